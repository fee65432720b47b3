"""Device probe: the Triton backward's tiles at head dim 256 (the Hopper kernels hold 64 and 128
only, so every D-256 backward is the Triton dK/dV and dQ kernels'). Offline (sm_90a, ptxas) the
shipped dK/dV tile (32 x 64 keys, 4 warps) spills ~1 KB a thread; candidates that do not are timed
here as the whole backward (do_bench median, ms): first the dK/dV tiles with the shipped dQ tile,
then the dQ tiles with the best dK/dV one; then that pair with the soft cap; SDPA's backends beside.

    python benchmarks/probe_attn_bwd256.py [--shapes 4,16,8,4096] [--cap 50]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from warpforge.ops import attention as attn
from warpforge.runtime.heuristics import AttentionConfig, attention_config

DKDV = [None, (16, 64, 8, 2), (32, 64, 8, 2), (32, 32, 4, 2), (16, 32, 4, 2), (32, 64, 8, 3), (16, 64, 8, 3),
        (16, 64, 4, 2)]
DQ = [None, (64, 32, 8, 2), (128, 32, 8, 2), (32, 64, 4, 2), (64, 64, 8, 2), (64, 32, 8, 3), (32, 32, 4, 2)]


def _with(cfgs):
    """attention_config with ``cfgs`` {kind: AttentionConfig tuple or None (shipped)} swapped in."""
    def cfg(kind, d, e, pattern="full"):
        c = cfgs.get(kind)
        return AttentionConfig(*c) if c else attention_config(kind, d, e, pattern)
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4,16,8,4096"])
    ap.add_argument("--cap", type=float, default=50.0)
    args = ap.parse_args()
    bench = lambda fn: triton.testing.do_bench(fn, warmup=5, rep=60, return_mode="median")  # noqa: E731
    D = 256
    rows = []

    def add(tag, impl, ms, fl):
        rows.append(dict(case=tag, impl=impl, ms=ms, tflops=fl / ms / 1e9 if ms else None))
        print(rows[-1], flush=True)

    for shape in args.shapes:
        B, H, HK, S = (int(x) for x in shape.split(","))
        torch.manual_seed(0)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        scale = D ** -0.5
        for causal in (False, True):
            right = 0 if causal else -1
            fl = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
            tag = f"B{B} H{H}/{HK} S{S} D{D} {'causal' if causal else 'full'}"
            kr, vr = (t.repeat_interleave(H // HK, 1).requires_grad_() for t in (k, v))
            qg = q.detach().requires_grad_()
            do = torch.randn_like(q)
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                             ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
                try:
                    with sdpa_kernel(be):
                        oc = torch.nn.functional.scaled_dot_product_attention(qg, kr, vr, is_causal=causal)
                        add(tag, f"sdpa {name} (kv repeated)", bench(lambda: torch.autograd.grad(oc, (qg, kr, vr), do, retain_graph=True)), fl)
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(case=tag, impl=f"sdpa {name}", error=str(e)[:120]))

            def run_bwd(cfgs, cap=0.0):
                saved = attn.attention_config
                attn.attention_config = _with(cfgs)
                try:
                    o, lse = attn._attention_fwd(q, k, v, None, None, None, S, S, scale, -1, right, False, 0.0, None, cap)
                    run = lambda: attn._attention_bwd(do, q, k, v, o, lse, None, None, None, None, S, S, scale,  # noqa: E731
                                                      -1, right, False, 0.0, None, cap)
                    ref = run()
                    assert all(t.isfinite().all() for t in ref)
                    return bench(run), ref
                finally:
                    attn.attention_config = saved

            base_ms, base = run_bwd({})
            add(tag, "shipped", base_ms, fl)
            best = (base_ms, None)
            for c in DKDV[1:]:
                try:
                    ms, got = run_bwd({"dkdv": c})
                    err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, base))
                    add(tag, f"dkdv {c} (err vs shipped {err:.1e})", ms, fl)
                    if ms < best[0]:
                        best = (ms, c)
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(case=tag, impl=f"dkdv {c}", error=str(e)[:120]))
            best_q = (best[0], None)
            for c in DQ[1:]:
                try:
                    ms, _ = run_bwd({"dkdv": best[1], "dq": c})
                    add(tag, f"dkdv {best[1]} dq {c}", ms, fl)
                    if ms < best_q[0]:
                        best_q = (ms, c)
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(case=tag, impl=f"dq {c}", error=str(e)[:120]))
            pick = {"dkdv": best[1], "dq": best_q[1]}
            add(tag, f"capped shipped", run_bwd({}, args.cap)[0], fl)
            add(tag, f"capped {pick}", run_bwd(pick, args.cap)[0], fl)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_attn_bwd256.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()} bf16 backward, D 256\n| case | impl | ms | TFLOP/s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} |" if "ms" in r
              else f"| {r['case']} | {r['impl']} | error | {r['error'][:80]} |")


if __name__ == "__main__":
    main()
