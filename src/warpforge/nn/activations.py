"""Module wrappers of the gated activations (``warpforge.ops.activations``), and the Llama MLP."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.activations import geglu, swiglu


class SwiGLU(nn.Module):
    """``silu(gate) * up``; ``forward(gate)`` alone takes a fused [..., 2n] gate_up tensor
    (first half gate, second half up) and returns [..., n]."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        return swiglu(gate, up)


class GeGLU(nn.Module):
    """``gelu(gate, approximate) * up``, with the same two calling forms as :class:`SwiGLU`."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"warpforge: 'approximate' is {approximate!r}; expected 'none' or 'tanh'")
        self.approximate = approximate

    def forward(self, gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        return geglu(gate, up, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SwiGLUMLP(nn.Module):
    """The Llama MLP: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, with warpforge's SwiGLU kernel
    in the middle. Parameter names match Hugging Face's ``LlamaMLP``, so its state dict loads as is."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # (..., hidden) -> (..., hidden)
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
