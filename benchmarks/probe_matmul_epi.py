"""GPU probe: the persistent TMA kernel's epilogue (pointer stores vs TMA stores, whole or in two
column slices), group size, stages and warp specialisation, on the large shapes where it trails
cuBLAS, forward (A @ W^T) and the backward's two layouts (dY @ W, dY^T @ X).

    python benchmarks/probe_matmul_epi.py [--out DIR] [--quick]

Every configuration is checked against cuBLAS's answer first, then timed under the bench's own
condition (warpforge.bench.timing.device_ms: these calls move >= 4 L2s, so back-to-back). Prints a
short table last (best configuration per problem, ratio to cuBLAS); every line goes to
DIR/probe_matmul_epi.log. Not a benchmark: `warpforge bench matmul` is.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import matmul as mm
from warpforge.runtime.heuristics import MatmulConfig

LOG: list[str] = []


def log(*a) -> None:
    s = " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


def problems(quick: bool):
    """(name, a, b) with a (M, K) and b (K, N) in the layouts the bench's calls produce."""
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)   # noqa: E731
    out = []
    for m, n, k in [(8192, 8192, 8192), (4096, 128256, 4096), (16384, 14336, 4096)] + (
            [] if quick else [(16384, 128256, 4096)]):
        x, w = r(m, k), r(n, k)
        out.append((f"fwd {m}x{n}x{k}", x, w.T))
    for m, n, k in [(16384, 14336, 4096), (16384, 4096, 14336)]:
        x, w, dy = r(m, k), r(n, k), r(m, n)
        out.append((f"dX {m}x{n}x{k}", dy, w))          # (M, N) @ (N, K): both row-major
        out.append((f"dW {m}x{n}x{k}", dy.T, x))        # (N, M) column-major @ (M, K)
    return out


def configs(quick: bool) -> list[MatmulConfig]:
    base = dict(num_warps=8, persistent=True)
    out = [MatmulConfig(128, 256, 64, group_m=g, num_stages=st, store_split=sp, **base)
           for g in (8, 16) for st in (3, 4) for sp in (0, 2)]
    out += [MatmulConfig(128, 256, 64, group_m=8, num_stages=3, store_split=1, **base),
            MatmulConfig(256, 128, 64, group_m=8, num_stages=3, store_split=2, **base),
            MatmulConfig(256, 128, 64, group_m=8, num_stages=4, store_split=0, **base),
            MatmulConfig(128, 256, 64, group_m=8, num_stages=3, store_split=2, warp_specialize=True, **base)]
    return out[:6] if quick else out


def name(c: MatmulConfig) -> str:
    return (f"{c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} s{c.num_stages} "
            f"store{c.store_split}{' ws' if c.warp_specialize else ''}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    tc = TimingConfig.quick()
    summary = []
    for pname, a, b in problems(args.quick):
        m, k = a.shape
        n = b.shape[1]
        nbytes = (m * k + k * n + m * n) * 2
        flops = 2 * m * n * k
        ref = torch.matmul(a, b)
        t_ref = device_ms(lambda: torch.matmul(a, b), tc, nbytes)
        log(f"{pname} layouts a{mm._layout(a)} b{mm._layout(b)}: cuBLAS {t_ref:.4f} ms {flops / t_ref / 1e9:.0f} TFLOP/s")
        best = None
        for c in configs(args.quick):
            c = mm._fit_stages(c, 2, 2)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            ep = mm._Epilogue(out)
            try:
                mm._launch_tma(a, b, out, ep, c, ("probe", pname, c))
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- out of shared memory etc.: report, go on
                log(f"  {name(c)}: failed {type(e).__name__}: {str(e)[:120]}")
                continue
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            if not err < 1e-2:
                log(f"  {name(c)}: WRONG rel err {err:.3e}")
                continue
            t = device_ms(lambda: mm._launch_tma(a, b, out, ep, c, ("probe", pname, c)), tc, nbytes)
            log(f"  {name(c)}: {t:.4f} ms {flops / t / 1e9:.0f} TFLOP/s {t_ref / t:.3f}x cuBLAS (err {err:.1e})")
            if best is None or t < best[1]:
                best = (c, t)
        if best:
            summary.append((pname, name(best[0]), best[1], t_ref))
    log("\nproblem | best config | ms | cuBLAS ms | ratio")
    for p, c, t, r in summary:
        log(f"{p} | {c} | {t:.4f} | {r:.4f} | {r / t:.3f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_matmul_epi.log").write_text("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
