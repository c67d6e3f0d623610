"""Private details of flashfuse.ops.matmul: the Triton kernels, their config tables and launchers."""
