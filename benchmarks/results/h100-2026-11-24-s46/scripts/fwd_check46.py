"""Session 46: offline triton 3.6 sm_90 compiles of the forward at 64 + 16 / 32 columns (hd80 / hd96)."""
import os, sys
sys.argv = [sys.argv[0], sys.argv[1] if len(sys.argv) > 1 else "src"]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../benchmarks/results/h100-2026-11-24-s43/scripts"))
import fwd_check43 as F
H = F.H
W = H._WARP_SPECIALIZED
cases = []
for t in (16, 32):
    cases += [(False, True, dict(TAIL_DIM=t)), (False, True, dict(TAIL_DIM=t, O_FROM_REGS=True)),
              (False, True, dict(TAIL_DIM=t, CONSUMERS=3, BLOCK_M=192, CONSUMER_REGS=160)),
              (True, True, dict(TAIL_DIM=t, BLOCK_N=64, NUM_STAGES=3)), (True, True, dict(TAIL_DIM=t, NUM_STAGES=3)),
              (True, True, dict(TAIL_DIM=t)), (True, False, dict(TAIL_DIM=t, Q_STAGES=1))]
for causal, paired, cfg in cases:
    try:
        F.compile_fwd(64, causal, paired=paired, cfg=cfg)
    except Exception as e:
        print(f"causal={causal} {cfg}: FAILED {type(e).__name__}: {str(e)[:2000]}", flush=True)
