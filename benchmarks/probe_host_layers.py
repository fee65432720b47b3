"""Device probe: where a small eager call's host time goes, layer by layer (add at n = 2^20 and
RoPE decode q (B, 32, 1, 128), k (B, 8, 1, 128), B = 1 and 64, bf16): eager PyTorch, the public
function, the fast path's C++ entry called directly, and the pieces around it. Each row is the
least over rounds of 2,000 back-to-back calls' issue time (no synchronize inside), in us.

    python benchmarks/probe_host_layers.py [--rounds 5]
"""
from __future__ import annotations

import argparse

import torch

import warpforge as wf
from warpforge.bench.timing import host_us
from warpforge.bench.workloads import rope_tables
from warpforge.runtime import fastpath, registry

BF16 = torch.bfloat16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    fastpath.load()
    lib = fastpath.lib
    x = torch.randn(1 << 20, device="cuda", dtype=BF16)
    y = torch.randn_like(x)
    rows = {
        "add: torch.add": lambda: torch.add(x, y),
        "add: x + y": lambda: x + y,
        "add: wf.add": lambda: wf.add(x, y),
        "add: lib.add (C++ entry)": lambda: lib.add(x, y, 1.0),
        "add: fastpath.door": lambda: fastpath.door(x),
        "add: registry.eager_door": lambda: registry.eager_door(x),
        "add: torch.compiler.is_compiling": torch.compiler.is_compiling,
        "add: torch.empty_like": lambda: torch.empty_like(x),
    }
    cos, sin = rope_tables(4096, 128, BF16, "cuda")
    for b in (1, 64):
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=BF16)
        k = torch.randn(b, 8, 1, 128, device="cuda", dtype=BF16)
        pos = torch.randint(1, 4000, (b, 1), device="cuda")

        def eager(q=q, k=k, pos=pos):
            c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
            h = q.shape[-1] // 2
            rot = lambda t: torch.cat((-t[..., h:], t[..., :h]), dim=-1)  # noqa: E731
            return q * c + rot(q) * s, k * c + rot(k) * s

        comp = torch.compile(eager, dynamic=False)
        rows[f"rope B={b}: eager"] = lambda q=q, k=k, pos=pos, eager=eager: eager(q, k, pos)
        rows[f"rope B={b}: compile"] = lambda q=q, k=k, pos=pos, comp=comp: comp(q, k, pos)
        rows[f"rope B={b}: wf.apply_rope"] = lambda q=q, k=k, pos=pos: wf.apply_rope(q, k, cos, sin, pos)
        rows[f"rope B={b}: lib.rope (C++ entry)"] = lambda q=q, k=k, pos=pos: lib.rope(q, k, cos, sin, pos, False)
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        rows[f"rope B={b}: wf fwd+bwd"] = lambda q=q, k=k, qg=qg, kg=kg, pos=pos: torch.autograd.grad(
            wf.apply_rope(qg, kg, cos, sin, pos), (qg, kg), (q, k))
        rows[f"rope B={b}: compile fwd+bwd"] = lambda q=q, k=k, qg=qg, kg=kg, pos=pos, comp=comp: torch.autograd.grad(
            comp(qg, kg, pos), (qg, kg), (q, k))
    for f in rows.values():                        # warm: offers, compiles
        f()
        f()
    torch.cuda.synchronize()
    print(f"fast path: {fastpath.status()}")
    best = {k: float("inf") for k in rows}
    for _ in range(a.rounds):
        for k, f in rows.items():
            best[k] = min(best[k], host_us(f, calls=2000, warmup=20, include_device=False))
    for k, v in best.items():
        print(f"{k:40s} {v:8.2f} us")
    # add: the bench's host_us (the loop's wall clock, GPU included) and the GPU time a call takes
    # inside such a loop (events around 200 back-to-back calls), for eager and ours
    from warpforge.ops import add as A
    from warpforge.runtime.launch import run

    def ours_block(block, warps):
        def f():
            out = torch.empty_like(x)
            run(A._add_fwd_vectorized_kernel, ((x.numel() + block - 1) // block,), (x, y, out, x.numel(), 1.0),
                BLOCK=block, num_warps=warps)
            return out
        return f

    loops = {"torch.add": lambda: torch.add(x, y), "wf.add": lambda: wf.add(x, y),
             "lib.add": lambda: lib.add(x, y, 1.0)}
    for block, warps in ((1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8)):
        loops[f"run BLOCK={block} w{warps}"] = ours_block(block, warps)
    for k, f in loops.items():
        f()
        wall = min(host_us(f, calls=200, warmup=5) for _ in range(a.rounds))
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(10_000_000)                  # the host queues all 200 calls before they run
        e0.record()
        for _ in range(200):
            f()
        e1.record()
        torch.cuda.synchronize()
        print(f"add loop {k:24s} host_us {wall:7.2f}   GPU per call in a queued loop {e0.elapsed_time(e1) / 200 * 1e3:6.2f} us")


if __name__ == "__main__":
    main()
