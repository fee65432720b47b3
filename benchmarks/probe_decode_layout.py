"""Device probe: decode over the same paged cache values stored two ways, against cuDNN SDPA.

The cache's logical shape is (num_blocks, block_size, Hkv, D) either way; only the storage order
differs:
- NHD (vLLM's and the bench's): a page holds block_size rows of Hkv x D, so one kv head's slice of
  a page is block_size runs of D elements, Hkv x D apart (16 x 256 B, 2 KB apart at Hkv 8, D 128);
- HND (FlashInfer's other layout): torch.empty(num_blocks, Hkv, block_size, D).transpose(1, 2), so a
  kv head's slice of a page is one contiguous run (4 KB).
The kernels read either through strides (the Gluon kernel's TMA box is [1, 16, 1, D] over a 4-D
descriptor). Question: does the contiguous slice close the 1-3% gap to cuDNN at batch >= 16?
Rounds alternate over the rows, each timed as the bench times decode (device_ms: clean calls for
these sizes); the table gives the least round.

    python benchmarks/probe_decode_layout.py [--shapes 16x8192,64x32768] [--rounds 5]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import warpforge as wf
from decode_probe_inputs import alternate, paged_problem, print_table, shapes, timing_setup, unpaged
from warpforge.bench.timing import device_ms

SHAPES = "1x16384,8x8192,16x8192,16x32768,32x16384,64x4096,64x32768"


def hnd(cache: torch.Tensor) -> torch.Tensor:
    """The same values, each (page, kv head) slice contiguous: a (num_blocks, block, Hkv, D) view of
    (num_blocks, Hkv, block, D) storage."""
    return cache.transpose(1, 2).contiguous().transpose(1, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    cfg, copy, _ = timing_setup()
    res, nbytes = {}, {}
    for sh, bsz, ctx in shapes(a.shapes):
        q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx)
        kh, vh = hnd(kc), hnd(vc)
        assert kh.stride(2) == 16 * 128 and torch.equal(kh, kc)
        ref = wf.decode_attention(q, kc, vc, bt, sl)
        torch.testing.assert_close(wf.decode_attention(q, kh, vh, bt, sl), ref, atol=0, rtol=0)
        kd, vd = unpaged(kc, bt, ctx), unpaged(vc, bt, ctx)
        q4 = q.unsqueeze(2)
        rows = {"ours NHD": lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False),
                "ours HND": lambda: wf.decode_attention(q, kh, vh, bt, sl, validate=False)}

        def sdpa():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)
        rows["sdpa cuDNN"] = sdpa
        torch.testing.assert_close(sdpa().squeeze(2), ref, atol=2e-2, rtol=2e-2)
        nbytes[sh] = kv_bytes
        times = alternate(rows, a.rounds, lambda fn: device_ms(fn, cfg, kv_bytes))
        res.update({(sh, name): us for name, us in times.items()})
        best = {name: min(us) for name, us in times.items()}
        print(f"{sh}: " + ", ".join(f"{n} {v:.1f} us" for n, v in best.items())
              + f"; cuDNN / HND {best['sdpa cuDNN'] / best['ours HND']:.3f}, / NHD {best['sdpa cuDNN'] / best['ours NHD']:.3f}",
              flush=True)
        del q, kc, vc, kh, vh, kd, vd
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
    print_table(res, nbytes, copy, width=12)


if __name__ == "__main__":
    main()
