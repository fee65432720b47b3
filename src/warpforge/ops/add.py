"""Vector add, the teaching op: ``out = input + alpha * other``, elementwise, forward and backward.

    out = x + alpha * y          d_input = dy          d_other = alpha * dy

Byte model (s = bytes per element, n elements): read two tensors, write one, 3*n*s. One FMA per
element: 1/(3*s) FLOP per byte, hundreds of times below any compute roof, so the only bound is the
memory system and the target is the *measured* device-to-device copy bandwidth (~4,250 GB/s on an
H200, ~3,000 GB/s on an H100).

Two variants, both registered (``warpforge::add_naive``, ``warpforge::add_vectorized``) and
benchmarked side by side, because the gap between them is the lesson:

``naive``       the textbook first kernel: one program per 128 elements, 4 warps, so one element
                per thread: a 2-byte load per operand for bf16. A 1 GB add is 4 million programs,
                each of which issues a single small load per thread and waits ~700 ns for it.
``vectorized``  a persistent grid of about SM-count x 4 programs (never more than the device holds
                at once), each striding over blocks of 16 KB per operand (8,192 bf16 or 4,096
                fp32 elements). With 8 warps that is 64 B per thread per operand: four 16-byte
                loads of ``input`` and four of ``other`` issued back to back before the first is
                used.

Why the second reaches the copy roof (Little's law: bytes in flight = bandwidth x latency): to
stream 4.8 TB/s through ~700 ns of DRAM latency an H200 must keep ~3.4 MB in flight, ~25 KB per
SM. The naive kernel puts 128 threads x 2 operands x 2 B = 512 B in flight per program; even at
16 resident programs per SM that is 8 KB, a third of what is needed (and each 2-byte access costs
an instruction and a load-store slot of its own). The vectorized kernel puts 256 threads x 2 x
64 B = 32 KB in flight per program: one resident program per SM already covers the latency, and
the grid holds two to four. Striding (instead of one program per block) keeps the grid exactly
as large as the chip, so there is no tail wave of half-empty SMs and no per-program start-up.

Full blocks are loaded without a mask: a mask built from an ``n`` that is not a multiple of 16
would stop Triton from proving 16-byte alignment of each thread's run and split every access into
scalar loads. Only the last partial block, handled once by one program, is masked.

Non-contiguous inputs are made contiguous first (one extra copy, documented in :func:`add`); the
output is always contiguous. Arithmetic is fp32 (one rounding, at the store), as torch does for
half types.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import interpreting, new_empty
from ..runtime.checks import check_same, check_tensor
from ..runtime.heuristics import ELEMWISE_BYTES, ELEMWISE_WARPS, elementwise_grid, resident_programs
from ..runtime.registry import Op

NAIVE_BLOCK = 128      # elements per program of the naive variant
NAIVE_WARPS = 4        # 128 threads: one element each


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def add_reference(input: torch.Tensor, other: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """Ground truth in float64 (float32 on devices without it), cast back to the input dtype."""
    wide = torch.float64 if input.device.type == "cpu" else torch.float32
    return (input.to(wide) + alpha * other.to(wide)).to(input.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _add_fwd_naive_kernel(
    x_ptr, y_ptr, out_ptr,     # (n,) contiguous input, other, output
    n, alpha,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (x + alpha * y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_fwd_vectorized_kernel(
    x_ptr, y_ptr, out_ptr,     # (n,) contiguous input, other, output
    n, alpha,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    n_full = n // BLOCK
    # full blocks, unmasked: every thread's run of 8 (bf16) or 4 (fp32) elements is one 16-byte access
    for b in range(pid, n_full, nprog):
        offs = tl.cast(b, tl.int64) * BLOCK + lanes
        x = tl.load(x_ptr + offs).to(tl.float32)
        y = tl.load(y_ptr + offs).to(tl.float32)
        tl.store(out_ptr + offs, (x + alpha * y).to(out_ptr.dtype.element_ty))
    # the partial last block, by the program whose turn it would have been
    if pid == n_full % nprog:
        offs = n_full * BLOCK + lanes              # <= n: fits n's own type (int64 when n >= 2**31)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
        tl.store(out_ptr + offs, (x + alpha * y).to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-d view of ``t`` (a copy only when ``t`` is not contiguous)."""
    return t.contiguous().view(-1)


def _add_naive(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = new_empty(x.shape, device=x.device, dtype=x.dtype)
    n = x.numel()
    if n == 0:
        return out
    _add_fwd_naive_kernel[(triton.cdiv(n, NAIVE_BLOCK),)](
        _flat(x), _flat(y), out.view(-1), n, alpha, BLOCK=NAIVE_BLOCK, num_warps=NAIVE_WARPS)
    return out


# programs of the vectorized kernel the device holds at once, per (dtype, block): from its registers
_RESIDENT: dict = {}


def _add_vectorized(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = new_empty(x.shape, device=x.device, dtype=x.dtype)
    n = x.numel()
    if n == 0:
        return out
    block = ELEMWISE_BYTES // x.element_size()
    args = (_flat(x), _flat(y), out.view(-1), n, alpha)
    resident = None
    if not interpreting():
        key = (x.dtype, block)
        resident = _RESIDENT.get(key)
        if resident is None:
            compiled = _add_fwd_vectorized_kernel.warmup(*args, BLOCK=block, grid=(1,), num_warps=ELEMWISE_WARPS)
            resident = _RESIDENT[key] = resident_programs(compiled, ELEMWISE_WARPS)
    grid = elementwise_grid(triton.cdiv(n, block), resident)
    _add_fwd_vectorized_kernel[(grid,)](*args, BLOCK=block, num_warps=ELEMWISE_WARPS)
    return out


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _add_naive_impl(input: torch.Tensor, other: torch.Tensor, alpha: float) -> torch.Tensor:
    return _add_naive(input, other, alpha)


def _add_vectorized_impl(input: torch.Tensor, other: torch.Tensor, alpha: float) -> torch.Tensor:
    return _add_vectorized(input, other, alpha)


def _add_fake(input, other, alpha):
    return input.new_empty(input.shape)


def _setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


def _backward(ctx, dy):
    # d_input is dy itself; d_other is a scale, needed only when alpha != 1 (torch's eager scale
    # already runs at the copy roof, so it gets no kernel of its own)
    return dy, (dy if ctx.alpha == 1.0 else dy * ctx.alpha), None


add_naive_op = Op("add_naive", _add_naive_impl, _add_fake, backward=_backward, setup_context=_setup)
add_vectorized_op = Op("add_vectorized", _add_vectorized_impl, _add_fake, backward=_backward, setup_context=_setup)

ADD_VARIANTS = {"naive": add_naive_op, "vectorized": add_vectorized_op}


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------
def add(input: torch.Tensor, other: torch.Tensor, *, alpha: float = 1.0, variant: str = "vectorized") -> torch.Tensor:
    """``torch.add(input, other, alpha=alpha)`` for two tensors of the same shape and dtype.

    No broadcasting and no type promotion: both raise. Non-contiguous inputs are copied to
    contiguous ones first (an extra read and write); the result is contiguous. ``variant`` picks
    the kernel: ``"vectorized"`` (default, the fast one) or ``"naive"`` (the textbook version).
    """
    check_tensor("input", input, min_dim=0)
    check_tensor("other", other, min_dim=0)
    if other.shape != input.shape:
        raise ValueError(
            f"warpforge: 'other' has shape {tuple(other.shape)} but 'input' has shape {tuple(input.shape)}; "
            f"add expects the same shape (broadcasting is not supported)")
    check_same("other", other, "input", input)
    if variant not in ADD_VARIANTS:
        raise ValueError(f"warpforge: 'variant' is {variant!r}; expected one of {', '.join(map(repr, ADD_VARIANTS))}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"warpforge: 'alpha' must be a real number, got {type(alpha).__name__}")
    return ADD_VARIANTS[variant](input, other, float(alpha))
