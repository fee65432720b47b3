"""Attention (FlashAttention forward and backward, dense and varlen) against a float64 reference.

Observed under the interpreter (fp32 dots for bf16, which it truncates): fp32 <= 4e-7, fp16 <=
4e-4, bf16 <= 8e-3 on outputs and all three gradients; conftest's TOL (2e-5, 3e-3, 2e-2) sits
5-50x above, a missed mask or rescale lands at 1e-1 or more.
"""
import contextlib
import functools

import numpy as np
import pytest
import torch
import triton.language as tl

import warpforge as wf
from warpforge.ops.attention import attention_op, attention_reference, dropout_keep_mask, dropout_seed
from conftest import DTYPES, ON_GPU, DEVICE, SHARED_MEMORY, assert_close, gpu_only, noncontig, randn

# (B, Hq, Hkv, L, S, D): one query and key, odd lengths, L != S both ways, GQA and MQA, D not a power of 2
SHAPES = [(1, 1, 1, 1, 1, 16), (2, 4, 2, 17, 17, 32), (1, 2, 1, 40, 70, 16), (1, 3, 3, 70, 33, 24)]
if ON_GPU:
    SHAPES += [(2, 8, 2, 1000, 1000, 64), (1, 4, 4, 4097, 4097, 128), (1, 4, 1, 300, 1000, 128)]


def _inputs(B, H, HK, L, S, D, dtype, grad=True):
    q = randn(B, H, L, D, dtype=dtype, requires_grad=grad)
    k = randn(B, HK, S, D, dtype=dtype, requires_grad=grad)
    v = randn(B, HK, S, D, dtype=dtype, requires_grad=grad)
    return q, k, v


def _check(q, k, v, dtype, what="", ref_kw=None, **kw):
    """Forward, lse and the three gradients against attention_reference in float64."""
    ref_kw = ref_kw or {}
    o, lse = wf.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    orf, lref = attention_reference(qr, kr, vr, is_causal=kw.get("is_causal", False), scale=kw.get("scale"),
                                    attn_mask=kw.get("attn_mask"), window_size=kw.get("window_size"), **ref_kw)
    assert o.dtype == dtype and o.shape == q.shape
    assert_close(o, orf, dtype, what=f"{what} out")
    assert_close(lse, lref, torch.float32, scale=10.0, what=f"{what} lse")
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    rgrads = torch.autograd.grad(orf, (qr, kr, vr), do.double())
    for name, g, r in zip(("dq", "dk", "dv"), grads, rgrads):
        assert_close(g, r, dtype, scale=2.0, what=f"{what} {name}")


def _check_grads(grads, q, k, v, do, dtype, what, **ref_kw):
    """A call's dq, dk, dv ``grads`` for upstream gradient ``do`` against attention_reference's in
    float64 (``ref_kw``: the reference's options)."""
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    orf, _ = attention_reference(qr, kr, vr, **ref_kw)
    for name, g, r in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(orf, (qr, kr, vr), do.double())):
        assert_close(g, r, dtype, scale=2.0, what=f"{what} {name}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward(shape, dtype, causal):
    q, k, v = _inputs(*shape, dtype)
    _check(q, k, v, dtype, is_causal=causal, enable_gqa=True)


def test_strided_views_and_scale():
    """q, k, v as (B, L, H, D) buffers viewed (B, H, L, D), the layout a fused QKV projection
    gives; the output keeps q's layout."""
    B, L, H, D = 2, 23, 3, 32
    qkv = randn(B, L, 3, H, D, requires_grad=True)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    _check(q, k, v, torch.float32, scale=0.3, is_causal=True)
    o = wf.scaled_dot_product_attention(q, k, v)
    assert o.stride() == torch.empty_like(q).stride()


def test_batch_dims():
    """3-d (N, L, D) and 5-d (B1, B2, H, L, D) inputs, as torch accepts."""
    q, k, v = randn(3, 9, 16), randn(3, 12, 16), randn(3, 12, 16)
    assert_close(wf.scaled_dot_product_attention(q, k, v), attention_reference(q, k, v)[0], torch.float32)
    q, k, v = randn(2, 2, 3, 9, 16), randn(2, 2, 3, 12, 16), randn(2, 2, 3, 12, 16)
    mask = torch.rand(2, 1, 1, 9, 12, device=DEVICE) > 0.3
    assert_close(wf.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                 attention_reference(q, k, v, attn_mask=mask)[0], torch.float32)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks(kind):
    B, H, L, S, D = 2, 2, 19, 37, 16
    q, k, v = _inputs(B, H, H, L, S, D, torch.float16)
    if kind == "bool":
        mask = torch.rand(B, 1, L, S, device=DEVICE) > 0.4      # broadcast over heads
        mask[0, 0, 3] = False                                   # a row that sees nothing: zeros
    else:
        mask = torch.randn(L, S, device=DEVICE, dtype=torch.float16)   # broadcast over batch and heads
    _check(q, k, v, torch.float16, attn_mask=mask)
    if kind == "bool":
        o = wf.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.all(o[0, :, 3] == 0)


def test_sliding_window():
    q, k, v = _inputs(1, 2, 1, 75, 75, 16, torch.float32)
    _check(q, k, v, torch.float32, window_size=(10, 0), enable_gqa=True)
    _check(q, k, v, torch.float32, window_size=(5, 7), enable_gqa=True)
    _check(q, k, v, torch.float32, window_size=(40, -1), is_causal=True, enable_gqa=True)


def test_mask_per_head_with_gqa():
    """A bool mask that differs per query head (no broadcast dim: the other mask tests broadcast
    over heads, so their head stride is 0), under GQA: each kernel offsets the mask by its query
    head, not its KV head (a mask read at head 0's offset, or the dK/dV program's KV head's, passed
    every head-broadcast mask)."""
    q, k, v = _inputs(2, 4, 2, 13, 21, 16, torch.float32)
    mask = torch.rand(2, 4, 13, 21, device=DEVICE) > 0.4
    _check(q, k, v, torch.float32, attn_mask=mask, enable_gqa=True)


def test_window_left_zero_and_causal_clip():
    """window_size's edge values: left 0 (a query sees no earlier key; 0 is a bound, not 'unbounded'
    like -1: read as unbounded it passed every other window), and is_causal with a right window past
    the diagonal (causal wins: right clipped to 0, as the reference and FlashAttention do; keeping
    right = 5 passed, no other call had both)."""
    q, k, v = _inputs(1, 2, 1, 37, 37, 16, torch.float32)
    _check(q, k, v, torch.float32, what="window (0, 3)", window_size=(0, 3), enable_gqa=True)
    _check(q, k, v, torch.float32, what="causal, window (2, 5)", window_size=(2, 5), is_causal=True, enable_gqa=True)


def test_lse_gradient():
    """A loss that uses the log-sum-exp (as a z-loss would) differentiates through it. The loss reads
    lse through a transposed view, so its gradient arrives with other strides than lse's (the
    backward must copy it before the kernel reads it with lse's strides: read as it came, the
    gradient's rows and heads were swapped)."""
    q, k, v = _inputs(1, 2, 2, 21, 30, 16, torch.float32)
    w = randn(1, 21, 2)
    o, lse = wf.scaled_dot_product_attention(q, k, v, return_lse=True, is_causal=True)
    (o.square().sum() + (lse.mT.square() * w).sum()).backward()
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    orf, lref = attention_reference(qr, kr, vr, is_causal=True)     # lse in float32: ~1e-7 rounding
    (orf.square().sum() + (lref.mT.square() * w).sum()).backward()
    for g, r in zip((q.grad, k.grad, v.grad), (qr.grad, kr.grad, vr.grad)):
        assert_close(g, r, torch.float32, scale=2.0)


def test_no_keys_backward():
    """S = 0: zeros out, and a backward that gives query zero gradients and key/value empty ones, as
    torch (the zeros were outside the autograd graph: backward raised)."""
    q, k, v = _inputs(1, 2, 2, 5, 0, 16, torch.float32)
    o = wf.scaled_dot_product_attention(q, k, v)
    assert o.shape == q.shape and torch.equal(o, torch.zeros_like(o)) and o.requires_grad
    o.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_backward_is_deterministic():
    q, k, v = _inputs(2, 4, 1, 45, 45, 16, torch.float16)
    do = torch.randn(2, 4, 45, 16, device=DEVICE, dtype=torch.float16)
    runs = [torch.autograd.grad(wf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), (q, k, v), do)
            for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def _packed(lens_q, lens_k, H, HK, D, dtype):
    q = randn(sum(lens_q), H, D, dtype=dtype, requires_grad=True)
    k = randn(sum(lens_k), HK, D, dtype=dtype, requires_grad=True)
    v = randn(sum(lens_k), HK, D, dtype=dtype, requires_grad=True)
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE) for x in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1]


def _varlen_reference(q, k, v, cu_q, cu_k, keep=None, **kw):
    """attention_reference sequence by sequence over packed q, k, v, in float64: (qr, kr, vr) (the
    leaves), the packed output and each sequence's lse. ``keep``: a dropout mask over (sequence,
    head, query, key), cut to each sequence's lengths; ``kw``: the reference's options."""
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    outs, lses = [], []
    for b in range(cu_q.shape[0] - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if keep is not None:
            kw["dropout_keep"] = keep[b, :, :sq.stop - sq.start, :sk.stop - sk.start]
        ob, lb = attention_reference(qr[sq].transpose(0, 1), kr[sk].transpose(0, 1), vr[sk].transpose(0, 1),
                                     bottom_right=True, **kw)
        outs.append(ob.transpose(0, 1))
        lses.append(lb)
    return (qr, kr, vr), torch.cat(outs), lses


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (6, -1)), (False, (4, 9))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen(dtype, causal, window):
    """Packed sequences, one of them empty and one of length 1, L != S (bottom-right causal)."""
    lens_q, lens_k = [5, 0, 1, 37, 20], [5, 3, 1, 40, 13]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 32, dtype)
    o, lse = wf.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                 window_size=window, return_lse=True)
    assert o.shape == q.shape and lse.shape == (4, sum(lens_q))
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    leaves, orf, lses = _varlen_reference(q, k, v, cu_q, cu_k, is_causal=causal, window_size=window)
    for b, lb in enumerate(lses):
        if lens_q[b]:
            assert_close(lse[:, cu_q[b]:cu_q[b + 1]], lb, torch.float32, scale=10.0, what=f"lse of sequence {b}")
    assert_close(o, orf, dtype, what="out")
    rgrads = torch.autograd.grad(orf, leaves, do.double())
    for name, g, r in zip(("dq", "dk", "dv"), grads, rgrads):
        assert_close(g, r, dtype, scale=2.0, what=name)


def test_compile_fullgraph_and_opcheck():
    q, k, v = _inputs(1, 2, 1, 13, 20, 16, torch.float32)

    def f(q, k, v):
        return wf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum()

    torch._dynamo.reset()
    loss = torch.compile(f, fullgraph=True)(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    ref = torch.autograd.grad(f(q, k, v), (q, k, v))
    for g, r in zip(grads, ref):
        assert_close(g, r, torch.float32)
    args = (q.detach(), k.detach(), v.detach(), None, None, None, 13, 20, 0.25, -1, 0, False, 0.0, None)
    torch.library.opcheck(attention_op.overload, args, test_utils=("test_schema", "test_faketensor"))
    seed = torch.tensor([7], dtype=torch.int64, device=DEVICE)
    torch.library.opcheck(attention_op.overload, (*args[:-2], 0.25, seed), test_utils=("test_schema", "test_faketensor"))


@gpu_only
def test_head_dim_256_forward_and_fp16_long():
    q, k, v = _inputs(1, 2, 2, 300, 513, 256, torch.bfloat16)
    with torch.no_grad():
        o = wf.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(o, attention_reference(q, k, v, is_causal=True)[0], torch.bfloat16)


def test_head_dim_256_small():
    q, k, v = _inputs(1, 1, 1, 9, 20, 256, torch.float16, grad=False)
    assert_close(wf.scaled_dot_product_attention(q, k, v), attention_reference(q, k, v)[0], torch.float16)


def test_bad_input():
    q, k, v = _inputs(1, 4, 2, 8, 8, 16, torch.float32, grad=False)
    sdpa = wf.scaled_dot_product_attention
    with pytest.raises(ValueError, match="head dims differ: query 16, key 16, value 32"):
        sdpa(q, k, randn(1, 2, 8, 32))
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        sdpa(q, k, v)
    with pytest.raises(ValueError, match="4 query heads cannot be grouped over 3"):
        sdpa(q, randn(1, 3, 8, 16), randn(1, 3, 8, 16), enable_gqa=True)
    for p in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="'dropout_p' is .*; expected a probability in \\[0, 1\\]"):
            sdpa(q, k, v, dropout_p=p, enable_gqa=True)
    with pytest.raises(TypeError, match="'dropout_p' must be a real number, got str"):
        sdpa(q, k, v, dropout_p="0.1", enable_gqa=True)
    with pytest.raises(ValueError, match="either 'attn_mask' or is_causal"):
        sdpa(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool, device=DEVICE), is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match="'attn_mask' of shape \\(5, 8\\) cannot broadcast"):
        sdpa(q, k, v, attn_mask=torch.ones(5, 8, dtype=torch.bool, device=DEVICE), enable_gqa=True)
    with pytest.raises(TypeError, match="'attn_mask' has dtype torch.int64"):
        sdpa(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.int64, device=DEVICE), enable_gqa=True)
    with pytest.raises(ValueError, match="'attn_mask' requires grad"):
        sdpa(q, k, v, attn_mask=torch.zeros(8, 8, device=DEVICE, requires_grad=True), enable_gqa=True)
    with pytest.raises(TypeError, match="'key' has dtype torch.float16 but 'query' has torch.float32"):
        sdpa(q, k.half(), v, enable_gqa=True)
    with pytest.raises(TypeError, match="'query' has dtype int32"):
        sdpa(q.int(), k, v)
    with pytest.raises(ValueError, match="head dim 512 is not supported"):
        sdpa(randn(1, 1, 2, 512), randn(1, 1, 2, 512), randn(1, 1, 2, 512))
    with pytest.raises(ValueError, match="expected \\(left, right\\)"):
        sdpa(q, k, v, window_size=(-3, 0), enable_gqa=True)
    with pytest.raises(ValueError, match="'window_size' \\(0, -2\\): expected \\(left, right\\)"):
        sdpa(q, k, v, window_size=(0, -2), enable_gqa=True)
    with pytest.raises(ValueError, match="'key' has shape \\(1, 2, 8, 16\\) but 'value' has \\(1, 2, 6, 16\\)"):
        sdpa(q, k, v[:, :, :6], enable_gqa=True)
    with pytest.raises(ValueError, match="batch dims differ: query \\(2,\\), key \\(1,\\)"):
        sdpa(q.expand(2, -1, -1, -1), k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="'query' is 4-d and 'key' 3-d"):
        sdpa(q, k[0], v[0], enable_gqa=True)
    qp, kp, vp, cu_q, cu_k = _packed([3, 4], [3, 4], 2, 2, 16, torch.float32)
    with pytest.raises(TypeError, match="'cu_seqlens_q' must be a 1-d int32 tensor"):
        wf.attention_varlen(qp, kp, vp, cu_q.long(), cu_k, 4, 4)
    with pytest.raises(ValueError, match="'cu_seqlens_k' must rise from 0 to the packed length 7"):
        wf.attention_varlen(qp, kp, vp, cu_q, cu_k - 1, 4, 4)
    with pytest.raises(ValueError, match="has 4 tokens, more than max_seqlen_q=3"):
        wf.attention_varlen(qp, kp, vp, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match="'q' has shape"):
        wf.attention_varlen(qp[None], kp, vp, cu_q, cu_k, 4, 4)
    with pytest.raises(ValueError, match="'k' has shape \\(7, 2, 16\\) but 'v' has \\(6, 2, 16\\)"):
        wf.attention_varlen(qp, kp, vp[:6], cu_q, cu_k, 4, 4)
    with pytest.raises(ValueError, match="'cu_seqlens_q' has 2 offsets but 'cu_seqlens_k' 3"):
        wf.attention_varlen(qp, kp, vp, cu_q[[0, 2]], cu_k, 7, 4)
    falling = torch.tensor([0, 5, 3, 7], dtype=torch.int32, device=DEVICE)     # right ends, a step of -2
    with pytest.raises(ValueError, match="'cu_seqlens_q' must rise from 0 .* smallest step -2"):
        wf.attention_varlen(qp, kp, vp, falling, torch.tensor([0, 3, 4, 7], dtype=torch.int32, device=DEVICE), 5, 4)


def _same_with_grads(o, ref, inputs, what):
    """fp32 output ``o`` and its gradients into (q, k, v) ``inputs`` as another call's, ``ref``."""
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, inputs, do)
    assert_close(o, ref, torch.float32, what=f"{what} out")
    for name, g, r in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(ref, inputs, do)):
        assert_close(g, r, torch.float32, what=f"{what} {name}")


def test_varlen_compile_dynamic_max_seqlen():
    """torch.compile(dynamic=True, fullgraph=True) over packings whose max_seqlen differs: one
    graph for all (operator.index on the traced max_seqlen specialised it, a recompile for each
    distinct value, so a training loop over packed batches recompiled at every step until Dynamo's
    cache limit sent it back to eager), and forward and gradients equal to the eager call's."""
    def f(q, k, v, cu_q, cu_k, mq, mk):
        return wf.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)

    torch._dynamo.reset()
    cf = torch.compile(f, dynamic=True, fullgraph=True)
    for step, (lens_q, lens_k) in enumerate((([3, 4], [5, 4]), ([6, 1], [6, 2]), ([2, 9, 1], [2, 11, 1]))):
        q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 2, 1, 16, torch.float32)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            o = cf(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
        _same_with_grads(o, f(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)), (q, k, v), f"compiled, step {step}")


def test_varlen_max_seqlen_past_the_total():
    """max_seqlen is an upper bound (as FlashAttention's): one far past the packed total (2**40,
    when a caller passes a generous constant) gives the exact call's output and gradients, and
    sizes no bigger a grid than the total (it sized cdiv(2**40, 128) rows of idle programs: a
    launch past the grid limit on a GPU, an endless loop under the interpreter)."""
    lens_q, lens_k = [3, 0, 6], [4, 2, 6]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 2, 1, 16, torch.float32)
    o = wf.attention_varlen(q, k, v, cu_q, cu_k, 2**40, 2**40, causal=True)
    ref = wf.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    _same_with_grads(o, ref, (q, k, v), "max_seqlen 2**40")


def test_varlen_strided_offsets():
    """cu_seqlens as strided views (every other entry of a wider tensor): the same result as the
    contiguous offsets (the kernels read them densely, so the function copies them)."""
    lens = [5, 9, 3]
    q, k, v, cu, _ = _packed(lens, lens, 2, 2, 16, torch.float32)
    wide = torch.stack([cu, cu * 0 + 99], 1).reshape(-1)[::2]
    assert not wide.is_contiguous() and torch.equal(wide, cu)
    with torch.no_grad():
        want = wf.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
        for validate in (True, False):
            got = wf.attention_varlen(q, k, v, wide, wide, max(lens), max(lens), causal=True, validate=validate)
            assert torch.equal(got, want), f"validate={validate}"


def test_batch_past_the_grid_limit_runs_in_slices(monkeypatch):
    """A batch x heads count past the launch grid's y extent (65,535) runs as launches over batch
    slices (dense: views; packed: slices of cu_seqlens). The limit lowered to 5 here: outputs, lse
    and every gradient equal to the unsliced run, dense (a bool mask, GQA, causal) and packed, with
    dropout (a slice's programs draw the mask of their whole-call batch index)."""
    import warpforge.ops.attention as A

    def run(limit):
        monkeypatch.setattr(A, "GRID_Y_MAX", limit)
        torch.manual_seed(3)
        q, k, v = _inputs(3, 4, 2, 9, 11, 16, torch.float32)
        mask = torch.rand(3, 1, 9, 11, device=DEVICE) > 0.3
        mask[..., 0] = True
        o, lse = wf.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, return_lse=True,
                                                 dropout_p=0.3)
        do = torch.randn_like(o)
        grads = torch.autograd.grad(o, (q, k, v), do)
        lens = [5, 0, 7, 3]
        qp, kp, vp, cu, _ = _packed(lens, lens, 4, 2, 16, torch.float32)
        op = wf.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens), causal=True, dropout_p=0.3)
        gp = torch.autograd.grad(op, (qp, kp, vp), torch.randn_like(op))
        return (o, lse, *grads, op, *gp)

    calls = _spy(monkeypatch, A, "_attention_fwd_into")
    sliced = run(5)
    assert len(calls) == 3 + 4, "one forward launch set a slice: 3 dense (one batch each), 4 packed"
    for got, want in zip(sliced, run(65535)):
        assert torch.equal(got, want)


def test_wide_offsets_path(monkeypatch):
    """The Triton kernels take 64-bit tile starts (WIDE) on packed calls and where a tensor's
    offsets may pass 2^31, else the 32-bit offsets: which one a call gets (meta tensors of the
    sizes), and the WIDE form on dense calls (a mask, a window, GQA) bitwise equal to the other.
    On the CPU the WIDE run lowers ROW_CHUNK from 1,024 rows to 32, so every tile past the first
    starts at a nonzero 64-bit row (no CPU shape reaches 1,024 rows); k and dO have other row
    strides than v and q: a tile start taken with another tensor's row stride (v's with k's, dO's
    with q's) passed while every tile start was 0."""
    import warpforge.ops.attention as A

    small = torch.empty(4, 32, 4096, 128, device="meta")
    huge = torch.empty_strided((1, 32, 524288, 128), (2**31, 128, 4096, 1), device="meta")   # rows x stride > 2^31
    dense = A._Problem(small, small, None, None, 4096, 4096)
    assert not A._wide_offsets(dense, small, small) and A._wide_offsets(dense, small, huge)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    assert A._wide_offsets(A._Problem(small[0], small[0], cu, cu, 3, 3), small[0])

    def run(wide):
        monkeypatch.setattr(A, "_wide_offsets", lambda *a: wide)
        if not ON_GPU:          # the interpreter reads ROW_CHUNK each call; a compiled kernel keeps its own
            monkeypatch.setattr(A, "ROW_CHUNK", tl.constexpr(32 if wide else 1024))
        torch.manual_seed(7)
        q, k, v = _inputs(2, 2, 1, 40, 45, 16, torch.float32)
        k, do = noncontig(k), noncontig(randn(2, 2, 40, 16))       # row strides 32, against q's and v's 16
        mask = torch.rand(2, 1, 40, 45, device=DEVICE) > 0.3
        outs = []
        for kw in (dict(attn_mask=mask), dict(window_size=(5, 0))):
            o = wf.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
            outs += [o, *torch.autograd.grad(o, (q, k, v), do)]
        return outs

    for got, want in zip(run(True), run(False)):
        assert torch.equal(got, want)


def test_tiles_follow_the_key_pattern(monkeypatch):
    """Each Triton kernel asks attention_configs for the pattern of keys a query sees (a mask wins,
    then a left window, then causal / a right bound, else full), and at D = 64 and 128 on a GPU the
    patterns measured to gain (NOTES item 77) get their own tiles; other head dims and fp32 do not."""
    import warpforge.ops.attention as A
    from warpforge.runtime import heuristics as Hc

    assert [Hc.attention_pattern(m, wl, wr) for m, wl, wr in
            ((False, -1, -1), (False, -1, 0), (False, -1, 3), (False, 8, 0), (False, 8, -1), (True, -1, -1),
             (True, 8, 0), (False, 0, 0), (False, 0, -1))] == \
        ["full", "causal", "causal", "window", "window", "mask", "mask", "window", "window"]    # left 0 is a window
    seen = []
    real = A.attention_configs
    monkeypatch.setattr(A, "attention_configs", lambda kind, *a: seen.append((kind, a[-1])) or real(kind, *a))
    q, k, v = _inputs(1, 2, 2, 9, 9, 16, torch.float32)        # fp32: the Triton kernels on any device
    mask = torch.rand(9, 9, device=DEVICE) > 0.3
    for kw, pattern in ((dict(), "full"), (dict(is_causal=True), "causal"), (dict(window_size=(3, 0)), "window"),
                        (dict(attn_mask=mask), "mask")):
        seen.clear()
        o = wf.scaled_dot_product_attention(q, k, v, **kw)
        torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        assert sorted(seen) == [("dkdv", pattern), ("dq", pattern), ("fwd", pattern)], (kw, seen)

    monkeypatch.setattr(Hc, "interpreting", lambda: False)
    kinds = ("fwd", "dq", "dkdv")
    for d in (128, 64):
        full = {kd: Hc.attention_config(kd, d, 2) for kd in kinds}
        for pattern in ("causal", "window", "mask"):
            assert {kd: Hc.attention_config(kd, d, 2, pattern) for kd in kinds} != full, (d, pattern)
    for d, e in ((256, 2), (32, 2), (128, 4), (64, 4)):
        for pattern in ("causal", "window", "mask"):
            assert all(Hc.attention_config(kd, d, e, pattern) == Hc.attention_config(kd, d, e) for kd in kinds)
    assert Hc.attention_config("dkdv", 128, 2, "mask") == Hc.attention_config("dkdv", 128, 2)   # 32 x 64: 1.02x


def test_tiles_step_down_where_shared_memory_is_short(monkeypatch):
    """Where a tile does not load (Triton refuses a kernel that needs more shared memory than the
    GPU has: an A100's 163 KB, an sm_86/89 card's 99 KB, against the 227 KB the tiles were chosen
    for), each Triton kernel runs the first smaller tile of heuristics.attention_configs, and its
    grid follows the new tile: forward, lse and gradients stay right. A stand-in refuses tiles over
    512 elements; under the interpreter every kernel starts at 32 x 32."""
    import warpforge.ops.attention as A
    from triton.runtime.errors import OutOfResources
    from warpforge.runtime import launch as launch_mod
    monkeypatch.setattr(launch_mod, "_TOO_BIG", {})
    monkeypatch.setattr(A, "_sm90_kernels", lambda: None)
    real, ran = A._launch, []

    def refusing(cache, grid, args, cfg, **const):
        if cfg.block_m * cfg.block_n > 512:
            raise OutOfResources(cfg.block_m * cfg.block_n, 512, "shared memory")
        ran.append((cache.kernel.__name__, cfg.block_m, cfg.block_n))
        return real(cache, grid, args, cfg, **const)
    monkeypatch.setattr(A, "_launch", refusing)
    mask = torch.rand(37, 45, device=DEVICE) > 0.3
    for kw in (dict(), dict(is_causal=True), dict(attn_mask=mask), dict(window_size=(7, 3))):
        ran.clear()
        _check(*_inputs(2, 4, 2, 37, 45, 24, torch.float32), torch.float32, what=str(kw), enable_gqa=True, **kw)
        tiles = {name: (m, n) for name, m, n in ran if m}
        assert tiles == {"_attn_fwd_kernel": (32, 16), "_attn_bwd_dq_kernel": (32, 16),
                         "_attn_bwd_dkdv_kernel": (16, 32)}, (kw, ran)
    refused = {(k[1], k[2]) for k in launch_mod.shared_memory_fallbacks()}
    assert {what for what, _ in refused} == {"attention fwd", "attention dq", "attention dkdv"}


@gpu_only
@pytest.mark.parametrize("gpu", ["A100", "sm_86/89"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_small_shared_memory_gpu(lower_shared_memory, monkeypatch, gpu, head_dim):
    """As on a GPU with less shared memory a block than Hopper (Triton's limit lowered to an A100's
    or an sm_86/89 card's; the Hopper kernels off, as there): every Triton kernel loads a tile that
    fits, and forward, lse and gradients stay right. At D = 128 the dK/dV tile (64 x 128, 4 stages:
    ~199 KB compiled for sm_90) is refused on both, so the step-down is exercised."""
    import warpforge.ops.attention as A
    from warpforge.runtime import launch
    monkeypatch.setattr(A, "_sm90_kernels", lambda: None)
    lower_shared_memory(SHARED_MEMORY[gpu], A._FWD, A._DQ, A._DKDV, A._DELTA)
    for kw in (dict(), dict(is_causal=True), dict(window_size=(100, 0))):
        q, k, v = _inputs(2, 4, 2, 300, 277, head_dim, torch.bfloat16)
        _check(q, k, v, torch.bfloat16, what=f"{gpu} D{head_dim} {kw}", enable_gqa=True, **kw)
    refused = {key[1] for key in launch.shared_memory_fallbacks()}
    if head_dim == 128:
        assert "attention dkdv" in refused, refused


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16)])
def test_tiles_not_square(block_m, block_n, monkeypatch):
    """The interpreter's tiles are square (32 x 32), the GPU's mostly not (dkdv 16 x 64 and 32 x 64,
    fwd 64 x 32 with a window: runtime/heuristics.py); forced here through attention_configs, causal
    and a two-sided window, L = 50 (a ragged half tile either way), GQA: a query or key span cut in
    the other side's tile size, or a dQ grid counted in key tiles (rows left unwritten), passed
    every square tile."""
    import warpforge.ops.attention as A
    from warpforge.runtime.heuristics import AttentionConfig
    monkeypatch.setattr(A, "attention_configs", lambda *a: iter([AttentionConfig(block_m, block_n, 4, 1)]))
    q, k, v = _inputs(1, 2, 1, 50, 45, 16, torch.float32)
    _check(q, k, v, torch.float32, what=f"{block_m} x {block_n} causal", is_causal=True, enable_gqa=True)
    _check(q, k, v, torch.float32, what=f"{block_m} x {block_n} window", window_size=(7, 3), enable_gqa=True)


def test_row_strides_past_the_32bit_limit_are_copied(monkeypatch):
    """The Triton kernels add a tile's rows to its (64-bit) first row in 32 bits, which holds for
    row strides under ROW_STRIDE_LIMIT; views with larger ones are copied first. The limit lowered
    here below the views' row strides: the strided k, v, dO and mask are copied (contiguous tensors
    are kept), and the output, lse and every gradient equal the unlowered run's, dense (GQA, a
    float mask) and packed."""
    import warpforge.ops.attention as A

    def run(limit):
        monkeypatch.setattr(A, "ROW_STRIDE_LIMIT", limit)
        torch.manual_seed(5)
        q = randn(2, 4, 13, 16, dtype=torch.float32, requires_grad=True)
        kv = randn(2, 2, 11, 4 * 16, dtype=torch.float32)
        k, v = kv[..., :16].requires_grad_(), kv[..., 32:48].requires_grad_()     # row stride 64
        mask = randn(2, 4, 13, 3 * 11, dtype=torch.float32)[..., ::3]                # column stride 3
        o, lse = wf.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, return_lse=True)
        do = randn(2, 4, 13, 2 * 16, dtype=torch.float32)[..., 16:]
        grads = torch.autograd.grad(o, (q, k, v), do)
        lens = [5, 0, 7]
        qp, kp, vp, cu, _ = _packed(lens, lens, 4, 2, 16, torch.float32)
        op = wf.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens), causal=True)
        gp = torch.autograd.grad(op, (qp, kp, vp), torch.randn_like(op))
        return (o, lse, *grads, op, *gp)

    limit = A.ROW_STRIDE_LIMIT
    copies = []
    real = A._rows32
    monkeypatch.setattr(A, "_rows32", lambda t, *a, **k: (lambda r: copies.append(r is not t) or r)(real(t, *a, **k)))
    lowered = run(3)
    assert sum(copies) == 7, "k, v and the mask (forward and backward) and dO were copied"
    copies.clear()
    default = run(limit)
    assert not any(copies), "nothing is copied under the real limit"
    for got, want in zip(lowered, default):
        assert torch.equal(got, want)


def test_fake_layout_of_permuted_views_past_the_32bit_limit(monkeypatch):
    """q, k, v stored sequence-first, (S, B, H, D).permute(1, 2, 0, 3) (Megatron's layout), whose
    row stride B*H*D reaches ROW_STRIDE_LIMIT (lowered here; for real at B*H*D >= 1,677,721, e.g.
    B = 512, H = 32, D = 128): the launchers copy them to contiguous tensors (_rows32) and allocate
    O and dQ/dK/dV like the copies, contiguous; the fakes must agree (empty_like of the views kept
    their permuted strides). torch.compile's forward then fails its stride assertion."""
    import warpforge.ops.attention as A
    from warpforge.ops.attention import attention_bwd_op

    monkeypatch.setattr(A, "ROW_STRIDE_LIMIT", 64)
    L, B, H, D = 5, 2, 3, 16                                   # row stride B*H*D = 96 >= 64
    q, k, v = (randn(L, B, H, D, dtype=torch.float32).permute(1, 2, 0, 3) for _ in range(3))
    args = (L, L, 0.25, -1, 0, False, 0.0, None)
    torch.library.opcheck(attention_op.overload, (q, k, v, None, None, None, *args),
                          test_utils=("test_schema", "test_faketensor"))
    o, lse = attention_op.overload(q, k, v, None, None, None, *args)
    torch.library.opcheck(attention_bwd_op.overload, (torch.randn_like(o), q, k, v, o, lse, None, None, None, None,
                                                      *args), test_utils=("test_schema", "test_faketensor"))
    f = lambda q, k, v: wf.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch._dynamo.reset()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))  # clone keeps the permuted strides
    out = torch.compile(f, fullgraph=True)(qg, kg, vg)
    ref = f(q, k, v)
    assert torch.equal(out, ref)


@gpu_only
@pytest.mark.parametrize("window", [None, (4, 0)])
def test_batch_heads_past_the_grid_limit(window):
    """B x H = 2,049 x 32 > 65,535 for real (the Hopper kernels without a window, the Triton ones
    with it): forward and gradients of the last sequences against float64."""
    B, H, L, D = 2049, 32, 16, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16)
    kw = dict(is_causal=True) if window is None else dict(window_size=window)
    o = wf.scaled_dot_product_attention(q, k, v, **kw)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    tail = slice(B - 3, B)
    qr, kr, vr = (t[tail].detach().double().requires_grad_() for t in (q, k, v))
    orf, _ = attention_reference(qr, kr, vr, is_causal=True, window_size=window or (-1, -1))
    assert_close(o[tail], orf, torch.bfloat16, what="out")
    for g, r in zip(grads, torch.autograd.grad(orf, (qr, kr, vr), do[tail].double())):
        assert_close(g[tail], r, torch.bfloat16, scale=2.0, what="grad")


def test_varlen_unvalidated_bad_offsets_stay_in_bounds():
    """validate=False with offsets past the packed tensors: programs clamp to them (an
    out-of-bounds read would raise under the interpreter); the sequences before are right."""
    qp, kp, vp, cu_q, cu_k = _packed([3, 4], [3, 4], 2, 2, 16, torch.float32)
    bad = torch.tensor([0, 3, 90], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        o = wf.attention_varlen(qp, kp, vp, bad, bad, 90, 90, validate=False)
        ref = wf.attention_varlen(qp, kp, vp, cu_q, cu_k, 4, 4)
    assert torch.equal(o[:3], ref[:3])


def _hopper():
    return ON_GPU and torch.cuda.get_device_capability()[0] == 9


@contextlib.contextmanager
def _deterministic_mode(on: bool):
    """torch.use_deterministic_algorithms(on, warn_only=True) inside, the caller's mode after."""
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved)


def _spy(monkeypatch, obj, name: str) -> list:
    """Replaces ``obj.name`` with a wrapper that calls it and appends 1 to the returned list."""
    calls, real = [], getattr(obj, name)
    monkeypatch.setattr(obj, name, lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    return calls


@pytest.mark.skipif(not _hopper(), reason="the Gluon forward (ops/attention_sm90.py) runs on sm_90 only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 17, 17, 64), (2, 4, 2, 1000, 1000, 64), (1, 4, 1, 300, 1000, 128),
                                   (1, 2, 2, 1000, 300, 128), (1, 2, 2, 4097, 4097, 128), (2, 8, 8, 256, 256, 128),
                                   (8, 16, 4, 300, 300, 64)])
def test_sm90_forward(shape, causal, dtype, monkeypatch):
    """The Hopper kernel takes these calls (checked, not assumed) and matches the float64
    reference: ragged ends both sides (TMA zero-fills and clips), L != S, GQA/MQA, D 64 and 128;
    the last shape has 384 work items, so the persistent kernel's programs walk several each."""
    from warpforge.ops import attention as A
    sm90 = A._sm90_kernels()
    assert sm90 is not None, "Gluon's Hopper API did not import"
    calls = _spy(monkeypatch, sm90, "attention_fwd_sm90")
    q, k, v = _inputs(*shape, dtype, grad=False)
    o, lse = wf.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    assert calls, "the call did not take the sm90 kernel"
    orf, lref = attention_reference(q, k, v, is_causal=causal, enable_gqa=True)
    assert not o.isnan().any() and not lse.isnan().any()
    assert_close(o, orf, dtype, what="sm90 out")
    assert_close(lse, lref, torch.float32, scale=10.0, what="sm90 lse")


@pytest.mark.skipif(not _hopper(), reason="the Gluon forward (ops/attention_sm90.py) runs on sm_90 only")
def test_sm90_strided_views_and_fallbacks():
    """(B, L, H, D) views go through TMA with their strides; calls the kernel does not cover
    (mask, window, D = 256, fp32, a base not 16-byte aligned) are not offered to it."""
    from warpforge.ops import attention as A
    sm90 = A._sm90_kernels()
    B, L, H, D = 2, 333, 4, 128
    qkv = randn(B, L, 3, H, D, dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert sm90.covers(q, k, v, None, None, -1, 0, False)
    for causal in (False, True):
        o = wf.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert_close(o, attention_reference(q, k, v, is_causal=causal)[0], torch.bfloat16, what="strided")
    mask = torch.ones(L, L, dtype=torch.bool, device=DEVICE)
    assert not sm90.covers(q, k, v, mask, None, -1, -1, False)
    assert not sm90.covers(q, k, v, None, None, 8, 0, False)
    q256 = randn(1, 2, 64, 256, dtype=torch.bfloat16)
    assert not sm90.covers(q256, q256, q256, None, None, -1, -1, False)
    q32 = randn(1, 2, 64, 128)
    assert not sm90.covers(q32, q32, q32, None, None, -1, -1, False)
    buf = randn(1 + 2 * 64 * 128, dtype=torch.bfloat16)
    qm = buf[1:].view(1, 2, 64, 128)
    assert not sm90.covers(qm, qm, qm, None, None, -1, -1, False)
    o = wf.scaled_dot_product_attention(qm, qm, qm)
    assert_close(o, attention_reference(qm, qm, qm)[0], torch.bfloat16, what="misaligned fallback")


@pytest.mark.skipif(not _hopper(), reason="the Gluon backward kernels (ops/attention_sm90.py) run on sm_90 only")
@pytest.mark.parametrize("form", ["fused", "deterministic"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape,dtype", [((1, 2, 2, 17, 17, 64), torch.float16), ((1, 4, 1, 300, 1000, 128), torch.bfloat16),
                                         ((1, 2, 2, 1000, 300, 128), torch.float16), ((2, 4, 2, 777, 777, 128), torch.bfloat16),
                                         ((1, 8, 2, 129, 4097, 64), torch.bfloat16)])
def test_sm90_backward(shape, dtype, causal, form, monkeypatch):
    """The backward takes the Hopper kernel of its form on these calls (checked): the fused one
    (dK, dV and dQ in one pass, dQ by TMA reduce-adds) by default, the seven-GEMM one (Triton
    dK/dV, Gluon dQ, no atomics) under torch.use_deterministic_algorithms; all three gradients
    match the float64 reference: ragged ends, L != S both ways, GQA/MQA, D 64 and 128."""
    from warpforge.ops import attention as A
    sm90 = A._sm90_kernels()
    name = "attention_bwd_fused_sm90" if form == "fused" else "attention_bwd_dq_sm90"
    calls = _spy(monkeypatch, sm90, name)
    q, k, v = _inputs(*shape, dtype)
    with _deterministic_mode(form == "deterministic"):
        _check(q, k, v, dtype, what=f"sm90 bwd {form}", is_causal=causal, enable_gqa=True)
    assert calls, f"the backward did not take {name}"


@pytest.mark.skipif(not _hopper(), reason="the Gluon backward kernels (ops/attention_sm90.py) run on sm_90 only")
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_backward_strided(causal, monkeypatch):
    """q, k, v as (B, L, H, D) views of one packed qkv tensor: the fused backward takes them
    (checked) through strided TMA descriptors, and dq, dk, dv come back in that layout, correct."""
    from warpforge.ops import attention as A
    sm90 = A._sm90_kernels()
    calls = _spy(monkeypatch, sm90, "attention_bwd_fused_sm90")
    qkv = randn(2, 333, 3, 4, 128, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    _check(q, k, v, torch.bfloat16, what="sm90 strided bwd", is_causal=causal)
    assert calls, "the backward did not take the fused kernel"


@pytest.mark.skipif(not _hopper(), reason="the Gluon backward kernels (ops/attention_sm90.py) run on sm_90 only")
def test_sm90_backward_deterministic_mode():
    """Under torch.use_deterministic_algorithms(True) the Hopper backward is bitwise repeatable,
    and right (the repeats alone would pass a kernel that is wrong the same way each time)."""
    q, k, v = _inputs(2, 8, 2, 1000, 1000, 128, torch.bfloat16)
    do = torch.randn(2, 8, 1000, 128, device=DEVICE, dtype=torch.bfloat16)
    with _deterministic_mode(True):
        runs = [torch.autograd.grad(wf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                                    (q, k, v), do) for _ in range(3)]
    for a, b in zip(runs[0], runs[1]):
        assert torch.equal(a, b)
    for a, b in zip(runs[0], runs[2]):
        assert torch.equal(a, b)
    _check_grads(runs[0], q, k, v, do, torch.bfloat16, "deterministic", is_causal=True, enable_gqa=True)


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels (ops/attention_sm90.py) run on sm_90 only")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 127, 255, 64), (1, 2, 1, 383, 383, 128), (2, 2, 2, 1, 63, 128),
                                   (1, 2, 2, 0, 40, 128), (1, 2, 2, 40, 0, 64)])
def test_sm90_tile_boundaries(shape, causal):
    """Lengths one short of a whole tile (127, 255, 383: 128- and 64-key tiles, and the 64-row
    consumer halves), a single query row, and empty query or key sides, forward (with lse) and
    all three gradients against float64. Every other Hopper test's lengths left at least two
    missing keys in the last tile or none, so a tile-edge test off by one key (TMA zero-fills
    the key past the end, which then scores 0 instead of -inf) passed them all (NOTES item 147)."""
    dtype = torch.bfloat16
    q, k, v = _inputs(*shape, dtype)
    if shape[3] and shape[4]:
        _check(q, k, v, dtype, what=f"sm90 boundary {shape}", is_causal=causal, enable_gqa=True)
        return
    o = wf.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)   # an empty side
    assert o.shape == q.shape and torch.equal(o, torch.zeros_like(o))
    o.float().sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and torch.equal(t.grad, torch.zeros_like(t))


class _Launches:
    """Stands in for a Gluon kernel object: records each launch's grid and options, then launches."""

    def __init__(self, kernel):
        self.kernel, self.seen = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.seen.append((grid, kw))
            return self.kernel[grid](*args, **kw)
        return launch


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels (ops/attention_sm90.py) run on sm_90 only")
@pytest.mark.parametrize("shape,causal,route", [
    ((4, 8, 2, 600, 650, 128), False, "persistent"), ((5, 8, 4, 520, 480, 64), False, "persistent"),
    ((1, 2, 2, 2100, 2300, 64), False, "tiles"), ((1, 2, 1, 2300, 2100, 128), False, "tiles"),
    ((1, 2, 1, 2100, 2200, 64), True, "tiles"), ((1, 4, 2, 300, 200, 64), True, "short")],
    ids=["persistent-d128", "persistent-d64", "tiles-d64-L<S", "tiles-d128-L>S", "causal-d64-long", "short-L>S"])
def test_sm90_forward_routes(shape, causal, route, monkeypatch):
    """Each of the Hopper forward's three launches is taken where it should be (checked from the
    launches themselves) and is right, forward, lse and gradients, on the shapes no other test
    gave it: the persistent kernel with more work items than SMs over 5 query tiles (which 132
    does not divide: with 3 tiles a program's items all shared its first item's tile, so a kernel
    reusing that tile passed), at D 128 and with gradients; a program a tile past
    PERSISTENT_MAX_LEN non-causal, with L != S both ways; causal D 64 past SHORT_CAUSAL_MAX_LEN
    (128-key tiles); and the short causal form with L > S."""
    from warpforge.ops import attention as A
    sm90 = A._sm90_kernels()
    pers = _Launches(sm90._attn_fwd_sm90_persistent_kernel)
    tiles = _Launches(sm90._attn_fwd_sm90_kernel)
    monkeypatch.setattr(sm90, "_attn_fwd_sm90_persistent_kernel", pers)
    monkeypatch.setattr(sm90, "_attn_fwd_sm90_kernel", tiles)
    B, H, HK, L, S, D = shape
    q, k, v = _inputs(*shape, torch.bfloat16)
    _check(q, k, v, torch.bfloat16, what=f"route {route}", is_causal=causal, enable_gqa=True)
    if route == "persistent":
        assert pers.seen and not tiles.seen
        items = -(-L // sm90.BLOCK_M) * B * H
        assert items > pers.seen[0][0][0], "fewer work items than programs: one item a program"
    else:
        assert tiles.seen and not pers.seen
        short = tiles.seen[0][1]["maxnreg"] == sm90.SHORT_CAUSAL["maxnreg"]
        assert short == (route == "short")


@pytest.mark.skipif(not _hopper(), reason="the Gluon backward kernels (ops/attention_sm90.py) run on sm_90 only")
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_backward_reverse_order(causal, monkeypatch):
    """The fused backward's REVERSE option (key tiles walked last to first, which the probes
    time) computes the same gradients: the forward order's dK and dV bit for bit (a key tile's
    sums do not depend on the order of the programs), dQ within rounding, all against float64."""
    from functools import partial
    from warpforge.ops import attention as A
    sm90 = A._sm90_kernels()
    q, k, v = _inputs(1, 4, 2, 700, 900, 128, torch.bfloat16)
    do = torch.randn(1, 4, 700, 128, device=DEVICE, dtype=torch.bfloat16)
    run = lambda: torch.autograd.grad(  # noqa: E731
        wf.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True), (q, k, v), do)
    fwd = run()
    monkeypatch.setattr(sm90, "attention_bwd_fused_sm90", partial(sm90.attention_bwd_fused_sm90, reverse=True))
    rev = run()
    assert torch.equal(rev[1], fwd[1]) and torch.equal(rev[2], fwd[2])
    _check_grads(rev, q, k, v, do, torch.bfloat16, "reverse", is_causal=causal, enable_gqa=True)


@gpu_only
def test_covered_call_with_broadcast_gradient(monkeypatch):
    """A gradient handed in as an expanded tensor (o.backward(w.expand_as(o)): zero strides, as
    autograd passes it on) cannot be addressed by a TMA descriptor: a call the Hopper kernels
    cover otherwise must send that backward to the Triton kernels (checked on Hopper), and be
    right. (A loss (o * w).sum() does not test this: its Mul backward materialises dO.)"""
    q, k, v = _inputs(1, 4, 2, 300, 300, 128, torch.bfloat16)
    fused = []
    if _hopper():
        from warpforge.ops import attention as A
        fused = _spy(monkeypatch, A._sm90_kernels(), "attention_bwd_fused_sm90")
    w = torch.randn(128, device=DEVICE, dtype=torch.bfloat16)
    o = wf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    do = w.expand_as(o)
    assert do.stride()[:-1] == (0, 0, 0)
    grads = torch.autograd.grad(o, (q, k, v), do)
    _check_grads(grads, q, k, v, do, torch.bfloat16, "broadcast dO", is_causal=True, enable_gqa=True)
    assert not fused, "an expanded dO reached the TMA kernel"


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("window,causal", [((0, 0), False), ((0, 3), False), ((5, 0), True)])
def test_window_left_zero_half_precision(window, causal, D):
    """Windows with a left bound of 0 (or a right bound) in bf16 at head dims 64 and 128, where the
    Hopper kernels would take a dense call: they must decline it (they have no window) and the
    Triton kernels keep the bound (0 is a bound, -1 unbounded)."""
    q, k, v = _inputs(1, 2, 1, 37, 41, D, torch.bfloat16)
    _check(q, k, v, torch.bfloat16, what=f"window {window}", window_size=window, is_causal=causal, enable_gqa=True)


def test_sm90_tma_contract():
    """What the Hopper kernels accept as TMA-addressable (checked on any machine): contiguous and
    (B, L, H, D)-strided views yes; a zero stride (an expanded gradient), a 2-byte offset base, a
    row stride not a multiple of 16 bytes, or a strided last dim no."""
    from warpforge.ops.attention_sm90 import tma_ok
    t = torch.randn(2, 3, 40, 64, dtype=torch.bfloat16)
    assert tma_ok(t)
    assert tma_ok(torch.randn(2, 40, 3, 64, dtype=torch.bfloat16).transpose(1, 2))
    assert not tma_ok(torch.randn(64, dtype=torch.bfloat16).expand(2, 3, 40, 64))
    assert not tma_ok(torch.randn(1 + 2 * 3 * 40 * 64, dtype=torch.bfloat16)[1:].view(2, 3, 40, 64))
    assert not tma_ok(torch.randn(2, 3, 40, 68, dtype=torch.bfloat16)[..., :60])
    assert not tma_ok(torch.randn(2, 3, 40, 128, dtype=torch.bfloat16)[..., ::2])


def test_bad_options_audit():
    """window_size not a pair of ints (failed inside int()/indexing, or 1.5 truncated to 1), scale
    NaN/inf (an all-NaN output), a mask that cannot broadcast for >4-d inputs (torch's expand
    error), a negative max_seqlen with validate=False (an empty grid: the output never written),
    and varlen's messages naming its own arguments (q, k, v)."""
    sdpa = wf.scaled_dot_product_attention
    q, k, v = randn(1, 2, 5, 16), randn(1, 2, 7, 16), randn(1, 2, 7, 16)
    for w in ((2,), 3, ("a", 0), (1.5, 0)):
        with pytest.raises(TypeError, match="'window_size' is .*; expected a pair \\(left, right\\) of ints"):
            sdpa(q, k, v, window_size=w)
    for s in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="'scale' is .*; expected a finite number"):
            sdpa(q, k, v, scale=s)
    with pytest.raises(TypeError, match="'scale' must be a real number, got str"):
        sdpa(q, k, v, scale="0.5")
    with pytest.raises(ValueError, match="'attn_mask' of shape \\(4, 7\\) cannot broadcast"):
        sdpa(q[None], k[None], v[None], attn_mask=torch.ones(4, 7, dtype=torch.bool, device=DEVICE))
    qp, kp, vp, cu_q, cu_k = _packed([3, 2], [4, 3], 2, 2, 16, torch.float32)
    vl = wf.attention_varlen
    with pytest.raises(ValueError, match="'max_seqlen_q' is -1; expected the longest sequence's length"):
        vl(qp, kp, vp, cu_q, cu_k, -1, 4, validate=False)
    with pytest.raises(TypeError, match="'max_seqlen_k' must be an int, got NoneType"):
        vl(qp, kp, vp, cu_q, cu_k, 3, None)
    with pytest.raises(TypeError, match="'max_seqlen_q' must be an int, got float"):
        vl(qp, kp, vp, cu_q, cu_k, 3.0, 4)
    # integers that are not Python ints, as numpy and a 0-d tensor give them, are taken
    assert_close(vl(qp, kp, vp, cu_q, cu_k, np.int64(3), torch.tensor(4)), vl(qp, kp, vp, cu_q, cu_k, 3, 4),
                 torch.float32, what="numpy and tensor max_seqlen")
    with pytest.raises(ValueError, match="'scale' is nan"):
        vl(qp, kp, vp, cu_q, cu_k, 3, 4, scale=float("nan"))
    with pytest.raises(TypeError, match="'window_size' is"):
        vl(qp, kp, vp, cu_q, cu_k, 3, 4, window_size=(2,))
    with pytest.raises(TypeError, match="'k' has dtype torch.float16 but 'q' has torch.float32"):
        vl(qp, kp.half(), vp.half(), cu_q, cu_k, 3, 4)
    # meta tensors: the output's shape, no kernel and no host copy of cu_seqlens
    meta = [t.detach().to("meta") for t in (qp, kp, vp, cu_q, cu_k)]
    assert vl(*meta, 3, 4).shape == qp.shape
    o, lse = vl(*meta, 3, 4, return_lse=True)
    assert o.shape == qp.shape and lse.shape == (2, 5), f"packed lse {tuple(lse.shape)}: expected (heads, total_q)"
    assert sdpa(*(t.to("meta") for t in (q, k, v))).shape == q.shape


# ----------------------------------------------------------------------------------------------
# Dropout
# ----------------------------------------------------------------------------------------------
def _call_seed(torch_seed: int):
    """The Philox key a dropout call made right after torch.manual_seed(torch_seed) draws."""
    torch.manual_seed(torch_seed)
    return dropout_seed(torch.device(DEVICE))


def test_dropout_mask_statistics():
    """The mask the kernels draw: each score kept with probability 1 - p (within 5 sigma over 64K
    scores), neighbours independent (the eight keys of a Philox draw take its eight 16-bit halves: a
    key group sharing one would correlate adjacent keys fully), a different mask for every
    batch entry, head and row, a new one for a new key, the same one for the same key; p = 0 keeps
    all, p = 1 none."""
    seed = _call_seed(0)
    B, H, L, S = 2, 4, 32, 256
    for p in (0.1, 0.5, 0.9):
        keep = dropout_keep_mask(seed, B, H, L, S, p).float()
        n = keep.numel()
        assert abs(keep.mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5, f"p={p}: kept {keep.mean():.4f}"
        x = keep - keep.mean()
        for name, a, b in (("keys", x[..., :-1], x[..., 1:]), ("keys 2 apart", x[..., :-2], x[..., 2:]),
                           ("keys 4 apart", x[..., :-4], x[..., 4:]), ("keys 8 apart", x[..., :-8], x[..., 8:]),
                           ("rows", x[..., :-1, :], x[..., 1:, :]), ("heads", x[:, :-1], x[:, 1:]),
                           ("batch", x[:-1], x[1:])):
            corr = (a * b).mean() / (x * x).mean()
            assert abs(corr.item()) < 0.05, f"p={p}: {name} correlate ({corr:.3f})"
    assert torch.equal(dropout_keep_mask(seed, B, H, L, S, 0.3), dropout_keep_mask(seed.clone(), B, H, L, S, 0.3))
    other = dropout_keep_mask(_call_seed(1), B, H, L, S, 0.3)
    assert (other != dropout_keep_mask(seed, B, H, L, S, 0.3)).float().mean() > 0.3
    assert dropout_keep_mask(seed, B, H, L, S, 0.0).all()
    assert not dropout_keep_mask(seed, B, H, L, S, 1.0).any()


def _philox_words(key: int, c: list) -> list:
    """Philox-4x32-10 (Random123's constants; key's low word first) over numpy uint64 arrays of
    32-bit counters: the four 32-bit words, written apart from Triton's tl.philox."""
    m = np.uint64(0xFFFFFFFF)
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    c0, c1, c2, c3 = (np.asarray(x, dtype=np.uint64) for x in c)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & m, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
    return [c0, c1, c2, c3]


def test_dropout_mask_definition():
    """The mask's definition, rebuilt in numpy: key j = 32 c + 8 w + 2 t + e of query row i, head h,
    batch entry b is kept when half e (low first) of word w of the draw at counter (4 c + t, i, h, b)
    is >= round(p * 2^16). Every kernel (the Triton ones, the Hopper forward) must draw exactly this."""
    seed = _call_seed(5)
    B, H, L, S, p = 2, 3, 5, 70, 0.4
    got = dropout_keep_mask(seed, B, H, L, S, p).cpu().numpy()
    b, h, i, j = np.meshgrid(np.arange(B), np.arange(H), np.arange(L), np.arange(S), indexing="ij")
    words = _philox_words(int(seed.item()), [4 * (j // 32) + (j % 8) // 2, i, h, b])
    w = (j % 32) // 8
    word = np.choose(w, words)
    bits = (word >> (16 * (j % 2)).astype(np.uint64)) & np.uint64(0xFFFF)
    want = bits >= round(p * 2**16)
    assert (got == want).all(), f"{(got != want).sum()} of {got.size} scores differ from the definition"


@gpu_only
def test_dropout_keep_mask_of_a_cpu_key():
    """A CPU key on a GPU machine (the bench's float64 reference checks build their inputs on the
    CPU) gets the mask its CUDA copy gets, on the CPU; it crashed inside the kernel launch before."""
    seed = _call_seed(5)
    got = dropout_keep_mask(seed.cpu(), 2, 3, 5, 70, 0.4)
    assert got.device.type == "cpu" and torch.equal(got, dropout_keep_mask(seed, 2, 3, 5, 70, 0.4).cpu())


def _check_with_dropout(q, k, v, dtype, p, what, **kw):
    """A dropout call's output, lse and gradients against attention_reference with the mask the
    call drew (rebuilt from the same torch seed)."""
    B, H, L = q.shape[:3]
    S = k.shape[2]
    torch.manual_seed(11)
    o, lse = wf.scaled_dot_product_attention(q, k, v, dropout_p=p, return_lse=True, **kw)
    keep = dropout_keep_mask(_call_seed(11), B, H, L, S, p)
    ref_kw = dict(is_causal=kw.get("is_causal", False), attn_mask=kw.get("attn_mask"),
                  window_size=kw.get("window_size"), softcap=kw.get("softcap", 0.0))
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    orf, lref = attention_reference(qr, kr, vr, dropout_keep=keep, dropout_p=p, **ref_kw)
    assert_close(o, orf, dtype, what=f"{what} out")
    assert_close(lse, lref, torch.float32, scale=10.0, what=f"{what} lse (undropped)")
    # a draw between the forward and the backward must not move the backward's mask
    torch.rand(3, device=DEVICE)
    do = torch.randn_like(o)
    _check_grads(torch.autograd.grad(o, (q, k, v), do), q, k, v, do, dtype, what, dropout_keep=keep, dropout_p=p,
                 **ref_kw)
    # and the mask matters: the reference without it is far off
    assert (o.double() - attention_reference(qr, kr, vr, **ref_kw)[0]).norm() > 0.05 * orf.norm()


DROPOUT_SHAPES = [(2, 4, 2, 17, 23, 16), (1, 3, 1, 40, 9, 32)]
if ON_GPU:
    DROPOUT_SHAPES += [(2, 8, 2, 1000, 1000, 64), (1, 4, 4, 300, 4097, 128)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] + ([torch.float16] if ON_GPU else []))
@pytest.mark.parametrize("shape", DROPOUT_SHAPES)
def test_dropout_forward_backward(shape, dtype, causal):
    """Dropout's output and three gradients against the float64 reference with the same mask:
    odd lengths, L != S, GQA and MQA; on the GPU, bar-like head dims (on Hopper the 16-bit calls'
    forward is the Gluon kernel's, their backward the Triton kernels')."""
    q, k, v = _inputs(*shape, dtype)
    _check_with_dropout(q, k, v, dtype, 0.2, f"p=0.2 {shape}", is_causal=causal, enable_gqa=True)


def _check_routed_bf16(got, run, q, k, v, do, ref_kw, what, monkeypatch):
    """A bf16 call's (out, lse, dq, dk, dv) ``got``, as routed (the Gluon kernels), against the
    float64 reference with options ``ref_kw``, and ``run()`` (the call again) on the deterministic
    backward and on the Triton kernels alone, each within bf16 rounding."""
    from warpforge.ops import attention as A
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    orf, lref = attention_reference(qr, kr, vr, **ref_kw)
    assert_close(got[0], orf, torch.bfloat16, what=f"{what} out")
    assert_close(got[1], lref, torch.float32, scale=10.0, what=f"{what} lse")
    _check_grads(got[2:], q, k, v, do, torch.bfloat16, what, **ref_kw)
    with _deterministic_mode(True):
        det = run()
    sm90 = A._sm90_kernels()
    monkeypatch.setattr(A, "_SM90", [None])
    tri = run()
    monkeypatch.setattr(A, "_SM90", [sm90])
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, tri):
        assert_close(a, b.double(), torch.bfloat16, what=f"{what}: against Triton, {name}")
    for name, a, b in zip(("dq", "dk", "dv"), got[2:], det[2:]):
        assert_close(a, b.double(), torch.bfloat16, what=f"{what}: fused against deterministic, {name}")


def _spy_sm90(monkeypatch, option: str):
    """(the Gluon kernels' module, {"fwd": [...], "bwd": [...]}): each call of its forward and fused
    backward appends its ``option`` keyword (None when absent), so a test can check the route."""
    from warpforge.ops import attention as A
    sm90 = A._sm90_kernels()
    seen = {"fwd": [], "bwd": []}
    for key, name in (("fwd", "attention_fwd_sm90"), ("bwd", "attention_bwd_fused_sm90")):
        real = getattr(sm90, name)
        monkeypatch.setattr(sm90, name, lambda *a, _r=real, _k=key, **kw: (seen[_k].append(kw.get(option)),
                                                                            _r(*a, **kw))[1])
    return sm90, seen


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels (ops/attention_sm90.py) run on sm_90 only")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 17, 17, 64), (2, 4, 2, 1000, 300, 64), (1, 4, 1, 300, 1000, 128),
                                   (1, 2, 2, 4097, 4097, 128), (2, 2, 1, 600, 600, 64), (3, 2, 1, 300, 200, 128)])
def test_sm90_dropout(shape, causal, monkeypatch):
    """The Gluon forward (at D 128; D 64 stays on the Triton kernel, faster there) and the fused
    backward draw dropout's mask themselves (checked, not assumed):
    output, lse (undropped) and the three gradients against the float64 reference with
    dropout_keep_mask's mask, and against the Triton kernels at the same key (the same mask, so
    within rounding), the deterministic backward (Triton dK/dV and dQ) too. Then batch slices (the
    grid limit lowered): each slice's programs count batch entries from the slice's first, as the
    mask does."""
    sm90, seen = _spy_sm90(monkeypatch, "dropout")
    B, H, HK, L, S, D = shape
    q, k, v = _inputs(B, H, HK, L, S, D, torch.bfloat16)
    p = 0.3
    kw = dict(dropout_p=p, is_causal=causal, enable_gqa=True)

    def run():
        torch.manual_seed(4)
        o, lse = wf.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        return (o, lse, *torch.autograd.grad(o, (q, k, v), do))

    do = torch.randn(B, H, L, D, device=DEVICE, dtype=torch.bfloat16)
    got = run()
    gluon_fwd = D in sm90.DROPOUT_FWD_HEAD_DIMS
    assert (bool(seen["fwd"]) and seen["fwd"][-1] is not None) == gluon_fwd, f"forward route at D {D}: {seen['fwd']}"
    assert seen["bwd"] and seen["bwd"][-1] is not None, "the dropout backward did not take the fused Gluon kernel"
    assert not any(t.isnan().any() for t in got)
    keep = dropout_keep_mask(_call_seed(4), B, H, L, S, p)
    ref_kw = dict(is_causal=causal, enable_gqa=True, dropout_keep=keep, dropout_p=p)
    _check_routed_bf16(got, run, q, k, v, do, ref_kw, "sm90 dropout (same mask)", monkeypatch)
    monkeypatch.setattr(A, "GRID_Y_MAX", H)
    seen["fwd"].clear()
    sliced = run()
    assert len(seen["fwd"]) == (B if gluon_fwd else 0) and all(d is not None for d in seen["fwd"])
    assert torch.equal(sliced[0], got[0])
    for name, a, b in zip(("dq", "dk", "dv"), sliced[2:], got[2:]):
        assert_close(a, b.double(), torch.bfloat16, what=f"batch slices: {name}")


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels (ops/attention_sm90.py) run on sm_90 only")
def test_sm90_dropout_extremes():
    """On the Gluon kernels: p = 1 drops every score (zero output and gradients, no NaN from the
    0 scale), a p too small for the 16-bit threshold keeps every score (the p = 0 call's output and
    gradients, scaled by 1 / (1 - p), within rounding)."""
    q, k, v = _inputs(2, 4, 2, 300, 300, 128, torch.bfloat16)
    do = torch.randn_like(q)
    for causal in (False, True):
        o = wf.scaled_dot_product_attention(q, k, v, dropout_p=1.0, is_causal=causal, enable_gqa=True)
        grads = torch.autograd.grad(o, (q, k, v), do)
        assert not o.isnan().any() and (o == 0).all()
        assert all(not g.isnan().any() and (g == 0).all() for g in grads)
        o = wf.scaled_dot_product_attention(q, k, v, dropout_p=1e-6, is_causal=causal, enable_gqa=True)
        o0 = wf.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        assert_close(o, o0.double(), torch.bfloat16, what="p = 1e-6 against p = 0")
        for g, g0 in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(o0, (q, k, v), do)):
            assert_close(g, g0.double(), torch.bfloat16, what="p = 1e-6 gradients against p = 0")


@pytest.mark.parametrize("kw", [dict(attn_mask="bool"), dict(attn_mask="float"), dict(window_size=(5, 2))])
def test_dropout_with_masks_and_windows(kw):
    """Dropout on the masked paths (every tile masked) and a sliding window."""
    q, k, v = _inputs(1, 2, 2, 19, 21, 16, torch.float32)
    if kw.get("attn_mask") == "bool":
        mask = torch.rand(19, 21, device=DEVICE) > 0.4
        mask[:, 0] = True
        kw = dict(attn_mask=mask)
    elif kw.get("attn_mask") == "float":
        kw = dict(attn_mask=randn(2, 19, 21))
    _check_with_dropout(q, k, v, torch.float32, 0.35, str(sorted(kw)), **kw)


def test_dropout_extremes_and_reproducibility():
    """p = 0 is the plain call, bit for bit; p = 1 drops everything (zeros, zero gradients); the
    same torch seed gives the same output, the next call a new mask; a generator draws the key."""
    q, k, v = _inputs(1, 2, 1, 13, 30, 16, torch.float32)
    sdpa = functools.partial(wf.scaled_dot_product_attention, enable_gqa=True)
    assert torch.equal(sdpa(q, k, v, dropout_p=0.0), sdpa(q, k, v))
    o = sdpa(q, k, v, dropout_p=1.0)
    assert torch.equal(o, torch.zeros_like(o))
    for g in torch.autograd.grad(o, (q, k, v), torch.randn_like(o)):
        assert torch.equal(g, torch.zeros_like(g))
    torch.manual_seed(4)
    a, b = sdpa(q, k, v, dropout_p=0.5), sdpa(q, k, v, dropout_p=0.5)
    torch.manual_seed(4)
    assert torch.equal(sdpa(q, k, v, dropout_p=0.5), a)
    assert not torch.equal(a, b), "the second call must draw a new mask"
    gen = torch.Generator(DEVICE).manual_seed(9)
    c = sdpa(q, k, v, dropout_p=0.5, generator=gen)
    gen.manual_seed(9)
    assert torch.equal(sdpa(q, k, v, dropout_p=0.5, generator=gen), c)
    keep = dropout_keep_mask(dropout_seed(torch.device(DEVICE), torch.Generator(DEVICE).manual_seed(9)), 1, 2, 13, 30, 0.5)
    assert_close(c, attention_reference(q, k, v, enable_gqa=True, dropout_keep=keep, dropout_p=0.5)[0], torch.float32)


def test_dropout_varlen():
    """Packed sequences (one empty, one of length 1) with dropout: sequence b takes batch entry b's
    mask over its own positions, against the per-sequence reference; forward and gradients."""
    lens_q, lens_k = [5, 0, 1, 23, 12], [5, 3, 1, 26, 9]
    H, p = 4, 0.25
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, H, 2, 16, torch.float32)
    torch.manual_seed(2)
    o = wf.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, dropout_p=p)
    keep = dropout_keep_mask(_call_seed(2), len(lens_q), H, max(lens_q), max(lens_k), p)
    leaves, orf, _ = _varlen_reference(q, k, v, cu_q, cu_k, keep, is_causal=True, dropout_p=p)
    assert_close(o, orf, torch.float32, what="out")
    do = torch.randn_like(o)
    for name, g, r in zip(("dq", "dk", "dv"), torch.autograd.grad(o, (q, k, v), do),
                          torch.autograd.grad(orf, leaves, do.double())):
        assert_close(g, r, torch.float32, scale=2.0, what=name)


def test_dropout_compile_fullgraph():
    """Under torch.compile(fullgraph=True) the key is drawn in the graph: with Inductor's
    fallback_random (its RNG then matches eager's), the compiled forward and gradients equal the
    eager call's from the same torch seed."""
    q, k, v = _inputs(1, 2, 1, 13, 20, 16, torch.float32)

    def f(q, k, v):
        return wf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, dropout_p=0.3)

    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(6)
        o = torch.compile(f, fullgraph=True)(q, k, v)
    torch.manual_seed(6)
    _same_with_grads(o, f(q, k, v), (q, k, v), "compiled dropout")


@gpu_only
def test_dropout_cuda_graph_replays_draw_new_masks():
    """Captured in a CUDA graph, a dropout call draws its key in the graph: each replay a new mask
    (as torch's dropout), never NaN, and the backward captured with it takes its replay's mask:
    with gv = d sum(o) / dv, the column sums of the kept, scaled probabilities, sum(gv * v) equals
    sum(o) only when both used the same mask (another mask misses by about sum(o) itself)."""
    q, k, v = _inputs(2, 4, 4, 128, 128, 64, torch.bfloat16, grad=False)
    v.requires_grad_()
    static = {}

    def step():
        o = wf.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        (gv,) = torch.autograd.grad(o.float().sum(), (v,))
        static["o"], static["gv"] = o, gv

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()                                      # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    outs = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        o, gv = static["o"].float().clone(), static["gv"].float().clone()
        assert o.isfinite().all() and gv.isfinite().all()
        # sum(o) = sum over (b, h, i, j) of P'_ij v_j . 1 = sum over (b, h, j) of gv_j . 1: same mask
        assert torch.allclose(o.sum(), (gv * v.float()).sum(), rtol=2e-2, atol=1.0)
        outs.append(o)
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])


# ----------------------------------------------------------------------------------------------
# Soft cap (Gemma 2: scores capped to c * tanh(score / c) before the mask)
# ----------------------------------------------------------------------------------------------
SOFTCAP_SHAPES = [(2, 4, 2, 17, 23, 16), (1, 3, 1, 40, 9, 32), (1, 1, 1, 1, 1, 16)]
if ON_GPU:
    SOFTCAP_SHAPES += [(2, 8, 4, 1000, 1000, 128), (1, 4, 1, 300, 4097, 64), (1, 2, 1, 257, 300, 256)]


def _check_softcap(q, k, v, dtype, cap, what, **kw):
    """_check with the cap, and that the cap matters: the uncapped reference is far off (where
    there is more than one key to weigh)."""
    _check(q, k, v, dtype, what=what, ref_kw=dict(softcap=cap, enable_gqa=kw.get("enable_gqa", False)),
           softcap=cap, **kw)
    if k.shape[-2] == 1:
        return
    o = wf.scaled_dot_product_attention(q, k, v, softcap=cap, **kw)
    ref_kw = dict(is_causal=kw.get("is_causal", False), attn_mask=kw.get("attn_mask"),
                  window_size=kw.get("window_size"), enable_gqa=kw.get("enable_gqa", False))
    plain = attention_reference(*(t.detach().double() for t in (q, k, v)), **ref_kw)[0]
    assert (o.double() - plain).norm() > 0.05 * plain.norm(), f"{what}: the cap changed nothing"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] + ([torch.float16] if ON_GPU else []))
@pytest.mark.parametrize("shape", SOFTCAP_SHAPES)
def test_softcap_forward_backward(shape, dtype, causal):
    """Output, lse and the three gradients (through the cap's 1 - tanh^2) against the float64
    reference: scores ~N(0, 9) under a cap of 4, so most of them sit on the tanh's bend or its
    shoulders; odd lengths, L != S, GQA and MQA, one query and key; on the GPU D 64, 128, 256 and
    the hardware tanh (16-bit inputs)."""
    B, H, HK, L, S, D = shape
    q = (randn(B, H, L, D, dtype=torch.float32) * 3).to(dtype).requires_grad_()
    k, v = _inputs(B, H, HK, L, S, D, dtype)[1:]
    _check_softcap(q, k, v, dtype, 4.0, f"softcap {shape}", is_causal=causal, enable_gqa=True)


@pytest.mark.parametrize("kw", [dict(attn_mask="bool"), dict(attn_mask="float"), dict(window_size=(5, 2)),
                                dict(dropout_p=0.3)])
def test_softcap_with_masks_windows_dropout(kw):
    """The cap on the masked paths (the cap comes first, then a float mask is added, as Gemma 2's
    eager attention adds its causal mask to the capped scores), with a window, and with dropout."""
    q = (randn(1, 2, 19, 16) * 3).requires_grad_()
    k, v = _inputs(1, 2, 2, 19, 21, 16, torch.float32)[1:]
    if kw.get("attn_mask") == "bool":
        mask = torch.rand(19, 21, device=DEVICE) > 0.4
        mask[:, 0] = True
        kw = dict(attn_mask=mask)
    elif kw.get("attn_mask") == "float":
        kw = dict(attn_mask=randn(2, 19, 21) * 2)
    if "dropout_p" in kw:
        _check_with_dropout(q, k, v, torch.float32, 0.3, "softcap and dropout", softcap=2.5)
        return
    _check_softcap(q, k, v, torch.float32, 2.5, str(sorted(kw)), **kw)


def test_softcap_varlen():
    """Packed sequences (one empty, one of length 1), bottom-right causal with a window, capped."""
    lens_q, lens_k = [5, 0, 1, 37, 20], [5, 3, 1, 40, 13]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 32, torch.float32)
    with torch.no_grad():
        q.mul_(3)
    o, lse = wf.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, window_size=(6, -1),
                                 softcap=3.0, return_lse=True)
    leaves, orf, lses = _varlen_reference(q, k, v, cu_q, cu_k, is_causal=True, window_size=(6, -1), softcap=3.0)
    assert_close(o, orf, torch.float32, what="out")
    for b, lb in enumerate(lses):
        if lens_q[b]:
            assert_close(lse[:, cu_q[b]:cu_q[b + 1]], lb, torch.float32, scale=10.0, what=f"lse of sequence {b}")
    do = torch.randn_like(o)
    for name, g, r in zip(("dq", "dk", "dv"), torch.autograd.grad(o, (q, k, v), do),
                          torch.autograd.grad(orf, leaves, do.double())):
        assert_close(g, r, torch.float32, scale=2.0, what=name)
    plain = _varlen_reference(q, k, v, cu_q, cu_k, is_causal=True, window_size=(6, -1))[1]
    assert (o.double() - plain).norm() > 0.05 * plain.norm()


def test_softcap_options_and_compile():
    """softcap=0 is the plain call, bit for bit; bad caps are clear errors naming the argument;
    torch.compile(fullgraph=True) gives the eager call's output and gradients; the operator's
    schema and fake kernel take the cap."""
    q = (randn(1, 2, 13, 16) * 3).requires_grad_()
    k, v = _inputs(1, 1, 1, 13, 20, 16, torch.float32)[1:]
    sdpa = functools.partial(wf.scaled_dot_product_attention, enable_gqa=True)
    assert torch.equal(sdpa(q, k, v, softcap=0.0), sdpa(q, k, v))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="'softcap' is .*; expected a finite number >= 0"):
            sdpa(q, k, v, softcap=bad)
    with pytest.raises(TypeError, match="'softcap' must be a real number, got str"):
        sdpa(q, k, v, softcap="30")
    qp, kp, vp, cu_q, cu_k = _packed([3, 2], [4, 3], 2, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="'softcap' is -2.0"):
        wf.attention_varlen(qp, kp, vp, cu_q, cu_k, 3, 4, softcap=-2.0)

    def f(q, k, v):
        return sdpa(q, k, v, is_causal=True, softcap=5.0)

    torch._dynamo.reset()
    _same_with_grads(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v), (q, k, v), "compiled softcap")
    args = (q.detach(), k.detach(), v.detach(), None, None, None, 13, 20, 0.25, -1, 0, False, 0.0, None, 5.0)
    torch.library.opcheck(attention_op.overload, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels (ops/attention_sm90.py) run on sm_90 only")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 17, 17, 64), (2, 4, 2, 1000, 300, 64), (1, 4, 1, 300, 1000, 128),
                                   (2, 4, 2, 1000, 1000, 128), (1, 2, 1, 4097, 4097, 128)])
def test_sm90_softcap(shape, causal, monkeypatch):
    """The Gluon forward (per-tile kernel, also where the plain call would take the persistent one)
    and the fused backward take capped calls (checked, not assumed): output, lse and the three
    gradients against the float64 reference, and against the Triton kernels (the same hardware
    tanh, so within rounding); the deterministic backward (Triton kernels) too; with dropout at
    D 128 the same against the reference with the call's mask."""
    sm90, seen = _spy_sm90(monkeypatch, "softcap")
    B, H, HK, L, S, D = shape
    q = (randn(B, H, L, D) * 3).bfloat16().requires_grad_()
    k, v = _inputs(B, H, HK, L, S, D, torch.bfloat16)[1:]
    do = torch.randn(B, H, L, D, device=DEVICE, dtype=torch.bfloat16)
    kw = dict(is_causal=causal, enable_gqa=True, softcap=4.0)

    def run(**extra):
        o, lse = wf.scaled_dot_product_attention(q, k, v, return_lse=True, **kw, **extra)
        return (o, lse, *torch.autograd.grad(o, (q, k, v), do))

    got = run()
    assert seen["fwd"] and seen["fwd"][-1] is not None, "the capped forward did not take the Gluon kernel"
    assert seen["bwd"] and seen["bwd"][-1] is not None, "the capped backward did not take the fused Gluon kernel"
    assert not any(t.isnan().any() for t in got)
    ref_kw = dict(is_causal=causal, enable_gqa=True, softcap=4.0)
    _check_routed_bf16(got, run, q, k, v, do, ref_kw, "sm90 capped", monkeypatch)
    qr, kr, vr = (t.detach().double() for t in (q, k, v))
    plain = attention_reference(qr, kr, vr, is_causal=causal, enable_gqa=True)[0]
    assert (got[0].double() - plain).norm() > 0.05 * plain.norm(), "the cap changed nothing"
    if D == 128:
        torch.manual_seed(5)
        dropped = run(dropout_p=0.2)
        keep = dropout_keep_mask(_call_seed(5), B, H, L, S, 0.2)
        orf, lref = attention_reference(qr, kr, vr, dropout_keep=keep, dropout_p=0.2, **ref_kw)
        assert_close(dropped[0], orf, torch.bfloat16, what="sm90 capped with dropout out")
        _check_grads(dropped[2:], q, k, v, do, torch.bfloat16, "sm90 capped with dropout", dropout_keep=keep,
                     dropout_p=0.2, **ref_kw)
