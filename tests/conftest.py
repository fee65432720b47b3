"""Shared test set-up: the device (CUDA when present, else CPU under the Triton interpreter),
poisoned outputs, and the relative-error check against a float64 reference."""
from __future__ import annotations

import zlib

import pytest
import torch

import warpforge.runtime as runtime

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# ||out - ref|| / ||ref|| against a float64 reference: the output's own rounding dominates.
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}

gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: this machine runs kernels under the Triton interpreter")


@pytest.fixture(autouse=True)
def _seed(request):
    """Random inputs, but reproducible per test: a failure seen once is seen again. (The Triton
    interpreter truncates fp32 -> bf16 where the GPU rounds, doubling bf16 error on CPU, so an
    unlucky draw on a tiny shape could otherwise flake.)"""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture(autouse=True)
def _poison_outputs(monkeypatch):
    """Every kernel output starts as NaN, so an element left unwritten fails the comparison."""
    monkeypatch.setattr(runtime, "POISON", True)
    yield


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (absolute error where ref is all zeros). NaN never passes."""
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(r)
    assert torch.equal(torch.isfinite(o), finite), "output has NaN/inf where the reference has none (or vice versa)"
    o, r = o[finite], r[finite]
    den = r.norm().item()
    num = (o - r).norm().item()
    return num / den if den > 0 else num


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0, what: str = "") -> None:
    err = rel_err(out, ref)
    tol = TOL[dtype] * scale
    assert err <= tol, f"{what} relative error {err:.3e} > {tol:.1e} ({dtype})"


def randn(*shape, dtype=torch.float32, requires_grad=False, scale=1.0):
    t = (torch.randn(*shape, device=DEVICE, dtype=torch.float32) * scale).to(dtype)
    return t.requires_grad_(requires_grad)


def noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t`` in a view whose rows are strided (every other row of a buffer
    twice as tall), so kernels must honour the row stride."""
    buf = torch.empty((*t.shape[:-1], 2, t.shape[-1]), device=t.device, dtype=t.dtype)
    buf.normal_()
    buf[..., 0, :] = t.detach()
    v = buf[..., 0, :]
    assert not v.is_contiguous() or t.numel() <= t.shape[-1]
    return v.requires_grad_(t.requires_grad)



SHARED_MEMORY = {"A100": 166_912, "sm_86/89": 101_376}   # bytes a block may use (Hopper: 232,448)


@pytest.fixture
def lower_shared_memory(monkeypatch):
    """``lower(limit, *caches)``: run the test as on a GPU with ``limit`` bytes of shared memory a
    block (GPU only): Triton's limit lowered, and the kernels of ``caches`` (runtime.launch
    LaunchCaches) forgotten so each loads afresh and meets it (a loaded kernel is not checked
    again). Forgotten again at the end, since a kernel refused under the lower limit stays refused
    in Triton's cache."""
    from triton.compiler import compiler
    from warpforge.runtime import launch

    seen = []

    def forget(caches):
        for c in caches:
            c.kernel.device_caches.clear()
            c.plans.clear()

    def lower(limit: int, *caches) -> None:
        seen.extend(caches)
        forget(caches)
        monkeypatch.setattr(compiler, "max_shared_mem", lambda device: limit)
        monkeypatch.setattr(launch, "_TOO_BIG", {})
    yield lower
    forget(seen)
