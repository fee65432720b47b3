"""GPU probe: stream-K in the persistent TMA kernel (``MatmulConfig.stream_k``) against the same
configuration without it and against cuBLAS, under the bench's own timing (clean flush, GPU time
only), three alternating rounds, each keeping its least.

Where it should matter: shapes whose tiles leave a last wave partly idle -- 128 x 14336 x 4096 in
128 x 128 tiles is 112 tiles for 132 SMs (cuBLAS runs 128 CTAs of 112 x 128 there), 4096^3 in
128 x 256 tiles is 3.88 waves, 4096 x 14336 x 4096 13.6.

    python benchmarks/probe_matmul_streamk.py [--out DIR] [--quick]
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import matmul as mm
from warpforge.runtime.heuristics import MatmulConfig

P = dict(persistent=True)
BIG = MatmulConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, store_split=2, **P)
BIG16 = MatmulConfig(128, 256, 64, group_m=16, num_stages=4, num_warps=8, **P)
M128 = {
    "tma 128x128x64 s4": MatmulConfig(128, 128, 64, group_m=1, num_stages=4, num_warps=8, **P),
    "tma 128x64x64 s4 w4": MatmulConfig(128, 64, 64, group_m=1, num_stages=4, num_warps=4, **P),
    "tma 128x64x128 s4 w4": MatmulConfig(128, 64, 128, group_m=1, num_stages=4, num_warps=4, **P),
    "tma 128x32x128 s5 w4": MatmulConfig(128, 32, 128, group_m=1, num_stages=5, num_warps=4, **P),
    "tma 64x64x128 s6 w4": MatmulConfig(64, 64, 128, group_m=8, num_stages=6, num_warps=4, **P),
    "tma 64x128x128 s4 w4": MatmulConfig(64, 128, 128, group_m=8, num_stages=4, num_warps=4, **P),
}
TILED = {"tiled 64x64x128 s6": MatmulConfig(64, 64, 128, group_m=8, num_stages=6, num_warps=4)}


def with_sk(configs: dict) -> dict:
    out = {}
    for name, c in configs.items():
        out[name] = c
        if c.persistent:
            out[name + " SK"] = dataclasses.replace(c, stream_k=True)
    return out


# (m, n, k, layout of A/B: "nt" = forward A @ W^T, "nn" = dX = dY @ W, "tn" = dW = dY^T @ X, configs)
PROBLEMS = [
    (128, 14336, 4096, "nt", with_sk({**M128, **TILED})),
    (128, 4096, 4096, "nt", with_sk({**M128, **TILED})),
    (128, 128256, 4096, "nt", with_sk({"tma 128x128x64 s4": M128["tma 128x128x64 s4"]})),
    (4096, 4096, 4096, "nt", with_sk({"tma 128x256x64 g8 s3 st2": BIG, "tma 128x256x64 g16 s4": BIG16})),
    (4096, 14336, 4096, "nt", with_sk({"tma 128x256x64 g8 s3 st2": BIG})),
    (4096, 4096, 14336, "nt", with_sk({"tma 128x256x64 g8 s3 st2": BIG})),
    (16384, 4096, 14336, "nn", with_sk({"tma 128x256x64 g8 s3 st2": BIG})),
    (14336, 4096, 16384, "tn", with_sk({"tma 128x256x64 g8 s3 st2": BIG})),
]


def operands(m, n, k, layout, dt):
    a = torch.randn(k, m, device="cuda", dtype=dt).T if layout[0] == "t" else torch.randn(m, k, device="cuda", dtype=dt)
    b = torch.randn(n, k, device="cuda", dtype=dt).T if layout[1] == "t" else torch.randn(k, n, device="cuda", dtype=dt)
    return a, b


def time_problem(m, n, k, layout, configs, dt=torch.bfloat16, rounds=3, tag="sk") -> list[str]:
    """Check every config against an fp32 product, then time cuBLAS and each config in ``rounds``
    alternating rounds under the bench's timing; one table line each (least, ratio to cuBLAS)."""
    tc = TimingConfig.quick()
    a, b = operands(m, n, k, layout, dt)
    out = torch.empty(m, n, device="cuda", dtype=dt)
    ref = torch.matmul(a.float(), b.float())
    impls = {"cuBLAS": lambda: torch.matmul(a, b)}
    for name, c in configs.items():
        c = mm._fit_stages(c, a.element_size(), out.element_size())
        fn = mm._launch_tma if c.persistent else mm._launch_tiled
        impls[name] = (lambda fn=fn, c=c, name=name: fn(a, b, out, mm._Epilogue(out), c, (tag, name, m, n, k, dt)))
        out.fill_(float("nan"))
        impls[name]()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (name, err)
    times = {name: [] for name in impls}
    nbytes = (m * k + k * n + m * n) * a.element_size()
    for _ in range(rounds):
        for name, f in impls.items():
            times[name].append(device_ms(f, tc, nbytes) * 1e3)
    best_ref = min(times["cuBLAS"])
    lines = []
    for name, ts in times.items():
        line = (f"{m}x{n}x{k} {layout} {str(dt)[6:]} | {name} | " + " ".join(f"{t:.1f}" for t in ts)
                + f" | {min(ts):.1f} | {best_ref / min(ts):.3f}")
        lines.append(line)
        print(line, flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="the first two problems only")
    args = ap.parse_args()
    lines = [f"{torch.cuda.get_device_name()} | problem | config | rounds (us) | least | x cuBLAS"]
    for m, n, k, layout, configs in PROBLEMS[:2] if args.quick else PROBLEMS:
        lines += time_problem(m, n, k, layout, configs)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_matmul_streamk.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
