"""Session 30: the forward with the P V wait after the softmax (SPLIT_PV_WAIT, the table's default now) vs without
(the code before, bit for bit the same PTX), CUDA-graph timed beside cuDNN, rounds alternating (session 29's
harness)."""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../h100-2026-11-23-s29/scripts"))
from s29_ab import run

V = {"old": dict(SPLIT_PV_WAIT=False), "new": None}
cases = {(hd, causal, S): V for hd in (64, 128) for causal in (True, False) for S in (512, 1024, 2048, 4096, 8192)}
run(cases, "s30_ab", over_table=True, rounds=2)
