"""Session 29, call 2 (with `pingpong.patch`): PINGPONG (the two consumer warpgroups take turns issuing their products:
FA3's warp-scheduler barriers, as mbarriers) beside the table's configs."""
from s29_ab import W, run

P = dict(W, PINGPONG=True)
run({(64, True, 1024): {"table": None, "bn128": dict(W), "bn128-pp": P},
     (64, True, 2048): {"table": None, "pp": P}, (64, True, 4096): {"table": None, "pp": P},
     (64, False, 1024): {"table": None, "pp": P}, (64, False, 4096): {"table": None, "pp": P},
     (128, True, 2048): {"table": None, "pp-q1": dict(P, Q_STAGES=1)}, (128, False, 2048): {"table": None, "pp": P}},
    "s29_pp")
