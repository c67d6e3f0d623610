"""Small pieces every Triton kernel file shares."""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .._env import INTERPRET

# Triton's interpreter computes tl.dot with numpy, which has no bfloat16: a bf16 x bf16 dot there gives
# garbage (seen with triton 3.9). In the interpreter, `dot` upcasts the operands to fp32 first (exact
# for bf16 inputs); compiled, it is a plain tensor-core tl.dot.
IN_INTERPRETER = tl.constexpr(INTERPRET)


@triton.jit
def dot(a, b, acc):
    """acc + a @ b with fp32 accumulation. fp32 operands on the GPU use "tf32x3" (three tf32 products on
    tensor cores, close to fp32 accuracy; plain tf32 would cost ~1e-3 relative error)."""
    if IN_INTERPRETER:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    elif a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def tanh(x):
    """tanh with relative accuracy near 0 (libdevice's, 2 ulp). The interpreter has no libdevice: there
    tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|), exact enough in numpy's fp32."""
    if IN_INTERPRETER:
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)
    else:
        return libdevice.tanh(x)


@functools.lru_cache(maxsize=None)
def _sm_count_of(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (the current one when it has no index), cached: launch
    plans size their grids with it."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


def tma_scratch(size: int, alignment: int, stream):
    """Global scratch for device-side tensor descriptors (TMA; 128 bytes per descriptor per program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def ensure_tma_allocator() -> None:
    """Kernels that build tensor descriptors on the device need triton.set_allocator: set tma_scratch
    unless the caller set an allocator (a context variable: per thread)."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(tma_scratch)


# Host-side integer helpers. triton.cdiv and triton.next_power_of_2 are constexpr functions since triton 3.x:
# called from Python they wrap and unwrap every argument, ~2 us a call here and ~10 us on the GPU machine's
# CPU, several times per launch. Launch plans use these plain versions instead.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int, minimum: int = 1) -> int:
    return max(1 << (n - 1).bit_length() if n > 0 else 1, minimum)
