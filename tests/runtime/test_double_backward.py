"""Double backward through ops whose backward is a kernel with no autograd formula of its own.

A gradient taken with create_graph=True must either carry the op's second-order terms or make the
second backward raise; it must never be a constant that silently drops them (a gradient penalty
``|dL/dx|^2`` added to a loss lost its term through the op and trained on the rest). The eager
door called such backward ops' launchers directly, and on a GPU the fast path's C++ nodes launched
their kernels; both now hand a create_graph backward to the registered operator, whose output
carries a node that raises "no autograd formula was registered" (runtime/registry.py,
runtime/csrc/fastpath.cpp).
"""
from __future__ import annotations

import pytest
import torch

import warpforge as wf
from conftest import DEVICE, rel_err

N = 64


def _cases():
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=DEVICE)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2]], dtype=torch.int32, device=DEVICE)
    tgt = torch.tensor([1, 5, 7, 0], device=DEVICE)
    return {
        "softmax": lambda x, w: wf.softmax(x * w, -1),
        "log_softmax": lambda x, w: wf.log_softmax(x * w, -1),
        "rms_norm": lambda x, w: wf.rms_norm(x, (N,), w),
        "layer_norm": lambda x, w: wf.layer_norm(x, (N,), w, w),
        "add_rms_norm": lambda x, w: wf.add_rms_norm(x, x.flip(0), w)[0],
        "swiglu": lambda x, w: wf.swiglu(x, x * w),
        "geglu": lambda x, w: wf.geglu(x * w, x),
        "amax": lambda x, w: wf.amax(x * w, -1),   # a backward linear in dy: exact without raising
        "sdpa": lambda x, w: wf.scaled_dot_product_attention((x * w).view(1, 1, 4, N), x.view(1, 1, 4, N),
                                                             x.view(1, 1, 4, N)),
        "attention_varlen": lambda x, w: wf.attention_varlen((x * w).reshape(8, 1, 32), x.reshape(8, 1, 32),
                                                             x.reshape(8, 1, 32), cu, cu, 5, 5, causal=True),
        "moe_experts": lambda x, w: wf.moe_experts(x, w * torch.ones(3, 32, N, device=DEVICE) / 8,
                                                   torch.ones(3, N, 16, device=DEVICE) / 4,
                                                   torch.full((4, 2), 0.5, device=DEVICE), ids),
        "cross_entropy_none": lambda x, w: wf.cross_entropy(x * w, tgt, reduction="none"),
    }


REFS = {   # torch's own ops, for a case that may complete its double backward rather than raise
    "amax": lambda x, w: torch.amax(x * w, -1),
}


@pytest.mark.parametrize("name", list(_cases()))
def test_double_backward_raises_not_drops(name):
    fn = _cases()[name]
    g0 = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, N, generator=g0).to(DEVICE)
    w0 = (1 + 0.1 * torch.randn(N, generator=g0)).to(DEVICE)
    for _ in range(2):          # the second call is the fast path's on a GPU (the first offers the kernels)
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = fn(x, w)
        r = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, y.dtype)
        gx, gw = torch.autograd.grad((y * r).sum(), (x, w), create_graph=True)
        x2, w2 = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        plain = torch.autograd.grad((fn(x2, w2) * r).sum(), (x2, w2))
        # the first-order gradients are the plain backward's
        assert rel_err(gx, plain[0]) <= 1e-6 and rel_err(gw, plain[1]) <= 1e-6, name
        other = torch.ones(3, requires_grad=True)
        penalty = gx.square().sum() + gw.square().sum() + other.square().sum()
        if name not in REFS:
            with pytest.raises(RuntimeError, match="no autograd formula|double backward"):
                penalty.backward()
            continue
        penalty.backward()        # must then be right: against torch's double backward in float64
        xr, wr = x0.double().requires_grad_(), w0.double().requires_grad_()
        hx, hw = torch.autograd.grad((REFS[name](xr, wr) * r.double()).sum(), (xr, wr), create_graph=True)
        (hx.square().sum() + hw.square().sum()).backward()
        assert rel_err(x.grad, xr.grad) <= 1e-5 and rel_err(w.grad, wr.grad) <= 1e-5, name
