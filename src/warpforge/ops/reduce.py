"""Row reductions over one dimension: ``sum`` and ``amax``, forward and backward.

    sum:   y[i] = sum_j x[i, j]                  dx[i, j] = dy[i]
    amax:  y[i] = max_j x[i, j]                  dx[i, j] = dy[i] * (x[i, j] == y[i]) / count_i
           (count_i = how many elements of row i equal its max: torch's rule, the gradient is
           shared evenly among ties; a row holding NaN has max NaN, as in torch)

Byte model (s = bytes per element, M rows of N): read M*N*s, write M*s -- essentially one read of
the input. One add (or max) per element: memory-bound, target the measured copy bandwidth. The
backward of ``sum`` is a broadcast (``expand``, no kernel, no bytes); the backward of ``amax``
reads x and writes dx, 2*M*N*s.

Any dim: it is moved last (a view), as softmax does; if that leaves the reduced dim strided the
rows are copied to contiguous ones first (one extra read and write). Accumulation is fp32 whatever
the input dtype; the result is cast once, at the store, to the input dtype (or ``dtype`` for sum).

Paths by N (``runtime/heuristics.py``):
- ``block``   N <= 16,384 (past 4,096 only with fewer than 2 rows an SM): a program holds ROWS
  whole rows (ROWS x BLOCK_N ~ 4,096 elements, so a short-row program still moves ~8-16 KB) and
  reduces each in registers: one read, the floor.
- ``loop`` N >= 8,192 with at least 2 rows an SM: one 16-warp program a row walks it in
  4,096-element steps, each step's load issued a step ahead and marked evict-first, lanes folded
  once at the end (a fixed order: deterministic). One launch, one read. H100, bf16, M*N = 2^27
  (``benchmarks/probe_reduce_long.py``, NOTES item 28): 87.4-89.0 us at N = 32K-262K against
  torch.compile's 86.9-89.7, where the partials below took 90.4-91.4 (their second launch); at 8K
  and 16K 86.3-86.7 against the block kernel's 87.0-88.0.
- ``partial`` N > 16,384 with fewer rows: nothing has to be exchanged, unlike softmax, because
  nothing is written back per element. Each row is cut into C = N / 8,192 chunks; program (row,
  chunk) reduces its chunk to one fp32 partial in an (M, C) buffer, and a second launch reduces the
  (M, C) partials with the block kernel, always in the same order: bitwise deterministic run to
  run, no atomics, no spin-waits. The partials are 1/8,192 of the input (4 B per 16 KB of bf16), a
  rounding error in the byte count; the price is one more launch (~3 us), paid where the rows are
  too few to fill the chip one program a row.
- amax with a gradient to come, rows a program holds (to 32K on a GPU, ``amax_grad_path``): the
  forward (``amax_mask``) finds the row's max in registers, then packs x == max into a bit mask
  (N / 8 bytes a row) and counts the ties from the same registers, comparing in x's own dtype so
  no fp32 copy of the row is kept. The backward (``amax_bits_scatter``) reads the mask, not x, and
  writes dx = bit * dy / ties: 2 + 2 + 1/8 bytes an element, where a backward reading x moves 6
  (torch.compile's, reading a 1-byte mask its forward wrote, also 6). x is not saved. H200, bf16,
  M*N = 2^27, fwd+bwd 1.20-1.78x torch.compile (benchmarks/NOTES.md, item 38). Eager calls under
  AMAX_MASK_MIN_NUMEL elements keep the C++ fast path and the count-and-scatter backward below.
- amax backward, after a forward that counted the ties (longer rows): where the forward walks rows (``loop``)
  or chunks (``partial``) and a gradient is wanted, it also counts, per row, the elements equal to
  the max (each lane counts how often it met its running max; the lanes or chunks holding the
  row's max add theirs), for a few ALU operations an element of a read-bound kernel. The backward
  is then one streaming pass, dx = (x == y) * dy / ties, with nothing to reduce: 2*M*N*s bytes in
  programs of 8,192 elements (``amax_ties`` and ``amax_scatter``; without a gradient the plain
  forward runs).
- amax backward of the plain operator (eager fast-path calls, symbolic shapes under torch.compile)
  is a row op (count the ties, then scatter), with softmax's paths: ``block`` (one
  program holds ROWS rows, or one 32-warp program a row to 32K on a GPU): count and scatter in
  registers, 2*M*N*s bytes. ``split`` (longer rows on a GPU): C co-resident programs a row each
  hold a chunk of x, exchange their chunk's tie count (``_rows.py``) and write dx: still 2*M*N*s.
  ``loop`` (the interpreter past 16,384): the count from chunk partials, then a second pass that
  re-reads x to scatter, 3*M*N*s. (The count-then-scatter pass was the GPU path too until
  2026-11-22: 65% of copy at N = 32K-262K on an H100, against 99% at 4K.)

NaN: the plain hardware max ignores NaN (``max.f32`` returns the other operand), so the block and
partial kernels count NaNs explicitly, and the loop kernel uses the NaN-propagating ``max.NaN``
lane by lane and tests the lanes once; a row holding NaN gives NaN, matching torch.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..runtime import fastpath, interpreting, new_empty
from ..runtime.checks import FLOAT_DTYPES, check_backend, check_tensor, normalize_dim
from ..runtime.heuristics import (AMAX_MASK_MIN_NUMEL, REDUCE_CHUNK, amax_bwd_config, amax_holds_row, amax_mask_config,
                                  amax_row_limit, reduce_config, reduce_loop_const, row_config, warps_for)
from ..runtime.device import device_name
from ..runtime.registry import Op
from ..runtime.launch import run
from ._rows import as_rows, gather_row_stats, publish_row_stats, split_launch


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------
def sum_reference(x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Ground truth in float64 (float32 on devices without it), cast to ``dtype`` or x's dtype."""
    wide = torch.float64 if x.device.type == "cpu" else torch.float32
    return x.to(wide).sum(dim, keepdim=keepdim).to(dtype or x.dtype)


def amax_reference(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    return x.amax(dim, keepdim=keepdim)           # exact in any dtype


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _reduce_tile(x, mask, MAX: tl.constexpr):
    """Reduce a loaded (R, B) fp32 tile along axis 1 (masked lanes hold 0 for sum, -inf for max)."""
    if MAX:
        v = tl.max(x, axis=1)
        nans = tl.sum(((x != x) & mask).to(tl.int32), axis=1)
        v = tl.where(nans > 0, float("nan"), v)
    else:
        v = tl.sum(x, axis=1)
    return v


@triton.jit
def _reduce_fwd_block_kernel(
    x_ptr, y_ptr,              # (M, N) rows (column stride 1, row stride stride_x), (M,) contiguous out
    M, N, stride_x,
    MAX: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    r = rows.to(tl.int64)[:, None]
    other = -float("inf") if MAX else 0.0
    x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=other).to(tl.float32)
    v = _reduce_tile(x, mask, MAX)
    tl.store(y_ptr + rows, v.to(y_ptr.dtype.element_ty), mask=rows < M)


@triton.jit
def _reduce_fwd_partial_kernel(
    x_ptr, part_ptr, cnt_ptr,  # (M, N) rows (column stride 1), (M, C) contiguous fp32 partials, (M, C) fp32 tie counts
    N, stride_x, C,            # C = cdiv(N, BLOCK_N) chunks per row; one program per (row, chunk)
    MAX: tl.constexpr, COUNT: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """COUNT (amax with a gradient to come): also how many of the chunk's elements equal its max."""
    pid = tl.program_id(0)
    row = pid // C
    chunk = pid % C
    cols = chunk.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)     # 64-bit: one row may pass 2^31
    mask = (cols < N)[None, :]
    other = -float("inf") if MAX else 0.0
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols[None, :], mask=mask, other=other).to(tl.float32)
    v = _reduce_tile(x, mask, MAX)                                     # (1,)
    at = row.to(tl.int64) * C + chunk + tl.arange(0, 1)
    tl.store(part_ptr + at, v)
    if COUNT:                                                          # a NaN chunk (v NaN) counts 0
        tl.store(cnt_ptr + at, tl.sum(((x == v[:, None]) & mask).to(tl.float32), axis=1))


@triton.jit
def _reduce_step(acc, ties, x, MAX: tl.constexpr, COUNT: tl.constexpr):
    """One step of the row loop's lane-wise fold: sum, or max (and with COUNT the tie counts)."""
    if MAX:                                        # max.NaN: a lane that met a NaN keeps it
        if COUNT:                                  # (NaN compares false: a NaN lane stops counting)
            # padding (-inf) counts only in lanes whose max is -inf, which add to the row's
            # count only when the whole row is -inf: clamped to N below, no mask per element
            ties = tl.where(x > acc, 0.0, ties) + (x >= acc).to(tl.float32)
        acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
    else:
        acc += x
    return acc, ties


@triton.jit
def _reduce_fwd_loop_kernel(
    x_ptr, y_ptr, cnt_ptr,     # (M, N) rows (column stride 1), (M,) contiguous out, (M,) fp32 tie counts
    N, stride_x,               # one program a row
    MAX: tl.constexpr, COUNT: tl.constexpr, BLOCK_N: tl.constexpr,
    N_CONST: tl.constexpr = 0,  # > 0: N compiled in (== N, a whole number of steps): no masks, no prefetch
):
    """One program walks its row in BLOCK_N-element steps, the next step's load issued before this
    step's math (two loads in flight a thread), marked evict-first (read once: keep L2 for others).
    COUNT (amax with a gradient to come): each lane also counts how often it met its running max
    (reset to 1 when the max rises), and the lanes holding the row's max add theirs at the end: the
    backward's tie count for a few ALU operations an element, instead of a reduction there."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    base = x_ptr + row.to(tl.int64) * stride_x
    other = -float("inf") if MAX else 0.0
    acc = tl.full((BLOCK_N,), other, tl.float32)       # lane-wise, folded once at the end: a fixed order
    ties = tl.zeros((BLOCK_N,), tl.float32)
    tl.static_assert(N_CONST % BLOCK_N == 0, "N_CONST is a whole number of BLOCK_N steps")
    if N_CONST > 0:
        for start in range(0, N_CONST, BLOCK_N):
            x = tl.load(base + start + cols, eviction_policy="evict_first").to(tl.float32)
            acc, ties = _reduce_step(acc, ties, x, MAX, COUNT)
    else:
        nxt = tl.load(base + cols, mask=cols < N, other=other, eviction_policy="evict_first")
        for start in range(0, N, BLOCK_N):
            x = nxt.to(tl.float32)
            c = start + BLOCK_N + cols
            nxt = tl.load(base + c, mask=c < N, other=other, eviction_policy="evict_first")
            acc, ties = _reduce_step(acc, ties, x, MAX, COUNT)
    if MAX:                                            # the lane fold drops NaN: test for it once
        v = tl.max(acc, axis=0)
        v = tl.where(tl.sum((acc != acc).to(tl.int32), axis=0) > 0, float("nan"), v)
        if COUNT:                                      # a NaN row counts 0 (acc == NaN is false)
            tl.store(cnt_ptr + row, tl.minimum(tl.sum(tl.where(acc == v, ties, 0.0), axis=0), N))
    else:
        v = tl.sum(acc, axis=0)
    tl.store(y_ptr + row, v.to(y_ptr.dtype.element_ty))


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _tie_bytes(x, v, byte, N, bit: tl.constexpr):
    """Pack which elements of a (..., B, 8) tile equal v (broadcast to it) into bytes: returns the
    (..., B) int32 bytes (bit j of byte i: column 8 i + j; bits past N cleared) and their tie
    counts. One select and one add an element: each hit adds its bit and 1 << 16 (a count field)."""
    s = tl.sum(tl.where(x == v, (1 << bit) + 65536, 0), axis=-1)
    valid = tl.minimum(tl.maximum(N - byte * 8, 0), 8)
    return s & ((1 << valid) - 1), s >> 16


@triton.jit
def _amax_mask_fwd_kernel(
    x_ptr, y_ptr, cnt_ptr, bits_ptr,   # (M, N) rows, (M,) out, (M,) fp32 tie counts, (M, NB) uint8 masks
    M, N, NB, stride_x,                # NB = cdiv(N, 8) bytes a row
    ROWS: tl.constexpr, BLOCK_B: tl.constexpr, NATIVE: tl.constexpr,
):
    """amax with a gradient to come, rows a program holds: the row's max, then from the same
    registers which elements equal it, as a bit mask (bit j of byte i: column 8 i + j) and a count.
    The tile is (ROWS, BLOCK_B, 8): a byte's 8 columns sit in one thread, so the packing is local.
    Padding loads -inf and matches only an all -inf row, whose count is clamped to N."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    byte = tl.arange(0, BLOCK_B)
    bit = tl.arange(0, 8)
    cols = byte[:, None] * 8 + bit[None, :]
    rmask = rows < M
    r = rows.to(tl.int64)
    x = tl.load(x_ptr + r[:, None, None] * stride_x + cols[None, :, :],
                mask=rmask[:, None, None] & (cols < N)[None, :, :], other=-float("inf"))
    v = tl.reduce(tl.reduce(x.to(tl.float32), 2, _max_nan), 1, _max_nan)   # max.NaN: a NaN row gives NaN
    if NATIVE:      # exact in x's dtype, no fp32 copy of the tile kept: 32 registers at 32K, not 55
        packed, ties = _tie_bytes(x, v.to(x.dtype)[:, None, None], byte[None, :], N, bit[None, None, :])
    else:           # the interpreter compares bf16 by its bits (-0 != 0, NaN == NaN): in fp32
        packed, ties = _tie_bytes(x.to(tl.float32), v[:, None, None], byte[None, :], N, bit[None, None, :])
    tl.store(cnt_ptr + rows, tl.minimum(tl.sum(ties, axis=1), N).to(tl.float32), mask=rmask)
    tl.store(bits_ptr + r[:, None] * NB + byte[None, :], packed.to(tl.uint8),
             mask=rmask[:, None] & (byte < NB)[None, :])
    tl.store(y_ptr + rows, v.to(y_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _amax_bits_scatter_kernel(
    bits_ptr, cnt_ptr, dy_ptr, dx_ptr,  # (M, NB) uint8 masks, (M,) fp32 tie counts, (M,) grad, (M, N) out
    N, NB, stride_dy, stride_dx, C,     # C = cdiv(NB, BLOCK_B) programs a row
    BLOCK_B: tl.constexpr,
):
    """dx = bit * dy / ties: reads N / 8 bytes of mask a row and writes dx, x is not read. The
    stores are streaming (.cs, evict-first): 2-9% faster on an H200 than plain ones, and no slower
    than a memset of dx (benchmarks/NOTES.md, item 38)."""
    pid = tl.program_id(0)
    row = pid // C
    chunk = pid % C
    r = row.to(tl.int64)
    byte = chunk * BLOCK_B + tl.arange(0, BLOCK_B)
    bit = tl.arange(0, 8)
    b = tl.load(bits_ptr + r * NB + byte, mask=byte < NB, other=0).to(tl.int32)
    hit = ((b[:, None] >> bit[None, :]) & 1).to(tl.float32)
    # as the other backwards: hit * (dy / ties), so a NaN row (0 ties) gets NaN gradients
    g = tl.load(dy_ptr + r * stride_dy).to(tl.float32) / tl.load(cnt_ptr + row)
    cols = byte[:, None] * 8 + bit[None, :]
    tl.store(dx_ptr + r * stride_dx + cols, (hit * g).to(dx_ptr.dtype.element_ty), mask=cols < N,
             cache_modifier=".cs")


@triton.jit
def _amax_bwd_block_kernel(
    x_ptr, y_ptr, dy_ptr, dx_ptr,  # (M, N) input rows, (M,) saved amax, (M,) gradient (any stride), (M, N) out
    M, N, stride_x, stride_dy, stride_dx,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    r = rows.to(tl.int64)
    x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    m = tl.load(y_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + r * stride_dy, mask=rmask, other=0.0).to(tl.float32)
    hit = ((x == m[:, None]) & mask).to(tl.float32)
    count = tl.sum(hit, axis=1)
    # as torch: hit * (dy / count), so a NaN row (count 0) gets NaN gradients
    dx = hit * (dy / count)[:, None]
    tl.store(dx_ptr + r[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _amax_bwd_count_kernel(
    x_ptr, y_ptr, part_ptr,    # (M, N) input rows, (M,) saved amax, (M, C) fp32 tie counts per chunk
    N, stride_x, C,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // C
    chunk = pid % C
    cols = chunk.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)     # 64-bit: one row may pass 2^31
    mask = cols < N
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(y_ptr + row).to(tl.float32)
    count = tl.sum(((x == m) & mask).to(tl.float32), axis=0)
    tl.store(part_ptr + row.to(tl.int64) * C + chunk, count)


@triton.jit
def _amax_bwd_scatter_kernel(
    x_ptr, y_ptr, cnt_ptr, dy_ptr, dx_ptr,  # (M, N) rows, (M,) amax, (M,) fp32 tie counts, (M,) grad, (M, N) out
    N, stride_x, stride_dy, stride_dx, C,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // C
    chunk = pid % C
    r = row.to(tl.int64)
    cols = chunk.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)     # 64-bit: one row may pass 2^31
    mask = cols < N
    x = tl.load(x_ptr + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(y_ptr + row).to(tl.float32)
    g = tl.load(dy_ptr + r * stride_dy).to(tl.float32) / tl.load(cnt_ptr + row)
    dx = ((x == m) & mask).to(tl.float32) * g
    tl.store(dx_ptr + r * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _amax_bwd_split_kernel(
    x_ptr, y_ptr, dy_ptr, dx_ptr,  # as the block kernel
    M, N, stride_x, stride_dy, stride_dx,
    stats_ptr, C, n_groups,        # the split exchange (``_rows.py``)
    BLOCK_N: tl.constexpr, CP: tl.constexpr,
):
    """Backward for rows too long for one program (GPU): C programs share a row, each holding one
    chunk of x; they exchange the chunk's tie count and write dx from the x they hold, so x is
    read once. The next row's chunk is loaded before this row's count is published and awaited."""
    pid = tl.program_id(0)
    chunk = pid % C
    cols = chunk.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)     # 64-bit: one row may pass 2^31
    mask = cols < N
    row = pid // C
    x = tl.load(x_ptr + tl.cast(row, tl.int64) * stride_x + cols, mask=mask & (row < M), other=0.0)
    for row in range(pid // C, M, n_groups):
        r = tl.cast(row, tl.int64)
        m = tl.load(y_ptr + row).to(tl.float32)
        hit = ((x.to(tl.float32) == m) & mask).to(tl.float32)
        nxt = row + n_groups
        x = tl.load(x_ptr + tl.cast(nxt, tl.int64) * stride_x + cols, mask=mask & (nxt < M), other=0.0)
        cnt = tl.sum(hit, axis=0)
        publish_row_stats(stats_ptr, row, chunk, C, cnt, cnt)          # one statistic; slot 2 unused
        a, _b, _valid = gather_row_stats(stats_ptr, row, C, CP)
        # as the block kernel: hit * (dy / count), NaN for a NaN row (count 0)
        g = tl.load(dy_ptr + r * stride_dy).to(tl.float32) / tl.sum(a, axis=0)
        tl.store(dx_ptr + r * stride_dx + cols, (hit * g).to(dx_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _reduce_rows(x2: torch.Tensor, out_dtype: torch.dtype, is_max: bool, counts: bool = False):
    """Reduce each row of ``x2`` (M, N), unit column stride, to an (M,) tensor of ``out_dtype``.
    ``counts`` (amax): return ``(y, ties)``, ties the (M,) fp32 count of each row's elements equal
    to its max, counted by the loop and partial kernels as they reduce (the block mode re-reads)."""
    m, n = x2.shape
    # the row loop with N compiled in where the device's table has it (heuristics.REDUCE_LOOP_CONST)
    const = None if counts else reduce_loop_const(m, n, device_name(x2))
    mode, block_n, warps = ("loop", *const) if const else reduce_config(m, n)
    if mode == "loop":
        y = new_empty((m,), device=x2.device, dtype=out_dtype)
        ties = torch.empty((m,), device=x2.device, dtype=torch.float32) if counts else y
        run(_reduce_fwd_loop_kernel, (m,), (x2, y, ties, n, x2.stride(0)),
            MAX=is_max, COUNT=counts, BLOCK_N=block_n, N_CONST=n if const else 0, num_warps=warps)
        return (y, ties) if counts else y
    if mode == "partial":
        c = triton.cdiv(n, block_n)
        part = torch.empty((m, c), device=x2.device, dtype=torch.float32)   # every entry written
        cpart = torch.empty((m, c), device=x2.device, dtype=torch.float32) if counts else part
        run(_reduce_fwd_partial_kernel, (m * c,),
            (x2, part, cpart, n, x2.stride(0), c),
            MAX=is_max, COUNT=counts, BLOCK_N=block_n, num_warps=warps)
        y = _reduce_rows(part, out_dtype, is_max)                            # fixed order: deterministic
        if not counts:
            return y
        # the chunks holding the row's max add their ties ((M, C) floats: 1/8,192 of x); y is exact
        # in fp32, and a NaN row (y NaN) matches no chunk
        return y, torch.where(part == y.float()[:, None], cpart, 0.0).sum(1)
    y = new_empty((m,), device=x2.device, dtype=out_dtype)
    cfg = row_config(n)
    run(_reduce_fwd_block_kernel, (triton.cdiv(m, cfg.rows),),
        (x2, y, m, n, x2.stride(0)),
        MAX=is_max, ROWS=cfg.rows, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    if counts:      # short rows (torch.ops.warpforge.amax_ties called directly): a second read
        return y, (x2 == y[:, None]).sum(1, dtype=torch.float32)
    return y


def _reduce_last(x: torch.Tensor, out_dtype: torch.dtype, is_max: bool) -> torch.Tensor:
    """Reduce the last dim of x (any leading shape)."""
    x2 = as_rows(x)
    if x2.shape[0] == 0:
        return new_empty(x.shape[:-1], device=x.device, dtype=out_dtype)
    return _reduce_rows(x2, out_dtype, is_max).view(x.shape[:-1])


def _amax_bwd(x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    x2 = as_rows(x)
    m, n = x2.shape
    dx = new_empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0:
        return dx.view(x.shape)
    y1, dy1 = y.reshape(-1), dy.reshape(-1)                     # (M,); dy may have stride 0
    args = (x2, y1, dy1, dx, m, n, x2.stride(0), dy1.stride(0), dx.stride(0))
    cfg = amax_bwd_config(n)
    if cfg.mode == "block":
        run(_amax_bwd_block_kernel, (triton.cdiv(m, cfg.rows),), args,
            ROWS=cfg.rows, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    elif cfg.mode == "split":
        split_launch(_amax_bwd_split_kernel, m, cfg, x.device, args, BLOCK_N=cfg.block_n)
    else:
        c = triton.cdiv(n, REDUCE_CHUNK)
        part = torch.empty((m, c), device=x.device, dtype=torch.float32)
        run(_amax_bwd_count_kernel, (m * c,),
            (x2, y1, part, n, x2.stride(0), c),
            BLOCK_N=REDUCE_CHUNK, num_warps=warps_for(REDUCE_CHUNK))
        _amax_scatter(x2, y1, _reduce_rows(part, torch.float32, False), dy1, dx)
    return dx.view(x.shape)


def _amax_scatter(x2, y1, ties, dy1, dx) -> None:
    """dx = (x == y) * dy / ties over (M, N) rows with the (M,) tie counts known: one streaming
    pass in (row, REDUCE_CHUNK) programs."""
    m, n = x2.shape
    c = triton.cdiv(n, REDUCE_CHUNK)
    run(_amax_bwd_scatter_kernel, (m * c,),
        (x2, y1, ties, dy1, dx, n, x2.stride(0), dy1.stride(0), dx.stride(0), c),
        BLOCK_N=REDUCE_CHUNK, num_warps=warps_for(REDUCE_CHUNK))


# ----------------------------------------------------------------------------------------------
# PyTorch operators (all reduce the last dim, without keepdim; the public functions do the rest)
# ----------------------------------------------------------------------------------------------
def _sum_impl(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _reduce_last(x, dtype, False)


def _sum_setup(ctx, inputs, output):
    ctx.shape = inputs[0].shape
    ctx.in_dtype = inputs[0].dtype


def _sum_backward(ctx, dy):
    # cast the (M,) gradient, then broadcast it: a view, no bytes
    return dy.to(ctx.in_dtype).unsqueeze(-1).expand(ctx.shape), None


sum_op = Op("sum", _sum_impl, lambda x, dtype: x.new_empty(x.shape[:-1], dtype=dtype),
            backward=_sum_backward, setup_context=_sum_setup)


def _amax_impl(x: torch.Tensor) -> torch.Tensor:
    return _reduce_last(x, x.dtype, True)


def _amax_bwd_impl(x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return _amax_bwd(x, y, dy)


amax_backward_op = Op("amax_backward", _amax_bwd_impl, lambda x, y, dy: x.new_empty(x.shape))


def _amax_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output)


def _amax_backward(ctx, dy):
    x, y = ctx.saved_tensors
    return amax_backward_op(x, y, dy)


amax_op = Op("amax", _amax_impl, lambda x: x.new_empty(x.shape[:-1]),
             backward=_amax_backward, setup_context=_amax_setup)


def amax_grad_path(x: torch.Tensor) -> str | None:
    """Which forward an amax over ``x``'s last dim takes when a gradient is to come:

    - ``"mask"``, rows a program holds (``amax_bwd_config``'s block mode: to 32K on a GPU): the
      forward writes, from the registers holding the row, a bit mask of the elements equal to the
      max and their count (``amax_mask``); the backward reads N / 8 bytes a row instead of x and
      writes dx (``amax_bits_scatter``). x is not saved.
    - ``"ties"``, longer rows (walked in steps or chunks): the forward also counts each row's ties
      as it walks it (``amax_ties``), the backward streams x once (``amax_scatter``).
    - None, symbolic shapes or no rows: the plain operator, whose backward counts and scatters.
    """
    m, n = math.prod(x.shape[:-1]), x.shape[-1]
    if not (isinstance(m, int) and isinstance(n, int)) or m == 0:
        return None
    return "mask" if amax_holds_row(n) else "ties"


def _amax_ties_impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y, ties = _reduce_rows(as_rows(x), x.dtype, True, counts=True)
    return y.view(x.shape[:-1]), ties.view(x.shape[:-1])


def _amax_scatter_impl(x: torch.Tensor, y: torch.Tensor, ties: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    x2 = as_rows(x)
    dx = new_empty(x2.shape, device=x.device, dtype=x.dtype)
    _amax_scatter(x2, y.reshape(-1), ties.reshape(-1), dy.reshape(-1), dx)
    return dx.view(x.shape)


amax_scatter_op = Op("amax_scatter", _amax_scatter_impl, lambda x, y, ties, dy: x.new_empty(x.shape))


def _amax_ties_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs[0], *output)


def _amax_ties_backward(ctx, dy, _dties):
    if dy is None:
        return None
    x, y, ties = ctx.saved_tensors
    return amax_scatter_op(x, y, ties, dy)


amax_ties_op = Op("amax_ties", _amax_ties_impl,
                  lambda x: (x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1], dtype=torch.float32)),
                  backward=_amax_ties_backward, setup_context=_amax_ties_setup)


def _amax_mask_rows(x2: torch.Tensor, out_dtype: torch.dtype):
    """(y, ties, bits) of (M, N) rows a program holds: (M,) max, (M,) fp32 tie count, (M, N/8) uint8."""
    m, n = x2.shape
    if not amax_holds_row(n):        # torch.ops.warpforge.amax_mask called directly on longer rows
        raise ValueError(f"warpforge: amax_mask's 'x' has rows of {n}; expected at most "
                         f"{amax_row_limit()} (rows one program holds)")
    y = new_empty((m,), device=x2.device, dtype=out_dtype)
    ties = torch.empty((m,), device=x2.device, dtype=torch.float32)
    bits = torch.empty((m, triton.cdiv(n, 8)), device=x2.device, dtype=torch.uint8)
    cfg = amax_mask_config(n)
    run(_amax_mask_fwd_kernel, (triton.cdiv(m, cfg.rows),),
        (x2, y, ties, bits, m, n, bits.shape[1], x2.stride(0)),
        ROWS=cfg.rows, BLOCK_B=max(1, cfg.block_n // 8), NATIVE=not interpreting(), num_warps=cfg.num_warps)
    return y, ties, bits


def _amax_bits_scatter(bits2, ties, dy1, dx, block_b: int = REDUCE_CHUNK // 8, warps: int = 0) -> None:
    """dx = bit * dy / ties over (M, N) rows from their (M, N/8) masks: (row, chunk) programs of
    up to REDUCE_CHUNK columns, each reading 1/16 of the bytes it writes (bf16)."""
    m, n = dx.shape
    nb = bits2.shape[1]
    block_b = min(block_b, triton.next_power_of_2(nb))
    c = triton.cdiv(nb, block_b)
    run(_amax_bits_scatter_kernel, (m * c,),
        (bits2, ties, dy1, dx, n, nb, dy1.stride(0), dx.stride(0), c),
        BLOCK_B=block_b, num_warps=warps or warps_for(8 * block_b))


def _amax_mask_impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, ties, bits = _amax_mask_rows(as_rows(x), x.dtype)
    lead = x.shape[:-1]
    return y.view(lead), ties.view(lead), bits.view(*lead, bits.shape[1])


def _amax_mask_fake(x):
    lead = x.shape[:-1]
    return (x.new_empty(lead), x.new_empty(lead, dtype=torch.float32),
            x.new_empty((*lead, (x.shape[-1] + 7) // 8), dtype=torch.uint8))


def _amax_bits_scatter_impl(bits: torch.Tensor, ties: torch.Tensor, dy: torch.Tensor, n: int,
                            dtype: torch.dtype) -> torch.Tensor:
    if bits.shape[-1] != triton.cdiv(n, 8):
        raise ValueError(f"warpforge: amax_bits_scatter's 'bits' has {bits.shape[-1]} bytes a row; "
                         f"expected {triton.cdiv(n, 8)} for n={n}")
    lead = bits.shape[:-1]
    m = math.prod(lead)
    dx = new_empty((m, n), device=bits.device, dtype=dtype)
    if m:
        _amax_bits_scatter(bits.reshape(m, bits.shape[-1]), ties.reshape(-1), dy.reshape(-1), dx)
    return dx.view(*lead, n)


amax_bits_scatter_op = Op("amax_bits_scatter", _amax_bits_scatter_impl,
                          lambda bits, ties, dy, n, dtype: bits.new_empty((*bits.shape[:-1], n), dtype=dtype))


def _amax_mask_setup(ctx, inputs, output):
    # no zero gradients made up for ties and bits (a 1/16-size fill of x, ~6 us at 2^27 on an H200)
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1], output[2])
    ctx.n, ctx.dtype = inputs[0].shape[-1], inputs[0].dtype


def _amax_mask_backward(ctx, dy, _dties, _dbits):
    if dy is None:
        return None
    ties, bits = ctx.saved_tensors
    return amax_bits_scatter_op(bits, ties, dy, ctx.n, ctx.dtype)


amax_mask_op = Op("amax_mask", _amax_mask_impl, _amax_mask_fake,
                  backward=_amax_mask_backward, setup_context=_amax_mask_setup)


def _amax_last(x: torch.Tensor) -> torch.Tensor:
    """amax over the last dim: with a gradient to come, the forward that leaves its backward
    nothing to count (:func:`amax_grad_path`)."""
    if torch.is_grad_enabled() and x.requires_grad:
        path = amax_grad_path(x)
        if path == "mask":
            return amax_mask_op(x)[0]
        if path == "ties":
            return amax_ties_op(x)[0]
    return amax_op(x)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _reduce_public(op, x: torch.Tensor, dim: int, keepdim: bool, *extra, cuda=None) -> torch.Tensor:
    check_tensor("input", x, min_dim=0)
    if not isinstance(keepdim, bool):
        raise TypeError(f"warpforge: 'keepdim' must be a bool, got {type(keepdim).__name__}")
    if cuda is not None:
        op = cuda
    d = normalize_dim("dim", dim, x.dim())       # before the 0-d case: torch takes only dim 0 or -1 there
    if x.dim() == 0:
        return op(x.reshape(1), *extra).reshape(())
    if x.shape[d] == 0:
        raise ValueError(f"warpforge: 'input' has shape {tuple(x.shape)}, so dim={dim} to reduce is empty; "
                         f"expected at least 1 element along it")
    y = op(x if d == x.dim() - 1 else x.movedim(d, -1), *extra)
    return y.unsqueeze(d) if keepdim else y


def _cuda(name: str, backend: str):
    """The CUDA backend's last-dim reduction for ``backend="cuda"``, else None."""
    if check_backend(backend) != "cuda":
        return None
    from ..cuda import functional as cuda_fn

    return getattr(cuda_fn, name)


def sum(input: torch.Tensor, dim: int = -1, keepdim: bool = False, *, dtype: torch.dtype | None = None,
        backend: str = "triton") -> torch.Tensor:
    """``torch.sum(input, dim, keepdim, dtype=dtype)`` over one dim, accumulated in fp32.

    ``dtype`` (float32, float16 or bfloat16) is the output dtype; the input is read in its own
    dtype (no cast pass). A non-last ``dim`` whose elements are strided costs one contiguous copy.
    ``backend="cuda"``: the CUDA C++ kernel (warpforge.cuda).
    """
    # the eager fast path (runtime/fastpath.py): None when it does not take the call
    fast = fastpath.door(input)
    if fast is not None and dtype is None and backend == "triton" and type(dim) is int and type(keepdim) is bool:
        out = fast.reduce(input, dim, keepdim, False)
        if out is not None:
            return out
    if dtype is not None and dtype not in FLOAT_DTYPES:
        names = ", ".join(str(t).replace("torch.", "") for t in FLOAT_DTYPES)
        raise TypeError(f"warpforge: 'dtype' is {dtype}; expected None or one of {names}")
    out_dtype = dtype if dtype is not None else getattr(input, "dtype", None)
    return _reduce_public(sum_op, input, dim, keepdim, out_dtype, cuda=_cuda("sum_last", backend))


def amax(input: torch.Tensor, dim: int = -1, keepdim: bool = False, *, backend: str = "triton") -> torch.Tensor:
    """``torch.amax(input, dim, keepdim)`` over one dim; NaN in a row gives NaN; the gradient is
    shared evenly among the elements equal to the max, as in torch. ``backend="cuda"``: the CUDA
    C++ kernel for the forward (the backward is the Triton kernel)."""
    fast = fastpath.door(input)
    if (fast is not None and backend == "triton" and type(dim) is int and type(keepdim) is bool
            and not (input.requires_grad and input.numel() >= AMAX_MASK_MIN_NUMEL and torch.is_grad_enabled())):
        out = fast.reduce(input, dim, keepdim, True)
        if out is not None:
            return out
    return _reduce_public(_amax_last, input, dim, keepdim, cuda=_cuda("amax_last", backend))
