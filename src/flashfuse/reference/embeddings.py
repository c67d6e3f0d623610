"""Sinusoidal timestep embeddings (Ho et al. 2020, after the Transformer's positional encodings), in float64:
the reference for flashfuse.ops.embeddings.

    freq_j = exp(-ln(max_period) j / (dim // 2 - downscale_freq_shift)),   j = 0 .. dim // 2 - 1
    emb_t  = [sin(scale t freq), cos(scale t freq)]     ([cos, sin] with flip_sin_to_cos; a zero column for odd dim)
"""

from __future__ import annotations

import math

import torch


def timestep_embedding_ref(timesteps, dim, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0,
                           max_period=10000):
    """(N, dim) float64 embedding of (N,) timesteps, and the (N, dim // 2) arguments of its sin / cos."""
    half = dim // 2
    j = torch.arange(half, dtype=torch.float64, device=timesteps.device)
    freq = torch.exp(-math.log(max_period) * j / (half - downscale_freq_shift))
    arg = scale * timesteps.double()[:, None] * freq[None, :]
    parts = [torch.cos(arg), torch.sin(arg)] if flip_sin_to_cos else [torch.sin(arg), torch.cos(arg)]
    emb = torch.cat(parts + [arg.new_zeros(arg.shape[0], dim % 2)], dim=1)
    return emb, arg
