"""Helpers the op tests share."""

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64. NaN anywhere in out gives NaN, which fails every `<= tol` check."""
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def nan_alloc(shape, dtype, device):
    """Stands in for an op file's ``_alloc`` in tests: buffers born NaN, so an element a kernel forgets to
    write fails the comparison."""
    return torch.full(shape if isinstance(shape, tuple) else (shape,), float("nan"), dtype=dtype, device=device)
