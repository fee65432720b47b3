"""The benchmark and roofline lab behind ``warpforge bench``.

- ``workloads.py``: one entry per op -- shapes, inputs, peers, byte and FLOP models (data only);
- ``runner.py``: timing, peers and modes for every workload (GPU), or the correctness run (CPU);
- ``timing.py``: how one callable is timed (CUDA events via do_bench, median, L2 flushed; host_us);
- ``report.py``: results.json, results.md, roofline.png, terminal tables and progress bar.

:func:`bench` is the whole command; the CLI only parses arguments.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import warnings
from pathlib import Path

import torch

from ..runtime import tuning
from . import report, runner, workloads
from .workloads import DTYPES, MODES, WORKLOADS

__all__ = ["bench", "metadata", "DTYPES", "MODES", "WORKLOADS"]


def metadata(*, quick: bool, modes: list[str], dtypes: list[str], ceilings: dict | None = None) -> dict:
    """Facts recorded with every result: versions, date, device and its measured ceilings."""
    import triton

    import warpforge

    meta = {
        "date": report.today(),
        "warpforge": getattr(warpforge, "__version__", "?"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "command": " ".join(["warpforge", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("warpforge") else None,
        "quick": quick,
        "modes": modes,
        "dtypes": dtypes,
        "interpreter": warpforge.interpreting(),
        "device": None,
        "ceilings": ceilings,
    }
    if torch.cuda.is_available():
        import dataclasses

        from ..runtime.device import device_info

        meta["device"] = dataclasses.asdict(device_info())
    return meta


def bench(ops: list[str] | None = None, *, modes: list[str] | None = None, dtypes: list[str] | None = None,
          quick: bool = False, out: str | Path | None = None, use_compile: bool = True, use_liger: bool = True,
          check: bool = False, small_only: bool = False, match: str | None = None) -> int:
    """Run the benchmark (CUDA) or the correctness run (no CUDA, or ``check``). Returns the exit code.
    ``small_only``: the decode-like (host-bound) cases alone. ``match``: a regular expression; only
    the cases whose label it finds (re.search) run."""
    wls = workloads.get(ops)
    modes = list(modes or MODES)
    notice = report.extras_notice()
    if notice:
        print(notice)

    checking = check or not torch.cuda.is_available()
    if match is not None:
        picked = dict(check=checking, quick=quick, small_only=small_only)
        if not any(runner.select_cases(wl, **picked, match=match) for wl in wls):
            labels = [c.label for wl in wls for c in runner.select_cases(wl, **picked)]
            print(f"warpforge bench: --match {match!r} matches none of the {len(labels)} "
                  f"{'correctness' if checking else 'timing'} cases of {', '.join(wl.name for wl in wls)} "
                  f"(e.g. {', '.join(repr(x) for x in labels[:3])})", file=sys.stderr)
            return 2

    if checking:
        # the correctness run is cheap: fp32 (tight tolerance) and bf16 unless told otherwise
        dtype_names = list(dtypes or ["fp32", "bf16"])
        return _check(wls, [DTYPES[d] for d in dtype_names], dtype_names, out, match)

    dtype_names = list(dtypes or ["bf16"])
    dts = [DTYPES[d] for d in dtype_names]

    from ..runtime.device import ceilings, device_info

    info = device_info()
    print(f"warpforge bench on {info.name} ({info.sm_count} SMs); measuring/reading ceilings ...", flush=True)
    ceil = ceilings()
    print(f"ceilings: copy {ceil['copy_gbps']:,.0f} GB/s, bf16 GEMM {ceil['bf16_tflops']:,.0f} TFLOP/s", flush=True)
    meta = metadata(quick=quick, modes=modes, dtypes=dtype_names, ceilings=ceil)
    if match is not None:
        meta["match"] = match
    # tune on first use of each shape bucket (in the warm-up calls, outside every timing); the
    # winners persist in the tuning cache. WARPFORGE_AUTOTUNE=0 keeps the heuristic defaults.
    with tuning.tuning(os.environ.get("WARPFORGE_AUTOTUNE", "1") != "0"):
        res = runner.run_bench(wls, modes, dts, quick=quick, use_compile=use_compile, use_liger=use_liger,
                               small_only=small_only, match=match,
                               copy_gbps=ceil.get("copy_gbps"),
                               gemm_tflops={torch.bfloat16: ceil.get("bf16_tflops"),
                                            torch.float16: ceil.get("fp16_tflops")},
                               progress=report.Progress("bench"))
    for op in dict.fromkeys(r["op"] for r in res.rows):
        group = [r for r in res.rows if r["op"] == op]
        report.print_table(group, report.bench_columns(group), title=op)
        prow, pcols = report.peer_table(group)
        if prow:
            report.print_table(prow, pcols, title=f"{op}: each peer's time / this row's time (> 1: this row is faster)")
    s = report.summary(res.rows)
    report.print_table(s, report.summary_columns(s),
                       title=f"summary ({report.summary_dtype(res.rows)}, headline shapes; % of the measured roof)")
    out_dir = Path(out) if out else report.default_out_dir(info.name)
    for p in report.write_results(out_dir, res.rows, meta, res.notes):
        print(f"wrote {p}")
    return 0


def merge(inputs: list[str | Path], out: str | Path) -> int:
    """One report (JSON, markdown, roofline) from the results.json of several runs on one device:
    metadata from the first run plus each run's command; for an (op, dtype, mode) timed in several
    runs, the rows of the last run that timed it (pass the runs oldest first): a later fp16 run of
    an op does not displace an earlier bf16 one. Decode-sized rows and large ones count apart: a
    ``--small`` run replaces an op's small rows and leaves its large ones. A ``--match`` run covers
    only some shapes: it replaces the rows of those shapes and leaves the rest of the group."""
    runs = [json.loads((Path(d) / "results.json").read_text()) for d in inputs]
    names = {r["device"]["name"] for r in runs}
    if len(names) != 1:
        raise SystemExit(f"warpforge report: the runs come from different devices ({', '.join(sorted(names))})")
    meta = {k: v for k, v in runs[0].items() if k not in ("rows", "notes", "summary")}
    meta["merged_from"] = [r.get("command") for r in runs]
    def group(row):
        return row["op"], row["dtype"], row["mode"], bool(row.get("small"))

    whole = {group(row): i for i, r in enumerate(runs) if r.get("match") is None for row in r["rows"]}
    latest = {(group(row), row["shape"]): i for i, r in enumerate(runs) for row in r["rows"]}
    rows = [row for i, r in enumerate(runs) for row in r["rows"]
            if latest[group(row), row["shape"]] == i and i >= whole.get(group(row), -1)]
    for row in rows:   # runs from before the timing column were all timed after do_bench's memset
        if row.get("status") == "ok":
            row.setdefault("timing", "memset")
    notes = list(dict.fromkeys(n for r in runs for n in r.get("notes", [])))
    s = report.summary(rows)
    report.print_table(s, report.summary_columns(s),
                       title=f"summary ({report.summary_dtype(rows)}, headline shapes; % of the measured roof)")
    for p in report.write_results(out, rows, meta, notes):
        print(f"wrote {p}")
    return 0


def _check(wls, dts, dtype_names, out, match=None) -> int:
    on_gpu = torch.cuda.is_available()
    banner = (report.BANNER_CPU if not on_gpu else
              "Correctness run on the GPU: its times are single wall-clock calls including JIT compilation, "
              "not benchmark times.")
    print(banner, flush=True)
    with warnings.catch_warnings():
        # the interpreter evaluates masked-off lanes too (log(0), 0/0): numpy warns, results are right
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
        res = runner.run_check(wls, dts, device="cuda" if on_gpu else "cpu", progress=report.Progress("check"),
                               match=match)
    report.print_table(res.rows, report.CHECK_COLUMNS, title="correctness against float64")
    failed = [r for r in res.rows if str(r["status"]).startswith("failed")]
    for n in res.notes:
        print(n)
    print(f"{len(res.rows) - len(failed)}/{len(res.rows)} checks passed"
          + (f"; FAILED: {', '.join(sorted({r['op'] for r in failed}))}" if failed else ""))
    print(banner, flush=True)
    if out:
        meta = metadata(quick=False, modes=["fwd", "bwd"], dtypes=dtype_names)
        meta["banner"] = banner
        for p in report.write_check(out, res.rows, meta, res.notes):
            print(f"wrote {p}")
    return 1 if failed else 0
