"""Device probe for decode's tall tiles on the pointer kernels (ops/moe.py, tall_path; NOTES item 103):
each call with the split launches off and with each tall config of ``TALL`` (the same one for gate/up
and down), against the torch._grouped_mm pipeline, as CUDA-graph latency (moe_probe_inputs.graph_us),
the least of ``--rounds`` alternating rounds, over the smaller experts' shapes and the bench's routings.
Prints a table last, and the verdict line ``tall: on`` or ``tall: off`` (the default config against
off, summed over every case) for the device script that runs the bench next.

    python benchmarks/probe_moe_tall.py [--cases dsv2:64,dsv2:256,...] [--routings balanced,random,zipf]
"""
import argparse

import torch

import warpforge.ops.moe as M
from warpforge.bench.workloads import make_moe_routing, moe_grouped_mm
from warpforge.runtime.heuristics import MoEConfig

from moe_probe_inputs import SHAPES, graph_us, make

TALL = [MoEConfig(128, 64, 128, 8, 3), MoEConfig(64, 64, 128, 4, 3), MoEConfig(128, 128, 64, 8, 3)]
p = argparse.ArgumentParser()
p.add_argument("--cases", default="dsv2:64,dsv2:256,qwen3:64,qwen3:256,olmoe:64,olmoe:256")
p.add_argument("--routings", default="balanced,random,zipf")
p.add_argument("--rounds", type=int, default=2)
a = p.parse_args()
default = dict(M.MOE_TALL)
names = ["off"] + [f"{c.block_m}x{c.block_n}x{c.block_k}/{c.num_warps}w{c.num_stages}s" for c in TALL]
table, total = [], {name: 0.0 for name in names}


def setup(name):
    M._TALL_ON = name != "off"
    if name != "off":
        c = TALL[names.index(name) - 1]
        M.MOE_TALL.update(up=c, down=c)


for case in a.cases.split(","):
    shape, T = case.split(":")
    T = int(T)
    d, n, E, k = SHAPES[shape]
    x, w1, w2, _, _ = make(T, d, n, E, k)
    for r in a.routings.split(","):
        ids, wts = make_moe_routing(T, E, k, r)
        ids, wts = ids.cuda(), wts.cuda()
        counts = sorted(torch.bincount(ids.view(-1).long(), minlength=E).tolist(), reverse=True)
        print(f"-- {shape} T={T} {r}: rows an expert {counts[:12]}", flush=True)
        fn = lambda: M.moe_experts(x, w1, w2, wts, ids, validate=False)  # noqa: E731
        setup("off")
        ref = fn().float()
        for name in names[1:]:
            setup(name)
            err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 1e-2:
                raise SystemExit(f"{shape} T={T} {r} {name}: relative error {err:.2e} against the one launch")
        best = {}
        for rnd in range(a.rounds):
            for name in ["grouped_mm"] + names:
                if name == "grouped_mm":
                    t = graph_us(lambda: moe_grouped_mm(x, w1, w2, wts, ids))
                else:
                    setup(name)
                    t = graph_us(fn)
                best[name] = min(best.get(name, 1e30), t)
                print(f"{shape} T={T} {r} round {rnd}: {name} {t:.1f} us", flush=True)
        g = best["grouped_mm"]
        for name in names:
            total[name] += best[name]
        table.append(f"{shape:6s} T={T:3d} {r:8s} grouped_mm {g:6.1f} | " +
                     " | ".join(f"{name} {best[name]:6.1f} ({g / best[name]:.2f}x)" for name in names))
M._TALL_ON = True
M.MOE_TALL.update(default)
print("\n".join(table))
print("sum over the cases: " + ", ".join(f"{name} {total[name]:.1f} us" for name in names))
first = names[1 + [c == default["up"] for c in TALL].index(True)]
print(f"tall: {'on' if total[first] < total['off'] else 'off'}")
