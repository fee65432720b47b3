"""LayerNorm's two-pass loop forward at long rows with pass 1's last step held in registers
(HOLD_LAST) and pass 2's re-reads walked last to first (REVERSE), against the default route (the
cluster kernel at 32K-262K on the H200) and RMSNorm's loop (issue 2: LayerNorm forward 32K at
87% of copy against the 90% bar; NOTES items 66, 95).

Item 66 found the loop L2-bound: pass 2's weight and bias streams cost ~5% each, and what pass 2
re-reads of x hits L1 only in part. Holding the last step leaves one step fewer to re-read and a
smaller working set in L1 (w, b and the rest of the row). Each variant is checked against the
default route's output, then timed with the bench's steady timer, in --rounds alternating rounds.

    WARPFORGE_FASTPATH=0 python benchmarks/probe_ln_loop_hold.py [--ns 32768,65536] [--rounds 3]
"""
from __future__ import annotations

import argparse

import torch
import triton

import warpforge as wf
from warpforge.bench import timing
from warpforge.ops.norms import _layer_norm_fwd_loop_kernel

BF16 = torch.bfloat16
VARIANTS = [(b, w, h, r) for b, w in ((16384, 32), (8192, 32), (16384, 16), (8192, 16))
            for h, r in ((False, False), (False, True), (True, False), (True, True))]


def loop_call(x, w, b, block, warps, hold, rev):
    m, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(m, device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)

    def call():
        _layer_norm_fwd_loop_kernel[(m,)](x, y, w, b, mean, rstd, m, n, x.stride(0), y.stride(0), 1e-5,
                                          HAS_W=True, HAS_B=True, BLOCK_N=block, ROWS=1, EVEN_N=n % block == 0,
                                          HOLD_LAST=hold, REVERSE=rev, num_warps=warps)
        return y
    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="32768,65536")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    cfg = timing.TimingConfig()
    table = []
    for n in [int(v) for v in a.ns.split(",")]:
        m = 2**27 // n
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=BF16) + 3.0
        w = torch.randn(n, device="cuda", dtype=BF16)
        b = torch.randn(n, device="cuda", dtype=BF16)
        xr = torch.randn(m, n, device="cuda", dtype=BF16)
        wr = torch.randn(n, device="cuda", dtype=BF16)
        ref = wf.layer_norm(x, (n,), w, b)
        calls = {"default route": lambda: wf.layer_norm(x, (n,), w, b),
                 "rms_norm default": lambda: wf.rms_norm(xr, (n,), wr, 1e-6)}
        for v in VARIANTS:
            call = loop_call(x, w, b, *v)
            got = call()
            torch.cuda.synchronize()
            diff = (got.float() - ref.float()).abs().max().item()
            name = f"loop {v[0]}x{v[1]} hold={int(v[2])} rev={int(v[3])}"
            if not diff <= 0.0625:
                print(f"{name}: WRONG, max diff {diff}")
                continue
            calls[name] = call
        times = {k: [] for k in calls}
        for _ in range(a.rounds):
            for k, fn in calls.items():
                times[k].append(1e3 * timing.device_ms(fn, cfg, 4 * m * n * 2))
        nbytes = 2 * m * n * 2 + 2 * n * 2
        for k, ts in times.items():
            best = min(ts)
            gbps = nbytes / best / 1e3
            print(f"N={n} {k:34s} " + " ".join(f"{t:7.1f}" for t in ts) + f"  best {best:7.1f} us  {gbps:6.0f} GB/s")
            table.append((n, k, best, gbps))
    print("\nN | variant | best us | GB/s")
    for n, k, best, gbps in table:
        print(f"{n} | {k} | {best:.1f} | {gbps:.0f}")


if __name__ == "__main__":
    main()
