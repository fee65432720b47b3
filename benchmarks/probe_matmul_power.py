"""GPU probe: does a warm GPU slow our persistent GEMM more than cuBLAS? (the bench measured 8192^3
at 0.85-0.92x cuBLAS where a probe on a cold GPU minutes earlier measured the same configuration
at 1.02-1.03x).

    python benchmarks/probe_matmul_power.py [--out DIR] [--seconds S]

Three phases on 8192^3 and 16384 x 14336 x 4096 bf16 (A @ W^T): (1) cold, alternating rounds of
ours and cuBLAS timed like the bench (device_ms, steady); (2) S seconds of each back to back, the
rate printed every second; (3) the alternating rounds again. Run `nvidia-smi --query-gpu=...
-lms 200` beside it for clocks, power and throttle reasons. Prints a short table last.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import matmul as mm
from warpforge.runtime.heuristics import MatmulConfig

LOG: list[str] = []


def log(*a) -> None:
    s = f"[{time.strftime('%H:%M:%S')}] " + " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    tc = TimingConfig.quick()
    table = []
    for m, n, k in [(8192, 8192, 8192), (16384, 14336, 4096)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        b = w.T
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 2 * m * n * k
        nbytes = (m * k + k * n + m * n) * 2
        impls = {"cuBLAS": lambda: torch.matmul(a, b)}
        for sp in (0, 2):
            c = MatmulConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, persistent=True, store_split=sp)
            impls[f"ours store{sp}"] = (lambda c=c: mm._launch_tma(a, b, out, mm._Epilogue(out), c, ("power", c, m)))
        for f in impls.values():
            f()
        torch.cuda.synchronize()

        def rounds(label, r=3):
            got = {name: [] for name in impls}
            for _ in range(r):
                for name, f in impls.items():
                    got[name].append(device_ms(f, tc, nbytes))
            for name, ts in got.items():
                log(f"{m}x{n}x{k} {label} {name}: " + " ".join(f"{t:.4f}" for t in ts) + " ms")
                table.append((f"{m}x{n}x{k}", label, name, min(ts), got["cuBLAS"]))
            return got

        rounds("cold")
        for name, f in impls.items():
            t_end = time.time() + args.seconds
            while time.time() < t_end:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                calls = max(1, int(1000 / (flops / 700e12 * 1e3)))    # ~1 s of work
                s.record()
                for _ in range(calls):
                    f()
                e.record()
                e.synchronize()
                t = s.elapsed_time(e) / calls
                log(f"{m}x{n}x{k} sustained {name}: {t:.4f} ms {flops / t / 1e9:.0f} TFLOP/s")
        rounds("warm")
    log("\nshape | phase | impl | best ms | ratio to cuBLAS best")
    for shape, label, name, t, ref in table:
        log(f"{shape} | {label} | {name} | {t:.4f} | {min(ref) / t:.3f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_matmul_power.log").write_text("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
