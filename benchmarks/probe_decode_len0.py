"""What the Gluon decode kernel's fixed cost is made of (issue 6; a probe, not the benchmark).

On 16 keys the kernel takes ~6 us where cuDNN's takes 3 (NOTES item 136). This probe times the
kernel alone (no combine) under the bench's clean timer, in alternating rounds, with every length
0 (no KV read at all), with 16 and with the full context, for the shipped kernel and copies with
one part taken out (timing only; the outputs of the cut copies are wrong and not checked):

- ``no merge``: the one-split merge branch compiled out (``if splits == 1`` -> ``if False``), so
  its 32 KB of scratch is not allocated (~104 KB of shared memory instead of ~136 KB);
- ``ring 2``: two slots instead of three (64 KB ring);
- ``no q``: the consumers take zeros for the query rows instead of loading them;
- ``no stores``: no partials stored at a unit's end;
- ``regs 168``: the consumer warps at 168 registers (less to allocate at the partitions' start).

    python benchmarks/probe_decode_len0.py [--shapes 1x16384,8x4096] [--rounds 3]
"""
from __future__ import annotations

import argparse

import torch

from decode_probe_inputs import load_sm90_patched, paged_problem
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import decode_attention as DA
from warpforge.ops import decode_attention_sm90 as G

NO_MERGE = [("        if splits == 1:\n", "        if False:\n")]
NO_Q = [("    q = _load_q(q_ptr, b, kvh, G, s_qb, s_qh, GP, D, ld)\n",
         "    q = gl.zeros([GP, D], q_ptr.dtype.element_ty, ld)\n"),
        ("        qn = _load_q(q_ptr, bn, kvhn, G, s_qb, s_qh, GP, D, ld)\n",
         "        qn = gl.zeros([GP, D], q_ptr.dtype.element_ty, ld)\n")]
NO_STORES = [("            gl.store(m_ptr + row, m_i, mask=gmask)\n", ""),
             ("            gl.store(l_ptr + row, l_i, mask=gmask)\n", ""),
             ("            gl.store(acc_ptr + row[None, :] * D + d[:, None], acc, mask=gmask[None, :])\n",
              "            gl.store(acc_ptr + row, gl.max(gl.max(acc, 0), 0) + m_i + l_i, mask=gmask & (m_i > 1e30))\n")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16384,8x4096")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    mods = {"shipped": (G, {}), "no merge": (load_sm90_patched(NO_MERGE, "_dec_len0_nomerge"), {}),
            "ring 2": (G, {"nb": 2}), "no q": (load_sm90_patched(NO_Q, "_dec_len0_noq"), {}),
            "no stores": (load_sm90_patched(NO_STORES, "_dec_len0_nostores"), {}),
            "regs 168": (G, {"regs": 168})}
    cfg = TimingConfig.quick()
    scale2 = 128 ** -0.5 * DA.LOG2E
    res = {}
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
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
    print(f"{'shape':9s} {'variant':10s} {'len0':>7s} {'len16':>7s} {'full':>7s}   (us, kernel alone, least of the rounds)")
    for sh in a.shapes.split(","):
        for name in mods:
            v = [min(res.get((sh, name, ln), [float("nan")])) for ln in ("len0", "len16", "full")]
            print(f"{sh:9s} {name:10s} {v[0]:7.1f} {v[1]:7.1f} {v[2]:7.1f}")


if __name__ == "__main__":
    main()
