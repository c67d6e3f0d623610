"""Helpers the op tests share."""

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64. NaN anywhere in out gives NaN, which fails every `<= tol` check."""
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
