"""Session 37: does the two compute partitions' phase matter? Partition 1 of the channels_last Gluon forward starts
DELAY ns late (a globaltimer spin), so that its rounds run half a cycle behind partition 0's; bf16, graph-timed."""
import importlib, sys, torch
sys.path.insert(0, ".gpu")
SRC = "src/flashfuse/ops/group_norm_details"
base = open(f"{SRC}/_hopper_fwd_cl.py").read()
anchor = "        for i in range(PART, gl.cdiv(n_samples - first, per_round), PARTS):\n"
assert base.count(anchor) == 1
spin = '''        if PART == 1:
            t_start = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            t_now = t_start
            while t_now - t_start < DELAY_NS:
                t_now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
'''
mods = {}
import flashfuse.ops.group_norm as G
mods["d0"] = G.hopper_fwd_cl
for d in (3000, 6000, 9000):
    s = base.replace(anchor, spin + anchor).replace("BOX_C: gl.constexpr = 128", "BOX_C: gl.constexpr = 128")
    s = s.replace("if gluon is not None:\n    @gluon.jit\n    def _channel_index", f"if gluon is not None:\n    DELAY_NS = gl.constexpr({d})\n\n    @gluon.jit\n    def _channel_index")
    assert f"DELAY_NS = gl.constexpr({d})" in s
    open(f"{SRC}/_hopper_fwd_cl_d{d}.py", "w").write(s)
    mods[f"d{d}"] = importlib.import_module(f"flashfuse.ops.group_norm_details._hopper_fwd_cl_d{d}")
from s28_abtools import alternate, gn_inputs, same, timed
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 320, 64, 64), (8, 320, 64, 64)]:
    x, w, b, r = gn_inputs(shape, False)
    x = x.contiguous(memory_format=torch.channels_last)
    ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
    outs, t = alternate(mods, lambda m: setattr(G, "hopper_fwd_cl", m), ff, 3)
    print(f"{str(shape):18s} " + " ".join(f"{k} {v:6.1f}" for k, v in t.items()) + " " +
          " ".join("same" if same(outs["d0"], o) else "DIFFER" for o in outs.values()), flush=True)
