"""A norm forward whose next rows arrive while this one is reduced (not the benchmark).

The block kernel (`ops/norms.py`) holds a row in registers, so an SM running one such program
(rows of 16K-32K, 16-32 warps) has no loads in flight while it reduces, scales and stores: on the
H200 LayerNorm 32K reaches 76% of copy, RMSNorm 87% (NOTES items 50, 55, 58). Here a persistent
program walks rows with a software-pipelined loop over TMA loads (``tl.range(num_stages=S)``), so
row r + grid is already on its way into shared memory while row r is worked on. A row of N = R x C
elements is read as a [ROWS, R, C] box of a (M, N / C, C) view (C = 256: a TMA box is at most 256
a dimension); rows past M and boxes past R are zero-filled by the copy engine.

    python benchmarks/probe_norm_tma.py [--ns 1024,4096,8192,16384,32768] [--only ln,rms]

Checks each variant against float64 and the shipped kernel's output, times it with the bench's own
timer, and prints a table (us, % of copy) with torch.compile and the shipped config in the same run.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import warpforge as wf
from warpforge.bench import timing
from warpforge.ops import norms
from warpforge.runtime import device as dev


@triton.jit
def _norm_tma_kernel(x_desc, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, M, N, stride_y, eps,
                     RMS: tl.constexpr, ROWS: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
                     STAGES: tl.constexpr, HOLD: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]          # [R, C] column of the row
    cmask = cols < N
    if HOLD:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0)
        if not RMS:
            b = tl.load(b_ptr + cols, mask=cmask, other=0.0)
    for blk in tl.range(pid, tl.cdiv(M, ROWS), nprog, num_stages=STAGES):
        row0 = blk * ROWS
        x = x_desc.load([row0, 0, 0]).to(tl.float32)                       # [ROWS, R, C]
        rows = row0 + tl.arange(0, ROWS)
        rmask = rows < M
        if RMS:
            rstd = tl.rsqrt(tl.sum(tl.sum(x * x, axis=2), axis=1) / N + eps)
            xh = x * rstd[:, None, None]
        else:
            mean = tl.sum(tl.sum(x, axis=2), axis=1) / N
            xc = tl.where(cmask[None, :, :], x - mean[:, None, None], 0.0)
            rstd = tl.rsqrt(tl.sum(tl.sum(xc * xc, axis=2), axis=1) / N + eps)
            xh = xc * rstd[:, None, None]
            tl.store(mean_ptr + rows, mean, mask=rmask)
        tl.store(rstd_ptr + rows, rstd, mask=rmask)
        if not HOLD:
            # read from L2 each row, after the statistics: the offset is 0 (rstd >= 0) but the
            # compiler cannot know, so the software pipeline leaves these loads alone (it would
            # give each a shared-memory ring as large as x's)
            zero = tl.minimum(tl.min(rstd, axis=0).to(tl.int32), 0)
            w = tl.load(w_ptr + zero + cols, mask=cmask, other=0.0)
            if not RMS:
                b = tl.load(b_ptr + zero + cols, mask=cmask, other=0.0)
        y = xh * w.to(tl.float32)[None, :, :]
        if not RMS:
            y += b.to(tl.float32)[None, :, :]
        ptrs = y_ptr + rows.to(tl.int64)[:, None, None] * stride_y + cols[None, :, :]
        tl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=rmask[:, None, None] & cmask[None, :, :])


def norm_tma(x, w, b, eps, rms, rows, warps, stages, hold, per_sm):
    m, n = x.shape
    c = min(256, n)
    r = n // c
    rp = triton.next_power_of_2(r)
    desc = TensorDescriptor(x, [m, r, c], [x.stride(0), c, 1], [rows, rp, c])
    y = torch.empty_like(x)
    mean = torch.empty(m, device=x.device, dtype=torch.float32)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    grid = min(triton.cdiv(m, rows), dev.sm_count() * per_sm)
    _norm_tma_kernel[(grid,)](desc, y, w, b if b is not None else w, mean, rstd, m, n, y.stride(0), eps,
                              RMS=rms, ROWS=rows, R=rp, C=c, STAGES=stages, HOLD=hold, num_warps=warps)
    return y


# (rows a box, warps, stages, hold weights, programs an SM) per N
VARIANTS = {
    1024: [(4, 4, 3, 1, 3), (4, 4, 2, 1, 4), (8, 8, 3, 1, 2), (2, 4, 3, 1, 4), (4, 8, 3, 1, 2)],
    4096: [(1, 4, 3, 1, 3), (1, 4, 3, 1, 4), (1, 8, 3, 1, 2), (1, 4, 4, 1, 3)],
    8192: [(1, 8, 3, 1, 2), (1, 8, 4, 1, 2), (1, 16, 3, 0, 1), (1, 16, 3, 1, 1)],
    16384: [(1, 16, 3, 0, 1), (1, 16, 4, 0, 1), (1, 32, 3, 0, 1)],
    32768: [(1, 32, 3, 0, 1), (1, 32, 2, 0, 1), (1, 16, 3, 0, 1)],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1024,4096,8192,16384,32768")
    ap.add_argument("--only", default="ln,rms")
    args = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    cfg_t = timing.TimingConfig.quick()
    table = []
    for n in (int(v) for v in args.ns.split(",")):
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
        w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * m * n * 2
        for name in args.only.split(","):
            rms = name == "rms"
            bb = None if rms else b
            ref = (norms.rms_norm_reference(x[:64], w, 1e-6) if rms else norms.layer_norm_reference(x[:64], w, b, 1e-5))
            ship = (lambda: wf.rms_norm(x, (n,), w, eps=1e-6)) if rms else (lambda: wf.layer_norm(x, (n,), w, b, eps=1e-5))
            comp = torch.compile((lambda t: torch.nn.functional.rms_norm(t, (n,), w, 1e-6)) if rms
                                 else (lambda t: torch.nn.functional.layer_norm(t, (n,), w, b, 1e-5)))
            comp(x)
            base = ship().clone()
            for what, fn in (("compile", lambda: comp(x)), ("shipped", ship)):
                ms = timing.device_ms(fn, cfg_t, nbytes)
                table.append((n, name, what, ms, 100 * nbytes / ms / 1e6 / copy, 0.0))
                print(table[-1], flush=True)
            for rows, warps, stages, hold, per_sm in VARIANTS.get(n, []):
                what = f"tma {rows}r {warps}w s{stages} {'hold' if hold else 'load'} {per_sm}/SM"
                eps = 1e-6 if rms else 1e-5
                try:
                    fn = lambda: norm_tma(x, w, bb, eps, rms, rows, warps, stages, bool(hold), per_sm)  # noqa: E731
                    out = fn()
                    err = ((out[:64].double() - ref.double()).norm() / ref.double().norm()).item()
                    worst = (out.float() - base.float()).abs().max().item()
                    assert err < 1e-2 and worst <= 0.07, f"err {err} worst {worst}"
                    ms = timing.device_ms(fn, cfg_t, nbytes)
                    table.append((n, name, what, ms, 100 * nbytes / ms / 1e6 / copy, err))
                except Exception as e:  # noqa: BLE001
                    table.append((n, name, f"{what} FAILED {type(e).__name__}: {str(e)[:100]}", 0, 0, 0))
                print(table[-1], flush=True)
        del x
    print(f"\ncopy {copy:,.0f} GB/s; % of copy (bf16, M*N = 2^27)")
    for n, name, what, ms, pct, err in table:
        print(f"{n:7d} {name:4s} {what:34s} {ms * 1e3:8.1f} us {pct:6.1f}%  err {err:.1e}")


if __name__ == "__main__":
    main()
