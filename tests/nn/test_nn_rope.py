"""warpforge.nn.RotaryEmbedding's table (tests/ops/test_rope.py checks the rotation itself)."""
import torch

from warpforge.nn.rope import RotaryEmbedding
from conftest import DEVICE, assert_close, randn


def test_table_uses_base():
    """The angles are pos * base^(-2i/D) with the module's base (it had used 10,000 whatever base was)."""
    for base in (10000.0, 500.0):
        m = RotaryEmbedding(8, 12, base=base)
        inv = 1.0 / base ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
        ang = torch.arange(12, dtype=torch.float64)[:, None] * inv
        assert torch.equal(m.cos_cached, ang.cos().float()) and torch.equal(m.sin_cached, ang.sin().float()), base
        assert m.cos_cached.shape == (12, 4) and f"base={base}" in repr(m)


def test_module_cast_keeps_the_tables_fp32():
    """.bfloat16() / .half() / .to(dtype) on the module (as on a whole model) leave the tables fp32
    with their values (they were rounded to 16 bits, off the docstring's fp32 angles); the cast
    module still rotates 16-bit q and k."""
    m = RotaryEmbedding(16, 40).to(DEVICE)
    cos, sin = m.cos_cached.clone(), m.sin_cached.clone()
    for cast in (lambda m: m.bfloat16(), lambda m: m.half(), lambda m: m.to(torch.bfloat16),
                 lambda m: m.to(DEVICE, torch.float16)):
        m = cast(m)
        assert m.cos_cached.dtype == m.sin_cached.dtype == torch.float32
        assert torch.equal(m.cos_cached, cos) and torch.equal(m.sin_cached, sin)
    q = randn(1, 2, 5, 16, dtype=torch.bfloat16)
    qr, kr = m(q, q.clone(), 30)
    assert qr.dtype == kr.dtype == torch.bfloat16 and torch.isfinite(qr.float()).all()


def test_compile_dynamic_shapes():
    """torch.compile(module, dynamic=True, fullgraph=True) over two sequence lengths: the module's
    tables have static shapes while q/k's head dim is symbolic, and apply_rope's table-width check
    (a constant tested for membership in a tuple of symbolic sizes, which Dynamo answers False)
    raised ValueError while tracing a valid call."""
    m = RotaryEmbedding(16, 32, device=DEVICE)
    torch._dynamo.reset()
    f = torch.compile(m, dynamic=True, fullgraph=True)
    for seq in (5, 9):
        q, k = randn(2, 4, seq, 16), randn(2, 2, seq, 16)
        qo, ko = f(q, k)
        want_q, want_k = m(q, k)
        assert_close(qo, want_q.double(), torch.float32, what=f"compiled q, S={seq}")
        assert_close(ko, want_k.double(), torch.float32, what=f"compiled k, S={seq}")
