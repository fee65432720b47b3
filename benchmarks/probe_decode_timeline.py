"""The GPU timeline of single decode calls (issue 6; not the benchmark): the bench's clean condition
(flush, GPU sleep, the call) repeated under torch.profiler, and each repetition's kernels read back
from the trace: the gap from the sleep's end to the call's first kernel, every kernel's duration and
the gaps between them. Separates launch latency from in-kernel time for the Gluon and Triton decode
kernels and cuDNN: at every length 0 and 16 (fixed costs; cuDNN on 16 keys) and at the real lengths,
beside an empty Triton kernel; the length-0 calls also warm (no flush).

    python benchmarks/probe_decode_timeline.py [--shapes 1x16384] [--reps 12]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import warpforge as wf
from decode_probe_inputs import paged_problem, unpaged
from warpforge.bench import timing
from warpforge.ops import decode_attention as DA


@triton.jit
def _empty_kernel(x_ptr):
    tl.store(x_ptr + tl.program_id(0), 1.0)


def timeline(fn, reps, pre=None, flush=True, skip=()):
    """Per repetition: (gap sleep end -> first kernel, [(name, dur)], [gaps between kernels]) in us.
    ``flush``: the bench's flush first; ``pre``: a call made after the flush, before the sleep."""
    sleep = timing._cover(timing._host_ms(fn))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            if flush:
                timing.flush_l2()
            if pre is not None:
                pre()
            torch.cuda._sleep(sleep)
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        path = fh.name
    p.export_chrome_trace(path)
    with open(path) as fh:
        ev = [e for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"]
    os.unlink(path)
    ev.sort(key=lambda e: e["ts"])
    out, cur, prev_end = [], None, None
    for e in ev:
        name = e["name"]
        if "sleep" in name.lower() or "spin" in name.lower():
            if cur is not None:
                out.append(cur)
            cur = {"lead": None, "kernels": [], "gaps": []}
            prev_end = e["ts"] + e["dur"]
            continue
        if cur is None or "FillFunctor" in name or "reduce_kernel" in name or any(k in name for k in skip):
            continue                    # the flush's kernels (memset, read pass) and strays before the first sleep
        gap = e["ts"] - prev_end
        if cur["lead"] is None:
            cur["lead"] = gap
        else:
            cur["gaps"].append(gap)
        cur["kernels"].append((name[:40], e["dur"]))
        prev_end = e["ts"] + e["dur"]
    if cur is not None:
        out.append(cur)
    return [r for r in out if r["kernels"]]


def summarize(rows):
    lead = statistics.median(r["lead"] for r in rows)
    names = [k[0] for k in rows[0]["kernels"]]
    durs = [statistics.median(r["kernels"][i][1] for r in rows if len(r["kernels"]) > i) for i in range(len(names))]
    gaps = [statistics.median(r["gaps"][i] for r in rows if len(r["gaps"]) > i) for i in range(len(names) - 1)]
    span = statistics.median(r["lead"] + sum(k[1] for k in r["kernels"]) + sum(r["gaps"]) for r in rows)
    parts = [f"lead {lead:.1f}"]
    for i, (n, d) in enumerate(zip(names, durs)):
        parts.append(f"{n} {d:.1f}")
        if i < len(gaps):
            parts.append(f"gap {gaps[i]:.1f}")
    return f"span {span:.1f} us = " + " | ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="1x16384")
    ap.add_argument("--reps", type=int, default=12)
    a = ap.parse_args()
    from warpforge.ops import decode_attention_sm90 as G
    hq, hk, d, page = 32, 8, 128, 16
    scale2 = d ** -0.5 * DA.LOG2E
    buf = torch.zeros(132, device="cuda")
    report = {}
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
        q, kc, vc, bt, sl, _ = paged_problem(bsz, ctx, hq, hk, d, page)
        sl0 = torch.zeros_like(sl)
        kd, vd = unpaged(kc, bt, ctx), unpaged(vc, bt, ctx)
        q4 = q.unsqueeze(2)

        def gluon(lens, nb=None, regs=None):
            o = torch.empty_like(q)
            parts = G.decode_sm90(q, kc, vc, bt, lens, o, scale2, nb=nb, regs=regs)
            if parts is not None:
                DA._combine(*parts, o, parts[0].shape[2])
            return o

        def triton_path(lens):
            saved = DA._SM90[:]
            DA._SM90[:] = [None]
            try:
                return wf.decode_attention(q, kc, vc, bt, lens, validate=False)
            finally:
                DA._SM90[:] = saved

        def cudnn():
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)

        sl16 = torch.full_like(sl, 16)
        kd16, vd16 = kd[:, :, :16].contiguous(), vd[:, :, :16].contiguous()

        def cudnn16():
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q4, kd16, vd16, enable_gqa=True)

        impls = {"empty triton kernel (132 programs)": lambda: _empty_kernel[(132,)](buf),
                 "cudnn": cudnn, "cudnn ctx16": cudnn16,
                 "gluon len0": lambda: gluon(sl0), "gluon len16": lambda: gluon(sl16),
                 "gluon": lambda: gluon(sl),
                 "triton len0": lambda: triton_path(sl0), "triton len16": lambda: triton_path(sl16),
                 "triton": lambda: triton_path(sl)}
        conds = {"clean": dict(), "warm (no flush)": dict(flush=False)}
        for name, fn in impls.items():
            for cname, kw in conds.items():
                if cname != "clean" and not name.endswith("len0") and not name.startswith("empty"):
                    continue
                try:
                    rows = timeline(fn, a.reps, **kw)
                except Exception as e:   # noqa: BLE001
                    print(f"B{bsz} ctx {ctx} {name} [{cname}]: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                line = f"B{bsz} ctx {ctx} {name} [{cname}]: {summarize(rows)}"
                report[f"B{bsz}x{ctx} {name} {cname}"] = rows
                print(line, flush=True)
        del kc, vc, kd, vd
    with open(os.path.join(a.out, "probe_decode_timeline.json"), "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    main()
