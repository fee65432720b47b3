"""Device probe: host time of small-row calls (1 and 64 rows of 4,096, bf16): ours, every launch
through Triton's JIT, through the launch plans of runtime/launch.py, and through the eager fast
path of runtime/fastpath.py (alternating in one process), against eager PyTorch; per call of 400 back-to-back calls, the minimum of several rounds
(the host is noisy). ``issue``: the host's time to issue one call; ``loop``: the wall clock per
call with the GPU work included (the bench's ``host_us``). `--profile OP` prints a cProfile of
that op's forward+backward, `--torch-profile OP` torch.profiler tables of ours and eager's;
`--all-grads` asks fwd+bwd for the parameters' gradients too (as the bench does); "bwd only"
reruns one retained graph's backward.

    python benchmarks/probe_small_rows.py [--rows 1,64] [--rounds 5] [--ops layer_norm] [--fast-only]
        [--all-grads] [--profile rms_norm] [--torch-profile layer_norm]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch
import torch.nn.functional as F

import warpforge as wf
from warpforge.bench.timing import host_us
from warpforge.runtime import fastpath, launch

BF16 = torch.bfloat16


def cases(m: int, n: int = 4096, all_grads: bool = False):
    x = torch.randn(m, n, device="cuda", dtype=BF16)
    xg = x.clone().requires_grad_()
    w = (torch.rand(n, device="cuda", dtype=BF16) + 0.5).requires_grad_()
    b = torch.randn(n, device="cuda", dtype=BF16).requires_grad_()
    r = torch.randn_like(x)
    dy = torch.randn_like(x)
    up = torch.randn_like(x)
    ops = {
        "softmax": (lambda t: wf.softmax(t, -1), lambda t: torch.softmax(t, -1)),
        "log_softmax": (lambda t: wf.log_softmax(t, -1), lambda t: torch.log_softmax(t, -1)),
        "rms_norm": (lambda t: wf.rms_norm(t, (n,), w, 1e-6), lambda t: F.rms_norm(t, (n,), w, 1e-6)),
        "layer_norm": (lambda t: wf.layer_norm(t, (n,), w, b), lambda t: F.layer_norm(t, (n,), w, b)),
        "add_rms_norm": (lambda t: wf.add_rms_norm(t, r, w, 1e-6)[0], lambda t: F.rms_norm(t + r, (n,), w, 1e-6)),
        "swiglu": (lambda t: wf.swiglu(t, up), lambda t: F.silu(t) * up),
        "sum": (lambda t: wf.sum(t, -1), lambda t: torch.sum(t, -1)),
        "amax": (lambda t: wf.amax(t, -1), lambda t: torch.amax(t, -1)),
    }
    for name, (ours, eager) in ops.items():
        for who, f in (("ours", ours), ("eager", eager)):
            with torch.no_grad():
                yield name, who, "fwd (no grad)", (lambda f=f: f(x))
            g = dy if name not in ("sum", "amax") else dy[:, 0]
            # the bench's fwd+bwd asks for every input's gradient (the parameters' too)
            wrt = [xg] + ([w] if all_grads and "norm" in name else []) + ([b] if all_grads and name == "layer_norm" else [])
            yield name, who, "fwd+bwd", (lambda f=f, g=g, wrt=wrt: torch.autograd.grad(f(xg), wrt, g))
            yield name, who, "bwd only", _bwd_only(f, xg, g, wrt)


def _bwd_only(f, xg, g, wrt):
    """The backward alone: a graph built once, its backward run again each call (retain_graph)."""
    box = []

    def run():
        if not box:
            box.append(f(xg))
        return torch.autograd.grad(box[0], wrt, g, retain_graph=True)
    return run


def measure(fn, grad: bool, calls: int) -> tuple[float, float]:
    if grad:
        return host_us(fn, calls=calls, warmup=20, include_device=False), host_us(fn, calls=calls, warmup=20)
    with torch.no_grad():
        return host_us(fn, calls=calls, warmup=20, include_device=False), host_us(fn, calls=calls, warmup=20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of JIT and plan launches (min taken)")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--ops", default=None, help="comma-separated op names (default: all)")
    ap.add_argument("--fast-only", action="store_true", help="time only the fast path against eager")
    ap.add_argument("--all-grads", action="store_true", help="fwd+bwd asks for the parameters' gradients too")
    ap.add_argument("--torch-profile", default=None,
                    help="OP: torch.profiler CPU/CUDA tables of ours and eager's fwd+bwd at the first row count")
    args = ap.parse_args()
    table = []
    print("fast path:", "on" if fastpath.load() else fastpath.status())
    fast = fastpath.lib
    for m in (int(v) for v in args.rows.split(",")):
        for name, who, what, fn in cases(m, all_grads=args.all_grads):
            if args.ops and name not in args.ops.split(","):
                continue
            grad = what != "fwd (no grad)"
            mine = ("fast",) if args.fast_only else ("jit", "plan", "fast")
            runs = {k: [] for k in mine} if who == "ours" else {"eager": []}
            for _ in range(args.rounds):
                for mode in runs:
                    launch._BYPASS = mode == "jit"
                    fastpath.lib = fast if mode == "fast" else None
                    runs[mode].append(measure(fn, grad, 400))
            launch._BYPASS = False
            fastpath.lib = fast
            for mode, vals in runs.items():
                table.append((m, name, mode, what, min(v[0] for v in vals), min(v[1] for v in vals)))
    if args.profile:
        m = int(args.rows.split(",")[0])
        fn = next(f for name, who, what, f in cases(m) if name == args.profile and who == "ours" and what == "fwd+bwd")
        for _ in range(20):
            fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(500):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue()[:5000])
    if args.torch_profile:
        from torch.profiler import ProfilerActivity, profile

        m = int(args.rows.split(",")[0])
        for who in ("ours", "eager"):
            fn = next(f for name, w_, what, f in cases(m, all_grads=args.all_grads)
                      if name == args.torch_profile and w_ == who and what == "fwd+bwd")
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(100):
                    fn()
                torch.cuda.synchronize()
            print(f"\n=== {args.torch_profile} {who} fwd+bwd, {m} rows: 100 calls ===")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    print("\nhost us per call (min of the rounds), bf16 rows of 4,096: issue / loop (loop: GPU work included)")
    print(f"{'rows':>4} {'op':<13} {'mode':<14} {'JIT launch':>13} {'launch plan':>13} {'fast path':>13} "
          f"{'eager':>13} {'fast/eager':>10}")
    by = {(m, n, who, what): (i, lp) for m, n, who, what, i, lp in table}
    nan = (float("nan"), float("nan"))
    for (m, n, who, what), (i, lp) in by.items():
        if who != "fast":
            continue
        ji, jl = by.get((m, n, "jit", what), nan)
        i, lp = by.get((m, n, "plan", what), nan)
        fi, fl = by[(m, n, "fast", what)]
        ei, el = by[(m, n, "eager", what)]
        print(f"{m:4d} {n:<13} {what:<14} {ji:6.1f}/{jl:6.1f} {i:6.1f}/{lp:6.1f} {fi:6.1f}/{fl:6.1f} "
              f"{ei:6.1f}/{el:6.1f} {fl / el:10.2f}")


if __name__ == "__main__":
    main()
