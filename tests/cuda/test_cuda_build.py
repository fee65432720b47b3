"""The CUDA C++ backend on a machine without a GPU (what CPU CI runs).

* Every kernel source (the ``.cu`` files of ``warpforge.cuda.SOURCES``) compiles with nvcc for
  ``sm_90``, and ptxas reports 0 bytes of spill stores and spill loads for every kernel.
* ``ops.cpp`` (the only translation unit that sees PyTorch) passes ``g++ -fsyntax-only`` against
  the installed torch's headers; the kernel side (``launch.h``, ``common.cuh``, ``*.cu``) includes
  no PyTorch header at all.
* Without a CUDA PyTorch, ``backend="cuda"`` raises :class:`warpforge.cuda.CudaBackendUnavailable`
  with the reason, and everything else keeps working.
* ``cuda_softmax_config`` returns launch shapes the kernels accept for every row length.

The GPU tests of the same backend are in test_cuda_ops.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import warpforge as wf
import warpforge.cuda as wcuda
from warpforge.runtime.heuristics import cuda_softmax_config
from conftest import DEVICE, assert_close
from cuda_support import cuda_include_dir, find_nvcc, softmax_config_ok

CSRC = Path(wcuda.CSRC)
KERNEL_SOURCES = tuple(s for s in wcuda.SOURCES if s.endswith(".cu"))
ARCH_FLAGS = ["-gencode=arch=compute_90,code=sm_90"]
NVCC_FLAGS = ["-std=c++17", "-O3", *ARCH_FLAGS, "-Xptxas", "-v"]
COMPILE_TIMEOUT_S = 900

NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (not on PATH, no $CUDA_HOME/bin/nvcc, "
                                                     "no /usr/local/cuda/bin/nvcc): cannot compile the kernels")


# ----------------------------------------------------------------------------------------------
# nvcc + ptxas -v for every kernel source, once per module, in parallel
# ----------------------------------------------------------------------------------------------
@dataclass
class KernelInfo:
    registers: int | None = None
    stack: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    entry: bool = False


@dataclass
class CompileResult:
    source: str
    cmd: list[str]
    returncode: int
    log: str
    seconds: float = 0.0
    kernels: dict[str, KernelInfo] = field(default_factory=dict)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> dict[str, KernelInfo]:
    """Per function: registers (entry functions), stack frame, spill stores, spill loads, from the
    ``-Xptxas -v`` report. Non-entry functions (device functions ptxas kept as calls) are included:
    a spill there is a spill of the kernel calling it."""
    kernels: dict[str, KernelInfo] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            kernels.setdefault(entry, KernelInfo()).entry = True
        elif m := _PROPS.search(line):
            props = m.group(1)
            kernels.setdefault(props, KernelInfo())
        elif (m := _SPILL.search(line)) and props is not None:
            k = kernels[props]
            k.stack, k.spill_stores, k.spill_loads = (int(g) for g in m.groups())
        elif (m := _REGS.search(line)) and entry is not None:
            kernels[entry].registers = int(m.group(1))
    return kernels


def demangle(names) -> dict[str, str]:
    """Readable kernel names through c++filt where it exists (else the mangled ones)."""
    names = list(names)
    cxxfilt = shutil.which("c++filt")
    if not names or cxxfilt is None:
        return {n: n for n in names}
    try:
        out = subprocess.run([cxxfilt], input="\n".join(names), check=False, capture_output=True, text=True,
                             timeout=60).stdout
        pretty = out.splitlines()
        if len(pretty) == len(names):
            return dict(zip(names, pretty))
    except (OSError, subprocess.SubprocessError):
        pass
    return {n: n for n in names}


def kernel_table(result: CompileResult, only=None) -> str:
    names = sorted(only if only is not None else result.kernels)
    pretty = demangle(names)
    rows = []
    for n in names:
        k = result.kernels[n]
        rows.append(f"  regs {k.registers if k.registers is not None else '-':>4}  stack {k.stack}  "
                    f"spill stores {k.spill_stores}  spill loads {k.spill_loads}  {pretty[n]}")
    return "\n".join(rows)


def compile_source(nvcc: str, source: str, out_dir: Path) -> CompileResult:
    obj = out_dir / (Path(source).stem + ".o")
    cmd = [nvcc, *NVCC_FLAGS, "-c", str(CSRC / source), "-o", str(obj), "-I", str(CSRC)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = -1, f"nvcc timed out after {COMPILE_TIMEOUT_S} s\n{e.stdout or ''}{e.stderr or ''}"
    if rc == 0 and not obj.is_file():
        rc, log = -2, log + f"\nnvcc exited 0 but wrote no {obj}"
    return CompileResult(source, cmd, rc, log, time.perf_counter() - t0, parse_ptxas(log))


def _compile_all(out_dir: Path) -> list[CompileResult]:
    present = [s for s in KERNEL_SOURCES if (CSRC / s).is_file()]
    if not present:
        return []
    workers = max(1, min(len(present), os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: compile_source(NVCC, s, out_dir), present))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, CompileResult]:
    """Every kernel source that exists, compiled once: in parallel threads (one nvcc process per
    core). Under pytest-xdist the workers share one compilation (the first one to get here
    compiles under a file lock in the session's common temp directory; the others read its
    results), so ``-n 2`` does not compile everything twice on a 2-core CI machine."""
    if NVCC is None:
        pytest.skip("nvcc not found: cannot compile the kernels")
    from filelock import FileLock   # a dependency of torch

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base   # per-session either way
    out_dir = shared / "warpforge_nvcc_sm90"
    record = out_dir / "results.json"
    with FileLock(str(shared / "warpforge_nvcc_sm90.lock")):
        if record.is_file():
            raw = json.loads(record.read_text())
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
            raw = [{"source": r.source, "cmd": r.cmd, "returncode": r.returncode, "log": r.log, "seconds": r.seconds}
                   for r in _compile_all(out_dir)]
            record.write_text(json.dumps(raw))
    return {d["source"]: CompileResult(**d, kernels=parse_ptxas(d["log"])) for d in raw}


_SAMPLE_PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4fastPf' for 'sm_90'
ptxas info    : Function properties for _Z4fastPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 264 bytes smem
ptxas info    : Compile time = 12.000 ms
ptxas info    : Function properties for _Z6helperv
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z5spillPf' for 'sm_90'
ptxas info    : Function properties for _Z5spillPf
    24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
"""


def test_ptxas_report_parser():
    """The parser behind the spill check, on a canned ``-Xptxas -v`` report (no nvcc needed)."""
    k = parse_ptxas(_SAMPLE_PTXAS)
    assert set(k) == {"_Z4fastPf", "_Z6helperv", "_Z5spillPf"}
    assert (k["_Z4fastPf"].entry, k["_Z4fastPf"].registers, k["_Z4fastPf"].spill_stores) == (True, 40, 0)
    assert (k["_Z6helperv"].entry, k["_Z6helperv"].registers, k["_Z6helperv"].stack) == (False, None, 8)
    s = k["_Z5spillPf"]
    assert (s.registers, s.stack, s.spill_stores, s.spill_loads) == (255, 24, 20, 16)
    table = kernel_table(CompileResult("x.cu", [], 0, _SAMPLE_PTXAS, kernels=k), ["_Z5spillPf"])
    assert "spill stores 20" in table and ("spill(float*)" in table or "_Z5spillPf" in table)  # c++filt or not


def test_kernel_sources_are_listed():
    """Every .cu file in csrc/ is built (listed in SOURCES) and ops.cpp is among the sources."""
    assert "ops.cpp" in wcuda.SOURCES
    on_disk = {p.name for p in CSRC.glob("*.cu")}
    missing = sorted(on_disk - set(wcuda.SOURCES))
    assert not missing, f"kernel sources in {CSRC} that warpforge.cuda.SOURCES does not build: {missing}"
    assert len(set(wcuda.SOURCES)) == len(wcuda.SOURCES), f"duplicate entries in SOURCES: {wcuda.SOURCES}"


@needs_nvcc
@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_kernels_compile_for_sm90_without_spills(source, compiled):
    if not (CSRC / source).is_file():
        pytest.skip(f"{source} is listed in warpforge.cuda.SOURCES but {CSRC / source} does not exist (yet)")
    r = compiled[source]
    assert r.returncode == 0, (f"nvcc failed on {source} (exit {r.returncode}):\n  {' '.join(r.cmd)}\n"
                               f"{r.log[-8000:]}")
    entries = [n for n, k in r.kernels.items() if k.entry]
    assert entries, f"no 'Compiling entry function' lines in the ptxas report of {source}:\n{r.log[-4000:]}"
    unparsed = [n for n in r.kernels if r.kernels[n].spill_stores is None]
    assert not unparsed, (f"ptxas reported no spill line for {len(unparsed)} function(s) of {source} "
                          f"(report format changed?):\n{kernel_table(r, unparsed)}")
    no_regs = [n for n in entries if r.kernels[n].registers is None]
    assert not no_regs, f"no register count for:\n{kernel_table(r, no_regs)}"
    print(f"\n{source}: {len(entries)} kernels for sm_90, nvcc {r.seconds:.1f} s\n{kernel_table(r)}")
    spilled = [n for n, k in r.kernels.items() if k.spill_stores or k.spill_loads]
    assert not spilled, (f"{len(spilled)} kernel(s) of {source} spill registers to local memory "
                         f"(expected 0 bytes spill stores and loads everywhere):\n{kernel_table(r, spilled)}")


# ----------------------------------------------------------------------------------------------
# ops.cpp against the installed torch's headers; kernels see none of them
# ----------------------------------------------------------------------------------------------
def test_ops_cpp_syntax_checks_against_torch_headers(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: cannot syntax-check ops.cpp")
    from torch.utils.cpp_extension import include_paths

    torch_incs = [str(p) for p in include_paths()]
    if not any((Path(p) / "torch" / "library.h").is_file() for p in torch_incs):
        pytest.skip(f"the installed torch ships no C++ headers (no torch/library.h under {torch_incs})")
    cuda_inc = cuda_include_dir(NVCC)
    if cuda_inc is None:
        pytest.skip("the CUDA toolkit's headers (cuda_runtime.h) were not found: c10/cuda needs them")
    incs = []
    # A CPU-only torch wheel has c10/cuda/*.h but not the CMake-generated cuda_cmake_macros.h they include.
    if not any((Path(p) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file() for p in torch_incs):
        stub = tmp_path / "stub"
        (stub / "c10" / "cuda" / "impl").mkdir(parents=True)
        (stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text(
            "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        incs.append(str(stub))
    incs += [*torch_incs, cuda_inc, str(CSRC)]
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cmd = [gxx, "-std=c++20", "-fsyntax-only", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           *(f"-I{p}" for p in incs), str(CSRC / "ops.cpp")]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    assert p.returncode == 0, f"g++ -fsyntax-only failed on ops.cpp:\n  {' '.join(cmd)}\n{(p.stdout + p.stderr)[-8000:]}"


_TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]\s*(torch/|ATen/|c10/|caffe2/|pybind11/|Python\.h)', re.MULTILINE)


def test_kernels_include_no_pytorch_headers():
    """The design (launch.h): only ops.cpp sees PyTorch; kernels get raw pointers and CUDA headers,
    so they compile fast and compile where no PyTorch is installed."""
    files = sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h"))
    names = {p.name for p in files}
    assert {"launch.h", "common.cuh"} <= names, f"expected launch.h and common.cuh in {CSRC}, found {sorted(names)}"
    offenders = {}
    for p in files:
        hits = [ln.strip() for ln in p.read_text().splitlines() if _TORCH_INCLUDE.match(ln)]
        if hits:
            offenders[p.name] = hits
    assert not offenders, f"kernel-side files include PyTorch headers: {offenders}"
    # the pattern does find them where they belong
    assert _TORCH_INCLUDE.search((CSRC / "ops.cpp").read_text()), "ops.cpp includes no PyTorch header?"


# ----------------------------------------------------------------------------------------------
# Without a CUDA PyTorch: backend="cuda" says why; the default backend still works
# ----------------------------------------------------------------------------------------------
no_cuda_backend = pytest.mark.skipif(wcuda.available(), reason="the CUDA backend is available here; these tests "
                                                               "check the behaviour where it is not")


def _inputs():
    """Small inputs on conftest's DEVICE (CPU under the Triton interpreter where there is no GPU)."""
    return torch.randn(3, 37, device=DEVICE), torch.randn(3, 37, device=DEVICE), torch.randn(37, 5, device=DEVICE)


# name -> (call(backend, a, b, w) with backend=None meaning "not passed", reference(a, b, w))
PUBLIC = {
    "add": (lambda be, a, b, w: wf.add(a, b, alpha=0.5, **be), lambda a, b, w: a.double() + 0.5 * b.double()),
    "add-naive": (lambda be, a, b, w: wf.add(a, b, variant="naive", **be), lambda a, b, w: a.double() + b.double()),
    "sum": (lambda be, a, b, w: wf.sum(a, -1, **be), lambda a, b, w: a.double().sum(-1)),
    "sum-dim0-keepdim": (lambda be, a, b, w: wf.sum(a, 0, True, dtype=torch.float32, **be),
                         lambda a, b, w: a.double().sum(0, keepdim=True)),
    "amax": (lambda be, a, b, w: wf.amax(a, -1, **be), lambda a, b, w: a.double().amax(-1)),
    "softmax": (lambda be, a, b, w: wf.softmax(a, -1, **be), lambda a, b, w: torch.softmax(a.double(), -1)),
    "log_softmax": (lambda be, a, b, w: wf.log_softmax(a, -1, **be),
                    lambda a, b, w: torch.log_softmax(a.double(), -1)),
    "matmul": (lambda be, a, b, w: wf.matmul(a, w, **be), lambda a, b, w: a.double() @ w.double()),
    "matmul-naive": (lambda be, a, b, w: wf.matmul(a, w, variant="naive", **be),
                     lambda a, b, w: a.double() @ w.double()),
}
# the CUDA-only variants too: backend="cuda" must refuse before looking at them
CUDA_ONLY = {
    "matmul-mma": lambda a, b, w: wf.matmul(a.half(), w.half(), variant="mma", backend="cuda"),
    "matmul-regblock": lambda a, b, w: wf.matmul(a, w, variant="regblock", backend="cuda"),
}


@no_cuda_backend
def test_unavailable_reason():
    assert wcuda.available() is False
    why = wcuda.unavailable_reason()
    assert isinstance(why, str) and why.strip(), f"unavailable_reason() is {why!r}; expected a non-empty reason"
    with pytest.raises(wcuda.CudaBackendUnavailable) as e:
        wcuda.load()
    assert why in str(e.value)
    with pytest.raises(wcuda.CudaBackendUnavailable, match=re.escape(why)):
        wcuda.ops()
    assert issubclass(wcuda.CudaBackendUnavailable, RuntimeError)


@no_cuda_backend
@pytest.mark.parametrize("name", [*PUBLIC, *CUDA_ONLY])
def test_backend_cuda_raises_with_reason(name):
    a, b, w = _inputs()
    call = CUDA_ONLY[name] if name in CUDA_ONLY else (lambda *t: PUBLIC[name][0]({"backend": "cuda"}, *t))
    with pytest.raises(wcuda.CudaBackendUnavailable) as e:
        call(a, b, w)
    why = wcuda.unavailable_reason()
    assert why in str(e.value), f"the error does not give the reason {why!r}: {e.value}"


@no_cuda_backend
@pytest.mark.parametrize("backend", [None, "triton"])
@pytest.mark.parametrize("name", list(PUBLIC))
def test_default_backend_still_works(name, backend):
    a, b, w = _inputs()
    call, ref = PUBLIC[name]
    out = call({} if backend is None else {"backend": backend}, a, b, w)
    assert_close(out, ref(a, b, w), torch.float32, what=f"{name} (backend={backend})")


@pytest.mark.parametrize("name", list(PUBLIC))
def test_unknown_backend_is_a_value_error(name):
    a, b, w = _inputs()
    with pytest.raises(ValueError, match="'backend'"):
        PUBLIC[name][0]({"backend": "cudax"}, a, b, w)


# ----------------------------------------------------------------------------------------------
# cuda_softmax_config: launch shapes softmax.cu accepts (config_ok + capacity there)
# ----------------------------------------------------------------------------------------------
def _row_lengths():
    ns = set(range(1, 300)) | {1000, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193,
                               16383, 16384, 16385, 32767, 32768, 32769, 65535, 65536, 65539, 131071, 131072,
                               131073, 262143, 262144, 262145, 524287, 524288, 524289, 1 << 20, (1 << 20) + 1,
                               3 * (1 << 20) + 7}
    ns |= {k * 1000 + 1 for k in range(1, 300, 7)}
    return sorted(ns)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("elem_size", [2, 4])
def test_cuda_softmax_config_is_valid(elem_size, backward):
    bad = {}
    for n in _row_lengths():
        cfg = cuda_softmax_config(n, elem_size, backward=backward)
        why = softmax_config_ok(cfg, n, elem_size, backward)
        if why is None and cfg[1] > 0:
            threads, vpt, cluster, _ = cfg
            assert threads * vpt * cluster * (16 // elem_size) >= n
        if why is not None:
            bad[n] = (cfg, why)
        if backward and elem_size == 2 and cfg[1] == 4 and cfg[3] == 1:
            assert cfg[0] <= 512, f"n={n}: {cfg}: the 16-bit backward at vpt 4 allows at most 512 threads"
    shown = dict(list(bad.items())[:20])
    assert not bad, f"{len(bad)} row lengths get a launch shape softmax.cu refuses (first 20): {shown}"


def test_cuda_softmax_config_shapes():
    # the longest bf16 row the design keeps in registers (8+ blocks x 1,024 threads x 32): not looped
    fwd = cuda_softmax_config(262144, 2)
    assert fwd[1] != 0 and fwd[2] > 1, f"262144 bf16 forward should be a register-resident cluster shape; got {fwd}"
    assert cuda_softmax_config(262144, 2, backward=True)[1] != 0
    # short rows: one warp each, several rows per block
    for n in (1, 7, 33, 123, 1000, 1024):
        t, v, c, r = cuda_softmax_config(n, 2)
        assert t == 32 and c == 1 and v > 0, (n, (t, v, c, r))
    # far past any cluster's capacity: the looped kernel
    assert cuda_softmax_config(1 << 24, 2)[1] == 0
    assert cuda_softmax_config(1 << 24, 4, backward=True)[1] == 0


def test_softmax_config_ok_mirror_refuses_bad_shapes():
    """The Python mirror of softmax.cu's checks (also used by test_cuda_ops.py's sweep) refuses what
    the C++ refuses."""
    assert softmax_config_ok([1024, 4, 1, 1], 32768, 2, False) is None
    assert softmax_config_ok([1024, 4, 1, 1], 32768, 2, True) is not None     # 16-bit bwd > 512 threads
    assert softmax_config_ok([256, 4, 1, 1], 32768, 2, False) is not None     # capacity 8192
    assert softmax_config_ok([1024, 0, 2, 1], 32768, 2, False) is not None    # looped with a cluster
    assert softmax_config_ok([48, 1, 1, 1], 100, 2, False) is not None        # not a multiple of 32
    assert softmax_config_ok([32, 4, 1, 64], 100, 2, False) is not None       # > 32 rows per block
    assert softmax_config_ok([64, 1, 1, 2], 100, 2, False) is not None        # rows per block > 1 needs 32 threads
    assert softmax_config_ok([1024, 3, 1, 1], 100, 2, False) is not None
    assert softmax_config_ok([1024, 4, 3, 1], 100, 2, False) is not None


def _cluster_rows_shape_ok(n, c, t, v, rows, stages, copies=1, extra=0, per_sm=1):
    """cluster_rows.cuh's cluster_rows_shape_error, mirrored: the generic rules on a cluster-rows
    launch shape for rows of n 16-bit elements staging ``copies`` tensors a row, ``extra`` bytes
    beside each staged row and ``per_sm`` blocks an SM (the kernels' own register rules apart)."""
    shared_static, reserved = 6528, 1024          # ClusterRowShared (ptxas: 6528 bytes smem), the runtime's 1 KB
    assert c in (2, 4, 8, 16) and t in (128, 256, 512, 1024) and v in (1, 2, 4, 8), (n, c, t, v)
    assert not (t == 1024 and v == 8) and per_sm in (1, 2) and per_sm * t <= 1024, (n, t, v, per_sm)
    assert c * t * v * 8 == n, (n, c, t, v)
    assert 1 <= rows <= min(8, t // 32) and rows * c <= 32 and 2 <= stages <= 8, (n, rows, stages)
    block = stages * rows * ((n // c) * 2 * copies + extra) + shared_static + reserved
    assert per_sm * block <= 228 * 1024, (n, stages, rows, per_sm)


def test_softmax_cluster_table(monkeypatch):
    """Every launch shape in heuristics.SOFTMAX_CLUSTER passes softmax.cu's
    softmax_cluster_config_error (mirrored here: the generic rules with a float a thread beside each
    staged row, and the register rule at 1,024 threads an SM), and the route asks for the table
    only where it applies: the named device, a row length in the table, at least one row an SM, not
    interpreting."""
    from warpforge.runtime import heuristics as H

    for table in H.SOFTMAX_CLUSTER.values():
        for n, (c, t, v, rows, stages, *more) in table.items():
            per_sm = more[0] if more else 1
            assert per_sm in (1, 2) and not (t * per_sm == 1024 and v >= 4), (n, t, v, per_sm)
            _cluster_rows_shape_ok(n, c, t, v, rows, stages, extra=4 * t, per_sm=per_sm)
    monkeypatch.setattr(H, "interpreting", lambda: False)
    monkeypatch.setattr(H, "sm_count", lambda *a: 132)
    assert H.softmax_cluster_config(262144, 512, "NVIDIA H200") == H.SOFTMAX_CLUSTER["H200"][262144]
    assert H.softmax_cluster_config(262144, 132, "NVIDIA H200") == H.SOFTMAX_CLUSTER["H200"][262144]
    assert H.softmax_cluster_config(262144, 131, "NVIDIA H200") is None
    assert H.softmax_cluster_config(65536, 2048, "NVIDIA H200") is None      # the Triton loop (SOFTMAX_LOOP_CONST)
    assert H.softmax_cluster_config(262144, 512, "NVIDIA H100 80GB HBM3") is None
    monkeypatch.setattr(H, "interpreting", lambda: True)
    assert H.softmax_cluster_config(262144, 512, "NVIDIA H200") is None


def test_layer_norm_cluster_table(monkeypatch):
    """Every launch shape in heuristics.NORM_LAYER_CLUSTER passes norm.cu's
    layer_norm_cluster_config_error (mirrored here), and the route asks for the table only where it
    applies: the named device, a row length in the table, at least one row an SM, not interpreting."""
    from warpforge.runtime import heuristics as H

    for table in H.NORM_LAYER_CLUSTER.values():
        for n, shape in table.items():
            _cluster_rows_shape_ok(n, *shape)
    for table in H.NORM_BWD_CLUSTER.values():   # the backward: x and dy staged, registers for dw and db
        for (layer, n), (c, t, v, rows, stages) in table.items():
            assert isinstance(layer, bool) and (t in (128, 256) or (t == 512 and v <= 2)), (layer, n, t, v)
            _cluster_rows_shape_ok(n, c, t, v, rows, stages, copies=2)
    monkeypatch.setattr(H, "interpreting", lambda: False)
    monkeypatch.setattr(H, "sm_count", lambda *a: 132)
    assert H.layer_norm_cluster_config(65536, 2048, "NVIDIA H200") == H.NORM_LAYER_CLUSTER["H200"][65536]
    assert H.layer_norm_cluster_config(262144, 132, "NVIDIA H200") == H.NORM_LAYER_CLUSTER["H200"][262144]
    assert H.layer_norm_cluster_config(65536, 131, "NVIDIA H200") is None
    assert H.layer_norm_cluster_config(32768, 4096, "NVIDIA H200") is None     # the loop kernel (NORM_LOOP_CONST)
    assert H.layer_norm_cluster_config(16384, 4096, "NVIDIA H200") is None
    assert H.layer_norm_cluster_config(65536, 2048, "NVIDIA H100 80GB HBM3") is None
    for layer in (True, False):
        for n in (32768, 65536, 262144):
            assert H.norm_bwd_cluster_config(n, 4096, layer, "NVIDIA H200") == H.NORM_BWD_CLUSTER["H200"][(layer, n)]
        assert H.norm_bwd_cluster_config(32768, 131, layer, "NVIDIA H200") is None
        assert H.norm_bwd_cluster_config(16384, 4096, layer, "NVIDIA H200") is None
        assert H.norm_bwd_cluster_config(32768, 4096, layer, "NVIDIA H100 80GB HBM3") is None
    monkeypatch.setattr(H, "interpreting", lambda: True)
    assert H.layer_norm_cluster_config(65536, 2048, "NVIDIA H200") is None
    assert H.norm_bwd_cluster_config(32768, 4096, True, "NVIDIA H200") is None
