"""Device probe: what a soft cap (Gemma 2's c * tanh(s / c)) costs our attention kernels, and
FlexAttention with the cap as its score_mod beside them. Rows (do_bench medians, ms; least of
--rounds alternating rounds), forward, forward+backward and backward alone:
ours uncapped as routed (the Hopper Gluon kernels at D 64/128), ours uncapped on the Triton
kernels, ours capped as routed (since session 54 the Gluon forward and fused backward take the
cap at D 64/128), ours capped on the Triton kernels (hardware tanh.approx), the same with the
exact exp2 form of tanh (two MUFU ops a score instead of one), flex_attention (torch.compile'd;
causal block mask built once; donated buffers off so its backward can be timed alone). First a
check of the capped call against the float32 reference.

    python benchmarks/probe_attn_softcap.py [--shapes 4,32,16,4096,128 4,16,8,4096,256] [--cap 50]
        [--rounds 2]
"""
from __future__ import annotations

import argparse

import torch
import torch._functorch.config
import triton
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import warpforge as wf
from probe_attn_dropout import _plain, _triton_only, time_rows   # (run from benchmarks/: on the path)
from warpforge.ops import attention as attn


def _exp2_form(fn):
    """``fn`` with the exact exp2 tanh (TANH_EXP2) for 16-bit inputs too."""
    def run(*a):
        real = attn._softcap_args
        attn._softcap_args = lambda q, scale, c: (real(q, scale, c)[0], attn.TANH_EXP2 if c else 0)
        try:
            return fn(*a)
        finally:
            attn._softcap_args = real
    return run


def _check(cap: float) -> str:
    torch.manual_seed(1)
    q = (torch.randn(1, 4, 300, 128, device="cuda") * 3).bfloat16().requires_grad_()
    k, v = (torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    o = wf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, softcap=cap)
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, _ = attn.attention_reference(qr, kr, vr, is_causal=True, enable_gqa=True, softcap=cap)
    do = torch.randn_like(o)
    errs = [((o.float() - ref).norm() / ref.norm()).item()]
    for g, r in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(ref, (qr, kr, vr), do.float())):
        errs.append(((g.float() - r).norm() / r.norm()).item())
    return f"check cap {cap:g} (q x 3) fwd/dq/dk/dv rel err " + " ".join(f"{e:.2e}" for e in errs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4,32,16,4096,128", "4,16,8,4096,256"])
    ap.add_argument("--cap", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")  # noqa: E731
    attn._sm90_kernels()
    torch._functorch.config.donated_buffer = False
    cap = args.cap
    print(_check(cap))
    print(_check(5.0))
    flex = torch.compile(flex_attention)

    def mod(score, b, h, i, j):
        return torch.tanh(score / cap) * cap

    print(f"{'shape':>20} {'causal':>6} {'row':>24} {'fwd ms':>8} {'fwd+bwd ms':>10} {'bwd ms':>8} {'fwd TF/s':>8}")
    for shape in args.shapes:
        B, H, HK, S, D = (int(x) for x in shape.split(","))
        torch.manual_seed(0)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        do = torch.randn_like(q)
        for causal in (False, True):
            mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, S, S, device="cuda") if causal else None

            def ours(c):
                return lambda: wf.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, softcap=c)

            rows = {"ours uncapped routed": (ours(0.0), _plain), "ours uncapped triton": (ours(0.0), _triton_only),
                    "ours capped routed": (ours(cap), _plain), "ours capped triton": (ours(cap), _triton_only),
                    "ours capped exp2 form": (ours(cap), lambda f: _exp2_form(_triton_only(f))),
                    "flex capped": (lambda: flex(q, k, v, score_mod=mod, block_mask=mask, enable_gqa=True), _plain)}
            flops = 4 * B * H * S * S * D // (2 if causal else 1)
            for name, (f, fb, bw, err) in time_rows(rows, (q, k, v), do, args.rounds, bench).items():
                if f is None:
                    print(f"{shape:>20} {str(causal):>6} {name:>24} failed: {err}")
                else:
                    print(f"{shape:>20} {str(causal):>6} {name:>24} {f:8.3f} {fb:10.3f} {bw:8.3f} "
                          f"{flops / f / 1e9:8.1f}")


if __name__ == "__main__":
    main()
