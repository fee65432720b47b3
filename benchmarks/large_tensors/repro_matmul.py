"""Suspects in ops/matmul.py's pointer kernel (_matmul_kernel).

1. split-K: the starting K offset of each split is int32 times the K stride:

       a_ptrs = ... + (k_lo * BLOCK_K + offs_k)[None, :] * s_ak          # matmul.py:252
       b_ptrs = ... + (k_lo * BLOCK_K + offs_k)[:, None] * s_bk          # matmul.py:253

   k_lo * BLOCK_K + offs_k (a K index) and s_bk (B's row stride) are int32, so for pid_k > 0 the
   product wraps once K_index * stride >= 2^31. (Without split-K k_lo = 0 and the loop advances the
   64-bit pointers, so only split-K is affected.) Split-K is what "auto" picks for M <= 64, e.g.
   the weight gradient of a small-output linear (router / value head / classifier):
   dW = dz^T @ x with x (T, d) row-major, s_bk = d: T * d >= 2^31 (T = 2^20 tokens, d = 4096 here).
   linear()'s backward computes exactly matmul(dz.T, x, "auto").

2. batched matmul: the batch is grid axis z (grid = (tiles, split, batch), matmul.py:550, read as
   tl.program_id(2)). CUDA limits grid z to 65,535, so a batched wf.matmul with more than 65,535
   batch entries fails to launch (no host check, no chunking).

Peak GPU memory ~9 GB (suspect 1: x is (2^20, 4096) bf16 = 8.6 GB); suspect 2 is tiny.

Run alone: python repro_matmul.py   (AUDIT64_TINY=1: a CPU/interpreter smoke test of the logic only)
"""
import os

os.environ.setdefault("WARPFORGE_FASTPATH", "0")
import torch
import warpforge as wf

from common import DEV, TINY, nanmax as _nanmax, run_standalone, sync as _sync
BF16 = torch.bfloat16




def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().float(), ref.detach().float()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def run_splitk() -> str:
    # T tokens, d features, E outputs. Only the last NZ token rows of dz are nonzero, so the exact
    # answer is a small matmul over those rows; they sit past element 2^31 of x, in the last split.
    T, d, E, NZ = (4096, 64, 16, 256) if TINY else (2**20, 4096, 16, 4096)
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(T, d, dtype=BF16, device=DEV, generator=g)                 # 8.6 GB
    dz = torch.zeros(T, E, dtype=BF16, device=DEV)
    dz[-NZ:] = torch.randn(NZ, E, dtype=BF16, device=DEV, generator=g)
    ref = dz[-NZ:].t().float() @ x[-NZ:].float()                                 # (E, d)
    errs = {}
    errs["matmul(dz.T, x) auto"] = _rel(wf.matmul(dz.t(), x), ref)
    errs["matmul(dz.T, x) splitk"] = _rel(wf.matmul(dz.t(), x, variant="splitk"), ref)
    w = torch.randn(E, d, dtype=BF16, device=DEV, generator=g).requires_grad_(True)
    y = wf.linear(x, w)                                                          # (T, E)
    y.backward(dz)                                                               # dW = dz^T @ x
    errs["linear backward dW"] = _rel(w.grad, ref)
    _sync()
    worst = _nanmax(errs.values())
    if worst <= 2e-2:
        return "OK"
    return f"WRONG (max err {worst:.3g} relative; " + ", ".join(f"{k}: {v:.3g}" for k, v in errs.items()) + ")"


def run_batched_grid_z() -> str:
    B = 8 if TINY else 65536                      # > 65,535: CUDA's grid-z limit
    g = torch.Generator(device=DEV).manual_seed(1)
    a = torch.randn(B, 16, 16, dtype=BF16, device=DEV, generator=g)
    b = torch.randn(B, 16, 16, dtype=BF16, device=DEV, generator=g)
    out = wf.matmul(a, b)
    _sync()
    err = _rel(out, torch.bmm(a.float(), b.float()))
    return "OK" if err <= 2e-2 else f"WRONG (max err {err:.3g} relative)"


SUSPECTS = {
    "matmul.splitK_k_offset_times_stride (matmul.py:252-253; linear dW with T*d > 2^31)": run_splitk,
    "matmul.batched_grid_z_over_65535 (matmul.py:550 grid=(tiles, split, batch))": run_batched_grid_z,
}

if __name__ == "__main__":
    run_standalone(SUSPECTS, "SUSPECT")
