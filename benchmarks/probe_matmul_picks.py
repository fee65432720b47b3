"""GPU probe: launch configurations for the short-M and backward GEMMs where the H100 bench fell
short of cuBLAS (benchmarks/NOTES.md, items 33-35), under the bench's own timing (clean flush or
steady, GPU time only), three rounds alternating over cuBLAS and the configs, each keeping its least.

- M = 128 forward (A @ W^T, "nt") in fp16: the 64-row persistent tiles that won in bf16
  (probe_matmul_streamk.log: 64x64x128 s6 at 128x4096x4096 1.009x cuBLAS, 64x128x128 s4 at
  128x14336x4096 0.981x).
- dX = dY @ W ("nn", M = 128) and dW = dY^T @ X ("tn", K = 128): the backward's two GEMMs of a
  128-token linear layer (matmul_bwd read 0.92x at 128x4096x4096).
- dW at 16384 tokens ("tn", 14336 x 4096 x 16384; 0.92x in the stream-K probe).

    python benchmarks/probe_matmul_picks.py [--out DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from warpforge.runtime.heuristics import MatmulConfig

from probe_matmul_streamk import time_problem

P = dict(persistent=True)
SHORT = {
    "tiled 64x64x128 s6": MatmulConfig(64, 64, 128, group_m=8, num_stages=6, num_warps=4),
    "tma 128x32x128 s5 w4": MatmulConfig(128, 32, 128, group_m=1, num_stages=5, num_warps=4, **P),
    "tma 64x64x128 s6 w4": MatmulConfig(64, 64, 128, group_m=8, num_stages=6, num_warps=4, **P),
    "tma 64x64x128 s8 w4": MatmulConfig(64, 64, 128, group_m=8, num_stages=8, num_warps=4, **P),
    "tma 64x128x128 s4 w4": MatmulConfig(64, 128, 128, group_m=8, num_stages=4, num_warps=4, **P),
    "tma 128x128x64 s4": MatmulConfig(128, 128, 64, group_m=1, num_stages=4, num_warps=8, **P),
}
# dW with K = 128: one or two K-steps, the output write is the cost
WIDE_K128 = {
    "tma 128x256x64 g8 s3 st2": MatmulConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, store_split=2, **P),
    "tma 128x128x64 g8 s2 st1": MatmulConfig(128, 128, 64, group_m=8, num_stages=2, num_warps=8, store_split=1, **P),
    "tma 128x128x64 g8 s2": MatmulConfig(128, 128, 64, group_m=8, num_stages=2, num_warps=8, **P),
    "tma 128x128x128 g8 s1 st1 w4": MatmulConfig(128, 128, 128, group_m=8, num_stages=1, num_warps=4, store_split=1, **P),
    "tiled 128x128x64 s2": MatmulConfig(128, 128, 64, group_m=8, num_stages=2, num_warps=8),
}
BIG = {
    "tma 128x256x64 g8 s3 st2": MatmulConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, store_split=2, **P),
    "tma 128x256x64 g16 s3 st2": MatmulConfig(128, 256, 64, group_m=16, num_stages=3, num_warps=8, store_split=2, **P),
    "tma 128x256x64 g8 s4 st2": MatmulConfig(128, 256, 64, group_m=8, num_stages=4, num_warps=8, store_split=2, **P),
    "tma 256x128x64 g8 s3 st2": MatmulConfig(256, 128, 64, group_m=8, num_stages=3, num_warps=8, store_split=2, **P),
    "tma 128x256x64 g8 s3": MatmulConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, **P),
}
F16, B16 = torch.float16, torch.bfloat16
PROBLEMS = [
    (128, 4096, 4096, "nt", SHORT, F16),
    (128, 14336, 4096, "nt", SHORT, F16),
    (128, 4096, 4096, "nn", SHORT, B16),       # dX of 128 x 4096 x 4096
    (128, 14336, 4096, "nn", SHORT, B16),      # dX of 128 x 4096 x 14336
    (128, 4096, 14336, "nn", SHORT, B16),      # dX of 128 x 14336 x 4096
    (4096, 4096, 128, "tn", WIDE_K128, B16),   # dW of 128 x 4096 x 4096
    (14336, 4096, 128, "tn", WIDE_K128, B16),  # dW of 128 x 14336 x 4096
    (14336, 4096, 16384, "tn", BIG, B16),      # dW of 16384 x 14336 x 4096
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    lines = [f"{torch.cuda.get_device_name()} | problem | config | rounds (us) | least | x cuBLAS"]
    for m, n, k, layout, configs, dt in PROBLEMS:
        lines += time_problem(m, n, k, layout, configs, dt, tag="picks")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_matmul_picks.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
