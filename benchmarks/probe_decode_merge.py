"""What the Gluon decode kernel's end-of-unit merge costs (issue 6; a probe, not the benchmark).

At a unit's end the four consumer warps merge their online-softmax states through shared memory
(double-buffered scratch, two mbarriers, two warp barriers) before the one-split path writes the
output. Item 75 found that merge (with a split's store) ~4-5 us a call at length 0. This probe
times the kernel alone (no combine), clean timer, as it is and patched (timing only, the
patched outputs are wrong and not checked):

- ``no merge``: each warp writes its own normalised state to the output (the four race), no
  shared memory, no barriers;
- ``no warp barriers``: the merge without its two gl.thread_barrier() calls.

Cells: one split a sequence (batch 64 x 4K, 16 x 8K: the merge runs once a unit) and batch 1 x 16K
(splits, no merge: a control), each with full lengths and every length 0; sdpa[cudnn] beside.
Two rounds, alternating.

    python benchmarks/probe_decode_merge.py [--shapes 64x4096,1x16384]
"""
from __future__ import annotations

import argparse

import torch

from decode_probe_inputs import cudnn_decode, load_sm90_copy, paged_problem
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import decode_attention as DA
from warpforge.ops import decode_attention_sm90 as G

MERGE_START = "            buf = rr % 2\n"
MERGE_END = """            gl.store(out_ptr + b.to(gl.int64) * s_ob + rows[:, None] * s_oh + W * DS + dd_m[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=(g_m < G)[:, None])
"""
NO_MERGE = """            o = acc / gl.where(l_i > 0, l_i, 1.0)[:, None]
            rows = (kvh * G + g).to(gl.int64)
            gl.store(out_ptr + b.to(gl.int64) * s_ob + rows[:, None] * s_oh + d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=gmask[:, None])
"""


def variants():
    src = open(G.__file__).read()
    i, j = src.index(MERGE_START), src.index(MERGE_END) + len(MERGE_END)
    assert src.count(MERGE_START) == 1 and src.count(MERGE_END) == 1
    no_merge = src[:i] + NO_MERGE + src[j:]
    block = src[i:j]
    assert block.count("            gl.thread_barrier()\n") == 2
    no_bar = src[:i] + block.replace("            gl.thread_barrier()\n", "") + src[j:]
    return {"base": G, "no merge": load_sm90_copy(no_merge, "_dec_nomerge"),
            "no warp barriers": load_sm90_copy(no_bar, "_dec_nobar")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="64x4096,16x8192,1x16384")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    cfg = TimingConfig.quick()
    mods = variants()
    scale2 = 128 ** -0.5 * DA.LOG2E
    res = {}
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
        q, kc, vc, bt, sl, kvb = paged_problem(bsz, ctx)
        sl0 = torch.zeros_like(sl)
        _, res[(sh, "full", "sdpa[cudnn]")] = cudnn_decode(q, kc, vc, bt, ctx, lambda fn: [device_ms(fn, cfg, kvb) * 1e3])
        o = torch.empty_like(q)
        for r in range(a.rounds):
            names = list(mods) if r % 2 == 0 else list(mods)[::-1]
            for name in names:
                for lens, tag in ((sl, "full"), (sl0, "len0")):
                    t = device_ms(lambda: mods[name].decode_sm90(q, kc, vc, bt, lens, o, scale2), cfg, kvb)
                    res.setdefault((sh, tag, name), []).append(t * 1e3)
        del q, kc, vc, bt
        torch.cuda.empty_cache()
    print(f"{'shape':9s} {'lens':5s} {'variant':18s} {'us':>7s}  rounds")
    for (sh, tag, name), v in res.items():
        print(f"{sh:9s} {tag:5s} {name:18s} {min(v):7.1f}  {[round(x, 1) for x in v]}")


if __name__ == "__main__":
    main()
