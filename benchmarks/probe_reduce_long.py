"""Device probe: sum/amax forward over long rows (N > 16,384, bf16, M*N = 2^27 and a few short
batches): the (row, chunk) partials + second launch against one looping program a row at several
(BLOCK_N, warps), with torch.compile and eager in the same process, timed as the bench's steady
condition. Prints us and % of the measured copy ceiling; checks each variant against torch.

    python benchmarks/probe_reduce_long.py [--out DIR]
    PROBE_EXTRA=1 python benchmarks/probe_reduce_long.py    # N <= 16K loop vs block; amax bwd at 32K
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import warpforge as wf
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import reduce as R
from warpforge.runtime import device as dev

# (mode, BLOCK_N, warps) forced through heuristics.reduce_config. The loop kernel is the prefetched,
# evict-first one; its earlier forms (no prefetch, no eviction hint, NaN counted per element) are
# in benchmarks/NOTES.md, item 28.
VARIANTS = [("partial", 8192, 8), ("loop", 2048, 16), ("loop", 4096, 16), ("loop", 8192, 16), ("loop", 4096, 8)]


def inductor_configs() -> list[str]:
    """The launch configs torch.compile's Triton kernels settled on (loaded modules' autotuners)."""
    from torch._inductor.codecache import PyCodeCache

    out = []
    for mod in list(PyCodeCache.modules) if isinstance(PyCodeCache.modules, list) else list(PyCodeCache.modules.values()):
        for name in dir(mod):
            obj = getattr(mod, name)
            launchers = getattr(obj, "launchers", None)
            if launchers:
                out.append(f"{name}: {[str(getattr(l, 'config', l)) for l in launchers]}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    cfg = TimingConfig()
    shapes = [((1 << 27) // n, n) for n in (32768, 65536, 262144)] + [(256, 262144)]
    real = R.reduce_config
    rows = []
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
        nbytes = m * n * 2
        for name, tfn in (("sum", torch.sum), ("amax", torch.amax)):
            ref = tfn(x.float(), -1)
            wfn = wf.sum if name == "sum" else wf.amax
            res = {}
            for mode, block, warps in VARIANTS:
                R.reduce_config = lambda mm, nn, c=(mode, block, warps): c
                got = wfn(x, -1).float()
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-2, (m, n, name, mode, block, warps, err)
                res[f"{mode} {block}x{warps}"] = device_ms(lambda: wfn(x, -1), cfg, nbytes)
            R.reduce_config = real
            res["default"] = device_ms(lambda: wfn(x, -1), cfg, nbytes)
            res["eager"] = device_ms(lambda: tfn(x, -1), cfg, nbytes)
            torch._dynamo.reset()
            comp = torch.compile(lambda t, f=tfn: f(t, -1), dynamic=False)
            comp(x)
            res["compile"] = device_ms(lambda: comp(x), cfg, nbytes)
            if m == 4096:
                print("   inductor:", *sorted(set(inductor_configs())), sep="\n     ", flush=True)
            for k, ms in res.items():
                rows.append({"op": name, "m": m, "n": n, "impl": k, "us": ms * 1e3,
                             "pct_copy": nbytes / (ms * 1e-3) / 1e9 / copy * 100})
            best = min(res, key=res.get)
            line = "  ".join(f"{k} {v * 1e3:.1f}" for k, v in res.items())
            print(f"{name:4s} {m:6d}x{n:<6d} best {best:18s} | {line}", flush=True)
    with open(os.path.join(a.out, "probe_reduce_long.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__" and os.environ.get("PROBE_EXTRA") != "1":
    main()


def extra():
    """Rows a program holds whole (N <= 16K): the block kernel against the loop kernel forced; and
    the amax backward at 32K under several launch shapes (steady timing, us)."""
    from warpforge.runtime.heuristics import RowConfig, amax_bwd_config
    from warpforge.runtime.launch import run

    cfg = TimingConfig()
    for n in (4096, 8192, 16384):
        m = (1 << 27) // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
        for name, is_max in (("sum", False), ("amax", True)):
            wfn = wf.amax if is_max else wf.sum
            res = {"block (default)": device_ms(lambda: wfn(x, -1), cfg, m * n * 2)}
            ref = wfn(x, -1)
            for block, warps in ((2048, 16), (4096, 16), (4096, 8), (8192, 16)):
                def f(block=block, warps=warps):
                    y = torch.empty(m, device="cuda", dtype=x.dtype)
                    run(R._reduce_fwd_loop_kernel, (m,), (x, y, y, n, x.stride(0)), MAX=is_max, COUNT=False, BLOCK_N=block, num_warps=warps)
                    return y
                assert torch.allclose(f().float(), ref.float(), rtol=1e-2, atol=1e-1)
                res[f"loop {block}x{warps}"] = device_ms(f, cfg, m * n * 2)
            torch._dynamo.reset()
            comp = torch.compile(lambda t, mx=is_max: t.amax(-1) if mx else t.sum(-1), dynamic=False)
            comp(x)
            res["compile"] = device_ms(lambda: comp(x), cfg, m * n * 2)
            print(f"{name:4s} {m:6d}x{n:<6d} | " + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in res.items()), flush=True)
    n, m = 32768, 4096
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    y = x.amax(-1)
    dy = torch.randn(m, device="cuda", dtype=torch.bfloat16)
    ref = R._amax_bwd(x, y, dy)
    real = R.amax_bwd_config
    res = {}
    for c in (None, RowConfig("block", 32768, 1, 16), RowConfig("split", 4096, 1, 4, 8), RowConfig("split", 8192, 1, 4, 4),
              RowConfig("split", 8192, 1, 8, 4), RowConfig("split", 16384, 1, 8, 2), RowConfig("split", 16384, 1, 16, 2)):
        R.amax_bwd_config = real if c is None else (lambda nn, c=c: c)
        assert torch.equal(R._amax_bwd(x, y, dy), ref)
        key = "default " + str(real(n)) if c is None else f"{c.mode} {c.block_n}x{c.num_warps} C={c.chunks}"
        res[key] = device_ms(lambda: R._amax_bwd(x, y, dy), cfg, 2 * m * n * 2)
    R.amax_bwd_config = real
    for k, v in res.items():
        print(f"amax bwd 4096x32768 {k:60s} {v * 1e3:7.1f} us")


if __name__ == "__main__" and os.environ.get("PROBE_EXTRA") == "1":
    extra()
