"""The Gluon decode call's fixed costs, A/B (issue 6; a probe, not the benchmark; NOTES item 136).

At batch 1 and 8 the call trails cuDNN by 1-2 us while streaming faster: the main kernel's fixed
part (about 6 us on 16 keys against cuDNN's 3) and the combine behind it. This probe times, in
alternating rounds under the bench's timer, an earlier copy of ops/decode_attention_sm90.py (``--old``,
with PDL where that copy has it) against the current one with and without programmatic dependent
launch of the combine (the current kernel lets the combine launch once each program is done), each
as the whole call (kernel and combine) and as the main kernel alone, and the operator by its
default route (``--routes``: also forced onto the Triton kernel and onto the Gluon one; ``--splits``:
the current kernel at forced split counts), beside sdpa[cudnn] on the same problem unpaged. Outputs are
checked against cuDNN's and between variants first.

    python benchmarks/probe_decode_fixed.py --old PATH [--shapes 1x16384,1x32768,8x4096] [--rounds 3]
        [--routes] [--splits 2,4]
"""
from __future__ import annotations

import argparse
import inspect

import torch

from decode_probe_inputs import cudnn_decode, load_sm90_copy, paged_problem, print_table, shapes, timing_setup
from warpforge.bench.timing import device_ms
from warpforge.ops import decode_attention as DA
from warpforge.ops import decode_attention_sm90 as G
from warpforge.runtime import heuristics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="an earlier copy of ops/decode_attention_sm90.py")
    ap.add_argument("--shapes", default="1x16384,1x32768,8x4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--routes", action="store_true", help="also the operator forced onto each kernel")
    ap.add_argument("--splits", default="", help="split counts to force on the current kernel (PDL on), e.g. 2,4")
    a = ap.parse_args()
    old = load_sm90_copy(open(a.old).read(), "_dec_fixed_old")
    cfg, copy, scale2 = timing_setup()
    res, nbytes = {}, {}
    for sh, bsz, ctx in shapes(a.shapes):
        q, kc, vc, bt, sl, kvb = paged_problem(bsz, ctx)
        nbytes[sh] = kvb

        def call(mod, pdl, combine=True, splits=None):
            o = torch.empty_like(q)
            parts = mod.decode_sm90(q, kc, vc, bt, sl, o, scale2, splits=splits, **({"pdl": True} if pdl else {}))
            if parts is not None and combine:
                DA._combine(*parts, o, parts[0].shape[2], pdl=pdl)
            return o

        def op(route=None):
            saved = DA._SM90[:], heuristics.DECODE_SM90_MIN_TOKENS
            if route == "triton":
                DA._SM90[:] = [None]
            elif route == "sm90":
                heuristics.DECODE_SM90_MIN_TOKENS = 0
            try:
                return DA.decode_attention_op(q, kc, vc, bt, sl, 128 ** -0.5, 0)
            finally:
                DA._SM90[:], heuristics.DECODE_SM90_MIN_TOKENS = saved

        old_pdl = "pdl" in inspect.signature(old.decode_sm90).parameters
        fns = {"old": lambda: call(old, old_pdl), "new": lambda: call(G, False), "new pdl": lambda: call(G, True),
               "old main": lambda: call(old, False, False), "new main": lambda: call(G, False, False), "op": op}
        if a.routes:
            fns.update({"op triton": lambda: op("triton"), "op sm90": lambda: op("sm90")})
        for s in (int(x) for x in a.splits.split(",") if x):
            fns[f"new pdl s{s}"] = lambda s=s: call(G, True, splits=s)
        ref, res[(sh, "sdpa[cudnn]")] = cudnn_decode(q, kc, vc, bt, ctx, lambda fn: [device_ms(fn, cfg, kvb) * 1e3])
        outs = {k: fns[k]().clone() for k in fns if "main" not in k}
        for k, o in outs.items():
            err = ((o.double() - ref.double()).norm() / ref.double().norm()).item()
            print(f"{sh} {k}: rel err to cudnn {err:.2e}, equal to old {torch.equal(o, outs['old'])}, "
                  f"nan {bool(o.isnan().any())}", flush=True)
        for r in range(a.rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                res.setdefault((sh, name), []).append(device_ms(fns[name], cfg, kvb) * 1e3)
            _, t = cudnn_decode(q, kc, vc, bt, ctx, lambda fn: [device_ms(fn, cfg, kvb) * 1e3])
            res[(sh, "sdpa[cudnn]")] += t
        del q, kc, vc, bt
        torch.cuda.empty_cache()
    print_table(res, nbytes, copy, 12)


if __name__ == "__main__":
    main()
