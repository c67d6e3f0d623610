"""One-line integrations with model libraries: `patch_transformers(model)` swaps a Hugging Face transformers
model's norms, rotary embedding, MLPs, attention and loss for flashfuse kernels, and `patch_diffusers(model)` a
diffusers U-Net's or DiT's GroupNorm + activation, attention processors, GEGLU and adaLN, in place and
reversibly. Importing this package imports neither transformers nor diffusers."""

from .diffusers import patch_diffusers, patch_summary, patched_diffusers, unpatch_diffusers
from .diffusers_attention import FlashfuseAttnProcessor
from .hf_attention import flashfuse_attention_forward, register_transformers_attention
from .transformers import patch_transformers, patched, unpatch_transformers

__all__ = [
    "FlashfuseAttnProcessor",
    "flashfuse_attention_forward",
    "patch_diffusers",
    "patch_summary",
    "patch_transformers",
    "patched",
    "patched_diffusers",
    "register_transformers_attention",
    "unpatch_diffusers",
    "unpatch_transformers",
]
