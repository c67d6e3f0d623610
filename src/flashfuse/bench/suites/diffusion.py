"""``diffusion``: the diffusion kernels against PyTorch eager and torch.compile of the same code.

GroupNorm + SiLU as diffusers' ResnetBlock2D runs it (``nonlinearity(norm(x))``, and ``norm2`` after the
time-embedding add), at SD-1.5 / SDXL U-Net levels (32 groups), NCHW and channels_last. Bytes: the forward
reads x and writes y (2 tensors; the time embedding is C values per sample), the backward reads x and dy
and writes dx (3 more). DiT's adaLN-Zero modulation LN(x) * (1 + scale) + shift at DiT-XL/2 size, counted
the same way. Ops are entries of ``OPS`` (see ``_ops.Op``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._ops import Op, OpSuite

GROUPS = 32


def gn_silu_eager(x, w, b):
    return F.silu(F.group_norm(x, GROUPS, w, b, 1e-5))


def gn_temb_silu_eager(x, temb, w, b):
    """ResnetBlock2D's ``norm2(h + temb[:, :, None, None])`` then SiLU."""
    return F.silu(F.group_norm(x + temb, GROUPS, w, b, 1e-5))


def _gn_inputs(p, dtype, device):
    x = torch.randn(p["N"], p["C"], p["H"], p["H"], device=device, dtype=dtype)
    if p["layout"] == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = 1.0 + 0.1 * torch.randn(p["C"], device=device, dtype=dtype)
    return x, w, 0.1 * torch.randn(p["C"], device=device, dtype=dtype)


def _gn_temb_inputs(p, dtype, device):
    x, w, b = _gn_inputs(p, dtype, device)
    return x, torch.randn(p["N"], p["C"], 1, 1, device=device, dtype=dtype), w, b


def _gn_ff(x, w, b):
    from flashfuse.ops.group_norm import group_norm
    return group_norm(x, GROUPS, w, b, 1e-5, activation="silu")


def _gn_temb_ff(x, temb, w, b):
    from flashfuse.ops.group_norm import group_norm
    return group_norm(x, GROUPS, w, b, 1e-5, activation="silu", residual=temb)


def _numel(p):
    return p["N"] * p["C"] * p["H"] * p["H"]


def ada_ln_eager(x, scale, shift):
    """DiT's adaLN-Zero modulation (diffusers' AdaLayerNormZero): LN(x) * (1 + scale) + shift."""
    return F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]


def _ada_ln_inputs(p, dtype, device):
    x = torch.randn(p["B"], p["T"], p["D"], device=device, dtype=dtype)
    return x, 0.1 * torch.randn(p["B"], p["D"], device=device, dtype=dtype), \
        0.1 * torch.randn(p["B"], p["D"], device=device, dtype=dtype)


def _ada_ln_ff(x, scale, shift):
    from flashfuse.ops.modulation import ada_layer_norm
    return ada_layer_norm(x, scale, shift, 1e-6)


def _tokens(p):
    return p["B"] * p["T"] * p["D"]


# SD-1.5 U-Net levels at 512x512 (64x64 latents) with batch 2 (CFG), one of its up blocks' concatenations (960
# channels: 30 per group), the protocol's training-size levels, and SDXL's three levels at 1024x1024 (128x128
# latents, batch 2).
GN_SHAPES = tuple(dict(N=n, C=c, H=h, layout=layout)
                  for n, c, h in ((2, 320, 64), (2, 960, 32), (8, 320, 128), (16, 640, 64), (16, 1280, 32),
                                  (2, 320, 128), (2, 640, 64), (2, 1280, 32))
                  for layout in ("nchw", "channels_last"))
GN_CPU = (dict(N=2, C=64, H=5, layout="nchw"), dict(N=2, C=64, H=5, layout="channels_last"))

OPS: dict[str, Op] = {
    "group_norm_silu": Op(_gn_inputs, gn_silu_eager, _gn_ff, None, GN_SHAPES, GN_CPU,
                          traffic={"fwd": 2, "fwd+bwd": 5}, numel=_numel),
    "group_norm_temb_silu": Op(_gn_temb_inputs, gn_temb_silu_eager, _gn_temb_ff, None, GN_SHAPES[:2], GN_CPU,
                               traffic={"fwd": 2, "fwd+bwd": 5}, numel=_numel),
    # DiT-XL/2 at 256x256: 256 tokens of 1152 per image; batch 128 puts x (75 MB bf16) beyond L2.
    "ada_layer_norm": Op(_ada_ln_inputs, ada_ln_eager, _ada_ln_ff, None, (dict(B=128, T=256, D=1152),),
                         (dict(B=2, T=7, D=40),), traffic={"fwd": 2, "fwd+bwd": 5}, numel=_tokens),
}


class Diffusion(OpSuite):
    name = "diffusion"
    description = ("diffusion kernels: GroupNorm + SiLU (+ time embedding), NCHW and channels_last; DiT's adaLN "
                   "modulation; vs eager and compile")
    eager_description = "PyTorch eager (diffusers' code)"
    has_liger = False
    ops = OPS
