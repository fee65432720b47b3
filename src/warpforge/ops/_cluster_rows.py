"""Routing to the CUDA backend's cluster-rows kernels (``cuda/csrc/cluster_rows.cuh``: a row over a
thread-block cluster, groups of rows staged in shared memory by bulk copies): the LayerNorm forward
and norm backward (ops/norms.py) and the softmax forward (ops/softmax.py) over long rows, where a
device's table names a launch shape. Shared here: whether the backend is built (once, with one
warning where it cannot be) and the call's contract checks that keep a call on the Triton path."""
from __future__ import annotations

import functools
import os
import warnings

import torch


@functools.cache
def cuda_backend_ready(env: str, who: str) -> bool:
    """Whether the CUDA backend is built and loaded here (building it on first use); False, with one
    warning naming the reason and ``who`` keeps its Triton kernels, where it cannot be, and without
    trying under ``env``=0."""
    if os.environ.get(env, "1") == "0":
        return False
    from .. import cuda as wcuda

    try:
        wcuda.load()
    except wcuda.CudaBackendUnavailable as e:
        warnings.warn(f"warpforge: {who} keep the Triton kernels for long rows: {e}", RuntimeWarning, stacklevel=4)
        return False
    return True


def aligned_rows(*ts) -> bool:
    """Every tensor (None skipped) starts on a 16-byte boundary, and so do its rows."""
    return all(t is None or (t.data_ptr() % 16 == 0 and (t.dim() < 2 or t.stride(0) * t.element_size() % 16 == 0))
               for t in ts)


def cluster_route(x2, same_dtype, rows, shape, env: str, who: str):
    """``shape()`` (a launch shape from heuristics' cluster tables, or None) where the CUDA cluster
    kernels can take this call, else None: x2 16-bit on the GPU, every tensor of ``same_dtype``
    (None skipped) of x2's dtype, every one of ``rows`` (None skipped) 16-byte aligned with aligned
    rows, and the backend built (``cuda_backend_ready(env, who)``). The table is read only once the
    cheap checks pass."""
    if x2.dtype not in (torch.bfloat16, torch.float16) or not x2.is_cuda:
        return None
    if any(t is not None and t.dtype != x2.dtype for t in same_dtype):
        return None
    cfg = shape()
    if cfg is None or not aligned_rows(*rows):
        return None
    return cfg if cuda_backend_ready(env, who) else None
