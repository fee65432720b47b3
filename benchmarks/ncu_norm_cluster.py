"""One call of a cluster norm kernel (csrc/norm.cu) at M*N = 2^27 bf16, for ncu:

    ncu --launch-skip 1 --launch-count 1 -k regex:norm python benchmarks/ncu_norm_cluster.py fwd 4,256,4,4,3
    ncu ... python benchmarks/ncu_norm_cluster.py bwd 4,256,4,2,3 [rms]
"""
import sys

import torch

import warpforge.cuda as wcuda

wcuda.load()
ops = torch.ops.warpforge_cuda
kind, c = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
rms = "rms" in sys.argv[3:]
n = c[0] * c[1] * c[2] * 8
m = 2**27 // n
x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
mean, rstd = torch.empty(m, device="cuda"), torch.empty(m, device="cuda")
for _ in range(2):
    if kind == "fwd":
        ops.layer_norm_fwd(x, w, b, 1e-5, c, torch.empty_like(x), mean, rstd)
    else:
        parts = torch.cuda.get_device_properties(0).multi_processor_count // c[0]
        dy = torch.randn_like(x)
        mean, rstd = x.float().mean(-1), torch.ones(m, device="cuda")
        ops.norm_bwd(x, dy, w, None if rms else mean, rstd, 0.0, rms, c, torch.empty_like(x),
                     torch.empty(parts, n, device="cuda"), None if rms else torch.empty(parts, n, device="cuda"))
torch.cuda.synchronize()
