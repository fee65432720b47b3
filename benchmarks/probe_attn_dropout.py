"""Device probe: what attention dropout costs our Triton kernels, beside SDPA's backends with the
same dropout. Rows, each forward and forward+backward (do_bench medians, ms; least of --rounds
alternating rounds): ours at p = 0 as routed (the Hopper Gluon kernels), ours at p = 0 on the
Triton kernels (the path dropout takes, without it), ours at p; SDPA's cuDNN, FlashAttention-2
and efficient backends at p.

    python benchmarks/probe_attn_dropout.py [--shapes 4,32,4096,128] [--p 0.1] [--rounds 2]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import warpforge as wf
from warpforge.ops import attention as attn


def _triton_only(fn):
    """``fn`` with the Hopper kernels switched off (attention.py's route reads _SM90 each call)."""
    def run(*a):
        saved = attn._SM90[:]
        attn._SM90[:] = [None]
        try:
            return fn(*a)
        finally:
            attn._SM90[:] = saved
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4,32,4096,128"])
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")  # noqa: E731
    attn._sm90_kernels()
    p = args.p
    print(f"{'shape':>22} {'causal':>6} {'row':>16} {'fwd ms':>8} {'fwd+bwd ms':>10} {'fwd TF/s':>8}")
    for shape in args.shapes:
        B, H, S, D = (int(x) for x in shape.split(","))
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        for causal in (False, True):
            def ours(pp):
                return lambda: wf.scaled_dot_product_attention(q, k, v, dropout_p=pp, is_causal=causal)

            def sdpa(backend):
                def run():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
                return run

            rows = {"ours p=0 routed": ours(0.0), "ours p=0 triton": _triton_only(ours(0.0)),
                    f"ours p={p}": ours(p), "sdpa[cudnn]": sdpa(SDPBackend.CUDNN_ATTENTION),
                    "sdpa[flash]": sdpa(SDPBackend.FLASH_ATTENTION),
                    "sdpa[efficient]": sdpa(SDPBackend.EFFICIENT_ATTENTION)}
            best = {}
            for _ in range(args.rounds):
                for name, fn in rows.items():
                    try:
                        with torch.no_grad():
                            f = bench(fn)
                        fb = bench(lambda: torch.autograd.grad(fn(), (q, k, v), do))
                    except Exception as e:  # noqa: BLE001 -- a backend that cannot run the case
                        best[name] = (None, None, str(e).splitlines()[0][:60])
                        continue
                    old = best.get(name)
                    if old is None or old[0] is None:
                        best[name] = (f, fb, "")
                    else:
                        best[name] = (min(old[0], f), min(old[1], fb), "")
            flops = 4 * B * H * S * S * D // (2 if causal else 1)
            for name, (f, fb, err) in best.items():
                if f is None:
                    print(f"{shape:>22} {str(causal):>6} {name:>16} failed: {err}")
                else:
                    print(f"{shape:>22} {str(causal):>6} {name:>16} {f:8.3f} {fb:10.3f} {flops / f / 1e9:8.0f}")


if __name__ == "__main__":
    main()
