"""Device probe: host time of small-row calls (1 and 64 rows of 4,096, bf16): ours, every launch
through Triton's JIT, through the launch plans of runtime/launch.py, and through the eager fast
path of runtime/fastpath.py (alternating in one process), against eager PyTorch; per call of 400 back-to-back calls, the minimum of several rounds
(the host is noisy). ``issue``: the host's time to issue one call; ``loop``: the wall clock per
call with the GPU work included (the bench's ``host_us``). `--profile OP` prints a cProfile of
that op's forward+backward.

    python benchmarks/probe_small_rows.py [--rows 1,64] [--rounds 5] [--profile rms_norm]
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


def cases(m: int, n: int = 4096):
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
            yield name, who, "fwd+bwd", (lambda f=f, g=g: torch.autograd.grad(f(xg), [xg], g))


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
    args = ap.parse_args()
    table = []
    print("fast path:", "on" if fastpath.load() else fastpath.status())
    fast = fastpath.lib
    for m in (int(v) for v in args.rows.split(",")):
        for name, who, what, fn in cases(m):
            grad = what != "fwd (no grad)"
            runs = {"jit": [], "plan": [], "fast": []} if who == "ours" else {"eager": []}
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
    print("\nhost us per call (min of the rounds), bf16 rows of 4,096: issue / loop (loop: GPU work included)")
    print(f"{'rows':>4} {'op':<13} {'mode':<14} {'JIT launch':>13} {'launch plan':>13} {'fast path':>13} "
          f"{'eager':>13} {'fast/eager':>10}")
    by = {(m, n, who, what): (i, lp) for m, n, who, what, i, lp in table}
    for (m, n, who, what), (i, lp) in by.items():
        if who != "plan":
            continue
        ji, jl = by[(m, n, "jit", what)]
        fi, fl = by[(m, n, "fast", what)]
        ei, el = by[(m, n, "eager", what)]
        print(f"{m:4d} {n:<13} {what:<14} {ji:6.1f}/{jl:6.1f} {i:6.1f}/{lp:6.1f} {fi:6.1f}/{fl:6.1f} "
              f"{ei:6.1f}/{el:6.1f} {fl / el:10.2f}")


if __name__ == "__main__":
    main()
