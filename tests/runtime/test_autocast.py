"""torch.autocast and the GEMM-shaped operators (runtime/amp.py).

Inside an autocast region each of these public functions must behave as if its floating-point
inputs had been cast to the region's dtype by hand: the same output bits, gradients back to the
float32 leaves in float32 (the bits of the hand-cast call's gradients, upcast), and the output
dtype of the torch counterpart under the same region. The region is the test device's (CPU under
the interpreter, or CUDA), bf16.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import warpforge as wf
from warpforge.runtime.amp import autocast_inputs

from conftest import DEVICE, ON_GPU, rel_err

BF = torch.bfloat16


def _same_grad(a, b, what):
    """Gradients: bit for bit on the CPU; on a GPU to 1e-3 (the Hopper attention backward sums dQ
    by atomics, in an order that varies from call to call)."""
    if ON_GPU:
        assert rel_err(a, b) <= 1e-3, what
    else:
        assert torch.equal(a, b), what


def _leaves(*ts):
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in ts]


def _case(name):
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g).to(DEVICE)

    if name == "linear":
        return (lambda x, w, b, res: wf.linear(x, w, b, "silu", res)), [r(5, 32), r(24, 32), r(24), r(5, 24)], \
            (lambda x, w, b, res: F.silu(F.linear(x, w, b)))   # the residual joins in the region's dtype
    if name == "matmul":
        return wf.matmul, [r(2, 5, 32), r(2, 32, 24)], torch.matmul
    if name == "sdpa":
        mask = r(16, 16)
        # the region casts the float mask too (as torch's SDPA does); by hand: to q's dtype
        return (lambda q, k, v: wf.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))), \
            [r(1, 2, 16, 64), r(1, 2, 16, 64), r(1, 2, 16, 64)], \
            (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    if name == "varlen":
        cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=DEVICE)
        return (lambda q, k, v: wf.attention_varlen(q, k, v, cu, cu, 7, 7, causal=True)), \
            [r(12, 2, 32), r(12, 1, 32), r(12, 1, 32)], None
    if name == "lce":
        tgt = torch.randint(0, 40, (6,), generator=g).to(DEVICE)
        return (lambda h, w, b: wf.linear_cross_entropy(h, w, tgt, b)), [r(6, 32), r(40, 32), r(40)], None
    if name == "moe":
        ids = torch.tensor([[0, 2], [1, 2], [2, 0], [1, 0], [2, 1]], dtype=torch.int32, device=DEVICE)
        wts = torch.softmax(r(5, 2), -1)
        return (lambda x, w1, w2: wf.moe_experts(x, w1, w2, wts, ids)), \
            [r(5, 32), r(3, 32, 32) / 6, r(3, 32, 16) / 4], None
    raise KeyError(name)


@pytest.mark.parametrize("name", ["linear", "matmul", "sdpa", "varlen", "lce", "moe"])
def test_autocast_casts_like_torch(name):
    """Autocast region with float32 inputs == the call on inputs cast to bf16 by hand (output bits,
    gradients of the float32 leaves), and the torch counterpart's output dtype. Without the casts
    the region computed in float32 and returned float32."""
    fn, inputs, torch_fn = _case(name)
    leaves = _leaves(*inputs)
    with torch.autocast(DEVICE, dtype=BF):
        out = fn(*leaves)
        if torch_fn is not None:
            assert out.dtype == torch_fn(*[t.detach() for t in inputs]).dtype == BF
    hand = _leaves(*[t.to(BF) for t in inputs])
    ref = fn(*hand)
    assert out.dtype == ref.dtype
    assert torch.equal(out, ref) and not out.isnan().any()
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, out.dtype)
    out.backward(dy)
    ref.backward(dy)
    for a, b in zip(leaves, hand):
        assert a.grad.dtype == torch.float32
        _same_grad(a.grad, b.grad.float(), name)


def test_autocast_takes_mixed_dtypes():
    """The mixed inputs autocast exists for (a bf16 activation, float32 parameters) are taken inside
    a region and still refused outside one, naming the argument."""
    x, w, b = torch.randn(4, 16, dtype=BF, device=DEVICE), torch.randn(8, 16, device=DEVICE), torch.randn(8, device=DEVICE)
    with torch.autocast(DEVICE, dtype=BF):
        y = wf.linear(x, w, b)
    assert y.dtype == BF and torch.equal(y, wf.linear(x, w.to(BF), b.to(BF)))
    with pytest.raises(TypeError, match="'weight'"):
        wf.linear(x, w, b)
    q = torch.randn(1, 2, 8, 32, device=DEVICE)
    with torch.autocast(DEVICE, dtype=BF):
        o = wf.scaled_dot_product_attention(q.to(BF), q, q)
    assert o.dtype == BF


def test_autocast_compiled():
    """Under torch.compile(fullgraph=True) the region's casts are traced: same dtype and bits as
    eager in the region."""
    x, w = torch.randn(5, 32, device=DEVICE), torch.randn(24, 32, device=DEVICE)
    q = torch.randn(1, 2, 16, 32, device=DEVICE)

    def f(a, b, c):
        return wf.linear(a, b), wf.scaled_dot_product_attention(c, c, c, is_causal=True)

    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    with torch.autocast(DEVICE, dtype=BF):
        eager, compiled = f(x, w, q), g(x, w, q)
    for e, c in zip(eager, compiled):
        assert c.dtype == BF and torch.equal(e, c)
    outside = g(x, w, q)     # out of the region again: float32 (a recompile, not the region's graph)
    assert all(t.dtype == torch.float32 for t in outside)


def test_autocast_inputs_rules():
    """What is cast: floating tensors on the region's device type, not float64, not integer or bool
    tensors, not None; nothing at all outside a region or in a disabled one."""
    f32, f64, i32, flag = (torch.randn(2, device=DEVICE), torch.randn(2, dtype=torch.float64, device=DEVICE),
                           torch.ones(2, dtype=torch.int32, device=DEVICE), torch.ones(2, dtype=torch.bool, device=DEVICE))
    other = torch.randn(2, device="cpu" if ON_GPU else "meta")   # another device type: never cast
    assert autocast_inputs(f32, f64, i32, flag, None) == (f32, f64, i32, flag, None)
    with torch.autocast(DEVICE, dtype=BF):
        a, b, c, d, e, o = autocast_inputs(f32, f64, i32, flag, None, other)
        with torch.autocast(DEVICE, enabled=False):
            assert autocast_inputs(f32)[0] is f32
    assert a.dtype == BF and b is f64 and c is i32 and d is flag and e is None and o is other
    with torch.autocast(DEVICE, dtype=BF):     # a device type without autocast (meta) leads: nothing cast
        meta = torch.randn(2, device="meta")
        assert autocast_inputs(meta, f32) == (meta, f32)


def test_row_ops_keep_their_dtype_under_autocast():
    """The row ops are not cast (module docstring of runtime/amp.py): float32 in, float32 out, the
    same bits as outside the region; bf16 in, bf16 out."""
    x, w = torch.randn(4, 64, device=DEVICE), torch.randn(64, device=DEVICE)
    with torch.autocast(DEVICE, dtype=BF):
        y = wf.rms_norm(x, (64,), w)
        z = wf.rms_norm(x.to(BF), (64,), w)
    assert y.dtype == torch.float32 and torch.equal(y, wf.rms_norm(x, (64,), w))
    assert z.dtype == BF


def test_float32_model_trains_in_an_autocast_region():
    """The usual mixed-precision step: float32 parameters, a bf16 region around the forward, the
    backward outside it. Every parameter gets a float32 gradient; the linear layers' equal the
    ones of the same model on bf16 copies of its parameters (upcast), and so does the loss. The
    norm's weight is not cast (a row op): its gradient is that one before the rounding to bf16."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(wf.nn.Linear(32, 48, activation="silu"), wf.nn.RMSNorm(48), wf.nn.Linear(48, 16))
    twin = torch.nn.Sequential(wf.nn.Linear(32, 48, activation="silu"), wf.nn.RMSNorm(48), wf.nn.Linear(48, 16))
    twin.load_state_dict(model.state_dict())
    model.to(DEVICE)
    twin.to(DEVICE, BF)
    x = torch.randn(6, 32, device=DEVICE)
    with torch.autocast(DEVICE, dtype=BF):
        loss = model(x).float().square().mean()
    loss.backward()
    ref = twin(x.to(BF)).float().square().mean()
    ref.backward()
    assert torch.equal(loss, ref) and loss.isfinite()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert p.dtype == p.grad.dtype == torch.float32, name
        if name.startswith("1."):
            torch.testing.assert_close(p.grad, q.grad.float(), rtol=1e-2, atol=1e-5)
        else:
            _same_grad(p.grad, q.grad.float(), name)


def test_autocast_region_dtype_and_device_type():
    """The region's own dtype (fp16 as well as bf16), and only a region of the tensors' device
    type: one for another device type (CPU tensors in an XPU region; CUDA tensors in a CPU
    region) casts nothing, though some autocast is on."""
    x, w = torch.randn(4, 16, device=DEVICE), torch.randn(8, 16, device=DEVICE)
    for dt in (torch.float16, BF):
        with torch.autocast(DEVICE, dtype=dt):
            assert autocast_inputs(x)[0].dtype == dt
            y = wf.linear(x, w)
        assert y.dtype == dt and torch.equal(y, wf.linear(x.to(dt), w.to(dt))), dt
    with torch.autocast("cpu" if ON_GPU else "xpu", dtype=BF):
        assert torch._C._is_any_autocast_enabled()
        assert autocast_inputs(x)[0] is x
