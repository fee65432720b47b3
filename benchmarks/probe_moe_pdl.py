"""Device probe for programmatic dependent launch in the MoE forward (ops/moe.py, _pdl; NOTES item 104):
each decode call with every launch a programmatic dependent of the one before -- the next launch
released at each program's start ("start", _PDL_MODE 1) or end ("end", 2) -- against the same call
without ("plain") and the torch._grouped_mm pipeline, as CUDA-graph latency (moe_probe_inputs.graph_us),
the least of ``--rounds`` alternating rounds. All three must give the same output bit for bit.

    python benchmarks/probe_moe_pdl.py [--cases mixtral:1,mixtral:64,...] [--routings random]
"""
import argparse

import torch

import warpforge.ops.moe as M
from warpforge.bench.workloads import moe_grouped_mm

from moe_probe_inputs import graph_us, routed_cases

p = argparse.ArgumentParser()
p.add_argument("--cases", default="mixtral:1,mixtral:8,mixtral:64,mixtral:256,dsv2:1,dsv2:8,dsv2:64,dsv2:256,"
                                  "olmoe:1,olmoe:64")
p.add_argument("--routings", default="random")
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()
table = []
for shape, T, r, x, w1, w2, wts, ids in routed_cases(a.cases, a.routings):
    fn = lambda: M.moe_experts(x, w1, w2, wts, ids, validate=False)  # noqa: E731
    modes = {"plain": 0, "start": 1, "end": 2}
    outs = {}
    for name, mode in modes.items():
        M._PDL_MODE = mode
        outs[name] = fn().clone()
        if not torch.equal(outs[name], outs["plain"]):
            raise SystemExit(f"{shape} T={T} {r}: the outputs differ with PDL {name} and without")
    best = {}
    for rnd in range(a.rounds):
        for name in ("grouped_mm", *modes):
            if name == "grouped_mm":
                t = graph_us(lambda: moe_grouped_mm(x, w1, w2, wts, ids))
            else:
                M._PDL_MODE = modes[name]
                t = graph_us(fn)
            best[name] = min(best.get(name, 1e30), t)
            print(f"{shape} T={T} {r} round {rnd}: {name} {t:.1f} us", flush=True)
    g = best["grouped_mm"]
    table.append(f"{shape:7s} T={T:3d} {r:8s}: " + ", ".join(f"{m} {best[m]:7.1f} us ({g / best[m]:.2f}x)"
                                                             for m in modes) + f", grouped_mm {g:7.1f} us")
M._PDL_MODE = 2
print("\n".join(table))
