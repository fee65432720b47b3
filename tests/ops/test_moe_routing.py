"""MoE routing (DeepSeek-style top-k with groups and correction bias) against the plain-PyTorch
reference: ids and counts exactly, weights by relative error, gradients of the weights and the
aux loss against autograd through the float64 reference; ties, T = 0, odd shapes, compile,
opcheck, bad input and the bias update.

Observed under the interpreter: weights agree with the float32 reference to <= 1e-7 relative,
gradients with the float64 one to <= 3e-7; a wrong mask, tie rule or Jacobian term lands at 1e-2
or more (or changes ids).
"""
import pytest
import torch

from warpforge.ops.moe_routing import (MAX_EXPERTS, MoERouting, moe_route, moe_route_op, moe_route_reference,
                                       moe_update_bias_)
from conftest import DEVICE, DTYPES, assert_close, randn


def _check(logits, top_k, what="", **kw):
    """Kernel vs the reference on the same logits: ids and counts exactly, weights to fp32 rounding."""
    r = moe_route(logits, top_k, **kw)
    ref = moe_route_reference(logits, top_k, **kw)
    t, e = logits.shape
    assert isinstance(r, MoERouting)
    assert r.weights.dtype == torch.float32 and r.ids.dtype == torch.int32 and r.counts.dtype == torch.int32
    assert r.weights.shape == (t, top_k) and r.ids.shape == (t, top_k) and r.counts.shape == (e,)
    bad = (r.ids != ref.ids).any(1).nonzero().flatten().tolist()
    assert torch.equal(r.ids, ref.ids), f"{what} ids differ in rows {bad}"
    assert torch.equal(r.counts, ref.counts), f"{what} counts differ"
    assert int(r.counts.sum()) == t * top_k
    assert_close(r.weights, ref.weights, torch.float32, what=f"{what} weights")
    return r, ref


# (T, E, k, kwargs): T not a multiple of the token tile (32), E not a power of two, group size 15,
# k = 1 and k = E / topk_group-ish, both group scores, renormalize, scale, bias
CASES = [
    (37, 60, 6, dict()),
    (37, 60, 1, dict(score="sigmoid")),
    (19, 64, 8, dict(renormalize=True, routed_scaling_factor=2.5)),
    (19, 64, 8, dict(score="sigmoid", renormalize=True, routed_scaling_factor=2.5)),
    (33, 60, 6, dict(n_group=4, topk_group=2, group_score="max")),
    (33, 60, 6, dict(n_group=4, topk_group=2, group_score="top2")),
    (33, 60, 30, dict(n_group=4, topk_group=2, renormalize=True)),          # every allowed expert chosen
    (21, 64, 8, dict(score="sigmoid", n_group=8, topk_group=4, renormalize=True, routed_scaling_factor=2.5,
                     correction_bias="bias")),                              # DeepSeek-V3 in miniature
    (21, 64, 5, dict(n_group=16, topk_group=3, correction_bias="bias")),    # groups of 4, 16 of them
    (17, 24, 3, dict(n_group=24, topk_group=5, group_score="top2")),        # groups of one expert
    (1, 7, 2, dict(n_group=7, topk_group=7)),                               # T = 1, nothing dropped
]


@pytest.mark.parametrize("t,e,k,kw", CASES, ids=[f"T{c[0]}-E{c[1]}-k{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_matches_reference(t, e, k, kw):
    kw = dict(kw)
    if kw.get("correction_bias") == "bias":
        kw["correction_bias"] = randn(e, scale=0.1)
    _check(randn(t, e, scale=2.0), k, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    """16-bit logits collide often (exact ties): the kernel must break them as the reference does."""
    x = randn(40, 48, dtype=dtype, scale=2.0)
    for kw in (dict(), dict(score="sigmoid", n_group=4, topk_group=2, correction_bias=randn(48, scale=0.05))):
        _check(x, 6, what=str(dtype), **kw)


def test_noncontiguous_logits():
    buf = randn(23, 2, 40)
    x = buf[:, 1, :]                                                        # row stride 80
    assert not x.is_contiguous()
    _check(x, 4, n_group=4, topk_group=2)
    r = moe_route(x, 4, n_group=4, topk_group=2)
    assert torch.equal(r.ids, moe_route(x.contiguous(), 4, n_group=4, topk_group=2).ids)


def test_max_experts():
    _check(randn(3, MAX_EXPERTS, scale=3.0), 8, n_group=8, topk_group=3)


def test_grouping_restricts_and_group_score_matters():
    x = randn(32, 60, scale=2.0)
    free = moe_route(x, 6)
    grouped, _ = _check(x, 6, n_group=4, topk_group=1)
    assert not torch.equal(free.ids, grouped.ids), "grouping changed nothing: the test proves nothing"
    assert (grouped.ids // 15 == grouped.ids[:, :1] // 15).all(), "experts from a dropped group were chosen"
    # one group with one great expert, another with two good ones: "max" keeps the first, "top2" the second
    y = torch.tensor([[4.0, 0.0, 0.0, 0.0, 3.5, 3.5, 0.0, 0.0]], device=DEVICE)
    by_max = moe_route(y, 2, n_group=2, topk_group=1, group_score="max").ids
    by_top2 = moe_route(y, 2, n_group=2, topk_group=1, group_score="top2").ids
    assert by_max.tolist() == [[0, 1]] and by_top2.tolist() == [[4, 5]]
    # the default: "max" for plain softmax, "top2" for sigmoid or with a bias
    assert torch.equal(moe_route(y, 2, n_group=2, topk_group=1).ids, by_max)
    assert torch.equal(moe_route(y, 2, score="sigmoid", n_group=2, topk_group=1).ids, by_top2)
    zero = torch.zeros(8, device=DEVICE)
    assert torch.equal(moe_route(y, 2, n_group=2, topk_group=1, correction_bias=zero).ids, by_top2)


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_correction_bias_moves_choice_not_weights(score):
    x = randn(29, 32)
    bias = torch.zeros(32, device=DEVICE)
    bias[[3, 17]] = 10.0                                                    # forces experts 3 and 17 in
    plain = moe_route(x, 4, score=score)
    r, _ = _check(x, 4, score=score, correction_bias=bias)
    assert not torch.equal(plain.ids, r.ids)
    assert ((r.ids == 3).any(1) & (r.ids == 17).any(1)).all()
    s = torch.sigmoid(x) if score == "sigmoid" else torch.softmax(x, -1)
    assert_close(r.weights, s.gather(1, r.ids.long()), torch.float32, what="weights are the unbiased scores")
    assert (r.weights < 1.0).all(), "a biased score leaked into the weights"


def test_ties_lowest_index_first():
    for dtype in DTYPES:
        x = torch.zeros(5, 12, device=DEVICE, dtype=dtype)
        assert moe_route(x, 4).ids.tolist() == [[0, 1, 2, 3]] * 5
        # equal groups too: the lowest groups are kept, then the lowest experts in them
        assert moe_route(x, 4, n_group=4, topk_group=2, score="sigmoid").ids.tolist() == [[0, 1, 2, 3]] * 5
    row = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.5, 3.0, 2.0]], device=DEVICE)
    for k, want in ((1, [1]), (2, [1, 3]), (3, [1, 3, 5]), (5, [1, 3, 5, 2, 6])):
        r, _ = _check(row, k)
        assert r.ids.tolist() == [want]
    # a tie the bias creates: every sigmoid score is 0.5, experts 1 and 2 tie at 1.5 ahead of 3 at 1.0
    x = torch.zeros(1, 4, device=DEVICE)
    bias = torch.tensor([0.0, 1.0, 1.0, 0.5], device=DEVICE)
    assert moe_route(x, 2, score="sigmoid", correction_bias=bias).ids.tolist() == [[1, 2]]


@pytest.mark.parametrize("kw", [dict(), dict(score="sigmoid"), dict(n_group=4, topk_group=2),
                                dict(n_group=4, topk_group=2, score="sigmoid", group_score="top2")], ids=str)
def test_nan_logits_keep_ids_distinct(kw):
    """A NaN logit (softmax: the whole row's scores NaN) or a NaN bias ranks first, as in
    torch.topk: the token's ids stay distinct and in range -- never one expert twice (which would
    double its share) -- a NaN choice carries a NaN weight, and the other tokens route as without it."""
    x = torch.randn(6, 16, device=DEVICE)
    x[1, 3] = float("nan")
    x[4] = float("nan")
    r = moe_route(x, 4, **kw)
    ids = r.ids.tolist()
    for t in (1, 4):
        assert len(set(ids[t])) == 4 and all(0 <= i < 16 for i in ids[t]), f"token {t}: ids {ids[t]}"
    assert torch.isnan(r.weights[4]).all() and torch.isnan(r.weights[1]).any()
    assert 3 in ids[1]                      # the NaN expert is chosen (its group too, when grouped)
    keep = [0, 2, 3, 5]
    ref = moe_route(x[keep], 4, **kw)
    assert r.ids[keep].tolist() == ref.ids.tolist()
    assert torch.equal(r.weights[keep], ref.weights)
    assert int(r.counts.sum()) == 6 * 4
    bias = torch.zeros(16, device=DEVICE)
    bias[5] = float("nan")
    rb = moe_route(torch.randn(3, 16, device=DEVICE), 4, correction_bias=bias, score="sigmoid",
                   **{k: v for k, v in kw.items() if k != "score"})
    assert all(len(set(row)) == 4 and row[0] == 5 for row in rb.ids.tolist())
    assert torch.isfinite(rb.weights).all()   # the bias picks; the weights are the unbiased scores


def test_reference_tie_rule_is_not_topk_luck():
    """The reference itself implements lowest-index-first (it is the ground truth for the above)."""
    x = torch.zeros(3, 40, dtype=torch.float64)
    x[:, 20:] = 1.0
    ref = moe_route_reference(x, 5)
    assert ref.ids.tolist() == [[20, 21, 22, 23, 24]] * 3
    ref = moe_route_reference(x, 5, n_group=4, topk_group=2, score="sigmoid")
    assert ref.ids.tolist() == [[20, 21, 22, 23, 24]] * 3


def test_empty_tokens():
    x = torch.empty(0, 24, device=DEVICE)
    r = moe_route(x, 3, n_group=4, topk_group=2, aux_loss_coef=0.1)
    assert r.weights.shape == (0, 3) and r.ids.shape == (0, 3)
    assert torch.equal(r.counts, torch.zeros(24, dtype=torch.int32, device=DEVICE))
    assert r.aux_loss.item() == 0.0


@pytest.mark.parametrize("score,renormalize", [("softmax", False), ("softmax", True), ("sigmoid", False),
                                                ("sigmoid", True)])
def test_gradients(score, renormalize):
    """d weights / d logits (and d aux / d logits) against autograd through the float64 reference."""
    t, e, k = 21, 40, 5
    kw = dict(score=score, renormalize=renormalize, routed_scaling_factor=1.7, n_group=4, topk_group=2,
              correction_bias=randn(e, scale=0.05), aux_loss_coef=0.3)
    x = randn(t, e, requires_grad=True)
    r = moe_route(x, k, **kw)
    xr = x.detach().double().requires_grad_()
    ref = moe_route_reference(xr, k, **kw)
    assert torch.equal(r.ids, ref.ids)
    assert_close(r.weights, ref.weights, torch.float32, what="weights")
    assert_close(r.aux_loss, ref.aux_loss, torch.float32, what="aux_loss")
    dw = torch.randn(t, k, device=DEVICE)
    (gx,) = torch.autograd.grad(r.weights, x, dw, retain_graph=True)
    (gr,) = torch.autograd.grad(ref.weights, xr, dw.double(), retain_graph=True)
    assert_close(gx, gr, torch.float32, scale=2.0, what="d weights / d logits")
    (ga,) = torch.autograd.grad(r.aux_loss, x)
    (gar,) = torch.autograd.grad(ref.aux_loss, xr)
    assert_close(ga, gar, torch.float32, scale=2.0, what="d aux / d logits")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gradient_dtype(dtype):
    x = randn(13, 24, dtype=dtype, requires_grad=True)
    r = moe_route(x, 3, renormalize=True)
    xr = x.detach().double().requires_grad_()
    ref = moe_route_reference(xr, 3, renormalize=True)
    assert torch.equal(r.ids, ref.ids)
    dw = torch.randn(13, 3, device=DEVICE)
    (gx,) = torch.autograd.grad(r.weights, x, dw)
    (gr,) = torch.autograd.grad(ref.weights, xr, dw.double())
    assert gx.dtype == dtype
    assert_close(gx, gr, dtype, scale=2.0, what="d logits")


def test_aux_loss():
    assert moe_route(randn(4, 8), 2).aux_loss is None
    # uniform logits: P_e = 1/E and sum_e f_e = 1, so the loss is exactly coef
    for score in ("softmax", "sigmoid"):
        r = moe_route(torch.zeros(6, 8, device=DEVICE), 2, score=score, aux_loss_coef=0.25)
        assert r.aux_loss.dtype == torch.float32 and r.aux_loss.dim() == 0
        assert abs(r.aux_loss.item() - 0.25) < 1e-6
    # all tokens to the same expert pair, with P concentrated there too: the loss grows
    x = torch.zeros(6, 8, device=DEVICE)
    x[:, :2] = 4.0
    skew = moe_route(x, 2, aux_loss_coef=0.25).aux_loss.item()
    assert skew > 0.25 * 3
    x = randn(30, 16)
    r = moe_route(x, 3, score="sigmoid", aux_loss_coef=0.01)
    ref = moe_route_reference(x.double(), 3, score="sigmoid", aux_loss_coef=0.01)
    assert_close(r.aux_loss, ref.aux_loss, torch.float32, what="aux_loss")


def test_poisoned_outputs_are_written():
    r = moe_route(randn(45, 20), 3)
    assert torch.isfinite(r.weights).all()
    assert ((r.ids >= 0) & (r.ids < 20)).all()


def test_compile_fullgraph():
    bias = randn(32, scale=0.05)

    def f(x):
        r = moe_route(x, 4, score="sigmoid", n_group=4, topk_group=2, renormalize=True,
                      routed_scaling_factor=2.0, correction_bias=bias, aux_loss_coef=0.1)
        return (r.weights * torch.arange(1, 5, device=x.device)).sum() + r.aux_loss, r.ids, r.counts

    torch._dynamo.reset()
    x = randn(11, 32, requires_grad=True)
    loss, ids, counts = torch.compile(f, fullgraph=True)(x)
    (g,) = torch.autograd.grad(loss, x)
    loss_e, ids_e, counts_e = f(x)
    (g_e,) = torch.autograd.grad(loss_e, x)
    assert torch.equal(ids, ids_e) and torch.equal(counts, counts_e)
    assert_close(loss, loss_e, torch.float32, what="compiled loss")
    assert_close(g, g_e, torch.float32, what="compiled gradient")


def test_opcheck():
    x = randn(9, 16, requires_grad=True)
    torch.library.opcheck(moe_route_op.overload, (x, randn(16), 3, True, 4, 2, True, True, 2.0))
    torch.library.opcheck(moe_route_op.overload, (x, None, 2, False, 1, 1, False, False, 1.0))


def test_bad_input():
    x = randn(4, 16)
    cases = [
        (TypeError, "'logits' has dtype int64", (torch.ones(4, 16, dtype=torch.long, device=DEVICE), 2), {}),
        (TypeError, "'logits' has dtype float64", (x.double(), 2), {}),
        (ValueError, "'logits' must be 2-d", (randn(2, 4, 16), 2), {}),
        (ValueError, "'logits' has 0 experts", (torch.empty(4, 0, device=DEVICE), 1), {}),
        (ValueError, f"'logits' has {MAX_EXPERTS + 1} experts .* at most {MAX_EXPERTS}",
         (randn(1, MAX_EXPERTS + 1), 2), {}),
        (ValueError, "'top_k' is 0; expected 1 <= top_k <= n_experts", (x, 0), {}),
        (ValueError, "'top_k' is 17; expected 1 <= top_k <= n_experts \\(16\\)", (x, 17), {}),
        (TypeError, "'top_k' must be an int", (x, 2.0), {}),
        (ValueError, "'score' is 'relu'", (x, 2), dict(score="relu")),
        (ValueError, "'n_group' is 3; expected a positive divisor", (x, 2), dict(n_group=3)),
        (ValueError, "'n_group' is 0", (x, 2), dict(n_group=0)),
        (ValueError, "'topk_group' is 5; expected 1 <= topk_group <= n_group \\(4\\)", (x, 2),
         dict(n_group=4, topk_group=5)),
        (ValueError, "'topk_group' is 0", (x, 2), dict(n_group=4, topk_group=0)),
        (ValueError, "'top_k' is 9 but only .* 8 experts remain", (x, 9), dict(n_group=4, topk_group=2)),
        (ValueError, "'group_score' is 'mean'", (x, 2), dict(n_group=4, topk_group=2, group_score="mean")),
        (TypeError, "'correction_bias' has dtype float16; expected float32", (x, 2),
         dict(correction_bias=torch.zeros(16, device=DEVICE, dtype=torch.float16))),
        (ValueError, "'correction_bias' has shape \\(15,\\); expected \\(16,\\)", (x, 2),
         dict(correction_bias=torch.zeros(15, device=DEVICE))),
        (TypeError, "'correction_bias' must be a torch.Tensor", (x, 2), dict(correction_bias=[0.0] * 16)),
        (ValueError, "'aux_loss_coef' is -1", (x, 2), dict(aux_loss_coef=-1.0)),
        (ValueError, "'aux_loss_coef' is inf", (x, 2), dict(aux_loss_coef=float("inf"))),   # >= 0 yet not finite
        (ValueError, "'aux_loss_coef' is nan", (x, 2), dict(aux_loss_coef=float("nan"))),
        (ValueError, "'routed_scaling_factor' is inf", (x, 2), dict(routed_scaling_factor=float("inf"))),
        (ValueError, "'routed_scaling_factor' is nan", (x, 2), dict(routed_scaling_factor=float("nan"))),
        (TypeError, "'renormalize' must be a bool", (x, 2), dict(renormalize=1)),
    ]
    for exc, msg, args, kw in cases:
        with pytest.raises(exc, match=msg):
            moe_route(*args, **kw)
    if DEVICE == "cuda":
        with pytest.raises(RuntimeError, match="'correction_bias' is on"):
            moe_route(x, 2, correction_bias=torch.zeros(16))
    else:
        with pytest.raises(RuntimeError, match="'correction_bias' is on meta but 'logits' is on cpu"):
            moe_route(x, 2, correction_bias=torch.zeros(16, device="meta"))


def test_update_bias():
    bias = torch.zeros(6, device=DEVICE)
    counts = torch.tensor([5, 1, 3, 3, 0, 6], device=DEVICE, dtype=torch.int32)   # mean 3
    out = moe_update_bias_(bias, counts, rate=0.5)
    assert out is bias
    assert bias.tolist() == [-0.5, 0.5, 0.0, 0.0, 0.5, -0.5]
    moe_update_bias_(bias, counts.long())                                  # default rate 1e-3
    assert torch.allclose(bias, torch.tensor([-0.501, 0.501, 0.0, 0.0, 0.501, -0.501], device=DEVICE))
    # the loop it is for: routing counts feed the bias, which then pulls load off the busy experts
    x = randn(64, 8)
    x[:, 0] += 3.0                                                          # expert 0 is everyone's favourite
    b = torch.zeros(8, device=DEVICE)
    before = moe_route(x, 2, correction_bias=b).counts
    for _ in range(8):
        moe_update_bias_(b, moe_route(x, 2, correction_bias=b).counts, rate=0.1)
    after = moe_route(x, 2, correction_bias=b).counts
    assert after.max() < before.max() and b[0] < 0
    with pytest.raises(TypeError, match="'correction_bias' has dtype float16; expected float32"):
        moe_update_bias_(torch.zeros(6, device=DEVICE, dtype=torch.float16), counts)
    with pytest.raises(ValueError, match="'correction_bias' must be 1-d"):
        moe_update_bias_(torch.zeros(2, 3, device=DEVICE), counts)
    with pytest.raises(ValueError, match="'counts' has shape \\(5,\\) but 'correction_bias' has \\(6,\\)"):
        moe_update_bias_(bias, counts[:5])
    with pytest.raises(TypeError, match="'counts' has dtype bool"):
        moe_update_bias_(bias, counts > 2)
    with pytest.raises(ValueError, match="'rate' is -0.1"):
        moe_update_bias_(bias, counts, rate=-0.1)
    other = "cpu" if DEVICE == "cuda" else "meta"                          # counts on another device than the bias
    with pytest.raises(RuntimeError, match=f"'counts' is on {other}.* but 'correction_bias' is on {DEVICE}"):
        moe_update_bias_(bias, counts.to(other))


def test_compile_dynamic_shapes():
    """torch.compile(dynamic=True, fullgraph=True) over two token counts with a scaling factor and
    the auxiliary loss: the float checks are comparisons (math.isfinite of a symbolic float broke
    the graph)."""
    torch._dynamo.reset()
    kw = dict(routed_scaling_factor=2.5, aux_loss_coef=0.01)
    f = torch.compile(lambda l: moe_route(l, 2, **kw), dynamic=True, fullgraph=True)
    for tokens in (5, 9):
        logits = randn(tokens, 8)
        got, want = f(logits), moe_route(logits, 2, **kw)
        assert torch.equal(got.ids, want.ids) and torch.equal(got.counts, want.counts)
        assert_close(got.weights, want.weights.double(), torch.float32)
        assert_close(got.aux_loss, want.aux_loss.double(), torch.float32)


def test_top_k_all_experts():
    """top_k = n_experts is legal (1 <= top_k <= E, not < E): every expert, in score order."""
    x = randn(9, 7, scale=2.0)
    r, _ = _check(x, 7, renormalize=True)
    assert (r.ids.sort(1).values == torch.arange(7, device=DEVICE)).all()
    assert torch.allclose(r.weights.sum(1), torch.ones(9, device=DEVICE))


def test_softmax_large_logits():
    """The softmax subtracts the row max: logits near 100 (exp overflows fp32) give the reference's
    finite weights and ids, not inf / inf = NaN."""
    _check(randn(6, 12) + 100.0, 3)


@pytest.mark.parametrize("kw", [dict(), dict(n_group=4, topk_group=2)], ids=["flat", "grouped"])
def test_negative_bias_with_padded_experts(kw):
    """A correction bias below every score (balancing drives biases negative): E = 48 pads to 64
    lanes (groups of 12 to 16), and a padding lane's choice score must stay -inf, not 0 + 0 = 0,
    which would outrank every real expert and group."""
    bias = randn(48, scale=0.01) - 2.0
    _check(randn(10, 48), 4, score="sigmoid", correction_bias=bias, **kw)


def test_minus_inf_bias_stays_in_kept_groups():
    """An expert switched off with a -inf bias ties with nothing outside the kept groups: when
    top_k needs every expert of the one kept group, the last pick is its -inf expert, never an
    expert of the dropped group."""
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0, 2.0, 1.5, 1.0, 0.5]], device=DEVICE)
    bias = torch.tensor([0.0] * 7 + [float("-inf")], device=DEVICE)
    for score in ("softmax", "sigmoid"):
        r, _ = _check(x, 4, score=score, n_group=2, topk_group=1, correction_bias=bias)
        assert r.ids.tolist() == [[4, 5, 6, 7]]


def test_renormalize_all_zero_scores():
    """A token whose sigmoid scores all underflow to 0 (logits -200) renormalises to
    0 / (0 + 1e-20) = 0, not 0 / 0 = NaN, in the weights and in their gradient."""
    x = randn(4, 16)
    x[2] = -200.0
    x.requires_grad_()
    kw = dict(score="sigmoid", renormalize=True, routed_scaling_factor=2.0)
    r, _ = _check(x.detach(), 3, **kw)
    assert (r.weights[2] == 0).all()
    w = moe_route(x, 3, **kw).weights
    (g,) = torch.autograd.grad(w, x, torch.randn(4, 3, device=DEVICE))
    assert torch.isfinite(g).all() and (g[2] == 0).all()


def test_aux_loss_float32_for_16bit_logits():
    """aux_loss is computed and returned in float32 whatever the logits' dtype."""
    for dtype in (torch.float16, torch.bfloat16):
        x = randn(20, 16, dtype=dtype)
        r = moe_route(x, 2, aux_loss_coef=0.1)
        ref = moe_route_reference(x.double(), 2, aux_loss_coef=0.1)
        assert torch.equal(r.ids, ref.ids)
        assert r.aux_loss.dtype == torch.float32
        assert_close(r.aux_loss, ref.aux_loss, torch.float32, what=str(dtype))


def test_update_bias_mean_parameter_and_rate():
    """The step compares each count with the MEAN, not the median: counts (1, 2, 9) have mean 4, so
    the first two rise and the third falls; a bias that requires grad (an nn.Parameter) is updated
    without recording history; an infinite rate is refused."""
    counts = torch.tensor([1, 2, 9], device=DEVICE, dtype=torch.int32)
    bias = torch.nn.Parameter(torch.zeros(3, device=DEVICE))
    moe_update_bias_(bias, counts, rate=0.25)
    assert bias.tolist() == [0.25, 0.25, -0.25]
    assert bias.grad_fn is None and bias.requires_grad
    with pytest.raises(ValueError, match="'rate' is inf"):
        moe_update_bias_(bias, counts, rate=float("inf"))
