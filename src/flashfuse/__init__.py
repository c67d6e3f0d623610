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
from .ops.attention.kvcache import flash_attn_with_kvcache  # noqa: E402
from .ops.cross_entropy import cross_entropy, fused_linear_cross_entropy  # noqa: E402
from .ops.embeddings import timestep_embedding  # noqa: E402
from .ops.glu import geglu, swiglu  # noqa: E402
from .ops.group_norm import group_norm  # noqa: E402
from .ops.matmul import fused_mlp, gated_mlp, linear  # noqa: E402
from .ops.modulation import ada_layer_norm, ada_layer_norm_gate  # noqa: E402
from .ops.norm import layer_norm, rms_norm  # noqa: E402
from .ops.rope import apply_rotary_emb, apply_rotary_pos_emb  # noqa: E402
from .ops.scheduler import FusedScheduler  # noqa: E402
from .cuda_graph import CUDAGraphed, cuda_graph  # noqa: E402
from .integrations import (  # noqa: E402  (imports neither transformers nor diffusers)
    patch_diffusers,
    patch_transformers,
    patched,
    patched_diffusers,
    unpatch_diffusers,
    unpatch_transformers,
)

__all__ = [
    "CUDAGraphed",
    "FusedScheduler",
    "ada_layer_norm",
    "ada_layer_norm_gate",
    "apply_rotary_emb",
    "apply_rotary_pos_emb",
    "cross_entropy",
    "cuda_graph",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "fused_linear_cross_entropy",
    "fused_mlp",
    "gated_mlp",
    "geglu",
    "group_norm",
    "layer_norm",
    "linear",
    "patch_diffusers",
    "patch_transformers",
    "patched",
    "patched_diffusers",
    "rms_norm",
    "scaled_dot_product_attention",
    "swiglu",
    "timestep_embedding",
    "unpatch_diffusers",
    "unpatch_transformers",
]
