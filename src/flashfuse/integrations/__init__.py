"""One-line integrations with model libraries: `patch_transformers(model)` swaps a Hugging Face transformers
model's norms, rotary embedding, MLPs, attention and loss for flashfuse kernels, in place and reversibly.
Importing this package does not import transformers."""

from .hf_attention import flashfuse_attention_forward, register_transformers_attention
from .transformers import patch_transformers, patched, unpatch_transformers

__all__ = [
    "flashfuse_attention_forward",
    "patch_transformers",
    "patched",
    "register_transformers_attention",
    "unpatch_transformers",
]
