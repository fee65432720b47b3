"""Host overhead of warpforge.matmul on short-M shapes: where the microseconds go (cProfile),
against torch.matmul. python benchmarks/probe_matmul_host.py"""
import cProfile
import io
import pstats

import torch

import warpforge
from warpforge.bench.timing import host_us
from warpforge.ops import matmul as mm
from warpforge.runtime import tuning

torch.manual_seed(0)
a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = w.T
out = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
with tuning.tuning():
    warpforge.matmul(a, b)
cfg = mm.matmul_config(16, 4096, 4096, 2, "auto")
ep = mm._Epilogue(out)
ag = a.clone().requires_grad_()
wg = w.clone().requires_grad_()
yo = warpforge.matmul(ag, wg.T)
yt = torch.matmul(ag, wg.T)
dy = torch.randn_like(yo)
cases = {
    "torch.matmul": lambda: torch.matmul(a, b),
    "warpforge.matmul": lambda: warpforge.matmul(a, b),
    "matmul_op (no checks)": lambda: mm.matmul_op(a, b, "auto"),
    "_mm": lambda: mm._mm(a, b),
    "_launch_tiled(cfg)": lambda: mm._launch_tiled(a, b, out, ep, cfg),
    "bwd torch": lambda: torch.autograd.grad(yt, (ag, wg), dy, retain_graph=True),
    "bwd warpforge": lambda: torch.autograd.grad(yo, (ag, wg), dy, retain_graph=True),
}
for name, fn in cases.items():
    print(f"{name:28s} issue {host_us(fn, 300, include_device=False):7.1f} us   end-to-end {host_us(fn, 300):7.1f} us")
for name in ("warpforge.matmul", "bwd warpforge"):
    pr = cProfile.Profile()
    fn = cases[name]
    pr.enable()
    for _ in range(300):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    print(f"==== {name}\n" + "\n".join(s.getvalue().splitlines()[6:40]))
