"""Launch shapes of the row ops at long rows, N = 32K-262K bf16, M*N = 2^27 (not the benchmark).
Forces the op's row config to each variant -- the pipe path (C programs a row exchanging
statistics, the wait a row behind; ``--pipe``) at several chunk sizes and warp counts, the block
path (one wide program a row) and the two-pass loop path -- checks each against a float64
reference and the default config's output (largest elementwise difference, so a wrong chunk of one
row shows), and times it with the bench's own timer (`bench/timing.py`).

    python benchmarks/probe_norm_long.py [--ns 32768,65536,262144] [--bwd] [--pipe] [--softmax]
        [--only ln] [--fwd-variants pipeL:2048:4,...] [--bwd-variants block:1024:4:2,...] [--per-sm 2,3]

A variant is ``mode:chunk:warps[:rows[:stages[:per_sm]]]`` (mode pipeL: the pipe kernels with
reload; stages: the block backward stages that many tiles through shared memory,
``RowConfig.stages``; per_sm: the block backward's weight-gradient grid, programs an SM, as
``--per-sm`` but for that variant alone). ``--per-sm``
sweeps the block backward's weight-gradient grid (programs an SM, ``grad_grid``). Run it with
WARPFORGE_FASTPATH=0: the fast path would replay the first config it was offered for a shape.
"""
from __future__ import annotations

import argparse
import functools

import torch
import triton

import warpforge as wf
from warpforge.bench import timing
from warpforge.ops import norms
from warpforge.runtime import device as dev
from warpforge.runtime.heuristics import NORM_LOOP_ROWS_PER_SM, RowConfig

BF16 = torch.bfloat16
FWD_VARIANTS = [("loop", 16384, 16), ("loop", 32768, 32), ("block", 32768, 16), ("block", 32768, 32)]
BWD_VARIANTS = [("split", 4096, 4), ("split", 8192, 4), ("split", 8192, 8), ("split", 16384, 8),
                ("split", 16384, 16), ("loop", 4096, 16), ("loop", 8192, 16), ("block", 32768, 16),
                ("block", 32768, 32)]
# the deferred-wait kernels (mode "pipe"): --pipe sweeps these instead
# ("pipeL": the same kernels re-reading the weight and bias chunks every row, RowConfig.reload)
PIPE_FWD = [("pipe", 4096, 4), ("pipe", 8192, 4), ("pipe", 8192, 8), ("pipe", 16384, 16), ("pipeL", 4096, 4),
            ("pipeL", 8192, 4), ("pipeL", 8192, 8)]
PIPE_BWD = [("pipe", 2048, 4), ("pipe", 4096, 4), ("pipe", 8192, 8), ("pipeL", 2048, 4), ("pipeL", 4096, 4),
            ("pipeL", 8192, 8)]


def parse_variants(text):
    """``mode:chunk:warps[:rows[:stages[:per_sm]]],...`` -> [(mode, chunk, warps, rows, stages, per_sm)]."""
    out = []
    for item in filter(None, text.split(",")):
        mode, *nums = item.split(":")                  # chunk, warps, then the optional fields
        defaults = [1, 0, 0][len(nums) - 2:]            # rows, stages, per_sm not given
        out.append((mode, *(int(v) for v in nums), *defaults))
    return out


def grid_per_sm(per_sm, m, rows, col_tiles, _config_per_sm=None):
    """``heuristics.grad_grid`` with ``per_sm`` programs an SM instead of GRAD_PROGRAMS_PER_SM."""
    groups = max(1, min(triton.cdiv(m, rows), dev.sm_count() * per_sm // col_tiles))
    per = triton.cdiv(triton.cdiv(m, groups), rows) * rows
    return triton.cdiv(m, per), per


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def maxdiff(a, b):
    """Largest elementwise difference (NaN counts as infinite): a wrong chunk of one row shows."""
    d = (a.float() - b.float()).abs()
    return float("inf") if d.isnan().any() else d.max().item()


def attempt(table, n, name, what, run):
    """Append ``run()``'s rows (n, name, label, ms, % of copy, error) to ``table``, or one FAILED row."""
    try:
        table.extend((n, name, *row) for row in run())
    except Exception as e:  # noqa: BLE001
        table.append((n, name, f"{what} FAILED {type(e).__name__}: {str(e)[:80]}", 0, 0, 0))
    print(table[-1], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="32768,65536,262144")
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--softmax", action="store_true", help="softmax / log-softmax forward and backward instead")
    ap.add_argument("--pipe", action="store_true", help="sweep pipe-mode shapes (the deferred-wait kernels) instead of block/loop/split ones")
    ap.add_argument("--defaults-only", action="store_true", help="forward: the heuristic's config only")
    ap.add_argument("--only", default="rms,ln,add", help="which norms (rms, ln, add)")
    ap.add_argument("--fwd-variants", default="", help="mode:chunk:warps[:rows],... instead of the built-in lists")
    ap.add_argument("--bwd-variants", default="", help="mode:chunk:warps[:rows],... instead of the built-in lists")
    ap.add_argument("--affine", default="wb", choices=("wb", "w", "none"),
                    help="LayerNorm's parameters: weight and bias, weight only, or neither")
    ap.add_argument("--per-sm", default="", help="block backward: programs an SM of the weight-gradient grid")
    args = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    cfg_t = timing.TimingConfig.quick()
    real = norms.norm_fwd_config
    table = []
    if args.softmax:
        return softmax_sweep(args, copy, cfg_t)
    for n in (int(v) for v in args.ns.split(",")):
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=BF16) * 2 + 0.5
        w = torch.rand(n, device="cuda", dtype=BF16) + 0.5
        b = torch.randn(n, device="cuda", dtype=BF16)
        res = torch.randn_like(x)
        lw = None if args.affine == "none" else w      # LayerNorm's weight and bias (--affine)
        lb = b if args.affine == "wb" else None
        refs = {"rms": norms.rms_norm_reference(x[:8], w, 1e-6),
                "ln": norms.layer_norm_reference(x[:8], lw, lb, 1e-5),
                "add": norms.add_rms_norm_reference(x[:8], res[:8], w, 1e-6)[0]}
        calls = {"rms": lambda: wf.rms_norm(x, (n,), w, eps=1e-6),
                 "ln": lambda: wf.layer_norm(x, (n,), lw, lb, eps=1e-5),
                 "add": lambda: wf.add_rms_norm(x, res, w, eps=1e-6)[0]}
        for name in [v for v in ("rms", "ln", "add") if v in args.only.split(",")]:
            nbytes = (4 if name == "add" else 2) * m * n * 2
            comp = torch.compile({"rms": lambda t: torch.nn.functional.rms_norm(t, (n,), w, 1e-6),
                                  "ln": lambda t: torch.nn.functional.layer_norm(t, (n,), lw, lb, 1e-5),
                                  "add": lambda t: torch.nn.functional.rms_norm(t + res, (n,), w, 1e-6)}[name],
                                 dynamic=False)   # as the bench: one static kernel a shape, not a dynamic one after the 2nd N
            comp(x)
            ms = timing.device_ms(lambda c=comp: c(x), cfg_t, nbytes)
            table.append((n, name, "compile", ms, 100 * nbytes / ms / 1e6 / copy, 0.0))
            print(table[-1], flush=True)
            route = real(n, name == "ln", many=name != "add" and m >= NORM_LOOP_ROWS_PER_SM * dev.sm_count(),
                         device_name=dev.device_info().name)       # the route the op takes on this device
            print(f"  default config: {route}", flush=True)
            base = calls[name]().clone()
            variants = [("default", 0, 0, 1, 0, 0)] + ([] if args.defaults_only else parse_variants(args.fwd_variants)
                                                       or [v + (1, 0, 0) for v in (PIPE_FWD if args.pipe else FWD_VARIANTS)])
            for mode, chunk, warps, rows, stages, _per_sm in variants:
                if chunk > n or (mode == "block" and chunk != n):
                    continue
                c = (route if mode == "default"
                     else RowConfig(mode.rstrip("L"), chunk, rows, warps, -(-n // chunk), mode == "pipeL", stages=stages))
                norms.norm_fwd_config = lambda _n, layer=False, _c=c, **_kw: _c

                def run(name=name, c=c, mode=mode, nbytes=nbytes):
                    out = calls[name]()
                    err = rel(out[:8], refs[name])
                    worst = maxdiff(out, base)
                    if not (err < 2e-2 and worst <= 0.07):
                        raise AssertionError(f"rel err {err}, max diff to the default {worst}")
                    ms = timing.device_ms(calls[name], cfg_t, nbytes)
                    label = f"{mode}{' ' + c.mode if mode == 'default' else ''} {c.block_n}x{c.num_warps}w"
                    label += f" r{c.rows}" if c.rows > 1 else ""
                    label += f" s{c.stages}" if c.stages else ""
                    return [(label, ms, 100 * nbytes / ms / 1e6 / copy, err)]
                try:
                    attempt(table, n, name, f"{mode} {chunk}x{warps}w", run)
                finally:
                    norms.norm_fwd_config = real
        if args.bwd:
            dy = torch.randn_like(x)
            bbytes = 3 * m * n * 2
            realb = norms.norm_bwd_config
            real_grid = norms.grad_grid
            for name in [v for v in ("rms", "ln") if v in args.only.split(",")]:
                xg = x.detach().requires_grad_()
                wg = w.detach().requires_grad_()
                bg = b.detach().requires_grad_()
                y = (wf.rms_norm(xg, (n,), wg, eps=1e-6) if name == "rms" else
                     wf.layer_norm(xg, (n,), wg, bg, eps=1e-5))
                ins = (xg, wg) if name == "rms" else (xg, wg, bg)
                ref = torch.autograd.grad(y, ins, dy, retain_graph=True)
                dname = dev.device_info().name
                print(f"  bwd default: {realb(n, name == 'ln', device_name=dname)}", flush=True)
                bwd_variants = [("default", 0, 0, 1, 0, 0)] + [
                    v[:5] + (p,) for v in (parse_variants(args.bwd_variants)
                                           or [v + (1, 0, 0) for v in (PIPE_BWD if args.pipe else BWD_VARIANTS)])
                    for p in ([v[5]] if v[5] else
                              [int(t) for t in args.per_sm.split(",")] if args.per_sm and v[0] == "block" else [0])]
                for mode, chunk, warps, rows, stages, per_sm in bwd_variants:
                    if chunk > n or (mode == "block" and chunk != triton.next_power_of_2(n)):
                        continue
                    c = (realb(n, name == "ln", device_name=dname) if mode == "default"
                         else RowConfig(mode.rstrip("L"), chunk, rows, warps, -(-n // chunk), mode == "pipeL",
                                        stages=stages))
                    norms.norm_bwd_config = lambda _n, layer=False, _c=c, **_kw: _c
                    if per_sm:
                        norms.grad_grid = functools.partial(grid_per_sm, per_sm)
                    what = (f"bwd {mode} {chunk}x{warps}w r{rows}" + (f" s{stages}" if stages else "")
                            + (f" {per_sm}/SM" if per_sm else ""))

                    def run(y=y, ins=ins, ref=ref, what=what):
                        got = torch.autograd.grad(y, ins, dy, retain_graph=True)
                        err = max(rel(g, r) for g, r in zip(got, ref))
                        worst = maxdiff(got[0], ref[0]) / ref[0].float().abs().max().item()
                        if not (err < 1e-2 and worst < 2e-2):
                            raise AssertionError(f"rel err {err} against the default config")
                        ms = timing.device_ms(lambda: torch.autograd.grad(y, ins, dy, retain_graph=True), cfg_t, bbytes)
                        return [(what, ms, 100 * bbytes / ms / 1e6 / copy, err)]
                    try:
                        attempt(table, n, name, what, run)
                    finally:
                        norms.norm_bwd_config = realb
                        norms.grad_grid = real_grid
                del y, ref
            del dy
        del x
    print(f"\ncopy {copy:,.0f} GB/s; % of copy (bf16, M*N = 2^27)")
    for n, name, what, ms, pct, err in table:
        print(f"{n:7d} {name:4s} {what:28s} {ms * 1e3:8.1f} us {pct:6.1f}%  err {err:.1e}")


SOFTMAX_VARIANTS = [("default", 0, 0), ("block", 32768, 16), ("block", 32768, 32), ("split", 8192, 4),
                    ("split", 16384, 8)]
SOFTMAX_PIPE = [("default", 0, 0), ("pipe", 4096, 4), ("pipe", 4096, 8), ("pipe", 8192, 4), ("pipe", 8192, 8),
                ("pipe", 16384, 16)]


def softmax_sweep(args, copy, cfg_t):
    from warpforge.ops import softmax as S

    real = S.softmax_config
    table = []
    for n in (int(v) for v in args.ns.split(",")):
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=BF16) * 3
        dy = torch.randn_like(x)
        for log in (False, True):
            ref = (torch.log_softmax if log else torch.softmax)(x[:8].double(), -1)
            y = S._softmax_fwd(x, log)
            dref = S._softmax_bwd(y, dy, log)
            yref = y.clone()
            for mode, chunk, warps in (SOFTMAX_PIPE if args.pipe else SOFTMAX_VARIANTS):
                if chunk > n or (mode == "block" and chunk != n):
                    continue
                c = None if mode == "default" else RowConfig(mode, chunk, 1, warps, -(-n // chunk))
                if c is not None:
                    S.softmax_config = lambda _n, backward=False, _c=c: _c
                name = f"{'log_' if log else ''}softmax"

                def run(log=log, c=c, mode=mode, ref=ref, y=y, dref=dref):
                    out = S._softmax_fwd(x, log)
                    err = rel(out[:8], ref)
                    dout = S._softmax_bwd(y, dy, log)
                    derr = rel(dout, dref)
                    worst = maxdiff(out, yref) / yref.float().abs().max().item()
                    dworst = maxdiff(dout, dref) / dref.float().abs().max().item()
                    if not (err < 2e-2 and derr < 2e-2 and worst < 2e-2 and dworst < 2e-2):
                        raise AssertionError(f"rel err {err} / {derr}")
                    f = c or real(n, False)
                    b = c or real(n, True)
                    ms_f = timing.device_ms(lambda: S._softmax_fwd(x, log), cfg_t, 4 * m * n)
                    ms_b = timing.device_ms(lambda: S._softmax_bwd(y, dy, log), cfg_t, 6 * m * n)
                    return [(f"fwd {mode} {f.block_n}x{f.num_warps}w", ms_f, 100 * 4 * m * n / ms_f / 1e6 / copy, err),
                            (f"bwd {mode} {b.block_n}x{b.num_warps}w", ms_b, 100 * 6 * m * n / ms_b / 1e6 / copy, derr)]
                try:
                    attempt(table, n, name, f"{mode} {chunk}x{warps}w", run)
                finally:
                    S.softmax_config = real
        del x, dy
    print(f"\ncopy {copy:,.0f} GB/s; softmax, % of copy (bf16, M*N = 2^27)")
    for n, name, what, ms, pct, err in table:
        print(f"{n:7d} {name:12s} {what:28s} {ms * 1e3:8.1f} us {pct:6.1f}%  err {err:.1e}")


if __name__ == "__main__":
    main()
