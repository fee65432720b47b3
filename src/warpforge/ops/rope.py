"""Rotary position embedding (RoPE) of q and k, forward and backward, in one launch.

For each token t at position p (row p of the cos/sin table) and each head, the head vector x of
size D is rotated pair by pair:

    y_a = x_a * cos_a - x_b * sin_a
    y_b = x_b * cos_b + x_a * sin_b

with pairs (a, b) = (i, i + D/2) in the rotate-half form (GPT-NeoX, Llama; ``interleaved=False``)
and (2i, 2i + 1) in the GPT-J form (``interleaved=True``). With Hugging Face tables (cos_a == cos_b,
sin_a == sin_b) this is ``q * cos + rotate_half(q) * sin``; the kernel uses each half of a full
table exactly as that formula does, so any table gives HF's answer.

The map is linear, and its transpose is the same rotation with each pair's sines swapped and
negated (sin_a -> -sin_b, sin_b -> -sin_a; for HF tables simply sin -> -sin). So the backward is
the same kernel with the sine rows swapped and negated once per program: dq and dk in one launch.
cos and sin get no gradient (they are fixed functions of the position).

Byte model (s = bytes per element): read q and k, write q_out and k_out, 2 * (|q| + |k|) * s, plus
the cos/sin rows once per token. For q (4, 32, 4096, 128) and k (4, 8, 4096, 128) in bf16 that is
2 * (134.2 + 33.6) MB = 335.5 MB, plus 8.4 MB of bf16 (B, S, D) tables (16.8 MB in fp32, 2.5-5 %).
6 FLOPs per element: memory bound, and the roof is the measured copy bandwidth (~4,250 GB/s on an
H200: ~80 us for that shape). torch.compile reaches 3,812 GB/s, Liger 1,050, eager 337.

Why the kernel is shaped as it is:
- One program owns a (batch, BLOCK_S tokens) block and a step of its heads: BLOCK_S x HEADS x D ~
  4,096 elements of q or of k (runtime/heuristics.py, rope_config). On a GPU each program does one
  step (grid axis 1 = the head groups); under the interpreter a program walks several.
- At the benchmark shape a step is 16 tokens x 2 heads x 256 B = 8 KB in and 8 KB out; the grid is
  4 x 256 token blocks x 20 head groups = 20,480 light programs. A token block's programs run
  close together, so its cos/sin rows come from DRAM about once and from L2 after that.
- Accesses along D are unit-stride tiles of D/2 (rotate-half: two loads, one per half) or D
  (interleaved: one load, split into even/odd lanes in registers), so 16-byte vector loads and
  stores; B, H and S strides are kernel arguments, so a (B, S, H, D) buffer seen as (B, H, S, D)
  through ``transpose(1, 2)`` is read in place. The head dim is a compile-time constant (masks
  vanish for power-of-two D).
- The order of a program's loads (``TABLE_FIRST``, from rope_config). Long sequences load the
  table rows at the top, then the step's q/k: the compiler hoists the rows' conversion to fp32 above
  the step, so q/k wait for the rows, but with thousands of programs in flight that costs nothing
  (and it measured 1% faster than the other order at the benchmark shape on the H200). A sequence
  of one token block (decode) is latency-bound: there the q/k loads go out with the table loads,
  after only the position ids, two DRAM round trips instead of three after an L2 flush (H200,
  decode q (64, 32, 1, 128): backward 6.0 -> 4.8 us, forward 5.2 -> 4.8; benchmarks/NOTES.md,
  item 116). Compiled ahead of time for sm_90 at the benchmark config: 72 registers, all q/k
  accesses 16-byte vectors, no shared memory.
- Maths in fp32, output cast once at the store; offsets in int64.

Positions: ``position_ids=None`` uses table row ``offset + s`` for token s; an int tensor of shape
(S,), (1, S) or (B, S) indexes the table rows. Out-of-range ids never read outside the table: the
kernel masks table loads to [0, T), and an out-of-range token comes out NaN (so the error shows in
the loss, never as plausible numbers). Checking the ids on the host costs an ``aminmax`` and a
device-to-host sync per call, which stalls a decode loop: the call cannot be queued ahead of the
GPU (H100, 1 or 64 decode tokens: 106 us of host time a call against torch.compile's 51, and
119-218 us between the timing events, the sync's wait included, against 7-8). So ids on the GPU
are checked only when asked for (:data:`CHECK_POSITIONS`, or ``WARPFORGE_CHECK_POSITIONS=1``),
which raises ``IndexError``; ids on the CPU (no sync) always are. Never under ``torch.compile``
or during CUDA graph capture.

Eager calls of contiguous q and k with ids on q's device (or an int offset, or none) are issued by
the eager fast path (``runtime/csrc/fastpath.cpp``: the same kernel, grid and config, and a C++
autograd node whose backward launches the same kernel with ``BACKWARD``; under ``create_graph``
it takes :data:`rope_backward_op`, which is differentiable). H100, decode q (B, 32, 1, 128), k (B,
8, 1, 128): 80-129 us of host time a forward through Python, 12-16 us through it, against
torch.compile's 55-75 (benchmarks/NOTES.md, item 29).
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import fastpath, new_empty, unit_last_dim
from ..runtime.checks import check_same, check_tensor
from ..runtime.heuristics import rope_config
from ..runtime.registry import Op
from ..runtime.launch import run

# eager host check of position ids on the GPU (one sync per call; the module docstring says why
# it is off by default): True raises IndexError for an out-of-range id instead of a NaN token
CHECK_POSITIONS = os.environ.get("WARPFORGE_CHECK_POSITIONS", "0") == "1"


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def _table_rows(t: torch.Tensor, d: int, s: int, position_ids, offset: int, interleaved: bool) -> torch.Tensor:
    """The (Bt, S, D) full-width table rows the tokens use."""
    if t.shape[-1] != d:                                        # half-size (..., D/2) table
        t = t.repeat_interleave(2, dim=-1) if interleaved else torch.cat([t, t], dim=-1)
    t = t if t.dim() == 3 else t.unsqueeze(0)                   # (Bt, T, D)
    if position_ids is None:
        return t[:, offset:offset + s]
    pos = position_ids.long()
    pos = pos if pos.dim() == 2 else pos.unsqueeze(0)           # (Bp, S)
    bt = max(t.shape[0], pos.shape[0])
    t, pos = t.expand(bt, -1, -1), pos.expand(bt, -1)
    return torch.gather(t, 1, pos[..., None].expand(-1, -1, d))


def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:                                             # (x0, x1, x2, x3) -> (-x1, x0, -x3, x2)
        return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)                                 # HF rotate_half
    return torch.cat([-x2, x1], dim=-1)


def rope_reference(q, k, cos, sin, position_ids=None, interleaved: bool = False):
    """Ground truth, HF's ``apply_rotary_pos_emb`` (or its GPT-J twin) in float64 (float32 on
    devices without it), cast back to q's dtype. ``position_ids`` as in :func:`apply_rope`."""
    wide = torch.float64 if q.device.type == "cpu" else torch.float32
    offset = position_ids if isinstance(position_ids, int) else 0
    pos = position_ids if isinstance(position_ids, torch.Tensor) else None
    d, s = q.shape[-1], q.shape[-2]
    c = _table_rows(cos.to(wide), d, s, pos, offset, interleaved).unsqueeze(1)   # (Bt, 1, S, D)
    sn = _table_rows(sin.to(wide), d, s, pos, offset, interleaved).unsqueeze(1)
    out = []
    for x in (q, k):
        xw = x.to(wide)
        out.append((xw * c + _rotate(xw, interleaved) * sn).to(x.dtype))
    return out[0], out[1]


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _load_pair(rows, mask, other, R0: tl.constexpr, R1: tl.constexpr,
               HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The two members of every pair of (R0, R1) rows of D = 2*HALF unit-stride elements starting
    at ``rows`` (R0, R1, 1): (x_a, x_b), each (R0, R1, BLOCK_H)."""
    if INTERLEAVED:
        d = tl.arange(0, 2 * BLOCK_H)[None, None, :]
        x = tl.load(rows + d, mask=mask & (d < 2 * HALF), other=other)     # one contiguous row
        xa, xb = tl.split(tl.reshape(x, (R0, R1, BLOCK_H, 2)))
    else:
        j = tl.arange(0, BLOCK_H)[None, None, :]
        m = mask & (j < HALF)
        xa = tl.load(rows + j, mask=m, other=other)
        xb = tl.load(rows + HALF + j, mask=m, other=other)
    return xa, xb


@triton.jit
def _store_pair(rows, ya, yb, mask, R0: tl.constexpr, R1: tl.constexpr,
                HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr):
    if INTERLEAVED:
        d = tl.arange(0, 2 * BLOCK_H)[None, None, :]
        y = tl.reshape(tl.join(ya, yb), (R0, R1, 2 * BLOCK_H))
        tl.store(rows + d, y, mask=mask & (d < 2 * HALF))
    else:
        j = tl.arange(0, BLOCK_H)[None, None, :]
        m = mask & (j < HALF)
        tl.store(rows + j, ya, mask=m)
        tl.store(rows + HALF + j, yb, mask=m)


@triton.jit
def _load_table(rows, ok, R0: tl.constexpr, R1: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                INTERLEAVED: tl.constexpr, HALF_TABLE: tl.constexpr):
    """cos or sin for both members of each pair, as stored (the step converts them), (R0, R1,
    BLOCK_H) each, from the table row pointers ``rows`` (R0, R1, 1). Rows whose position is out of
    range (``ok`` False) read nothing and give NaN."""
    if HALF_TABLE:                                   # (..., D/2): one value per pair
        j = tl.arange(0, BLOCK_H)[None, None, :]
        ta = tl.load(rows + j, mask=ok & (j < HALF), other=float("nan"))
        tb = ta
    else:
        ta, tb = _load_pair(rows, ok, float("nan"), R0, R1, HALF, BLOCK_H, INTERLEAVED)
    return ta, tb


@triton.jit
def _token_rows(pos_ptrs, s, smask, offset, T, HAS_POS: tl.constexpr):
    """Each token's table row (BLOCK_S, 1, 1) and whether it is in range (never read outside the
    table)."""
    if HAS_POS:
        pos = tl.load(pos_ptrs, mask=smask, other=0).to(tl.int64)
    else:
        pos = s + offset
    ok = (smask & (pos >= 0) & (pos < T))[:, None, None]
    return pos[:, None, None], ok


@triton.jit
def _rotate_heads(
    x_ptr, y_ptr,              # this batch's (H, S, D) input and output
    h0, H, s, smask,           # first head of the step, head count, (BLOCK_S,) int64 tokens and mask
    sxh, sxs, syh, sys,        # head and token strides of x and y
    pos_ptrs, offset, T,       # (BLOCK_S,) position id pointers, first row when not HAS_POS, table rows
    cos_base, sin_base, scs, sss,                # this batch's tables and their row strides
    tc, ts,                    # the (cos, sin) pairs, loaded by the caller when TABLE_FIRST
    BLOCK_S: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, HALF_TABLE: tl.constexpr, HAS_POS: tl.constexpr, BACKWARD: tl.constexpr,
    TABLE_FIRST: tl.constexpr,
):
    h = h0 + tl.arange(0, HEADS)
    m = smask[:, None, None] & (h < H)[None, :, None]                  # (BLOCK_S, HEADS, 1)
    h = h.to(tl.int64)[None, :, None]
    s3 = s[:, None, None]
    # q/k, then (unless the caller has them) the table rows: issued together, once the ids are in
    xa, xb = _load_pair(x_ptr + s3 * sxs + h * sxh, m, 0.0, BLOCK_S, HEADS, HALF, BLOCK_H, INTERLEAVED)
    if TABLE_FIRST:
        ca, cb = tc
        sa, sb = ts
    else:
        pos, ok = _token_rows(pos_ptrs, s, smask, offset, T, HAS_POS)
        ca, cb = _load_table(cos_base + pos * scs, ok, BLOCK_S, 1, HALF, BLOCK_H, INTERLEAVED, HALF_TABLE)
        sa, sb = _load_table(sin_base + pos * sss, ok, BLOCK_S, 1, HALF, BLOCK_H, INTERLEAVED, HALF_TABLE)
    sh: tl.constexpr = (BLOCK_S, HEADS, BLOCK_H)
    ca = tl.broadcast_to(ca.to(tl.float32), sh)
    cb = tl.broadcast_to(cb.to(tl.float32), sh)
    sa = tl.broadcast_to(sa.to(tl.float32), sh)
    sb = tl.broadcast_to(sb.to(tl.float32), sh)
    if BACKWARD:                 # the transpose: each pair's sines swapped and negated
        t = sa
        sa = -sb
        sb = -t
    xa = xa.to(tl.float32)
    xb = xb.to(tl.float32)
    ya = xa * ca - xb * sa
    yb = xb * cb + xa * sb
    dt = y_ptr.dtype.element_ty
    _store_pair(y_ptr + s3 * sys + h * syh, ya.to(dt), yb.to(dt), m, BLOCK_S, HEADS, HALF, BLOCK_H, INTERLEAVED)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr,              # (B, Hq, S, D), (B, Hk, S, D): q, k (forward) or dq_out, dk_out (backward); D stride 1
    qo_ptr, ko_ptr,            # (B, Hq, S, D), (B, Hk, S, D) outputs; D stride 1
    cos_ptr, sin_ptr,          # (Bt, T, D or D/2) tables, last stride 1 (batch stride 0 when shared)
    pos_ptr,                   # (Bp, S) int32/int64 position ids when HAS_POS (batch stride 0 when shared)
    S, Hq, Hk, T, offset,      # tokens, heads, table rows, first row when not HAS_POS
    n_sblk, n_split,           # token blocks per sequence, programs sharing a block's heads
    sqb, sqh, sqs, skb, skh, sks,              # q, k strides (batch, head, token)
    sqob, sqoh, sqos, skob, skoh, skos,        # output strides
    scb, scs, ssb, sss, spb, sps,              # cos, sin (batch, row) and position (batch, token) strides
    BLOCK_S: tl.constexpr, HEADS_Q: tl.constexpr, HEADS_K: tl.constexpr,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVED: tl.constexpr, HALF_TABLE: tl.constexpr, HAS_POS: tl.constexpr, BACKWARD: tl.constexpr,
    TABLE_FIRST: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // n_sblk).to(tl.int64)
    s = (pid % n_sblk) * BLOCK_S + tl.arange(0, BLOCK_S)
    smask = s < S
    s = s.to(tl.int64)
    pos_ptrs = pos_ptr + b * spb + s * sps
    cos_base = cos_ptr + b * scb
    sin_base = sin_ptr + b * ssb
    if TABLE_FIRST:
        pos, ok = _token_rows(pos_ptrs, s, smask, offset, T, HAS_POS)
        tc = _load_table(cos_base + pos * scs, ok, BLOCK_S, 1, HALF, BLOCK_H, INTERLEAVED, HALF_TABLE)
        ts = _load_table(sin_base + pos * sss, ok, BLOCK_S, 1, HALF, BLOCK_H, INTERLEAVED, HALF_TABLE)
    else:
        tc, ts = (s, s), (s, s)                                         # unused: the step loads them
    # On a GPU every program does one step (rope_config); the interpreter's programs walk several
    nq = tl.cdiv(Hq, HEADS_Q)
    for g in range(tl.program_id(1), nq + tl.cdiv(Hk, HEADS_K), n_split):
        if g < nq:
            _rotate_heads(q_ptr + b * sqb, qo_ptr + b * sqob, g * HEADS_Q, Hq, s, smask, sqh, sqs, sqoh, sqos,
                          pos_ptrs, offset, T, cos_base, sin_base, scs, sss, tc, ts,
                          BLOCK_S, HEADS_Q, HALF, BLOCK_H, INTERLEAVED, HALF_TABLE, HAS_POS, BACKWARD, TABLE_FIRST)
        else:
            _rotate_heads(k_ptr + b * skb, ko_ptr + b * skob, (g - nq) * HEADS_K, Hk, s, smask, skh, sks, skoh, skos,
                          pos_ptrs, offset, T, cos_base, sin_base, scs, sss, tc, ts,
                          BLOCK_S, HEADS_K, HALF, BLOCK_H, INTERLEAVED, HALF_TABLE, HAS_POS, BACKWARD, TABLE_FIRST)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _out_like(x: torch.Tensor, alloc) -> torch.Tensor:
    """An output of x's (B, H, S, D) shape in x's layout: (B, S, H, D) in memory when x is a
    transposed view of such a buffer (heads inner to tokens), else contiguous. The fake uses the
    same rule, so both agree on strides."""
    b, h, s, d = x.shape
    if x.stride(1) < x.stride(2):
        return alloc((b, s, h, d)).transpose(1, 2)
    return alloc((b, h, s, d))


def _rope_launch(q, k, cos, sin, position_ids, offset: int, interleaved: bool, backward: bool):
    qo = _out_like(q, lambda shp: new_empty(shp, dtype=q.dtype, device=q.device))
    ko = _out_like(k, lambda shp: new_empty(shp, dtype=k.dtype, device=k.device))
    bsz, hq, s, d = q.shape
    hk = k.shape[1]
    if bsz * s == 0:
        return qo, ko
    q, k = unit_last_dim(q), unit_last_dim(k)
    cos, sin = unit_last_dim(cos), unit_last_dim(sin)
    cos3 = cos if cos.dim() == 3 else cos.unsqueeze(0)          # (Bt, T, D or D/2)
    sin3 = sin if sin.dim() == 3 else sin.unsqueeze(0)

    def bstride(t):                                             # a batch of one is shared
        return 0 if t.shape[0] == 1 else t.stride(0)

    if position_ids is not None:
        pos = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)   # (Bp, S)
        pos_args = (pos, bstride(pos), pos.stride(1))
    else:
        pos_args = (cos3, 0, 0)                                 # unused pointer
    cfg = rope_config(bsz, s, hq, hk, d)
    n_sblk = triton.cdiv(s, cfg.block_s)
    half = d // 2
    run(_rope_kernel, (bsz * n_sblk, cfg.split),
        (q, k, qo, ko, cos3, sin3, pos_args[0], s, hq, hk, cos3.shape[1], offset, n_sblk, cfg.split,
         q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), qo.stride(0),
         qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2), bstride(cos3), cos3.stride(1),
         bstride(sin3), sin3.stride(1), pos_args[1], pos_args[2]),
        BLOCK_S=cfg.block_s, HEADS_Q=cfg.heads_q, HEADS_K=cfg.heads_k, HALF=half,
        BLOCK_H=triton.next_power_of_2(half), INTERLEAVED=interleaved, HALF_TABLE=cos3.shape[-1] != d,
        HAS_POS=position_ids is not None, BACKWARD=backward, TABLE_FIRST=cfg.table_first, num_warps=cfg.num_warps)
    return qo, ko


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _rope_impl(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               position_ids: Optional[torch.Tensor], offset: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _rope_launch(q, k, cos, sin, position_ids, offset, interleaved, backward=False)


def _rope_bwd_impl(dq_out: torch.Tensor, dk_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   position_ids: Optional[torch.Tensor], offset: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _rope_launch(dq_out, dk_out, cos, sin, position_ids, offset, interleaved, backward=True)


def _rope_fake(q, k, cos, sin, position_ids, offset, interleaved):
    return _out_like(q, q.new_empty), _out_like(k, k.new_empty)


def _setup(ctx, inputs, output):
    _q, _k, cos, sin, position_ids, offset, interleaved = inputs
    ctx.offset, ctx.interleaved = offset, interleaved
    ctx.save_for_backward(cos, sin, position_ids)


def _grads(ctx, gq, gk, op):
    cos, sin, position_ids = ctx.saved_tensors
    dq, dk = op(gq, gk, cos, sin, position_ids, ctx.offset, ctx.interleaved)
    return dq, dk, None, None, None, None, None                 # no gradient for the tables or positions


def _backward(ctx, gq, gk):
    return _grads(ctx, gq, gk, rope_backward_op)


def _backward_of_backward(ctx, ggq, ggk):                       # the backward is linear too: its transpose is the forward
    return _grads(ctx, ggq, ggk, rope_op)


rope_backward_op = Op("rope_backward", _rope_bwd_impl, _rope_fake,
                      backward=_backward_of_backward, setup_context=_setup)
rope_op = Op("rope", _rope_impl, _rope_fake, backward=_backward, setup_context=_setup)


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------
def _check_positions(position_ids: torch.Tensor, rows: int) -> None:
    """Host check of the ids: always for ids on the CPU, for ids on the GPU (a sync) only with
    CHECK_POSITIONS; never under torch.compile or during CUDA graph capture."""
    if position_ids.numel() == 0 or torch.compiler.is_compiling():
        return
    if position_ids.device.type != "cpu" and (not CHECK_POSITIONS or torch.cuda.is_current_stream_capturing()):
        return
    lo, hi = (int(v) for v in torch.aminmax(position_ids))
    if lo < 0 or hi >= rows:
        raise IndexError(f"warpforge: 'position_ids' has values in [{lo}, {hi}]; expected ids in "
                         f"[0, {rows}) to index the {rows} rows of 'cos'/'sin'")


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               position_ids: int | torch.Tensor | None = None, interleaved: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k (out of place), in one kernel launch.

    Args:
        q: (B, Hq, S, D), k: (B, Hk, S, D): the Hugging Face layout, Hq a multiple of Hk (MHA, GQA,
            MQA), D even, fp32/fp16/bf16, same dtype. Any B/H/S strides are read in place, e.g.
            ``x.view(B, S, H, D).transpose(1, 2)``; a copy is made only if D is not unit-stride.
            The outputs keep that layout: (B, S, H, D) in memory when the heads stride is smaller
            than the tokens stride, contiguous (B, H, S, D) otherwise.
        cos, sin: the tables, fp32 or q's dtype, same shape: (T, Dt), (1, T, Dt) or (B, T, Dt),
            where Dt is D (HF: ``cat(freqs, freqs)`` for rotate-half, each value repeated per pair
            for interleaved) or D/2 (flash-attn style: one value per pair).
        position_ids: ``None`` (token s uses row s), an int offset (token s uses row offset + s;
            decode), or an int32/int64 tensor of shape (S,), (1, S) or (B, S) of row indices.
            With no tensor the table needs at least offset + S rows. An out-of-range id never
            reads outside the table and gives that token NaN; ids on the CPU, or on the GPU with
            ``WARPFORGE_CHECK_POSITIONS=1`` (a sync per call), raise ``IndexError`` instead.
        interleaved: False pairs (i, i + D/2) (GPT-NeoX/Llama ``rotate_half``); True pairs
            (2i, 2i + 1) (GPT-J).

    Returns:
        (q_out, k_out), in q's and k's dtype. Differentiable in q and k (cos, sin and the
        positions get no gradient).
    """
    # the eager fast path (runtime/fastpath.py): None when it does not take the call (CPU ids,
    # checked ids, anything unusual: the Python path below, with its clear errors)
    fast = fastpath.door(q)
    if fast is not None and not CHECK_POSITIONS:
        out = fast.rope(q, k, cos, sin, position_ids, bool(interleaved))
        if out is not None:
            return out
    check_tensor("q", q, min_dim=4)
    check_tensor("k", k, min_dim=4)
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"warpforge: '{name}' must be 4-d (B, H, S, D), got shape {tuple(t.shape)}")
    check_same("k", k, "q", q, shape=False)
    bsz, hq, s, d = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (bsz, s, d):
        raise ValueError(f"warpforge: 'k' has shape {tuple(k.shape)} but 'q' has {tuple(q.shape)}; "
                         f"expected the same batch, sequence length and head dim (B, *, S, D)")
    if d % 2:
        raise ValueError(f"warpforge: 'q' has head dim D={d}; expected an even D (RoPE rotates pairs)")
    hk = k.shape[1]
    if hk == 0 or hq == 0 or hq % hk:
        raise ValueError(f"warpforge: 'q' has {hq} heads and 'k' has {hk}; expected Hq to be a multiple of Hk >= 1")

    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, dtypes=(torch.float32, q.dtype), min_dim=2)
        check_same(name, t, "q", q, shape=False, dtype=False)
        if t.dim() > 3:
            raise ValueError(f"warpforge: '{name}' must be (T, D), (1, T, D) or (B, T, D), got shape {tuple(t.shape)}")
    if sin.shape != cos.shape:
        raise ValueError(f"warpforge: 'sin' has shape {tuple(sin.shape)} but 'cos' has {tuple(cos.shape)}; expected the same shape")
    # explicit == / != throughout: `int in (SymInt, ...)` is False under torch.compile(dynamic=True)
    # when a static table's size meets a symbolic head dim or batch (the check refused valid tables)
    if cos.shape[-1] != d and cos.shape[-1] != d // 2:
        raise ValueError(f"warpforge: 'cos' has last dim {cos.shape[-1]}; expected the head dim D={d} "
                         f"(or D/2={d // 2} for a half-size table)")
    if cos.dim() == 3 and cos.shape[0] != 1 and cos.shape[0] != bsz:
        raise ValueError(f"warpforge: 'cos' has batch size {cos.shape[0]}; expected 1 or the batch size of 'q' ({bsz})")
    rows = cos.shape[-2]

    offset, pos = 0, None
    if isinstance(position_ids, torch.Tensor):
        pos = position_ids
        if pos.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"warpforge: 'position_ids' has dtype {str(pos.dtype).replace('torch.', '')}; expected int32 or int64")
        check_same("position_ids", pos, "q", q, shape=False, dtype=False)
        if not (pos.shape == (s,) or (pos.dim() == 2 and (pos.shape[0] == 1 or pos.shape[0] == bsz) and pos.shape[1] == s)):
            raise ValueError(f"warpforge: 'position_ids' has shape {tuple(pos.shape)}; expected ({s},), (1, {s}) or ({bsz}, {s})")
        _check_positions(pos, rows)
    elif position_ids is not None:
        if isinstance(position_ids, bool) or not isinstance(position_ids, int):
            raise TypeError(f"warpforge: 'position_ids' must be None, an int offset or an int tensor, got {type(position_ids).__name__}")
        offset = position_ids
        if offset < 0:
            raise ValueError(f"warpforge: 'position_ids' offset is {offset}; expected >= 0")
    if pos is None and rows < offset + s:
        raise ValueError(f"warpforge: 'cos' has {rows} rows; expected at least offset + S = {offset + s}")
    return rope_op(q, k, cos, sin, pos, offset, bool(interleaved))
