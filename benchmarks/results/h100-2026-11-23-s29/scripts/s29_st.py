"""Session 29, call 4: the hd64 causal forward on 128-key tiles with 3 / 4 stages, KV_JOINT on / off (see
s29_joint.py), over the table's configs."""
from s29_ab import run

B3, B4, J = dict(BLOCK_N=128, NUM_STAGES=3), dict(BLOCK_N=128, NUM_STAGES=4), dict(KV_JOINT=True)
ALL = {"table": None, "bn128-st3": B3, "bn128-st3-joint": dict(B3, **J), "bn128-st4": B4, "bn128-st4-joint": dict(B4, **J)}
run({(64, True, 512): ALL, (64, True, 1024): ALL,
     (64, True, 2048): {k: ALL[k] for k in ("table", "bn128-st3", "bn128-st3-joint", "bn128-st4")},
     (64, True, 8192): {k: ALL[k] for k in ("table", "bn128-st3", "bn128-st3-joint")}}, "s29_st", over_table=True)
