"""Session 29, call 1 (with `half_last.patch`): HALF_LAST (128-key tiles; a warpgroup that sees only the first half of
its last key block multiplies that half alone) beside the table, 64-key and 128-key tiles, causal S = 512..4096."""
from s29_ab import W, run

HD64 = {"table": None, "bn64-st3": dict(W, BLOCK_N=64, NUM_STAGES=3), "bn128": dict(W),
        "bn128-half": dict(W, HALF_LAST=True), "bn128-half-st3": dict(W, HALF_LAST=True, NUM_STAGES=3)}
HD128 = {"table": None, "bn64-st3": dict(W, BLOCK_N=64, NUM_STAGES=3), "bn128-q1": dict(W, Q_STAGES=1),
         "bn128-q1-half": dict(W, Q_STAGES=1, HALF_LAST=True), "bn128-q2-half": dict(W, HALF_LAST=True)}
run({**{(64, True, S): HD64 for S in (512, 1024, 2048, 4096)}, **{(128, True, S): HD128 for S in (512, 1024, 2048)}},
    "s29_fwd")
