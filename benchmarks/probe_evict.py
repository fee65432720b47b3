"""Device probe: do cache hints close the last few % on streaming elementwise kernels?
A SwiGLU-shaped kernel (2 reads, 1 write) with and without evict_first loads / streaming stores."""
import torch
import triton
import triton.language as tl
import triton.testing as tt

from warpforge.runtime.device import ceilings


@triton.jit
def _k(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr, EVICT: tl.constexpr, CS: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if EVICT:
        g = tl.load(g_ptr + offs, mask=m, eviction_policy="evict_first").to(tl.float32)
        u = tl.load(u_ptr + offs, mask=m, eviction_policy="evict_first").to(tl.float32)
    else:
        g = tl.load(g_ptr + offs, mask=m).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=m).to(tl.float32)
    y = (g * tl.sigmoid(g) * u).to(o_ptr.dtype.element_ty)
    if CS:
        tl.store(o_ptr + offs, y, mask=m, cache_modifier=".cs")
    else:
        tl.store(o_ptr + offs, y, mask=m)


COPY = ceilings()["copy_gbps"]
g = torch.randn(16384 * 14336, device="cuda", dtype=torch.bfloat16)
u = torch.randn_like(g)
o = torch.empty_like(g)
nb = 3 * g.numel() * 2
for block, warps in ((1024, 4), (2048, 4), (4096, 8)):
    for ev in (False, True):
        for cs in (False, True):
            f = lambda: _k[(triton.cdiv(g.numel(), block),)](g, u, o, g.numel(), BLOCK=block, EVICT=ev, CS=cs, num_warps=warps)  # noqa: E731
            t = tt.do_bench(f, warmup=10, rep=80, return_mode="median")
            print(f"block={block} warps={warps} evict_first={ev} store.cs={cs}: {nb / t / 1e6:.0f} GB/s "
                  f"{100 * nb / t / 1e6 / COPY:.1f}%", flush=True)
