"""Normalisation layers: thin ``nn.Module`` wrappers of ``warpforge.ops.norms``.

Parameters are named ``weight`` and ``bias`` as in ``torch.nn.LayerNorm``/``torch.nn.RMSNorm``, so
their state dicts load unchanged.
"""
from __future__ import annotations

import operator

import torch
from torch import nn

from ..ops.norms import CASTING_MODES, _check_eps, add_rms_norm, layer_norm, rms_norm
from ..runtime.checks import check_finite


def _last_dim(normalized_shape, name: str = "normalized_shape") -> tuple[int]:
    try:
        shape = (operator.index(normalized_shape),)
    except TypeError:
        try:
            shape = tuple(operator.index(s) for s in normalized_shape)
        except TypeError:
            what = "an int or a sequence of one int" if name == "normalized_shape" else "an int"
            raise TypeError(f"warpforge: '{name}' is {normalized_shape!r}; expected {what}") from None
    if len(shape) != 1:
        raise ValueError(f"warpforge: '{name}' {shape}: warpforge norms normalise over the last dimension only; expected one size")
    if shape[0] < 1:
        raise ValueError(f"warpforge: '{name}' {shape}: expected a positive size")
    return shape


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` over the last dimension, on warpforge kernels."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _last_dim(normalized_shape)
        self.eps = _check_eps(eps)
        self.elementwise_affine = elementwise_affine
        kw = {"device": device, "dtype": dtype}
        self.register_parameter(
            "weight", nn.Parameter(torch.ones(self.normalized_shape, **kw)) if elementwise_affine else None)
        self.register_parameter(
            "bias", nn.Parameter(torch.zeros(self.normalized_shape, **kw)) if elementwise_affine and bias else None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(nn.Module):
    """``torch.nn.RMSNorm`` over the last dimension, plus Gemma's ``offset`` (y = x_hat * (offset + w);
    with offset=1.0 the weight starts at zeros) and HF Llama's rounding (``casting_mode="llama"``)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, *,
                 offset: float = 0.0, casting_mode: str = "gemma", device=None, dtype=None) -> None:
        super().__init__()
        if casting_mode not in CASTING_MODES:
            raise ValueError(f"warpforge: 'casting_mode' must be one of {CASTING_MODES}, got {casting_mode!r}")
        self.normalized_shape = _last_dim(normalized_shape)
        self.eps = None if eps is None else _check_eps(eps)
        self.elementwise_affine = elementwise_affine
        self.offset = check_finite("offset", offset)
        self.casting_mode = casting_mode
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            self.reset_parameters()
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.zeros_(self.weight) if self.offset == 1.0 else nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, offset=self.offset,
                        casting_mode=self.casting_mode)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"offset={self.offset}, casting_mode={self.casting_mode!r}")


class AddRMSNorm(nn.Module):
    """Residual add fused with RMSNorm: ``forward(x, residual)`` returns ``(rms_norm(x + residual),
    x + residual)`` -- the normed activations and the new residual stream."""

    def __init__(self, hidden_size: int, eps: float | None = None, *, offset: float = 0.0,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.hidden_size = _last_dim(hidden_size, "hidden_size")[0]
        self.eps = None if eps is None else _check_eps(eps)
        self.offset = check_finite("offset", offset)
        self.weight = nn.Parameter(torch.empty(self.hidden_size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight) if self.offset == 1.0 else nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(x, residual, self.weight, self.eps, offset=self.offset)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, offset={self.offset}"
