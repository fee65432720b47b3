"""How one callable is timed on a GPU (METHOD.md in short).

- ``device_ms``: ``triton.testing.do_bench`` -- CUDA events around each call, a warm-up, many
  repetitions, the L2 cache overwritten before each one, and the *median* (not the mean: one slow
  outlier from a clock change or another process would move a mean by more than the differences
  we care about).
- ``host_us``: what a decode loop feels. 200 back-to-back calls, one synchronize, wall clock per
  call. Below ~20 us of GPU work per call, Python and dispatcher overhead is the cost, and this is
  the number that shows it; ``device_ms`` hides it because events bracket only the GPU work.

- ``extra_gib``: the peak device memory one call adds above what is allocated before it (its
  outputs, gradients and workspace count; the inputs, already there, do not).

Nothing here runs without CUDA; the correctness run on CPU times with :func:`wall_ms` only.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimingConfig:
    warmup_ms: float = 25.0   # do_bench warm-up budget, milliseconds of GPU time
    rep_ms: float = 100.0     # do_bench measurement budget, milliseconds of GPU time
    warm_calls: int = 3       # explicit calls before timing: JIT/compile, autotune, allocator
    host_calls: int = 200     # back-to-back calls for host_us

    @classmethod
    def quick(cls) -> "TimingConfig":
        return cls(warmup_ms=10.0, rep_ms=40.0, warm_calls=2, host_calls=200)


def warm(fn: Callable[[], object], calls: int) -> None:
    """Run ``fn`` a few times and wait: Triton JIT, torch.compile and autotuning happen here,
    outside every measurement."""
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()


def device_ms(fn: Callable[[], object], cfg: TimingConfig) -> float:
    """Median GPU time of one call of ``fn``, milliseconds, L2 flushed between calls."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=cfg.warmup_ms, rep=cfg.rep_ms, return_mode="median"))


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
