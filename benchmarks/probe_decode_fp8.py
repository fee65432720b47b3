"""Device probe: decode over fp8 (e4m3) paged caches -- the Triton kernel's tile, warps and stages
-- against the same problem in bf16 (our default route, the Triton kernel alone) and cuDNN SDPA on
the dequantised values, unpaged.

Each fp8 variant runs with its own decode_config and its own plan table, swapped in before each
call, so its launches replay (no JIT, no launcher on the clock). Rounds alternate over the rows,
timed as the bench times decode (device_ms); the table gives the least round and % of copy on the
bytes that row reads (fp8 rows: 1 byte an element).

    python benchmarks/probe_decode_fp8.py [--shapes 16x8192,64x4096] [--rounds 4]
"""
from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

import warpforge.ops.decode_attention as DA
import warpforge.runtime.heuristics as heur
from decode_probe_inputs import alternate, paged_problem, shapes, timing_setup, unpaged
from warpforge.bench.timing import device_ms
from warpforge.bench.workloads import kv_fp8

SHAPES = "1x16384,8x8192,16x8192,32x16384,64x4096,64x32768"
# (block_n, num_warps, num_stages) of the fp8 Triton kernel; None: decode_config's own pick.
# (Session 56's second run, probes_s56/s56b, timed a V read as 32-bit words; that code is gone.)
VARIANTS = [None, (64, 4, 3), (128, 8, 3), (128, 4, 4), (256, 8, 2), (256, 8, 3), (64, 4, 4)]


def config_with(v):
    if v is None:
        return heur.decode_config
    block_n, warps, stages = v

    def cfg(*a):
        c = heur.decode_config(*a)
        return dataclasses.replace(c, block_n=block_n, granule=max(block_n, a[5]), num_warps=warps, num_stages=stages)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    tcfg, copy, _ = timing_setup()
    sm90 = DA._sm90_kernel()
    res, nbytes = {}, {}
    for sh, bsz, ctx in shapes(a.shapes):
        q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx)
        k8, ks = kv_fp8(kc)
        v8, vs = kv_fp8(vc)
        kd, vd = (k8.to(torch.bfloat16) * ks), (v8.to(torch.bfloat16) * vs)   # exact: power-of-two scales
        ref = DA.decode_attention(q, kd, vd, bt, sl)
        ku, vu = unpaged(kd, bt, ctx), unpaged(vd, bt, ctx)
        q4 = q.unsqueeze(2)
        del kc, vc
        plans = {}

        def route(name, cfg_fn, sm):
            plans[name] = {}

            def run(fn):
                def call():
                    DA._PLANS = plans[name]
                    DA.decode_config = cfg_fn
                    DA._SM90[0] = sm
                    return fn()
                return call
            return run

        rows = {"bf16 default": route("bf16 default", heur.decode_config, sm90)(
                    lambda: DA.decode_attention(q, kd, vd, bt, sl, validate=False)),
                "bf16 triton": route("bf16 triton", heur.decode_config, None)(
                    lambda: DA.decode_attention(q, kd, vd, bt, sl, validate=False))}
        for v in VARIANTS:
            name = "fp8 default" if v is None else "fp8 %d/%dw/%ds" % v
            rows[name] = route(name, config_with(v), sm90)(
                lambda: DA.decode_attention(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs, validate=False))

        def sdpa():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q4, ku, vu, enable_gqa=True)
        rows["cuDNN bf16"] = sdpa
        for name, fn in rows.items():
            out = fn()
            out = out.squeeze(2) if out.dim() == 4 else out
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            assert err < 2e-2 and not out.isnan().any(), (sh, name, err)
        nbytes[sh] = kv_bytes
        times = alternate(rows, a.rounds, lambda fn: device_ms(fn, tcfg, kv_bytes))
        res.update({(sh, name): us for name, us in times.items()})
        best = {name: min(us) for name, us in times.items()}
        print(f"{sh}: " + ", ".join(f"{n} {v:.1f}" for n, v in best.items()), flush=True)
        del q, k8, v8, kd, vd, ku, vu
        torch.cuda.empty_cache()
    DA.decode_config = heur.decode_config
    print(f"\n{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
    print(f"{'shape':9s} {'variant':16s} {'us':>8s} {'% copy':>7s} {'cuDNN/x':>8s}  rounds")
    for (sh, name), v in res.items():
        b = nbytes[sh] // (2 if name.startswith("fp8") else 1)
        print(f"{sh:9s} {name:16s} {min(v):8.1f} {100 * b / (min(v) * 1e-6) / 1e9 / copy:7.1f} "
              f"{min(res[(sh, 'cuDNN bf16')]) / min(v):8.3f}  {[round(x, 1) for x in v]}")


if __name__ == "__main__":
    main()
