"""Private details of ``flashfuse.ops.norm``: its Triton kernels."""
