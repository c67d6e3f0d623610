"""flashfuse: fused, tiled Triton kernels for LLM and diffusion models in PyTorch.

Importing flashfuse on a machine without CUDA switches Triton to its interpreter (see ``_env``), so the
same kernels run, slowly and exactly, on CPU tensors.
"""

from . import _env  # noqa: F401  (must come first: decides compiled vs interpreted before kernels exist)

__version__ = "0.1.0"
