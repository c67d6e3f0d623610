"""Session 30, call 2: hd128 causal from 1K keys, the P V wait after the softmax (SPLIT_PV_WAIT) on / off over the
table's entry, three rounds alternating (session 29's harness)."""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../h100-2026-11-23-s29/scripts"))
from s29_ab import run

cases = {(128, True, S): {"off": dict(SPLIT_PV_WAIT=False), "on": dict(SPLIT_PV_WAIT=True)}
         for S in (1024, 2048, 4096, 8192, 16384)}
run(cases, "s30_ab2", over_table=True, rounds=3)
