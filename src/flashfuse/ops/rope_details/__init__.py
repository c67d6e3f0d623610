"""Private details of ``flashfuse.ops.rope``: its Triton kernel."""
