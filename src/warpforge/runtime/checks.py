"""Argument checks shared by every operator: clear errors that name the argument and what was
expected, raised in Python before any kernel is launched."""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from . import interpreting

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def is_finite(v) -> bool:
    """A float option is finite, by comparisons (NaN fails them): under
    torch.compile(dynamic=True) such options are symbolic floats, and math.isfinite of one breaks
    the graph (benchmarks/NOTES.md item 74)."""
    return -math.inf < v < math.inf


def as_index(v):
    """An integer size or length argument: an int or a SymInt as it is, anything else through
    ``operator.index`` (numpy and 0-d tensor integers; TypeError for the rest). operator.index on
    a SymInt makes Dynamo evaluate it and guard on its value, so torch.compile recompiled for every
    value (attention_varlen's max_seqlen, a norm's hidden size; NOTES item 144)."""
    return v if isinstance(v, (int, torch.SymInt)) else operator.index(v)


def dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    """``float32, float16, bfloat16``: dtypes as the error messages name them."""
    return ", ".join(dict.fromkeys(str(d).replace("torch.", "") for d in dtypes))


def host_sync_unavailable(t: torch.Tensor) -> bool:
    """Where a validation's device-to-host copy is impossible, so the check is skipped: while
    torch.compile traces, on meta tensors, and while a CUDA graph captures (the kernels still never
    access memory outside their tensors)."""
    return (torch.compiler.is_compiling() or t.device.type == "meta"
            or (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()))


def to_float(name: str, v) -> float:
    """A real-valued option as a float: a number, or what float() takes but a string or a bool
    (e.g. a 0-d tensor); a TypeError naming the option otherwise."""
    if isinstance(v, (bool, str, bytes)):
        raise TypeError(f"warpforge: '{name}' must be a real number, got {type(v).__name__}")
    try:
        return float(v)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"warpforge: '{name}' must be a real number, got {type(v).__name__}") from None


def check_finite(name: str, v) -> float:
    """A real-valued option (see :func:`to_float`), finite: NaN or inf would reach the kernels and
    come back as a NaN result, never as an error."""
    f = to_float(name, v)
    if not is_finite(f):
        raise ValueError(f"warpforge: '{name}' is {f}; expected a finite number")
    return f


def check_tensor(name: str, t, *, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES, min_dim: int = 1) -> None:
    """A floating tensor of a supported dtype, on a device our kernels run on, with a non-empty last dim."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"warpforge: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"warpforge: '{name}' has dtype {str(t.dtype).replace('torch.', '')}; expected one of "
                        f"{dtype_names(dtypes)}")
    if t.dim() < min_dim:
        raise ValueError(f"warpforge: '{name}' must have at least {min_dim} dimension(s), got a {t.dim()}-d tensor")
    check_device(name, t)
    if t.dim() >= 1 and t.shape[-1] == 0:
        raise ValueError(f"warpforge: '{name}' has a zero-size last dimension (shape {tuple(t.shape)}); expected at least 1 element per row")


def check_device(name: str, t: torch.Tensor) -> None:
    """GPU tensors, or CPU tensors when the Triton interpreter runs the kernels."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and interpreting():
        return
    if t.device.type == "meta":
        return
    raise RuntimeError(
        f"warpforge: '{name}' is on device '{t.device}', but warpforge kernels need a CUDA tensor "
        f"(CPU tensors run only under the Triton interpreter, TRITON_INTERPRET=1)"
    )


def check_same(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor, *, shape: bool = True, dtype: bool = True) -> None:
    """``t`` matches ``ref`` in device, and optionally in shape and dtype."""
    if t.device != ref.device:
        raise RuntimeError(f"warpforge: '{name}' is on {t.device} but '{ref_name}' is on {ref.device}; expected the same device")
    if dtype and t.dtype != ref.dtype:
        raise TypeError(f"warpforge: '{name}' has dtype {t.dtype} but '{ref_name}' has {ref.dtype}; expected the same dtype")
    if shape and t.shape != ref.shape:
        raise ValueError(f"warpforge: '{name}' has shape {tuple(t.shape)} but '{ref_name}' has {tuple(ref.shape)}; expected the same shape")


def check_weight(name: str, w, x_name: str, x: torch.Tensor, n: int) -> None:
    """A 1-d per-feature parameter of length ``n`` on ``x``'s device."""
    check_tensor(name, w)
    if w.dim() != 1 or w.shape[0] != n:
        raise ValueError(f"warpforge: '{name}' has shape {tuple(w.shape)}; expected ({n},) to match the last dimension of '{x_name}'")
    check_same(name, w, x_name, x, shape=False, dtype=False)


def normalize_dim(name: str, dim: int, ndim: int) -> int:
    if not isinstance(dim, int):
        raise TypeError(f"warpforge: '{name}' must be an int, got {type(dim).__name__}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"warpforge: '{name}'={dim} is out of range for a {ndim}-d tensor")
    return dim % max(ndim, 1)


def check_normalized_shape(normalized_shape, x: torch.Tensor) -> int:
    """warpforge norms normalise over the last dimension only; returns its size."""
    if isinstance(normalized_shape, (int, torch.SymInt)):
        normalized_shape = (normalized_shape,)
    try:
        normalized_shape = tuple(as_index(s) for s in normalized_shape)
    except TypeError:        # None, a float, a string of digits: torch raises too
        raise TypeError(f"warpforge: 'normalized_shape' is {normalized_shape!r}; expected an int or a sequence "
                        f"of ints (as torch.nn.functional.layer_norm)") from None
    if len(normalized_shape) != 1 or x.dim() < 1 or normalized_shape[0] != x.shape[-1]:
        raise ValueError(
            f"warpforge: 'normalized_shape' {normalized_shape} does not match input of shape {tuple(x.shape)}; "
            f"expected a single size equal to the last dimension ({x.shape[-1] if x.dim() else 'none'})"
        )
    return normalized_shape[0]


BACKENDS = ("triton", "cuda")


def check_backend(backend) -> str:
    """``"triton"`` (default) or ``"cuda"`` (the C++ extension, warpforge.cuda); for "cuda", raises
    warpforge.cuda.CudaBackendUnavailable with the reason where it cannot run."""
    if backend not in BACKENDS:
        raise ValueError(f"warpforge: 'backend' is {backend!r}; expected one of {', '.join(map(repr, BACKENDS))}")
    if backend == "cuda":
        from .. import cuda

        cuda.ops()   # builds/loads on first use; raises with the reason where unavailable
    return backend
