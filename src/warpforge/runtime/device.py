"""Device facts and *measured* ceilings.

The roofline of every benchmark row is drawn from two numbers measured on the device itself, not
from a datasheet: device-to-device copy bandwidth (bytes read + bytes written per second, the
ceiling of every memory-bound op) and the cuBLAS bf16/fp16 GEMM rate (the ceiling of matrix work).
They take a few seconds to measure, so they are cached per device (name, SM count, memory size)
and PyTorch/CUDA version in ``$WARPFORGE_CACHE`` (default ``~/.cache/warpforge``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from pathlib import Path

import torch


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    name: str
    sm_count: int
    l2_bytes: int
    capability: tuple[int, int]
    memory_bytes: int
    smem_per_sm: int = 0
    regs_per_sm: int = 65536
    dram_bytes_per_s: float = 0.0    # the datasheet peak (memory clock x bus width, double data rate); 0: unknown

    @property
    def key(self) -> str:
        safe = "".join(c if c.isalnum() else "-" for c in self.name).strip("-")
        return f"{safe}-sm{self.capability[0]}{self.capability[1]}-{self.sm_count}sm-{self.memory_bytes >> 30}g"


@functools.lru_cache(maxsize=None)
def device_info(index: int | None = None) -> DeviceInfo:
    """Facts about CUDA device ``index`` (current device by default)."""
    if not torch.cuda.is_available():
        raise RuntimeError("warpforge: no CUDA device is available")
    index = torch.cuda.current_device() if index is None else index
    p = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        name=p.name,
        sm_count=p.multi_processor_count,
        l2_bytes=int(getattr(p, "L2_cache_size", 0)),
        capability=(p.major, p.minor),
        memory_bytes=p.total_memory,
        smem_per_sm=int(getattr(p, "shared_memory_per_multiprocessor", 0)),
        regs_per_sm=int(getattr(p, "regs_per_multiprocessor", 65536)),
        dram_bytes_per_s=2.0 * getattr(p, "memory_clock_rate", 0) * 1e3 * getattr(p, "memory_bus_width", 0) / 8,
    )


def device_name(t: torch.Tensor) -> str:
    """The name of t's GPU, which picks device-specific launch routes; "" off the GPU."""
    return device_info(t.device.index).name if t.is_cuda else ""


@functools.lru_cache(maxsize=None)
def sm_count(index: int | None = None) -> int:
    """Multiprocessor count; a stand-in of 4 under the interpreter (it runs programs one by one)."""
    if not torch.cuda.is_available():
        return 4
    return device_info(index).sm_count


_H100_DRAM_BYTES_PER_S = 3.35e12


@functools.lru_cache(maxsize=None)
def dram_bandwidth(index: int | None = None) -> float:
    """The DRAM's peak bytes a second from the device's properties (a launch heuristic's input,
    never a ceiling: those are measured); an H100 SXM's where the properties lack it."""
    peak = device_info(index).dram_bytes_per_s if torch.cuda.is_available() else 0.0
    return peak or _H100_DRAM_BYTES_PER_S


def cache_dir() -> Path:
    return Path(os.environ.get("WARPFORGE_CACHE", Path.home() / ".cache" / "warpforge"))


def _median_ms(fn, reps: int) -> float:
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    fn()
    torch.cuda.synchronize()
    for i in range(reps):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return times[len(times) // 2]


def measure_copy_bandwidth(nbytes: int = 1 << 30, reps: int = 30) -> float:
    """Device-to-device copy, GB/s counting bytes read plus bytes written (1 GiB each way by
    default: 20x the L2 of an H100, so the cache cannot help)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), reps)
    return 2 * nbytes / ms / 1e6


def measure_gemm_tflops(dtype: torch.dtype, n: int = 8192, reps: int = 20) -> float:
    """cuBLAS (torch.matmul) n x n x n on random data, TFLOP/s. Random, not zeros: zeros run
    faster than real data on Hopper tensor cores."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    ms = _median_ms(lambda: a @ b, reps)
    return 2 * n**3 / ms / 1e9


@functools.lru_cache(maxsize=None)
def ceilings(refresh: bool = False) -> dict:
    """Measured ceilings of the current device, cached on disk. Keys: copy_gbps, bf16_tflops,
    fp16_tflops, measured_at, device, torch."""
    info = device_info()
    path = cache_dir() / f"ceilings-{info.key}-torch{torch.__version__.split('+')[0]}.json"
    if path.exists() and not refresh:
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    result = {
        "device": info.name,
        "torch": torch.__version__,
        "copy_gbps": measure_copy_bandwidth(),
        "bf16_tflops": measure_gemm_tflops(torch.bfloat16),
        "fp16_tflops": measure_gemm_tflops(torch.float16),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
    except OSError:
        pass  # a read-only home still gets the numbers, just not the cache
    return result
