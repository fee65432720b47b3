"""Device probe: amax forward+backward with the tie mask (rows a program holds) against the paths it
replaces and torch.compile, bf16, M*N = 2^27, steady GPU timing (us): the mask forward (and one
other tile), the backward from the mask against a memset of dx, the kernels one call launches.

    python benchmarks/probe_amax_mask.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import warpforge as wf
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import reduce as R
from warpforge.runtime import device as dev


def fwd_bwd(fn, x, dy):
    def call():
        x.grad = None
        fn(x).backward(dy)
    return call


def kernels_of(fn) -> str:
    """The GPU kernels one call of fn launches, with their times (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)


def main():
    from warpforge.runtime.heuristics import RowConfig, amax_mask_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    cfg = TimingConfig()
    real_path, real_cfg = R.amax_grad_path, R.amax_mask_config
    rows = []
    for n in (1024, 4096, 8192, 16384, 32768):
        m = (1 << 27) // n
        x = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3).requires_grad_()
        dy = torch.randn(m, device="cuda", dtype=torch.bfloat16)
        xr = x.detach().clone().requires_grad_()
        xr.amax(-1).backward(dy)
        xd = x.detach()
        res = {}
        base = amax_mask_config(n)
        variants = [("fwd mask", base)]
        if base.rows > 1:
            variants.append((f"fwd r{base.rows // 2}", RowConfig("block", base.block_n, base.rows // 2, base.num_warps)))
        ref = None
        for name, c in variants:
            R.amax_mask_config = lambda nn, c=c: c
            got = R._amax_mask_rows(xd, xd.dtype)
            if ref is None:
                ref = got
                assert torch.equal(got[0], xd.amax(-1))
            assert all(torch.equal(p, q) for p, q in zip(got, ref)), (name, n)
            res[name] = device_ms(lambda: R._amax_mask_rows(xd, xd.dtype), cfg, m * n * 2)
        R.amax_mask_config = real_cfg
        _, ties, bits = ref
        dx = torch.empty_like(xd)
        R._amax_bits_scatter(bits, ties, dy, dx)
        torch.testing.assert_close(dx, xr.grad)
        res["bwd bits"] = device_ms(lambda: R._amax_bits_scatter(bits, ties, dy, dx), cfg, m * n * 2)
        res["zero_"] = device_ms(lambda: dx.zero_(), cfg, m * n * 2)
        res["fwd plain"] = device_ms(lambda: R._reduce_rows(xd, xd.dtype, True), cfg, m * n * 2)
        for name, path in (("ties", "ties"), ("plain", None)):
            if name == "ties" and n <= 4096:
                continue                                  # (its block-mode count is a torch pass)
            R.amax_grad_path = lambda t, p=path: p
            res[name] = device_ms(fwd_bwd(wf.amax, x, dy), cfg, 3 * m * n * 2)
        R.amax_grad_path = real_path
        x.grad = None
        wf.amax(x).backward(dy)                           # the fast path is off at this size
        torch.testing.assert_close(x.grad, xr.grad)
        res["default"] = device_ms(fwd_bwd(wf.amax, x, dy), cfg, 3 * m * n * 2)
        torch._dynamo.reset()
        comp = torch.compile(lambda t: t.amax(-1), dynamic=False)
        res["compile"] = device_ms(fwd_bwd(comp, xr, dy), cfg, 3 * m * n * 2)
        if n == 4096:
            print(kernels_of(fwd_bwd(wf.amax, x, dy)), flush=True)
        for k, ms in res.items():
            rows.append({"m": m, "n": n, "impl": k, "us": ms * 1e3})
        line = "  ".join(f"{k} {v * 1e3:.1f}" for k, v in res.items())
        print(f"{m:6d}x{n:<6d} compile/default {res['compile'] / res['default']:.3f} | {line}", flush=True)
    with open(os.path.join(a.out, "probe_amax_mask.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
