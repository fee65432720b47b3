"""The CUDA C++ backend on a GPU: every operator of ``torch.ops.warpforge_cuda`` through the public
functions (``backend="cuda"``) and directly, against float64 references.

Skipped as a whole where the backend cannot run (warpforge.cuda.unavailable_reason() says why). The
first test builds the extension (about a minute; cached afterwards in $WARPFORGE_CACHE/cuda or
~/.cache/warpforge/cuda). Every op is followed by torch.cuda.synchronize() (``sync``), and every
test by another, so an asynchronous fault is reported by the test that caused it.

Poisoning: conftest's WARPFORGE_POISON switch only reaches the Triton kernels; here the C++ ops
allocate their outputs with at::empty. An element a kernel leaves unwritten holds whatever the
allocator returned, so instead: every comparison (conftest.rel_err) fails on NaN/inf where the
reference is finite, and softmax rows must sum to 1.

Tolerances: conftest's TOL (relative error ||out - ref|| / ||ref|| against float64), times 2 for
gradients, as in tests/ops. The matmul tolerance grows with sqrt(K) past K = 1024.

``compute-sanitizer`` (memcheck, racecheck) runs tests/cuda/sanitize_cuda.py in a subprocess: marked
slow; WARPFORGE_SKIP_SANITIZER=1 or ``-m "not slow"`` leaves it out.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import warpforge as wf
import warpforge.cuda as wcuda
from warpforge.runtime.heuristics import cuda_softmax_config
from conftest import DTYPES, assert_close
from cuda_support import (BACKEND_MARKS, DEV, _synchronize_after_test, built,  # noqa: F401 (autouse fixtures)
                          find_compute_sanitizer, softmax_config_ok)

pytestmark = BACKEND_MARKS

REPO = Path(__file__).resolve().parents[2]
SANITIZE_SCRIPT = Path(__file__).with_name("sanitize_cuda.py")
# |sum(row) - 1| for softmax (sum(exp(row)) for log_softmax): observed for outputs rounded from the
# exact values, scale-3 inputs, rows up to 262,144: fp32 2e-7, fp16 1.2e-3, bf16 2.5e-3
ROWSUM_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def ops():
    return torch.ops.warpforge_cuda


def sync(t):
    """torch.cuda.synchronize(), then ``t``: an asynchronous error surfaces at the op that caused it."""
    torch.cuda.synchronize()
    return t


def rnd(*shape, dtype=torch.float32, scale=1.0, shift=0.0, requires_grad=False):
    t = (torch.randn(*shape, device=DEV) * scale + shift).to(dtype)
    return t.requires_grad_(requires_grad)


def leaf64(t):
    """A float64 copy of t that collects its own gradient."""
    return t.detach().double().requires_grad_()


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` in a view whose data pointer is one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    v = buf[1:].view(t.shape)
    v.copy_(t.detach())
    assert v.data_ptr() % 16 != 0
    return v.requires_grad_(t.requires_grad)


def unaligned_rows(t: torch.Tensor) -> torch.Tensor:
    """The values of 2-D ``t`` as x[:, :n] of a slightly wider buffer: unit column stride, an odd
    row stride (so rows after the first are not 16-byte aligned, whatever the dtype)."""
    m, n = t.shape
    width = n + (1 if n % 2 == 0 else 2)
    buf = torch.randn(m, width, device=t.device).to(t.dtype)
    v = buf[:, :n]
    v.copy_(t.detach())
    assert v.stride() == (width, 1) and (v.stride(0) * v.element_size()) % 16 != 0
    return v.requires_grad_(t.requires_grad)


def check_rows_normalised(y: torch.Tensor, log: bool, dtype, what=""):
    p = y.detach().double()
    s = (p.exp() if log else p).sum(-1)
    tol = ROWSUM_TOL[dtype] * (2 if log else 1)
    err = (s - 1).abs().max().item()
    worst = s.flatten()[(s - 1).abs().flatten().argmax()].item()
    assert err <= tol, f"{what} a row sums to {worst!r} (|err| {err:.2e} > {tol:.0e})"


# ----------------------------------------------------------------------------------------------
# add
# ----------------------------------------------------------------------------------------------
ADD_N = [1, 7, 123, 4097, 2**20 + 3]
ADD_VARIANTS = ["naive", "vectorized"]


@pytest.mark.parametrize("variant", ADD_VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("n", ADD_N)
def test_add_forward_backward(n, dtype, variant):
    a, b = rnd(n, dtype=dtype, requires_grad=True), rnd(n, dtype=dtype, requires_grad=True)
    y = sync(wf.add(a, b, variant=variant, backend="cuda"))
    assert y.shape == a.shape and y.dtype == dtype and y.device == a.device and y.is_contiguous()
    assert_close(y, a.double() + b.double(), dtype, what="add")
    dy = rnd(n, dtype=dtype)
    y.backward(dy)
    sync(None)
    assert torch.equal(a.grad, dy) and torch.equal(b.grad, dy)


@pytest.mark.parametrize("variant", ADD_VARIANTS)
@pytest.mark.parametrize("alpha", [0.5, -2.0, 0.0, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
def test_add_alpha(dtype, alpha, variant):
    n = 4097
    a, b = rnd(n, dtype=dtype, requires_grad=True), rnd(n, dtype=dtype, requires_grad=True)
    y = sync(wf.add(a, b, alpha=alpha, variant=variant, backend="cuda"))
    assert_close(y, a.double() + alpha * b.double(), dtype, what=f"alpha={alpha}")
    dy = rnd(n, dtype=dtype)
    y.backward(dy)
    sync(None)
    assert torch.equal(a.grad, dy)
    assert_close(b.grad, alpha * dy.double(), dtype, what="grad of other")


@pytest.mark.parametrize("variant", ADD_VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
def test_add_layouts(dtype, variant):
    # transposed 2-D views (copied by the wrapper), and 2-D / 3-D shapes
    at, bt = rnd(65, 33, dtype=dtype).t(), rnd(65, 33, dtype=dtype).t()
    assert not at.is_contiguous()
    assert_close(sync(wf.add(at, bt, alpha=0.5, variant=variant, backend="cuda")),
                 at.double() + 0.5 * bt.double(), dtype, what="transposed")
    a3, b3 = rnd(3, 5, 7, dtype=dtype), rnd(3, 5, 7, dtype=dtype)
    y3 = sync(wf.add(a3, b3, variant=variant, backend="cuda"))
    assert y3.shape == (3, 5, 7)
    assert_close(y3, a3.double() + b3.double(), dtype, what="3-D")
    s = sync(wf.add(torch.tensor(1.5, device=DEV, dtype=dtype), torch.tensor(2.0, device=DEV, dtype=dtype),
                    variant=variant, backend="cuda"))
    assert s.shape == () and s.item() == 3.5


@pytest.mark.parametrize("variant", ADD_VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("n", [7, 4097, 2**20 + 3])
def test_add_misaligned_storage(n, dtype, variant):
    """x[1:] of a larger tensor: contiguous, but the data pointer is not 16-byte aligned, so the
    vectorized kernel must take its scalar path (for either operand)."""
    a, b = rnd(n, dtype=dtype, requires_grad=True), rnd(n, dtype=dtype, requires_grad=True)
    am, bm = misaligned(a), misaligned(b)
    for x, y, what in ((am, b, "input misaligned"), (a, bm, "other misaligned"), (am, bm, "both misaligned")):
        out = sync(wf.add(x, y, alpha=-1.5, variant=variant, backend="cuda"))
        assert_close(out, x.double() - 1.5 * y.double(), dtype, what=what)
    out = wf.add(am, bm, alpha=2.0, variant=variant, backend="cuda")
    dy = rnd(n, dtype=dtype)
    out.backward(dy)
    sync(None)
    assert torch.equal(am.grad, dy)
    assert_close(bm.grad, 2.0 * dy.double(), dtype, what="grad of misaligned other")


# ----------------------------------------------------------------------------------------------
# sum, amax
# ----------------------------------------------------------------------------------------------
RED_SHAPES = [(1, 1), (3, 123), (7, 4097), (2, 262144 + 5), (5000, 33), (1, 2**20 + 1),
              # a block a row: 256 threads (2,049..4,096 bf16), 512 wide; one item a row once there
              # are rows enough for a wave (deep kernels, misaligned tails)
              (270, 2049), (600, 3000), (300, 8193), (300, 40001)]


def _shift(n: int) -> float:
    """A positive mean for the inputs of row sums: sums far from 0 (so a relative error means
    something even for one row) yet below float16's maximum, 65504, for rows up to 2**20."""
    return min(0.5, 8000.0 / n)


def _reduce_ref(name, x, dim=-1, keepdim=False):
    return x.sum(dim, keepdim=keepdim) if name == "sum" else x.amax(dim, keepdim=keepdim)


def _check_reduce(name, y, x, dtype, dim=-1, keepdim=False, what=""):
    if name == "amax":   # exact: a max of representable values
        ref = x.detach().amax(dim, keepdim=keepdim)
        assert y.shape == ref.shape and y.dtype == ref.dtype
        assert torch.equal(y, ref), f"{what} amax differs from torch.amax in {(y != ref).sum().item()} place(s)"
    else:
        assert_close(y, x.detach().double().sum(dim, keepdim=keepdim), dtype, what=what)


@pytest.mark.parametrize("name", ["sum", "amax"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("shape", RED_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reduce_forward_backward(shape, dtype, name):
    x = rnd(*shape, dtype=dtype, shift=_shift(shape[-1]), requires_grad=True)
    y = sync(getattr(wf, name)(x, -1, backend="cuda"))
    assert y.shape == shape[:-1] and y.dtype == dtype
    _check_reduce(name, y, x, dtype, what=str(shape))
    dy = rnd(*shape[:-1], dtype=dtype)
    y.backward(dy)
    sync(None)
    xr = leaf64(x)
    _reduce_ref(name, xr).backward(dy.double())
    assert_close(x.grad, xr.grad, dtype, scale=2.0, what="backward")


@pytest.mark.parametrize("config", [[1, 0, 0, 0, 0], [2, 0, 0, 0, 0], [2, 3, 256, 0, 1], [1, 5, 128, 512, 0],
                                    [0, 0, 0, 8192, 0], [0, 0, 0, 0, 1]],
                         ids=lambda c: "-".join(map(str, c)))
def test_reduce_tuning_knobs(config):
    """Every launch shape the probe's knobs reach (deep / wide kernels, forced chunks, threads,
    the warp-per-row limit) gives the same answer; the knobs are reset afterwards."""
    ops = wcuda.ops()
    try:
        ops.reduce_tuning(config)
        for dtype in DTYPES:
            for shape in ((3, 123), (270, 2049), (37, 40001), (2, 2**17 + 3)):
                for name in ("sum", "amax"):
                    x = rnd(*shape, dtype=dtype, shift=_shift(shape[-1]))
                    y = sync(getattr(wf, name)(x, backend="cuda"))
                    _check_reduce(name, y, x, dtype, what=f"{shape} config {config}")
    finally:
        ops.reduce_tuning([0, 0, 0, 0, 0])
    with pytest.raises(RuntimeError, match="config"):
        ops.reduce_tuning([3, 0, 0, 0, 0])
    with pytest.raises(RuntimeError, match="config"):
        ops.reduce_tuning([0, 0])


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "amax"])
def test_reduce_dims_and_keepdim(name, keepdim):
    for dtype in DTYPES:
        x = rnd(5, 9, 4099, dtype=dtype, shift=0.5)
        for dim in (0, 1, 2, -1, -3):
            y = sync(getattr(wf, name)(x, dim, keepdim, backend="cuda"))
            _check_reduce(name, y, x, dtype, dim=dim, keepdim=keepdim, what=f"dim={dim} keepdim={keepdim} {dtype}")
        v = rnd(37, dtype=dtype, shift=0.5)                                   # 1-D
        _check_reduce(name, sync(getattr(wf, name)(v, 0, keepdim, backend="cuda")), v, dtype, dim=0,
                      keepdim=keepdim, what="1-D")
        s = torch.tensor(2.5, device=DEV, dtype=dtype)                        # 0-D
        assert sync(getattr(wf, name)(s, backend="cuda")).item() == 2.5


@pytest.mark.parametrize("name", ["sum", "amax"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("shape", [(3, 123), (7, 4097), (2, 262144 + 5), (300, 33)],
                         ids=lambda s: "x".join(map(str, s)))
def test_reduce_strided_rows(shape, dtype, name):
    """Rows x[:, :n] of a wider tensor (row stride not a multiple of 16 bytes), every other row of
    a taller one (aligned stride), a misaligned data pointer, and a transposed (copied) view."""
    base = rnd(*shape, dtype=dtype, shift=_shift(shape[-1]), requires_grad=True)
    fn = getattr(wf, name)
    every_other = torch.randn(shape[0], 2, shape[1], device=DEV).to(dtype)[:, 0, :]
    every_other.copy_(base.detach())
    for x, what in ((unaligned_rows(base), "unaligned row stride"), (every_other, "every other row"),
                    (misaligned(base), "misaligned pointer")):
        _check_reduce(name, sync(fn(x, -1, backend="cuda")), x, dtype, what=what)
    t = rnd(shape[1], 5, dtype=dtype, shift=_shift(shape[-1])).t()
    _check_reduce(name, sync(fn(t, -1, backend="cuda")), t, dtype, what="transposed")
    # backward through the strided view
    x = unaligned_rows(base.detach()).requires_grad_()
    y = fn(x, -1, backend="cuda")
    dy = rnd(shape[0], dtype=dtype)
    y.backward(dy)
    sync(None)
    xr = leaf64(x)
    _reduce_ref(name, xr).backward(dy.double())
    assert_close(x.grad, xr.grad, dtype, scale=2.0, what="backward, strided rows")


@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16)],
                         ids=lambda d: _dt(d))
@pytest.mark.parametrize("n", [123, 4097, 262144 + 5])
def test_sum_dtype(n, in_dtype, out_dtype):
    x = rnd(3, n, dtype=in_dtype, shift=_shift(n), requires_grad=True)
    y = sync(wf.sum(x, -1, dtype=out_dtype, backend="cuda"))
    assert y.dtype == out_dtype and y.shape == (3,)
    assert_close(y, x.detach().double().sum(-1), out_dtype, what=f"{in_dtype} -> {out_dtype}")
    dy = rnd(3, dtype=out_dtype)
    y.backward(dy)
    sync(None)
    assert x.grad.dtype == in_dtype
    assert torch.equal(x.grad, dy.to(in_dtype)[:, None].expand(3, n))


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("n", [123, 4097, 262144 + 5])
def test_amax_nan_and_infinities(n, dtype):
    x = rnd(5, n, dtype=dtype)
    x[1, n // 2] = float("nan")
    x[3, n - 1] = float("nan")           # the very last element: the row's tail
    x[2] = float("-inf")
    x[4, 0] = float("inf")
    y = sync(wf.amax(x, -1, backend="cuda"))
    ref = x.amax(-1)
    assert torch.isnan(y[1]) and torch.isnan(y[3]), f"NaN in a row must give NaN; got {y.tolist()}"
    assert y[2].item() == float("-inf") and y[4].item() == float("inf")
    assert torch.equal(y[0], ref[0])


# ----------------------------------------------------------------------------------------------
# softmax, log_softmax
# ----------------------------------------------------------------------------------------------
SOFTMAX_N = [1, 7, 33, 123, 1000, 1024, 1025, 4097, 8192, 32768, 65536 + 3, 131072, 262144]
LOGS = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])


def _sm(log):
    return (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("n", SOFTMAX_N)
def test_softmax_forward(n, dtype, log):
    fn, tfn = _sm(log)
    x = rnd(3, n, dtype=dtype, scale=3.0)
    y = sync(fn(x, -1, backend="cuda"))
    assert y.shape == x.shape and y.dtype == dtype
    what = f"n={n} config {cuda_softmax_config(n, x.element_size())}:"
    assert_close(y, tfn(x.double(), -1), dtype, what=what)
    check_rows_normalised(y, log, dtype, what=what)


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
def test_softmax_many_rows(dtype, log):
    fn, tfn = _sm(log)
    for shape in ((512, 1000), (1001, 7), (37, 33000)):
        x = rnd(*shape, dtype=dtype, scale=3.0)
        y = sync(fn(x, -1, backend="cuda"))
        assert_close(y, tfn(x.double(), -1), dtype, what=str(shape))
        check_rows_normalised(y, log, dtype, what=str(shape))


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("n", [7, 1025, 4097 + 2, 65536 + 3, 262144])
def test_softmax_backward(n, dtype, log):
    fn, tfn = _sm(log)
    x = rnd(2, n, dtype=dtype, scale=3.0, requires_grad=True)
    y = fn(x, -1, backend="cuda")
    dy = rnd(2, n, dtype=dtype)
    y.backward(dy)
    sync(None)
    xr = leaf64(x)
    yr = tfn(xr, -1)
    yr.backward(dy.double())
    assert_close(y, yr, dtype, what="forward")
    assert_close(x.grad, xr.grad, dtype, scale=2.0,
                 what=f"backward, n={n} config {cuda_softmax_config(n, x.element_size(), backward=True)}:")


@LOGS
def test_softmax_other_dims_and_layouts(log):
    fn, tfn = _sm(log)
    for dtype in DTYPES:
        z = rnd(6, 37, 5, dtype=dtype, scale=3.0)
        for dim in (0, 1, -2, 2):
            assert_close(sync(fn(z, dim, backend="cuda")), tfn(z.double(), dim), dtype, what=f"dim={dim}")
        for n in (123, 1025, 65536 + 3):
            base = rnd(3, n, dtype=dtype, scale=3.0)
            every_other = torch.randn(3, 2, n, device=DEV).to(dtype)[:, 0, :]
            every_other.copy_(base)
            for x, what in ((unaligned_rows(base), "unaligned row stride"), (every_other, "every other row"),
                            (misaligned(base), "misaligned pointer")):
                y = sync(fn(x, -1, backend="cuda"))
                assert_close(y, tfn(x.double(), -1), dtype, what=f"n={n} {what}")
                check_rows_normalised(y, log, dtype, what=f"n={n} {what}")
        t = rnd(50, 7, dtype=dtype, scale=3.0).t()                        # column stride != 1: copied
        assert_close(sync(fn(t, -1, backend="cuda")), tfn(t.double(), -1), dtype, what="transposed")
        s = sync(fn(torch.tensor(0.3, device=DEV, dtype=dtype), backend="cuda"))
        assert s.shape == () and abs(s.item() - (0.0 if log else 1.0)) <= 1e-6, s.item()
        y = sync(fn(z, 1, dtype=torch.float32, backend="cuda"))          # dtype= converts first
        assert y.dtype == torch.float32
        assert_close(y, tfn(z.double(), 1), torch.float32, what="dtype=")


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("n", [7, 1025, 32768, 262144])
def test_softmax_strided_backward(n, dtype, log):
    """Backward where the input rows are strided (the saved output is contiguous) and dy is strided."""
    fn, tfn = _sm(log)
    x = unaligned_rows(rnd(2, n, dtype=dtype, scale=3.0)).requires_grad_()
    y = fn(x, -1, backend="cuda")
    dy = unaligned_rows(rnd(2, n, dtype=dtype))
    y.backward(dy)
    sync(None)
    xr = leaf64(x)
    tfn(xr, -1).backward(dy.double())
    assert_close(x.grad, xr.grad, dtype, scale=2.0, what="backward")


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
@pytest.mark.parametrize("n", [7, 1025, 32768, 262144])
def test_softmax_masked_rows(n, dtype, log):
    """A row of -inf but one finite element (first or last, so in the first or the last thread and
    block) gives 1 (log: 0) there and 0 (log: -inf) elsewhere; an all -inf row gives NaN; both as torch."""
    fn, tfn = _sm(log)
    x = torch.full((4, n), float("-inf"), device=DEV, dtype=dtype)
    x[0, n - 1] = 2.0
    x[1, 0] = -3.0
    x[3] = rnd(n, dtype=dtype, scale=3.0)       # an ordinary row next to them
    y = sync(fn(x, -1, backend="cuda"))
    ref = tfn(x.double(), -1)
    assert torch.isnan(ref[2]).all()
    assert torch.isnan(y[2]).all(), "an all -inf row should give NaN, as torch does"
    assert_close(y[[0, 1, 3]], ref[[0, 1, 3]], dtype, what="masked rows")
    hot = y[0, n - 1].item(), y[1, 0].item()
    want = 0.0 if log else 1.0
    assert all(abs(h - want) <= 1e-2 for h in hot), f"the finite element gives {hot}; expected {want}"


def _f_softmax_pair(t):
    return wf.softmax(t, -1, backend="cuda"), wf.log_softmax(t, -1, backend="cuda")


@pytest.mark.parametrize("shape,dtype", [((4, 1000), torch.float32), ((2, 65536 + 3), torch.bfloat16)],
                         ids=["4x1000-float32", "2x65539-bfloat16"])
def test_softmax_torch_compile_fullgraph(shape, dtype):
    wcuda.load()                       # under torch.compile the library must already be loaded
    torch._dynamo.reset()              # a fresh, static-shape compile for each case
    compiled = torch.compile(_f_softmax_pair, fullgraph=True)
    x = rnd(*shape, dtype=dtype, scale=3.0)
    got, eager = sync(compiled(x)), sync(_f_softmax_pair(x))
    for g, e, log in zip(got, eager, (False, True)):
        assert torch.equal(g, e), f"compiled != eager for {shape} {dtype} (log={log}): same kernel, same shape"
        assert_close(g, _sm(log)[1](x.double(), -1), dtype, what=f"compiled {shape}")


def test_softmax_torch_compile_dynamic_shapes():
    """dynamic=True: the row length is symbolic when cuda_softmax_config picks the launch shape."""
    wcuda.load()
    torch._dynamo.reset()
    compiled = torch.compile(_f_softmax_pair, fullgraph=True, dynamic=True)
    for shape in ((4, 1000), (3, 1025), (2, 65536 + 3)):
        x = rnd(*shape, scale=3.0)
        for g, log in zip(sync(compiled(x)), (False, True)):
            assert_close(g, _sm(log)[1](x.double(), -1), torch.float32, what=f"compiled, dynamic {shape}")


def test_softmax_torch_compile_backward():
    wcuda.load()

    def f(t, w):
        return (wf.softmax(t, -1, backend="cuda") * w).sum()

    x = rnd(3, 1025, scale=3.0, requires_grad=True)
    w = rnd(3, 1025)
    sync(torch.compile(f, fullgraph=True)(x, w)).backward()
    sync(None)
    xr = leaf64(x)
    (torch.softmax(xr, -1) * w.double()).sum().backward()
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="compiled backward")


# ---- opcheck ------------------------------------------------------------------------------------
def test_opcheck_softmax():
    for dtype, n in ((torch.float32, 37), (torch.bfloat16, 4100)):
        x = rnd(4, n, dtype=dtype, requires_grad=True)
        cfg = cuda_softmax_config(n, x.element_size())
        for log in (False, True):
            torch.library.opcheck(ops().softmax.default, (x, log, cfg))
            y = sync(ops().softmax(x.detach(), log, cfg))
            bcfg = cuda_softmax_config(n, x.element_size(), backward=True)
            torch.library.opcheck(ops().softmax_backward.default, (y, rnd(4, n, dtype=dtype), log, bcfg))


def test_opcheck_add():
    for dtype in (torch.float32, torch.bfloat16):
        a, b = rnd(5, 37, dtype=dtype, requires_grad=True), rnd(5, 37, dtype=dtype, requires_grad=True)
        torch.library.opcheck(ops().add.default, (a, b, 0.5, "vectorized"))
        torch.library.opcheck(ops().add.default, (a, b, 1.0, "naive"))


def test_opcheck_sum_amax():
    x = rnd(6, 37, requires_grad=True)
    torch.library.opcheck(ops().sum.default, (x, torch.float32))
    torch.library.opcheck(ops().amax.default, (x,))
    xb = rnd(3, 5000, dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(ops().sum.default, (xb, torch.float32))
    torch.library.opcheck(ops().amax.default, (xb,))


def test_opcheck_matmul():
    a, b = rnd(17, 33, requires_grad=True), rnd(33, 45, requires_grad=True)
    for v in ("naive", "tiled", "regblock"):
        torch.library.opcheck(ops().matmul.default, (a, b, v))
    # mma needs leading dimensions that are multiples of 8 (the public wrapper pads; the op does not)
    a16 = rnd(24, 40, dtype=torch.bfloat16, requires_grad=True)
    b16 = rnd(40, 56, dtype=torch.bfloat16, requires_grad=True)
    for v in ("mma", "mma_tma"):
        torch.library.opcheck(ops().matmul.default, (a16, b16, v))


# ---- launch shapes, explicitly --------------------------------------------------------------------
SWEEP = {
    32768: [[1024, 4, 1, 1], [512, 4, 2, 1], [256, 4, 4, 1], [128, 4, 8, 1], [64, 4, 16, 1], [512, 2, 4, 1],
            [1024, 1, 4, 1], [256, 1, 16, 1], [992, 4, 2, 1], [96, 4, 16, 1], [1024, 0, 1, 1], [256, 0, 1, 1]],
    262144: [[1024, 4, 8, 1], [512, 4, 16, 1], [1024, 0, 1, 1], [128, 0, 1, 1]],
}
SWEEP_CASES = [(n, cfg) for n, cfgs in SWEEP.items() for cfg in cfgs]


@LOGS
@pytest.mark.parametrize("n,cfg", SWEEP_CASES, ids=[f"{n}-{'_'.join(map(str, c))}" for n, c in SWEEP_CASES])
def test_softmax_launch_shapes(n, cfg, log):
    dtype = torch.bfloat16
    assert softmax_config_ok(cfg, n, 2, backward=False) is None, f"test bug: {cfg} is not a valid forward shape"
    x = rnd(2, n, dtype=dtype, scale=3.0)
    y = sync(ops().softmax(x, log, cfg))
    ref = _sm(log)[1](x.double(), -1)
    assert_close(y, ref, dtype, what=f"forward {cfg}")
    check_rows_normalised(y, log, dtype, what=f"forward {cfg}")
    dy = rnd(2, n, dtype=dtype)
    if softmax_config_ok(cfg, n, 2, backward=True) is None:
        dx = sync(ops().softmax_backward(y, dy, log, cfg))
        xr = leaf64(x)
        _sm(log)[1](xr, -1).backward(dy.double())
        assert_close(dx, xr.grad, dtype, scale=2.0, what=f"backward {cfg}")
    else:   # the 16-bit backward at 4 vectors per thread: at most 512 threads
        with pytest.raises(RuntimeError, match="config"):
            ops().softmax_backward(y, dy, log, cfg)
        sync(None)


@pytest.mark.parametrize("cfg", [[256, 4, 1, 1], [32, 4, 16, 1], [1024, 0, 2, 1], [48, 1, 1, 1], [2048, 1, 1, 1],
                                 [0, 1, 1, 1], [1024, 3, 1, 1], [1024, 8, 1, 1], [1024, 4, 3, 1], [1024, 4, 32, 1],
                                 [32, 4, 1, 64], [64, 4, 1, 2], [1024, 4, 1, 0]],
                         ids=lambda c: "_".join(map(str, c)))
def test_softmax_invalid_launch_shape(cfg):
    n = 32768
    assert softmax_config_ok(cfg, n, 2, backward=False) is not None, f"test bug: {cfg} is valid"
    x = rnd(2, n, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="config"):
        ops().softmax(x, False, cfg)
    with pytest.raises(RuntimeError, match="config"):
        ops().softmax_backward(x, x, False, cfg)
    sync(None)


def test_softmax_config_of_wrong_length():
    x = rnd(2, 100)
    for cfg in ([32, 4, 1], [32, 4, 1, 4, 1], []):
        with pytest.raises(RuntimeError, match="'config' must be"):
            ops().softmax(x, False, cfg)


# ----------------------------------------------------------------------------------------------
# matmul
# ----------------------------------------------------------------------------------------------
MM_SHAPES = [(1, 1, 1), (17, 33, 45), (128, 256, 64), (123, 77, 300), (256, 512, 1024), (1000, 1000, 1000)]  # (M, N, K)
TC = ("mma", "mma_tma")   # tensor-core rungs: fp16 / bf16 only
MM_CASES = [(v, d) for v in ("naive", "tiled", "regblock", *TC) for d in DTYPES
            if not (v in TC and d == torch.float32)]
MM_IDS = [f"{v}-{_dt(d)}" for v, d in MM_CASES]


def _ksc(k: int) -> float:
    """Tolerance scale for an inner dimension k: fp32 accumulation error grows like sqrt(k)."""
    return max(1.0, (k / 1024) ** 0.5)


@pytest.mark.parametrize("variant,dtype", MM_CASES, ids=MM_IDS)
@pytest.mark.parametrize("m,n,k", MM_SHAPES, ids=["x".join(map(str, s)) for s in MM_SHAPES])
def test_matmul(m, n, k, variant, dtype):
    a, b = rnd(m, k, dtype=dtype), rnd(k, n, dtype=dtype)
    c = sync(wf.matmul(a, b, variant=variant, backend="cuda"))
    assert c.shape == (m, n) and c.dtype == dtype
    assert_close(c, a.double() @ b.double(), dtype, scale=_ksc(k), what=f"{variant} ({m}, {n}, {k})")


@pytest.mark.parametrize("variant", ["mma", "mma_tma", "mma_tma_128x128x32_s4", "mma_tma_128x256x64_s3"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_dt)
@pytest.mark.parametrize("m,n,k", [(2056, 2056, 136), (4100, 1032, 72), (8, 8, 4104)],
                         ids=["289-tiles", "4100x1032x72", "8x8x4104"])
def test_matmul_tensor_core_configs(m, n, k, variant, dtype):
    """The tensor-core tile configurations through the operator itself: more tiles than resident
    blocks (the persistent blocks of mma_tma walk several tiles, their slices numbered across
    tiles), edges in m and n, a long k of one tile. Output poisoning: a NaN-filled block of the
    output's size is freed just before the call, so the caching allocator most likely hands it to
    at::empty -- an element the kernel leaves unwritten then stays NaN (and NaN never passes)."""
    a, b = rnd(m, k, dtype=dtype), rnd(k, n, dtype=dtype)
    poison = torch.full((m, n), float("nan"), dtype=dtype, device=DEV)
    del poison
    c = sync(ops().matmul(a, b, variant))
    assert not c.isnan().any(), f"{variant}: unwritten (NaN) output elements"
    assert_close(c, a.double() @ b.double(), dtype, scale=_ksc(k), what=f"{variant} ({m}, {n}, {k})")


@pytest.mark.parametrize("variant", ["auto", "naive", "tiled", "regblock", *TC])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt)
def test_matmul_layouts(dtype, variant):
    if variant in TC and dtype == torch.float32:
        pytest.skip(f"{variant} takes float16/bfloat16 (test_matmul_errors checks the TypeError)")
    for m, n, k in ((33, 17, 45), (64, 48, 96)):
        a, w = rnd(m, k, dtype=dtype), rnd(n, k, dtype=dtype)
        b = w.t()                                                     # (K, N), column-major: copied
        a_wide = rnd(m, k + 5, dtype=dtype)[:, :k]                    # row-major, leading dim k + 5
        a_wide.copy_(a)
        a_t = rnd(k, m, dtype=dtype).t()                              # column-major
        a_t.copy_(a)
        b_wide = rnd(k, n + 3, dtype=dtype)[:, :n]
        b_wide.copy_(b)
        ref = a.double() @ b.double()
        for x, y, what in ((a, b, "b = w.T"), (a_wide, b, "a with a wide leading dim"), (a_t, b_wide, "a.T, b wide"),
                           (misaligned(a), b.contiguous(), "misaligned a")):
            c = sync(wf.matmul(x, y, variant=variant, backend="cuda"))
            assert_close(c, ref, dtype, what=f"{variant} ({m}, {n}, {k}) {what}")
        a3 = rnd(2, 5, k, dtype=dtype)                                 # batch dims fold into M
        c3 = sync(wf.matmul(a3, b, variant=variant, backend="cuda"))
        assert c3.shape == (2, 5, n)
        assert_close(c3, a3.double() @ b.double(), dtype, what=f"{variant} 3-D input")


@pytest.mark.parametrize("variant,dtype", [(v, d) for v, d in MM_CASES if v in ("regblock", *TC)],
                         ids=[i for i, (v, d) in zip(MM_IDS, MM_CASES) if v in ("regblock", *TC)])
@pytest.mark.parametrize("m,n,k", [(17, 33, 45), (128, 256, 64), (1, 8, 16)])
def test_matmul_backward(m, n, k, variant, dtype):
    a, b = rnd(m, k, dtype=dtype, requires_grad=True), rnd(k, n, dtype=dtype, requires_grad=True)
    c = wf.matmul(a, b, variant=variant, backend="cuda")
    dc = rnd(m, n, dtype=dtype)
    c.backward(dc)
    sync(None)
    ar, br = leaf64(a), leaf64(b)
    (ar @ br).backward(dc.double())
    assert_close(c, ar @ br, dtype, scale=_ksc(k), what="forward")
    assert_close(a.grad, ar.grad, dtype, scale=2.0 * _ksc(n), what=f"{variant} grad of a ({m}, {n}, {k})")
    assert_close(b.grad, br.grad, dtype, scale=2.0 * _ksc(m), what=f"{variant} grad of b ({m}, {n}, {k})")


def test_matmul_errors():
    a32, b32 = rnd(8, 16), rnd(16, 8)
    for v in TC:
        with pytest.raises(TypeError, match=v):
            wf.matmul(a32, b32, variant=v, backend="cuda")
    with pytest.raises(ValueError, match=r"'input'.*'other'"):
        wf.matmul(rnd(3, 4), rnd(5, 6), backend="cuda")                # K mismatch
    with pytest.raises(ValueError, match="'other'"):
        wf.matmul(rnd(3, 4), rnd(4), backend="cuda")                   # 1-D other
    with pytest.raises(ValueError, match="'other'"):
        wf.matmul(rnd(3, 4), rnd(2, 4, 5), backend="cuda")             # batched other: not on this backend
    with pytest.raises(ValueError, match="'input'"):
        wf.matmul(rnd(4), rnd(4, 5), backend="cuda")                   # 1-D input
    with pytest.raises(ValueError, match="'variant'"):
        wf.matmul(a32, b32, variant="splitk", backend="cuda")          # a Triton-only rung
    with pytest.raises(TypeError, match="'input'|'other'"):
        wf.matmul(a32, b32.half(), backend="cuda")                     # dtype mismatch
    sync(None)


# ----------------------------------------------------------------------------------------------
# bad input reaching the operators directly
# ----------------------------------------------------------------------------------------------
CFG = [32, 1, 1, 4]   # a valid warp-per-row shape for rows of <= 128 fp32 / 256 16-bit elements


@pytest.mark.parametrize("bad", [torch.int32, torch.float64], ids=_dt)
def test_op_wrong_dtype(bad):
    xi = torch.ones(3, 4, device=DEV, dtype=bad)
    cases = [
        ("add", lambda: ops().add(xi, xi, 1.0, "naive"), "'input' has dtype"),
        ("add vectorized", lambda: ops().add(xi, xi, 1.0, "vectorized"), "'input' has dtype"),
        ("sum", lambda: ops().sum(xi, torch.float32), "'input' has dtype"),
        ("amax", lambda: ops().amax(xi), "'input' has dtype"),
        ("softmax", lambda: ops().softmax(xi, False, CFG), "'input' has dtype"),
        ("softmax_backward", lambda: ops().softmax_backward(xi, xi, False, CFG), "'output' has dtype"),
        ("matmul", lambda: ops().matmul(xi, xi.t().contiguous(), "naive"), "'a' has dtype"),
    ]
    for name, call, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            call()
    x = rnd(3, 4)
    with pytest.raises(RuntimeError, match="'dtype' has dtype"):
        ops().sum(x, bad)                                          # output dtype
    with pytest.raises(RuntimeError, match="'other' has dtype"):
        ops().add(x, x.to(torch.float16), 1.0, "naive")
    with pytest.raises(RuntimeError, match="'grad_output' has dtype"):
        ops().softmax_backward(x, x.half(), False, CFG)
    with pytest.raises(RuntimeError, match="'b' has dtype"):
        ops().matmul(x, rnd(4, 5, dtype=torch.bfloat16), "naive")
    sync(None)


def test_op_mixed_device_inputs():
    """One CUDA and one CPU tensor: the op runs and its check names the CPU argument."""
    x = rnd(3, 4)
    with pytest.raises(RuntimeError, match="'other' must be a CUDA tensor"):
        ops().add(x, x.cpu(), 1.0, "naive")
    with pytest.raises(RuntimeError, match="'input' must be a CUDA tensor"):
        ops().add(x.cpu(), x, 1.0, "naive")
    with pytest.raises(RuntimeError, match="'grad_output' must be a CUDA tensor"):
        ops().softmax_backward(x, x.cpu(), False, CFG)
    with pytest.raises(RuntimeError, match="'b' must be a CUDA tensor"):
        ops().matmul(x, rnd(4, 5).cpu(), "naive")
    sync(None)


CPU_CALLS = {
    "add": lambda x: ops().add(x, x, 1.0, "naive"),
    "sum": lambda x: ops().sum(x, torch.float32),
    "amax": lambda x: ops().amax(x),
    "softmax": lambda x: ops().softmax(x, False, CFG),
    "softmax_backward": lambda x: ops().softmax_backward(x, x, False, CFG),
    "matmul": lambda x: ops().matmul(x, x.t().contiguous(), "naive"),
}


@pytest.mark.parametrize("name", list(CPU_CALLS))
def test_op_cpu_tensor(name):
    """Only CPU tensors: ops.cpp's check_cuda() says the tensor must be a CUDA tensor. (Needs a
    kernel registered for the CPU dispatch key too; with the CUDA one only, the dispatcher answers
    first with "Could not run 'warpforge_cuda::...' with arguments from the 'CPU' backend".)"""
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        CPU_CALLS[name](torch.ones(3, 4))


@pytest.mark.parametrize("name", ["add", "sum", "amax", "softmax", "log_softmax", "matmul"])
def test_public_cpu_tensor_with_cuda_backend(name):
    x = torch.ones(3, 4)
    calls = {
        "add": lambda: wf.add(x, x, backend="cuda"), "sum": lambda: wf.sum(x, backend="cuda"),
        "amax": lambda: wf.amax(x, backend="cuda"), "softmax": lambda: wf.softmax(x, backend="cuda"),
        "log_softmax": lambda: wf.log_softmax(x, backend="cuda"),
        "matmul": lambda: wf.matmul(x, x.t(), backend="cuda"),
    }
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        calls[name]()


def test_op_bad_shapes_and_strides():
    x = rnd(3, 4)
    with pytest.raises(RuntimeError, match="shape"):
        ops().add(x, rnd(4, 3), 1.0, "vectorized")
    with pytest.raises(ValueError, match="'other'"):
        wf.add(x, rnd(4, 3), backend="cuda")
    x3 = rnd(2, 3, 4)
    for call in (lambda: ops().sum(x3, torch.float32), lambda: ops().amax(x3), lambda: ops().softmax(x3, False, CFG),
                 lambda: ops().sum(rnd(4), torch.float32)):
        with pytest.raises(RuntimeError, match="2-D"):
            call()
    with pytest.raises(RuntimeError, match="2-D"):
        ops().matmul(x3, rnd(4, 5), "naive")
    with pytest.raises(RuntimeError, match="'a'.*'b'"):
        ops().matmul(x, rnd(5, 6), "naive")                     # K mismatch
    t = rnd(6, 4).t()                                          # column stride 6
    for call in (lambda: ops().sum(t, torch.float32), lambda: ops().amax(t), lambda: ops().softmax(t, False, CFG)):
        with pytest.raises(RuntimeError, match="unit stride"):
            call()
    with pytest.raises(RuntimeError, match="contiguous"):
        ops().add(t, t, 1.0, "naive")
    with pytest.raises(RuntimeError, match="row-major"):
        ops().matmul(rnd(4, 6), rnd(5, 6).t(), "naive")          # b (6, 5) column-major
    with pytest.raises(RuntimeError, match="'variant'"):
        ops().add(x, x, 1.0, "fast")
    with pytest.raises(RuntimeError, match="'variant'"):
        ops().matmul(x, rnd(4, 5), "cublas")
    with pytest.raises(RuntimeError, match="mma"):
        ops().matmul(rnd(8, 16), rnd(16, 8), "mma")             # fp32
    for v in TC:
        with pytest.raises(RuntimeError, match="aligned"):
            ops().matmul(rnd(8, 15, dtype=torch.half), rnd(15, 8, dtype=torch.half), v)   # lda = 15
        with pytest.raises(RuntimeError, match="mma"):
            ops().matmul(rnd(8, 16), rnd(16, 8), v)             # fp32
    with pytest.raises(RuntimeError, match="0 columns"):
        ops().sum(rnd(3, 0), torch.float32)
    sync(None)


def test_op_empty_inputs():
    assert sync(ops().add(rnd(0, 3), rnd(0, 3), 1.0, "vectorized")).shape == (0, 3)
    assert sync(ops().sum(rnd(0, 5), torch.float32)).shape == (0,)
    assert sync(ops().softmax(rnd(0, 5), False, CFG)).shape == (0, 5)
    c = sync(ops().matmul(rnd(3, 0), rnd(0, 4), "naive"))
    assert c.shape == (3, 4) and torch.equal(c, torch.zeros(3, 4, device=DEV))


def test_op_tensors_on_different_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs to put the operands on different devices; this machine has "
                    f"{torch.cuda.device_count()}")
    x0 = torch.randn(3, 4, device="cuda:0")
    x1 = torch.randn(3, 4, device="cuda:1")
    with pytest.raises(RuntimeError, match="'other' is on cuda:1 but 'input' is on cuda:0"):
        ops().add(x0, x1, 1.0, "naive")
    with pytest.raises(RuntimeError, match="'grad_output' is on cuda:1"):
        ops().softmax_backward(x0, x1, False, CFG)
    with pytest.raises(RuntimeError, match="'b' is on cuda:1"):
        ops().matmul(x0, torch.randn(4, 5, device="cuda:1"), "naive")
    # and everything runs on a second device (the device guard, the per-device SM count)
    y = rnd(2, 262144 + 5, dtype=torch.bfloat16).to("cuda:1")
    assert_close(sync(wf.sum(y, -1, backend="cuda")), y.double().sum(-1), torch.bfloat16, what="cuda:1 sum")
    assert_close(sync(wf.softmax(y, -1, backend="cuda")), torch.softmax(y.double(), -1), torch.bfloat16,
                 what="cuda:1 softmax")
    torch.cuda.synchronize("cuda:1")


# ----------------------------------------------------------------------------------------------
# compute-sanitizer
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer(tool):
    """tests/cuda/sanitize_cuda.py (every kernel once, small odd shapes) under compute-sanitizer.

    ``--report-api-errors no``: PyTorch's start-up probes return CUDA errors on purpose, which the
    default would count; the script's own launch errors raise (TORCH_CHECK / C10_CUDA_CHECK), so
    they still fail the run. PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives each tensor its own
    allocation, so memcheck sees an access past a tensor's end (in a cached pool it would not)."""
    if os.environ.get("WARPFORGE_SKIP_SANITIZER") == "1":
        pytest.skip("WARPFORGE_SKIP_SANITIZER=1")
    exe = find_compute_sanitizer()
    if exe is None:
        pytest.skip("compute-sanitizer is not on PATH (nor next to nvcc)")
    cache = os.environ.get("WARPFORGE_CACHE") or str(Path.home() / ".cache" / "warpforge")
    env = dict(os.environ, WARPFORGE_CACHE=cache, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    cmd = [exe, "--tool", tool, "--error-exitcode", "1", "--report-api-errors", "no",
           sys.executable, str(SANITIZE_SCRIPT)]
    try:
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} ran past 1800 s:\n{str(e.stdout or '')[-4000:]}\n{str(e.stderr or '')[-4000:]}")
    out = p.stdout + p.stderr
    tail = out[-12000:]
    assert "sanitize: ok" in out, f"the script did not finish:\n{tail}"
    if tool == "racecheck":
        # racecheck also flags PyTorch's own at::native::reduce_kernel (the script's reference sums
        # and maxima on the GPU; seen on an H100, 2026-11-22): a hazard counts only in our kernels
        races = re.findall(r"Race reported between .*? access at (.*?)\+0x", out)
        ours = [k for k in races if "at::native::" not in k]
        assert not ours, f"racecheck found hazards in warpforge kernels: {sorted(set(ours))}\n{tail}"
        assert p.returncode == 0 or races, f"{' '.join(cmd)} exited {p.returncode}:\n{tail}"
    else:
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{tail}"
        assert "ERROR SUMMARY: 0 errors" in out, f"{tool} reported errors:\n{tail}"
