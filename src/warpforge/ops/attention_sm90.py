"""Attention forward and backward for Hopper (sm_90) in Gluon: warp-specialised, TMA-fed, with the
softmax of one warpgroup running under the other's tensor-core work. ops/attention.py takes this kernel for
dense calls it covers (no user mask, no sliding window, causal or not, head dim 64 or 128,
bf16/fp16, 16-byte aligned strides) and keeps its Triton kernel for everything else.

Why a second kernel: the Triton forward (FlashAttention-2 structure) tops out at ~480 TFLOP/s on
an H100/H200 at B=4 H=32 S=4096 D=128, about 0.8x cuDNN. Its PTX shows why: `tl.dot` waits on the
QK^T result right after issuing it, and the tile's softmax (16K exp2s over a 128 x 128 tile, a
MUFU pipe of 16 a clock: ~1,000 cycles, as long as one of the tile's two GEMMs) runs while the
tensor cores idle. Writing QK^T of the next tile ahead of the softmax in Triton does not help:
the compiler still waits on it at once (NOTES item 43). Gluon exposes the asynchronous wgmma,
its wait, mbarriers, TMA and warp specialisation, so the schedule can be written down:

- a producer warp (24 registers) streams K and V tiles of 128 keys through two-slot rings with
  TMA, each slot guarded by a "ready" mbarrier (TMA byte count) and an "empty" one (both
  consumers release it);
- two consumer warpgroups, 64 query rows each, with no barrier between them: while one runs
  its softmax the other's GEMMs own the tensor cores (FlashAttention-3's ping-pong, here left to
  the warp scheduler);
- inside a consumer, tile j's QK^T and tile j-1's PV are issued back to back and only QK^T is
  waited on before the softmax, so the softmax overlaps the PV GEMM (FA3's intra-warpgroup
  overlap);
- the O tile leaves through shared memory and a TMA store; 4-D descriptors over (B, H, L, D)
  zero-fill rows past a sequence's end and clip the store, so any length works.

Measured (H200, B=4 H=32 S=4096 D=128 bf16, benchmarks/probe_attn_gluon.py): 576-581 TFLOP/s
non-causal (Triton kernel 481, cuDNN 598) and 538-539 causal (Triton 427, cuDNN 525).

Short sequences, where a program does only a few K/V tiles and its fixed cost shows: non-causal
calls up to PERSISTENT_MAX_LEN run a persistent form (one program an SM walking the (query tile,
head) items, O staged apart so one item's store overlaps the next item's work); causal calls at
D <= 64 up to SHORT_CAUSAL_MAX_LEN use 64-key tiles with few enough registers for two programs
an SM (NOTES items 46-49).

The backward, by default, is one fused kernel (attention_bwd_fused_sm90, FlashAttention-3's
form): a program owns 128 keys (64 a consumer warpgroup, dK and dV in its registers) and walks
every query tile of every query head reading them; per tile, five GEMMs (S^T, dP^T, dV += P^T dO,
dK += dS^T Q, and dQ's share dS K, split by head-dim halves between the warpgroups after an
mbarrier exchange of dS^T through shared memory), with dQ summed across key tiles by TMA
reduce-adds into an fp32 buffer. Gluon in Triton 3.6 builds that op (create_async_tma_reduce)
but exports no function for it, hence _tma_reduce_add. On an H200 at B=4 H=32 S=4096 D=128:
5.39 ms against 6.42 for the seven-GEMM form and cuDNN's 5.34 (benchmarks/probe_attn_bwd_fused.py).
The sum's order varies from run to run, so under torch.use_deterministic_algorithms(True) the
backward takes the seven-GEMM form instead: Triton dK/dV kernel plus this file's dQ kernel
(attention_bwd_dq_sm90: 128 query rows a program, S and dP recomputed per 64-key tile, the
previous tile's dQ += dS K issued behind them), bitwise repeatable.

Dropout (DROPOUT; the per-tile forward and the fused backward): each consumer draws the Philox
words of its tile while the tile's GEMMs run, in the accumulator's own layout (ops/attention.py's
_dropout_keep defines the mask so that a thread's scores are whole draws: no draw is computed
twice, no shuffle); the forward zeroes the dropped P before PV, the backward, whose tiles are
transposed, packs its mask to 16 bits a (row, t) through shared memory into S^T's layout. H200,
B4 H32 S4096 D128 bf16 p = 0.1: forward 3.13 ms (Triton 3.39, cuDNN 3.60), backward 7.50 (Triton
11.22, cuDNN 6.72; NOTES items 156-157). The draws are integer work beside the MMAs (+1.4 ms forward,
+2.2 backward over p = 0): the mask costs about what the tensor cores leave free.

Soft cap (SOFTCAP; Gemma 2's c tanh(s / c), the per-tile forward and the fused backward): one
tanh.approx a score beside the exp2, so the MUFU pipe does twice the work a score; the backward
recomputes the tanh for dS's 1 - tanh^2. The switches (cap, dropout, causal) reach the worker
partitions as the shape of a never-read shared-memory stub (_flag_stub): one wrapper for all.
H200, B4 H32/16 S4096 D128 bf16 (NOTES item 159): forward 2.22 ms against 1.82 uncapped (causal
1.20 / 0.93), backward 5.87 against 5.36; the Triton kernels capped 2.62 / 8.46, flex_attention
5.17 / 12.92.
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language._core import builtin
from triton._C.libtriton import ir as _ir

from ..runtime.device import sm_count
from .attention import LOG2E

HALF = 64          # query rows a consumer warpgroup owns (the wgmma M of one warpgroup)
BLOCK_M = 128      # query rows a program owns (two consumers)
BLOCK_N = 128      # keys a K/V tile holds
SLOTS = 2          # K and V ring slots (3 measured no faster: 581 against 576 TFLOP/s)
MAXNREG = 168      # 12 warps x 32 x 168 = the 64K register file; consumers rise to 240, the loader drops to 24
HEAD_DIMS = (64, 128)
# dropout's forward takes this kernel at D 128 only: at D 64 the Philox draws (as many as at D 128)
# outweigh half the MMA work and the Triton kernel is faster (H200, B4 H32 S4096 p 0.1: 2.62 against
# 2.43 ms, causal 1.45 against 1.31; D 128 3.11 against 3.41; NOTES item 156)
DROPOUT_FWD_HEAD_DIMS = (128,)
PERSISTENT_MAX_LEN = 2048   # non-causal calls up to this length take the persistent kernel (NOTES item 46)
SHORT_CAUSAL_MAX_LEN = 2048   # causal D <= 64 calls up to this length: 64-key tiles, two programs an SM (NOTES 48)
SHORT_CAUSAL = dict(block_n=64, maxnreg=80, regs=112)   # 12 warps x 32 x 80 registers = under half the file


@gluon.jit
def _edge_tile(n0, BN: gl.constexpr, len_k, row_lo, CAUSAL: gl.constexpr):
    """Whether key tile [n0, n0 + BN) needs a mask for rows from row_lo: it runs past the last key,
    or (causal) past the first row's diagonal."""
    edge = n0 + BN > len_k
    if CAUSAL:
        edge = edge | (n0 + BN - 1 > row_lo)
    return edge


@gluon.jit
def _visible(rows, cols, n0, len_k, CAUSAL: gl.constexpr):
    """Which (row, key n0 + col) pairs of a tile are attended: keys before the end and, under
    causal, not after the row."""
    ok = (n0 + cols)[None, :] < len_k
    if CAUSAL:
        ok = ok & (rows[:, None] >= (n0 + cols)[None, :])
    return ok


@gluon.jit
def _tanh(x):
    """The hardware's tanh.approx.f32 (one MUFU op; ops/attention.py's _exp2_scores takes the same)."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _scores(s, m_i, l_i, rows, cols, n0, len_k, scale_log2, EDGE: gl.constexpr, CAUSAL: gl.constexpr,
            cap_in=0.0, cap_out=0.0, SOFTCAP: gl.constexpr = False):
    """Online-softmax step on one score tile: new running max and sum, P (unnormalised) and the
    rescale factor of the older accumulator. The mask (keys past the end, keys after the row
    under causal) is applied only on tiles that need it. SOFTCAP: the raw products capped first,
    c tanh(scale s / c) log2(e) with cap_in = scale / c, cap_out = c log2(e)."""
    if SOFTCAP:
        s = _tanh(s * cap_in) * cap_out
    if EDGE:
        s = gl.where(_visible(rows, cols, n0, len_k, CAUSAL), s, -float("inf"))
    if SOFTCAP:
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - m_new[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * scale_log2)
        p = gl.exp2(s * scale_log2 - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _softmax_any(s, m_i, l_i, rows, cols, n0, len_k, row_lo, scale_log2, CAUSAL: gl.constexpr,
                 cap_in=0.0, cap_out=0.0, SOFTCAP: gl.constexpr = False):
    if _edge_tile(n0, s.type.shape[1], len_k, row_lo, CAUSAL):
        p, m_i, l_i, alpha = _scores(s, m_i, l_i, rows, cols, n0, len_k, scale_log2, True, CAUSAL,
                                     cap_in, cap_out, SOFTCAP)
    else:
        p, m_i, l_i, alpha = _scores(s, m_i, l_i, rows, cols, n0, len_k, scale_log2, False, CAUSAL,
                                     cap_in, cap_out, SOFTCAP)
    return p, m_i, l_i, alpha


@gluon.jit
def _tile_program(H, GROUP, len_k, HM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """A per-tile program's work: (b, h, hk, m0, n_tiles) for query rows [m0, m0 + 2 HM) of head h
    (causal: the longest rows first, and only the K/V tiles up to the last row)."""
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * (2 * HM)
    if CAUSAL:
        n_tiles = gl.cdiv(gl.minimum(len_k, m0 + 2 * HM), BN)
    else:
        n_tiles = gl.cdiv(len_k, BN)
    return b, h, h // GROUP, m0, n_tiles


@gluon.jit
def _kv_rings(k_desc, v_desc, NB: gl.constexpr):
    """K and V rings of NB slots with their ready (TMA byte count) and empty (both consumer
    warpgroups arrive) mbarriers."""
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NB] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [NB] + v_desc.block_type.shape, v_desc.layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NB):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    return k_smem, v_smem, k_ready, k_empty, v_ready, v_empty


@gluon.jit
def _stream_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, b, hk, kv, n_tiles):
    """The producer's K/V stream: tiles 0 .. n_tiles - 1 of KV head (b, hk) into ring positions
    kv .. kv + n_tiles - 1, each slot refilled once both consumers released it."""
    BN: gl.constexpr = k_desc.block_type.shape[2]
    NB: gl.constexpr = k_smem.type.shape[0]
    for j in range(n_tiles):
        slot = (kv + j) % NB
        phase = (((kv + j) // NB) & 1) ^ 1           # a fresh barrier counts as phase 1 done
        mbarrier.wait(k_empty.index(slot), phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, j * BN, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, hk, j * BN, 0], v_ready.index(slot), v_smem.index(slot))


# Dropout: the mask ops/attention.py's _dropout_keep defines, drawn in the wgmma accumulator's
# layout. Key j = 32 c + 8 w + 2 t + e of a row takes half e of word w of the Philox draw at counter
# (4 c + t, row, head, batch); in the accumulator of a (rows, keys) tile the thread with lane % 4
# == t holds exactly those keys of its rows, so it draws (its rows) x (keys / 32) times a tile and
# no draw is repeated by another thread. _drop_layout is the accumulator's layout with the columns
# split as (c, w, t, e) (registers: e, row + 8, w, c, row + 64; lanes: t, row; warps: row + 16,
# + 32): the words live on its (row, c, t) slice and spread over (w, e) in registers. The backward
# holds scores transposed (keys as rows): it draws in this layout and moves the mask across.
@gluon.constexpr_function
def _drop_layout(rows, cols):
    rows, cols = int(rows), int(cols)
    reg = [[0, 0, 0, 0, 1], [8, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0]]
    reg += [[0, 1 << i, 0, 0, 0] for i in range((cols // 32).bit_length() - 1)]
    reg += [[64 << i, 0, 0, 0, 0] for i in range((rows // 64).bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=reg, lane_bases=[[0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [1, 0, 0, 0, 0], [2, 0, 0, 0, 0], [4, 0, 0, 0, 0]],
        warp_bases=[[16, 0, 0, 0, 0], [32, 0, 0, 0, 0]], block_bases=[], shape=[rows, cols // 32, 4, 4, 2])


@gluon.constexpr_function
def _axis_layout(layout, dim, rank):
    """The 1-D layout of dim ``dim`` of a rank-``rank`` ``layout``: the others sliced away, the
    highest first, so expand_dims over them in rising order gives ``layout`` back (_index)."""
    for d in reversed(range(int(rank))):
        if d != int(dim):
            layout = gl.SliceLayout(d, layout)
    return layout


@gluon.jit
def _index(N: gl.constexpr, DIM: gl.constexpr, RANK: gl.constexpr, layout: gl.constexpr):
    """0 .. N - 1 along dim DIM of a rank-RANK tensor in ``layout``, of size 1 along the others."""
    x = gl.arange(0, N, layout=_axis_layout(layout, DIM, RANK))
    for d in gl.static_range(RANK):
        if d != DIM:
            x = gl.expand_dims(x, d)
    return x


@gluon.jit
def _philox(k0, k1, c0, c1, c2, c3, ROUNDS: gl.constexpr):
    """Philox-4x32 (Random123's multipliers and key bumps) over uint32 counters, key (k0, k1): the
    same words as Triton's tl.philox."""
    for _ in gl.static_range(ROUNDS):
        a0 = c0
        a2 = c2
        c0 = gl.umulhi(a2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = gl.umulhi(a0, 0xD2511F53) ^ c3 ^ k1
        c1 = a2 * 0xCD9E8D57
        c3 = a0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@gluon.jit
def _philox_key(seed):
    """dropout_seed's int64 key as Philox's two 32-bit key words (low, high)."""
    seed = seed.to(gl.uint64, bitcast=True)
    return (seed & 0xFFFFFFFF).to(gl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(gl.uint32)


@gluon.jit
def _dropout_words(k0, k1, b, h, row_lo, n0, ROWS: gl.constexpr, COLS: gl.constexpr, ROUNDS: gl.constexpr):
    """The four Philox words of each (row, 32-key block, t) of a (ROWS, COLS) score tile (query rows
    from row_lo, keys from n0, a multiple of 32), one a thread in _drop_layout's (row, c, t) slice."""
    L3: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(4, _drop_layout(ROWS, COLS)))
    r3 = row_lo + _index(ROWS, 0, 3, L3)
    c3 = n0 // 32 + _index(COLS // 32, 1, 3, L3)
    t3 = _index(4, 2, 3, L3)
    zero = r3 * 0 + c3 * 0 + t3 * 0
    return _philox(k0, k1, (c3 * 4 + t3 + zero).to(gl.uint32), (r3 + zero).to(gl.uint32),
                   (zero + h).to(gl.uint32), (zero + b).to(gl.uint32), ROUNDS)


@gluon.jit
def _keep5(w0, w1, w2, w3, thr, ROWS: gl.constexpr, COLS: gl.constexpr):
    """The kept-score mask of _dropout_words' words as (row, c, w, t, e) in _drop_layout: score
    (row, 32 c + 8 w + 2 t + e) kept when half e of word w of its draw is >= thr."""
    L5: gl.constexpr = _drop_layout(ROWS, COLS)
    wi = _index(4, 2, 5, L5)
    ei = _index(2, 4, 5, L5)
    x0 = gl.expand_dims(gl.expand_dims(w0, 2), 4)
    x1 = gl.expand_dims(gl.expand_dims(w1, 2), 4)
    x2 = gl.expand_dims(gl.expand_dims(w2, 2), 4)
    x3 = gl.expand_dims(gl.expand_dims(w3, 2), 4)
    word = gl.where(wi == 0, x0, gl.where(wi == 1, x1, gl.where(wi == 2, x2, x3)))      # (row, c, w, t, 1)
    half = gl.where(ei == 0, word & 0xFFFF, word >> 16)                                   # (row, c, w, t, e)
    return half.to(gl.int32) >= thr


@gluon.jit
def _keep(w0, w1, w2, w3, thr, ROWS: gl.constexpr, COLS: gl.constexpr):
    """_keep5's mask as a (ROWS, COLS) tile, laid out as the forward's accumulator."""
    return gl.reshape(_keep5(w0, w1, w2, w3, thr, ROWS, COLS), [ROWS, COLS])


@gluon.jit
def _dropped(p, w0, w1, w2, w3, thr):
    """p (a forward score tile) with the dropped scores zeroed."""
    keep = _keep(w0, w1, w2, w3, thr, p.type.shape[0], p.type.shape[1])
    return gl.where(gl.convert_layout(keep, p.type.layout), p, 0.0)


@gluon.constexpr_function
def _drop_layout_t(keys, queries):
    """A transposed score tile's accumulator layout (keys as rows, the backward's S^T) with the
    key dim split as (c, w, t, e), key = 32 c + 8 w + 2 t + e: registers query + 1, w + 1 (key + 8),
    query + 8, + 16, ...; lanes query + 2, + 4, e, t; warps w + 2 (key + 16), c (key + 32)."""
    keys, queries = int(keys), int(queries)
    assert keys == 64, "a warpgroup's 64 keys"
    reg = [[0, 0, 0, 0, 1], [0, 1, 0, 0, 0]] + [[0, 0, 0, 0, 8 << i] for i in range((queries // 8).bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=reg, lane_bases=[[0, 0, 0, 0, 2], [0, 0, 0, 0, 4], [0, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0]],
        warp_bases=[[0, 2, 0, 0, 0], [1, 0, 0, 0, 0]], block_bases=[], shape=[2, 4, 4, 2, queries])


@gluon.jit
def _pack_keep(w0, w1, w2, w3, thr, mk, QUERIES: gl.constexpr):
    """A transposed tile's mask, first half: from _dropout_words' words for (QUERIES query rows,
    64 keys) each thread packs its 16 scores of a (row, t) into 16 bits (bit 8 c + 2 w + e) and
    stores them in ``mk`` ((4, QUERIES) int16 shared memory, t-major, so a reader's two adjacent
    queries are one 32-bit load; 16-byte vectors XOR-swizzled by t, so neither the writers' nor
    the readers' lanes share a bank). Two registers a thread stay live, not the words."""
    L5: gl.constexpr = _drop_layout(QUERIES, 64)
    keep = _keep5(w0, w1, w2, w3, thr, QUERIES, 64)
    bits = gl.where(keep, 1 << (_index(2, 1, 5, L5) * 8 + _index(4, 2, 5, L5) * 2 + _index(2, 4, 5, L5)), 0)
    packed = gl.reduce_or(gl.reduce_or(gl.reduce_or(bits, 4), 2), 1)             # (row, t)
    mk.store(gl.permute(packed.to(gl.int16), (1, 0)))


@gluon.jit
def _unpack_keep(mk, QUERIES: gl.constexpr):
    """The second half: after a barrier (every thread's _pack_keep stored), the (64 keys, QUERIES)
    kept-score mask in the transposed tile's accumulator layout, each thread reading the words
    its scores need."""
    gl.thread_barrier()
    LT: gl.constexpr = _drop_layout_t(64, QUERIES)
    words = mk.load(gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LT))))
    words = gl.expand_dims(gl.expand_dims(gl.expand_dims(words.to(gl.int32) & 0xFFFF, 0), 1), 3)   # (1, 1, t, 1, q)
    bit = _index(2, 0, 5, LT) * 8 + _index(4, 1, 5, LT) * 2 + _index(2, 3, 5, LT)      # (c, w, 1, e, 1)
    return gl.reshape(((words >> bit) & 1) != 0, [64, QUERIES])


@gluon.jit
def _attend(qs, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, rows, row_lo, len_k, kv, n_tiles, scale_log2,
            CAUSAL: gl.constexpr, k0=0, k1=0, drop_b=0, drop_h=0, drop_thr=0, DROPOUT: gl.constexpr = False,
            ROUNDS: gl.constexpr = 10, cap_in=0.0, cap_out=0.0, SOFTCAP: gl.constexpr = False):
    """QK^T, the online softmax and O += P V over ring tiles kv .. kv + n_tiles - 1 (slots and
    phases count from kv): tile j's QK^T and tile j-1's PV in flight together, only QK^T waited
    on before the softmax. Returns the last tile's P (its PV not issued), O, the row max and sum.
    DROPOUT (Philox key (k0, k1), the batch entry and head its counters take, the threshold): the
    sum takes every P, the PV GEMMs only the kept ones; each tile's Philox words are drawn while
    its QK^T (and the previous tile's PV) run. SOFTCAP (cap_in, cap_out): capped scores (_scores)."""
    HM: gl.constexpr = qs.type.shape[0]
    D: gl.constexpr = qs.type.shape[1]
    BN: gl.constexpr = k_smem.type.shape[3]
    NB: gl.constexpr = k_smem.type.shape[0]
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    scol: gl.constexpr = gl.SliceLayout(0, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    flat_k: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    cols = gl.arange(0, BN, layout=scol)
    zero_s = gl.zeros([HM, BN], gl.float32, s_layout)

    slot = kv % NB
    mbarrier.wait(k_ready.index(slot), (kv // NB) & 1)
    kt = k_smem.index(slot)._reinterpret(dtype, [BN, D], flat_k).permute((1, 0))
    s = warpgroup_mma(qs, kt, zero_s, use_acc=False, is_async=True)
    if DROPOUT:
        w0, w1, w2, w3 = _dropout_words(k0, k1, drop_b, drop_h, row_lo, 0, HM, BN, ROUNDS)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(k_empty.index(slot))
    p, m_i, l_i, alpha = _softmax_any(s, gl.full([HM], -float("inf"), gl.float32, srow),
                                      gl.zeros([HM], gl.float32, srow), rows, cols, 0, len_k, row_lo,
                                      scale_log2, CAUSAL, cap_in, cap_out, SOFTCAP)
    if DROPOUT:
        p = _dropped(p, w0, w1, w2, w3, drop_thr)
    acc = gl.zeros([HM, D], gl.float32, o_layout)
    for j in range(1, n_tiles):
        slot = (kv + j) % NB
        prev = (kv + j - 1) % NB
        mbarrier.wait(k_ready.index(slot), ((kv + j) // NB) & 1)
        kt = k_smem.index(slot)._reinterpret(dtype, [BN, D], flat_k).permute((1, 0))
        s = warpgroup_mma(qs, kt, zero_s, use_acc=False, is_async=True)              # S_j
        pv = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_ready.index(prev), ((kv + j - 1) // NB) & 1)
        vt = v_smem.index(prev)._reinterpret(dtype, [BN, D], flat_k)
        acc = warpgroup_mma(pv, vt, acc, is_async=True)                               # O += P_{j-1} V_{j-1}
        if DROPOUT:
            w0, w1, w2, w3 = _dropout_words(k0, k1, drop_b, drop_h, row_lo, j * BN, HM, BN, ROUNDS)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))                          # S_j done, PV in flight
        mbarrier.arrive(k_empty.index(slot))
        p, m_i, l_i, alpha = _softmax_any(s, m_i, l_i, rows, cols, j * BN, len_k, row_lo, scale_log2, CAUSAL,
                                          cap_in, cap_out, SOFTCAP)
        if DROPOUT:
            p = _dropped(p, w0, w1, w2, w3, drop_thr)
        acc, pv = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pv))
        mbarrier.arrive(v_empty.index(prev))
        acc = acc * gl.convert_layout(alpha, orow)[:, None]
    return p, acc, m_i, l_i


@gluon.jit
def _last_pv(p, acc, v_smem, v_ready, v_empty, t):
    """O += P V of ring tile t (the last tile of an item)."""
    D: gl.constexpr = acc.type.shape[1]
    BN: gl.constexpr = v_smem.type.shape[3]
    NB: gl.constexpr = v_smem.type.shape[0]
    dtype: gl.constexpr = v_smem.dtype
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    pv = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(v_ready.index(t % NB), (t // NB) & 1)
    vt = v_smem.index(t % NB)._reinterpret(dtype, [BN, D], gl.NVMMASharedLayout.get_default_for([BN, D], dtype))
    acc = warpgroup_mma(pv, vt, acc, is_async=True)
    acc, pv = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pv))
    mbarrier.arrive(v_empty.index(t % NB))
    return acc


@gluon.jit
def _flag_stub(SOFTCAP: gl.constexpr, DROPOUT: gl.constexpr, CAUSAL: gl.constexpr):
    """A never-read shared-memory stub whose shape, [1 + SOFTCAP, 1 + DROPOUT, 1 + CAUSAL], carries
    a kernel's switches into its warp partitions (which take no constexpr arguments); they read
    them back from ``flags.type.shape``."""
    return gl.allocate_shared_memory(gl.int8, [1 + SOFTCAP, 1 + DROPOUT, 1 + CAUSAL],
                                     gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))


@gluon.jit
def _consume(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
             lse_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale_log2,
             seed_ptr, drop_thr, drop_scale, drop_b0, flags, cap_in, cap_out,
             WG: gl.constexpr, ROUNDS: gl.constexpr = 10):
    """A consumer warpgroup: query rows [m0 + 64 WG, +64) against every visible K/V tile. The
    switches come as the shape of ``flags`` (_flag_stub): CAUSAL; DROPOUT: the Philox key at
    seed_ptr, batch entries counted from drop_b0, P kept where its 16 bits are >= drop_thr, O
    scaled by drop_scale = 1 / (1 - p), lse the undropped one; SOFTCAP: capped scores (cap_in,
    cap_out; _scores)."""
    SOFTCAP: gl.constexpr = flags.type.shape[0] == 2
    DROPOUT: gl.constexpr = flags.type.shape[1] == 2
    CAUSAL: gl.constexpr = flags.type.shape[2] == 2
    HM: gl.constexpr = q_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    srow: gl.constexpr = gl.SliceLayout(
        1, gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, k_desc.block_type.shape[2], 16]))
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    flat_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HM, D], dtype)

    q_slot = q_smem.index(WG)
    qs = q_slot._reinterpret(dtype, [HM, D], flat_q)
    row_lo = m0 + WG * HM
    rows = row_lo + gl.arange(0, HM, layout=srow)
    mbarrier.wait(q_bar.index(WG), 0)
    if DROPOUT:
        k0, k1 = _philox_key(gl.load(seed_ptr))
        p, acc, m_i, l_i = _attend(qs, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, rows, row_lo, len_k, 0,
                                   n_tiles, scale_log2, CAUSAL, k0, k1, b + drop_b0, h, drop_thr, True, ROUNDS,
                                   cap_in, cap_out, SOFTCAP)
    else:
        p, acc, m_i, l_i = _attend(qs, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, rows, row_lo, len_k, 0,
                                   n_tiles, scale_log2, CAUSAL, cap_in=cap_in, cap_out=cap_out, SOFTCAP=SOFTCAP)
    acc = _last_pv(p, acc, v_smem, v_ready, v_empty, n_tiles - 1)

    if DROPOUT:
        out = acc * (drop_scale / gl.convert_layout(l_i, orow))[:, None]
    else:
        out = acc / gl.convert_layout(l_i, orow)[:, None]
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(lse_ptr + b.to(gl.int64) * slb + h.to(gl.int64) * slh + rows.to(gl.int64) * slm, lse, mask=rows < len_q)
    qs.store(out.to(dtype))                          # Q's slot is free: this warpgroup's QK^T are done
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, row_lo, 0], q_slot)
    tma.store_wait(pendings=0)


@gluon.jit
def _consume_wg1(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                 lse_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale_log2,
                 seed_ptr, drop_thr, drop_scale, drop_b0, flags, cap_in, cap_out):
    # worker partitions take no constexpr arguments (Triton 3.6 flattens a worker's arguments to IR
    # values, and a constexpr there is a bare Python value: tried in session 52), so the switches
    # ride in the shape of ``flags`` and the warpgroup index is this wrapper's
    _consume(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
             lse_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale_log2,
             seed_ptr, drop_thr, drop_scale, drop_b0, flags, cap_in, cap_out, 1)


@gluon.jit
def _load(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
          lse_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale_log2,
          seed_ptr, drop_thr, drop_scale, drop_b0, flags, cap_in, cap_out):
    """The producer warp: both halves of the Q tile, then K_j and V_j into the rings as the
    consumers free the slots (an empty barrier completes when both consumers arrive)."""
    HM: gl.constexpr = q_desc.block_type.shape[2]
    for w in gl.static_range(2):
        mbarrier.expect(q_bar.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, m0 + w * HM, 0], q_bar.index(w), q_smem.index(w))
    _stream_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, b, hk, 0, n_tiles)


@gluon.jit
def _attn_fwd_sm90_kernel(q_desc, k_desc, v_desc, o_desc,   # 4-D (B, H, L, D) TMA descriptors, K/V over (B, Hkv, S, D)
                          lse_ptr, slb, slh, slm,           # lse (B, H, L) fp32 and its strides
                          H, GROUP, len_q, len_k, scale_log2,
                          seed_ptr, drop_thr, drop_scale, drop_b0,   # dropout (DROPOUT only), as _consume takes them
                          cap_in, cap_out,                  # soft cap (SOFTCAP only), as _scores takes them
                          CAUSAL: gl.constexpr, REGS: gl.constexpr, num_warps: gl.constexpr,
                          DROPOUT: gl.constexpr = False, SOFTCAP: gl.constexpr = False):
    HM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    NB: gl.constexpr = 2
    dtype: gl.constexpr = q_desc.dtype
    b, h, hk, m0, n_tiles = _tile_program(H, GROUP, len_k, HM, BN, CAUSAL)
    q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = _kv_rings(k_desc, v_desc, NB)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    args = (q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
            lse_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale_log2,
            seed_ptr, drop_thr, drop_scale, drop_b0, _flag_stub(SOFTCAP, DROPOUT, CAUSAL), cap_in, cap_out)
    WG0: gl.constexpr = 0
    gl.warp_specialize([(_consume, args + (WG0,)), (_consume_wg1, args), (_load, args)], [4, 1], [REGS, 24])


# Persistent form of the forward (non-causal, short sequences)
@gluon.jit
def _work_item(item, n_m, H, GROUP, len_k, HM: gl.constexpr, BN: gl.constexpr):
    """Work item -> (b, h, hk, m0, n_tiles), head by head (a head's K/V stays in L2 while the
    programs in flight share it)."""
    bh = item // n_m
    pid_m = item % n_m
    b = bh // H
    h = bh % H
    m0 = pid_m * (2 * HM)
    return b, h, h // GROUP, m0, gl.cdiv(len_k, BN)


@gluon.jit
def _consume_items(q_desc, k_desc, v_desc, o_desc, q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                   v_ready, v_empty, lse_ptr, slb, slh, slm, H, GROUP, len_q, len_k, n_m, n_items, scale_log2,
                   WG: gl.constexpr):
    """A consumer warpgroup of the persistent (non-causal) kernel: for each work item, query rows
    [m0 + 64 WG, +64) against every K/V tile. Ring slots and phases run on across items (kv
    counts the tiles consumed)."""
    HM: gl.constexpr = q_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    srow: gl.constexpr = gl.SliceLayout(
        1, gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]))
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    flat_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HM, D], dtype)

    qs = q_smem.index(WG)._reinterpret(dtype, [HM, D], flat_q)
    o_slot = o_smem.index(WG)
    os_ = o_slot._reinterpret(dtype, [HM, D], flat_q)
    kv = 0
    it = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, h, hk, m0, n_tiles = _work_item(item, n_m, H, GROUP, len_k, HM, BN)
        row_lo = m0 + WG * HM
        rows = row_lo + gl.arange(0, HM, layout=srow)
        mbarrier.wait(q_ready.index(WG), it & 1)
        p, acc, m_i, l_i = _attend(qs, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, rows, row_lo, len_k, kv,
                                   n_tiles, scale_log2, False)
        mbarrier.arrive(q_empty.index(WG))               # every QK^T of this item is done: Q may be refilled
        acc = _last_pv(p, acc, v_smem, v_ready, v_empty, kv + n_tiles - 1)

        out = acc / gl.convert_layout(l_i, orow)[:, None]
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
        gl.store(lse_ptr + b.to(gl.int64) * slb + h.to(gl.int64) * slh + rows.to(gl.int64) * slm, lse,
                 mask=rows < len_q)
        tma.store_wait(pendings=0)                       # the previous item's O has left the staging slot
        os_.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, h, row_lo, 0], o_slot)
        kv += n_tiles
        it += 1
    tma.store_wait(pendings=0)


@gluon.jit
def _consume_items_wg1(q_desc, k_desc, v_desc, o_desc, q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                       k_empty, v_ready, v_empty, lse_ptr, slb, slh, slm, H, GROUP, len_q, len_k, n_m, n_items,
                       scale_log2):
    _consume_items(q_desc, k_desc, v_desc, o_desc, q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                   k_empty, v_ready, v_empty, lse_ptr, slb, slh, slm, H, GROUP, len_q, len_k, n_m, n_items,
                   scale_log2, 1)


@gluon.jit
def _load_items(q_desc, k_desc, v_desc, o_desc, q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                v_ready, v_empty, lse_ptr, slb, slh, slm, H, GROUP, len_q, len_k, n_m, n_items, scale_log2):
    """The persistent kernel's producer warp: per work item, both halves of the Q tile (once the
    consumers released the last item's), then K_j and V_j into the rings as slots free up."""
    HM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    kv = 0
    it = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, h, hk, m0, n_tiles = _work_item(item, n_m, H, GROUP, len_k, HM, BN)
        for w in gl.static_range(2):
            mbarrier.wait(q_empty.index(w), (it & 1) ^ 1)
            mbarrier.expect(q_ready.index(w), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, h, m0 + w * HM, 0], q_ready.index(w), q_smem.index(w))
        _stream_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, b, hk, kv, n_tiles)
        kv += n_tiles
        it += 1


@gluon.jit
def _attn_fwd_sm90_persistent_kernel(q_desc, k_desc, v_desc, o_desc,   # as _attn_fwd_sm90_kernel's
                                     lse_ptr, slb, slh, slm,
                                     H, GROUP, len_q, len_k, n_m, n_items, scale_log2,   # n_m query tiles a head
                                     num_warps: gl.constexpr):
    """Non-causal, persistent: a program an SM walks the (query tile, head) items pid, pid + grid,
    ... so one item's set-up (its Q load, the last PV, the O store through its own staging
    buffer) overlaps its neighbours' work. Short sequences gain most (B32 H32 S512 D64: 0.233 ->
    0.194 ms on an H200); past 2K the fixed stride's tail costs what it saves."""
    NB: gl.constexpr = 2
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    o_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = _kv_rings(k_desc, v_desc, NB)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    args = (q_desc, k_desc, v_desc, o_desc, q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
            v_ready, v_empty, lse_ptr, slb, slh, slm, H, GROUP, len_q, len_k, n_m, n_items, scale_log2)
    WG0: gl.constexpr = 0
    gl.warp_specialize([(_consume_items, args + (WG0,)), (_consume_items_wg1, args), (_load_items, args)],
                       [4, 1], [240, 24])


# ----------------------------------------------------------------------------------------------
# Backward, dQ: the forward's shape with three GEMMs a tile (S = Q K^T, dP = dO V^T, dQ += dS K).
# S_j and dP_j are issued with dQ_{j-1} behind them and only S_j, dP_j are waited on, so the
# tile's exp2s and dS run under the previous tile's dQ GEMM.
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _dscores(s, dp, lse2, delta, rows, cols, n0, len_k, row_lo, scale_log2, CAUSAL: gl.constexpr):
    """dS = P * (dP - delta) of one tile, P = exp2(S log2(e)/sqrt(d) - lse log2(e)) recomputed
    from the saved lse; masked keys (past the end, after the row under causal) get P = 0."""
    p = gl.exp2(s * scale_log2 - lse2[:, None])
    if _edge_tile(n0, s.type.shape[1], len_k, row_lo, CAUSAL):
        p = gl.where(_visible(rows, cols, n0, len_k, CAUSAL), p, 0.0)
    return p * (dp - delta[:, None])


@gluon.jit
def _dq_consume(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, k_empty,
                v_ready, v_empty, lse_ptr, delta_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles,
                scale, scale_log2, WG: gl.constexpr, CAUSAL: gl.constexpr):
    """A consumer warpgroup: dQ of query rows [m0 + 64 WG, +64); written into its Q slot and out by TMA."""
    HM: gl.constexpr = q_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    NB: gl.constexpr = k_smem.type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    scol: gl.constexpr = gl.SliceLayout(0, s_layout)
    flat_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HM, D], dtype)
    flat_k: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)

    q_slot = q_smem.index(WG)
    qs = q_slot._reinterpret(dtype, [HM, D], flat_q)
    dos = do_smem.index(WG)._reinterpret(dtype, [HM, D], flat_q)
    row_lo = m0 + WG * HM
    rows = row_lo + gl.arange(0, HM, layout=srow)
    cols = gl.arange(0, BN, layout=scol)
    at = b.to(gl.int64) * slb + h.to(gl.int64) * slh + rows.to(gl.int64) * slm
    lse2 = gl.load(lse_ptr + at, mask=rows < len_q, other=float("inf")) * 1.4426950408889634
    delta = gl.load(delta_ptr + at, mask=rows < len_q, other=0.0)
    zero_s = gl.zeros([HM, BN], gl.float32, s_layout)

    mbarrier.wait(q_bar.index(WG), 0)
    mbarrier.wait(k_ready.index(0), 0)
    mbarrier.wait(v_ready.index(0), 0)
    s = warpgroup_mma(qs, k_smem.index(0)._reinterpret(dtype, [BN, D], flat_k).permute((1, 0)), zero_s,
                      use_acc=False, is_async=True)
    dp = warpgroup_mma(dos, v_smem.index(0)._reinterpret(dtype, [BN, D], flat_k).permute((1, 0)), zero_s,
                       use_acc=False, is_async=True)
    s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
    mbarrier.arrive(v_empty.index(0))
    ds = gl.convert_layout(_dscores(s, dp, lse2, delta, rows, cols, 0, len_k, row_lo, scale_log2, CAUSAL).to(dtype),
                           a_layout)
    dq = gl.zeros([HM, D], gl.float32, o_layout)
    for j in range(1, n_tiles):
        slot = j % NB
        prev = (j - 1) % NB
        mbarrier.wait(k_ready.index(slot), (j // NB) & 1)
        mbarrier.wait(v_ready.index(slot), (j // NB) & 1)
        s = warpgroup_mma(qs, k_smem.index(slot)._reinterpret(dtype, [BN, D], flat_k).permute((1, 0)), zero_s,
                          use_acc=False, is_async=True)
        dp = warpgroup_mma(dos, v_smem.index(slot)._reinterpret(dtype, [BN, D], flat_k).permute((1, 0)), zero_s,
                           use_acc=False, is_async=True)
        dq = warpgroup_mma(ds, k_smem.index(prev)._reinterpret(dtype, [BN, D], flat_k), dq, is_async=True)
        s, dp = warpgroup_mma_wait(num_outstanding=1, deps=(s, dp))          # S_j, dP_j done; dQ in flight
        mbarrier.arrive(v_empty.index(slot))
        ds_new = _dscores(s, dp, lse2, delta, rows, cols, j * BN, len_k, row_lo, scale_log2, CAUSAL)
        dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))
        mbarrier.arrive(k_empty.index(prev))
        ds = gl.convert_layout(ds_new.to(dtype), a_layout)
    last = (n_tiles - 1) % NB
    dq = warpgroup_mma(ds, k_smem.index(last)._reinterpret(dtype, [BN, D], flat_k), dq, is_async=True)
    dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))
    mbarrier.arrive(k_empty.index(last))
    qs.store((dq * scale).to(dtype))                 # Q's slot is free: this warpgroup's GEMMs are done
    fence_async_shared()
    tma.async_copy_shared_to_global(q_desc, [b, h, row_lo, 0], q_slot)   # q_desc's twin over dQ: see launcher
    tma.store_wait(pendings=0)


@gluon.jit
def _dq_consume_wg1_full(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, k_empty,
                         v_ready, v_empty, lse_ptr, delta_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles,
                         scale, scale_log2, dq_desc):
    _dq_consume(dq_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready,
                v_empty, lse_ptr, delta_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale, scale_log2,
                1, False)


@gluon.jit
def _dq_consume_wg1_causal(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, k_empty,
                           v_ready, v_empty, lse_ptr, delta_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles,
                           scale, scale_log2, dq_desc):
    _dq_consume(dq_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready,
                v_empty, lse_ptr, delta_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale, scale_log2,
                1, True)


@gluon.jit
def _dq_load(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, k_empty,
             v_ready, v_empty, lse_ptr, delta_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles,
             scale, scale_log2, dq_desc):
    """The producer warp: Q and dO halves (one barrier a half), then K_j and V_j into the rings."""
    HM: gl.constexpr = q_desc.block_type.shape[2]
    for w in gl.static_range(2):
        mbarrier.expect(q_bar.index(w), 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, m0 + w * HM, 0], q_bar.index(w), q_smem.index(w))
        tma.async_copy_global_to_shared(do_desc, [b, h, m0 + w * HM, 0], q_bar.index(w), do_smem.index(w))
    _stream_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, b, hk, 0, n_tiles)


@gluon.jit
def _attn_bwd_dq_sm90_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc,   # 4-D descriptors; dq like q
                             lse_ptr, delta_ptr, slb, slh, slm,        # lse, delta (B, H, L) fp32
                             H, GROUP, len_q, len_k, scale, scale_log2,
                             CAUSAL: gl.constexpr, NB: gl.constexpr, num_warps: gl.constexpr):
    HM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    b, h, hk, m0, n_tiles = _tile_program(H, GROUP, len_k, HM, BN, CAUSAL)
    q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = _kv_rings(k_desc, v_desc, NB)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    args = (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready,
            v_empty, lse_ptr, delta_ptr, slb, slh, slm, b, h, hk, m0, len_q, len_k, n_tiles, scale, scale_log2)
    WG0: gl.constexpr = 0
    # the default partition stores through dq_desc in q_desc's place (same shape and layout)
    dargs = (dq_desc,) + args[1:]
    if CAUSAL:
        gl.warp_specialize([(_dq_consume, dargs + (WG0, CAUSAL)), (_dq_consume_wg1_causal, args + (dq_desc,)),
                            (_dq_load, args + (dq_desc,))], [4, 1], [240, 24])
    else:
        gl.warp_specialize([(_dq_consume, dargs + (WG0, CAUSAL)), (_dq_consume_wg1_full, args + (dq_desc,)),
                            (_dq_load, args + (dq_desc,))], [4, 1], [240, 24])


# ----------------------------------------------------------------------------------------------
# Backward, fused: dK, dV and dQ from one pass (five GEMMs a tile, FlashAttention-3's form).
# A program owns 128 keys (64 a consumer warpgroup, each holding its dK and dV in registers) and
# walks the query tiles of every query head that reads them. Per tile a consumer computes
# S^T = K Q^T and dP^T = V dO^T, then P^T and dS^T, issues dV += P^T dO and dK += dS^T Q from
# registers, and writes dS^T into shared memory; once both halves are there (an mbarrier), each
# warpgroup multiplies dQ's half of the head dim, dQ[:, half] = dS K[:, half], over all 128 keys
# and adds it, scaled, into an fp32 dQ buffer with a TMA reduce-add (cp.reduce.async.bulk.tensor).
# The caller zeroes that buffer and casts it into dq afterwards.
# ----------------------------------------------------------------------------------------------
@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Gluon (Triton 3.6) builds the TMA reduce op but does not export a function for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _dscore_t(pt, dpt, delta1, scol: gl.constexpr, tt, SOFTCAP: gl.constexpr):
    """dS^T = P^T (dP^T - delta) of one step, through the cap's 1 - tanh^2 (tt) under SOFTCAP."""
    ds = pt * (dpt - gl.convert_layout(delta1, scol)[None, :])
    if SOFTCAP:
        ds = ds * (1.0 - tt * tt)
    return ds


@gluon.jit
def _fb_consume(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem,
                ds_smem, st_smem, mk_smem, kv_bar, q_ready, q_empty, ds_ready, ds_empty, lse_ptr, delta_ptr, slb,
                slh, slm,
                b, hk, n0, GROUP, len_q, i_lo, n_i, scale, scale_log2, seed_ptr, drop_thr, drop_scale, drop_b0,
                flags, cap_in, cap_out, WG: gl.constexpr, ROUNDS: gl.constexpr = 10):
    """A consumer warpgroup: dK and dV of keys [n0 + 64 WG, +64), and its half of every dQ tile.
    The switches come as the shape of ``flags`` (_flag_stub), as the forward's _consume takes them.
    DROPOUT (as the forward's _consume): each step draws the forward's mask for its (query tile,
    keys) in the forward's orientation while S^T and dP^T run, and moves it into S^T's layout
    (through shared memory); dV takes the kept P^T scaled by drop_scale, dP^T the same mask and
    scale before dS^T = P^T (dP^T - delta). SOFTCAP: P^T from the capped scores, and dS^T through
    the cap's 1 - tanh^2."""
    SOFTCAP: gl.constexpr = flags.type.shape[0] == 2
    DROPOUT: gl.constexpr = flags.type.shape[1] == 2
    CAUSAL: gl.constexpr = flags.type.shape[2] == 2
    BM: gl.constexpr = q_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    KN: gl.constexpr = k_desc.block_type.shape[2]          # keys a program owns (two warpgroups)
    HN: gl.constexpr = dk_desc.block_type.shape[2]         # keys a warpgroup owns
    DH: gl.constexpr = dqa_desc.block_type.shape[3]        # dQ columns a warpgroup adds
    NQ: gl.constexpr = q_smem.type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DH, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    scol: gl.constexpr = gl.SliceLayout(0, s_layout)
    flat_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], dtype)
    flat_k: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KN, D], dtype)
    flat_dq: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, DH], gl.float32)
    flat_o: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HN, D], dtype)

    k2 = k_smem._reinterpret(dtype, [KN, D], flat_k)
    v2 = v_smem._reinterpret(dtype, [KN, D], flat_k)
    kw = k2.slice(WG * HN, HN, dim=0)                      # this warpgroup's keys, A of S^T
    vw = v2.slice(WG * HN, HN, dim=0)
    kh = k2.slice(WG * DH, DH, dim=1)                      # all keys, this warpgroup's dQ columns
    stage = st_smem.index(WG)
    st2 = stage._reinterpret(gl.float32, [BM, DH], flat_dq)
    key_lo = n0 + WG * HN
    keys = key_lo + gl.arange(0, HN, layout=srow)
    cols = gl.arange(0, BM, layout=scol)
    r1 = gl.arange(0, BM, layout=gl.BlockedLayout([1], [32], [4], [0]))
    zero_s = gl.zeros([HN, BM], gl.float32, s_layout)
    zero_q = gl.zeros([BM, DH], gl.float32, dq_layout)
    dk = gl.zeros([HN, D], gl.float32, kv_layout)
    dv = gl.zeros([HN, D], gl.float32, kv_layout)
    mbarrier.wait(kv_bar, 0)
    n_steps = GROUP * n_i
    for t in range(n_steps):
        g = t // n_i
        m0 = (i_lo + t % n_i) * BM
        h = hk * GROUP + g
        q1 = m0 + r1                                       # lse and delta: one load a thread, then spread
        at = b.to(gl.int64) * slb + h.to(gl.int64) * slh + q1.to(gl.int64) * slm
        lse1 = gl.load(lse_ptr + at, mask=q1 < len_q, other=float("inf"))
        delta1 = gl.load(delta_ptr + at, mask=q1 < len_q, other=0.0)
        slot = t % NQ
        mbarrier.wait(q_ready.index(slot), (t // NQ) & 1)
        q2 = q_smem.index(slot)._reinterpret(dtype, [BM, D], flat_q)
        do2 = do_smem.index(slot)._reinterpret(dtype, [BM, D], flat_q)
        st = warpgroup_mma(kw, q2.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dpt = warpgroup_mma(vw, do2.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if DROPOUT:
            # the key is loaded each step (volatile: not hoisted), so its ten round keys are not
            # 20 loop-invariant registers, which spilled
            k0, k1 = _philox_key(gl.load(seed_ptr, volatile=True))
            w0, w1, w2, w3 = _dropout_words(k0, k1, b + drop_b0, h, m0, key_lo, BM, HN, ROUNDS)
            _pack_keep(w0, w1, w2, w3, drop_thr, mk_smem.index(WG), BM)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        lse2 = gl.convert_layout(lse1, scol) * 1.4426950408889634
        tt = st           # (unused without the cap)
        if SOFTCAP:
            tt = _tanh(st * cap_in)
            pt = gl.exp2(tt * cap_out - lse2[None, :])
        else:
            pt = gl.exp2(st * scale_log2 - lse2[None, :])
        if CAUSAL:
            if m0 < key_lo + HN:                           # a tile on the diagonal: keys after the row get P = 0
                pt = gl.where((m0 + cols)[None, :] >= keys[:, None], pt, 0.0)
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
        if DROPOUT:
            keep = gl.convert_layout(_unpack_keep(mk_smem.index(WG), BM), s_layout)
            dpt = gl.where(keep, dpt * drop_scale, 0.0)
            dst = _dscore_t(pt, dpt, delta1, scol, tt, SOFTCAP).to(dtype)
            pa = gl.convert_layout(gl.where(keep, pt * drop_scale, 0.0).to(dtype), a_layout)
        else:
            dst = _dscore_t(pt, dpt, delta1, scol, tt, SOFTCAP).to(dtype)
            pa = gl.convert_layout(pt.to(dtype), a_layout)
        da = gl.convert_layout(dst, a_layout)
        dv = warpgroup_mma(pa, do2, dv, is_async=True)
        dk = warpgroup_mma(da, q2, dk, is_async=True)
        dslot = t % 2
        mbarrier.wait(ds_empty.index(dslot), ((t // 2) & 1) ^ 1)
        ds_smem.index(dslot).slice(WG * HN, HN, dim=0).store(dst)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_ready.index(dslot))
        mbarrier.wait(ds_ready.index(dslot), (t // 2) & 1)
        dq = warpgroup_mma(ds_smem.index(dslot).permute((1, 0)), kh, zero_q, use_acc=False, is_async=True)
        dv, dk, dq, pa, da = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, pa, da))
        mbarrier.arrive(q_empty.index(slot))
        mbarrier.arrive(ds_empty.index(dslot))
        tma.store_wait(pendings=0)                         # the last reduce has read the staging tile
        st2.store(dq * scale)
        fence_async_shared()
        _tma_reduce_add(dqa_desc, [b, h, m0, WG * DH], stage)
    tma.store_wait(pendings=0)
    o2 = stage._reinterpret(dtype, [HN, D], flat_o)
    o2.store((dk * scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, hk, key_lo, 0], stage._reinterpret(dtype, dk_desc.block_type.shape,
                                                                                     dk_desc.layout))
    tma.store_wait(pendings=0)
    o2.store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dv_desc, [b, hk, key_lo, 0], stage._reinterpret(dtype, dv_desc.block_type.shape,
                                                                                     dv_desc.layout))
    tma.store_wait(pendings=0)


@gluon.jit
def _fb_consume_wg1(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem,
                    ds_smem, st_smem, mk_smem, kv_bar, q_ready, q_empty, ds_ready, ds_empty, lse_ptr, delta_ptr,
                    slb, slh, slm, b, hk, n0, GROUP, len_q, i_lo, n_i, scale, scale_log2,
                    seed_ptr, drop_thr, drop_scale, drop_b0, flags, cap_in, cap_out):
    # the second warpgroup (worker partitions take no constexpr arguments: see _consume_wg1)
    _fb_consume(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem,
                ds_smem, st_smem, mk_smem, kv_bar, q_ready, q_empty, ds_ready, ds_empty, lse_ptr, delta_ptr,
                slb, slh, slm, b, hk, n0, GROUP, len_q, i_lo, n_i, scale, scale_log2,
                seed_ptr, drop_thr, drop_scale, drop_b0, flags, cap_in, cap_out, 1)


@gluon.jit
def _fb_load(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem,
             ds_smem, st_smem, mk_smem, kv_bar, q_ready, q_empty, ds_ready, ds_empty, lse_ptr, delta_ptr, slb, slh, slm,
             b, hk, n0, GROUP, len_q, i_lo, n_i, scale, scale_log2, seed_ptr, drop_thr, drop_scale, drop_b0,
             flags, cap_in, cap_out):
    """The producer warp: the program's K and V once, then Q and dO of each step into the ring."""
    BM: gl.constexpr = q_desc.block_type.shape[2]
    NQ: gl.constexpr = q_smem.type.shape[0]
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, hk, n0, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [b, hk, n0, 0], kv_bar, v_smem)
    for t in range(GROUP * n_i):
        h = hk * GROUP + t // n_i
        m0 = (i_lo + t % n_i) * BM
        slot = t % NQ
        mbarrier.wait(q_empty.index(slot), ((t // NQ) & 1) ^ 1)
        mbarrier.expect(q_ready.index(slot), 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, m0, 0], q_ready.index(slot), q_smem.index(slot))
        tma.async_copy_global_to_shared(do_desc, [b, h, m0, 0], q_ready.index(slot), do_smem.index(slot))


@gluon.jit
def _attn_bwd_fused_sm90_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc,
                                lse_ptr, delta_ptr, slb, slh, slm, HK, GROUP, len_q, len_k, scale, scale_log2,
                                seed_ptr, drop_thr, drop_scale, drop_b0,   # dropout (DROPOUT only), as the forward's
                                cap_in, cap_out,                  # soft cap (SOFTCAP only), as the forward's
                                CAUSAL: gl.constexpr, NQ: gl.constexpr, REVERSE: gl.constexpr,
                                num_warps: gl.constexpr, DROPOUT: gl.constexpr = False, SOFTCAP: gl.constexpr = False):
    BM: gl.constexpr = q_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    KN: gl.constexpr = k_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    pid_n = gl.program_id(0)                               # causal: key tile 0 sees the most query tiles
    if REVERSE:
        pid_n = gl.num_programs(0) - 1 - pid_n
    bh = gl.program_id(1)
    b = bh // HK
    hk = bh % HK
    n0 = pid_n * KN
    n_i_all = gl.cdiv(len_q, BM)
    if CAUSAL:
        i_lo = gl.minimum(n0 // BM, n_i_all)
    else:
        i_lo = n0 * 0
    n_i = n_i_all - i_lo
    q_smem = gl.allocate_shared_memory(dtype, [NQ] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NQ] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, KN, BM], gl.NVMMASharedLayout.get_default_for([KN, BM], dtype))
    st_smem = gl.allocate_shared_memory(gl.float32, [2] + dqa_desc.block_type.shape, dqa_desc.layout)
    if DROPOUT:                                            # each warpgroup's packed mask (_keep_transposed)
        mk_smem = gl.allocate_shared_memory(gl.int16, [2, 4, BM], gl.SwizzledSharedLayout(8, 1, 4, [1, 0]))
    else:
        mk_smem = st_smem
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NQ, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NQ, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(NQ):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(ds_empty.index(i), count=2)
    args = (q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem,
            ds_smem, st_smem, mk_smem, kv_bar, q_ready, q_empty, ds_ready, ds_empty, lse_ptr, delta_ptr, slb, slh, slm,
            b, hk, n0, GROUP, len_q, i_lo, n_i, scale, scale_log2, seed_ptr, drop_thr, drop_scale, drop_b0,
            _flag_stub(SOFTCAP, DROPOUT, CAUSAL), cap_in, cap_out)
    WG0: gl.constexpr = 0
    gl.warp_specialize([(_fb_consume, args + (WG0,)), (_fb_consume_wg1, args), (_fb_load, args)], [4, 1], [240, 24])


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, d: int, dtype: torch.dtype):
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], gdt)


def _desc(t: torch.Tensor, rows: int, cols: int | None = None) -> TensorDescriptor:
    """A 4-D descriptor over (B, H, L, D) ``t`` whose box is ``rows`` x ``cols`` (default: all of D)."""
    cols = cols or t.shape[-1]
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols], _smem_layout(rows, cols, t.dtype))


def covers(q, k, v, mask, cu_q, win_left: int, win_right: int, bottom_right: bool) -> bool:
    """Whether this kernel takes the call: a dense Hopper call without a user mask or window."""
    if cu_q is not None or mask is not None or win_left >= 0 or win_right > 0:
        return False
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] not in HEAD_DIMS:
        return False
    L, S = q.shape[2], k.shape[2]
    if L == 0 or S == 0 or (win_right == 0 and bottom_right and L != S):
        return False
    return all(tma_ok(t) for t in (q, k, v))


def tma_ok(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address ``t`` as it is: unit last stride, a 16-byte aligned
    base, and every other stride positive and a multiple of 16 bytes (an expanded gradient's
    zero strides are not, so such a tensor goes to the Triton kernels)."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s > 0 and s * t.element_size() % 16 == 0 for s in t.stride()[:-1]))


DQ_BLOCK_N = 64    # keys a K/V tile of the dQ kernel holds (three score-sized tiles live: S, dP, dS);
DQ_BLOCK_N_D64 = 128   # at D 64 a 128-key tile fits without spills: 1-4% faster (probe_attn_bwd_tiles)
DQ_SLOTS = 3       # K is held a tile longer than V (its dQ GEMM runs under the next tile)


def attention_bwd_dq_sm90(do, q, k, v, lse, delta, dq, scale: float, causal: bool, block_n: int | None = None) -> None:
    """dq = scale * dS K for (B, H, L, D) q, do, dq and (B, Hkv, S, D) k, v, with dS recomputed
    from the saved lse and delta = rowsum(O dO) - dlse; the caller checked ``covers`` for every
    tensor."""
    B, H, L, D = q.shape
    bn = block_n or (DQ_BLOCK_N_D64 if D <= 64 else DQ_BLOCK_N)
    grid = (triton.cdiv(L, BLOCK_M), B * H)
    _attn_bwd_dq_sm90_kernel[grid](
        _desc(q, HALF), _desc(do, HALF), _desc(k, bn), _desc(v, bn), _desc(dq, HALF),
        lse, delta, lse.stride(0), lse.stride(1), lse.stride(2),
        H, H // k.shape[1], L, k.shape[2], scale, scale * LOG2E,
        CAUSAL=causal, NB=DQ_SLOTS, num_warps=4, maxnreg=MAXNREG)


def attention_fwd_sm90(q, k, v, o, lse, scale: float, causal: bool, block_n: int | None = None,
                       maxnreg: int | None = None, regs: int | None = None, dropout=None, softcap=None) -> None:
    """o, lse = attention(q, k, v) for (B, H, L, D) q and (B, Hkv, S, D) k, v, written in place
    (o like q, 16-byte aligned; lse (B, H, L) fp32). The caller checked ``covers``. Non-causal
    calls with L <= PERSISTENT_MAX_LEN take the persistent kernel, the rest a program a tile;
    causal calls at D <= 64 with L <= SHORT_CAUSAL_MAX_LEN use 64-key tiles and 80 registers a
    thread at launch (the consumers rise to 112), so two programs share an SM. ``block_n``,
    ``maxnreg`` and ``regs`` (the consumers' registers) override the choice, for the probes.
    ``dropout``: (seed tensor, threshold, keep scale, first batch index) as ops/attention.py's
    launcher passes them; such calls take the per-tile kernel with 128-key tiles, as do capped ones
    (``softcap``: (cap_in, cap_out), _scores')."""
    B, H, L, D = q.shape
    if dropout is not None or softcap is not None:
        block_n = BLOCK_N          # neither the short causal form nor the persistent kernel below
    if causal and D <= 64 and L <= SHORT_CAUSAL_MAX_LEN and block_n is None:
        block_n, maxnreg, regs = SHORT_CAUSAL["block_n"], SHORT_CAUSAL["maxnreg"], SHORT_CAUSAL["regs"]
    n_m = triton.cdiv(L, BLOCK_M)
    bn = block_n or BLOCK_N
    descs = (_desc(q, HALF), _desc(k, bn), _desc(v, bn), _desc(o, HALF))
    lse_args = (lse, lse.stride(0), lse.stride(1), lse.stride(2))
    if not causal and L <= PERSISTENT_MAX_LEN and block_n is None:
        n_items = n_m * B * H
        sms = sm_count(q.device.index)
        _attn_fwd_sm90_persistent_kernel[(min(n_items, sms),)](
            *descs, *lse_args, H, H // k.shape[1], L, k.shape[2], n_m, n_items, scale * LOG2E,
            num_warps=4, maxnreg=MAXNREG)
        return
    _attn_fwd_sm90_kernel[(n_m, B * H)](
        *descs, *lse_args, H, H // k.shape[1], L, k.shape[2], scale * LOG2E, *(dropout or (lse, 0, 1.0, 0)),
        *(softcap or (0.0, 0.0)), CAUSAL=causal, REGS=regs or 240, num_warps=4, maxnreg=maxnreg or MAXNREG,
        DROPOUT=dropout is not None, SOFTCAP=softcap is not None)


FUSED_SLOTS = 2     # Q/dO ring slots of the fused backward (3 measured the same at D 64; no room at D 128)
FUSED_BLOCK_M_D64_FULL = 128   # query rows a step at D 64 without causal: 6-7% faster; causal 6-10% slower (NOTES 49)
FUSED_BACKWARD = True   # the probes switch it off to time the seven-GEMM form


def attention_bwd_fused_sm90(do, q, k, v, lse, delta, dq_acc, dk, dv, scale: float, causal: bool,
                             block_m: int | None = None, reverse: bool = False, dropout=None, softcap=None) -> None:
    """dk, dv written and dq_acc (fp32, (B, H, L, D), zeroed by the caller) accumulated with
    scale * dS K, all from one pass over the key tiles (see _attn_bwd_fused_sm90_kernel); the
    caller casts dq_acc into dq. The caller checked ``covers`` and ``tma_ok`` for every tensor.
    ``dropout``: (seed tensor, threshold, keep scale, first batch index), as the forward's;
    ``softcap``: (cap_in, cap_out), as the forward's."""
    B, H, L, D = q.shape
    HK, S = k.shape[1], k.shape[2]
    bm = block_m or (FUSED_BLOCK_M_D64_FULL if D <= 64 and not causal else HALF)
    grid = (triton.cdiv(S, 2 * HALF), B * HK)
    _attn_bwd_fused_sm90_kernel[grid](
        _desc(q, bm), _desc(do, bm), _desc(k, 2 * HALF), _desc(v, 2 * HALF), _desc(dk, HALF), _desc(dv, HALF),
        _desc(dq_acc, bm, D // 2), lse, delta, lse.stride(0), lse.stride(1), lse.stride(2),
        HK, H // HK, L, S, scale, scale * LOG2E, *(dropout or (lse, 0, 1.0, 0)), *(softcap or (0.0, 0.0)),
        CAUSAL=causal, NQ=FUSED_SLOTS, REVERSE=reverse, num_warps=4, maxnreg=MAXNREG, DROPOUT=dropout is not None,
        SOFTCAP=softcap is not None)
