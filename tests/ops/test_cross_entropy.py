"""cross_entropy and linear_cross_entropy: every reduction x every option, every dtype, the kernel
paths (split with one chunk, loop with several, the backward's chunked recompute), layouts, int32
targets, return_lse, non-finite logits, autograd (the gradient formed in the forward and the
per-token recompute of reduction="none"), torch.compile, opcheck, bad input, and GPU-sized rows.

Three independent truths, so that no shared mistake hides: ``_formula`` (the module header's
loss written out by hand in float64: logsumexp, gather, tanh -- no F.cross_entropy), PyTorch's
own ``F.cross_entropy`` in float64 for the options it has (weight, ignore_index, reduction,
label_smoothing), and the module's ``cross_entropy_reference``, itself checked against both.
Gradients come from float64 autograd through ``_formula`` (and through F.cross_entropy).

CPU shapes stay small (the interpreter runs a row in ~5-10 ms): T <= 40 tokens, V <= ~4500.
"""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    DEVICE,
    DTYPES,
    ON_GPU,
    assert_close,
    gpu_only,
    noncontig,
    randn,
    rel_err,
)

import warpforge as wf
import warpforge.ops.cross_entropy as ce
import warpforge.runtime.heuristics as heur
from warpforge.ops.cross_entropy import (
    ce_backward_op,
    cross_entropy_op,
    cross_entropy_reference,
    lce_backward_op,
    linear_cross_entropy_op,
)
from warpforge.runtime.heuristics import RowConfig

REDUCTIONS = ["none", "mean", "sum"]
RED_CODE = {"none": 0, "mean": 1, "sum": 2}
FP64_TOL = 1e-10          # two float64 computations of the same formula
# cross_entropy_reference computes in float32 off the CPU (its docstring), so there it agrees with
# the float64 formula to fp32 rounding only
REF_TOL = FP64_TOL if not ON_GPU else 2e-5


# ----------------------------------------------------------------------------------------------
# Truths
# ----------------------------------------------------------------------------------------------
def _formula(x, t, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
             softcap=None):
    """The header's loss, written out in float64 on x (T, V) (differentiable):
    x' = c tanh(x / c); per counted token (1-eps) w_y (lse - x'_y) + eps/V sum_j w_j (lse - x'_j)
    + z lse^2; mean = CE sum / sum of w_y over counted tokens + z sum / their number (0 where a
    divisor is 0)."""
    x = x.double()
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    v = x.shape[-1]
    w = torch.ones(v, dtype=torch.float64, device=x.device) if weight is None else weight.double()
    t = t.long()
    valid = t != ignore_index
    ts = torch.where(valid, t, torch.zeros_like(t))
    lse = torch.logsumexp(x, -1)
    nll = w[ts] * (lse - x.gather(1, ts[:, None]).squeeze(1))
    smooth = ((lse[:, None] - x) * w).sum(-1) / v
    cel = (1 - label_smoothing) * nll + (label_smoothing * smooth if label_smoothing else 0.0)
    zero = torch.zeros_like(lse)
    cel = torch.where(valid, cel, zero)
    zt = torch.where(valid, z_loss * lse * lse, zero)
    if reduction == "none":
        return cel + zt
    if reduction == "sum":
        return cel.sum() + zt.sum()
    den = torch.where(valid, w[ts], zero).sum()
    cnt = valid.sum()
    return (cel.sum() / den if den > 0 else cel.sum() * 0) + (zt.sum() / cnt if cnt > 0 else zt.sum() * 0)


def _leaf(t):
    return None if t is None else t.detach().double().requires_grad_()


def _upstream(loss, reduction, dtype=None):
    """A non-unit upstream gradient: a random one per token for "none" (every other element of a
    buffer twice as long where the loss is 1-d: the backward must honour its stride), 1.7 for a
    scalar."""
    dtype = dtype or loss.dtype
    if reduction == "none":
        if loss.dim() == 1:
            return torch.randn(2 * loss.shape[0], device=loss.device).to(dtype)[::2]
        return torch.randn(loss.shape, device=loss.device).to(dtype)
    return torch.tensor(1.7, device=loss.device, dtype=dtype)


# Option sets of the main matrix. V = 131 (split path, one 256-wide chunk, masked tail).
T_, V_ = 10, 131
CASES = {
    "plain": {},
    "weight": {"weight": True},
    "ignore_some": {"ignore": "some"},
    "ignore_all": {"ignore": "all"},
    "smoothing": {"label_smoothing": 0.15},
    "z_loss": {"z_loss": 0.05},                 # z lse^2 ~ 0.05 * 5.5^2 ~ 1.5 against CE ~ 5: visible
    "softcap": {"softcap": 2.5},                # logits ~ N(0, 3): tanh saturates, visible
    "all": {"weight": True, "ignore": "some", "ignore_index": 5, "label_smoothing": 0.2, "z_loss": 0.05, "softcap": 4.0},
}


def _inputs(case, t, v, dtype=torch.float32, scale=3.0, requires_grad=True):
    """Logits, targets (hitting class 0 and V-1) and the keyword options of ``case``."""
    opts = dict(CASES[case]) if isinstance(case, str) else dict(case)
    x = randn(t, v, dtype=dtype, requires_grad=requires_grad, scale=scale)
    tgt = torch.randint(0, v, (t,), device=DEVICE)
    tgt[0], tgt[-1] = v - 1, 0
    ii = opts.pop("ignore_index", -100)
    ignore = opts.pop("ignore", None)
    if ignore == "some":
        tgt[1::3] = ii                            # every third token, including the middle ones
    elif ignore == "all":
        tgt[:] = ii
    if opts.pop("weight", False):
        opts["weight"] = torch.rand(v, device=DEVICE) * 2 + 0.1     # positive, far from uniform
    return x, tgt, dict(opts, ignore_index=ii)


def _torch_ok(opts):
    """Whether PyTorch's cross_entropy computes the same thing (it has no z_loss or softcap, and
    its mean over zero counted tokens is NaN where ours is 0)."""
    return not opts.get("z_loss") and not opts.get("softcap")


def _check(x, tgt, opts, reduction, dtype, what=""):
    """Forward and backward (non-unit upstream gradient) against _formula, F.cross_entropy and
    cross_entropy_reference."""
    loss = wf.cross_entropy(x, tgt, reduction=reduction, **opts)
    assert loss.dtype == dtype and loss.shape == ((x.shape[0],) if reduction == "none" else ())
    xr = _leaf(x)
    ref = _formula(xr, tgt, reduction=reduction, **opts)
    assert_close(loss, ref, dtype, what=f"{what} forward vs formula")
    refm = cross_entropy_reference(x.detach(), tgt.long(), reduction=reduction, **opts)
    assert refm.dtype == dtype
    assert rel_err(cross_entropy_reference(xr.detach(), tgt.long(), reduction=reduction, **opts), ref) <= REF_TOL, \
        "cross_entropy_reference disagrees with the written-out formula"
    g = _upstream(loss, reduction)
    loss.backward(g)
    ref.backward(g.double())
    assert x.grad is not None and x.grad.dtype == dtype
    assert_close(x.grad, xr.grad, dtype, scale=2.0, what=f"{what} backward vs formula")
    all_ignored = bool((tgt == opts["ignore_index"]).all())
    if _torch_ok(opts) and not (all_ignored and reduction == "mean"):
        xt = _leaf(x)
        w = opts.get("weight")
        tl_ = F.cross_entropy(xt, tgt.long(), weight=None if w is None else w.double(),
                              ignore_index=opts["ignore_index"], reduction=reduction,
                              label_smoothing=opts.get("label_smoothing", 0.0))
        assert rel_err(tl_, ref) <= FP64_TOL, "the written-out formula disagrees with F.cross_entropy"
        assert_close(loss, tl_, dtype, what=f"{what} forward vs torch")
        tl_.backward(g.double())
        assert_close(x.grad, xt.grad, dtype, scale=2.0, what=f"{what} backward vs torch")
    return loss


# ----------------------------------------------------------------------------------------------
# The matrix: every reduction x every option set (fp32), forward and backward
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_options(reduction, case):
    x, tgt, opts = _inputs(case, T_, V_)
    loss = _check(x, tgt, opts, reduction, torch.float32, what=case)
    if case == "ignore_all":
        # every token ignored: 0 (PyTorch's mean is NaN here: a deliberate difference) and zero gradients
        assert torch.equal(loss, torch.zeros_like(loss))
        assert torch.equal(x.grad, torch.zeros_like(x.grad))
        if reduction == "mean":
            assert torch.isnan(F.cross_entropy(x.detach().double(), tgt, reduction="mean"))
    if CASES[case].get("ignore") == "some":
        ignored = tgt == opts["ignore_index"]
        assert ignored.any() and torch.equal(x.grad[ignored], torch.zeros_like(x.grad[ignored]))
        if reduction == "none":
            assert torch.equal(loss[ignored], torch.zeros_like(loss[ignored]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype, reduction):
    """Every dtype, all options at once, on the loop path (V = 1100 > 1024: two pieces, the second
    76 wide) under the interpreter; the split path on the GPU."""
    t, v = (7, 1100) if not ON_GPU else (77, 32001)
    x, tgt, opts = _inputs("all", t, v, dtype=dtype)
    tgt[2] = v - 1 - 30                                       # a target in the ragged last piece
    _check(x, tgt, opts, reduction, dtype, what=str(dtype))
    x2, tgt2, opts2 = _inputs("plain", t, v, dtype=dtype)
    _check(x2, tgt2, opts2, reduction, dtype, what=f"{dtype} plain")


def test_unit_upstream_gradient():
    """``loss.backward()``: the in-place scale returns at once for a gradient of exactly 1."""
    x, tgt, opts = _inputs("all", 9, 37)
    wf.cross_entropy(x, tgt, **opts).backward()
    xr = _leaf(x)
    _formula(xr, tgt, **opts).backward()
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0)
    # and twice the loss, through autograd's sum of upstream gradients
    x.grad = None
    loss = wf.cross_entropy(x, tgt, reduction="sum", **opts)
    (loss * 0.5 + loss * 2.5).backward()
    xr.grad = None
    (_formula(xr, tgt, reduction="sum", **opts) * 3.0).backward()
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0)
    # reduction="none" summed: the recompute gets a stride-0 (expanded) upstream gradient
    x.grad = xr.grad = None
    wf.cross_entropy(x, tgt, reduction="none", **opts).sum().backward()
    _formula(xr, tgt, reduction="sum", **opts).backward()
    assert_close(x.grad, xr.grad, torch.float32, scale=2.0, what="sum of none")


# ----------------------------------------------------------------------------------------------
# Kernel paths
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_ce_config():
    heur.ce_config.cache_clear()
    yield heur.ce_config
    heur.ce_config.cache_clear()


def test_config_heuristic(fresh_ce_config):
    if ON_GPU:
        cfg = heur.ce_config(128256)
        assert cfg.mode == "split" and cfg.block_n == 8192 and cfg.chunks == 16, cfg
        cfg = heur.ce_config(32000)
        assert cfg.mode == "split" and cfg.block_n == 4096 and cfg.chunks == 8, cfg
    else:
        assert heur.ce_config(1024) == RowConfig("split", 1024, 1, 4, 1)
        assert heur.ce_config(131) == RowConfig("split", 256, 1, 4, 1)
        assert heur.ce_config(1025).mode == "loop" and heur.ce_config(1025).block_n == 1024


PATHS = {                                               # (CONFIG_OVERRIDE, V, piece width)
    "split_1chunk": (None, 131, 256),
    "loop_default_ragged": (None, 1025, 1024),          # 1024 + a last piece of one column
    "loop_forced": (RowConfig("loop", 32, 1, 4), 131, 32),   # 5 pieces, the last 3 wide
    "split_forced_wide": (RowConfig("split", 512, 1, 4, 1), 131, 512),
}


@pytest.mark.parametrize("reduction", ["none", "mean"])        # (sum: in test_options and test_dtypes)
@pytest.mark.parametrize("path", list(PATHS))
def test_paths(path, reduction, monkeypatch):
    cfg, v, piece = PATHS[path]
    monkeypatch.setattr(ce, "CONFIG_OVERRIDE", cfg)
    x, tgt, opts = _inputs("all", 8, v)
    tgt[2], tgt[3], tgt[4] = v - 1, piece % v, piece % v - 1   # the last column; either side of a piece edge
    _check(x, tgt, opts, reduction, torch.float32, what=path)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_many_chunks(reduction, monkeypatch, fresh_ce_config):
    """The heuristic itself with small pieces: CE_LOOP_BLOCK = 64 makes V = 300 a 5-piece loop under
    the interpreter; CE_CHUNK = 64 makes it a 5-chunk split (the cross-program exchange) on the GPU."""
    monkeypatch.setattr(heur, "CE_LOOP_BLOCK", 64)
    monkeypatch.setattr(heur, "CE_CHUNK", 64)
    heur.ce_config.cache_clear()
    cfg = heur.ce_config(300)
    assert cfg.block_n == 64 and (cfg.mode == "split" and cfg.chunks == 5 if ON_GPU else cfg.mode == "loop"), cfg
    x, tgt, opts = _inputs("all", 11, 300)
    tgt[2], tgt[3], tgt[4], tgt[6] = 63, 64, 256, 299
    _check(x, tgt, opts, reduction, torch.float32, what="5 chunks")


def test_stats_path_many_chunks(monkeypatch):
    """The forward without a gradient on the split path (reduction="none", or no_grad) is the
    statistics kernel, one program a (row, chunk), then the combine kernel over the chunks. Under
    the interpreter a row is otherwise always one chunk; STATS_LAUNCH = (32, 4) makes V = 131 five
    chunks (the last 3 wide), so the combine's rescale of each chunk's sum to the row max, and the
    target's share taken only in the chunk that owns it (targets either side of chunk edges, and
    a soft cap, under which a non-owning chunk's masked target logit is -inf), are checked off the
    GPU too."""
    monkeypatch.setattr(ce, "STATS_LAUNCH", (32, 4))
    x, tgt, opts = _inputs("all", 10, 131, requires_grad=False)
    tgt[2], tgt[3], tgt[4], tgt[6], tgt[8] = 31, 32, 128, 63, 130
    x[5, 96:128] += 8.0                   # one chunk's max well above the others'
    capped = 4.0 * torch.tanh(x.double() / 4.0)
    with torch.no_grad():
        for red in REDUCTIONS:
            loss, lse = wf.cross_entropy(x, tgt, reduction=red, return_lse=True, **opts)
            assert_close(loss, _formula(x, tgt, reduction=red, **opts), torch.float32, what=f"5 stats chunks {red}")
            assert_close(lse, torch.logsumexp(capped, -1), torch.float32, what=f"5 stats chunks lse {red}")


@pytest.mark.parametrize("path", ["split_1chunk", "loop_forced"])
def test_large_logits(path, monkeypatch):
    """Rows shifted by +-200, far outside exp's fp32 range (exp(200) is inf, exp(-200) is 0): loss
    and gradient are shift-invariant, so they match the float64 formula and PyTorch only where
    every kernel subtracts the row max before exp -- the forward with the gradient formed in it
    ("mean"), and the statistics forward and the recompute from the saved lse ("none")."""
    cfg, v, _piece = PATHS[path]
    monkeypatch.setattr(ce, "CONFIG_OVERRIDE", cfg)
    shift = torch.tensor([200.0, -200.0, 0.0, 200.0, -200.0, 120.0, -120.0], device=DEVICE)
    for reduction in ("mean", "none"):
        x, tgt, opts = _inputs({"weight": True, "ignore": "some", "label_smoothing": 0.1}, 7, v,
                               requires_grad=False)
        x = (x + shift[:, None]).requires_grad_()
        _check(x, tgt, opts, reduction, torch.float32, what=f"{path} shifted by 200")


def test_backward_recompute_chunks():
    """reduction="none" recomputes the gradient in (row, 4096-column) programs: V = 4500 takes two
    a row, the second ragged."""
    x, tgt, opts = _inputs("all", 3, 4500)
    tgt[0], tgt[2] = 4499, 4096
    _check(x, tgt, opts, "none", torch.float32, what="V=4500")


def test_second_backward():
    """The gradient formed in the forward is scaled in place by the first backward, so a second
    one through the same graph must raise, not return a wrong gradient; reduction="none"
    recomputes, so there a second backward is fine."""
    x, tgt, opts = _inputs("all", 6, 37)
    loss = wf.cross_entropy(x, tgt, **opts)
    loss.backward(torch.tensor(2.0, device=DEVICE), retain_graph=True)
    first = x.grad.clone()
    with pytest.raises(RuntimeError, match="second backward through the same graph"):
        loss.backward(torch.tensor(2.0, device=DEVICE))
    xr = _leaf(x)
    (_formula(xr, tgt, **opts) * 2).backward()
    assert_close(first, xr.grad, torch.float32, scale=2.0, what="first backward")

    x.grad = None
    loss = wf.cross_entropy(x, tgt, reduction="none", **opts)
    g = randn(6)
    loss.backward(g, retain_graph=True)
    once = x.grad.clone()
    loss.backward(g)
    assert_close(x.grad, 2 * once, torch.float32, what="second backward, reduction=none")


def test_second_backward_dispatcher_door(monkeypatch):
    """Through the registered operator (not the eager fast path) the saved gradient is scaled out of
    place, so a second backward gives the same gradient again."""
    monkeypatch.setattr(ce, "FAST_EAGER", False)
    monkeypatch.setattr("warpforge.runtime.registry.FAST_EAGER", False)
    x, tgt, opts = _inputs("all", 6, 37)
    loss = wf.cross_entropy(x, tgt, **opts)
    loss.backward(torch.tensor(1.5, device=DEVICE), retain_graph=True)
    once = x.grad.clone()
    loss.backward(torch.tensor(1.5, device=DEVICE))
    xr = _leaf(x)
    (_formula(xr, tgt, **opts) * 1.5).backward()
    assert_close(once, xr.grad, torch.float32, scale=2.0)
    assert_close(x.grad, 2 * xr.grad, torch.float32, scale=2.0)


# ----------------------------------------------------------------------------------------------
# Layouts and targets
# ----------------------------------------------------------------------------------------------
def _vs_torch(x, tgt, reduction, weight=None, ignore_index=-100, label_smoothing=0.0, what=""):
    """Our loss and gradient on any layout PyTorch takes, against PyTorch in float64."""
    loss = wf.cross_entropy(x, tgt, weight, ignore_index, reduction, label_smoothing)
    xr = _leaf(x)
    ref = F.cross_entropy(xr, tgt.long(), None if weight is None else weight.double(), ignore_index=ignore_index,
                          reduction=reduction, label_smoothing=label_smoothing)
    assert loss.shape == ref.shape, what
    assert_close(loss, ref, x.dtype, what=f"{what} forward")
    g = _upstream(loss, reduction, torch.float32)
    loss.backward(g)
    ref.backward(g.double())
    assert x.grad.shape == x.shape
    assert_close(x.grad, xr.grad, x.dtype, scale=2.0, what=f"{what} backward")


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_layouts(reduction):
    w = torch.rand(37, device=DEVICE) + 0.5
    # (C,): one token, target 0-d
    _vs_torch(randn(37, requires_grad=True), torch.tensor(36, device=DEVICE), reduction, w, what="1-d")
    # (N, C, d1) and (N, C, d1, d2): class dim 1
    t3 = torch.randint(0, 37, (3, 5), device=DEVICE)
    t3[1, 2] = -100
    _vs_torch(randn(3, 37, 5, requires_grad=True), t3, reduction, w, label_smoothing=0.1, what="(N,C,d1)")
    _vs_torch(randn(2, 37, 3, 2, requires_grad=True), torch.randint(0, 37, (2, 3, 2), device=DEVICE), reduction,
              what="(N,C,d1,d2)")
    # strided rows, read in place
    _vs_torch(noncontig(randn(9, 37, requires_grad=True)), torch.randint(0, 37, (9,), device=DEVICE), reduction,
              w, what="strided rows")
    # a transposed view: class stride 9, copied
    xt = randn(37, 9).t().requires_grad_()
    assert xt.stride(1) != 1
    _vs_torch(xt, torch.randint(0, 37, (9,), device=DEVICE), reduction, w, what="transposed")
    # an expanded row: row stride 0
    xe = randn(1, 37).expand(6, 37).requires_grad_()
    _vs_torch(xe, torch.randint(0, 37, (6,), device=DEVICE), reduction, what="row stride 0")


def test_strided_target():
    tgt = torch.randint(0, 37, (18,), device=DEVICE)[::2]
    assert tgt.stride(0) == 2
    _vs_torch(randn(9, 37, requires_grad=True), tgt, "mean", label_smoothing=0.1, what="strided target")
    _vs_torch(randn(9, 37, requires_grad=True), tgt, "none", what="strided target, none")


def test_strided_class_weight():
    """A class weight with stride 2 (a column of a (V, 2) buffer): PyTorch takes it, so must we
    (copied, or read with its stride), in cross_entropy and as linear_cross_entropy's ce_weight."""
    w = (torch.rand(37, 2, device=DEVICE) + 0.5)[:, 1]
    assert w.stride(0) == 2
    tgt = torch.randint(0, 37, (9,), device=DEVICE)
    _vs_torch(randn(9, 37, requires_grad=True), tgt, "mean", w, label_smoothing=0.1, what="strided weight")
    _vs_torch(randn(9, 37, requires_grad=True), tgt, "none", w, what="strided weight, none")
    h, wt = randn(9, 8, requires_grad=True), randn(37, 8, requires_grad=True)
    _check_lce(h, wt, None, tgt, {"ce_weight": w}, "sum", torch.float32, 4, what="strided ce_weight")


def test_class_weight_dtype():
    """bf16 logits with an fp32 class weight (and the reverse): the weight is read as fp32."""
    x, tgt, opts = _inputs("weight", 9, 37, dtype=torch.bfloat16)
    _check(x, tgt, opts, "mean", torch.bfloat16, what="fp32 weight")
    x, tgt, opts = _inputs("weight", 9, 37)
    opts["weight"] = opts["weight"].bfloat16()
    _check(x, tgt, opts, "sum", torch.float32, what="bf16 weight")


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_int32_targets(reduction):
    x, tgt, opts = _inputs({"weight": True, "ignore": "some", "ignore_index": -1, "label_smoothing": 0.1}, 10, 37)
    l64 = wf.cross_entropy(x, tgt, reduction=reduction, **opts)
    x.grad = None
    _check(x, tgt.int(), opts, reduction, torch.float32, what="int32")
    # int32 and int64 targets give the same bits, on the path with a gradient and on the one without
    assert torch.equal(wf.cross_entropy(x, tgt.int(), reduction=reduction, **opts).detach(), l64.detach())
    assert torch.equal(wf.cross_entropy(x.detach(), tgt.int(), reduction=reduction, **opts),
                       wf.cross_entropy(x.detach(), tgt, reduction=reduction, **opts))


def test_ignore_index_inside_the_vocabulary():
    """ignore_index = 3, a real class: its tokens are skipped, other tokens are scored against it."""
    x = randn(8, 11, requires_grad=True)
    tgt = torch.tensor([3, 0, 3, 10, 5, 3, 1, 2], device=DEVICE)
    _vs_torch(x, tgt, "mean", ignore_index=3, label_smoothing=0.2, what="ignore_index=3")


def test_return_lse():
    x = randn(3, 37, 5, scale=3.0, requires_grad=True)
    tgt = torch.randint(0, 37, (3, 5), device=DEVICE)
    tgt[0, 0] = -100
    loss, lse = wf.cross_entropy(x, tgt, reduction="none", return_lse=True)
    assert lse.shape == tgt.shape and lse.dtype == torch.float32 and not lse.requires_grad
    assert_close(lse, torch.logsumexp(x.detach().double(), 1), torch.float32, what="lse")
    assert loss.requires_grad and torch.equal(loss, wf.cross_entropy(x, tgt, reduction="none"))
    loss2, lse2 = wf.cross_entropy(x, tgt, softcap=2.0, z_loss=0.1, return_lse=True)
    assert loss2.shape == ()
    assert_close(lse2, torch.logsumexp(2.0 * torch.tanh(x.detach().double() / 2.0), 1), torch.float32,
                 what="lse of the capped logits")
    xb = randn(9, 130, dtype=torch.bfloat16, scale=3.0)
    _, lse3 = wf.cross_entropy(xb, torch.randint(0, 130, (9,), device=DEVICE), return_lse=True)
    assert lse3.dtype == torch.float32
    assert_close(lse3, torch.logsumexp(xb.double(), -1), torch.float32, what="lse of bf16 logits")


def test_empty_and_single_class():
    x = randn(0, 7, requires_grad=True)
    tgt = torch.empty(0, dtype=torch.long, device=DEVICE)
    for red in REDUCTIONS:
        loss = wf.cross_entropy(x, tgt, reduction=red)
        assert loss.shape == ((0,) if red == "none" else ()), red
        if red != "none":
            assert loss.item() == 0.0
    wf.cross_entropy(x, tgt, reduction="sum").backward()
    assert x.grad.shape == (0, 7)
    one = randn(4, 1, requires_grad=True)                # V = 1: log-softmax is 0, so is the loss
    loss = wf.cross_entropy(one, torch.zeros(4, dtype=torch.long, device=DEVICE), reduction="none")
    assert torch.equal(loss.detach(), torch.zeros(4, device=DEVICE))


# ----------------------------------------------------------------------------------------------
# Non-finite logits
# ----------------------------------------------------------------------------------------------
def test_nan_row():
    x = randn(6, 37)
    x[2, 5] = float("nan")
    x.requires_grad_()
    tgt = torch.randint(0, 37, (6,), device=DEVICE)
    loss = wf.cross_entropy(x, tgt, reduction="none")
    assert torch.isnan(loss[2]) and torch.isfinite(loss[torch.arange(6, device=DEVICE) != 2]).all()
    _vs_torch(x, tgt, "none", what="NaN row")            # finite rows' loss and gradient match torch
    x.grad = None
    mean = wf.cross_entropy(x, tgt)
    assert torch.isnan(mean)
    mean.backward()
    assert torch.isnan(x.grad[2]).all() and torch.isfinite(x.grad[torch.arange(6, device=DEVICE) != 2]).all()


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_infinities(reduction):
    """-inf entries are classes of probability 0 (a -inf target logit: an infinite loss); +inf in a
    row makes it NaN, as in PyTorch; a row of nothing but -inf is NaN."""
    x = randn(5, 37)
    x[0, :20] = -float("inf")                 # masked classes, target elsewhere
    x[1, 7] = -float("inf")                   # the target's logit
    x[3, 9] = float("inf")
    x[4, :] = -float("inf")
    tgt = torch.tensor([30, 7, 2, 4, 1], device=DEVICE)
    loss = wf.cross_entropy(x, tgt, reduction="none")
    ref = F.cross_entropy(x.double(), tgt, reduction="none")
    assert torch.isfinite(loss[0]) and loss[1] == float("inf") and torch.isnan(loss[3]) and torch.isnan(loss[4])
    assert torch.isinf(ref[1]) and torch.isnan(ref[3]) and torch.isnan(ref[4])
    assert_close(loss, ref, torch.float32, what="infinities")
    keep = torch.tensor([0, 2], device=DEVICE)            # rows whose gradient is finite
    xk = x[keep].clone().requires_grad_()
    _vs_torch(xk, tgt[keep], reduction, what="-inf masked classes")
    assert torch.equal(xk.grad[0, :20], torch.zeros(20, device=DEVICE))
    # label smoothing counts every class, so a -inf logit makes the loss infinite, as in PyTorch
    ls = wf.cross_entropy(x[:3], tgt[:3], label_smoothing=0.1, reduction="none")
    assert torch.isinf(ls[0]) and torch.isinf(ls[1]) and torch.isfinite(ls[2])
    assert_close(ls, F.cross_entropy(x[:3].double(), tgt[:3], label_smoothing=0.1, reduction="none"), torch.float32)
    # a soft cap maps -inf to -cap: finite again
    xc = x[:3].clone().requires_grad_()
    _check(xc, tgt[:3], {"ignore_index": -100, "softcap": 2.0}, reduction, torch.float32, what="-inf capped")


# ----------------------------------------------------------------------------------------------
# torch.compile and opcheck
# ----------------------------------------------------------------------------------------------
def test_compile_fullgraph():
    """torch.compile(fullgraph=True), forward and backward, against eager and the float64 formula.
    First cross_entropy with both gradient routes in one graph (the gradient formed in the forward
    for "mean", the recompute for "none") and the fused linear form with every gradient; then the
    linear form where the forward returns no gradients ("none") or only some (a frozen head, no
    bias). One test, so that CPU CI pays for inductor's warm-up once."""
    x, tgt, opts = _inputs("all", 7, 37)
    h, w = randn(7, 16, requires_grad=True), randn(37, 16, requires_grad=True)
    gn = randn(7)

    def f(x, h, w):
        a = wf.cross_entropy(x, tgt, **opts)
        b = wf.cross_entropy(x, tgt, reduction="none", label_smoothing=0.1)
        c = wf.linear_cross_entropy(h, w, tgt, torch.zeros(37, device=DEVICE), z_loss=0.01, chunk_size=3)
        return a * 1.5 + (b * gn).sum() + c * 0.5

    out = torch.compile(f, fullgraph=True)(x, h, w)
    out.backward()
    grads = [t.grad.clone() for t in (x, h, w)]
    for t in (x, h, w):
        t.grad = None
    eager = f(x, h, w)
    eager.backward()
    assert_close(out, eager, torch.float32, what="compiled vs eager forward")
    for name, gc, t in zip("xhw", grads, (x, h, w)):
        assert_close(gc, t.grad, torch.float32, what=f"compiled vs eager d{name}")
    xr, hr, wr = _leaf(x), _leaf(h), _leaf(w)
    ref = (_formula(xr, tgt, **opts) * 1.5 + (_formula(xr, tgt, reduction="none", label_smoothing=0.1)
                                               * gn.double()).sum()
           + _formula(hr @ wr.T, tgt, z_loss=0.01) * 0.5)
    ref.backward()
    assert_close(out, ref, torch.float32, what="compiled forward")
    for name, gc, r in zip("xhw", grads, (xr, hr, wr)):
        assert_close(gc, r.grad, torch.float32, scale=2.0, what=f"compiled d{name}")

    # the linear form without some of its gradient outputs
    for t in (h, w):
        t.grad = None
    w_frozen = w.detach()

    def g(h, w):
        return (wf.linear_cross_entropy(h, w, tgt, reduction="none") * gn).sum() \
            + wf.linear_cross_entropy(h, w_frozen, tgt, z_loss=0.01, chunk_size=3)

    out = torch.compile(g, fullgraph=True)(h, w)
    out.backward()
    hr, wr = _leaf(h), _leaf(w)
    ref = (_formula(hr @ wr.T, tgt, reduction="none") * gn.double()).sum() \
        + _formula(hr @ w_frozen.double().T, tgt, z_loss=0.01)
    ref.backward()
    assert_close(out, ref, torch.float32, what="compiled linear forward")
    assert_close(h.grad, hr.grad, torch.float32, scale=2.0, what="compiled linear dhidden")
    assert_close(w.grad, wr.grad, torch.float32, scale=2.0, what="compiled linear dweight")


def test_opcheck():
    x, tgt, _ = _inputs("ignore_some", 6, 37)
    w = torch.rand(37, device=DEVICE) + 0.5
    torch.library.opcheck(cross_entropy_op.overload, (x, tgt, w, -100, 1, 0.1, 0.01, 3.0, True))
    torch.library.opcheck(cross_entropy_op.overload, (x, tgt.int(), None, -100, 0, 0.0, 0.0, 0.0, False))
    lse = torch.logsumexp(x.detach(), -1)
    torch.library.opcheck(ce_backward_op.overload, (x.detach(), tgt, w, lse, randn(6), -100, 0, 0.1, 0.01, 3.0))


def test_opcheck_linear():
    """The fused operator with every gradient formed in the forward, then with some or none of them
    (reduction="none"; a frozen head without bias): absent gradients are empty outputs, which must
    not alias one another; and its backward operator."""
    _, tgt, _ = _inputs("ignore_some", 6, 37)
    w = torch.rand(37, device=DEVICE) + 0.5
    h, wt, b = randn(6, 8, requires_grad=True), randn(37, 8, requires_grad=True), randn(37, requires_grad=True)
    torch.library.opcheck(linear_cross_entropy_op.overload,
                          (h, wt, tgt, b, w, -100, 1, 0.1, 0.01, 3.0, 4, True, True, True))
    torch.library.opcheck(linear_cross_entropy_op.overload,
                          (h, wt, tgt, b, w, -100, 0, 0.1, 0.01, 3.0, 4, True, True, True))
    torch.library.opcheck(linear_cross_entropy_op.overload,
                          (h, wt, tgt, None, None, -100, 1, 0.0, 0.0, 0.0, 0, True, False, False))
    hd, wd, bd = h.detach(), wt.detach(), b.detach()
    lse = torch.logsumexp(3.0 * torch.tanh((hd @ wd.T + bd) / 3.0), -1)
    torch.library.opcheck(lce_backward_op.overload, (hd, wd, tgt, bd, w, lse, randn(6), -100, 0, 0.1, 0.01, 3.0, 4,
                                                     True, True, True))
    torch.library.opcheck(lce_backward_op.overload, (hd, wd, tgt, None, None, lse, randn(6), -100, 0, 0.0, 0.0, 0.0,
                                                     0, True, False, False))


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------
def test_bad_input():
    x, tgt = randn(5, 7), torch.randint(0, 7, (5,), device=DEVICE)
    with pytest.raises(TypeError, match="'target' has dtype torch.float32; expected class indices"):
        wf.cross_entropy(x, tgt.float())
    with pytest.raises(TypeError, match="'target' has dtype torch.int16; expected int64 or int32"):
        wf.cross_entropy(x, tgt.to(torch.int16))
    with pytest.raises(ValueError, match=r"'target' has shape \(4,\); expected \(5,\)"):
        wf.cross_entropy(x, tgt[:4])
    with pytest.raises(ValueError, match=r"'target' has shape \(5, 1\); expected \(5,\)"):
        wf.cross_entropy(x, tgt[:, None])
    with pytest.raises(TypeError, match="'target' must be a torch.Tensor"):
        wf.cross_entropy(x, [0, 1, 2, 3, 4])
    with pytest.raises(TypeError, match="'input' has dtype int64"):
        wf.cross_entropy(tgt[:, None].expand(5, 7).contiguous(), tgt)
    with pytest.raises(ValueError, match=r"'weight' has shape \(6,\); expected \(7,\)"):
        wf.cross_entropy(x, tgt, torch.ones(6, device=DEVICE))
    with pytest.raises(ValueError, match=r"'weight' has shape \(1, 7\); expected \(7,\)"):
        wf.cross_entropy(x, tgt, torch.ones(1, 7, device=DEVICE))
    with pytest.raises(ValueError, match="'reduction' is 'avg'; expected one of 'none', 'mean', 'sum'"):
        wf.cross_entropy(x, tgt, reduction="avg")
    with pytest.raises(ValueError, match="'label_smoothing' is 1.5; expected a value in"):
        wf.cross_entropy(x, tgt, label_smoothing=1.5)
    with pytest.raises(ValueError, match="'label_smoothing' is -0.1"):
        wf.cross_entropy(x, tgt, label_smoothing=-0.1)
    with pytest.raises(ValueError, match="'z_loss' is -0.1; expected a finite value >= 0"):
        wf.cross_entropy(x, tgt, z_loss=-0.1)
    with pytest.raises(ValueError, match="'z_loss' is nan"):
        wf.cross_entropy(x, tgt, z_loss=float("nan"))
    with pytest.raises(ValueError, match="'softcap' is 0; expected None or a finite value > 0"):
        wf.cross_entropy(x, tgt, softcap=0)
    with pytest.raises(ValueError, match="'softcap' is -3.0"):
        wf.cross_entropy(x, tgt, softcap=-3.0)
    with pytest.raises(TypeError, match="'ignore_index' must be an int, got float"):
        wf.cross_entropy(x, tgt, ignore_index=-100.0)

    h, w = randn(5, 8), randn(7, 8)
    with pytest.raises(ValueError, match=r"'hidden' has shape \(5, 8\) and 'weight' has shape \(7, 9\)"):
        wf.linear_cross_entropy(h, randn(7, 9), tgt)
    with pytest.raises(TypeError, match="'hidden' has dtype torch.float32 but 'weight' has torch.bfloat16"):
        wf.linear_cross_entropy(h, w.bfloat16(), tgt)
    with pytest.raises(ValueError, match="'weight' must have at least 2 dimension"):
        wf.linear_cross_entropy(h, randn(8), tgt)
    with pytest.raises(ValueError, match=r"'weight' has shape \(2, 7, 8\); expected \(V, H\)"):
        wf.linear_cross_entropy(h, randn(2, 7, 8), tgt)
    with pytest.raises(ValueError, match=r"'bias' has shape \(6,\).*expected \(7,\)"):
        wf.linear_cross_entropy(h, w, tgt, randn(6))
    with pytest.raises(ValueError, match="'bias' has shape .*dtype torch.bfloat16"):
        wf.linear_cross_entropy(h, w, tgt, randn(7, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="'chunk_size' is 0; expected None or a positive int"):
        wf.linear_cross_entropy(h, w, tgt, chunk_size=0)
    with pytest.raises(ValueError, match="'chunk_size' is 2.5"):
        wf.linear_cross_entropy(h, w, tgt, chunk_size=2.5)
    with pytest.raises(ValueError, match=r"'target' has shape \(5,\); expected \(2, 3\)"):
        wf.linear_cross_entropy(randn(2, 3, 8), w, tgt)
    with pytest.raises(ValueError, match=r"'ce_weight' has shape \(6,\); expected \(7,\)"):
        wf.linear_cross_entropy(h, w, tgt, ce_weight=torch.ones(6, device=DEVICE))
    with pytest.raises(ValueError, match="'reduction' is 'max'"):
        wf.linear_cross_entropy(h, w, tgt, reduction="max")


@pytest.mark.skipif(ON_GPU, reason="on the GPU a bad target is a device-side assertion (test_device_assertion)")
def test_out_of_range_target():
    x = randn(5, 7, requires_grad=True)
    for bad in (7, -5, 100):
        tgt = torch.tensor([0, bad, 3, -100, 6], device=DEVICE)
        for red in REDUCTIONS:
            with pytest.raises(ValueError, match=rf"'target' holds 1 class index\(es\) outside \[0, 7\) that are not "
                                                 rf"ignore_index \(-100\), e.g. {bad}"):
                wf.cross_entropy(x, tgt, reduction=red)
    with pytest.raises(ValueError, match=r"'target' holds 2 class index\(es\) outside \[0, 7\)"):
        wf.cross_entropy(x, torch.tensor([0, 7, 3, -100, 2], device=DEVICE).int(), ignore_index=3)
    with pytest.raises(ValueError, match=r"'target' holds 1 class index\(es\) outside \[0, 7\)"):
        wf.linear_cross_entropy(randn(5, 8), randn(7, 8), torch.tensor([0, 1, 2, 3, 7], device=DEVICE))


# ----------------------------------------------------------------------------------------------
# linear_cross_entropy
# ----------------------------------------------------------------------------------------------
LCE_CASES = {
    "plain": {},
    "bias": {"bias": True},
    "ce_weight_ignore": {"ce_weight": True, "ignore": True},
    "all": {"bias": True, "ce_weight": True, "ignore": True, "label_smoothing": 0.1, "z_loss": 0.02, "softcap": 6.0},
}


def _lce_inputs(case, t, hdim, v, dtype=torch.float32, lead=None):
    o = dict(LCE_CASES[case])
    shape = lead if lead is not None else (t,)
    h = randn(*shape, hdim, dtype=dtype, requires_grad=True)
    w = randn(v, hdim, dtype=dtype, requires_grad=True, scale=hdim ** -0.5 * 2)
    b = randn(v, dtype=dtype, requires_grad=True) if o.pop("bias", False) else None
    tgt = torch.randint(0, v, shape, device=DEVICE)
    tgt.view(-1)[0] = v - 1
    if o.pop("ignore", False):
        tgt.view(-1)[1::4] = -100
    if o.pop("ce_weight", False):
        o["ce_weight"] = torch.rand(v, device=DEVICE) + 0.3
    return h, w, b, tgt, o


def _check_lce(h, w, b, tgt, opts, reduction, dtype, chunk_size, what=""):
    loss = wf.linear_cross_entropy(h, w, tgt, b, reduction=reduction, chunk_size=chunk_size, **opts)
    assert loss.dtype == dtype and loss.shape == (tuple(tgt.shape) if reduction == "none" else ())
    hr, wr, br = _leaf(h), _leaf(w), _leaf(b)
    logits = hr.reshape(-1, hr.shape[-1]) @ wr.T + (br if br is not None else 0)
    o = dict(opts)
    cw = o.pop("ce_weight", None)
    ref = _formula(logits, tgt.reshape(-1), cw, reduction=reduction, **o)
    if reduction == "none":
        ref = ref.reshape(tgt.shape)
    assert_close(loss, ref, dtype, what=f"{what} forward")
    g = _upstream(loss, reduction)
    loss.backward(g)
    ref.backward(g.double())
    for name, t, r in (("hidden", h, hr), ("weight", w, wr), ("bias", b, br)):
        if t is None:
            continue
        if t.requires_grad:
            assert t.grad is not None and t.grad.dtype == dtype and t.grad.shape == t.shape, name
            assert_close(t.grad, r.grad, dtype, scale=2.0, what=f"{what} d{name}")
        else:
            assert t.grad is None, name
    return loss


@pytest.mark.parametrize("case", list(LCE_CASES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear(reduction, case):
    """T = 13 in chunks of 5: 5 + 5 + 3 (ragged), so dW accumulates across chunks and the mean's
    divisors span chunks."""
    h, w, b, tgt, opts = _lce_inputs(case, 13, 16, 131)
    _check_lce(h, w, b, tgt, opts, reduction, torch.float32, 5, what=case)


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_dtypes_3d(dtype, reduction):
    """(B, S, H) hidden, bf16 and fp32, chunks of 4 over 2 x 5 tokens (4 + 4 + 2); and the default
    chunking (one chunk on the CPU)."""
    h, w, b, tgt, opts = _lce_inputs("all", None, 24, 150, dtype=dtype, lead=(2, 5))
    _check_lce(h, w, b, tgt, opts, reduction, dtype, 4, what=f"{dtype} 3-d")
    h, w, b, tgt, opts = _lce_inputs("bias", None, 24, 150, dtype=dtype, lead=(2, 5))
    _check_lce(h, w, b, tgt, opts, reduction, dtype, None, what=f"{dtype} default chunk")


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_linear_partial_grads(reduction):
    """Only hidden needs a gradient (a frozen head), then only the weight (frozen hidden), then only
    the bias; chunk_size larger than T, and 1."""
    h, w, b, tgt, opts = _lce_inputs("all", 9, 16, 70)
    w.requires_grad_(False)
    b.requires_grad_(False)
    _check_lce(h, w, b, tgt, opts, reduction, torch.float32, 64, what="frozen weight")
    h, w, b, tgt, opts = _lce_inputs("all", 9, 16, 70)
    h.requires_grad_(False)
    b.requires_grad_(False)
    _check_lce(h, w, b, tgt, opts, reduction, torch.float32, 4, what="frozen hidden")
    h, w, b, tgt, opts = _lce_inputs("all", 9, 16, 70)
    h.requires_grad_(False)
    w.requires_grad_(False)
    _check_lce(h, w, b, tgt, opts, reduction, torch.float32, 1, what="bias only")


def test_linear_bf16_bias_grad_accumulates_in_fp32():
    """bf16, 101 tokens in chunks of 2 (mean): the first chunk gives class 0's bias gradient ~1 (a row sure of
    class 0, target 1), each later chunk ~0.0026 (two rows at p0 = 0.0013), under half a bf16 ulp
    of the running sum, so an accumulator of the bias's dtype drops every one of them (-11%); fp32
    keeps them, and one rounding to bf16 at the end is 0.4%. Logits are exact in bf16 (W = I, b = 0)."""
    v = hdim = 4
    rows = torch.tensor([[-4.0, 2.5, 0.0, 0.0]]).repeat(101, 1)
    rows[0] = torch.tensor([12.0, 0.0, 0.0, 0.0])
    h = rows.to(DEVICE, torch.bfloat16).requires_grad_()
    w = torch.eye(v, hdim, device=DEVICE, dtype=torch.bfloat16)
    b = torch.zeros(v, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    tgt = torch.ones(101, dtype=torch.long, device=DEVICE)
    wf.linear_cross_entropy(h, w, tgt, b, chunk_size=2).backward()
    ref = torch.softmax(rows.double(), -1)[:, 0].mean()
    got = b.grad[0].double().cpu()
    assert torch.isfinite(got) and abs(got - ref) <= 0.01 * ref, f"dbias[0] {got.item():.6g}, expected {ref.item():.6g}"


def test_linear_loop_path():
    """V = 1100: the loop kernel (two pieces under the interpreter) writing the gradient in place
    of the chunk's logits, and the recompute of reduction="none" in place."""
    for reduction in ("mean", "none"):
        h, w, b, tgt, opts = _lce_inputs("all", 6, 8, 1100)
        tgt[2] = 1099
        _check_lce(h, w, b, tgt, opts, reduction, torch.float32, 4, what=f"V=1100 {reduction}")


def test_linear_no_grad_and_lse():
    h, w, b, tgt, opts = _lce_inputs("all", 11, 16, 70)
    logits = h.detach().double() @ w.detach().double().T + b.detach().double()
    cw = opts.pop("ce_weight")
    with torch.no_grad():
        for red in REDUCTIONS:
            loss = wf.linear_cross_entropy(h, w, tgt, b, reduction=red, ce_weight=cw, chunk_size=4, **opts)
            assert not loss.requires_grad
            assert_close(loss, _formula(logits, tgt, cw, reduction=red, **opts), torch.float32, what=f"no_grad {red}")
    loss, lse = wf.linear_cross_entropy(h, w, tgt, b, ce_weight=cw, chunk_size=4, return_lse=True, **opts)
    assert loss.requires_grad and not lse.requires_grad and lse.shape == (11,) and lse.dtype == torch.float32
    assert_close(lse, torch.logsumexp(6.0 * torch.tanh(logits / 6.0), -1), torch.float32, what="lse")


def test_linear_strided_hidden_and_tied_weight():
    """Hidden with strided rows; a weight that is the transpose of an (H, V) buffer (tied embedding)."""
    h = noncontig(randn(2, 5, 16, requires_grad=True))
    emb = randn(16, 40, scale=0.5)
    w = emb.t().requires_grad_()
    tgt = torch.randint(0, 40, (2, 5), device=DEVICE)
    _check_lce(h, w, None, tgt, {"label_smoothing": 0.1}, "mean", torch.float32, 3, what="strided")


def test_linear_second_backward():
    h, w, b, tgt, opts = _lce_inputs("all", 6, 16, 40)
    loss = wf.linear_cross_entropy(h, w, tgt, b, chunk_size=4, **opts)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward through the same graph"):
        loss.backward()


def test_double_backward_raises():
    """With a scalar reduction the gradient is formed in the forward, a constant to autograd: a
    gradient taken with create_graph=True had a silently None gradient of its own (a penalty on it
    was lost). Such a backward raises now, clearly."""
    x, tgt, opts = _inputs("all", 6, 37)
    h, w, b, ltgt, lopts = _lce_inputs("all", 6, 16, 40)
    lopts = {k: v for k, v in lopts.items() if k != "reduction"}
    for loss_fn, leaf in ((lambda: wf.cross_entropy(x, tgt, **opts), x),
                          (lambda: wf.linear_cross_entropy(h, w, ltgt, b, reduction="sum", chunk_size=4, **lopts), h)):
        with pytest.raises(RuntimeError, match="create_graph=True"):
            torch.autograd.grad(loss_fn(), leaf, create_graph=True)
        (g,) = torch.autograd.grad(loss_fn(), leaf)         # a plain backward is unaffected
        assert torch.isfinite(g).all()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear_zero_tokens(reduction):
    """No tokens: the loss is 0 (empty for "none") and every gradient is zeros of its shape --
    dweight included, which no chunk writes (its buffer starts poisoned), on the path with the
    gradients formed in the forward and on the recompute of "none"."""
    h = randn(0, 8, requires_grad=True)
    w, b = randn(7, 8, requires_grad=True), randn(7, requires_grad=True)
    tgt = torch.empty(0, dtype=torch.long, device=DEVICE)
    loss = wf.linear_cross_entropy(h, w, tgt, b, reduction=reduction, chunk_size=4, label_smoothing=0.1)
    assert loss.shape == ((0,) if reduction == "none" else ())
    if reduction != "none":
        assert loss.item() == 0.0
    loss.sum().backward()
    assert h.grad.shape == (0, 8)
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


def test_linear_matches_cross_entropy_of_logits():
    """The fused form equals cross_entropy of the materialised logits, loss and gradients."""
    h, w, b, tgt, opts = _lce_inputs("all", 10, 16, 70)
    cw = opts.pop("ce_weight")
    loss = wf.linear_cross_entropy(h, w, tgt, b, ce_weight=cw, chunk_size=3, **opts)
    loss.backward(torch.tensor(0.7, device=DEVICE))
    grads = [t.grad.clone() for t in (h, w, b)]
    for t in (h, w, b):
        t.grad = None
    loss2 = wf.cross_entropy(torch.addmm(b, h, w.T), tgt, cw, **opts)
    loss2.backward(torch.tensor(0.7, device=DEVICE))
    assert_close(loss, loss2.detach().double(), torch.float32)
    for g, t in zip(grads, (h, w, b)):
        assert_close(g, t.grad.double(), torch.float32, scale=2.0)


# ----------------------------------------------------------------------------------------------
# GPU only: vocabulary-sized rows, T*V past 2^31, the device-side assertion
# ----------------------------------------------------------------------------------------------
@gpu_only
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("case", ["plain", "all", "ignore_all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tv", [(64, 128256), (300, 128256), (97, 262144)], ids=str)
def test_gpu_vocab_rows(tv, dtype, case, reduction):
    """The split path with 16 and 32 chunks a row (programs exchanging row statistics; 8,192
    columns a chunk)."""
    t, v = tv
    heur.ce_config.cache_clear()
    cfg = heur.ce_config(v)
    assert cfg.mode == "split" and cfg.chunks == -(-v // cfg.block_n) >= 16, cfg
    x, tgt, opts = _inputs(case, t, v, dtype=dtype)
    if case != "ignore_all":
        tgt[1] = 4096                                         # the first column of chunk 1
    _check(x, tgt, opts, reduction, dtype, what=f"{tv}")


@gpu_only
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_gpu_linear_vocab(reduction):
    h, w, b, tgt, opts = _lce_inputs("all", 300, 256, 128256, dtype=torch.bfloat16)
    _check_lce(h, w, b, tgt, opts, reduction, torch.bfloat16, 128, what="LM head")


@gpu_only
def test_gpu_offsets_past_2_31():
    """T * V = 16400 * 131072 > 2^31 elements (4.3 GB of bf16): rows past 16384 start beyond 2^31."""
    t, v = 16400, 131072
    assert t * v > 2**31
    x = torch.randn(t, v, device=DEVICE, dtype=torch.bfloat16)
    tgt = torch.randint(0, v, (t,), device=DEVICE)
    rows = torch.tensor([0, 1, 8191, 16383, 16384, 16390, 16399], device=DEVICE)
    tgt[16399] = v - 1
    with torch.no_grad():
        loss, lse = wf.cross_entropy(x, tgt, reduction="none", z_loss=1e-3, return_lse=True)
    ref = _formula(x[rows], tgt[rows], reduction="none", z_loss=1e-3)
    assert_close(loss[rows], ref, torch.bfloat16, what="rows past 2^31")
    assert_close(lse[rows], torch.logsumexp(x[rows].double(), -1), torch.float32, what="lse past 2^31")
    assert torch.isfinite(loss).all()


@gpu_only
def test_device_assertion():
    code = ("import torch, warpforge\n"
            "x = torch.randn(4, 1000, device='cuda')\n"
            "t = torch.tensor([1, 2, 1000, 3], device='cuda')\n"
            "loss = warpforge.cross_entropy(x, t)\n"
            "torch.cuda.synchronize()\n"
            "print(loss.item())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode != 0, r.stdout
    assert "'target' holds a class index outside" in r.stderr, (r.stdout[-2000:], r.stderr[-4000:])


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        wf.cross_entropy(torch.randn(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="'target' is on"):
        wf.cross_entropy(randn(3, 5), torch.zeros(3, dtype=torch.long))


def test_public_names():
    assert wf.cross_entropy is ce.cross_entropy and wf.linear_cross_entropy is ce.linear_cross_entropy


@pytest.mark.parametrize("opts", [{}, dict(z_loss=1e-4, softcap=20.0, label_smoothing=0.1)])
def test_compile_dynamic_shapes(opts):
    """torch.compile(dynamic=True, fullgraph=True) over two token counts, with the default options
    and with z-loss and a soft cap: the option checks are comparisons (math.isfinite of a symbolic
    float broke the graph)."""
    torch._dynamo.reset()
    f = torch.compile(lambda x, t: wf.cross_entropy(x, t, **opts), dynamic=True, fullgraph=True)
    for tokens in (5, 9):
        x = randn(tokens, 40, requires_grad=True)
        t = torch.randint(0, 40, (tokens,), device=DEVICE)
        xr = x.detach().clone().requires_grad_()
        loss = f(x, t)
        want = wf.cross_entropy(xr, t, **opts)
        assert_close(loss, want.double(), torch.float32)
        loss.backward()
        want.backward()
        assert_close(x.grad, xr.grad.double(), torch.float32)


def test_bad_options_audit():
    """Options that failed inside float() or a dict lookup, naming nothing (a string or None
    label_smoothing / z_loss / softcap, a list reduction), and an (N, 0, d) input (0 classes:
    torch's reshape error)."""
    x, tgt = randn(5, 7), torch.randint(0, 7, (5,), device=DEVICE)
    for name, v in (("label_smoothing", "abc"), ("label_smoothing", None), ("z_loss", None), ("softcap", "a")):
        with pytest.raises(TypeError, match=f"'{name}' must be a real number"):
            wf.cross_entropy(x, tgt, **{name: v})
    with pytest.raises(ValueError, match=r"'reduction' is \['mean'\]"):
        wf.cross_entropy(x, tgt, reduction=["mean"])
    with pytest.raises(ValueError, match=r"'input' has shape \(2, 0, 3\), 0 classes"):
        wf.cross_entropy(randn(2, 0, 3), torch.zeros(2, 3, dtype=torch.long, device=DEVICE))
    with pytest.raises(TypeError, match="'z_loss' must be a real number"):
        wf.linear_cross_entropy(randn(5, 8), randn(7, 8), tgt, z_loss="0.1")


def test_option_boundaries():
    """The ends of the option ranges: label_smoothing = 1.0 is allowed (as in PyTorch: the loss is
    the uniform-target term alone), and bools, which are ints to isinstance, are refused as
    ignore_index and chunk_size."""
    x, tgt = randn(5, 7, requires_grad=True), torch.randint(0, 7, (5,), device=DEVICE)
    tgt[1] = -100
    _vs_torch(x, tgt, "mean", label_smoothing=1.0, what="label_smoothing=1")
    with pytest.raises(TypeError, match="'ignore_index' must be an int, got bool"):
        wf.cross_entropy(x, tgt, ignore_index=True)
    with pytest.raises(ValueError, match="'chunk_size' is True; expected None or a positive int"):
        wf.linear_cross_entropy(randn(5, 8), randn(7, 8), tgt, chunk_size=True)
