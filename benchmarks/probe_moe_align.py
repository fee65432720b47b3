"""Device probe for the MoE alignment (ops/moe.py, _align; NOTES item 102): the one-program kernel
(_moe_align_one_kernel) against the three chunked launches (count, offsets, scatter), each timed
alone as CUDA-graph latency (moe_probe_inputs.graph_us), over decode slot counts and expert counts
with uniformly random ids. Prints one line a case and the slot count past which three launches win.

    python benchmarks/probe_moe_align.py [--slots 8,48,64,128,256,384,512,1024,1536,2048] [--experts 8,64,128]
"""
import argparse

import torch

import warpforge.ops.moe as M
from warpforge.runtime.heuristics import moe_block_m

from moe_probe_inputs import graph_us

p = argparse.ArgumentParser()
p.add_argument("--slots", default="8,48,64,128,256,384,512,1024,1536,2048")
p.add_argument("--experts", default="8,64,128")
a = p.parse_args()
g = torch.Generator(device="cuda").manual_seed(0)
for E in (int(v) for v in a.experts.split(",")):
    wins = []
    for S in (int(v) for v in a.slots.split(",")):
        ids = torch.randint(0, E, (S,), device="cuda", dtype=torch.int32, generator=g)
        bm = moe_block_m(S, E, 2)
        t = {}
        for name, one_max in (("one", 1 << 30), ("three", 0)):
            M.MOE_ALIGN_ONE_MAX = M.MOE_ALIGN_ONE_WORK = one_max
            t[name] = graph_us(lambda: M._align(ids, E, bm), reps=500)
            out = [o.clone() for o in M._align(ids, E, bm)]
            if name == "one":
                ref = out
            elif not all(torch.equal(x, y) for x, y in zip(ref, out)):
                raise SystemExit(f"E={E} S={S}: the two paths disagree")
        wins.append(t["one"] < t["three"])
        print(f"E={E} S={S} block_m={bm}: one program {t['one']:.2f} us, three launches {t['three']:.2f} us", flush=True)
    print(f"E={E}: the one program wins at {sum(wins)} of {len(wins)} slot counts")
