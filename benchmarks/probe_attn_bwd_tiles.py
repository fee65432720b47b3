"""Device probe: backward tiles at head dim 64, where the backward is weakest (0.70-0.80x cuDNN,
1.14-1.30x FA2 on the H200): the Triton dK/dV kernel's tiles and the Gluon dQ kernel's key tile,
each timed as the whole backward beside SDPA's cuDNN and FA2 backends.

    python benchmarks/probe_attn_bwd_tiles.py [--shapes 8,32,2048,64 4,32,4096,64]
"""
from __future__ import annotations

import argparse
import functools
import json
import os

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from warpforge.ops import attention as attn
from warpforge.runtime.heuristics import AttentionConfig, attention_config

DKDV = [None, (64, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
DQ_BN = [64, 128]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["8,32,2048,64", "4,32,4096,64"])
    args = ap.parse_args()
    bench = lambda fn: triton.testing.do_bench(fn, warmup=20, rep=200, return_mode="median")  # noqa: E731
    sm90 = attn._sm90_kernels()
    real_dq = sm90.attention_bwd_dq_sm90
    saved_cfg = attn.attention_config
    rows = []
    for shape in args.shapes:
        B, H, S, D = (int(x) for x in shape.split(","))
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        scale = D ** -0.5
        for causal in (False, True):
            right = 0 if causal else -1
            fl = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
            tag = f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}"
            o, lse = attn._attention_fwd(q, k, v, None, None, None, S, S, scale, -1, right, False)
            do = torch.randn_like(o)
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(be):
                    oc = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    ms = bench(lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True))
                rows.append(dict(case=tag, impl=f"sdpa {name}", ms=ms, tflops=fl / ms / 1e9))
                print(rows[-1], flush=True)
            for dkdv in DKDV:
                for bn in DQ_BN:
                    if dkdv is not None:
                        attn.attention_config = (lambda c: lambda kind, d, e: AttentionConfig(*c) if kind == "dkdv"
                                                 else saved_cfg(kind, d, e))(dkdv)
                    sm90.attention_bwd_dq_sm90 = functools.partial(real_dq, block_n=bn)
                    try:
                        run = lambda: attn._attention_bwd(do, q, k, v, o, lse, None, None, None, None, S, S, scale,  # noqa: E731
                                                          -1, right, False)
                        run()
                        ms = bench(run)
                        rows.append(dict(case=tag, impl=f"dkdv {dkdv or 'default'} dq bn{bn}", ms=ms, tflops=fl / ms / 1e9))
                    except Exception as e:  # noqa: BLE001
                        rows.append(dict(case=tag, impl=f"dkdv {dkdv} dq bn{bn}", error=str(e)[:200]))
                    finally:
                        attn.attention_config = saved_cfg
                        sm90.attention_bwd_dq_sm90 = real_dq
                    print(rows[-1], flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_attn_bwd_tiles.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()} bf16 backward\n| case | impl | ms | TFLOP/s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['impl']} | {r.get('ms', float('nan')):.3f} | {r.get('tflops', float('nan')):.1f} |"
              if "ms" in r else f"| {r['case']} | {r['impl']} | error | {r['error'][:80]} |")


if __name__ == "__main__":
    main()
