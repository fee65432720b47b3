"""Launching a compiled Triton kernel without the JIT's per-call work.

``kernel[grid](*args, **constexprs)`` costs ~20-60 us of Python on every call: it binds the
arguments, computes a specialisation key from every argument (pointer alignment, integer
divisibility), hashes it and looks the compiled kernel up. For a GEMM of 16 x 4096 x 4096 that is
more than the ~18 us the GPU needs (H200, benchmarks/NOTES.md).

:class:`LaunchCache` keeps, per caller-chosen *plan key*, the compiled kernel the JIT returned on
the first launch, and launches it directly afterwards (what the JIT itself does last). The plan
key must pin everything the JIT would have specialised on: the caller includes the shapes and
strides (so integer arguments keep their divisibility), the dtypes, the constexprs and each
pointer's 16-byte alignment. Under the interpreter, or with ``WARPFORGE_JIT_LAUNCH=1``, every
launch goes through the JIT.
"""
from __future__ import annotations

import os

import torch
from triton import knobs
from triton.runtime.errors import OutOfResources

from . import fastpath, interpreting
from .device import device_info

try:                                           # griddepcontrol (sm_90+): programmatic dependent launch
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:                            # pragma: no cover - a Triton without it
    gdc_launch_dependents = gdc_wait = None

_BYPASS = os.environ.get("WARPFORGE_JIT_LAUNCH", "0") == "1"


def pdl_supported(t: torch.Tensor) -> bool:
    """Whether kernels on t's device can be launched as programmatic dependents of the launch
    before them (``launch_pdl``, waiting in ``gdc_wait``): an sm_90+ GPU, not the interpreter, and
    a Triton that has griddepcontrol. Each op keeps its own switch on top (ops/decode_attention.py,
    ops/moe.py)."""
    return (gdc_wait is not None and not interpreting() and t.is_cuda
            and device_info(t.device.index).capability[0] >= 9)


class LaunchCache:
    """Compiled kernels by plan key, for one ``@triton.jit`` function."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.plans: dict = {}

    def __call__(self, key, grid: tuple, args: tuple, constexprs: dict, *, num_warps: int, num_stages: int | None,
                 **options):
        """Launch ``kernel[grid](*args, **constexprs)`` and return the compiled kernel. ``args`` are
        the runtime arguments in signature order; the constexprs are the parameters after them.
        ``options``: further compile options (e.g. ``launch_pdl``), which the key must pin."""
        opts = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
        opts.update(options)
        if _BYPASS or interpreting() or key is None:
            return self.kernel[grid](*args, **constexprs, **opts)
        plan = self.plans.get(key)
        if plan is None:
            compiled = self.kernel[grid](*args, **constexprs, **opts)
            # the parameters after the runtime arguments, as the JIT bound them: a constexpr the
            # caller left out takes its default
            params = self.kernel.params[len(args):]
            plan = (compiled, tuple(constexprs[p.name] if p.name in constexprs else p.default for p in params))
            self.plans[key] = plan
            return compiled
        compiled, tail = plan
        launch(compiled, grid, (*args, *tail))
        return compiled

    def specialized(self, grid: tuple, args: tuple, constexprs: dict, *, num_warps: int, num_stages: int | None,
                    **options):
        """Launch with the plan key the JIT itself would use: :func:`spec_key` of the runtime
        arguments, the constexprs, the launch shape and the current device (the JIT compiles and
        loads a kernel per device), and ``options`` (as in :meth:`__call__`). ``num_stages=None``:
        the JIT's default."""
        key = None if _BYPASS or interpreting() else (
            torch._C._cuda_getDevice(), spec_key(args), tuple(constexprs.items()), num_warps, num_stages,
            tuple(sorted(options.items())))
        return self(key, grid, args, constexprs, num_warps=num_warps, num_stages=num_stages, **options)

    def get(self, key):
        """(compiled kernel, constexpr values) recorded for ``key``, or None."""
        return self.plans.get(key)


_CACHES: dict = {}


def run(kernel, grid: tuple, args: tuple, *, num_warps: int, num_stages: int | None = None, **constexprs) -> None:
    """``kernel[grid](*args, **constexprs, num_warps=...)`` without the JIT's per-call work after
    the first call of each specialisation (:meth:`LaunchCache.specialized`): what the row-wise and
    elementwise ops use, whose small calls are host-bound. Launches of the kernels the eager fast
    path knows are offered to it (runtime/fastpath.py)."""
    cache = _CACHES.get(kernel)
    if cache is None:
        cache = _CACHES[kernel] = LaunchCache(kernel)
    compiled = cache.specialized(grid, args, constexprs, num_warps=num_warps, num_stages=num_stages)
    if fastpath.ready and kernel.__name__ in fastpath.KERNELS:
        fastpath.offer(kernel, args, constexprs, num_warps, compiled)


def launch(compiled, grid: tuple, values: tuple) -> None:
    """What the JIT does last: run a compiled kernel on the current stream (``values``: every
    parameter in signature order, constexprs included)."""
    g0, g1, g2 = (*grid, 1, 1)[:3]
    # the raw handle straight from the C API: torch.cuda.current_stream() builds a Stream object
    # and resolves the device in Python, the largest host cost of a direct launch (H100 host,
    # decode at batch 1; benchmarks/NOTES.md)
    stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *values),
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)


class Desc:
    """A host-side TMA descriptor as the launcher reads it (base tensor, shape, strides, box),
    without ``TensorDescriptor``'s per-construction validation: the plan that builds these
    checked alignment and strides once, and pins them in its key."""
    __slots__ = ("base", "shape", "strides", "block_shape", "padding")

    def __init__(self, base, shape, strides, block_shape) -> None:
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, "zero"


class Ptr:
    """A device address as a launch reads a pointer argument (``data_ptr()``): a piece of a larger
    allocation passed without building a tensor view for it (~1 us of host time each). The
    allocation must be referenced until the launches that use it are enqueued; the caching
    allocator then reuses it in stream order, after them."""
    __slots__ = ("addr",)

    def __init__(self, addr: int) -> None:
        self.addr = addr

    def data_ptr(self) -> int:
        return self.addr


def shared_memory_limit(index: int | None = None) -> int:
    """Shared memory one block may use on the current CUDA device (or ``index``), in bytes: the
    limit Triton checks a compiled kernel against (227 KB on Hopper, 163 KB on an A100, 99 KB on
    sm_86/89 cards). The launch tiles are chosen on Hopper; :func:`launch_fitting` steps down from
    them where a kernel does not fit."""
    from triton.compiler import compiler
    return compiler.max_shared_mem(torch.cuda.current_device() if index is None else index)


# (device, kernel, config, key) -> (bytes needed, the device's limit): configs whose compiled kernel
# did not fit, found on their first launch and skipped after
_TOO_BIG: dict = {}


def _device() -> int:
    return torch.cuda.current_device() if torch.cuda.is_available() else -1


def launch_fitting(what: str, configs, launch_one, key=()):
    """``launch_one(cfg)`` for the first of ``configs`` (an iterable, best first: a generator's later
    configs are built only if needed) whose compiled kernel fits the device's shared memory per
    block, and its result. The tiles are chosen on Hopper (227 KB); on an A100 (163 KB) or an
    sm_86/89 card (99 KB) some do not fit, and Triton refuses them when the kernel loads, before
    anything runs (``OutOfResources``). Such a config is remembered per device, ``what`` and ``key``
    (a tuple of everything else that sizes the kernel's shared memory: head dim, dtype, switches;
    dicts in it are taken as their items) and skipped on later calls, so a step down costs its
    compiles once. ``what`` names the kernel in the error raised when none fits. Where nothing was
    ever refused (Hopper) the first config is launched with little else (under 1 us of host time)."""
    refused, frozen = [], None
    for cfg in configs:
        if _TOO_BIG:                     # something was refused before: skip what is known not to fit
            frozen = _frozen(key) if frozen is None else frozen
            seen = _TOO_BIG.get((_device(), what, cfg, frozen))
            if seen is not None:
                refused.append((cfg, *seen))
                continue
        try:
            return launch_one(cfg)
        except OutOfResources as e:
            if e.name != "shared memory":
                raise
            frozen = _frozen(key) if frozen is None else frozen
            _TOO_BIG[(_device(), what, cfg, frozen)] = (e.required, e.limit)
            refused.append((cfg, e.required, e.limit))
    tried = "; ".join(f"{cfg} needs {need:,} B" for cfg, need, _ in refused)
    limit = refused[-1][2] if refused else shared_memory_limit()
    raise RuntimeError(f"warpforge: {what}: no launch configuration fits this GPU's {limit:,} bytes of shared "
                       f"memory per block (tried {tried or 'none'})")


def _frozen(key: tuple) -> tuple:
    return tuple(tuple(k.items()) if isinstance(k, dict) else k for k in key)


def shared_memory_fallbacks() -> dict:
    """The configs :func:`launch_fitting` found too large on this process's devices, as
    ``{(device, kernel, config, key): (bytes needed, limit)}``: what a run on a GPU with less shared
    memory than Hopper stepped down from."""
    return dict(_TOO_BIG)


def aligned(*tensors) -> tuple[bool, ...]:
    """Each tensor's 16-byte alignment (part of every plan key: Triton specialises on it)."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


def spec_key(args: tuple) -> tuple:
    """What the JIT specialises a kernel's runtime arguments on, as a plan key: a tensor's dtype
    and 16-byte alignment; an integer's being 1, its divisibility by 16 and whether it needs 64
    bits; a float nothing; None as itself."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or a is None:
            key.append(a)
        elif isinstance(a, int):
            key.append((a == 1, a % 16 == 0, -2**31 <= a < 2**31))
        else:
            key.append(type(a))
    return tuple(key)
