"""One call of the CUDA backend's staged cluster softmax forward (csrc/softmax.cu,
softmax_fwd_cluster_kernel) at M*N = 2^27 bf16, after a warm-up call, for ncu:

    ncu --launch-skip 1 --launch-count 1 -k regex:softmax_fwd_cluster \\
        python benchmarks/ncu_softmax_cluster.py 16,256,8,2,3[,blocks an SM] [log]
"""
import sys

import torch

import warpforge.cuda as wcuda

wcuda.load()
cfg = [int(v) for v in sys.argv[1].split(",")]
log = "log" in sys.argv[2:]
n = cfg[0] * cfg[1] * cfg[2] * 8
x = torch.randn(2**27 // n, n, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
for _ in range(2):
    wcuda.ops().softmax_fwd_cluster(x, log, cfg, y)
torch.cuda.synchronize()
