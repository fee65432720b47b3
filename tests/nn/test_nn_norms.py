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


def test_options_reach_the_kernels():
    """eps, offset and casting_mode given to the constructors reach the kernels: against the float64
    references with those options. (eps = 0.5 on unit-variance rows moves the output by ~18%; the
    modules had dropped eps for the functions' defaults, 1e-5 and finfo.eps, unseen at eps=1e-6.)"""
    from warpforge.ops.norms import layer_norm_reference, rms_norm, rms_norm_reference

    x, r, w, b = randn(3, 5, 16), randn(3, 5, 16), randn(16), randn(16)
    ln = LayerNorm(16, eps=0.5, device=DEVICE)
    rms = RMSNorm(16, eps=0.5, offset=1.0, device=DEVICE)
    add = AddRMSNorm(16, eps=0.5, offset=1.0, device=DEVICE)
    with torch.no_grad():
        for m in (ln, rms, add):
            m.weight.copy_(w)
        ln.bias.copy_(b)
    xd, wd = x.double(), w.double()
    assert_close(ln(x), layer_norm_reference(xd, wd, b.double(), eps=0.5), torch.float32, what="LayerNorm eps")
    assert_close(rms(x), rms_norm_reference(xd, wd, eps=0.5, offset=1.0), torch.float32, what="RMSNorm eps, offset")
    normed, h = add(x, r)
    assert_close(normed, rms_norm_reference(h.double(), wd, eps=0.5, offset=1.0), torch.float32,
                 what="AddRMSNorm eps, offset")
    # casting_mode="llama" rounds x_hat to bf16 before the weight: the functional call's bits, not "gemma"'s
    llama = RMSNorm(16, casting_mode="llama", device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        llama.weight.copy_(w * 3)
    xb = randn(8, 16, dtype=torch.bfloat16, scale=3.0)
    y = llama(xb)
    assert torch.equal(y, rms_norm(xb, (16,), llama.weight, casting_mode="llama"))
    assert not torch.equal(y, rms_norm(xb, (16,), llama.weight)), "llama and gemma rounding agree on this input"


def test_parameters_dtype_and_reset():
    """Parameters in the requested dtype; reset_parameters() restores torch's init (LayerNorm: ones
    and zeros; RMSNorm/AddRMSNorm: ones, or zeros with offset=1.0); no bias without an affine."""
    bf = torch.bfloat16
    for m in (LayerNorm(8, device=DEVICE, dtype=bf), RMSNorm(8, device=DEVICE, dtype=bf),
              AddRMSNorm(8, device=DEVICE, dtype=bf)):
        params = dict(m.named_parameters())
        assert params and all(p.dtype == bf and p.device.type == DEVICE for p in params.values()), type(m).__name__
    ones, zeros = torch.ones(8, device=DEVICE), torch.zeros(8, device=DEVICE)
    for m, want in ((LayerNorm(8, device=DEVICE), (ones, zeros)), (RMSNorm(8, device=DEVICE), (ones,)),
                    (RMSNorm(8, offset=1.0, device=DEVICE), (zeros,)), (AddRMSNorm(8, device=DEVICE), (ones,)),
                    (AddRMSNorm(8, offset=1.0, device=DEVICE), (zeros,))):
        with torch.no_grad():
            for p in m.parameters():
                p.normal_()
        m.reset_parameters()
        got = list(m.parameters())
        assert len(got) == len(want) and all(torch.equal(g, v) for g, v in zip(got, want)), repr(m)
    bare = LayerNorm(8, elementwise_affine=False)
    assert bare.weight is None and bare.bias is None and not list(bare.parameters())
