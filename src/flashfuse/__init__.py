"""flashfuse: fused, tiled Triton kernels for LLM and diffusion models in PyTorch.

Importing flashfuse on a machine without CUDA switches Triton to its interpreter (see ``_env``), so the
same kernels run, slowly and exactly, on CPU tensors.
"""

from . import _env  # noqa: F401  (must come first: decides compiled vs interpreted before kernels exist)

__version__ = "0.1.0"

from .ops.attention.interface import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    scaled_dot_product_attention,
)

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "scaled_dot_product_attention",
]
