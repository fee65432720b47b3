import pytest
import torch

from warpforge.ops.add import ADD_VARIANTS, add, add_naive_op, add_reference, add_vectorized_op
from conftest import DTYPES, ON_GPU, DEVICE, assert_close, gpu_only, noncontig, randn

VARIANTS = list(ADD_VARIANTS)
SIZES = [1, 7, 123, 4097, 100003]          # 100003: several full blocks per program plus a tail
if ON_GPU:
    SIZES += [(1 << 24) + 3, 3 * (1 << 22)]


def _leaf(t):
    return t.detach().double().requires_grad_()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_forward_backward(n, dtype, variant):
    alpha = 1.0 if n % 2 else -0.75
    x = randn(n, dtype=dtype, requires_grad=True)
    y = randn(n, dtype=dtype, requires_grad=True)
    out = add(x, y, alpha=alpha, variant=variant)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    xr, yr = _leaf(x), _leaf(y)
    ref = xr + alpha * yr
    assert_close(out, ref, dtype, what="forward")
    dy = randn(n, dtype=dtype)
    out.backward(dy)
    ref.backward(dy.double())
    assert x.grad.dtype == dtype and y.grad.dtype == dtype
    assert_close(x.grad, xr.grad, dtype, what="d_input")
    assert_close(y.grad, yr.grad, dtype, what="d_other")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("alpha", [1.0, 2.5, -1.0, 0.0, 3])
def test_alpha(variant, alpha):
    x, y = randn(5, 41), randn(5, 41)
    out = add(x, y, alpha=alpha, variant=variant)
    assert_close(out, x.double() + alpha * y.double(), torch.float32)
    torch.testing.assert_close(out, torch.add(x, y, alpha=alpha))


@pytest.mark.parametrize("variant", VARIANTS)
def test_noncontiguous_and_shapes(variant):
    x = noncontig(randn(6, 333, requires_grad=True))
    y = randn(6, 333, requires_grad=True)
    out = add(x, y, alpha=0.5, variant=variant)
    assert out.is_contiguous()
    assert_close(out, x.double() + 0.5 * y.double(), torch.float32, what="strided rows")
    out.sum().backward()                               # a stride-0 dy
    assert torch.equal(x.grad, torch.ones_like(x)) and torch.allclose(y.grad, torch.full_like(y, 0.5))
    t, u = randn(33, 9).t(), randn(9, 33)              # a transposed input: copied to contiguous
    assert_close(add(t, u, variant=variant), t.double() + u.double(), torch.float32, what="transposed")
    a, b = randn(2, 3, 5, 7), randn(2, 3, 5, 7)
    assert_close(add(a, b, variant=variant), a.double() + b.double(), torch.float32, what="4-d")
    s = add(torch.tensor(2.0, device=DEVICE), torch.tensor(3.0, device=DEVICE), alpha=2, variant=variant)
    assert s.shape == () and s.item() == 8.0


@pytest.mark.parametrize("variant", VARIANTS)
def test_empty_batch(variant):
    e = add(torch.empty(0, 16, device=DEVICE), torch.empty(0, 16, device=DEVICE), variant=variant)
    assert e.shape == (0, 16)


def test_special_values():
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e38, 3.0], device=DEVICE)
    y = torch.tensor([1.0, 2.0, 3.0, 1e38, float("nan")], device=DEVICE)
    for v in VARIANTS:
        torch.testing.assert_close(add(x, y, variant=v), x + y, equal_nan=True)


def test_compile_fullgraph():
    x = randn(3, 7, 123, requires_grad=True)
    y = randn(3, 7, 123, requires_grad=True)

    def f(a, b):
        return add(a, b, alpha=2.0) * add(a, b, variant="naive")

    out = torch.compile(f, fullgraph=True)(x, y)
    g = torch.randn_like(out)
    out.backward(g)
    xr, yr = _leaf(x), _leaf(y)
    ref = (xr + 2 * yr) * (xr + yr)
    ref.backward(g.double())
    assert_close(out, ref, torch.float32, what="compiled forward")
    assert_close(x.grad, xr.grad, torch.float32, what="compiled d_input")
    assert_close(y.grad, yr.grad, torch.float32, what="compiled d_other")


@pytest.mark.parametrize("op", [add_naive_op, add_vectorized_op], ids=["naive", "vectorized"])
def test_opcheck(op):
    x, y = randn(4, 37, requires_grad=True), randn(4, 37, requires_grad=True)
    torch.library.opcheck(op.overload, (x, y, 1.0))
    torch.library.opcheck(op.overload, (x, y, -0.5))


def test_bad_input():
    a = torch.ones(3, 4, device=DEVICE)
    with pytest.raises(TypeError, match="'input' has dtype int64"):
        add(torch.ones(3, 4, dtype=torch.long, device=DEVICE), a)
    with pytest.raises(ValueError, match=r"'other' has shape \(4,\) but 'input' has shape \(3, 4\).*broadcasting"):
        add(a, torch.ones(4, device=DEVICE))
    with pytest.raises(TypeError, match="'other' has dtype torch.float16 but 'input' has torch.float32"):
        add(a, a.half())
    with pytest.raises(ValueError, match="zero-size last dimension"):
        add(torch.ones(3, 0, device=DEVICE), torch.ones(3, 0, device=DEVICE))
    with pytest.raises(ValueError, match="'variant' is 'fast'"):
        add(a, a, variant="fast")
    with pytest.raises(TypeError, match="'alpha' must be a real number"):
        add(a, a, alpha=a)
    with pytest.raises(TypeError, match="'alpha' must be a real number, got bool"):     # as torch.add rejects it
        add(a, a, alpha=True)


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        add(torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="'other' is on device 'cpu'"):
        add(torch.ones(3, 4, device=DEVICE), torch.ones(3, 4))


def test_reference_matches_torch():
    x, y = randn(3, 11), randn(3, 11)
    assert_close(add_reference(x, y, 0.5), torch.add(x.double(), y.double(), alpha=0.5), torch.float32)
