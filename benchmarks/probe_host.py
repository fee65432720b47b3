"""Device probe: where the host (CPU) time of a small eager call goes. cProfile of softmax
forward+backward at 1 x 4096, and per-call host time of each layer of the call."""
from __future__ import annotations

import cProfile
import io
import os
import pstats

import torch

import warpforge as wf
from warpforge.bench.timing import host_us
from warpforge.ops import softmax as S

OUT = os.environ.get("OUT", ".")


x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
xg = x.clone().requires_grad_()
dy = torch.randn_like(x)
cfg = S.row_config(4096)
rows = {
    "torch.softmax (eager)": lambda: torch.softmax(x, -1),
    "raw triton launch": lambda: S._softmax_fwd_block_kernel[(1,)](x, y, 1, 4096, 4096, 4096, LOG=False, ROWS=cfg.rows, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps),
    "launcher _softmax_fwd": lambda: S._softmax_fwd(x, False),
    "Op fast door (no grad)": lambda: S.softmax_op(x, False),
    "wf.softmax (no grad)": lambda: wf.softmax(x),
    "torch.ops.warpforge.softmax": lambda: torch.ops.warpforge.softmax(x, False),
    "wf.softmax (grad, fwd only)": lambda: wf.softmax(xg),
    "wf.softmax fwd+bwd": lambda: torch.autograd.grad(wf.softmax(xg), [xg], dy),
    "torch.softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(xg, -1), [xg], dy),
    "wf.rms_norm (no grad)": lambda: wf.rms_norm(x, (4096,), None, 1e-6),
    "wf.add (no grad)": lambda: wf.add(x, x),
    "wf.swiglu (no grad)": lambda: wf.swiglu(x, x),
}
res = {k: host_us(f, calls=2000, warmup=20, include_device=False) for k, f in rows.items()}
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    torch.autograd.grad(wf.softmax(xg), [xg], dy)
torch.cuda.synchronize()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
print(s.getvalue()[:6000])
open(os.path.join(OUT, "host_profile.txt"), "w").write(s.getvalue())
print(f"\n{'call':<34} {'host us/call':>12}")
for k, v in res.items():
    print(f"{k:<34} {v:12.1f}")
