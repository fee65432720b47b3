"""Where a small-batch decode call's time goes (issue 6; not the benchmark). For each cell (default:
batch 1 at 4K-32K and batch 8 at 4K; Hq 32 / Hkv 8, D 128, bf16, pages of 16 shuffled), timed as
the bench times it (clean: one call after a flush):

- sdpa[cudnn] on the unpaged problem, and the default call;
- the Gluon kernel's full call, its main kernel alone (partials, no combine), the call with every
  length 0 (what the call costs before and after its reads), and ring depths (``--nb``);
- the Triton split kernel's full call, its split kernel alone, and with lengths 0;
- a read-only pass over the same pages (benchmarks/probe_page_read.py's kernel, 132 programs), the
  read floor with no attention arithmetic.

Then host time: wall-clock microseconds per call of back-to-back calls without the final wait (the
host's issue time), ours against SDPA's, and a cProfile of ours.

    python benchmarks/probe_decode_b1.py [--shapes 1x4096,1x32768] [--nb 4,6] [--no-host]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats

import torch
import torch.nn.functional as F

import warpforge as wf
from decode_probe_inputs import cudnn_decode, load_sm90_copy, paged_problem, unpaged
from probe_page_read import read_pages
from warpforge.bench.timing import TimingConfig, device_ms, host_us
from warpforge.ops import decode_attention as DA
from warpforge.runtime import device as dev
from warpforge.runtime import heuristics


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def load_base(path):
    """An older copy of ops/decode_attention_sm90.py (e.g. ``git show REV:...``) as its own module."""
    return load_sm90_copy(open(path).read(), "_decode_sm90_base")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="1x4096,1x8192,1x16384,1x32768,8x4096")
    ap.add_argument("--nb", default="4,6", help="ring depths to try on the Gluon kernel")
    ap.add_argument("--no-host", action="store_true")
    ap.add_argument("--base", default="", help="an older decode_attention_sm90.py to time beside the current one")
    a = ap.parse_args()
    from warpforge.ops import decode_attention_sm90 as G
    copy = dev.ceilings()["copy_gbps"]
    cfg = TimingConfig.quick()
    sms = dev.sm_count(0)
    hq, hk, d, page = 32, 8, 128, 16
    scale2 = d ** -0.5 * DA.LOG2E
    rows = []
    min_tokens = heuristics.DECODE_SM90_MIN_TOKENS
    base = load_base(a.base) if a.base else None
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
        q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx, hq, hk, d, page)
        sl0 = torch.zeros_like(sl)
        q4 = q.unsqueeze(2)
        res = {}
        ref, res["cudnn"] = cudnn_decode(q, kc, vc, bt, ctx, lambda fn: device_ms(fn, cfg, kv_bytes))
        res["default"] = device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg, kv_bytes)

        def gluon(lens, nb=None, combine=True, mod=G):
            o = torch.empty_like(q)
            parts = mod.decode_sm90(q, kc, vc, bt, lens, o, scale2, nb=nb)
            if parts is not None and combine:
                DA._combine(*parts, o, parts[0].shape[2])
            return o

        errs = {"gluon": rel(gluon(sl), ref)}
        res["gluon"] = device_ms(lambda: gluon(sl), cfg, kv_bytes)
        res["gluon main"] = device_ms(lambda: gluon(sl, combine=False), cfg, kv_bytes)
        res["gluon len0"] = device_ms(lambda: gluon(sl0), cfg, kv_bytes)
        if base is not None:
            errs["base"] = rel(gluon(sl, mod=base), ref)
            res["base"] = device_ms(lambda: gluon(sl, mod=base), cfg, kv_bytes)
            res["base main"] = device_ms(lambda: gluon(sl, mod=base, combine=False), cfg, kv_bytes)
            res["gluon again"] = device_ms(lambda: gluon(sl), cfg, kv_bytes)
        for nb in (int(x) for x in a.nb.split(",") if x):
            errs[f"gluon nb{nb}"] = rel(gluon(sl, nb=nb), ref)
            res[f"gluon nb{nb}"] = device_ms(lambda: gluon(sl, nb=nb), cfg, kv_bytes)

        saved = DA._SM90[:]
        DA._SM90[:] = [None]
        errs["triton"] = rel(wf.decode_attention(q, kc, vc, bt, sl, validate=False), ref)
        res["triton"] = device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg, kv_bytes)
        res["triton len0"] = device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl0, validate=False), cfg, kv_bytes)
        comb = DA._combine
        DA._combine = lambda *x, **k: None
        res["triton main"] = device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg, kv_bytes)
        DA._combine = comb
        DA._SM90[:] = saved

        flat = bt.reshape(-1).contiguous()
        best = None
        for progs in (sms, 2 * sms):
            for stages in (3, 4):
                t = device_ms(lambda: read_pages(kc, vc, flat, progs, 8192, stages, 8), cfg, kv_bytes)
                if best is None or t < best[0]:
                    best = (t, f"{progs}p {stages}st")
        res[f"read ({best[1]})"] = best[0]

        pct = lambda ms: kv_bytes / (ms * 1e-3) / 1e9 / copy * 100  # noqa: E731
        for k, ms in res.items():
            rows.append({"b": bsz, "ctx": ctx, "impl": k, "us": ms * 1e3, "pct_copy": pct(ms)})
        print(f"B{bsz} ctx {ctx} (sm90 route: {bsz * hk * bt.shape[1] * page >= min_tokens}) errs "
              + " ".join(f"{k} {v:.1e}" for k, v in errs.items()), flush=True)
        print("   " + " | ".join(f"{k} {v * 1e3:.1f} us {pct(v):.0f}%" for k, v in res.items()), flush=True)

        if not a.no_host and bsz == 1 and ctx in (4096, 16384):
            h_ours = host_us(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), 300, 5, include_device=False)
            h_op = host_us(lambda: DA.decode_attention_op(q, kc, vc, bt, sl, d ** -0.5, 0), 300, 5, include_device=False)
            plans = DA._PLANS

            class _NoPlans(dict):
                def __setitem__(self, k, v):
                    pass

            DA._PLANS = _NoPlans()
            h_noplan = host_us(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), 300, 5,
                               include_device=False)
            DA._PLANS = plans
            print(f"   host issue us/call: ours without plans {h_noplan:.1f}; the operator alone (no argument "
                  f"checks) {h_op:.1f}", flush=True)
            rows.append({"b": bsz, "ctx": ctx, "impl": "host ours, no plans", "us": h_noplan})
            rows.append({"b": bsz, "ctx": ctx, "impl": "host op only", "us": h_op})
            kd, vd = unpaged(kc, bt, ctx), unpaged(vc, bt, ctx)
            h_sdpa = host_us(lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True), 300, 5,
                             include_device=False)
            print(f"   host issue us/call: ours {h_ours:.1f}, sdpa {h_sdpa:.1f}", flush=True)
            rows.append({"b": bsz, "ctx": ctx, "impl": "host ours", "us": h_ours})
            rows.append({"b": bsz, "ctx": ctx, "impl": "host sdpa", "us": h_sdpa})
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(300):
                wf.decode_attention(q, kc, vc, bt, sl, validate=False)
            pr.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
            with open(os.path.join(a.out, f"decode_host_profile_b{bsz}_{ctx}.txt"), "w") as fh:
                fh.write(s.getvalue())
            del kd, vd
        del kc, vc
    with open(os.path.join(a.out, "probe_decode_b1.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
