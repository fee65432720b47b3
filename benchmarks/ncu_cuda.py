"""ncu target for the CUDA backend's hot kernels (profile with `ncu -k regex:...`): one call each of
the mma matmul at 4096^3 bf16, the bf16 row sum at 32768 x 4096 and 512 x 262144, and the softmax
forward at 512 x 262144, after a warm-up call each."""
import torch

from warpforge import cuda

cuda.load()
ops = cuda.ops()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
x1 = torch.randn(32768, 4096, device="cuda", dtype=torch.bfloat16)
x2 = torch.randn(512, 262144, device="cuda", dtype=torch.bfloat16)
for _ in range(2):
    ops.matmul(a, b, "mma")
    ops.sum(x1, torch.float32)
    ops.sum(x2, torch.float32)
    ops.softmax(x2, False, [1024, 4, 8, 1])
torch.cuda.synchronize()
print("ncu target: done")
