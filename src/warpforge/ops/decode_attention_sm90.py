"""Decode attention over a paged KV cache for Hopper (sm_90) in Gluon: a persistent, TMA-fed
stream. ops/decode_attention.py takes this kernel for the calls it covers (bf16/fp16 q over caches
of its dtype or fp8 e4m3/e5m2, head dim 64 or 128, pages of >= 16 tokens, GQA groups of <= 16,
16-byte aligned caches, at least heuristics.DECODE_SM90_MIN_TOKENS cached (token, kv head) pairs
of capacity, now 0) and keeps its Triton kernel for everything else.

Why a second kernel: decode is a read stream (4 FLOP a byte at 32 query over 8 KV heads), so what
matters is keeping enough bytes in flight on every SM for the whole call. The Triton kernel
(cp.async gathers, 2 stages, a program a (sequence, kv head, split)) read 78-95% of copy at batch
>= 16 on an H200 against unpaged SDPA's (cuDNN) 96-107% (NOTES item 40).

- A persistent program an SM walks work units (sequence, kv head, split) pid, pid + grid, ...;
  the split count is the smallest that fills >= 95% of the grid's rounds (16 at batch 1 over 8 kv
  heads: 128 units on 132 SMs; 1 from batch 16 up).
- A producer (the default partition) streams 16-token page slices of K and V with TMA into a
  ring of 96 KB (3 slots of 4 K and 4 V slices at D = 128) that runs on across units; a 4-D
  descriptor over the cache (block, row, kv head, D) with a [1, 16, 1, D] box gathers one
  (page, head) slice, and a block id outside [0, num_blocks) is sent as -1, a box TMA fills
  with zeros without reading memory (those tokens are masked out). The next slot's block ids (at a
  unit's last slot, the next unit's length and ids) are read right after this slot's copies issue.
- Four consumer warps take one slice of each slot apiece, each with its own online softmax (no
  cross-warp reduction a slot), with mma.sync (m16n8k16) and the 16 tokens of a slice on the M
  side: S^T = K Q^T and O^T += V^T P^T, the GQA group's query heads the N side, padded to 8
  columns (16 past a group of 8). A group of 4 thus pads to 8, not to 16 rows as Q K^T would:
  half the MMAs and half the accumulator registers (H200: B1 x 16K kernel 27.7 -> 23.2 us,
  B64 x 4K 251 -> 242; NOTES item 130). A warp reads its next slice's block id one slot ahead,
  and hands the slot back to the producer as soon as S is computed and V is in registers (0-2%
  at batch >= 8 on an H200, NOTES item 64).
- A unit that is a whole sequence (one split) merges the four warps' states through shared
  memory, each warp D / 4 columns, and writes the output: one launch. With splits, each warp's
  state is a partial and ops/decode_attention.py's combine kernel merges them (merging the warps
  first measured slower there: 21.6 against 17.6 us at batch 1 x 4K). The combine goes out as this
  kernel's programmatic dependent, released once each program's partitions are done (``PDL``):
  its launch overlaps the last programs (H200: batch 1 x 16K 28.2 -> 26.7 us, 8 x 4K 43.0 ->
  41.6; NOTES item 136). Reading the first slot's block ids beside the length instead of after it
  (a guess from the capacity's split) measured 0.4-0.9 us slower and was dropped.
- A sliding window (WINDOW) starts each unit at the window's first slice and masks the keys
  before it; the splits are planned on the window's span. A softcap (SOFTCAP) caps the scores
  with one exp2 (ops/decode_attention.py's _softcap). A slice loaded whole may hold rows past the
  length (or before the window) that nobody wrote: they are zeroed in V^T before P V, where
  p = 0 alone would still turn a NaN there into a NaN output (NOTES item 158).

- fp8 caches (FP8: the descriptors' dtype): TMA lands the 8-bit pages (a slot is half the bytes:
  6 slots in the ring at D = 128) and the consumers widen them to fp16 in registers, exact for
  both formats, for the same MMAs with k_width 4 operands (a thread's 4 consecutive k).
  - K comes through ldmatrix as it is.
  - V^T has no 8-bit transposed ldmatrix on sm_90, so a thread loads 16 bytes of each of 4 tokens
    and those become V^T's rows under a relabelling (_vt8, _dcol) that moves no data.
  - q is taken to fp16 at a power of two a head (exact, whatever bf16 holds), undone with k_scale
    in the score scale; v_scale multiplies the accumulator.
  - These calls are bound by the consumers' latency, not the DRAM, and two changes are compiled
    for them alone: the softmax sums stay a thread's own until the unit ends, and S^T runs as two
    MMA chains over D's halves (HALVES: at one split, and for units of HALVES_MIN_SLOTS slots).
  - H200: 1.40-1.71x cuDNN on the bf16 problem from batch 16, 1.21-1.59x at batch 8 (NOTES
    item 166).

Measured (H200, 2026-11-26, benchmarks/probe_decode_sm90.py, Hq 32 / Hkv 8, D 128, pages of 16
shuffled): 92-104% of copy at batch 16-64 (Triton kernel 79-96%, cuDNN 96-106%); 0.95-0.98x
cuDNN there, 0.89-0.98x at batch 8 (bench). Tried and dropped (NOTES item 51): rings of 4-6 slots (1-3%
slower than 3), two programs an SM at 128 registers, a stream-K schedule (slot ranges across
pairs: the kv heads' programs lose step and read 10% slower).
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..runtime.device import dram_bandwidth, sm_count
from ..runtime.launch import Desc, LaunchCache, Ptr, launch
from .attention_sm90 import tma_ok
from .decode_attention import scale_ptrs, window_span

SLICE = 16          # tokens one TMA box (and one consumer warp's share of a slot) holds
CONSUMERS = 4       # consumer warps: a slot is CONSUMERS slices of K and of V
RING_BYTES = 96 * 1024   # the ring: 3 slots of 32 KB at D = 128, 6 of 16 KB at D = 64
PROGRAMS_PER_SM = 1
REGS_DEFAULT = 232  # the consumer warps' registers a thread (one program an SM)
HEAD_DIMS = (64, 128)
MAX_GROUP = 16      # query heads a kv head serves: the MMAs' N side, 8 or 16 columns
MIN_UNIT_SLOTS = 4  # a split covers at least this many slots of its capacity share
# The split count's cost model (plan: one split or the filling count), fitted to forced-split
# timings on the H100 and the H200 (NOTES item 139): a program streams its unit at
# SM_STREAM_BYTES a microsecond, all of them together at STREAM_EFF of the DRAM peak, the two
# limits blended as a BLEND-norm; each round of units past the first adds ROUND_US (a unit's
# start: its length, block ids and first copies), a split launch SPLIT_US (partials, the combine).
SM_STREAM_BYTES = 65_000
STREAM_EFF = 0.9
BLEND = 6
ROUND_US = 2.0
SPLIT_US = 2.0
FILL = 0.95         # the candidate split count is the smallest that fills this share of the grid's rounds
HALVES_MIN_SLOTS = 32  # fp8 split launches: the two-chain S^T from units of this many slots (_halves)
MERGE_STUB = 8      # the merge scratch's columns in a split launch (no merge compiled; D never is 8)



@gluon.jit
def _unit(u, splits, Hkv, lens_ptr, cap, win, C: gl.constexpr, WINDOW: gl.constexpr):
    """Work unit u -> (b, kv head, split, the sequence's length n, its slices [c0, c1) of 16 tokens,
    the first key lo): the keys [lo, n) (n clamped to the block table's capacity; lo = 0, or with a
    WINDOW n - 1 - win) as whole slices, cut into ``splits`` chunks of whole slots."""
    pair = u // splits
    split = u % splits
    b = pair // Hkv
    kvh = pair % Hkv
    n = gl.load(lens_ptr + b)
    n = gl.minimum(gl.maximum(n, 0), cap).to(gl.int32)
    n16 = gl.cdiv(n, 16)
    if WINDOW:
        lo = gl.maximum(n - 1 - win, 0)
        first = lo // 16
    else:
        lo = 0
        first = 0
    chunk = gl.cdiv(gl.cdiv(n16 - first, splits), C) * C
    c0 = first + split * chunk
    c1 = gl.minimum(c0 + chunk, n16)
    return b, kvh, split, n, c0, c1, lo


@gluon.jit
def _page_of(bt_ptr, b, c, c1, sub, num_blocks, s_bb, s_bj):
    """Block id of slice c of sequence b (``sub`` slices a page), or -1 at or past c1 and for an
    id outside [0, num_blocks): TMA fills a box at block -1 with zeros and reads nothing."""
    page = gl.load(bt_ptr + b.to(gl.int64) * s_bb + (c // sub).to(gl.int64) * s_bj, mask=c < c1, other=-1)
    ok = (page >= 0) & (page < num_blocks)
    return gl.where(ok, page, -1).to(gl.int32)


@gluon.jit
def _pages(bt_ptr, b, c, c1, sub, num_blocks, s_bb, s_bj):
    """Block ids of slices c .. c + 3 (one slot at C = 4)."""
    return (_page_of(bt_ptr, b, c, c1, sub, num_blocks, s_bb, s_bj),
            _page_of(bt_ptr, b, c + 1, c1, sub, num_blocks, s_bb, s_bj),
            _page_of(bt_ptr, b, c + 2, c1, sub, num_blocks, s_bb, s_bj),
            _page_of(bt_ptr, b, c + 3, c1, sub, num_blocks, s_bb, s_bj))


@gluon.jit
def _dec_produce(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                 k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                 qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb, s_bj,
                 s_ob, s_oh):
    """The producer: unit after unit, slot after slot, C (K, V) slice pairs by TMA into the ring
    once its consumers released the slot. A slot's copies are issued first and the next slot's
    block ids (the next unit's length and ids at a unit's last slot) read after them: in steady
    state that read overlaps the wait for the next free slot, and at the kernel's start the first
    copies wait for one length and one block-id read, not for the next unit's length and the next
    slot's ids too (the first slot lands 1.4 us sooner at batch 1 on an H200; the call is 0-2 us
    shorter, NOTES item 69)."""
    NB: gl.constexpr = ready.type.shape[0]
    C: gl.constexpr = k_smem.type.shape[0] // NB
    gl.static_assert(C == 4)
    WINDOW: gl.constexpr = flags.type.shape[0] == 2
    nprog = gl.num_programs(0)
    t = 0
    b, kvh, split, n, c0, c1, lo = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, win, C, WINDOW)
    p0, p1, p2, p3 = _pages(bt_ptr, b, c0, c1, sub, num_blocks, s_bb, s_bj)
    for u in range(gl.program_id(0), n_units, nprog):
        n_slots = gl.cdiv(gl.maximum(c1 - c0, 0), C)
        bn, kvhn, splitn, nn, c0n, c1n = b, kvh, split, n, c0, c1
        for j in range(n_slots):
            c = c0 + j * C
            slot = t % NB
            mbarrier.wait(empty.index(slot), ((t // NB) & 1) ^ 1)      # a fresh barrier counts as phase 1 done
            bar = ready.index(slot)
            mbarrier.expect(bar, 2 * C * k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [p0, (c % sub) * 16, kvh, 0], bar, k_smem.index(slot * C))
            tma.async_copy_global_to_shared(v_desc, [p0, (c % sub) * 16, kvh, 0], bar, v_smem.index(slot * C))
            tma.async_copy_global_to_shared(k_desc, [p1, ((c + 1) % sub) * 16, kvh, 0], bar, k_smem.index(slot * C + 1))
            tma.async_copy_global_to_shared(v_desc, [p1, ((c + 1) % sub) * 16, kvh, 0], bar, v_smem.index(slot * C + 1))
            tma.async_copy_global_to_shared(k_desc, [p2, ((c + 2) % sub) * 16, kvh, 0], bar, k_smem.index(slot * C + 2))
            tma.async_copy_global_to_shared(v_desc, [p2, ((c + 2) % sub) * 16, kvh, 0], bar, v_smem.index(slot * C + 2))
            tma.async_copy_global_to_shared(k_desc, [p3, ((c + 3) % sub) * 16, kvh, 0], bar, k_smem.index(slot * C + 3))
            tma.async_copy_global_to_shared(v_desc, [p3, ((c + 3) % sub) * 16, kvh, 0], bar, v_smem.index(slot * C + 3))
            if j + 1 == n_slots:                                        # the unit's last slot: the next unit
                bn, kvhn, splitn, nn, c0n, c1n, lon = _unit(gl.minimum(u + nprog, n_units - 1), splits, Hkv,
                                                            lens_ptr, cap, win, C, WINDOW)
                p0, p1, p2, p3 = _pages(bt_ptr, bn, c0n, c1n, sub, num_blocks, s_bb, s_bj)
            else:
                p0, p1, p2, p3 = _pages(bt_ptr, b, c + C, c1, sub, num_blocks, s_bb, s_bj)
            t += 1
        if n_slots == 0:                                                # an empty unit: the next one now
            bn, kvhn, splitn, nn, c0n, c1n, lon = _unit(gl.minimum(u + nprog, n_units - 1), splits, Hkv, lens_ptr,
                                                        cap, win, C, WINDOW)
            p0, p1, p2, p3 = _pages(bt_ptr, bn, c0n, c1n, sub, num_blocks, s_bb, s_bj)
        b, kvh, split, n, c0, c1 = bn, kvhn, splitn, nn, c0n, c1n


@gluon.constexpr_function
def _v8_layout(d):
    """An fp8 V slice (16 tokens, D) with each thread's D / 8 consecutive bytes (one 16- or 8-byte
    load) of 4 tokens: lanes t (bits 0-1) take tokens 4t .. 4t + 3, lanes g (bits 2-4) columns
    D / 8 g on; _vt8 relabels it as V^T's A operand."""
    d = int(d)
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range((d // 8).bit_length() - 1)] + [[1, 0], [2, 0]],
        lane_bases=[[4, 0], [8, 0], [0, d // 8], [0, d // 4], [0, d // 2]], warp_bases=[], block_bases=[],
        shape=[16, d])


@gluon.jit
def _dcol(rho, D: gl.constexpr, FP8: gl.constexpr):
    """The column d of O^T's row rho: rho itself, or with fp8 caches (_vt8's relabelling)
    D / 8 (rho % 8) + 2 (rho // 16) + (rho // 8) % 2."""
    if FP8:
        return (D // 8) * (rho % 8) + 2 * (rho // 16) + (rho // 8) % 2
    else:
        return rho


@gluon.jit
def _vt8(v, a_l: gl.constexpr):
    """V^T's A operand from a (16 tokens, D) fp8 slice widened in registers, loaded with each
    thread's D / 8 consecutive columns of 4 tokens (16 or 8 bytes a load). The MMA's A operand
    (k_width 4) wants a thread's 4 consecutive tokens (k) of rows g and g + 8 of each 16-row tile
    i, so row rho = 16 i + 8 h + g is taken to be column d = D / 8 g + 2 i + h: rows are only
    labels to P V (the output is written by _dcol), and the relabelling moves no data (no
    ldmatrix.trans for 8-bit data on sm_90; a transposed load would read single bytes)."""
    D: gl.constexpr = v.shape[1]
    v = gl.permute(gl.reshape(v, [16, 8, D // 16, 2]), (2, 3, 1, 0))              # (i, h, g, token)
    return gl.convert_layout(gl.reshape(v, [D, 16]), a_l, assert_trivial=True)


@gluon.jit
def _load_q(q_ptr, b, kvh, G, s_qb, s_qh, GP: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """The GQA group's query rows (GP, D), zero past G."""
    g = gl.arange(0, GP, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    rows = (kvh * G + g).to(gl.int64)
    return gl.load(q_ptr + b.to(gl.int64) * s_qb + rows[:, None] * s_qh + d[None, :], mask=(g < G)[:, None], other=0.0)


@gluon.jit
def _dec_consume(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                 k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                 qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb, s_bj,
                 s_ob, s_oh, W: gl.constexpr):
    """Consumer warp W: slice W of every slot of its program's units, its own online softmax over
    them; a unit's (max, sum, acc) leave as partial split * C + W of each query head of the group.
    The next unit's length and query rows are loaded when a unit starts.

    Tokens are the MMAs' M side and the query heads their N side (GP = 8 columns for groups of up
    to 8, else 16): S^T = K Q^T is (16 tokens, GP), O^T += V^T P^T is (D, GP), so a group of 4
    pads to 8 columns, not to 16 rows, and a slice is 2 x D / 16 mma.sync, not 4 x D / 16."""
    NB: gl.constexpr = ready.type.shape[0]
    C: gl.constexpr = k_smem.type.shape[0] // NB
    D: gl.constexpr = k_desc.block_type.shape[3]
    GP: gl.constexpr = scm.type.shape[1]
    ONE: gl.constexpr = sc.type.shape[2] == D                                 # one split: merge here
    WINDOW: gl.constexpr = flags.type.shape[0] == 2                           # keys from n - 1 - win only
    SOFTCAP: gl.constexpr = flags.type.shape[1] == 2                          # capped scores (_softcap)
    LSE: gl.constexpr = flags.type.shape[2] == 2                              # ONE: m_ptr takes the lse
    HALVES: gl.constexpr = flags.type.shape[3] == 2                           # fp8: S^T as two MMA chains
    dtype: gl.constexpr = k_desc.dtype
    FP8: gl.constexpr = dtype.primitive_bitwidth == 8                        # fp8 caches: widened to fp16 (exact)
    gl.static_assert(FP8 or not HALVES)
    mdt: gl.constexpr = gl.float16 if FP8 else dtype                          # the MMAs' operands
    KW: gl.constexpr = 4 if FP8 else 2      # fp8: each thread's 4 consecutive k of a row, one 32-bit word loaded
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    LV: gl.constexpr = _v8_layout(D)                                          # fp8 V's loads (_vt8)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    flat: gl.constexpr = gl.NVMMASharedLayout.get_default_for([16, D], dtype)
    srow: gl.constexpr = gl.SliceLayout(1, mma)                               # tokens (S^T), D (O^T)
    scol: gl.constexpr = gl.SliceLayout(0, mma)                               # query heads

    DS: gl.constexpr = D // C
    L3: gl.constexpr = gl.BlockedLayout([1, GP // 2, DS // 16], [1, 2, 16], [1, 1, 1], [2, 1, 0])
    mlay: gl.constexpr = gl.SliceLayout(0, L3)                                # (GP, DS) merge tiles
    mrow: gl.constexpr = gl.SliceLayout(1, mlay)
    toks = gl.arange(0, 16, layout=srow)
    g = gl.arange(0, GP, layout=scol)
    d = _dcol(gl.arange(0, D, layout=srow), D, FP8)                          # O^T's rows' columns
    gmask = g < G
    g_m = gl.arange(0, GP, layout=mrow)
    dd_m = gl.arange(0, DS, layout=gl.SliceLayout(0, mlay))
    nprog = gl.num_programs(0)
    t = 0
    rr = 0
    b, kvh, split, n, c0, c1, lo = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, win, C, WINDOW)
    q = _load_q(q_ptr, b, kvh, G, s_qb, s_qh, GP, D, ld)
    if FP8:
        ks = gl.load(ks_ptr)
        vs = gl.load(vs_ptr)
    page_nx = _page_of(bt_ptr, b, c0 + W, c1, sub, num_blocks, s_bb, s_bj)
    for u in range(gl.program_id(0), n_units, nprog):
        bn, kvhn, splitn, nn, c0n, c1n, lon = _unit(gl.minimum(u + nprog, n_units - 1), splits, Hkv, lens_ptr, cap,
                                                    win, C, WINDOW)
        qn = _load_q(q_ptr, bn, kvhn, G, s_qb, s_qh, GP, D, ld)
        if FP8:
            # Q^T to fp16 at a power of two a head that brings its largest |q| into [2^14, 2^15):
            # exact for every element down to 2^-31 of that (bf16 keeps 8 bits); the scores are
            # scaled back, with k_scale, by sfac a column (one multiply, as qk_scale)
            qf = q.to(gl.float32)
            ex = (gl.max(gl.abs(qf), 1).to(gl.int32, bitcast=True) >> 23) & 0xFF
            qs = (gl.minimum(gl.maximum(268 - ex, 1), 254) << 23).to(gl.float32, bitcast=True)
            qx = (qf * qs[:, None]).to(mdt)
            if HALVES:                                                    # the halves' Q^T (see S^T below)
                qh = gl.permute(gl.reshape(qx, [GP, 2, D // 2]), (0, 2, 1))      # (GP, D / 2, half)
                qa, qc = gl.split(gl.convert_layout(qh, gl.BlockedLayout([1, 1, 2], [4, 8, 1], [1, 1, 1], [2, 1, 0])))
                qb = gl.convert_layout(gl.permute(qa, (1, 0)), b_l)
                qb1 = gl.convert_layout(gl.permute(qc, (1, 0)), b_l)
            else:
                qb = gl.convert_layout(gl.permute(qx, (1, 0)), b_l)
            sfac = gl.convert_layout((cap_in if SOFTCAP else qk_scale) * ks / qs, scol)[None, :]
        else:
            qb = gl.convert_layout(gl.permute(q, (1, 0)), b_l)            # Q^T (D, GP)
            sfac = cap_in if SOFTCAP else qk_scale
        n_slots = gl.cdiv(gl.maximum(c1 - c0, 0), C)
        m_i = gl.full([GP], -float("inf"), gl.float32, scol)
        if FP8:
            # each thread keeps its own sums, reduced across the lanes once, after the unit: no
            # shuffles a slice (the max still needs them). fp8 calls are bound by the consumers'
            # latency, not the DRAM: 3-10% faster there (H200, NOTES item 166); 16-bit ones, bound
            # by the DRAM, measured level and keep the reduction a slice
            l_i = gl.zeros([16, GP], gl.float32, mma)
        else:
            l_i = gl.zeros([GP], gl.float32, scol)
        acc = gl.zeros([D, GP], gl.float32, mma)                          # O^T
        for j in range(n_slots):
            c = c0 + j * C + W
            # this warp's block id was read a slot ahead (the next unit's first one at the unit's
            # last slot), so its latency never sits between a landed slot and its arithmetic
            page = page_nx
            last = j + 1 == n_slots
            page_nx = _page_of(bt_ptr, gl.where(last, bn, b), gl.where(last, c0n + W, c + C),
                               gl.where(last, c1n, c1), sub, num_blocks, s_bb, s_bj)
            slot = t % NB
            mbarrier.wait(ready.index(slot), (t // NB) & 1)
            # S^T = K Q^T, then V^T to registers and the slot back to the producer before the
            # softmax and O^T += V^T P^T: its refill is issued while this slice is still being
            # worked on
            kt = k_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat)
            if HALVES:
                # fp8: two chains of D / 32 dependent MMAs over D's halves, not one of D / 16: the
                # softmax waits half as long. H200 (NOTES item 166): 17-21% faster at one split,
                # 4-6% with splits of 64 slots; each unit's start costs it more, so units of 16
                # slots came out level and of 4 slots (1 x 4K) 3% slower: the host asks for it
                # (_halves) at one split and for units of HALVES_MIN_SLOTS slots or more
                s = mma_v2(kt.slice(0, D // 2, dim=1).load(a_l).to(mdt), qb, gl.zeros([16, GP], gl.float32, mma)) + \
                    mma_v2(kt.slice(D // 2, D // 2, dim=1).load(a_l).to(mdt), qb1, gl.zeros([16, GP], gl.float32, mma))
            else:
                s = mma_v2(kt.load(a_l).to(mdt), qb, gl.zeros([16, GP], gl.float32, mma))   # (16 tokens, GP heads)
            if FP8:
                vt = _vt8(v_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat).load(LV).to(mdt), a_l)
            else:
                vt = v_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat).permute((1, 0)).load(a_l)
            mbarrier.arrive(empty.index(slot))
            if c < c1:
                ok = ((c * 16 + toks) < n) & (page >= 0)
                if WINDOW:
                    ok = ok & ((c * 16 + toks) >= lo)
                if SOFTCAP:
                    s = cap_out * (1.0 - 2.0 / (gl.exp2(s * sfac) + 1.0))    # softcap tanh(.), exp2 domain
                else:
                    s = s * sfac
                s = gl.where(ok[:, None], s, -float("inf"))
                m_new = gl.maximum(m_i, gl.max(s, 0))
                m_use = gl.where(m_new == -float("inf"), 0.0, m_new)      # no -inf - -inf = NaN
                alpha = gl.exp2(m_i - m_use)
                p = gl.exp2(s - m_use[None, :])
                if FP8:
                    l_i = l_i * alpha[None, :] + p
                else:
                    l_i = l_i * alpha + gl.sum(p, 0)
                # a slice across the length's end (or the window's start) holds rows nobody wrote,
                # or stale ones: p = 0 there, but 0 x NaN is NaN, so those rows of V^T are zeroed.
                # This costs the loop 0.3-1%; peeling the unit's last slot, or zeroing the rows in
                # shared memory instead, measured slower (NOTES item 158)
                if WINDOW:
                    edge = (c * 16 + 16 > n) | (c * 16 < lo)
                else:
                    edge = c * 16 + 16 > n
                if edge:
                    tv = c * 16 + gl.arange(0, 16, layout=gl.SliceLayout(0, a_l))
                    vt = gl.where(((tv < n) & (tv >= lo))[None, :], vt, gl.zeros_like(vt))
                acc = mma_v2(vt, gl.convert_layout(p.to(mdt), b_l), acc * alpha[None, :])
                m_i = m_new
            t += 1
        if n_slots == 0:                                                # an empty unit: the next one's id now
            page_nx = _page_of(bt_ptr, bn, c0n + W, c1n, sub, num_blocks, s_bb, s_bj)
        if FP8:
            acc = acc * vs                                              # P (v_scale V) = v_scale (P V)
            l_i = gl.sum(l_i, 0)
        if ONE:
            # the whole sequence: the C warps' states -> one, D / C columns a warp, through
            # double-buffered scratch, and the output itself (no partials, no combine pass).
            # Compiled only for one-split launches: with this branch and its 32 KB of scratch in
            # the kernel, a split launch ran 1-2.5 us slower (H200, NOTES item 137)
            buf = rr % 2
            ph = (rr // 2) & 1
            mbarrier.wait(free.index(buf), ph ^ 1)                      # a fresh barrier counts as phase 1 done
            sc.index(buf * C + W).permute((1, 0)).store(acc)
            scm.index(buf * C + W).store(m_i)
            scl.index(buf * C + W).store(l_i)
            gl.thread_barrier()
            mbarrier.arrive(done.index(buf))
            mbarrier.wait(done.index(buf), ph)
            mx = scm.index(buf * C).load(mrow)
            for w in gl.static_range(1, C):
                mx = gl.maximum(mx, scm.index(buf * C + w).load(mrow))
            mu = gl.where(mx == -float("inf"), 0.0, mx)
            lsum = gl.zeros([GP], gl.float32, mrow)
            a = gl.zeros([GP, DS], gl.float32, mlay)
            for w in gl.static_range(C):
                wt = gl.exp2(scm.index(buf * C + w).load(mrow) - mu)
                lsum += scl.index(buf * C + w).load(mrow) * wt
                a += sc.index(buf * C + w).slice(W * DS, DS, dim=1).load(mlay) * wt[:, None]
            gl.thread_barrier()
            mbarrier.arrive(free.index(buf))
            rr += 1
            o = a / gl.where(lsum > 0, lsum, 1.0)[:, None]                # seq_len 0: zeros
            rows = (kvh * G + g_m).to(gl.int64)
            gl.store(out_ptr + b.to(gl.int64) * s_ob + rows[:, None] * s_oh + _dcol(W * DS + dd_m, D, FP8)[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=(g_m < G)[:, None])
            if LSE:
                if W == 0:    # the natural log-sum-exp, ln 2 (M + log2 L), into the (B, Hq) fp32 m_ptr
                    lse = gl.where(lsum > 0, (mu + gl.log2(gl.where(lsum > 0, lsum, 1.0))) * 0.6931471805599453,
                                   -float("inf"))
                    gl.store(m_ptr + b.to(gl.int64) * (Hkv * G) + rows, lse, mask=g_m < G)
        else:
            # a split: this warp's state is partial split * C + W (the combine kernel merges them;
            # merging the C warps here first measured slower at batch 1: 21.6 against 17.6 us)
            row = (b.to(gl.int64) * (Hkv * G) + kvh * G + g) * (splits * C) + split * C + W
            gl.store(m_ptr + row, m_i, mask=gmask)
            gl.store(l_ptr + row, l_i, mask=gmask)
            gl.store(acc_ptr + row[None, :] * D + d[:, None], acc, mask=gmask[None, :])
        b, kvh, split, n, c0, c1, lo, q = bn, kvhn, splitn, nn, c0n, c1n, lon, qn


@gluon.jit
def _dec_consume0(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                  k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                  qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb,
                  s_bj, s_ob, s_oh):
    # worker partitions take no constexpr arguments: one wrapper a consumer warp
    _dec_consume(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                 k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                 qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb, s_bj,
                 s_ob, s_oh, 0)


@gluon.jit
def _dec_consume1(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                  k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                  qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb,
                  s_bj, s_ob, s_oh):
    _dec_consume(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                 k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                 qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb, s_bj,
                 s_ob, s_oh, 1)


@gluon.jit
def _dec_consume2(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                  k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                  qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb,
                  s_bj, s_ob, s_oh):
    _dec_consume(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                 k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                 qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb, s_bj,
                 s_ob, s_oh, 2)


@gluon.jit
def _dec_consume3(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                  k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                  qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb,
                  s_bj, s_ob, s_oh):
    _dec_consume(q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
                 k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
                 qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb, s_bj,
                 s_ob, s_oh, 3)


@gluon.jit
def _decode_sm90_kernel(q_ptr,                    # (B, Hq, D), D unit-stride
                        k_desc, v_desc,           # 4-D descriptors over (num_blocks, block_size, Hkv, D), box [1, 16, 1, D]
                        bt_ptr, lens_ptr,         # (B, max_blocks) block table, (B,) lengths (int32/int64)
                        out_ptr,                  # (B, Hq, D) output (written when splits == 1)
                        m_ptr, l_ptr, acc_ptr,    # (B, Hq, S), (B, Hq, S), (B, Hq, S, D) fp32 partials (splits > 1)
                        ks_ptr, vs_ptr,           # fp8 caches: one fp32 each, the dequantisation scales
                        qk_scale, cap_in, cap_out,  # SOFTCAP: 2 log2(e) scale / softcap, softcap log2(e)
                        Hkv, G, num_blocks, cap,
                        win,                      # WINDOW: keys from position n - 1 - win on
                        sub, splits, n_units, s_qb, s_qh, s_bb, s_bj, s_ob, s_oh,
                        NB: gl.constexpr, C: gl.constexpr, GP: gl.constexpr, REGS: gl.constexpr,
                        SD: gl.constexpr, PDL: gl.constexpr = False, WINDOW: gl.constexpr = False,
                        SOFTCAP: gl.constexpr = False, LSE: gl.constexpr = False, HALVES: gl.constexpr = False):
    # SD: the merge scratch's columns, D where every unit is a whole sequence (one split), else a
    # stub: the consumers compile the merge only then (_dec_consume's ONE). WINDOW, SOFTCAP, LSE and
    # HALVES reach the partitions (which take no constexpr arguments) as the shape of ``flags``. LSE
    # (one split only): the merge also writes each head's log-sum-exp, m_ptr being the (B, Hq) fp32
    # lse. HALVES (fp8 only): S^T as two MMA chains over D's halves
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NB * C] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [NB * C] + v_desc.block_type.shape, v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    D: gl.constexpr = k_desc.block_type.shape[3]
    plain2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    plain1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sc = gl.allocate_shared_memory(gl.float32, [2 * C, GP, SD], plain2)     # the warps' states at a unit's end
    scm = gl.allocate_shared_memory(gl.float32, [2 * C, GP], plain1)       # (GP: the padded group, read there)
    scl = gl.allocate_shared_memory(gl.float32, [2 * C, GP], plain1)
    done = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    flags = gl.allocate_shared_memory(gl.int8, [1 + WINDOW, 1 + SOFTCAP, 1 + LSE, 1 + HALVES],
                                      gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))   # never read: its shape
    for i in gl.static_range(NB):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=C)
    for i in gl.static_range(2):
        mbarrier.init(done.index(i), count=C)
        mbarrier.init(free.index(i), count=C)
    args = (q_ptr, k_desc, v_desc, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
            k_smem, v_smem, ready, empty, sc, scm, scl, done, free, flags,
            qk_scale, cap_in, cap_out, Hkv, G, num_blocks, cap, win, sub, splits, n_units, s_qb, s_qh, s_bb, s_bj,
            s_ob, s_oh)
    gl.warp_specialize([(_dec_produce, args), (_dec_consume0, args), (_dec_consume1, args), (_dec_consume2, args),
                        (_dec_consume3, args)], [1, 1, 1, 1], [REGS, REGS, REGS, REGS])
    if PDL:
        # every partition is done (its stores issued): the combine, launched as this grid's
        # programmatic dependent, may start now and waits in its first step for this grid's end
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
_GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
_GL_FP8 = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}


@functools.lru_cache(maxsize=None)
def _smem_layout(d: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for([1, SLICE, 1, d], {**_GL_DTYPE, **_GL_FP8}[dtype])


def covers(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether this kernel takes the call (the caller checked the arguments)."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    nblocks, page, hkv, d = k_cache.shape
    if q.dtype not in _GL_DTYPE or d not in HEAD_DIMS or page < SLICE or q.shape[1] // hkv > MAX_GROUP:
        return False
    if k_cache.dtype != q.dtype and k_cache.dtype not in _GL_FP8:
        return False
    return nblocks > 0 and tma_ok(k_cache) and tma_ok(v_cache)


def _modelled_us(pairs: int, capacity: int, slots: int, token_bytes: int, chip_us: float, s: int) -> float:
    """The split-count cost model's time of ``s`` splits (see SM_STREAM_BYTES), in microseconds
    less the launch's fixed cost."""
    slot_tokens = CONSUMERS * SLICE
    rounds = triton.cdiv(pairs * s, slots)
    unit_us = rounds * triton.cdiv(triton.cdiv(capacity, slot_tokens), s) * slot_tokens * token_bytes / SM_STREAM_BYTES
    return (unit_us ** BLEND + chip_us ** BLEND) ** (1 / BLEND) + (rounds - 1) * ROUND_US + (SPLIT_US if s > 1 else 0.0)


@functools.lru_cache(maxsize=4096)
def plan(pairs: int, capacity: int, slots: int, token_bytes: int, dram_bytes_per_s: float) -> tuple[int, int]:
    """(splits, grid) for ``pairs`` (sequence, kv head) pairs of ``capacity`` tokens of
    ``token_bytes`` (K and V) on a grid of at most ``slots`` persistent programs. The candidate is
    the smallest split count whose units fill FILL of the grid's rounds (else the fullest), each
    split at least MIN_UNIT_SLOTS slots of the capacity. It is taken if the cost model times it
    below one split: a unit's stream (its rounds of capacity / s tokens) and the chip's (all the
    bytes at STREAM_EFF of ``dram_bytes_per_s``) bound the time together, and a split adds
    SPLIT_US. At batch 1 the programs' streams bind and splitting wins; where the pairs alone come
    near the DRAM's rate (batch 8 at short contexts, batch 12) one split does."""
    most = max(1, triton.cdiv(capacity, SLICE) // (CONSUMERS * MIN_UNIT_SLOTS))
    best, best_fill = 1, 0.0
    for s in range(1, most + 1):
        units = pairs * s
        fill = units / (triton.cdiv(units, slots) * slots)
        if fill > best_fill + 1e-9:
            best, best_fill = s, fill
        if fill >= FILL:
            break
    if best > 1:
        chip_us = pairs * capacity * token_bytes / (STREAM_EFF * dram_bytes_per_s) * 1e6
        if _modelled_us(pairs, capacity, slots, token_bytes, chip_us, best) >= \
                _modelled_us(pairs, capacity, slots, token_bytes, chip_us, 1):
            best = 1
    return best, min(pairs * best, slots)


_LAUNCH = LaunchCache(_decode_sm90_kernel)


def _geometry(q, k_cache, block_table, splits, slots, nb, regs, window=-1):
    """(splits, grid, ring depth, registers, the kernel's integer arguments from ``Hkv`` to the
    block table's strides, TMA box) of a call: fixed by the shapes, the strides and the window.
    With a window the split count is planned on the window's span, not the capacity."""
    bsz, hq, d = q.shape
    nblocks, page, hkv, _ = k_cache.shape
    capacity = block_table.shape[1] * page
    span = window_span(capacity, window, SLICE)
    grid_slots = slots or PROGRAMS_PER_SM * sm_count(q.device.index)
    s, grid = plan(bsz * hkv, span, grid_slots, 2 * d * k_cache.element_size(), dram_bandwidth(q.device.index))
    if splits is not None:                     # forced: clamped to the span's slots
        s = max(1, min(splits, triton.cdiv(triton.cdiv(span, SLICE), CONSUMERS)))
        grid = min(bsz * hkv * s, grid_slots)
    ring = nb or max(2, RING_BYTES // (2 * CONSUMERS * SLICE * d * k_cache.element_size()))
    ints = (hkv, hq // hkv, nblocks, capacity, window, page // SLICE, s, bsz * hkv * s,
            q.stride(0), q.stride(1), block_table.stride(0), block_table.stride(1))
    return s, grid, ring, regs or REGS_DEFAULT, ints, [1, SLICE, 1, d]


def _halves(k_cache, block_table, s: int, window: int) -> bool:
    """Whether an fp8 launch runs S^T as two MMA chains (_dec_consume's HALVES): at one split,
    and for units of HALVES_MIN_SLOTS slots or more."""
    if k_cache.element_size() != 1:
        return False
    span = window_span(block_table.shape[1] * k_cache.shape[1], window, SLICE)
    return s == 1 or triton.cdiv(triton.cdiv(span, SLICE), s * CONSUMERS) >= HALVES_MIN_SLOTS


def _group_cols(group: int) -> int:
    """The MMAs' N side for a GQA group of ``group`` query heads: 8, or 16 past 8."""
    return 8 if group <= 8 else 16


def _partials(q, s):
    """The (m, l, acc) fp32 partials of ``s`` splits (B, Hq, P), (B, Hq, P), (B, Hq, P, D), P = S x C."""
    bsz, hq, d = q.shape
    m = torch.empty((bsz, hq, s * CONSUMERS), dtype=torch.float32, device=q.device)
    l = torch.empty((bsz, hq, s * CONSUMERS), dtype=torch.float32, device=q.device)
    acc = torch.empty((bsz, hq, s * CONSUMERS, d), dtype=torch.float32, device=q.device)
    return m, l, acc


def decode_sm90(q, k_cache, v_cache, block_table, seq_lens, out, scale_log2: float, splits: int | None = None,
                slots: int | None = None, nb: int | None = None, regs: int | None = None, key=None,
                pdl: bool = False, window: int = -1, softcap: tuple[float, float] | None = None,
                lse=None, k_scale=None, v_scale=None):
    """The kernel's pass. With one split a sequence it writes ``out``
    (contiguous) and returns None; otherwise it returns the (m, l, acc) partials (B, Hq, P), (B, Hq, P), (B, Hq, P, D) fp32,
    P = S x C, for ops/decode_attention.py's combine kernel. ``splits``, ``slots`` (programs),
    ``nb`` (ring depth) and ``regs`` (registers a thread) override the plan, for the probes.
    ``key``: the caller's plan key (everything the launch depends on but the data pointers); the
    compiled kernel is recorded under it, and :func:`replay` then launches it directly. ``pdl``: the
    caller launches the combine as this grid's programmatic dependent (``launch_pdl``), and each
    program lets it launch once all of its partitions are done. ``window``: the sliding window's
    left (-1: none); ``softcap``: None, or the (cap_in, cap_out) of ops/decode_attention.py's
    _softcap_args. ``lse``: a (B, Hq) fp32 tensor for the log-sum-exp: at one split the kernel's
    merge writes it; with splits the caller's combine must (it gets the partials as ever).
    ``k_scale``, ``v_scale``: one-element fp32 tensors, with fp8 caches."""
    s, grid, ring, nreg, ints, box = _geometry(q, k_cache, block_table, splits, slots, nb, regs, window)
    split_out = s > 1
    parts = _partials(q, s) if split_out else (out if lse is None else lse, out, out)   # unused at one split but the lse
    layout = _smem_layout(q.shape[2], k_cache.dtype)
    k_desc = TensorDescriptor(k_cache, list(k_cache.shape), list(k_cache.stride()), box, layout)
    v_desc = TensorDescriptor(v_cache, list(v_cache.shape), list(v_cache.stride()), box, layout)
    _LAUNCH(None if key is None else (key, splits, slots, nb, regs, pdl), (grid,),
            (q, k_desc, v_desc, block_table, seq_lens, out, *parts, *scale_ptrs(out, k_scale, v_scale), scale_log2,
             *(softcap or (0.0, 0.0)), *ints,
             out.stride(0), out.stride(1)),
            dict(NB=ring, C=CONSUMERS, GP=_group_cols(q.shape[1] // k_cache.shape[2]), REGS=nreg,
                 SD=MERGE_STUB if split_out else q.shape[2], PDL=pdl and split_out, WINDOW=window >= 0,
                 SOFTCAP=softcap is not None, LSE=lse is not None and not split_out,
                 HALVES=_halves(k_cache, block_table, s, window)),
            num_warps=4, num_stages=None,
            **({"maxnreg": regs} if regs else {}))
    return parts if split_out else None


def replay(key, q, k_cache, v_cache, block_table, pdl: bool = False, window: int = -1, softcap: bool = False):
    """After ``decode_sm90(..., key=key, pdl=pdl, window=window)`` ran once on a call like this one
    (``softcap``: with a softcap; the key tells whether it had an ``lse``): a function
    ``fire(q, k_cache, v_cache, block_table, seq_lens, out, scale_log2, caps, lse, k_scale, v_scale)`` that launches the
    recorded kernel with no JIT work (the descriptors are rebuilt around the new base pointers;
    shape, strides and box are the key's) and returns None at one split, else (m, l, acc, buffer):
    the partials as pointers into one fp32 buffer, which the caller keeps until the combine is
    launched. None under the JIT."""
    recorded = _LAUNCH.get((key, None, None, None, None, pdl))
    if recorded is None:
        return None
    compiled, tail = recorded
    s, grid, _, _, ints, box = _geometry(q, k_cache, block_table, None, None, None, None, window)
    split_out = s > 1
    shape, kstride, vstride = list(k_cache.shape), list(k_cache.stride()), list(v_cache.stride())
    grid = (grid,)

    bsz, hq, d = q.shape
    rows = bsz * hq * s * CONSUMERS                    # (m, l, acc) in one allocation: rows, rows, rows x D,
    rows16 = -(-rows // 4) * 4                         # each part 16-byte aligned (as the kernel was compiled)

    def fire(q, k_cache, v_cache, block_table, seq_lens, out, scale_log2, caps, lse=None, k_scale=None, v_scale=None):
        if split_out:
            buf = torch.empty(2 * rows16 + rows * d, dtype=torch.float32, device=out.device)
            base = buf.data_ptr()
            parts = (Ptr(base), Ptr(base + 4 * rows16), Ptr(base + 8 * rows16), buf)
        else:
            parts = (out if lse is None else lse, out, out)
        launch(compiled, grid, (q, Desc(k_cache, shape, kstride, box), Desc(v_cache, shape, vstride, box), block_table,
                                seq_lens, out, *parts[:3], *scale_ptrs(out, k_scale, v_scale), scale_log2, *caps, *ints,
                                out.stride(0), out.stride(1),
                                *tail))
        return parts if split_out else None

    return fire
