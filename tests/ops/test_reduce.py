import pytest
import torch

from warpforge.ops import reduce as R
from warpforge.ops.reduce import (amax, amax_backward_op, amax_bits_scatter_op, amax_mask_op, amax_op, amax_reference,
                                  amax_scatter_op, amax_ties_op, sum_op, sum_reference)
from conftest import DTYPES, ON_GPU, DEVICE, assert_close, gpu_only, noncontig, randn

# block path; past 16,384 partials, or one looping program a row with rows enough (9: the
# interpreter's stand-in chip of 4 SMs; 300 x 40000 on a GPU)
SHAPES = [(1,), (3, 7), (2, 3, 123), (5, 4097), (2, 20000), (3, 40000), (9, 20000)]
if ON_GPU:
    SHAPES += [(64, 32768), (8, 65536), (3, 262144), (4097, 1024), (2, 3_000_001), (300, 40000)]

OPS = {"sum": (R.sum, torch.sum), "amax": (amax, torch.amax)}


def _leaf(t):
    return t.detach().double().requires_grad_()


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward(shape, dtype, name):
    fn, tfn = OPS[name]
    x = randn(*shape, dtype=dtype, requires_grad=True, scale=2.0)
    y = fn(x)
    assert y.dtype == dtype and y.shape == shape[:-1]
    xr = _leaf(x)
    yr = tfn(xr, -1)
    if name == "amax":
        assert torch.equal(y, yr.to(dtype)), "amax must be exact"
    else:
        assert_close(y, yr, dtype, what="forward")
    dy = randn(*shape[:-1], 1, dtype=dtype).reshape(y.shape)
    y.backward(dy)
    yr.backward(dy.double())
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    assert_close(x.grad, xr.grad, dtype, what="backward")


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("keepdim", [False, True])
def test_dims_and_keepdim(name, keepdim):
    fn, tfn = OPS[name]
    z = randn(5, 9, 4, requires_grad=True)
    for dim in (0, 1, 2, -1, -2, -3):
        y = fn(z, dim, keepdim)
        zr = _leaf(z)
        yr = tfn(zr, dim, keepdim=keepdim)
        assert y.shape == yr.shape, f"dim={dim}"
        assert_close(y, yr, torch.float32, what=f"dim={dim}")
        dy = randn(*y.shape)
        (g,) = torch.autograd.grad(y, z, dy)
        yr.backward(dy.double())
        assert_close(g, zr.grad, torch.float32, what=f"backward dim={dim}")
    s = torch.tensor(2.5, device=DEVICE)
    assert fn(s).shape == () and fn(s).item() == 2.5
    assert fn(s, 0, True).shape == ()


@pytest.mark.parametrize("name", list(OPS))
def test_noncontiguous(name):
    fn, tfn = OPS[name]
    x = noncontig(randn(6, 33, requires_grad=True))
    assert_close(fn(x), tfn(x.double(), -1), torch.float32, what="strided rows")
    t = randn(7, 5).t()                                                  # column stride != 1: copied
    assert_close(fn(t), tfn(t.double(), -1), torch.float32, what="transposed")
    big = noncontig(randn(3, 20000))
    assert_close(fn(big), tfn(big.double(), -1), torch.float32, what="strided rows, partials path")


@pytest.mark.parametrize("n", [4, 123, 20000] + ([40000, 262144] if ON_GPU else []))   # GPU: block, split
def test_amax_ties(n):
    """The gradient is shared evenly among all elements equal to the max (torch's rule)."""
    x = randn(4, n)
    top = x.abs().max() + 1
    hot = [[0], [1, n - 1], [0, n // 2, n - 1], list(range(n))]          # 1, 2, 3 and n ties
    for r, cols in enumerate(hot):
        x[r, cols] = top
    x.requires_grad_()
    y = amax(x)
    dy = torch.tensor([1.0, 2.0, 3.0, 4.0], device=DEVICE)
    y.backward(dy)
    expected = torch.zeros(4, n, device=DEVICE)
    for r, cols in enumerate(hot):
        expected[r, cols] = dy[r] / len(cols)
    torch.testing.assert_close(x.grad, expected)
    xr = x.detach().clone().requires_grad_()
    xr.amax(-1).backward(dy)
    torch.testing.assert_close(x.grad, xr.grad)
    b = randn(16, n).to(torch.bfloat16).round().requires_grad_()        # many natural ties
    gb = torch.autograd.grad(amax(b), b, torch.ones(16, device=DEVICE, dtype=torch.bfloat16))[0]
    br = b.detach().clone().requires_grad_()
    gr = torch.autograd.grad(br.amax(-1), br, torch.ones(16, device=DEVICE, dtype=torch.bfloat16))[0]
    torch.testing.assert_close(gb, gr)


def test_amax_backward_split_single_chunk(monkeypatch):
    """The split backward's prefetch/publish/gather and tie sharing, on CPU too: forced with one
    chunk a row (more would wait forever in the interpreter); the GPU shapes above run C > 1."""
    import triton
    from warpforge.runtime.heuristics import RowConfig

    monkeypatch.setattr(R, "amax_bwd_config", lambda n: RowConfig("split", triton.next_power_of_2(n), 1, 4, 1))
    monkeypatch.setattr(R, "amax_grad_path", lambda t: None)          # the plain operator's backward
    n = 37
    x = randn(5, n)
    x[1, [0, 5, 36]] = x.abs().max() + 1                                 # three ties in row 1
    x[3, 7] = float("nan")                                              # a NaN row: NaN gradients
    x.requires_grad_()
    dy = randn(5)
    (g,) = torch.autograd.grad(amax(x), x, dy)
    xr = x.detach().clone().requires_grad_()
    (gr,) = torch.autograd.grad(xr.amax(-1), xr, dy)
    torch.testing.assert_close(g, gr, equal_nan=True)
    assert g[3].isnan().all()


@pytest.mark.parametrize("n", [7, 20000])
def test_nan_and_infinities(n):
    x = randn(4, n)
    x[1, n // 3] = float("nan")
    x[2] = -float("inf")
    x[3, n - 1] = float("inf")
    a = amax(x)
    assert torch.isnan(a[1]) and a[2] == -float("inf") and a[3] == float("inf")
    assert a[0] == x[0].max()
    s = R.sum(x)
    assert torch.isnan(s[1]) and s[2] == -float("inf") and s[3] == float("inf")
    # backward: torch gives the whole NaN row NaN gradients (0 ties, 0 * dy/0); we match it
    xg = x.clone().requires_grad_()
    g = torch.autograd.grad(amax(xg), xg, torch.ones(4, device=DEVICE))[0]
    xt = x.clone().requires_grad_()
    gt = torch.autograd.grad(xt.amax(-1), xt, torch.ones(4, device=DEVICE))[0]
    torch.testing.assert_close(g, gt, equal_nan=True)


@pytest.mark.parametrize("mode", ["loop", "partial"])
def test_long_row_modes(monkeypatch, mode):
    """Both long-row forwards, forced, on the same rows: each matches the reference (NaN and
    infinities included) and the mode asked for is the one that ran."""
    seen = []
    real = R.reduce_config

    def forced(m, n):
        if n < 20000:                                                  # the partials' own reduction
            return real(m, n)
        seen.append(mode)
        return (mode, 4096, 4)

    monkeypatch.setattr(R, "reduce_config", forced)
    n = 20001                                                           # a ragged last step
    x = randn(5, n, scale=3.0)
    x[1, 7] = float("nan")
    x[2] = -float("inf")
    x[3, n - 1] = float("inf")
    x[4, n - 1] = x[4].abs().max() + 1                                  # the max in the last, partial step
    for fn, tfn in OPS.values():
        got, ref = fn(x), tfn(x.double(), -1)
        torch.testing.assert_close(got.double(), ref, equal_nan=True, rtol=1e-5, atol=1e-3)
    assert seen and set(seen) == {mode}
    assert torch.equal(R.sum(x[:1]), R.sum(x[:1]))                     # deterministic


@pytest.mark.parametrize("const", [False, True])
def test_loop_const(monkeypatch, const):
    """The row loop with N compiled in (heuristics.REDUCE_LOOP_CONST, ``reduce_loop_const``), forced
    at 64-element steps over rows of 192 (three whole steps): sum and amax match the reference with
    NaN, infinities and the max in the last step, and the loop with N an argument gives the same."""
    monkeypatch.setattr(R, "reduce_loop_const", (lambda m, n, name: (64, 4)) if const else (lambda m, n, name: None))
    monkeypatch.setattr(R, "reduce_config", lambda m, n: ("loop", 64, 4))
    n = 192
    x = randn(5, n, scale=3.0)
    x[1, 7] = float("nan")
    x[2] = -float("inf")
    x[3, n - 1] = float("inf")
    x[4, n - 1] = x[4].abs().max() + 1
    for fn, tfn in OPS.values():
        got, ref = fn(x), tfn(x.double(), -1)
        torch.testing.assert_close(got.double(), ref, equal_nan=True, rtol=1e-5, atol=1e-3)


@pytest.mark.skipif(not ON_GPU, reason="the device's own routes")
@pytest.mark.parametrize("n", [4096, 8192, 32768, 65536])
def test_loop_const_device_route(n):
    """Sum and amax over rows enough to loop (two an SM) on this GPU: on an H200 they take the loop
    with N compiled in (heuristics.REDUCE_LOOP_CONST); checked against a float64 reference in bf16
    and fp32, the max in a row's last column."""
    from warpforge.runtime.heuristics import REDUCE_LOOP_ROWS_PER_SM, reduce_loop_const

    m = REDUCE_LOOP_ROWS_PER_SM * torch.cuda.get_device_properties(0).multi_processor_count
    if "H200" in torch.cuda.get_device_name():
        assert reduce_loop_const(m, n, torch.cuda.get_device_name()) is not None
    for dtype in (torch.bfloat16, torch.float32):
        x = randn(m, n, dtype=dtype)
        x[5, n - 1] = 100.0
        for name, (fn, tfn) in OPS.items():
            got, ref = fn(x, -1), tfn(x.double(), -1)
            assert_close(got, ref, dtype, what=f"{name} {n} {dtype}")


@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                (torch.float32, torch.float16), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("n", [123, 20000])
def test_sum_dtype(in_dtype, out_dtype, n):
    x = randn(3, n, dtype=in_dtype, requires_grad=True)
    y = R.sum(x, -1, dtype=out_dtype)
    assert y.dtype == out_dtype
    ref = x.double().sum(-1)
    assert_close(y, ref, out_dtype, what="sum(dtype=)")           # accumulated in fp32, rounded once
    if out_dtype == torch.float32:
        assert_close(y, ref, torch.float32, what="fp32 output")
    y.backward(torch.ones_like(y))
    assert x.grad.dtype == in_dtype and torch.equal(x.grad, torch.ones_like(x))


def test_deterministic_partials():
    x = randn(3, 50000)
    assert torch.equal(R.sum(x), R.sum(x))


def test_empty_batch():
    for fn in (R.sum, amax):
        e = fn(torch.empty(0, 16, device=DEVICE))
        assert e.shape == (0,)
        e = fn(torch.empty(2, 0, 16, device=DEVICE), -1, True)
        assert e.shape == (2, 0, 1)


def test_compile_fullgraph():
    x = randn(3, 7, 123, requires_grad=True)

    def f(t):
        return R.sum(t, -1) * 2 + amax(t, 1).sum(-1, keepdim=False)[:, None]

    out = torch.compile(f, fullgraph=True)(x)
    g = torch.randn_like(out)
    out.backward(g)
    xr = _leaf(x)
    ref = xr.sum(-1) * 2 + xr.amax(1).sum(-1)[:, None]
    ref.backward(g.double())
    assert_close(out, ref, torch.float32, what="compiled forward")
    assert_close(x.grad, xr.grad, torch.float32, what="compiled backward")


@pytest.mark.parametrize("path", ["mask", "ties"])
def test_compile_amax_paths(monkeypatch, path):
    """Under torch.compile the graph holds the forward that leaves the backward nothing to count:
    the bit mask for rows a program holds, the tie count for rows it walks in chunks (one element
    past the longest row a program holds: the interpreter's block, 32K on a GPU, where 20,000 took
    the mask path); the gradient matches torch's ties."""
    from warpforge.runtime.heuristics import amax_row_limit
    n = 300 if path == "mask" else amax_row_limit() + 1
    monkeypatch.setattr(R, "_amax_bwd", lambda *a: pytest.fail("the backward re-counted the ties"))
    other = "amax_ties_op" if path == "mask" else "amax_mask_op"
    monkeypatch.setattr(R, other, lambda *a: pytest.fail(f"took {other}"))
    x = randn(3, n)
    x[1, [5, n - 1]] = x.abs().max() + 1
    x.requires_grad_()
    out = torch.compile(lambda t: amax(t) * 3, fullgraph=True)(x)
    dy = randn(3)
    (g,) = torch.autograd.grad(out, x, dy)
    xr = x.detach().clone().requires_grad_()
    (gr,) = torch.autograd.grad(xr.amax(-1) * 3, xr, dy)
    torch.testing.assert_close(g, gr)


@pytest.mark.parametrize("n", [37, 20000])
def test_opcheck(n):
    x = randn(4, n, requires_grad=True)
    torch.library.opcheck(sum_op.overload, (x, torch.float32))
    torch.library.opcheck(sum_op.overload, (x.detach().bfloat16().requires_grad_(), torch.float32))
    torch.library.opcheck(amax_op.overload, (x,))
    y = x.detach().amax(-1)
    torch.library.opcheck(amax_backward_op.overload, (x.detach(), y, randn(4)))
    torch.library.opcheck(amax_ties_op.overload, (x,))
    ties = (x.detach() == y[:, None]).sum(1, dtype=torch.float32)
    torch.library.opcheck(amax_scatter_op.overload, (x.detach(), y, ties, randn(4)))
    if n <= 16384:                                                       # rows a program holds
        torch.library.opcheck(amax_mask_op.overload, (x,))
        _, ties, bits = amax_mask_op(x.detach())
        torch.library.opcheck(amax_bits_scatter_op.overload, (bits, ties, randn(4), n, torch.float32))
        torch.library.opcheck(amax_bits_scatter_op.overload, (bits, ties, randn(4), n, torch.bfloat16))


@pytest.mark.parametrize("mode", ["loop", "partial"])
def test_amax_forward_counts_ties(monkeypatch, mode):
    """The forward that counts ties for the backward (loop: lane-wise counts reset when a lane's max
    rises; partial: per-chunk counts, the chunks holding the row's max summed), forced with small
    blocks so that ties fall in different lanes, steps and chunks: the counts match torch's, the
    gradient matches torch's, and the backward never takes the counting row kernel."""
    n = 37
    monkeypatch.setattr(R, "reduce_config", lambda m, k: (mode, 8, 4) if k == n else ("block", 0, 0))
    monkeypatch.setattr(R, "amax_grad_path", lambda t: "ties")     # rows of 37 count as long
    monkeypatch.setattr(R, "_amax_bwd", lambda *a: pytest.fail("the backward re-counted the ties"))
    x = randn(6, n)
    top = x.abs().max() + 1
    x[0, [0, 9, 36]] = top                       # three ties: lanes 0 and 1 and 4, steps 0, 1 and 4
    x[1, [3, 11]] = top - 1
    x[1, 30] = top                               # lane 6's max rises after two ties elsewhere
    x[2, 5] = float("nan")                       # NaN row: 0 ties, NaN gradients (as torch)
    x[3] = -float("inf")                         # every element a tie; 37 is no multiple of 8
    x[4, [1, 2, 3, 4]] = top                     # ties in neighbouring lanes of one step
    y, ties = amax_ties_op(x)
    assert torch.equal(y, x.amax(-1)) or torch.equal(y.isnan(), x.amax(-1).isnan())
    ref = (x == x.amax(-1, keepdim=True)).sum(-1).float()
    assert torch.equal(ties, ref), (ties, ref)
    assert ties[:5].tolist() == [3, 1, 0, n, 4]
    xg = x.clone().requires_grad_()
    dy = randn(6)
    (g,) = torch.autograd.grad(amax(xg), xg, dy)
    xt = x.clone().requires_grad_()
    (gt,) = torch.autograd.grad(xt.amax(-1), xt, dy)
    torch.testing.assert_close(g, gt, equal_nan=True)
    assert g[2].isnan().all() and not g[[0, 1, 3, 4, 5]].isnan().any()
    monkeypatch.setattr(R, "amax_ties_op", lambda *a: pytest.fail("counted ties with no gradient"))
    with torch.no_grad():                        # no gradient: the plain forward
        torch.testing.assert_close(amax(xg), y, equal_nan=True)


def test_bad_input():
    with pytest.raises(TypeError, match="'input' has dtype int64"):
        R.sum(torch.ones(3, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(TypeError, match="'input' has dtype int64"):
        amax(torch.ones(3, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="zero-size last dimension"):
        amax(torch.ones(3, 0, device=DEVICE))
    with pytest.raises(ValueError, match="dim=0 to reduce is empty"):
        R.sum(torch.ones(0, 3, device=DEVICE), 0)
    with pytest.raises(IndexError, match="'dim'=2 is out of range"):
        R.sum(torch.ones(3, 4, device=DEVICE), dim=2)
    with pytest.raises(TypeError, match="'dim' must be an int"):
        amax(torch.ones(3, 4, device=DEVICE), dim=(0, 1))
    with pytest.raises(TypeError, match="'dtype' is torch.float64"):
        R.sum(torch.ones(3, 4, device=DEVICE), dtype=torch.float64)


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        R.sum(torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        amax(torch.ones(3, 4))


def test_reference_matches_torch():
    x = randn(3, 11, 5)
    assert_close(sum_reference(x, 1, True), x.double().sum(1, keepdim=True), torch.float32)
    assert torch.equal(amax_reference(x, 0), x.amax(0))


def _packed(hit: torch.Tensor) -> torch.Tensor:
    """The (..., N) bool mask as amax_mask packs it: bit j of byte i is column 8 i + j."""
    n = hit.shape[-1]
    pad = torch.nn.functional.pad(hit.to(torch.int32), (0, -n % 8)).unflatten(-1, (-1, 8))
    return (pad << torch.arange(8, device=hit.device, dtype=torch.int32)).sum(-1).to(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 8, 37, 123, 4097] + ([32768] if ON_GPU else []))
def test_amax_mask_forward(n, dtype):
    """The forward for rows a program holds writes the ties as a bit mask and their count: both
    match torch's (x == max) bit for bit, with ties spread over bytes, the last partial byte, a NaN
    row (no bits, 0 ties), an all -inf row (every element a tie, padding none) and -0 tying +0;
    6 rows: a part-filled program where one holds several."""
    x = randn(6, n, dtype=dtype)
    top = x.abs().max() + 1
    x[0, [c for c in (0, 7, 8, n - 1) if c < n]] = top
    x[1] = top                                    # every element a tie
    x[2, n // 2] = float("nan")
    x[3] = -float("inf")
    x[4, n - 1] = float("inf")
    x[5] = -1.0
    x[5, 0], x[5, n - 1] = -0.0, 0.0              # -0 and +0 tie (the last write wins at n = 1)
    y, ties, bits = amax_mask_op(x)
    ref = x.amax(-1)
    assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y[~ref.isnan()], ref[~ref.isnan()])
    hit = x == ref[:, None]
    assert bits.dtype == torch.uint8 and bits.shape == (6, (n + 7) // 8)
    assert torch.equal(bits, _packed(hit)), (bits, _packed(hit))
    assert torch.equal(ties, hit.sum(-1).float())
    assert ties[1] == n and ties[2] == 0 and ties[3] == n and ties[5] == min(n, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 123), (4, 9000)])
def test_amax_mask_backward(dtype, shape, monkeypatch):
    """With a gradient to come, rows a program holds take the mask forward; the backward reads the
    mask (not x, which is not saved), and matches torch's shared gradient, NaN rows included."""
    monkeypatch.setattr(R, "_amax_bwd", lambda *a: pytest.fail("the backward re-counted the ties"))
    monkeypatch.setattr(R, "amax_ties_op", lambda *a: pytest.fail("took the ties path"))
    monkeypatch.setattr(R, "AMAX_MASK_MIN_NUMEL", 0)                # not the GPU's eager fast path
    x = randn(*shape, dtype=dtype, scale=2.0).round()               # many natural ties
    x.view(-1, shape[-1])[1, 2] = float("nan")
    x.requires_grad_()
    y = amax(x)
    assert y.grad_fn is not None
    _, t, b = amax_mask_op(x)
    assert not t.requires_grad and not b.requires_grad        # no gradients made up for them
    dy = randn(*shape[:-1], dtype=dtype)
    (g,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(xr.amax(-1), xr, dy.double())
    assert g.dtype == dtype
    assert torch.equal(g.isnan(), gr.isnan())
    assert_close(g.nan_to_num(), gr.nan_to_num(), dtype, what="mask backward")
    y = amax(x)
    with torch.no_grad():
        x.add_(1)                                 # x is not saved: changing it in place is no error
    (g2,) = torch.autograd.grad(y, x, dy)
    assert torch.equal(g2.isnan(), g.isnan()) and torch.equal(g2.nan_to_num(), g.nan_to_num())


def test_amax_mask_noncontiguous_grad(monkeypatch):
    """dy broadcast (stride 0) and strided rows of x reach the mask kernels correctly."""
    monkeypatch.setattr(R, "AMAX_MASK_MIN_NUMEL", 0)
    x = noncontig(randn(5, 300)).requires_grad_()
    y = amax(x)
    dy = torch.ones(1, device=DEVICE).expand(5)
    (g,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().clone().requires_grad_()
    (gr,) = torch.autograd.grad(xr.amax(-1), xr, dy)
    torch.testing.assert_close(g, gr)


@pytest.mark.parametrize("shape", [(3, 7), (4, 4097), (3, 20000)])
def test_amax_plain_backward(shape, monkeypatch):
    """The plain operator's backward (count, then scatter: symbolic shapes under torch.compile and
    the eager fast path take it), forced where the mask or the ties path would run."""
    monkeypatch.setattr(R, "amax_grad_path", lambda t: None)
    monkeypatch.setattr(R, "amax_mask_op", lambda *a: pytest.fail("took the mask path"))
    x = randn(*shape, scale=2.0).round()
    x[1, 3] = float("nan")
    x.requires_grad_()
    dy = randn(shape[0])
    (g,) = torch.autograd.grad(amax(x), x, dy)
    xr = x.detach().clone().requires_grad_()
    (gr,) = torch.autograd.grad(xr.amax(-1), xr, dy)
    torch.testing.assert_close(g, gr, equal_nan=True)


def test_amax_mask_ops_reject_bad_shapes():
    """The mask ops called directly: rows longer than a program holds, and a mask whose width does
    not fit n, raise a clear error instead of launching."""
    from warpforge.runtime.heuristics import BLOCK_MAX, WIDE_BLOCK_MAX

    n = (WIDE_BLOCK_MAX if ON_GPU else BLOCK_MAX) + 1
    with pytest.raises(ValueError, match=f"rows of {n}"):
        amax_mask_op(randn(2, n))
    _, ties, bits = amax_mask_op(randn(2, 20))
    with pytest.raises(ValueError, match="3 bytes a row; expected 5 for n=40"):
        amax_bits_scatter_op(bits, ties, randn(2), 40, torch.float32)


def test_bad_options_audit():
    """keepdim must be a bool (a truthy string kept the dim), and dim must be in range for a 0-d
    input too (any dim passed); meta tensors get their shape, no kernel."""
    x = torch.ones(3, 4, device=DEVICE)
    for fn in (R.sum, amax):
        with pytest.raises(TypeError, match="'keepdim' must be a bool, got str"):
            fn(x, keepdim="yes")
        with pytest.raises(TypeError, match="'keepdim' must be a bool, got NoneType"):
            fn(x, keepdim=None)
        with pytest.raises(IndexError, match="'dim'=3 is out of range for a 0-d tensor"):
            fn(torch.tensor(2.0, device=DEVICE), dim=3)
        assert fn(torch.empty(3, 8, device="meta")).shape == (3,)


def test_loop_strided_rows(monkeypatch):
    """The row loop (forced, 64-element steps, a ragged last one) reads each row with its own row
    stride: strided rows of x, sum and amax, with and without tie counts."""
    monkeypatch.setattr(R, "reduce_config", lambda m, n: ("loop", 64, 4))
    x = noncontig(randn(5, 150, scale=2.0).round())                     # row stride 300, natural ties
    for fn, tfn in OPS.values():
        torch.testing.assert_close(fn(x).double(), tfn(x.double(), -1), rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(R, "amax_grad_path", lambda t: "ties")          # the counting forward
    y, ties = amax_ties_op(x)
    assert torch.equal(y, x.amax(-1))
    assert torch.equal(ties, (x == x.amax(-1, keepdim=True)).sum(-1).float())

