"""Attention: FlashAttention forward and backward, dense (SDPA) and packed variable-length batches.

    S = scale * Q K^T (+ mask),   P = softmax(S) over keys,   O = P V,   lse = logsumexp(S) per row
    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   delta_i = sum_d O_i dO_i - dlse_i
    dQ = scale * dS K,   dK = scale * dS^T Q

FLOP model: the forward does two GEMMs of 2*L*S*D each per head, 4*B*H*L*S*D (half of it causal);
the backward five (S recomputed, dV, dP, dQ, dK), 2.5x the forward. Byte model: Q, K, V read and
O written once each, 2*B*(Hq + Hkv)*L*D*s -- at L = 4096, D = 128 that is 512 FLOPs per byte, far
past any ridge point (an H100 needs ~300), so attention is compute-bound and the roof is the
measured bf16 GEMM rate. What made FlashAttention famous is the other way round: the naive
version writes the L x S score matrix to memory (B=4, H=32, L=S=4096: 4.3 GB of bf16 per pass),
which makes it memory-bound by two orders of magnitude. Here the scores never leave the SM.

Why the kernels look the way they do:
- Forward: a program holds BLOCK_M query rows and streams K/V tiles of BLOCK_N rows, keeping a
  running row max m, row sum l and an fp32 accumulator (the online softmax): when m grows, the
  old l and accumulator are rescaled by exp(m_old - m_new), so one pass over K/V suffices. exp2
  with log2(e) folded into the scale: one FMA a score instead of a multiply, a subtract and exp.
- Masking costs a compare and a select per score, so the key range of a query tile is split in
  three: tiles before and after the fully visible middle (the causal diagonal, the sliding window's
  edge, the ragged end) take the masked path, the middle none. Causal tiles above the diagonal are
  never visited: half the work, counted as half the FLOPs.
- Causal programs take query tiles longest-first so the short ones fill the tail of the grid.
- Backward: one program per key tile holds K, V and the dK, dV accumulators and streams every
  query tile that sees it (and, under GQA, every query head of its group, so a KV head's gradient
  is one program's sum, not a race of Hq/Hkv programs), recomputing S and P from the saved lse
  instead of storing the L x S probabilities. dQ comes from a second kernel per query tile that
  recomputes S and dP: seven GEMMs where the FLOP model counts five, but no atomics, so the
  backward is deterministic. (dQ by per-element fp32 atomics from the dK/dV programs,
  FlashAttention-2's way, measured no faster on an H100: 7.47 against 7.20 ms at B=4 H=32
  S=4096 D=128; the Hopper kernel below does it with TMA reduce-adds of whole tiles instead.)
- Hopper: dense forwards without a user mask or window, D 64/128 in bf16/fp16, go to a
  warp-specialised Gluon kernel (ops/attention_sm90.py: TMA producer warp, two consumer
  warpgroups, QK^T in flight during the softmax); on an H200 at B=4 H=32 S=4096 D=128 it runs
  at 655 / 602 TFLOP/s full / causal against this file's kernel's ~480 / ~430 (1.06x / 1.08x
  cuDNN). The backward of those calls is a fused Gluon kernel there (dK, dV and dQ in one pass,
  five GEMMs, dQ summed by TMA reduce-adds into fp32: 0.99x cuDNN on the H200), or, under
  torch.use_deterministic_algorithms(True), this file's dK/dV kernel plus a Gluon dQ kernel.
  With dropout, the forward at D 128 and the fused backward are the Gluon kernels too (they draw
  the mask in the wgmma accumulator's layout, _dropout_keep); the D-64 forward and the
  deterministic backward stay here. A soft cap (Gemma 2) is taken by the Gluon forward (per-tile
  kernel) and fused backward as by the Triton kernels (_exp2_scores: tanh.approx), the deterministic
  backward's dQ here. Every other call runs the Triton kernels here.
- GQA/MQA: query head h reads KV head h // (Hq/Hkv); nothing is repeated in memory.
- Variable length: the same kernels, where a program reads its sequence's start and length from
  cu_seqlens (clamped to the packed tensor, so a bad cu_seqlens cannot send a read out of bounds).

Conventions: ``is_causal`` of the SDPA drop-in is top-left aligned (query i sees keys j <= i), as
torch's; the varlen ``causal`` is bottom-right aligned (query i of L sees keys j <= i + S - L), as
FlashAttention's. A query row with no visible key (a bool mask of all False, a window past the
sequence) outputs zeros, and its lse is +inf. lse is natural-log, fp32.
"""
from __future__ import annotations

import functools
import math
import operator
import os

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import interpreting, unit_last_dim
from ..runtime.amp import autocast_inputs
from ..runtime.checks import (as_index, check_device, check_finite, check_same, check_tensor, host_sync_unavailable,
                              to_float)
from ..runtime.heuristics import AttentionConfig, attention_configs, attention_pattern
from ..runtime.launch import LaunchCache, launch_fitting
from ..runtime.registry import Op

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
ATTN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def attention_reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                        window_size=None, bottom_right=False, dropout_keep=None, dropout_p=0.0, softcap=0.0):
    """Plain attention in float64 on the CPU (float32 elsewhere), for (..., H, L, D) inputs.
    Returns (out in q's dtype, lse in float32). Rows with no visible key give 0 and lse +inf.
    ``dropout_keep``: a bool mask broadcastable to the scores (dropout_keep_mask's); the kept
    probabilities are scaled by 1 / (1 - dropout_p), the others dropped (lse is unchanged).
    ``softcap`` > 0: the scaled scores capped to softcap * tanh(score / softcap), before the mask."""
    wd = torch.float64 if q.device.type == "cpu" else torch.float32
    qf, kf, vf = q.to(wd), k.to(wd), v.to(wd)
    if qf.shape[-3] != kf.shape[-3]:
        rep = qf.shape[-3] // kf.shape[-3]
        kf, vf = kf.repeat_interleave(rep, -3), vf.repeat_interleave(rep, -3)
    L, S = qf.shape[-2], kf.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (qf @ kf.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    off = S - L if bottom_right else 0
    ok = torch.ones(L, S, dtype=torch.bool, device=q.device)
    left, right = window_size if window_size is not None else (-1, -1)
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        ok &= j <= i + off + right
    if left >= 0:
        ok &= j >= i + off - left
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            ok = ok & attn_mask
        else:
            s = s + attn_mask.to(wd)
    s = s.masked_fill(~ok, -float("inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])    # empty rows: all zeros
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    if dropout_keep is not None:
        p = torch.where(dropout_keep, p / (1.0 - dropout_p) if dropout_p < 1.0 else 0.0, 0.0)
    return (p @ vf).to(q.dtype), lse.float()


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _mm(a, b, acc, DOT_PREC: tl.constexpr):
    """acc + a @ b on the tensor cores (acc None: a fresh fp32 product). DOT_PREC "upcast" (the CPU
    interpreter with bfloat16, whose dot would multiply the raw 16-bit patterns) widens to fp32."""
    if DOT_PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=DOT_PREC)


@triton.jit
def _visible_span(s0, other_len, c, below, above,
                  BLOCK_SELF: tl.constexpr, BLOCK_OTHER: tl.constexpr,
                  HAS_BELOW: tl.constexpr, HAS_ABOVE: tl.constexpr):
    """Index t of the other side is visible from self index s when s+c-below <= t <= s+c+above.
    For self tile [s0, s0+BLOCK_SELF), the other side's tiles [lo, hi) hold everything visible;
    [a, b) are the tiles wholly visible from every row of the tile (no mask needed), [lo, a) and
    [b, hi) need the mask. lo, a, b are multiples of BLOCK_OTHER."""
    lo = s0 * 0
    hi = s0 * 0 + other_len
    if HAS_BELOW:
        lo = tl.maximum(s0 + c - below, 0) // BLOCK_OTHER * BLOCK_OTHER
    if HAS_ABOVE:
        hi = tl.minimum(hi, tl.maximum(s0 + BLOCK_SELF + c + above, 0))
    full_lo = lo
    if HAS_BELOW:
        first = tl.maximum(s0 + BLOCK_SELF - 1 + c - below, 0)
        full_lo = tl.maximum(lo, (first + BLOCK_OTHER - 1) // BLOCK_OTHER * BLOCK_OTHER)
    full_hi = other_len // BLOCK_OTHER * BLOCK_OTHER
    if HAS_ABOVE:
        full_hi = tl.minimum(full_hi, tl.maximum(s0 + c + above + 1, 0) // BLOCK_OTHER * BLOCK_OTHER)
    a = tl.minimum(full_lo, hi)
    b = tl.maximum(a, full_hi)
    return lo, a, b, hi


@triton.jit
def _visible(i, j, len_k, off, win_left, win_right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Query rows i (column vector) may see key rows j (row vector): in range and in the window."""
    ok = j < len_k
    if HAS_RIGHT:
        ok = ok & (j <= i + off + win_right)
    if HAS_LEFT:
        ok = ok & (j >= i + off - win_left)
    return ok


ROW_CHUNK = tl.constexpr(1024)     # a tile's first row = a 64-bit multiple of this + a 32-bit rest (_split_row)


@triton.jit
def _split_row(r0):
    """A tile's first row ``r0`` as (hi, lo): ``hi`` (int64) a multiple of ROW_CHUNK, whose offset
    (hi x stride, past 2^31 on long rows) is a 64-bit scalar, and ``lo`` < ROW_CHUNK, which the
    tile's rows add in 32 bits. The tile's offsets are rebuilt from ``lo`` each step: 64-bit offset
    vectors (item 73) cost these loops up to 12%, and loop-invariant 32-bit offset tiles (the
    first row as a scalar alone) were hoisted and spilled, up to 25% at D = 256 (H200,
    benchmarks/NOTES.md item 76). Needs (ROW_CHUNK + 256) x stride < 2^31: ROW_STRIDE_LIMIT."""
    r0 = tl.cast(r0, tl.int32)          # (a plain int under the interpreter)
    lo = r0 % ROW_CHUNK
    return tl.cast(r0 - lo, tl.int64), lo


@triton.jit
def _tile_start(r0, WIDE: tl.constexpr):
    """(hi, lo) of a tile's first row: _split_row's where offsets may pass 2^31 (WIDE), else (0,
    r0): the 32-bit offsets the kernels had before item 73, whose loops measured fastest on dense
    calls (benchmarks/NOTES.md item 76)."""
    if WIDE:
        t_hi, t_lo = _split_row(r0)
    else:
        t_hi, t_lo = 0, r0
    return t_hi, t_lo


@triton.jit
def _wide(x, WIDE: tl.constexpr):
    """``x`` in 64 bits where offsets may pass 2^31 (WIDE), else as it is."""
    if WIDE:
        x = tl.cast(x, tl.int64)
    return x


@triton.jit
def _dropout_keep(seed, b, h, rows, n0, thr, BLOCK_N: tl.constexpr):
    """Which scores of a tile survive dropout: a (len(rows), BLOCK_N) bool tile for query rows
    ``rows`` (positions in their sequence) and keys n0 .. n0 + BLOCK_N (n0 and BLOCK_N multiples of
    32) of query head h in batch entry b. Key j = 32 c + 8 w + 2 t + e takes half e of word w of one
    Philox-4x32-10 draw, keyed by the 64-bit ``seed`` with counter (4 c + t, row, head, batch): a
    draw's 8 scores are the ones one thread of a Hopper wgmma accumulator holds in a row (columns
    2t, 2t + 1 of each group of 8), so the Gluon forward draws each word once (attention_sm90's
    _dropout_words). A score is kept when its 16 bits are >= ``thr`` (round(dropout_p * 2^16)), so
    the drop rate is p to within 2^-17 (FlashAttention-2 takes 8 bits, p to within 2^-9). A
    score's fate is a function of (seed, b, h, i, j) alone, not of the tile shape: every forward
    and backward kernel (other tiles, some transposed) draws the same mask, and dropout_keep_mask
    rebuilds it for tests. The draws are the cost (benchmarks/NOTES.md items 155-156)."""
    NC: tl.constexpr = BLOCK_N // 32
    c = n0 // 32 + tl.arange(0, NC)
    t = tl.arange(0, 4)
    zero = rows[:, None, None] * 0 + c[None, :, None] * 0 + t[None, None, :] * 0
    c0 = (c[None, :, None] * 4 + t[None, None, :] + zero).to(tl.uint32)     # (R, NC, 4)
    c1 = (rows[:, None, None] + zero).to(tl.uint32)
    c2 = (zero + h).to(tl.uint32)
    c3 = (zero + b).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
    w01 = tl.join(tl.join(r0 & 0xFFFF, r0 >> 16), tl.join(r1 & 0xFFFF, r1 >> 16))   # (R, NC, t, e, w % 2)
    w23 = tl.join(tl.join(r2 & 0xFFFF, r2 >> 16), tl.join(r3 & 0xFFFF, r3 >> 16))
    r = tl.permute(tl.join(w01, w23), (0, 1, 5, 4, 2, 3))                     # (R, NC, w // 2, w % 2, t, e)
    return tl.reshape(r, (rows.shape[0], BLOCK_N)).to(tl.int32) >= thr


TANH_APPROX = 2    # SOFTCAP: the hardware's tanh.approx.f32 (one MUFU op; 16-bit inputs on a GPU)
TANH_EXP2 = 1      # SOFTCAP: 1 - 2 / (exp2(2 x log2 e) + 1) (fp32 inputs, and the interpreter)


@triton.jit
def _exp2_scores(qk, scale_log2, cap_in, cap_out, SOFTCAP: tl.constexpr):
    """(scores in the exp2 domain, tanh) of raw products ``qk``: scale qk log2(e), or under a soft
    cap c (SOFTCAP) c tanh(scale qk / c) log2(e), with cap_in = scale / c and cap_out = c log2(e)
    (_softcap_args). The tanh is returned for the backward's chain rule, d(capped)/d(raw) =
    1 - tanh^2 (without the cap, ``qk`` stands in, unused). TANH_APPROX is one MUFU op a score
    (FlashAttention-2/3 take the same instruction); the exp2 form, two (exp2 and a reciprocal), is
    exact to fp32 rounding and the only one the interpreter can run."""
    if not SOFTCAP:
        return qk * scale_log2, qk
    x = qk * cap_in
    if SOFTCAP == 2:
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        t = 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)
    return t * cap_out, t


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, skn, svn, mask_base, smm, smn,
               lo, hi, m0, len_q, len_k, off, win_left, win_right, scale_log2,
               offs_m, offs_n, offs_d,
               MASKED: tl.constexpr, MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
               WIDE: tl.constexpr, seed, drop_b, drop_h, drop_thr, DROPOUT: tl.constexpr,
               cap_in, cap_out, SOFTCAP: tl.constexpr):
    """Key tiles [lo, hi) into the running (acc, l, m) of one query tile. With DROPOUT, l sums every
    probability and the accumulator only the kept ones (the 1 / (1 - p) scale comes last). With
    SOFTCAP the scaled scores are capped (_exp2_scores) before any mask is added or applied."""
    dmask = offs_d < D
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + offs_n
        t_hi, t_lo = _tile_start(n0, WIDE)
        rn = t_lo + offs_n
        k_tile = k_base + t_hi * skn
        v_tile = v_base + t_hi * svn
        if MASKED:
            kt = tl.load(k_tile + rn[None, :] * skn + offs_d[:, None], mask=(n[None, :] < len_k) & dmask[:, None], other=0.0)
            v = tl.load(v_tile + rn[:, None] * svn + offs_d[None, :], mask=(n[:, None] < len_k) & dmask[None, :], other=0.0)
        elif BLOCK_D == D:
            kt = tl.load(k_tile + rn[None, :] * skn + offs_d[:, None])
            v = tl.load(v_tile + rn[:, None] * svn + offs_d[None, :])
        else:
            kt = tl.load(k_tile + rn[None, :] * skn + offs_d[:, None], mask=dmask[:, None], other=0.0)
            v = tl.load(v_tile + rn[:, None] * svn + offs_d[None, :], mask=dmask[None, :], other=0.0)
        qk = _mm(q, kt, None, DOT_PREC)                           # (BLOCK_M, BLOCK_N) fp32
        if MASKED:
            i = m0 + offs_m
            mask_tile = mask_base + _wide(m0, WIDE) * smm      # columns n: 32-bit (ROW_STRIDE_LIMIT)
            ok = _visible(i[:, None], n[None, :], len_k, off, win_left, win_right, HAS_LEFT, HAS_RIGHT)
            s, _t = _exp2_scores(qk, scale_log2, cap_in, cap_out, SOFTCAP)
            if MASK_KIND == 1:
                keep = tl.load(mask_tile + offs_m[:, None] * smm + n[None, :] * smn, mask=ok & (i[:, None] < len_q), other=0)
                ok = ok & (keep != 0)
            elif MASK_KIND == 2:
                s += tl.load(mask_tile + offs_m[:, None] * smm + n[None, :] * smn, mask=ok & (i[:, None] < len_q),
                         other=0.0).to(tl.float32) * 1.4426950408889634
            s = tl.where(ok, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == -float("inf"), 0.0, m_new)               # a row with nothing visible yet
            p = tl.math.exp2(s - m_use[:, None])
        elif SOFTCAP:
            s, _t = _exp2_scores(qk, scale_log2, cap_in, cap_out, SOFTCAP)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
            p = tl.math.exp2(s - m_use[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * scale_log2)
            m_use = m_new
            p = tl.math.exp2(qk * scale_log2 - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DROPOUT:
            p = tl.where(_dropout_keep(seed, drop_b, drop_h, m0 + offs_m, n0, drop_thr, BLOCK_N), p, 0.0)
        acc = _mm(p.to(v.dtype), v, acc, DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _seq_bounds(cu_ptr, b, total, fixed_len, VARLEN: tl.constexpr):
    """(start, length) of sequence b: from cu_seqlens, clamped to the packed length, or dense."""
    if VARLEN:
        start = tl.minimum(tl.maximum(tl.load(cu_ptr + b), 0), total)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + b + 1), start), total)
        return start, end - start
    return b * 0, b * 0 + fixed_len


@triton.jit
def _query_tile(cu_q_ptr, cu_k_ptr, H, GROUP, len_q_fixed, len_k_fixed, total_q, total_k,
                BLOCK_M: tl.constexpr, VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Which query tile a (tile, batch x head) program owns: batch b, query head h, its KV head,
    both sequences' (start, length), the tile's first row m0 and the causal diagonal's offset."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_start, len_q = _seq_bounds(cu_q_ptr, b, total_q, len_q_fixed, VARLEN)
    k_start, len_k = _seq_bounds(cu_k_ptr, b, total_k, len_k_fixed, VARLEN)
    pid_m = tl.program_id(0)
    if HAS_RIGHT:
        pid_m = tl.num_programs(0) - 1 - pid_m          # causal: the longest rows first
    off = len_k * 0
    if BOTTOM_RIGHT:
        off = len_k - len_q
    return b, h, h // GROUP, q_start, len_q, k_start, len_k, pid_m * BLOCK_M, off


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, mask_ptr,  # q (.., L, D), k v (.., S, D), o like q, lse fp32, mask (B, H, L, S) view
    cu_q_ptr, cu_k_ptr,                  # (B + 1,) int32 cumulative lengths (VARLEN only)
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,   # strides in elements (last dim 1)
    slb, slh, slm, smb, smh, smm, smn,   # lse and mask strides (mask: 0 on broadcast dims)
    H, GROUP, len_q_fixed, len_k_fixed, total_q, total_k,
    scale_log2, win_left, win_right,
    seed_ptr, drop_thr, drop_scale, drop_b0,   # dropout (DROPOUT only): int64 seed, p * 2^16, 1 / (1 - p), batch offset
    cap_in, cap_out,                     # soft cap (SOFTCAP only): scale / c and c * log2(e) (_exp2_scores)
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    MASK_KIND: tl.constexpr, DOT_PREC: tl.constexpr, WIDE: tl.constexpr = True, DROPOUT: tl.constexpr = False,
    SOFTCAP: tl.constexpr = 0,
):
    b, h, hk, q_start, len_q, k_start, len_k, m0, off = _query_tile(
        cu_q_ptr, cu_k_ptr, H, GROUP, len_q_fixed, len_k_fixed, total_q, total_k,
        BLOCK_M, VARLEN, BOTTOM_RIGHT, HAS_RIGHT)
    if m0 < len_q:
        b64 = b.to(tl.int64)
        q_base = q_ptr + b64 * sqb + h.to(tl.int64) * sqh + q_start.to(tl.int64) * sqm
        k_base = k_ptr + b64 * skb + hk.to(tl.int64) * skh + k_start.to(tl.int64) * skn
        v_base = v_ptr + b64 * svb + hk.to(tl.int64) * svh + k_start.to(tl.int64) * svn
        o_base = o_ptr + b64 * sob + h.to(tl.int64) * soh + q_start.to(tl.int64) * som
        mask_base = mask_ptr + b64 * smb + h.to(tl.int64) * smh
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        rows = m0 + offs_m
        qmask = (rows[:, None] < len_q) & (offs_d[None, :] < D)
        rw = _wide(rows, WIDE)                  # 64-bit offsets: rows * stride passes 2^31 on long sequences
        q = tl.load(q_base + rw[:, None] * sqm + offs_d[None, :], mask=qmask, other=0.0)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
        lo, a, bb, hi = _visible_span(m0, len_k, off, win_left, win_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
        if MASK_KIND != 0:                              # a user mask: every tile takes the masked path
            a = lo
            bb = lo
        seed = 0
        if DROPOUT:
            seed = tl.load(seed_ptr)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, skn, svn, mask_base, smm, smn,
                                   lo, a, m0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                                   True, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_N, DOT_PREC, WIDE,
                                   seed, b + drop_b0, h, drop_thr, DROPOUT, cap_in, cap_out, SOFTCAP)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, skn, svn, mask_base, smm, smn,
                                   a, bb, m0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                                   False, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_N, DOT_PREC, WIDE,
                                   seed, b + drop_b0, h, drop_thr, DROPOUT, cap_in, cap_out, SOFTCAP)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, skn, svn, mask_base, smm, smn,
                                   bb, hi, m0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                                   True, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_N, DOT_PREC, WIDE,
                                   seed, b + drop_b0, h, drop_thr, DROPOUT, cap_in, cap_out, SOFTCAP)
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        if DROPOUT:
            out = out * drop_scale
        tl.store(o_base + rw[:, None] * som + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=qmask)
        lse = tl.where(empty, float("inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
        lse_base = lse_ptr + b64 * slb + h.to(tl.int64) * slh + q_start.to(tl.int64) * slm
        tl.store(lse_base + rw * slm, lse, mask=rows < len_q)


@triton.jit
def _attn_bwd_delta_kernel(
    o_ptr, do_ptr, dlse_ptr, delta_ptr, cu_q_ptr,   # delta = rowsum(O * dO) - dlse, laid out like lse
    sob, soh, som, sdb, sdh, sdm, slb, slh, slm,
    H, len_q_fixed, total_q,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr,
):
    bh = tl.program_id(1)
    b = bh // H
    h = (bh % H).to(tl.int64)
    q_start, len_q = _seq_bounds(cu_q_ptr, b, total_q, len_q_fixed, VARLEN)
    m0 = tl.program_id(0) * BLOCK_M
    if m0 < len_q:
        b64 = b.to(tl.int64)
        rows = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        msk = (rows[:, None] < len_q) & (offs_d[None, :] < D)
        q0 = q_start.to(tl.int64)
        o = tl.load(o_ptr + b64 * sob + h * soh + (q0 + rows[:, None]) * som + offs_d[None, :], mask=msk, other=0.0)
        do = tl.load(do_ptr + b64 * sdb + h * sdh + (q0 + rows[:, None]) * sdm + offs_d[None, :], mask=msk, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        lse_at = b64 * slb + h * slh + (q0 + rows) * slm
        if HAS_DLSE:
            delta -= tl.load(dlse_ptr + lse_at, mask=rows < len_q, other=0.0)
        tl.store(delta_ptr + lse_at, delta, mask=rows < len_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, sqm, sdm, slm, mask_base, smm, smn,
                lo, hi, n0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                MASKED: tl.constexpr, MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, DOT_PREC: tl.constexpr,
                WIDE: tl.constexpr, seed, drop_b, drop_h, drop_thr, drop_scale, BLOCK_N: tl.constexpr,
                DROPOUT: tl.constexpr, cap_in, cap_out, SOFTCAP: tl.constexpr):
    """Query tiles [lo, hi) of one head into the dK, dV of one key tile (everything transposed:
    rows are keys, columns queries). With DROPOUT, dV takes the kept probabilities scaled by
    1 / (1 - p), and dP the same mask and scale before dS = P (dP - delta). With SOFTCAP, dS takes
    the cap's derivative 1 - tanh^2 on its way to the raw scores."""
    dmask = offs_d < D
    n = n0 + offs_n
    for m0 in range(lo, hi, BLOCK_M):
        i = m0 + offs_m
        t_hi, t_lo = _tile_start(m0, WIDE)          # 64-bit tile start, 32-bit rows inside it
        rm = t_lo + offs_m
        q_tile = q_base + t_hi * sqm
        do_tile = do_base + t_hi * sdm
        lse_tile = lse_base + t_hi * slm
        delta_tile = delta_base + t_hi * slm
        mask_tile = mask_base + t_hi * smm + _wide(n0, WIDE) * smn
        if MASKED:
            rmask = i < len_q
            q = tl.load(q_tile + rm[:, None] * sqm + offs_d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
            do = tl.load(do_tile + rm[:, None] * sdm + offs_d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
            lse = tl.load(lse_tile + rm * slm, mask=rmask, other=float("inf"))
            delta = tl.load(delta_tile + rm * slm, mask=rmask, other=0.0)
        else:
            if BLOCK_D == D:
                q = tl.load(q_tile + rm[:, None] * sqm + offs_d[None, :])
                do = tl.load(do_tile + rm[:, None] * sdm + offs_d[None, :])
            else:
                q = tl.load(q_tile + rm[:, None] * sqm + offs_d[None, :], mask=dmask[None, :], other=0.0)
                do = tl.load(do_tile + rm[:, None] * sdm + offs_d[None, :], mask=dmask[None, :], other=0.0)
            lse = tl.load(lse_tile + rm * slm)
            delta = tl.load(delta_tile + rm * slm)
        st, tt = _exp2_scores(_mm(k, tl.trans(q), None, DOT_PREC), scale_log2, cap_in, cap_out,   # (BLOCK_N, BLOCK_M)
                              SOFTCAP)
        if MASKED:
            ok = _visible(i[None, :], n[:, None], len_k, off, win_left, win_right, HAS_LEFT, HAS_RIGHT)
            ok = ok & (i[None, :] < len_q)
            if MASK_KIND == 1:
                keep = tl.load(mask_tile + rm[None, :] * smm + offs_n[:, None] * smn, mask=ok, other=0)
                ok = ok & (keep != 0)
            elif MASK_KIND == 2:
                st += tl.load(mask_tile + rm[None, :] * smm + offs_n[:, None] * smn, mask=ok, other=0.0).to(tl.float32) * 1.4426950408889634
            st = tl.where(ok, st, -float("inf"))
        pt = tl.math.exp2(st - lse[None, :] * 1.4426950408889634)
        if DROPOUT:
            keep = tl.trans(_dropout_keep(seed, drop_b, drop_h, i, n0, drop_thr, BLOCK_N))
            dv = _mm(tl.where(keep, pt * drop_scale, 0.0).to(do.dtype), do, dv, DOT_PREC)
            dpt = tl.where(keep, _mm(v, tl.trans(do), None, DOT_PREC) * drop_scale, 0.0)
        else:
            dv = _mm(pt.to(do.dtype), do, dv, DOT_PREC)
            dpt = _mm(v, tl.trans(do), None, DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        if SOFTCAP:
            dst = dst * (1.0 - tt * tt)
        dk = _mm(dst.to(q.dtype), q, dk, DOT_PREC)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, mask_ptr, cu_q_ptr, cu_k_ptr,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm,
    sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
    slb, slh, slm, smb, smh, smm, smn,
    HK, GROUP, len_q_fixed, len_k_fixed, total_q, total_k,
    scale, scale_log2, win_left, win_right,
    seed_ptr, drop_thr, drop_scale, drop_b0,   # dropout (DROPOUT only), as the forward's
    cap_in, cap_out,                     # soft cap (SOFTCAP only), as the forward's
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    MASK_KIND: tl.constexpr, DOT_PREC: tl.constexpr, WIDE: tl.constexpr = True, DROPOUT: tl.constexpr = False,
    SOFTCAP: tl.constexpr = 0,
):
    bhk = tl.program_id(1)
    b = bhk // HK
    hk = bhk % HK
    q_start, len_q = _seq_bounds(cu_q_ptr, b, total_q, len_q_fixed, VARLEN)
    k_start, len_k = _seq_bounds(cu_k_ptr, b, total_k, len_k_fixed, VARLEN)
    n0 = tl.program_id(0) * BLOCK_N
    if n0 < len_k:
        off = 0
        if BOTTOM_RIGHT:
            off = len_k - len_q
        b64 = b.to(tl.int64)
        q0 = q_start.to(tl.int64)
        k0 = k_start.to(tl.int64)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        n = n0 + offs_n
        kmask = (n[:, None] < len_k) & (offs_d[None, :] < D)
        hk64 = hk.to(tl.int64)
        k = tl.load(k_ptr + b64 * skb + hk64 * skh + (k0 + n[:, None]) * skn + offs_d[None, :], mask=kmask, other=0.0)
        v = tl.load(v_ptr + b64 * svb + hk64 * svh + (k0 + n[:, None]) * svn + offs_d[None, :], mask=kmask, other=0.0)
        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        # query tiles that see this key tile: i with j - off - win_right <= i <= j - off + win_left
        lo, a, bb, hi = _visible_span(n0, len_q, -off, win_right, win_left, BLOCK_N, BLOCK_M, HAS_RIGHT, HAS_LEFT)
        if MASK_KIND != 0:                              # a user mask: every tile masked
            a = lo
            bb = lo
        if n0 + BLOCK_N > len_k:                        # the ragged last key tile: masked throughout
            a = lo
            bb = lo
        seed = 0
        if DROPOUT:
            seed = tl.load(seed_ptr)
        for g in range(GROUP):
            h = (hk * GROUP + g).to(tl.int64)
            q_base = q_ptr + b64 * sqb + h * sqh + q0 * sqm
            do_base = do_ptr + b64 * sdb + h * sdh + q0 * sdm
            lse_base = lse_ptr + b64 * slb + h * slh + q0 * slm
            delta_base = delta_ptr + b64 * slb + h * slh + q0 * slm
            mask_base = mask_ptr + b64 * smb + h * smh
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, sqm, sdm, slm, mask_base, smm, smn,
                                 lo, a, n0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                                 True, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_M, DOT_PREC, WIDE,
                                 seed, b + drop_b0, h, drop_thr, drop_scale, BLOCK_N, DROPOUT,
                                 cap_in, cap_out, SOFTCAP)
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, sqm, sdm, slm, mask_base, smm, smn,
                                 a, bb, n0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                                 False, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_M, DOT_PREC, WIDE,
                                 seed, b + drop_b0, h, drop_thr, drop_scale, BLOCK_N, DROPOUT,
                                 cap_in, cap_out, SOFTCAP)
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, sqm, sdm, slm, mask_base, smm, smn,
                                 bb, hi, n0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                                 True, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_M, DOT_PREC, WIDE,
                                 seed, b + drop_b0, h, drop_thr, drop_scale, BLOCK_N, DROPOUT,
                                 cap_in, cap_out, SOFTCAP)
        dk = dk * scale
        tl.store(dk_ptr + b64 * sdkb + hk64 * sdkh + (k0 + n[:, None]) * sdkn + offs_d[None, :], dk.to(dk_ptr.dtype.element_ty), mask=kmask)
        tl.store(dv_ptr + b64 * sdvb + hk64 * sdvh + (k0 + n[:, None]) * sdvn + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty), mask=kmask)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_base, v_base, skn, svn, mask_base, smm, smn,
              lo, hi, m0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
              MASKED: tl.constexpr, MASK_KIND: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
              WIDE: tl.constexpr, seed, drop_b, drop_h, drop_thr, drop_scale, DROPOUT: tl.constexpr,
              cap_in, cap_out, SOFTCAP: tl.constexpr):
    """Key tiles [lo, hi) into the dQ of one query tile (DROPOUT: dP masked and scaled, SOFTCAP: dS
    through the cap, as in _dkdv_tiles)."""
    dmask = offs_d < D
    i = m0 + offs_m
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + offs_n
        t_hi, t_lo = _tile_start(n0, WIDE)          # 64-bit tile start, 32-bit rows inside it
        rn = t_lo + offs_n
        k_tile = k_base + t_hi * skn
        v_tile = v_base + t_hi * svn
        mask_tile = mask_base + _wide(m0, WIDE) * smm          # columns n: 32-bit (ROW_STRIDE_LIMIT)
        if MASKED:
            kv_mask = (n[:, None] < len_k) & dmask[None, :]
            k = tl.load(k_tile + rn[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_tile + rn[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
        elif BLOCK_D == D:
            k = tl.load(k_tile + rn[:, None] * skn + offs_d[None, :])
            v = tl.load(v_tile + rn[:, None] * svn + offs_d[None, :])
        else:
            k = tl.load(k_tile + rn[:, None] * skn + offs_d[None, :], mask=dmask[None, :], other=0.0)
            v = tl.load(v_tile + rn[:, None] * svn + offs_d[None, :], mask=dmask[None, :], other=0.0)
        s, t = _exp2_scores(_mm(q, tl.trans(k), None, DOT_PREC), scale_log2, cap_in, cap_out,   # (BLOCK_M, BLOCK_N)
                            SOFTCAP)
        if MASKED:
            ok = _visible(i[:, None], n[None, :], len_k, off, win_left, win_right, HAS_LEFT, HAS_RIGHT)
            if MASK_KIND == 1:
                keep = tl.load(mask_tile + offs_m[:, None] * smm + n[None, :] * smn, mask=ok & (i[:, None] < len_q), other=0)
                ok = ok & (keep != 0)
            elif MASK_KIND == 2:
                s += tl.load(mask_tile + offs_m[:, None] * smm + n[None, :] * smn, mask=ok & (i[:, None] < len_q),
                         other=0.0).to(tl.float32) * 1.4426950408889634
            s = tl.where(ok, s, -float("inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = _mm(do, tl.trans(v), None, DOT_PREC)
        if DROPOUT:
            dp = tl.where(_dropout_keep(seed, drop_b, drop_h, i, n0, drop_thr, BLOCK_N), dp * drop_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = _mm(ds.to(k.dtype), k, dq, DOT_PREC)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, mask_ptr, cu_q_ptr, cu_k_ptr,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm, sdqb, sdqh, sdqm,
    slb, slh, slm, smb, smh, smm, smn,
    H, GROUP, len_q_fixed, len_k_fixed, total_q, total_k,
    scale, scale_log2, win_left, win_right,
    seed_ptr, drop_thr, drop_scale, drop_b0,   # dropout (DROPOUT only), as the forward's
    cap_in, cap_out,                     # soft cap (SOFTCAP only), as the forward's
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    MASK_KIND: tl.constexpr, DOT_PREC: tl.constexpr, WIDE: tl.constexpr = True, DROPOUT: tl.constexpr = False,
    SOFTCAP: tl.constexpr = 0,
):
    b, h, hk, q_start, len_q, k_start, len_k, m0, off = _query_tile(
        cu_q_ptr, cu_k_ptr, H, GROUP, len_q_fixed, len_k_fixed, total_q, total_k,
        BLOCK_M, VARLEN, BOTTOM_RIGHT, HAS_RIGHT)
    if m0 < len_q:
        b64 = b.to(tl.int64)
        h64 = h.to(tl.int64)
        q0 = q_start.to(tl.int64)
        k0 = k_start.to(tl.int64)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        i = m0 + offs_m
        rmask = i < len_q
        qmask = rmask[:, None] & (offs_d[None, :] < D)
        q = tl.load(q_ptr + b64 * sqb + h64 * sqh + (q0 + i[:, None]) * sqm + offs_d[None, :], mask=qmask, other=0.0)
        do = tl.load(do_ptr + b64 * sdb + h64 * sdh + (q0 + i[:, None]) * sdm + offs_d[None, :], mask=qmask, other=0.0)
        lse_at = b64 * slb + h64 * slh + (q0 + i) * slm
        lse = tl.load(lse_ptr + lse_at, mask=rmask, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_ptr + lse_at, mask=rmask, other=0.0)
        k_base = k_ptr + b64 * skb + hk.to(tl.int64) * skh + k0 * skn
        v_base = v_ptr + b64 * svb + hk.to(tl.int64) * svh + k0 * svn
        mask_base = mask_ptr + b64 * smb + h64 * smh
        dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        seed = 0
        if DROPOUT:
            seed = tl.load(seed_ptr)
        lo, a, bb, hi = _visible_span(m0, len_k, off, win_left, win_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
        if MASK_KIND != 0:
            a = lo
            bb = lo
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, skn, svn, mask_base, smm, smn,
                       lo, a, m0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                       True, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_N, DOT_PREC, WIDE,
                       seed, b + drop_b0, h, drop_thr, drop_scale, DROPOUT, cap_in, cap_out, SOFTCAP)
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, skn, svn, mask_base, smm, smn,
                       a, bb, m0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                       False, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_N, DOT_PREC, WIDE,
                       seed, b + drop_b0, h, drop_thr, drop_scale, DROPOUT, cap_in, cap_out, SOFTCAP)
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, skn, svn, mask_base, smm, smn,
                       bb, hi, m0, len_q, len_k, off, win_left, win_right, scale_log2, offs_m, offs_n, offs_d,
                       True, MASK_KIND, HAS_LEFT, HAS_RIGHT, D, BLOCK_D, BLOCK_N, DOT_PREC, WIDE,
                       seed, b + drop_b0, h, drop_thr, drop_scale, DROPOUT, cap_in, cap_out, SOFTCAP)
        dq = dq * scale
        tl.store(dq_ptr + b64 * sdqb + h64 * sdqh + (q0 + i[:, None]) * sdqm + offs_d[None, :], dq.to(dq_ptr.dtype.element_ty), mask=qmask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
class _Problem:
    """Shapes and strides of one attention call, dense (B, H, L, D) or packed (T, H, D).

    Dense: strides (batch, head, row) as given. Packed: batch stride 0, row stride the token
    stride, and each program adds its sequence's start from cu_seqlens."""

    def __init__(self, q, k, cu_q, cu_k, max_q, max_k):
        self.varlen = cu_q is not None
        if self.varlen:
            self.B = cu_q.shape[0] - 1
            self.H, self.HK, self.D = q.shape[1], k.shape[1], q.shape[2]
            # grid only (programs read their own lengths), and no sequence outruns the packed total:
            # a max_seqlen far past it (FlashAttention takes any upper bound) sized a grid of idle
            # programs, cdiv(2**40, 128) rows of them for max_seqlen=2**40
            self.len_q, self.len_k = min(max_q, q.shape[0]), min(max_k, k.shape[0])
            self.total_q, self.total_k = q.shape[0], k.shape[0]
        else:
            self.B, self.H, self.len_q, self.D = q.shape
            self.HK, self.len_k = k.shape[1], k.shape[2]
            self.total_q, self.total_k = self.len_q, self.len_k
        self.group = self.H // self.HK
        self.block_d = max(16, triton.next_power_of_2(self.D))

    def strides(self, t):
        """(batch, head, row) strides of q/k/v-like ``t``."""
        if self.varlen:
            return 0, t.stride(1), t.stride(0)
        return t.stride(0), t.stride(1), t.stride(2)

    def lse_shape(self):
        return (self.H, self.total_q) if self.varlen else (self.B, self.H, self.len_q)

    def lse_strides(self, lse):
        if self.varlen:
            return 0, lse.stride(0), lse.stride(1)
        return lse.stride(0), lse.stride(1), lse.stride(2)

    def mask_strides(self, mask):
        return tuple(mask.stride()) if mask is not None else (0, 0, 0, 0)


def _out_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(t)
    if runtime.POISON:
        out.fill_(float("nan"))
    return out


def _flags(p: _Problem, q, mask, win_left, win_right, bottom_right, tensors):
    return dict(D=p.D, BLOCK_D=p.block_d, VARLEN=p.varlen, BOTTOM_RIGHT=bottom_right,
                HAS_LEFT=win_left >= 0, HAS_RIGHT=win_right >= 0,
                MASK_KIND=0 if mask is None else (1 if mask.dtype == torch.bool else 2),
                DOT_PREC=_dot_precision(q.dtype), WIDE=_wide_offsets(p, *tensors, mask))


def _wide_offsets(p: _Problem, *tensors) -> bool:
    """Whether the Triton kernels take 64-bit tile starts (WIDE): wherever an element's offset in
    one of ``tensors`` may pass 2^31 (a margin of 2x: rows past the end are offset too, masked),
    and on packed calls, where that form measured faster (H200, benchmarks/NOTES.md item 76)."""
    if p.varlen:
        return True
    for t in tensors:
        if t is not None and t.numel() and sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) >= 2**30:
            return True
    return False


def _dot_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "ieee"          # exact fp32 products: fp32 is for checking, not a performance target
    return "upcast" if interpreting() and dtype == torch.bfloat16 else "tf32"


def _launch(cache: LaunchCache, grid: tuple, args: tuple, cfg, **const) -> None:
    """``kernel[grid](*args, **const)``, the compiled kernel launched directly after the first call
    with the same specialisation (runtime/launch.py): at S = 512 a forward takes ~20 us on an
    H100, less than the JIT's own per-call argument binding."""
    cache.specialized(grid, args, const, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _launch_tiled(cache: LaunchCache, kind: str, p, q, pattern: str, rows: int, args: tuple, **const) -> None:
    """One of the tiled kernels ("fwd", "dq", "dkdv") over ``rows`` rows (queries; keys for dk dv) a
    (batch, head) pair, at attention_config's tile or, where this GPU's shared memory cannot hold
    it, the first smaller one that fits (heuristics.attention_configs, launch.launch_fitting)."""
    def one(cfg):
        grid = (triton.cdiv(rows, cfg.block_n if kind == "dkdv" else cfg.block_m), p.B * (p.HK if kind == "dkdv" else p.H))
        _launch(cache, grid, args, cfg, **const, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)

    launch_fitting(f"attention {kind}", attention_configs(kind, p.block_d, q.element_size(), pattern), one,
                   (q.dtype, const))


def _dummy(t: torch.Tensor) -> torch.Tensor:
    return t   # an unused pointer argument (never dereferenced: its constexpr switch is off)


def _mask_arg(mask, q):
    """The mask as the kernels read it: bool as bytes (same strides), or q itself when absent."""
    if mask is None:
        return q
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask


_FWD = LaunchCache(_attn_fwd_kernel)
_DELTA = LaunchCache(_attn_bwd_delta_kernel)
_DKDV = LaunchCache(_attn_bwd_dkdv_kernel)
_DQ = LaunchCache(_attn_bwd_dq_kernel)
_DELTA_CFG = AttentionConfig(0, 0, 4, 1)   # the row-dot kernel: 4 warps, nothing to pipeline


_SM90 = []


def _sm90_kernels():
    """The Hopper kernels (ops/attention_sm90.py, Gluon: forward, fused backward, dQ) when they
    can run here: a GPU build of Triton with Gluon, not the interpreter, and not switched off by
    WARPFORGE_ATTN_SM90=0 (which the probes use to time the Triton kernels). Imported once, on
    the first call."""
    if not _SM90:
        mod = None
        if not interpreting() and os.environ.get("WARPFORGE_ATTN_SM90", "1") != "0" and torch.cuda.is_available():
            try:
                from . import attention_sm90 as mod
            except ImportError:        # a Triton without Gluon's Hopper API: the Triton kernel only
                mod = None
        _SM90.append(mod)
    return _SM90[0]


GRID_Y_MAX = 65535    # CUDA's limit on a launch grid's y extent, which holds (batch x heads)


def _batch_slices(batch: int, heads: int):
    """Batch ranges whose batch x heads programs fit a grid's y extent, or None when the whole
    batch does (every common call). Attention is independent across the batch, so a larger one
    runs as one launch set a slice: dense tensors as views of their batch dim, packed ones whole
    with a slice of cu_seqlens (its offsets are absolute into the packed tensors)."""
    if batch * heads <= GRID_Y_MAX:
        return None
    per = max(1, GRID_Y_MAX // heads)
    return [(b0, min(b0 + per, batch)) for b0 in range(0, batch, per)]


def _dense_offsets(cu):
    """cu_seqlens as the kernels read it (cu[b], cu[b + 1]: densely): a strided view is copied
    (it once read other entries' values, benchmarks/NOTES.md item 70)."""
    return None if cu is None else cu.contiguous()


def _sliced(b0: int, b1: int, varlen: bool, *tensors):
    """The batch slice [b0, b1) of dense (B, ...) tensors (None stays None); packed tensors whole."""
    return tuple(t if t is None or varlen else t[b0:b1] for t in tensors)


def _launch_sets(p: _Problem, cu_q, cu_k):
    """(cu_q, cu_k, cut, b0) of each launch set of a call: the whole call, or its batch slices where
    batch x heads passes the grid's y extent (_batch_slices); ``cut(*tensors)`` is the set's part
    of the call's tensors (_sliced: packed ones whole, with the set's slice of cu_seqlens), ``b0``
    its first batch entry (dropout's counter takes the whole call's batch index)."""
    slices = _batch_slices(p.B, p.H)
    for b0, b1 in slices or [(0, p.B)]:
        cq, ck = (cu_q, cu_k) if cu_q is None or slices is None else (cu_q[b0:b1 + 1], cu_k[b0:b1 + 1])
        yield cq, ck, functools.partial(_sliced, b0, b1, p.varlen or slices is None), b0


ROW_STRIDE_LIMIT = 2**31 // (ROW_CHUNK.value + 256)   # the Triton kernels' 32-bit row offsets (_split_row)


def _rows32(t, varlen: bool = False, mask: bool = False):
    """``t`` (q/k/v-like; ``mask``: the attention mask; None stays None), or a contiguous copy where
    the Triton kernels' 32-bit offsets inside a tile would not hold it (their tiles' first rows are
    64-bit, _split_row; benchmarks/NOTES.md item 76): a row stride of ROW_STRIDE_LIMIT or more, or
    a mask whose key index times its column stride passes 2^31. Only odd views get here."""
    if t is None:
        return t
    if mask:
        fits = abs(t.stride(-2)) < ROW_STRIDE_LIMIT and abs(t.stride(-1)) * t.shape[-1] < 2**31
    else:
        fits = abs(t.stride(0) if varlen else t.stride(2)) < ROW_STRIDE_LIMIT
    return t if fits else t.contiguous()


def _kernel_inputs(mask, cu_q, cu_k, *tensors):
    """The call's tensors (q/k/v-like), mask and cu_seqlens as the Triton kernels read them: unit
    last dim and in-tile offsets that fit 32 bits (_rows32), dense offsets (_dense_offsets)."""
    varlen = cu_q is not None
    return (*(_rows32(unit_last_dim(t), varlen) for t in tensors), _rows32(mask, mask=True),
            _dense_offsets(cu_q), _dense_offsets(cu_k))


DROP_BITS = 16    # a score is kept when its 16 random bits are >= p * 2^16 (_dropout_keep)


def _dropout_args(dropout_p: float, seed, fallback, b0: int) -> tuple:
    """(seed pointer, threshold, keep scale, first batch index) as every kernel takes them, and
    whether DROPOUT is on. Off: ``fallback`` stands for the unread seed pointer."""
    if not dropout_p:
        return (fallback, 0, 1.0, b0), False
    if seed is None:
        raise ValueError("warpforge: dropout_p > 0 needs the mask's key: a one-element int64 tensor (dropout_seed)")
    return (seed, _drop_threshold(dropout_p), 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p), b0), True


def _drop_threshold(dropout_p: float) -> int:
    return min(round(dropout_p * 2**DROP_BITS), 2**DROP_BITS)    # p = 1: 2^16, no score kept


def _softcap_args(q, scale: float, softcap: float) -> tuple[tuple[float, float], int]:
    """((cap_in, cap_out), SOFTCAP) as the Triton kernels take a soft cap (_exp2_scores): 0 off; the
    hardware tanh for 16-bit inputs on a GPU, the exact exp2 form for fp32 and the interpreter."""
    if not softcap:
        return (0.0, 0.0), 0
    kind = TANH_EXP2 if interpreting() or q.dtype == torch.float32 else TANH_APPROX
    return (scale / softcap, softcap * LOG2E), kind


def _attention_fwd(q, k, v, mask, cu_q, cu_k, max_q: int, max_k: int, scale: float,
                   win_left: int, win_right: int, bottom_right: bool, dropout_p: float = 0.0, seed=None,
                   softcap: float = 0.0):
    q, k, v, mask, cu_q, cu_k = _kernel_inputs(mask, cu_q, cu_k, q, k, v)
    p = _Problem(q, k, cu_q, cu_k, max_q, max_k)
    o = _out_like(q)
    lse = runtime.new_empty(p.lse_shape(), dtype=torch.float32, device=q.device)
    if p.len_q == 0 or p.B == 0 or p.H == 0:
        return o, lse
    for cq, ck, cut, b0 in _launch_sets(p, cu_q, cu_k):
        qs, ks, vs, ms, os_, ls = cut(q, k, v, mask, o, lse)
        _attention_fwd_into(qs, ks, vs, ms, cq, ck, max_q, max_k, scale, win_left, win_right, bottom_right,
                            os_, ls, dropout_p, seed, b0, softcap)
    return o, lse


def _attention_fwd_into(q, k, v, mask, cu_q, cu_k, max_q: int, max_k: int, scale: float,
                        win_left: int, win_right: int, bottom_right: bool, o, lse,
                        dropout_p: float = 0.0, seed=None, b0: int = 0, softcap: float = 0.0):
    p = _Problem(q, k, cu_q, cu_k, max_q, max_k)
    drop, dropout = _dropout_args(dropout_p, seed, lse, b0)
    cap, capped = _softcap_args(q, scale, softcap)
    sm90 = _sm90_kernels()
    if sm90 is not None and sm90.covers(q, k, v, mask, cu_q, win_left, win_right, bottom_right) and sm90.tma_ok(o) \
            and (not dropout or q.shape[-1] in sm90.DROPOUT_FWD_HEAD_DIMS):
        sm90.attention_fwd_sm90(q, k, v, o, lse, scale, causal=win_right == 0, dropout=drop if dropout else None,
                                softcap=cap if capped else None)
        return
    pattern = attention_pattern(mask is not None, win_left, win_right)
    _launch_tiled(_FWD, "fwd", p, q, pattern, p.len_q, (
        q, k, v, o, lse, _mask_arg(mask, q),
        _dummy(lse) if cu_q is None else cu_q, _dummy(lse) if cu_k is None else cu_k,
        *p.strides(q), *p.strides(k), *p.strides(v), *p.strides(o), *p.lse_strides(lse), *p.mask_strides(mask),
        p.H, p.group, p.len_q, p.len_k, p.total_q, p.total_k,
        scale * LOG2E, win_left, win_right, *drop, *cap),
        **_flags(p, q, mask, win_left, win_right, bottom_right, (q, k, v, o)), DROPOUT=dropout, SOFTCAP=capped)


def _attention_bwd(do, q, k, v, o, lse, dlse, mask, cu_q, cu_k, max_q: int, max_k: int, scale: float,
                   win_left: int, win_right: int, bottom_right: bool, dropout_p: float = 0.0, seed=None,
                   softcap: float = 0.0):
    do, q, k, v, o, mask, cu_q, cu_k = _kernel_inputs(mask, cu_q, cu_k, do, q, k, v, o)
    p = _Problem(q, k, cu_q, cu_k, max_q, max_k)
    dq, dk, dv = _out_like(q), _out_like(k), _out_like(v)
    if p.B == 0 or p.H == 0 or p.len_q == 0 or p.len_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    for cq, ck, cut, b0 in _launch_sets(p, cu_q, cu_k):
        part = cut(do, q, k, v, o, lse, dlse, mask, dq, dk, dv)
        _attention_bwd_into(*part[:8], cq, ck, max_q, max_k, scale, win_left, win_right, bottom_right, *part[8:],
                            dropout_p, seed, b0, softcap)
    return dq, dk, dv


def _attention_bwd_into(do, q, k, v, o, lse, dlse, mask, cu_q, cu_k, max_q: int, max_k: int, scale: float,
                        win_left: int, win_right: int, bottom_right: bool, dq, dk, dv,
                        dropout_p: float = 0.0, seed=None, b0: int = 0, softcap: float = 0.0):
    p = _Problem(q, k, cu_q, cu_k, max_q, max_k)
    drop, dropout = _dropout_args(dropout_p, seed, lse, b0)
    cap, capped = _softcap_args(q, scale, softcap)
    delta = torch.empty_like(lse)
    if dlse is not None:
        dlse = dlse.contiguous() if dlse.stride() != lse.stride() else dlse
    block = 64 if not interpreting() else 32
    _launch(_DELTA, (triton.cdiv(p.len_q, block), p.B * p.H), (
        o, do, lse if dlse is None else dlse, delta, _dummy(lse) if cu_q is None else cu_q,
        *p.strides(o), *p.strides(do), *p.lse_strides(lse), p.H, p.len_q, p.total_q), _DELTA_CFG,
        D=p.D, BLOCK_D=p.block_d, BLOCK_M=block, VARLEN=p.varlen, HAS_DLSE=dlse is not None)
    sm90 = _sm90_kernels()
    hopper = sm90 is not None and sm90.covers(q, k, v, mask, cu_q, win_left, win_right, bottom_right) \
        and do.dtype == q.dtype and sm90.tma_ok(do) and sm90.tma_ok(dq)
    if hopper and sm90.FUSED_BACKWARD and not torch.are_deterministic_algorithms_enabled() \
            and sm90.tma_ok(dk) and sm90.tma_ok(dv):
        # one pass for dK, dV and dQ (dQ summed over key tiles by TMA reduce-adds: not bitwise
        # reproducible, so torch.use_deterministic_algorithms(True) takes the form below)
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        sm90.attention_bwd_fused_sm90(do, q, k, v, lse, delta, dq_acc, dk, dv, scale, causal=win_right == 0,
                                      dropout=drop if dropout else None, softcap=cap if capped else None)
        dq.copy_(dq_acc)
        return
    hopper = hopper and not dropout and not capped   # the Gluon dQ kernel below has neither dropout nor a cap
    # the Triton kernels' arguments (not built on the fused path above: the host time of every call)
    flags = _flags(p, q, mask, win_left, win_right, bottom_right, (do, q, k, v, o, dq, dk, dv))
    common = (*p.lse_strides(lse), *p.mask_strides(mask))
    cu = (_dummy(lse) if cu_q is None else cu_q, _dummy(lse) if cu_k is None else cu_k)
    mptr = _mask_arg(mask, q)
    pattern = attention_pattern(mask is not None, win_left, win_right)
    _launch_tiled(_DKDV, "dkdv", p, q, pattern, p.len_k, (
        q, k, v, do, lse, delta, dk, dv, mptr, *cu,
        *p.strides(q), *p.strides(k), *p.strides(v), *p.strides(do), *p.strides(dk), *p.strides(dv), *common,
        p.HK, p.group, p.len_q, p.len_k, p.total_q, p.total_k, scale, scale * LOG2E, win_left, win_right,
        *drop, *cap), **flags, DROPOUT=dropout, SOFTCAP=capped)
    if hopper:
        sm90.attention_bwd_dq_sm90(do, q, k, v, lse, delta, dq, scale, causal=win_right == 0)
        return
    _launch_tiled(_DQ, "dq", p, q, pattern, p.len_q, (
        q, k, v, do, lse, delta, dq, mptr, *cu,
        *p.strides(q), *p.strides(k), *p.strides(v), *p.strides(do), *p.strides(dq), *common,
        p.H, p.group, p.len_q, p.len_k, p.total_q, p.total_k, scale, scale * LOG2E, win_left, win_right,
        *drop, *cap), **flags, DROPOUT=dropout, SOFTCAP=capped)


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              cu_q: torch.Tensor | None, cu_k: torch.Tensor | None, max_q: int, max_k: int, scale: float,
              win_left: int, win_right: int, bottom_right: bool, dropout_p: float,
              seed: torch.Tensor | None, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_fwd(q, k, v, mask, cu_q, cu_k, max_q, max_k, scale, win_left, win_right, bottom_right,
                          dropout_p, seed, softcap)


def _fwd_fake(q, k, v, mask, cu_q, cu_k, max_q, max_k, scale, win_left, win_right, bottom_right, dropout_p, seed,
              softcap=0.0):
    lse_shape = (q.shape[1], q.shape[0]) if cu_q is not None else q.shape[:-1]
    # laid out as the launcher allocates o: like q as the kernels take it (_kernel_inputs), which
    # is a contiguous copy past the 32-bit row limit
    return torch.empty_like(_rows32(unit_last_dim(q), cu_q is not None)), q.new_empty(lse_shape, dtype=torch.float32)


def _bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, dlse: torch.Tensor | None, mask: torch.Tensor | None,
              cu_q: torch.Tensor | None, cu_k: torch.Tensor | None, max_q: int, max_k: int, scale: float,
              win_left: int, win_right: int, bottom_right: bool, dropout_p: float,
              seed: torch.Tensor | None, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _attention_bwd(do, q, k, v, o, lse, dlse, mask, cu_q, cu_k, max_q, max_k, scale, win_left, win_right,
                          bottom_right, dropout_p, seed, softcap)


def _bwd_fake(do, q, k, v, o, lse, dlse, mask, cu_q, cu_k, max_q, max_k, scale, win_left, win_right, bottom_right,
              dropout_p, seed, softcap=0.0):
    return tuple(torch.empty_like(_rows32(unit_last_dim(t), cu_q is not None)) for t in (q, k, v))


attention_bwd_op = Op("attention_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    q, k, v, mask, cu_q, cu_k, max_q, max_k, scale, win_left, win_right, bottom_right, dropout_p, seed = inputs[:14]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, mask, cu_q, cu_k, seed)
    ctx.args = (max_q, max_k, scale, win_left, win_right, bottom_right, dropout_p)
    # torch's autograd fills the defaulted softcap into ``inputs``; the eager door (runtime/registry.py)
    # passes the call's arguments as given, which may stop before it
    ctx.softcap = inputs[14] if len(inputs) > 14 else 0.0


def _backward(ctx, do, dlse):
    q, k, v, o, lse, mask, cu_q, cu_k, seed = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = attention_bwd_op(do, q, k, v, o, lse, dlse, mask, cu_q, cu_k, *ctx.args, seed, ctx.softcap)
    return dq, dk, dv, *(None,) * 12


attention_op = Op("attention", _fwd_impl, _fwd_fake, backward=_backward, setup_context=_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _check_qkv(q, k, v, dims: str, names: tuple[str, str, str] = ("query", "key", "value")) -> None:
    nq, nk, nv = names
    for name, t in zip(names, (q, k, v)):
        check_tensor(name, t, dtypes=ATTN_DTYPES, min_dim=1)
    check_same(nk, k, nq, q, shape=False)
    check_same(nv, v, nq, q, shape=False)
    if not (k.shape[-1] == v.shape[-1] == q.shape[-1]):
        raise ValueError(f"warpforge: head dims differ: {nq} {q.shape[-1]}, {nk} {k.shape[-1]}, {nv} {v.shape[-1]}; "
                         f"expected one head dim for all three")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"warpforge: head dim {q.shape[-1]} is not supported; expected at most {MAX_HEAD_DIM}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"warpforge: '{nk}' has shape {tuple(k.shape)} but '{nv}' has {tuple(v.shape)}; "
                         f"expected the same {dims} shape")


def _check_heads(hq: int, hk: int, enable_gqa: bool) -> None:
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"warpforge: {hq} query heads cannot be grouped over {hk} key/value heads; "
                         f"expected the query head count to be a multiple of the key/value head count")
    if hq != hk and not enable_gqa:
        raise ValueError(f"warpforge: query has {hq} heads but key/value have {hk}; pass enable_gqa=True for "
                         f"grouped-query attention (as torch's scaled_dot_product_attention requires)")


def _window(window_size, causal: bool) -> tuple[int, int]:
    if window_size is None:
        left, right = -1, -1
    else:
        try:
            left, right = (operator.index(w) for w in window_size)
        except (TypeError, ValueError):
            raise TypeError(f"warpforge: 'window_size' is {window_size!r}; expected a pair (left, right) of ints, "
                            f"-1 for unbounded") from None
    if left < -1 or right < -1:
        raise ValueError(f"warpforge: 'window_size' {tuple(window_size)}: expected (left, right) with -1 for unbounded")
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def check_softcap(softcap) -> float:
    """A soft cap as the attention functions take it: a finite float >= 0 (0: off)."""
    softcap = to_float("softcap", softcap)
    if not (softcap >= 0 and softcap < float("inf")):
        raise ValueError(f"warpforge: 'softcap' is {softcap}; expected a finite number >= 0 (0: off)")
    return softcap


def _check_dropout(dropout_p) -> float:
    """dropout_p as a float in [0, 1] (to_float's real numbers; NaN and the rest refused by name)."""
    p = to_float("dropout_p", dropout_p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"warpforge: 'dropout_p' is {p}; expected a probability in [0, 1]")
    return p


def dropout_seed(device, generator: torch.Generator | None = None) -> torch.Tensor:
    """A dropout mask's 64-bit Philox key: one int64 on ``device``, drawn from ``generator``
    (default: the device's default generator). On the device, so no host sync, and a CUDA graph
    replay draws a new one, as torch's own dropout does."""
    where = device if generator is None else generator.device
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=where, generator=generator).to(device)


@triton.jit
def _dropout_mask_kernel(seed_ptr, out_ptr, H, L, S, thr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(2)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n0 = tl.program_id(1) * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    keep = _dropout_keep(tl.load(seed_ptr), bh // H, bh % H, rows, n0, thr, BLOCK_N)
    at = bh.to(tl.int64) * L * S + rows[:, None].to(tl.int64) * S + cols[None, :]
    tl.store(out_ptr + at, keep.to(tl.int8), mask=(rows[:, None] < L) & (cols[None, :] < S))


def dropout_keep_mask(seed: torch.Tensor, batch: int, heads: int, L: int, S: int, dropout_p: float) -> torch.Tensor:
    """The (batch, heads, L, S) bool mask of kept scores that the attention kernels draw for Philox
    key ``seed`` (dropout_seed's one-element int64 tensor) at ``dropout_p``: query head h, query
    position i, key position j of batch entry b (of a packed call: sequence b, positions within it).
    For tests and for reproducing a call: seed with torch.manual_seed, draw ``dropout_seed`` as the
    call would. A CPU key on a machine whose kernels run on a GPU (no interpreter) is drawn there
    and the mask returned on the CPU: the mask depends on the key's value only."""
    dropout_p = _check_dropout(dropout_p)
    if seed.device.type == "cpu" and not interpreting() and torch.cuda.is_available():
        return dropout_keep_mask(seed.cuda(), batch, heads, L, S, dropout_p).cpu()
    check_device("seed", seed)
    out = torch.empty((batch, heads, L, S), dtype=torch.int8, device=seed.device)
    if out.numel():
        grid = (triton.cdiv(L, 32), triton.cdiv(S, 32), batch * heads)
        _dropout_mask_kernel[grid](seed, out, heads, L, S, _drop_threshold(dropout_p), BLOCK_M=32, BLOCK_N=32)
    return out.bool()


def _prepare_mask(attn_mask, B, H, L, S, q):
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"warpforge: 'attn_mask' must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"warpforge: 'attn_mask' has dtype {attn_mask.dtype}; expected bool (True = may attend) "
                        f"or a floating dtype (added to the scores)")
    if attn_mask.requires_grad:
        raise ValueError("warpforge: 'attn_mask' requires grad; a gradient for the mask is not supported "
                         "(detach it, or use torch's scaled_dot_product_attention)")
    if attn_mask.device != q.device:
        raise RuntimeError(f"warpforge: 'attn_mask' is on {attn_mask.device} but 'query' is on {q.device}")
    try:
        return attn_mask.expand(B, H, L, S)
    except RuntimeError:
        raise ValueError(f"warpforge: 'attn_mask' of shape {tuple(attn_mask.shape)} cannot broadcast to the "
                         f"attention scores' shape {(B, H, L, S)} (batch, query heads, L, S)") from None


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                                 *, return_lse: bool = False, window_size: tuple[int, int] | None = None,
                                 generator: torch.Generator | None = None, softcap: float = 0.0):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention kernels).

    query (..., Hq, L, D), key and value (..., Hkv, S, D); fp16, bf16 or fp32; D up to 256; any
    strides with unit stride along D (others are copied). Returns (..., Hq, L, D) in the layout of
    query. ``attn_mask``: bool (True = may attend) or additive float, broadcastable to
    (..., Hq, L, S), without gradient. ``is_causal`` is top-left aligned as in torch.

    Extensions: ``return_lse=True`` also returns the (..., Hq, L) float32 log-sum-exp of the scaled
    scores (differentiable); ``window_size=(left, right)`` restricts query i to keys
    [i - left, i + right] (-1: unbounded), a sliding window; ``softcap`` > 0 caps the scaled scores
    to softcap * tanh(score / softcap) before the mask is added or applied (Gemma 2; flash-attn's
    ``softcap``: on a GPU the 16-bit calls take the hardware's approximate tanh, as it does; the
    Hopper kernels below take capped calls too, but for the deterministic backward's dQ). The backward is bit for bit the
    same from run to run, except on Hopper (sm_90) for the calls its fused kernel takes (dense,
    no mask or window, D 64/128, bf16/fp16), whose dQ is summed across key tiles by reduce-adds
    in an order that varies; ``torch.use_deterministic_algorithms(True)`` sends those calls to
    the deterministic kernels (no atomics; ~19% slower at B=4 H=32 S=4096 D=128).

    ``dropout_p``: attention dropout as torch's (applied whenever it is > 0; modules pass 0 in
    eval): each probability is dropped with probability ``dropout_p`` and the kept ones scaled by
    1 / (1 - dropout_p), with a mask drawn in the kernels from a Philox key that is itself drawn
    from ``generator`` (default: the device's default generator, so ``torch.manual_seed``
    reproduces a call). The backward redraws the same mask; ``lse`` stays that of the undropped
    scores. On Hopper the Gluon forward (D 128) and fused backward draw the mask themselves, the
    other kernels the same mask; ``dropout_keep_mask`` rebuilds a call's mask.

    Not supported, with a clear error: head dims that differ between query, key and value, a mask
    that requires grad.

    Inside ``torch.autocast``, query, key, value and a float mask are cast to the region's dtype
    first, as torch's SDPA casts them (runtime/amp.py).
    """
    query, key, value, attn_mask = autocast_inputs(query, key, value, attn_mask)
    _check_qkv(query, key, value, "(..., heads, S)")
    dropout_p = _check_dropout(dropout_p)
    softcap = check_softcap(softcap)
    if is_causal and attn_mask is not None:
        raise ValueError("warpforge: pass either 'attn_mask' or is_causal=True, not both (as torch requires)")
    if query.dim() < 3 or query.dim() != key.dim():
        raise ValueError(f"warpforge: 'query' is {query.dim()}-d and 'key' {key.dim()}-d; expected both "
                         f"(..., heads, L, D) with at least 3 dims and the same rank")
    if query.shape[:-3] != key.shape[:-3]:
        raise ValueError(f"warpforge: batch dims differ: query {tuple(query.shape[:-3])}, key {tuple(key.shape[:-3])}")
    q, k, v = query, key, value
    lead = q.shape[:-3]
    if q.dim() == 3:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    elif q.dim() > 4:
        q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    B, H, L, D = q.shape
    HK, S = k.shape[1], k.shape[2]
    _check_heads(H, HK, enable_gqa)
    left, right = _window(window_size, is_causal)
    scale = 1.0 / math.sqrt(D) if scale is None else check_finite("scale", scale)
    if attn_mask is not None and query.dim() > 4 and isinstance(attn_mask, torch.Tensor):
        try:
            attn_mask = attn_mask.expand(*lead, H, L, S).reshape(B, H, L, S)
        except RuntimeError:
            raise ValueError(f"warpforge: 'attn_mask' of shape {tuple(attn_mask.shape)} cannot broadcast to the "
                             f"attention scores' shape {(*lead, H, L, S)} (batch, query heads, L, S)") from None
    mask = _prepare_mask(attn_mask, B, H, L, S, q)
    if S == 0:
        # no keys: zeros, kept in the autograd graph (a bare zeros_like had no grad_fn, so backward
        # raised "does not require grad"): the empty sums are exactly 0, and give query a zero
        # gradient and key/value their empty ones, as torch
        o = torch.zeros_like(query) + (query[..., :0].sum() + key.sum() + value.sum())
        lse = torch.full((*query.shape[:-1],), float("inf"), device=q.device, dtype=torch.float32)
    else:
        seed = dropout_seed(q.device, generator) if dropout_p else None
        o, lse = attention_op(q, k, v, mask, None, None, L, S, scale, left, right, False, dropout_p, seed, softcap)
        o, lse = o.reshape(query.shape), lse.reshape(query.shape[:-1])
    return (o, lse) if return_lse else o


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: bool = False, scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                     return_lse: bool = False, validate: bool = True, dropout_p: float = 0.0,
                     generator: torch.Generator | None = None, softcap: float = 0.0):
    """Attention over a packed batch of sequences of different lengths (FlashAttention's varlen API).

    q (total_q, Hq, D), k and v (total_k, Hkv, D): the sequences one after another; sequence b is
    rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q (int32, (B + 1,), starting at 0). ``max_seqlen_*``:
    the longest sequence (sizes the grid; no device-to-host copy needed). ``causal`` is bottom-right
    aligned (the last query sees every key), and ``window_size=(left, right)`` a sliding window
    around that diagonal (-1: unbounded). Hq a multiple of Hkv (GQA/MQA). Returns (total_q, Hq, D)
    and, with ``return_lse``, the (Hq, total_q) float32 log-sum-exp. Empty and length-1 sequences
    are fine. ``validate`` checks cu_seqlens against the packed lengths and max_seqlen (one
    device-to-host copy; skipped under torch.compile and CUDA graph capture); without it a bad
    cu_seqlens still never reads outside q, k, v (programs
    clamp to them), but its rows are undefined. The backward is deterministic. ``dropout_p`` and
    ``generator``: attention dropout, as scaled_dot_product_attention's (a sequence's mask is that
    of batch entry b of a dense call, over its own positions). ``softcap``: as
    scaled_dot_product_attention's (Gemma 2's prefill beside decode_attention's). Inside ``torch.autocast``, q, k and v
    are cast to the region's dtype first (runtime/amp.py).
    """
    q, k, v = autocast_inputs(q, k, v)
    _check_qkv(q, k, v, "(total, heads)", ("q", "k", "v"))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"warpforge: '{name}' has shape {tuple(t.shape)}; expected (total_tokens, heads, head_dim)")
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]), ("cu_seqlens_k", cu_seqlens_k, k.shape[0])):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 1:
            got = f"{cu.dtype} of shape {tuple(cu.shape)}" if isinstance(cu, torch.Tensor) else type(cu).__name__
            raise TypeError(f"warpforge: '{name}' must be a 1-d int32 tensor of B + 1 offsets; got {got}")
        if cu.device != q.device:
            raise RuntimeError(f"warpforge: '{name}' is on {cu.device} but 'q' is on {q.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"warpforge: 'cu_seqlens_q' has {cu_seqlens_q.shape[0]} offsets but 'cu_seqlens_k' "
                         f"{cu_seqlens_k.shape[0]}; expected one per sequence plus one for both")
    _check_heads(q.shape[1], k.shape[1], True)
    lens = []
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        try:
            m = as_index(m)
        except TypeError:
            raise TypeError(f"warpforge: '{name}' must be an int, got {type(m).__name__}") from None
        if m < 0:      # a negative max_seqlen_q sized an empty grid: the output was never written
            raise ValueError(f"warpforge: '{name}' is {m}; expected the longest sequence's length (>= 0)")
        lens.append(m)
    max_seqlen_q, max_seqlen_k = lens
    if validate:
        _validate_cu(cu_seqlens_q, q.shape[0], max_seqlen_q, "q")
        _validate_cu(cu_seqlens_k, k.shape[0], max_seqlen_k, "k")
    left, right = _window(window_size, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else check_finite("scale", scale)
    dropout_p = _check_dropout(dropout_p)
    softcap = check_softcap(softcap)
    seed = dropout_seed(q.device, generator) if dropout_p else None
    o, lse = attention_op(q, k, v, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          scale, left, right, True, dropout_p, seed, softcap)
    return (o, lse) if return_lse else o


def _validate_cu(cu: torch.Tensor, total: int, max_len: int, side: str) -> None:
    """cu_seqlens against the packed length and max_seqlen, with one device-to-host copy; skipped
    while torch.compile traces or a CUDA graph captures (no host copy is possible there; the
    kernels still never read outside q, k, v), as decode_attention's and moe_experts' checks are."""
    if host_sync_unavailable(cu):
        return
    lens = cu[1:] - cu[:-1]
    first, last, low, high = torch.stack([cu[0], cu[-1], lens.min() if lens.numel() else cu[0] * 0,
                                          lens.max() if lens.numel() else cu[0] * 0]).tolist()
    if first != 0 or last != total or low < 0:
        raise ValueError(f"warpforge: 'cu_seqlens_{side}' must rise from 0 to the packed length {total} "
                         f"(got first {first}, last {last}, smallest step {low})")
    if high > max_len:
        raise ValueError(f"warpforge: a sequence in 'cu_seqlens_{side}' has {high} tokens, more than "
                         f"max_seqlen_{side}={max_len}")
