"""Device probe: the attention backward with the Gluon dQ kernel (ops/attention_sm90.py) against
the same backward with the Triton dQ kernel, and SDPA's cuDNN backward, in one process.

    python benchmarks/probe_attn_bwd_sm90.py [--shape 4,32,4096,128]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from warpforge.ops import attention as attn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,32,4096,128")
    args = ap.parse_args()
    B, H, S, D = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = D ** -0.5
    rows = []
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=300, return_mode="median")  # noqa: E731
    sm90 = attn._sm90_kernels()
    for causal in (False, True):
        right = 0 if causal else -1
        fl = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        o, lse = attn._attention_fwd(q, k, v, None, None, None, S, S, scale, -1, right, False)
        do = torch.randn_like(o)
        run = lambda: attn._attention_bwd(do, q, k, v, o, lse, None, None, None, None, S, S, scale, -1, right, False)  # noqa: E731
        g_sm90 = run()
        ms = bench(run)
        rows.append(dict(causal=causal, impl="warpforge (gluon dQ)", ms=ms, tflops=fl / ms / 1e9))
        attn._SM90[0] = None
        g_tri = run()
        ms = bench(run)
        rows.append(dict(causal=causal, impl="warpforge (triton dQ)", ms=ms, tflops=fl / ms / 1e9))
        attn._SM90[0] = sm90
        err = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(g_sm90, g_tri)]
        rows[-2]["dq_vs_triton"] = err[0]
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            oc = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            ms = bench(lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True))
        rows.append(dict(causal=causal, impl="sdpa cudnn", ms=ms, tflops=fl / ms / 1e9))
        for r in rows[-3:]:
            print(r, flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_attn_bwd_sm90.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), shape=[B, H, S, D], rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  B{B} H{H} S{S} D{D} bf16 backward")
    print("| causal | impl | ms | TFLOP/s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['causal']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} |")


if __name__ == "__main__":
    main()
