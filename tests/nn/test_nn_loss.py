"""nn.CrossEntropyLoss and nn.LinearCrossEntropyLoss: thin modules over warpforge.cross_entropy and
warpforge.linear_cross_entropy (same numbers, bit for bit), drop-in for torch.nn.CrossEntropyLoss
(same state dict, same loss), class weights as buffers that follow .to()."""
import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, assert_close, gpu_only, randn

import warpforge
from warpforge.nn import CrossEntropyLoss, LinearCrossEntropyLoss


def _leaf(t):
    return None if t is None else t.detach().double().requires_grad_()


def _targets(n, v, ignore_index=-100):
    t = torch.randint(0, v, (n,), device=DEVICE)
    t[1::4] = ignore_index
    return t


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_loss_matches_torch_module(reduction):
    w = torch.rand(37, device=DEVICE) + 0.5
    mod = CrossEntropyLoss(weight=w, ignore_index=3, reduction=reduction, label_smoothing=0.1)
    ref_mod = torch.nn.CrossEntropyLoss(weight=w.double(), ignore_index=3, reduction=reduction, label_smoothing=0.1)
    x = randn(9, 37, requires_grad=True, scale=2.0)
    t = _targets(9, 37, ignore_index=3)
    out = mod(x, t)
    xr = _leaf(x)
    ref = ref_mod(xr, t)
    assert out.shape == ref.shape
    assert_close(out, ref, torch.float32, what="forward")
    g = torch.randn(ref.shape, device=DEVICE)
    out.backward(g)
    ref.backward(g.double())
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="backward")


def test_cross_entropy_loss_matches_functional():
    """z_loss and softcap (which torch's module lacks) are passed through: the module's loss and
    gradient are the functional call's exactly."""
    w = torch.rand(37, device=DEVICE) + 0.5
    opts = {"ignore_index": -1, "reduction": "sum", "label_smoothing": 0.05, "z_loss": 0.02, "softcap": 5.0}
    mod = CrossEntropyLoss(weight=w, **opts)
    x = randn(3, 37, 4, requires_grad=True, scale=3.0)              # (N, C, d1): class dim 1
    t = torch.randint(0, 37, (3, 4), device=DEVICE)
    t[0, 1] = -1
    out = mod(x, t)
    out.backward(torch.tensor(0.3, device=DEVICE))
    g_mod = x.grad.clone()
    x.grad = None
    ref = warpforge.cross_entropy(x, t, w, **opts)
    ref.backward(torch.tensor(0.3, device=DEVICE))
    assert torch.equal(out, ref) and torch.equal(g_mod, x.grad)
    # and the options really reach the kernel: without them the loss differs
    assert not torch.allclose(out, warpforge.cross_entropy(x, t, w, ignore_index=-1, reduction="sum"))


def test_cross_entropy_loss_state_dict_and_to():
    w = torch.rand(11, device=DEVICE) + 0.5
    mod = CrossEntropyLoss(weight=w)
    assert set(mod.state_dict()) == {"weight"} and "weight" in dict(mod.named_buffers())
    # torch's module has the same state dict: load it, both ways
    w2 = torch.rand(11, device=DEVICE) + 0.5
    mod.load_state_dict(torch.nn.CrossEntropyLoss(weight=w2).state_dict())
    assert torch.equal(mod.weight, w2)
    x, t = randn(6, 11), torch.randint(0, 11, (6,), device=DEVICE)
    assert_close(mod(x, t), F.cross_entropy(x.double(), t, w2.double()), torch.float32)
    ref = torch.nn.CrossEntropyLoss(weight=torch.ones(11, device=DEVICE))
    ref.load_state_dict(mod.state_dict())
    assert torch.equal(ref.weight, w2)
    assert set(CrossEntropyLoss().state_dict()) == set(torch.nn.CrossEntropyLoss().state_dict()) == set()
    # the weight is a buffer: it follows the module's dtype and device
    mod.to(torch.bfloat16)
    assert mod.weight.dtype == torch.bfloat16
    xb = x.bfloat16()
    assert torch.equal(mod(xb, t), warpforge.cross_entropy(xb, t, w2.bfloat16()))
    assert mod.to("meta").weight.device.type == "meta"


@gpu_only
def test_weight_follows_module_to_cuda():
    mod = CrossEntropyLoss(weight=torch.rand(11) + 0.5, z_loss=0.01).to("cuda")
    assert mod.weight.device.type == "cuda"
    x, t = torch.randn(6, 11, device="cuda"), torch.randint(0, 11, (6,), device="cuda")
    ref = warpforge.ops.cross_entropy.cross_entropy_reference(x, t, mod.weight, z_loss=0.01)
    assert_close(mod(x, t), ref, torch.float32)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_loss(reduction):
    cw = torch.rand(40, device=DEVICE) + 0.5
    mod = LinearCrossEntropyLoss(reduction=reduction, label_smoothing=0.1, z_loss=0.01, softcap=8.0, ce_weight=cw,
                                 chunk_size=3)
    h = randn(2, 4, 16, requires_grad=True)
    w = randn(40, 16, requires_grad=True, scale=0.5)
    b = randn(40, requires_grad=True)
    t = _targets(8, 40).reshape(2, 4)
    out = mod(h, w, t, b)
    assert out.shape == ((2, 4) if reduction == "none" else ())
    g = torch.randn(out.shape, device=DEVICE)
    out.backward(g)
    grads = [p.grad.clone() for p in (h, w, b)]
    for p in (h, w, b):
        p.grad = None
    ref = warpforge.linear_cross_entropy(h, w, t, b, -100, reduction, 0.1, 0.01, 8.0, ce_weight=cw, chunk_size=3)
    ref.backward(g)
    assert torch.equal(out, ref)
    for name, got, p in zip(("hidden", "weight", "bias"), grads, (h, w, b)):
        assert torch.equal(got, p.grad), name
    # against torch on the materialised logits (float64), label smoothing and class weights included
    hr, wr, br = _leaf(h), _leaf(w), _leaf(b)
    logits = 8.0 * torch.tanh((hr.reshape(8, 16) @ wr.T + br) / 8.0)
    ce = F.cross_entropy(logits, t.reshape(8), cw.double(), reduction="none", label_smoothing=0.1)
    valid = t.reshape(8) != -100
    zt = 0.01 * torch.logsumexp(logits, -1) ** 2 * valid
    if reduction == "none":
        full = (ce + zt).reshape(2, 4)
    else:
        full = ce.sum() / cw.double()[t.reshape(8)[valid]].sum() + zt.sum() / valid.sum()
    assert_close(out, full, torch.float32, what="vs torch")
    full.backward(g.double())
    for name, got, r in zip(("hidden", "weight", "bias"), grads, (hr, wr, br)):
        assert_close(got, r.grad, torch.float32, scale=2.0, what=f"d{name} vs torch")


def test_linear_cross_entropy_loss_buffer_and_repr():
    cw = torch.rand(40, device=DEVICE) + 0.5
    mod = LinearCrossEntropyLoss(ce_weight=cw, z_loss=1e-4, softcap=30.0, chunk_size=64)
    assert set(mod.state_dict()) == {"ce_weight"} and torch.equal(mod.ce_weight, cw)
    assert mod.to(torch.float16).ce_weight.dtype == torch.float16
    assert mod.to("meta").ce_weight.device.type == "meta"
    assert set(LinearCrossEntropyLoss().state_dict()) == set()
    r = repr(LinearCrossEntropyLoss(ignore_index=-1, reduction="sum", z_loss=1e-4, softcap=30.0, chunk_size=64))
    for part in ("ignore_index=-1", "reduction='sum'", "z_loss=0.0001", "softcap=30.0", "chunk_size=64"):
        assert part in r, r
    r = repr(CrossEntropyLoss(label_smoothing=0.1, z_loss=1e-4))
    assert "label_smoothing=0.1" in r and "z_loss=0.0001" in r, r
    assert warpforge.nn.CrossEntropyLoss is CrossEntropyLoss
    assert warpforge.nn.LinearCrossEntropyLoss is LinearCrossEntropyLoss


def test_bad_options_reach_the_user():
    x, t = randn(4, 7), torch.randint(0, 7, (4,), device=DEVICE)
    with pytest.raises(ValueError, match="'reduction' is 'avg'"):
        CrossEntropyLoss(reduction="avg")(x, t)
    with pytest.raises(ValueError, match=r"'weight' has shape \(6,\); expected \(7,\)"):
        CrossEntropyLoss(weight=torch.ones(6, device=DEVICE))(x, t)
    with pytest.raises(ValueError, match="'chunk_size' is 0"):
        LinearCrossEntropyLoss(chunk_size=0)(randn(4, 8), randn(7, 8), t)
    with pytest.raises(ValueError, match="'z_loss' is -1"):
        LinearCrossEntropyLoss(z_loss=-1)(randn(4, 8), randn(7, 8), t)


def test_constructors_check_options():
    """The loss modules checked their options only at the first forward."""
    with pytest.raises(ValueError, match="'reduction' is 'avg'"):
        CrossEntropyLoss(reduction="avg")
    with pytest.raises(ValueError, match="'label_smoothing' is 2.0"):
        CrossEntropyLoss(label_smoothing=2.0)
    with pytest.raises(ValueError, match="'softcap' is -1.0"):
        LinearCrossEntropyLoss(softcap=-1.0)
    with pytest.raises(ValueError, match="'chunk_size' is 0"):
        LinearCrossEntropyLoss(chunk_size=0)
    with pytest.raises(TypeError, match="'ignore_index' must be an int"):
        LinearCrossEntropyLoss(ignore_index=-100.0)


def test_linear_cross_entropy_loss_ignore_index():
    """The module's ignore_index reaches the kernel (it passed the default -100, so targets of the
    chosen class were counted as that class): against torch on the materialised logits."""
    h, w = randn(6, 8, requires_grad=True), randn(5, 8, scale=0.5)
    t = torch.tensor([0, 2, 4, 2, 1, 3], device=DEVICE)
    out = LinearCrossEntropyLoss(ignore_index=2)(h, w, t)
    hr = _leaf(h)
    ref = F.cross_entropy(hr @ w.double().T, t, ignore_index=2)
    assert_close(out, ref, torch.float32, what="forward")
    out.backward()
    ref.backward()
    assert_close(h.grad, hr.grad, torch.float32, scale=2.0, what="dhidden")
    assert float(h.grad[1].abs().sum()) == float(h.grad[3].abs().sum()) == 0.0, "ignored rows got a gradient"
