"""Decode's sliding window and softcap, and rows nobody wrote (issue 6; a probe, not the benchmark).

1. Dead rows. A sequence's last page holds rows past its length that nobody wrote (or stale ones),
   and a window's first page rows before the window. The Gluon kernel loads a 16-token slice whole
   and gives those rows p = 0, but 0 x NaN is NaN. For the shipped kernel and, with ``--old``, an
   earlier copy of ops/decode_attention_sm90.py: those rows set to NaN, is the output finite and
   right (lengths 4097, 1000, 17 and 1; one split and forced splits)?
2. Cost. The op (validate=False, plans replayed) on paged problems: plain, with softcap 50, with a
   window of the last 4,096 keys; SDPA's cuDNN backend on the whole unpaged context and on the
   window's keys alone (contiguous). With ``--old``: the old copy's kernel beside the shipped one
   (kernel alone, decode_sm90) for the dead-row fix's cost. Rounds alternate the order.

    python benchmarks/probe_decode_window.py [--shapes 16x32768,64x8192,1x32768] [--old PATH]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from decode_probe_inputs import load_sm90_copy, paged_problem, print_table, shapes, timing_setup, unpaged
from warpforge.bench.timing import device_ms
from warpforge.ops import decode_attention_sm90 as G
from warpforge.ops.decode_attention import decode_attention, decode_attention_reference

WINDOW = 4096


def dead_rows(mods: dict, scale2: float) -> None:
    """Part 1: NaN in every row past each length; each module's kernel at its plan and 3 splits."""
    torch.manual_seed(0)
    lens = [4097, 1000, 17, 1]
    page, hq, hk, d = 16, 32, 8, 128
    mb = -(-max(lens) // page) + 1
    nb = len(lens) * mb
    kc = torch.randn(nb, page, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    bt = torch.randperm(nb, device="cuda", dtype=torch.int32).view(len(lens), mb)
    for b, n in enumerate(lens):
        for p in range(n, mb * page):
            kc[bt[b, p // page], p % page] = float("nan")
            vc[bt[b, p // page], p % page] = float("nan")
    sl = torch.tensor(lens, device="cuda", dtype=torch.int32)
    q = torch.randn(len(lens), hq, d, device="cuda", dtype=torch.bfloat16)
    ref = decode_attention_reference(q, kc, vc, bt, sl).float()
    from warpforge.ops.decode_attention import _combine
    for name, mod in mods.items():
        for splits in (None, 3):
            o = torch.zeros_like(q)
            parts = mod.decode_sm90(q, kc, vc, bt, sl, o, scale2, splits)
            if parts is not None:
                _combine(*parts[:3], o, parts[0].shape[2])
            torch.cuda.synchronize()
            fin = torch.isfinite(o).all(-1).all(-1).tolist()
            err = ((o.float() - ref).norm() / ref.norm()).item()
            print(f"dead rows: {name:8s} splits={splits}: finite per sequence {fin}, relative error {err:.2e}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16x32768,64x8192,1x32768")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", metavar="PATH", help="an earlier copy of ops/decode_attention_sm90.py")
    a = ap.parse_args()
    cfg, copy, scale2 = timing_setup()
    mods = {"shipped": G}
    if a.old:
        mods["old"] = load_sm90_copy(open(a.old).read(), "_dec_old")
    dead_rows(mods, scale2)
    res, nbytes = {}, {}
    for sh, bsz, ctx in shapes(a.shapes):
        q, kc, vc, bt, sl, kvb = paged_problem(bsz, ctx)
        nbytes[sh] = kvb
        kd, vd = unpaged(kc, bt, ctx), unpaged(vc, bt, ctx)
        kw, vw = kd[:, :, -WINDOW:].contiguous(), vd[:, :, -WINDOW:].contiguous()
        q4 = q.unsqueeze(2)
        o = torch.empty_like(q)
        fns = {
            "op": lambda: decode_attention(q, kc, vc, bt, sl, validate=False),
            "op softcap50": lambda: decode_attention(q, kc, vc, bt, sl, softcap=50.0, validate=False),
            f"op window{WINDOW}": lambda: decode_attention(q, kc, vc, bt, sl, window_size=(WINDOW - 1, 0),
                                                           validate=False),
            "cudnn": lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True),
            f"cudnn window{WINDOW}": lambda: F.scaled_dot_product_attention(q4, kw, vw, enable_gqa=True),
        }
        for name, mod in mods.items():
            fns[f"kernel {name}"] = lambda mod=mod: mod.decode_sm90(q, kc, vc, bt, sl, o, scale2)
        # the window's answer against the cuDNN one on its keys
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
            want = fns[f"cudnn window{WINDOW}"]().squeeze(2).float()
        got = fns[f"op window{WINDOW}"]().float()
        print(f"{sh}: window against cuDNN on its keys, relative difference "
              f"{((got - want).norm() / want.norm()).item():.2e}", flush=True)
        for r in range(a.rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                if name.startswith("cudnn"):
                    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
                        t = device_ms(fns[name], cfg, kvb)
                else:
                    t = device_ms(fns[name], cfg, kvb)
                res.setdefault((sh, name), []).append(t * 1e3)
        del kd, vd, kw, vw
    print("\n% copy is on the whole context's KV bytes (the window rows read a fraction of them)")
    print_table(res, nbytes, copy, width=18)


if __name__ == "__main__":
    main()
