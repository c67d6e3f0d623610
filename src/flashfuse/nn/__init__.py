"""nn.Module drop-ins built on the flashfuse ops; parameter names match torch / transformers so state dicts load
unchanged."""

from .loss import FusedLinearCrossEntropyLoss
from .norm import LayerNorm, RMSNorm
from .rope import RotaryEmbedding

__all__ = [
    "FusedLinearCrossEntropyLoss",
    "LayerNorm",
    "RMSNorm",
    "RotaryEmbedding",
]
