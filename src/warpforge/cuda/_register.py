"""Fake (meta) implementations and autograd formulas of the ``warpforge_cuda`` operators, whose
schemas and CUDA implementations ``csrc/ops.cpp`` registers. Run once, after the library loads."""
from __future__ import annotations

import torch

from ..runtime.heuristics import cuda_softmax_config

_done = False


def _ops():
    return torch.ops.warpforge_cuda


# ---- add --------------------------------------------------------------------------------------
def _add_fake(input, other, alpha, variant):
    return input.new_empty(input.shape)


def _add_setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


def _add_backward(ctx, dy):
    return dy, (dy if ctx.alpha == 1.0 else dy * ctx.alpha), None, None


# ---- sum, amax (the last dim of a 2-D input) --------------------------------------------------------
def _sum_fake(input, dtype):
    return input.new_empty(input.shape[:-1], dtype=dtype)


def _sum_setup(ctx, inputs, output):
    ctx.shape, ctx.in_dtype = inputs[0].shape, inputs[0].dtype


def _sum_backward(ctx, dy):
    return dy.to(ctx.in_dtype).unsqueeze(-1).expand(ctx.shape), None


def _amax_fake(input):
    return input.new_empty(input.shape[:-1])


def _amax_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output)


def _amax_backward(ctx, dy):
    # the gradient split among each row's maxima: the Triton kernel (warpforge.ops.reduce) -- this
    # backend's reductions are forward kernels
    from ..ops.reduce import amax_backward_op

    x, y = ctx.saved_tensors
    return amax_backward_op(x, y, dy)


# ---- softmax ----------------------------------------------------------------------------------
def _softmax_fake(input, log, config):
    return input.new_empty(input.shape)


def _softmax_bwd_fake(output, grad_output, log, config):
    return output.new_empty(output.shape)


def _softmax_setup(ctx, inputs, output):
    ctx.log = inputs[1]
    ctx.save_for_backward(output)


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    if dy.stride(-1) != 1:
        dy = dy.contiguous()
    cfg = cuda_softmax_config(y.shape[-1], y.element_size(), backward=True)
    return _ops().softmax_backward(y, dy, ctx.log, cfg), None, None


# ---- matmul -----------------------------------------------------------------------------------
def _matmul_fake(a, b, variant):
    return a.new_empty((a.shape[0], b.shape[1]))


def _matmul_setup(ctx, inputs, output):
    a, b, ctx.variant = inputs
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, dc):
    # through matmul_2d, which lays operands out for the variant (the mma rung pads leading
    # dimensions that are not multiples of 8: a^T is (K, M) with M arbitrary)
    from .functional import matmul_2d

    a, b = ctx.saved_tensors
    da = db = None
    if ctx.needs_input_grad[0]:
        da = matmul_2d(dc, b.t(), ctx.variant)      # (M, N) @ (N, K)
    if ctx.needs_input_grad[1]:
        db = matmul_2d(a.t(), dc, ctx.variant)      # (K, M) @ (M, N)
    return da, db, None


# ---- LayerNorm forward over long rows: writes its out, mean and rstd (no autograd here: ops/norms.py's
# operator owns it) ------------------------------------------------------------------------------
def _layer_norm_fwd_fake(input, weight, bias, eps, config, out, mean, rstd):
    return None


def _norm_bwd_fake(input, grad_output, weight, mean, rstd, offset, rms, config, dx, dw_part, db_part, grad_sum=None):
    return None


# ---- softmax forward over long rows (a cluster a row, staged groups): writes its out (no autograd
# here: ops/softmax.py's operator owns it) ----------------------------------------------------------
def _softmax_fwd_cluster_fake(input, log, config, out):
    return None


def register() -> None:
    global _done
    if _done:
        return
    lib = "warpforge_cuda::"
    for name, fake in (("add", _add_fake), ("sum", _sum_fake), ("amax", _amax_fake), ("softmax", _softmax_fake),
                       ("softmax_backward", _softmax_bwd_fake), ("matmul", _matmul_fake),
                       ("layer_norm_fwd", _layer_norm_fwd_fake), ("norm_bwd", _norm_bwd_fake),
                       ("softmax_fwd_cluster", _softmax_fwd_cluster_fake)):
        torch.library.register_fake(lib + name, fake)
    for name, backward, setup in (("add", _add_backward, _add_setup), ("sum", _sum_backward, _sum_setup),
                                  ("amax", _amax_backward, _amax_setup),
                                  ("softmax", _softmax_backward, _softmax_setup),
                                  ("matmul", _matmul_backward, _matmul_setup)):
        torch.library.register_autograd(lib + name, backward, setup_context=setup)
    _done = True
