"""RoPE launch shapes (not the benchmark): q (4, 32, 4096, 128), k (4, 8, 4096, 128) bf16, HF
rotate-half tables. Forces `ops/rope.py`'s config to each variant (tokens a program, q / k heads a
loop step, warps), checks it against eager, and times the forward and backward kernels with the
bench's timer beside torch.compile of the eager formula.

    python benchmarks/probe_rope.py
"""
from __future__ import annotations

import torch

from warpforge.bench import timing
from warpforge.bench.workloads import _eager_rope, rope_tables
from warpforge.ops import rope as R
from warpforge.runtime import device as dev
from warpforge.runtime.heuristics import RopeConfig

B, HQ, HK, S, D = 4, 32, 8, 4096, 128
# (block_s, heads_q, heads_k, num_warps, split): split = programs sharing one token block's head
# steps (grid axis 1); split = all steps makes every program one load-rotate-store of one step
VARIANTS = [(4, 8, 8, 8, 1), (8, 8, 8, 4, 5), (16, 4, 4, 4, 10), (32, 4, 4, 4, 10), (32, 2, 2, 4, 20),
            (16, 2, 2, 4, 20), (64, 2, 2, 8, 20), (16, 4, 4, 2, 10), (8, 4, 4, 2, 10), (64, 4, 4, 8, 10),
            (32, 8, 8, 8, 5), (16, 8, 8, 4, 5)]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    copy = dev.ceilings()["copy_gbps"]
    cfg_t = timing.TimingConfig.quick()
    q = torch.randn(B, HQ, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16)
    cos, sin = rope_tables(S, D, torch.bfloat16, "cuda")
    nbytes = 2 * (q.numel() + k.numel()) * 2
    rq, rk = _eager_rope(q, k, cos, sin, None)
    rows = []
    comp = torch.compile(lambda a, b: _eager_rope(a, b, cos, sin, None))
    comp(q, k)
    ms = timing.device_ms(lambda: comp(q, k), cfg_t, nbytes)
    rows.append(("compile", ms, ms))
    real = R.rope_config
    print("default:", real(B, S, HQ, HK, D), flush=True)
    for bs, hq, hk, w, sp in [(None, 0, 0, 0, 0)] + VARIANTS:
        c = real(B, S, HQ, HK, D) if bs is None else RopeConfig(bs, hq, hk, sp, w)
        R.rope_config = lambda *a, _c=c: _c
        name = "default" if bs is None else f"{bs} tok x {hq}/{hk} heads, {w} warps, split {sp}"
        try:
            oq, ok_ = R._rope_launch(q, k, cos, sin, None, 0, False, backward=False)
            err = max(rel(oq, rq), rel(ok_, rk))
            if not err < 1e-2:
                raise AssertionError(f"rel err {err}")
            f = timing.device_ms(lambda: R._rope_launch(q, k, cos, sin, None, 0, False, backward=False), cfg_t, nbytes)
            b = timing.device_ms(lambda: R._rope_launch(q, k, cos, sin, None, 0, False, backward=True), cfg_t, nbytes)
            rows.append((name, f, b))
        except Exception as e:  # noqa: BLE001
            rows.append((f"{name} FAILED {type(e).__name__}: {str(e)[:60]}", 0.0, 0.0))
        finally:
            R.rope_config = real
        print(rows[-1], flush=True)
    print(f"\ncopy {copy:,.0f} GB/s; RoPE kernels, % of copy (fwd / bwd)")
    for name, f, b in rows:
        if f:
            print(f"{name:34s} {f * 1e3:7.1f} us {100 * nbytes / f / 1e6 / copy:6.1f}%   {b * 1e3:7.1f} us {100 * nbytes / b / 1e6 / copy:6.1f}%")
        else:
            print(name)


if __name__ == "__main__":
    main()
