"""Session 42: NCHW GroupNorm + SiLU forward at batch-2 levels (SDXL 1024^2, SD-1.5 512^2) under forced plans of the
Gluon forward (K chunks per group) vs the Triton plans (plan None), graph-timed, 3 rounds in rotating order."""
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops import group_norm as gnm
from flashfuse.ops.group_norm_details import _hopper_fwd as hf

SHAPES = {(2, 320, 128): (None, 2, 5, 10), (2, 640, 64): (None, 2, 4, 5, 10), (2, 1280, 32): (None, 2, 4, 5, 8, 10),
          (2, 320, 64): (None, 2, 5), (2, 960, 32): (None, 2, 3, 5), (16, 640, 64): (1, 2, 4)}
orig = hf.plan
sms = torch.cuda.get_device_properties(0).multi_processor_count


def forced(k):
    def plan(n, c, hw, groups, element_size, sms_, *a, **kw):
        if k is None:
            return None
        cols, tile_rows = hf.ROW_BYTES // element_size, hf.TILE_BYTES // hf.ROW_BYTES
        cpg, rpc, n_groups = c // groups, hw // cols, n * groups
        return hf.Plan(k, cpg // k * rpc, min(sms_ // k, n_groups))
    return plan


for (n, c, h), ks in SHAPES.items():
    torch.manual_seed(0)
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16)
    temb = torch.randn(n, c, 1, 1, device="cuda", dtype=torch.bfloat16)
    w = 1 + 0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)
    b = 0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)
    default = orig(n, c, h * h, 32, 2, sms)
    res = {}
    for temb_on in (False, True):
        ref = None
        outs = {}
        for k in ks:
            hf.plan = forced(k)
            f = lambda: gnm.group_norm(x, 32, w, b, 1e-5, activation="silu", residual=temb if temb_on else None)
            y = f().float()
            if ref is None:
                ref = y
            outs[k] = ((y - ref).abs().max() / ref.abs().max()).item()
            res[(temb_on, k)] = []
        for rnd in range(3):
            order = list(ks) if rnd % 2 == 0 else list(reversed(ks))
            for k in order:
                hf.plan = forced(k)
                f = lambda: gnm.group_norm(x, 32, w, b, 1e-5, activation="silu", residual=temb if temb_on else None)
                res[(temb_on, k)].append(do_bench_cudagraph(f, rep=50, return_mode="median") * 1e3)
        gb = 2 * x.numel() * 2 / 1e3
        print(f"({n}, {c}, {h}, {h}) temb={int(temb_on)} default plan {default}")
        for k in ks:
            us = sorted(res[(temb_on, k)])[1]
            print(f"   K={k}  {us:7.1f} us  {gb / us / 3.0:5.1%} of 3.0 TB/s  diff vs first {outs[k]:.1e}  rounds "
                  + " ".join(f"{t:.1f}" for t in res[(temb_on, k)]))
hf.plan = orig
