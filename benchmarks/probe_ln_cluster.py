"""The cluster LayerNorm forward (CUDA backend, csrc/norm.cu) against the Triton default, long rows,
bf16, M*N = 2^27: outputs and statistics checked against the Triton kernel and float32 torch, then
timed (two rounds, alternating) on the bench's timer. A probe, not the benchmark (NOTES item 86).

    WARPFORGE_FASTPATH=0 python benchmarks/probe_ln_cluster.py [--quick] [32768 65536 262144]
"""
import os, sys
import torch
from warpforge.bench import timing
from warpforge.ops import _cluster_rows, norms

from cluster_probe_setup import setup

ops, copy, cfg_t = setup()

CONFIGS = {   # n: [cluster, threads, vectors a thread, rows a group, stages]; cluster x threads x vectors x 8 = n
    32768: [(4, 256, 4, 4, 3), (4, 256, 4, 2, 3), (4, 256, 4, 4, 2), (4, 256, 4, 6, 2), (2, 512, 4, 2, 3), (8, 256, 2, 4, 4), (4, 512, 2, 4, 3), (4, 256, 4, 2, 6), (2, 1024, 2, 2, 3), (4, 1024, 1, 2, 6),
            (8, 512, 1, 4, 4), (8, 256, 2, 2, 3)],
    65536: [(8, 256, 4, 4, 3), (4, 512, 4, 2, 3), (8, 256, 4, 2, 4), (8, 512, 2, 2, 4), (4, 1024, 2, 1, 6), (8, 1024, 1, 4, 3),
            (16, 256, 2, 2, 6), (4, 512, 4, 1, 6), (8, 256, 4, 1, 3)],
    262144: [(16, 512, 4, 2, 3), (8, 512, 8, 1, 3), (8, 1024, 4, 1, 3), (16, 512, 4, 1, 4), (16, 256, 8, 1, 5), (16, 1024, 2, 1, 6),
             (16, 512, 4, 1, 6)],
}
if "--quick" in sys.argv:
    CONFIGS = {k: v[:3] for k, v in CONFIGS.items()}
ns = [int(a) for a in sys.argv[1:] if a.isdigit()]
if ns:
    CONFIGS = {k: v for k, v in CONFIGS.items() if k in ns}


def triton_ln(x, w, b):   # the Triton route: the cluster kernel's switched off
    _cluster_rows.cuda_backend_ready.cache_clear()
    os.environ["WARPFORGE_NORM_CUDA"] = "0"
    try:
        return norms.layer_norm_op(x, w, b, 1e-5)
    finally:
        os.environ["WARPFORGE_NORM_CUDA"] = "1"
        _cluster_rows.cuda_backend_ready.cache_clear()


def cluster_ln(x, w, b, c):
    y = torch.empty_like(x)
    mean = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    ops.layer_norm_fwd(x, w, b, 1e-5, list(c), y, mean, rstd)
    return y, mean, rstd


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


rows = []
for n, configs in CONFIGS.items():
    m = 2**27 // n
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g) * 3 + 1.5
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    ref32 = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
    tri_y, tri_mean, tri_rstd = triton_ln(x, w, b)
    print(f"n={n}: triton rel err {rel(tri_y, ref32):.2e}", flush=True)
    good = []
    for c in configs:
        try:
            y, mean, rstd = cluster_ln(x, w, b, c)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"  {c}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        e_y, d_tri = rel(y, ref32), (y.float() - tri_y.float()).abs().max().item()
        e_m = ((mean - tri_mean).abs().max() / tri_mean.abs().max()).item()
        e_r = ((rstd - tri_rstd).abs().max() / tri_rstd.abs().max()).item()
        ok = e_y < 8e-3 and e_m < 1e-4 and e_r < 1e-4 and bool(torch.isfinite(y).all())
        print(f"  {c}: rel err {e_y:.2e}, max |y - triton| {d_tri:.3g}, mean {e_m:.1e}, rstd {e_r:.1e} "
              f"{'ok' if ok else 'WRONG'}", flush=True)
        if ok:
            good.append(c)
    # without weight and bias, the first good config
    if good:
        y, mean, rstd = cluster_ln(x, None, None, good[0])
        r = torch.nn.functional.layer_norm(x.float(), (n,), None, None, 1e-5)
        print(f"  no affine {good[0]}: rel err {rel(y, r):.2e}", flush=True)
        xh = x.half()
        y, mean, rstd = cluster_ln(xh, w.half(), b.half(), good[0])
        print(f"  fp16 {good[0]}: rel err {rel(y, ref32):.2e}", flush=True)
        # a partial last group and fewer rows than clusters
        for mm in (m - 1, 3):
            y, mean, rstd = cluster_ln(x[:mm], w, b, good[0])
            print(f"  m={mm} {good[0]}: rel err {rel(y, ref32[:mm]):.2e}", flush=True)
    if n in (65536, 262144):   # the default route under CUDA-graph capture: replays match eager
        xs = x.clone()
        norms.layer_norm_op(xs, w, b, 1e-5)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gy, gmean, grstd = norms.layer_norm_op(xs, w, b, 1e-5)
        xs.copy_(torch.randn_like(x))
        graph.replay()
        ey, emean, erstd = norms.layer_norm_op(xs, w, b, 1e-5)
        print(f"  CUDA graph replay equal to eager: {torch.equal(gy, ey) and torch.equal(grstd, erstd)}", flush=True)
    nbytes = 4 * m * n
    fns = {"triton": lambda: triton_ln(x, w, b), "default route": lambda: norms.layer_norm_op(x, w, b, 1e-5)}
    for c in good:
        fns[str(c)] = (lambda c=c: cluster_ln(x, w, b, c))
    if good:
        fns["none " + str(good[0])] = lambda: cluster_ln(x, None, None, good[0])
        fns["triton none"] = lambda: triton_ln(x, None, None)
    times = {k: [] for k in fns}
    for _ in range(2):
        for k, fn in fns.items():
            times[k].append(timing.device_ms(fn, cfg_t, nbytes) * 1e3)
    for k, ts in times.items():
        best = min(ts)
        rows.append((n, k, ts, 100 * nbytes / (best * 1e-6) / 1e9 / copy))
        print(f"  {k:28s} {ts[0]:8.1f} {ts[1]:8.1f} us  {rows[-1][3]:5.1f}% of copy", flush=True)

print("\nn        config                        us (2 rounds)       % copy (best)")
for n, k, ts, pct in rows:
    print(f"{n:7d}  {k:28s} {ts[0]:8.1f} {ts[1]:8.1f}   {pct:5.1f}")
