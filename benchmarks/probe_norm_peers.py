"""What torch.compile's norm forwards are, and what the affine parameters cost ours (not the benchmark).

    python benchmarks/probe_norm_peers.py [--ns 1024,8192,32768] [--inductor] [--affine]

``--inductor``: compiles F.layer_norm / F.rms_norm at each N (M*N = 2^27, bf16), runs it once, and
prints the Triton kernel Inductor generated and the launch config its autotuner kept (XBLOCK,
R0_BLOCK, warps, stages), so our launch shapes can be compared with the peer that beats them.

``--affine``: times our LayerNorm and RMSNorm with no affine parameters, a weight only, and weight
and bias (the bench's timer). A program that holds one row re-reads the parameters from L2 for
every row; if that traffic is what holds the long rows back, the rows without parameters show it.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import warpforge as wf
from warpforge.bench import timing
from warpforge.runtime import device as dev

BF16 = torch.bfloat16


def inductor(ns):
    from torch._inductor.codecache import PyCodeCache

    for n in ns:
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=BF16)
        w = torch.rand(n, device="cuda", dtype=BF16) + 0.5
        b = torch.randn(n, device="cuda", dtype=BF16)
        for name, fn in (("ln", lambda t: F.layer_norm(t, (n,), w, b, 1e-5)), ("rms", lambda t: F.rms_norm(t, (n,), w, 1e-6))):
            torch._dynamo.reset()
            before = set(id(mod) for mod in _modules(PyCodeCache))
            torch.compile(fn)(x)
            torch.cuda.synchronize()
            for mod in _modules(PyCodeCache):
                if id(mod) in before:
                    continue
                for attr, obj in vars(mod).items():
                    if hasattr(obj, "launchers") and obj.launchers:
                        cfgs = [(l.config.kwargs, l.config.num_warps, l.config.num_stages) for l in obj.launchers]
                        print(f"=== N {n} {name}: {attr} kept {cfgs}", flush=True)
                        src = getattr(getattr(obj, "fn", None), "src", None)
                        if src:
                            print(src, flush=True)


def _modules(cache):
    mods = getattr(cache, "modules", None)
    if mods is None:
        mods = list(getattr(cache, "cache", {}).values())
    return list(mods)


def affine(ns):
    copy = dev.ceilings()["copy_gbps"]
    cfg_t = timing.TimingConfig.quick()
    rows = []
    for n in ns:
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=BF16)
        w = torch.rand(n, device="cuda", dtype=BF16) + 0.5
        b = torch.randn(n, device="cuda", dtype=BF16)
        nbytes = 2 * m * n * 2
        calls = {"ln none": lambda: wf.layer_norm(x, (n,), None, None),
                 "ln w": lambda: wf.layer_norm(x, (n,), w, None),
                 "ln w+b": lambda: wf.layer_norm(x, (n,), w, b),
                 "rms none": lambda: wf.rms_norm(x, (n,), None),
                 "rms w": lambda: wf.rms_norm(x, (n,), w)}
        for what, fn in calls.items():
            ms = timing.device_ms(fn, cfg_t, nbytes)
            rows.append((n, what, ms, 100 * nbytes / ms / 1e6 / copy))
            print(rows[-1], flush=True)
    print(f"\ncopy {copy:,.0f} GB/s; % of copy (bf16, M*N = 2^27)")
    for n, what, ms, pct in rows:
        print(f"{n:7d} {what:10s} {ms * 1e3:8.1f} us {pct:6.1f}%")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1024,8192,32768")
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument("--affine", action="store_true")
    args = ap.parse_args()
    ns = [int(v) for v in args.ns.split(",")]
    if args.affine:
        affine(ns)
    if args.inductor:
        inductor(ns)


if __name__ == "__main__":
    main()
