"""warpforge: fast Triton kernels for the operators LLMs spend their time in, as real PyTorch
operators (``torch.ops.warpforge.*``), with a benchmark and roofline lab (``warpforge bench``).

On a machine without a CUDA device the kernels run under the Triton interpreter (slowly, for
correctness); ``import warpforge`` arranges that before any kernel is defined.
"""
from .runtime import interpreting, setup_interpreter

setup_interpreter()

from .ops.activations import geglu, swiglu  # noqa: E402
from .ops.add import add  # noqa: E402
from .ops.attention import attention_varlen, scaled_dot_product_attention  # noqa: E402
from .ops.cross_entropy import cross_entropy, linear_cross_entropy  # noqa: E402
from .ops.decode_attention import append_paged_kv, decode_attention  # noqa: E402
from .ops.fp8 import linear_fp8, quantize_fp8, scaled_matmul  # noqa: E402
from .ops.matmul import linear, matmul  # noqa: E402
from .ops.moe import moe_experts  # noqa: E402
from .ops.moe_routing import MoERouting, moe_route, moe_update_bias_  # noqa: E402
from .ops.norms import add_rms_norm, layer_norm, rms_norm  # noqa: E402
from .ops.reduce import amax, sum  # noqa: E402  (shadows builtins.sum inside this namespace only)
from .ops.rope import apply_rope  # noqa: E402
from .ops.softmax import log_softmax, softmax  # noqa: E402
from . import nn  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "add", "scaled_dot_product_attention", "attention_varlen", "sum", "amax", "softmax", "log_softmax", "layer_norm", "rms_norm", "add_rms_norm",
    "swiglu", "geglu", "apply_rope", "matmul", "linear", "cross_entropy", "linear_cross_entropy", "quantize_fp8", "scaled_matmul", "linear_fp8", "decode_attention", "append_paged_kv", "moe_route", "moe_update_bias_", "MoERouting", "moe_experts", "nn", "interpreting",
]
