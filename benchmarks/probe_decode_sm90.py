"""Device probe for the Gluon decode kernel (ops/decode_attention_sm90.py): correctness against the
float64 reference on odd cases (head dims, pages, GQA groups, lengths, strided caches, bad block
ids unvalidated), then the bench's cells (Hq 32 / Hkv 8, D 128, bf16, pages of 16 shuffled) timed
as the bench times them: the Gluon kernel at its plan and at variants, the Triton kernel, and SDPA
(cuDNN) on the same problem unpaged. % of the measured copy bandwidth on the KV bytes.

    python benchmarks/probe_decode_sm90.py [--out DIR] [--quick] [--variants nb=4,nb=8,slots=264,ordered,contig]
        [--shapes 16x8192,64x4096]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

import warpforge as wf
from decode_probe_inputs import cudnn_decode, paged_problem, unpaged
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import decode_attention as DA
from warpforge.ops import decode_attention_sm90 as G
from warpforge.runtime import device as dev

BATCHES = (1, 8, 16, 32, 64)
CONTEXTS = (4096, 8192, 16384, 32768)


def ref64(q, kc, vc, bt, lens, scale=None):
    return DA.decode_attention_reference(q.double(), kc.double(), vc.double(), bt, lens, scale)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def paged(bsz, mb, page, hkv, d, dtype, extra=3, interleave=False):
    nb = bsz * mb + extra
    if interleave:
        pool = torch.randn(nb, page, 2, hkv, d, device="cuda", dtype=dtype)
        kc, vc = pool[:, :, 0], pool[:, :, 1]
    else:
        kc = torch.randn(nb, page, hkv, d, device="cuda", dtype=dtype)
        vc = torch.randn_like(kc)
    bt = torch.randperm(nb, device="cuda")[:bsz * mb].view(bsz, mb).to(torch.int32)
    return kc, vc, bt


def check() -> list[str]:
    from warpforge.runtime import heuristics
    heuristics.DECODE_SM90_MIN_TOKENS = 0            # the Gluon kernel on the small cases too
    fails = []
    torch.manual_seed(0)
    cases = []   # (name, hq, hkv, d, page, lens, dtype, interleave, bt dtype, splits)
    for d in (64, 128):
        for page in (16, 32, 64):
            cases.append((f"d{d} p{page} g4", 32, 8, d, page, [1, 17, 1000, 0, 4097, 64, 63], torch.bfloat16, False, torch.int32, None))
    cases += [("mha", 8, 8, 128, 16, [300, 5, 0], torch.float16, False, torch.int64, None),
              ("mqa g16", 16, 1, 128, 16, [2000, 33], torch.bfloat16, True, torch.int32, None),
              ("g8", 32, 4, 64, 32, [777, 1, 4096], torch.float16, True, torch.int64, 3),
              ("g1 splits1", 4, 4, 128, 16, [5000, 16, 15], torch.bfloat16, False, torch.int32, 1),
              ("many splits", 32, 8, 128, 16, [8192, 100], torch.bfloat16, False, torch.int32, 40),
              ("g3", 6, 2, 64, 16, [129, 0, 1], torch.bfloat16, False, torch.int32, None)]
    for name, hq, hkv, d, page, lens, dtype, inter, btd, splits in cases:
        lens_t = torch.tensor(lens, device="cuda", dtype=torch.int32)
        mb = -(-max(max(lens), 1) // page) + 1
        kc, vc, bt = paged(len(lens), mb, page, hkv, d, dtype, interleave=inter)
        bt = bt.to(btd)
        q = torch.randn(len(lens), hq, d, device="cuda", dtype=dtype)
        assert G.covers(q, kc, vc), name
        ref = ref64(q, kc, vc, bt, lens_t)
        out = DA.decode_attention(q, kc, vc, bt, lens_t, num_splits=splits)
        e = rel(out, ref)
        ok = e < 1e-2 and bool(torch.isfinite(out).all())
        zero = [i for i, n in enumerate(lens) if n == 0]
        ok = ok and all(out[i].abs().max() == 0 for i in zero)
        ok = ok and bool(torch.equal(out, DA.decode_attention(q, kc, vc, bt, lens_t, num_splits=splits)))
        print(f"check {name:14s} rel {e:.2e} {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            fails.append(name)
    # bad block ids, unvalidated: those sequences' tokens in bad blocks are left out, the rest exact
    hq, hkv, d, page, mb = 32, 8, 128, 16, 8
    kc, vc, bt = paged(3, mb, page, hkv, d, torch.bfloat16)
    good = bt.clone()
    bt[1, 2] = -1
    bt[2, 0] = kc.shape[0] + 5
    lens_t = torch.tensor([100, 120, 10**6], device="cuda", dtype=torch.int32)
    q = torch.randn(3, hq, d, device="cuda", dtype=torch.bfloat16)
    out = DA.decode_attention(q, kc, vc, bt, lens_t, validate=False)
    e0 = rel(out[0], ref64(q, kc, vc, good, lens_t)[0])
    ok = e0 < 1e-2 and bool(torch.isfinite(out).all())
    print(f"check bad ids      rel {e0:.2e} finite {bool(torch.isfinite(out).all())} {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        fails.append("bad ids")
    return fails


def profile(variants):
    """Per-kernel device time (torch.profiler, back-to-back calls) of the default path, the Triton
    path and cuDNN at a few cells."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_
    hq, hk, d, page = 32, 8, 128, 16
    for bsz, ctx in ((1, 4096), (1, 32768), (16, 8192)):
        q, kc, vc, bt, sl, _ = paged_problem(bsz, ctx, hq, hk, d, page)
        kd, vd = unpaged(kc, bt, ctx), unpaged(vc, bt, ctx)
        q4 = q.unsqueeze(2)
        calls = {"gluon": lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False),
                 "cudnn": lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)}
        for name, fn in calls.items():
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
                with prof_(activities=[ProfilerActivity.CUDA]) as p:
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
            ev = [e for e in p.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            print(f"profile B{bsz} ctx{ctx} {name}: " + "; ".join(
                f"{e.key[:48]} {e.device_time_total / max(e.count, 1):.1f} us x{e.count}" for e in ev), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", default="nb=4,nb=8")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--profile", action="store_true", help="kernel times (torch.profiler) at a few cells")
    ap.add_argument("--shapes", default="", help="BxCTX,... instead of the sweep (e.g. 16x8192,64x4096)")
    a = ap.parse_args()
    from warpforge.runtime import heuristics
    fails = [] if a.no_check else check()
    heuristics.DECODE_SM90_MIN_TOKENS = 0            # the sweep times the Gluon kernel everywhere
    copy = dev.ceilings()["copy_gbps"]
    cfg_t = TimingConfig.quick()
    hq, hk, d, page = 32, 8, 128, 16
    shapes = [(1, 4096), (1, 32768), (16, 8192), (64, 32768)] if a.quick else [(b, c) for b in BATCHES for c in CONTEXTS]
    if a.shapes:
        shapes = [tuple(int(x) for x in sh.split("x")) for sh in a.shapes.split(",")]
    variants = [v for v in a.variants.split(",") if v]
    rows = []
    sms = dev.sm_count(0)
    for bsz, ctx in shapes:
        q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx, hq, hk, d, page)
        res = {}
        sd, res["sdpa[cudnn]"] = cudnn_decode(q, kc, vc, bt, ctx, lambda fn: device_ms(fn, cfg_t, kv_bytes))
        s, grid = G.plan(bsz * hk, bt.shape[1] * page, sms, 2 * d * q.element_size(), dev.dram_bandwidth(0))
        out = wf.decode_attention(q, kc, vc, bt, sl, validate=False)
        err = rel(out, sd)
        res[f"gluon (S={s}, grid={grid})"] = device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg_t, kv_bytes)
        saved = DA._SM90[:]
        DA._SM90[:] = [None]
        res["triton"] = device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg_t, kv_bytes)
        DA._SM90[:] = saved
        for v in variants:
            if v == "ordered":     # each sequence's pages in pool order: the unpaged address stream
                bto = torch.arange(bt.numel(), device="cuda", dtype=torch.int32).view_as(bt)
                res[v] = device_ms(lambda: wf.decode_attention(q, kc, vc, bto, sl, validate=False), cfg_t, kv_bytes)
                continue
            if v == "contig":      # each (block, kv head) slice 4 KB contiguous: the DRAM pattern's share
                kcc = kc.new_empty(kc.shape[0], hk, page, d).permute(0, 2, 1, 3)
                kcc.copy_(kc)
                vcc = kc.new_empty(kc.shape[0], hk, page, d).permute(0, 2, 1, 3)
                vcc.copy_(vc)
                res[v] = device_ms(lambda: wf.decode_attention(q, kcc, vcc, bt, sl, validate=False), cfg_t, kv_bytes)
                del kcc, vcc
                continue
            kw = {k: int(val) for k, val in (kv.split("=") for kv in v.split(":"))}

            def call(kw=kw):
                o = torch.empty_like(q)
                parts = G.decode_sm90(q, kc, vc, bt, sl, o, d ** -0.5 * DA.LOG2E, **kw)
                if parts is not None:
                    DA._combine(*parts, o, parts[0].shape[2])
                return o
            e = rel(call(), sd)
            if e > 1e-2:
                print(f"  variant {v}: rel {e:.2e} FAIL", flush=True)
                fails.append(f"{v} B{bsz} ctx{ctx}")
            res[v] = device_ms(call, cfg_t, kv_bytes)
        pct = lambda ms: kv_bytes / (ms * 1e-3) / 1e9 / copy * 100  # noqa: E731
        for k, ms in res.items():
            rows.append({"b": bsz, "ctx": ctx, "impl": k, "us": ms * 1e3, "pct_copy": pct(ms)})
        print(f"B{bsz:<3d} ctx {ctx:6d} err {err:.1e}: " + " | ".join(f"{k} {v * 1e3:.1f} us {pct(v):.0f}%" for k, v in res.items()),
              flush=True)
        del kc, vc
    if a.profile:
        profile(variants)
    with open(os.path.join(a.out, "probe_decode_sm90.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": rows, "fails": fails}, fh, indent=1)
    print("FAILS:", fails)


if __name__ == "__main__":
    main()
