"""Vector add, the "hello world" of GPU kernels, written twice: in Triton and in CUDA C++.

    out[i] = a[i] + b[i]

Two loads and one store per add: nothing to compute, everything to move. Both kernels are judged by
one number, the fraction of device-to-device copy bandwidth they reach on vectors much larger than L2.

- backend="triton": the kernel below. Triton picks the vector width, the coalescing and the index
  arithmetic from BLOCK and the pointer alignment it sees; the same code runs in Triton's interpreter
  on the CPU.
- backend="cuda": ``ops/csrc/vector_add.cu``, the same kernel by hand (16-byte loads where aligned, a
  scalar tail, a grid-stride loop), compiled at first use with torch.utils.cpp_extension.load_inline
  for the current GPU's compute capability and cached (in memory, and on disk by torch).
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import torch
import triton
import triton.language as tl

from .._checks import check_same, check_tensor
from ._triton import IN_INTERPRETER, cdiv

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32)
BACKENDS = ("triton", "cuda")
_CUDA_SOURCE = Path(__file__).with_name("csrc") / "vector_add.cu"


# 4096 elements per program with 8 warps = 16 elements per thread: four 16-byte loads per input in fp32
# (two in fp16/bf16), all issued before the first returns, so each program keeps 32 KiB (fp32) of loads
# in flight; with many programs per SM that covers HBM latency. The offsets are int64 (program id cast
# first), so vectors beyond 2^31 elements work.
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _vector_add_kernel(p_a, p_b, p_out, n, BLOCK: tl.constexpr):
    i_pid = tl.program_id(0).to(tl.int64)
    start = i_pid * BLOCK
    o = start + tl.arange(0, BLOCK)                                       # [BLOCK] element offsets
    # Full blocks go without a mask. A mask `o < n` is known to be constant over 16-byte groups only
    # when Triton sees n % 16 == 0, so for any other n a masked access is split into scalar ones; the
    # unmasked path gets 16-byte accesses whenever the pointers are 16-byte aligned (Triton checks that
    # at launch). Only the last block, the partial one, takes the masked path.
    if start + BLOCK <= n:
        tl.store(p_out + o, _add(tl.load(p_a + o), tl.load(p_b + o)))
    else:
        m = o < n
        tl.store(p_out + o, _add(tl.load(p_a + o, mask=m), tl.load(p_b + o, mask=m)), mask=m)


@triton.jit
def _add(b_a, b_b):
    if b_a.dtype.is_fp16() or b_a.dtype.is_bf16():
        # Add in fp32, then round to 16 bits: the correctly rounded 16-bit sum (fp32 carries at least
        # 2p + 2 bits of the p-bit formats, which makes rounding twice the same as rounding once), so
        # identical to torch's; and it runs in the interpreter, whose numpy has no bf16 arithmetic.
        # Free here: the kernel waits on memory, not on adds.
        return _round_fp32_to(b_a.to(tl.float32) + b_b.to(tl.float32), b_a.dtype)
    else:
        return b_a + b_b                                                  # fp32, fp64; int32 wraps


@triton.jit
def _round_fp32_to(x, dtype: tl.constexpr):
    """fp32 -> dtype, rounding to nearest, ties to even: what ``x.to(dtype)`` does when compiled.

    Triton's interpreter truncates fp32 -> bf16 instead (seen with triton 3.9), so there the rounding is
    done on the bits: add 0x7FFF (half a bf16 ulp, less one) plus the lowest kept bit (ties go to
    even), then drop the 16 low bits. Infinities and NaNs keep their class.
    """
    if IN_INTERPRETER and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


def vector_add_triton(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = a + b for contiguous tensors of one shape and dtype (no checks: see vector_add)."""
    n = a.numel()
    if n:
        _vector_add_kernel[(cdiv(n, BLOCK),)](a, b, out, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out


@functools.lru_cache(maxsize=None)
def _cuda_unavailable_reason() -> str | None:
    """Why backend="cuda" cannot run here, or None when it can. Cached: the ninja check runs a
    subprocess, which cost ~1 ms per call before it was cached (seen on an H200)."""
    fallback = ("backend='triton' runs everywhere: compiled on a GPU, in Triton's interpreter on the CPU "
                "(TRITON_INTERPRET=1, which flashfuse sets when there is no GPU)")
    if not torch.cuda.is_available():
        build = " (this torch build has no CUDA)" if torch.version.cuda is None else ""
        return (f"vector_add(backend='cuda') runs a CUDA C++ kernel and needs a CUDA GPU; torch sees none"
                f"{build}. {fallback}")
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        return ("vector_add(backend='cuda') compiles ops/csrc/vector_add.cu at first use and needs nvcc, "
                f"which was not found (install the CUDA toolkit, or set CUDA_HOME). {fallback}")
    if not cpp_extension.is_ninja_available():
        return ("vector_add(backend='cuda') compiles ops/csrc/vector_add.cu with torch.utils.cpp_extension, "
                f"which needs ninja (pip install ninja). {fallback}")
    return None


@functools.lru_cache(maxsize=None)
def _cuda_module(major: int, minor: int):
    """Compile (once per process and compute capability; torch also caches the build on disk)."""
    from torch.utils.cpp_extension import load_inline

    arch = f"{major}{minor}"
    options = {}
    if "no_implicit_headers" in inspect.signature(load_inline).parameters:
        options["no_implicit_headers"] = True                             # the .cu includes what it uses
    return load_inline(
        name=f"flashfuse_vector_add_sm{arch}",
        cpp_sources="#include <torch/extension.h>\nvoid vector_add(at::Tensor a, at::Tensor b, at::Tensor out);",
        cuda_sources=_CUDA_SOURCE.read_text(),
        functions=["vector_add"],
        # Only this device's architecture (SASS, no PTX to JIT): the smallest build, the fastest compile.
        extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_cflags=["-O3"],
        **options,
    )


def vector_add_cuda(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = a + b with the CUDA C++ kernel, for contiguous CUDA tensors (no checks: see vector_add)."""
    _cuda_module(*torch.cuda.get_device_capability(a.device)).vector_add(a, b, out)
    return out


def vector_add(a: torch.Tensor, b: torch.Tensor, *, backend: str = "triton") -> torch.Tensor:
    """Elementwise ``a + b`` with a Triton kernel (``backend="triton"``) or a CUDA C++ one (``"cuda"``).

    a, b: tensors of one shape (any, no broadcasting), one dtype (fp16, bf16, fp32, fp64 or int32,
    integers wrap around like torch's) and one device. Returns a new contiguous tensor of that shape.
    Non-contiguous inputs are copied to contiguous memory first (both kernels read flat memory).
    The CUDA backend needs a CUDA GPU, nvcc and ninja, and compiles at first use (tens of seconds).

    Example::

        a, b = torch.randn(10**8, device="cuda"), torch.randn(10**8, device="cuda")
        out = vector_add(a, b, backend="cuda")
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "cuda":
        reason = _cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
    check_tensor("a", a, dtypes=SUPPORTED_DTYPES)
    check_tensor("b", b, dtypes=SUPPORTED_DTYPES)
    check_same(("a", "b"), (a, b))
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (no broadcasting), got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if backend == "cuda" and a.device.type != "cuda":
        raise ValueError(f"backend='cuda' needs CUDA tensors, got tensors on {a.device}")
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a, memory_format=torch.contiguous_format)
    return (vector_add_cuda if backend == "cuda" else vector_add_triton)(a, b, out)
