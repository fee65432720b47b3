"""GPU probe: which kernels cuBLAS (torch.matmul) launches for the bench's GEMM shapes -- the kernel
name carries its tile, cluster shape and schedule (e.g. ``..._64x128x64_1x2x1_..._warpspecialized``),
the design our configurations are measured against.

    python benchmarks/probe_cublas_kernels.py [--out DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = [(16, 4096, 4096), (128, 4096, 4096), (128, 14336, 4096), (128, 4096, 14336),
          (4096, 4096, 4096), (4096, 14336, 4096), (8192, 8192, 8192), (16384, 14336, 4096)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    lines = [torch.cuda.get_device_name()]
    for dt in (torch.bfloat16, torch.float16):
        for m, n, k in SHAPES:
            for layout in ("nt", "nn", "tn"):
                a = torch.randn(m, k, device="cuda", dtype=dt) if layout != "tn" else \
                    torch.randn(k, m, device="cuda", dtype=dt).T
                b = torch.randn(n, k, device="cuda", dtype=dt).T if layout == "nt" else \
                    torch.randn(k, n, device="cuda", dtype=dt)
                torch.matmul(a, b)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    torch.matmul(a, b)
                    torch.cuda.synchronize()
                names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
                line = f"{str(dt)[6:]} {layout} {m}x{n}x{k}: " + " | ".join(names)
                lines.append(line)
                print(line, flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_cublas_kernels.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
