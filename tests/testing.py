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


def spawn_nvls_off(worker, args, nprocs: int) -> None:
    """torch.multiprocessing.spawn(worker, args, nprocs) with NVLink multicast off in the children (they inherit
    flashfuse.distributed.NVLS_OFF_ENV, as the device README requires on GPU hosts); the parent's environment is
    restored afterwards. A child's exception fails the caller here."""
    import os

    import torch.multiprocessing as mp

    from flashfuse.distributed import NVLS_OFF_ENV, disable_nvlink_multicast

    saved = {k: os.environ.get(k) for k in NVLS_OFF_ENV}
    disable_nvlink_multicast()
    try:
        mp.spawn(worker, args=args, nprocs=nprocs, join=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
