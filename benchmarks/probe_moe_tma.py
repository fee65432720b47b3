"""Device probe for the Hopper MoE path (ops/moe.py, TMA operands; not the benchmark): correctness of
the TMA path against the pointer path and a float32 loop, each kernel timed alone over a few
configurations (do_bench median), then fwd / fwd+bwd of both paths and the torch._grouped_mm
pipeline, T = 8192 random routing.

    python benchmarks/probe_moe_tma.py [--shapes dsv2,mixtral] [--sweep up,down,dgrad,dx,wgrad] [--e2e dsv2,qwen3,...]
"""
import argparse, torch, triton
import warpforge.ops.moe as M
import warpforge.runtime.heuristics as H
from warpforge.runtime.heuristics import MoEConfig, moe_block_m, moe_config

from moe_probe_inputs import SHAPES, make
SWEEP = {   # (block_m, block_n, block_k, warps, stages, programs an SM (0: a program a tile), warp specialise, flatten)
    "up": [(128, 128, 64, 8, 3, 1, True, False, False), (128, 128, 64, 8, 3, 1, False, True, True),
           (128, 128, 64, 8, 3, 1, True, True, True), (128, 128, 64, 8, 3, 1, True, False, True),
           (128, 128, 64, 8, 4, 1, False, True, True), (128, 128, 64, 8, 3, 0, False, False, True),
           (128, 64, 64, 8, 4, 1, False, True, True)],   # 9th: PAIRED (one gate+up accumulator)
    "down": [(128, 256, 64, 8, 3, 1, False, True), (128, 128, 64, 8, 4, 1, False, True), (128, 256, 64, 8, 3, 1, True, True),
             (128, 256, 64, 8, 3, 0, False, False), (128, 128, 64, 8, 4, 0, False, False), (128, 256, 64, 8, 4, 1, False, True)],
    "wgrad": [(128, 128, 64, 8, 4, 0, False, False), (128, 128, 64, 8, 4, 1, False, False), (128, 128, 64, 8, 3, 0, False, False),
              (128, 128, 32, 8, 5, 0, False, False), (128, 256, 64, 8, 3, 0, False, False), (128, 256, 64, 8, 3, 1, False, False),
              (128, 128, 64, 4, 3, 0, False, False)],
}
SWEEP["dx"] = SWEEP["down"]
SWEEP["dgrad"] = SWEEP["down"]
p = argparse.ArgumentParser()
p.add_argument("--shapes", default="dsv2,mixtral")
p.add_argument("--sweep", default="up,down,dgrad,dx,wgrad")
p.add_argument("--e2e", default="dsv2,qwen3,mixtral,olmoe")
p.add_argument("--T", type=int, default=8192)
p.add_argument("--decode", default="", help="T list: the decode sweep (TMA tiles under 128 rows) instead")
a = p.parse_args()
dev, bf16 = "cuda", torch.bfloat16


def rel(x, y):
    return ((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)).item()


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def fwd_bwd(x, w1, w2, wts, ids, dout):
    ts = [t.clone().requires_grad_() for t in (x, w1, w2, wts)]
    out = M.moe_experts(*ts, ids, validate=False)
    out.backward(dout)
    return [out] + [t.grad for t in ts]


DECODE_SWEEP = [(16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (16, 64, 256, 4, 3), (16, 64, 128, 4, 6),
                (16, 128, 64, 4, 6), (16, 32, 128, 4, 4), (16, 128, 128, 8, 4)]
if a.decode:
    import dataclasses
    M._TMA_DECODE_MIN_BLOCK_M, M._TMA_DECODE_MIN_WEIGHTS = 16, 0
    rows = []
    for name in a.e2e.split(","):
        d, n, E, k = SHAPES[name]
        for T in map(int, a.decode.split(",")):
            args = make(T, d, n, E, k, seed=2)
            bm = moe_block_m(T * k, E, 2)
            M._TMA_ON = False
            ref = M.moe_experts(*args, validate=False)
            t_ptr = bench(lambda: M.moe_experts(*args, validate=False))
            M._TMA_ON = True
            res = [f"pointer {t_ptr * 1e3:.1f}"]
            for c in DECODE_SWEEP:
                H.MOE_TMA_DECODE[bm] = MoEConfig(bm, *c[1:])
                try:
                    out = M.moe_experts(*args, validate=False)
                    err = rel(out, ref)
                    ms = bench(lambda: M.moe_experts(*args, validate=False))
                    res.append(f"{c[1]}x{c[2]}w{c[3]}s{c[4]} {ms * 1e3:.1f}" + ("" if err < 1e-2 else f" ERR {err:.1e}"))
                except Exception as exc:
                    res.append(f"{c} failed {exc!r:.150}")
            rows.append((name, T, bm, res))
            print(name, T, bm, *res, flush=True)
            # backward through the TMA path at this tile (first config) against the pointer path
            H.MOE_TMA_DECODE[bm] = MoEConfig(bm, *DECODE_SWEEP[0][1:])
            dout = torch.randn(T, d, device=dev, dtype=bf16)
            new = fwd_bwd(*args, dout)
            M._TMA_ON = False
            old = fwd_bwd(*args, dout)
            M._TMA_ON = True
            print("  bwd check", " ".join(f"{rel(u, v):.1e}" for u, v in zip(new, old)), flush=True)
    print("\n| shape | T | block_m | us: pointer, TMA tiles |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | " + "; ".join(r[3]) + " |")
    raise SystemExit

# 1. correctness: TMA path against the pointer path (T = 8192) and a float32 loop (T = 777)
for name in a.e2e.split(","):
    d, n, E, k = SHAPES[name]
    for T in (777, a.T):
        args = make(T, d, n, E, k, seed=1)
        dout = torch.randn(T, d, device=dev, dtype=bf16)
        M._TMA_ON = True
        assert M.tma_path(args[0], args[1], args[2], moe_block_m(T * k, E, 2)) or T == 777, "TMA path not taken"
        new = fwd_bwd(*args, dout)
        M._TMA_ON = False
        old = fwd_bwd(*args, dout)
        M._TMA_ON = True
        errs = [rel(u, v) for u, v in zip(new, old)]
        line = f"check {name} T={T} tma={M.tma_path(args[0], args[1], args[2], moe_block_m(T * k, E, 2))} vs pointer: " + \
            " ".join(f"{e:.1e}" for e in errs)
        if T == 777:
            rs = [t.detach().float().requires_grad_() for t in args[:4]]
            ref = M.moe_experts_reference(*rs, args[4])
            ref.backward(dout.float())
            errs2 = [rel(new[0], ref)] + [rel(g, r.grad) for g, r in zip(new[1:], rs)]
            line += " | vs fp32: " + " ".join(f"{e:.1e}" for e in errs2)
            errs += errs2
        bad = any(torch.isnan(t).any().item() for t in new) or any(e > 2e-2 for e in errs)
        print(line, "FAIL" if bad else "OK", flush=True)
        del args, new, old

# 2. each kernel alone, TMA configs against the pointer kernel
table = []
default = dict(H.MOE_TMA_CONFIGS)
UNPAIRED_UP = (MoEConfig(128, 128, 64, 8, 3), 1, True, False)   # session 22's first pick (577 / 617 TFLOP/s)
for name in filter(None, a.shapes.split(",")):
    d, n, E, k = SHAPES[name]
    T = a.T
    x, w1, w2, wts, ids = make(T, d, n, E, k)
    bm = moe_block_m(T * k, E, 2)
    ss, sp, te, st, cnt = M._align(ids.view(-1), E, bm)
    P = ss.numel()
    meta2, meta3 = (ss, te), (ss, te, st)
    rows_used = int(st[-1].item())
    fl = 2 * T * k * d * n
    xg = M._gather_rows(x, ss, te, k, bm)
    h = torch.randn(P, n, device=dev, dtype=bf16); z = torch.empty(P, 2 * n, device=dev, dtype=bf16)
    y = torch.empty(P, d, device=dev, dtype=bf16)
    dz = torch.randn(P, 2 * n, device=dev, dtype=bf16) * 0.1
    hw = torch.randn(P, n, device=dev, dtype=bf16) * 0.1
    for t in (h, dz, hw):
        t[rows_used:] = 0
    dw1 = torch.empty_like(w1); dw2 = torch.empty_like(w2)
    ms = bench(lambda: M._gather_rows(x, ss, te, k, bm))
    table.append((name, "gather", "-", ms, rows_used * d * 2 * 2 / ms / 1e9, "GB/s"))
    print(*table[-1], flush=True)
    s = 2
    olds = {
        "up": (lambda: M._gemm(x, M._b_fwd_up(w1), h, meta=meta2, K=d, N=n, cfg=moe_config("up", bm, s), topk=k,
                               gather_a=True, epi=1, z=z, store_z=True), 2 * fl),
        "down": (lambda: M._gemm(h, M._b_fwd_down(w2), y, meta=meta2, K=n, N=d, cfg=moe_config("down", bm, s), topk=k,
                                 gather_a=False, epi=0, weights=wts.view(-1), scale_rows=True), fl),
        "dgrad": (lambda: M._gemm(x, M._b_bwd_down(w2), h, meta=meta2, K=d, N=n, cfg=moe_config("dgrad", bm, s),
                                  topk=k, gather_a=True, epi=0), fl),
        "dx": (lambda: M._gemm(dz, M._b_bwd_up(w1), y, meta=meta2, K=2 * n, N=d, cfg=moe_config("down", bm, s),
                               topk=k, gather_a=False, epi=0), 2 * fl),
        "wgrad": (lambda: (M._wgrad(x, hw, dw2, sorted_slot=ss, start=st, M=d, N=n, topk=k, gather_a=True,
                                    gather_b=False, cfg=moe_config("wgrad", bm, s)),
                           M._wgrad(dz, x, dw1, sorted_slot=ss, start=st, M=2 * n, N=d, topk=k, gather_a=False,
                                    gather_b=True, cfg=moe_config("wgrad", bm, s))), 3 * fl),
    }
    news = {
        "up": lambda: M._gemm_tma(xg, w1, h, meta=meta3, K=d, N=n, kind="up", b_t=True, epi=1, z=z),
        "down": lambda: M._gemm_tma(h, w2, y, meta=meta3, K=n, N=d, kind="down", b_t=True, weights=wts.view(-1)),
        "dgrad": lambda: M._gemm_tma(xg, w2, h, meta=meta3, K=d, N=n, kind="dgrad", b_t=False),
        "dx": lambda: M._gemm_tma(dz, w1, y, meta=meta3, K=2 * n, N=d, kind="dx", b_t=False),
        "wgrad": lambda: (M._wgrad_tma(xg, hw, dw2, start=st, M=d, N=n), M._wgrad_tma(dz, xg, dw1, start=st, M=2 * n, N=d)),
    }
    for kind in filter(None, a.sweep.split(",")):
        fn, f = olds[kind]
        ms = bench(fn)
        table.append((name, kind, "pointer", ms, f / ms / 1e9, "TFLOP/s"))
        print(*table[-1], flush=True)
        ref_out = None
        for c in SWEEP[kind]:
            H.MOE_TMA_CONFIGS[kind] = (MoEConfig(*c[:5]), c[5], c[6], c[7])
            M._PAIRED_UP = c[8] if len(c) > 8 else True
            try:
                news[kind]()
                torch.cuda.synchronize()
                ms = bench(news[kind])
                table.append((name, kind, "tma " + "x".join(map(str, c[:3])) + f" w{c[3]} s{c[4]} p{c[5]}" + (" ws" if c[6] else "") + (" flat" if c[7] else "")
                              + (" paired" if len(c) > 8 and c[8] else ""),
                              ms, f / ms / 1e9, "TFLOP/s"))
            except Exception as exc:
                table.append((name, kind, f"tma {c} failed {exc!r:.200}", 0, 0, ""))
            print(*table[-1], flush=True)
        H.MOE_TMA_CONFIGS[kind] = default[kind]
        M._PAIRED_UP = True
    del x, w1, w2, xg, h, z, y, dz, hw, dw1, dw2

# 3. end to end
e2e = []
for name in a.e2e.split(","):
    d, n, E, k = SHAPES[name]
    T = a.T
    args = make(T, d, n, E, k)
    fl = 6 * T * k * d * n
    dout = torch.randn(T, d, device=dev, dtype=bf16)
    ts = [t.clone().requires_grad_() if i < 4 else t for i, t in enumerate(args)]
    for label, on in (("pointer", False), ("tma unpaired", True), ("tma", True)):
        M._TMA_ON = on
        M._PAIRED_UP = label == "tma"
        H.MOE_TMA_CONFIGS["up"] = UNPAIRED_UP if label == "tma unpaired" else default["up"]
        f = bench(lambda: M.moe_experts(*args, validate=False))

        def step():
            for t in ts[:4]:
                t.grad = None
            M.moe_experts(*ts, validate=False).backward(dout)
        fb = bench(step)
        e2e.append((name, label, f, fl / f / 1e9, fb, 3 * fl / fb / 1e9))
        print(*e2e[-1], flush=True)
    M._TMA_ON, M._PAIRED_UP = True, True
    H.MOE_TMA_CONFIGS["up"] = default["up"]
    del args, ts

print("\n| shape | kernel | variant | ms | rate |")
for r in table:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.0f} {r[5]} |")
print("\n| shape | path | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |")
for r in e2e:
    print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.0f} | {r[4]:.3f} | {r[5]:.0f} |")
