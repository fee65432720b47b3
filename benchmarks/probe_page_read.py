"""The read ceiling of a paged KV cache (not the benchmark): how fast can any kernel read the K and V
pages a decode step needs, when the pages are in a random order, against the same bytes read in
order and against unpaged SDPA (cuDNN) on the decode problem itself?

A read-only Triton kernel walks a block table and sums every page of K and V (nothing is written
but one float a program), over a sweep of grids, load widths, pipeline depths and warp counts; the
best of each is reported as % of the measured copy bandwidth on the bytes read. Pages hold
``page`` tokens x Hkv heads x D (the decode bench's cache layout), so a page of 16 tokens is one
32 KB contiguous chunk of K and one of V at Hkv 8, D 128, bf16.

    python benchmarks/probe_page_read.py [--shapes 16x8192,32x8192,64x4096] [--pages 16,32,64]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.runtime import device as dev


@triton.jit
def _read_pages_kernel(k_ptr, v_ptr, bt_ptr, out_ptr, total, per_prog,
                       PAGE: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Program p sums pages bt[p * per_prog : (p + 1) * per_prog] of K and V, BLOCK elements a load."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    SUB: tl.constexpr = PAGE // BLOCK
    start = pid * per_prog
    steps = tl.minimum(per_prog, total - start) * SUB
    for i in tl.range(0, steps, num_stages=STAGES):
        page = tl.load(bt_ptr + start + i // SUB).to(tl.int64)
        base = page * PAGE + (i % SUB) * BLOCK
        acc += tl.load(k_ptr + base + offs, eviction_policy="evict_first").to(tl.float32)
        acc += tl.load(v_ptr + base + offs, eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def read_pages(kc, vc, bt_flat, programs, block, stages, warps):
    total = bt_flat.numel()
    per = triton.cdiv(total, programs)
    grid = triton.cdiv(total, per)
    out = torch.empty(grid, device=kc.device, dtype=torch.float32)
    _read_pages_kernel[(grid,)](kc, vc, bt_flat, out, total, per, PAGE=kc[0].numel(), BLOCK=block,
                                STAGES=stages, num_warps=warps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="16x8192,32x8192,64x4096,16x32768")
    ap.add_argument("--pages", default="16,64")
    ap.add_argument("--quick", action="store_true", help="fewer read configs")
    a = ap.parse_args()
    hq, hk, d = 32, 8, 128
    copy = dev.ceilings()["copy_gbps"]
    sms = dev.sm_count(0)
    cfg_t = TimingConfig.quick()
    configs = list(itertools.product((sms, 2 * sms, 4 * sms), (4096, 8192), (2, 3, 4), (4, 8)))
    if a.quick:
        configs = [c for c in configs if c[1] == 8192 and c[3] == 8]
    rows = []
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
        nbytes = 2 * bsz * ctx * hk * d * 2
        pct = lambda ms: nbytes / (ms * 1e-3) / 1e9 / copy * 100  # noqa: E731
        q = torch.randn(bsz, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        kd = torch.randn(bsz, hk, ctx, d, device="cuda", dtype=torch.bfloat16)
        vd = torch.randn_like(kd)
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
            t_sdpa = device_ms(lambda: F.scaled_dot_product_attention(q, kd, vd, enable_gqa=True), cfg_t, nbytes)
        del kd, vd
        line = [f"B{bsz} ctx {ctx}: sdpa[cudnn] {t_sdpa * 1e3:.1f} us {pct(t_sdpa):.1f}%"]
        rows.append({"b": bsz, "ctx": ctx, "what": "sdpa[cudnn]", "us": t_sdpa * 1e3, "pct_copy": pct(t_sdpa)})
        for page in (int(p) for p in a.pages.split(",")):
            nb = bsz * ctx // page
            kc = torch.randn(nb, page, hk, d, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            orders = {"ordered": torch.arange(nb, device="cuda", dtype=torch.int32),
                      "shuffled": torch.randperm(nb, device="cuda", dtype=torch.int32)}
            for name, bt in orders.items():
                ref = (kc[bt.long()].float().sum() + vc[bt.long()].float().sum()).item()
                best = None
                for progs, block, stages, warps in configs:
                    if kc[0].numel() % block:
                        continue
                    s = read_pages(kc, vc, bt, progs, block, stages, warps).sum().item()
                    if abs(s - ref) > 1e-3 * (abs(ref) + kc.numel() ** 0.5):
                        print(f"  WRONG SUM page {page} {name} {progs}/{block}/{stages}/{warps}: {s} vs {ref}", flush=True)
                        continue
                    t = device_ms(lambda: read_pages(kc, vc, bt, progs, block, stages, warps), cfg_t, nbytes)
                    rows.append({"b": bsz, "ctx": ctx, "what": f"read p{page} {name}", "programs": progs,
                                 "block": block, "stages": stages, "warps": warps, "us": t * 1e3, "pct_copy": pct(t)})
                    if best is None or t < best[0]:
                        best = (t, progs, block, stages, warps)
                t, progs, block, stages, warps = best
                line.append(f"p{page} {name} {t * 1e3:.1f} us {pct(t):.1f}% ({progs}p {block}x{stages}st {warps}w)")
            del kc, vc
        print(" | ".join(line), flush=True)
    with open(os.path.join(a.out, "probe_page_read.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
