"""Device probe for Mixtral-sized MoE decode (not the benchmark: `warpforge bench moe_decode` is):
where a T = 256 step's time goes. Each Hopper kernel (gather, gate/up, down, combine) timed alone
under forced row tiles and launch configs, against the read ceiling of the same weights (a
read-only Triton kernel summing w_gate_up, then w_down, best of a small grid/load/pipeline sweep).

Question (benchmarks/NOTES.md, item 97): the 32-row tiles of T = 64 stream the weights at ~97% of
copy, every 64/128-row tile tried at T = 256 at ~84%. Is that the tensor-core work of the taller
tiles, or the bytes in flight an SM (the T = 64 config keeps ~3 x 72 KB of weight boxes in flight,
the T = 256 ones 32-64 KB)?

    python benchmarks/probe_moe_decode_split.py [--T 64,256] [--read]
"""
import argparse
import itertools

import torch
import triton
import triton.language as tl

import warpforge.ops.moe as M
from warpforge.bench import timing
from warpforge.runtime import device as devinfo
from warpforge.runtime.heuristics import MoEConfig

from moe_probe_inputs import SHAPES, make

p = argparse.ArgumentParser()
p.add_argument("--T", default="64,256")
p.add_argument("--read", action="store_true", help="also the weights' read ceiling")
p.add_argument("--sweep", default="", help="extra variants: " + "/".join(["2"]))
a = p.parse_args()
cfg_t = timing.TimingConfig.quick()
copy = devinfo.ceilings()["copy_gbps"]
sms = devinfo.sm_count(0)


@triton.jit
def _read_kernel(ptr, out_ptr, n, per_prog, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    start = pid.to(tl.int64) * per_prog
    stop = tl.minimum(start + per_prog, n)
    for i in tl.range(start, stop, BLOCK, num_stages=STAGES):
        acc += tl.load(ptr + i + offs, mask=i + offs < stop, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def read_ceiling(t):
    flat = t.view(-1)
    n = flat.numel()
    best = None
    for progs, block, stages, warps in itertools.product((sms, 2 * sms, 4 * sms), (4096, 8192), (3, 4), (8,)):
        per = triton.cdiv(triton.cdiv(n, progs), block) * block
        grid = triton.cdiv(n, per)
        out = torch.empty(grid, device=t.device, dtype=torch.float32)
        fn = lambda: _read_kernel[(grid,)](flat, out, n, per, BLOCK=block, STAGES=stages, num_warps=warps)  # noqa: E731
        ms = timing.device_ms(fn, cfg_t, n * t.element_size())
        if best is None or ms < best[0]:
            best = (ms, f"{progs}p {block}x{stages}st {warps}w")
    return best


REAL_TMA_CONFIG = M.moe_tma_config


def force(kind_cfgs):
    """moe_tma_config replaced: {kind: (MoEConfig, programs an SM, ws, flatten)} for the forced
    kinds, the shipped table otherwise."""
    M.moe_tma_config = lambda kind, block_m=128: kind_cfgs.get(kind) or REAL_TMA_CONFIG(kind, block_m)


def dec(bm, bn, bk, w, st, pps=0, ws=False, fl=False):
    return (MoEConfig(bm, bn, bk, w, st), pps, ws, fl)


# (label, block_m, up, down): None = what the shipped table gives at that block_m
VARIANTS = [
    ("shipped", None, None, None),
    ("bm32 shipped", 32, None, None),
    ("bm64 shipped", 64, None, None),
    ("bm128 shipped", 128, None, None),
]
SWEEPS = {   # --sweep 2: does the K step / box size matter more than the rows of tensor-core work?
    "2": [
        ("bm32 n128 k64 st4", 32, dec(32, 128, 64, 4, 4), dec(32, 128, 64, 4, 4)),
        ("bm32 n64 k128 st4", 32, dec(32, 64, 128, 4, 4), dec(32, 64, 128, 4, 4)),
        ("bm64 n64 k128 st4", 64, dec(64, 64, 128, 4, 4), dec(64, 128, 128, 4, 4)),
        ("bm64 n64 k128 st3", 64, dec(64, 64, 128, 4, 3), dec(64, 128, 128, 4, 3)),
        ("bm64 n128 k128 st2", 64, dec(64, 128, 128, 4, 2), dec(64, 128, 128, 4, 2)),
        ("bm64 n64 k256 st2", 64, dec(64, 64, 256, 4, 2), dec(64, 64, 256, 4, 3)),
        ("bm128 n128 k128 st2 pp0", 128, dec(128, 128, 128, 8, 2), dec(128, 128, 128, 8, 3)),
        ("bm128 n64 k128 st3 pp0", 128, dec(128, 64, 128, 8, 3), dec(128, 256, 64, 8, 4)),
    ],
}

VARIANTS += SWEEPS.get(a.sweep, [])
rows = []
d, n, E, k = SHAPES["mixtral"]
x, w1, w2, wts, ids = make(max(map(int, a.T.split(","))), d, n, E, k)
up_bytes, down_bytes = E * 2 * n * d * 2, E * d * n * 2
if a.read:
    for name, t in (("w_gate_up", w1), ("w_down", w2)):
        ms, lab = read_ceiling(t)
        line = f"read {name}: {ms * 1e3:.1f} us {t.numel() * 2 / ms / 1e6 / copy * 100:.1f}% of copy ({lab})"
        rows.append(line)
        print(line, flush=True)
real_bm = M.moe_block_m
for T in map(int, a.T.split(",")):
    xs, ws_, ids_ = x[:T], wts[:T].contiguous(), ids[:T].contiguous()
    M._TMA_ON = False
    ref = M.moe_experts(xs, w1, w2, ws_, ids_, validate=False).float()
    M._TMA_ON = True
    M._TMA_DECODE_MIN_BLOCK_M, M._TMA_DECODE_MIN_WEIGHTS = 16, 0
    counts = torch.bincount(ids_.view(-1).long(), minlength=E).tolist()
    print(f"T={T} rows an expert: {counts}", flush=True)
    for label, bm, up, down in VARIANTS:
        bm_eff = real_bm(T * k, E, 2) if bm is None else bm
        force({kk: v for kk, v in (("up", up), ("down", down)) if v is not None})
        M.moe_block_m = lambda *_a, _b=bm_eff: _b
        try:
            out = M.moe_experts(xs, w1, w2, ws_, ids_, validate=False).float()
            err = ((out - ref).norm() / ref.norm()).item()
            ss, sp, te, st, _c = M._align(ids_.view(-1), E, bm_eff)
            meta = (ss, te, st)
            P = ss.numel()
            xg = M._gather_rows(xs, ss, te, k, bm_eff)
            h = torch.empty((P, n), device="cuda", dtype=x.dtype)
            y = torch.empty((P, d), device="cuda", dtype=x.dtype)
            fns = {
                "gather": (lambda: M._gather_rows(xs, ss, te, k, bm_eff), 0),
                "up": (lambda: M._gemm_tma(xg, w1, h, meta=meta, K=d, N=n, kind="up", b_t=True, epi=1), up_bytes),
                "down": (lambda: M._gemm_tma(h, w2, y, meta=meta, K=n, N=d, kind="down", b_t=True,
                                             weights=ws_.view(-1)), down_bytes),
                "combine": (lambda: M._combine(y, sp, T, k, d, x.dtype), 0),
                "call": (lambda: M.moe_experts(xs, w1, w2, ws_, ids_, validate=False), up_bytes + down_bytes),
            }
            res = {kk: timing.device_ms(f, cfg_t, nb or None) * 1e3 for kk, (f, nb) in fns.items()}
            line = (f"T={T} {label} (bm {bm_eff}): call {res['call']:.1f} us "
                    f"({(up_bytes + down_bytes) / res['call'] / 1e3 / copy * 100:.1f}% copy) = "
                    f"up {res['up']:.1f} ({up_bytes / res['up'] / 1e3 / copy * 100:.1f}%) + "
                    f"down {res['down']:.1f} ({down_bytes / res['down'] / 1e3 / copy * 100:.1f}%) + "
                    f"gather {res['gather']:.1f} + combine {res['combine']:.1f}; err {err:.1e}")
        except Exception as exc:  # noqa: BLE001
            line = f"T={T} {label} (bm {bm_eff}): failed {repr(exc)[:300]}"
        rows.append(line)
        print(line, flush=True)
    force({})
    M.moe_block_m = real_bm
print("\n== summary ==")
print("\n".join(rows))
