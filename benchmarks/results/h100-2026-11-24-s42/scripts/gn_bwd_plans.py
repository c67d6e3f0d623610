"""Session 42: NCHW GroupNorm + SiLU forward + backward at batch-2 levels under forced plans of the Gluon backward
(K chunks per group; one round leaves one of its two compute partitions idle) vs the Triton plans (None);
graph-timed fwd+bwd (the forward's plan unchanged), 3 rounds in alternating order, gradients compared."""
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops import group_norm as gnm
from flashfuse.ops.group_norm_details import _hopper_bwd as hb, _hopper_fwd as hf

orig = hb.plan
SHAPES = {(2, 640, 64): ("default", None, 4, 5), (2, 1280, 32): ("default", None, 4, 5), (2, 320, 64): ("default", None, 5),
          (2, 960, 32): ("default", None, 3, 5), (2, 320, 128): ("default", None, 5)}


def forced(k):
    def plan(n, c, hw, groups, element_size, sms_):
        if k == "default":
            return orig(n, c, hw, groups, element_size, sms_)
        if k is None:
            return None
        cols = hf.ROW_BYTES // element_size
        cpg, rpc, n_groups = c // groups, hw // cols, n * groups
        return hf.Plan(k, cpg // k * rpc, min(sms_ // k, n_groups))
    return plan


for (n, c, h), ks in SHAPES.items():
    torch.manual_seed(0)
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)).requires_grad_()
    b = (0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)).requires_grad_()
    dy = torch.randn_like(x)
    print(f"({n}, {c}, {h}, {h}) backward default plan {orig(n, c, h * h, 32, 2, 132)}", flush=True)
    f = lambda: torch.autograd.grad(gnm.group_norm(x, 32, w, b, 1e-5, activation="silu"), (x, w, b), dy)
    res, diffs, ref = {k: [] for k in ks}, {}, None
    for k in ks:
        hb.plan = forced(k)
        g = [t.float() for t in f()]
        ref = g if ref is None else ref
        diffs[k] = max(((a - r).abs().max() / r.abs().max()).item() for a, r in zip(g, ref))
    for rnd in range(3):
        for k in (ks if rnd % 2 == 0 else ks[::-1]):
            hb.plan = forced(k)
            res[k].append(do_bench_cudagraph(f, rep=50, return_mode="median") * 1e3)
    for k in ks:
        us = sorted(res[k])[1]
        print(f"   K={k}  fwd+bwd {us:6.1f} us  {5 * x.numel() * 2 / us / 1e3 / 3000:.1%} of copy  diff {diffs[k]:.1e}  rounds "
              + " ".join(f"{t:.1f}" for t in res[k]), flush=True)
hb.plan = orig
