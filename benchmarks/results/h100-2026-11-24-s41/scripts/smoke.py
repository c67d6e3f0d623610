"""Session 41 smoke: varlen forward, then backward, per head dim, NaN past cu_seqlens[-1]; CUDA_LAUNCH_BLOCKING."""
import sys, torch
sys.path.insert(0, "tests")
from attention_utils import check_rows_past_last_sequence
for hd in (64, 128, 256):
    for causal in (False, True):
        try:
            check_rows_past_last_sequence("cuda", float("nan"), torch.bfloat16, hd, causal)
            print(f"hd{hd} causal={causal}: ok", flush=True)
        except Exception as e:
            print(f"hd{hd} causal={causal}: {type(e).__name__} {str(e)[:300]}", flush=True)
            raise
