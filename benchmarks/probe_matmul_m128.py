"""GPU probe: M = 128 configurations under the bench's own timing (clean flush, GPU time only),
three alternating rounds, against cuBLAS. The tuner (do_bench, memset flush) and the m128 sweep of
probe_matmul.py disagreed with the bench on which configuration wins at 128 x 4096 x 4096.

    python benchmarks/probe_matmul_m128.py [--out DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import matmul as mm
from warpforge.runtime.heuristics import MatmulConfig

CONFIGS = {
    "tiled 64x64x128 s6 sk1": MatmulConfig(64, 64, 128, group_m=8, num_stages=6, num_warps=4, split_k=1),
    "tiled 64x64x128 s6 sk2": MatmulConfig(64, 64, 128, group_m=8, num_stages=6, num_warps=4, split_k=2),
    "tiled 64x64x64 s6 sk2": MatmulConfig(64, 64, 64, group_m=8, num_stages=6, num_warps=4, split_k=2),
    "tma 128x32x128 s5": MatmulConfig(128, 32, 128, group_m=1, num_stages=5, num_warps=4, persistent=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    tc = TimingConfig.quick()
    lines = []
    m, n, k = 128, 4096, 4096
    for dt, layout in [(torch.bfloat16, "nt"), (torch.float16, "nt"), (torch.bfloat16, "nn")]:
        a = torch.randn(m, k, device="cuda", dtype=dt)
        w = torch.randn(n, k, device="cuda", dtype=dt)
        b = w.T if layout == "nt" else w.T.contiguous()
        out = torch.empty(m, n, device="cuda", dtype=dt)
        ref = torch.matmul(a, b)
        impls = {"cuBLAS": lambda: torch.matmul(a, b)}
        for name, c in CONFIGS.items():
            fn = mm._launch_tma if c.persistent else mm._launch_tiled
            impls[name] = (lambda fn=fn, c=c, name=name: fn(a, b, out, mm._Epilogue(out), c, ("m128", name, dt, layout)))
            impls[name]()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            assert err < 1e-2, (name, err)
        times = {name: [] for name in impls}
        for _ in range(3):
            for name, f in impls.items():
                times[name].append(device_ms(f, tc, (m * k + k * n + m * n) * 2) * 1e3)
        best_ref = min(times["cuBLAS"])
        for name, ts in times.items():
            line = (f"128x4096x4096 {str(dt)[6:]} {layout} | {name} | " + " ".join(f"{t:.1f}" for t in ts)
                    + f" us | least {min(ts):.1f} | {best_ref / min(ts):.3f}x cuBLAS")
            lines.append(line)
            print(line, flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_matmul_m128.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
