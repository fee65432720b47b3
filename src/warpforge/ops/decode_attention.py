"""Decode attention over a paged KV cache (flash-decoding), and the append of new keys/values into it.

One query token per sequence attends to that sequence's cached tokens:

    out[b, h] = softmax(scale * q[b, h] . K_b[:, kvh]^T) @ V_b[:, kvh]      kvh = h // (Hq / Hkv)

where K_b, V_b are the first seq_lens[b] positions of sequence b, stored in pages: the cache is
(num_blocks, block_size, Hkv, D) (the vLLM / flash-attn layout: a block holds block_size
consecutive positions of every kv head) and position p of sequence b lives in physical block
block_table[b, p // block_size], row p % block_size. ``append_paged_kv`` writes new tokens there.

Byte model (s = bytes per element): decode must read every cached key and value once,
2 * sum_b(seq_len_b) * Hkv * D * s, plus q and out (B * Hq * D * s each: 16 KB a sequence at
Hq = 32, D = 128, bf16 -- nothing next to a 4k-token context's 16.8 MB of KV). FLOPs are 4 * Hq * D
per cached token against 2 * Hkv * D * s bytes: 4 FLOP/byte at Hq = 32, Hkv = 8 in bf16, two orders
of magnitude under an H100's ridge (~990 TFLOP/s / ~3.35 TB/s ~ 300). Memory bound: the roof is the
measured copy bandwidth (~3 TB/s on an H100: 5.6 us for batch 1 at 4k tokens, D = 128, Hkv = 8;
5.7 ms for batch 64 at 32k).

Why the kernels look the way they do:
- GQA grouping. A program owns a *kv head* and loads the G = Hq / Hkv query heads that share it as
  one (G padded to >= 16) x D tile, so each K/V tile feeds a (16 x D) @ (D x BLOCK_N) tl.dot and is
  read from memory once. One program per query head would read the KV G times (4x the bytes at
  Hq = 32, Hkv = 8, unless L2 happens to catch the re-reads). The padding rows cost no bandwidth.
- Split-K over the context (flash-decoding). B * Hkv programs are 8 at batch 1: 8 of 132 SMs, a
  few per cent of the chip's bandwidth. Each sequence's context is cut into ``num_splits``
  contiguous chunks (multiples of the tile or of the page, whichever is longer), one program each; the
  programs keep an online (max, sum, acc) in fp32 and write it to an fp32 workspace, and a second
  small kernel merges the splits of each (sequence, head) with the log-sum-exp rescale
      M = max_c m_c,  L = sum_c l_c * 2^(m_c - M),  out = sum_c acc_c * 2^(m_c - M) / L.
  That workspace is B * Hq * S * (D + 2) * 4 bytes written and read once (1 MB at batch 1, S = 32:
  6% of a 4k context's KV bytes, mostly from L2). With one split the first kernel writes the
  output itself and the combine is skipped (batch >= 50 at Hkv = 8 on 132 SMs).
- No host sync to size the grid: the split count comes from the block table's *capacity*
  (max_blocks_per_seq * block_size), B * Hkv and the SM count (``heuristics.decode_config``:
  ~3 programs an SM); inside the kernel each sequence's *actual* length is divided into that many
  chunks, so all splits of a sequence do equal work whatever its length. A split that starts past
  the end (e.g. seq_len 0) writes m = -inf, l = 0, acc = 0: the combine gives it weight 0.
- A loop step streams BLOCK_N tokens (64 at D = 128 in bf16: 16 KB of K and 16 KB of V) that span
  several pages: the step gathers the page id of each token from the block table (a few cached
  bytes) and forms int64 addresses page * stride + row * stride + head * D + d; D is unit-stride,
  so loads are 16-byte vectors, and num_stages 2-3 keeps the next tiles in flight.
- exp2 with log2(e) folded into the scale; statistics and accumulator in fp32; the probabilities
  are cast to the cache dtype for the second dot (as flash attention does); fp32 caches use exact
  (IEEE) dots, not TF32.
- Safety: the kernel never reads outside the caches, whatever the metadata says. Each length is
  clamped to [0, capacity] (so the block table is never read past its row), and tokens whose
  block id is outside [0, num_blocks) are masked out of the softmax. ``validate=True`` (default)
  also checks the metadata on the host with ONE device-to-host sync for all checks together and
  raises a ValueError naming the argument; ``validate=False`` skips that sync (CUDA graphs, serving
  loops); the check is also skipped under torch.compile and during CUDA graph capture.

Options: ``window_size=(left, right)`` attends to the last left + 1 positions only (Mistral's and
gpt-oss's sliding windows); the kernels start at the window, so the pages before it are neither
read nor checked, and the split count is planned on the window. ``softcap`` caps the scaled scores
to softcap * tanh(score / softcap) (Gemma 2), computed as one exp2. Rows of a page past a
sequence's length (or before its window) are never let into the output, whatever they hold.

``return_lse=True`` also returns each head's log-sum-exp of the scores (to merge this result with
attention over other keys: a shared prefix, another rank's shard). Whatever merges the call's
partial states writes it: the combine kernel where the call splits, the Hopper kernel's in-kernel
merge at one split (level with the plain call on an H200 at every batch, NOTES item 165; it cost
+1-4% from batch 16 while those calls took the partials and the combine, item 163). The Triton
kernel's one-split calls (other GPUs, calls the Hopper kernel declines) still take the partials
and the combine.

Semantics decisions: seq_len 0 gives an all-zero output row (a softmax over nothing, read as the
empty sum; a NaN would poison a batched serving step). Forward only: decode needs no gradient, so
no autograd formula is registered (backward through it raises). ``append_paged_kv`` writes in place
and does not advance ``cache_seqlens``: the caller owns that counter.

Append byte model: read the new keys and values, write them, 4 * B * T * Hkv * D * s: a program
per (sequence, token) moves all of its Hkv * D keys and values in 16-byte vectors.

fp8 caches (``float8_e4m3fn`` / ``float8_e5m2`` with a per-tensor ``k_scale`` and ``v_scale``,
vLLM's ``kv_cache_dtype="fp8"``): half the cache memory, so twice the tokens in the same pool.
Both kernels widen the fp8 tiles exactly and fold the scales in where they cost nothing: k_scale
into the score scale (q . (s k) = s (q . k)) and v_scale into the accumulator at the end
(P (s V) = s (P V)). ``append_paged_kv`` quantises 16/32-bit new tokens on the way in, with
fp8.py's rounding.
- The Hopper kernel (ops/decode_attention_sm90.py) takes the calls it covers. It widens to fp16
  in registers, with q brought to fp16 at a power of two a head. H200 (NOTES item 166), cuDNN on
  the dequantised bf16 problem over ours: 1.40-1.71x from batch 16 (67-91% of copy on the fp8
  bytes), 1.21-1.59x at batch 8, 0.94-1.25x at batch 1 (4K to 32K).
- The Triton kernel loads fp8 tiles of twice the tokens (the tiles are sized in bytes) and widens
  them to q's dtype. It streams tokens at about its 16-bit rate, 35-49% of copy on the fp8 bytes
  (item 164), so it buys memory, not speed.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import interpreting, new_empty, unit_last_dim
from ..runtime.checks import (FLOAT_DTYPES, check_device, check_same, check_tensor, dtype_names, host_sync_unavailable,
                              is_finite)
from ..runtime import heuristics
from ..runtime.heuristics import DECODE_COMBINE_D, DECODE_COMBINE_STEP, decode_config
from ..runtime.launch import LaunchCache, Ptr, aligned, gdc_launch_dependents, gdc_wait, launch, pdl_supported
from ..runtime.registry import Op
from .attention import _window, check_softcap
from .fp8 import _fp8_quantize, fp8_quantize_consts

LOG2E = 1.4426950408889634
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
MIN_BLOCK_SIZE = 8
INDEX_DTYPES = (torch.int32, torch.int64)
KV_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)      # 8-bit caches, with a per-tensor scale each


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def decode_attention_reference(q, k_cache, v_cache, block_table, seq_lens, scale=None, window_size=(-1, -1),
                               softcap=0.0, return_lse: bool = False, k_scale=None, v_scale=None):
    """Ground truth: gather each sequence's pages and do softmax attention, in float64 on the CPU
    (float32 on a GPU, float64 for float64 inputs); cast back to q's dtype. seq_len 0 gives zeros.
    ``window_size[0]`` >= 0 keeps the last window_size[0] + 1 positions; ``softcap`` > 0 caps the
    scaled scores to softcap * tanh(score / softcap). Pages before the window are not gathered.
    ``return_lse``: also the (B, Hq) log-sum-exp of the (capped) scaled scores, in that wide dtype
    (-inf where nothing is attended). ``k_scale`` / ``v_scale`` (floats or one-element tensors;
    None: 1): the caches hold keys / values divided by them (fp8 caches), so they are multiplied
    back in the wide dtype."""
    wide = torch.float64 if q.device.type == "cpu" or q.dtype == torch.float64 else torch.float32
    bsz, hq, d = q.shape
    bs = k_cache.shape[1]
    group = hq // k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    left = window_size[0]
    out = torch.zeros((bsz, hq, d), dtype=wide, device=q.device)
    lse = torch.full((bsz, hq), -math.inf, dtype=wide, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        if n <= 0:
            continue
        lo = max(n - 1 - left, 0) if left >= 0 else 0
        first = lo // bs                                   # the pages from the one holding lo
        ids = block_table[b, first:triton.cdiv(n, bs)].long()

        def keys(cache, mult):
            rows = cache[ids].reshape(-1, *cache.shape[2:])[lo - first * bs:n - first * bs].to(wide)
            if mult is not None:
                rows = rows * (mult.to(wide).reshape(()) if isinstance(mult, torch.Tensor) else mult)
            return rows.repeat_interleave(group, dim=1)                                       # (keys, Hq, D)

        s = torch.einsum("hd,nhd->hn", q[b].to(wide), keys(k_cache, k_scale)) * scale         # (Hq, keys)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), keys(v_cache, v_scale))
        lse[b] = torch.logsumexp(s, dim=-1)
    return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b in fp32. PRECISION "ieee" for fp32 operands (exact, not TF32). UPCAST (the CPU
    interpreter only, whose dot multiplies bfloat16 as raw 16-bit integers) widens to fp32 first."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _softcap(s, cap_in, cap_out):
    """Soft-capped scores in the exp2 domain: softcap * tanh(scale * s / softcap) * log2(e), with
    tanh(x) = 1 - 2 / (e^(2x) + 1) (exact at both ends: e^(2x) = inf gives 1, 0 gives -1) and
    cap_in = 2 log2(e) scale / softcap, cap_out = softcap log2(e)."""
    return cap_out * (1.0 - 2.0 / (tl.math.exp2(s * cap_in) + 1.0))


@triton.jit
def _decode_attention_split_kernel(
    q_ptr,                     # (B, Hq, D) queries, D unit-stride
    k_ptr, v_ptr,              # (num_blocks, block_size, Hkv, D) paged caches, D unit-stride
    bt_ptr,                    # (B, max_blocks) int32/int64 block table
    lens_ptr,                  # (B,) int32/int64 tokens to attend to
    out_ptr,                   # (B, Hq, D) output (written when SPLIT is False)
    m_ptr, l_ptr, acc_ptr,     # (B, Hq, S), (B, Hq, S), (B, Hq, S, D) fp32 partials (SPLIT)
    qk_scale,                  # scale * log2(e): scores live in the exp2 domain
    cap_in, cap_out,           # SOFTCAP: 2 log2(e) scale / softcap and softcap * log2(e) (see _softcap)
    ks_ptr, vs_ptr,            # KV_FP8: one fp32 each, the caches' dequantisation scales
    Hkv, G, num_blocks, max_blocks, num_splits,
    win,                       # WINDOW: keys at positions >= n - 1 - win only (the sliding window's left)
    s_qb, s_qh,                # q strides (batch, head)
    s_kn, s_kt, s_kh,          # k_cache strides (block, row, head)
    s_vn, s_vt, s_vh,          # v_cache strides
    s_bb, s_bj,                # block table strides (batch, column)
    s_ob, s_oh,                # out strides
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, GRANULE: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr = False,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, KV_FP8: tl.constexpr = False,
):
    if PDL:                                    # the combine kernel may launch now (it waits for our writes)
        gdc_launch_dependents()
    if KV_FP8:                                 # q . (k_scale k) = k_scale (q . k): the scale joins the score's
        ks = tl.load(ks_ptr)
        qk_scale = qk_scale * ks
        cap_in = cap_in * ks
    pid = tl.program_id(0)                     # b * Hkv + kv head
    split = tl.program_id(1)
    b = pid // Hkv
    kvh = pid % Hkv
    # Clamp the length to what the block table can describe: never read past its row.
    n = tl.load(lens_ptr + b)
    n = tl.minimum(tl.maximum(n, 0), max_blocks * PAGE).to(tl.int32)
    # The keys attended: [lo, n). With a window the splits share [lo rounded down to a granule, n),
    # and neither the pages nor the block-table entries before lo are read.
    lo = tl.maximum(n - 1 - win, 0) if WINDOW else 0
    base = (lo // GRANULE) * GRANULE
    chunk = tl.cdiv(tl.cdiv(n - base, num_splits), GRANULE) * GRANULE
    start = base + split * chunk
    end = tl.minimum(start + chunk, n)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * G + g                                                    # (BLOCK_G,) query heads
    gmask = g < G
    dmask = d < HEAD_DIM
    b64 = b.to(tl.int64)
    q = tl.load(q_ptr + b64 * s_qb + heads.to(tl.int64)[:, None] * s_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)           # (BLOCK_G, BLOCK_D)

    m_i = tl.full((BLOCK_G,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    bt_row = bt_ptr + b64 * s_bb
    k_head = k_ptr + kvh.to(tl.int64) * s_kh
    v_head = v_ptr + kvh.to(tl.int64) * s_vh
    offs = tl.arange(0, BLOCK_N)
    for t0 in range(start, end, BLOCK_N):
        pos = t0 + offs                                                    # (BLOCK_N,) positions
        live = pos < end
        if WINDOW:
            live = live & (pos >= lo)
        page = tl.load(bt_row + (pos // PAGE) * s_bj, mask=live, other=-1).to(tl.int64)
        live = live & (page >= 0) & (page < num_blocks)                    # bad ids: masked, not read
        row = (pos % PAGE).to(tl.int64)
        lm = live[:, None] & dmask[None, :]
        k = tl.load(k_head + (page * s_kn + row * s_kt)[:, None] + d[None, :], mask=lm, other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)                                              # exact: fp8 widens losslessly
        s = _dot(q, tl.trans(k), PRECISION, UPCAST)                         # (BLOCK_G, BLOCK_N) fp32
        s = _softcap(s, cap_in, cap_out) if SOFTCAP else s * qk_scale
        s = tl.where(live[None, :], s, -float("inf"))                     # (BLOCK_G, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == -float("inf"), 0.0, m_new)              # no -inf - -inf = NaN
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head + (page * s_vn + row * s_vt)[:, None] + d[None, :], mask=lm, other=0.0)
        if KV_FP8:
            v = v.to(q.dtype)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new

    if KV_FP8:                                 # P (v_scale V) = v_scale (P V)
        acc = acc * tl.load(vs_ptr)
    hmask = gmask[:, None] & dmask[None, :]
    if SPLIT:
        row_ml = (b64 * (Hkv * G) + heads) * num_splits + split            # (BLOCK_G,) int64
        tl.store(m_ptr + row_ml, m_i, mask=gmask)
        tl.store(l_ptr + row_ml, l_i, mask=gmask)
        tl.store(acc_ptr + row_ml[:, None] * HEAD_DIM + d[None, :], acc, mask=hmask)
    else:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]                     # seq_len 0: acc = 0 -> zeros
        tl.store(out_ptr + b64 * s_ob + heads.to(tl.int64)[:, None] * s_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=hmask)


@triton.jit
def _decode_attention_combine_kernel(
    m_ptr, l_ptr, acc_ptr,     # (B, Hq, S), (B, Hq, S), (B, Hq, S, D) fp32 partials
    out_ptr,                   # (B, Hq, D) output
    lse_ptr,                   # (B, Hq) fp32 log-sum-exp of the scores (LSE only)
    Hq, num_splits, s_ob, s_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, STEP: tl.constexpr, ONE_PASS: tl.constexpr,
    PDL: tl.constexpr = False, LSE: tl.constexpr = False,
):
    """Merge the S partials of one (sequence, head) over a BLOCK_D slice of D. ONE_PASS (S <= STEP):
    every partial's max, sum and accumulator slice loaded at once, so the merge costs one round
    trip to L2, not one per STEP partials (H200, batch 1 x 4K, 64 partials: 6.0 us a merge before).
    PDL: launched as a programmatic dependent of the split kernel, it waits here for that grid's
    writes (griddepcontrol.wait) instead of at the kernel boundary. LSE: the D slice's first program
    also writes the natural log-sum-exp, ln 2 * (M + log2 L) (-inf where nothing was attended)."""
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)                     # b * Hq + head
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    base = pid.to(tl.int64) * num_splits
    c = tl.arange(0, STEP)
    dmask = d < HEAD_DIM
    if ONE_PASS:
        cm = c < num_splits
        m = tl.load(m_ptr + base + c, mask=cm, other=-float("inf"))
        l = tl.load(l_ptr + base + c, mask=cm, other=0.0)
        a = tl.load(acc_ptr + (base + c)[:, None] * HEAD_DIM + d[None, :], mask=cm[:, None] & dmask[None, :], other=0.0)
        mx = tl.max(m, axis=0)
        mx = tl.where(mx == -float("inf"), 0.0, mx)
        w = tl.math.exp2(m - mx)                                           # empty split: 0
        total = tl.sum(l * w, axis=0)
        acc = tl.sum(a * w[:, None], axis=0)
    else:
        # pass 1: the largest split maximum (a few floats a split)
        m_run = tl.full((STEP,), -float("inf"), tl.float32)
        for c0 in range(0, num_splits, STEP):
            m_run = tl.maximum(m_run, tl.load(m_ptr + base + c0 + c, mask=c0 + c < num_splits, other=-float("inf")))
        mx = tl.max(m_run, axis=0)
        mx = tl.where(mx == -float("inf"), 0.0, mx)
        # pass 2: rescale and sum
        l_sum = tl.zeros((STEP,), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        for c0 in range(0, num_splits, STEP):
            cm = c0 + c < num_splits
            m = tl.load(m_ptr + base + c0 + c, mask=cm, other=-float("inf"))
            w = tl.math.exp2(m - mx)
            l_sum += tl.load(l_ptr + base + c0 + c, mask=cm, other=0.0) * w
            a = tl.load(acc_ptr + (base + c0 + c)[:, None] * HEAD_DIM + d[None, :],
                        mask=cm[:, None] & dmask[None, :], other=0.0)
            acc += tl.sum(a * w[:, None], axis=0)
        total = tl.sum(l_sum, axis=0)
    o = acc / tl.where(total > 0, total, 1.0)                              # nothing attended: zeros
    b = pid // Hq
    h = pid % Hq
    tl.store(out_ptr + b.to(tl.int64) * s_ob + h.to(tl.int64) * s_oh + d, o.to(out_ptr.dtype.element_ty), mask=dmask)
    if LSE:
        if tl.program_id(1) == 0:
            lse = tl.where(total > 0, (mx + tl.math.log2(tl.where(total > 0, total, 1.0))) * 0.6931471805599453,
                           -float("inf"))                                  # ln 2 * log2: natural log
            tl.store(lse_ptr + pid, lse)


@triton.jit
def _append_paged_kv_kernel(
    key_ptr, value_ptr,        # (B, T, Hkv, D) new keys and values, D unit-stride
    k_ptr, v_ptr,              # (num_blocks, block_size, Hkv, D) paged caches, written in place
    bt_ptr,                    # (B, max_blocks) int32/int64 block table
    lens_ptr,                  # (B,) int32/int64 tokens already cached: token t goes to lens[b] + t
    ks_ptr, vs_ptr,                            # QUANT: one fp32 each, the caches' scales (stored = new / scale)
    T, Hkv, num_blocks, max_blocks,
    s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,        # key, value strides (batch, token, head)
    s_cn, s_ct, s_ch, s_dn, s_dt, s_dh,        # k_cache, v_cache strides (block, row, head)
    s_bb, s_bj,                                # block table strides
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, PAGE: tl.constexpr,
    QUANT: tl.constexpr = False, FP8_MAX: tl.constexpr = 448.0, FIX: tl.constexpr = False,
    MANT: tl.constexpr = 3, EMIN: tl.constexpr = -6,
):
    """QUANT (fp8 caches, 16/32-bit new tokens): each element stored as rne(clamp(x / scale,
    +-FP8_MAX)), fp8.py's rounding (an IEEE divide, then one convert)."""
    pid = tl.program_id(0)                     # b * T + t
    b = pid // T
    t = pid % T
    b64 = b.to(tl.int64)
    pos = tl.load(lens_ptr + b).to(tl.int64) + t
    ok = (pos >= 0) & (pos < max_blocks * PAGE)                            # never past the table's row
    pos = tl.where(ok, pos, 0)
    page = tl.load(bt_ptr + b64 * s_bb + (pos // PAGE) * s_bj, mask=ok, other=-1).to(tl.int64)
    ok = ok & (page >= 0) & (page < num_blocks)                            # never outside the cache
    row = pos % PAGE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    src_k = key_ptr + b64 * s_kb + t.to(tl.int64) * s_kt
    src_v = value_ptr + b64 * s_vb + t.to(tl.int64) * s_vt
    dst_k = k_ptr + page * s_cn + row * s_ct
    dst_v = v_ptr + page * s_dn + row * s_dt
    for h0 in range(0, Hkv, BLOCK_H):
        hh = (h0 + h).to(tl.int64)
        mask = ok & (hh < Hkv)[:, None] & dmask[None, :]
        x = tl.load(src_k + hh[:, None] * s_kh + d[None, :], mask=mask)
        y = tl.load(src_v + hh[:, None] * s_vh + d[None, :], mask=mask)
        if QUANT:
            x = _fp8_quantize(x.to(tl.float32), tl.load(ks_ptr), k_ptr.dtype.element_ty, FP8_MAX, FIX, MANT, EMIN)
            y = _fp8_quantize(y.to(tl.float32), tl.load(vs_ptr), v_ptr.dtype.element_ty, FP8_MAX, FIX, MANT, EMIN)
        tl.store(dst_k + hh[:, None] * s_ch + d[None, :], x, mask=mask)
        tl.store(dst_v + hh[:, None] * s_dh + d[None, :], y, mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
_SPLIT_LAUNCH = LaunchCache(_decode_attention_split_kernel)
_COMBINE_LAUNCH = LaunchCache(_decode_attention_combine_kernel)


_SM90 = []


def _sm90_kernel():
    """ops/decode_attention_sm90.py (Gluon) where it can run: a GPU build of Triton with Gluon, not
    the interpreter, and not switched off by WARPFORGE_DECODE_SM90=0 (the probes time the Triton
    kernel that way). Imported once, on the first call."""
    if not _SM90:
        mod = None
        if not interpreting() and os.environ.get("WARPFORGE_DECODE_SM90", "1") != "0" and torch.cuda.is_available():
            try:
                from . import decode_attention_sm90 as mod
            except ImportError:        # a Triton without Gluon's Hopper API
                mod = None
        _SM90.append(mod)
    return _SM90[0]


def _combine_plan(out, parts: int, pdl: bool, lse: bool = False):
    """(plan key, grid, constexprs) of the combine launch for ``out`` (a fresh contiguous tensor);
    ``lse``: it writes the log-sum-exp too."""
    bsz, hq, d = out.shape
    one = parts <= DECODE_COMBINE_STEP
    block_d = min(triton.next_power_of_2(d), DECODE_COMBINE_D) if one else triton.next_power_of_2(d)
    step = triton.next_power_of_2(parts) if one else 16
    key = (out.device.index, out.shape, out.stride(), out.dtype, parts, pdl, lse)
    return key, (bsz * hq, triton.cdiv(d, block_d)), dict(HEAD_DIM=d, BLOCK_D=block_d, STEP=step, ONE_PASS=one, PDL=pdl,
                                                          LSE=lse)


def _combine(m, l, acc, out, parts: int, pdl: bool = False, lse=None) -> None:
    """out = the merge of ``parts`` (max, sum, acc) partials of each (sequence, head): a program a
    (sequence, head, DECODE_COMBINE_D slice of D), in one pass up to DECODE_COMBINE_STEP partials.
    ``pdl``: launched as a programmatic dependent of the split kernel before it. The Triton split
    kernel lets it launch from its first instruction (H200, batch 1: 4-6% off the call; NOTES item
    65); the Gluon kernel once each of its programs is done (released at a program's start it
    measured slower; at the end, 1.4-1.6 us off a batch-1 or batch-8 call, NOTES item 136). ``m``,
    ``l``, ``acc`` and ``out`` are fresh (aligned, contiguous) allocations; so is ``lse`` (B, Hq)
    fp32, written where given."""
    key, grid, const = _combine_plan(out, parts, pdl, lse is not None)
    _COMBINE_LAUNCH(key, grid, (m, l, acc, out, out if lse is None else lse, out.shape[1], parts, out.stride(0),
                                out.stride(1)), const,
                    num_warps=4, num_stages=1, **({"launch_pdl": True} if pdl else {}))


def _combine_replay(out, parts: int, pdl: bool, lse: bool = False):
    """After a :func:`_combine` like this one (``lse``: with a log-sum-exp output):
    ``fire(m, l, acc, out, lse)`` launching its compiled kernel directly (None under the JIT)."""
    key, grid, _ = _combine_plan(out, parts, pdl, lse)
    recorded = _COMBINE_LAUNCH.get(key)
    if recorded is None:
        return None
    compiled, tail = recorded
    ints = (out.shape[1], parts, out.stride(0), out.stride(1))
    return lambda m, l, acc, out, lse: launch(compiled, grid, (m, l, acc, out, out if lse is None else lse, *ints,
                                                               *tail))


_PDL_ON = os.environ.get("WARPFORGE_DECODE_PDL", "1") != "0"


def _pdl(t: torch.Tensor) -> bool:
    """Whether the split kernels (Triton and Gluon) and their combine use programmatic dependent
    launch (sm_90+ GPU, not the interpreter; WARPFORGE_DECODE_PDL=0 turns it off)."""
    return _PDL_ON and pdl_supported(t)


# Decode plans: everything a call's launches depend on except the data pointers and the scale,
# keyed by the shapes, strides, dtypes, alignments and routing switches. The first call of a key
# goes through the launchers (and the JIT); later ones replay the recorded kernels through
# ``fire``, which allocates the output (and partials) and launches: at batch 1 on an H200 host a
# call issues in 49-70 us instead of 147-161 (benchmarks/NOTES.md item 69).
_PLANS: dict = {}
_MAX_PLANS = 4096


def _softcap_args(scale: float, softcap: float) -> tuple[float, float]:
    """The kernels' (cap_in, cap_out) of ``softcap`` (0: off, and the pair unused)."""
    return (2 * LOG2E * scale / softcap, softcap * LOG2E) if softcap > 0 else (0.0, 0.0)


def window_span(capacity: int, window: int, granule: int) -> int:
    """The positions one sequence's splits share: the capacity, or with a window (``window`` >= 0)
    its window_size[0] + 1 keys and a granule of misalignment, whichever is fewer. The split
    count is planned on this."""
    return capacity if window < 0 else min(capacity, window + 1 + granule)


def _decode_launch(q, k_cache, v_cache, block_table, seq_lens, scale: float, num_splits: int, window: int = -1,
                   softcap: float = 0.0, want_lse: bool = False, k_scale=None, v_scale=None):
    """out, or (out, lse) with ``want_lse``: then the Hopper kernel's one-split calls write the
    log-sum-exp from their in-kernel merge, and every other call takes the partials and the
    combine kernel (the Triton kernel's at one split too), which writes it.
    ``k_scale``, ``v_scale``: one-element fp32 tensors where the caches are fp8 (else None)."""
    bsz, hq, d = q.shape
    if bsz == 0:
        out = new_empty((bsz, hq, d), dtype=q.dtype, device=q.device)
        return (out, new_empty((bsz, hq), dtype=torch.float32, device=q.device)) if want_lse else out
    q = unit_last_dim(q)
    seq_lens = seq_lens.contiguous()           # the kernels index it densely (a strided view read wrong lengths)
    k_scale, v_scale = _aligned_scale(k_scale), _aligned_scale(v_scale)
    sm90 = _sm90_kernel()
    key = None if interpreting() else (
        q.device.index, q.dtype, q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.stride(),
        block_table.shape, block_table.stride(), block_table.dtype, seq_lens.dtype, num_splits,
        aligned(q, k_cache, v_cache, block_table, seq_lens), sm90 is None, heuristics.DECODE_SM90_MIN_TOKENS,
        window, softcap > 0, want_lse, k_cache.dtype)
    fire = _PLANS.get(key) if key is not None else None
    if fire is not None:
        return fire(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, k_scale, v_scale)
    out, fire = _decode_first(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, sm90, key, window,
                              softcap, want_lse, k_scale, v_scale)
    if fire is not None:
        if len(_PLANS) >= _MAX_PLANS:          # many distinct shapes (a serving loop's varying batch): start over
            _PLANS.clear()
        _PLANS[key] = fire
    return out


def _decode_first(q, k_cache, v_cache, block_table, seq_lens, scale: float, num_splits: int, sm90, key,
                  window: int = -1, softcap: float = 0.0, want_lse: bool = False, k_scale=None, v_scale=None):
    """A call through the launchers (recording the compiled kernels under ``key``): (result, a
    ``fire(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, k_scale, v_scale)``
    replaying the same launches, or None under the interpreter); the result is out, or (out, lse)
    with ``want_lse``."""
    bsz, hq, d = q.shape
    nblocks, page, hkv, _ = k_cache.shape
    out = new_empty((bsz, hq, d), dtype=q.dtype, device=q.device)
    lse = new_empty((bsz, hq), dtype=torch.float32, device=q.device) if want_lse else None
    result = (out, lse) if want_lse else out
    if sm90 is not None and bsz * hkv * block_table.shape[1] * page >= heuristics.DECODE_SM90_MIN_TOKENS \
            and sm90.covers(q, k_cache, v_cache):
        pdl = _pdl(q)
        parts = sm90.decode_sm90(q, k_cache, v_cache, block_table, seq_lens, out, scale * LOG2E, num_splits or None,
                                 key=key if not num_splits else None, pdl=pdl, window=window,
                                 softcap=_softcap_args(scale, softcap) if softcap > 0 else None, lse=lse,
                                 k_scale=k_scale, v_scale=v_scale)
        if parts is not None:
            _combine(*parts, out, parts[0].shape[2], pdl=pdl, lse=lse)
        if key is None or num_splits:          # a forced split count is a probe's or a test's: no plan
            return result, None
        sfire = sm90.replay(key, q, k_cache, v_cache, block_table, pdl, window=window, softcap=softcap > 0)
        cfire = _combine_replay(out, parts[0].shape[2], pdl, want_lse) if parts is not None else None
        if sfire is None or (parts is not None and cfire is None):
            return result, None
        shape, dtype, device = out.shape, out.dtype, out.device

        def fire(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, k_scale, v_scale):
            out = new_empty(shape, dtype=dtype, device=device)
            lse = new_empty(shape[:2], dtype=torch.float32, device=device) if want_lse else None
            parts = sfire(q, k_cache, v_cache, block_table, seq_lens, out, scale * LOG2E, _softcap_args(scale, softcap),
                          lse, k_scale, v_scale)
            if parts is not None:
                cfire(*parts[:3], out, lse)
            return (out, lse) if want_lse else out

        return result, fire
    group = hq // hkv
    max_blocks = block_table.shape[1]
    forced = num_splits if num_splits > 0 else None
    elem = k_cache.element_size()              # the tiles are sized in cache bytes (fp8: twice the tokens)
    cfg = decode_config(bsz, hkv, group, max_blocks * page, d, page, elem, forced)
    if window >= 0:     # the splits share the window's span (the granule depends on neither)
        cfg = decode_config(bsz, hkv, group, window_span(max_blocks * page, window, cfg.granule), d, page,
                            elem, forced)
    splits = cfg.num_splits
    parts = None if splits == 1 and not want_lse else (new_empty((bsz, hq, splits), dtype=torch.float32, device=q.device),
                                      new_empty((bsz, hq, splits), dtype=torch.float32, device=q.device),
                                      new_empty((bsz, hq, splits, d), dtype=torch.float32, device=q.device))
    m, l, acc = parts if parts is not None else (out, out, out)      # unused pointers at one split
    # A decode step's kernels run for microseconds; the JIT's per-launch binding would cost more
    # than that, so the compiled kernels are launched directly (runtime/launch.py), keyed by
    # everything the JIT specialises on.
    const = dict(HEAD_DIM=d, BLOCK_D=cfg.block_d, BLOCK_G=cfg.block_g, BLOCK_N=cfg.block_n,
                 PAGE=page, GRANULE=cfg.granule, SPLIT=parts is not None,
                 PRECISION="ieee" if q.dtype == torch.float32 else "tf32",      # "tf32" is ignored for 16-bit
                 UPCAST=interpreting() and q.dtype == torch.bfloat16, PDL=parts is not None and _pdl(q),
                 WINDOW=window >= 0, SOFTCAP=softcap > 0, KV_FP8=k_scale is not None)
    split_key = (q.device.index, q.shape, q.stride(), q.dtype, k_cache.shape, k_cache.stride(), v_cache.stride(),
                 block_table.shape, block_table.stride(), block_table.dtype, seq_lens.dtype, cfg, out.stride(),
                 aligned(q, k_cache, v_cache, block_table, seq_lens, out, m, l, acc), const["PDL"], window,
                 softcap > 0, want_lse, k_cache.dtype)
    grid = (bsz * hkv, splits)
    ints = (hkv, group, nblocks, max_blocks, splits, window,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_table.stride(0), block_table.stride(1),
            out.stride(0), out.stride(1))
    _SPLIT_LAUNCH(split_key, grid, (q, k_cache, v_cache, block_table, seq_lens, out, m, l, acc, scale * LOG2E,
                                    *_softcap_args(scale, softcap), *scale_ptrs(out, k_scale, v_scale), *ints),
                  const, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if parts is not None:
        _combine(m, l, acc, out, splits, pdl=const["PDL"], lse=lse)
    recorded = _SPLIT_LAUNCH.get(split_key)
    cfire = _combine_replay(out, splits, const["PDL"], want_lse) if parts is not None else None
    if key is None or recorded is None or (parts is not None and cfire is None):
        return result, None
    compiled, tail = recorded
    shape, dtype, device = out.shape, out.dtype, out.device
    rows = bsz * hq * splits                   # (m, l, acc) in one allocation: rows, rows, rows x D,
    rows16 = -(-rows // 4) * 4                 # each part 16-byte aligned (as the kernels were compiled)

    split_out = parts is not None

    def fire(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, k_scale, v_scale):
        out = new_empty(shape, dtype=dtype, device=device)
        if split_out:
            buf = new_empty((2 * rows16 + rows * d,), dtype=torch.float32, device=device)
            base = buf.data_ptr()
            m, l, acc = Ptr(base), Ptr(base + 4 * rows16), Ptr(base + 8 * rows16)
        else:
            m = l = acc = out
        launch(compiled, grid, (q, k_cache, v_cache, block_table, seq_lens, out, m, l, acc, scale * LOG2E,
                                *_softcap_args(scale, softcap), *scale_ptrs(out, k_scale, v_scale), *ints, *tail))
        if split_out:
            lse = new_empty(shape[:2], dtype=torch.float32, device=device) if want_lse else None
            cfire(m, l, acc, out, lse)
            return (out, lse) if want_lse else out
        return out

    return result, fire


def _append_launch(key, value, k_cache, v_cache, block_table, cache_seqlens, k_scale=None, v_scale=None) -> None:
    """``k_scale``, ``v_scale``: one-element fp32 tensors where 16/32-bit tokens go into fp8
    caches (quantised on the way), else None."""
    bsz, t, hkv, d = key.shape
    if bsz * t == 0:
        return
    key, value = unit_last_dim(key), unit_last_dim(value)
    cache_seqlens = cache_seqlens.contiguous()     # indexed densely: a strided view wrote at wrong positions
    k_scale, v_scale = _aligned_scale(k_scale), _aligned_scale(v_scale)
    block_d = triton.next_power_of_2(d)
    block_h = min(triton.next_power_of_2(hkv), max(1, 4096 // block_d))
    quant = k_scale is not None
    fp8 = dict(fp8_quantize_consts(k_cache.dtype), QUANT=True) if quant else {}
    _append_paged_kv_kernel[(bsz * t,)](
        key, value, k_cache, v_cache, block_table, cache_seqlens,
        k_scale if quant else key, v_scale if quant else key,
        t, hkv, k_cache.shape[0], block_table.shape[1],
        key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0), block_table.stride(1),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=block_h, PAGE=k_cache.shape[1],
        num_warps=4 if block_h * block_d >= 1024 else 2, **fp8,
    )


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _decode_impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, num_splits: int, window: int = -1,
                 softcap: float = 0.0, k_scale: Optional[torch.Tensor] = None,
                 v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _decode_launch(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, window, softcap, False,
                          k_scale, v_scale)


def _decode_fake(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, window=-1, softcap=0.0,
                 k_scale=None, v_scale=None):
    return q.new_empty(q.shape)


def _decode_lse_impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float, num_splits: int, window: int = -1,
                     softcap: float = 0.0, k_scale: Optional[torch.Tensor] = None,
                     v_scale: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _decode_launch(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, window, softcap, True,
                          k_scale, v_scale)


def _decode_lse_fake(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, window=-1, softcap=0.0,
                     k_scale=None, v_scale=None):
    return q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32)


def _append_impl(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, cache_seqlens: torch.Tensor, k_scale: Optional[torch.Tensor] = None,
                 v_scale: Optional[torch.Tensor] = None) -> None:
    _append_launch(key, value, k_cache, v_cache, block_table, cache_seqlens, k_scale, v_scale)


def _append_fake(key, value, k_cache, v_cache, block_table, cache_seqlens, k_scale=None, v_scale=None) -> None:
    return None


decode_attention_op = Op("decode_attention", _decode_impl, _decode_fake)     # forward only
decode_attention_lse_op = Op("decode_attention_lse", _decode_lse_impl, _decode_lse_fake)   # out and the log-sum-exp
append_paged_kv_op = Op("append_paged_kv", _append_impl, _append_fake, mutates_args=("k_cache", "v_cache"))


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------
def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_rank(name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"warpforge: '{name}' must be {rank}-d {layout}, got shape {tuple(t.shape)}")


def _check_index(name: str, t, ref_name: str, ref: torch.Tensor, rank: int, layout: str, batch: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"warpforge: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"warpforge: '{name}' has dtype {_dt(t.dtype)}; expected an integer tensor (int32 or int64)")
    _check_rank(name, t, rank, layout)
    check_device(name, t)
    check_same(name, t, ref_name, ref, shape=False, dtype=False)
    if t.shape[0] != batch:
        raise ValueError(f"warpforge: '{name}' has batch size {t.shape[0]}; expected {batch} "
                         f"(one row per sequence)")


def _check_caches(k_cache, v_cache, ref_name: str, ref: torch.Tensor) -> tuple[int, int, int, int]:
    """The caches' shape, strides and dtype: ``ref``'s (q's, key's) dtype, or an fp8 format."""
    check_tensor("k_cache", k_cache, dtypes=FLOAT_DTYPES + KV_FP8_DTYPES, min_dim=1)
    check_tensor("v_cache", v_cache, dtypes=FLOAT_DTYPES + KV_FP8_DTYPES, min_dim=1)
    _check_rank("k_cache", k_cache, 4, "(num_blocks, block_size, Hkv, D)")
    _check_rank("v_cache", v_cache, 4, "(num_blocks, block_size, Hkv, D)")
    check_same("k_cache", k_cache, ref_name, ref, shape=False, dtype=False)
    if k_cache.dtype != ref.dtype and k_cache.dtype not in KV_FP8_DTYPES:
        raise TypeError(f"warpforge: 'k_cache' has dtype {k_cache.dtype} but '{ref_name}' has {ref.dtype}; "
                        f"expected the same dtype, or an fp8 cache ({dtype_names(KV_FP8_DTYPES)})")
    check_same("v_cache", v_cache, "k_cache", k_cache)
    nblocks, page, hkv, d = k_cache.shape
    if page < MIN_BLOCK_SIZE or page & (page - 1):
        raise ValueError(f"warpforge: 'k_cache' has block_size {page} (dim 1); expected a power of two >= {MIN_BLOCK_SIZE}")
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"warpforge: 'k_cache' has head dim D={d}; expected {MIN_HEAD_DIM} <= D <= {MAX_HEAD_DIM}")
    if hkv == 0:
        raise ValueError("warpforge: 'k_cache' has 0 kv heads (dim 2); expected at least 1")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.stride(-1) != 1:
            raise ValueError(f"warpforge: '{name}' has stride {c.stride(-1)} on its head dim; expected 1 "
                             f"(the cache is written and read in place, so it cannot be copied)")
    return nblocks, page, hkv, d


# Per-tensor scales given as Python floats, as one-element device tensors: made once per (value,
# device), so a decode loop passing floats launches no fill kernel per call.
_SCALES: dict = {}


def _kv_scale(name: str, v, cache: torch.Tensor):
    """``v`` (the public ``k_scale`` / ``v_scale``) as the operators take it: a one-element fp32
    tensor on the cache's device where the cache is fp8 (None means 1.0), None otherwise (where a
    scale given is an error: it would be silently unused). A tensor is used as it is (no host
    read, so a CUDA graph replays whatever it holds then); a float must be finite and > 0."""
    if cache.dtype not in KV_FP8_DTYPES:
        if v is not None:
            raise ValueError(f"warpforge: '{name}' is given but the caches are {_dt(cache.dtype)}; a scale applies "
                             f"only to fp8 caches ({dtype_names(KV_FP8_DTYPES)})")
        return None
    if isinstance(v, torch.Tensor):
        if not v.is_floating_point() or v.numel() != 1:
            raise ValueError(f"warpforge: '{name}' is a {_dt(v.dtype)} tensor of shape {tuple(v.shape)}; expected "
                             f"one floating-point element (a per-tensor scale)")
        check_device(name, v)
        check_same(name, v, "k_cache", cache, shape=False, dtype=False)
        return v.reshape(1).to(torch.float32)
    v = 1.0 if v is None else v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"warpforge: '{name}' must be a float, a one-element tensor or None, got {type(v).__name__}")
    if not (is_finite(v) and v > 0):
        raise ValueError(f"warpforge: '{name}' is {v}; expected a finite scale > 0")
    if torch.compiler.is_compiling() or type(cache) is not torch.Tensor or (
            cache.is_cuda and torch.cuda.is_current_stream_capturing()):
        return torch.full((1,), float(v), dtype=torch.float32, device=cache.device)
    key = (float(v), cache.device)
    t = _SCALES.get(key)
    if t is None:
        if len(_SCALES) >= 1024:
            _SCALES.clear()
        t = _SCALES[key] = torch.full((1,), float(v), dtype=torch.float32, device=cache.device)
    return t


def scale_ptrs(out, k_scale, v_scale):
    """The decode kernels' (ks_ptr, vs_ptr) arguments: the fp8 caches' scales, or ``out`` twice
    (never read) without them."""
    return (out, out) if k_scale is None else (k_scale, v_scale)


def _aligned_scale(t):
    """A scale tensor 16-byte aligned, as the kernels are compiled (a view may not be)."""
    return t if t is None or t.data_ptr() % 16 == 0 else t.clone()


def _skip_sync(t: torch.Tensor) -> bool:
    """Where a host check is impossible: fake tensors, and checks.host_sync_unavailable."""
    return type(t) is not torch.Tensor or host_sync_unavailable(t)


def _first(mask: torch.Tensor) -> torch.Tensor:
    """(any, flat index of the first True) of a boolean tensor, as int64 device scalars."""
    flat = mask.reshape(-1)
    if flat.numel() == 0:
        z = torch.zeros((), dtype=torch.int64, device=mask.device)
        return torch.stack([z, z])
    return torch.stack([flat.any().long(), flat.long().argmax()])


def _validate_metadata(block_table: torch.Tensor, lens: torch.Tensor, extra: int, page: int, nblocks: int,
                       lens_name: str, what: str, window: int = -1) -> None:
    """Host check of the paged-cache metadata, ONE device-to-host sync for everything: positions
    [0, lens[b] + extra) of every sequence must fit the block table, and the block ids of the
    positions in use must lie in [0, nblocks). ``extra``: tokens about to be appended (0 for
    decode; then the positions in use are the appended ones). ``window`` (decode, >= 0): only
    positions from lens[b] - 1 - window are in use (a server may have freed the pages before)."""
    if lens.numel() == 0 or _skip_sync(lens):
        return
    max_blocks = block_table.shape[1]
    capacity = max_blocks * page
    n = lens.long()
    end = n + extra
    used = torch.clamp(end, 0, capacity)
    if extra:
        first_block = torch.clamp(n, 0, capacity) // page
    elif window >= 0:
        first_block = torch.clamp(n - 1 - window, 0, capacity) // page
    else:
        first_block = torch.zeros_like(n)
    cols = torch.arange(max_blocks, device=lens.device)
    in_use = (cols[None, :] < (used[:, None] + page - 1) // page) & (cols[None, :] >= first_block[:, None])
    bad_ids = in_use & ((block_table < 0) | (block_table >= nblocks))
    neg, over, ids = _first(n < 0), _first(end > capacity), _first(bad_ids)
    i_neg, i_over, i_ids = neg[1], over[1], ids[1]
    report = torch.stack([neg[0], i_neg, n[i_neg], over[0], i_over, n[i_over],
                          ids[0], i_ids, block_table.reshape(-1)[i_ids].long() if bad_ids.numel() else i_ids])
    (has_neg, b_neg, v_neg, has_over, b_over, v_over, has_ids, j_ids, v_ids) = report.tolist()   # the one sync
    if has_neg:
        raise ValueError(f"warpforge: '{lens_name}'[{b_neg}] is {v_neg}; expected lengths >= 0")
    if has_over:
        tail = f" + {extra} new token(s) = {v_over + extra}" if extra else ""
        raise ValueError(f"warpforge: '{lens_name}'[{b_over}] is {v_over}{tail}, past the block table's capacity "
                         f"{capacity} (max_blocks_per_seq {max_blocks} x block_size {page}) for sequence {b_over}")
    if has_ids:
        b, j = divmod(j_ids, max_blocks)
        raise ValueError(f"warpforge: 'block_table'[{b}, {j}] is {v_ids}, a block {what} by sequence {b}; "
                         f"expected a block id in [0, {nblocks}) (num_blocks of the caches)")


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
# Argument signatures (types, dtypes, devices, shapes, the caches' head-dim strides) that passed
# decode_attention's checks: a decode loop's later calls skip them (~15 us of host time).
_CHECKED: set = set()


def _signature(q, k_cache, v_cache, block_table, seq_lens):
    """What decode_attention's argument checks depend on, for plain CUDA tensors outside tracing;
    None otherwise (the checks then run every call)."""
    if torch.compiler.is_compiling() or not all(type(t) is torch.Tensor for t in (q, k_cache, v_cache, block_table,
                                                                                  seq_lens)):
        return None
    if not q.is_cuda:
        return None
    return (q.dtype, q.device, q.shape, k_cache.dtype, k_cache.device, k_cache.shape, k_cache.stride(-1),
            v_cache.dtype, v_cache.device, v_cache.shape, v_cache.stride(-1), block_table.dtype, block_table.device,
            block_table.shape, seq_lens.dtype, seq_lens.device, seq_lens.shape)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, *, scale: float | None = None,
                     window_size: tuple[int, int] | None = None, softcap: float = 0.0,
                     num_splits: int | None = None, validate: bool = True, return_lse: bool = False,
                     k_scale=None, v_scale=None):
    """Attention of one query token per sequence over a paged KV cache (flash-decoding).

    Args:
        q: (B, Hq, D), fp32/fp16/bf16, any strides (a copy is made only if D is not unit-stride).
        k_cache, v_cache: (num_blocks, block_size, Hkv, D), q's dtype or an fp8 format
            (float8_e4m3fn, float8_e5m2: see ``k_scale``), D unit-stride: block n holds
            block_size consecutive positions of every kv head. Hq must be a multiple of Hkv (MHA,
            GQA, MQA); query head h reads kv head h // (Hq // Hkv). 16 <= D <= 256 (any D: the
            kernel pads to a power of two with masks); block_size a power of two >= 8.
        block_table: (B, max_blocks_per_seq) int32/int64: entry j of row b is the physical block
            of that sequence's positions j*block_size ... (j+1)*block_size - 1.
        seq_lens: (B,) int32/int64: how many cached tokens each sequence attends to. 0 is allowed
            and gives an all-zero output row (a softmax over nothing, taken as the empty sum).
        scale: the score scale, default 1/sqrt(D).
        window_size: (left, right), a sliding window as in :func:`attention_varlen` and
            flash-attn. The query is position seq_lens[b] - 1, so it attends to the positions from
            seq_lens[b] - 1 - left on (left = -1: all of them). Only those positions' pages and
            block-table entries are read (nor checked by ``validate``), so a server may free or
            reuse the pages that fell out of the window. ``right`` has no effect (no key lies
            past the query) and is accepted for the common signature. None: no window.
        softcap: > 0 caps the scaled scores as Gemma 2 and flash-attn do:
            score = softcap * tanh(scale * q.k / softcap). 0 (default): off.
        num_splits: programs sharing each sequence's context (flash-decoding's split count);
            default from ``heuristics.decode_config``. Results agree for every value (up to
            rounding); values past the capacity's tile count are clamped.
        validate: check the metadata on the host (one device-to-host sync for all checks):
            ValueError for negative seq_lens, seq_lens past the block table's capacity, and block
            ids outside [0, num_blocks) for positions in use. ``validate=False`` skips the sync
            (CUDA graphs, serving loops); the check is also skipped under torch.compile and CUDA
            graph capture. Unchecked bad metadata never makes the kernel read out of bounds:
            lengths are clamped to the capacity and tokens in invalid blocks are left out, so
            such a sequence's output is undefined (but the others are exact).
        return_lse: also return the (B, Hq) float32 log-sum-exp of each head's scaled (and capped)
            scores, natural log, -inf for a sequence that attends to nothing: what merging this
            result with attention over other keys needs (a shared prefix's, another rank's
            shard's): out = sum_i exp(lse_i - lse) out_i, lse = logsumexp_i lse_i. The Hopper
            kernel writes it from its merge (in the kernel at one split, in the combine with
            splits); the Triton kernel's one-split calls then take the partials and the combine
            (a second small launch).
        k_scale, v_scale: fp8 caches only (vLLM's ``kv_cache_dtype="fp8"``): the caches hold
            key / k_scale and value / v_scale (as :func:`append_paged_kv` writes them), so the
            attention is over k_scale * k_cache and v_scale * v_cache. A float, or a one-element
            tensor on the device (read by the kernel, never by the host: a CUDA graph replays
            with whatever it holds); None is 1.0. The kernels widen fp8 exactly (to fp16 on the
            Hopper kernel, with q at a power of two a head; to q's dtype on the Triton one) and
            fold the scales into the score scale and the output, so the only error beyond a
            16-bit cache's is the fp8 rounding of what was stored; it reads half the bytes, and
            on an H100/H200 from batch 8 it is faster than a 16-bit cache (module docstring).

    Returns:
        (B, Hq, D) in q's dtype, or (that, lse) with ``return_lse``. Forward only: decode needs no
        gradient and none is registered.
    """
    sig = _signature(q, k_cache, v_cache, block_table, seq_lens)
    if sig is None or sig not in _CHECKED:
        check_tensor("q", q, min_dim=1)
        _check_rank("q", q, 3, "(B, Hq, D)")
        nblocks, page, hkv, d = _check_caches(k_cache, v_cache, "q", q)
        bsz, hq, dq = q.shape
        if dq != d:
            raise ValueError(f"warpforge: 'q' has head dim D={dq} but 'k_cache' has D={d}; expected the same head dim")
        if hq == 0 or hq % hkv:
            raise ValueError(f"warpforge: 'q' has {hq} heads and 'k_cache' has {hkv} kv heads; "
                             f"expected Hq to be a multiple of Hkv")
        _check_index("block_table", block_table, "q", q, 2, "(B, max_blocks_per_seq)", bsz)
        _check_index("seq_lens", seq_lens, "q", q, 1, "(B,)", bsz)
        if sig is not None:
            if len(_CHECKED) >= 4096:
                _CHECKED.clear()
            _CHECKED.add(sig)
    nblocks, page, hkv, d = k_cache.shape
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"warpforge: 'scale' must be a float or None, got {type(scale).__name__}")
    elif not is_finite(scale):
        raise ValueError(f"warpforge: 'scale' is {scale}; expected a finite number (or None for 1/sqrt(D))")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"warpforge: 'num_splits' is {num_splits!r}; expected None or an int >= 1")
    window = _window(window_size, False)[0]
    softcap = check_softcap(softcap)
    ks, vs = _kv_scale("k_scale", k_scale, k_cache), _kv_scale("v_scale", v_scale, k_cache)
    if validate:
        _validate_metadata(block_table, seq_lens, 0, page, nblocks, "seq_lens", "in use", window)
    op = decode_attention_lse_op if return_lse else decode_attention_op
    return op(q, k_cache, v_cache, block_table, seq_lens, float(scale), num_splits or 0, window, softcap, ks, vs)



def append_paged_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_table: torch.Tensor, cache_seqlens: torch.Tensor, *, k_scale=None, v_scale=None,
                    validate: bool = True) -> None:
    """Write T new tokens of each sequence into the paged caches, in place.

    Token t of sequence b goes to position p = cache_seqlens[b] + t: block block_table[b, p //
    block_size], row p % block_size, all kv heads. ``cache_seqlens`` is NOT advanced (the caller
    owns it: add T after the call).

    Args:
        key, value: (B, T, Hkv, D), T >= 1 (decode: T = 1), the caches' dtype; or fp32/fp16/bf16
            into fp8 caches, quantised on the way (see ``k_scale``).
        k_cache, v_cache: (num_blocks, block_size, Hkv, D), as in :func:`decode_attention`.
        k_scale, v_scale: where 16/32-bit tokens go into fp8 caches, each element is stored as
            round-to-nearest-even(clamp(x / scale, +-fp8 max)) (448 for e4m3, 57,344 for e5m2;
            NaN stays NaN): a float or a one-element device tensor, None meaning 1.0 -- the same
            scales :func:`decode_attention` then takes. Not allowed otherwise (nothing to apply
            them to).
        block_table: (B, max_blocks_per_seq) int32/int64; cache_seqlens: (B,) int32/int64.
        validate: one device-to-host sync checks that cache_seqlens >= 0, cache_seqlens + T fits the
            block table's capacity, and the blocks written are in [0, num_blocks) (ValueError).
            ``validate=False`` skips it (also skipped under torch.compile and CUDA graph capture);
            unchecked, the kernel still never writes out of bounds: tokens past the capacity or
            in invalid blocks are dropped.
    """
    check_tensor("key", key, dtypes=FLOAT_DTYPES + KV_FP8_DTYPES, min_dim=1)
    _check_rank("key", key, 4, "(B, T, Hkv, D)")
    check_tensor("value", value, dtypes=FLOAT_DTYPES + KV_FP8_DTYPES, min_dim=1)
    check_same("value", value, "key", key)
    nblocks, page, hkv, d = _check_caches(k_cache, v_cache, "key", key)
    if (type(k_cache) is torch.Tensor and not k_cache.is_meta and not torch.compiler.is_compiling()
            and k_cache.data_ptr() == v_cache.data_ptr()):
        # one tensor passed as both (two views of one buffer, e.g. kv[:, 0] and kv[:, 1], are fine):
        # the values would overwrite the keys just written
        raise ValueError("warpforge: 'k_cache' and 'v_cache' are the same memory; expected two caches")
    bsz, t, hk, dk = key.shape
    if (hk, dk) != (hkv, d):
        raise ValueError(f"warpforge: 'key' has {hk} heads of D={dk} but 'k_cache' has {hkv} of D={d}; "
                         f"expected the same kv heads and head dim")
    if t == 0:
        raise ValueError("warpforge: 'key' has T=0 tokens (dim 1); expected T >= 1")
    _check_index("block_table", block_table, "key", key, 2, "(B, max_blocks_per_seq)", bsz)
    _check_index("cache_seqlens", cache_seqlens, "key", key, 1, "(B,)", bsz)
    quant = k_cache.dtype != key.dtype             # 16/32-bit tokens into an fp8 cache (_check_caches allowed it)
    if not quant and (k_scale is not None or v_scale is not None):
        raise ValueError(f"warpforge: 'k_scale'/'v_scale' are given but 'key' already has the caches' dtype "
                         f"{_dt(key.dtype)}; a scale applies only when 16/32-bit tokens are quantised into fp8 caches")
    ks = _kv_scale("k_scale", k_scale, k_cache) if quant else None
    vs = _kv_scale("v_scale", v_scale, k_cache) if quant else None
    if validate:
        _validate_metadata(block_table, cache_seqlens, t, page, nblocks, "cache_seqlens", "written")
    append_paged_kv_op(key, value, k_cache, v_cache, block_table, cache_seqlens, ks, vs)
