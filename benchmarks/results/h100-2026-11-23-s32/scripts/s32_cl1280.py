"""Session 32: the channels_last Gluon forward at C = 1280 (bf16: 20 channel blocks, a 64-pixel tile of all C fills 20
of the ring's ~26 slots) with one chunk per round of more than half the ring (plan 'big'), vs the Triton plans that
run there now. Graph-timed us, rounds alternating; outputs vs the Triton plans and dx-free float64 reference."""
import sys
import torch
import flashfuse.ops.group_norm as G
from flashfuse.ops.group_norm_details import _hopper_fwd_cl as CL
from flashfuse.ops._triton import cdiv
from flashfuse.reference.group_norm import group_norm_ref
sys.path.insert(0, ".gpu/s32")
from s28_abtools import gn_inputs, timed

orig_plan = CL.plan


def big_plan(n, c, hw, element_size, sms):
    """plan() where a pixel tile of all C overflows half the ring: one 64-pixel chunk per program and round."""
    p = orig_plan(n, c, hw, element_size, sms)
    if p is not None:
        return p
    box_c = CL.BOX_BYTES // element_size
    if c % box_c:
        return None
    n_cb = c // box_c
    ring = CL.SMEM_BYTES - CL.SCRATCH_BYTES - CL._tables_bytes(c, element_size)
    slots = ring // (CL.TILE_P * CL.BOX_BYTES + 16)
    if slots < n_cb:
        return None
    k = cdiv(hw, CL.TILE_P)
    if k > sms:
        return None
    per_round = min(sms // k, n)
    return CL.Plan(CL.TILE_P, slots, CL.TILE_P, k, per_round)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


for shape in [(16, 1280, 32, 32), (8, 1280, 32, 32), (4, 1280, 32, 32), (16, 1280, 16, 16), (32, 1280, 16, 16)]:
    for temb in (False, True):
      try:
        x, w, b, r = gn_inputs(shape, temb)
        x = x.contiguous(memory_format=torch.channels_last)
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        t = {"triton": [], "big": []}
        outs = {}
        for rnd in range(3):
            for name in (("triton", "big") if rnd % 2 == 0 else ("big", "triton")):
                CL.plan = orig_plan if name == "triton" else big_plan
                outs[name] = [v.clone() for v in f()]
                t[name].append(timed(f))
        CL.plan = big_plan
        p = big_plan(shape[0], shape[1], shape[2] * shape[3], 2, torch.cuda.get_device_properties(0).multi_processor_count)
        el = CL.eligible(x, 32, "silu", None if r is None else (shape[1], 1, 0), outs["big"][0])
        CL.plan = orig_plan
        ref = group_norm_ref(x.double(), 32, w.double(), b.double(), 1e-5, "silu", None if r is None else r.double())
        print(f"{str(shape):18s} temb={int(temb)} gluon={int(el)} plan={p} triton {min(t['triton']):6.1f} "
              f"big {min(t['big']):6.1f} ({min(t['big']) / min(t['triton']):.3f})  err triton {rel(outs['triton'][0], ref):.1e} "
              f"big {rel(outs['big'][0], ref):.1e} mean {rel(outs['big'][1], outs['triton'][1]):.1e} "
              f"rstd {rel(outs['big'][2], outs['triton'][2]):.1e}  clone {timed(lambda: x.clone()):5.1f}", flush=True)
      except Exception as e:
        CL.plan = orig_plan
        print(shape, temb, "FAILED", repr(e)[:600], flush=True)
