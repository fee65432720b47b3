"""Are the Gluon decode kernel's consumer warps what holds it under the read ceiling? (issue 6; a
probe, not the benchmark.)

The unit kernel (ops/decode_attention_sm90.py) reads 3-7% under the paged read ceiling at batch
>= 16 (NOTES item 62) while cuDNN sits within 0-2% of it; the merge (item 79), the block-id reads
and the slot release (item 64) are ruled out. Never timed: the four consumer warps' own work. Each
warp must finish its 16-token slice (S = Q K^T over D = 128 as 16 dependent mma.sync, the online
softmax, P V) within one slot period, ~0.9 us at an SM's share of 4.5 TB/s; if it does not, the
ring drains at the consumers' pace. This probe times the kernel alone (no combine), under the
bench's timer, as it is and patched (timing only: the patched outputs are wrong and not checked):

- ``no math``: a consumer waits for its slot and releases it at once (no shared-memory reads, no
  MMA, no softmax): the producer's TMA stream alone, the kernel's data-path ceiling;
- ``no softmax``: both MMAs, P = S cast to bf16 with no max, exp or rescale;
- ``early release``: K and V both to registers and the slot released before S = Q K^T (the
  shipped kernel releases after S; item 64 found this order spilling 240 bytes at 232 registers,
  48 at 248: never timed), at the default registers and at 248 (``r248``; ``base r248`` beside it);
- ``two S chains`` (``--chains``): S = Q K^T as two MMAs over the halves of D, summed (two
  dependent chains of 4 k-steps instead of one of 8; NOTES item 119's lead);
- ``no math +q+ids``, ``+q``, ``+ids`` (``--loads``; NOTES item 123): "no math" with the consumers'
  own loads kept live, the unit's query rows (one row max a unit) and each slot's block id (one add
  a slot), which the plain variant drops as dead code;
- ``read ceiling``: probe_page_read's Triton kernel summing the same pages (best of four launch
  shapes), and sdpa[cudnn] on the same problem unpaged.

Prediction: if ``no math`` reads >= ~103% of copy (probe_page_read's ceiling) where the base reads
~97-100%, the consumers are the limit and more consumer warps (two groups taking alternate slots)
is the next build; if ``no math`` is no faster, the data path is, and consumer work is not worth
touching.

    python benchmarks/probe_decode_consumers.py [--shapes 16x8192,64x4096,32x16384,1x16384]
        [--chains | --loads | --staged | --old PATH]
"""
from __future__ import annotations

import argparse

import torch

from decode_probe_inputs import (cudnn_decode, load_sm90_copy, load_sm90_patched, paged_problem, print_table, shapes,
                                 timing_setup)
from probe_page_read import read_pages
from warpforge.bench.timing import device_ms
from warpforge.ops import decode_attention_sm90 as G
from warpforge.runtime.device import sm_count

READS = [(1, 8192, 3, 8), (2, 8192, 3, 8), (4, 8192, 3, 8), (2, 8192, 4, 8)]   # (programs an SM, block, stages, warps)

WORK_START = "            kt = k_smem.index(slot * C + W)"
WORK_END = "                m_i = m_new\n"
NO_MATH = "            mbarrier.arrive(empty.index(slot))\n"
SOFTMAX_START = "            if c < c1:\n"
EARLY_FROM = """            s = mma_v2(qa, kt, gl.zeros([16, 16], gl.float32, mma))       # (16 heads, 16 tokens)
            vt = v_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat).load(b_l)
            mbarrier.arrive(empty.index(slot))
"""
EARLY_TO = """            vt = v_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat).load(b_l)
            mbarrier.arrive(empty.index(slot))
            s = mma_v2(qa, kt, gl.zeros([16, 16], gl.float32, mma))       # (16 heads, 16 tokens)
"""
# two S = Q K^T chains over the halves of D (4 dependent k-steps each instead of 8), q loaded as halves
CHAIN_EDITS = [
    ("""@gluon.jit
def _dec_consume(""", """@gluon.jit
def _load_q_half(q_ptr, b, kvh, G, s_qb, s_qh, DH: gl.constexpr, OFF: gl.constexpr, layout: gl.constexpr):
    g = gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, DH, layout=gl.SliceLayout(0, layout)) + OFF
    rows = (kvh * G + g).to(gl.int64)
    return gl.load(q_ptr + b.to(gl.int64) * s_qb + rows[:, None] * s_qh + d[None, :], mask=(g < G)[:, None], other=0.0)


@gluon.jit
def _dec_consume("""),
    ("""    q = _load_q(q_ptr, b, kvh, G, s_qb, s_qh, D, ld)
""", """    q = _load_q_half(q_ptr, b, kvh, G, s_qb, s_qh, D // 2, 0, ld)
    q2 = _load_q_half(q_ptr, b, kvh, G, s_qb, s_qh, D // 2, D // 2, ld)
"""),
    ("""        qn = _load_q(q_ptr, bn, kvhn, G, s_qb, s_qh, D, ld)
        qa = gl.convert_layout(q, a_l)
""", """        qn = _load_q_half(q_ptr, bn, kvhn, G, s_qb, s_qh, D // 2, 0, ld)
        qn2 = _load_q_half(q_ptr, bn, kvhn, G, s_qb, s_qh, D // 2, D // 2, ld)
        qa = gl.convert_layout(q, a_l)
        qa2 = gl.convert_layout(q2, a_l)
"""),
    ("""            kt = k_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat).permute((1, 0)).load(b_l)
            s = mma_v2(qa, kt, gl.zeros([16, 16], gl.float32, mma))       # (16 heads, 16 tokens)
""", """            kfull = k_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat)
            kt = kfull.slice(0, D // 2, dim=1).permute((1, 0)).load(b_l)
            kt2 = kfull.slice(D // 2, D // 2, dim=1).permute((1, 0)).load(b_l)
            s = (mma_v2(qa, kt, gl.zeros([16, 16], gl.float32, mma))
                 + mma_v2(qa2, kt2, gl.zeros([16, 16], gl.float32, mma)))
"""),
    ("""        b, kvh, split, n, c0, c1, q = bn, kvhn, splitn, nn, c0n, c1n, qn
""", """        b, kvh, split, n, c0, c1, q, q2 = bn, kvhn, splitn, nn, c0n, c1n, qn, qn2
"""),
]
NO_SOFTMAX = """            if c < c1:
                acc = mma_v2(gl.convert_layout(s.to(dtype), a_l), vt, acc)
"""
# ``--loads``: "no math" with the consumers' own loads kept live (the plain variant drops them as dead
# code): the unit's query rows (through one row max a unit) and each slot's block id (one add a slot)
Q_LIVE = ("        qa = gl.convert_layout(q, a_l)\n",
          "        qa = gl.convert_layout(q, a_l)\n"
          "        q_live = gl.max(gl.convert_layout(q, mma).to(gl.float32), 1)\n")
KEEP = {"no math +q+ids": "q_live + page.to(gl.float32)", "no math +q": "q_live",
        "no math +ids": "page.to(gl.float32)"}


def no_math_source(src: str, keep: str | None = None) -> str:
    """``src`` with the consumers' work (WORK_START .. WORK_END) replaced by NO_MATH; with ``keep``
    (a KEEP expression), that value kept live through the running max (and q's, where it names it)."""
    i, j = src.index(WORK_START), src.index(WORK_END) + len(WORK_END)
    live = f"            if c < c1:\n                m_i = gl.maximum(m_i, {keep})\n"
    body = NO_MATH if keep is None else NO_MATH + live
    text = src[:i] + body + src[j:]
    return text.replace(*Q_LIVE) if keep is not None and "q_live" in keep else text

# ``--staged``: the producer writes each slot's C block ids to shared memory with the slot (it reads
# them anyway), and a consumer takes its slice's id from there after the slot's wait, in place of
# its own global read a slot ahead (NOTES item 125: kept live in "no math", those reads cost
# ~2 us at batch 1)
STAGE_ARGS = ("sc, scm, scl, done, free,", "sc, scm, scl, done, free, pid,")
ONE_WARP = "gl.BlockedLayout([1], [32], [1], [0])"
STAGED_EDITS = [
    ("""@gluon.jit
def _dec_produce(""", """@gluon.jit
def _ids4(p0, p1, p2, p3):
    i = gl.arange(0, 4, layout=gl.BlockedLayout([1], [32], [4], [0]))
    return gl.where(i == 0, p0, gl.where(i == 1, p1, gl.where(i == 2, p2, p3)))


@gluon.jit
def _dec_produce("""),
    ("""            bar = ready.index(slot)
            mbarrier.expect(bar, 2 * C * k_desc.block_type.nbytes)
""", """            pid.index(slot).store(_ids4(p0, p1, p2, p3))
            gl.thread_barrier()
            bar = ready.index(slot)
            mbarrier.expect(bar, 2 * C * k_desc.block_type.nbytes)
"""),
    ("""    page_nx = _page_of(bt_ptr, b, c0 + W, c1, sub, num_blocks, s_bb, s_bj)
""", ""),
    ("""            page = page_nx
            last = j + 1 == n_slots
            page_nx = _page_of(bt_ptr, gl.where(last, bn, b), gl.where(last, c0n + W, c + C),
                               gl.where(last, c1n, c1), sub, num_blocks, s_bb, s_bj)
            slot = t % NB
            mbarrier.wait(ready.index(slot), (t // NB) & 1)
""", f"""            slot = t % NB
            mbarrier.wait(ready.index(slot), (t // NB) & 1)
            ids = pid.index(slot).load({ONE_WARP})
            page = gl.sum(gl.where(gl.arange(0, C, layout={ONE_WARP}) == W, ids, 0), 0)
"""),
    ("""        if n_slots == 0:                                                # an empty unit: the next one's id now
            page_nx = _page_of(bt_ptr, bn, c0n + W, c1n, sub, num_blocks, s_bb, s_bj)
""", ""),
    ("""    free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
""", """    free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pid = gl.allocate_shared_memory(gl.int32, [NB, C], plain1)
"""),
]


def staged_source(src: str) -> str:
    """The kernel's source with the block ids staged in shared memory (STAGED_EDITS)."""
    assert src.count(STAGE_ARGS[0]) == 11
    src = src.replace(*STAGE_ARGS)
    for old, new in STAGED_EDITS:
        assert src.count(old) == 1, old[:80]
        src = src.replace(old, new)
    return src


def variants(chains: bool, old: str | None, loads: bool = False, staged: bool = False, rings=(), regs=()):
    """({name: (module, decode_sm90's overrides)}, the reference's name, the candidates checked
    against it). With ``old``: the shipped kernel, the old copy, and the shipped kernel at each
    ring depth of ``rings`` and register count of ``regs``."""
    if old:
        more = {**{f"shipped nb{n}": (G, {"nb": n}) for n in rings},
                **{f"shipped r{r}": (G, {"regs": r}) for r in regs}}
        return {"shipped": (G, {}), "old": (load_sm90_copy(open(old).read(), "_dec_old"), {}), **more}, \
            "shipped", ("old", *more)
    src = open(G.__file__).read()
    assert src.count(WORK_START) == 1 and src.count(WORK_END) == 1 and src.count(SOFTMAX_START) == 1
    no_math = load_sm90_copy(no_math_source(src), "_dec_nomath")
    if staged:
        st, ids = staged_source(src), KEEP["no math +ids"]
        return {"base": (G, {}), "ids staged": (load_sm90_copy(st, "_dec_staged"), {}),
                "no math": (no_math, {}),
                "no math +ids": (load_sm90_copy(no_math_source(src, ids), "_dec_nomath_ids"), {}),
                "no math +ids smem": (load_sm90_copy(no_math_source(st, ids), "_dec_nomath_ids_smem"), {})}, \
            "base", ("ids staged",)
    if loads:
        assert src.count(Q_LIVE[0]) == 1
        kept = {name: (load_sm90_copy(no_math_source(src, expr), f"_dec_nomath_keep{k}"), {})
                for k, (name, expr) in enumerate(KEEP.items())}
        return {"base": (G, {}), "no math": (no_math, {}), **kept}, "base", ()
    if chains:
        return {"base": (G, {}), "two S chains": (load_sm90_patched(CHAIN_EDITS, "_dec_chains"), {}),
                "no math": (no_math, {})}, "base", ("two S chains",)
    k, j = src.index(SOFTMAX_START), src.index(WORK_END) + len(WORK_END)
    no_softmax = load_sm90_copy(src[:k] + NO_SOFTMAX + src[j:], "_dec_nosoftmax")
    early = load_sm90_patched([(EARLY_FROM, EARLY_TO)], "_dec_early")
    return {"base": (G, {}), "no math": (no_math, {}), "no softmax": (no_softmax, {}),
            "base r248": (G, {"regs": 248}), "early release": (early, {}), "early r248": (early, {"regs": 248})}, \
        "base", ("early release", "early r248")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16x8192,64x4096,32x16384,1x16384")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chains", action="store_true", help="base, two S chains and no math only")
    ap.add_argument("--old", metavar="PATH", help="the shipped kernel against an earlier copy of its source file")
    ap.add_argument("--loads", action="store_true",
                    help="base, no math, and no math with the consumers' q and block-id loads kept live")
    ap.add_argument("--staged", action="store_true",
                    help="base against the block ids staged in shared memory by the producer; no math with the "
                         "consumers' id reads kept live, from global memory and from shared memory")
    ap.add_argument("--ring", default="",
                    help="with --old: ring depths (slots) to time the shipped kernel at, e.g. 4,5")
    ap.add_argument("--regs", default="", help="with --old: consumer registers a thread to time the shipped kernel at")
    a = ap.parse_args()
    cfg, copy, scale2 = timing_setup()
    ints = lambda v: tuple(int(x) for x in v.split(",") if x)                  # noqa: E731
    mods, base, cands = variants(a.chains, a.old, a.loads, a.staged, ints(a.ring), ints(a.regs))
    res, nbytes = {}, {}
    for sh, bsz, ctx in shapes(a.shapes):
        q, kc, vc, bt, sl, kvb = paged_problem(bsz, ctx)
        nbytes[sh] = kvb
        _, res[(sh, "sdpa[cudnn]")] = cudnn_decode(q, kc, vc, bt, ctx, lambda fn: [device_ms(fn, cfg, kvb) * 1e3])
        flat = bt.reshape(-1)
        read = min(device_ms(lambda: read_pages(kc, vc, flat, m * sm_count(), blk, st, w), cfg, kvb)
                   for m, blk, st, w in READS)
        res[(sh, "read ceiling")] = [read * 1e3]
        o = torch.empty_like(q)
        outs = {}
        for name in (base,) + cands:                                    # the candidates: same bits as base?
            mod, kw = mods[name]
            try:
                got = mod.decode_sm90(q, kc, vc, bt, sl, o, scale2, **kw)
            except Exception as e:  # noqa: BLE001 -- reported; the timing loop drops it
                print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            outs[name] = [t.clone() for t in (got if got is not None else (o,))]
        for name in (n for n in cands if n in outs):
            ref = outs[base]
            same = all(torch.equal(x, y) for x, y in zip(outs[name], ref))
            diff = max(((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30)).item()
                       for x, y in zip(outs[name], ref))
            print(f"{sh} {name}: equal to base {same}, max difference / max |base| {diff:.2e}", flush=True)
        for r in range(a.rounds):
            for name in (list(mods) if r % 2 == 0 else list(mods)[::-1]):
                try:
                    mod, kw = mods[name]
                    t = device_ms(lambda: mod.decode_sm90(q, kc, vc, bt, sl, o, scale2, **kw), cfg, kvb)
                except Exception as e:  # noqa: BLE001 -- a patched variant that does not compile: say so, go on
                    print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    del mods[name]
                    continue
                res.setdefault((sh, name), []).append(t * 1e3)
        del q, kc, vc, bt
        torch.cuda.empty_cache()
    print_table(res, nbytes, copy, 16)


if __name__ == "__main__":
    main()
