"""Every kernel of warpforge's CUDA backend, once, on small odd shapes: the workload for
compute-sanitizer (not a pytest module; test_cuda_ops.py::test_compute_sanitizer runs it).

    compute-sanitizer --tool memcheck  --error-exitcode 1 python tests/cuda/sanitize_cuda.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/cuda/sanitize_cuda.py [reduce ...]

(Naming parts -- add, reduce, softmax, matmul, layer_norm, norm_bwd -- runs only those.)

Covers, for float32, float16 and bfloat16: add (naive, vectorized; aligned and misaligned
pointers); sum and amax (warp-per-row, block-per-row, the chunked long-row path with its second
launch, unaligned row strides); softmax and log-softmax forward and backward through the
warp-per-row, block, cluster (2, 4, 8, 16 blocks) and looped launch shapes, aligned and not;
matmul, every variant (mma_tma's tile configurations too), on (17, 33, 45) and (130, 136, 72);
the cluster LayerNorm forward and LayerNorm / RMSNorm backward (Hopper) over 2- to 16-block clusters. Sanitizers slow kernels 10-100x, so the
shapes are small: cluster shapes get few threads per block (e.g. [32, 1, 16, 1]) so that a row of
a few thousand elements spreads over every block of the cluster. Each op is synchronized and
checked loosely against a float64 reference (a garbage result fails too); prints
"sanitize: ok" at the end. Set PYTORCH_NO_CUDA_MEMORY_CACHING=1 so memcheck sees each tensor's
own bounds (test_compute_sanitizer does).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

try:
    import warpforge as wf
except ImportError:   # run from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    import warpforge as wf
import warpforge.cuda as wcuda
from warpforge.runtime.heuristics import cuda_softmax_config

DEV = "cuda"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}   # loose: this is not the accuracy test
_count = 0


def check(what: str, out: torch.Tensor, ref: torch.Tensor, dtype, scale: float = 1.0) -> None:
    global _count
    torch.cuda.synchronize()
    _count += 1
    o, r = out.detach().double(), ref.detach().double()
    assert o.shape == r.shape, f"{what}: shape {tuple(o.shape)} != {tuple(r.shape)}"
    fin = torch.isfinite(r)
    assert torch.equal(torch.isfinite(o), fin), f"{what}: NaN/inf where the reference has none (or vice versa)"
    den = r[fin].norm().item()
    err = (o[fin] - r[fin]).norm().item() / (den if den > 0 else 1.0)
    assert err <= TOL[dtype] * scale, f"{what}: relative error {err:.2e} > {TOL[dtype] * scale:.0e}"


def rnd(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, device=DEV) * scale + shift).to(dtype)


def misaligned(t: torch.Tensor) -> torch.Tensor:
    buf = torch.empty(t.numel() + 1, device=DEV, dtype=t.dtype)
    v = buf[1:].view(t.shape)
    v.copy_(t)
    return v


def odd_rows(t: torch.Tensor) -> torch.Tensor:
    """x[:, :n] of a buffer with an odd row length: rows not 16-byte aligned."""
    m, n = t.shape
    buf = torch.zeros(m, n + (1 if n % 2 == 0 else 2), device=DEV, dtype=t.dtype)
    v = buf[:, :n]
    v.copy_(t)
    return v


def vec(dtype) -> int:
    return 16 // torch.empty((), dtype=dtype).element_size()


def run_add(ops) -> None:
    for dtype in DTYPES:
        for n in (7, 4103):
            a, b = rnd(n, dtype=dtype), rnd(n, dtype=dtype)
            for variant in ("naive", "vectorized"):
                for x, y, tag in ((a, b, "aligned"), (misaligned(a), b, "misaligned")):
                    check(f"add {variant} {dtype} n={n} {tag}", ops.add(x, y, 0.5, variant),
                          x.double() + 0.5 * y.double(), dtype)


def run_reduce(ops) -> None:
    for dtype in DTYPES:
        # warp rows (wide; deep at 2,047 bf16), block rows (wide), chunked + second launch, and a
        # block a row once there are rows for a wave (deep)
        for m, n in ((5, 123), (7, 2047), (3, 4101), (2, 262144 + 5), (300, 40001)):
            x = rnd(m, n, dtype=dtype, shift=min(0.5, 8000.0 / n))   # sums below fp16 max
            for rows, tag in ((x, "aligned"), (odd_rows(x), "odd row stride"), (misaligned(x), "misaligned")):
                check(f"sum {dtype} {m}x{n} {tag}", ops.sum(rows, dtype), rows.double().sum(-1), dtype)
                y = ops.amax(rows)
                torch.cuda.synchronize()
                assert torch.equal(y, rows.amax(-1)), f"amax {dtype} {m}x{n} {tag}"
        x = rnd(2, 4101, dtype=dtype, shift=0.5)
        check(f"sum {dtype} -> float32", ops.sum(x, torch.float32), x.double().sum(-1), torch.float32)


def softmax_shapes(dtype):
    """(rows, n, config): every kernel family and VPT, cluster sizes 2..16, with rows that fill
    every block of the cluster but stay small."""
    v = vec(dtype)
    out = []
    for n in (7, 123, 48 * v - 1, 4 * 32 * v - 3):                          # warp per row, heuristic VPT 1, 2, 4
        out.append((5, n, cuda_softmax_config(n, 16 // v)))
    out.append((3, 1500, cuda_softmax_config(1500, 16 // v)))              # one block per row
    out.append((2, 64 * 2 * v - 5, [64, 2, 1, 1]))                          # block, VPT 2
    out.append((2, 32 * 1 * v - 1, [32, 1, 1, 1]))                          # block of one warp, VPT 1
    for c in (2, 4, 8, 16):                                                 # clusters, VPT 1, 2, 4
        for vpt in (1, 2, 4):
            out.append((2, 32 * vpt * c * v - 3, [32, vpt, c, 1]))
    out.append((1, 65536 + 3, cuda_softmax_config(65536 + 3, 16 // v)))    # the heuristic's cluster shape
    out.append((2, 5003, [128, 0, 1, 1]))                                   # looped
    out.append((1, 3, [1024, 0, 1, 1]))                                     # looped, most threads idle
    return out


def bwd_config(cfg, n, dtype):
    """The forward's shape where the backward can run it, else the backward heuristic's: the 16-bit
    backward at 4 vectors a thread takes at most 512 threads (softmax.cu)."""
    if dtype != torch.float32 and cfg[1] == 4 and cfg[3] == 1 and cfg[0] > 512:
        return cuda_softmax_config(n, 2, backward=True)
    return cfg


def run_softmax(ops) -> None:
    for dtype in DTYPES:
        for m, n, cfg in softmax_shapes(dtype):
            x = rnd(m, n, dtype=dtype, scale=3.0)
            dy = rnd(m, n, dtype=dtype)
            for log in (False, True):
                tfn = torch.log_softmax if log else torch.softmax
                for xin, gin, tag in ((x, dy, "aligned"), (odd_rows(x), odd_rows(dy), "odd row stride")):
                    y = ops.softmax(xin, log, cfg)
                    check(f"softmax log={log} {dtype} {m}x{n} {cfg} {tag}", y, tfn(xin.double(), -1), dtype)
                    xr = xin.double().requires_grad_()
                    tfn(xr, -1).backward(gin.double())
                    dx = ops.softmax_backward(y, gin, log, bwd_config(cfg, n, dtype))
                    check(f"softmax_backward log={log} {dtype} {m}x{n} {cfg} {tag}", dx, xr.grad, dtype, scale=2.0)


def run_matmul(ops) -> None:
    for dtype in DTYPES:
        for m, n, k in ((17, 33, 45), (130, 136, 72)):
            a, b = rnd(m, k, dtype=dtype), rnd(k, n, dtype=dtype)
            ref = a.double() @ b.double()
            for variant in ("naive", "tiled", "regblock", "mma", "mma_tma"):
                if variant.startswith("mma") and dtype == torch.float32:
                    continue
                check(f"matmul {variant} {dtype} ({m}, {n}, {k})", wf.matmul(a, b, variant=variant, backend="cuda"),
                      ref, dtype)
            if dtype != torch.float32 and k % 8 == 0 and n % 8 == 0:
                for variant in ("mma", "mma_tma", "mma_tma_128x128x32_s4", "mma_tma_128x256x64_s3"):
                    check(f"matmul {variant} direct {dtype} ({m}, {n}, {k})", ops.matmul(a, b, variant), ref, dtype)
        a = rnd(33, 50, dtype=dtype)[:, :45]                                 # a leading dimension of 50
        b = rnd(45, 17, dtype=dtype)
        for variant in ("naive", "tiled", "regblock"):
            check(f"matmul {variant} {dtype} lda=50", ops.matmul(a, b, variant), a.double() @ b.double(), dtype)


def run_layer_norm(ops):
    """The cluster LayerNorm forward (norm.cu; sm_90 only): 2-16 block clusters, partial last groups,
    more groups than resident clusters, each parameter combination, both 16-bit dtypes."""
    if torch.cuda.get_device_capability()[0] < 9:
        return
    import torch.nn.functional as F

    for cfg, m in (((2, 128, 1, 2, 2), 301), ((4, 128, 2, 4, 3), 9), ((16, 128, 1, 2, 2), 5),
                   ((8, 256, 4, 4, 3), 37), ((16, 512, 4, 2, 3), 5)):
        n = cfg[0] * cfg[1] * cfg[2] * 8
        for dtype, affine in ((torch.bfloat16, True), (torch.float16, False)):
            x = rnd(m, n, dtype=dtype)
            w = rnd(n, dtype=dtype) if affine else None
            b = rnd(n, dtype=dtype) if affine else None
            y = torch.empty_like(x)
            mean, rstd = torch.empty(m, device=DEV), torch.empty(m, device=DEV)
            ops.layer_norm_fwd(x, w, b, 1e-5, list(cfg), y, mean, rstd)
            ref = F.layer_norm(x.double(), (n,), None if w is None else w.double(), None if b is None else b.double())
            check(f"layer_norm {cfg} m={m} {dtype}", y, ref, dtype)


def run_norm_bwd(ops):
    """The cluster LayerNorm and RMSNorm backward (norm.cu; sm_90 only): 2-16 block clusters, 1 and 2
    rows a group, partial last groups, more groups than resident clusters, fewer partial rows than
    clusters that fit; dx, and dw / db summed over the partial rows."""
    if torch.cuda.get_device_capability()[0] < 9:
        return
    for cfg, m in (((2, 128, 1, 2, 2), 301), ((4, 128, 2, 1, 3), 9), ((16, 128, 1, 2, 2), 5),
                   ((2, 256, 8, 1, 3), 7), ((4, 256, 4, 2, 3), 37)):
        n = cfg[0] * cfg[1] * cfg[2] * 8
        for dtype, rms in ((torch.bfloat16, False), (torch.float16, True)):
            x, dy = rnd(m, n, dtype=dtype), rnd(m, n, dtype=dtype)
            w = rnd(n, dtype=dtype)
            x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
            if rms:
                rstd = (x64.detach().pow(2).mean(-1) + 1e-6).rsqrt()
                mean = None
                y = x64 * (x64.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w64
            else:
                import torch.nn.functional as F

                mean, rstd = x64.detach().mean(-1), (x64.detach().var(-1, unbiased=False) + 1e-5).rsqrt()
                y = F.layer_norm(x64, (n,), w64, None, 1e-5)
            y.backward(dy.double())
            parts = 3
            dx = torch.empty_like(x)
            dwp = torch.empty(parts, n, device=DEV)
            dbp = None if rms else torch.empty(parts, n, device=DEV)
            ops.norm_bwd(x, dy, w, None if mean is None else mean.float().contiguous(), rstd.float().contiguous(),
                         0.0, rms, list(cfg), dx, dwp, dbp)
            check(f"norm_bwd {cfg} m={m} {dtype} rms={rms} dx", dx, x64.grad, dtype)
            check(f"norm_bwd {cfg} m={m} {dtype} rms={rms} dw", dwp.sum(0), w64.grad, dtype)
            if dbp is not None:
                check(f"norm_bwd {cfg} m={m} {dtype} db", dbp.sum(0), dy.double().sum(0), dtype)


def main() -> int:
    t0 = time.perf_counter()
    if not wcuda.available():
        print(f"sanitize: the CUDA backend is unavailable: {wcuda.unavailable_reason()}", file=sys.stderr)
        return 2
    wcuda.load()
    ops = wcuda.ops()
    torch.manual_seed(0)
    only = set(sys.argv[1:])    # e.g. "reduce": re-check one kernel family
    for part in (run_add, run_reduce, run_softmax, run_matmul, run_layer_norm, run_norm_bwd):
        if only and part.__name__[4:] not in only:
            continue
        t = time.perf_counter()
        part(ops)
        torch.cuda.synchronize()
        print(f"sanitize: {part.__name__[4:]:8s} done ({time.perf_counter() - t:.1f} s)", flush=True)
    print(f"sanitize: ok ({_count} checks, {time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
