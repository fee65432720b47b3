"""The cluster backward of LayerNorm and RMSNorm (CUDA backend, csrc/norm.cu) against the Triton
backward, long rows, bf16, M*N = 2^27: dx, dw, db checked against the Triton route's (NaN-poisoned
outputs, plus an odd row count), then timed on empty outputs (backward alone: the kernel and the
partial-row sum; two rounds, alternating). A probe (NOTES items 87, 89, 90).

Session 32's version of this probe timed torch.full(nan) of dx (a 256 MB write) inside every
cluster call, and not inside the Triton one; the cluster figures of item 87 carry that write.

    WARPFORGE_FASTPATH=0 python benchmarks/probe_norm_bwd_cluster.py [ln|rms] [32768 65536 262144]
"""
import os, sys
import torch
from warpforge.bench import timing
from warpforge.ops import _cluster_rows, norms

from cluster_probe_setup import setup

ops, copy, cfg_t = setup()
sms = torch.cuda.get_device_properties(0).multi_processor_count

# n: [cluster, threads, vectors a thread, rows a group, stages]; the first is the H200 route's
CONFIGS = {
    32768: [(2, 256, 8, 1, 3), (4, 256, 4, 2, 3), (4, 256, 4, 1, 3), (4, 512, 2, 2, 3), (4, 512, 2, 1, 4),
            (8, 256, 2, 2, 4), (8, 256, 2, 4, 3), (8, 512, 1, 4, 3), (4, 256, 4, 3, 2)],
    65536: [(4, 256, 8, 1, 3), (8, 256, 4, 2, 3), (8, 512, 2, 2, 3), (8, 256, 4, 1, 5), (16, 256, 2, 4, 3),
            (16, 512, 1, 4, 3), (8, 512, 2, 1, 5)],
    262144: [(16, 256, 8, 1, 3)],
}
kinds = [a for a in sys.argv[1:] if a in ("ln", "rms")] or ["ln", "rms"]
ns = [int(a) for a in sys.argv[1:] if a.isdigit()] or list(CONFIGS)


def cluster_bwd(x, dy, w, mean, rstd, rms, has_b, c, poison=False):
    n = x.shape[1]
    parts = max(1, sms // c[0])
    make = torch.full_like if poison else (lambda t, v: torch.empty_like(t))
    dx = make(x, float("nan"))
    dwp = torch.empty((parts, n), device=x.device) if w is not None else None
    dbp = torch.empty((parts, n), device=x.device) if has_b else None
    if poison:
        for t in (dwp, dbp):
            if t is not None:
                t.fill_(float("nan"))
    ops.norm_bwd(x, dy, w, mean, rstd, 0.0, rms, list(c), dx, dwp, dbp)
    return (dx, *norms._grad_sums(dwp, dbp, x.dtype))


def triton_bwd(x, dy, w, mean, rstd, rms, has_b):
    return norms._norm_bwd(dy, x, None, w, mean, rstd, 0.0, rms=rms, llama=False, has_bias=has_b)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def inputs(m, n, layer, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g) * 2 + 0.5
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5
    xf = x.float()
    if layer:
        mean = xf.mean(-1)
        rstd = ((xf - mean[:, None]).pow(2).mean(-1) + 1e-5).rsqrt().contiguous()
    else:
        mean, rstd = None, (xf.pow(2).mean(-1) + 1e-6).rsqrt().contiguous()
    return x, dy, w, mean, rstd


os.environ["WARPFORGE_NORM_CUDA"] = "0"   # the Triton route for the reference and the baseline
_cluster_rows.cuda_backend_ready.cache_clear()
rows = []
for kind in kinds:
    layer = kind == "ln"
    name = kind.upper()
    for n in ns:
        configs = CONFIGS[n]
        good = []
        for m in (2**27 // n, 37 if n >= 65536 else 301):
            x, dy, w, mean, rstd = inputs(m, n, layer, n + m)
            ref = triton_bwd(x, dy, w, mean, rstd, not layer, layer)
            for c in configs:
                if m != 2**27 // n and c not in good:
                    continue
                try:
                    out = cluster_bwd(x, dy, w, mean, rstd, not layer, layer, c, poison=True)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"  {name} {n} m={m} {c}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                errs = [rel(o, r) for o, r in zip(out, ref) if r is not None]
                ok = all(e < 5e-3 for e in errs) and all(bool(torch.isfinite(o).all()) for o in out if o is not None)
                print(f"  {name} {n} m={m} {c}: rel diff to Triton (dx, dw, db) {['%.1e' % e for e in errs]} "
                      f"{'ok' if ok else 'WRONG'}", flush=True)
                if ok and m == 2**27 // n:
                    good.append(c)
                elif not ok and c in good:
                    good.remove(c)
        m = 2**27 // n
        x, dy, w, mean, rstd = inputs(m, n, layer, n)
        nbytes = 6 * m * n
        fns = {"triton": lambda: triton_bwd(x, dy, w, mean, rstd, not layer, layer)}
        for c in good:
            fns[str(c)] = (lambda c=c: cluster_bwd(x, dy, w, mean, rstd, not layer, layer, c))
        times = {k: [] for k in fns}
        for _ in range(2):
            for k, fn in fns.items():
                times[k].append(timing.device_ms(fn, cfg_t, nbytes) * 1e3)
        for k, ts in times.items():
            rows.append((name, n, k, ts, 100 * nbytes / (min(ts) * 1e-6) / 1e9 / copy))
            print(f"  {name} {n} {k:28s} {ts[0]:8.1f} {ts[1]:8.1f} us  {rows[-1][4]:5.1f}% of copy", flush=True)

print("\nop   n        config                        us (2 rounds)       % copy (best)")
for name, n, k, ts, pct in rows:
    print(f"{name:4s} {n:7d}  {k:28s} {ts[0]:8.1f} {ts[1]:8.1f}   {pct:5.1f}")
