"""Device probe: what return_lse costs decode_attention (the partials and the combine at every
split count, where one split writes the output directly without it), bf16 Hq 32 / Hkv 8 D 128,
pages of 16 shuffled; rounds alternate over the rows, each timed as the bench times decode
(device_ms), the table gives the least round.

    python benchmarks/probe_decode_lse.py [--shapes 1x16384,64x4096] [--rounds 5]
"""
from __future__ import annotations

import argparse

import torch

import warpforge as wf
from decode_probe_inputs import alternate, paged_problem, print_table, shapes, timing_setup
from warpforge.bench.timing import device_ms

SHAPES = "1x4096,1x16384,8x8192,16x8192,32x16384,64x4096,64x32768"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    cfg, copy, _ = timing_setup()
    res, nbytes = {}, {}
    for sh, bsz, ctx in shapes(a.shapes):
        q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx)
        out, lse = wf.decode_attention(q, kc, vc, bt, sl, return_lse=True)
        torch.testing.assert_close(out, wf.decode_attention(q, kc, vc, bt, sl), atol=2e-2, rtol=2e-2)
        assert torch.isfinite(lse).all()
        rows = {"plain": lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False),
                "return_lse": lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False, return_lse=True)}
        nbytes[sh] = kv_bytes
        times = alternate(rows, a.rounds, lambda fn: device_ms(fn, cfg, kv_bytes))
        res.update({(sh, name): us for name, us in times.items()})
        best = {name: min(us) for name, us in times.items()}
        print(f"{sh}: plain {best['plain']:.1f} us, return_lse {best['return_lse']:.1f} us "
              f"(+{best['return_lse'] - best['plain']:.1f})", flush=True)
        del q, kc, vc
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
    print_table(res, nbytes, copy, width=12)


if __name__ == "__main__":
    main()
