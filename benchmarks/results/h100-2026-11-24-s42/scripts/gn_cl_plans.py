"""Session 42: channels_last GroupNorm + SiLU forward at batch-2 levels: the Gluon forward's default plan (one round
there: one chunk per program, a compute partition idle), 32-pixel chunks in two rounds, and the Triton plans (None);
graph-timed, 3 rounds in alternating order, outputs compared."""
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops import group_norm as gnm
from flashfuse.ops.group_norm_details import _hopper_fwd_cl as cl

orig = cl.plan


def variant(name):
    def plan(n, c, hw, es, sms):
        p = orig(n, c, hw, es, sms)
        if name == "default" or p is None:
            return p
        if name == "triton":
            return None
        box_c = cl.BOX_BYTES // es
        ring = cl.SMEM_BYTES - cl.SCRATCH_BYTES - cl._tables_bytes(c, es)
        slots = ring // (32 * cl.BOX_BYTES + 16)
        k = -(-hw // 32)
        return cl.Plan(32, slots, 32, k, max(1, min(sms // k, n)))
    return plan


for (n, c, h) in ((2, 640, 64), (2, 320, 64), (2, 320, 128)):
    torch.manual_seed(0)
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    temb = torch.randn(n, c, 1, 1, device="cuda", dtype=torch.bfloat16)
    w = 1 + 0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)
    b = 0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)
    print(f"({n}, {c}, {h}, {h}) channels_last default plan {orig(n, c, h * h, 2, 132)}")
    for temb_on in (False, True):
        names = ("default", "triton")
        res, diffs, ref = {k: [] for k in names}, {}, None
        for nm in names:
            cl.plan = variant(nm)
            y = gnm.group_norm(x, 32, w, b, 1e-5, activation="silu", residual=temb if temb_on else None).float()
            ref = y if ref is None else ref
            diffs[nm] = ((y - ref).abs().max() / ref.abs().max()).item()
        for rnd in range(3):
            for nm in (names if rnd % 2 == 0 else names[::-1]):
                cl.plan = variant(nm)
                f = lambda: gnm.group_norm(x, 32, w, b, 1e-5, activation="silu", residual=temb if temb_on else None)
                res[nm].append(do_bench_cudagraph(f, rep=50, return_mode="median") * 1e3)
        for nm in names:
            us = sorted(res[nm])[1]
            print(f"   temb={int(temb_on)} {nm:8s} {us:6.1f} us  {2 * x.numel() * 2 / us / 1e3 / 3000:.1%}  diff {diffs[nm]:.1e}"
                  f"  rounds " + " ".join(f"{t:.1f}" for t in res[nm]))
cl.plan = orig
