"""warpforge.nn.MoE's module plumbing (tests/ops/test_moe.py checks its output against the reference):
parameter init, the routing options reaching moe_route, the correction bias buffer and its update."""
import torch

import warpforge as wf
from warpforge.ops.moe_routing import moe_route_reference
from conftest import DEVICE, randn


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
