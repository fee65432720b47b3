"""How one callable is timed on a GPU (METHOD.md in short).

- ``device_ms``: CUDA events around the calls, a warm-up, many repetitions, the *median* (not the
  mean: one slow outlier from a clock change or another process would move a mean by more than the
  differences we care about). Two conditions, picked by how many bytes the call moves (its byte
  model), so that no call is charged memory traffic that is not its own:

  * ``steady`` -- calls that move at least 4x the L2 (every bar shape of the memory-bound ops): back-
    to-back calls with no flush, a batch between two events, the median of the batches' per-call
    means. These are the copy ceiling's own conditions (``runtime/device.py`` times back-to-back
    copies): each call writes back the dirty lines its predecessor left, which for the same op are
    its own, and a working set of >= 4 L2s streams through the cache without reuse. A GPU sleep
    ahead of each batch lets the host queue the whole batch first, so host time per call never
    opens gaps between the calls (what ``device_ms`` measures is GPU time).
  * ``clean`` -- smaller calls, one at a time, each after a flush that leaves the L2 holding only
    *clean* lines of an unrelated buffer (a 256 MB memset, then a read pass over twice the L2): the
    call's inputs come from DRAM and it writes back nothing it did not write. A GPU sleep between
    the flush and the first event covers the call's host time (a small forward+backward spends
    100+ us in autograd, longer than the flush), so here too the events bracket GPU work alone.
    The decode-like (small) cases' few-microsecond calls have a second mode: the median of 1,000
    calls of one kernel read ~4.3 us in one measurement and ~5.3 us in the next, the same kernel
    through two host paths 1.1 us apart (H200, 2026-11-27, benchmarks/probe_small_rounds.py), while
    each measurement's own samples sat within ~0.3 us (p10-p90). So the runner times a small case's
    implementations in ``small_rounds`` alternating rounds of ``clean_calls / small_rounds`` calls
    each (the same number of calls in all) and keeps each one's least round (``runner._device_rounds``).

  Why not ``triton.testing.do_bench``'s flush (a 256 MB memset before each call, which this module
  used until 2026-11-22): the memset's last ~L2 of writes is still dirty when the call starts, so the
  call's misses write it back. ncu on the H100 (2026-11-22, `benchmarks/probe_flush.py`): a 512 x
  262,144 bf16 row sum -- a kernel that writes 1 KB -- wrote 24 MB of DRAM and took 99 us after the
  memset, 0.2 MB and 90 us after a clean flush. That charged read-heavy kernels ~10% against the
  copy ceiling (write-heavy ones pay about what they leave behind, so they were not). Rows timed
  that way carry ``timing: memset`` in merged reports.
- ``host_us``: what a decode loop feels. 200 back-to-back calls, one synchronize, wall clock per
  call. Below ~20 us of GPU work per call, Python and dispatcher overhead is the cost, and this is
  the number that shows it; ``device_ms`` hides it because events bracket only the GPU work. The
  bench times a small case's implementations in 5 alternating rounds and keeps each one's least
  (``runner._host_times``): the host's noise only adds time, and single loops varied +-30% from
  run to run.

- ``extra_gib``: the peak device memory one call adds above what is allocated before it (its
  outputs, gradients and workspace count; the inputs, already there, do not).

Nothing here runs without CUDA; the correctness run on CPU times with :func:`wall_ms` only.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimingConfig:
    warmup_ms: float = 25.0   # warm-up budget, milliseconds of GPU time
    rep_ms: float = 100.0     # measurement budget, milliseconds of GPU time
    warm_calls: int = 3       # explicit calls before timing: JIT/compile, autotune, allocator
    host_calls: int = 200     # back-to-back calls for host_us
    host_rounds: int = 5      # alternating host_us rounds over a small case's implementations (runner)
    small_rounds: int = 5     # alternating device-time rounds over a small case's implementations (runner)
    clean_calls: int = 1000   # most single calls one ``clean`` measurement times

    @classmethod
    def quick(cls) -> "TimingConfig":
        return cls(warmup_ms=10.0, rep_ms=40.0, warm_calls=2, host_calls=200, host_rounds=5, small_rounds=5)


def warm(fn: Callable[[], object], calls: int) -> None:
    """Run ``fn`` a few times and wait: Triton JIT, torch.compile and autotuning happen here,
    outside every measurement."""
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()


STEADY_L2_MULTIPLE = 4        # calls moving >= this many L2s are timed back to back (``steady``)
STEADY_BATCH_MS = 2.0         # GPU time of one steady batch (between its two events)


def method(nbytes: int | None) -> str | None:
    """The timing condition :func:`device_ms` uses for a call that moves ``nbytes`` ("steady" or
    "clean"); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return "steady" if nbytes and l2 and nbytes >= STEADY_L2_MULTIPLE * l2 else "clean"


_FLUSH: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_CYCLES_PER_MS: dict[int, float] = {}


def flush_l2() -> None:
    """Leave the L2 holding only clean lines of a buffer no timed call touches: a 256 MB memset
    evicts whatever the last call left, then a read pass over twice the L2 writes the memset's dirty
    lines back (here, not inside the next timed call)."""
    dev = torch.cuda.current_device()
    if dev not in _FLUSH:
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size
        wipe = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
        src = torch.ones(max(2 * l2, 64 * 2**20) // 4, dtype=torch.float32, device="cuda")
        _FLUSH[dev] = (wipe, src)
    wipe, src = _FLUSH[dev]
    wipe.zero_()
    src.sum()


def _events(n: int) -> list:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def _cycles_per_ms() -> float:
    """GPU clock cycles a millisecond, as ``torch.cuda._sleep`` counts them (measured once)."""
    dev = torch.cuda.current_device()
    if dev not in _CYCLES_PER_MS:
        cycles = 2_000_000
        torch.cuda._sleep(cycles)   # first launch outside the measurement
        s, e = _events(2)
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS[dev] = cycles / max(s.elapsed_time(e), 1e-3)
    return _CYCLES_PER_MS[dev]


def _estimate_ms(fn: Callable[[], object]) -> float:
    """GPU ms a call, from five back-to-back calls (after one flush)."""
    flush_l2()
    s, e = _events(2)
    s.record()
    for _ in range(5):
        fn()
    e.record()
    torch.cuda.synchronize()
    return max(s.elapsed_time(e) / 5, 1e-4)


def _warm_calls(cfg: "TimingConfig", est: float) -> int:
    return min(max(1, int(cfg.warmup_ms / est)), 1000)


def _host_ms(fn: Callable[[], object]) -> float:
    """Host milliseconds to issue one call (three calls after a synchronize; their GPU work runs
    behind)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    return (time.perf_counter() - t0) / 3 * 1e3


def _cover(host_ms: float) -> int:
    """GPU sleep cycles ahead of a timed call or batch that let the host queue all of its work
    first (1.5x its issue time and 50 us, at most 50 ms): the events then bracket GPU work, not
    gaps the host leaves."""
    return int(min(1.5 * host_ms + 0.05, 50.0) * _cycles_per_ms())


def _clean_ms(fn: Callable[[], object], cfg: "TimingConfig", est: float) -> float:
    for _ in range(_warm_calls(cfg, est)):
        fn()
    # A small call's host time (a forward+backward through autograd: 100+ us) can outlast the flush,
    # and the GPU would then sit between the events waiting for kernels the host has not issued yet.
    sleep = _cover(_host_ms(fn))
    n = min(max(int(cfg.rep_ms / est), 10), cfg.clean_calls)
    start, end = _events(n), _events(n)
    for i in range(n):
        flush_l2()
        torch.cuda._sleep(sleep)
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def _steady_ms(fn: Callable[[], object], cfg: "TimingConfig", est: float) -> float:
    batch = min(max(math.ceil(STEADY_BATCH_MS / est), 4), 64)
    n = min(max(int(cfg.rep_ms / (batch * est)), 5), 100)
    for _ in range(_warm_calls(cfg, est)):
        fn()
    # Enough GPU sleep before each batch for the host to queue all of it: no gaps inside a batch.
    sleep = _cover(batch * _host_ms(fn))
    start, end = _events(n), _events(n)
    torch.cuda.synchronize()
    for i in range(n):
        torch.cuda._sleep(sleep)
        start[i].record()
        for _ in range(batch):
            fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / batch for s, e in zip(start, end))


def device_ms(fn: Callable[[], object], cfg: TimingConfig, nbytes: int | None = None) -> float:
    """Median GPU time of one call of ``fn``, milliseconds, under the condition :func:`method`
    picks for a call moving ``nbytes`` (module docstring)."""
    est = _estimate_ms(fn)
    if method(nbytes) == "steady":
        return _steady_ms(fn, cfg, est)
    return _clean_ms(fn, cfg, est)


def host_us(fn: Callable[[], object], calls: int = 200, warmup: int = 1, include_device: bool = True) -> float:
    """Wall-clock microseconds per call of ``calls`` back-to-back calls. With ``include_device``
    the clock stops after one final synchronize (what a loop of such calls costs end to end);
    without, before it (the host's issue time alone, however long the GPU work takes)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if include_device:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / calls * 1e6


def extra_gib(fn: Callable[[], object]) -> float:
    """GiB of device memory one call of ``fn`` adds at its peak over what was allocated before it,
    with everything it returns still held (the outputs and gradients a caller would keep)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return (peak - base) / 2**30


def wall_ms(fn: Callable[[], object]) -> tuple[object, float]:
    """Result and wall-clock milliseconds of one call (the interpreter's time on CPU)."""
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3
