import pytest
import torch

import warpforge as wf
from warpforge.ops.softmax import softmax_op, softmax_reference
from conftest import DTYPES, ON_GPU, DEVICE, assert_close, gpu_only, noncontig, randn

SHAPES = [(1,), (3, 7), (2, 3, 123), (5, 4097), (2, 20000)]      # block path, and the loop path past 16,384
if ON_GPU:
    # wide blocks, the split and pipe paths; 100 x 262,144 gives each pipe program many rows
    SHAPES += [(64, 32768), (8, 65536), (3, 262144), (4097, 1024), (100, 262144)]


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward(shape, dtype, log):
    x = randn(*shape, dtype=dtype, requires_grad=True, scale=3.0)
    fn = wf.log_softmax if log else wf.softmax
    y = fn(x, dim=-1)
    assert y.dtype == dtype and y.shape == x.shape
    xr = x.detach().double().requires_grad_()
    yr = torch.log_softmax(xr, -1) if log else torch.softmax(xr, -1)
    assert_close(y, yr, dtype, what="forward")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    yr.backward(dy.double())
    assert_close(x.grad, xr.grad, dtype, scale=2.0, what="backward")


@pytest.mark.parametrize("log", [False, True])
def test_noncontiguous_and_other_dims(log):
    fn, tfn = (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)
    x = noncontig(randn(6, 33, requires_grad=True))
    assert_close(fn(x), tfn(x.double(), -1), torch.float32, what="strided rows")
    z = randn(5, 9, 4)
    for dim in (0, 1, -2):
        assert_close(fn(z, dim=dim), tfn(z.double(), dim), torch.float32, what=f"dim={dim}")
    t = randn(7, 5).t()                                              # column stride != 1: copied
    assert_close(fn(t, -1), tfn(t.double(), -1), torch.float32, what="transposed")
    assert_close(fn(z, dtype=torch.float32), tfn(z.double(), -1), torch.float32)


def test_expanded_gradient():
    """The block backward takes a gradient broadcast over the rows (row stride 0). (A weighted
    sum's backward hands it a contiguous product instead, so the gradient is passed directly.)"""
    x = randn(4, 50, requires_grad=True)
    dy = randn(1, 50).expand(4, 50)
    assert dy.stride(0) == 0
    (g,) = torch.autograd.grad(wf.softmax(x), x, dy)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(torch.softmax(xr, -1), xr, dy.double())
    assert_close(g, gr, torch.float32)


def test_infinities_and_empty():
    x = torch.tensor([[0.0, -float("inf"), 1.0], [-float("inf")] * 3], device=DEVICE)
    y = wf.softmax(x)
    ref = torch.softmax(x, -1)
    assert torch.allclose(y[0], ref[0]) and torch.isnan(y[1]).all() and torch.isnan(ref[1]).all()
    e = wf.softmax(torch.empty(0, 16, device=DEVICE))
    assert e.shape == (0, 16)
    s = wf.softmax(torch.tensor(2.5, device=DEVICE))
    assert s.item() == 1.0


@pytest.mark.parametrize("log", [False, True])
def test_empty_input_stays_differentiable(log):
    """An input with no elements gives an empty result that is still in the autograd graph (it was
    a bare empty_like: backward raised "does not require grad")."""
    fn = wf.log_softmax if log else wf.softmax
    for shape, dim in (((0, 16), -1), ((0, 16), 0), ((3, 0, 5), 1)):
        x = randn(*shape, requires_grad=True)
        y = fn(x, dim)
        assert y.shape == x.shape and y.requires_grad
        y.sum().backward()
        assert x.grad.shape == x.shape


def test_compile_fullgraph():
    x = randn(3, 7, 123, requires_grad=True)

    def f(t):
        return (wf.softmax(t, -1) * 2 + wf.log_softmax(t, -1)).sum(-1)

    out = torch.compile(f, fullgraph=True)(x)
    g = torch.randn_like(out)
    out.backward(g)
    xr = x.detach().double().requires_grad_()
    ref = (torch.softmax(xr, -1) * 2 + torch.log_softmax(xr, -1)).sum(-1)
    ref.backward(g.double())
    assert_close(out, ref, torch.float32, what="compiled forward")
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="compiled backward")


@pytest.mark.parametrize("log", [False, True])
def test_opcheck(log):
    x = randn(4, 37, requires_grad=True)
    torch.library.opcheck(softmax_op.overload, (x, log))


def test_bad_input():
    with pytest.raises(TypeError, match="'input' has dtype int64"):
        wf.softmax(torch.ones(3, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="zero-size last dimension"):
        wf.softmax(torch.ones(3, 0, device=DEVICE))
    with pytest.raises(IndexError, match="'dim'=2 is out of range"):
        wf.softmax(torch.ones(3, 4, device=DEVICE), dim=2)


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        wf.softmax(torch.ones(3, 4))


def test_reference_matches_torch():
    x = randn(3, 11)
    assert_close(softmax_reference(x), torch.softmax(x.double(), -1), torch.float32)


@pytest.mark.parametrize("mode", ["split", "pipe"])
@pytest.mark.parametrize("log", [False, True])
def test_exchange_paths_single_chunk(monkeypatch, log, mode):
    """The split and pipe kernels' publish/prefetch/gather logic, on CPU too: forced with one chunk
    per row (more would wait forever in the interpreter, which runs programs one at a time; its
    one program then walks every row, so the pipe kernels carry each row to the next step)."""
    import triton
    from warpforge.ops import softmax as mod
    from warpforge.runtime.heuristics import RowConfig

    monkeypatch.setattr(mod, "softmax_config", lambda n, backward, **_: RowConfig(mode, triton.next_power_of_2(n), 1, 4, 1))
    x = randn(5, 37, requires_grad=True)
    fn, tfn = (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)
    y = fn(x)
    xr = x.detach().double().requires_grad_()
    yr = tfn(xr, -1)
    assert_close(y, yr, torch.float32, what="forward")
    dy = randn(5, 37)
    y.backward(dy)
    yr.backward(dy.double())
    assert_close(x.grad, xr.grad, torch.float32, what="backward")


def test_bad_options_and_meta():
    """dtype= that is not a torch.dtype, and dim= out of range for a 0-d input, raise by name (they
    reached x.to("float32") and a silent reduction); meta tensors get their shape, no kernel."""
    x = randn(3, 4)
    for fn in (wf.softmax, wf.log_softmax):
        with pytest.raises(TypeError, match="'dtype' must be a torch.dtype or None, got str"):
            fn(x, dtype="float32")
        for dt in (torch.float64, torch.int32):     # the dtype asked for, named (not 'input' after the cast)
            with pytest.raises(TypeError, match=f"'dtype' is {str(dt)[6:]}; expected None or one of float32"):
                fn(x, dtype=dt)
        assert fn(x, dtype=torch.bfloat16).dtype == torch.bfloat16
        with pytest.raises(IndexError, match="'dim'=5 is out of range for a 0-d tensor"):
            fn(torch.tensor(2.0, device=DEVICE), dim=5)
        y = fn(torch.empty(3, 8, device="meta"))
        assert y.device.type == "meta" and y.shape == (3, 8)


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("n", [64, 150, 192])   # one whole step, three with a masked last, three whole
def test_loop_forward_steps(monkeypatch, log, n, const):
    """The two-pass loop forward with 64-element steps, forced (ops/softmax.py
    ``_softmax_fwd_loop_kernel``: online statistics per 8-column group, rescaled once a group a
    step), with N compiled in too (``const_n``, whole steps only): the max rising in a later step,
    a row of -inf but one element, a row holding NaN and one of huge values against float64."""
    from warpforge.ops import softmax as mod
    from warpforge.runtime.heuristics import RowConfig

    if const and n % 64:
        pytest.skip("N compiled in takes whole steps only")
    monkeypatch.setattr(mod, "softmax_config", lambda n, backward, **_: RowConfig("loop", 64, 1, 4, const_n=const))
    x = randn(6, n, scale=3.0)
    x[1, n - 1] = 40.0                     # the row's max in its last step: every group rescaled
    x[2] = -float("inf")
    x[2, n // 2] = 1.0
    x[3, 5] = float("nan")
    x[4] *= 1e4
    fn, tfn = (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)
    got = fn(x, -1)
    want = tfn(x.double(), -1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("log", [False, True])
def test_block_forward_large_magnitudes(log):
    """The block forward subtracts each row's max before exp: rows around +-100 and of +-1e4
    (exp overflows fp32 past 88.7, underflows below -103), with a masked tail (N = 123), stay
    finite and right."""
    x = randn(4, 123, scale=3.0)
    x[0] += 100.0
    x[1] -= 200.0
    x[2] *= 1e4
    x[3, 7] = 500.0
    fn, tfn = (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)
    got = fn(x)
    want = tfn(x.double(), -1)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("log", [False, True])
def test_loop_backward_strided_gradient(log):
    """The loop backward (rows past 16,384) reads dy with its own row stride, not y's: a gradient
    whose rows are strided (every other row of a buffer) and one broadcast over the rows (stride 0)."""
    fn, tfn = (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)
    n = 20000
    for dy in (noncontig(randn(2, n)), randn(1, n).expand(2, n)):
        x = randn(2, n, requires_grad=True)
        y = fn(x)
        (g,) = torch.autograd.grad(y, x, dy)
        xr = x.detach().double().requires_grad_()
        (gr,) = torch.autograd.grad(tfn(xr, -1), xr, dy.double())
        assert_close(g, gr, torch.float32, scale=2.0, what=f"loop backward, dy strides {dy.stride()}")
