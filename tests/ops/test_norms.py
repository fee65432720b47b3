import math

import pytest
import torch
import torch.nn.functional as F

from warpforge.ops.norms import (add_rms_norm, add_rms_norm_backward_op, add_rms_norm_op, add_rms_norm_reference,
                                 layer_norm, layer_norm_backward_op, layer_norm_op, layer_norm_reference,
                                 rms_norm, rms_norm_backward_op, rms_norm_op, rms_norm_reference)
from conftest import DTYPES, ON_GPU, DEVICE, assert_close, gpu_only, noncontig, randn

SHAPES = [(1,), (3, 7), (2, 3, 123), (7, 256), (5, 4097), (2, 20000), (2, 20480)]   # block path (7 x 256: N ==
# BLOCK_N, rows past M in a 16-row program), and the loop path past 16,384 (20,480: whole steps, EVEN_N)
if ON_GPU:
    # wide blocks, the split and pipe paths (bwd split from 4,097 for LayerNorm, 8,193 for RMSNorm;
    # pipe past 32K); 300 x 65,536 and 100 x 262,144 give each pipe program many rows (its
    # carried row) and a row count no multiple of the row groups
    SHAPES += [(64, 32768), (8, 65536), (3, 262144), (4097, 1024), (33, 16384), (300, 65536), (100, 262144),
               (300, 8192), (280, 5000),       # the loop forward (4K < N <= 8K, >= 2 rows an SM)
               (300, 32768), (280, 20000), (300, 3000),   # H200: the loop to 32K, LayerNorm 4K at 4 warps
               (280, 40000)]                              # H200: RMSNorm's 2,048-column pipe, a partial chunk


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    """A float64 copy of t that collects its own gradient."""
    return None if t is None else t.detach().double().requires_grad_()


def _grads(*ts):
    return [None if t is None else t.grad for t in ts]


def _param(n: int, dtype, requires_grad=True, scale=0.5, shift=1.0):
    return (randn(n, scale=scale) + shift).to(dtype).requires_grad_(requires_grad)


class _GuardedOutputs:
    """Every output the norms' launchers allocate (``ops.norms.new_empty``) as the head of a
    larger buffer whose tail holds a canary: a store past the end of an output (a row past M, a
    column past N) lands in the tail, where ``check`` sees it. The heads start as NaN, as the
    conftest's poisoned outputs do. The eager fast path (GPU), which allocates its own, is off."""
    CANARY = 3.0

    def __init__(self, monkeypatch):
        from warpforge.ops import norms as mod
        from warpforge.runtime import fastpath

        self.buffers = []
        monkeypatch.setattr(mod, "new_empty", self._new_empty)
        monkeypatch.setattr(fastpath, "lib", None)

    def _new_empty(self, shape, *, dtype, device):
        numel = math.prod(shape)
        buf = torch.full((numel + 2 * shape[-1] + 64,), self.CANARY, dtype=dtype, device=device)
        self.buffers.append((tuple(shape), buf, numel))
        return buf[:numel].view(shape).fill_(float("nan"))

    def check(self):
        assert self.buffers, "no output was allocated through ops.norms.new_empty"
        for shape, buf, numel in self.buffers:
            tail = buf[numel:]
            assert torch.equal(tail, torch.full_like(tail, self.CANARY)), f"a store past the end of a {shape} output"


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_forward_backward(shape, dtype):
    n = shape[-1]
    x = randn(*shape, dtype=dtype, requires_grad=True, scale=2.0)
    w, b = _param(n, dtype), _param(n, dtype, shift=0.0)
    y = layer_norm(x, (n,), w, b, eps=1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    yr = F.layer_norm(xr, (n,), wr, br, eps=1e-5)
    assert_close(y, yr, dtype, what="forward")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    yr.backward(dy.double())
    for name, g, gr in zip(("dx", "dw", "db"), _grads(x, w, b), _grads(xr, wr, br)):
        assert g.dtype == dtype
        if n == 1 and name != "db":                              # x_hat = 0: dx, dw are 0 up to rounding
            assert g.abs().max().item() <= 1e-5 and gr.abs().max().item() <= 1e-5, name   # rstd = 1/sqrt(eps) = 316 scales rounding
        else:
            assert_close(g, gr, dtype, scale=2.0, what=name)


@pytest.mark.parametrize("shape", [(9, 37), (3, 20000)])
@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_layer_norm_optional_affine(shape, affine):
    n = shape[-1]
    x = randn(*shape, requires_grad=True)
    w = _param(n, torch.float32) if affine == "weight" else None
    b = _param(n, torch.float32, shift=0.5) if affine == "bias" else None
    y = layer_norm(x, n, w, b)
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    yr = F.layer_norm(xr, (n,), wr, br)
    assert_close(y, yr, torch.float32, what="forward")
    dy = randn(*shape)
    y.backward(dy)
    yr.backward(dy.double())
    for g, gr in zip(_grads(x, w, b), _grads(xr, wr, br)):
        assert (g is None) == (gr is None)
        if g is not None:
            assert_close(g, gr, torch.float32, scale=2.0)


@pytest.mark.parametrize("n", [300, 20000, 20480])               # block and loop statistics
def test_layer_norm_large_mean_does_not_cancel(n):
    """x = 1000 + randn: E[x^2] - E[x]^2 would lose ~1e-2 of the variance in fp32; the two-pass /
    Chan statistics keep the error at the rounding of x - mean itself (~3e-5)."""
    x = randn(4, n, requires_grad=True) + 1000.0
    x.retain_grad()
    y = layer_norm(x, (n,))
    xr = _leaf(x)
    yr = F.layer_norm(xr, (n,))
    assert_close(y, yr, torch.float32, scale=10.0, what="forward, mean 1000")
    dy = randn(4, n)
    y.backward(dy)
    yr.backward(dy.double())
    assert_close(x.grad, xr.grad, torch.float32, scale=10.0, what="backward, mean 1000")


@pytest.mark.parametrize("n", [50, 20000])                       # block and loop forwards
def test_eps_comparable_to_the_variance(n):
    """eps = 0.01 on rows of variance (and mean square) 0.01: eps is half the denominator, so a
    kernel that drops it is off by ~40%, where in the fp32 tests above (eps 1e-5 or finfo.eps on
    rows of variance ~1) it moves the output by less than the tolerance. The backward reads the
    saved rstd, so the forwards are what is checked."""
    x = randn(3, n, scale=0.1)
    w, b = _param(n, torch.float32), _param(n, torch.float32, shift=0.0)
    xd, wd, bd = x.double(), w.detach().double(), b.detach().double()
    assert_close(layer_norm(x, (n,), w, b, eps=0.01), F.layer_norm(xd, (n,), wd, bd, eps=0.01), torch.float32,
                 what="layer_norm eps=0.01")
    assert_close(rms_norm(x, (n,), w, 0.01), F.rms_norm(xd, (n,), wd, 0.01), torch.float32, what="rms_norm eps=0.01")


# ----------------------------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_forward_backward(shape, dtype):
    n = shape[-1]
    x = randn(*shape, dtype=dtype, requires_grad=True, scale=2.0)
    w = _param(n, dtype)
    y = rms_norm(x, (n,), w)                                     # eps=None: finfo(dtype).eps, as torch
    assert y.dtype == dtype and y.shape == x.shape
    xr, wr = _leaf(x), _leaf(w)
    yr = F.rms_norm(xr, (n,), wr, eps=torch.finfo(dtype).eps)
    assert_close(y, yr, dtype, what="forward")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    yr.backward(dy.double())
    if n == 1:     # x_hat = +-1: dx = rstd * g * (1 - x_hat^2) is pure cancellation, ~0
        assert (x.grad.double() - xr.grad).abs().max().item() <= 1e-3 * dy.abs().max().item() / x.detach().abs().min().item()
    else:
        assert_close(x.grad, xr.grad, dtype, scale=2.0, what="dx")
    assert w.grad.dtype == dtype
    assert_close(w.grad, wr.grad, dtype, scale=2.0, what="dw")


@pytest.mark.parametrize("shape", [(6, 45), (2, 20000)])
def test_rms_norm_no_weight_and_gemma_offset(shape):
    n = shape[-1]
    x = randn(*shape, requires_grad=True)
    xr = _leaf(x)
    y, yr = rms_norm(x, (n,), None, 1e-6), F.rms_norm(xr, (n,), None, 1e-6)
    assert_close(y, yr, torch.float32, what="no weight")
    dy = randn(*shape)
    y.backward(dy)
    yr.backward(dy.double())
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="no weight dx")

    # Gemma: x_hat * (1 + w), w around 0
    x.grad = None
    xr = _leaf(x)
    w = _param(n, torch.float32, shift=0.0)
    wr = _leaf(w)
    y = rms_norm(x, (n,), w, 1e-6, offset=1.0)
    yr = F.rms_norm(xr, (n,), None, 1e-6) * (1.0 + wr)
    assert_close(y, yr, torch.float32, what="offset=1")
    y.backward(dy)
    yr.backward(dy.double())
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="offset=1 dx")
    assert_close(w.grad, wr.grad, torch.float32, scale=2.0, what="offset=1 dw")


def _hf_llama_rms_norm(x, w, eps):
    """Hugging Face LlamaRMSNorm.forward, verbatim maths: fp32 x_hat, rounded, times the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


# fp16 on the CPU: the Triton interpreter casts fp32 -> bf16 by truncation (the GPU rounds to
# nearest even), so bit-level agreement with torch can only be checked there for bf16.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16])
@pytest.mark.parametrize("n", [256, 20000])
def test_rms_norm_llama_casting_mode(dtype, n):
    x = randn(8, n, dtype=dtype)
    w = _param(n, dtype)
    ref = _hf_llama_rms_norm(x, w, 1e-6)
    llama = rms_norm(x, (n,), w, 1e-6, casting_mode="llama")
    gemma = rms_norm(x, (n,), w, 1e-6, casting_mode="gemma")
    # llama rounds like HF: the same bits but for rare ties of a different fp32 sum order;
    # gemma rounds once, so a good fraction of its elements differ from HF by an ulp.
    assert (llama != ref).float().mean().item() < 0.005
    assert (gemma != ref).float().mean().item() > 0.05
    assert_close(llama, rms_norm_reference(x, w, 1e-6, casting_mode="llama"), dtype)

    # gradients: autograd through the HF maths in float64, with x_hat rounded to the input dtype
    # in the forward and the rounding passed straight through in the backward
    xg, wg = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    xr, wr = _leaf(x), _leaf(w)
    dy = randn(8, n, dtype=dtype)
    rms_norm(xg, (n,), wg, 1e-6, casting_mode="llama").backward(dy)
    x_hat = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)
    (x_hat + (x_hat.to(dtype).double() - x_hat).detach()).mul(wr).backward(dy.double())
    assert_close(xg.grad, xr.grad, dtype, scale=2.0, what="llama dx")
    assert_close(wg.grad, wr.grad, dtype, scale=2.0, what="llama dw")


@pytest.mark.parametrize("n", [256, 20000])                      # block and two-pass backwards
def test_rms_norm_llama_weight_gradient(n):
    """casting_mode="llama": y = round(x_hat) * w, so dw = sum_rows(dy * round(x_hat)). With an fp32
    weight of ones the bf16 output is round(x_hat) itself (whatever the cast's rounding), so the fp32
    dw is checked at fp32 tolerance against sum(dy * y): a dw from the unrounded x_hat is off by the
    bf16 rounding, ~1e-3, which the dtype-tolerance check above cannot see."""
    x, dy = randn(4, n, dtype=torch.bfloat16), randn(4, n, dtype=torch.bfloat16)
    w = torch.ones(n, device=DEVICE, requires_grad=True)
    y = rms_norm(x, (n,), w, 1e-6, casting_mode="llama")
    y.backward(dy)
    assert w.grad.dtype == torch.float32
    assert_close(w.grad, (dy.double() * y.detach().double()).sum(0), torch.float32, scale=2.0, what="llama dw")


def test_rms_norm_bad_casting_mode():
    with pytest.raises(ValueError, match="'casting_mode' must be one of"):
        rms_norm(randn(2, 8), (8,), None, casting_mode="mistral")


# ----------------------------------------------------------------------------------------------
# add + RMSNorm
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm_forward_backward(shape, dtype):
    n = shape[-1]
    x = randn(*shape, dtype=dtype, requires_grad=True)
    res = randn(*shape, dtype=dtype, requires_grad=True, scale=2.0)
    w = _param(n, dtype)
    normed, h = add_rms_norm(x, res, w, 1e-6)
    assert normed.dtype == h.dtype == dtype and normed.shape == h.shape == x.shape
    # h is x + residual in the input dtype, and normed is rms_norm of that rounded h
    assert_close(h, x.detach().double() + res.detach().double(), dtype, what="h")
    hd = (x.detach() + res.detach())
    assert_close(normed, F.rms_norm(hd.double(), (n,), w.detach().double(), 1e-6), dtype, what="normed")
    ref_normed, ref_h = add_rms_norm_reference(x.detach(), res.detach(), w.detach(), 1e-6)
    assert_close(normed, ref_normed, dtype, what="normed vs reference")

    xr, rr, wr = _leaf(x), _leaf(res), _leaf(w)
    hr = xr + rr
    nr = F.rms_norm(hr, (n,), wr, 1e-6)
    dn, dh = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    torch.autograd.backward((normed, h), (dn, dh))
    torch.autograd.backward((nr, hr), (dn.double(), dh.double()))
    for name, g, gr in zip(("dx", "dresidual", "dw"), _grads(x, res, w), _grads(xr, rr, wr)):
        assert g.dtype == dtype
        assert_close(g, gr, dtype, scale=2.0, what=name)


def test_add_rms_norm_one_output_used_and_offset():
    x, res = randn(5, 70, requires_grad=True), randn(5, 70, requires_grad=True)
    w = _param(70, torch.float32, shift=0.0)
    normed, _h = add_rms_norm(x, res, w, 1e-6, offset=1.0)
    normed.sum().backward()                                      # no gradient reaches h
    xr, rr, wr = _leaf(x), _leaf(res), _leaf(w)
    (F.rms_norm(xr + rr, (70,), None, 1e-6) * (1 + wr)).sum().backward()
    for g, gr in zip(_grads(x, res, w), _grads(xr, rr, wr)):
        assert_close(g, gr, torch.float32, scale=2.0)


@pytest.mark.parametrize("n", [50, 20000])                       # the block kernel, the loop kernel
def test_add_rms_norm_strides_and_rounded_h(n):
    """x a strided view and the residual dense, each read with its own row stride, in the block
    kernel and the loop kernel (N > 16,384). ``normed`` is rms_norm of the bf16 h returned: the
    same bits as rms_norm(h) under the interpreter (the same kernel, one flag apart), which a kernel
    normalising the unrounded fp32 sum misses by an ulp in many elements (the loop kernel's pass 1
    must sum the rounded h that its pass 2 re-reads). Backward: dnormed expanded (row stride 0)
    and dh a strided view (3N), the residual gradient read with its own stride."""
    m = 3
    x = noncontig(randn(m, n, dtype=torch.bfloat16, requires_grad=True))
    res = randn(m, n, dtype=torch.bfloat16, requires_grad=True, scale=2.0)
    w = _param(n, torch.bfloat16)
    normed, h = add_rms_norm(x, res, w, 1e-6)
    assert_close(h, x.detach().double() + res.detach().double(), torch.bfloat16, what="h")
    differ = (normed != rms_norm(h.detach(), (n,), w.detach(), 1e-6)).float().mean().item()
    assert differ <= (0.01 if ON_GPU else 0.0), f"normed differs from rms_norm(h) in {differ:.2%} of its elements"
    dn = randn(n, dtype=torch.bfloat16).expand(m, n)
    dh = randn(m, 3, n, dtype=torch.bfloat16)[:, 1]
    torch.autograd.backward((normed, h), (dn, dh))
    xr, rr, wr = _leaf(x), _leaf(res), _leaf(w)
    hr = xr + rr
    torch.autograd.backward((F.rms_norm(hr, (n,), wr, 1e-6), hr), (dn.double(), dh.double()))
    for name, g, gr in zip(("dx", "dresidual", "dw"), _grads(x, res, w), _grads(xr, rr, wr)):
        assert_close(g, gr, torch.bfloat16, scale=2.0, what=name)


# ----------------------------------------------------------------------------------------------
# All three: weight dtypes, strides, determinism, empty batches, compile, opcheck, bad input
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["layer", "rms", "add"])
def test_fp32_weight_with_bf16_input(op):
    n = 96
    x = randn(7, n, dtype=torch.bfloat16, requires_grad=True)
    w = _param(n, torch.float32)
    xr, wr = _leaf(x), _leaf(w)
    dy = randn(7, n, dtype=torch.bfloat16)
    if op == "layer":
        b = _param(n, torch.float32, shift=0.0)
        br = _leaf(b)
        y, yr = layer_norm(x, (n,), w, b), F.layer_norm(xr, (n,), wr, br)
    elif op == "rms":
        b = br = None
        y, yr = rms_norm(x, (n,), w, 1e-6), F.rms_norm(xr, (n,), wr, 1e-6)
    else:
        b = br = None
        y, h = add_rms_norm(x, x.detach() * 0.5, w, 1e-6)
        hr = xr + xr.detach() * 0.5               # normalised after rounding to bf16: use the h returned
        assert_close(h, hr, torch.bfloat16, what="h")
        yr = F.rms_norm(hr + (h.double() - hr).detach(), (n,), wr, 1e-6)
    assert y.dtype == torch.bfloat16
    assert_close(y, yr, torch.bfloat16, what="forward")
    y.backward(dy)
    yr.backward(dy.double())
    assert w.grad.dtype == torch.float32
    assert_close(x.grad, xr.grad, torch.bfloat16, scale=2.0, what="dx")
    assert_close(w.grad, wr.grad, torch.float32, scale=10.0, what="dw fp32")   # fp32 dw: tight
    if b is not None:
        assert_close(b.grad, br.grad, torch.float32, scale=10.0, what="db fp32")


@pytest.mark.parametrize("groups", [1, 3, 8, 9, 64, 65])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["both", "w", "b"])
def test_weight_gradient_partial_sums(groups, dtype, which):
    """The (G, N) fp32 partial-sum buffers to (N,) gradients in the parameter's dtype: one fp32
    row as it is, up to GRAD_SUM_MAX rows the fused sum-and-cast kernel, more ATen's sum."""
    from warpforge.ops import norms

    n = 300                                      # not a multiple of the kernel's column block
    dw = randn(groups, n) if which != "b" else None
    db = randn(groups, n) + 0.5 if which != "w" else None
    got_w, got_b = norms._grad_sums(dw, db, dtype)
    for got, parts in ((got_w, dw), (got_b, db)):
        if parts is None:
            assert got is None
            continue
        assert got.shape == (n,) and got.dtype == dtype
        assert_close(got, parts.double().sum(0), dtype, what=f"G={groups}")
        if groups == 1 and dtype == torch.float32:
            assert got.data_ptr() == parts.data_ptr()        # no copy, no launch
    assert norms.GRAD_SUM_MAX == 64                          # the parametrisation straddles it


@pytest.mark.parametrize("groups", [9, 17])
def test_weight_gradient_partial_sums_long_rows(groups):
    """Past 16K columns the fused sum-and-cast kernel walks the partial rows in steps of 8
    (heuristics.grad_sum_config), so each step's rows must add to what the earlier steps summed
    (G = 9: a second step of one row; 17: three steps). Shorter rows take every row in one step."""
    from warpforge.ops import norms
    from warpforge.runtime.heuristics import grad_sum_config

    n = 16400
    assert grad_sum_config(n, norms.GRAD_SUM_MAX)[0] < groups <= norms.GRAD_SUM_MAX
    dw, db = randn(groups, n), randn(groups, n) + 0.5
    got_w, got_b = norms._grad_sums(dw, db, torch.float32)
    assert_close(got_w, dw.double().sum(0), torch.float32, what=f"dw G={groups}")
    assert_close(got_b, db.double().sum(0), torch.float32, what=f"db G={groups}")


@pytest.mark.parametrize("m", [3, 203])   # one row group (sums stored straight into (N,) outputs), several
def test_backward_ops_return_the_weight_dtype(m):
    """The raw backward operators return dw and db in the weight's dtype, as their fake kernels
    promise torch.compile, whether the one-row-group path stores the sums straight into the (N,)
    outputs or the partial-sum buffers are reduced (autograd casts a wrong dtype back silently,
    so only the raw operators show it); bf16 input with a bf16 and an fp32 weight."""
    n = 37
    x, dy = randn(m, n, dtype=torch.bfloat16), randn(m, n, dtype=torch.bfloat16)
    for wdtype in (torch.bfloat16, torch.float32):
        w = _param(n, wdtype, requires_grad=False)
        _, mean, rstd = layer_norm_op(x, w, w, 1e-5)
        _, dw, db = layer_norm_backward_op(dy, x, w, mean, rstd, wdtype)
        _, rstd = rms_norm_op(x, w, 1e-6, 0.0, False)
        _, dw_rms = rms_norm_backward_op(dy, x, w, rstd, 0.0, False)
        _, h, rstd = add_rms_norm_op(x, x, w, 1e-6, 0.0)
        _, dw_add = add_rms_norm_backward_op(dy, dy, h, w, rstd, 0.0)
        for name, g in (("layer dw", dw), ("layer db", db), ("rms dw", dw_rms), ("add dw", dw_add)):
            assert g.dtype == wdtype and g.shape == (n,), (name, wdtype, g.dtype, g.shape)


@pytest.mark.parametrize("m", [3, 64, 203])   # one row group (sums stored straight into (N,)), several
@pytest.mark.parametrize("wdtype", [None, torch.bfloat16])
def test_layer_norm_bias_gradient_in_the_bias_dtype(m, wdtype):
    """A bf16 input with no weight (or a bf16 one) and an fp32 bias: db is the fp32 sum of dy over
    the rows, not that sum rounded to bf16 and cast back (it was: relative error 3.1e-3 at
    64 x 37), through autograd and from the raw backward operator, whose dw keeps the weight's
    dtype."""
    n = 37
    x, dy = randn(m, n, dtype=torch.bfloat16), randn(m, n, dtype=torch.bfloat16)
    w = None if wdtype is None else _param(n, wdtype)
    b = _param(n, torch.float32)
    want = dy.double().sum(0)
    for call in range(2):        # on a GPU the second call takes the eager fast path's recorded kernels
        b.grad = None
        layer_norm(x, (n,), w, b).backward(dy)
        assert b.grad.dtype == torch.float32
        err = ((b.grad.double() - want).norm() / want.norm()).item()
        assert err < 1e-6, f"call {call}: db relative error {err:.2e} (bf16 rounding gives ~1e-3)"
        if w is not None:
            assert w.grad.dtype == wdtype
    _, mean, rstd = layer_norm_op(x, None if w is None else w.detach(), b.detach(), 1e-5)
    _, dw, db = layer_norm_backward_op(dy, x, None if w is None else w.detach(), mean, rstd, torch.float32)
    assert db.dtype == torch.float32 and dw.dtype == (torch.bfloat16 if w is None else wdtype)
    assert ((db.double() - want).norm() / want.norm()).item() < 1e-6


def test_noncontiguous_inputs_and_expanded_gradients():
    n = 50
    x = noncontig(randn(6, n, requires_grad=True))
    res = noncontig(randn(6, n))
    w, b = _param(n, torch.float32), _param(n, torch.float32)
    scale = torch.arange(n, device=DEVICE, dtype=torch.float32)
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    # sum().backward() hands the backward a stride-0 gradient
    (layer_norm(x, (n,), w, b) * scale).sum().backward()
    (F.layer_norm(xr, (n,), wr, br) * scale).sum().backward()
    for g, gr in zip(_grads(x, w, b), _grads(xr, wr, br)):
        assert_close(g, gr, torch.float32, scale=2.0, what="layer_norm strided")
    x.grad = None
    xr = _leaf(x)
    rms_norm(x, (n,), w, 1e-6).sum().backward()
    F.rms_norm(xr, (n,), None, 1e-6).mul(w.detach().double()).sum().backward()
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="rms_norm strided")
    normed, h = add_rms_norm(x.detach(), res, w.detach(), 1e-6)
    assert_close(h, x.detach().double() + res.double(), torch.float32, what="add strided h")
    assert_close(normed, F.rms_norm(x.detach().double() + res.double(), (n,), w.detach().double(), 1e-6),
                 torch.float32, what="add strided normed")
    t = randn(6, n).t()                                          # column stride != 1: copied
    assert_close(rms_norm(t, 6, None, 1e-6), F.rms_norm(t.double(), (6,), None, 1e-6), torch.float32)


@pytest.mark.parametrize("op", ["layer", "rms"])
def test_long_rows_strided(op):
    """Rows past 16,384 -- the interpreter's loop forwards and two-pass backward (a statistics
    kernel, then column tiles) -- with x a strided view (row stride 2N) and dy another (3N): each
    kernel must read x and dy and write y and dx with their own row strides."""
    m, n = 3, 20000
    x = noncontig(randn(m, n, requires_grad=True))
    dy = randn(3 * m, n)[::3]
    w = _param(n, torch.float32)
    b = _param(n, torch.float32, shift=0.0) if op == "layer" else None
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    if op == "layer":
        y, yr = layer_norm(x, (n,), w, b), F.layer_norm(xr, (n,), wr, br)
    else:
        y, yr = rms_norm(x, (n,), w, 1e-6), F.rms_norm(xr, (n,), wr, 1e-6)
    assert_close(y, yr, torch.float32, what="forward")
    y.backward(dy)
    yr.backward(dy.double())
    for name, g, gr in zip(("dx", "dw", "db"), _grads(x, w, b), _grads(xr, wr, br)):
        if gr is not None:
            assert_close(g, gr, torch.float32, scale=2.0, what=name)


@pytest.mark.parametrize("n", [50, 20000])
def test_strided_parameters(n):
    """Weight and bias as strided views (a column of an (N, 2) parameter table) and expanded (stride
    0): the kernels read them densely, so the launchers copy them; outputs and every gradient
    against the contiguous parameters. N = 20,000 takes the long-row paths."""
    x, dy, res = randn(3, n), randn(3, n), randn(3, n)
    table = _param(2 * n, torch.float32, requires_grad=False).view(n, 2)
    w, b = table[:, 0], table[:, 1]
    assert w.stride() == (2,)
    for wv, bv in ((w, b), (w[:1].expand(n), b[:1].expand(n))):
        cases = [("layer_norm", lambda x_, w_, b_: layer_norm(x_, (n,), w_, b_)),
                 ("rms_norm", lambda x_, w_, b_: rms_norm(x_, (n,), w_, 1e-6)),
                 ("add_rms_norm", lambda x_, w_, b_: add_rms_norm(x_, res, w_, 1e-6)[0])]
        for name, f in cases:
            outs = []
            for wt, bt in ((wv, bv), (wv.contiguous(), bv.contiguous())):
                assert wt.stride() == wv.stride() or wt.is_contiguous()
                xl = x.detach().clone().requires_grad_()
                wl, bl = wt.detach().requires_grad_(), bt.detach().requires_grad_()     # strides kept
                y = f(xl, wl, bl)
                y.backward(dy)
                outs.append((y.detach(), xl.grad, wl.grad, bl.grad))
            for got, want, what in zip(outs[0], outs[1], ("y", "dx", "dw", "db")):
                if want is None:
                    assert got is None
                    continue
                assert_close(got, want.double(), torch.float32, what=f"{name} {what} stride {wv.stride()}")


def test_weight_gradients_are_deterministic():
    """Two backward runs give bit-identical dweight/dbias (fixed-order reduction, no atomics);
    M = 203 spreads the rows over several programs of the persistent grid."""
    m, n = 203, 37
    x, dy = randn(m, n, dtype=torch.bfloat16), randn(m, n, dtype=torch.bfloat16)
    w, b = _param(n, torch.bfloat16), _param(n, torch.bfloat16)

    def run():
        ws, bs = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        layer_norm(x, (n,), ws, bs).backward(dy)
        w2 = w.detach().clone().requires_grad_()
        rms_norm(x, (n,), w2).backward(dy)
        w3 = w.detach().clone().requires_grad_()
        normed, h = add_rms_norm(x, x, w3)
        torch.autograd.backward((normed, h), (dy, dy))
        return ws.grad, bs.grad, w2.grad, w3.grad

    first, second = run(), run()
    for a, c in zip(first, second):
        assert torch.equal(a, c)
    wr = _leaf(w)
    F.rms_norm(x.double(), (n,), wr, torch.finfo(torch.bfloat16).eps).backward(dy.double())
    assert_close(first[2], wr.grad, torch.bfloat16, scale=2.0, what="dw")


def test_empty_batch():
    n = 16
    x = torch.empty(0, n, device=DEVICE, requires_grad=True)
    w, b = _param(n, torch.float32), _param(n, torch.float32)
    y = layer_norm(x, (n,), w, b)
    assert y.shape == (0, n)
    y.sum().backward()
    assert x.grad.shape == (0, n) and torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))
    w.grad = None
    y = rms_norm(x, (n,), w)
    assert y.shape == (0, n)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    normed, h = add_rms_norm(torch.empty(2, 0, n, device=DEVICE), torch.empty(2, 0, n, device=DEVICE), w)
    assert normed.shape == h.shape == (2, 0, n)


def test_compile_fullgraph():
    n = 123
    x = randn(3, 5, n, requires_grad=True)
    res = randn(3, 5, n, requires_grad=True)
    w, b = _param(n, torch.float32), _param(n, torch.float32)

    def f(x, res, w, b):
        normed, h = add_rms_norm(x, res, w, 1e-6)
        return layer_norm(normed, (n,), w, b) + rms_norm(h, (n,), w, 1e-6, casting_mode="llama") * 2

    out = torch.compile(f, fullgraph=True)(x, res, w, b)
    g = torch.randn_like(out)
    out.backward(g)
    leaves = [_leaf(t) for t in (x, res, w, b)]
    xr, rr, wr, br = leaves
    hr = xr + rr
    nr = F.rms_norm(hr, (n,), wr, 1e-6)
    ref = F.layer_norm(nr, (n,), wr, br) + F.rms_norm(hr, (n,), wr, 1e-6) * 2
    ref.backward(g.double())
    assert_close(out, ref, torch.float32, what="compiled forward")
    for t, r in zip((x, res, w, b), leaves):
        assert_close(t.grad, r.grad, torch.float32, scale=2.0, what="compiled backward")


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "add_rms_norm"])
def test_compile_dynamic_hidden_size(name):
    """torch.compile(dynamic=True, fullgraph=True) with normalized_shape=x.shape[-1:] over three
    hidden sizes: one graph (check_normalized_shape's operator.index on the traced size specialised
    it, and the weight's size with it: a recompile for each hidden size), forward and gradients
    equal to the eager call's."""
    def f(x, w):
        if name == "rms_norm":
            return rms_norm(x, x.shape[-1:], w, 1e-6)
        if name == "layer_norm":
            return layer_norm(x, x.shape[-1:], w, w * 0.5)
        normed, h = add_rms_norm(x, x * 0.5, w, 1e-6)
        return normed + h

    torch._dynamo.reset()
    cf = torch.compile(f, dynamic=True, fullgraph=True)
    for step, n in enumerate((12, 20, 37)):
        x, w = randn(3, n, requires_grad=True), _param(n, torch.float32)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            out = cf(x, w)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (x, w), g)
        ref = f(x, w)
        assert_close(out, ref, torch.float32, what=f"compiled {name}, N={n}")
        for t, gr, r in zip(("x", "w"), grads, torch.autograd.grad(ref, (x, w), g)):
            assert_close(gr, r, torch.float32, scale=2.0, what=f"compiled d{t} of {name}, N={n}")


def test_opcheck():
    n = 37
    x, dy = randn(4, n, requires_grad=True), randn(4, n)
    w, b = _param(n, torch.float32), _param(n, torch.float32)
    torch.library.opcheck(layer_norm_op.overload, (x, w, b, 1e-5))
    torch.library.opcheck(layer_norm_op.overload, (x, None, b, 1e-5))
    torch.library.opcheck(rms_norm_op.overload, (x, w, 1e-6, 1.0, True))
    torch.library.opcheck(add_rms_norm_op.overload, (x, randn(4, n, requires_grad=True), w, 1e-6, 0.0))
    xd = x.detach()
    _, mean, rstd = layer_norm_op(xd, w.detach(), None, 1e-5)
    torch.library.opcheck(layer_norm_backward_op.overload, (dy, xd, w.detach(), mean, rstd, torch.float32))
    torch.library.opcheck(layer_norm_backward_op.overload, (dy, xd, None, mean, rstd, None))
    xb, dyb = xd.to(torch.bfloat16), dy.to(torch.bfloat16)   # a bias wider than the weight: db in its dtype
    _, mean, rstd = layer_norm_op(xb, None, None, 1e-5)
    torch.library.opcheck(layer_norm_backward_op.overload, (dyb, xb, w.detach().to(torch.bfloat16), mean, rstd,
                                                            torch.float32))
    _, rstd = rms_norm_op(xd, None, 1e-6, 0.0, False)
    torch.library.opcheck(rms_norm_backward_op.overload, (dy, xd, w.detach(), rstd, 0.0, False))
    torch.library.opcheck(add_rms_norm_backward_op.overload, (dy, dy * 2, xd, w.detach(), rstd, 1.0))


def test_bad_input():
    x = randn(3, 8)
    with pytest.raises(TypeError, match="'input' has dtype int64"):
        layer_norm(torch.ones(3, 8, dtype=torch.long, device=DEVICE), (8,))
    with pytest.raises(TypeError, match="'weight' has dtype float64"):
        rms_norm(x, (8,), torch.ones(8, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="'normalized_shape' \\(4,\\) does not match"):
        layer_norm(x, (4,))
    with pytest.raises(ValueError, match="'normalized_shape' \\(3, 8\\) does not match"):
        rms_norm(x, (3, 8))
    with pytest.raises(ValueError, match="'bias' has shape \\(7,\\); expected \\(8,\\)"):
        layer_norm(x, (8,), None, torch.ones(7, device=DEVICE))
    with pytest.raises(ValueError, match="'residual' has shape \\(3, 4\\) but 'x' has \\(3, 8\\)"):
        add_rms_norm(x, randn(3, 4), torch.ones(8, device=DEVICE))
    with pytest.raises(TypeError, match="'residual' has dtype torch.float16 but 'x' has torch.float32"):
        add_rms_norm(x, randn(3, 8, dtype=torch.float16), torch.ones(8, device=DEVICE))
    with pytest.raises(ValueError, match="zero-size last dimension"):
        rms_norm(torch.ones(3, 0, device=DEVICE), (0,))
    with pytest.raises(ValueError, match="'eps' must be a non-negative float"):
        layer_norm(x, (8,), eps=-1.0)


def test_bad_eps_and_parameter_shapes():
    """eps is checked by all three functions (a negative, NaN, a bool and a string are refused; 0
    is taken, as torch takes it), and each weight and bias for its length."""
    x, w = randn(3, 8), torch.ones(8, device=DEVICE)
    calls = {"layer_norm": lambda e: layer_norm(x, (8,), w, w, eps=e),
             "rms_norm": lambda e: rms_norm(x, (8,), w, e),
             "add_rms_norm": lambda e: add_rms_norm(x, x, w, e)}
    for name, f in calls.items():
        for bad in (-1.0, float("nan"), True, "1e-5"):
            with pytest.raises(ValueError, match="'eps' must be a non-negative float"):
                f(bad)
                pytest.fail(f"{name} took eps={bad!r}")
    assert_close(layer_norm(x, (8,), eps=0), F.layer_norm(x.double(), (8,), eps=0.0), torch.float32, what="eps=0")
    assert_close(rms_norm(x, (8,), None, 0.0), F.rms_norm(x.double(), (8,), None, 0.0), torch.float32, what="eps=0")
    short = torch.ones(7, device=DEVICE)
    for f in (lambda: layer_norm(x, (8,), short), lambda: layer_norm(x, (8,), None, short),
              lambda: rms_norm(x, (8,), short), lambda: add_rms_norm(x, x, short)):
        with pytest.raises(ValueError, match="has shape \\(7,\\); expected \\(8,\\)"):
            f()


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        layer_norm(torch.ones(3, 4), (4,))
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        rms_norm(torch.ones(3, 4), (4,))
    with pytest.raises(RuntimeError, match="'x' is on device 'cpu'"):
        add_rms_norm(torch.ones(3, 4), torch.ones(3, 4), torch.ones(4))
    with pytest.raises(RuntimeError, match="'weight' is on device 'cpu'"):
        rms_norm(torch.ones(3, 4, device="cuda"), (4,), torch.ones(4))


def test_references_match_torch():
    x, w, b = randn(3, 11), randn(11), randn(11)
    assert_close(layer_norm_reference(x, w, b), F.layer_norm(x.double(), (11,), w.double(), b.double()), torch.float32)
    assert_close(rms_norm_reference(x, w, 1e-6), F.rms_norm(x.double(), (11,), w.double(), 1e-6), torch.float32)
    assert_close(rms_norm_reference(x, w, 1e-6, offset=1.0),
                 F.rms_norm(x.double(), (11,), None, 1e-6) * (1 + w.double()), torch.float32)


@pytest.mark.parametrize("reload", [False, True])
@pytest.mark.parametrize("bwd_mode", ["split", "pipe"])
@pytest.mark.parametrize("op", ["layer", "rms", "add"])
def test_exchange_paths_single_chunk(monkeypatch, op, bwd_mode, reload):
    """The exchange kernels' publish/prefetch/gather logic (the forward's pipe kernel; the
    backward's split and pipe kernels), on CPU too: forced with one chunk per row (more would wait
    forever in the interpreter, which runs programs one at a time; its one program then walks
    every row, so the pipe kernels carry each row to the next step). On the GPU the SHAPES above
    cover C > 1 chunks. No store may land past an output (the pipe's last step is a row past M)."""
    import triton
    from warpforge.ops import norms as mod
    from warpforge.runtime.heuristics import RowConfig

    def cfg(mode):
        return lambda n, layer, **_: RowConfig(mode, triton.next_power_of_2(n), 1, 4, 1, reload)

    monkeypatch.setattr(mod, "norm_fwd_config", cfg("pipe"))
    monkeypatch.setattr(mod, "norm_bwd_config", cfg(bwd_mode))
    guard = _GuardedOutputs(monkeypatch)
    n = 37
    x = randn(5, n, requires_grad=True) + 100.0
    x.retain_grad()
    w, b = _param(n, torch.float32), _param(n, torch.float32)
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    if op == "layer":
        y, yr = layer_norm(x, (n,), w, b), F.layer_norm(xr, (n,), wr, br)
    elif op == "rms":
        y, yr = rms_norm(x, (n,), w, 1e-6, offset=1.0), F.rms_norm(xr, (n,), None, 1e-6) * (1 + wr)
    else:
        res = randn(5, n)
        y, h = add_rms_norm(x, res, w, 1e-6)
        assert_close(h, xr.detach() + res.double(), torch.float32, what="h")
        yr = F.rms_norm(xr + res.double(), (n,), wr, 1e-6)
    assert_close(y, yr, torch.float32, scale=5.0, what="forward")
    dy = randn(5, n)
    y.backward(dy)
    yr.backward(dy.double())
    assert_close(x.grad, xr.grad, torch.float32, scale=5.0, what="dx")
    assert_close(w.grad, wr.grad, torch.float32, scale=5.0, what="dw")
    if op == "layer":
        assert_close(b.grad, br.grad, torch.float32, scale=5.0, what="db")
    guard.check()


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("op", ["layer", "rms", "add"])
def test_block_backward_staged(monkeypatch, op, rows):
    """The block backward with its row tiles staged through shared memory by the compiler's
    software pipeline (RowConfig.stages; LayerNorm 4K < N <= 8K on the H200), forced on a 37-wide
    row: against float64, and against the hand-pipelined loop it replaces (the same arithmetic:
    the same bits under the interpreter; compiled apart on a GPU, close). 11 rows in 3 row groups
    of 4: the last group is short, and with two rows a tile its last tile is half past M. x and
    the residual gradient are strided views (row stride 2N; dy dense), so each is read with its
    own row stride."""
    from warpforge.ops import norms as mod
    from warpforge.runtime.heuristics import RowConfig

    n = 37
    x = noncontig(randn(11, n) + 30.0)
    w, b = _param(n, torch.float32), _param(n, torch.float32, shift=0.0)
    res = randn(11, n)
    dy, dsum = randn(11, n), noncontig(randn(11, n))
    monkeypatch.setattr(mod, "grad_grid", lambda m, rows_, col_tiles, per_sm=0: (3, 4))

    def grads(stages):
        monkeypatch.setattr(mod, "norm_bwd_config", lambda n, layer, **_: RowConfig("block", 64, rows, 4, stages=stages))
        leaves = [t.detach().requires_grad_() for t in (x, w, b, res)]     # strides kept (clone would not)
        if op == "layer":
            outs, ins = (layer_norm(leaves[0], (n,), leaves[1], leaves[2]),), leaves[:3]
        elif op == "rms":
            outs, ins = (rms_norm(leaves[0], (n,), leaves[1], 1e-6),), leaves[:2]
        else:
            outs, ins = add_rms_norm(leaves[0], leaves[3], leaves[1], 1e-6), [leaves[0], leaves[3], leaves[1]]
        return torch.autograd.grad(outs, ins, (dy, dsum)[:len(outs)])

    staged, plain = grads(3), grads(0)
    xr, wr, br, rr = _leaf(x), _leaf(w), _leaf(b), _leaf(res)
    if op == "layer":
        outs, ins = (F.layer_norm(xr, (n,), wr, br),), [xr, wr, br]
    elif op == "rms":
        outs, ins = (F.rms_norm(xr, (n,), wr, 1e-6),), [xr, wr]
    else:
        h = xr + rr
        outs, ins = (F.rms_norm(h, (n,), wr, 1e-6), h), [xr, rr, wr]
    ref = torch.autograd.grad(outs, ins, (dy.double(), dsum.double())[:len(outs)])
    for got, want, base in zip(staged, ref, plain):
        assert_close(got, want, torch.float32, scale=5.0)
        if ON_GPU:     # compiled apart, the two loops may order a reduction differently
            assert_close(got, base, torch.float32, scale=2.0)
        else:
            assert torch.equal(got, base)


@pytest.mark.parametrize("n", [37, 64, 150, 192])   # one step (masked, whole), three steps (masked), whole steps
@pytest.mark.parametrize("op,rows,const", [("layer", 1, False), ("layer", 2, False), ("rms", 1, False),
                                           ("layer", 1, True), ("rms", 1, True)])
def test_loop_forward_steps(monkeypatch, op, rows, const, n):
    """The two-pass loop forward with 64-element steps, forced: its per-lane statistics (LayerNorm:
    each 8-column group's mean and M2 merged across steps by Chan's formula, then across groups)
    for one step and for several, with and without a masked last step, on rows with a large mean
    and one outlier; LayerNorm with two rows a program too (5 rows: the last program's second row
    is past M, and no store may land there); and both kernels with N compiled in (``const_n``: whole
    steps only, no masks)."""
    from warpforge.ops import norms as mod
    from warpforge.runtime.heuristics import RowConfig

    if const and n % 64:
        pytest.skip("N compiled in takes whole steps only (heuristics.NORM_LOOP_CONST)")
    monkeypatch.setattr(mod, "norm_fwd_config", lambda n, layer, **_: RowConfig("loop", 64, rows, 4, const_n=const))
    guard = _GuardedOutputs(monkeypatch)
    x = randn(5, n) + 300.0
    x[1, n // 2] = 3e4
    w, b = _param(n, torch.float32), _param(n, torch.float32, shift=0.0)
    if op == "layer":
        y, yr = layer_norm(x, (n,), w, b), F.layer_norm(x.double(), (n,), w.double(), b.double())
    else:
        y, yr = rms_norm(x, (n,), w, 1e-6), F.rms_norm(x.double(), (n,), w.double(), 1e-6)
    assert_close(y, yr, torch.float32, scale=5.0, what="forward")
    guard.check()


@pytest.mark.skipif(not ON_GPU, reason="the device's own routes; the interpreter keeps the plain row config")
@pytest.mark.parametrize("op,n", [("layer", 8192), ("layer", 24576), ("layer", 32768), ("rms", 4096), ("rms", 8192),
                                  ("rms", 24576), ("rms", 32768)])
def test_loop_forward_device_route(op, n):
    """The forward's route on this GPU with rows enough to take the loop kernels (two rows an SM):
    on an H200 both norms compile N in at 8K, 24K and 32K, and RMSNorm at 4K too
    (heuristics.NORM_LOOP_CONST), checked against a float64 reference in bf16 and fp32 on rows with
    a large mean."""
    from warpforge.runtime.device import device_name
    from warpforge.runtime.heuristics import NORM_LOOP_ROWS_PER_SM, norm_fwd_config

    m = NORM_LOOP_ROWS_PER_SM * torch.cuda.get_device_properties(0).multi_processor_count
    cfg = norm_fwd_config(n, layer=op == "layer", many=True, device_name=device_name(randn(1)))
    if "H200" in torch.cuda.get_device_name():
        assert cfg.mode == "loop" and cfg.const_n, cfg
    for dtype in (torch.bfloat16, torch.float32):
        x = (randn(m, n) * 2 + 40.0).to(dtype)
        w, b = _param(n, dtype), _param(n, dtype, shift=0.0)
        if op == "layer":
            y, yr = layer_norm(x, (n,), w, b), F.layer_norm(x.double(), (n,), w.double(), b.double())
        else:
            y, yr = rms_norm(x, (n,), w, 1e-6), F.rms_norm(x.double(), (n,), w.double(), 1e-6)
        assert_close(y, yr, dtype, what=f"{op} {n} {dtype}")


def test_bad_options_audit():
    """normalized_shape must be an int or ints (None and 8.5 failed deep inside a tuple(); (8.9,) was
    truncated to 8 and accepted), and offset a finite number (NaN gave an all-NaN output; a string
    failed inside float())."""
    x, w = randn(3, 8), torch.ones(8, device=DEVICE)
    for bad in (None, 8.5, (8.9,), "8"):
        with pytest.raises(TypeError, match="'normalized_shape' is .*; expected an int or a sequence of ints"):
            layer_norm(x, bad)
        with pytest.raises(TypeError, match="'normalized_shape' is"):
            rms_norm(x, bad)
    assert layer_norm(x, torch.Size([8])).shape == x.shape
    with pytest.raises(ValueError, match="'offset' is nan; expected a finite number"):
        rms_norm(x, (8,), w, offset=float("nan"))
    with pytest.raises(ValueError, match="'offset' is inf; expected a finite number"):
        add_rms_norm(x, x, w, offset=float("inf"))
    with pytest.raises(TypeError, match="'offset' must be a real number, got str"):
        add_rms_norm(x, x, w, offset="a")
