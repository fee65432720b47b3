"""Cross-entropy over a vocabulary, and the fused linear + cross-entropy that never holds the logits.

Per token t with logits x (V of them), target y, optional class weights w (1 without), label
smoothing eps, z-loss coefficient z and a tanh soft cap c (Gemma 2's final-logit softcapping):

    x'    = c * tanh(x / c)                 (x' = x without a cap)
    lse   = log(sum_j exp(x'_j))            p_j = exp(x'_j - lse)
    loss  = (1 - eps) * w_y * (lse - x'_y)  +  (eps / V) * sum_j w_j * (lse - x'_j)  +  z * lse^2
    dloss/dx'_j = a * [ kappa * p_j - (1 - eps) * w_y * [j == y] - (eps / V) * w_j ]  +  2 z b lse p_j
          kappa = (1 - eps) * w_y + (eps / V) * sum_j w_j
    dloss/dx_j  = dloss/dx'_j * (1 - (x'_j / c)^2)

The first two terms are PyTorch's ``cross_entropy`` with ``weight`` and ``label_smoothing``
exactly. ``reduction="mean"`` divides them by sum_t w_{y_t} over the tokens that are not
``ignore_index`` (as PyTorch does) and the z term by the number of those tokens (the mean of
z * lse^2 over tokens, PaLM's z-loss); ignored tokens contribute 0 to the loss and get a zero
gradient. Where that divisor is 0 (every token ignored) the mean is 0 and so are the gradients
(PyTorch returns NaN there). a and b are the upstream gradient over those divisors.

Byte model (s = bytes per element of the logits, T tokens, V classes): the forward+backward must
read the logits once and write their gradient once, 2*T*V*s: at T = 8192, V = 128,256 in bf16
that is 4.2 GB, ~0.99 ms at an H200's measured 4.25 TB/s copy rate. FLOPs are ~10 per element, so
the bound is memory.

Why the kernels look the way they do:
- The gradient is formed in the forward. When the logits need a gradient and the loss is reduced
  to a scalar, the kernel that computes lse goes on to write dloss/dx with the upstream gradient
  taken as 1, and the backward only scales it -- on the device, by a kernel whose programs return
  at once when that gradient is exactly 1 (the usual ``loss.backward()``): one read of the logits
  and one write of the gradient in all, the byte floor. Computing lse in the forward and the
  gradient in the backward would read the logits twice: 1.5x the floor.
- One row of 128,256 bf16 logits is 256 KB, more than an SM's registers or shared memory, so on
  the GPU C co-resident programs share a row (the ``split`` path of ``_rows.py``): each holds its
  chunk in registers, publishes (max, sum of exp) of its chunk, waits for the row's other chunks,
  combines them with the online-softmax rescale and writes its chunk's gradient from registers.
  No pass ever re-reads the logits.
- ``reduction="none"``: each token's upstream gradient is only known in the backward, and dW of
  the fused linear form cannot be rescaled per token afterwards, so the forward saves lse (4 bytes
  a token) and the backward reads the logits once more to write the gradient in one pass -- the
  per-token gradients are exact (a known failure of fusing the gradient into the forward).
- The loss of each (row, chunk) is written to a small fp32 buffer, already divided by the mean's
  divisor, and summed by PyTorch in a fixed order: deterministic, no atomics. The divisors come
  from a first tiny kernel over the targets, which also checks them: a target outside [0, V) that
  is not ``ignore_index`` trips a device-side assertion on the GPU, as PyTorch's own kernel does
  (an error at the next synchronisation, no host round trip per call), and a ValueError under the
  interpreter; the kernels never index with it, and its token's loss is NaN.
- Instructions, not only bytes: reading and writing bf16 at 4.2 TB/s is 1.05 T elements a second,
  and an H200 issues ~33.5 T thread-instructions a second, so the whole kernel has ~32 issue slots
  an element. The first version used ~22 (PTX) and was issue-bound. Now: exp(x - m) as one FMA and
  an ex2, no mask select where the load already fills -inf, the gradient's scalars multiplied
  together before the one per-element multiply, and no per-element target compare (the target's
  gradient is a scalar store after a barrier): ~12-14, and 80 registers a thread (six programs an
  SM). 1.58 -> 1.46 ms for the fused pass at 8192 x 128,256; the forward alone 1.05 -> 0.57 ms.
- Offsets into the logits are int64 (row index x row stride), so T*V past 2^31 works.

Non-finite logits follow PyTorch: -inf entries are classes with probability 0 (a -inf target
logit gives an infinite loss); a NaN or +inf anywhere in a row makes that row's loss and gradient
NaN, and the reduced loss NaN. Nothing is clamped away silently.

Fused linear + cross-entropy: ``hidden @ weight.T (+ bias)`` is computed chunk by chunk (cuBLAS), the
chunk's gradient is formed in place of its logits by the kernel above, and dhidden and dweight are
accumulated from it at once (dW += dlogits^T @ hidden, fp32 inside the GEMM, stored in the
weight's dtype between chunks). The logits are never whole: extra memory is one chunk of logits
plus the gradients themselves, and the work is the three GEMMs a linear + cross-entropy needs,
plus one pass of this kernel per chunk.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import interpreting, new_empty
from ..runtime.amp import autocast_inputs
from ..runtime.checks import check_device, check_tensor, is_finite, to_float
from ..runtime.device import sm_count
from ..runtime.heuristics import ce_config, persistent_grid
from ..runtime.registry import FAST_EAGER, Op, may_keep_buffers
from ._rows import exp_minus, gather_row_stats, online_finish, online_update, publish_row_stats, split_launch

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def cross_entropy_reference(logits, target, weight=None, ignore_index=-100, reduction="mean",
                            label_smoothing=0.0, z_loss=0.0, softcap=None, return_lse=False):
    """Ground truth in float64 (float32 on devices without it): PyTorch's ``cross_entropy`` on the
    (soft-capped) logits, plus the z term, with this module's conventions for the mean (see the
    header). ``logits`` is (T, V), ``target`` (T,)."""
    x = logits.double() if logits.device.type == "cpu" else logits.float()
    target = target.long()
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    w = None if weight is None else weight.to(x.dtype)
    valid = target != ignore_index
    lse = torch.logsumexp(x, -1)
    ce = torch.nn.functional.cross_entropy(x, target, weight=w, ignore_index=ignore_index,
                                           reduction="none", label_smoothing=label_smoothing)
    zt = torch.where(valid, z_loss * lse * lse, torch.zeros_like(lse))
    if reduction == "none":
        loss = ce + zt
    elif reduction == "sum":
        loss = ce.sum() + zt.sum()
    else:
        safe = torch.where(valid, target, torch.zeros_like(target))
        den = (w[safe] if w is not None else torch.ones_like(lse)).masked_fill(~valid, 0).sum()
        cnt = valid.sum()
        loss = torch.where(den > 0, ce.sum() / den.clamp_min(1e-300), ce.sum() * 0) \
            + torch.where(cnt > 0, zt.sum() / cnt.clamp_min(1), zt.sum() * 0)
    loss = loss.to(logits.dtype)
    return (loss, lse.float()) if return_lse else loss


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit(debug=True)
def _ce_prep_kernel(
    t_ptr, stride_t,           # (T,) targets, int32 or int64
    w_ptr,                     # (V,) class weights (unused without HAS_W)
    norm_ptr,                  # (4,) fp32 out: sum of w_y over counted tokens, their number, sum_j w_j, bad targets
    T, V, ignore_index,
    HAS_W: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.arange(0, BLOCK)
    den = tl.zeros((BLOCK,), tl.float32)
    cnt = tl.zeros((BLOCK,), tl.int32)
    bad = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, T, BLOCK):
        i = start + offs
        live = i < T
        t = tl.load(t_ptr + i.to(tl.int64) * stride_t, mask=live, other=ignore_index)
        counted = t != ignore_index
        inside = (t >= 0) & (t < V)
        tl.device_assert(inside | (~counted),
                         "warpforge.cross_entropy: 'target' holds a class index outside [0, V) that is not ignore_index")
        ok = counted & inside
        if HAS_W:
            wy = tl.load(w_ptr + tl.where(ok, t, 0), mask=ok, other=0.0).to(tl.float32)
        else:
            wy = ok.to(tl.float32)
        den += tl.where(ok, wy, 0.0)
        cnt += ok.to(tl.int32)
        bad += (counted & (~inside)).to(tl.int32)
    wsum = tl.zeros((BLOCK,), tl.float32)
    if HAS_W:
        for start in range(0, V, BLOCK):
            wsum += tl.load(w_ptr + start + offs, mask=start + offs < V, other=0.0).to(tl.float32)
        total_w = tl.sum(wsum, axis=0)
    else:
        total_w = V * 1.0
    tl.store(norm_ptr, tl.sum(den, axis=0))
    tl.store(norm_ptr + 1, tl.sum(cnt, axis=0).to(tl.float32))
    tl.store(norm_ptr + 2, total_w)
    tl.store(norm_ptr + 3, tl.sum(bad, axis=0).to(tl.float32))


@triton.jit
def _capped(x, mask, cap, SOFTCAP: tl.constexpr):
    """x' = cap * tanh(x / cap) in fp32 (tanh u = 2 sigmoid(2u) - 1), -inf in masked lanes. (The
    loads fill masked lanes with -inf already; only the cap, which maps -inf to -cap, needs the
    select: one instruction an element saved on the common path.)"""
    if SOFTCAP:
        x = tl.where(mask, cap * (2.0 * tl.sigmoid(x * (2.0 / cap)) - 1.0), -float("inf"))
    return x


@triton.jit
def _divisors(norm_ptr, MEAN: tl.constexpr):
    """The per-call scalars, loaded once per program: 1 / (sum of w_y) and 1 / (counted tokens)
    for the mean (1 otherwise; 0 where the divisor is 0), and sum_j w_j."""
    den = tl.load(norm_ptr)
    cnt = tl.load(norm_ptr + 1)
    wsum = tl.load(norm_ptr + 2)
    if MEAN:
        inv_a = tl.where(den > 0, 1.0 / den, 0.0)
        inv_b = tl.where(cnt > 0, 1.0 / cnt, 0.0)
    else:
        inv_a = den * 0.0 + 1.0
        inv_b = den * 0.0 + 1.0
    return inv_a, inv_b, wsum


@triton.jit
def _class_weight(w_ptr, tgt, V, ignore_index, HAS_W: tl.constexpr):
    if HAS_W:
        ok = (tgt != ignore_index) & (tgt >= 0) & (tgt < V)
        return tl.load(w_ptr + tl.where(ok, tgt, 0), mask=ok, other=0.0).to(tl.float32)
    else:
        return 1.0


@triton.jit
def _row_terms(tgt, wy, g, inv_a, inv_b, wsum, V, ignore_index, eps):
    """Per-token scalars: whether it counts, whether its target is a bad index, and the
    coefficients of the CE and z terms of the gradient (upstream gradient over the divisors)."""
    counted = tgt != ignore_index
    inside = (tgt >= 0) & (tgt < V)
    ok = counted & inside
    a = tl.where(ok, g * inv_a, 0.0)
    b = tl.where(ok, g * inv_b, 0.0)
    kappa = (1.0 - eps) * wy + (eps / V) * wsum
    return ok, counted & (~inside), a, b, kappa


@triton.jit
def _owns(tgt, start, BLOCK_N: tl.constexpr):
    """Whether the chunk of columns [start, start + BLOCK_N) holds the target."""
    return (tgt >= start) & (tgt < start + BLOCK_N)


@triton.jit
def _target_logit(xs, cols, tgt, own):
    """The target's (soft-capped) logit x'_y, taken from the chunk's registers by the program that
    holds it (0 elsewhere). Not re-read from memory here: this kernel has no barrier between the
    read and the gradient store, which in place could land first."""
    return tl.sum(tl.where((cols == tgt) & own, xs, 0.0), axis=0)


@triton.jit
def _smooth_sum(xs, cols, mask, w_ptr, HAS_W: tl.constexpr):
    """sum_j w_j x'_j over a chunk (w = 1 without class weights)."""
    xm = tl.where(mask, xs, 0.0)
    if HAS_W:
        xm = xm * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return tl.sum(xm, axis=0)


@triton.jit
def _row_loss(xys, ssum, lse, wy, ok, bad, inv_a, inv_b, wsum, V, eps, zc, ZLOSS: tl.constexpr):
    """The token's loss from x'_y, sum_j w_j x'_j and lse, divided by the mean's divisors; 0 for an
    ignored token, NaN for a bad target."""
    ce = (1.0 - eps) * wy * (lse - xys) + (eps / V) * (wsum * lse - ssum)
    zt = lse * 0.0
    if ZLOSS:
        zt = zc * lse * lse
    return tl.where(bad, float("nan"), tl.where(ok, ce * inv_a + zt * inv_b, 0.0))


@triton.jit
def _grad(e, scale, xs, wj, lse, a, b, kappa, wy, V, eps, zc, cap,
          SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr, TARGET: tl.constexpr):
    """dloss/dx from p = softmax(x') = e * scale (see the header), elementwise on a chunk (TARGET=False) or on
    the target's single logit (TARGET=True). The scalar parts are folded first so that an element
    costs a multiply-add (and the cap's derivative); the target's -1 is a separate scalar store,
    so no per-element index compare (and no index vector held in registers) is needed."""
    c1 = a * kappa
    if ZLOSS:
        c1 += 2.0 * zc * b * lse
    g = e * (c1 * scale)            # p = e * scale; the scalars multiplied once, not per element
    if SMOOTH:
        g -= (a * eps / V) * wj
    if TARGET:
        g -= a * (1.0 - eps) * wy
    if SOFTCAP:
        t = tl.minimum(tl.abs(xs) / cap, 1.0)     # |x'| <= cap; masked lanes (-inf) give 0
        g = g * (1.0 - t * t)
    return g


@triton.jit
def _class_weights(w_ptr, cols, mask, HAS_W: tl.constexpr, SMOOTH: tl.constexpr):
    """w_j for the smoothing term of the gradient (1 without class weights; unused without smoothing)."""
    if SMOOTH and HAS_W:
        return tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        return 1.0


@triton.jit
def _store_target_grad(dx_row, tgt, xy, own, lse, a, b, kappa, wy, w_ptr, V, eps, zc, cap,
                       HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr):
    """Overwrite the target's gradient (the chunk store wrote it without the -1 term); ``xy`` is
    the target's soft-capped logit. Called after a barrier, so the chunk's vector store of that
    element is ordered before this one."""
    if own:
        gt = _grad(exp_minus(xy, lse), 1.0, xy, wy, lse, a, b, kappa, wy, V, eps, zc, cap, SMOOTH, ZLOSS, SOFTCAP, True)
        tl.store(dx_row + tgt, gt.to(dx_row.dtype.element_ty))


@triton.jit
def _store_chunk_grad(dx_row, cols, mask, e, scale, xs, tgt, xy, own, lse, a, b, kappa, wy, w_ptr, V, eps, zc,
                      cap, HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr):
    """Write a chunk's gradient from its softmax e * scale, then (in the program holding the
    target, after a barrier that orders the two stores) the target's own."""
    g = _grad(e, scale, xs, _class_weights(w_ptr, cols, mask, HAS_W, SMOOTH), lse, a, b, kappa, wy, V, eps, zc, cap,
              SMOOTH, ZLOSS, SOFTCAP, False)
    tl.store(dx_row + cols, g.to(dx_row.dtype.element_ty), mask=mask)
    if own:
        tl.debug_barrier()
    _store_target_grad(dx_row, tgt, xy, own, lse, a, b, kappa, wy, w_ptr, V, eps, zc, cap,
                       HAS_W, SMOOTH, ZLOSS, SOFTCAP)


@triton.jit
def _finish_row(row, e, xs, m_c, tgt, xy, ssum, chunk, start, cols, mask, C,
                dx_ptr, w_ptr, lse_ptr, part_ptr, stats_ptr, stride_dx, g_up, inv_a, inv_b, wsum,
                V, ignore_index, eps, zc, cap,
                HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr,
                WRITE_GRAD: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr):
    """The second half of a row's chunk: wait for the row's other chunks' (max, sum of exp),
    combine them into lse, write this chunk's loss share, lse (chunk 0) and gradient."""
    own = _owns(tgt, start, BLOCK_N)
    wy = _class_weight(w_ptr, tgt, V, ignore_index, HAS_W)
    ok, bad, a, b, kappa = _row_terms(tgt, wy, g_up, inv_a, inv_b, wsum, V, ignore_index, eps)
    ms, ss, valid = gather_row_stats(stats_ptr, row, C, CP)
    m = tl.max(tl.where(valid, ms, -float("inf")), axis=0)
    lse = m + tl.log(tl.sum(tl.where(valid, ss * tl.exp(ms - m), 0.0), axis=0))
    # this chunk's share of the loss: the target term where it lives, the lse terms in chunk 0
    xys = tl.where(own, xy, 0.0)
    part = _row_loss(xys, ssum, tl.where(chunk == 0, lse, 0.0), wy, ok, bad, inv_a, inv_b, wsum, V, eps, zc, ZLOSS)
    tl.store(part_ptr + tl.cast(row, tl.int64) * C + chunk, part)
    if chunk == 0:
        tl.store(lse_ptr + row, lse)
    if WRITE_GRAD:
        _store_chunk_grad(dx_ptr + tl.cast(row, tl.int64) * stride_dx, cols, mask, e, tl.exp(m_c - lse), xs, tgt,
                          xy, own, lse, a, b, kappa, wy, w_ptr, V, eps, zc, cap, HAS_W, SMOOTH, ZLOSS, SOFTCAP)


@triton.jit
def _ce_split_kernel(
    x_ptr, dx_ptr,             # (T, V) logits (unit column stride, any row stride); gradient out (may alias x)
    t_ptr, w_ptr, g_ptr,       # (T,) targets; (V,) class weights; upstream gradient (a scalar)
    lse_ptr, part_ptr,         # (T,) fp32 lse out; (T, C) fp32 loss parts out
    norm_ptr,                  # (4,) fp32 from _ce_prep_kernel
    T, V, stride_x, stride_dx, stride_t, stride_g,
    ignore_index, eps, zc, cap,
    stats_ptr, C, n_groups,    # the exchange (``_rows.split_launch``)
    HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr,
    MEAN: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_N: tl.constexpr, CP: tl.constexpr,
):
    pid = tl.program_id(0)
    chunk = pid % C
    start = chunk * BLOCK_N
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < V
    inv_a, inv_b, wsum = _divisors(norm_ptr, MEAN)
    g_up = tl.load(g_ptr).to(tl.float32)
    row = pid // C
    x = tl.load(x_ptr + tl.cast(row, tl.int64) * stride_x + cols, mask=mask & (row < T), other=-float("inf"))
    t_next = tl.load(t_ptr + tl.cast(row, tl.int64) * stride_t, mask=row < T, other=ignore_index)
    for row in range(pid // C, T, n_groups):
        xs = _capped(x.to(tl.float32), mask, cap, SOFTCAP)
        tgt = t_next
        nxt = row + n_groups      # the next row's loads first: their latency hides this row's exchange
        x = tl.load(x_ptr + tl.cast(nxt, tl.int64) * stride_x + cols, mask=mask & (nxt < T), other=-float("inf"))
        t_next = tl.load(t_ptr + tl.cast(nxt, tl.int64) * stride_t, mask=nxt < T, other=ignore_index)
        own = _owns(tgt, start, BLOCK_N)
        # the target's logit by a scalar load (an L1 hit: the chunk was just loaded) rather than a
        # compare over the chunk, which keeps a column vector live across the exchange (80 -> 128
        # registers). In place (dx == x) it is still race-free: the load precedes the bar.sync of
        # the max reduction below in program order, and a CTA barrier completes it before any
        # thread passes, while every store of this row comes after the exchange (num_warps > 1).
        xy = _capped(tl.load(x_ptr + tl.cast(row, tl.int64) * stride_x + tl.where(own, tgt, 0), mask=own,
                             other=0.0).to(tl.float32), own, cap, SOFTCAP)
        m_c = tl.max(xs, axis=0)
        m_c = tl.where(m_c == -float("inf"), 0.0, m_c)
        e = exp_minus(xs, m_c)
        if SMOOTH:
            ssum = _smooth_sum(xs, cols, mask, w_ptr, HAS_W)
        else:
            ssum = m_c * 0.0
        publish_row_stats(stats_ptr, row, chunk, C, m_c, tl.sum(e, axis=0))
        _finish_row(row, e, xs, m_c, tgt, xy, ssum, chunk, start, cols, mask, C,
                    dx_ptr, w_ptr, lse_ptr, part_ptr, stats_ptr, stride_dx, g_up, inv_a, inv_b, wsum,
                    V, ignore_index, eps, zc, cap, HAS_W, SMOOTH, ZLOSS, SOFTCAP, WRITE_GRAD, BLOCK_N, CP)


@triton.jit
def _ce_stats_kernel(
    x_ptr, t_ptr, w_ptr, stat_ptr, part_ptr, norm_ptr,   # stat: (T, C, 2) fp32 (max, sum of exp) out
    T, V, C, stride_x, stride_t, ignore_index, eps, cap,
    HAS_W: tl.constexpr, SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr, MEAN: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Forward without a gradient, one (row, chunk) a program: the chunk's (max, sum of exp) and
    its lse-free share of the loss, written out with no wait on the row's other chunks (nothing
    is written after lse is known); ``_ce_combine_kernel`` finishes the rows. One read of the
    logits at streaming speed."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * BLOCK_N
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < V
    x_row = x_ptr + tl.cast(row, tl.int64) * stride_x
    xs = _capped(tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32), mask, cap, SOFTCAP)
    tgt = tl.load(t_ptr + tl.cast(row, tl.int64) * stride_t)
    own = _owns(tgt, start, BLOCK_N)
    # a scalar load, not a compare over the chunk (5 instructions an element): nothing is written here
    xy = _capped(tl.load(x_row + tl.where(own, tgt, 0), mask=own, other=0.0).to(tl.float32), own, cap, SOFTCAP)
    m_c = tl.max(xs, axis=0)
    m_c = tl.where(m_c == -float("inf"), 0.0, m_c)
    s_c = tl.sum(exp_minus(xs, m_c), axis=0)
    if SMOOTH:
        ssum = _smooth_sum(xs, cols, mask, w_ptr, HAS_W)
    else:
        ssum = m_c * 0.0
    inv_a, inv_b, wsum = _divisors(norm_ptr, MEAN)
    wy = _class_weight(w_ptr, tgt, V, ignore_index, HAS_W)
    ok = (tgt != ignore_index) & (tgt >= 0) & (tgt < V)
    share = -(1.0 - eps) * wy * tl.where(own, xy, 0.0) - (eps / V) * ssum
    base = tl.cast(row, tl.int64) * C + chunk
    tl.store(part_ptr + base, tl.where(ok, share * inv_a, 0.0))
    tl.store(stat_ptr + base * 2, m_c)
    tl.store(stat_ptr + base * 2 + 1, s_c)


@triton.jit
def _ce_combine_kernel(
    stat_ptr, part_ptr, lse_ptr, t_ptr, w_ptr, norm_ptr,
    T, V, C, stride_t, ignore_index, eps, zc,
    HAS_W: tl.constexpr, ZLOSS: tl.constexpr, MEAN: tl.constexpr, ROWS: tl.constexpr, CP: tl.constexpr,
):
    """lse of ROWS rows from their chunks' (max, sum of exp); adds each row's lse terms to its
    chunk-0 loss share (NaN for a bad target) and writes lse."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < T
    cs = tl.arange(0, CP)
    valid = live[:, None] & (cs[None, :] < C)
    base = rows.to(tl.int64)[:, None] * C + cs[None, :]
    ms = tl.load(stat_ptr + base * 2, mask=valid, other=-float("inf"))
    ss = tl.load(stat_ptr + base * 2 + 1, mask=valid, other=0.0)
    m = tl.max(ms, axis=1)
    m = tl.where(m == -float("inf"), 0.0, m)
    lse = m + tl.log(tl.where(live, tl.sum(ss * tl.exp(ms - m[:, None]), axis=1), 1.0))
    tgt = tl.load(t_ptr + rows.to(tl.int64) * stride_t, mask=live, other=ignore_index)
    counted = tgt != ignore_index
    inside = (tgt >= 0) & (tgt < V)
    ok = counted & inside
    if HAS_W:
        wy = tl.load(w_ptr + tl.where(ok, tgt, 0), mask=ok, other=0.0).to(tl.float32)
    else:
        wy = ok.to(tl.float32)
    inv_a, inv_b, wsum = _divisors(norm_ptr, MEAN)
    add = ((1.0 - eps) * wy + (eps / V) * wsum) * lse * inv_a
    if ZLOSS:
        add += zc * lse * lse * inv_b
    p0 = part_ptr + rows.to(tl.int64) * C
    first = tl.load(p0, mask=live, other=0.0)
    out = tl.where(ok, first + add, 0.0)
    out = tl.where(counted & (~inside), float("nan"), out)
    tl.store(p0, out, mask=live)
    tl.store(lse_ptr + rows, lse, mask=live)


@triton.jit
def _ce_loop_kernel(
    x_ptr, dx_ptr, t_ptr, w_ptr, g_ptr, lse_ptr, part_ptr, norm_ptr,
    T, V, stride_x, stride_dx, stride_t, stride_g,
    ignore_index, eps, zc, cap,
    HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr,
    MEAN: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program a row, walking it in BLOCK_N pieces: statistics, then (WRITE_GRAD) a second
    pass that re-reads the row. The interpreter's path and the fallback past the split path."""
    row = tl.program_id(0)
    base = x_ptr + tl.cast(row, tl.int64) * stride_x
    offs = tl.arange(0, BLOCK_N)
    inv_a, inv_b, wsum = _divisors(norm_ptr, MEAN)
    tgt = tl.load(t_ptr + tl.cast(row, tl.int64) * stride_t)
    own = (tgt >= 0) & (tgt < V)
    wy = _class_weight(w_ptr, tgt, V, ignore_index, HAS_W)
    g_up = tl.load(g_ptr + tl.cast(row, tl.int64) * stride_g).to(tl.float32)
    ok, bad, a, b, kappa = _row_terms(tgt, wy, g_up, inv_a, inv_b, wsum, V, ignore_index, eps)
    m_v = tl.full((BLOCK_N,), -float("inf"), tl.float32)
    s_v = tl.zeros((BLOCK_N,), tl.float32)
    ssum = tl.sum(s_v, axis=0)
    xy = ssum
    for start in range(0, V, BLOCK_N):
        cols = start + offs
        mask = cols < V
        xs = _capped(tl.load(base + cols, mask=mask, other=-float("inf")).to(tl.float32), mask, cap, SOFTCAP)
        xy += tl.sum(tl.where(cols == tgt, xs, 0.0), axis=0)
        if SMOOTH:
            ssum += _smooth_sum(xs, cols, mask, w_ptr, HAS_W)
        m_v, s_v = online_update(m_v, s_v, xs)
    m, s_row = online_finish(m_v, s_v)
    lse = m + tl.log(s_row)
    tl.store(part_ptr + row, _row_loss(xy, ssum, lse, wy, ok, bad, inv_a, inv_b, wsum, V, eps, zc, ZLOSS))
    tl.store(lse_ptr + row, lse)
    if WRITE_GRAD:
        dx_row = dx_ptr + tl.cast(row, tl.int64) * stride_dx
        for start in range(0, V, BLOCK_N):
            cols = start + offs
            mask = cols < V
            xs = _capped(tl.load(base + cols, mask=mask, other=-float("inf")).to(tl.float32), mask, cap, SOFTCAP)
            g = _grad(exp_minus(xs, lse), 1.0, xs, _class_weights(w_ptr, cols, mask, HAS_W, SMOOTH), lse, a, b, kappa,
                      wy, V, eps, zc, cap, SMOOTH, ZLOSS, SOFTCAP, False)
            tl.store(dx_row + cols, g.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.debug_barrier()
        _store_target_grad(dx_row, tgt, xy, own, lse, a, b, kappa, wy, w_ptr, V, eps, zc, cap,
                           HAS_W, SMOOTH, ZLOSS, SOFTCAP)


@triton.jit
def _ce_bwd_kernel(
    x_ptr, dx_ptr, t_ptr, w_ptr, g_ptr, lse_ptr, norm_ptr,
    T, V, stride_x, stride_dx, stride_t, stride_g,
    ignore_index, eps, zc, cap,
    HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr,
    MEAN: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The gradient from the saved lse, one (row, chunk) a program: one read, one write."""
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK_N
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < V
    x_row = x_ptr + tl.cast(row, tl.int64) * stride_x
    x = tl.load(x_row + cols, mask=mask, other=-float("inf"))
    xs = _capped(x.to(tl.float32), mask, cap, SOFTCAP)
    lse = tl.load(lse_ptr + row)
    inv_a, inv_b, wsum = _divisors(norm_ptr, MEAN)
    tgt = tl.load(t_ptr + tl.cast(row, tl.int64) * stride_t)
    own = _owns(tgt, start, BLOCK_N)
    xy = _target_logit(xs, cols, tgt, own)
    wy = _class_weight(w_ptr, tgt, V, ignore_index, HAS_W)
    g_up = tl.load(g_ptr + tl.cast(row, tl.int64) * stride_g).to(tl.float32)
    ok, bad, a, b, kappa = _row_terms(tgt, wy, g_up, inv_a, inv_b, wsum, V, ignore_index, eps)
    _store_chunk_grad(dx_ptr + tl.cast(row, tl.int64) * stride_dx, cols, mask, exp_minus(xs, lse), 1.0, xs, tgt, xy, own,
                      lse, a, b, kappa, wy, w_ptr, V, eps, zc, cap, HAS_W, SMOOTH, ZLOSS, SOFTCAP)


@triton.jit
def _scale_kernel(x_ptr, g_ptr, n, BLOCK: tl.constexpr):
    """x *= g in place, persistent grid; every program returns at once when g == 1 (the upstream
    gradient of ``loss.backward()``), so the common backward costs one tiny launch."""
    g = tl.load(g_ptr).to(tl.float32)
    if g != 1.0:
        offs = tl.arange(0, BLOCK)
        # a 64-bit induction variable: in 32 bits start + step wraps past 2^31 when n is just under it
        for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, tl.num_programs(0) * BLOCK):
            i = start + offs
            x = tl.load(x_ptr + i, mask=i < n)
            tl.store(x_ptr + i, (x.to(tl.float32) * g).to(x_ptr.dtype.element_ty), mask=i < n)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
_ONES: dict = {}          # a device scalar 1.0 per device: the upstream gradient the forward assumes
CONFIG_OVERRIDE = None    # a RowConfig forcing the kernel's shape (probes and tests)
STATS_LAUNCH = None       # (columns, warps) of the no-gradient statistics kernel (probes)


def _one(device: torch.device) -> torch.Tensor:
    t = _ONES.get(device)
    if t is None and not may_keep_buffers(device):
        return torch.ones((), dtype=torch.float32, device=device)
    if t is None:
        t = _ONES[device] = torch.ones((), dtype=torch.float32, device=device)
    return t


def _prep(target: torch.Tensor, weight: Optional[torch.Tensor], vocab: int, ignore_index: int) -> torch.Tensor:
    """(4,) fp32 on the device: the mean's CE divisor, the counted tokens, sum_j w_j, bad targets."""
    norm = torch.empty(4, dtype=torch.float32, device=target.device)
    # one program; a block wide enough that 8192 targets are one trip (8.2 us at 1024 a trip on an H100,
    # each trip a dependent global load)
    block = 1024 if interpreting() else min(8192, max(1024, triton.next_power_of_2(target.shape[0])))
    _ce_prep_kernel[(1,)](target, target.stride(0), weight if weight is not None else norm, norm,
                          target.shape[0], vocab, ignore_index, HAS_W=weight is not None, BLOCK=block,
                          num_warps=4 if block <= 1024 else 16)
    if interpreting() and norm[3].item() > 0:
        t = target[(target != ignore_index) & ((target < 0) | (target >= vocab))]
        raise ValueError(f"warpforge: 'target' holds {t.numel()} class index(es) outside [0, {vocab}) that are not "
                         f"ignore_index ({ignore_index}), e.g. {t[0].item()}")
    return norm


def _flags(weight, eps: float, z: float, cap: float, mean: bool) -> dict:
    return dict(HAS_W=weight is not None, SMOOTH=eps > 0, ZLOSS=z != 0, SOFTCAP=cap > 0, MEAN=mean)


def _ce_rows(x: torch.Tensor, target: torch.Tensor, weight, norm: torch.Tensor, ignore_index: int, eps: float,
             z: float, cap: float, mean: bool, dx: Optional[torch.Tensor], lse: torch.Tensor) -> torch.Tensor:
    """The forward over (T, V) rows: lse into ``lse``, the gradient (upstream gradient 1) into ``dx``
    when given (``dx`` may be ``x``: in place). Returns the (T, C) fp32 loss parts."""
    t, v = x.shape
    cfg = CONFIG_OVERRIDE or ce_config(v)
    w = weight if weight is not None else norm          # any pointer: unread without class weights
    if dx is None and cfg.mode == "split":
        # no gradient: chunk statistics with no exchange, then a small combine over rows
        block, warps = STATS_LAUNCH or (cfg.block_n, cfg.num_warps)
        c = triton.cdiv(v, block)
        parts = torch.empty((t, c), dtype=torch.float32, device=x.device)
        if t == 0:
            return parts
        stat = torch.empty((t, c, 2), dtype=torch.float32, device=x.device)
        _ce_stats_kernel[(t, c)](x, target, w, stat, parts, norm, t, v, c, x.stride(0), target.stride(0),
                                 ignore_index, eps, cap, HAS_W=weight is not None, SMOOTH=eps > 0, SOFTCAP=cap > 0,
                                 MEAN=mean, BLOCK_N=block, num_warps=warps)
        cp = triton.next_power_of_2(c)
        rows = max(1, min(64, 2048 // cp))
        _ce_combine_kernel[(triton.cdiv(t, rows),)](stat, parts, lse, target, w, norm, t, v, c, target.stride(0),
                                                   ignore_index, eps, z, HAS_W=weight is not None, ZLOSS=z != 0,
                                                   MEAN=mean, ROWS=rows, CP=cp, num_warps=4)
        return parts
    parts = torch.empty((t, cfg.chunks if cfg.mode == "split" else 1), dtype=torch.float32, device=x.device)
    if t == 0:
        return parts
    out = dx if dx is not None else x
    args = (x, out, target, w, _one(x.device), lse, parts, norm,
            t, v, x.stride(0), out.stride(0), target.stride(0), 0, ignore_index, eps, z, cap)
    flags = _flags(weight, eps, z, cap, mean)
    if cfg.mode == "split":
        split_launch(_ce_split_kernel, t, cfg, x.device, args, WRITE_GRAD=dx is not None, BLOCK_N=cfg.block_n, **flags)
    else:
        _ce_loop_kernel[(t,)](*args, WRITE_GRAD=dx is not None, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **flags)
    return parts


def _ce_grad_rows(x: torch.Tensor, target: torch.Tensor, weight, norm, lse, grad: torch.Tensor, ignore_index: int,
                  eps: float, z: float, cap: float, mean: bool, dx: torch.Tensor) -> None:
    """The gradient from the saved lse into ``dx`` (may be ``x``), scaled by ``grad`` (a scalar or (T,))."""
    t, v = x.shape
    if t == 0:
        return
    g = grad.float()
    stride_g = 0 if g.dim() == 0 else g.stride(0)
    block = min(4096, triton.next_power_of_2(v))
    _ce_bwd_kernel[(t, triton.cdiv(v, block))](
        x, dx, target, weight if weight is not None else norm, g, lse, norm,
        t, v, x.stride(0), dx.stride(0), target.stride(0), stride_g, ignore_index, eps, z, cap,
        BLOCK_N=block, num_warps=4, **_flags(weight, eps, z, cap, mean))


def scale_(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``x *= grad`` in place (``grad`` a one-element tensor), without a host round trip: returns
    at once on the device when ``grad`` is exactly 1."""
    n = x.numel()
    if n:
        block = 4096
        grid = persistent_grid(triton.cdiv(n, block), 1, None if interpreting() else 4 * sm_count())
        _scale_kernel[(grid,)](x, grad, n, BLOCK=block, num_warps=4)   # the kernel reads any float dtype
    return x


def _reduce(parts: torch.Tensor, reduction: int, dtype: torch.dtype) -> torch.Tensor:
    loss = parts.sum(1) if reduction == 0 else parts.sum()
    return loss.to(dtype)


# ----------------------------------------------------------------------------------------------
# PyTorch operators: cross_entropy
# ----------------------------------------------------------------------------------------------
def _ce_impl(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
             reduction: int, label_smoothing: float, z_loss: float, softcap: float,
             fused_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, v = logits.shape
    norm = _prep(target, weight, v, ignore_index)
    lse = new_empty((t,), dtype=torch.float32, device=logits.device)
    dx = new_empty((t, v), dtype=logits.dtype, device=logits.device) if fused_grad else logits.new_empty((0,))
    parts = _ce_rows(logits, target, weight, norm, ignore_index, label_smoothing, z_loss, softcap,
                     reduction == 1, dx if fused_grad else None, lse)
    return _reduce(parts, reduction, logits.dtype), lse, dx


def _ce_fake(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, fused_grad):
    t, v = logits.shape
    return (logits.new_empty((t,) if reduction == 0 else ()), logits.new_empty((t,), dtype=torch.float32),
            logits.new_empty((t, v) if fused_grad else (0,)))


def _ce_bwd_impl(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], lse: torch.Tensor,
                 grad: torch.Tensor, ignore_index: int, reduction: int, label_smoothing: float, z_loss: float,
                 softcap: float) -> torch.Tensor:
    t, v = logits.shape
    norm = _prep(target, weight, v, ignore_index)
    dx = new_empty((t, v), dtype=logits.dtype, device=logits.device)
    _ce_grad_rows(logits, target, weight, norm, lse, grad, ignore_index, label_smoothing, z_loss, softcap,
                  reduction == 1, dx)
    return dx


ce_backward_op = Op("cross_entropy_backward", _ce_bwd_impl, lambda logits, *a: logits.new_empty(logits.shape))


def _real(t: torch.Tensor) -> bool:
    """An eager call on real tensors, where the saved gradient may be scaled in place."""
    return FAST_EAGER and type(t) is torch.Tensor and not torch.compiler.is_compiling()


def _scaled(ctx, saved: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient formed in the forward, times the upstream gradient: in place in eager mode
    (free when that gradient is 1), out of place where functional semantics are needed."""
    if not _real(saved):
        return (saved.float() * grad.float()).to(saved.dtype)
    return scale_(saved, grad)


def _once(ctx, name: str) -> None:
    if getattr(ctx, "used", False):
        raise RuntimeError(
            f"warpforge.{name}: a second backward through the same graph (retain_graph=True) is not supported "
            f"when the gradient is formed in the forward (its saved gradient was scaled in place by the first); "
            f"call it with torch.no_grad() for the loss alone or run the forward again")
    ctx.used = True


def _no_double_backward(name: str) -> None:
    """With a scalar reduction the gradient is formed in the forward, a constant to autograd (and
    the one handed back is the operator's own output, whose gradient the backward ignores): a
    backward with create_graph=True -- the only one that runs with grad mode on -- gave a gradient
    whose own gradient was silently None (a gradient penalty through the loss was lost). Raise."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"warpforge.{name}: backward with create_graph=True (double backward) is not supported with "
            f"reduction 'mean' or 'sum': the gradient is formed in the forward; use "
            f"torch.nn.functional.cross_entropy where second derivatives are needed")


def _ce_setup(ctx, inputs, output):
    logits, target, weight, ignore_index, reduction, eps, z, cap, fused = inputs
    ctx.params = (ignore_index, reduction, eps, z, cap)
    ctx.fused = fused
    ctx.set_materialize_grads(False)    # no (T, V) zeros for the unused gradient output's gradient
    if fused:
        ctx.save_for_backward(output[2])
    else:
        ctx.save_for_backward(logits, target, weight, output[1])


def _ce_backward(ctx, g_loss, g_lse, g_dx):
    if g_loss is None:
        return (None,) * 9
    if ctx.fused:
        _no_double_backward("cross_entropy")
        (dx,) = ctx.saved_tensors
        if _real(dx):
            _once(ctx, "cross_entropy")
        dx = _scaled(ctx, dx, g_loss)
    else:
        logits, target, weight, lse = ctx.saved_tensors
        dx = ce_backward_op(logits, target, weight, lse, g_loss, *ctx.params)
    return dx, None, None, None, None, None, None, None, None


cross_entropy_op = Op("cross_entropy", _ce_impl, _ce_fake, backward=_ce_backward, setup_context=_ce_setup)


# ----------------------------------------------------------------------------------------------
# PyTorch operators: linear_cross_entropy
# ----------------------------------------------------------------------------------------------
CHUNK_BYTES = 256 * 2**20    # default bound on one chunk of logits


def chunk_rows(tokens: int, vocab: int, itemsize: int, device: torch.device, chunk_size: int = 0) -> int:
    """Tokens per chunk: the user's bound, else what CHUNK_BYTES (or an eighth of the free device
    memory, if smaller) of logits holds, in multiples of 64."""
    if chunk_size > 0:
        return max(1, min(chunk_size, tokens))
    budget = CHUNK_BYTES
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = min(budget, free // 8)
    rows = max(1, budget // max(1, vocab * itemsize))
    if rows >= 64:
        rows -= rows % 64
    return max(1, min(rows, tokens))


def _logits(h, w, bias, out):
    if bias is None:
        return torch.mm(h, w.t(), out=out)
    return torch.addmm(bias, h, w.t(), out=out)


def _accumulate(lg, hc, w, first, dh_c, dw, db):
    """dh_c = dlogits @ W, dW (+)= dlogits^T @ h_c (fp32 inside the GEMM), db += column sums."""
    if dh_c is not None:
        torch.mm(lg, w, out=dh_c)
    if dw is not None:
        if first:
            torch.mm(lg.t(), hc, out=dw)
        else:
            dw.addmm_(lg.t(), hc)
    if db is not None:
        db.add_(lg.sum(0, dtype=torch.float32))


def _grad_buffers(h, w, bias, need_dh, need_dw, need_db):
    dh = new_empty(h.shape, dtype=h.dtype, device=h.device) if need_dh else None
    dw = new_empty(w.shape, dtype=w.dtype, device=w.device) if need_dw else None
    db = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_db else None
    return dh, dw, db


def _lce_impl(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
              ce_weight: Optional[torch.Tensor], ignore_index: int, reduction: int, label_smoothing: float,
              z_loss: float, softcap: float, chunk_size: int, need_dh: bool, need_dw: bool,
              need_db: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    t, _h = hidden.shape
    v = weight.shape[0]
    fused = reduction != 0 and (need_dh or need_dw or need_db)
    norm = _prep(target, ce_weight, v, ignore_index)
    rows = chunk_rows(t, v, hidden.element_size(), hidden.device, chunk_size)
    lse = new_empty((t,), dtype=torch.float32, device=hidden.device)
    dh, dw, db = _grad_buffers(hidden, weight, bias, need_dh and fused, need_dw and fused, need_db and fused)
    buf = torch.empty((min(rows, t), v), dtype=hidden.dtype, device=hidden.device)
    parts = []
    for s in range(0, t, rows):
        e = min(s + rows, t)
        lg = _logits(hidden[s:e], weight, bias, buf[: e - s])
        parts.append(_ce_rows(lg, target[s:e], ce_weight, norm, ignore_index, label_smoothing, z_loss, softcap,
                              reduction == 1, lg if fused else None, lse[s:e]))
        if fused:
            _accumulate(lg, hidden[s:e], weight, s == 0, None if dh is None else dh[s:e], dw, db)
    del buf
    if t == 0 and dw is not None:
        dw.zero_()
    loss = _reduce(torch.cat(parts) if parts else hidden.new_empty((0, 1), dtype=torch.float32), reduction, hidden.dtype)
    def empty():   # a fresh one per missing gradient: an operator's outputs may not alias each other
        return hidden.new_empty((0,))
    return (loss, lse, empty() if dh is None else dh, empty() if dw is None else dw,
            empty() if db is None else db.to(bias.dtype))


def _lce_fake(hidden, weight, target, bias, ce_weight, ignore_index, reduction, label_smoothing, z_loss, softcap,
              chunk_size, need_dh, need_dw, need_db):
    t = hidden.shape[0]
    fused = reduction != 0 and (need_dh or need_dw or need_db)
    return (hidden.new_empty((t,) if reduction == 0 else ()), hidden.new_empty((t,), dtype=torch.float32),
            hidden.new_empty(hidden.shape if fused and need_dh else (0,)),
            weight.new_empty(weight.shape) if fused and need_dw else hidden.new_empty((0,)),
            bias.new_empty(bias.shape) if fused and need_db else hidden.new_empty((0,)))


def _lce_bwd_impl(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                  ce_weight: Optional[torch.Tensor], lse: torch.Tensor, grad: torch.Tensor, ignore_index: int,
                  reduction: int, label_smoothing: float, z_loss: float, softcap: float, chunk_size: int,
                  need_dh: bool, need_dw: bool, need_db: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward from the saved lse (``reduction="none"``): each chunk's logits are recomputed
    and turned into their gradient in place in one pass, then dh and dW as in the forward."""
    t, _h = hidden.shape
    v = weight.shape[0]
    norm = _prep(target, ce_weight, v, ignore_index)
    rows = chunk_rows(t, v, hidden.element_size(), hidden.device, chunk_size)
    dh, dw, db = _grad_buffers(hidden, weight, bias, need_dh, need_dw, need_db)
    buf = torch.empty((min(rows, t), v), dtype=hidden.dtype, device=hidden.device)
    for s in range(0, t, rows):
        e = min(s + rows, t)
        lg = _logits(hidden[s:e], weight, bias, buf[: e - s])
        g = grad if grad.dim() == 0 else grad[s:e]
        _ce_grad_rows(lg, target[s:e], ce_weight, norm, lse[s:e], g, ignore_index, label_smoothing, z_loss, softcap,
                      reduction == 1, lg)
        _accumulate(lg, hidden[s:e], weight, s == 0, None if dh is None else dh[s:e], dw, db)
    if t == 0 and dw is not None:
        dw.zero_()
    def empty():
        return hidden.new_empty((0,))
    return (empty() if dh is None else dh, empty() if dw is None else dw, empty() if db is None else db.to(bias.dtype))


def _lce_bwd_fake(hidden, weight, target, bias, ce_weight, lse, grad, ignore_index, reduction, label_smoothing,
                  z_loss, softcap, chunk_size, need_dh, need_dw, need_db):
    return (hidden.new_empty(hidden.shape if need_dh else (0,)),
            weight.new_empty(weight.shape) if need_dw else hidden.new_empty((0,)),
            bias.new_empty(bias.shape) if need_db else hidden.new_empty((0,)))


lce_backward_op = Op("linear_cross_entropy_backward", _lce_bwd_impl, _lce_bwd_fake)


def _lce_setup(ctx, inputs, output):
    hidden, weight, target, bias, ce_weight, ignore_index, reduction, eps, z, cap, chunk, ndh, ndw, ndb = inputs
    ctx.fused = reduction != 0 and (ndh or ndw or ndb)
    ctx.set_materialize_grads(False)    # no zeros the size of dW for the gradient outputs' gradients
    ctx.needs = (ndh, ndw, ndb)
    ctx.params = (ignore_index, reduction, eps, z, cap, chunk)
    if ctx.fused:
        ctx.save_for_backward(*output[2:])
    else:
        ctx.save_for_backward(hidden, weight, target, bias, ce_weight, output[1])


def _lce_backward(ctx, g_loss, g_lse, g_dh, g_dw, g_db):
    if g_loss is None:
        return (None,) * 14
    ndh, ndw, ndb = ctx.needs
    if ctx.fused:
        _no_double_backward("linear_cross_entropy")
        dh, dw, db = ctx.saved_tensors
        if _real(dh):
            _once(ctx, "linear_cross_entropy")
        grads = [_scaled(ctx, g, g_loss) if need else None for g, need in ((dh, ndh), (dw, ndw), (db, ndb))]
    else:
        hidden, weight, target, bias, ce_weight, lse = ctx.saved_tensors
        ig, red, eps, z, cap, chunk = ctx.params
        out = lce_backward_op(hidden, weight, target, bias, ce_weight, lse, g_loss, ig, red, eps, z, cap, chunk,
                              ndh, ndw, ndb)
        grads = [g if need else None for g, need in zip(out, ctx.needs)]
    dh, dw, db = grads
    return dh, dw, None, db, None, None, None, None, None, None, None, None, None, None


linear_cross_entropy_op = Op("linear_cross_entropy", _lce_impl, _lce_fake, backward=_lce_backward,
                             setup_context=_lce_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _check_options(ignore_index, reduction, label_smoothing, z_loss, softcap) -> tuple[int, float, float, float]:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"warpforge: 'ignore_index' must be an int, got {type(ignore_index).__name__}")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"warpforge: 'reduction' is {reduction!r}; expected one of 'none', 'mean', 'sum'")
    eps = to_float("label_smoothing", label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"warpforge: 'label_smoothing' is {label_smoothing}; expected a value in [0, 1]")
    z = to_float("z_loss", z_loss)
    if not (is_finite(z) and z >= 0.0):
        raise ValueError(f"warpforge: 'z_loss' is {z_loss}; expected a finite value >= 0")
    cap = 0.0 if softcap is None else to_float("softcap", softcap)
    if softcap is not None and not (is_finite(cap) and cap > 0.0):
        raise ValueError(f"warpforge: 'softcap' is {softcap}; expected None or a finite value > 0")
    return REDUCTIONS[reduction], eps, z, cap


def _check_chunk_size(chunk_size) -> None:
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"warpforge: 'chunk_size' is {chunk_size!r}; expected None or a positive int (tokens)")


def _check_target(target, rows_name: str, rows: int, expected_shape) -> None:
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"warpforge: 'target' must be a torch.Tensor, got {type(target).__name__}")
    if target.is_floating_point():
        raise TypeError(f"warpforge: 'target' has dtype {target.dtype}; expected class indices (int64 or int32) -- "
                        f"probability targets are not supported")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"warpforge: 'target' has dtype {target.dtype}; expected int64 or int32 class indices")
    if tuple(target.shape) != tuple(expected_shape):
        raise ValueError(f"warpforge: 'target' has shape {tuple(target.shape)}; expected {tuple(expected_shape)} "
                         f"to match the {rows} rows of '{rows_name}'")


def _check_class_weight(name: str, w, vocab: int, ref: torch.Tensor) -> None:
    if w is None:
        return
    check_tensor(name, w)
    if w.dim() != 1 or w.shape[0] != vocab:
        raise ValueError(f"warpforge: '{name}' has shape {tuple(w.shape)}; expected ({vocab},), one weight per class")
    if w.device != ref.device:
        raise RuntimeError(f"warpforge: '{name}' is on {w.device} but the logits are on {ref.device}")


def _rows_of(x: torch.Tensor) -> torch.Tensor:
    """(T, V) with unit column stride (any row stride); copies only when that is impossible."""
    return x if x.stride(1) == 1 or x.shape[1] == 1 else x.contiguous()


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                  z_loss: float = 0.0, softcap: Optional[float] = None, *, return_lse: bool = False):
    """Drop-in for ``torch.nn.functional.cross_entropy`` with class-index targets, plus
    ``z_loss`` (adds z * lse^2 per counted token) and ``softcap`` (logits -> c * tanh(logits / c)
    first). ``input`` is (C,), (N, C) or (N, C, d1, ...) as in PyTorch; (N, C) with a unit class
    stride is read in place, other layouts are copied to rows first. ``return_lse=True`` also
    returns the log-sum-exp of each row (fp32, shaped like ``target``, without gradient).

    Differences from PyTorch, all deliberate: the mean over zero counted tokens is 0 (not NaN), and
    so is a weighted mean whose counted class weights sum to <= 0 (class weights are expected >= 0;
    checking them would cost a device-to-host copy); int32 targets are accepted; an out-of-range
    target is a device-side assertion on the GPU, a ValueError under the interpreter. The loss has
    the input's dtype, as in PyTorch."""
    check_tensor("input", input)
    red, eps, z, cap = _check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    if input.dim() == 1:
        vocab, out_shape = input.shape[0], ()
        x2 = input.reshape(1, vocab)
    elif input.dim() == 2:
        vocab, out_shape = input.shape[1], (input.shape[0],)
        x2 = input
    else:
        vocab, out_shape = input.shape[1], (input.shape[0], *input.shape[2:])
        if vocab == 0:
            raise ValueError(f"warpforge: 'input' has shape {tuple(input.shape)}, 0 classes (dim 1); expected at least 1")
        x2 = input.movedim(1, -1).reshape(-1, vocab)
    _check_target(target, "input", x2.shape[0], out_shape)
    check_device("target", target)
    if target.device != input.device:
        raise RuntimeError(f"warpforge: 'target' is on {target.device} but 'input' is on {input.device}")
    _check_class_weight("weight", weight, vocab, input)
    if weight is not None:
        weight = weight.contiguous()         # the kernels index it densely (a copy of V floats at most)
    x2 = _rows_of(x2)
    t2 = target.reshape(-1)
    fused = red != 0 and torch.is_grad_enabled() and input.requires_grad
    loss, lse, _dx = cross_entropy_op(x2, t2, weight, ignore_index, red, eps, z, cap, fused)
    if red == 0:
        loss = loss.reshape(out_shape)
    if return_lse:
        return loss, lse.detach().reshape(out_shape)
    return loss


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: Optional[float] = None, *,
                         ce_weight: Optional[torch.Tensor] = None, chunk_size: Optional[int] = None,
                         return_lse: bool = False):
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without ever holding the logits whole.

    ``hidden`` (..., H), ``weight`` (V, H) (an LM head), ``target`` shaped like ``hidden``'s leading
    dims, ``bias`` (V,); ``ce_weight`` is the per-class weight of ``cross_entropy``. ``chunk_size``
    bounds the tokens whose logits exist at once (default: what 256 MiB of logits holds, or an
    eighth of the free device memory if less). With a scalar reduction and gradients needed, the
    gradients are formed during the forward (see the module header); dweight is accumulated across
    chunks in the weight's dtype (fp32 within each chunk's GEMM). Inside ``torch.autocast``,
    hidden, weight and bias are cast to the region's dtype first, as the F.linear of the unfused
    form would cast them (``ce_weight`` is not; runtime/amp.py)."""
    hidden, weight, bias = autocast_inputs(hidden, weight, bias)
    check_tensor("hidden", hidden)
    check_tensor("weight", weight, min_dim=2)
    red, eps, z, cap = _check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    if weight.dim() != 2:
        raise ValueError(f"warpforge: 'weight' has shape {tuple(weight.shape)}; expected (V, H), a 2-d LM head")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"warpforge: 'hidden' has shape {tuple(hidden.shape)} and 'weight' has shape "
                         f"{tuple(weight.shape)}; expected weight (V, {hidden.shape[-1]}) to match hidden's last dim")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"warpforge: 'hidden' has dtype {hidden.dtype} but 'weight' has {weight.dtype}; expected the same")
    if weight.device != hidden.device:
        raise RuntimeError(f"warpforge: 'weight' is on {weight.device} but 'hidden' is on {hidden.device}")
    vocab = weight.shape[0]
    if bias is not None:
        check_tensor("bias", bias)
        if bias.shape != (vocab,) or bias.dtype != hidden.dtype or bias.device != hidden.device:
            raise ValueError(f"warpforge: 'bias' has shape {tuple(bias.shape)}, dtype {bias.dtype}, device {bias.device}; "
                             f"expected ({vocab},), {hidden.dtype}, {hidden.device}")
    out_shape = tuple(hidden.shape[:-1])
    _check_target(target, "hidden", math.prod(out_shape), out_shape)
    if target.device != hidden.device:
        raise RuntimeError(f"warpforge: 'target' is on {target.device} but 'hidden' is on {hidden.device}")
    _check_class_weight("ce_weight", ce_weight, vocab, hidden)
    if ce_weight is not None:
        ce_weight = ce_weight.contiguous()
    _check_chunk_size(chunk_size)
    h2 = hidden.reshape(-1, hidden.shape[-1])
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    grad = torch.is_grad_enabled()
    need = (grad and hidden.requires_grad, grad and weight.requires_grad, grad and bias is not None and bias.requires_grad)
    loss, lse, *_grads = linear_cross_entropy_op(h2, weight, target.reshape(-1), bias, ce_weight, ignore_index, red,
                                                 eps, z, cap, chunk_size or 0, *need)
    if red == 0:
        loss = loss.reshape(out_shape)
    if return_lse:
        return loss, lse.detach().reshape(out_shape)
    return loss
