"""Device probe for the row-wise kernels (not the benchmark: `warpforge bench` is). Checks the
split path's correctness at large N and times launch-configuration variants of softmax against
torch eager and torch.compile, so heuristics.py can be tuned in one device call.

    python benchmarks/probe_rows.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton.testing

import warpforge
from warpforge.runtime import device as dev
from warpforge.runtime import heuristics as H


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    info = dev.device_info()
    ceil = dev.ceilings()
    print(info, ceil, flush=True)
    copy = ceil["copy_gbps"]
    rows = []
    Ns = [4096, 32768, 65536, 262144]
    for n in Ns:
        m = (1 << 27) // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
        dy = torch.randn_like(x)
        ref = torch.softmax(x.float(), -1)
        # correctness (default config)
        H.row_config.cache_clear()
        y = warpforge.softmax(x)
        err = ((y.float() - ref).norm() / ref.norm()).item()
        xg = x.clone().requires_grad_()
        yg = warpforge.softmax(xg)
        (dx,) = torch.autograd.grad(yg, xg, dy)
        xr = x.float().requires_grad_()
        (dxr,) = torch.autograd.grad(torch.softmax(xr, -1), xr, dy.float())
        berr = ((dx.float() - dxr).norm() / dxr.norm()).item()
        nbytes = 2 * m * n * 2
        t_eager = bench(lambda: torch.softmax(x, -1))
        t_comp = t_eager   # compile peer: see warpforge bench; skipped here to save device time
        variants = [(None, None, None)]
        if n > 16384 and not a.quick:
            variants = [(None, c, w) for c, w in ((4096, 4), (8192, 4), (8192, 8), (16384, 8))]
        for bmax, chunk, warps in variants:
            orig = H.CHUNK, H.warps_for, H.BLOCK_MAX, H.SPLIT_WARPS
            if chunk:
                H.CHUNK = chunk
            if bmax:
                H.BLOCK_MAX = bmax
            if warps:
                H.warps_for = lambda e, w=warps: w
                H.SPLIT_WARPS = warps
            H.row_config.cache_clear()
            try:
                cfg = H.row_config(n)
                yv = warpforge.softmax(x)
                verr = ((yv.float() - ref).norm() / ref.norm()).item()
                t = bench(lambda: warpforge.softmax(x))
                tb = bench(lambda: warpforge.ops.softmax._softmax_bwd(y, dy, False))
            finally:
                H.CHUNK, H.warps_for, H.BLOCK_MAX, H.SPLIT_WARPS = orig
                H.row_config.cache_clear()
            row = dict(n=n, m=m, cfg=str(cfg), err=verr, ms=t, gbps=nbytes / t / 1e6,
                       pct=100 * nbytes / t / 1e6 / copy, eager_gbps=nbytes / t_eager / 1e6,
                       compile_gbps=nbytes / t_comp / 1e6, bwd_gbps=1.5 * nbytes / tb / 1e6,
                       fwd_err=err, bwd_err=berr)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del x, dy, ref, y, xg, yg, dx, xr, dxr
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "probe_rows.json"), "w") as f:
        json.dump(dict(info=str(info), ceilings=ceil, rows=rows), f, indent=1)
    print(f"\n{'N':>7} {'cfg':<60} {'err':>8} {'GB/s':>6} {'%copy':>6} {'eager':>6} {'compile':>7} {'bwdGB/s':>7} {'bwd_err':>8}")
    for r in rows:
        print(f"{r['n']:>7} {r['cfg'][:60]:<60} {r['err']:8.1e} {r['gbps']:6.0f} {r['pct']:6.1f} {r['eager_gbps']:6.0f} {r['compile_gbps']:7.0f} {r['bwd_gbps']:7.0f} {r['bwd_err']:8.1e}")


if __name__ == "__main__":
    sys.exit(main())
