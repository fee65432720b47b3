"""Where the in-kernel split merge of ops/decode_attention_sm90.py (FUSED) spends its extra time
(issue 6; a probe, not the benchmark): the Gluon kernel alone, clean timer, full lengths and every
length 0, at B1 x 16K and B8 x 4K, as is and with parts removed by patching its source (the last
arriver's loads; those and the atomic; the atomic relaxed), against the kernel that stores partials
for the combine kernel. Two rounds.

    python benchmarks/probe_decode_fused_diag.py
"""
import json, os, sys

import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_probe_inputs import load_sm90_copy, paged_problem
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import decode_attention as DA
from warpforge.ops import decode_attention_sm90 as G
from warpforge.runtime import launch
cfg = TimingConfig.quick()
src = open(G.__file__).read()
def patch(src, pairs):
    for a, b in pairs:
        assert src.count(a) == 1, a
        src = src.replace(a, b)
    return src
LOOP = "        for s0 in range(0, splits, SC):\n"
ATOM = '    arrived = gl.atomic_add(ctr, 1, sem="acq_rel", scope="gpu")\n'
V = {
 "fused": (G, True),
 "no final loads": (load_sm90_copy(patch(src, [(LOOP, LOOP.replace("range(0, splits, SC)", "range(0, 0, SC)"))]), "_v2"), True),
 "no atomic, no loads": (load_sm90_copy(patch(src, [(LOOP, LOOP.replace("range(0, splits, SC)", "range(0, 0, SC)")), (ATOM, "    arrived = split\n")]), "_v3"), True),
 "relaxed atomic": (load_sm90_copy(patch(src, [(ATOM, ATOM.replace("acq_rel", "relaxed"))]), "_v5"), True),
 "main kernel (partials)": (G, False),
}
scale2 = 128 ** -0.5 * DA.LOG2E
res = {}
for sh in ("1x16384", "8x4096"):
    bsz, ctx = (int(x) for x in sh.split("x"))
    q, kc, vc, bt, sl, kvb = paged_problem(bsz, ctx)
    sl0 = torch.zeros_like(sl)
    for r in range(2):
        for name, (mod, fused) in V.items():
            o = torch.empty_like(q)
            for lens, tag in ((sl, "full"), (sl0, "len0")):
                t = device_ms(lambda: mod.decode_sm90(q, kc, vc, bt, lens, o, scale2, fused=fused), cfg, kvb)
                res.setdefault((sh, tag, name), []).append(t * 1e3)
            for b in launch.COUNTERS.values():
                b.zero_()
print(f"{'shape':8s} {'lens':5s} {'variant':24s} us (rounds)")
for (sh, tag, name), v in res.items():
    print(f"{sh:8s} {tag:5s} {name:24s} {min(v):6.1f}  {[round(x, 1) for x in v]}")
