"""LayerNorm, RMSNorm and fused add+RMSNorm over the last dimension, forward and backward.

    LayerNorm   mu = mean(x), rstd = 1/sqrt(mean((x - mu)^2) + eps), x_hat = (x - mu) * rstd
                y = x_hat * w + b
    RMSNorm     rstd = 1/sqrt(mean(x^2) + eps), x_hat = x * rstd, y = x_hat * (offset + w)
    add+RMSNorm h = x + residual (rounded to the input dtype), normed = rms_norm(h)

    backward, with g = dy * w (or dy * (offset + w)):
    LayerNorm   dx = rstd * (g - x_hat * mean(g * x_hat) - mean(g)), dw = sum_rows(dy * x_hat), db = sum_rows(dy)
    RMSNorm     dx = rstd * (g - x_hat * mean(g * x_hat)),            dw = sum_rows(dy * x_hat)
    add+RMSNorm dh = rms_backward(dnormed) + dh_out;  dx = dresidual = dh

Byte model (s = bytes per element, M rows of N): the forward reads x and writes y, 2*M*N*s (+ N*s
for each of w, b; + M*8 bytes of saved fp32 statistics, 0.05% at N = 4096). The backward reads x
and dy and writes dx, 3*M*N*s, so forward+backward is 5*M*N*s. add+RMSNorm reads x and residual
and writes h and normed (4*M*N*s); its backward reads h, dnormed, dh_out and writes dh (4*M*N*s).
FLOPs are ~8 per element: at 4.3 TB/s and 67 fp32 TFLOP/s an H200 would need ~30 FLOP per bf16
byte to be compute bound, so the bound is memory and the target is the measured copy bandwidth
(~4,250 GB/s on an H200: 32768x4096 bf16 RMSNorm forward is 537 MB, ~126 us at the roof).

Why the kernels look the way they do:
- Forward, ``block`` path (N <= 16,384): a program holds whole rows in registers, so x is read
  once and y written once -- the byte floor. The textbook LayerNorm reads x three times (mean,
  variance, normalise); holding the row makes the two-pass variance free: sum((x - mu)^2) on the
  registers, never E[x^2] - mu^2, which loses every digit when |mu| >> std (x = 1000 + randn in
  fp32: mu^2 = 1e6 carries ~0.06 of absolute error, as large as the variance itself).
  Short rows are packed ROWS to a program so each moves ~8 KB.
- Forward, ``pipe`` path (GPU, N > 32,768; one 32-warp program a row to 32K): C co-resident
  programs share a row and exchange per-chunk statistics, one row behind (see the kernel). Still
  one read and one write per element at N = 262,144, at 89-95% of the copy roof on an H100.
- Forward, ``loop`` path (fallback, and the interpreter past 16,384): one program per row, two
  passes (statistics with a running Chan merge per chunk, then normalise): 1.5x the bytes.
- Forward, ``loop`` path with N compiled in (heuristics.NORM_LOOP_CONST; the H200 at 8K and 32K
  where the step divides N): fixed trip counts and no masks. The code the compiler makes of it
  differs by shape, for better or worse (benchmarks/NOTES.md item 105), so only measured shapes
  take it; LayerNorm at 32K reads 94% of the copy roof that way, against 86% at best with N a
  runtime argument.
- Forward, LayerNorm rows of 65,536 and 262,144 on the H200 (heuristics.NORM_LAYER_CLUSTER):
  the CUDA backend's cluster kernel (``warpforge/cuda/csrc/norm.cu``), where that backend builds
  (nvcc and ninja; built on first use, cached). A row is spread over a thread-block cluster whose
  blocks each keep their column slice of w and b in registers for every row and exchange partial
  statistics through distributed shared memory, so neither x nor the parameters are re-read from
  L2 -- the Triton kernels' limit at those lengths on that device. ``WARPFORGE_NORM_CUDA=0``
  keeps the Triton kernels.
- Backward: x_hat is recomputed from x and the saved fp32 (mean, rstd) -- never saved, which
  would cost another M*N*s write and read. For rows up to 8,192 (RMSNorm; LayerNorm in a 2-byte
  dtype on the H100 and H200, heuristics.NORM_LAYER_BWD_WIDE) or 4,096 (LayerNorm otherwise)
  one pass over (x, dy) computes the row statistics in registers and writes dx: the byte floor
  3*M*N*s. The limit is registers, not bytes: x, dy, x_hat, g, the dw (and db) accumulators and
  the prefetched next tile are ~15 registers per element a thread holds, and ptxas for sm_90
  fits 8 elements a thread (16 warps over 4,096) in 128 registers but spills 1.4-1.8 KB a
  thread at 16,384 (see ``runtime/heuristics.py: norm_bwd_config``).
- Backward, LayerNorm and RMSNorm rows of 32,768, 65,536 and 262,144 on the H200 (2-byte dtypes,
  no residual gradient, not the "llama" casting mode; heuristics.NORM_BWD_CLUSTER): the CUDA
  backend's cluster backward (same file, same structure as the forward: w held and dw/db summed in
  registers over the rows a block walks, x and dy staged by bulk copies, the two row sums exchanged
  through distributed shared memory). It reads x and dy once, against the Triton kernels' re-reads
  from L2 at those lengths.
- Weight and bias gradients are deterministic: a persistent grid of G programs (~16 warps per
  SM: 132 row groups on a 132-SM H200 at 16 warps), each walking a fixed contiguous range of
  rows and accumulating dw (and db) in fp32 registers, writes one row of a (G, N) fp32 buffer,
  reduced in a fixed order and cast to the parameter's dtype: for G <= GRAD_SUM_MAX (every small
  call) by ``_grad_sum_kernel``, one launch for both parameters, else by ``buffer.sum(0)``; one
  row group stores the sums itself. No atomics, so two runs give the same bits. The buffer costs
  2*G*N*4 bytes: 4.3 MB against 805 MB for a 32768x4096 bf16 backward.
  Each program loads its next tile of (x, dy) before computing the current one, so with only
  one program per SM the memory pipe still has a tile in flight. With ``stages`` set
  (RowConfig.stages; on the H200, LayerNorm's 8,192-column programs) the compiler's software
  pipeline stages the next tiles through shared memory instead (cp.async): three tiles in
  flight, none held in registers.
- Backward for longer rows, ``split`` (to 32K) and ``pipe`` (past it, the wait a row behind)
  paths (GPU): C co-resident programs share a row as in the forward and exchange the chunk sums
  of g * x_hat (and g); each program owns one column chunk for all of its row group's rows, so
  its dw/db chunk accumulates in registers and is written once per group into a (groups, N)
  partial buffer: one pass, deterministic.
- Backward ``loop`` path (the interpreter's, and rows past the split path's reach): the row
  statistics come from a first kernel (reads x, dy), then (row group, 4,096-column tile) programs
  write dx and the dw partials: x and dy are read twice, 5*M*N*s instead of 3*M*N*s.
- All statistics are fp32 whatever the input dtype; each output is cast once, at the store.
  ``casting_mode="llama"`` rounds x_hat to the input dtype before the weight multiply, as
  Hugging Face's LlamaRMSNorm does; "gemma" (default) keeps everything fp32 until the store.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import fastpath, new_empty
from ..runtime.checks import check_finite, check_normalized_shape, check_same, check_tensor, check_weight
from ..runtime.heuristics import (NORM_LOOP_ROWS_PER_SM, grad_grid, grad_sum_config, layer_norm_cluster_config,
                                  norm_bwd_cluster_config, norm_bwd_config, norm_fwd_config, sm_count)
from ..runtime.device import device_name
from ..runtime.registry import Op
from ..runtime.launch import run
from ._cluster_rows import cluster_route
from ._rows import as_rows, gather_row_stats, load_cols, publish_row_stats, split_launch, store_cols

CASTING_MODES = ("gemma", "llama")


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------
def _ref_float(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.device.type == "cpu" else t.float()


def layer_norm_reference(x, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """Ground truth in float64 (float32 on devices without it), cast back to x's dtype."""
    xf = _ref_float(x)
    mu = xf.mean(-1, keepdim=True)
    var = (xf - mu).pow(2).mean(-1, keepdim=True)
    y = (xf - mu) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * _ref_float(weight)
    if bias is not None:
        y = y + _ref_float(bias)
    return y.to(x.dtype)


def rms_norm_reference(x, weight=None, eps: float | None = None, offset: float = 0.0,
                       casting_mode: str = "gemma") -> torch.Tensor:
    """Ground truth: float64 maths ("gemma"), or HF Llama's rounding of x_hat to x's dtype before
    the weight multiply ("llama"). Differentiable (the rounding passes gradients straight through)."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    xf = _ref_float(x)
    x_hat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if casting_mode == "llama":
        x_hat = x_hat.to(x.dtype).to(xf.dtype)
    if weight is not None:
        x_hat = x_hat * (offset + _ref_float(weight))
    return x_hat.to(x.dtype)


def add_rms_norm_reference(x, residual, weight, eps: float | None = None, offset: float = 0.0):
    """(rms_norm(h), h) with h = x + residual rounded to x's dtype, as the fused kernel returns."""
    h = (_ref_float(x) + _ref_float(residual)).to(x.dtype)
    return rms_norm_reference(h, weight, eps, offset), h


# ----------------------------------------------------------------------------------------------
# Triton kernels. One family: constexpr flags pick LayerNorm (RMS=False) or RMSNorm (RMS=True),
# the optional weight/bias, the fused residual add (HAS_RES) and Llama rounding (LLAMA). Pointers
# of absent tensors are placeholders that are never touched.
# ----------------------------------------------------------------------------------------------
EARLY_PARAMS_MAX = tl.constexpr(4096)  # the block forward's widest program that loads w and b with x


@triton.jit
def _norm_fwd_block_kernel(
    x_ptr, res_ptr,            # (M, N) input and residual (HAS_RES), column stride 1, any row stride
    y_ptr, h_ptr,              # (M, N) contiguous outputs: normed, and x + residual (HAS_RES)
    w_ptr, b_ptr,              # (N,) weight (HAS_W), bias (HAS_B); fp32 or the input dtype
    mean_ptr, rstd_ptr,        # (M,) fp32 saved statistics (mean only for LayerNorm)
    M, N, stride_x, stride_r, stride_y, stride_h,
    eps, offset,
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr,
    LLAMA: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_OFFSET: tl.constexpr = True,   # offset != 0 (Gemma's 1 + w): else no add an element
    EVEN_N: tl.constexpr = False,      # N == BLOCK_N: no column is masked, so no select an element
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    r = rows.to(tl.int64)[:, None]
    # Programs of up to 4,096 elements (every row to 4K, the decode shapes among them) load the
    # weight and bias with x rather than after the row's reductions: a decode-sized call then waits
    # for memory once, not twice (LayerNorm, 64 x 4,096 bf16, H100: 7.3 -> 5.5 us). Wider programs
    # load them late: held from the start they spill (32K x 32 warps: 94.6 -> 75.4% of copy).
    if HAS_W:
        if ROWS * BLOCK_N <= EARLY_PARAMS_MAX:
            w = tl.load(w_ptr + cols, mask=cmask, other=0.0)
    if HAS_B:
        if ROWS * BLOCK_N <= EARLY_PARAMS_MAX:
            b = tl.load(b_ptr + cols, mask=cmask, other=0.0)
    x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + r * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = x.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + r * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)                        # normalise the value we return
    if RMS:
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        x_hat = x * rstd[:, None]
    else:
        mean = tl.sum(x, axis=1) / N
        if EVEN_N:
            xc = x - mean[:, None]     # rows past M are zeros, their mean 0: xc stays 0 there
        else:
            xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
        x_hat = xc * rstd[:, None]
        tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)
    if LLAMA:
        x_hat = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
    y = x_hat
    if HAS_W:
        if ROWS * BLOCK_N > EARLY_PARAMS_MAX:
            w = tl.load(w_ptr + cols, mask=cmask, other=0.0)
        if HAS_OFFSET:
            y = y * (w.to(tl.float32) + offset)[None, :]
        else:
            y = y * w.to(tl.float32)[None, :]
    if HAS_B:
        if ROWS * BLOCK_N > EARLY_PARAMS_MAX:
            b = tl.load(b_ptr + cols, mask=cmask, other=0.0)
        y += b.to(tl.float32)[None, :]
    tl.store(y_ptr + r * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_fwd_pipe_kernel(
    x_ptr, res_ptr, y_ptr, h_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr,   # as the block kernel
    M, N, stride_x, stride_r, stride_y, stride_h, eps, offset,
    stats_ptr, C, n_groups,    # the exchange workspace, programs a row, row groups (_rows.split_launch)
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr,
    LLAMA: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr, RELOAD: tl.constexpr,
    HAS_OFFSET: tl.constexpr = True,
):
    """Rows past 32K on a GPU: C co-resident programs share a row, each holding one column chunk,
    and exchange per-chunk statistics (``_rows.py``): RMSNorm its chunk's sum of squares;
    LayerNorm (chunk mean, chunk M2), combined with Chan's parallel formula
    M2 = sum_c [M2_c + n_c * (mean_c - mean)^2], which only ever subtracts means (the block
    path's accuracy). The wait is deferred by one row: a program publishes row r's statistics,
    then finishes row r - n_groups, whose statistics the group published one step earlier, so the
    exchange's latency is off the critical path (a program holds three rows' chunks: r + n_groups
    in flight, r raw, r - n_groups being written). RELOAD: re-read the weight and bias chunks
    every row (L1/L2 hits) rather than hold them, two fp32 registers an element."""
    pid = tl.program_id(0)
    chunk = pid % C
    first = pid // C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    if not RELOAD:
        if HAS_W:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_OFFSET:
                w += offset
        if HAS_B:
            b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    offs = tl.arange(0, CP)
    n_c = tl.minimum(tl.maximum(N - offs * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    n_mine = tl.minimum(N - chunk * BLOCK_N, BLOCK_N).to(tl.float32)
    live = mask & (first < M)
    x = tl.load(x_ptr + tl.cast(first, tl.int64) * stride_x + cols, mask=live, other=0.0)
    if HAS_RES:
        res = tl.load(res_ptr + tl.cast(first, tl.int64) * stride_r + cols, mask=live, other=0.0)
        hp = tl.zeros((BLOCK_N,), h_ptr.dtype.element_ty)
    else:
        hp = tl.zeros((BLOCK_N,), x_ptr.dtype.element_ty)
    for row in range(first, M + n_groups, n_groups):
        r = tl.cast(row, tl.int64)
        here = row < M
        if HAS_RES:
            h = (x.to(tl.float32) + res.to(tl.float32)).to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + r * stride_h + cols, h, mask=mask & here)
        else:
            h = x
        xf = h.to(tl.float32)
        nxt = row + n_groups
        live = mask & (nxt < M)
        x = tl.load(x_ptr + tl.cast(nxt, tl.int64) * stride_x + cols, mask=live, other=0.0)
        if HAS_RES:
            res = tl.load(res_ptr + tl.cast(nxt, tl.int64) * stride_r + cols, mask=live, other=0.0)
        if here:
            if RMS:
                ss_c = tl.sum(xf * xf, axis=0)
                publish_row_stats(stats_ptr, row, chunk, C, ss_c, ss_c)
            else:
                mean_c = tl.sum(xf, axis=0) / n_mine
                d = tl.where(mask, xf - mean_c, 0.0)
                publish_row_stats(stats_ptr, row, chunk, C, mean_c, tl.sum(d * d, axis=0))
        prev = row - n_groups
        if prev >= first:
            # the weight and bias chunks are re-read every row (L1/L2 hits) rather than held:
            # with three rows' chunks live, holding them in fp32 costs two registers an element
            if RELOAD:
                if HAS_W:
                    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                    if HAS_OFFSET:
                        w += offset
                if HAS_B:
                    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            pf = hp.to(tl.float32)
            a, b_stat, valid = gather_row_stats(stats_ptr, prev, C, CP)
            if RMS:
                rstd = tl.rsqrt(tl.sum(a, axis=0) / N + eps)
                x_hat = pf * rstd
            else:
                mean = tl.sum(tl.where(valid, n_c * a, 0.0), axis=0) / N
                dm = a - mean
                m2 = tl.sum(tl.where(valid, b_stat + n_c * dm * dm, 0.0), axis=0)
                rstd = tl.rsqrt(m2 / N + eps)
                x_hat = (pf - mean) * rstd
                if chunk == 0:
                    tl.store(mean_ptr + prev, mean)
            if chunk == 0:
                tl.store(rstd_ptr + prev, rstd)
            if LLAMA:
                x_hat = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
            y = x_hat
            if HAS_W:
                y = y * w
            if HAS_B:
                y += b
            tl.store(y_ptr + tl.cast(prev, tl.int64) * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
        hp = h


@triton.jit
def _norm_fwd_loop_kernel(
    x_ptr, res_ptr, y_ptr, h_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr,   # as the block kernel
    M, N, stride_x, stride_r, stride_y, stride_h, eps, offset,
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr,
    LLAMA: tl.constexpr, BLOCK_N: tl.constexpr, HAS_OFFSET: tl.constexpr = True, N_CONST: tl.constexpr = 0,
):
    """RMSNorm (and add+RMSNorm) in two passes over a row too long to hold: pass 1 sums squares
    per lane, pass 2 re-reads the row (from L2) and normalises. LayerNorm has its own loop kernel
    (_layer_norm_fwd_loop_kernel). N_CONST > 0: N compiled in (== N), a whole number of BLOCK_N
    steps: fixed trip counts and no column masks."""
    tl.static_assert(RMS, "the loop kernel is RMSNorm's; LayerNorm takes _layer_norm_fwd_loop_kernel")
    tl.static_assert(N_CONST % BLOCK_N == 0, "N_CONST is a whole number of BLOCK_N steps")
    MASKED: tl.constexpr = N_CONST == 0
    if N_CONST > 0:
        n_cols = N_CONST
    else:
        n_cols = N
    row = tl.program_id(0)
    r = row.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    # pass 1: per-lane sum of squares. With a residual, h is written here and re-read in pass 2.
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        # pass 2 re-reads the row: keep x in L2 (evict-last) until then; with a residual it
        # re-reads h instead, so x and the residual go (evict-first)
        if HAS_RES:
            x = tl.load(x_ptr + r * stride_x + start + cols, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            x += tl.load(res_ptr + r * stride_r + start + cols, mask=mask, other=0.0,
                         eviction_policy="evict_first").to(tl.float32)
            h = x.to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + r * stride_h + start + cols, h, mask=mask)
            x = h.to(tl.float32)
        else:
            x = load_cols(x_ptr + r * stride_x + start + cols, mask, 0.0, MASKED, "evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    if HAS_RES:
        tl.debug_barrier()                            # pass 1's h stores before pass 2's loads
    # pass 2: normalise
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        if HAS_RES:
            x = tl.load(h_ptr + r * stride_h + start + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            x = load_cols(x_ptr + r * stride_x + start + cols, mask, 0.0, MASKED, "evict_first").to(tl.float32)
        x_hat = x * rstd
        if LLAMA:
            x_hat = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
        y = x_hat
        if HAS_W:
            w = load_cols(w_ptr + start + cols, mask, 0.0, MASKED, "evict_last").to(tl.float32)
            if HAS_OFFSET:
                w += offset
            y = y * w
        store_cols(y_ptr + r * stride_y + start + cols, y.to(y_ptr.dtype.element_ty), mask, MASKED)


LN_GROUP = tl.constexpr(8)   # the LayerNorm loop's in-thread group: one 16-byte load of bf16 a thread


@triton.jit
def _layer_norm_fwd_loop_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr,   # as the block kernel (no residual)
    M, N, stride_x, stride_y, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,        # rows a program (pass 2 loads each weight and bias step once for all)
    EVEN_N: tl.constexpr,      # BLOCK_N divides N: no step masks a column
    N_CONST: tl.constexpr = 0,  # > 0: N compiled in (== N; EVEN_N, ROWS 1, a program a row): no masks at all
):
    """LayerNorm in two passes over rows too long to hold (pass 2 re-reads them from L2).

    Pass 1 keeps no reduction across threads inside its loop, so a step's loads never wait on
    one: each row's step is viewed as (BLOCK_N / 8, 8) groups of 8 adjacent columns, one group a
    thread's 16-byte load; a group's mean and M2 are reduced in the thread and merged into that
    group position's running (count, mean, M2) by Chan's formula. After the loop the group
    positions are merged across the program, once a row. Only means are subtracted, so a row with
    a large mean loses no variance to cancellation (as the block kernel's two passes).
    What still separates it from RMSNorm at 32K is pass 2's weight and bias, a 64 KB stream each
    a row through an L2 already near its limit (H200, benchmarks/NOTES.md item 66). ROWS > 1
    (rows held in the thread) shares those loads between rows, but measured 1.3-2x slower there;
    the heuristics take 1 and ROWS stays for the probes."""
    G: tl.constexpr = BLOCK_N // LN_GROUP
    tl.static_assert(N_CONST == 0 or (EVEN_N and ROWS == 1 and N_CONST % BLOCK_N == 0))
    MASKED: tl.constexpr = N_CONST == 0
    if N_CONST > 0:
        n_cols = N_CONST
    else:
        n_cols = N
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = (rows < M)[:, None, None]
    base_x = rows.to(tl.int64)[:, None, None] * stride_x
    offs = (tl.arange(0, G)[:, None] * LN_GROUP + tl.arange(0, LN_GROUP)[None, :])[None, :, :]
    g_mean = tl.zeros((ROWS, G), tl.float32)
    g_m2 = tl.zeros((ROWS, G), tl.float32)
    g_n = tl.zeros((ROWS, G), tl.float32)      # columns merged so far at each group position
    for start in range(0, n_cols, BLOCK_N):
        # pass 2 re-reads the rows: keep x in L2 (evict-last) until then
        if EVEN_N:
            x = load_cols(x_ptr + base_x + start + offs, live, 0.0, MASKED, "evict_last").to(tl.float32)
            m_c = tl.sum(x, axis=2) * (1.0 / LN_GROUP)
            d = x - m_c[:, :, None]
            n_old = start / G                                    # a position's columns before this step
            frac = LN_GROUP / (n_old + LN_GROUP)                 # this step's share of them after
        else:
            mask = live & (start + offs < N)
            x = tl.load(x_ptr + base_x + start + offs, mask=mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
            # the group's count, tied to x (masked columns load 0) so that it is computed in x's
            # layout: from the mask alone the compiler reduces it in another and converts (a barrier)
            c = tl.sum(tl.where(mask, 1.0, x * 0.0), axis=2)
            m_c = tl.sum(x, axis=2) / tl.maximum(c, 1.0)
            d = tl.where(mask, x - m_c[:, :, None], 0.0)
            n_old = g_n
            g_n += c
            frac = c / tl.maximum(g_n, 1.0)
        delta = m_c - g_mean
        g_mean += delta * frac
        g_m2 += tl.sum(d * d, axis=2) + delta * delta * (n_old * frac)
    if EVEN_N:
        mean = tl.sum(g_mean, axis=1) / G
        dm = g_mean - mean[:, None]
        m2 = tl.sum(g_m2 + dm * dm * (n_cols / G), axis=1)
    else:
        mean = tl.sum(g_mean * g_n, axis=1) / N
        dm = tl.where(g_n > 0, g_mean - mean[:, None], 0.0)
        m2 = tl.sum(g_m2 + dm * dm * g_n, axis=1)
    rstd = tl.rsqrt(m2 / n_cols + eps)
    tl.store(mean_ptr + rows, mean, mask=rows < M)
    tl.store(rstd_ptr + rows, rstd, mask=rows < M)
    mean = mean[:, None, None]
    rstd = rstd[:, None, None]
    base_y = rows.to(tl.int64)[:, None, None] * stride_y
    # pass 2: normalise
    for start in range(0, n_cols, BLOCK_N):
        cmask = start + offs < N
        mask = live & cmask
        x = load_cols(x_ptr + base_x + start + offs, mask, 0.0, MASKED, "evict_first").to(tl.float32)
        y = (x - mean) * rstd
        if HAS_W:
            y = y * load_cols(w_ptr + start + offs, cmask, 0.0, MASKED, "evict_last").to(tl.float32)
        if HAS_B:
            y += load_cols(b_ptr + start + offs, cmask, 0.0, MASKED, "evict_last").to(tl.float32)
        store_cols(y_ptr + base_y + start + offs, y.to(y_ptr.dtype.element_ty), mask, MASKED)


@triton.jit
def _norm_bwd_stats_kernel(
    dy_ptr, x_ptr,             # (M, N) incoming gradient and saved input, any row strides
    w_ptr, mean_ptr, rstd_ptr,  # (N,) weight (HAS_W), (M,) fp32 saved statistics
    c_ptr,                     # (M, 2) fp32 out: mean(g * x_hat), mean(g) per row
    M, N, stride_dy, stride_x, offset,
    RMS: tl.constexpr, HAS_W: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The backward's row statistics for N > 16,384 (loop path, pass 1 of 2)."""
    row = tl.program_id(0)
    r = row.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rstd = tl.load(rstd_ptr + row)
    if RMS:
        mean = 0.0
    else:
        mean = tl.load(mean_ptr + row)
    acc1 = tl.zeros((BLOCK_N,), tl.float32)
    acc2 = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, N, BLOCK_N):
        mask = start + cols < N
        x = tl.load(x_ptr + r * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(dy_ptr + r * stride_dy + start + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_W:
            g = g * (tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32) + offset)
        acc1 += g * ((x - mean) * rstd)                 # g = 0 in masked lanes
        acc2 += g
    tl.store(c_ptr + row * 2, tl.sum(acc1, axis=0) / N)
    tl.store(c_ptr + row * 2 + 1, tl.sum(acc2, axis=0) / N)


@triton.jit
def _norm_bwd_finish(g, x_hat, dy, c1, c2, rstd, dx_ptrs, ds_ptrs, mask, dw_acc, db_acc, x_ptr,
                     RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     HAS_DSUM: tl.constexpr, LLAMA: tl.constexpr):
    """The end of one backward step, shared by the block and split kernels: dx from the row
    statistics (c1 = mean(g * x_hat), c2 = mean(g), already broadcast by the caller; c2 unused
    for RMSNorm) plus the gradient of the x + residual output, stored; then this step's dw/db
    contributions. Returns the updated (dw_acc, db_acc)."""
    if RMS:
        dx = (g - x_hat * c1) * rstd
    else:
        dx = (g - x_hat * c1 - c2) * rstd
    if HAS_DSUM:
        dx += tl.load(ds_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dx_ptrs, dx.to(dx_ptrs.dtype.element_ty), mask=mask)
    if HAS_W:
        if LLAMA:                                       # y = round(x_hat) * w: dw sees round(x_hat)
            x_hat = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
        dw_acc += dy * x_hat
    if HAS_B:
        db_acc += dy
    return dw_acc, db_acc


@triton.jit
def _norm_bwd_terms(xf, dyf, w, row, mean_ptr, rstd_ptr, mask, RMS: tl.constexpr, HAS_W: tl.constexpr):
    """One row's chunk of the exchange backward: (x_hat, g = dy * w, rstd) from its fp32 x and dy
    and the saved statistics (``w``: the weight chunk, offset applied; unused without HAS_W)."""
    rstd = tl.load(rstd_ptr + row)
    if RMS:
        x_hat = xf * rstd
    else:
        x_hat = tl.where(mask, (xf - tl.load(mean_ptr + row)) * rstd, 0.0)
    g = dyf * w if HAS_W else dyf
    return x_hat, g, rstd


@triton.jit
def _norm_bwd_publish(stats_ptr, row, chunk, C, g, x_hat, RMS: tl.constexpr):
    """Publish this chunk's sum of g * x_hat (and, for LayerNorm, of g)."""
    s1 = tl.sum(g * x_hat, axis=0)
    if RMS:
        publish_row_stats(stats_ptr, row, chunk, C, s1, s1)   # one statistic; slot 2 unused
    else:
        publish_row_stats(stats_ptr, row, chunk, C, s1, tl.sum(g, axis=0))


@triton.jit
def _norm_bwd_row_means(stats_ptr, row, C, N, CP: tl.constexpr, RMS: tl.constexpr):
    """Wait for every chunk of ``row`` and return c1 = mean(g * x_hat) and c2 = mean(g) (c1 again
    for RMSNorm, which has no mean(g) term)."""
    a, b_stat, valid = gather_row_stats(stats_ptr, row, C, CP)
    c1 = tl.sum(a, axis=0) / N
    c2 = c1
    if not RMS:
        c2 = tl.sum(b_stat, axis=0) / N
    return c1, c2


@triton.jit
def _norm_bwd_split_kernel(
    dy_ptr, x_ptr, dsum_ptr,   # (M, N) incoming gradient, saved input, gradient of x + residual
    w_ptr, mean_ptr, rstd_ptr,  # (N,) weight (HAS_W); (M,) fp32 saved statistics
    dx_ptr,                    # (M, N) contiguous out
    dw_ptr, db_ptr,            # (n_groups, N) fp32 out: each row group's partial sums
    M, N, stride_dy, stride_x, stride_ds, stride_dx, offset,
    stats_ptr, C, n_groups,    # the split exchange (``_rows.py``)
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DSUM: tl.constexpr,
    LLAMA: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr,
):
    """Backward for rows too long for one program (GPU): C programs share a row, exchange the
    chunk sums of g * x_hat (and g), and write dx from the (x, dy) they hold: x and dy are read
    once. Each program owns one column chunk for all of its group's rows, so it accumulates that
    chunk of dw/db in registers and writes one partial row per group: deterministic."""
    pid = tl.program_id(0)
    chunk = pid % C
    group = pid // C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros((BLOCK_N,), tl.float32)
    db_acc = tl.zeros((BLOCK_N,), tl.float32)
    live = mask & (group < M)
    x = tl.load(x_ptr + tl.cast(group, tl.int64) * stride_x + cols, mask=live, other=0.0)
    dy = tl.load(dy_ptr + tl.cast(group, tl.int64) * stride_dy + cols, mask=live, other=0.0)
    for row in range(group, M, n_groups):
        r = tl.cast(row, tl.int64)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        nxt = row + n_groups                          # prefetch the next row first
        live = mask & (nxt < M)
        x = tl.load(x_ptr + tl.cast(nxt, tl.int64) * stride_x + cols, mask=live, other=0.0)
        dy = tl.load(dy_ptr + tl.cast(nxt, tl.int64) * stride_dy + cols, mask=live, other=0.0)
        x_hat, g, rstd = _norm_bwd_terms(xf, dyf, w if HAS_W else dyf, row, mean_ptr, rstd_ptr, mask, RMS, HAS_W)
        _norm_bwd_publish(stats_ptr, row, chunk, C, g, x_hat, RMS)
        c1, c2 = _norm_bwd_row_means(stats_ptr, row, C, N, CP, RMS)
        dw_acc, db_acc = _norm_bwd_finish(
            g, x_hat, dyf, c1, c2, rstd,
            dx_ptr + r * stride_dx + cols, dsum_ptr + r * stride_ds + cols, mask, dw_acc, db_acc, x_ptr,
            RMS, HAS_W, HAS_B, HAS_DSUM, LLAMA)
    part = tl.cast(group, tl.int64) * N + cols
    if HAS_W:
        tl.store(dw_ptr + part, dw_acc, mask=mask)
    if HAS_B:
        tl.store(db_ptr + part, db_acc, mask=mask)


@triton.jit
def _norm_bwd_pipe_kernel(
    dy_ptr, x_ptr, dsum_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,   # as the split kernel
    M, N, stride_dy, stride_x, stride_ds, stride_dx, offset,
    stats_ptr, C, n_groups,
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DSUM: tl.constexpr,
    LLAMA: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr, RELOAD: tl.constexpr,
):
    """The split backward with the wait deferred by one row (as ``_norm_fwd_pipe_kernel``):
    publish row r's chunk sums, then finish row r - n_groups from its raw (x, dy), kept in
    registers for that one step. RELOAD: re-read the weight chunk every row."""
    pid = tl.program_id(0)
    chunk = pid % C
    group = pid // C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    if not RELOAD:
        if HAS_W:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros((BLOCK_N,), tl.float32)
    db_acc = tl.zeros((BLOCK_N,), tl.float32)
    live = mask & (group < M)
    x = tl.load(x_ptr + tl.cast(group, tl.int64) * stride_x + cols, mask=live, other=0.0)
    dy = tl.load(dy_ptr + tl.cast(group, tl.int64) * stride_dy + cols, mask=live, other=0.0)
    xp = tl.zeros((BLOCK_N,), x_ptr.dtype.element_ty)
    dyp = tl.zeros((BLOCK_N,), dy_ptr.dtype.element_ty)
    for row in range(group, M + n_groups, n_groups):
        here = row < M
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        xr = x
        dyr = dy
        nxt = row + n_groups
        live = mask & (nxt < M)
        x = tl.load(x_ptr + tl.cast(nxt, tl.int64) * stride_x + cols, mask=live, other=0.0)
        dy = tl.load(dy_ptr + tl.cast(nxt, tl.int64) * stride_dy + cols, mask=live, other=0.0)
        if HAS_W and RELOAD:      # re-read every row (an L1/L2 hit): frees a register an element
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + offset
        if here:
            x_hat, g, rstd = _norm_bwd_terms(xf, dyf, w if HAS_W else dyf, row, mean_ptr, rstd_ptr, mask, RMS, HAS_W)
            _norm_bwd_publish(stats_ptr, row, chunk, C, g, x_hat, RMS)
        prev = row - n_groups
        if prev >= group:
            r = tl.cast(prev, tl.int64)
            pxf = xp.to(tl.float32)
            pdy = dyp.to(tl.float32)
            x_hat, g, rstd = _norm_bwd_terms(pxf, pdy, w if HAS_W else pdy, prev, mean_ptr, rstd_ptr, mask, RMS, HAS_W)
            c1, c2 = _norm_bwd_row_means(stats_ptr, prev, C, N, CP, RMS)
            dw_acc, db_acc = _norm_bwd_finish(
                g, x_hat, pdy, c1, c2, rstd,
                dx_ptr + r * stride_dx + cols, dsum_ptr + r * stride_ds + cols, mask, dw_acc, db_acc, x_ptr,
                RMS, HAS_W, HAS_B, HAS_DSUM, LLAMA)
        xp = xr
        dyp = dyr
    part = tl.cast(group, tl.int64) * N + cols
    if HAS_W:
        tl.store(dw_ptr + part, dw_acc, mask=mask)
    if HAS_B:
        tl.store(db_ptr + part, db_acc, mask=mask)


@triton.jit
def _norm_bwd_tile(x, dy, rows, rmask, mask, r, cols, cmask, w_ptr, mean_ptr, rstd_ptr, c_ptr, dx_ptr, dsum_ptr,
                   dw_acc, db_acc, x_ptr, N, stride_ds, stride_dx, offset,
                   RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DSUM: tl.constexpr,
                   LLAMA: tl.constexpr, FULL_ROW: tl.constexpr):
    """One (ROWS, BLOCK_N) tile of ``_norm_bwd_kernel`` from its fp32 x and dy: dx stored, the
    tile's dw/db added to the accumulators (returned)."""
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    if RMS:
        x_hat = x * rstd[:, None]
    else:
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    if HAS_W:
        # re-read per tile (an L1 hit) rather than pinned in registers: at 8,192 columns that
        # frees 16 registers a thread, the difference between spilling and not
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32) + offset
        g = dy * w[None, :]
    else:
        g = dy
    if FULL_ROW:
        c1 = tl.sum(g * x_hat, axis=1) / N
    else:
        c1 = tl.load(c_ptr + rows * 2, mask=rmask, other=0.0)
    c2 = c1                                         # RMSNorm has no mean(g) term
    if not RMS:
        if FULL_ROW:
            c2 = tl.sum(g, axis=1) / N
        else:
            c2 = tl.load(c_ptr + rows * 2 + 1, mask=rmask, other=0.0)
    return _norm_bwd_finish(
        g, x_hat, dy, c1[:, None], c2[:, None], rstd[:, None],
        dx_ptr + r * stride_dx + cols[None, :], dsum_ptr + r * stride_ds + cols[None, :], mask,
        dw_acc, db_acc, x_ptr, RMS, HAS_W, HAS_B, HAS_DSUM, LLAMA)


@triton.jit
def _norm_bwd_kernel(
    dy_ptr, x_ptr,             # (M, N) incoming gradient and saved input (h for add+RMSNorm)
    dsum_ptr,                  # (M, N) gradient of the x + residual output (HAS_DSUM)
    w_ptr, mean_ptr, rstd_ptr,  # (N,) weight (HAS_W); (M,) fp32 saved statistics
    c_ptr,                     # (M, 2) fp32 row statistics from _norm_bwd_stats_kernel (not FULL_ROW)
    dx_ptr,                    # (M, N) contiguous out
    dw_ptr, db_ptr,            # (G, N) fp32 out: this program's partial sums over its rows
    M, N, stride_dy, stride_x, stride_ds, stride_dx, rows_per_prog, offset,
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DSUM: tl.constexpr,
    LLAMA: tl.constexpr, FULL_ROW: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    GRID_PER_SM: tl.constexpr, STAGES: tl.constexpr = 0,
):
    """dx and deterministic dw/db partials. Program (g, c) owns rows [g*rows_per_prog, +rows_per_prog)
    and columns [c*BLOCK_N, +BLOCK_N). FULL_ROW (block path, one column tile): the row statistics
    are computed here, in one pass over (x, dy); else they come from c_ptr. GRID_PER_SM is not
    read here: it names the weight-gradient grid (``grad_grid``) the launch used, which the eager
    fast path (runtime/csrc/fastpath.cpp) reads from the offered launch to size its own grids."""
    g_id = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    dw_acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
    db_acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
    row_start = g_id * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    if STAGES > 0:
        # the compiler's software pipeline stages the next STAGES - 1 tiles of x and dy through
        # shared memory (cp.async): more bytes in flight than registers hold, and none of them
        # costs a register while this tile is computed
        for r0 in tl.range(row_start, row_end, ROWS, num_stages=STAGES):
            rows = r0 + tl.arange(0, ROWS)
            rmask = rows < row_end
            mask = rmask[:, None] & cmask[None, :]
            r = rows.to(tl.int64)[:, None]
            x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + r * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dw_acc, db_acc = _norm_bwd_tile(x, dy, rows, rmask, mask, r, cols, cmask, w_ptr, mean_ptr, rstd_ptr,
                                            c_ptr, dx_ptr, dsum_ptr, dw_acc, db_acc, x_ptr, N, stride_ds,
                                            stride_dx, offset, RMS, HAS_W, HAS_B, HAS_DSUM, LLAMA, FULL_ROW)
    else:
        # software pipeline by hand: the next tile's x and dy are in flight (in registers) while
        # this one is computed, so a program keeps the memory pipe busy on its own
        rows = row_start + tl.arange(0, ROWS)
        mask = (rows < row_end)[:, None] & cmask[None, :]
        r = rows.to(tl.int64)[:, None]
        x_next = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=0.0)
        dy_next = tl.load(dy_ptr + r * stride_dy + cols[None, :], mask=mask, other=0.0)
        for r0 in range(row_start, row_end, ROWS):
            rows = r0 + tl.arange(0, ROWS)
            rmask = rows < row_end
            mask = rmask[:, None] & cmask[None, :]
            r = rows.to(tl.int64)[:, None]
            x = x_next.to(tl.float32)
            dy = dy_next.to(tl.float32)
            nrows = rows + ROWS
            nmask = (nrows < row_end)[:, None] & cmask[None, :]
            nr = nrows.to(tl.int64)[:, None]
            x_next = tl.load(x_ptr + nr * stride_x + cols[None, :], mask=nmask, other=0.0)
            dy_next = tl.load(dy_ptr + nr * stride_dy + cols[None, :], mask=nmask, other=0.0)
            dw_acc, db_acc = _norm_bwd_tile(x, dy, rows, rmask, mask, r, cols, cmask, w_ptr, mean_ptr, rstd_ptr,
                                            c_ptr, dx_ptr, dsum_ptr, dw_acc, db_acc, x_ptr, N, stride_ds,
                                            stride_dx, offset, RMS, HAS_W, HAS_B, HAS_DSUM, LLAMA, FULL_ROW)
    # every program writes its whole partial row (zeros if it had no rows): the buffer is complete
    part = g_id.to(tl.int64) * N + cols
    if HAS_W:
        tl.store(dw_ptr + part, tl.sum(dw_acc, axis=0), mask=cmask)
    if HAS_B:
        tl.store(db_ptr + part, tl.sum(db_acc, axis=0), mask=cmask)


GRAD_SUM_MAX = 64       # partial rows _grad_sum_kernel reduces; more go to torch's sum(0)


@triton.jit
def _grad_sum_kernel(dw_part_ptr, db_part_ptr,   # (G, N) fp32 partial sums (HAS_W, HAS_B)
                     dw_ptr, db_ptr,             # (N,) out, the parameters' dtype
                     G, N,
                     HAS_W: tl.constexpr, HAS_B: tl.constexpr, GR: tl.constexpr, BLOCK: tl.constexpr):
    """dw and db from their partial-sum buffers in one launch: GR rows at a time into a (GR, BLOCK)
    fp32 accumulator, then one fixed-shape reduction over its rows -- the same order for a given
    G, so the same bits -- and the cast to the parameter's dtype at the store. For the small G of
    decode-sized calls, where two sums and two casts were four more launches (benchmarks/NOTES.md)."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < N
    dw = tl.zeros((GR, BLOCK), tl.float32)
    db = tl.zeros((GR, BLOCK), tl.float32)
    for g0 in range(0, G, GR):
        rows = g0 + tl.arange(0, GR)
        mask = (rows < G)[:, None] & cmask[None, :]
        off = rows.to(tl.int64)[:, None] * N + cols[None, :]
        if HAS_W:
            dw += tl.load(dw_part_ptr + off, mask=mask, other=0.0)
        if HAS_B:
            db += tl.load(db_part_ptr + off, mask=mask, other=0.0)
    if HAS_W:
        tl.store(dw_ptr + cols, tl.sum(dw, axis=0).to(dw_ptr.dtype.element_ty), mask=cmask)
    if HAS_B:
        tl.store(db_ptr + cols, tl.sum(db, axis=0).to(db_ptr.dtype.element_ty), mask=cmask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _cluster_route(x2, same_dtype, rows, shape):
    """The CUDA cluster kernels' launch shape for this call, or None (``_cluster_rows.cluster_route``;
    WARPFORGE_NORM_CUDA=0 keeps the Triton kernels)."""
    return cluster_route(x2, same_dtype, rows, shape, "WARPFORGE_NORM_CUDA", "LayerNorm and RMSNorm")


def _layer_norm_cluster(x2, y, weight, bias, m: int, n: int):
    """The CUDA cluster forward's launch shape for this LayerNorm call, or None where the Triton
    kernels keep it (heuristics.layer_norm_cluster_config; parameters of the input's dtype)."""
    return _cluster_route(x2, (weight, bias), (x2, y, weight, bias),
                          lambda: layer_norm_cluster_config(n, m, device_name(x2)))


def _norm_bwd_cluster(x2, dy2, dx, weight, m: int, n: int, rms: bool, ds2=None):
    """The CUDA cluster backward's launch shape for this call, or None where the Triton kernels keep
    it (heuristics.norm_bwd_cluster_config, which with a residual gradient ds2 routes add+RMSNorm's
    lengths only; dy, the weight and ds2 of the input's dtype)."""
    return _cluster_route(x2, (dy2, weight, ds2), (x2, dy2, dx, weight, ds2),
                          lambda: norm_bwd_cluster_config(n, m, not rms, device_name(x2), ds2 is not None))


def _norm_fwd(x, residual, weight, bias, eps: float, offset: float, rms: bool, llama: bool):
    """Normalise the last dim of x (+ residual). Returns (y, h or None, mean or None, rstd)."""
    # the kernels read the parameters densely (w_ptr + cols): a strided view is copied
    weight = None if weight is None else weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    x2 = as_rows(x)
    m, n = x2.shape
    y = new_empty((m, n), device=x.device, dtype=x.dtype)
    rstd = new_empty((m,), device=x.device, dtype=torch.float32)
    mean = None if rms else new_empty((m,), device=x.device, dtype=torch.float32)
    h = r2 = None
    if residual is not None:
        r2 = as_rows(residual)
        h = new_empty((m, n), device=x.device, dtype=x.dtype)
    cluster = None if rms or residual is not None or m == 0 else _layer_norm_cluster(x2, y, weight, bias, m, n)
    if cluster is not None:
        from .. import cuda as wcuda

        wcuda.ops().layer_norm_fwd(x2, weight, bias, float(eps), list(cluster), y, mean, rstd)
    elif m > 0:
        cfg = norm_fwd_config(n, layer=not rms, many=residual is None and m >= NORM_LOOP_ROWS_PER_SM * sm_count(),
                              device_name=device_name(x), residual=residual is not None)
        args = (x2, x2 if r2 is None else r2, y, y if h is None else h,
                x2 if weight is None else weight, x2 if bias is None else bias,
                rstd if mean is None else mean, rstd,
                m, n, x2.stride(0), 0 if r2 is None else r2.stride(0), y.stride(0),
                0 if h is None else h.stride(0), float(eps), float(offset))
        flags = dict(RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None,
                     HAS_RES=residual is not None, LLAMA=llama, HAS_OFFSET=float(offset) != 0.0)
        if cfg.mode == "block":
            run(_norm_fwd_block_kernel, (triton.cdiv(m, cfg.rows),), args,
                **flags, ROWS=cfg.rows, BLOCK_N=cfg.block_n, EVEN_N=n == cfg.block_n, num_warps=cfg.num_warps)
        elif cfg.mode == "pipe":
            split_launch(_norm_fwd_pipe_kernel, m, cfg, x.device, args, **flags, RELOAD=cfg.reload,
                         BLOCK_N=cfg.block_n)
        elif rms:
            run(_norm_fwd_loop_kernel, (m,), args, **flags, BLOCK_N=cfg.block_n, N_CONST=n if cfg.const_n else 0,
                num_warps=cfg.num_warps)
        else:   # LayerNorm never has a residual, and LLAMA casting is RMSNorm's
            run(_layer_norm_fwd_loop_kernel, (triton.cdiv(m, cfg.rows),),
                (x2, y, x2 if weight is None else weight, x2 if bias is None else bias, mean, rstd,
                 m, n, x2.stride(0), y.stride(0), float(eps)),
                HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_N=cfg.block_n, ROWS=cfg.rows,
                EVEN_N=n % cfg.block_n == 0, N_CONST=n if cfg.const_n else 0, num_warps=cfg.num_warps)
    return y.view(x.shape), (None if h is None else h.view(x.shape)), mean, rstd


def _norm_bwd(dy, x, dsum, weight, mean, rstd, offset: float, rms: bool, llama: bool,
              bias_dtype: torch.dtype | None):
    """Returns (dx, dw, db): dw and db are (N,) sums over rows, dw in the weight's dtype, db in
    ``bias_dtype`` (the bias's; None: no bias, db None), or None when absent."""
    weight = None if weight is None else weight.contiguous()     # read densely, as in _norm_fwd
    dy2, x2 = as_rows(dy), as_rows(x)
    m, n = x2.shape
    dx = new_empty((m, n), device=x.device, dtype=x.dtype)
    has_w, has_bias = weight is not None, bias_dtype is not None
    pdtype = _param_dtype(x, weight)
    if m == 0:
        return (dx.view(x.shape), torch.zeros((n,), device=x.device, dtype=pdtype) if has_w else None,
                torch.zeros((n,), device=x.device, dtype=bias_dtype) if has_bias else None)
    ds2 = None if dsum is None else as_rows(dsum)
    cluster = None if llama else _norm_bwd_cluster(x2, dy2, dx, weight, m, n, rms, ds2)
    if cluster is not None:
        from .. import cuda as wcuda

        parts = max(1, sm_count() // cluster[0])   # at most this many clusters run: one partial row each
        dw_part = new_empty((parts, n), device=x.device, dtype=torch.float32) if has_w else None
        db_part = new_empty((parts, n), device=x.device, dtype=torch.float32) if has_bias else None
        wcuda.ops().norm_bwd(x2, dy2, weight, mean, rstd, float(offset), rms, list(cluster), dx, dw_part, db_part,
                             ds2)
        return (dx.view(x.shape), *_grad_sums(dw_part, db_part, pdtype, bias_dtype))
    flags = dict(RMS=rms, HAS_W=has_w, HAS_B=has_bias, HAS_DSUM=ds2 is not None, LLAMA=llama)
    cfg = norm_bwd_config(n, layer=not rms, device_name=device_name(x),
                          itemsize=max(x.element_size(), dy.element_size()), dsum=ds2 is not None)
    if cfg.mode in ("split", "pipe"):
        parts = {}

        def args(groups):
            parts["dw"] = new_empty((groups, n), device=x.device, dtype=torch.float32) if has_w else None
            parts["db"] = new_empty((groups, n), device=x.device, dtype=torch.float32) if has_bias else None
            return (dy2, x2, dy2 if ds2 is None else ds2, x2 if weight is None else weight,
                    rstd if mean is None else mean, rstd, dx,
                    dx if parts["dw"] is None else parts["dw"], dx if parts["db"] is None else parts["db"],
                    m, n, dy2.stride(0), x2.stride(0), 0 if ds2 is None else ds2.stride(0), dx.stride(0),
                    float(offset))

        if cfg.mode == "pipe":
            split_launch(_norm_bwd_pipe_kernel, m, cfg, x.device, args, **flags, RELOAD=cfg.reload,
                         BLOCK_N=cfg.block_n)
        else:
            split_launch(_norm_bwd_split_kernel, m, cfg, x.device, args, **flags, BLOCK_N=cfg.block_n)
        return (dx.view(x.shape), *_grad_sums(parts["dw"], parts["db"], pdtype, bias_dtype))
    full_row = cfg.mode == "block"
    col_tiles = 1 if full_row else triton.cdiv(n, cfg.block_n)
    groups, rows_per_prog = grad_grid(m, cfg.rows, col_tiles, cfg.grad_per_sm)
    # one row group (a few rows): the kernel's partial row is the sum, stored in each parameter's
    # dtype straight into the (N,) gradients -- no buffer, no second launch
    direct = groups == 1
    shape = (n,) if direct else (groups, n)
    dw = new_empty(shape, device=x.device, dtype=pdtype if direct else torch.float32) if has_w else None
    db = new_empty(shape, device=x.device, dtype=bias_dtype if direct else torch.float32) if has_bias else None
    c = rstd
    if not full_row:
        c = new_empty((m, 2), device=x.device, dtype=torch.float32)
        run(_norm_bwd_stats_kernel, (m,),
            (dy2, x2, x2 if weight is None else weight, rstd if mean is None else mean, rstd, c, m, n,
             dy2.stride(0), x2.stride(0), float(offset)),
            RMS=rms, HAS_W=has_w, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    run(_norm_bwd_kernel, (groups, col_tiles),
        (dy2, x2, dy2 if ds2 is None else ds2, x2 if weight is None else weight,
         rstd if mean is None else mean, rstd, c, dx, dx if dw is None else dw, dx if db is None else db, m,
         n, dy2.stride(0), x2.stride(0), 0 if ds2 is None else ds2.stride(0), dx.stride(0), rows_per_prog,
         float(offset)),
        **flags, FULL_ROW=full_row, ROWS=cfg.rows, BLOCK_N=cfg.block_n, GRID_PER_SM=cfg.grad_per_sm,
        STAGES=cfg.stages, num_warps=cfg.num_warps)
    return dx.view(x.shape), *((dw, db) if direct else _grad_sums(dw, db, pdtype, bias_dtype))


def _param_dtype(x: torch.Tensor, weight: torch.Tensor | None) -> torch.dtype:
    """The dtype dw is returned in: the weight's, else x's (db takes the bias's own)."""
    return x.dtype if weight is None else weight.dtype


def _grad_sums(dw: torch.Tensor | None, db: torch.Tensor | None, dtype: torch.dtype,
               db_dtype: torch.dtype | None = None):
    """The (N,) sums of the (G, N) fp32 partial-sum buffers dw and db (either may be None), dw's
    in ``dtype``, db's in ``db_dtype`` (default ``dtype``), in a fixed order: one fp32 row is
    returned as it is; up to GRAD_SUM_MAX rows ``_grad_sum_kernel`` sums and casts both in one
    launch; more go to ``sum(0)`` and a cast. The fast path (runtime/csrc/fastpath.cpp: norm_bwd)
    makes the same choices, so both give the same bits."""
    some = dw if dw is not None else db
    if some is None:
        return None, None
    db_dtype = dtype if db_dtype is None else db_dtype
    g, n = some.shape
    if g == 1 and (dw is None or dtype == torch.float32) and (db is None or db_dtype == torch.float32):
        return (None if dw is None else dw[0]), (None if db is None else db[0])
    if g > GRAD_SUM_MAX:
        return (None if dw is None else dw.sum(0).to(dtype)), (None if db is None else db.sum(0).to(db_dtype))
    dw_out = None if dw is None else new_empty((n,), device=some.device, dtype=dtype)
    db_out = None if db is None else new_empty((n,), device=some.device, dtype=db_dtype)
    other = dw_out if dw_out is not None else db_out
    rows, block = grad_sum_config(n, GRAD_SUM_MAX)
    run(_grad_sum_kernel, (triton.cdiv(n, block),),
        (some if dw is None else dw, some if db is None else db,
         other if dw_out is None else dw_out, other if db_out is None else db_out, g, n),
        HAS_W=dw is not None, HAS_B=db is not None, GR=rows, BLOCK=block, num_warps=4)
    return dw_out, db_out


def _absent(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.new_empty((0,), dtype=dtype)


def _rows_of(x: torch.Tensor):
    return math.prod(x.shape[:-1])


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
# LayerNorm ------------------------------------------------------------------------------------
def _layer_norm_impl(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, _, mean, rstd = _norm_fwd(x, None, weight, bias, eps, 0.0, rms=False, llama=False)
    return y, mean, rstd


def _layer_norm_fake(x, weight, bias, eps):
    m = _rows_of(x)
    return x.new_empty(x.shape), x.new_empty((m,), dtype=torch.float32), x.new_empty((m,), dtype=torch.float32)


def _layer_norm_bwd_impl(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                         mean: torch.Tensor, rstd: torch.Tensor,
                         bias_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db); dw in the weight's dtype (``_param_dtype``), db in ``bias_dtype`` (the
    bias's: an fp32 bias beside a bf16 weight gets its fp32 sum, not one rounded to bf16; None:
    no bias), each empty (0,) when absent."""
    dx, dw, db = _norm_bwd(dy, x, None, weight, mean, rstd, 0.0, rms=False, llama=False, bias_dtype=bias_dtype)
    pdtype = _param_dtype(x, weight)
    return dx, (_absent(x, pdtype) if dw is None else dw), (_absent(x, pdtype) if db is None else db)


def _layer_norm_bwd_fake(dy, x, weight, mean, rstd, bias_dtype):
    n = x.shape[-1]
    pdtype = _param_dtype(x, weight)
    return (x.new_empty(x.shape), x.new_empty((n if weight is not None else 0,), dtype=pdtype),
            x.new_empty((n,), dtype=bias_dtype) if bias_dtype is not None else x.new_empty((0,), dtype=pdtype))


layer_norm_backward_op = Op("layer_norm_backward", _layer_norm_bwd_impl, _layer_norm_bwd_fake)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    _y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(x, weight, mean, rstd)


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_backward_op(dy, x, weight, mean, rstd, ctx.bias_dtype)
    dw = None if weight is None else dw
    db = None if ctx.bias_dtype is None else db
    return dx, dw, db, None


layer_norm_op = Op("layer_norm", _layer_norm_impl, _layer_norm_fake,
                   backward=_layer_norm_backward, setup_context=_layer_norm_setup)


# RMSNorm --------------------------------------------------------------------------------------
def _rms_norm_impl(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
                   llama: bool) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, _, rstd = _norm_fwd(x, None, weight, None, eps, offset, rms=True, llama=llama)
    return y, rstd


def _rms_norm_fake(x, weight, eps, offset, llama):
    return x.new_empty(x.shape), x.new_empty((_rows_of(x),), dtype=torch.float32)


def _rms_norm_bwd_impl(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                       rstd: torch.Tensor, offset: float, llama: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw); dw in the weight's dtype, empty (0,) without a weight."""
    dx, dw, _ = _norm_bwd(dy, x, None, weight, None, rstd, offset, rms=True, llama=llama, bias_dtype=None)
    return dx, (_absent(x, x.dtype) if dw is None else dw)


def _rms_norm_bwd_fake(dy, x, weight, rstd, offset, llama):
    return x.new_empty(x.shape), x.new_empty((x.shape[-1] if weight is not None else 0,), dtype=_param_dtype(x, weight))


rms_norm_backward_op = Op("rms_norm_backward", _rms_norm_bwd_impl, _rms_norm_bwd_fake)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _eps, offset, llama = inputs
    _y, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.offset, ctx.llama = offset, llama
    ctx.save_for_backward(x, weight, rstd)


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward_op(dy, x, weight, rstd, ctx.offset, ctx.llama)
    return dx, (None if weight is None else dw), None, None, None


rms_norm_op = Op("rms_norm", _rms_norm_impl, _rms_norm_fake,
                 backward=_rms_norm_backward, setup_context=_rms_norm_setup)


# add + RMSNorm --------------------------------------------------------------------------------
def _add_rms_norm_impl(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       offset: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, h, _, rstd = _norm_fwd(x, residual, weight, None, eps, offset, rms=True, llama=False)
    return y, h, rstd


def _add_rms_norm_fake(x, residual, weight, eps, offset):
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty((_rows_of(x),), dtype=torch.float32)


def _add_rms_norm_bwd_impl(dnormed: torch.Tensor, dsum: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                           rstd: torch.Tensor, offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, dw): dh is the gradient of both x and residual; dw in the weight's dtype."""
    dh, dw, _ = _norm_bwd(dnormed, h, dsum, weight, None, rstd, offset, rms=True, llama=False, bias_dtype=None)
    return dh, dw


def _add_rms_norm_bwd_fake(dnormed, dsum, h, weight, rstd, offset):
    return h.new_empty(h.shape), h.new_empty((h.shape[-1],), dtype=weight.dtype)


add_rms_norm_backward_op = Op("add_rms_norm_backward", _add_rms_norm_bwd_impl, _add_rms_norm_bwd_fake)


def _add_rms_norm_setup(ctx, inputs, output):
    _x, _residual, weight, _eps, offset = inputs
    _y, h, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.offset = offset
    ctx.save_for_backward(h, weight, rstd)


def _add_rms_norm_backward(ctx, dnormed, dsum, _drstd):
    h, weight, rstd = ctx.saved_tensors
    dh, dw = add_rms_norm_backward_op(dnormed, dsum, h, weight, rstd, ctx.offset)
    return dh, dh, dw, None, None


add_rms_norm_op = Op("add_rms_norm", _add_rms_norm_impl, _add_rms_norm_fake,
                     backward=_add_rms_norm_backward, setup_context=_add_rms_norm_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"warpforge: 'eps' must be a non-negative float, got {eps!r}")
    return float(eps)


def layer_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.layer_norm`` normalising over the last dimension only
    (``normalized_shape`` must be ``(input.shape[-1],)``). ``weight`` and ``bias`` are optional,
    independently, and may be fp32 or the input's dtype; the output has the input's dtype."""
    # the eager fast path (runtime/fastpath.py): None when it does not take the call
    fast = fastpath.door(input)
    if fast is not None:
        out = fast.layer_norm(input, normalized_shape, weight, bias, eps)
        if out is not None:
            return out
    check_tensor("input", input)
    n = check_normalized_shape(normalized_shape, input)
    if weight is not None:
        check_weight("weight", weight, "input", input, n)
    if bias is not None:
        check_weight("bias", bias, "input", input, n)
    eps = _check_eps(eps)
    return layer_norm_op(input, weight, bias, eps)[0]


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None, *, offset: float = 0.0, casting_mode: str = "gemma") -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.rms_norm`` over the last dimension
    (``eps=None`` means ``torch.finfo(input.dtype).eps``, as torch).

    ``offset``: y = x_hat * (offset + weight); 1.0 gives Gemma's ``x_hat * (1 + w)``. Without a
    weight y = x_hat (the offset applies to the weight only).
    ``casting_mode``: "gemma" does all maths in fp32 and rounds once, at the output; "llama"
    rounds x_hat = x * rstd to the input dtype before multiplying by (offset + w), as Hugging
    Face's LlamaRMSNorm. The backward differentiates the fp32 maths in both modes (the rounding
    passes gradients straight through, as autograd through ``.to(dtype)`` does); in "llama" mode
    dw uses the rounded x_hat that the forward multiplied by w.
    """
    fast = fastpath.door(input)
    if fast is not None and (casting_mode == "gemma" or casting_mode == "llama"):
        out = fast.rms_norm(input, normalized_shape, weight, eps, offset, casting_mode == "llama")
        if out is not None:
            return out
    check_tensor("input", input)
    n = check_normalized_shape(normalized_shape, input)
    if weight is not None:
        check_weight("weight", weight, "input", input, n)
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"warpforge: 'casting_mode' must be one of {CASTING_MODES}, got {casting_mode!r}")
    eps = torch.finfo(input.dtype).eps if eps is None else _check_eps(eps)
    return rms_norm_op(input, weight, eps, check_finite("offset", offset), casting_mode == "llama")[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float | None = None,
                 *, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add and RMSNorm: returns ``(rms_norm(h), h)`` with ``h = x + residual`` in
    the input dtype -- the normed activations and the pre-norm residual stream, from one kernel
    that reads x and residual once. ``h`` is rounded before it is normalised, so ``normed``
    equals ``rms_norm(x + residual)`` computed in the input dtype. Maths as ``rms_norm`` with
    ``casting_mode="gemma"``."""
    fast = fastpath.door(x)
    if fast is not None and type(residual) is torch.Tensor:
        out = fast.add_rms_norm(x, residual, weight, eps, offset)
        if out is not None:
            return out
    check_tensor("x", x)
    check_tensor("residual", residual)
    check_same("residual", residual, "x", x)
    check_weight("weight", weight, "x", x, x.shape[-1])
    eps = torch.finfo(x.dtype).eps if eps is None else _check_eps(eps)
    normed, h, _ = add_rms_norm_op(x, residual, weight, eps, check_finite("offset", offset))
    return normed, h
