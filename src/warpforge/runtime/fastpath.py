"""The eager fast path: small row-op (and add, RoPE) calls issued from C++ (``csrc/fastpath.cpp``).

A decode-sized row op (1-64 rows) does a few microseconds of GPU work. Issued from Python -- argument
checks, allocations, a Triton launch, an ``autograd.Function`` whose backward the autograd engine
hands to a Python node -- it took 3-7x eager PyTorch's host time (benchmarks/NOTES.md, item 23). The
fast path does what eager PyTorch does: one pybind11 call per op that screens the arguments,
allocates, launches the *same* compiled Triton kernels with ``cuLaunchKernel``, and records a C++
autograd node whose backward launches the backward kernels the same way.

How the kernels get there: :func:`warpforge.runtime.launch.run` offers every launch of the kernels
the C++ side knows (:data:`KERNELS`) once the library is loaded. A call whose shape class was never
offered returns None from C++ and takes the Python path, which offers it; so the first call of each
shape class runs in Python and the later ones do not. Anything the fast path does not handle (a
non-contiguous input, ``dtype=``, an option it does not know, a bad argument) also takes the Python
path, which raises the clear errors.

Where it runs: eager calls on real CUDA tensors. Under ``torch.compile`` the public functions take
the registered operator (the check comes first), and ``WARPFORGE_EAGER_DISPATCH=1`` (registry's
``FAST_EAGER = False``) turns it off with the rest of the direct eager door.

Build: on the first eligible call, with ``torch.utils.cpp_extension`` (a C++ compiler, ninja, the
CUDA headers; no nvcc), about a minute once per machine, cached under ``$WARPFORGE_CACHE``
(``~/.cache/warpforge``); ``warpforge build`` builds it ahead of time. Set ``WARPFORGE_FASTPATH=0``
to never build or use it. Where it cannot be built the ops keep working through Python, and
:func:`status` says why.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import torch

from . import registry

CSRC = Path(__file__).parent / "csrc"
NAME = "warpforge_fastpath"

# kernels offered to the C++ side: the @triton.jit functions by name (filled at load)
KERNELS: frozenset = frozenset()
# the loaded module once usable, else None (the public functions test this first); before the
# first eligible call, a _Loader that loads it
lib = None
ready = False              # the module is loaded: launch.run offers kernels to it
_module = None             # the loaded module (lib may be set to None to bypass it; offers still go here)
_why: str | None = None   # why it is off, once known
_tried = False
_lock = threading.Lock()
_KINDS: dict = {}          # compiled kernel -> ABI kinds of its runtime arguments, or None


def disabled_reason() -> str | None:
    """Why the fast path cannot be used here (None: it can, and builds on first use)."""
    if os.environ.get("WARPFORGE_FASTPATH", "1") == "0":
        return "disabled by WARPFORGE_FASTPATH=0"
    from . import interpreting

    if interpreting():
        return "kernels run in the Triton interpreter"
    if torch.version.cuda is None or not torch.cuda.is_available():
        return "no CUDA device"
    return None


def status() -> str:
    if lib is not None:
        return "on"
    why = _why or disabled_reason()
    return f"off: {why}" if why else "not built yet (builds on the first eligible call; `warpforge build` now)"


def _cache_dir() -> Path:
    root = Path(os.environ.get("WARPFORGE_CACHE") or Path.home() / ".cache" / "warpforge")
    path = root / "fastpath" / f"torch{torch.__version__.split('+')[0]}-cu{torch.version.cuda}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fallbacks() -> dict:
    """The backward operators the C++ nodes call for a shape whose kernel was never offered, and
    under create_graph: through the registry, which (grad mode on, an input requiring grad) gives
    the output the operator's node -- one that raises on a second backward, or RoPE's, which is
    differentiable -- rather than a constant."""
    from ..ops import activations, norms, reduce, rope, softmax

    gelu = {v: k for k, v in activations._GELU_MODES.items()}

    def glu_bwd(gate, up, dy, act):
        if act == activations.SILU:
            return activations.swiglu_backward_op(gate, up, dy)
        return activations.geglu_backward_op(gate, up, dy, gelu[act])

    return {
        "glu_bwd": glu_bwd,
        "amax_bwd": reduce.amax_backward_op,
        "softmax_bwd": softmax.softmax_backward_op,
        "rms_norm_bwd": norms.rms_norm_backward_op,
        # the node passes the bias itself (or None): the operator takes its dtype
        "layer_norm_bwd": lambda dy, x, w, mean, rstd, b: norms.layer_norm_backward_op(
            dy, x, w, mean, rstd, None if b is None else b.dtype),
        "add_rms_norm_bwd": norms.add_rms_norm_backward_op,
        "rope_bwd": rope.rope_backward_op,
    }


def load(verbose: bool = False) -> bool:
    """Build (once per machine) and load the fast path; True if it is on. Failures are reported
    once on stderr and leave it off."""
    global lib, KERNELS, ready, _module, _why, _tried
    with _lock:
        if _tried:
            return lib is not None
        _tried = True
        why = disabled_reason()
        if why is not None:
            _why = why
            return False
        try:
            from torch.utils import cpp_extension

            from . import POISON
            from .device import device_info, sm_count
            from .heuristics import (NORM_LOOP_ROWS_PER_SM, REDUCE_LOOP_ROWS_PER_SM, norm_loop_max_n, norm_loop_min_n,
                                     reduce_loop_min_n, softmax_loop_range)
            from ..ops.norms import GRAD_SUM_MAX

            mod = cpp_extension.load(
                name=NAME, sources=[str(CSRC / "fastpath.cpp")], extra_cflags=["-O3"], with_cuda=True,
                build_directory=str(_cache_dir()), is_python_module=True,
                verbose=verbose or bool(os.environ.get("WARPFORGE_BUILD_VERBOSE")))
            mod.init(sm_count(), GRAD_SUM_MAX, POISON, _fallbacks(), REDUCE_LOOP_ROWS_PER_SM * sm_count(),
                     reduce_loop_min_n(device_info().name),
                     NORM_LOOP_ROWS_PER_SM * sm_count(), norm_loop_min_n(device_info().name),
                     norm_loop_max_n(device_info().name), *softmax_loop_range(device_info().name))
        except Exception as e:  # noqa: BLE001 -- no compiler, no ninja, no headers: stay on Python
            _why = f"build failed ({type(e).__name__}: {e}); build directory {_cache_dir()}"
            print(f"warpforge: the eager fast path is off: {_why}", file=sys.stderr)
            return False
        KERNELS = frozenset(mod.kernel_names())
        lib = _module = mod
        ready = True
        return True


class _Loader:
    """What :data:`lib` holds before the first eligible call: any op loads the library (building
    it if needed) and answers None, so that call takes the Python path."""

    def __getattr__(self, name):
        load()
        if lib is None or isinstance(lib, _Loader):
            globals()["lib"] = None
        return lambda *args, **kwargs: None


if disabled_reason() is None:
    lib = _Loader()


def door(t):
    """The fast path to try for an eager call whose first tensor is ``t`` (the module, or before
    the first such call the loader), or None: it is off, or the call does not take the eager
    door (registry.eager_door: compiling, a tensor subclass, WARPFORGE_EAGER_DISPATCH=1)."""
    return lib if lib is not None and registry.eager_door(t) else None


def offer(kernel, args: tuple, constexprs: dict, num_warps: int, compiled) -> None:
    """Record a Python-path launch of one of :data:`KERNELS` with the C++ side (launch.run calls
    this after launching)."""
    kinds = _KINDS.get(compiled, False)
    if kinds is False:
        kinds = _KINDS[compiled] = _abi_kinds(compiled, len(args))
    if kinds is None:
        return
    _module.offer(kernel.__name__, torch._C._cuda_getDevice(), args, constexprs, num_warps * 32,
              compiled.metadata.shared, kinds, compiled.function)


def _abi_kinds(compiled, n_args: int) -> str | None:
    """Each runtime argument's ABI kind from the compiled signature ('p' pointer, 'i' int32, 'l'
    int64, 'f' fp32, 'x' specialised away), or None for a kernel the C++ launcher cannot take
    (scratch memory, clusters, cooperative or PDL launches, other argument types)."""
    md = compiled.metadata
    if (md.global_scratch_size or md.profile_scratch_size or md.num_ctas != 1
            or md.launch_cooperative_grid or md.launch_pdl or compiled.function is None):
        return None
    kinds = []
    for ty in list(compiled.src.signature.values())[:n_args]:
        k = "p" if ty.startswith("*") else {"i32": "i", "i64": "l", "fp32": "f", "constexpr": "x"}.get(ty)
        if k is None:
            return None
        kinds.append(k)
    return "".join(kinds)
