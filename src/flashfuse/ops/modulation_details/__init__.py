"""Private details of ``flashfuse.ops.modulation``: its Triton kernels."""
