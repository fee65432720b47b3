import pytest
import torch
import torch.nn.functional as F

import warpforge
from warpforge.nn.linear import Linear
from warpforge.ops.matmul import ACTIVATIONS, _act_reference
from conftest import DEVICE, DTYPES, assert_close, randn


def _leaf(t):
    return None if t is None else t.detach().double().requires_grad_()


def test_state_dict_both_ways():
    ref = torch.nn.Linear(33, 17, device=DEVICE)
    mod = Linear(33, 17, activation="silu", device=DEVICE)
    assert set(mod.state_dict()) == {"weight", "bias"}
    assert {k: v.shape for k, v in mod.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    mod.load_state_dict(ref.state_dict())
    x = randn(2, 5, 33)
    assert_close(mod(x), F.silu(ref(x.double().float()).double()), torch.float32, what="torch -> warpforge")
    mod2 = Linear(33, 17, device=DEVICE)
    with torch.no_grad():
        mod2.weight.normal_()
        mod2.bias.normal_()
    ref.load_state_dict(mod2.state_dict())
    assert torch.equal(ref.weight, mod2.weight) and torch.equal(ref.bias, mod2.bias)
    assert_close(mod2(x), F.linear(x.double(), ref.weight.double(), ref.bias.double()), torch.float32,
                 what="warpforge -> torch")
    nob = Linear(8, 4, bias=False, device=DEVICE)
    assert nob.bias is None and set(nob.state_dict()) == {"weight"}
    assert isinstance(mod, torch.nn.Linear) and warpforge.nn.Linear is Linear


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", list(ACTIVATIONS), ids=str)
def test_forward_backward(activation, dtype):
    mod = Linear(45, 17, activation=activation, device=DEVICE, dtype=dtype)
    assert mod.weight.dtype == dtype
    x = randn(3, 7, 45, dtype=dtype, requires_grad=True)
    res = randn(3, 7, 17, dtype=dtype, requires_grad=True)
    y = mod(x, res)
    assert y.shape == (3, 7, 17) and y.dtype == dtype
    xr, wr, br, rr = _leaf(x), _leaf(mod.weight), _leaf(mod.bias), _leaf(res)
    yr = _act_reference(F.linear(xr, wr, br), activation) + rr
    assert_close(y, yr, dtype, what="forward")
    dy = randn(3, 7, 17, dtype=dtype)
    y.backward(dy)
    yr.backward(dy.double())
    for name, g, r in (("x", x.grad, xr.grad), ("weight", mod.weight.grad, wr.grad),
                       ("bias", mod.bias.grad, br.grad), ("residual", res.grad, rr.grad)):
        assert g is not None and g.dtype == dtype, name
        assert_close(g, r, dtype, scale=2.0, what=f"d{name}")


def test_matches_torch_linear_without_residual():
    ref = torch.nn.Linear(24, 10, bias=False, device=DEVICE)
    mod = Linear(24, 10, bias=False, activation="relu", device=DEVICE)
    mod.load_state_dict(ref.state_dict())
    x = randn(6, 24, requires_grad=True)
    xr = _leaf(x)
    y = mod(x)
    yr = F.relu(F.linear(xr, ref.weight.double()))
    assert_close(y, yr, torch.float32)
    y.sum().backward()
    yr.sum().backward()
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0)
    assert mod.weight.grad is not None and mod.weight.grad.shape == (10, 24)


def test_repr_and_bad_activation():
    assert "activation='gelu_tanh'" in repr(Linear(4, 3, activation="gelu_tanh"))
    assert "activation" not in repr(Linear(4, 3))
    assert "in_features=4, out_features=3" in repr(Linear(4, 3))
    with pytest.raises(ValueError, match="'activation' is 'swish'; expected one of None, 'none', 'relu'"):
        Linear(4, 3, activation="swish")
    mod = Linear(4, 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"'residual' has shape \(2, 4\); expected \(2, 3\)"):
        mod(randn(2, 4), randn(2, 4))
    with pytest.raises(ValueError, match="in_features=5"):
        mod(randn(2, 5))
