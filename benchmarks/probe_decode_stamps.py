"""Where the Gluon decode kernel's fixed cost goes (issue 6; scratch probe, not the benchmark).

The kernel of ops/decode_attention_sm90.py is copied to a temporary module with %globaltimer stamps
at its stages (kernel entry, each partition's entry, the length and block-id loads, the first slot
issued and landed, the loop's end, the partial stores), written for programs 0..63 into the output
buffer, which a split call does not otherwise write (the combine kernel does, and is not run here).
Prints each stage's median time after the kernel's first entry, over programs and repetitions,
under the bench's clean condition (flush first) and warm.

    python benchmarks/probe_decode_stamps.py [--shapes 1x16384] [--reps 10] [--src NAME=PATH,...]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from decode_probe_inputs import load_sm90_patched, paged_problem, stamp_samples

STAMP = '''
@gluon.jit
def _stamp(out_ptr, slot: gl.constexpr, dep):
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [dep], dtype=gl.int64, is_pure=False, pack=1)
    pid = gl.program_id(0)
    if pid < 64:
        p = out_ptr.to(gl.pointer_type(gl.int64), bitcast=True)
        gl.store(p + pid * 16 + slot, t)

'''

NAMES = {0: "kernel entry", 1: "setup done", 2: "producer entry", 3: "producer: length",
         4: "producer: block ids", 5: "producer: first slot free", 6: "producer: last TMA issued",
         7: "consumer 0 entry", 8: "consumer 0: length", 9: "consumer 0: q", 10: "consumer 0: first slot landed",
         11: "consumer 0: loop done", 12: "consumer 0: partials stored", 13: "consumer 3: partials stored",
         14: "producer: first TMA issued"}


def patched_module(path=None, name="_decode_sm90_stamped"):
    reps = [
        ("\n\n@gluon.jit\ndef _unit(", "\n" + STAMP + "\n@gluon.jit\ndef _unit("),
        # producer
        ("    t = 0\n    b, kvh, split, n, c0, c1 = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, C)\n"
         "    p0, p1, p2, p3 = _pages(bt_ptr, b, c0, c1, sub, num_blocks, s_bb, s_bj)\n",
         "    t = 0\n    _stamp(out_ptr, 2, gl.program_id(0))\n"
         "    b, kvh, split, n, c0, c1 = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, C)\n"
         "    _stamp(out_ptr, 3, n)\n"
         "    p0, p1, p2, p3 = _pages(bt_ptr, b, c0, c1, sub, num_blocks, s_bb, s_bj)\n"
         "    _stamp(out_ptr, 4, p0 + p1 + p2 + p3)\n"),
        ("            mbarrier.wait(empty.index(slot), ((t // NB) & 1) ^ 1)      # a fresh barrier counts as phase 1 done\n",
         "            mbarrier.wait(empty.index(slot), ((t // NB) & 1) ^ 1)      # a fresh barrier counts as phase 1 done\n"
         "            if t == 0:\n                _stamp(out_ptr, 5, t)\n"),
        ("            p0, p1, p2, p3 = _pages(bt_ptr, bn, c0n, c1n, sub, num_blocks, s_bb, s_bj)\n"
         "        b, kvh, split, n, c0, c1 = bn, kvhn, splitn, nn, c0n, c1n\n",
         "            p0, p1, p2, p3 = _pages(bt_ptr, bn, c0n, c1n, sub, num_blocks, s_bb, s_bj)\n"
         "        b, kvh, split, n, c0, c1 = bn, kvhn, splitn, nn, c0n, c1n\n    _stamp(out_ptr, 6, t)\n"),
        ("            tma.async_copy_global_to_shared(v_desc, [p3, ((c + 3) % sub) * 16, kvh, 0], bar, v_smem.index(slot * C + 3))\n",
         "            tma.async_copy_global_to_shared(v_desc, [p3, ((c + 3) % sub) * 16, kvh, 0], bar, v_smem.index(slot * C + 3))\n"
         "            if t == 0:\n                _stamp(out_ptr, 14, t)\n"),
        # consumer
        ("    b, kvh, split, n, c0, c1 = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, C)\n"
         "    q = _load_q(q_ptr, b, kvh, G, s_qb, s_qh, GP, D, ld)\n",
         "    if W == 0:\n        _stamp(out_ptr, 7, gl.program_id(0))\n"
         "    b, kvh, split, n, c0, c1 = _unit(gl.program_id(0), splits, Hkv, lens_ptr, cap, C)\n"
         "    if W == 0:\n        _stamp(out_ptr, 8, n)\n"
         "    q = _load_q(q_ptr, b, kvh, G, s_qb, s_qh, GP, D, ld)\n"
         "    if W == 0:\n        _stamp(out_ptr, 9, gl.max(gl.max(q.to(gl.float32), 1), 0).to(gl.int32, bitcast=True))\n"),
        ("            mbarrier.wait(ready.index(slot), (t // NB) & 1)\n",
         "            mbarrier.wait(ready.index(slot), (t // NB) & 1)\n"
         "            if W == 0:\n                if t == 0:\n                    _stamp(out_ptr, 10, t)\n"),
        ("            gl.store(acc_ptr + row[None, :] * D + d[:, None], acc, mask=gmask[None, :])\n",
         "            gl.store(acc_ptr + row[None, :] * D + d[:, None], acc, mask=gmask[None, :])\n"
         "            if W == 0:\n                _stamp(out_ptr, 12, t)\n"
         "            if W == 3:\n                _stamp(out_ptr, 13, t)\n"),
        ("        if ONE:\n            # the whole sequence",
         "        if W == 0:\n            _stamp(out_ptr, 11, t)\n        if ONE:\n            # the whole sequence"),
        # kernel
        ("    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NB * C] + k_desc.block_type.shape, k_desc.layout)\n",
         "    _stamp(out_ptr, 0, gl.program_id(0))\n"
         "    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NB * C] + k_desc.block_type.shape, k_desc.layout)\n"),
        ("    gl.warp_specialize([(_dec_produce, args)",
         "    _stamp(out_ptr, 1, gl.program_id(0))\n    gl.warp_specialize([(_dec_produce, args)"),
    ]
    return load_sm90_patched(reps, name, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16384")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--src", default="", help="NAME=PATH,...: other copies of the kernel's source file to stamp too")
    a = ap.parse_args()
    mods = {"shipped": patched_module()}
    for k, item in enumerate(x for x in a.src.split(",") if x):
        name, path = item.split("=")
        mods[name] = patched_module(path, f"_decode_sm90_stamped{k}")
    for sh in a.shapes.split(","):
        bsz, ctx = (int(x) for x in sh.split("x"))
        q, kc, vc, bt, sl, _ = paged_problem(bsz, ctx)
        for lens_name, lens in (("len0", torch.zeros_like(sl)), ("full", sl)):
            for cond in ("clean", "warm"):
                for mname, S in mods.items():
                    samples = stamp_samples(S, q, kc, vc, bt, lens, a.reps, 64, 16, NAMES, flush=cond == "clean")
                    line = "  ".join(f"{NAMES[k]} {statistics.median(v):.2f}" for k, v in samples.items() if v)
                    print(f"B{bsz} ctx {ctx} {lens_name} [{cond}] {mname}: us after first entry: {line}", flush=True)


if __name__ == "__main__":
    main()
