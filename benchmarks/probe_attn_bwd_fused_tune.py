"""Device probe: launch choices of the fused Hopper backward (ops/attention_sm90.py), the kernel
alone (dq_acc zeroed once, not per call): causal key-tile order (key tile 0, which sees the most
query tiles, first; or reversed, the first version's order), and at D 64 a 128-row query tile
and a third Q/dO slot. Each variant's dK, dV and dQ are compared with the default's.

    python benchmarks/probe_attn_bwd_fused_tune.py
"""
from __future__ import annotations

import json
import os

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from warpforge.ops import attention as attn
from warpforge.ops import attention_sm90 as sm90

SHAPES = [(4, 32, 32, 4096, 128, True), (4, 32, 8, 4096, 128, True), (1, 16, 16, 16384, 128, True),
          (16, 16, 16, 1024, 128, True), (8, 32, 32, 2048, 64, False), (8, 32, 32, 2048, 64, True),
          (4, 32, 32, 4096, 64, False), (4, 32, 32, 4096, 64, True), (1, 32, 32, 16384, 64, True)]


def main():
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # noqa: E731
    rows = []
    for B, H, HK, S, D, causal in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        scale = D ** -0.5
        right = 0 if causal else -1
        o, lse = attn._attention_fwd(q, k, v, None, None, None, S, S, scale, -1, right, False)
        do = torch.randn_like(o)
        delta = (o.float() * do.float()).sum(-1)
        fl = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        tag = f"B{B} H{H}/{HK} S{S} D{D} {'causal' if causal else 'full'}"
        variants = [("default", {}, 2)]
        if causal:
            variants.append(("reversed order", dict(reverse=True), 2))
        if D == 64:
            variants += [("bm128", dict(block_m=128), 2), ("3 slots", {}, 3)]
        ref = None
        for name, kw, slots in variants:
            sm90.FUSED_SLOTS = slots
            acc = torch.zeros(q.shape, dtype=torch.float32, device="cuda")
            dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
            sm90.attention_bwd_fused_sm90(do, q, k, v, lse, delta, acc, dk, dv, scale, causal, **kw)
            torch.cuda.synchronize()
            got = (acc.clone(), dk.clone(), dv.clone())
            if ref is None:
                ref = got
            err = max(((a.float() - r.float()).norm() / r.float().norm()).item() for a, r in zip(got, ref))
            nan = any(bool(t.isnan().any()) for t in got)
            ms = bench(lambda: sm90.attention_bwd_fused_sm90(do, q, k, v, lse, delta, acc, dk, dv, scale, causal, **kw))
            rows.append(dict(case=tag, impl=name, ms=ms, tflops=fl / ms / 1e9, vs_default=err, nan=nan))
        sm90.FUSED_SLOTS = 2
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            oc = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=HK != H)
            ms = bench(lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True))
        rows.append(dict(case=tag, impl="sdpa cudnn (whole bwd)", ms=ms, tflops=fl / ms / 1e9))
        for r in rows:
            if r["case"] == tag:
                print(r, flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_attn_bwd_fused_tune.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()} bf16 backward, fused kernel alone\n| case | impl | ms | TFLOP/s | vs default |\n|---|---|---|---|---|")
    for r in rows:
        extra = f"{r['vs_default']:.1e}{' NaN!' if r['nan'] else ''}" if "vs_default" in r else ""
        print(f"| {r['case']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} | {extra} |")


if __name__ == "__main__":
    main()
