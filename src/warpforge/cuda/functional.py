"""The CUDA backend behind the public functions' ``backend="cuda"``: shape handling around the
``warpforge_cuda`` operators. The public functions (warpforge.ops.*) have already checked the
arguments; the operators check their own contracts again in C++ (TORCH_CHECK).

Contiguity, documented: the kernels read rows with unit column stride (softmax, sum, amax: any
row stride) and row-major matrices (matmul: any leading dimension). Anything else is copied to
contiguous memory first -- one extra read and write -- never refused.
"""
from __future__ import annotations

import torch

from ..runtime.heuristics import cuda_softmax_config
from . import ops

MATMUL_VARIANTS = ("naive", "tiled", "regblock", "mma", "mma_tma")
TENSOR_CORE_VARIANTS = ("mma", "mma_tma")   # fp16 / bf16 only


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (M, N) rows over its last dim with unit column stride, copying only when needed."""
    if x.dim() == 2 and (x.stride(-1) == 1 or x.shape[-1] <= 1):
        return x
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1])


def add(input: torch.Tensor, other: torch.Tensor, alpha: float, variant: str) -> torch.Tensor:
    return ops().add(input.contiguous(), other.contiguous(), alpha, variant)


def sum_last(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Sum over the last dim, any leading shape."""
    return ops().sum(_rows(x), dtype).view(x.shape[:-1])


def amax_last(x: torch.Tensor) -> torch.Tensor:
    return ops().amax(_rows(x)).view(x.shape[:-1])


def softmax_last(x: torch.Tensor, log: bool) -> torch.Tensor:
    cfg = cuda_softmax_config(x.shape[-1], x.element_size())
    return ops().softmax(_rows(x), log, cfg).view(x.shape)


def matmul_variant(dtype: torch.dtype, variant: str) -> str:
    """``auto``: the fastest tensor-core rung (mma_tma: mma.sync fed by TMA) for 16-bit types,
    register blocking for fp32."""
    if variant == "auto":
        return "mma_tma" if dtype in (torch.float16, torch.bfloat16) else "regblock"
    return variant


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """Row-major with a 16-byte-aligned leading dimension where the tensor-core rung needs one."""
    if t.stride(-1) != 1 or (t.shape[0] > 1 and t.stride(0) < t.shape[1]):
        t = t.contiguous()
    return t


def matmul_2d(a: torch.Tensor, b: torch.Tensor, variant: str) -> torch.Tensor:
    v = matmul_variant(a.dtype, variant)
    a, b = _row_major(a), _row_major(b)
    if v.startswith("mma"):
        # the tensor-core rung loads 16-byte chunks: leading dims a multiple of 8 elements, aligned bases
        # (from the storage offset, not data_ptr(): this also runs on fake tensors while tracing;
        # PyTorch's allocations themselves are at least 256-byte aligned)
        def aligned(t):
            return (t.storage_offset() * t.element_size()) % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % 8 == 0)
        if not aligned(a) or not aligned(b) or b.shape[1] % 8 != 0:
            return _padded_mma(a, b, v)
    return ops().matmul(a, b, v)


def _padded_mma(a: torch.Tensor, b: torch.Tensor, variant: str = "mma") -> torch.Tensor:
    """Operands whose rows are not 16-byte multiples (K or N not a multiple of 8, or an odd
    leading dimension): zero-pad K and N to multiples of 8 (zeros add nothing to a dot product),
    multiply, slice. One extra copy of each operand; exact."""
    k, n = a.shape[1], b.shape[1]
    kp, np_ = -(-k // 8) * 8, -(-n // 8) * 8
    a_p = torch.nn.functional.pad(a, (0, kp - k))               # (M, Kp)
    b_p = torch.nn.functional.pad(b, (0, np_ - n, 0, kp - k))   # (Kp, Np)
    return ops().matmul(a_p, b_p, variant)[:, :n]
