import sys, torch, traceback
sys.path.insert(0, "tests")
from attention_utils import check_rows_past_last_sequence
hd, causal = int(sys.argv[1]), bool(int(sys.argv[2]))
try:
    check_rows_past_last_sequence("cuda", float("nan"), torch.bfloat16, hd, causal)
    torch.cuda.synchronize()
    print(f"hd{hd} causal={causal}: ok", flush=True)
except Exception:
    traceback.print_exc(limit=-8)
    sys.exit(1)
