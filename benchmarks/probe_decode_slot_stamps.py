"""Where the Gluon decode kernel's consumer warps spend a batch-1 call, slot by slot (issue 6; NOTES
item 119: without their work the kernel is ~5.5 us faster at B1 x 16K and x 32K alike, and neither
the slot release order nor a shorter S chain moves it). A probe, not the benchmark.

A copy of ops/decode_attention_sm90.py with %globaltimer stamps (probe_decode_stamps.py's _stamp,
here 128 a program for programs 0..7, in the output buffer a split call does not otherwise write):
for each of the program's first 32 slots t, when the producer issued its copies (I), when consumer
warp 0's wait for it passed (W) and when that warp finished the slice's arithmetic (D); plus the
kernel's entry and the partial store. Printed: medians over programs and repetitions, us after
the kernel's first entry, under the bench's clean condition. Reading: W_t - I_t is the copies'
latency where the warp was idle (W_t > D_{t-1}); W_t ~ D_{t-1} means the data was there first
and the warp is the bottleneck.

    python benchmarks/probe_decode_slot_stamps.py [--shapes 1x16384,1x32768] [--reps 10]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from decode_probe_inputs import load_sm90_patched, paged_problem, stamp_samples

SLOTS = 32
STAMP = '''
@gluon.jit
def _stamp(out_ptr, slot, dep):
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [dep], dtype=gl.int64, is_pure=False, pack=1)
    pid = gl.program_id(0)
    if pid < 8:
        p = out_ptr.to(gl.pointer_type(gl.int64), bitcast=True)
        gl.store(p + pid * 128 + slot, t)

'''
# stamp columns: 0 entry, 1 partials stored (warp 0); I_t = 2 + t, W_t = 34 + t, D_t = 66 + t (t < 32)
EDITS = [
    ("\n\n@gluon.jit\ndef _unit(", "\n" + STAMP + "\n@gluon.jit\ndef _unit("),
    ("            tma.async_copy_global_to_shared(v_desc, [p3, ((c + 3) % sub) * 16, kvh, 0], bar, v_smem.index(slot * C + 3))\n",
     "            tma.async_copy_global_to_shared(v_desc, [p3, ((c + 3) % sub) * 16, kvh, 0], bar, v_smem.index(slot * C + 3))\n"
     "            if t < 32:\n                _stamp(out_ptr, 2 + t, t)\n"),
    ("            mbarrier.wait(ready.index(slot), (t // NB) & 1)\n",
     "            mbarrier.wait(ready.index(slot), (t // NB) & 1)\n"
     "            if W == 0:\n                if t < 32:\n                    _stamp(out_ptr, 34 + t, t)\n"),
    ("                m_i = m_new\n",
     "                m_i = m_new\n"
     "                if W == 0:\n                    if t < 32:\n                        _stamp(out_ptr, 66 + t, gl.max(m_i, 0).to(gl.int32, bitcast=True))\n"),
    ("            gl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=gmask[:, None])\n",
     "            gl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=gmask[:, None])\n"
     "            if W == 0:\n                _stamp(out_ptr, 1, t)\n"),
    ("    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NB * C] + k_desc.block_type.shape, k_desc.layout)\n",
     "    _stamp(out_ptr, 0, gl.program_id(0))\n"
     "    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NB * C] + k_desc.block_type.shape, k_desc.layout)\n"),
]


def patched_module():
    return load_sm90_patched(EDITS, "_decode_sm90_slot_stamps")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16384,1x32768")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    S = patched_module()
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
        q, kc, vc, bt, sl, _ = paged_problem(bsz, ctx)
        cols = stamp_samples(S, q, kc, vc, bt, sl, a.reps, 8, 128, range(2 + 3 * SLOTS))
        med = {k: statistics.median(v) for k, v in cols.items() if v}
        print(f"B{bsz} ctx {ctx} [clean], us after the first entry; partials stored {med.get(1, float('nan')):.2f}")
        print(f"{'t':>3s} {'I issue':>8s} {'W ready':>8s} {'D done':>8s} {'W-I':>6s} {'D-W':>6s} {'W-Dprev':>8s}")
        prev = None
        for t in range(SLOTS):
            i, w, dd = med.get(2 + t), med.get(34 + t), med.get(66 + t)
            if w is None:
                break
            gap = f"{w - prev:8.2f}" if prev is not None else f"{'':8s}"
            print(f"{t:3d} {i if i is not None else float('nan'):8.2f} {w:8.2f} {dd if dd is not None else float('nan'):8.2f} "
                  f"{w - (i or 0):6.2f} {(dd or 0) - w:6.2f} {gap}")
            prev = dd
        del q, kc, vc, bt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
