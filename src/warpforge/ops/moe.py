"""Mixture of Experts: the routed SwiGLU experts of a DeepSeek/Qwen/Mixtral-style MoE layer, forward and
backward, as grouped GEMMs over tokens sorted by expert.

    for each token t and each of its k choices j (expert e = ids[t, j], weight w[t, j]):
        z_g = x[t] @ Wg[e]^T,  z_u = x[t] @ Wu[e]^T          (gate and up: w_gate_up[e] = [Wg; Wu], (2n, d))
        h   = silu(z_g) * z_u                                  (n)
        out[t] += w[t, j] * h @ Wd[e]^T                        (w_down[e]: (d, n))

FLOP model (no padding counted): forward 6*T*k*d*n (three GEMMs of 2*T*k*d*n), backward 12*T*k*d*n
(dX and dW of each), forward+backward 18*T*k*d*n. Bytes: every active expert's weights once,
3*E_active*d*n*s, plus x and out: at training sizes (T = 8192, k = 6, d = 2048, n = 1408 in bf16:
0.43 TFLOP over 1.2 GB, ~360 FLOP/byte) the experts are compute bound (an H100's ridge is ~300);
at decode (T <= 256) they stream weights and the roof is the copy bandwidth.

How the work is laid out, and why:

- *Alignment without a host sync.* Each (token, choice) pair is a *slot*, s = t*k + j. The slots are
  sorted by expert, stably (token order inside an expert), into a padded row space where every
  expert starts on a multiple of the GEMM tile height BLOCK_M. Three small kernels do it: a
  histogram per chunk of 128 slots, one program that turns the chunk histograms into prefix sums
  (the expert offsets, and which expert owns each BLOCK_M-row tile), and a scatter that places every
  slot at offset + rank (rank among the same expert's slots of its chunk: a 128 x 128 compare).
  At decode sizes (up to MOE_ALIGN_ONE_MAX slots) one program does all of it instead, ranking the
  slots by one sort of (expert, slot) keys: the three launches' latency is most of their cost there.
  The row count is never copied to the host: the GEMMs' grids are sized to the upper bound,
  ceil(T*k / BLOCK_M) + min(E, T*k) tiles, and a tile no expert owns exits at once. (Liger's fused
  MoE syncs here; the torch._grouped_mm pipeline's bincount/argsort path does not need to.)
- *Gather fused into the first GEMM.* A row of the up-projection tile is x[slot // k]: the A loads
  read the token rows directly (no (T*k, d) gathered copy of x is written or read back).
- *Gate and up in one program, SwiGLU in its epilogue.* A program holds a BLOCK_M x BLOCK_N gate
  accumulator and the matching up accumulator (columns n apart in w_gate_up), shares every A tile
  between the two dots, and writes h = silu(z_g) * z_u once. The pre-activations z = [z_g, z_u] are
  written only when a backward will need them (bf16, (rows, 2n): less than the (T*k, d) gathered x
  + (T*k, 2n) + (T*k, n) + (T*k, d) the torch._grouped_mm pipeline's autograd keeps).
- *Down projection with the routing weight in the epilogue*, into the padded rows; then a combine
  kernel sums each token's k rows in a fixed order, in fp32: deterministic, bit for bit, no atomics.
- *Backward* (rows in the same padded order, from the saved metadata and z):
    g  = dout[t] @ Wd[e]                 (grouped GEMM, gather of dout fused)          (rows, n)
    a row-wise pass: h = silu(z_g) * z_u recomputed, dw[s] = g . h (the routing weight's gradient
    without ever storing the experts' outputs), dh = w * g, dz_g = dh * z_u * silu'(z_g),
    dz_u = dh * silu(z_g), hw = w * h (fused into the GEMM's epilogue instead, this pass measured
    3x slower: NOTES.md)
    dWd[e] = dout[rows]^T @ hw[rows]      (K = the expert's rows: a grouped GEMM with a variable K)
    dWgu[e] = dz[rows]^T @ x[rows]        (idem, x gathered)
    dx[t] = sum_j (dz @ Wgu[e])[s]       (grouped GEMM into the padded rows, then the combine)
  An expert with no tokens gets an exact-zero weight gradient (its K loop is empty; the tile is
  still written). Padding rows are exact zeros in every intermediate (their A loads are masked), so
  the weight-gradient loops need no row masks for them.
- Ids outside [0, E) never cause an out-of-bounds access: the kernels drop such slots (they get no
  row and add nothing). ``validate=True`` (the default) raises on them first, with one host sync.

The decode path (T <= 256) is the same pipeline with BLOCK_M = 16 (or 32/64 as the rows per expert
grow; a tile with room to spare, since each extra row tile of an expert streams its weights again)
and K tiles of 128: each program streams a strip of an expert's weights, the tokens of that expert
riding along as the M side of the dot. Where decode reaches 128-row tiles on the Hopper path
(Mixtral T = 256: ``swap_path``), A and B are swapped instead (``_moe_swap_kernel``): the weights
are the MMA's M side and an expert's tokens its N side, 64 rows where a tile has that few, so
the tiles' padding rows are neither multiplied nor stored.

The Hopper path (sm_90+, fp16/bf16; every call with 128-row tiles, and Mixtral-sized experts at 32-
and 64-row tiles: ``tma_path``) runs the same steps with every GEMM operand a TMA box:
- the gathered operands are materialised once in the padded row order (``_moe_gather_kernel``:
  x for gate/up -- gathered again in the backward for dW_gate_up -- and dout for dgrad and dW_down;
  zeros on padding rows), ~0.1 ms at DeepSeek-V2-Lite T = 8192 against ~1 ms of gate/up GEMM;
- the weights are read as one (E * R, C) matrix; a partial column tile's extra rows are the next
  expert's (or zero-filled past the end) and only feed masked columns; along K the boxes walk
  B's rows only where d and 2n are multiples of 128, so they never cross an expert;
- the row GEMMs are persistent (one program an SM over the used tiles, whose count is read from
  the device: no host sync), tile and K loops flattened into one software pipeline; gate/up reads
  w_gate_up as (E, 2, n, d), so one box brings a column tile's gate and up rows and one
  [128, 256] accumulator takes both (two 128 x 128 ones left ptxas no registers for the flattened
  loop: it serialised their wgmmas);
- the weight gradients take (expert, tile) programs whose K loop runs over the expert's padded
  rows, A read transposed from its box.
The K order of every sum is the pointer kernels', so the two paths agree bit for bit (H200,
benchmarks/NOTES.md, items 53 and 57); the Hopper kernels run 1.1-1.9x faster per GEMM.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..runtime import interpreting, new_empty, unit_last_dim
from ..runtime.amp import autocast_inputs
from ..runtime.checks import check_same, check_tensor, host_sync_unavailable
from ..runtime.device import sm_count
from ..runtime.heuristics import (MOE_ALIGN_CHUNK, MOE_ALIGN_ONE_MAX, MOE_ALIGN_ONE_WORK, MOE_SWAP, MOE_SWAP_MAX_ROWS, MoEConfig, gemm_configs,
                                  moe_block_m, moe_config, moe_tma_config)
from ..runtime.launch import LaunchCache, gdc_launch_dependents, gdc_wait, launch_fitting, pdl_supported
from ..runtime.registry import Op
from .matmul import _column_halves, _dot, _precision, _tile_coords, _tma_store_tile, _tma_view, _upcast

MOE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_EXPERTS = 4096


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def moe_experts_reference(x, w_gate_up, w_down, topk_weights, topk_ids) -> torch.Tensor:
    """Ground truth: a per-expert loop in float64 (float32 on GPUs), cast back to x's dtype."""
    wide = torch.float64 if x.device.type == "cpu" else torch.float32
    d = x.shape[-1]
    xs = x.reshape(-1, d).to(wide)
    k = topk_ids.shape[-1]
    ids = topk_ids.reshape(-1, k).long()
    wts = topk_weights.reshape(-1, k).to(wide)
    n = w_gate_up.shape[1] // 2
    out = torch.zeros_like(xs)
    for e in range(w_gate_up.shape[0]):
        tok, j = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        z = xs[tok] @ w_gate_up[e].to(wide).T
        h = torch.nn.functional.silu(z[:, :n]) * z[:, n:]
        out.index_add_(0, tok, (h @ w_down[e].to(wide).T) * wts[tok, j, None])
    return out.to(x.dtype).reshape(x.shape)


# ----------------------------------------------------------------------------------------------
# Triton kernels: alignment
# ----------------------------------------------------------------------------------------------
@triton.jit
def _pdl_start(PDL: tl.constexpr):
    """A forward decode kernel's first step when its launch is a programmatic dependent of the one
    before it (``_pdl``; PDL 1 or 2): wait for that grid to finish (its writes visible) before any
    memory access. PDL 1 then lets the next launch's programs start at once (they take the SMs'
    free slots and wait there); PDL 2 lets it start only as each program ends (``_pdl_end``)."""
    if PDL != 0:
        gdc_wait()
    if PDL == 1:
        gdc_launch_dependents()


@triton.jit
def _pdl_end(PDL: tl.constexpr):
    """A PDL 2 kernel's last step: this program no longer holds the next launch back (a program
    that returns early releases it by ending)."""
    if PDL == 2:
        gdc_launch_dependents()


@triton.jit
def _moe_count_kernel(
    ids_ptr,            # (S,) int32 expert of each slot
    chunk_ptr,          # (chunks, E) int32 out: per-chunk histogram
    sorted_ptr,         # (P,) int32 out: filled with -1 here (padding), the scatter overwrites real rows
    S, P, fill_per,
    E: tl.constexpr, NB: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = 0,
):
    _pdl_start(PDL)
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < S, other=E)
    ok = (offs < S) & (ids >= 0) & (ids < E)
    hist = tl.histogram(tl.where(ok, ids, 0), NB, mask=ok)
    bins = tl.arange(0, NB)
    tl.store(chunk_ptr + c * E + bins, hist, mask=bins < E)
    lo = c * fill_per
    for r in range(0, fill_per, CHUNK):
        rows = lo + r + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + rows, tl.full([CHUNK], -1, tl.int32), mask=(rows < P) & (rows < lo + fill_per))
    _pdl_end(PDL)


@triton.jit
def _moe_offsets_kernel(
    chunk_ptr,          # (chunks, E) int32: histograms in, exclusive prefix over chunks out
    counts_ptr,         # (E,) int32 out: slots per expert
    start_ptr,          # (E + 1,) int32 out: first padded row of each expert (and the padded total)
    tile_expert_ptr,    # (tiles_max,) int32 out: expert owning each BLOCK_M-row tile, -1 past the end
    chunks, tiles_max,
    E: tl.constexpr, NB: tl.constexpr, BLOCK_M: tl.constexpr, CB: tl.constexpr, TB: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    _pdl_start(PDL)
    bins = tl.arange(0, NB)
    emask = bins < E
    running = tl.zeros([NB], dtype=tl.int32)
    for c0 in range(0, chunks, CB):
        rows = c0 + tl.arange(0, CB)
        ptrs = chunk_ptr + rows[:, None] * E + bins[None, :]
        m = (rows < chunks)[:, None] & emask[None, :]
        hist = tl.load(ptrs, mask=m, other=0)
        incl = tl.cumsum(hist, axis=0)
        tl.store(ptrs, incl - hist + running[None, :], mask=m)
        running += tl.sum(hist, axis=0)
    tl.store(counts_ptr + bins, running, mask=emask)
    _moe_layout(running, emask, start_ptr, tile_expert_ptr, tiles_max, E, BLOCK_M, TB)
    _pdl_end(PDL)


@triton.jit
def _moe_layout(counts, emask, start_ptr, tile_expert_ptr, tiles_max, E: tl.constexpr, BLOCK_M: tl.constexpr,
                TB: tl.constexpr):
    """From the slots per expert ([NB], emask: the real experts): each expert's first padded row
    (and the padded total at E), and the owner of every BLOCK_M-row tile (-1 past the end).
    Returns the first padded rows ([NB])."""
    tiles = tl.where(emask, (counts + BLOCK_M - 1) // BLOCK_M, 0)
    tile_end = tl.cumsum(tiles, axis=0)
    bins = tl.arange(0, counts.shape[0])
    first = (tile_end - tiles) * BLOCK_M
    tl.store(start_ptr + bins, first, mask=emask)
    tl.store(start_ptr + E, tl.sum(tiles, axis=0) * BLOCK_M)
    for t0 in range(0, tiles_max, TB):
        t = t0 + tl.arange(0, TB)
        owner = tl.sum(((tile_end[None, :] <= t[:, None]) & emask[None, :]).to(tl.int32), axis=1)
        tl.store(tile_expert_ptr + t, tl.where(owner < E, owner, -1), mask=t < tiles_max)
    return first


@triton.jit
def _moe_align_one_kernel(
    ids_ptr,            # (S,) int32 expert of each slot
    sorted_ptr, pos_ptr, counts_ptr, start_ptr, tile_expert_ptr,   # out: as the three kernels above
    S, P, tiles_max,
    E: tl.constexpr, NB: tl.constexpr, SB: tl.constexpr, BLOCK_M: tl.constexpr, TB: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """The whole alignment in one program, for S <= SB slots (decode, where the three launches of
    count, offsets and scatter cost more than the work): the histogram of all slots, the layout,
    then one sort of (expert, slot) keys. A slot's rank within its expert is its place in the
    sorted order less the slots of the experts before it, so the ranks take no serial loop."""
    _pdl_start(PDL)
    lane = tl.arange(0, SB)
    ids = tl.load(ids_ptr + lane, mask=lane < S, other=-1)
    ok = (lane < S) & (ids >= 0) & (ids < E)
    counts = tl.histogram(tl.where(ok, ids, 0), NB, mask=ok)
    emask = tl.arange(0, NB) < E
    tl.store(counts_ptr + tl.arange(0, NB), counts, mask=emask)
    first = _moe_layout(counts, emask, start_ptr, tile_expert_ptr, tiles_max, E, BLOCK_M, TB)
    before = tl.cumsum(counts, axis=0) - counts                   # slots of the experts before each
    key = tl.sort(tl.where(ok, ids, E) * SB + lane)              # dropped slots (expert E) sort last
    slot = key % SB
    e = key // SB
    valid = e < E
    e = tl.where(valid, e, 0)
    pos = tl.gather(first, e, 0) + lane - tl.gather(before, e, 0)
    for r0 in range(0, P, SB):
        tl.store(sorted_ptr + r0 + lane, tl.full([SB], -1, tl.int32), mask=r0 + lane < P)
    tl.debug_barrier()              # the -1 fill before the real rows land on it
    tl.store(sorted_ptr + pos, slot, mask=valid)
    tl.store(pos_ptr + slot, tl.where(valid, pos, -1), mask=slot < S)
    _pdl_end(PDL)


@triton.jit
def _moe_scatter_kernel(
    ids_ptr,            # (S,) int32
    chunk_ptr,          # (chunks, E) int32: slots of each expert in earlier chunks
    start_ptr,          # (E + 1,) int32
    sorted_ptr,         # (P,) int32 out: slot of each padded row
    pos_ptr,            # (S,) int32 out: padded row of each slot (-1: dropped, id out of range)
    S,
    E: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = 0,
):
    _pdl_start(PDL)
    c = tl.program_id(0)
    lane = tl.arange(0, CHUNK)
    offs = c * CHUNK + lane
    ids = tl.load(ids_ptr + offs, mask=offs < S, other=-1)
    ok = (offs < S) & (ids >= 0) & (ids < E)
    e = tl.where(ok, ids, 0)
    # rank among the earlier slots of this chunk with the same expert: a CHUNK x CHUNK compare
    same = (ids[:, None] == ids[None, :]) & (lane[None, :] < lane[:, None]) & ok[None, :]
    rank = tl.sum(same.to(tl.int32), axis=1)
    base = tl.load(chunk_ptr + c * E + e, mask=ok, other=0) + tl.load(start_ptr + e, mask=ok, other=0)
    pos = base + rank
    tl.store(sorted_ptr + pos, offs, mask=ok)
    tl.store(pos_ptr + offs, tl.where(ok, pos, -1), mask=offs < S)
    _pdl_end(PDL)


# ----------------------------------------------------------------------------------------------
# Triton kernels: grouped GEMMs and the combine
# ----------------------------------------------------------------------------------------------
@triton.jit
def _moe_epilogue(acc, acc_u, rows64, offs_n, N, c_ptr, s_cm, z_ptr, s_zm, w_ptr, slot,
                  EPI: tl.constexpr, SCALE_ROWS: tl.constexpr, STORE_Z: tl.constexpr):
    """A finished tile of the row GEMMs, columns past N masked. EPI 0: C = acc, times each row's
    routing weight (``slot``'s, 0 on padding rows) with SCALE_ROWS. EPI 1 (acc = z_g, acc_u =
    z_u): C = silu(z_g) * z_u, and z = [z_g, z_u] with STORE_Z."""
    out_ty = c_ptr.dtype.element_ty
    c_ptrs = c_ptr + rows64[:, None] * s_cm + offs_n[None, :]
    mask = (offs_n < N)[None, :]
    if EPI == 0:
        if SCALE_ROWS:
            acc = acc * tl.load(w_ptr + slot, mask=slot >= 0, other=0.0)[:, None]
        tl.store(c_ptrs, acc.to(out_ty), mask=mask)
    else:
        h = acc * tl.sigmoid(acc) * acc_u
        tl.store(c_ptrs, h.to(out_ty), mask=mask)
        if STORE_Z:
            z_ptrs = z_ptr + rows64[:, None] * s_zm + offs_n[None, :]
            tl.store(z_ptrs, acc.to(out_ty), mask=mask)
            tl.store(z_ptrs + N, acc_u.to(out_ty), mask=mask)


@triton.jit
def _moe_gemm_kernel(
    a_ptr,              # A: (T, K) read at row slot // TOPK (GATHER_A), or (P, K) at the padded row
    b_ptr,              # B: (E, K, N) any strides (a view of w_gate_up or w_down)
    c_ptr,              # C: (P, N)
    z_ptr,              # (P, 2 * N) pre-activations [z_g, z_u], written by EPI 1 with STORE_Z
    w_ptr,              # (S,) fp32 routing weight of each slot (SCALE_ROWS)
    sorted_ptr,         # (P,) int32 slot of each padded row, -1 padding
    tile_expert_ptr,    # (tiles_max,) int32
    K, N, tiles_n,
    s_am, s_ak, s_be, s_bk, s_bn, s_cm, s_zm,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, GATHER_A: tl.constexpr, EPI: tl.constexpr, SCALE_ROWS: tl.constexpr,
    STORE_Z: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """One BLOCK_M x BLOCK_N tile of one expert's rows. EPI 0: C = acc (times the routing weight
    with SCALE_ROWS); EPI 1: gate and up accumulators (B columns N apart), C = silu(z_g) * z_u."""
    _pdl_start(PDL)
    pid = tl.program_id(0)
    tiles_m = tl.num_programs(0) // tiles_n
    pid_m, pid_n = _tile_coords(pid, tiles_m, tiles_n, GROUP_M)
    e = tl.load(tile_expert_ptr + pid_m)
    if e < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows64 = rows.to(tl.int64)
    slot = tl.load(sorted_ptr + rows)
    valid = slot >= 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    if GATHER_A:
        a_rows = tl.where(valid, slot // TOPK, 0).to(tl.int64)
    else:
        a_rows = rows64
    a_ptrs = a_ptr + a_rows[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + e.to(tl.int64) * s_be + offs_k[:, None] * s_bk + offs_n[None, :] * s_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)    # EPI 1 only (dead code otherwise)
    up_off = N * s_bn
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            kin = (k0 + offs_k) < K
            a = tl.load(a_ptrs, mask=valid[:, None] & kin[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kin[:, None] & mask_n[None, :], other=0.0)
        acc = _dot(a, b, acc, PRECISION, UPCAST)
        if EPI == 1:
            if EVEN_K:
                bu = tl.load(b_ptrs + up_off, mask=mask_n[None, :], other=0.0)
            else:
                bu = tl.load(b_ptrs + up_off, mask=kin[:, None] & mask_n[None, :], other=0.0)
            acc_u = _dot(a, bu, acc_u, PRECISION, UPCAST)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    _moe_epilogue(acc, acc_u, rows64, offs_n, N, c_ptr, s_cm, z_ptr, s_zm, w_ptr, slot, EPI, SCALE_ROWS, STORE_Z)
    _pdl_end(PDL)


@triton.jit
def _moe_swiglu_bwd_kernel(
    g_ptr,              # (P, N) g = dout[token] @ Wd[e] (the dgrad GEMM's output)
    z_ptr,              # (P, 2 * N) saved pre-activations [z_g, z_u]
    dz_ptr,             # (P, 2 * N) out: [dz_g, dz_u]
    hw_ptr,             # (P, N) out: w * h, the B operand of dWd
    dw_ptr,             # (P,) fp32 out: g . h, the routing weight's gradient of each row
    w_ptr, sorted_ptr, tile_expert_ptr,
    N,
    TILE_M: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The SwiGLU backward over ROWS rows of one tile (ROWS divides TILE_M), row sums in fp32."""
    r0 = tl.program_id(0) * ROWS
    if tl.load(tile_expert_ptr + r0 // TILE_M) < 0:
        return
    rows = (r0 + tl.arange(0, ROWS)).to(tl.int64)
    slot = tl.load(sorted_ptr + rows)
    w = tl.load(w_ptr + slot, mask=slot >= 0, other=0.0)[:, None]
    dw = tl.zeros([ROWS], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        m = (cols < N)[None, :]
        g = tl.load(g_ptr + rows[:, None] * N + cols[None, :], mask=m, other=0.0).to(tl.float32)
        zp = z_ptr + rows[:, None] * (2 * N) + cols[None, :]
        zg = tl.load(zp, mask=m, other=0.0).to(tl.float32)
        zu = tl.load(zp + N, mask=m, other=0.0).to(tl.float32)
        sig = tl.sigmoid(zg)
        act = zg * sig
        h = act * zu
        dw += tl.sum(g * h, axis=1)
        dh = g * w
        dp = dz_ptr + rows[:, None] * (2 * N) + cols[None, :]
        tl.store(dp, (dh * zu * (sig + act * (1.0 - sig))).to(dz_ptr.dtype.element_ty), mask=m)
        tl.store(dp + N, (dh * act).to(dz_ptr.dtype.element_ty), mask=m)
        tl.store(hw_ptr + rows[:, None] * N + cols[None, :], (h * w).to(hw_ptr.dtype.element_ty), mask=m)
    tl.store(dw_ptr + rows, dw)


@triton.jit
def _moe_wgrad_kernel(
    a_ptr,              # A: (T, M) read at row slot // TOPK (GATHER_A), or (P, M) at the padded row
    b_ptr,              # B: (T, N) gathered (GATHER_B), or (P, N)
    c_ptr,              # C: (E, M, N) any strides: C[e] = A[rows of e]^T @ B[rows of e]
    sorted_ptr,         # (P,) int32
    start_ptr,          # (E + 1,) int32 padded row offsets
    M, N,
    s_ar, s_am, s_br, s_bn, s_ce, s_cm, s_cn,
    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, GATHER_A: tl.constexpr, GATHER_B: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of one expert's weight gradient: a K loop over that expert's
    padded rows (none for an expert without tokens: the tile is written as exact zeros)."""
    pid = tl.program_id(0)
    e = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(pid, tiles_m, tiles_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    start = tl.load(start_ptr + e)
    end = tl.load(start_ptr + e + 1)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(start, end, BLOCK_K):
        r = r0 + tl.arange(0, BLOCK_K)
        valid = r < end                  # BLOCK_K may exceed the padding unit: stop at the expert's end
        if GATHER_A or GATHER_B:
            slot = tl.load(sorted_ptr + r, mask=valid, other=-1)
            valid = slot >= 0
            tok = tl.where(valid, slot // TOPK, 0).to(tl.int64)
        if GATHER_A:
            a = tl.load(a_ptr + tok[None, :] * s_ar + offs_m[:, None] * s_am,
                        mask=mask_m[:, None] & valid[None, :], other=0.0)
        else:
            a = tl.load(a_ptr + r.to(tl.int64)[None, :] * s_ar + offs_m[:, None] * s_am,
                        mask=mask_m[:, None] & valid[None, :], other=0.0)
        if GATHER_B:
            b = tl.load(b_ptr + tok[:, None] * s_br + offs_n[None, :] * s_bn,
                        mask=valid[:, None] & mask_n[None, :], other=0.0)
        else:
            b = tl.load(b_ptr + r.to(tl.int64)[:, None] * s_br + offs_n[None, :] * s_bn,
                        mask=valid[:, None] & mask_n[None, :], other=0.0)
        acc = _dot(a, b, acc, PRECISION, UPCAST)
    c_ptrs = c_ptr + e.to(tl.int64) * s_ce + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _moe_combine_kernel(
    y_ptr,              # (P, D) per-row results (padded order)
    pos_ptr,            # (T * TOPK,) int32 padded row of each slot (-1: none)
    out_ptr,            # (T, D) out
    D, s_y, s_o,
    TOPK: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0,
):
    """out[t] = sum_j y[pos[t, j]] in fp32, j in order: deterministic."""
    _pdl_start(PDL)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = offs < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        p = tl.load(pos_ptr + t * TOPK + j)
        acc += tl.load(y_ptr + p.to(tl.int64) * s_y + offs, mask=m & (p >= 0), other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * s_o + offs, acc.to(out_ptr.dtype.element_ty), mask=m)
    _pdl_end(PDL)


# ----------------------------------------------------------------------------------------------
# Triton kernels: the Hopper path (operands by TMA)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _moe_gather_kernel(
    src_ptr,            # (T, D) token rows
    sorted_ptr,         # (P,) int32 slot of each padded row, -1 padding
    tile_expert_ptr,    # (tiles_max,) int32
    dst_ptr,            # (P, D) out: src[slot // TOPK], zeros on padding rows (unused tiles left alone)
    D, s_src, s_dst,
    TOPK: tl.constexpr, TILE_M: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """The token rows in the padded expert order, so that the grouped GEMMs read A by TMA boxes. A
    program copies ROWS rows' BLOCK_D columns (program_id(1): the column block), one load and
    store each, so the copy is one memory round trip deep."""
    _pdl_start(PDL)
    r0 = tl.program_id(0) * ROWS
    if tl.load(tile_expert_ptr + r0 // TILE_M) < 0:
        return
    rows = r0 + tl.arange(0, ROWS)
    slot = tl.load(sorted_ptr + rows)
    valid = slot >= 0
    tok = tl.where(valid, slot // TOPK, 0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = cols < D
    v = tl.load(src_ptr + tok[:, None] * s_src + cols[None, :], mask=valid[:, None] & m[None, :], other=0.0)
    tl.store(dst_ptr + rows.to(tl.int64)[:, None] * s_dst + cols[None, :], v, mask=m[None, :])
    _pdl_end(PDL)


@triton.jit
def _expert_tile_coords(tile, tiles_n, tile_expert_ptr, start_ptr, BLOCK_M: tl.constexpr):
    """(row tile, column tile, expert) of output tile number ``tile`` in expert order: the tiles
    are numbered as in row-major order, expert by expert (an expert's row tiles are consecutive),
    but within an expert its row tiles are walked down each column before the next column, so
    the row tiles reading one strip of the expert's weights run together (row-major order puts
    the expert's whole weights between them; measured, that cost less than expected: NOTES item
    103). An expert of one row tile is walked row-major. The expert is -1 past the used tiles
    (the row tile is then ``tile // tiles_n``)."""
    t = tile // tiles_n
    e = tl.load(tile_expert_ptr + t)
    used = e >= 0
    es = tl.where(used, e, 0)
    first = tl.load(start_ptr + es) // BLOCK_M
    count = tl.where(used, tl.load(start_ptr + es + 1) // BLOCK_M - first, 1)
    first = tl.where(used, first, t)
    local = tile - first * tiles_n
    return first + local % count, local // count, e


@triton.jit
def _moe_epilogue_tma(acc, acc_u, om, on, c_desc, z_desc, w_ptr, slot, EPI: tl.constexpr, SCALE_ROWS: tl.constexpr,
                      STORE_Z: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """_moe_epilogue's work with TMA bulk stores: C's tile in SPLIT column slices (EPI 0), or h,
    z_g and z_u (EPI 1; z viewed as (P, 2, N), so a partial column tile's z_g clips at N rather
    than spilling into z_u). Every row of the tile is written, padding rows included, as the
    pointer epilogue does."""
    if EPI == 0:
        if SCALE_ROWS:
            acc = acc * tl.load(w_ptr + slot, mask=slot >= 0, other=0.0)[:, None]
        _tma_store_tile(c_desc, om, on, acc.to(c_desc.dtype), SPLIT, BLOCK_M, BLOCK_N)
    else:
        h = acc * tl.sigmoid(acc) * acc_u
        if STORE_Z:
            z_desc.store([om, 0, on], tl.reshape(acc.to(z_desc.dtype), (BLOCK_M, 1, BLOCK_N)))
            z_desc.store([om, 1, on], tl.reshape(acc_u.to(z_desc.dtype), (BLOCK_M, 1, BLOCK_N)))
        c_desc.store([om, on], h.to(c_desc.dtype))


@triton.jit
def _moe_gemm_tma_kernel(
    a_desc,             # A (P, K) in padded row order, box [BLOCK_M, BLOCK_K]
    b_desc,             # the weights as 2-D (E * R, C): box [BLOCK_N, BLOCK_K] if B_T (B[k, j] = W[e*R + j, k]),
                        # else [BLOCK_K, BLOCK_N] (B[k, j] = W[e*R + k, j]); PAIRED: w_gate_up as
                        # (E, 2, n, d), box [1, 2, BLOCK_N, BLOCK_K] (gate and up rows of one column tile)
    c_desc,             # STORE_SPLIT > 0: C's descriptor, box [BLOCK_M, BLOCK_N // STORE_SPLIT] (else None)
    z_desc,             # STORE_SPLIT > 0 and STORE_Z: z as (P, 2, N), box [BLOCK_M, 1, BLOCK_N] (else None)
    c_ptr,              # C (P, N)
    z_ptr,              # (P, 2 * N) pre-activations [z_g, z_u] (EPI 1 with STORE_Z)
    w_ptr,              # (S,) fp32 routing weight of each slot (SCALE_ROWS)
    sorted_ptr, tile_expert_ptr, start_ptr,
    K, N, R, s_cm, s_zm, E,
    NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, B_T: tl.constexpr, EPI: tl.constexpr, SCALE_ROWS: tl.constexpr,
    STORE_Z: tl.constexpr, PRECISION: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr,
    PAIRED: tl.constexpr, STORE_SPLIT: tl.constexpr, EXPERT_ORDER: tl.constexpr, PDL: tl.constexpr = 0,
):
    """_moe_gemm_kernel's work, persistent: NUM_PROGRAMS programs walk the used tiles (the count
    read from start[E], so no host sync sizes the loop) in grouped order; A and B arrive by TMA,
    tile and K loops flattened into one software pipeline. B rows past an expert's R (a partial
    column tile) belong to the next expert or are zero-filled: they only feed masked columns.
    PAIRED (EPI 1): one box brings a column tile's gate and up rows, so one [BLOCK_M, 2 * BLOCK_N]
    accumulator takes both (one wgmma a K step instead of two, and registers enough for the
    flattened loop), split into z_g and z_u for the epilogue. STORE_SPLIT > 0: the finished tile
    leaves by TMA bulk stores (the hardware clips columns past N) instead of pointer stores.
    EXPERT_ORDER: the tiles in expert order (_expert_tile_coords), else grouped by GROUP_M."""
    _pdl_start(PDL)
    tiles_m = tl.load(start_ptr + E) // BLOCK_M
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        if EXPERT_ORDER:
            pid_m, pid_n, e = _expert_tile_coords(tile, tiles_n, tile_expert_ptr, start_ptr, BLOCK_M)
        else:
            pid_m, pid_n = _tile_coords(tile, tiles_m, tiles_n, GROUP_M)
            e = tl.load(tile_expert_ptr + pid_m)
        om = pid_m * BLOCK_M
        on = pid_n * BLOCK_N
        wrow = e * R
        if PAIRED:
            both = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
            for ks in range(k_steps):
                ok = ks * BLOCK_K
                a = a_desc.load([om, ok])
                b = b_desc.load([e, 0, on, ok]).reshape([2 * BLOCK_N, BLOCK_K]).T
                both = _dot(a, b, both, PRECISION, False)
            acc, acc_u = _column_halves(both, BLOCK_M, 2 * BLOCK_N)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for ks in range(k_steps):
                ok = ks * BLOCK_K
                a = a_desc.load([om, ok])
                if B_T:
                    b = b_desc.load([wrow + on, ok]).T
                else:
                    b = b_desc.load([wrow + ok, on])
                acc = _dot(a, b, acc, PRECISION, False)
                if EPI == 1:
                    bu = b_desc.load([wrow + N + on, ok]).T
                    acc_u = _dot(a, bu, acc_u, PRECISION, False)
        rows = (om + tl.arange(0, BLOCK_M)).to(tl.int64)
        slot = rows
        if SCALE_ROWS:
            slot = tl.load(sorted_ptr + rows)
        if STORE_SPLIT == 0:
            _moe_epilogue(acc, acc_u, rows, on + tl.arange(0, BLOCK_N), N, c_ptr, s_cm, z_ptr, s_zm, w_ptr, slot,
                          EPI, SCALE_ROWS, STORE_Z)
        else:
            _moe_epilogue_tma(acc, acc_u, om, on, c_desc, z_desc, w_ptr, slot, EPI, SCALE_ROWS, STORE_Z,
                              STORE_SPLIT, BLOCK_M, BLOCK_N)
    _pdl_end(PDL)


@triton.jit
def _moe_swap_pass(w_desc, x_desc, c_desc, w_ptr, sorted_ptr, e, row, on, K, R, ROWS: tl.constexpr,
                   MW: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr, PAIRED: tl.constexpr, EPI: tl.constexpr,
                   SCALE_ROWS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One pass of _moe_swap_kernel: C[row .. row + ROWS, on .. on + BJ] from MW weight rows (gate
    and up: 2 * BJ) against ROWS token rows (x_desc's and c_desc's box), K walked by BK."""
    acc = tl.zeros([MW, ROWS], dtype=tl.float32)
    for ks in range(tl.cdiv(K, BK)):
        ok = ks * BK
        if PAIRED:
            w = w_desc.load([e, 0, on, ok]).reshape([MW, BK])
        else:
            w = w_desc.load([e * R + on, ok])
        acc = _dot(w, x_desc.load([row, ok]).T, acc, PRECISION, UPCAST)
    out = tl.trans(acc)
    if EPI == 1:
        g, u = _column_halves(out, ROWS, 2 * BJ)
        out = g * tl.sigmoid(g) * u
    elif SCALE_ROWS:
        slot = tl.load(sorted_ptr + row + tl.arange(0, ROWS))
        out = out * tl.load(w_ptr + slot, mask=slot >= 0, other=0.0)[:, None]
    c_desc.store([row, on], out.to(c_desc.dtype))


@triton.jit
def _moe_swap_kernel(
    w_desc,             # PAIRED: w_gate_up as (E, 2, n, d), box [1, 2, BJ, BK]; else the weights as 2-D
                        # (E * R, K), box [BJ, BK]
    x_desc, xw_desc,    # the token rows (P, K) in padded order, boxes [TM, BK] and [TW, BK]
    c_desc, cw_desc,    # C (P, N), boxes [TM, BJ] and [TW, BJ]
    w_ptr,              # (S,) fp32 routing weight of each slot (SCALE_ROWS)
    sorted_ptr, tile_expert_ptr, start_ptr, counts_ptr,
    K, N, R,
    BLOCK_M: tl.constexpr, TM: tl.constexpr, TW: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr,
    PAIRED: tl.constexpr, EPI: tl.constexpr, SCALE_ROWS: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, EXPERT_ORDER: tl.constexpr, PDL: tl.constexpr = 0,
):
    """Decode's row GEMMs with A and B swapped: the weights are the MMA's M side (a program takes BJ
    output columns: 2 * BJ weight rows for gate and up) and an expert's tokens its N side, so a
    program reads only TM token rows once for its BJ columns where the tile has at most TM real
    rows, and the tile's rows in passes of TW (> TM; BLOCK_M: one pass) where it has more, each
    pass reading the weights again. Token rows arrive in the padded order of BLOCK_M-row tiles;
    rows past an expert's count are zeros there. EXPERT_ORDER: programs in expert order
    (_expert_tile_coords: an expert's row tiles read each weight strip together), else row-major."""
    _pdl_start(PDL)
    tiles_n = tl.cdiv(N, BJ)
    if EXPERT_ORDER:
        pid_m, pid_n, e = _expert_tile_coords(tl.program_id(0), tiles_n, tile_expert_ptr, start_ptr, BLOCK_M)
    else:
        pid_m = tl.program_id(0) // tiles_n
        pid_n = tl.program_id(0) % tiles_n
        e = tl.load(tile_expert_ptr + pid_m)
    if e < 0:
        return
    on = pid_n * BJ
    row = pid_m * BLOCK_M
    rows = tl.load(start_ptr + e) + tl.load(counts_ptr + e) - row     # real rows in this tile (>= 1)
    MW: tl.constexpr = 2 * BJ if EPI == 1 else BJ
    if rows > TM:
        for part in tl.static_range(BLOCK_M // TW):
            if part * TW < rows:
                _moe_swap_pass(w_desc, xw_desc, cw_desc, w_ptr, sorted_ptr, e, row + part * TW, on, K, R, TW,
                               MW, BJ, BK, PAIRED, EPI, SCALE_ROWS, PRECISION, UPCAST)
    else:
        _moe_swap_pass(w_desc, x_desc, c_desc, w_ptr, sorted_ptr, e, row, on, K, R, TM,
                       MW, BJ, BK, PAIRED, EPI, SCALE_ROWS, PRECISION, UPCAST)
    _pdl_end(PDL)


@triton.jit
def _moe_wgrad_tma_kernel(
    a_desc,             # A (P, M) in padded row order, box [BLOCK_K, BLOCK_M] (read transposed)
    b_desc,             # B (P, N) in padded row order, box [BLOCK_K, BLOCK_N]
    c_desc,             # STORE_SPLIT > 0: C as (E, M, N), box [1, BLOCK_M, BLOCK_N // STORE_SPLIT] (else None)
    c_ptr,              # C (E, M, N) any strides: C[e] = A[rows of e]^T @ B[rows of e]
    start_ptr,          # (E + 1,) int32 padded row offsets (multiples of BLOCK_K)
    M, N, E, s_ce, s_cm, s_cn,
    NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, WARP_SPECIALIZE: tl.constexpr = False,
    FLATTEN: tl.constexpr = False, STORE_SPLIT: tl.constexpr = 0,
):
    """_moe_wgrad_kernel's work with TMA operands: NUM_PROGRAMS programs over (expert, tile),
    expert-major (the programs of a wave share one expert's rows in L2); an expert's K loop runs
    over its padded rows, none for an expert without tokens (its tile is written as zeros)."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_e = tiles_m * tiles_n
    for tile in tl.range(tl.program_id(0), per_e * E, NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        e = tile // per_e
        pid_m, pid_n = _tile_coords(tile - e * per_e, tiles_m, tiles_n, GROUP_M)
        om = pid_m * BLOCK_M
        on = pid_n * BLOCK_N
        lo = tl.load(start_ptr + e)
        hi = tl.load(start_ptr + e + 1)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for r in range(lo, hi, BLOCK_K):
            a = a_desc.load([r, om]).T
            b = b_desc.load([r, on])
            acc = _dot(a, b, acc, PRECISION, False)
        if STORE_SPLIT == 0:
            offs_m = om + tl.arange(0, BLOCK_M)
            offs_n = on + tl.arange(0, BLOCK_N)
            c_ptrs = c_ptr + e.to(tl.int64) * s_ce + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])
        else:
            # TMA bulk stores (the hardware clips rows past M and columns past N of expert e)
            out = acc.to(c_desc.dtype)
            if STORE_SPLIT == 1:
                c_desc.store([e, om, on], tl.reshape(out, (1, BLOCK_M, BLOCK_N)))
            else:
                left, right = _column_halves(out, BLOCK_M, BLOCK_N)
                c_desc.store([e, om, on], tl.reshape(left, (1, BLOCK_M, BLOCK_N // 2)))
                c_desc.store([e, om, on + BLOCK_N // 2], tl.reshape(right, (1, BLOCK_M, BLOCK_N // 2)))


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
_COUNT = LaunchCache(_moe_count_kernel)
_OFFSETS = LaunchCache(_moe_offsets_kernel)
_ALIGN_ONE = LaunchCache(_moe_align_one_kernel)
_SCATTER = LaunchCache(_moe_scatter_kernel)
_GEMM = LaunchCache(_moe_gemm_kernel)
_WGRAD = LaunchCache(_moe_wgrad_kernel)
_SWIGLU_BWD = LaunchCache(_moe_swiglu_bwd_kernel)
_COMBINE = LaunchCache(_moe_combine_kernel)
_GATHER = LaunchCache(_moe_gather_kernel)
_GEMM_TMA = LaunchCache(_moe_gemm_tma_kernel)
_SWAP = LaunchCache(_moe_swap_kernel)
_WGRAD_TMA = LaunchCache(_moe_wgrad_tma_kernel)


def _launch(cache: LaunchCache, grid: tuple, args: tuple, cfg: MoEConfig | tuple, pdl: bool = False, **const) -> None:
    """``cache``'s kernel over ``grid``; ``pdl``: as a programmatic dependent of the launch before it
    (the kernel's PDL constexpr: it waits for that grid first, ``_pdl_start``)."""
    warps, stages = (cfg.num_warps, cfg.num_stages) if isinstance(cfg, MoEConfig) else cfg
    if pdl:
        cache.specialized(grid, args, {**const, "PDL": _PDL_MODE}, num_warps=warps, num_stages=stages,
                          launch_pdl=True)
    else:
        cache.specialized(grid, args, const, num_warps=warps, num_stages=stages)


# programmatic dependent launch in inference forwards: 0 off, 1 the next launch may start as soon
# as every program of this one has begun, 2 as each program ends (_pdl_start, _pdl_end)
_PDL_MODE = {"0": 0, "1": 1, "2": 2}.get(os.environ.get("WARPFORGE_MOE_PDL", "2").strip())
if _PDL_MODE is None:
    raise ValueError(f"WARPFORGE_MOE_PDL is {os.environ['WARPFORGE_MOE_PDL']!r}; expected 0 (off), 1 or 2")


def _pdl(x: torch.Tensor) -> bool:
    """Whether a forward's launches (alignment, gather, GEMMs, combine) are each a programmatic
    dependent of the one before (sm_90+ GPU, not the interpreter; ``WARPFORGE_MOE_PDL=0`` turns it
    off): the next grid's programs start as the last ones of this grid retire, instead of after
    it ends, and wait for it in ``_pdl_start`` before touching memory. Decode, where a call is
    five or more short launches, is what it is for (benchmarks/NOTES.md, item 104)."""
    return _PDL_MODE != 0 and pdl_supported(x)


def _tiles_max(slots: int, experts: int, block_m: int) -> int:
    """Upper bound on the BLOCK_M-row tiles of the padded layout: every expert adds at most one
    partial tile, and at most min(E, slots) experts have any."""
    return triton.cdiv(slots, block_m) + min(experts, slots)


def _align(ids: torch.Tensor, experts: int, block_m: int, pdl: bool = False):
    """Sort the slots by expert into the padded row space (see the module docstring); no host sync.
    Returns (sorted_slot (P,), slot_pos (S,), tile_expert (tiles_max,), expert_start (E + 1,),
    counts (E,)), all int32."""
    S = ids.numel()
    dev = ids.device
    tiles_max = _tiles_max(S, experts, block_m)
    P = tiles_max * block_m
    chunk = MOE_ALIGN_CHUNK
    chunks = triton.cdiv(S, chunk)
    nb = triton.next_power_of_2(experts + 1)
    sorted_slot = torch.empty(P, dtype=torch.int32, device=dev)
    slot_pos = torch.empty(S, dtype=torch.int32, device=dev)
    tile_expert = torch.empty(tiles_max, dtype=torch.int32, device=dev)
    start = torch.empty(experts + 1, dtype=torch.int32, device=dev)
    counts = torch.empty(experts, dtype=torch.int32, device=dev)
    # rows a step of the [rows, NB] histogram and tile-owner loops (chunks, tiles): <= 4,096 elements
    step = triton.next_power_of_2(max(1, min(64, 4096 // nb)))
    if 0 < S <= MOE_ALIGN_ONE_MAX and S * experts <= MOE_ALIGN_ONE_WORK:
        _launch(_ALIGN_ONE, (1,), (ids, sorted_slot, slot_pos, counts, start, tile_expert, S, P, tiles_max), (8, 1), pdl,
                E=experts, NB=nb, SB=max(16, triton.next_power_of_2(S)), BLOCK_M=block_m, TB=step)
        return sorted_slot, slot_pos, tile_expert, start, counts
    hist = torch.empty((chunks, experts), dtype=torch.int32, device=dev)
    fill_per = triton.cdiv(triton.cdiv(P, chunks), chunk) * chunk
    _launch(_COUNT, (chunks,), (ids, hist, sorted_slot, S, P, fill_per), (4, 1), pdl, E=experts, NB=nb, CHUNK=chunk)
    _launch(_OFFSETS, (1,), (hist, counts, start, tile_expert, chunks, tiles_max), (4, 1), pdl,
            E=experts, NB=nb, BLOCK_M=block_m, CB=step, TB=step)
    _launch(_SCATTER, (chunks,), (ids, hist, start, sorted_slot, slot_pos, S), (8, 1), pdl, E=experts, CHUNK=chunk)
    return sorted_slot, slot_pos, tile_expert, start, counts


def _gemm(a, b_view, c, *, meta, K: int, N: int, cfg: MoEConfig, topk: int, gather_a: bool, epi: int,
          weights=None, scale_rows=False, z=None, store_z=False, pdl: bool = False) -> None:
    """Launch _moe_gemm_kernel over every possible tile. ``b_view``: (E, K, N) strides of B."""
    sorted_slot, tile_expert = meta
    s_be, s_bk, s_bn, b = b_view
    dummy = sorted_slot
    flags = dict(TOPK=topk, GATHER_A=gather_a, EPI=epi, SCALE_ROWS=scale_rows, STORE_Z=store_z,
                 PRECISION=_precision(a.dtype), UPCAST=_upcast(a.dtype))

    def one(cfg):
        tiles_n = triton.cdiv(N, cfg.block_n)
        args = (a, b, c, dummy if z is None else z, dummy if weights is None else weights, sorted_slot, tile_expert,
                K, N, tiles_n, a.stride(0), a.stride(1), s_be, s_bk, s_bn, c.stride(0),
                0 if z is None else z.stride(0))
        _launch(_GEMM, (tile_expert.numel() * tiles_n,), args, cfg, pdl, **flags, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, EVEN_K=(K % cfg.block_k == 0))

    # the row tile stays: it is the sorted layout's padding unit
    launch_fitting("MoE grouped GEMM", gemm_configs(cfg, keep_m=True), one, (a.dtype, flags))


def _wgrad(a, b, c, *, sorted_slot, start, M: int, N: int, topk: int, gather_a: bool, gather_b: bool,
           cfg: MoEConfig) -> None:
    E = c.shape[0]
    args = (a, b, c, sorted_slot, start, M, N, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), c.stride(2))
    flags = dict(TOPK=topk, GATHER_A=gather_a, GATHER_B=gather_b, PRECISION=_precision(a.dtype),
                 UPCAST=_upcast(a.dtype))

    def one(cfg):
        grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), E)
        _launch(_WGRAD, grid, args, cfg, **flags, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                GROUP_M=cfg.group_m)

    launch_fitting("MoE weight gradient", gemm_configs(cfg), one, (a.dtype, flags))


def _combine(y, slot_pos, T: int, topk: int, D: int, dtype, pdl: bool = False) -> torch.Tensor:
    out = new_empty((T, D), dtype=dtype, device=y.device)
    if T == 0:
        return out
    block_d = min(triton.next_power_of_2(D), 64 if interpreting() else 2048)
    _launch(_COMBINE, (T, triton.cdiv(D, block_d)), (y, slot_pos, out, D, y.stride(0), out.stride(0)),
            (4 if block_d <= 1024 else 8, 1), pdl, TOPK=topk, BLOCK_D=block_d)
    return out


def _weights_2d(w: torch.Tensor) -> torch.Tensor | None:
    """The (E, R, C) weights as one (E * R, C) matrix TMA can read, or None where the experts are
    not stacked at a uniform row stride."""
    E, R, C = w.shape
    if w.stride(2) != 1 or (E > 1 and w.stride(0) != R * w.stride(1)):
        return None
    w2d = w.as_strided((E * R, C), (w.stride(1), 1))
    view = _tma_view(w2d, E * R, C)          # row-major boxes: not transposed
    return w2d if view is not None and not view[0] else None


def tma_path(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, block_m: int) -> bool:
    """Whether a call takes the Hopper kernels (TMA operands; persistent GEMMs at 128-row tiles):
    sm_90+, fp16/bf16, weights TMA can read as 2-D, K dims that the B boxes walk down (d and 2n)
    whole multiples of every BLOCK_K, and 128-row tiles -- or 32-64-row tiles (decode) where
    each expert's matrices hold at least ``_TMA_DECODE_MIN_WEIGHTS`` weights (smaller experts'
    calls are host-bound, and the descriptors cost host time). ``WARPFORGE_MOE_TMA=0`` turns it
    off."""
    if interpreting() or not x.is_cuda or not _TMA_ON or x.dtype not in (torch.float16, torch.bfloat16):
        return False
    d, n2 = x.shape[1], w1.shape[1]
    if block_m < 128 and (block_m < _TMA_DECODE_MIN_BLOCK_M or d * n2 // 2 < _TMA_DECODE_MIN_WEIGHTS):
        return False
    if torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    if d % 128 or n2 % 128 or (n2 // 2) % 8:
        return False
    return _weights_2d(w1) is not None and _weights_2d(w2) is not None


def swap_path(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, block_m: int, slots: int, experts: int,
              save_z: bool) -> bool:
    """Whether a forward takes the swapped decode kernels (``_moe_swap_kernel``): a call on the
    Hopper path at tiles of a multiple of both kinds' TW rows (128) whose experts get at most
    ``MOE_SWAP_MAX_ROWS`` rows on average (decode: the unswapped kernels would multiply and re-read
    the tiles' padding rows; benchmarks/NOTES.md, items 100-101), with no pre-activations to save.
    ``_SWAP_ON`` off turns it off."""
    if not _SWAP_ON or save_z or slots == 0:
        return False
    if any(block_m % _swap_config(kind)[1] for kind in ("up", "down")):
        return False                        # a tile's rows must split into TW-row passes
    if interpreting():
        return _SWAP_INTERP
    return slots <= MOE_SWAP_MAX_ROWS * min(experts, slots) and tma_path(x, w1, w2, block_m)


_SWAP_ON = os.environ.get("WARPFORGE_MOE_SWAP", "1") != "0"
_SWAP_INTERP = False                        # the tests turn it on to run the kernel under the interpreter
MOE_SWAP_INTERP = (16, 32, 16, 16, 4, 1)    # (TM, TW, BJ, BK, warps, stages) there


def _swap_config(kind: str) -> tuple:
    """The swapped kernel's (TM, TW, BJ, BK, warps, stages) for ``kind`` ("up" or "down")."""
    return MOE_SWAP_INTERP if interpreting() else MOE_SWAP[kind]


_TMA_ON = os.environ.get("WARPFORGE_MOE_TMA", "1") != "0"
# the decode TMA kernels (one program a tile: the swapped kernel, and _moe_gemm_tma_kernel at 32-64-row
# tiles) walk their tiles in expert order (_expert_tile_coords); off: row-major or grouped by GROUP_M as
# before, for benchmarks/probe_moe_order.py (H200, Mixtral T = 64 balanced and random: 665 against
# 670-680 us; NOTES item 103)
_EXPERT_ORDER = True
_TMA_DECODE_MIN_BLOCK_M = 32
_PAIRED_UP = True           # 128-row gate/up tiles take one [BLOCK_M, 2 * BLOCK_N] accumulator
_TMA_DECODE_MIN_WEIGHTS = 1 << 24


def _gather_rows(src: torch.Tensor, sorted_slot, tile_expert, topk: int, block_m: int, pdl: bool = False) -> torch.Tensor:
    """src[slot // topk] for every padded row of a used tile (zeros on padding rows)."""
    P, D = sorted_slot.numel(), src.shape[1]
    dst = new_empty((P, D), dtype=src.dtype, device=src.device)
    rows = 16
    block_d = min(32 if interpreting() else 512, triton.next_power_of_2(D))   # the tests: several blocks
    _launch(_GATHER, (P // rows, triton.cdiv(D, block_d)), (src, sorted_slot, tile_expert, dst, D, src.stride(0),
                                                            dst.stride(0)), (4, 1), pdl,
            TOPK=topk, TILE_M=block_m, ROWS=rows, BLOCK_D=block_d)
    return dst


def _weights_desc(w: torch.Tensor, N: int, box: list[int], paired: bool):
    """TMA descriptor of the (E, R, C) expert weights with ``box``-shaped boxes: with ``paired``,
    w_gate_up (E, 2n, d) viewed as (E, 2, n, d) (``N`` = n), so that one [1, 2, *box] box brings a
    column tile's gate and up rows; else the (E * R, C) matrix (``_weights_2d``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if paired:
        E = w.shape[0]
        wv = w.as_strided((E, 2, N, w.shape[2]), (w.stride(0), N * w.stride(1), w.stride(1), 1))
        return TensorDescriptor.from_tensor(wv, [1, 2, *box])
    return TensorDescriptor.from_tensor(_weights_2d(w), box)


def _gemm_tma(a, w, c, *, meta, K: int, N: int, kind: str, b_t: bool, epi: int = 0, weights=None,
              z=None, pdl: bool = False) -> None:
    """_moe_gemm_tma_kernel: C (P, N) = A (P, K) @ B_e over the used tiles. ``w``: the (E, R, C)
    weights, read as B[k, j] = w[e, j, k] (``b_t``) or w[e, k, j]."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    sorted_slot, tile_expert, start = meta
    block_m = sorted_slot.numel() // tile_expert.numel()
    cfg, programs_per_sm, ws, flatten = moe_tma_config(kind, block_m)
    E, R = w.shape[0], w.shape[1]
    paired = epi == 1 and block_m >= 128 and _PAIRED_UP
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k])
    b_desc = _weights_desc(w, N, [cfg.block_n, cfg.block_k] if paired or b_t else [cfg.block_k, cfg.block_n], paired)
    tiles = tile_expert.numel() * triton.cdiv(N, cfg.block_n)
    programs = tiles if programs_per_sm == 0 else max(1, min(tiles, programs_per_sm * sm_count()))
    dummy = sorted_slot
    # TMA stores: C (P, N) and z (P, 2N) are fresh contiguous buffers with 16-byte rows (tma_path
    # asks n % 8 == 0; d % 128 == 0); EPI 1 stores one [BLOCK_M, BLOCK_N] slice each of h, z_g, z_u
    split = cfg.store_split if epi == 0 else min(cfg.store_split, 1)
    c_desc = z_desc = None
    if split:
        c_desc = TensorDescriptor(c, [c.shape[0], N], [c.stride(0), 1], [cfg.block_m, cfg.block_n // split])
        if z is not None:
            z_desc = TensorDescriptor(z, [z.shape[0], 2, N], [z.stride(0), N, 1], [cfg.block_m, 1, cfg.block_n])
    args = (a_desc, b_desc, c_desc, z_desc, c, dummy if z is None else z, dummy if weights is None else weights,
            sorted_slot, tile_expert, start, K, N, R, c.stride(0), 0 if z is None else z.stride(0), E)
    _launch(_GEMM_TMA, (programs,), args, cfg, pdl, NUM_PROGRAMS=programs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, B_T=b_t, EPI=epi, SCALE_ROWS=weights is not None,
            STORE_Z=z is not None, PRECISION=_precision(a.dtype), WARP_SPECIALIZE=ws, FLATTEN=flatten,
            PAIRED=paired, STORE_SPLIT=split, EXPERT_ORDER=programs_per_sm == 0 and _EXPERT_ORDER)


def _gemm_swap(a, w, c, *, meta, K: int, N: int, epi: int, weights=None, cfg=None, pdl: bool = False) -> None:
    """_moe_swap_kernel: C (P, N) = A (P, K) @ W_e^T over the used BLOCK_M-row tiles (decode). ``w``:
    the (E, R, K) weights, read row-major (gate/up: w_gate_up, both halves of a column tile in one
    box); ``cfg``: (TM, TW, BJ, BK, warps, stages), default ``MOE_SWAP``'s for the kind."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    sorted_slot, tile_expert, start, counts = meta
    block_m = sorted_slot.numel() // tile_expert.numel()
    tm, tw, bj, bk, warps, stages = cfg or _swap_config("up" if epi == 1 else "down")
    R = w.shape[1]
    w_desc = _weights_desc(w, N, [bj, bk], paired=epi == 1)
    x_desc = TensorDescriptor.from_tensor(a, [tm, bk])
    xw_desc = TensorDescriptor.from_tensor(a, [tw, bk])
    c_desc = TensorDescriptor(c, [c.shape[0], N], [c.stride(0), 1], [tm, bj])
    cw_desc = TensorDescriptor(c, [c.shape[0], N], [c.stride(0), 1], [tw, bj])
    grid = (tile_expert.numel() * triton.cdiv(N, bj),)
    args = (w_desc, x_desc, xw_desc, c_desc, cw_desc, sorted_slot if weights is None else weights, sorted_slot,
            tile_expert, start, counts, K, N, R)
    _launch(_SWAP, grid, args, (warps, stages), pdl, BLOCK_M=block_m, TM=tm, TW=tw, BJ=bj, BK=bk, PAIRED=epi == 1,
            EPI=epi, SCALE_ROWS=weights is not None, PRECISION=_precision(a.dtype), UPCAST=_upcast(a.dtype),
            EXPERT_ORDER=_EXPERT_ORDER)


def _wgrad_tma(a, b, c, *, start, M: int, N: int, block_m: int) -> None:
    """_moe_wgrad_tma_kernel: C[e] (M, N) = A[rows of e]^T @ B[rows of e], A (P, M), B (P, N)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    cfg, programs_per_sm, ws, flatten = moe_tma_config("wgrad", block_m)
    E = c.shape[0]
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_k, cfg.block_m])
    b_desc = TensorDescriptor.from_tensor(b, [cfg.block_k, cfg.block_n])
    tiles = E * triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    programs = tiles if programs_per_sm == 0 else max(1, min(tiles, programs_per_sm * sm_count()))
    # TMA stores where C is contiguous with 16-byte rows (the weight gradients are fresh buffers)
    split = cfg.store_split if c.is_contiguous() and (N * c.element_size()) % 16 == 0 else 0
    c_desc = TensorDescriptor(c, [E, M, N], [M * N, N, 1], [1, cfg.block_m, cfg.block_n // split]) if split else None
    args = (a_desc, b_desc, c_desc, c, start, M, N, E, c.stride(0), c.stride(1), c.stride(2))
    _launch(_WGRAD_TMA, (programs,), args, cfg, NUM_PROGRAMS=programs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, PRECISION=_precision(a.dtype), WARP_SPECIALIZE=ws,
            FLATTEN=flatten, STORE_SPLIT=split)


def _b_fwd_up(w1):      # B[k, j] = w_gate_up[e, j, k]: (E, d, 2n)
    return (w1.stride(0), w1.stride(2), w1.stride(1), w1)


def _b_fwd_down(w2):    # B[k, j] = w_down[e, j, k]: (E, n, d)
    return (w2.stride(0), w2.stride(2), w2.stride(1), w2)


def _b_bwd_down(w2):    # B[k, j] = w_down[e, k, j]: (E, d, n)
    return (w2.stride(0), w2.stride(1), w2.stride(2), w2)


def _b_bwd_up(w1):      # B[k, j] = w_gate_up[e, k, j]: (E, 2n, d)
    return (w1.stride(0), w1.stride(1), w1.stride(2), w1)


def _moe_fwd(x, w1, w2, weights, ids, block_m: int, save_z: bool):
    T, d = x.shape
    E, n2, _ = w1.shape
    n = n2 // 2
    topk = ids.shape[1]
    S = T * topk
    P = _tiles_max(S, E, block_m) * block_m
    if S == 0:
        # a fresh empty tensor per output: an operator's outputs may not alias each other (one
        # shared tensor made the registered operator raise on zero tokens)
        def empty():
            return torch.empty(0, dtype=torch.int32, device=x.device)
        return (torch.zeros((T, d), dtype=x.dtype, device=x.device), x.new_empty((0, n2)), empty(), empty(), empty(),
                torch.zeros(E + 1, dtype=torch.int32, device=x.device), torch.zeros(E, dtype=torch.int32, device=x.device))
    pdl = _pdl(x) and not save_z         # inference calls (decode): each launch a dependent of the last
    sorted_slot, slot_pos, tile_expert, start, counts = _align(ids.view(-1), E, block_m, pdl)
    meta = (sorted_slot, tile_expert)
    h = new_empty((P, n), dtype=x.dtype, device=x.device)
    z = new_empty((P, n2), dtype=x.dtype, device=x.device) if save_z else x.new_empty((0, n2))
    y = new_empty((P, d), dtype=x.dtype, device=x.device)
    swap = swap_path(x, w1, w2, block_m, S, E, save_z)
    if swap or tma_path(x, w1, w2, block_m):
        xg = _gather_rows(x, sorted_slot, tile_expert, topk, block_m, pdl)
        if swap:
            meta = (sorted_slot, tile_expert, start, counts)
            _gemm_swap(xg, w1, h, meta=meta, K=d, N=n, epi=1, pdl=pdl)
            del xg
            _gemm_swap(h, w2, y, meta=meta, K=n, N=d, epi=0, weights=weights.view(-1), pdl=pdl)
        else:
            meta = (sorted_slot, tile_expert, start)
            _gemm_tma(xg, w1, h, meta=meta, K=d, N=n, kind="up", b_t=True, epi=1, z=z if save_z else None, pdl=pdl)
            del xg
            _gemm_tma(h, w2, y, meta=meta, K=n, N=d, kind="down", b_t=True, weights=weights.view(-1), pdl=pdl)
    else:
        _gemm(x, _b_fwd_up(w1), h, meta=meta, K=d, N=n, cfg=moe_config("up", block_m, x.element_size()), topk=topk,
              gather_a=True, epi=1, z=z if save_z else None, store_z=save_z, pdl=pdl)
        _gemm(h, _b_fwd_down(w2), y, meta=meta, K=n, N=d, cfg=moe_config("down", block_m, x.element_size()),
              topk=topk, gather_a=False, epi=0, weights=weights.view(-1), scale_rows=True, pdl=pdl)
    out = _combine(y, slot_pos, T, topk, d, x.dtype, pdl)
    return out, z, sorted_slot, slot_pos, tile_expert, start, counts


def _moe_bwd(dout, x, w1, w2, weights, z, sorted_slot, slot_pos, tile_expert, start, block_m: int):
    T, d = x.shape
    n2 = w1.shape[1]
    n = n2 // 2
    topk = weights.shape[1]
    dev, s = x.device, x.element_size()
    if T * topk == 0:                  # contiguous, as the main path and the fake allocate them
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=dev) for t in (x, w1, w2)) + \
            (torch.zeros(weights.shape, dtype=torch.float32, device=dev),)
    P = sorted_slot.numel()
    meta = (sorted_slot, tile_expert)
    # g = dout @ Wd with a plain store, then the SwiGLU backward as its own pass: fused into the GEMM's
    # epilogue (5 tiles in and out of registers in the MMA layout) it cost ~0.9 ms of 1.47 at
    # DeepSeek-V2-Lite T = 8192 on an H100, against ~0.3 ms for the separate pass (NOTES.md)
    g = new_empty((P, n), dtype=x.dtype, device=dev)
    tma = tma_path(x, w1, w2, block_m)
    if tma:
        dout_g = _gather_rows(dout, sorted_slot, tile_expert, topk, block_m)
        _gemm_tma(dout_g, w2, g, meta=(*meta, start), K=d, N=n, kind="dgrad", b_t=False)
    else:
        _gemm(dout, _b_bwd_down(w2), g, meta=meta, K=d, N=n, cfg=moe_config("dgrad", block_m, s), topk=topk,
              gather_a=True, epi=0)
    dz = new_empty((P, n2), dtype=x.dtype, device=dev)
    hw = new_empty((P, n), dtype=x.dtype, device=dev)
    dwrow = new_empty((P,), dtype=torch.float32, device=dev)
    per_program = min(16, block_m)
    block_n = min(triton.next_power_of_2(n), 32 if interpreting() else 256)
    _launch(_SWIGLU_BWD, (P // per_program,), (g, z, dz, hw, dwrow, weights.view(-1), sorted_slot, tile_expert, n),
            (4, 1), TILE_M=block_m, ROWS=per_program, BLOCK_N=block_n)
    del g
    pos = slot_pos.long()
    dwts = torch.where(pos >= 0, dwrow[pos.clamp_min(0)], 0.0).view(T, topk)
    dw2 = new_empty(w2.shape, dtype=w2.dtype, device=dev)
    dw1 = new_empty(w1.shape, dtype=w1.dtype, device=dev)
    if tma:
        _wgrad_tma(dout_g, hw, dw2, start=start, M=d, N=n, block_m=block_m)
        del dout_g, hw
        xg = _gather_rows(x, sorted_slot, tile_expert, topk, block_m)
        _wgrad_tma(dz, xg, dw1, start=start, M=n2, N=d, block_m=block_m)
        del xg
        rows = new_empty((P, d), dtype=x.dtype, device=dev)
        _gemm_tma(dz, w1, rows, meta=(*meta, start), K=n2, N=d, kind="dx", b_t=False)
        dx = _combine(rows, slot_pos, T, topk, d, x.dtype)
        return dx, dw1, dw2, dwts
    wcfg = moe_config("wgrad", block_m, s)
    _wgrad(dout, hw, dw2, sorted_slot=sorted_slot, start=start, M=d, N=n, topk=topk,
           gather_a=True, gather_b=False, cfg=wcfg)
    _wgrad(dz, x, dw1, sorted_slot=sorted_slot, start=start, M=n2, N=d, topk=topk,
           gather_a=False, gather_b=True, cfg=wcfg)
    rows = new_empty((P, d), dtype=x.dtype, device=dev)
    _gemm(dz, _b_bwd_up(w1), rows, meta=meta, K=n2, N=d, cfg=moe_config("down", block_m, s), topk=topk,
          gather_a=False, epi=0)
    dx = _combine(rows, slot_pos, T, topk, d, x.dtype)
    return dx, dw1, dw2, dwts


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _fwd_impl(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor, block_m: int, save_z: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                         torch.Tensor]:
    return _moe_fwd(x, w_gate_up, w_down, weights, ids, block_m, save_z)


def _fwd_fake(x, w_gate_up, w_down, weights, ids, block_m, save_z):
    T, d = x.shape
    E, n2, _ = w_gate_up.shape
    S = ids.numel()
    tiles = _tiles_max(S, E, block_m) if S else 0
    i32 = torch.int32
    return (x.new_empty((T, d)), x.new_empty((tiles * block_m if save_z else 0, n2)),
            x.new_empty((tiles * block_m,), dtype=i32), x.new_empty((S if tiles else 0,), dtype=i32),
            x.new_empty((tiles,), dtype=i32), x.new_empty((E + 1,), dtype=i32), x.new_empty((E,), dtype=i32))


def _bwd_impl(dout: torch.Tensor, x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
              weights: torch.Tensor, z: torch.Tensor, sorted_slot: torch.Tensor, slot_pos: torch.Tensor,
              tile_expert: torch.Tensor, start: torch.Tensor, block_m: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _moe_bwd(dout.contiguous(), x, w_gate_up, w_down, weights, z, sorted_slot, slot_pos,
                    tile_expert, start, block_m)


def _bwd_fake(dout, x, w_gate_up, w_down, weights, z, sorted_slot, slot_pos, tile_expert, start, block_m):
    # contiguous, as _moe_bwd allocates them (empty_like kept a transposed weight's strides, and
    # the compiled backward failed its stride assertion)
    return (x.new_empty(x.shape), w_gate_up.new_empty(w_gate_up.shape), w_down.new_empty(w_down.shape),
            weights.new_empty(weights.shape, dtype=torch.float32))


moe_experts_bwd_op = Op("moe_experts_bwd", _bwd_impl, _bwd_fake)


def _setup(ctx, inputs, output):
    x, w1, w2, weights, ids, block_m, save_z = inputs
    _, z, sorted_slot, slot_pos, tile_expert, start, _ = output
    ctx.save_for_backward(x, w1, w2, weights, z, sorted_slot, slot_pos, tile_expert, start)
    ctx.block_m = block_m
    ctx.weights_dtype = weights.dtype


def _backward(ctx, dout, *unused):
    x, w1, w2, weights, z, sorted_slot, slot_pos, tile_expert, start = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(x)
    if z.shape[0] != sorted_slot.shape[0]:
        raise RuntimeError("warpforge: moe_experts ran without saving its pre-activations (save_z=False), "
                           "so it cannot be differentiated; call it with grad enabled")
    dx, dw1, dw2, dwts = moe_experts_bwd_op(dout, x, w1, w2, weights, z, sorted_slot, slot_pos, tile_expert,
                                            start, ctx.block_m)
    return dx, dw1, dw2, dwts, None, None, None


moe_experts_op = Op("moe_experts", _fwd_impl, _fwd_fake, backward=_backward, setup_context=_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _check(x, w_gate_up, w_down, topk_weights, topk_ids):
    check_tensor("x", x, dtypes=MOE_DTYPES)
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        check_tensor(name, w, dtypes=MOE_DTYPES, min_dim=1)
        if w.dim() != 3:
            raise ValueError(f"warpforge: '{name}' has shape {tuple(w.shape)}; expected a 3-d "
                             f"{'(n_experts, 2 * expert_dim, d_model)' if name == 'w_gate_up' else '(n_experts, d_model, expert_dim)'} tensor")
        check_same(name, w, "x", x, shape=False)
    E, n2, d = w_gate_up.shape
    if d != x.shape[-1] or n2 % 2 or n2 == 0:
        raise ValueError(f"warpforge: 'w_gate_up' has shape {tuple(w_gate_up.shape)}; expected (n_experts, "
                         f"2 * expert_dim, {x.shape[-1]}) (gate rows then up rows, d_model = x.shape[-1])")
    if tuple(w_down.shape) != (E, d, n2 // 2):
        raise ValueError(f"warpforge: 'w_down' has shape {tuple(w_down.shape)}; expected ({E}, {d}, {n2 // 2}) "
                         f"to match 'w_gate_up' {tuple(w_gate_up.shape)}")
    if E > MAX_EXPERTS:
        raise ValueError(f"warpforge: {E} experts; at most {MAX_EXPERTS} are supported")
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        got = topk_ids.dtype if isinstance(topk_ids, torch.Tensor) else type(topk_ids).__name__
        raise TypeError(f"warpforge: 'topk_ids' must be an int32 or int64 tensor; got {got}")
    check_tensor("topk_weights", topk_weights, dtypes=MOE_DTYPES)
    lead = tuple(x.shape[:-1])
    if topk_ids.dim() != x.dim() or tuple(topk_ids.shape[:-1]) != lead:
        raise ValueError(f"warpforge: 'topk_ids' has shape {tuple(topk_ids.shape)}; expected (*x.shape[:-1], top_k) "
                         f"= {(*lead, 'top_k')}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"warpforge: 'topk_weights' has shape {tuple(topk_weights.shape)} but 'topk_ids' has "
                         f"{tuple(topk_ids.shape)}; expected the same shape")
    k = topk_ids.shape[-1]
    if k < 1 or k > E:
        raise ValueError(f"warpforge: top_k = {k} (the last dim of 'topk_ids'); expected 1 <= top_k <= n_experts = {E}")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        check_same(name, t, "x", x, shape=False, dtype=False)


def _validate_ids(ids: torch.Tensor, E: int) -> bool:
    """Whether the ids were checked (False where no host copy is possible: tracing, capture, meta)."""
    if ids.numel() == 0:
        return True
    if host_sync_unavailable(ids):
        return False
    low, high = torch.stack([ids.min(), ids.max()]).tolist()
    if low < 0 or high >= E:
        raise ValueError(f"warpforge: 'topk_ids' holds expert ids in [{low}, {high}]; expected ids in [0, {E - 1}] "
                         f"(n_experts = {E})")
    return True


def moe_experts(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """The routed experts of an MoE layer from precomputed routing (the functional form).

    x (..., d); w_gate_up (E, 2n, d): each expert's gate rows then up rows (the Hugging Face
    transformers / Liger layout); w_down (E, d, n); topk_ids (..., k) int32/int64 expert ids and
    topk_weights (..., k) their weights. Returns (..., d):
    out[t] = sum_j topk_weights[t, j] * (silu(x[t] Wg^T) * (x[t] Wu^T)) Wd^T for e = topk_ids[t, j].
    fp16, bf16 (fp32 accumulation) or fp32. Differentiable w.r.t. x, both weights and
    topk_weights; deterministic forward and backward (no atomics). ``validate`` checks the ids
    are in [0, E) with one host sync; without it an id out of range is dropped (never read out of
    bounds) -- pass False in CUDA graphs or when the router is trusted. Inside ``torch.autocast``,
    x and both weights are cast to the region's dtype first, as the F.linear calls of an unfused
    layer would cast them (topk_weights keep theirs; runtime/amp.py).
    """
    x, w_gate_up, w_down = autocast_inputs(x, w_gate_up, w_down)
    _check(x, w_gate_up, w_down, topk_weights, topk_ids)
    E = w_gate_up.shape[0]
    checked = validate and _validate_ids(topk_ids, E)
    d, k = x.shape[-1], topk_ids.shape[-1]
    x2 = x.reshape(-1, d)
    ids = topk_ids.reshape(-1, k)
    if ids.dtype != torch.int32 and not checked:
        # unchecked int64 ids are narrowed to int32 below, where an id past 2^31 wraps (2^32 -> 0)
        # into range: clamp first, so that every out-of-range id stays out of range and is dropped
        ids = ids.clamp(-1, E)
    ids = ids if ids.dtype == torch.int32 and ids.is_contiguous() else ids.to(torch.int32).contiguous()
    weights = topk_weights.reshape(-1, k)
    weights = weights if weights.dtype == torch.float32 and weights.is_contiguous() else weights.float().contiguous()
    x2 = unit_last_dim(x2)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, w_gate_up, w_down, topk_weights))
    block_m = moe_block_m(x2.shape[0] * k, E, x.element_size())
    out = moe_experts_op(x2, w_gate_up, w_down, weights, ids, block_m, grad)[0]
    return out.reshape(x.shape)


__all__ = ["moe_experts", "moe_experts_reference"]
