"""Device probe: the fused Hopper backward (ops/attention_sm90.py, dK, dV and dQ in one pass with
TMA reduce-adds into an fp32 dQ) against the seven-GEMM form (Triton dK/dV kernel + Gluon dQ
kernel) and SDPA's cuDNN and FlashAttention-2 backwards, in one process. First a correctness pass
on odd shapes against a float64 reference (both forms), then times.

    python benchmarks/probe_attn_bwd_fused.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from warpforge.ops import attention as attn
from warpforge.ops import attention_sm90 as sm90

CHECKS = [  # B, H, HK, L, S, D, causal
    (2, 4, 4, 1000, 1000, 128, False), (2, 4, 4, 1000, 1000, 128, True), (1, 8, 2, 300, 517, 128, False),
    (1, 8, 2, 517, 300, 128, True), (2, 4, 1, 17, 4097, 64, False), (1, 4, 4, 1, 129, 128, False),
    (1, 4, 2, 777, 777, 64, True), (1, 2, 2, 4097, 4097, 64, False), (3, 2, 2, 128, 128, 128, True),
]
TIMES = [(4, 32, 32, 4096, 128), (4, 32, 8, 4096, 128), (16, 16, 16, 1024, 128), (1, 16, 16, 16384, 128),
         (8, 32, 32, 2048, 64), (32, 32, 32, 512, 64), (1, 32, 32, 16384, 64)]


def grads(q, k, v, do, causal, fused):
    sm90.FUSED_BACKWARD = fused
    L, S, D = q.shape[2], k.shape[2], q.shape[3]
    right = 0 if causal else -1
    o, lse = attn._attention_fwd(q, k, v, None, None, None, L, S, D ** -0.5, -1, right, False)
    return attn._attention_bwd(do, q, k, v, o, lse, None, None, None, None, L, S, D ** -0.5, -1, right, False)


def reference(q, k, v, do, causal):
    g = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    kk, vv = k64.repeat_interleave(g, 1), v64.repeat_interleave(g, 1)
    s = q64 @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    o = torch.softmax(s, -1).nan_to_num() @ vv
    return torch.autograd.grad(o, (q64, k64, v64), do.double())


def check():
    worst = 0.0
    for B, H, HK, L, S, D, causal in CHECKS:
        torch.manual_seed(1)
        q = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
        ref = reference(q, k, v, do, causal)
        line = f"B{B} H{H}/{HK} L{L} S{S} D{D} {'causal' if causal else 'full'}:"
        for fused in (True, False):
            got = grads(q, k, v, do, causal, fused)
            errs = [((a.double() - r).norm() / r.norm().clamp_min(1e-30)).item() for a, r in zip(got, ref)]
            bad = any(not torch.isfinite(a).all() for a in got)
            line += f" {'fused' if fused else '7gemm'} dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e}{' NaN!' if bad else ''}"
            if fused:
                worst = max(worst, *errs, float("inf") if bad else 0.0)
        print(line, flush=True)
    sm90.FUSED_BACKWARD = True
    print(f"worst fused relative error {worst:.2e} ({'ok' if worst < 2e-2 else 'FAIL'})", flush=True)
    return worst < 2e-2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true", help="the correctness pass only")
    args = ap.parse_args()
    ok = check()
    if args.check:
        return
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # noqa: E731
    rows = []
    for B, H, HK, S, D in (TIMES[:2] if args.quick else TIMES):
        torch.manual_seed(0)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        scale = D ** -0.5
        for causal in (False, True):
            tag = f"B{B} H{H}/{HK} S{S} D{D} {'causal' if causal else 'full'}"
            right = 0 if causal else -1
            fl = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
            o, lse = attn._attention_fwd(q, k, v, None, None, None, S, S, scale, -1, right, False)
            do = torch.randn_like(o)
            run = lambda: attn._attention_bwd(do, q, k, v, o, lse, None, None, None, None, S, S, scale, -1, right, False)  # noqa: E731
            out = {}
            for name, fused in (("fused", True), ("7gemm", False)):
                sm90.FUSED_BACKWARD = fused
                out[name] = run()
                ms = bench(run)
                rows.append(dict(case=tag, impl=name, ms=ms, tflops=fl / ms / 1e9))
            sm90.FUSED_BACKWARD = True
            diff = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(out["fused"], out["7gemm"]))
            rows[-2]["vs_7gemm"] = diff
            if not args.quick:   # the fused kernel alone (no zeroing, no cast)
                acc = torch.zeros(q.shape, dtype=torch.float32, device="cuda")
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                delta = torch.zeros_like(lse)
                ms = bench(lambda: sm90.attention_bwd_fused_sm90(do, q, k, v, lse, delta, acc, dk, dv, scale, causal))
                rows.append(dict(case=tag, impl="fused kernel only", ms=ms, tflops=fl / ms / 1e9))
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel(be):
                        oc = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                                                              enable_gqa=HK != H)
                        ms = bench(lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True))
                    rows.append(dict(case=tag, impl=f"sdpa {name}", ms=ms, tflops=fl / ms / 1e9))
                except RuntimeError as e:
                    print(f"{tag} sdpa {name}: {str(e)[:80]}")
            for r in rows:
                if r["case"] == tag:
                    print(r, flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_attn_bwd_fused.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), correct=ok, rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()} bf16 backward (correctness {'ok' if ok else 'FAILED'})")
    print("| case | impl | ms | TFLOP/s | x cuDNN |\n|---|---|---|---|---|")
    for r in rows:
        c = [x for x in rows if x["case"] == r["case"] and x["impl"] == "sdpa cudnn"]
        ratio = c[0]["ms"] / r["ms"] if c else float("nan")
        print(f"| {r['case']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
