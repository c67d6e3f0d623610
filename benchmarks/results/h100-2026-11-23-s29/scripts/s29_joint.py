"""Session 29, call 3 (with KV_JOINT, not kept as a patch: the producer waits on v_empty before a slot's K and V loads,
the consumers no longer arrive on k_empty): one release per K / V slot, after its P V, so one mbarrier arrive and one
partition barrier fewer per key block; over the table's configs."""
from s29_ab import run

J = dict(KV_JOINT=True)
J3 = dict(J, NUM_STAGES=3)
run({(64, True, 1024): {"table": None, "joint": J, "joint-bn128-st3": dict(J3, BLOCK_N=128)},
     (64, True, 2048): {"table": None, "joint": J, "joint-st3": J3},
     (64, True, 4096): {"table": None, "joint": J, "joint-st3": J3},
     (64, False, 1024): {"table": None, "joint": J, "joint-st3": J3},
     (64, False, 4096): {"table": None, "joint": J, "joint-st3": J3},
     (64, False, 16384): {"table": None, "joint": J},
     (128, True, 1024): {"table": None, "joint": J}, (128, True, 4096): {"table": None, "joint": J},
     (128, False, 2048): {"table": None, "joint": J}}, "s29_joint", over_table=True)
