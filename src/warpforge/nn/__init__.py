"""Thin ``nn.Module`` wrappers over the functional ops."""
from .activations import GeGLU, SwiGLU, SwiGLUMLP
from .linear import Linear
from .moe import MoE
from .loss import CrossEntropyLoss, LinearCrossEntropyLoss
from .norms import AddRMSNorm, LayerNorm, RMSNorm
from .rope import RotaryEmbedding

__all__ = ["Linear", "CrossEntropyLoss", "LinearCrossEntropyLoss", "LayerNorm", "RMSNorm", "AddRMSNorm", "SwiGLU", "GeGLU", "SwiGLUMLP", "RotaryEmbedding", "MoE"]
