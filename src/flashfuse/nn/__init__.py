"""nn.Module drop-ins built on the flashfuse ops; parameter names match torch / transformers so state dicts load
unchanged."""

from .group_norm import GroupNormAct
from .loss import FusedLinearCrossEntropyLoss
from .mlp import FusedMLP, GeGLUMLP, SwiGLUMLP
from .norm import LayerNorm, RMSNorm
from .rope import RotaryEmbedding

__all__ = [
    "FusedLinearCrossEntropyLoss",
    "FusedMLP",
    "GeGLUMLP",
    "GroupNormAct",
    "LayerNorm",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLUMLP",
]
