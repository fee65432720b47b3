import torch
import pytest

from warpforge.nn.norms import AddRMSNorm, LayerNorm, RMSNorm
from conftest import DEVICE, assert_close, randn


def test_layer_norm_module_loads_torch_state_dict():
    ref = torch.nn.LayerNorm(24, eps=1e-6, device=DEVICE)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    mod = LayerNorm(24, eps=1e-6, device=DEVICE)
    mod.load_state_dict(ref.state_dict())
    x = randn(3, 24)
    assert_close(mod(x), ref(x.double().float()).double(), torch.float32)
    nob = LayerNorm(24, bias=False, device=DEVICE)
    assert nob.bias is None and set(nob.state_dict()) == {"weight"}
    assert LayerNorm(24, elementwise_affine=False).weight is None


def test_rms_norm_module_and_gemma_init():
    ref = torch.nn.RMSNorm(16, eps=1e-6, device=DEVICE)
    with torch.no_grad():
        ref.weight.normal_()
    mod = RMSNorm(16, eps=1e-6, device=DEVICE)
    mod.load_state_dict(ref.state_dict())
    x = randn(4, 16, requires_grad=True)
    assert_close(mod(x), ref(x.detach()), torch.float32)
    mod(x).sum().backward()
    assert mod.weight.grad is not None and x.grad is not None
    gemma = RMSNorm(16, offset=1.0, device=DEVICE)
    assert torch.equal(gemma.weight, torch.zeros(16, device=DEVICE))
    assert_close(gemma(x.detach()), torch.nn.functional.rms_norm(x.detach().double(), (16,)), torch.float32)
    with pytest.raises(ValueError, match="casting_mode"):
        RMSNorm(16, casting_mode="fp8")


def test_add_rms_norm_module():
    mod = AddRMSNorm(32, eps=1e-6, device=DEVICE)
    x, r = randn(2, 5, 32), randn(2, 5, 32)
    normed, h = mod(x, r)
    assert_close(h, x.double() + r.double(), torch.float32)
    assert_close(normed, torch.nn.functional.rms_norm((x + r).double(), (32,), eps=1e-6), torch.float32)
    assert torch.equal(AddRMSNorm(8, offset=1.0).weight, torch.zeros(8))


def test_constructors_check_sizes_and_options():
    """Sizes <= 0 or not ints failed inside torch.ones/empty ("negative dimension") or int() (or
    built a module no input fits); eps < 0 and a NaN offset were caught only at the forward, or
    never (the offset gave an all-NaN output)."""
    for cls in (LayerNorm, RMSNorm):
        for bad in (0, -1, (2, 8)):
            with pytest.raises(ValueError, match="'normalized_shape'"):
                cls(bad)
        for bad in (8.5, None, "8"):
            with pytest.raises(TypeError, match="'normalized_shape' is"):
                cls(bad)
        with pytest.raises(ValueError, match="'eps' must be a non-negative float"):
            cls(8, eps=-1.0)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="'hidden_size'"):
            AddRMSNorm(bad)
    with pytest.raises(TypeError, match="'hidden_size' is 'x'"):
        AddRMSNorm("x")
    for cls in (RMSNorm, AddRMSNorm):
        with pytest.raises(ValueError, match="'offset' is nan; expected a finite number"):
            cls(8, offset=float("nan"))
        with pytest.raises(TypeError, match="'offset' must be a real number, got str"):
            cls(8, offset="a")
    assert LayerNorm(torch.Size([8])).normalized_shape == (8,) and AddRMSNorm(8).hidden_size == 8
