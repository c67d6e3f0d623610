"""Session 29, call 5 (with O_DIRECT, not kept as a patch: the epilogue stores O from the wgmma registers with
gl.store through a pointer and strides, instead of shared memory + fence + barrier + TMA) over the table's configs."""
from s29_ab import run

D = dict(O_DIRECT=True)
run({key: {"table": None, "direct": D} for key in ((64, True, 512), (64, True, 1024), (64, True, 2048), (64, True, 4096),
                                                   (64, False, 1024), (64, False, 4096), (128, True, 1024),
                                                   (128, True, 4096), (128, False, 2048))}, "s29_direct", over_table=True)
