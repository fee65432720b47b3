"""The Gluon decode kernel's splits merged in-kernel against partials plus the combine launch
(issue 6; a probe, not the benchmark). For each cell (Hq 32 / Hkv 8, D 128, bf16, pages of 16
shuffled), timed as the bench times it (clean: one call after a flush), in alternating rounds:

- sdpa[cudnn] on the unpaged problem;
- ``decode_attention`` with ``decode_attention_sm90.FUSED`` on (the last split of each
  (sequence, kv head) merges, one launch) and off (partials and the combine kernel);
- both with every length 0 (the calls' fixed cost).

Then checks, per route: the error against the float32 reference on ragged lengths (0, 1, odd,
full), two calls bitwise equal, and the arrival counters back at zero; and host time per call.

    python benchmarks/probe_decode_fused.py [--shapes 1x4096,8x4096] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import warpforge as wf
from decode_probe_inputs import cudnn_decode, paged_problem
from warpforge.bench.timing import TimingConfig, device_ms, host_us
from warpforge.ops import decode_attention as DA
from warpforge.runtime import launch


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="1x4096,1x8192,1x16384,1x32768,4x16384,8x4096,8x16384,64x4096")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from warpforge.ops import decode_attention_sm90 as G
    cfg = TimingConfig.quick()
    routes = {"fused": True, "combine": False}

    def call(q, kc, vc, bt, sl, fused):
        G.FUSED = fused
        return wf.decode_attention(q, kc, vc, bt, sl, validate=False)

    rows = []
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
        q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx)
        sl0 = torch.zeros_like(sl)
        ref, cudnn = cudnn_decode(q, kc, vc, bt, ctx, lambda fn: device_ms(fn, cfg, kv_bytes))
        row = {"shape": sh, "splits": G.plan(bsz * kc.shape[2], bt.shape[1] * kc.shape[1], 132)[0], "cudnn": [cudnn]}
        for name, fused in routes.items():
            row[name + " err"] = rel(call(q, kc, vc, bt, sl, fused), ref)
        for r in range(a.rounds):
            order = list(routes.items()) if r % 2 == 0 else list(routes.items())[::-1]
            for name, fused in order:
                row.setdefault(name, []).append(device_ms(lambda: call(q, kc, vc, bt, sl, fused), cfg, kv_bytes))
                row.setdefault(name + " len0", []).append(device_ms(lambda: call(q, kc, vc, bt, sl0, fused), cfg, kv_bytes))
        # ragged lengths on the same pages: empty, one token, odd, full
        lens = torch.randint(0, ctx + 1, (bsz,), device="cuda", dtype=torch.int32)
        lens[0] = ctx
        if bsz > 1:
            lens[1] = 0
        if bsz > 2:
            lens[2] = 1
        ref_r = DA.decode_attention_reference(q.float(), kc.float(), vc.float(), bt, lens).to(q.dtype)
        for name, fused in routes.items():
            o1, o2 = call(q, kc, vc, bt, lens, fused), call(q, kc, vc, bt, lens, fused)
            torch.cuda.synchronize()
            row[name + " ragged err"] = rel(o1, ref_r)
            row[name + " bitwise"] = bool(torch.equal(o1, o2))
            row[name + " nan"] = bool(o1.isnan().any())
        row["counters zero"] = all(int(b.abs().sum()) == 0 for b in launch.COUNTERS.values())
        if bsz == 1:
            for name, fused in routes.items():
                row[name + " host us"] = host_us(lambda: call(q, kc, vc, bt, sl, fused))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, kc, vc, bt
        torch.cuda.empty_cache()
    G.FUSED = True
    with open(os.path.join(a.out, "decode_fused.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    print(f"\n{'shape':>8s} {'S':>3s} {'cudnn':>7s} {'fused':>7s} {'combine':>7s} {'f/c':>6s} {'cudnn/f':>7s} "
          f"{'len0 f':>7s} {'len0 c':>7s} {'err f':>8s} {'ragged f':>8s} {'bits':>5s} {'host f/c':>11s}   (us, min of rounds)")
    for row in rows:
        f, c, cu = (min(row[k]) * 1e3 for k in ("fused", "combine", "cudnn"))
        host = f"{row['fused host us']:.0f}/{row['combine host us']:.0f}" if "fused host us" in row else "-"
        print(f"{row['shape']:>8s} {row['splits']:3d} {cu:7.1f} {f:7.1f} {c:7.1f} {f / c:6.3f} {cu / f:7.3f} "
              f"{min(row['fused len0']) * 1e3:7.1f} {min(row['combine len0']) * 1e3:7.1f} {row['fused err']:8.1e} "
              f"{row['fused ragged err']:8.1e} {str(row['fused bitwise'] and row['counters zero'])[:5]:>5s} {host:>11s}")


if __name__ == "__main__":
    main()
