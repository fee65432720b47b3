"""Runtime: where kernels run (GPU or the Triton interpreter), device facts and measured ceilings,
launch heuristics, operator registration and argument checks.

Import order matters for one thing only: Triton decides at ``@triton.jit`` time whether a kernel is
compiled or interpreted, so :func:`setup_interpreter` runs before any op module is imported.
"""
from __future__ import annotations

import os

import torch


def setup_interpreter() -> bool:
    """On a machine with no CUDA device, run kernels under the Triton interpreter.

    Sets ``TRITON_INTERPRET=1`` unless the user already chose a value. Returns whether kernels
    will be interpreted. Called once by ``import warpforge``, before any kernel is defined.
    """
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return interpreting()


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# Tests set this so every output buffer starts as NaN: an element a kernel forgot to write fails.
POISON = os.environ.get("WARPFORGE_POISON", "0") == "1"


def unit_last_dim(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dim has unit stride (what the kernels index; a size-1 dim's stride is
    never used), else a contiguous copy (e.g. of an expanded gradient)."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def new_empty(shape, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate a kernel's output (NaN-filled when :data:`POISON` is set)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if POISON and out.is_floating_point():
        out.fill_(float("nan"))
    return out
