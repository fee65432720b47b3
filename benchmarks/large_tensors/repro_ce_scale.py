"""Suspect: cross_entropy's backward scale kernel (ops/cross_entropy.py:533, _scale_kernel) for a
gradient of just under 2^31 elements and an upstream gradient != 1.

With reduction "mean"/"sum" and a gradient wanted, the forward already writes dlogits (upstream 1)
and the backward scales it in place by a persistent grid:

    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):   # int32 when n < 2^31
        i = tl.cast(start, tl.int64) + offs

When n = T * V fits in int32 the induction variable is int32 (the loop compiles to
`add i32` + `icmp slt`, no overflow guard). With n within one grid stride of 2^31
(step = 4 * SMs * 4096 = 2,162,688 on 132 SMs), `start + step` wraps negative for most programs,
the `start < n` test passes, and the loop walks from about -2^31 back up through [0, n): it scales
memory 4 GiB *before* dlogits and scales other programs' blocks of dlogits a second time.
Reached whenever the upstream gradient is not exactly 1 (loss scaling, 1 / grad_accum_steps, a
weighted sum of losses). Same helper scales linear_cross_entropy's dh/dW/db.

Repro: T = 16,743 tokens x V = 128,256 (Llama-3 vocab): 2,147,390,208 elements (2^31 - 93,440),
bf16 logits 4.3 GB + gradient 4.3 GB; (0.5 * loss).backward(). The whole gradient is compared with
torch's softmax - onehot in 1,024-row chunks; the logits' checksum must not change.
Peak GPU memory ~10 GB.

Run alone: python repro_ce_scale.py   (AUDIT64_TINY=1: a CPU/interpreter smoke test of the logic only)
"""
import os

os.environ.setdefault("WARPFORGE_FASTPATH", "0")
import torch
import warpforge as wf

from common import DEV, TINY, nanmax as _nanmax, run_standalone, sync as _sync
T, V = (64, 1000) if TINY else (16743, 128256)
UPSTREAM = 0.5




def run() -> str:
    g = torch.Generator(device=DEV).manual_seed(0)
    logits = torch.randn(T, V, dtype=torch.bfloat16, device=DEV, generator=g)
    target = torch.randint(0, V, (T,), device=DEV, generator=g)
    checksum = float(torch.sum(logits, dtype=torch.float64))
    logits.requires_grad_(True)
    loss = wf.cross_entropy(logits, target)                    # mean over T tokens
    (loss * UPSTREAM).backward()
    _sync()
    grad = logits.grad
    worst, scale, bad_rows = 0.0, 0.0, 0
    step = 16 if TINY else 1024
    with torch.no_grad():
        for r0 in range(0, T, step):
            r1 = min(T, r0 + step)
            p = torch.softmax(logits[r0:r1].float(), dim=-1)
            p[torch.arange(r1 - r0, device=DEV), target[r0:r1]] -= 1.0
            p *= UPSTREAM / T
            err = (grad[r0:r1].float() - p).abs()
            worst = _nanmax([worst, float(err.max())])
            scale = max(scale, float(p.abs().max()))
            bad_rows += int((~(err.amax(-1) <= 2e-2 * float(p.abs().max()))).sum())   # NaN counts as wrong
        checksum_after = float(torch.sum(logits, dtype=torch.float64))
    rel = worst / max(scale, 1e-30)
    problems = []
    if not rel <= 2e-2:
        problems.append(f"{bad_rows} of {T} gradient rows wrong")
    if checksum_after != checksum:
        problems.append(f"logits modified by the backward (checksum {checksum!r} -> {checksum_after!r})")
    if not problems:
        return "OK"
    return f"WRONG (max err {rel:.3g} relative; " + "; ".join(problems) + ")"


SUSPECTS = {
    "cross_entropy.scale_kernel_loop_iv_int32_wrap (cross_entropy.py:533; T*V in (2^31-2.16M, 2^31), upstream grad != 1)": run,
}

if __name__ == "__main__":
    run_standalone(SUSPECTS, "SUSPECT")
