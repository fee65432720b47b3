"""Gated activations of the LLM MLP: SwiGLU and GeGLU, forward and backward.

    swiglu(g, u) = silu(g) * u              silu(g) = g * sigmoid(g)
    geglu(g, u)  = gelu(g) * u              gelu(g) = g * Phi(g)                      ("none", erf)
                                                    ~ g * sigmoid(2k(g + 0.044715 g^3)) ("tanh"),
                                                      k = sqrt(2/pi), since 0.5(1 + tanh z) = sigmoid(2z)
    backward:  dg = dy * u * act'(g)        du = dy * act(g)
               silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g)
               gelu'(g) = Phi(g) + g phi(g)                                           ("none")
                        = s + g s (1 - s) 2k (1 + 3 * 0.044715 g^2),  s = sigmoid(u(g)) ("tanh")

Two calling forms. ``act(gate, up)`` takes two tensors of the same shape [..., n]. ``act(gate)``
takes one tensor [..., 2n] -- the output of a fused gate_up projection -- whose first half along
the last dim is the gate and second half the up projection; the result is [..., n] and the
gradient is one [..., 2n] tensor written by the same single backward kernel (the halves are two
pointers into one buffer, so no split, no cat, no copy).

Byte model (s = bytes per element, M*n elements per operand): forward reads g, u and writes y:
3*M*n*s. Forward + backward: the backward reads g, u, dy and writes dg, du (it recomputes act(g)
from the saved gate rather than saving it: an extra tensor saved would cost 2*M*n*s, recomputing
costs ~20 FLOPs per element of idle ALU time): 8*M*n*s in all. At ~10-25 FLOPs per element,
1-3 FLOPs per byte against the ~14 an H200 needs to be compute-bound (67 TFLOP/s fp32 over
4.8 TB/s), every path is memory-bound; the target is the measured copy bandwidth
(torch.compile reaches 4,342 GB/s fwd on an H200 at 16384 x 14336 bf16, Liger 4,309).

Why the kernel is shaped as it is:
- 2-D tiles of BLOCK_M rows x BLOCK_N columns (``tile_config``): up to 2,048 columns, rows stacked
  to 4,096 elements per program, 8 warps: 16 elements per thread per operand, two 16-byte loads of
  each bf16 operand (four in flight per thread forward, six backward, all issued before any is
  used). A 16384 x 14336 problem is 57,344 programs, ~430 per SM: the chip stays full and the
  last-wave tail is <1%. 14,336 = 7 x 2,048, so no tile of the Llama-3-8B shape is partly empty.
- Two contiguous operands (the common case) take a flat 1-D kernel instead: FLAT_BLOCK elements
  a program, 4 warps, so each thread moves one 16-byte vector of each bf16 operand and ~16
  programs share an SM (64 KB in flight). On an H200 at 16384 x 14336 bf16 it ran at 101-102% of
  the copy roof where the 2-D tiles ran at 97% (benchmarks/NOTES.md): the row arithmetic and the
  larger per-thread runs of the tile cost ~4%.
- Row offsets are ``row.to(int64) * stride``: a long-context batch (131072 tokens x 28672, a
  packed gate_up of Llama-3-8B) is 3.8e9 elements, past int32.
- Inputs keep any row stride (the two halves of a [.., 2n] tensor are strided rows), so neither
  form copies; only a last dim with non-unit stride is made contiguous. (The up half of a packed
  tensor starts n elements in: its 16-byte accesses need n*s to be a multiple of 16, true of
  every real hidden size; an odd n still works, with narrower loads.)
- Everything is fp32 inside, rounded once at the store. Sigmoids are 1/(1+exp(-x)): exp overflow
  to inf gives exactly 0, and every derivative is written so that the overflowing factor is
  multiplied by a 0, never by inf (g = +-30 or +-1e4 give finite gradients, no NaN). The erf
  form is 0.5 g (1 + erf(g / sqrt 2)) as in torch, with the same fp32 cancellation for g < -4
  (values below ~1e-5 in magnitude lose relative, not absolute, accuracy).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import fastpath, new_empty
from ..runtime.checks import check_same, check_tensor
from ..runtime.heuristics import FLAT_BLOCK, FLAT_WARPS, tile_config
from ..runtime.registry import Op
from ..runtime.launch import run
from ._rows import as_rows

SILU, GELU, GELU_TANH = 0, 1, 2
_GELU_MODES = {"none": GELU, "tanh": GELU_TANH}


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------
def _split(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if up is None:
        n = gate.shape[-1] // 2
        return gate[..., :n], gate[..., n:]
    return gate, up


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """Ground truth in float64 (float32 on devices without it), cast back to gate's dtype."""
    wide = torch.float64 if gate.device.type == "cpu" else torch.float32
    g, u = _split(gate.to(wide), None if up is None else up.to(wide))
    return (torch.nn.functional.silu(g) * u).to(gate.dtype)


def geglu_reference(gate: torch.Tensor, up: torch.Tensor | None = None, approximate: str = "tanh") -> torch.Tensor:
    wide = torch.float64 if gate.device.type == "cpu" else torch.float32
    g, u = _split(gate.to(wide), None if up is None else up.to(wide))
    return (torch.nn.functional.gelu(g, approximate=approximate) * u).to(gate.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _act(g, ACT: tl.constexpr):
    """act(g) in fp32."""
    if ACT == 0:
        a = g * _sigmoid(g)
    elif ACT == 1:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:
        a = g * _sigmoid(g * (1.5957691216057308 + 0.07135481627159665 * g * g))   # 2k, 2k * 0.044715
    return a


@triton.jit
def _act_and_grad(g, ACT: tl.constexpr):
    """(act(g), act'(g)) in fp32."""
    if ACT == 0:
        s = _sigmoid(g)
        a = g * s
        da = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(g * 0.7071067811865476))
        a = g * cdf
        da = cdf + g * (0.3989422804014327 * tl.exp(-0.5 * g * g))          # 1/sqrt(2 pi)
    else:
        g2 = g * g
        s = _sigmoid(g * (1.5957691216057308 + 0.07135481627159665 * g2))
        a = g * s
        da = s + (g * s) * (1.0 - s) * (1.5957691216057308 + 0.21406444881478995 * g2)   # 2k * 3 * 0.044715
    return a, da


@triton.jit
def _glu_fwd_tile_kernel(
    g_ptr, u_ptr, y_ptr,       # (M, n) gate and up rows (unit column stride, any row stride; may be
                               # the two halves of one (M, 2n) buffer), (M, n) contiguous output
    M, n, stride_g, stride_u, stride_y,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < n)
    r = rows.to(tl.int64)[:, None]
    c = cols[None, :]
    g = tl.load(g_ptr + r * stride_g + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + r * stride_u + c, mask=mask, other=0.0).to(tl.float32)
    y = _act(g, ACT) * u
    tl.store(y_ptr + r * stride_y + c, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_tile_kernel(
    g_ptr, u_ptr, dy_ptr,      # (M, n) saved gate, saved up, incoming gradient (unit column stride)
    dg_ptr, du_ptr,            # (M, n) outputs: two tensors, or the two halves of one (M, 2n) buffer
    M, n, stride_g, stride_u, stride_dy, stride_dg, stride_du,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < n)
    r = rows.to(tl.int64)[:, None]
    c = cols[None, :]
    g = tl.load(g_ptr + r * stride_g + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + r * stride_u + c, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + r * stride_dy + c, mask=mask, other=0.0).to(tl.float32)
    a, da = _act_and_grad(g, ACT)
    tl.store(dg_ptr + r * stride_dg + c, (dy * u * da).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + r * stride_du + c, (dy * a).to(du_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_fwd_flat_kernel(
    g_ptr, u_ptr, y_ptr,       # (total,) contiguous gate, up, output
    total, ACT: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.cast(tl.program_id(0), tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (_act(g, ACT) * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_flat_kernel(
    g_ptr, u_ptr, dy_ptr,      # (total,) contiguous saved gate, saved up, incoming gradient
    dg_ptr, du_ptr,            # (total,) contiguous outputs
    total, ACT: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.cast(tl.program_id(0), tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a, da = _act_and_grad(g, ACT)
    tl.store(dg_ptr + offs, (dy * u * da).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (dy * a).to(du_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _operands(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(M, n) row views of the gate and up operands, and n."""
    if up is None:
        x2 = as_rows(gate)                              # (M, 2n)
        n = x2.shape[1] // 2
        return x2[:, :n], x2[:, n:], n
    g2, u2 = as_rows(gate), as_rows(up)
    return g2, u2, g2.shape[1]


def _flat(*ts: torch.Tensor) -> bool:
    """Every operand a contiguous buffer of the same shape: the problem is one flat vector."""
    return all(t.is_contiguous() for t in ts)


def _glu_fwd(gate: torch.Tensor, up: torch.Tensor | None, act: int) -> torch.Tensor:
    g2, u2, n = _operands(gate, up)
    m = g2.shape[0]
    y = new_empty((m, n), device=gate.device, dtype=gate.dtype)
    out_shape = (*gate.shape[:-1], n)
    if m == 0:
        return y.view(out_shape)
    if up is not None and _flat(gate, up):
        run(_glu_fwd_flat_kernel, (triton.cdiv(m * n, FLAT_BLOCK),),
            (gate, up, y, m * n),
            ACT=act, BLOCK=FLAT_BLOCK, num_warps=FLAT_WARPS)
        return y.view(out_shape)
    bm, bn, warps = tile_config(n)
    run(_glu_fwd_tile_kernel, (triton.cdiv(m, bm), triton.cdiv(n, bn)),
        (g2, u2, y, m, n, g2.stride(0), u2.stride(0), y.stride(0)),
        ACT=act, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    return y.view(out_shape)


def _glu_bwd(gate: torch.Tensor, up: torch.Tensor | None, dy: torch.Tensor, act: int) -> torch.Tensor:
    """One tensor: the (..., 2n) gradient of a packed gate, or the (2, ..., n) stack (dgate, dup)."""
    g2, u2, n = _operands(gate, up)
    m = g2.shape[0]
    dy2 = as_rows(dy)
    if up is None:
        grad = new_empty((m, 2 * n), device=gate.device, dtype=gate.dtype)
        dg, du = grad[:, :n], grad[:, n:]
        shape = gate.shape
    else:
        grad = new_empty((2, m, n), device=gate.device, dtype=gate.dtype)
        dg, du = grad[0], grad[1]
        shape = (2, *gate.shape)
    if m == 0:
        return grad.view(shape)
    if up is not None and _flat(gate, up, dy):
        run(_glu_bwd_flat_kernel, (triton.cdiv(m * n, FLAT_BLOCK),),
            (gate, up, dy, dg, du, m * n),
            ACT=act, BLOCK=FLAT_BLOCK, num_warps=FLAT_WARPS)
        return grad.view(shape)
    bm, bn, warps = tile_config(n)
    run(_glu_bwd_tile_kernel, (triton.cdiv(m, bm), triton.cdiv(n, bn)),
        (g2, u2, dy2, dg, du, m, n, g2.stride(0), u2.stride(0), dy2.stride(0), dg.stride(0), du.stride(0)),
        ACT=act, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    return grad.view(shape)


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _fwd_fake(gate, up, *rest):
    n = gate.shape[-1] // 2 if up is None else gate.shape[-1]
    return gate.new_empty((*gate.shape[:-1], n))


def _bwd_fake(gate, up, dy, *rest):
    return gate.new_empty(gate.shape if up is None else (2, *gate.shape))


def _setup(ctx, inputs, output):
    gate, up = inputs[0], inputs[1]
    ctx.rest = tuple(inputs[2:])                    # (approximate,) for geglu
    ctx.packed = up is None
    ctx.save_for_backward(gate, up)                 # inputs only: act(gate) is recomputed


def _grads(ctx, grad):
    if ctx.packed:
        return (grad, None, *([None] * len(ctx.rest)))
    return (grad[0], grad[1], *([None] * len(ctx.rest)))


def _swiglu_impl(gate: torch.Tensor, up: torch.Tensor | None) -> torch.Tensor:
    return _glu_fwd(gate, up, SILU)


def _swiglu_bwd_impl(gate: torch.Tensor, up: torch.Tensor | None, dy: torch.Tensor) -> torch.Tensor:
    return _glu_bwd(gate, up, dy, SILU)


swiglu_backward_op = Op("swiglu_backward", _swiglu_bwd_impl, _bwd_fake)


def _swiglu_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    return _grads(ctx, swiglu_backward_op(gate, up, dy))


swiglu_op = Op("swiglu", _swiglu_impl, _fwd_fake, backward=_swiglu_backward, setup_context=_setup)


def _geglu_impl(gate: torch.Tensor, up: torch.Tensor | None, approximate: str) -> torch.Tensor:
    return _glu_fwd(gate, up, _GELU_MODES[approximate])


def _geglu_bwd_impl(gate: torch.Tensor, up: torch.Tensor | None, dy: torch.Tensor, approximate: str) -> torch.Tensor:
    return _glu_bwd(gate, up, dy, _GELU_MODES[approximate])


geglu_backward_op = Op("geglu_backward", _geglu_bwd_impl, _bwd_fake)


def _geglu_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    return _grads(ctx, geglu_backward_op(gate, up, dy, *ctx.rest))


geglu_op = Op("geglu", _geglu_impl, _fwd_fake, backward=_geglu_backward, setup_context=_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _check(gate, up) -> None:
    check_tensor("gate", gate)
    if up is not None:
        check_tensor("up", up)
        check_same("up", up, "gate", gate)
    elif gate.shape[-1] % 2:
        raise ValueError(
            f"warpforge: 'gate' has shape {tuple(gate.shape)} and no 'up' was given, so its last dim must be "
            f"even (first half gate, second half up); got {gate.shape[-1]}")


def swiglu(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up``. With ``up=None``, ``gate`` is a fused [..., 2n] gate_up projection:
    first half gate, second half up; the result is [..., n]."""
    # the eager fast path (runtime/fastpath.py): None when it does not take the call
    fast = fastpath.door(gate)
    if fast is not None and up is not None:
        out = fast.glu(gate, up, SILU)
        if out is not None:
            return out
    _check(gate, up)
    return swiglu_op(gate, up)


def geglu(gate: torch.Tensor, up: torch.Tensor | None = None, approximate: str = "tanh") -> torch.Tensor:
    """``gelu(gate, approximate) * up`` (``approximate`` in {"none", "tanh"}, as
    ``torch.nn.functional.gelu``). With ``up=None``, ``gate`` is a fused [..., 2n] gate_up
    projection: first half gate, second half up; the result is [..., n]."""
    fast = fastpath.door(gate)
    if fast is not None and up is not None and type(approximate) is str and approximate in _GELU_MODES:
        out = fast.glu(gate, up, _GELU_MODES[approximate])
        if out is not None:
            return out
    if not isinstance(approximate, str) or approximate not in _GELU_MODES:
        raise ValueError(f"warpforge: 'approximate' is {approximate!r}; expected 'none' or 'tanh'")
    _check(gate, up)
    return geglu_op(gate, up, approximate)
