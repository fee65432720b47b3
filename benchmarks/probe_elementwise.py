"""Device probe: launch sweeps of the elementwise kernels (vectorized add, SwiGLU) at the bench's
headline shapes, bf16. Prints GB/s and % of the copy ceiling per variant."""
import itertools

import torch
import triton.testing as tt

import warpforge as wf
from warpforge.ops import activations as A, add as AD
from warpforge.runtime.device import ceilings

COPY = ceilings()["copy_gbps"]
ms = lambda f: tt.do_bench(f, warmup=10, rep=80, return_mode="median")  # noqa: E731
g = torch.randn(16384, 14336, device="cuda", dtype=torch.bfloat16)
u = torch.randn_like(g)
nb = 3 * g.numel() * 2
t = ms(lambda: torch.nn.functional.silu(g) * u)
cf = torch.compile(lambda a, b: torch.nn.functional.silu(a) * b, dynamic=False)
cf(g, u)
print(f"swiglu eager {nb / t / 1e6:.0f} GB/s; compile {nb / ms(lambda: cf(g, u)) / 1e6:.0f} GB/s; copy {COPY:.0f}")
for block, warps in itertools.product((1024, 2048, 4096), (4, 8)):
    orig = (A.FLAT_BLOCK, A.FLAT_WARPS, AD.FLAT_BLOCK, AD.FLAT_WARPS)
    A.FLAT_BLOCK = AD.FLAT_BLOCK = block
    A.FLAT_WARPS = AD.FLAT_WARPS = warps
    try:
        t = ms(lambda: wf.swiglu(g, u))
        print(f"swiglu flat block={block} warps={warps}: {nb / t / 1e6:.0f} GB/s {100 * nb / t / 1e6 / COPY:.1f}%", flush=True)
    finally:
        A.FLAT_BLOCK, A.FLAT_WARPS, AD.FLAT_BLOCK, AD.FLAT_WARPS = orig
a = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
nb = 3 * a.numel() * 2
print(f"add eager {nb / ms(lambda: a + b) / 1e6:.0f} GB/s")
for block, warps in itertools.product((1024, 2048, 4096), (4, 8)):
    orig = (AD.FLAT_BLOCK, AD.FLAT_WARPS)
    AD.FLAT_BLOCK, AD.FLAT_WARPS = block, warps
    try:
        t = ms(lambda: wf.add(a, b))
        print(f"add block={block} warps={warps}: {nb / t / 1e6:.0f} GB/s {100 * nb / t / 1e6 / COPY:.1f}%", flush=True)
    finally:
        AD.FLAT_BLOCK, AD.FLAT_WARPS = orig
