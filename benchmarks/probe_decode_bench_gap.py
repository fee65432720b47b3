"""Why do two decode cells read slowly in the bench only? (issue 6; a probe, not the benchmark.)

Since session 21 the bench (`warpforge bench decode_attention`, H200) has put batch 64 x 4K and
64 x 32K at 0.86-0.88x cuDNN while every other cell of batch >= 8 reads 0.94-0.99x, and the
probes (probe_decode_sm90.py, probe_decode_consumers.py: their own inputs, a fresh process) read
those two shapes at 0.98-1.0x (NOTES items 51, 62, 130). This probe takes the bench's own inputs
(workloads._decode_make) in the bench's case order, in one process, and times under the bench's
timer:

- ``op``: wf.decode_attention(validate=False), the bench's warpforge row;
- ``kernel``: the Gluon kernel called directly (decode_sm90, one split at batch 64: no combine);
- ``op sorted``: the op with the same caches and the block table sorted (pages in memory order);
- ``op fresh``: the op on the probes' inputs (decode_probe_inputs.paged_problem), made after the
  bench's are freed;
- ``op seed k`` (``--seeds``): the op over the same caches with other random page orders;
- ``sdpa[cudnn]`` on the bench's unpaged copies;
- with ``--math``, SDPA's math backend run once at the end of each case, as the bench runs it.

Prediction: if ``op`` is slow where ``kernel`` is not, the call's wrapper is the cause; if both are
slow on the bench's inputs and ``op fresh`` is not, the inputs (their memory, or the order of
their pages) are; if ``op sorted`` is fast, the page order is.

    python benchmarks/probe_decode_bench_gap.py [--shapes 32x32768,64x4096,64x8192,64x32768]
"""
from __future__ import annotations

import argparse
import gc

import torch
import torch.nn.functional as F

from decode_probe_inputs import paged_problem, print_table, shapes, timing_setup
from warpforge.bench import workloads as W
from warpforge.bench.timing import device_ms
from warpforge.ops import decode_attention_sm90 as G

import warpforge as wf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32x32768,64x4096,64x8192,64x32768")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=0, help="also time this many other random page orders")
    ap.add_argument("--math", action="store_true", help="run sdpa[math] once at the end of each case (the bench does)")
    ap.add_argument("--no-fresh", action="store_true", help="skip the 'op fresh' inputs")
    a = ap.parse_args()
    cfg, copy, scale2 = timing_setup()
    res, nbytes = {}, {}
    for sh, bsz, ctx in shapes(a.shapes):
        case = W._decode_case(bsz, ctx)
        q, kc, vc, bt, sl, q4, k4, v4 = W._decode_make(case, torch.bfloat16, "cuda")
        kvb = 2 * bsz * ctx * 8 * 128 * 2
        nbytes[sh] = kvb
        bts = bt.reshape(-1).sort().values.view_as(bt).contiguous()
        o = torch.empty_like(q)
        fns = {
            "op": lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False),
            "kernel": lambda: G.decode_sm90(q, kc, vc, bt, sl, o, scale2),
            "op sorted": lambda: wf.decode_attention(q, kc, vc, bts, sl, validate=False),
        }
        for seed in range(a.seeds):          # other random page orders over the same caches
            gen = torch.Generator(device="cuda").manual_seed(seed)
            bt_s = torch.randperm(bt.numel(), device="cuda", generator=gen).view_as(bt).to(torch.int32)
            fns[f"op seed {seed}"] = (lambda t: lambda: wf.decode_attention(q, kc, vc, t, sl, validate=False))(bt_s)

        def cudnn():
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)

        ref = cudnn().squeeze(2).float()
        got = fns["op"]().float()
        print(f"{sh}: op against cuDNN, max |difference| {(got - ref).abs().max().item():.2e}", flush=True)
        for r in range(a.rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                res.setdefault((sh, name), []).append(device_ms(fns[name], cfg, kvb) * 1e3)
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
                res.setdefault((sh, "sdpa[cudnn]"), []).append(
                    device_ms(lambda: F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True), cfg, kvb) * 1e3)
        if a.math:                           # as the bench's last peer: SDPA's unfused math backend, once
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
                F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)
            torch.cuda.synchronize()
            print(f"{sh}: sdpa[math] ran; peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
        del q, kc, vc, bt, sl, q4, k4, v4, bts, fns, o
        gc.collect()
        torch.cuda.empty_cache()
        if a.no_fresh:
            continue
        q, kc, vc, bt, sl, _ = paged_problem(bsz, ctx)
        for r in range(a.rounds):
            res.setdefault((sh, "op fresh"), []).append(
                device_ms(lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False), cfg, kvb) * 1e3)
        del q, kc, vc, bt, sl
        gc.collect()
        torch.cuda.empty_cache()
    print_table(res, nbytes, copy, 14)


if __name__ == "__main__":
    main()
