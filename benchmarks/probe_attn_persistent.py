"""Device probe: the Hopper forward, one program a (query tile, head) against the persistent
form (one program an SM walking the items; ops/attention_sm90.py takes it for non-causal calls
up to PERSISTENT_MAX_LEN), over the bench's sweep shapes, beside cuDNN and FA2. Both forms are
forced for every shape by moving that threshold, and their outputs compared bit for bit.

    python benchmarks/probe_attn_persistent.py
"""
from __future__ import annotations

import json
import os

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from warpforge.ops import attention_sm90 as sm90

SHAPES = [(32, 32, 512, 64), (32, 16, 512, 128), (16, 32, 1024, 64), (16, 16, 1024, 128), (8, 32, 2048, 64),
          (4, 32, 4096, 128), (1, 16, 16384, 128)]


def main():
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # noqa: E731
    rows = []
    for B, H, S, D in SHAPES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False,):
            fl = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
            tag = f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}"
            outs = {}
            saved = sm90.PERSISTENT_MAX_LEN
            for name, limit in (("one a tile", 0), ("persistent", 1 << 30)):
                sm90.PERSISTENT_MAX_LEN = limit
                o = torch.full_like(q, float("nan"))
                lse = torch.full((B, H, S), float("nan"), device="cuda")
                fn = lambda: sm90.attention_fwd_sm90(q, k, v, o, lse, D ** -0.5, causal)  # noqa: E731
                fn()
                torch.cuda.synchronize()
                outs[name] = (o.clone(), lse.clone())
                ms = bench(fn)
                rows.append(dict(case=tag, impl=name, ms=ms, tflops=fl / ms / 1e9))
            sm90.PERSISTENT_MAX_LEN = saved
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                with sdpa_kernel(be):
                    ms = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
                rows.append(dict(case=tag, impl=f"sdpa {name}", ms=ms, tflops=fl / ms / 1e9))
            (o1, l1), (o2, l2) = outs["one a tile"], outs["persistent"]
            same = bool(torch.equal(o1, o2) and torch.equal(l1, l2))
            rows[-4]["same_as_old"] = same
            for r in rows[-4:]:
                print(r, flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_attn_persistent.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()} bf16 forward\n| case | impl | ms | TFLOP/s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} |" + (f" same={r['same_as_old']}" if "same_as_old" in r else ""))


if __name__ == "__main__":
    main()
