"""The CUDA C++ backend: hand-written kernels (``csrc/*.cu``) as real PyTorch operators,
``torch.ops.warpforge_cuda.*``, selected with ``backend="cuda"`` in the public functions.

Build. The sources are compiled on first use with ``torch.utils.cpp_extension`` (nvcc + ninja) for
the current device's architecture (``sm_90`` on Hopper) into a per-(PyTorch, CUDA, architecture)
cache directory (``$WARPFORGE_CACHE/cuda`` or ``~/.cache/warpforge/cuda``): the first call takes
about a minute, later processes load the cached library in milliseconds, and an edited source is
rebuilt. ``warpforge build-cuda`` builds ahead of time. Only ``ops.cpp`` includes PyTorch's headers;
the kernels see raw pointers through ``launch.h``, so they compile fast and CI can compile them
with nvcc on a machine without a GPU or a CUDA PyTorch.

Where the backend cannot work -- PyTorch built without CUDA, no GPU, no nvcc, no ninja --
:func:`available` is False, :func:`unavailable_reason` says why, ``backend="cuda"`` raises
:class:`CudaBackendUnavailable` with that reason, and everything else keeps working.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("ops.cpp", "add.cu", "reduce.cu", "softmax.cu", "matmul.cu", "mma_tma.cu", "norm.cu")
NAMESPACE = "warpforge_cuda"

_loaded = False


class CudaBackendUnavailable(RuntimeError):
    """The CUDA C++ backend cannot run here (the message says why)."""


def _nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


@functools.cache
def unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run on this machine, or None when it can (it may still have to
    be built: :func:`load`)."""
    if torch.version.cuda is None:
        return "PyTorch was built without CUDA (torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    if _nvcc() is None:
        return "no CUDA compiler: nvcc is not on PATH and CUDA_HOME is not set"
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401
        except ImportError:
            return "ninja is not installed (pip install ninja): torch.utils.cpp_extension needs it to build"
    return None


def available() -> bool:
    """Whether ``backend="cuda"`` can be used here (it builds on first use)."""
    return _loaded or unavailable_reason() is None


def cache_dir() -> Path:
    root = Path(os.environ.get("WARPFORGE_CACHE") or Path.home() / ".cache" / "warpforge")
    major, minor = torch.cuda.get_device_capability()
    tag = f"torch{torch.__version__.split('+')[0]}-cu{torch.version.cuda}-sm{major}{minor}"
    path = root / "cuda" / tag
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_flags() -> tuple[list[str], list[str]]:
    """(C++ flags, nvcc flags). -lineinfo maps SASS back to source for ncu and compute-sanitizer
    at no cost in speed; -Xptxas -warn-spills makes a spill in any kernel visible in the build log."""
    return ["-O3"], ["-O3", "-lineinfo", "-Xptxas", "-warn-spills"]


def load(verbose: bool | None = None) -> None:
    """Build (once per machine, cached) and load the CUDA operators; register their fake
    implementations and autograd. Raises :class:`CudaBackendUnavailable` where they cannot run."""
    global _loaded
    if _loaded:
        return
    why = unavailable_reason()
    if why is not None:
        raise CudaBackendUnavailable(f"warpforge: the CUDA backend is unavailable: {why}")
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    old_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"   # this device only: one cubin, no PTX JIT
    cflags, cuda_flags = build_flags()
    try:
        cpp_extension.load(
            name="warpforge_cuda",
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=cflags,
            extra_cuda_cflags=cuda_flags,
            extra_include_paths=[str(CSRC)],
            build_directory=str(cache_dir()),
            is_python_module=False,
            verbose=bool(verbose if verbose is not None else os.environ.get("WARPFORGE_BUILD_VERBOSE")),
        )
    except Exception as e:  # noqa: BLE001 -- a compiler failure: say where the log is
        raise CudaBackendUnavailable(
            f"warpforge: building the CUDA backend failed ({type(e).__name__}: {e}); build directory "
            f"{cache_dir()}; set WARPFORGE_BUILD_VERBOSE=1 for the compiler's output") from e
    finally:
        if old_arch is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old_arch
    from . import _register

    _register.register()
    _loaded = True


def ops():
    """``torch.ops.warpforge_cuda``, loading the library first if needed. Under torch.compile the
    library must already be loaded (call :func:`load` once before compiling)."""
    if not _loaded and not torch.compiler.is_compiling():
        load()
    return getattr(torch.ops, NAMESPACE)
