"""Autotuning with an on-disk cache: the winner of a timed search, per device and shape bucket.

A kernel with a large configuration space (matrix multiply: tile, stages, warps, split) has a
heuristic default (``heuristics.py``) that every first call uses, and can be *tuned*: each
candidate is compiled and timed on the real operands and the fastest is kept. The winner is
stored in ``$WARPFORGE_CACHE/tuned-<device key>-triton<version>.json`` under a key that names the
kernel and a *bucket* of shapes (dimensions rounded up to powers of two), so that a second process
-- or a different shape in the same bucket -- reuses it without timing anything.

warpforge also ships the winners found on the GPUs it was measured on
(``runtime/tuned/tuned-<device key>-triton<version>.json``, written by ``warpforge bench`` runs and
copied in): on such a device the first call of a known shape bucket is already tuned. Entries in
the user's cache take precedence.

Tuning runs only when asked: ``WARPFORGE_AUTOTUNE=1`` in the environment, ``with tuning():`` in
code, or a variant that is the tuner by name (``matmul(..., variant="autotuned")``).
``warpforge bench`` turns it on, so its first warm-up call of each shape does the search; the timed
calls that follow reuse the stored winner.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import triton

from .device import cache_dir, device_info

_ENABLED = [os.environ.get("WARPFORGE_AUTOTUNE", "0") == "1"]
_LOCK = threading.Lock()
_TABLE: dict[str, dict] | None = None     # shipped winners overlaid by the user's
_USER: dict[str, dict] = {}                # the user's own cache file, as written


def enabled() -> bool:
    return _ENABLED[0]


@contextlib.contextmanager
def tuning(on: bool = True) -> Iterator[None]:
    """Turn tuning on (or off) inside the block."""
    old = _ENABLED[0]
    _ENABLED[0] = on
    try:
        yield
    finally:
        _ENABLED[0] = old


def bucket(x: int, lo: int = 16) -> int:
    """``x`` rounded up to a power of two, at least ``lo``."""
    return max(lo, triton.next_power_of_2(max(int(x), 1)))


def cache_path() -> Path:
    """The user's table for the current device (a "cpu" table where there is no CUDA device: the
    interpreter never tunes, but direct callers get a path rather than an error)."""
    try:
        dev = device_info().key
    except RuntimeError:
        dev = "cpu"
    return cache_dir() / f"tuned-{dev}-triton{triton.__version__}.json"


def shipped_path() -> Path:
    return Path(__file__).parent / "tuned" / cache_path().name


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _table() -> dict[str, dict]:
    global _TABLE, _USER
    if _TABLE is None:
        _USER = _read(cache_path())
        _TABLE = {**_read(shipped_path()), **_USER}
    return _TABLE


def lookup(key: str) -> dict | None:
    """The stored winner for ``key``, or None."""
    with _LOCK:
        return _table().get(key)


def store(key: str, value: dict) -> None:
    """Record a winner, in memory and on disk (written whole to a temporary file, then renamed,
    so a concurrent reader never sees half a file)."""
    with _LOCK:
        _table()[key] = value
        _USER[key] = value
        path = cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**_read(path), **_USER}, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass   # a read-only cache directory still tunes, it just does not remember


def forget() -> None:
    """Drop the in-memory table (tests; the file is read again on next use)."""
    global _TABLE, _USER
    with _LOCK:
        _TABLE, _USER = None, {}


def search(candidates: Sequence, run: Callable[[object], object], *, warmup_ms: int = 10, rep_ms: int = 40,
           rounds: int = 2):
    """Time ``run(candidate)`` for each candidate (median of CUDA-event timings) and return
    ``(best, {index: ms})``. A candidate that fails to compile or launch (too much shared memory,
    an unsupported shape) is skipped. The candidates are timed in ``rounds`` alternating rounds
    and each keeps its least median: an H100's clock drifts by a few percent over the seconds a
    search takes (power and heat on the large GEMMs), about the gaps between the leading
    candidates, and one pass in order would rank the drift."""
    from triton.testing import do_bench

    times: dict[int, float] = {}
    failed: set[int] = set()
    for _ in range(max(1, rounds)):
        for i, cand in enumerate(candidates):
            if i in failed:
                continue
            try:
                t = do_bench(lambda c=cand: run(c), warmup=warmup_ms, rep=rep_ms, return_mode="median")
            except Exception:  # noqa: BLE001 -- out of resources, a compile error: not a winner
                failed.add(i)
                times.pop(i, None)
                continue
            times[i] = min(t, times.get(i, t))
    if not times:
        raise RuntimeError("warpforge: autotuning found no candidate that runs")
    best = min(times, key=times.get)
    return candidates[best], times
