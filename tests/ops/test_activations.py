import pytest
import torch
import torch.nn.functional as F

from warpforge.nn.activations import GeGLU, SwiGLU, SwiGLUMLP
from warpforge.ops.activations import (geglu, geglu_backward_op, geglu_op, geglu_reference, swiglu,
                                       swiglu_backward_op, swiglu_op, swiglu_reference)
from conftest import DTYPES, ON_GPU, DEVICE, assert_close, gpu_only, noncontig, randn

# (rows..., n): n in {1, 7, 123, 4097} and one above 16,384; (37, 1) keeps n = 1 over many elements
SHAPES = [(37, 1), (3, 7), (2, 3, 123), (5, 4097), (1, 16411)]
if ON_GPU:
    SHAPES += [(512, 14336), (3, 65536), (1024, 4097), (4, 33, 2048)]

ACTS = {
    "swiglu": (lambda g, u=None: swiglu(g, u), lambda g: F.silu(g)),
    "geglu_tanh": (lambda g, u=None: geglu(g, u, "tanh"), lambda g: F.gelu(g, approximate="tanh")),
    "geglu_none": (lambda g, u=None: geglu(g, u, approximate="none"), lambda g: F.gelu(g)),
}


def _leaf(t):
    return t.detach().double().requires_grad_()


def _check_two(act, gate, up, dtype, scale=1.0):
    """forward and both gradients of the two-tensor form against float64."""
    fn, ref_act = ACTS[act]
    y = fn(gate, up)
    assert y.dtype == dtype and y.shape == gate.shape and y.is_contiguous()
    gr, ur = _leaf(gate), _leaf(up)
    yr = ref_act(gr) * ur
    assert_close(y, yr, dtype, scale=scale, what="forward")
    dy = randn(*y.shape, dtype=dtype)
    dg, du = torch.autograd.grad(y, (gate, up), dy)
    yr.backward(dy.double())
    assert dg.dtype == dtype and du.dtype == dtype
    assert_close(dg, gr.grad, dtype, scale=2.0 * scale, what="dgate")
    assert_close(du, ur.grad, dtype, scale=scale, what="dup")


def _check_packed(act, x, dtype, scale=1.0):
    """forward and gradient of the one-tensor [..., 2n] form against float64."""
    fn, ref_act = ACTS[act]
    n = x.shape[-1] // 2
    y = fn(x)
    assert y.dtype == dtype and y.shape == (*x.shape[:-1], n)
    xr = _leaf(x)
    yr = ref_act(xr[..., :n]) * xr[..., n:]
    assert_close(y, yr, dtype, scale=scale, what="forward")
    dy = randn(*y.shape, dtype=dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    yr.backward(dy.double())
    assert dx.dtype == dtype and dx.shape == x.shape
    assert_close(dx[..., :n], xr.grad[..., :n], dtype, scale=2.0 * scale, what="dgate half")
    assert_close(dx[..., n:], xr.grad[..., n:], dtype, scale=scale, what="dup half")


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_two_tensors(shape, dtype, act):
    gate = randn(*shape, dtype=dtype, requires_grad=True, scale=2.0)
    up = randn(*shape, dtype=dtype, requires_grad=True)
    _check_two(act, gate, up, dtype)


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_packed(shape, dtype, act):
    x = randn(*shape[:-1], 2 * shape[-1], dtype=dtype, requires_grad=True, scale=2.0)
    _check_packed(act, x, dtype)


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitude_gates(act, dtype):
    """Gates of +-30 (and +-1e4) overflow exp() inside sigmoid/gelu: results and gradients must stay
    finite and right, not NaN."""
    big = torch.tensor([-1e4, -100.0, -30.0, -20.0, -9.0, 0.0, 9.0, 20.0, 30.0, 100.0, 1e4], device=DEVICE)
    gate = torch.cat([big, randn(53, scale=30.0)]).to(dtype).repeat(3, 1).requires_grad_()
    up = randn(*gate.shape, dtype=dtype, requires_grad=True)
    _check_two(act, gate, up, dtype)
    x = torch.cat([gate.detach(), up.detach()], -1).requires_grad_()
    _check_packed(act, x, dtype)
    y = ACTS[act][0](gate, up)
    dg, du = torch.autograd.grad(y, (gate, up), torch.ones_like(y))
    assert torch.isfinite(y).all() and torch.isfinite(dg).all() and torch.isfinite(du).all()


@pytest.mark.parametrize("act", list(ACTS))
def test_noncontiguous(act):
    gate = noncontig(randn(6, 33, requires_grad=True))
    up = noncontig(randn(6, 33, requires_grad=True))
    _check_two(act, gate, up, torch.float32)
    _check_two(act, randn(6, 33, requires_grad=True), up, torch.float32)   # mixed layouts
    x = noncontig(randn(2, 5, 66, requires_grad=True))                     # strided packed rows
    _check_packed(act, x, torch.float32)
    t = randn(40, 9).t().requires_grad_()                                  # column stride != 1: copied
    _check_two(act, t, randn(9, 40, requires_grad=True), torch.float32)
    _check_packed(act, randn(10, 40).t().requires_grad_(), torch.float32)


@pytest.mark.parametrize("act", ["swiglu", "geglu_none"])
def test_expanded_gradient(act):
    """sum().backward() hands the backward a stride-0 gradient."""
    fn, ref_act = ACTS[act]
    for packed in (False, True):
        x = randn(4, 100 if packed else 50, requires_grad=True)
        up = None if packed else randn(4, 50, requires_grad=True)
        fn(x, up).sum().backward()
        xr = _leaf(x)
        yr = ref_act(xr[:, :50]) * xr[:, 50:] if packed else ref_act(xr) * up.detach().double()
        yr.sum().backward()
        assert_close(x.grad, xr.grad, torch.float32)


def test_empty_batch():
    for act in ACTS:
        fn = ACTS[act][0]
        g = torch.empty(0, 8, device=DEVICE, requires_grad=True)
        u = torch.empty(0, 8, device=DEVICE, requires_grad=True)
        y = fn(g, u)
        assert y.shape == (0, 8)
        y.sum().backward()
        assert g.grad.shape == (0, 8) and u.grad.shape == (0, 8)
        p = torch.empty(2, 0, 8, device=DEVICE, requires_grad=True)
        y = fn(p)
        assert y.shape == (2, 0, 4)
        y.sum().backward()
        assert p.grad.shape == (2, 0, 8)


def test_compile_fullgraph():
    g = randn(3, 7, 123, requires_grad=True, scale=2.0)
    u = randn(3, 7, 123, requires_grad=True)
    x = randn(3, 7, 246, requires_grad=True, scale=2.0)

    def f(a, b, c):
        return swiglu(a, b) + geglu(c) * 2

    out = torch.compile(f, fullgraph=True)(g, u, x)
    dy = torch.randn_like(out)
    out.backward(dy)
    gr, ur, xr = _leaf(g), _leaf(u), _leaf(x)
    ref = F.silu(gr) * ur + F.gelu(xr[..., :123], approximate="tanh") * xr[..., 123:] * 2
    ref.backward(dy.double())
    assert_close(out, ref, torch.float32, what="compiled forward")
    for name, a, b in (("gate", g, gr), ("up", u, ur), ("packed", x, xr)):
        assert_close(a.grad, b.grad, torch.float32, scale=2.0, what=f"compiled d{name}")


def test_opcheck():
    g, u = randn(4, 37, requires_grad=True), randn(4, 37, requires_grad=True)
    x = randn(2, 3, 74, requires_grad=True)
    torch.library.opcheck(swiglu_op.overload, (g, u))
    torch.library.opcheck(swiglu_op.overload, (x, None))
    for approximate in ("none", "tanh"):
        torch.library.opcheck(geglu_op.overload, (g, u, approximate))
        torch.library.opcheck(geglu_op.overload, (x, None, approximate))
    dy, dyp = randn(4, 37), randn(2, 3, 37)
    torch.library.opcheck(swiglu_backward_op.overload, (g.detach(), u.detach(), dy))
    torch.library.opcheck(swiglu_backward_op.overload, (x.detach(), None, dyp))
    torch.library.opcheck(geglu_backward_op.overload, (g.detach(), u.detach(), dy, "tanh"))
    torch.library.opcheck(geglu_backward_op.overload, (x.detach(), None, dyp, "none"))


def test_modules():
    for mod, act in ((SwiGLU(), "swiglu"), (GeGLU(), "geglu_tanh"), (GeGLU("none"), "geglu_none")):
        g, u = randn(3, 10, scale=2.0), randn(3, 10)
        ref = ACTS[act][1](g.double()) * u.double()
        assert_close(mod(g, u), ref, torch.float32, what=act)
        assert_close(mod(torch.cat([g, u], -1)), ref, torch.float32, what=f"{act} packed")
    with pytest.raises(ValueError, match="'approximate' is 'exact'"):
        GeGLU("exact")
    mlp = SwiGLUMLP(16, 40).to(DEVICE)
    assert [n for n, _ in mlp.named_parameters()] == ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    x = randn(2, 5, 16, requires_grad=True)
    y = mlp(x)
    assert y.shape == (2, 5, 16)
    dy = randn(2, 5, 16)
    y.backward(dy)
    xr = _leaf(x)
    wg, wu, wd = (p.detach().double().requires_grad_() for p in mlp.parameters())
    yr = (F.silu(xr @ wg.t()) * (xr @ wu.t())) @ wd.t()
    yr.backward(dy.double())
    assert_close(y, yr, torch.float32, what="mlp forward")
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="mlp dx")
    for p, pr in zip(mlp.parameters(), (wg, wu, wd)):
        assert_close(p.grad, pr.grad, torch.float32, scale=2.0, what="mlp dweight")
    assert SwiGLUMLP(8, 12, bias=True).gate_proj.bias is not None


def test_bad_input():
    a = torch.ones(3, 4, device=DEVICE)
    with pytest.raises(TypeError, match="'gate' has dtype int64"):
        swiglu(torch.ones(3, 4, dtype=torch.long, device=DEVICE), a)
    with pytest.raises(TypeError, match="'up' has dtype int64"):
        geglu(a, torch.ones(3, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match=r"'up' has shape \(3, 5\) but 'gate' has \(3, 4\)"):
        swiglu(a, torch.ones(3, 5, device=DEVICE))
    with pytest.raises(TypeError, match="'up' has dtype torch.bfloat16 but 'gate' has torch.float32"):
        geglu(a, a.bfloat16())
    with pytest.raises(ValueError, match="last dim must be even"):
        swiglu(torch.ones(3, 5, device=DEVICE))
    with pytest.raises(ValueError, match="zero-size last dimension"):
        swiglu(torch.ones(3, 0, device=DEVICE))
    with pytest.raises(ValueError, match="'approximate' is 'erf'"):
        geglu(a, a, approximate="erf")
    with pytest.raises(ValueError, match="at least 1 dimension"):
        swiglu(torch.tensor(1.0, device=DEVICE), torch.tensor(1.0, device=DEVICE))


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    with pytest.raises(RuntimeError, match="'gate' is on device 'cpu'"):
        swiglu(torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="'up' is on device 'cpu'"):
        geglu(torch.ones(3, 4, device=DEVICE), torch.ones(3, 4))


def test_reference_matches_torch():
    g, u = randn(3, 11), randn(3, 11)
    assert_close(swiglu_reference(g, u), F.silu(g.double()) * u.double(), torch.float32)
    assert_close(geglu_reference(torch.cat([g, u], -1), approximate="none"), F.gelu(g.double()) * u.double(), torch.float32)


def test_approximate_not_a_string():
    """An unhashable 'approximate' failed with "unhashable type: 'list'" (a dict lookup)."""
    a = randn(3, 4)
    with pytest.raises(ValueError, match=r"'approximate' is \['tanh'\]; expected 'none' or 'tanh'"):
        geglu(a, a, approximate=["tanh"])
