"""``RotaryEmbedding``: the cos/sin table of RoPE and a forward that rotates q and k with
:func:`warpforge.ops.rope.apply_rope` (one kernel launch for both)."""
from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..ops.rope import apply_rope
from ._buffers import apply_keeping_dtype


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with the standard inverse frequencies base^(-2i/D).

    The table is kept half-size, (max_position_embeddings, head_dim / 2) in fp32 (one angle per
    pair), as non-persistent buffers ``cos_cached`` and ``sin_cached``: half the table bytes of HF's
    full-width rows, and the same result for both pairings. Angles are computed in float64 and
    rounded once to fp32; casting the module (``.bfloat16()``) leaves the tables in fp32.
    """

    def __init__(self, head_dim: int, max_position_embeddings: int = 4096, base: float = 10000.0,
                 interleaved: bool = False, device=None) -> None:
        super().__init__()
        if not isinstance(head_dim, numbers.Integral) or head_dim <= 0 or head_dim % 2:
            raise ValueError(f"warpforge: 'head_dim' is {head_dim!r}; expected a positive even number")
        if not isinstance(max_position_embeddings, numbers.Integral) or max_position_embeddings <= 0:
            raise ValueError(f"warpforge: 'max_position_embeddings' is {max_position_embeddings!r}; expected an int >= 1")
        if not (isinstance(base, numbers.Real) and 0 < base < math.inf):
            # base 0 or < 0 makes inf/NaN angles: every rotated value NaN
            raise ValueError(f"warpforge: 'base' is {base!r}; expected a finite number > 0")
        self.head_dim = int(head_dim)
        self.max_position_embeddings = int(max_position_embeddings)
        self.base = float(base)
        self.interleaved = bool(interleaved)
        inv_freq = 1.0 / (self.base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        t = torch.arange(max_position_embeddings, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)                                   # (T, D/2)
        self.register_buffer("cos_cached", freqs.cos().float().to(device), persistent=False)
        self.register_buffer("sin_cached", freqs.sin().float().to(device), persistent=False)

    def _apply(self, fn, recurse=True):
        # the tables stay fp32 through module casts (.bfloat16() would round the angles' cos/sin)
        return apply_keeping_dtype(self, fn, recurse, ("cos_cached", "sin_cached"))

    def forward(self, q: torch.Tensor, k: torch.Tensor, position_ids: int | torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, Hq, S, D), k (B, Hk, S, D) -> rotated (q, k); ``position_ids`` as in ``apply_rope``
        (None: positions 0..S-1; an int offset; or a (S,)/(B, S) tensor of positions)."""
        for name, t in (("q", q), ("k", k)):
            # the table is half-size (D/2 columns): a q of head dim D/2 would read it as a full-width
            # table of another head dim, and rotate by the wrong angles without an error
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] != self.head_dim:
                raise ValueError(f"warpforge: '{name}' has head dim {t.shape[-1]}; this RotaryEmbedding was built "
                                 f"for head_dim={self.head_dim}")
        return apply_rope(q, k, self.cos_cached, self.sin_cached, position_ids, self.interleaved)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, max_position_embeddings={self.max_position_embeddings}, "
                f"base={self.base}, interleaved={self.interleaved}")
