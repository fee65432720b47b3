"""What the Gluon decode kernel's fixed cost is made of (issue 6; a probe, not the benchmark).

On 16 keys the kernel took ~6 us where cuDNN's takes 3 (NOTES item 136). This probe times the
kernel alone (no combine) under the bench's clean timer, in alternating rounds, with every length
0 (no KV read at all), with 16 and with the full context, for the shipped kernel and copies with
one part taken out or changed (timing only; the outputs of the cut copies are wrong and not
checked). Session 47 ran it with a ``no merge`` copy (the one-split merge compiled out of split
launches), which is how the kernel now ships (NOTES item 137):

- ``ring 2``: two slots instead of three (64 KB ring);
- ``no q``: the consumers take zeros for the query rows instead of loading them;
- ``no stores``: no partials stored at a unit's end;
- ``regs 168``: the consumer warps at 168 registers (less to allocate at the partitions' start);
- ``prefetch desc``: not a cut but an addition, the TMA descriptors prefetched at the producer's
  start (``prefetch.param.tensormap``), so their first fetch overlaps the length and block-id reads;
- ``merge 1 buf``: for one-split shapes (batch >= 16), the merge scratch single-buffered (16 KB less
  shared memory; the outputs stay right: a unit's merge waits for the last one's reads).

    python benchmarks/probe_decode_len0.py [--shapes 1x16384,8x4096] [--rounds 3]
"""
from __future__ import annotations

import argparse

import torch

from decode_probe_inputs import load_sm90_patched, paged_problem, shapes
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import decode_attention as DA
from warpforge.ops import decode_attention_sm90 as G

NO_Q = [("    q = _load_q(q_ptr, b, kvh, G, s_qb, s_qh, GP, D, ld)\n",
         "    q = gl.zeros([GP, D], q_ptr.dtype.element_ty, ld)\n"),
        ("        qn = _load_q(q_ptr, bn, kvhn, G, s_qb, s_qh, GP, D, ld)\n",
         "        qn = gl.zeros([GP, D], q_ptr.dtype.element_ty, ld)\n")]
# the TMA descriptors fetched at the producer's start (before the length and block-id reads) instead
# of at the first copies (stamps, NOTES item 137: ~1.3 us between the first free slot and the first
# copies issued after a flush). Gluon has no op for it: inline PTX naming the kernel's parameters
# (k_desc and v_desc are parameters 1 and 10 of _decode_sm90_kernel, each descriptor followed by its
# 4 shape and 4 stride parameters); a wrong index would prefetch a non-descriptor, a hint only.
PREFETCH = [("""    nprog = gl.num_programs(0)
    t = 0
    b, kvh, split, n, c0, c1 = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, C)
    p0, p1, p2, p3 = _pages(""", """    nprog = gl.num_programs(0)
    t = 0
    gl.inline_asm_elementwise("prefetch.param.tensormap [_decode_sm90_kernel_param_1]; "
                              "prefetch.param.tensormap [_decode_sm90_kernel_param_10]; // $0",
                              "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    b, kvh, split, n, c0, c1 = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, C)
    p0, p1, p2, p3 = _pages(""")]
# one-split launches: the merge scratch single-buffered (16 KB instead of 32 at D = 128, GP = 8): the
# next unit's merge waits for this one's reads (item 137 found a split launch 1-2.5 us faster without
# the 32 KB; this asks whether the one-split stream gains from less shared memory too)
ONE_BUFFER = [("            buf = rr % 2\n            ph = (rr // 2) & 1\n",
               "            buf = 0\n            ph = rr & 1\n"),
              ("    sc = gl.allocate_shared_memory(gl.float32, [2 * C, GP, SD], plain2)",
               "    sc = gl.allocate_shared_memory(gl.float32, [C, GP, SD], plain2)"),
              ("    scm = gl.allocate_shared_memory(gl.float32, [2 * C, GP], plain1)",
               "    scm = gl.allocate_shared_memory(gl.float32, [C, GP], plain1)"),
              ("    scl = gl.allocate_shared_memory(gl.float32, [2 * C, GP], plain1)",
               "    scl = gl.allocate_shared_memory(gl.float32, [C, GP], plain1)")]
NO_STORES = [("            gl.store(m_ptr + row, m_i, mask=gmask)\n", ""),
             ("            gl.store(l_ptr + row, l_i, mask=gmask)\n", ""),
             ("            gl.store(acc_ptr + row[None, :] * D + d[:, None], acc, mask=gmask[None, :])\n",
              "            gl.store(acc_ptr + row, gl.max(gl.max(acc, 0), 0) + m_i + l_i, mask=gmask & (m_i > 1e30))\n")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16384,8x4096")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    mods = {"shipped": (G, {}), "ring 2": (G, {"nb": 2}), "no q": (load_sm90_patched(NO_Q, "_dec_len0_noq"), {}),
            "no stores": (load_sm90_patched(NO_STORES, "_dec_len0_nostores"), {}),
            "regs 168": (G, {"regs": 168}), "prefetch desc": (load_sm90_patched(PREFETCH, "_dec_len0_prefetch"), {}),
            "merge 1 buf": (load_sm90_patched(ONE_BUFFER, "_dec_len0_onebuf"), {})}
    cfg = TimingConfig.quick()
    scale2 = 128 ** -0.5 * DA.LOG2E                 # (not timing_setup: no copy ceiling needed here)
    res = {}
    for sh, bsz, ctx in shapes(a.shapes):
        q, kc, vc, bt, sl, kvb = paged_problem(bsz, ctx)
        lens = {"len0": torch.zeros_like(sl), "len16": torch.full_like(sl, 16), "full": sl}
        o = torch.empty_like(q)
        for r in range(a.rounds):
            for name in (list(mods) if r % 2 == 0 else list(mods)[::-1]):
                mod, kw = mods[name]
                for ln, l in lens.items():
                    try:
                        t = device_ms(lambda: mod.decode_sm90(q, kc, vc, bt, l, o, scale2, **kw), cfg, None)
                    except Exception as e:  # noqa: BLE001 -- a cut copy that does not compile: say so, go on
                        print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        continue
                    res.setdefault((sh, name, ln), []).append(t * 1e3)
        del q, kc, vc, bt
        torch.cuda.empty_cache()
    print(f"{'shape':9s} {'variant':13s} {'len0':>7s} {'len16':>7s} {'full':>7s}   (us, kernel alone, least of the rounds)")
    for sh, _, _ in shapes(a.shapes):
        for name in mods:
            v = [min(res.get((sh, name, ln), [float("nan")])) for ln in ("len0", "len16", "full")]
            print(f"{sh:9s} {name:13s} {v[0]:7.1f} {v[1]:7.1f} {v[2]:7.1f}")


if __name__ == "__main__":
    main()
