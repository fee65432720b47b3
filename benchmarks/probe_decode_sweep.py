"""Device probe: the decode kernels' launch constants (never swept before: heuristics.py's
DECODE_* were the design's starting point), Hq 32 / Hkv 8, D 128, bf16, pages of 16 shuffled, over
batch x context; % of the measured copy bandwidth on the KV bytes, against SDPA on the same
problem unpaged (B, H, S, D) in the same process. Steady GPU timing (the bench's).

    python benchmarks/probe_decode_sweep.py [--out DIR] [--per-sm 3,6,12] [--tiles 16384,32768]
        [--warps 4,8] [--stages 2,3,4] [--pair-stages]   (--pair-stages: 3 stages at 16 KB, 2 at 32 KB)
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os

import torch
import torch.nn.functional as F

import warpforge as wf
from decode_probe_inputs import paged_problem, unpaged
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import decode_attention as DA
from warpforge.runtime import device as dev
from warpforge.runtime import heuristics as H

SHAPES = [(1, 4096), (1, 32768), (8, 8192), (16, 4096), (32, 16384), (64, 4096), (64, 32768)]
PER_SM = (3, 6, 12)
TILE = (16384, 32768)
WARPS = (4, 8)
STAGES = (2, 3, 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--per-sm", default=",".join(map(str, PER_SM)))
    ap.add_argument("--tiles", default=",".join(map(str, TILE)))
    ap.add_argument("--warps", default=",".join(map(str, WARPS)))
    ap.add_argument("--stages", default=",".join(map(str, STAGES)))
    ap.add_argument("--pair-stages", action="store_true")
    a = ap.parse_args()
    ints = lambda t: tuple(int(v) for v in t.split(","))  # noqa: E731
    grid = [(p, t, w, s) for p, t, w, s in itertools.product(ints(a.per_sm), ints(a.tiles), ints(a.warps), ints(a.stages))
            if not a.pair_stages or s == (3 if t <= 16384 else 2)]
    copy = dev.ceilings()["copy_gbps"]
    cfg_t = TimingConfig.quick()
    real = DA.decode_config
    raw = H.decode_config.__wrapped__                      # not the lru_cache: it reads the constants
    hq, hk, d, page = 32, 8, 128, 16
    rows = []
    for bsz, ctx in SHAPES:
        q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx, hq, hk, d, page)
        ref = wf.decode_attention(q, kc, vc, bt, sl)
        res = {}
        # SDPA on the same problem, unpaged
        kd, vd = unpaged(kc, bt, ctx), unpaged(vc, bt, ctx)
        q4 = q.unsqueeze(2)
        sd = F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True).squeeze(2)
        torch.testing.assert_close(sd, ref, atol=2e-2, rtol=2e-2)
        res["sdpa"] = device_ms(lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True), cfg_t, kv_bytes)
        del kd, vd
        res["default " + str(real(bsz, hk, hq // hk, bt.shape[1] * page, d, page, 2))] = device_ms(
            lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg_t, kv_bytes)
        for per_sm, tile, warps, stages in grid:
            saved = (H.DECODE_PROGRAMS_PER_SM, H.DECODE_TILE_BYTES, H.DECODE_BIG_TILE_BYTES)
            H.DECODE_PROGRAMS_PER_SM, H.DECODE_TILE_BYTES, H.DECODE_BIG_TILE_BYTES = per_sm, tile, tile
            c = dataclasses.replace(raw(bsz, hk, hq // hk, bt.shape[1] * page, d, page, 2),
                                    num_warps=warps, num_stages=stages)
            H.DECODE_PROGRAMS_PER_SM, H.DECODE_TILE_BYTES, H.DECODE_BIG_TILE_BYTES = saved
            DA.decode_config = lambda *args, c=c, **kw: c
            key = f"p{per_sm} t{tile // 1024}K w{warps} s{stages} (S={c.num_splits}, N={c.block_n})"
            try:
                out = wf.decode_attention(q, kc, vc, bt, sl, validate=False)
                torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
                res[key] = device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg_t, kv_bytes)
            except Exception as e:  # noqa: BLE001 (out of shared memory and the like: a row, not a stop)
                print(f"  {key}: {type(e).__name__}: {str(e)[:100]}", flush=True)
            finally:
                DA.decode_config = real
        for k, ms in res.items():
            rows.append({"b": bsz, "ctx": ctx, "impl": k, "us": ms * 1e3,
                         "pct_copy": kv_bytes / (ms * 1e-3) / 1e9 / copy * 100})
        best = sorted((v, k) for k, v in res.items() if k != "sdpa")[:6]
        dflt = [v for k, v in res.items() if k.startswith("default")][0]
        pct = lambda ms: kv_bytes / (ms * 1e-3) / 1e9 / copy * 100  # noqa: E731
        print(f"B{bsz:<3d} ctx {ctx:6d}: sdpa {res['sdpa'] * 1e3:8.1f} us {pct(res['sdpa']):5.1f}% | default "
              f"{dflt * 1e3:8.1f} us {pct(dflt):5.1f}% | best " +
              "; ".join(f"{k} {v * 1e3:.1f} us {pct(v):.1f}%" for v, k in best), flush=True)
    with open(os.path.join(a.out, "probe_decode_sweep.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
