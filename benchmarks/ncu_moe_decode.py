"""ncu target for Mixtral-sized MoE decode (NOTES item 97: is T = 256's 128-row gate/up kernel bound
by the tensor cores, the L2-to-SM path or DRAM?). Warm-up calls outside the profiled range, then one
call each at T = 64 (32-row tiles) and T = 256 (128-row tiles) inside cudaProfilerStart/Stop:

    ncu --profile-from-start off --clock-control none -k regex:_moe_gemm_tma --metrics ... \\
        python benchmarks/ncu_moe_decode.py
"""
import torch

import warpforge.ops.moe as M

from moe_probe_inputs import SHAPES, make

d, n, E, k = SHAPES["mixtral"]
x, w1, w2, wts, ids = make(256, d, n, E, k)
calls = [(x[:T], w1, w2, wts[:T].contiguous(), ids[:T].contiguous()) for T in (64, 256)]
for args in calls:
    for _ in range(3):
        M.moe_experts(*args, validate=False)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for args in calls:
    M.moe_experts(*args, validate=False)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("ncu target: done")
