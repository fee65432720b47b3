"""Device probe: host cost of the autograd engine around a Python backward (per call, us)."""
import torch

import warpforge as wf
from warpforge.bench.timing import host_us
from warpforge.ops import softmax as S


class Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        return g * 1


class Ours(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = S._softmax_fwd(x, False)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return S._softmax_bwd(y, g, False)


x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
xg = x.clone().requires_grad_()
dy = torch.randn_like(x)
y = S._softmax_fwd(x, False)
rows = {
    "launcher _softmax_bwd (main thread)": lambda: S._softmax_bwd(y, dy, False),
    "x*1 (eager op)": lambda: x * 1,
    "Trivial fwd+bwd (autograd.grad)": lambda: torch.autograd.grad(Trivial.apply(xg), [xg], dy),
    "Ours (plain Function) fwd+bwd": lambda: torch.autograd.grad(Ours.apply(xg), [xg], dy),
    "wf.softmax fwd+bwd": lambda: torch.autograd.grad(wf.softmax(xg), [xg], dy),
    "torch.softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(xg, -1), [xg], dy),
    "Trivial fwd only": lambda: Trivial.apply(xg),
    "Ours fwd only": lambda: Ours.apply(xg),
}
for k, f in rows.items():
    print(f"{k:<40} {host_us(f, calls=2000, warmup=50, include_device=False):8.1f} us", flush=True)
