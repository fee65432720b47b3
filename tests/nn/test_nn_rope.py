"""warpforge.nn.RotaryEmbedding's table (tests/ops/test_rope.py checks the rotation itself)."""
import torch

from warpforge.nn.rope import RotaryEmbedding


def test_table_uses_base():
    """The angles are pos * base^(-2i/D) with the module's base (it had used 10,000 whatever base was)."""
    for base in (10000.0, 500.0):
        m = RotaryEmbedding(8, 12, base=base)
        inv = 1.0 / base ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
        ang = torch.arange(12, dtype=torch.float64)[:, None] * inv
        assert torch.equal(m.cos_cached, ang.cos().float()) and torch.equal(m.sin_cached, ang.sin().float()), base
        assert m.cos_cached.shape == (12, 4) and f"base={base}" in repr(m)
