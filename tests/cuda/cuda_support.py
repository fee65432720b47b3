"""Helpers shared by tests/cuda (not a test module: pytest collects test_*.py only): the set-up of
the modules that run the built backend, finding the CUDA tools, and a Python mirror of the
launch-shape checks in csrc/softmax.cu."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import warpforge.cuda as wcuda


# ----------------------------------------------------------------------------------------------
# The modules that run the built backend: ``pytestmark = BACKEND_MARKS`` and the two autouse
# fixtures imported by name (a fixture imported into a test module applies to that module only)
# ----------------------------------------------------------------------------------------------
BACKEND_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not wcuda.available(),
                       reason=f"the CUDA C++ backend cannot run here: {wcuda.unavailable_reason()}"),
]
DEV = torch.device("cuda")
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="thread-block clusters and bulk copies need sm_90")


@pytest.fixture(scope="module", autouse=True)
def built():
    """Build (or load from the cache) the extension once for the module."""
    try:
        wcuda.load()
    except wcuda.CudaBackendUnavailable as e:
        pytest.fail(f"warpforge.cuda.available() is True but the backend does not load: {e}", pytrace=False)
    return wcuda.ops()


@pytest.fixture(autouse=True)
def _synchronize_after_test():
    yield
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------
# Finding the tools
# ----------------------------------------------------------------------------------------------
def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME / $CUDA_PATH, else PATH, else /usr/local/cuda."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def cuda_include_dir(nvcc: str | None) -> str | None:
    """The CUDA toolkit's include directory (the one holding cuda_runtime.h). ``dirname(nvcc)/../include``
    first; nvcc on PATH may be a wrapper script (e.g. /usr/local/bin/nvcc exec-ing the real one), so
    also the resolved path and the toolkit root that ``nvcc --dryrun`` reports (``#$ TOP=...``)."""
    candidates = []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if root:
            candidates.append(Path(root) / "include")
    if nvcc:
        candidates += [Path(nvcc).parent.parent / "include", Path(nvcc).resolve().parent.parent / "include"]
        try:
            dry = subprocess.run([nvcc, "--dryrun", "-c", "x.cu"], check=False, capture_output=True, text=True,
                                 timeout=60)
            for line in (dry.stdout + dry.stderr).splitlines():
                m = re.match(r"#\$ TOP=(.+)$", line.strip())
                if m:
                    candidates.append(Path(m.group(1).strip()) / "include")
        except (OSError, subprocess.SubprocessError):
            pass
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda_runtime.h").is_file():
            return str(c.resolve())
    return None


def find_compute_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else next to nvcc ($CUDA_HOME/bin, /usr/local/cuda/bin)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    nvcc = find_nvcc()
    for d in ([Path(nvcc).parent, Path(nvcc).resolve().parent] if nvcc else []) + [Path("/usr/local/cuda/bin")]:
        if (d / "compute-sanitizer").is_file():
            return str(d / "compute-sanitizer")
    return None


# ----------------------------------------------------------------------------------------------
# softmax launch shapes
# ----------------------------------------------------------------------------------------------
def softmax_config_ok(cfg, n: int, elem_size: int, backward: bool) -> str | None:
    """Why softmax.cu would refuse ``cfg`` for rows of ``n`` elements (None: it runs). Mirrors
    config_ok(), capacity() and the backward's 512-thread limit in softmax.cu."""
    if not (isinstance(cfg, list) and len(cfg) == 4 and all(isinstance(v, int) for v in cfg)):
        return f"not a list of 4 ints: {cfg!r}"
    threads, vpt, cluster, rows = cfg
    if threads < 32 or threads > 1024 or threads % 32:
        return "threads must be a multiple of 32 in [32, 1024]"
    if cluster not in (1, 2, 4, 8, 16):
        return "cluster must be 1, 2, 4, 8 or 16"
    if vpt not in (0, 1, 2, 4):
        return "vectors per thread must be 0, 1, 2 or 4"
    if rows < 1:
        return "rows per block must be >= 1"
    if vpt == 0:
        return None if cluster == 1 and rows == 1 else "the looped shape (vpt 0) takes cluster 1, 1 row per block"
    if rows > 1 and not (threads == 32 and cluster == 1 and rows <= 32):
        return "several rows per block only for the warp-per-row shape (32 threads, cluster 1, <= 32 rows)"
    if threads * vpt * cluster * (16 // elem_size) < n:
        return f"capacity {threads * vpt * cluster * (16 // elem_size)} < n = {n}"
    if backward and elem_size == 2 and vpt == 4 and rows == 1 and threads > 512:
        return "the 16-bit backward at 4 vectors per thread is limited to 512 threads"
    return None
