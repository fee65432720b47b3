"""Suspect: row reductions (wf.sum / wf.amax and amax's backward) over a row longer than 2^31 elements,
e.g. wf.sum(x) / wf.amax(x) of a flattened 1-D tensor.

A single row with N > 16,384 takes the "partial" path (ops/reduce.py, reduce_config): one program per
(row, 8,192-column chunk). The kernels compute the column index as

    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)          # chunk: int32 (pid % C), BLOCK_N = 8192

(reduce.py:133 _reduce_fwd_partial_kernel, :282 _amax_bwd_count_kernel, :300 _amax_bwd_scatter_kernel).
N itself is passed as int64 once it exceeds 2^31 - 1, but chunk * 8192 is int32 arithmetic: from chunk
262,144 on (element 2^31) it wraps to -2^31, the mask `cols < N` is still true, and the load (or, in the
backward, the store) lands 4 GiB before the tensor.

Repro: a bf16 vector of 2^31 + 2^15 elements (4.3 GB), zero except the last 2^15 elements (= 1.0) and
one element (= 5.0) in that tail. Expected: sum = 32768 (exact in bf16 and fp32), amax = 5, and the
gradient of amax is 1 at that element and 0 everywhere else. Peak GPU memory ~8.6 GB (amax backward).

Run alone: python repro_reduce_1d.py   (AUDIT64_TINY=1: a CPU/interpreter smoke test of the logic only)
"""
import os

os.environ.setdefault("WARPFORGE_FASTPATH", "0")   # skip the one-time C++ fast-path build (same kernels)
import torch
import warpforge as wf

from common import DEV, TINY, nanmax as _nanmax, run_standalone, sync as _sync
TAIL = 1024 if TINY else 2**15
N = (40_000 if TINY else 2**31) + TAIL          # the tail lies entirely past element 2^31
PEAK = -7                                        # index (from the end) of the unique maximum




def _vector():
    x = torch.zeros(N, dtype=torch.bfloat16, device=DEV)
    x[-TAIL:] = 1.0
    x[PEAK] = 5.0
    return x


def run_sum() -> str:
    x = _vector()
    x[PEAK] = 1.0                                # plain tail of ones: the sum is TAIL exactly
    y16 = wf.sum(x)                              # bf16 out (fp32 accumulation)
    y32 = wf.sum(x, dtype=torch.float32)
    _sync()
    e16, e32 = abs(float(y16) - TAIL), abs(float(y32) - TAIL)
    if max(e16, e32) == 0.0:
        return "OK"
    return f"WRONG (max err {_nanmax([e16, e32]):.6g}; wf.sum bf16={float(y16)!r} fp32={float(y32)!r}, expected {TAIL})"


def run_amax() -> str:
    x = _vector()
    y = wf.amax(x)
    _sync()
    err = abs(float(y) - 5.0)
    return "OK" if err == 0.0 else f"WRONG (max err {err:.6g}; wf.amax={float(y)!r}, expected 5.0)"


def run_amax_backward() -> str:
    x = _vector().requires_grad_(True)
    y = wf.amax(x)                               # with a gradient to come: the "ties" forward (counts)
    y.backward()
    _sync()
    g = x.grad
    problems = []
    y = y.detach()
    if float(y) != 5.0:
        problems.append(f"forward {float(y)!r} != 5.0")
    if float(g[PEAK]) != 1.0:
        problems.append(f"grad at the max {float(g[PEAK])!r} != 1")
    nz = int(torch.count_nonzero(g))
    if nz != 1:
        problems.append(f"{nz} nonzero gradient elements (expected 1)")
    tail_err = float((g[-TAIL:].float() - torch.where(torch.arange(TAIL, device=DEV) == TAIL + PEAK, 1.0, 0.0)).abs().max())
    if tail_err != 0.0:
        problems.append(f"tail grad err {tail_err:.3g}")
    return "OK" if not problems else f"WRONG (max err {_nanmax([tail_err, abs(float(g[PEAK]) - 1.0)]):.6g}; " + "; ".join(problems) + ")"


SUSPECTS = {
    "reduce.sum_row_over_2^31 (reduce.py:133)": run_sum,
    "reduce.amax_row_over_2^31 (reduce.py:133)": run_amax,
    "reduce.amax_backward_row_over_2^31 (reduce.py:133,282,300)": run_amax_backward,
}

if __name__ == "__main__":
    run_standalone(SUSPECTS, "SUSPECT")
