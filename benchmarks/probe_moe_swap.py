"""Device probe for the swapped decode kernels (ops/moe.py, _moe_swap_kernel; NOTES items 100-101):
Decode (Mixtral by default) under the bench's routings, all latencies as a serving loop sees them (each call or
kernel captured once in a CUDA graph and replayed back to back; moe_probe_inputs.graph_us).

For each routing: the torch._grouped_mm pipeline, the shipped unswapped call, then a sweep of the
gate/up kernel's (TM, TW, BJ, BK, warps, stages) with the down kernel at its default, the down
kernel's with gate/up at its default, each kernel alone and in the whole call, and the best pair.
``--force`` runs the swapped kernels at 128-row tiles where the shipped heuristics would not (T = 64,
smaller experts); the shipped route is timed first either way.

    python benchmarks/probe_moe_swap.py [--shape mixtral] [--T 256] [--routings balanced,random,zipf]
        [--force] [--defaults-only] [--up 'TM,TW,BJ,BK,warps,stages;...'] [--down ...]
"""
import argparse

import torch

import warpforge.ops.moe as M
from warpforge.bench.workloads import make_moe_routing, moe_grouped_mm

from moe_probe_inputs import SHAPES, graph_us, make

p = argparse.ArgumentParser()
p.add_argument("--T", type=int, default=256)
p.add_argument("--routings", default="balanced,random,zipf")
p.add_argument("--force", action="store_true")
p.add_argument("--shape", default="mixtral", choices=sorted(SHAPES))
p.add_argument("--defaults-only", action="store_true", help="time MOE_SWAP's configs only, no sweep")
p.add_argument("--up", help="gate/up configs to sweep, 'TM,TW,BJ,BK,warps,stages;...' (default: a built-in list)")
p.add_argument("--down", help="down configs to sweep, as --up")
a = p.parse_args()
UP = [(64, 128, 64, 64, 4, 4), (64, 128, 128, 64, 8, 4), (64, 128, 64, 64, 4, 3), (64, 128, 64, 128, 4, 3)]
DOWN = [(64, 128, 128, 128, 4, 3), (64, 128, 128, 128, 8, 3), (64, 128, 64, 128, 4, 4), (64, 128, 128, 64, 4, 4)]


def configs(text):
    return [tuple(int(v) for v in c.split(",")) for c in text.split(";") if c.strip()]


UP = configs(a.up) if a.up else UP
DOWN = configs(a.down) if a.down else DOWN

d, n, E, k = SHAPES[a.shape]
x, w1, w2, _, _ = make(a.T, d, n, E, k)
real = M.MOE_SWAP.copy()
if a.defaults_only:
    UP, DOWN = [real["up"]], [real["down"]]
shipped_block_m = M.moe_block_m
rows = []


def say(line):
    print(line, flush=True)
    rows.append(line)


for r in a.routings.split(","):
    ids, wts = make_moe_routing(a.T, E, k, r)
    ids, wts = ids.cuda(), wts.cuda()
    counts = sorted(torch.bincount(ids.view(-1).long(), minlength=E).tolist(), reverse=True)
    say(f"-- T={a.T} {r}: rows an expert {counts}")
    fn = lambda: M.moe_experts(x, w1, w2, wts, ids, validate=False)  # noqa: E731
    g0 = graph_us(lambda: moe_grouped_mm(x, w1, w2, wts, ids))
    M.moe_block_m = shipped_block_m
    t = graph_us(fn)
    say(f"T={a.T} {r}: shipped route {t:.1f} us ({g0 / t:.2f}x)")
    if a.force:
        M.moe_block_m = lambda *args: 128
    M._SWAP_ON = False
    base = fn().float()
    t = graph_us(fn)
    say(f"T={a.T} {r}: grouped_mm {g0:.1f} us; unswapped {t:.1f} us ({g0 / t:.2f}x)")
    M._SWAP_ON = True
    ss, sp, te, st, cnt = M._align(ids.view(-1), E, 128)
    xg = M._gather_rows(x, ss, te, k, 128)
    h = torch.empty((ss.numel(), n), device="cuda", dtype=x.dtype)
    y = torch.empty((ss.numel(), d), device="cuda", dtype=x.dtype)
    meta = (ss, te, st, cnt)
    best = {}
    for kind, cfgs in (("up", UP), ("down", DOWN)):
        res = []
        for c in cfgs:
            M.MOE_SWAP.update(real)
            M.MOE_SWAP[kind] = c
            try:
                if kind == "up":
                    alone = graph_us(lambda: M._gemm_swap(xg, w1, h, meta=meta, K=d, N=n, epi=1, cfg=c))
                else:
                    alone = graph_us(lambda: M._gemm_swap(h, w2, y, meta=meta, K=n, N=d, epi=0,
                                                          weights=wts.view(-1), cfg=c))
                out = fn().float()
                err = ((out - base).norm() / base.norm()).item()
                call = graph_us(fn)
                res.append((call, c))
                say(f"T={a.T} {r}: {kind} {c}: alone {alone:.1f} us, call {call:.1f} us ({g0 / call:.2f}x), err {err:.1e}")
            except Exception as exc:  # noqa: BLE001
                say(f"T={a.T} {r}: {kind} {c}: failed {repr(exc)[:160]}")
        best[kind] = min(res)[1] if res else real[kind]
    M.MOE_SWAP.update(best)
    out = fn().float()
    err = ((out - base).norm() / base.norm()).item()
    call = graph_us(fn)
    say(f"T={a.T} {r}: BEST up {best['up']} down {best['down']}: call {call:.1f} us ({g0 / call:.2f}x), err {err:.1e}")
    M.MOE_SWAP.update(real)
print("\n== summary ==")
print("\n".join(rows))
