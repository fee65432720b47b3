"""The cluster backward of LayerNorm and RMSNorm (CUDA backend, csrc/norm.cu) against the Triton
backward, long rows, bf16, M*N = 2^27: dx, dw, db checked against the Triton route's, then timed
(backward alone: the kernel and the partial-row sum; two rounds, alternating). A probe (NOTES item 87).

    WARPFORGE_FASTPATH=0 python benchmarks/probe_norm_bwd_cluster.py
"""
import os, sys, time
import torch
import warpforge.cuda as wcuda
from warpforge.bench import timing
from warpforge.ops import norms
from warpforge.runtime import device as dev
from warpforge.runtime import heuristics as H

t0 = time.time()
wcuda.load()
print(f"CUDA backend built/loaded in {time.time() - t0:.1f} s", flush=True)
ops = torch.ops.warpforge_cuda
copy = dev.ceilings()["copy_gbps"]
cfg_t = timing.TimingConfig.quick()
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(torch.cuda.get_device_name(), "copy GB/s", copy, flush=True)

CONFIGS = {   # n: [cluster, threads, vectors a thread, rows a group, stages]
    32768: [(4, 256, 4, 2, 3), (8, 256, 2, 4, 3), (8, 128, 4, 4, 3), (4, 512, 2, 2, 3), (2, 256, 8, 1, 3)],
    65536: [(8, 256, 4, 2, 3), (16, 256, 2, 2, 6), (8, 512, 2, 2, 3), (4, 256, 8, 1, 3), (8, 256, 4, 1, 5)],
    262144: [(16, 256, 8, 1, 3), (16, 256, 8, 1, 2)],
}


def cluster_bwd(x, dy, w, mean, rstd, rms, has_b, c):
    n = x.shape[1]
    parts = max(1, sms // c[0])
    dx = torch.full_like(x, float("nan"))
    dwp = torch.full((parts, n), float("nan"), device=x.device) if w is not None else None
    dbp = torch.full((parts, n), float("nan"), device=x.device) if has_b else None
    ops.norm_bwd(x, dy, w, mean, rstd, 0.0, rms, list(c), dx, dwp, dbp)
    return (dx, *norms._grad_sums(dwp, dbp, x.dtype))


def triton_bwd(x, dy, w, mean, rstd, rms, has_b):
    os.environ["WARPFORGE_NORM_CUDA"] = "0"
    norms._cuda_backend_ready.cache_clear()
    try:
        return norms._norm_bwd(dy, x, None, w, mean, rstd, 0.0, rms=rms, llama=False, has_bias=has_b)
    finally:
        os.environ["WARPFORGE_NORM_CUDA"] = "1"
        norms._cuda_backend_ready.cache_clear()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


rows = []
for layer in (True, False):
    for n, configs in CONFIGS.items():
        m = 2**27 // n
        g = torch.Generator(device="cuda").manual_seed(n)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g) * 2 + 0.5
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.rand(n, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5
        xf = x.float()
        rstd = ((xf - (xf.mean(-1, keepdim=True) if layer else 0)).pow(2).mean(-1) + 1e-5).rsqrt() if layer \
            else (xf.pow(2).mean(-1) + 1e-6).rsqrt()
        mean = xf.mean(-1) if layer else None
        rstd = rstd.contiguous()
        name = "LN" if layer else "RMS"
        ref = triton_bwd(x, dy, w, mean, rstd, not layer, layer)
        good = []
        for c in configs:
            try:
                out = cluster_bwd(x, dy, w, mean, rstd, not layer, layer, c)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"  {name} {n} {c}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            errs = [rel(o, r) for o, r in zip(out, ref) if r is not None]
            ok = all(e < 5e-3 for e in errs) and all(bool(torch.isfinite(o).all()) for o in out if o is not None)
            print(f"  {name} {n} {c}: rel diff to Triton (dx, dw, db) {['%.1e' % e for e in errs]} "
                  f"{'ok' if ok else 'WRONG'}", flush=True)
            if ok:
                good.append(c)
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
            print(f"  {name} {n} {k:24s} {ts[0]:8.1f} {ts[1]:8.1f} us  {rows[-1][4]:5.1f}% of copy", flush=True)

print("\nop   n        config                    us (2 rounds)       % copy (best)")
for name, n, k, ts, pct in rows:
    print(f"{name:4s} {n:7d}  {k:24s} {ts[0]:8.1f} {ts[1]:8.1f}   {pct:5.1f}")
