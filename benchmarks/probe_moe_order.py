"""Device probe for the decode TMA kernels' tile order (ops/moe.py, _expert_tile_coords; NOTES item 103):
each call with the tiles in expert order (an expert's row tiles walk each column together) against the
order before (row-major for the swapped kernel, grouped by GROUP_M for the 32-64-row TMA kernel), and
the torch._grouped_mm pipeline, as CUDA-graph latency (moe_probe_inputs.graph_us), the least of
``--rounds`` alternating rounds. The two orders must give the same output bit for bit.

    python benchmarks/probe_moe_order.py [--cases mixtral:64,mixtral:256] [--routings balanced,random,zipf]
"""
import argparse

import torch

import warpforge.ops.moe as M
from warpforge.bench.workloads import moe_grouped_mm

from moe_probe_inputs import graph_us, routed_cases

p = argparse.ArgumentParser()
p.add_argument("--cases", default="mixtral:64,mixtral:256")
p.add_argument("--routings", default="balanced,random,zipf")
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()
table = []
for shape, T, r, x, w1, w2, wts, ids in routed_cases(a.cases, a.routings):
    counts = sorted(torch.bincount(ids.view(-1).long(), minlength=w1.shape[0]).tolist(), reverse=True)
    print(f"-- {shape} T={T} {r}: rows an expert {counts[:12]}", flush=True)
    fns = {"grouped_mm": lambda: moe_grouped_mm(x, w1, w2, wts, ids)}
    outs = {}
    for order in (True, False):
        M._EXPERT_ORDER = order
        outs[order] = M.moe_experts(x, w1, w2, wts, ids, validate=False).clone()
    if not torch.equal(outs[True], outs[False]):
        raise SystemExit(f"{shape} T={T} {r}: the two orders disagree")
    best = {}
    for rnd in range(a.rounds):
        for name in ("grouped_mm", "expert order", "before"):
            if name == "grouped_mm":
                fn = fns[name]
            else:
                M._EXPERT_ORDER = name == "expert order"
                fn = lambda: M.moe_experts(x, w1, w2, wts, ids, validate=False)  # noqa: E731
            t = graph_us(fn)
            best[name] = min(best.get(name, 1e30), t)
            print(f"{shape} T={T} {r} round {rnd}: {name} {t:.1f} us", flush=True)
    g = best["grouped_mm"]
    table.append(f"{shape} T={T} {r:8s}: expert order {best['expert order']:7.1f} us ({g / best['expert order']:.2f}x), "
                 f"before {best['before']:7.1f} us ({g / best['before']:.2f}x), grouped_mm {g:7.1f} us")
M._EXPERT_ORDER = True
print("\n".join(table))
