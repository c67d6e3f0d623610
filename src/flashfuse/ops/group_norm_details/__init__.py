"""Private details of ``flashfuse.ops.group_norm``: its Triton kernels."""
