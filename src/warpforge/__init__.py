"""warpforge: fast Triton kernels for the operators LLMs spend their time in, as real PyTorch
operators (``torch.ops.warpforge.*``), with a benchmark and roofline lab (``warpforge bench``).

On a machine without a CUDA device the kernels run under the Triton interpreter (slowly, for
correctness); ``import warpforge`` arranges that before any kernel is defined.
"""
from .runtime import interpreting, setup_interpreter

setup_interpreter()

from .ops.softmax import log_softmax, softmax  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "softmax", "log_softmax", "interpreting",
]
