"""GPU probe for ops/matmul.py: correctness of every variant, then configurations timed against cuBLAS.

    python benchmarks/probe_matmul.py [--out DIR] [--quick] [--ws]

Prints a short table last (best configuration per shape and kernel, ratio to cuBLAS); the full log
of every candidate goes to DIR/probe_matmul.log. Not a benchmark: `warpforge bench matmul` is.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

import warpforge
from warpforge.ops import matmul as mm
from warpforge.runtime.heuristics import MatmulConfig, matmul_candidates

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def correctness():
    torch.manual_seed(0)
    bad = 0
    for dt, m, n, k in [(torch.bfloat16, *s) for s in [(1, 17, 255), (17, 255, 4097), (255, 4097, 17), (4097, 17, 255)]] + [
            (torch.float16, 300, 500, 1000), (torch.float32, 300, 500, 1000)]:
        if True:
            a = torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(n, k, device="cuda", dtype=dt)
            ref = a.double() @ w.double().T
            for v in mm.VARIANTS:
                for name, (x, y) in {"nt": (a, w.T), "nn": (a, w.T.contiguous()),
                                     "tn": (a.T.contiguous().T, w.T)}.items():
                    e = rel(warpforge.matmul(x, y, variant=v), ref)
                    tol = 2e-2 if dt == torch.bfloat16 else (3e-3 if dt == torch.float16 else 1e-5)
                    if not e <= tol:
                        bad += 1
                        log(f"FAIL {dt} {m}x{n}x{k} {v} {name}: rel err {e:.2e}")
    # linear with every epilogue, fwd + bwd against fp64 autograd
    for act in (None, "relu", "silu", "gelu", "gelu_tanh"):
        x = torch.randn(300, 520, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(700, 520, device="cuda", dtype=torch.bfloat16) * 0.05).requires_grad_()
        b = torch.randn(700, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        r = torch.randn(300, 700, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = warpforge.linear(x, w, b, act, r)
        dy = torch.randn_like(y)
        g = torch.autograd.grad(y, (x, w, b, r), dy)
        xd, wd, bd, rd = (t.detach().double().requires_grad_() for t in (x, w, b, r))
        yd = mm._act_reference(xd @ wd.T + bd, act) + rd
        gd = torch.autograd.grad(yd, (xd, wd, bd, rd), dy.double())
        errs = [rel(y, yd)] + [rel(p, q) for p, q in zip(g, gd)]
        if max(errs) > 3e-2:
            bad += 1
        log(f"linear act={act}: errors y,dx,dw,db,dres = {', '.join(f'{e:.1e}' for e in errs)}")
    # split-K determinism
    a = torch.randn(16, 14336, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16)
    c1 = warpforge.matmul(a, w.T, variant="splitk")
    c2 = warpforge.matmul(a, w.T, variant="splitk")
    log("split-K bitwise repeatable:", torch.equal(c1, c2), "err", f"{rel(c1, a.double() @ w.double().T):.1e}")
    bad += not torch.equal(c1, c2)
    log(f"correctness: {bad} failures")
    return bad


SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096)] + [
    (m, n, k) for m in (16, 128, 4096, 16384) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))]


def small_sweep(m, n, k):
    """A broad grid for short M (decode/small prefill), every split that gives 1-8 programs per SM."""
    out = []
    for bn, bk, st, w in itertools.product((32, 64, 128), (64, 128, 256), (3, 5), (4,)):
        if bk * (m if m > 16 else 16) * 2 + bk * bn * 2 > 60000:
            continue
        tiles = -(-m // (16 if m <= 16 else 64 if m <= 64 else 128)) * -(-n // bn)
        for sk in (1, 2, 4, 8):
            if k // (bk * sk) < 2 or not (132 <= tiles * sk <= 1100):
                continue
            out.append(MatmulConfig(16 if m <= 16 else (64 if m <= 64 else 128), bn, bk, group_m=1,
                                    num_stages=st, num_warps=w if m <= 64 else 4, split_k=sk))
    return out


def m128_sweep(m, n, k):
    """M = 128: both M tilings (one 128-row tile, or two 64-row tiles sharing each weight tile via
    L2), warps and splits."""
    out = []
    for bm, bn, bk, st, w in itertools.product((64, 128), (32, 64, 128), (64, 128), (3, 4, 6), (4, 8)):
        if (bm + bn) * bk * 2 * st > 200_000 or (w == 8 and bm * bn < 128 * 64):
            continue
        tiles = -(-m // bm) * -(-n // bn)
        for sk in (1, 2, 3, 4):
            if k // (bk * sk) < 2 or not (100 <= tiles * sk <= 800):
                continue
            out.append(MatmulConfig(bm, bn, bk, group_m=8 if bm == 64 else 1, num_stages=st, num_warps=w, split_k=sk))
    return out


def m128_persistent():
    """M = 128 on the persistent TMA kernel: one 128-row tile a weight tile, narrow N tiles."""
    return [MatmulConfig(128, bn, bk, group_m=1, num_stages=st, num_warps=w, persistent=True)
            for bn, bk, st, w in itertools.product((32, 64, 128), (64, 128), (4, 5, 6), (4, 8))
            if (128 + bn) * bk * 2 * st <= 200_000 and not (w == 8 and bn < 64)]


def large_sweep():
    out = []
    for (bm, bn, bk), st, g, ws in itertools.product(((128, 256, 64), (256, 128, 64)), (3, 4), (4, 8, 16), (False, True)):
        out.append(MatmulConfig(bm, bn, bk, group_m=g, num_stages=st, num_warps=8, warp_specialize=ws))
    return out


def time_shape(m, n, k, dt, kinds, ws, sweep="", layout="nt"):
    a = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt)
    b = w.T
    if layout == "nn":
        b = w.T.contiguous()
    elif layout == "tn":
        a = a.T.contiguous().T
    out = torch.empty(m, n, device="cuda", dtype=dt)
    ep = mm._Epilogue(out)
    t_cublas = do_bench(lambda: torch.matmul(a, b), warmup=10, rep=50, return_mode="median")
    flops = 2 * m * n * k
    res = {}
    for kind in kinds:
        launch = mm._launch_tma if kind == "persistent" else mm._launch_tiled
        cands = matmul_candidates(m, n, k, a.element_size(), kind)
        if sweep == "m128":
            cands = m128_sweep(m, n, k) if kind == "splitk" else m128_persistent()
        elif sweep:
            cands = small_sweep(m, n, k) if kind == "splitk" else large_sweep()
        if kind == "persistent" and ws and not sweep:
            cands = cands + [MatmulConfig(**{**c.as_dict(), "warp_specialize": True}) for c in cands[:3]]
        best = None
        for c in cands:
            try:
                # through a launch plan (the compiled kernel relaunched directly): the JIT's per-call
                # Python would otherwise be timed along with a 20 us kernel
                key = ("probe", m, n, k, layout, str(dt), c)
                t = do_bench(lambda c=c, key=key: launch(a, b, out, ep, c, key), warmup=10, rep=50,
                             return_mode="median")
            except Exception as e:  # noqa: BLE001
                log(f"  {kind} {c}: failed {type(e).__name__}: {str(e)[:120]}")
                continue
            ok = rel(out, torch.matmul(a, b)) < 2e-2
            log(f"  {m}x{n}x{k} {str(dt)[6:]} {kind:10s} {c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} "
                f"s{c.num_stages} w{c.num_warps} sk{c.split_k} ws{int(c.warp_specialize)}: {t * 1e3:8.1f} us "
                f"{flops / t / 1e9:6.0f} TF/s  x{t_cublas / t:.2f} cuBLAS {'ok' if ok else 'WRONG'}")
            if ok and (best is None or t < best[0]):
                best = (t, c)
        res[kind] = best
    return t_cublas, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ws", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--sweep", default="", help="small|large: broad grids instead of the tuner's candidates")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log(torch.cuda.get_device_name(), time.strftime("%Y-%m-%d %H:%M"), "torch", torch.__version__)
    bad = 0 if args.skip_check else correctness()
    rows = []
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    shapes = SHAPES[:4] + SHAPES[6:8] + SHAPES[10:12] if args.quick else SHAPES
    jobs = [((m, n, k), dn, "nt") for (m, n, k), dn in itertools.product(shapes, args.dtypes.split(","))]
    if args.sweep == "small":
        jobs = [((m, n, k), "bf16", "nt") for (m, n, k) in SHAPES if m <= 128]
    elif args.sweep == "m128":
        # the forward's layout in both 16-bit types, and the backward's dX (B row-major)
        jobs = [((128, 4096, 4096), "bf16", "nt"), ((128, 4096, 4096), "fp16", "nt"),
                ((128, 4096, 4096), "bf16", "nn")]
    elif args.sweep == "large":
        jobs = [((4096, 4096, 4096), "bf16", "nt"), ((4096, 14336, 4096), "bf16", "nt"),
                ((4096, 14336, 4096), "bf16", "nn"), ((4096, 14336, 4096), "bf16", "tn")]
    for (m, n, k), dn, layout in jobs:
        kinds = ["splitk"] if m <= 128 else ["persistent", "grouped"]
        if args.sweep:
            kinds = ["splitk"] if m <= 128 else ["persistent"]
            if args.sweep == "m128":
                kinds.append("persistent")
        elif m <= 128 and n >= 14336:
            kinds.append("grouped")
        tc, res = time_shape(m, n, k, dts[dn], kinds, args.ws, args.sweep, layout)
        for kind, best in res.items():
            if best:
                t, c = best
                rows.append((f"{m}x{n}x{k} {layout}", dn, kind, f"{c.block_m}x{c.block_n}x{c.block_k} s{c.num_stages} "
                             f"w{c.num_warps} sk{c.split_k} ws{int(c.warp_specialize)}",
                             f"{tc * 1e3:.1f}", f"{t * 1e3:.1f}", f"{tc / t:.2f}"))
        torch.cuda.empty_cache()
    (out / "probe_matmul.log").write_text("\n".join(LOG))
    print("\nshape | dtype | kernel | best config | cuBLAS us | ours us | x cuBLAS")
    for r in rows:
        print(" | ".join(r))
    print(f"correctness failures: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
