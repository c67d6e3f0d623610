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
    import torch.multiprocessing as mp

    from flashfuse.distributed import nvlink_multicast_off

    with nvlink_multicast_off():
        mp.spawn(worker, args=args, nprocs=nprocs, join=True)


def write_rank_json(out_dir: str, rank: int, result: dict) -> None:
    """A worker's result, where spawn_and_read_json reads it."""
    import json
    import os

    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def spawn_and_read_json(worker, tmp, nprocs: int) -> list:
    """spawn_nvls_off(worker, (tmp / "init", tmp), nprocs) for workers that rendezvous through the file
    tmp / "init" and write their result with write_rank_json(tmp, rank, result); returns the ranks' results in order, also printed (the
    measured errors, for the log under pytest -s)."""
    import json

    spawn_nvls_off(worker, (str(tmp / "init"), str(tmp)), nprocs)
    out = []
    for r in range(nprocs):
        with open(tmp / f"rank{r}.json") as f:
            out.append(json.load(f))
    print(json.dumps(out, indent=1))
    return out
