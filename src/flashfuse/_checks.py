"""Input validation shared by the public functions.

Every message names the argument, the value it got and what is supported, so a user sees at once what
to change (bad input never gives a silent wrong result, a hang or a crash inside a kernel).
"""

from __future__ import annotations

import torch

from ._env import INTERPRET

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_tensor(name: str, t, *, ndims: tuple[int, ...] | None = None, dtypes=FLOAT_DTYPES) -> None:
    """Type, rank, dtype and device of one tensor argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndims is not None and t.dim() not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)} ({t.dim()} dims)")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {names}")
    if not t.is_cuda and not (INTERPRET and t.device.type == "cpu"):
        hint = "" if INTERPRET else " (CPU tensors run only in Triton's interpreter: set TRITON_INTERPRET=1)"
        raise ValueError(f"{name} is on {t.device}; flashfuse kernels need a CUDA tensor{hint}")


def check_same(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...], *, dtype=True, device=True) -> None:
    """All tensors share dtype and/or device."""
    first_name, first = names[0], tensors[0]
    first_index = first.get_device()    # a CUDA device's index (cheaper than .device), -1 elsewhere
    for name, t in zip(names[1:], tensors[1:]):
        if device and (t.get_device() != first_index or (first_index < 0 and t.device != first.device)):
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; "
                             "all inputs must be on one device")
        if dtype and t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
                            "all inputs must share one dtype")


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Kernels take any strides except in the last dim; copy only when that one is strided."""
    return t if t.stride(-1) == 1 else t.contiguous()
