"""The eager fast path (runtime/fastpath.py, csrc/fastpath.cpp): it must give the Python path's
bits -- the same kernels, grids and reductions -- forward and backward, decline what it does not
handle, and stay out of torch.compile."""
import pytest
import torch

import warpforge as wf
from warpforge.runtime import fastpath, heuristics, registry
from conftest import ON_GPU, gpu_only, noncontig, randn

DT = [torch.float32, torch.float16, torch.bfloat16]


def test_status_off_without_gpu():
    if ON_GPU:
        pytest.skip("a GPU is present: the fast path may be on")
    assert fastpath.lib is None
    assert fastpath.status().startswith("off")


@pytest.fixture
def fast():
    if not fastpath.load():
        pytest.skip(f"the fast path is {fastpath.status()}")
    lib = fastpath.lib
    yield lib
    fastpath.lib = lib


def _cpp_node(y) -> bool:
    """y was made by one of the fast path's C++ autograd nodes (not the Python Function's)."""
    node = y.grad_fn
    while node.name().startswith("Unsqueeze"):        # keepdim=True: a view on top of ours
        node = node.next_functions[0][0]
    name = node.name()
    return "Fn" in name and "autograd" not in name.lower().replace("torch::autograd", "")


def _leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in ts]


def _run(fn, inputs, grad_out_seed: int):
    """Outputs and input gradients of fn(*inputs)."""
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator(device="cuda").manual_seed(grad_out_seed)
    grads_out = [torch.randn(o.shape, device=o.device, generator=g).to(o.dtype) for o in outs]
    need = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = torch.autograd.grad(outs, need, grads_out) if need else ()
    return [o.detach() for o in outs], list(grads)


def _same_bits(fn, make_inputs, fast_lib, python_backward: bool = False):
    """fn through the Python path and through the fast path: identical outputs and gradients, and
    the fast path really took the calls (its C++ node is on the graph, and its backward launched
    the kernels the Python path offered rather than calling back into Python -- unless
    ``python_backward``: the backward takes a path the fast path does not launch)."""
    fastpath.lib = None
    ref = _run(fn, make_inputs(), 0)          # Python path: offers the kernels
    fastpath.lib = fast_lib
    fell_back = fast_lib.fallbacks_used()
    inputs = make_inputs()
    outs = fn(*inputs)
    first = outs[0] if isinstance(outs, tuple) else outs
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
        assert _cpp_node(first), first.grad_fn.name()
    got = _run(fn, make_inputs(), 0)
    assert (fast_lib.fallbacks_used() > fell_back) == python_backward, "backward fallbacks to Python"
    for a, b in zip(ref[0] + ref[1], got[0] + got[1]):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), (a - b).abs().max()


# (300, 1000): more weight-gradient partial rows than the fused sum takes (GRAD_SUM_MAX)
SHAPES = [(1, 4096), (7, 123), (64, 4096), (3, 5, 1000), (2, 8192), (1, 7), (300, 1000)]


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_same_bits(fast, shape, dtype, log):
    fn = wf.log_softmax if log else wf.softmax
    x = randn(*shape, dtype=dtype, scale=3.0)
    _same_bits(lambda t: fn(t, -1), lambda: _leaves(x.requires_grad_()), fast)


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["weight", "none", "gemma1", "llama", "fp32w"])
def test_rms_norm_same_bits(fast, shape, dtype, variant):
    n = shape[-1]
    x = randn(*shape, dtype=dtype, scale=2.0).requires_grad_()
    wdt = torch.float32 if variant == "fp32w" else dtype
    w = None if variant == "none" else (randn(n) * 0.5 + 1).to(wdt).requires_grad_()
    kw = dict(offset=1.0) if variant == "gemma1" else dict(casting_mode="llama") if variant == "llama" else {}
    _same_bits(lambda t, w: wf.rms_norm(t, (n,), w, 1e-6, **kw), lambda: _leaves(x, w), fast)


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("params", ["wb", "w", "b", "none", "wb32", "b32"])   # b32: an fp32 bias (db in fp32)
def test_layer_norm_same_bits(fast, shape, dtype, params):
    n = shape[-1]
    x = randn(*shape, dtype=dtype, scale=2.0).requires_grad_()
    w = (randn(n) * 0.5 + 1).to(dtype).requires_grad_() if "w" in params else None
    b = randn(n, dtype=torch.float32 if "32" in params else dtype).requires_grad_() if "b" in params else None
    from warpforge.runtime.device import device_info
    split = heuristics.norm_bwd_config(n, True, device_name=device_info().name,   # 8,192: split (H200, 2-byte: block)
                                       itemsize=x.element_size()).mode != "block"
    _same_bits(lambda t, w, b: wf.layer_norm(t, n, w, b), lambda: _leaves(x, w, b), fast, python_backward=split)


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm_same_bits(fast, shape, dtype):
    n = shape[-1]
    x = randn(*shape, dtype=dtype).requires_grad_()
    r = randn(*shape, dtype=dtype).requires_grad_()
    w = (randn(n) * 0.5 + 1).to(dtype).requires_grad_()
    _same_bits(lambda x, r, w: wf.add_rms_norm(x, r, w, 1e-6, offset=0.5), lambda: _leaves(x, r, w), fast)


@gpu_only
def test_norm_loop_rows_declined(fast):
    """Norm forwards over rows of 4K < N <= 8K with rows enough take Python's two-pass loop kernel
    (heuristics.norm_fwd_config), and on an H200 rows of 4K and up to 32K too (heuristics.NORM_WIDE_LOOP,
    NORM_LOOP_CONST): the fast path declines them, even after a short call of the same length offered
    it the block kernel, and still takes the short call."""
    from warpforge.runtime import heuristics
    from warpforge.runtime.device import device_info, sm_count

    name = device_info().name
    for n in (4096, 8192, 32768):
        if not heuristics.norm_loop_min_n(name) <= n <= heuristics.norm_loop_max_n(name):
            continue
        w = randn(n, dtype=torch.bfloat16)
        fastpath.lib = None
        ref = wf.rms_norm(randn(2, n, dtype=torch.bfloat16), (n,), w)      # offers the block kernel
        fastpath.lib = fast
        x = randn(2 * sm_count(), n, dtype=torch.bfloat16)
        with torch.no_grad():
            assert fast.rms_norm(x, (n,), w, None, 0.0, False) is None, n
            assert fast.layer_norm(x, n, w, None, 1e-5) is None, n
            assert fast.rms_norm(x[:2], (n,), w, None, 0.0, False) is not None, n
            assert ref.shape == (2, n)


@gpu_only
def test_softmax_loop_rows_declined(fast):
    """Softmax forwards of many rows over the lengths this device loops over (heuristics.
    SOFTMAX_LOOP_CONST, softmax_loop_range) take Python's loop kernel: the fast path declines them,
    even after a short call of the same length offered it the block kernel, and takes the short call."""
    from warpforge.runtime import heuristics
    from warpforge.runtime.device import device_info, sm_count

    lo, hi = heuristics.softmax_loop_range(device_info().name)
    if lo > hi:
        pytest.skip("no softmax loop route on this device")
    n = min(hi, heuristics.WIDE_BLOCK_MAX)   # a length a short call takes the block kernel at
    assert n >= lo
    fastpath.lib = None
    ref = wf.softmax(randn(2, n, dtype=torch.bfloat16), -1)            # offers the block kernel
    fastpath.lib = fast
    x = randn(2 * sm_count(), n, dtype=torch.bfloat16)
    with torch.no_grad():
        assert fast.softmax(x, -1, False) is None
        assert fast.softmax(x, -1, True) is None
        assert fast.softmax(x[:2], -1, False) is not None
    assert ref.shape == (2, n)


@gpu_only
def test_norm_offset_is_keyed(fast):
    """The norm forward's block kernel is compiled with or without the per-element offset add
    (HAS_OFFSET, a flag of its key): a kernel offered by a call without an offset is never replayed
    for a call with one (Gemma's 1 + w), which then takes Python's path and its own kernel."""
    n = 1001                                           # a length no other test offers
    x = randn(4, n, dtype=torch.bfloat16)
    w = randn(n, dtype=torch.bfloat16)
    fastpath.lib = None
    wf.rms_norm(x, (n,), w)                            # offers the kernel without the offset add
    fastpath.lib = fast
    with torch.no_grad():
        assert fast.rms_norm(x, (n,), w, None, 0.0, False) is not None
        assert fast.rms_norm(x, (n,), w, None, 1.0, False) is None
        got = wf.rms_norm(x, (n,), w, offset=1.0)
    from warpforge.ops.norms import rms_norm_reference

    want = rms_norm_reference(x, w, None, offset=1.0)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(got, wf.rms_norm(x, (n,), w))  # the offset did apply


@gpu_only
def test_no_grad_and_inference_mode(fast):
    x = randn(16, 4096, dtype=torch.bfloat16)
    w = randn(4096, dtype=torch.bfloat16)
    fastpath.lib = None
    ref = wf.rms_norm(x, (4096,), w)
    fastpath.lib = fast
    with torch.no_grad():
        assert fast.rms_norm(x, (4096,), w, None, 0.0, False) is not None   # offered by the call above
        assert torch.equal(wf.rms_norm(x, (4096,), w), ref)
    with torch.inference_mode():
        assert torch.equal(wf.rms_norm(x, (4096,), w), ref)


@gpu_only
def test_backward_falls_back_to_python(fast):
    """A forward offered without its backward (first seen under no_grad): the C++ node computes
    the gradient through the Python launcher, which offers it."""
    n = 3000
    x = randn(5, n, dtype=torch.float16, requires_grad=True)
    with torch.no_grad():
        wf.softmax(x, -1)                                  # Python path: offers the forward only
    assert fast.softmax(x.detach(), -1, False) is not None
    y = wf.softmax(x, -1)
    assert _cpp_node(y), y.grad_fn.name()
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    ref = torch.softmax(x.detach().double(), -1)
    assert dx.abs().max().item() < 1e-2 and torch.isfinite(dx).all()   # d(sum softmax)/dx = 0
    assert torch.allclose(y.detach().double(), ref, atol=1e-3)


@gpu_only
def test_declines_what_it_does_not_take(fast):
    x = randn(8, 256, dtype=torch.bfloat16)
    wf.softmax(x, -1)
    assert fast.softmax(x, 0, False) is None                       # not the last dim
    assert fast.softmax(noncontig(x), -1, False) is None           # not contiguous
    assert fast.softmax(x.cpu(), -1, False) is None                # not CUDA
    assert fast.softmax(x.int(), -1, False) is None                # not a float
    assert fast.rms_norm(x, (255,), None, None, 0.0, False) is None
    assert fast.rms_norm(x, (256,), torch.ones(255, device="cuda"), None, 0.0, False) is None
    assert fast.rms_norm(x, (256,), None, True, 0.0, False) is None    # eps=True: Python raises
    assert fast.layer_norm(x, 256, "w", None, 1e-5) is None
    # ... and the public functions still raise the clear errors
    with pytest.raises(ValueError, match="normalized_shape"):
        wf.rms_norm(x, (255,))
    with pytest.raises(ValueError, match="weight"):
        wf.layer_norm(x, (256,), torch.ones(255, device="cuda", dtype=torch.bfloat16))
    # a non-contiguous input still gives the right answer, through Python
    xt = noncontig(x)
    torch.testing.assert_close(wf.softmax(xt, -1).float(), torch.softmax(xt.float(), -1), atol=1e-2, rtol=0)


@gpu_only
def test_off_under_dispatch_door_and_compile(fast, monkeypatch):
    x = randn(4, 512, dtype=torch.float32)
    wf.softmax(x, -1)
    calls = []
    real = fast.softmax
    spy = type("Spy", (), {"softmax": staticmethod(lambda *a: calls.append(a) or real(*a))})()
    fastpath.lib = spy
    wf.softmax(x, -1)
    assert len(calls) == 1
    monkeypatch.setattr(registry, "FAST_EAGER", False)
    wf.softmax(x, -1)
    assert len(calls) == 1
    monkeypatch.setattr(registry, "FAST_EAGER", True)
    torch._dynamo.reset()
    out = torch.compile(lambda t: wf.softmax(t, -1), fullgraph=True)(x)
    assert len(calls) == 1
    torch.testing.assert_close(out, torch.softmax(x, -1))


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", [(1, 4096), (7, 123), (64, 14336), (3, 1)])
@pytest.mark.parametrize("act", ["swiglu", "geglu_tanh", "geglu"])
def test_glu_same_bits(fast, shape, dtype, act):
    g = randn(*shape, dtype=dtype, scale=2.0).requires_grad_()
    u = randn(*shape, dtype=dtype).requires_grad_()
    fn = {"swiglu": lambda a, b: wf.swiglu(a, b), "geglu_tanh": lambda a, b: wf.geglu(a, b),
          "geglu": lambda a, b: wf.geglu(a, b, approximate="none")}[act]
    _same_bits(fn, lambda: _leaves(g, u), fast)


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", [(1, 4096), (7, 123), (64, 4096), (2, 3, 1000), (5, 1)])
@pytest.mark.parametrize("op", ["sum", "amax", "sum_keepdim", "amax_keepdim"])
def test_reduce_same_bits(fast, shape, dtype, op):
    x = randn(*shape, dtype=dtype, scale=2.0)
    if op.startswith("amax"):
        x[..., 0] = x.amax(-1)          # a tie: the gradient is shared
    x.requires_grad_()
    keep = op.endswith("keepdim")
    fn = wf.amax if op.startswith("amax") else wf.sum
    if op.startswith("amax"):
        # Python's amax with a gradient to come takes the bit-mask forward (amax_grad_path), so the
        # plain kernels the fast path replays are offered here, not by whichever test ran before
        from warpforge.ops.reduce import amax_op

        fastpath.lib = None
        _run(lambda t: amax_op(t), _leaves(x), 0)
        fastpath.lib = fast
    _same_bits(lambda t: fn(t, -1, keep), lambda: _leaves(x), fast)


@gpu_only
def test_reduce_many_rows_take_python(fast):
    """A few rows of 8K (4K on an H200) take the block kernel (offered), many the loop kernel
    (heuristics.reduce_config, reduce_loop_const): the block kernel's key holds only M's class, so
    the fast path must leave many rows to Python."""
    from warpforge.runtime.device import device_info

    n = heuristics.reduce_loop_min_n(device_info().name)
    many = heuristics.REDUCE_LOOP_ROWS_PER_SM * heuristics.sm_count()
    x = randn(16, n, dtype=torch.bfloat16)
    wf.sum(x, -1)
    assert fast.reduce(x, -1, False, False) is not None
    big = randn(many + 16, n, dtype=torch.bfloat16)
    assert fast.reduce(big, -1, False, False) is None
    fastpath.lib = None
    ref = wf.sum(big, -1)
    fastpath.lib = fast
    assert torch.equal(wf.sum(big, -1), ref)


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", [(1, 4096), (7, 123), (2**20,), (3, 5, 1000), (1,)])
@pytest.mark.parametrize("alpha", [1.0, -0.5])
def test_add_same_bits(fast, shape, dtype, alpha):
    x = randn(*shape, dtype=dtype).requires_grad_()
    y = randn(*shape, dtype=dtype).requires_grad_()
    _same_bits(lambda a, b: wf.add(a, b, alpha=alpha), lambda: _leaves(x, y), fast)


@gpu_only
def test_add_takes_python_where_it_must(fast):
    x, y = randn(4, 256), randn(4, 256)
    assert fast.add(x, y.T.contiguous().T, 1.0) is None              # not contiguous
    assert fast.add(x, y[:, :128], 1.0) is None                      # shapes differ
    assert fast.add(x, y.half(), 1.0) is None                        # dtypes differ
    with pytest.raises(ValueError, match="'other' has shape"):
        wf.add(x, y[:, :128])                                        # the Python path's clear error
    torch.testing.assert_close(wf.add(x, y, alpha=2), x + 2 * y)     # an int alpha
    torch.testing.assert_close(wf.add(x, y, variant="naive"), x + y)


@gpu_only
def test_packed_glu_and_sum_dtype_take_python(fast):
    gu = randn(4, 256, dtype=torch.bfloat16)
    torch.testing.assert_close(wf.swiglu(gu).float(), (torch.nn.functional.silu(gu[:, :128].float())
                                                       * gu[:, 128:].float()), atol=2e-2, rtol=2e-2)
    x = randn(4, 256, dtype=torch.bfloat16)
    assert wf.sum(x, -1, dtype=torch.float32).dtype == torch.float32
    assert fast.glu(gu, gu[:, :1], 0) is None                   # shapes differ


def _rope_inputs(case: str, dtype):
    """(q, k, cos, sin, position_ids, interleaved) for a RoPE case."""
    d = 128 if case == "decode_offset" else 64
    b, hq, hk, s = {"decode_ids": (4, 8, 2, 1), "decode_offset": (1, 32, 8, 1), "prefill": (2, 4, 2, 37),
                    "interleaved_half": (2, 6, 3, 37), "batch_table": (2, 4, 1, 37)}[case]
    q = randn(b, hq, s, d, dtype=dtype).requires_grad_()
    k = randn(b, hk, s, d, dtype=dtype).requires_grad_()
    rows = 40 if s > 1 else 64
    tdt = torch.float32 if case in ("decode_offset", "batch_table") else dtype
    width = d // 2 if case == "interleaved_half" else d
    lead = (2,) if case == "batch_table" else ()
    ang = torch.rand(*lead, rows, width, device="cuda") * 6.28
    cos, sin = ang.cos().to(tdt), ang.sin().to(tdt)
    pos = {"decode_ids": torch.randint(0, rows, (b, 1), device="cuda"), "decode_offset": 17, "prefill": None,
           "interleaved_half": torch.randperm(rows, device="cuda")[:s].int(),
           "batch_table": torch.randint(0, rows, (1, s), device="cuda")}[case]
    return q, k, cos, sin, pos, case == "interleaved_half"


@gpu_only
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("case", ["decode_ids", "decode_offset", "prefill", "interleaved_half", "batch_table"])
def test_rope_same_bits(fast, case, dtype):
    q, k, cos, sin, pos, il = _rope_inputs(case, dtype)
    _same_bits(lambda a, b: wf.apply_rope(a, b, cos, sin, pos, il), lambda: _leaves(q, k), fast)


@gpu_only
def test_rope_double_backward_and_one_output(fast):
    """create_graph takes the differentiable Python backward (the C++ kernel launch is not); a
    gradient for only one output gets zeros for the other, as the Python Function's."""
    q, k, cos, sin, pos, il = _rope_inputs("decode_ids", torch.float32)

    def second(use_fast):
        fastpath.lib = fast if use_fast else None
        a, b = _leaves(q, k)
        qo, ko = wf.apply_rope(a, b, cos, sin, pos, il)
        gq = torch.randn(qo.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).requires_grad_()
        dq, dk = torch.autograd.grad((qo, ko), (a, b), (gq, torch.ones_like(ko)), create_graph=True)
        (ggq,) = torch.autograd.grad((dq * dq).sum(), gq)
        (only_q,) = torch.autograd.grad(wf.apply_rope(a, b, cos, sin, pos, il)[0].sum(), a)
        return [dq.detach(), dk.detach(), ggq, only_q], qo.grad_fn.name()

    ref, _ = second(False)
    used = fast.fallbacks_used()
    got, node = second(True)
    fastpath.lib = fast
    assert "Rope" in node and fast.fallbacks_used() > used
    for a, b in zip(ref, got):
        assert torch.equal(a, b), (a - b).abs().max()


@gpu_only
def test_rope_takes_python_where_it_must(fast):
    q, k, cos, sin, pos, _ = _rope_inputs("decode_ids", torch.bfloat16)
    q, k = q.detach(), k.detach()
    wf.apply_rope(q, k, cos, sin, pos)                              # offered
    assert fast.rope(q, k, cos, sin, pos, False) is not None
    qp, kp, cp, sp, _, _ = _rope_inputs("prefill", torch.bfloat16)
    qt = qp.detach().transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) in memory
    assert fast.rope(qt, kp.detach(), cp, sp, None, False) is None  # not contiguous: Python
    assert fast.rope(q, k, cos, sin, pos.cpu(), False) is None      # CPU ids: checked in Python
    assert fast.rope(q, k, cos, sin, pos.float(), False) is None
    assert fast.rope(q, k, cos, sin, 64, False) is None             # offset past the table
    assert fast.rope(q, k, cos, sin, True, False) is None
    assert fast.rope(q, k[:, :, :, :32], cos, sin, pos, False) is None
    assert fast.rope(q, k, cos.requires_grad_(), sin, pos, False) is None
    cos.requires_grad_(False)
    from warpforge.ops import rope as rope_mod

    bad = torch.full((4, 1), 64, device="cuda")
    assert fast.rope(q, k, cos, sin, bad, False) is not None        # unchecked GPU ids: NaN tokens
    rope_mod.CHECK_POSITIONS = True                                 # checked: Python raises
    try:
        with pytest.raises(IndexError, match="position_ids"):
            wf.apply_rope(q, k, cos, sin, bad)
    finally:
        rope_mod.CHECK_POSITIONS = False
    with pytest.raises(ValueError, match="offset"):
        wf.apply_rope(q, k, cos, sin, 64)
    # a transposed (B, S, H, D) view still gives the right answer, through Python
    torch.testing.assert_close(wf.apply_rope(qt, kp, cp, sp)[0], wf.apply_rope(qp.detach(), kp, cp, sp)[0])


@gpu_only
def test_rope_table_changed_in_place_raises(fast):
    """The C++ node saves cos, sin and the ids as variables: changing one in place between the
    forward and the backward raises, as the Python path does (they were kept in saved_data, and
    the backward silently used the new values)."""
    q, k, cos, sin, pos, il = _rope_inputs("decode_ids", torch.bfloat16)
    wf.apply_rope(q.detach(), k.detach(), cos, sin, pos, il)          # offered
    for table in ("cos", "sin", "pos"):
        c, s, p = cos.clone(), sin.clone(), pos.clone()
        a, b = _leaves(q, k)
        qo, ko = wf.apply_rope(a, b, c, s, p, il)
        assert _cpp_node(qo), qo.grad_fn.name()
        {"cos": c, "sin": s, "pos": p}[table].add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (qo.float().sum() + ko.float().sum()).backward()


@gpu_only
def test_create_graph_backward_takes_the_operators(fast):
    """Under create_graph the C++ nodes hand their backward to the registered operators (the
    fallbacks): the same first-order bits, and gradients that carry a node raising on a second
    backward. A kernel launched there gave a constant, and the second-order terms were silently
    dropped."""
    x0 = randn(8, 4096, dtype=torch.bfloat16)
    w0 = randn(4096, dtype=torch.bfloat16)
    cases = {"softmax": lambda x, w: wf.softmax(x * w, -1), "rms_norm": lambda x, w: wf.rms_norm(x, (4096,), w),
             "layer_norm": lambda x, w: wf.layer_norm(x, (4096,), w, w),
             "add_rms_norm": lambda x, w: wf.add_rms_norm(x, x.flip(0), w)[0],
             "swiglu": lambda x, w: wf.swiglu(x * w, x), "geglu": lambda x, w: wf.geglu(x * w, x),
             "amax": lambda x, w: wf.amax(x * w, -1)}
    for name, fn in cases.items():
        fn(x0, w0)                                                     # offered
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = fn(x, w)
        assert _cpp_node(y), (name, y.grad_fn.name())
        used = fast.fallbacks_used()
        gx, gw = torch.autograd.grad(y.float().sum(), (x, w), create_graph=True)
        assert fast.fallbacks_used() > used, name
        x2, w2 = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        plain = torch.autograd.grad(fn(x2, w2).float().sum(), (x2, w2))
        assert torch.equal(gx, plain[0]) and torch.equal(gw, plain[1]), name
        if name == "amax":      # its backward is linear in dy (a constant here): nothing to raise
            continue
        with pytest.raises(RuntimeError, match="no autograd formula"):
            (gx.float().square().sum() + gw.float().square().sum()).backward()
