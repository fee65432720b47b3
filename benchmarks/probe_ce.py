"""Device probe for cross-entropy (not the benchmark: `warpforge bench cross_entropy
linear_cross_entropy` is). Checks the split path at large V against a float32 reference, times
launch shapes of the fused forward+backward at T = 8192, V = 128,256 against the byte floor and the
peers, and the fused linear + cross-entropy against the three cuBLAS GEMMs it needs.

    python benchmarks/probe_ce.py [--skip-linear]
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import torch
import triton.testing

import warpforge
from warpforge.ops import cross_entropy as ce
from warpforge.runtime import device as dev
from warpforge.runtime.heuristics import RowConfig


SKIP_PEERS = True    # the linear peers were measured in the first run (eager 50.1 ms / 11.7 GiB, Liger 55.5 / 1.10)


def bench(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=20, rep=rep, return_mode="median")


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(table):
    torch.manual_seed(0)
    for v in (128256, 262144):
        for dtype in (torch.bfloat16, torch.float32):
            for opts in ({}, {"label_smoothing": 0.1, "z_loss": 1e-4, "softcap": 30.0},
                         {"weight": True, "label_smoothing": 0.05}):
                for red in ("mean", "none"):
                    o = dict(opts)
                    if o.pop("weight", False):
                        o["weight"] = torch.rand(v, device="cuda") + 0.5
                    x = (torch.randn(67, v, device="cuda") * 3).to(dtype).requires_grad_()
                    t = torch.randint(0, v, (67,), device="cuda")
                    t[::7] = -100
                    loss = warpforge.cross_entropy(x, t, reduction=red, **o)
                    g = torch.randn_like(loss)
                    (dx,) = torch.autograd.grad(loss, x, g)
                    xr = x.detach().float().requires_grad_()
                    lr = ce.cross_entropy_reference(xr, t, reduction=red, **o).float()
                    (dxr,) = torch.autograd.grad(lr, xr, g.float())
                    table.append(("check", v, str(dtype)[6:], red, str(sorted(opts)), "%.1e" % rel(loss, lr),
                                  "%.1e" % rel(dx, dxr), bool(torch.isfinite(dx).all())))


def time_ce(table, copy, T=8192, V=128256, configs=None):
    torch.manual_seed(0)
    x = (torch.randn(T, V, device="cuda") * 2).bfloat16()
    t = torch.randint(0, V, (T,), device="cuda")
    floor = 2 * T * V * 2 / copy / 1e6
    xg = x.clone().requires_grad_()

    def ours():
        return torch.autograd.grad(warpforge.cross_entropy(xg, t), xg)

    def fwd_only():
        with torch.no_grad():
            return warpforge.cross_entropy(x, t)
    configs = configs or [None]

    def fwd_grad():
        return ce._ce_impl(x, t, None, -100, 1, 0.0, 0.0, 0.0, True)
    ref = None
    for c in configs:
        ce.CONFIG_OVERRIDE = None if c is None else RowConfig(c[0], c[1], 1, c[2], -(-V // c[1]))
        if c is not None and -(-V // c[1]) > 128:
            continue
        try:
            (dx,) = ours()
            if ref is None:
                ref = dx.float()
            err = rel(dx, ref)
            ms = bench(ours)
            ms_f = bench(fwd_grad)
            table.append(("ce fwd+bwd %dx%d" % (T, V), str(c or "default"), "%.3f ms" % ms, "%.2fx floor" % (ms / floor), "err %.1e" % err,
                          "fwd-with-grad op %.3f ms" % ms_f))
        except Exception as e:  # noqa: BLE001
            table.append(("ce fwd+bwd", str(c), "failed", str(e)[:100]))
    ce.CONFIG_OVERRIDE = None
    from warpforge.ops import _rows
    for key, res in _rows._RESIDENT.items():
        if key[0] is ce._ce_split_kernel and dict(key[2]).get("SMOOTH") is False:
            table.append(("resident", "warps %d" % key[1], str([kv for kv in key[2] if kv[0] in ("BLOCK_N", "WRITE_GRAD")]), res))
    try:
        for cache in ce._ce_split_kernel.device_caches.values():
            for k, v in cache[0].items():
                table.append(("compiled", str(v.metadata.num_warps), "regs %s spills %s" % (v.n_regs, v.n_spills),
                              str(k)[-100:]))
    except Exception as e:  # noqa: BLE001
        table.append(("compiled", "?", str(e)[:80]))
    table.append(("ce fwd only (no grad)", "default", "%.3f ms" % bench(fwd_only), "floor(read) %.3f" % (floor / 2)))
    xe = x.clone().requires_grad_()
    eager = lambda: torch.autograd.grad(torch.nn.functional.cross_entropy(xe.float(), t), xe)  # noqa: E731
    sm = lambda: warpforge.softmax(x)  # noqa: E731
    table.append(("softmax fwd same shape", "%.3f ms" % bench(sm), "floor %.3f" % floor))
    if SKIP_PEERS:
        return
    table.append(("ce fwd+bwd", "eager", "%.3f ms" % bench(eager), "%.2fx floor" % (bench(eager) / floor)))
    comp = torch.compile(lambda a, b: torch.nn.functional.cross_entropy(a.float(), b))
    cf = lambda: torch.autograd.grad(comp(xe, t), xe)  # noqa: E731
    cf()
    ms = bench(cf)
    table.append(("ce fwd+bwd", "compile", "%.3f ms" % ms, "%.2fx floor" % (ms / floor)))
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
        xl = x.clone().requires_grad_()
        lf = lambda: torch.autograd.grad(LigerCrossEntropyFunction.apply(xl, t, None)[0], xl)  # noqa: E731
        lf()
        ms = bench(lf)
        table.append(("ce fwd+bwd", "liger", "%.3f ms" % ms, "%.2fx floor" % (ms / floor)))
    except Exception as e:  # noqa: BLE001
        table.append(("ce fwd+bwd", "liger", "absent", str(e)[:80]))
    table.append(("ce", "byte floor", "%.3f ms" % floor, "copy %.0f GB/s" % copy))


def kernel_times(fn, calls=5):
    """(kernel name, device us per call, launches per call) of every kernel ``fn`` runs, slowest first."""
    from torch.profiler import ProfilerActivity, profile as prof
    fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sorted(((e.key, e.device_time_total / calls, e.count / calls) for e in p.key_averages()
                   if e.device_time_total > 0), key=lambda k: -k[1])


def profile(table):
    T, V = 8192, 128256
    x = (torch.randn(T, V, device="cuda") * 2).bfloat16()
    t = torch.randint(0, V, (T,), device="cuda")
    for launch in (None, (8192, 8), (16384, 8)):
        ce.STATS_LAUNCH = launch
        fn = lambda: ce._ce_impl(x, t, None, -100, 1, 0.0, 0.0, 0.0, False)  # noqa: E731
        ks = kernel_times(fn)
        table.append(("prof fwd no-grad %s" % (launch,), "%.3f ms total" % bench(fn),
                      "; ".join("%s %.1f us" % (k[:24], us) for k, us, c in ks[:3])))
    ce.STATS_LAUNCH = None


def step_profile(table, copy, T=8192, V=128256):
    """Every kernel of one training step (loss, then its backward) at the headline shape, with
    each kernel's device time, against the step's measured time and the byte floor."""
    torch.manual_seed(0)
    x = (torch.randn(T, V, device="cuda") * 2).bfloat16().requires_grad_()
    t = torch.randint(0, V, (T,), device="cuda")
    floor = 2 * T * V * 2 / copy / 1e6

    def step():
        return torch.autograd.grad(warpforge.cross_entropy(x, t), x)
    ks = kernel_times(step)
    ms = bench(step)
    table.append(("step %dx%d" % (T, V), "%.3f ms" % ms, "%.3fx floor (%.3f ms)" % (ms / floor, floor),
                  "kernels %.1f us" % sum(k[1] for k in ks)))
    for k, us, n in ks:
        table.append(("  kernel", k[:60], "%.1f us" % us, "x%.1f" % n))


def peak_extra(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    del out
    return extra / 2**30


def time_linear(table):
    T, H, V = 8192, 4096, 128256
    torch.manual_seed(0)
    h = (torch.randn(T, H, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(V, H, device="cuda") * 0.02).bfloat16().requires_grad_()
    t = torch.randint(0, V, (T,), device="cuda")
    dl = torch.randn(T, V, device="cuda").bfloat16() * 1e-4
    g1 = lambda: h.detach() @ w.detach().T  # noqa: E731
    g2 = lambda: dl @ w.detach()  # noqa: E731
    g3 = lambda: dl.T @ h.detach()  # noqa: E731
    gemm = sum(bench(f, rep=200) for f in (g1, g2, g3))
    del dl
    table.append(("lce", "3 cuBLAS GEMMs", "%.2f ms" % gemm))
    ref = None
    trace = []

    def wrap(name):
        fn = getattr(ce, name)

        def inner(*a, **k):
            out = fn(*a, **k)
            trace.append((name, torch.cuda.memory_allocated() / 2**30, torch.cuda.max_memory_allocated() / 2**30))
            return out
        return inner
    saved = {n: getattr(ce, n) for n in ("_logits", "_ce_rows", "_accumulate", "_prep", "_grad_buffers", "scale_")}
    for n in saved:
        setattr(ce, n, wrap(n))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    gs = torch.autograd.grad(warpforge.linear_cross_entropy(h, w, t, chunk_size=1024), (h, w))
    trace.append(("end", torch.cuda.memory_allocated() / 2**30, torch.cuda.max_memory_allocated() / 2**30))
    del gs
    for n, f in saved.items():
        setattr(ce, n, f)
    table.append(("lce mem trace base %.3f GiB" % base, "; ".join("%s %.3f/%.3f" % (n, a - base, m - base) for n, a, m in trace[:12] + trace[-6:])))
    for chunk in (None, 1536):
        def ours():
            return torch.autograd.grad(warpforge.linear_cross_entropy(h, w, t, chunk_size=chunk), (h, w))
        gs = ours()
        if ref is None:
            ref = gs
        errs = "%.1e/%.1e" % (rel(gs[0], ref[0]), rel(gs[1], ref[1]))
        del gs
        ms = bench(ours, rep=300)
        mem = peak_extra(ours)
        table.append(("lce fwd+bwd", f"chunk {chunk}", "%.2f ms" % ms, "%.3fx gemm" % (ms / gemm), "%.2f GiB" % mem, errs))

    if SKIP_PEERS:
        return

    def eager():
        return torch.autograd.grad(torch.nn.functional.cross_entropy((h @ w.T).float(), t), (h, w))
    gs = eager()
    table.append(("lce", "eager vs ours(default) grads", "%.1e/%.1e" % (rel(ref[0], gs[0]), rel(ref[1], gs[1]))))
    del gs
    table.append(("lce fwd+bwd", "eager", "%.2f ms" % bench(eager, rep=300), "%.2f GiB" % peak_extra(eager)))
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction as F
        lf = lambda: torch.autograd.grad(F.apply(h, w, t)[0], (h, w))  # noqa: E731
        lf()
        table.append(("lce fwd+bwd", "liger", "%.2f ms" % bench(lf, rep=300), "%.2f GiB" % peak_extra(lf)))
    except Exception as e:  # noqa: BLE001
        table.append(("lce", "liger", "absent", str(e)[:80]))


def assert_check(table):
    code = ("import torch, warpforge; x=torch.randn(4, 50000, device='cuda'); t=torch.tensor([1, 2, 60000, 3], device='cuda');"
            "l=warpforge.cross_entropy(x, t); torch.cuda.synchronize(); print('NO ERROR', l.item())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    msg = [ln for ln in (p.stdout + p.stderr).splitlines() if "target" in ln or "assert" in ln.lower() or "NO ERROR" in ln]
    table.append(("bad target", "rc %d" % p.returncode, " | ".join(m[:150] for m in msg[:3])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-linear", action="store_true")
    ap.add_argument("--step", action="store_true", help="only the training step's kernel profile and time")
    args = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    table = []
    if args.step:
        step_profile(table, copy)
        for r in table:
            print(*r, sep=" | ", flush=True)
        return
    sweep = [(8192, 128256, [None, ("split", 8192, 4), ("split", 4096, 4), ("split", 8192, 8), ("split", 16384, 8)]),
             (8192, 262144, [None, ("split", 4096, 4), ("split", 16384, 8)])]
    steps = [check, profile] + [lambda tb, s=s: time_ce(tb, copy, *s) for s in sweep]
    if not args.skip_linear:
        steps.append(time_linear)
    steps.append(assert_check)
    for step in steps:
        try:
            step(table)
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            table.append(("step failed", getattr(step, "__name__", "?"), str(e)[:200]))
        torch.cuda.empty_cache()
        for r in table:
            print(*r, sep=" | ", flush=True)
        print("----", flush=True)


if __name__ == "__main__":
    main()
