"""Turning rows into results: ``results.json``, ``results.md``, ``roofline.png``, and the tables and
progress bar on the terminal.

``rich`` (tables, progress bar) and ``matplotlib`` (the PNG) are the optional extra
``warpforge[bench]``; without them the tables are plain text, there is no PNG, and one line says so.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import sys
from pathlib import Path

BANNER_CPU = ("No CUDA GPU: this is a correctness run under the Triton interpreter; "
              "its times are interpreter times, not GPU times.")


def have_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def extras_notice() -> str | None:
    missing = [n for n, ok in (("rich", have_rich()), ("matplotlib", have_matplotlib())) if not ok]
    if not missing:
        return None
    return (f"note: {' and '.join(missing)} not installed (pip install 'warpforge[bench]'): "
            f"plain-text tables{', no roofline PNG' if 'matplotlib' in missing else ''}.")


def today() -> str:
    return _dt.date.today().isoformat()


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").lower() or "device"


def default_out_dir(device_name: str) -> Path:
    """``bench-out/<gpu-name>-<YYYY-MM-DD>/`` (git-ignored)."""
    return Path("bench-out") / f"{safe_name(device_name)}-{today()}"


# ----------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------
def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) < 1e-3:
            return f"{v:.2e}"
        return f"{v:.{digits}g}"
    return str(v)


BENCH_COLUMNS = [("mode", "mode"), ("dtype", "dtype"), ("shape", "shape"), ("impl", "impl"), ("ms", "ms"),
                 ("host_us", "host µs"), ("gbps", "GB/s"), ("tflops", "TFLOP/s"), ("pct_copy", "% copy"), ("pct_roof", "% roof"),
                 ("ratio", "vs best peer"), ("status", "status")]
CHECK_COLUMNS = [("op", "op"), ("dtype", "dtype"), ("shape", "shape"), ("impl", "impl"), ("direction", "dir"),
                 ("rel_err", "rel err"), ("tol", "tol"), ("ok", "pass"), ("wall_ms", "interp ms"),
                 ("status", "status")]
SUMMARY_COLUMNS = [("op", "op"), ("mode", "mode"), ("dtype", "dtype"), ("shape", "headline shape"),
                   ("ours_ms", "warpforge ms"), ("floor_ms", "roof ms"),
                   ("ours_pct", "warpforge % roof"), ("best_peer", "best peer"), ("peer_pct", "peer % roof"),
                   ("ratio", "ratio (peer ms / ours)"), ("geomean_ratio", "geomean ratio, large shapes")]
# Columns only some workloads fill (references, memory): shown where a row of the table has them.
OPTIONAL_COLUMNS = [("vs_ref", "time / ref"), ("extra_gib", "extra GiB"), ("timing", "timing")]
# The summary's also: each named peer's time over ours at the headline shape (the per-op tables
# show these as a table of their own, :func:`peer_table`).
SUMMARY_OPTIONAL_COLUMNS = OPTIONAL_COLUMNS + [("vs_peers", "peer ms / warpforge ms")]
PEER_TABLE_KEYS = [("mode", "mode"), ("dtype", "dtype"), ("shape", "shape"), ("impl", "impl")]


def _with_optional(rows: list[dict], columns, optional=OPTIONAL_COLUMNS) -> list:
    """``columns`` plus each optional column some row of ``rows`` carries (before "status")."""
    extra = [c for c in optional if any(c[0] in r for r in rows)]
    if not extra:
        return list(columns)
    cols = list(columns)
    at = next((i for i, (k, _) in enumerate(cols) if k == "status"), len(cols))
    return cols[:at] + extra + cols[at:]


def bench_columns(rows: list[dict]) -> list:
    """The per-op table's columns: the time to the reference rows and the extra peak memory appear
    for the workloads that measure them (the rows carry ``vs_ref`` / ``extra_gib``) only."""
    return _with_optional(rows, BENCH_COLUMNS)


def summary_columns(entries: list[dict]) -> list:
    return _with_optional([{k: v for k, v in e.items() if v is not None} for e in entries], SUMMARY_COLUMNS,
                          SUMMARY_OPTIONAL_COLUMNS)


def peer_table(rows: list[dict]) -> tuple[list[dict], list]:
    """For an op with named peers: one row per timed implementation of ours (and any other row that
    is not a peer) with a column per peer, that peer's time over the row's (``vs_peers``; > 1: the
    row is faster). ([], []) for an op without them."""
    mine = [r for r in rows if isinstance(r.get("vs_peers"), dict)]
    if not mine:
        return [], []
    names = list(dict.fromkeys(n for r in mine for n in r["vs_peers"]))
    out = [{**{k: r.get(k) for k, _ in PEER_TABLE_KEYS}, "kind": r.get("kind"),   # kind: the terminal's style
            **{f"vs:{n}": r["vs_peers"].get(n) for n in names}} for r in mine]
    return out, PEER_TABLE_KEYS + [(f"vs:{n}", n) for n in names]


def _cells(row: dict, columns) -> list[str]:
    out = []
    for key, _ in columns:
        v = row.get(key)
        if (key == "ratio" or key.startswith("vs:")) and isinstance(v, float):
            out.append(f"{v:.2f}x")
        elif key in ("vs_ref", "vs_peers") and isinstance(v, dict):
            out.append(", ".join(f"{x:.2f}x {name}" for name, x in v.items()) or "-")
        elif key == "extra_gib" and isinstance(v, float):
            out.append(f"{v:.2f}")
        elif key in ("pct_copy", "pct_roof") or key.endswith("_pct"):
            out.append("-" if v is None else f"{v:.1f}")
        else:
            out.append(fmt(v))
    return out


def markdown_table(rows: list[dict], columns) -> str:
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + " --- |" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r, columns)) + " |")
    return "\n".join(lines)


def plain_table(rows: list[dict], columns) -> str:
    cells = [[h for _, h in columns]] + [_cells(r, columns) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def print_table(rows: list[dict], columns, title: str = "", file=None) -> None:
    """A rich table when rich is installed, else plain text."""
    file = file or sys.stdout
    if have_rich():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(title=title or None, show_lines=False)
        for key, head in columns:
            t.add_column(Text(head), justify="left" if key in ("op", "mode", "dtype", "shape", "impl", "status",
                                                               "direction", "best_peer") else "right")
        for r in rows:
            style = None
            if str(r.get("status", "ok")).startswith("failed"):
                style = "red"
            elif r.get("kind") == "ours":
                style = "bold"
            elif r.get("kind") == "ref":
                style = "italic"
            t.add_row(*(Text(c) for c in _cells(r, columns)), style=style)   # Text: "[naive]" is no markup
        Console(file=file, width=200).print(t)
    else:
        if title:
            print(title, file=file)
        print(plain_table(rows, columns), file=file)


# ----------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------
def summary_dtype(rows: list[dict]) -> str | None:
    """bf16 when present, else the first dtype benchmarked."""
    dtypes = [r["dtype"] for r in rows]
    return "bf16" if "bf16" in dtypes else (dtypes[0] if dtypes else None)


def _ok(r: dict) -> bool:
    return r.get("status") == "ok" and r.get("ms")


def _pct(r: dict):
    """% of the attainable roof (memory-bound ops: the copy ceiling; GEMMs: the measured GEMM rate);
    results written before that column existed have only % of copy."""
    v = r.get("pct_roof")
    return r.get("pct_copy") if v is None else v


def summary(rows: list[dict]) -> list[dict]:
    """Per op and mode, at the headline large shape of the summary dtype: warpforge's time and the
    roofline's (the time at 100% of the roof: the byte floor at the measured copy bandwidth for a
    memory-bound op, the FLOPs at the measured GEMM rate for a compute-bound one), warpforge's % of
    the roofline (copy bandwidth x intensity, capped by the measured GEMM rate), the best peer's,
    their ratio; the geometric mean of the ratio over all large shapes; and where the workload
    measures them, warpforge's time over each reference row's (``vs_ref``) and its extra peak
    memory (``extra_gib``)."""
    dt = summary_dtype(rows)
    out = []
    keys = list(dict.fromkeys((r["op"], r["mode"]) for r in rows if r["dtype"] == dt))
    for op, mode in keys:
        group = [r for r in rows if r["op"] == op and r["mode"] == mode and r["dtype"] == dt]
        head = [r for r in group if r.get("headline")]
        ours = next((r for r in head if r["impl"] == "warpforge"), None)
        entry = {"op": op, "mode": mode, "dtype": dt, "shape": head[0]["shape"] if head else None,
                 "ours_ms": None, "floor_ms": None, "ours_pct": None, "best_peer": None, "peer_pct": None,
                 "ratio": None, "geomean_ratio": None, "vs_ref": None, "extra_gib": None}
        if ours is not None:
            entry["ours_pct"] = _pct(ours) if _ok(ours) else None
            if _ok(ours):
                entry["ours_ms"] = ours["ms"]
                entry["floor_ms"] = ours["ms"] * entry["ours_pct"] / 100 if entry["ours_pct"] else None
                entry["vs_ref"] = ours.get("vs_ref")
                entry["extra_gib"] = ours.get("extra_gib")
            entry["best_peer"] = ours.get("best_peer")
            entry["ratio"] = ours.get("ratio")
            if "vs_peers" in ours:   # an op with named peers: each one's time over ours
                entry["vs_peers"] = ours["vs_peers"] if _ok(ours) else None
            peer = next((r for r in head if r["impl"] == ours.get("best_peer")), None)
            if peer is not None and _ok(peer):
                entry["peer_pct"] = _pct(peer)
        ratios = [r["ratio"] for r in group
                  if r["impl"] == "warpforge" and not r.get("small") and _ok(r) and r.get("ratio")]
        if ratios:
            entry["geomean_ratio"] = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.append(entry)
    return out


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------
def results_markdown(rows: list[dict], meta: dict, notes: list[str]) -> str:
    dev = meta.get("device") or {}
    ceil = meta.get("ceilings") or {}
    lines = [f"# warpforge bench: {dev.get('name', 'unknown device')}, {meta.get('date', today())}", ""]
    lines.append(f"torch {meta.get('torch')}, triton {meta.get('triton')}, warpforge {meta.get('warpforge')}"
                 + (", quick sweep" if meta.get("quick") else ""))
    if ceil:
        lines.append(f"Measured ceilings: copy {fmt(ceil.get('copy_gbps'))} GB/s (read + write), "
                     f"cuBLAS bf16 GEMM {fmt(ceil.get('bf16_tflops'))} TFLOP/s, "
                     f"fp16 {fmt(ceil.get('fp16_tflops'))} TFLOP/s.")
    lines += ["", "Time: median of CUDA-event timings (bench/timing.py); the timing column says under which "
              "condition: steady = back-to-back calls, no flush, as the copy ceiling is measured (calls "
              "moving >= 4x the L2); clean = single calls, each after a flush that leaves the L2 holding "
              "only clean lines; memset = single calls after triton.testing.do_bench's memset flush (runs "
              "before 2026-11-22's change: the memset's dirty lines were written back inside the timed "
              "call, which cost read-heavy kernels ~10% against the copy ceiling). "
              "GB/s and TFLOP/s from each op's byte and FLOP model (bench/workloads.py); % roof: of the "
              "measured roofline at the op's FLOP/byte (copy bandwidth x intensity, capped by the cuBLAS "
              "GEMM rate of the dtype). "
              "Ratio = best peer's time / this row's time (> 1: faster than every peer). "
              "host µs (decode shapes): wall clock per call of 200 back-to-back calls and one synchronize. "
              "roof ms (summary): the time at 100% of the roof, i.e. the byte floor at the measured copy "
              "bandwidth (memory-bound ops) or the FLOPs at the measured GEMM rate (compute-bound). "
              "Where an op has reference rows (kind ref, e.g. cublas_gemms: the GEMMs the op cannot avoid, "
              "timed in the same run; never a peer), time / ref = this row's time / the reference's "
              "(< 1: faster than the reference). extra GiB (ops that measure it): peak device memory one "
              "call adds above the inputs, its outputs and gradients included.", ""]
    if notes:
        lines += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    s = summary(rows)
    lines += ["## Summary", "", markdown_table(s, summary_columns(s)), ""]
    for op in dict.fromkeys(r["op"] for r in rows):
        group = [r for r in rows if r["op"] == op]
        lines += [f"## {op}", "", markdown_table(group, bench_columns(group)), ""]
        prow, pcols = peer_table(group)
        if prow:
            lines += [f"### {op}: each peer's time / this row's time (> 1: this row is faster)", "",
                      markdown_table(prow, pcols), ""]
    return "\n".join(lines)


def check_markdown(rows: list[dict], meta: dict, notes: list[str]) -> str:
    lines = [f"# warpforge correctness run, {meta.get('date', today())}", "", meta.get("banner", ""), ""]
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    lines += [markdown_table(rows, CHECK_COLUMNS), ""]
    return "\n".join(lines)


def write_results(out_dir: str | Path, rows: list[dict], meta: dict, notes: list[str]) -> list[Path]:
    """``results.json``, ``results.md`` and (with matplotlib) ``roofline.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    p = out / "results.json"
    p.write_text(json.dumps({**meta, "notes": notes, "summary": summary(rows), "rows": rows}, indent=1,
                            default=str))
    written.append(p)
    p = out / "results.md"
    p.write_text(results_markdown(rows, meta, notes))
    written.append(p)
    if have_matplotlib():
        p = out / "roofline.png"
        if roofline(rows, meta, p):
            written.append(p)
    return written


def write_check(out_dir: str | Path, rows: list[dict], meta: dict, notes: list[str]) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    a, b = out / "correctness.json", out / "correctness.md"
    a.write_text(json.dumps({**meta, "notes": notes, "rows": rows}, indent=1, default=str))
    b.write_text(check_markdown(rows, meta, notes))
    return [a, b]


# ----------------------------------------------------------------------------------------------
# Roofline
# ----------------------------------------------------------------------------------------------
def roofline(rows: list[dict], meta: dict, path: str | Path) -> bool:
    """Left: log-log roofline (arithmetic intensity vs achieved TFLOP/s) with the measured copy
    slope and bf16 GEMM flat, one marker per op x implementation at its headline shape. Right: %
    of the roof per op and mode, warpforge against the best peer. False when nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dt = summary_dtype(rows)
    head = [r for r in rows if r.get("headline") and r["dtype"] == dt and _ok(r) and r.get("bytes")]
    if not head:
        return False
    # one mode for the roofline: fwd when measured, else the first one present
    modes = list(dict.fromkeys(r["mode"] for r in head))
    mode = "fwd" if "fwd" in modes else modes[0]
    pts = [r for r in head if r["mode"] == mode]
    ceil = meta.get("ceilings") or {}
    copy = ceil.get("copy_gbps")
    flat = ceil.get("bf16_tflops")

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(16, 6.5), gridspec_kw={"width_ratios": [1.1, 1]})
    impls = list(dict.fromkeys(r["impl"] for r in pts))
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(impls)}
    xs = [r["flops"] / r["bytes"] for r in pts]
    lo, hi = min(xs) / 4, max(max(xs) * 4, 1e3)
    if copy and flat:
        ridge = flat * 1e3 / copy
        hi = max(hi, ridge * 4)
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(grid, [min(x * copy / 1e3, flat) for x in grid], color="black", lw=1.5,
                label=f"measured roof: copy {copy:,.0f} GB/s, bf16 GEMM {flat:,.0f} TFLOP/s")
    for r, x in zip(pts, xs):
        ax.scatter([x], [r["tflops"]], color=colours[r["impl"]], s=40, zorder=3,
                   marker="o" if r["kind"] == "ours" else "s")
        ax.annotate(r["op"], (x, r["tflops"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for name in impls:
        ax.scatter([], [], color=colours[name], label=name, marker="o" if name.startswith("warpforge") else "s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte, from the byte and FLOP models)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"roofline, {mode}, {dt}, headline shapes")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")

    bars = [s for s in summary(rows) if s["ours_pct"] is not None or s["peer_pct"] is not None]
    labels = [f"{s['op']}\n{s['mode']}" for s in bars]
    idx = range(len(bars))
    w = 0.4
    bx.bar([i - w / 2 for i in idx], [s["ours_pct"] or 0 for s in bars], w, label="warpforge", color="tab:blue")
    bx.bar([i + w / 2 for i in idx], [s["peer_pct"] or 0 for s in bars], w, label="best peer", color="tab:gray")
    for i, s in zip(idx, bars):
        if s["best_peer"]:
            bx.annotate(s["best_peer"], (i + w / 2, s["peer_pct"] or 0), fontsize=6, ha="center",
                        xytext=(0, 2), textcoords="offset points", rotation=90)
    bx.axhline(100, color="black", lw=1, ls="--")
    bx.set_xticks(list(idx))
    bx.set_xticklabels(labels, fontsize=6, rotation=90)
    bx.set_ylabel("% of the measured roof (copy bandwidth, or GEMM rate when compute-bound)")
    bx.set_title(f"% of roof, {dt}, headline shapes")
    bx.legend(fontsize=8)
    dev = (meta.get("device") or {}).get("name", "")
    fig.suptitle(f"warpforge bench {dev} {meta.get('date', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------------------------
# Progress bar
# ----------------------------------------------------------------------------------------------
class Progress:
    """Rich progress bar when rich is installed, else one line per case."""

    def __init__(self, title: str = "bench") -> None:
        self.title = title
        self._p = None
        self._task = None
        self.total = 0
        self.done = 0

    def start(self, total: int) -> None:
        self.total, self.done = total, 0
        if have_rich():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RP, TextColumn, TimeElapsedColumn

            self._p = RP(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), transient=False)
            self._p.start()
            self._task = self._p.add_task(self.title, total=total)

    def advance(self, what: str) -> None:
        # called as a case starts: show what runs now; the bar counts cases finished
        if self._p is not None:
            from rich.markup import escape

            self._p.update(self._task, completed=self.done, description=escape(f"{self.title}: {what}"))
        else:
            print(f"[{self.done + 1}/{self.total}] {what}", flush=True)
        self.done += 1

    def stop(self) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=self.done, description=self.title)
            self._p.stop()
            self._p = None

    def log(self, msg: str) -> None:
        if self._p is not None:
            self._p.console.print(msg, markup=False, highlight=False)
        else:
            print(msg, flush=True)
