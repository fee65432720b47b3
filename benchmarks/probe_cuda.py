"""Device probe for the CUDA C++ backend (not the benchmark: `warpforge bench` is). Builds the
extension (timed), smoke-checks every operator against torch, sweeps the softmax launch shapes
(threads, vectors per thread, cluster) at the bar's row lengths, and times add / sum / amax and the
matmul ladder, so runtime/heuristics.py can be tuned from one device call.

    python benchmarks/probe_cuda.py [--skip-sweep] [--skip-matmul]
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import time

import torch
import triton.testing

import warpforge as wf
from warpforge import cuda
from warpforge.runtime import heuristics as H


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def copy_gbps() -> float:
    x = torch.empty(2**28, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / ms / 1e6


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def smoke(log):
    ops = cuda.ops()
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for (m, n) in ((3, 7), (5, 1000), (4, 4097), (2, 32768), (2, 262144 + 3)):
            x = torch.randn(m, n, device="cuda", dtype=dt)
            y = wf.softmax(x, backend="cuda")
            e = rel(y, torch.softmax(x.double(), -1))
            dy = torch.randn_like(x)
            xr = x.double().requires_grad_()
            torch.softmax(xr, -1).backward(dy.double())
            xg = x.clone().requires_grad_()
            wf.softmax(xg, backend="cuda").backward(dy)
            eb = rel(xg.grad, xr.grad)
            s = rel(wf.sum(x, backend="cuda"), x.double().sum(-1))
            mx = rel(wf.amax(x, backend="cuda"), x.double().amax(-1))
            log(f"smoke {str(dt)[6:]:9s} {m}x{n}: softmax fwd {e:.1e} bwd {eb:.1e} sum {s:.1e} amax {mx:.1e}")
        a = torch.randn(2**20 + 3, device="cuda", dtype=dt)
        for v in ("naive", "vectorized"):
            log(f"smoke add {v} {str(dt)[6:]}: {rel(wf.add(a, a, alpha=0.5, variant=v, backend='cuda'), a.double() * 1.5):.1e}")
        for (m, n, k) in ((17, 33, 45), (256, 512, 1024)):
            A = torch.randn(m, k, device="cuda", dtype=dt)
            B = torch.randn(k, n, device="cuda", dtype=dt)
            ref = A.double() @ B.double()
            for v in ("naive", "tiled", "regblock", "mma"):
                if v == "mma" and dt == torch.float32:
                    continue
                try:
                    log(f"smoke matmul {v:8s} {str(dt)[6:]:9s} {m}x{n}x{k}: {rel(ops.matmul(A, B, v), ref):.1e}")
                except Exception as ex:  # noqa: BLE001
                    log(f"smoke matmul {v} {dt} {m}x{n}x{k}: FAILED {type(ex).__name__}: {str(ex)[:200]}")
    torch.cuda.synchronize()


def sweep(log, roof, table, shapes=()):
    ops = cuda.ops()
    dt = torch.bfloat16
    shapes = shapes or [(16384, 4096), (16384, 8192), (16384, 32768), (2048, 65536), (512, 262144)]
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=dt)
        dy = torch.randn_like(x)
        nbytes = 2 * x.numel() * 2
        tri = bench(lambda: wf.softmax(x))
        comp = torch.compile(lambda t: torch.softmax(t, -1))
        cms = bench(lambda: comp(x))
        nv = n // 8
        cands = set()
        for threads in (128, 256, 512, 1024):
            for vpt in (1, 2, 4):
                for cl in (1, 2, 4, 8, 16):
                    if threads * vpt * cl >= nv and threads * vpt * cl < 2 * nv + threads * vpt and threads >= 32:
                        cands.add((threads, vpt, cl, 1))
        if nv <= 128:
            cands |= {(32, v, 1, r) for v in (1, 2, 4) for r in (4, 8) if 32 * v >= nv}
        cands.add((1024, 0, 1, 1))
        heur = tuple(H.cuda_softmax_config(n, 2))
        cands.add(heur)
        res = []
        ref = torch.softmax(x.float(), -1)
        for c in sorted(cands):
            print(f"    fwd {c} ...", flush=True)
            try:
                y = ops.softmax(x, False, list(c))
                err = rel(y, ref)
                ms = bench(lambda: ops.softmax(x, False, list(c)))
                res.append((ms, c, err))
            except Exception as ex:  # noqa: BLE001
                log(f"  {m}x{n} {c}: {type(ex).__name__}: {str(ex)[:120]}")
        res.sort()
        for ms, c, err in res[:6]:
            log(f"  {m}x{n} fwd {c}: {ms*1e3:8.1f} us {nbytes/ms/1e6/roof*100:5.1f}% err {err:.1e}{'  <- heuristic' if c == heur else ''}")
        hms = next(ms for ms, c, _ in res if c == heur)
        # backward with the heuristic and the best few shapes
        y = ops.softmax(x, False, list(heur))
        hb = tuple(H.cuda_softmax_config(n, 2, backward=True))
        bres = []
        for c in sorted({hb} | {c for _, c, _ in res[:8]}):
            if c[1] == 4 and c[0] > 512 and c[3] == 1:
                continue   # the 16-bit backward at 4 vectors per thread takes at most 512 threads
            print(f"    bwd {c} ...", flush=True)
            try:
                ms = bench(lambda: ops.softmax_backward(y, dy, False, list(c)))
                bres.append((ms, c))
            except Exception:  # noqa: BLE001
                pass
        bres.sort()
        tb = bench(lambda: torch.ops.warpforge.softmax_backward(y, dy, False))
        for ms, c in bres[:3]:
            log(f"  {m}x{n} bwd {c}: {ms*1e3:8.1f} us {1.5*nbytes/ms/1e6/roof*100:5.1f}%{'  <- heuristic' if c == hb else ''}")
        hbms = next((ms for ms, c in bres if c == hb), float("nan"))
        table.append(dict(shape=f"{m}x{n}", cuda_fwd_pct=nbytes / hms / 1e6 / roof * 100,
                          best_fwd_pct=nbytes / res[0][0] / 1e6 / roof * 100, best_cfg=res[0][1],
                          triton_pct=nbytes / tri / 1e6 / roof * 100, compile_pct=nbytes / cms / 1e6 / roof * 100,
                          cuda_bwd_pct=1.5 * nbytes / hbms / 1e6 / roof * 100, triton_bwd_pct=1.5 * nbytes / tb / 1e6 / roof * 100))
        del x, dy, y, ref


def memory_ops(log, roof, table):
    for dt in (torch.bfloat16, torch.float32):
        n = 2**28
        a, b = torch.randn(n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)
        for v in ("naive", "vectorized"):
            ms = bench(lambda: wf.add(a, b, variant=v, backend="cuda"))
            tms = bench(lambda: wf.add(a, b, variant=v))
            pct = 3 * n * a.element_size() / ms / 1e6 / roof * 100
            tpct = 3 * n * a.element_size() / tms / 1e6 / roof * 100
            log(f"add {v:10s} {str(dt)[6:]}: cuda {pct:5.1f}%  triton {tpct:5.1f}%")
            table.append(dict(op=f"add[{v}]", dtype=str(dt)[6:], cuda_pct=pct, triton_pct=tpct))
        del a, b
        for m, n in ((32768, 4096), (4096, 32768), (512, 262144), (1, 2**27)):
            x = torch.randn(m, n, device="cuda", dtype=dt)
            for name in ("sum", "amax"):
                f = getattr(wf, name)
                ms = bench(lambda: f(x, backend="cuda"))
                tms = bench(lambda: f(x))
                pct = x.numel() * x.element_size() / ms / 1e6 / roof * 100
                tpct = x.numel() * x.element_size() / tms / 1e6 / roof * 100
                log(f"{name} {m}x{n} {str(dt)[6:]}: cuda {pct:5.1f}%  triton {tpct:5.1f}%")
                table.append(dict(op=name, shape=f"{m}x{n}", dtype=str(dt)[6:], cuda_pct=pct, triton_pct=tpct))
            del x


def reduce_sweep(log, roof, table, shapes=()):
    """The row reductions' launch knobs (warpforge_cuda::reduce_tuning: deep/wide, chunks per
    long row, threads per long-row block, the longest row one warp takes, persistent grid) at
    M*N = 2^27 bf16, against the default and torch.compile in the same process. Each
    configuration is timed twice, in interleaved order, to show the spread."""
    ops = cuda.ops()
    comp = torch.compile(lambda t: t.sum(-1))
    default = (0, 0, 0, 0, 0)
    for m, n in shapes or ((32768, 4096), (16384, 8192), (4096, 32768), (2048, 65536), (512, 262144),
                           (131072, 1024), (1, 2**27), (128, 2**20), (65536, 2048)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        ref = x.float().sum(-1)
        gb = (x.numel() + m) * 2 / 1e9

        def pct(ms):
            return gb / ms * 1e3 / roof * 100
        comp(x)
        log(f"sum {m}x{n}: compile {pct(bench(lambda: comp(x))):5.1f}%")
        cfgs = [default, (0, 0, 0, 0, 1)]
        if n >= 65536 and m > 1:
            cfgs += [(1, 0, 0, 0, 0), (0, 0, 256, 0, 0), (2, 2, 512, 0, 1), (2, 4, 512, 0, 1)]
        for cfg in cfgs + cfgs[::-1]:
            ops.reduce_tuning(list(cfg))
            try:
                y = wf.sum(x, backend="cuda")
                err = rel(y, ref)
                p_ = pct(bench(lambda: wf.sum(x, backend="cuda")))
                log(f"sum {m}x{n} cfg {cfg}: {p_:5.1f}%  err {err:.1e}")
                table.append(dict(op="sum_sweep", shape=f"{m}x{n}", cfg=str(cfg), pct=p_, err=err))
            except Exception as ex:  # noqa: BLE001
                log(f"sum {m}x{n} cfg {cfg}: FAILED {type(ex).__name__}: {str(ex)[:200]}")
        ops.reduce_tuning(list(default))
        del x


def matmul_ladder(log, table, extra=()):
    ops = cuda.ops()
    n = 4096
    for dt in (torch.bfloat16,):
        a = torch.randn(n, n, device="cuda", dtype=dt)
        b = torch.randn(n, n, device="cuda", dtype=dt)
        fl = 2 * n**3
        cub = bench(lambda: a @ b)
        log(f"matmul 4096^3 {dt}: cuBLAS {fl/cub/1e9:.0f} TFLOP/s")
        ref = (a.float() @ b.float())
        for v in extra:   # the extra variants on edge shapes first (m, n, k not multiples of a tile)
            for (m_, n_, k_) in ((1, 8, 8), (17, 24, 40), (129, 136, 4104), (300, 264, 72), (1000, 520, 2056)):
                A = torch.randn(m_, k_, device="cuda", dtype=dt)
                B = torch.randn(k_, n_, device="cuda", dtype=dt)
                try:
                    out = ops.matmul(A, B, v)
                    torch.cuda.synchronize()
                    e = rel(out, A.double() @ B.double())
                    bad = "" if e < 1e-2 and not out.isnan().any() else "  <-- WRONG"
                    log(f"check {v} {m_}x{n_}x{k_}: err {e:.1e}{bad}")
                except Exception as ex:  # noqa: BLE001
                    log(f"check {v} {m_}x{n_}x{k_}: FAILED {type(ex).__name__}: {str(ex)[:200]}")
        for v in ("naive", "tiled", "regblock", "mma", *extra):
            try:
                err = rel(ops.matmul(a, b, v), ref)
                ms = bench(lambda: ops.matmul(a, b, v))
                log(f"matmul {v:8s}: {fl/ms/1e9:6.1f} TFLOP/s = {cub/ms*100:5.1f}% cuBLAS, err {err:.1e}")
                table.append(dict(op=f"matmul[{v}]", tflops=fl / ms / 1e9, pct_cublas=cub / ms * 100, err=err))
            except Exception as ex:  # noqa: BLE001
                log(f"matmul {v}: FAILED {type(ex).__name__}: {str(ex)[:200]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-matmul", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--mma", default="", help="comma-separated extra mma variant names to time")
    ap.add_argument("--only-memory", action="store_true", help="add / sum / amax only")
    ap.add_argument("--reduce-sweep", action="store_true", help="only the row reductions' launch knobs")
    ap.add_argument("--shapes", default="", help="sweep only these MxN shapes, e.g. 512x262144,2048x65536")
    args = ap.parse_args()
    faulthandler.enable()
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    t = time.time()
    cuda.load()
    log(f"build+load: {time.time() - t:.1f} s  ({cuda.cache_dir()})")
    if not (args.only_memory or args.reduce_sweep):
        smoke(log)
    roof = copy_gbps()
    log(f"copy roof: {roof:.0f} GB/s on {torch.cuda.get_device_name()}")
    table: list[dict] = []
    if args.reduce_sweep:
        reduce_sweep(log, roof, table, [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s])
        args.skip_matmul = args.skip_sweep = args.only_memory = True
    else:
        memory_ops(log, roof, table)
    if args.only_memory:
        args.skip_matmul = args.skip_sweep = True
    if not args.skip_matmul:
        matmul_ladder(log, table, [v for v in args.mma.split(",") if v])
    if not args.skip_sweep:
        sweep(log, roof, table, [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s])
    with open(os.path.join(args.out, "probe_cuda.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), roof=roof, rows=table, log=lines), f, indent=1, default=str)
    log("\nsummary")
    for r in table:
        log("  " + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
