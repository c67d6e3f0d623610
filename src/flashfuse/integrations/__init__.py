"""One-line integrations with model libraries (interim: the exports land with hf_attention.py and nn/mlp.py)."""
