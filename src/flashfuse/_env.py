"""Where kernels run: compiled on a CUDA GPU, or in Triton's interpreter on the CPU.

With no CUDA device, flashfuse sets ``TRITON_INTERPRET=1`` before any of its kernels are defined, so
every kernel runs (slowly, exactly) on CPU tensors. An explicit ``TRITON_INTERPRET`` from the user wins.
This module must be imported before anything that defines a ``@triton.jit`` kernel.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

