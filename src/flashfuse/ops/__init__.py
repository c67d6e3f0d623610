"""Kernels, one op per file: @triton.jit kernels -> launchers -> autograd.Function -> torch.library op."""
