"""warpforge.nn.MoE's module plumbing (tests/ops/test_moe.py checks its output against the reference):
parameter init, the routing options reaching moe_route, the correction bias buffer and its update."""
import pytest
import torch

import warpforge as wf
from warpforge.ops.moe import moe_experts_reference
from warpforge.ops.moe_routing import moe_route_reference
from conftest import DEVICE, assert_close, randn


def test_reset_parameters_bounds():
    """nn.Linear's init per projection: U(+-1/sqrt(fan_in)), fan_in = d_model for the router and
    w_gate_up, expert_dim for w_down (with d_model = 64 and expert_dim = 4 the bounds are 1/8 and 1/2)."""
    m = wf.nn.MoE(64, 4, 4, 2, n_shared=1)
    for name, bound in (("router", 1 / 8), ("w_gate_up", 1 / 8), ("w_down", 1 / 2)):
        p = getattr(m, name)
        assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound, (name, float(p.abs().max()))
    with torch.no_grad():
        m.w_down.fill_(5.0)
    m.reset_parameters()
    assert m.w_down.abs().max() <= 0.5
    assert wf.nn.MoE(8, 4, 4, 2, dtype=torch.bfloat16).w_down.dtype == torch.bfloat16


def test_options_reach_routing_and_bias_buffer():
    """aux_loss_coef reaches moe_route (self.aux_loss is the reference's); eval() forwards leave the
    correction bias alone; a sigmoid router keeps the bias as a buffer even without updates (a
    DeepSeek-V3 checkpoint's e_score_correction_bias loads into it and steers the choice)."""
    torch.manual_seed(0)
    d, n, E, k = 16, 8, 4, 2
    x = randn(6, d)
    m = wf.nn.MoE(d, n, E, k, aux_loss_coef=0.1, device=DEVICE)
    with torch.no_grad():
        m(x)
    ref = moe_route_reference(x.double() @ m.router.detach().double().T, k, aux_loss_coef=0.1)
    assert m.aux_loss is not None and abs(float(m.aux_loss) - float(ref.aux_loss)) <= 1e-5 * abs(float(ref.aux_loss))
    m = wf.nn.MoE(d, n, E, k, score="sigmoid", bias_update_rate=0.01, device=DEVICE).eval()
    m(x)
    assert torch.equal(m.correction_bias, torch.zeros(E, device=DEVICE)), "an eval forward nudged the bias"
    m = wf.nn.MoE(d, n, E, k, score="sigmoid", device=DEVICE)
    assert "correction_bias" in m.state_dict()
    m.load_state_dict({**m.state_dict(), "correction_bias": torch.tensor([0.0, 0.0, 5.0, 5.0], device=DEVICE)})
    m(x)
    assert m.counts.tolist() == [0, 0, 6, 6], m.counts


def test_routing_options_reach_the_output():
    """renormalize=False and group_score="max" (not the sigmoid default "top2") reach moe_route: the
    output is the reference's with exactly those options."""
    d, n, E, k = 16, 8, 16, 3
    kw = dict(score="sigmoid", n_group=4, topk_group=2, group_score="max", renormalize=False, routed_scaling_factor=1.5)
    m = wf.nn.MoE(d, n, E, k, device=DEVICE, **kw)
    x = randn(24, d)
    with torch.no_grad():
        y = m(x)
    logits = x.double() @ m.router.detach().double().T
    r = moe_route_reference(logits, k, **kw)
    assert not torch.equal(r.ids, moe_route_reference(logits, k, **{**kw, "group_score": "top2"}).ids)
    assert torch.equal(m.counts, r.counts)
    ref = moe_experts_reference(x.double(), m.w_gate_up.detach().double(), m.w_down.detach().double(),
                                r.weights, r.ids.long())
    assert_close(y, ref, torch.float32, scale=5)


def test_aux_loss_trains_the_router():
    """self.aux_loss keeps its graph: backward from it alone gives the router the reference's gradient."""
    d, E, k = 16, 8, 2
    m = wf.nn.MoE(d, 8, E, k, aux_loss_coef=0.1, device=DEVICE)
    x = randn(10, d)
    m(x)
    m.aux_loss.backward()
    router = m.router.detach().double().requires_grad_()
    moe_route_reference(x.double() @ router.T, k, aux_loss_coef=0.1).aux_loss.backward()
    assert_close(m.router.grad, router.grad, torch.float32, scale=2.0, what="d aux / d router")


def test_bias_update_step_and_reset():
    """A training forward moves the bias by exactly bias_update_rate * sign(mean(counts) - counts) of
    that forward's counts (not moe_update_bias_'s default step); reset_parameters() zeroes it again."""
    m = wf.nn.MoE(16, 8, 4, 1, bias_update_rate=0.25, device=DEVICE)
    m(randn(8, 16))
    c = m.counts.float()
    assert torch.equal(m.correction_bias, 0.25 * torch.sign(c.mean() - c))
    assert m.correction_bias.abs().sum() > 0
    m.reset_parameters()
    assert torch.equal(m.correction_bias, torch.zeros(4, device=DEVICE))


def test_top_k_all_experts_and_zero_sizes():
    """top_k == n_experts is legal (every token to every expert); a zero d_model or expert_dim is a
    ValueError naming it (not a ZeroDivisionError from the init bound)."""
    m = wf.nn.MoE(8, 4, 4, 4, device=DEVICE)
    m(randn(3, 8))
    assert m.counts.tolist() == [3, 3, 3, 3]
    for name in ("d_model", "expert_dim"):
        args = {**dict(d_model=8, expert_dim=4, n_experts=4, top_k=2), name: 0}
        with pytest.raises(ValueError, match=f"'{name}' = 0"):
            wf.nn.MoE(**args)


@pytest.mark.parametrize("cast", ["bfloat16", "half", "to"])
def test_module_cast_keeps_the_correction_bias_float32(cast):
    """Casting the module (.bfloat16(), .half(), .to(dtype)) casts its parameters but keeps the
    correction bias float32 with its values (it used to be cast too, and the forward refused it);
    the cast module runs and still updates the bias."""
    dt = torch.float16 if cast == "half" else torch.bfloat16
    m = wf.nn.MoE(16, 8, 4, 2, score="sigmoid", bias_update_rate=1e-3, device=DEVICE)
    with torch.no_grad():
        m.correction_bias.copy_(torch.tensor([1e-3, -2e-3, 1.0 + 1e-4, 0.0]))   # not representable in 16 bits
    before = m.correction_bias.clone()
    m = m.to(dt) if cast == "to" else getattr(m, cast)()
    assert m.w_gate_up.dtype == m.router.dtype == dt
    assert m.correction_bias.dtype == torch.float32 and torch.equal(m.correction_bias, before)
    assert "correction_bias" in dict(m.named_buffers())
    y = m(randn(5, 16, dtype=dt))
    assert y.dtype == dt and torch.isfinite(y.float()).all()
    assert not torch.equal(m.correction_bias, before)                            # the training step moved it
    assert m.float().correction_bias.dtype == torch.float32
