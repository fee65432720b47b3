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
``vectorized``  one program per 1,024 elements (``FLAT_BLOCK``), 4 warps: each thread owns a run of
                8 elements, one 16-byte load of each bf16 operand (two of fp32), the widest
                access a thread can issue.

Why the second reaches the copy roof (Little's law: bytes in flight = bandwidth x latency): to
stream 4.8 TB/s through ~700 ns of DRAM latency an H200 must keep ~3.4 MB in flight, ~25 KB per
SM. Both kernels fit 16 programs of 128 threads on an SM, so the difference is bytes per access:
the naive kernel puts 128 threads x 2 operands x 2 B = 512 B in flight per program, 8 KB per SM,
a third of what is needed (and each 2-byte access costs an instruction and a load-store slot of
its own); the vectorized kernel puts 128 x 2 x 16 B = 4 KB per program, 64 KB per SM. Measured on
an H200 (benchmarks/results): naive ~30% of the copy roof, vectorized ~100%. (A persistent grid
of ~4 programs per SM striding over 16 KB blocks, an earlier version, reached 96%: fewer, fatter
programs hide latency no better and add a loop.)

Full blocks are loaded without a mask: a mask built from an ``n`` that is not a multiple of 16
would stop Triton from proving 16-byte alignment of each thread's run and split every access into
scalar loads. Only the last, partial block is masked.

Non-contiguous inputs are made contiguous first (one extra copy, documented in :func:`add`); the
output is always contiguous. Arithmetic is fp32 (one rounding, at the store), as torch does for
half types.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import fastpath, new_empty
from ..runtime.checks import check_backend, check_same, check_tensor
from ..runtime.heuristics import FLAT_BLOCK, FLAT_WARPS
from ..runtime.registry import Op
from ..runtime.launch import run

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
    start = tl.cast(tl.program_id(0), tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        # a full block, unmasked: every thread's run of 8 elements is one (bf16) or two (fp32)
        # 16-byte accesses
        x = tl.load(x_ptr + offs).to(tl.float32)
        y = tl.load(y_ptr + offs).to(tl.float32)
        tl.store(out_ptr + offs, (x + alpha * y).to(out_ptr.dtype.element_ty))
    else:
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


def _add_launch(kernel, block: int, warps: int, x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = new_empty(x.shape, device=x.device, dtype=x.dtype)
    n = x.numel()
    if n > 0:
        run(kernel, (triton.cdiv(n, block),),
            (_flat(x), _flat(y), out.view(-1), n, alpha),
            BLOCK=block, num_warps=warps)
    return out


def _add_naive(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return _add_launch(_add_fwd_naive_kernel, NAIVE_BLOCK, NAIVE_WARPS, x, y, alpha)


def _add_vectorized(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return _add_launch(_add_fwd_vectorized_kernel, FLAT_BLOCK, FLAT_WARPS, x, y, alpha)


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
def add(input: torch.Tensor, other: torch.Tensor, *, alpha: float = 1.0, variant: str = "vectorized",
        backend: str = "triton") -> torch.Tensor:
    """``torch.add(input, other, alpha=alpha)`` for two tensors of the same shape and dtype.

    No broadcasting and no type promotion: both raise. Non-contiguous inputs are copied to
    contiguous ones first (an extra read and write); the result is contiguous. ``variant`` picks
    the kernel: ``"vectorized"`` (default, the fast one) or ``"naive"`` (the textbook version).
    ``backend="cuda"`` runs the CUDA C++ kernels of the same two variants (warpforge.cuda).
    """
    # the eager fast path (runtime/fastpath.py): None when it does not take the call
    fast = fastpath.door(input)
    if fast is not None and variant == "vectorized" and backend == "triton" and type(alpha) in (int, float):
        out = fast.add(input, other, float(alpha))
        if out is not None:
            return out
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
    if check_backend(backend) == "cuda":
        from ..cuda import functional as cuda_fn

        return cuda_fn.add(input, other, float(alpha), variant)
    return ADD_VARIANTS[variant](input, other, float(alpha))
