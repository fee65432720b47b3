"""``torch.autocast`` for the GEMM-shaped operators.

PyTorch's autocast casts the floating-point inputs of its lower-precision ops (``F.linear``,
``torch.matmul``, ``F.scaled_dot_product_attention``) to the region's dtype (bf16 or fp16) before
they run. A warpforge operator is a custom op, which autocast leaves alone; so without this, a
drop-in call inside an autocast region ran in float32 (slow, and with an output dtype that differs
from torch's) or rejected the mixed dtypes autocast exists to absorb (a bf16 activation with a
float32 parameter). The public functions of the GEMM-shaped ops (linear, matmul, the attention
functions, linear_cross_entropy, moe_experts) call :func:`autocast_inputs` first, so they take
the same inputs as their torch counterparts and return the same dtype. The casts are ordinary
``Tensor.to`` calls: autograd carries gradients back to the float32 leaves in their own dtype.

The row ops (norms, softmax, cross-entropy, ...) are not cast: they already compute in float32
inside the kernel and keep their inputs' dtype for the output (torch upcasts such ops to float32
under autocast, which would double their memory traffic).
"""
from __future__ import annotations

import torch


# the device types autocast knows, found once here (torch.compile of torch 2.11 cannot trace
# torch.amp.is_autocast_available, and torch.is_autocast_enabled raises for the others, e.g. meta)
_AUTOCAST_DEVICES = frozenset(d for d in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla",
                                          torch._C._get_privateuse1_backend_name())
                              if torch.amp.is_autocast_available(d))


def autocast_dtype(t) -> torch.dtype | None:
    """The autocast dtype in force for ``t``'s device type, or None outside an autocast region
    (one cheap check when autocast is off everywhere; traceable by torch.compile)."""
    if not torch._C._is_any_autocast_enabled() or not isinstance(t, torch.Tensor):
        return None
    dev = t.device.type
    if dev not in _AUTOCAST_DEVICES or not torch.is_autocast_enabled(dev):
        return None
    return torch.get_autocast_dtype(dev)


def autocast_inputs(*tensors):
    """``tensors`` as autocast would pass them to a lower-precision op: inside an autocast region
    for the first tensor's device type, every floating-point tensor on that device type other than
    float64 is cast to the region's dtype; anything else (None, integer and bool tensors, float64,
    non-tensors) is returned unchanged. Outside a region: ``tensors`` unchanged."""
    dtype = autocast_dtype(tensors[0])
    if dtype is None:
        return tensors
    dev = tensors[0].device.type
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 and t.device.type == dev else t for t in tensors)
