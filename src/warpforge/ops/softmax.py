"""Softmax and log-softmax over the last dimension, forward and backward.

    y = exp(x - max(x)) / sum(exp(x - max(x)))          (softmax)
    y = x - max(x) - log(sum(exp(x - max(x))))          (log-softmax)
    dx = y * (dy - sum(y * dy))                          (softmax backward)
    dx = dy - exp(y) * sum(dy)                           (log-softmax backward)

Byte model (s = bytes per element, M rows of N): forward reads x and writes y, 2*M*N*s; backward
reads y and dy and writes dx, 3*M*N*s. FLOPs are ~5 per element: far below any compute roof
(an H200 moves 4.3 TB/s and does 67 TFLOP/s fp32, so 15 FLOP per byte would be needed), so the
bound is memory and the target is the measured copy bandwidth.

Why the kernels look the way they do:
- The textbook softmax reads x three times (max, sum, normalise). Holding the row in registers
  makes it one read and one write: the byte floor. That works up to N = 16,384 (``block`` path).
- Past that a row does not fit in one SM's registers, and a looped kernel that re-reads the row
  moves 1.5x the bytes. The ``split`` path spreads a row over C co-resident programs that exchange
  (max, sum-of-exp) per chunk and combine them with the online-softmax rescale
  S = sum_c s_c * exp(m_c - M): one read, one write at any N (see ``_rows.py``).
- Statistics are fp32 whatever the input dtype; the output is cast once, at the store.
- Short rows are packed several to a program (ROWS x BLOCK_N tiles) so every program moves ~8 KB.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import fastpath, new_empty
from ..runtime.checks import FLOAT_DTYPES, check_backend, check_tensor, dtype_names, normalize_dim
from ..runtime.device import device_name, sm_count
from ..runtime.heuristics import NORM_LOOP_ROWS_PER_SM, softmax_cluster_config, softmax_config
from ..runtime.registry import Op
from ..runtime.launch import run
from ._cluster_rows import cluster_route
from ._rows import (LOG2E, as_rows, exp_minus, gather_row_stats, load_cols, online_finish, publish_row_stats,
                    split_launch, store_cols)


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def softmax_reference(x: torch.Tensor, dim: int = -1, log: bool = False) -> torch.Tensor:
    """Ground truth in float64 (float32 on devices without it), cast back to x's dtype."""
    xf = x.double() if x.device.type == "cpu" else x.float()
    y = torch.log_softmax(xf, dim) if log else torch.softmax(xf, dim)
    return y.to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _softmax_fwd_block_kernel(
    x_ptr, y_ptr,              # (M, N) input rows (column stride 1), (M, N) contiguous output
    M, N, stride_x, stride_y,  # row strides in elements
    LOG: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    r = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r * stride_x + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=1)
    m = tl.where(m == -float("inf"), 0.0, m)          # an all -inf row gives NaN, as torch does
    z = x - m[:, None]
    e = tl.exp(z)
    s = tl.sum(e, axis=1)
    if LOG:
        y = z - tl.log(s)[:, None]
    else:
        y = e * (1.0 / s)[:, None]
    tl.store(y_ptr + r * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_max_sum(stats_ptr, row, C, CP: tl.constexpr):
    """Wait for every chunk's (max, sum of exp) of ``row`` and combine them with the online-softmax
    rescale: the row's max M and S = sum_c s_c * exp(m_c - M)."""
    ms, ss, valid = gather_row_stats(stats_ptr, row, C, CP)
    m = tl.max(tl.where(valid, ms, -float("inf")), axis=0)
    return m, tl.sum(tl.where(valid, ss * tl.exp(ms - m), 0.0), axis=0)


@triton.jit
def _softmax_fwd_split_kernel(
    x_ptr, y_ptr, M, N, stride_x, stride_y,
    stats_ptr,                 # (M, C, 2) int32 exchange workspace, filled with the sentinel
    C, n_groups,               # programs per row, row groups in the persistent grid
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr,
):
    pid = tl.program_id(0)
    chunk = pid % C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    row = pid // C
    x = tl.load(x_ptr + tl.cast(row, tl.int64) * stride_x + cols, mask=mask & (row < M), other=-float("inf"))
    for row in range(pid // C, M, n_groups):
        xf = x.to(tl.float32)
        # prefetch the next row first: its DRAM latency hides this row's statistics and the wait
        nxt = row + n_groups
        x = tl.load(x_ptr + tl.cast(nxt, tl.int64) * stride_x + cols, mask=mask & (nxt < M), other=-float("inf"))
        m_c = tl.max(xf, axis=0)
        m_c = tl.where(m_c == -float("inf"), 0.0, m_c)
        e = exp_minus(xf, m_c)
        publish_row_stats(stats_ptr, row, chunk, C, m_c, tl.sum(e, axis=0))
        m, s = _row_max_sum(stats_ptr, row, C, CP)
        if LOG:
            y = xf - m - tl.log(s)
        else:
            y = e * (tl.exp(m_c - m) / s)
        tl.store(y_ptr + tl.cast(row, tl.int64) * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_pipe_kernel(
    x_ptr, y_ptr, M, N, stride_x, stride_y, stats_ptr, C, n_groups,   # as the split kernel
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr,
):
    """The split kernel with the wait deferred by one row: publish row r's (max, sum of exp),
    then write row r - n_groups, whose statistics the group published one step earlier (the
    exchange's latency leaves the critical path; its raw chunk stays in registers one step)."""
    pid = tl.program_id(0)
    chunk = pid % C
    first = pid // C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + tl.cast(first, tl.int64) * stride_x + cols, mask=mask & (first < M), other=-float("inf"))
    xp = tl.zeros((BLOCK_N,), x_ptr.dtype.element_ty)
    for row in range(first, M + n_groups, n_groups):
        xf = x.to(tl.float32)
        xr = x
        nxt = row + n_groups
        x = tl.load(x_ptr + tl.cast(nxt, tl.int64) * stride_x + cols, mask=mask & (nxt < M), other=-float("inf"))
        if row < M:
            m_c = tl.max(xf, axis=0)
            m_c = tl.where(m_c == -float("inf"), 0.0, m_c)
            publish_row_stats(stats_ptr, row, chunk, C, m_c, tl.sum(exp_minus(xf, m_c), axis=0))
        prev = row - n_groups
        if prev >= first:
            pf = xp.to(tl.float32)
            m, s = _row_max_sum(stats_ptr, prev, C, CP)
            if LOG:
                y = pf - m - tl.log(s)
            else:
                y = exp_minus(pf, m) * (1.0 / s)
            tl.store(y_ptr + tl.cast(prev, tl.int64) * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
        xp = xr


SOFTMAX_GROUP = tl.constexpr(8)   # the loop forward's in-thread group: one 16-byte load of bf16 a thread


@triton.jit
def _softmax_fwd_loop_kernel(
    x_ptr, y_ptr, M, N, stride_x, stride_y,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
    N_CONST: tl.constexpr = 0,     # > 0: N compiled in (== N, a whole number of steps): no masks
):
    """Two passes over a row: pass 1 keeps x in L2 (evict-last) and the online statistics per group
    of 8 adjacent columns, reduced in the thread: the group's running max rises by the step's group
    max, so the running sum is rescaled once a group a step, and exp runs 1 + 1/8 times an element
    (the per-lane online update ran it twice, a rate near the SFU's at the copy roof); pass 2
    re-reads x (evict-first) and writes y, one more exp an element for softmax, none for log-softmax."""
    G: tl.constexpr = BLOCK_N // SOFTMAX_GROUP
    MASKED: tl.constexpr = N_CONST == 0
    tl.static_assert(N_CONST % BLOCK_N == 0, "N_CONST is a whole number of BLOCK_N steps")
    if N_CONST > 0:
        n_cols = N_CONST
    else:
        n_cols = N
    r = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, G)[:, None] * SOFTMAX_GROUP + tl.arange(0, SOFTMAX_GROUP)[None, :]
    xrow = x_ptr + r * stride_x
    yrow = y_ptr + r * stride_y
    m_g = tl.full((G,), -float("inf"), tl.float32)
    s_g = tl.zeros((G,), tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        x = load_cols(xrow + start + offs, start + offs < N, -float("inf"), MASKED, "evict_last").to(tl.float32)
        m_new = tl.maximum(m_g, tl.max(x, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)      # an all -inf group keeps sum 0
        if LOG:
            # x - m exact near the max: log-softmax's y = x - m - log(s) carries s's error alone,
            # and the FMA form's rounding of m * log2 e (~1e-3 of s at |m| ~ 3e4) would not cancel
            e = tl.exp2((x - m_safe[:, None]) * LOG2E)
        else:
            e = exp_minus(x, m_safe[:, None])     # the same rounding in y's numerator: it cancels
        s_g = s_g * tl.exp(m_g - m_safe) + tl.sum(e, axis=1)
        m_g = m_new
    m, s = online_finish(m_g, s_g)
    for start in range(0, n_cols, BLOCK_N):
        x = load_cols(xrow + start + offs, start + offs < N, 0.0, MASKED, "evict_first").to(tl.float32)
        if LOG:
            y = x - m - tl.log(s)
        else:
            y = exp_minus(x, m) * (1.0 / s)
        store_cols(yrow + start + offs, y.to(y_ptr.dtype.element_ty), start + offs < N, MASKED)


@triton.jit
def _bwd_combine(y, dy, LOG: tl.constexpr):
    """The per-row statistic of the backward: sum(y*dy) for softmax, sum(dy) for log-softmax."""
    if LOG:
        return tl.sum(dy, axis=-1)
    else:
        return tl.sum(y * dy, axis=-1)


@triton.jit
def _bwd_apply(y, dy, s, LOG: tl.constexpr):
    if LOG:
        return dy - tl.exp(y) * s
    else:
        return y * (dy - s)


@triton.jit
def _softmax_bwd_block_kernel(
    y_ptr, dy_ptr, dx_ptr,     # (M, N) saved output, incoming gradient (any row stride), (M, N) out
    M, N, stride_y, stride_dy, stride_dx,
    LOG: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    r = rows.to(tl.int64)[:, None]
    other = -float("inf") if LOG else 0.0             # exp(-inf) = 0 in masked lanes
    y = tl.load(y_ptr + r * stride_y + cols[None, :], mask=mask, other=other).to(tl.float32)
    dy = tl.load(dy_ptr + r * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = _bwd_combine(y, dy, LOG)
    dx = _bwd_apply(y, dy, s[:, None], LOG)
    tl.store(dx_ptr + r * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_split_kernel(
    y_ptr, dy_ptr, dx_ptr, M, N, stride_y, stride_dy, stride_dx,
    stats_ptr, C, n_groups,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr,
):
    pid = tl.program_id(0)
    chunk = pid % C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    other = -float("inf") if LOG else 0.0
    row = pid // C
    live = mask & (row < M)
    y = tl.load(y_ptr + tl.cast(row, tl.int64) * stride_y + cols, mask=live, other=other)
    dy = tl.load(dy_ptr + tl.cast(row, tl.int64) * stride_dy + cols, mask=live, other=0.0)
    for row in range(pid // C, M, n_groups):
        yf = y.to(tl.float32)
        dyf = dy.to(tl.float32)
        nxt = row + n_groups                          # prefetch the next row first
        live = mask & (nxt < M)
        y = tl.load(y_ptr + tl.cast(nxt, tl.int64) * stride_y + cols, mask=live, other=other)
        dy = tl.load(dy_ptr + tl.cast(nxt, tl.int64) * stride_dy + cols, mask=live, other=0.0)
        s_c = _bwd_combine(yf, dyf, LOG)
        publish_row_stats(stats_ptr, row, chunk, C, s_c, s_c)   # one statistic; the pair's second slot is unused
        ss, _unused, valid = gather_row_stats(stats_ptr, row, C, CP)
        dx = _bwd_apply(yf, dyf, tl.sum(ss, axis=0), LOG)
        tl.store(dx_ptr + tl.cast(row, tl.int64) * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_pipe_kernel(
    y_ptr, dy_ptr, dx_ptr, M, N, stride_y, stride_dy, stride_dx, stats_ptr, C, n_groups,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr,
):
    """The split backward with the wait deferred by one row (as ``_softmax_fwd_pipe_kernel``)."""
    pid = tl.program_id(0)
    chunk = pid % C
    first = pid // C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    other = -float("inf") if LOG else 0.0
    live = mask & (first < M)
    y = tl.load(y_ptr + tl.cast(first, tl.int64) * stride_y + cols, mask=live, other=other)
    dy = tl.load(dy_ptr + tl.cast(first, tl.int64) * stride_dy + cols, mask=live, other=0.0)
    yp = tl.zeros((BLOCK_N,), y_ptr.dtype.element_ty)
    dyp = tl.zeros((BLOCK_N,), dy_ptr.dtype.element_ty)
    for row in range(first, M + n_groups, n_groups):
        yr = y
        dyr = dy
        nxt = row + n_groups
        live = mask & (nxt < M)
        y = tl.load(y_ptr + tl.cast(nxt, tl.int64) * stride_y + cols, mask=live, other=other)
        dy = tl.load(dy_ptr + tl.cast(nxt, tl.int64) * stride_dy + cols, mask=live, other=0.0)
        if row < M:
            s_c = _bwd_combine(yr.to(tl.float32), dyr.to(tl.float32), LOG)
            publish_row_stats(stats_ptr, row, chunk, C, s_c, s_c)
        prev = row - n_groups
        if prev >= first:
            ss, _unused, valid = gather_row_stats(stats_ptr, prev, C, CP)
            dx = _bwd_apply(yp.to(tl.float32), dyp.to(tl.float32), tl.sum(ss, axis=0), LOG)
            tl.store(dx_ptr + tl.cast(prev, tl.int64) * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        yp = yr
        dyp = dyr


@triton.jit
def _softmax_bwd_loop_kernel(
    y_ptr, dy_ptr, dx_ptr, M, N, stride_y, stride_dy, stride_dx,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    other = -float("inf") if LOG else 0.0
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, N, BLOCK_N):
        mask = start + cols < N
        y = tl.load(y_ptr + r * stride_y + start + cols, mask=mask, other=other).to(tl.float32)
        dy = tl.load(dy_ptr + r * stride_dy + start + cols, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            acc += dy
        else:
            acc += y * dy
    s = tl.sum(acc, axis=0)
    for start in range(0, N, BLOCK_N):
        mask = start + cols < N
        y = tl.load(y_ptr + r * stride_y + start + cols, mask=mask, other=other).to(tl.float32)
        dy = tl.load(dy_ptr + r * stride_dy + start + cols, mask=mask, other=0.0).to(tl.float32)
        dx = _bwd_apply(y, dy, s, LOG)
        tl.store(dx_ptr + r * stride_dx + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _softmax_cluster(x2, y, m: int, n: int):
    """The CUDA staged cluster forward's launch shape for this call, or None where the Triton kernels
    keep it (heuristics.softmax_cluster_config; WARPFORGE_SOFTMAX_CUDA=0 keeps them)."""
    return cluster_route(x2, (), (x2, y), lambda: softmax_cluster_config(n, m, device_name(x2)),
                         "WARPFORGE_SOFTMAX_CUDA", "softmax and log-softmax")


def _softmax_fwd(x: torch.Tensor, log: bool) -> torch.Tensor:
    """Softmax over the last dim of x (any leading shape)."""
    x2 = as_rows(x)
    m, n = x2.shape
    y = new_empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0:
        return y.view(x.shape)
    cluster = _softmax_cluster(x2, y, m, n)
    if cluster is not None:
        from .. import cuda as wcuda

        wcuda.ops().softmax_fwd_cluster(x2, log, list(cluster), y)
        return y.view(x.shape)
    cfg = softmax_config(n, backward=False, many=m >= NORM_LOOP_ROWS_PER_SM * sm_count(),
                         device_name=device_name(x))
    args = (x2, y, m, n, x2.stride(0), y.stride(0))
    if cfg.mode == "block":
        run(_softmax_fwd_block_kernel, (triton.cdiv(m, cfg.rows),), args,
            LOG=log, ROWS=cfg.rows, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    elif cfg.mode in ("split", "pipe"):
        kernel = _softmax_fwd_pipe_kernel if cfg.mode == "pipe" else _softmax_fwd_split_kernel
        split_launch(kernel, m, cfg, x.device, args, LOG=log, BLOCK_N=cfg.block_n)
    else:
        run(_softmax_fwd_loop_kernel, (m,), args, LOG=log, BLOCK_N=cfg.block_n, N_CONST=n if cfg.const_n else 0,
            num_warps=cfg.num_warps)
    return y.view(x.shape)


def _softmax_bwd(y: torch.Tensor, dy: torch.Tensor, log: bool) -> torch.Tensor:
    y2, dy2 = as_rows(y), as_rows(dy)
    m, n = y2.shape
    dx = new_empty((m, n), device=y.device, dtype=y.dtype)
    if m == 0:
        return dx.view(y.shape)
    cfg = softmax_config(n, backward=True, device_name=device_name(y), log=log)
    args = (y2, dy2, dx, m, n, y2.stride(0), dy2.stride(0), dx.stride(0))
    if cfg.mode == "block":
        run(_softmax_bwd_block_kernel, (triton.cdiv(m, cfg.rows),), args,
            LOG=log, ROWS=cfg.rows, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    elif cfg.mode in ("split", "pipe"):
        kernel = _softmax_bwd_pipe_kernel if cfg.mode == "pipe" else _softmax_bwd_split_kernel
        split_launch(kernel, m, cfg, y.device, args, LOG=log, BLOCK_N=cfg.block_n)
    else:
        run(_softmax_bwd_loop_kernel, (m,), args, LOG=log, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    return dx.view(y.shape)


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _softmax_impl(x: torch.Tensor, log: bool) -> torch.Tensor:
    return _softmax_fwd(x, log)


def _softmax_bwd_impl(y: torch.Tensor, dy: torch.Tensor, log: bool) -> torch.Tensor:
    return _softmax_bwd(y, dy, log)


softmax_backward_op = Op("softmax_backward", _softmax_bwd_impl, lambda y, dy, log: y.new_empty(y.shape))


def _setup(ctx, inputs, output):
    ctx.log = inputs[1]
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_backward_op(y, dy, ctx.log), None


softmax_op = Op("softmax", _softmax_impl, lambda x, log: x.new_empty(x.shape),
                backward=_backward, setup_context=_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _softmax_public(x: torch.Tensor, dim: int, dtype: torch.dtype | None, log: bool, backend: str) -> torch.Tensor:
    check_tensor("input", x, min_dim=0)
    op = softmax_op
    if check_backend(backend) == "cuda":
        from ..cuda.functional import softmax_last as op
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"warpforge: 'dtype' must be a torch.dtype or None, got {type(dtype).__name__}")
        if dtype not in FLOAT_DTYPES:      # named here: after the cast, the error blamed 'input'
            raise TypeError(f"warpforge: 'dtype' is {str(dtype).replace('torch.', '')}; expected None or one of "
                            f"{dtype_names(FLOAT_DTYPES)}")
        x = x.to(dtype)
    d = normalize_dim("dim", dim, x.dim())       # before the 0-d case: torch takes only dim 0 or -1 there
    if x.dim() == 0:
        return op(x.reshape(1), log).reshape(())
    if x.numel() == 0:
        # nothing to compute, but the result must stay in the autograd graph (an empty_like had no
        # grad_fn: backward raised "does not require grad"); any map of an empty tensor is exact
        return x.clone()
    if d == x.dim() - 1:
        return op(x, log)
    return op(x.movedim(d, -1), log).movedim(-1, d)


def softmax(input: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None, *,
            backend: str = "triton") -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.softmax(input, dim, dtype=dtype)``. ``backend="cuda"``:
    the CUDA C++ kernels (warpforge.cuda)."""
    # the eager fast path (runtime/fastpath.py): None when it does not take the call
    fast = fastpath.door(input)
    if fast is not None and dtype is None and backend == "triton" and type(dim) is int:
        out = fast.softmax(input, dim, False)
        if out is not None:
            return out
    return _softmax_public(input, dim, dtype, False, backend)


def log_softmax(input: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None, *,
                backend: str = "triton") -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.log_softmax(input, dim, dtype=dtype)``. ``backend="cuda"``:
    the CUDA C++ kernels (warpforge.cuda)."""
    fast = fastpath.door(input)
    if fast is not None and dtype is None and backend == "triton" and type(dim) is int:
        out = fast.softmax(input, dim, True)
        if out is not None:
            return out
    return _softmax_public(input, dim, dtype, True, backend)
