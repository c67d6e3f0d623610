"""Vector add, both backends. a + b is exact up to one rounding, which torch and both kernels do the
same way (fp16/bf16: the correctly rounded sum), so results must equal torch's bit for bit."""

import pytest
import torch

from flashfuse.ops import vector_add as va
from flashfuse.ops.vector_add import vector_add

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def check_equal(out, a, b):
    expect = a + b
    assert out.shape == expect.shape and out.dtype == expect.dtype and out.device == expect.device
    assert out.is_contiguous()
    if out.is_floating_point():
        assert torch.isfinite(out).all()
    assert torch.equal(out, expect), f"max abs diff {(out.double() - expect.double()).abs().max().item()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("n", [1, 17, 1000, 4097])
def test_triton_backend(n, dtype, device):
    a = torch.randn(n, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    check_equal(vector_add(a, b), a, b)


def test_triton_backend_shapes_and_dtypes(device):
    a, b = torch.randn(3, 5, 7, device=device, dtype=torch.float64), torch.randn(3, 5, 7, device=device,
                                                                                   dtype=torch.float64)
    check_equal(vector_add(a, b), a, b)                                   # any shape, fp64
    check_equal(vector_add(a.transpose(0, 2), b.transpose(0, 2)), a.transpose(0, 2), b.transpose(0, 2))
    i = torch.tensor([2**31 - 1, -(2**31), 5, -7], dtype=torch.int32, device=device)
    j = torch.tensor([1, -1, 6, 7], dtype=torch.int32, device=device)
    check_equal(vector_add(i, j), i, j)                                   # int32 wraps like torch
    e = torch.empty(0, 4, device=device)
    assert vector_add(e, e).shape == (0, 4)


def test_bad_inputs(device):
    a = torch.randn(8, device=device)
    with pytest.raises(ValueError, match="same shape"):
        vector_add(a, torch.randn(9, device=device))
    with pytest.raises(ValueError, match="same shape"):
        vector_add(a, torch.randn(1, device=device))                      # no broadcasting
    with pytest.raises(TypeError, match="b has dtype torch.float16 but a has torch.float32"):
        vector_add(a, a.half())
    with pytest.raises(TypeError, match="a has dtype torch.int64; supported"):
        vector_add(a.long(), a.long())
    with pytest.raises(TypeError, match="b must be a torch.Tensor"):
        vector_add(a, 1.0)
    with pytest.raises(ValueError, match="backend must be one of"):
        vector_add(a, a, backend="numpy")
    with pytest.raises(ValueError, match="a is on meta"):
        vector_add(a.to("meta"), a.to("meta"))


def test_cuda_backend_unavailable_messages(monkeypatch, device):
    """Without a GPU (forced here on any machine) or without nvcc, backend='cuda' says why and points to
    the Triton backend, which runs in the interpreter."""
    a = torch.randn(8, device=device)
    # The reason is cached per process (the ninja check runs a subprocess): clear it around each patch.
    va._cuda_unavailable_reason.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        with pytest.raises(RuntimeError, match=r"needs a CUDA GPU; torch sees none.*backend='triton' runs everywhere"):
            vector_add(a, a, backend="cuda")
        from torch.utils import cpp_extension

        va._cuda_unavailable_reason.cache_clear()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
        with pytest.raises(RuntimeError, match=r"needs nvcc.*interpreter"):
            vector_add(a, a, backend="cuda")
    finally:
        va._cuda_unavailable_reason.cache_clear()


def test_cuda_backend_on_this_machine(device):
    """Where CUDA is absent, backend='cuda' raises the RuntimeError; where it exists, it computes."""
    a, b = torch.randn(1001, device=device), torch.randn(1001, device=device)
    if va._cuda_unavailable_reason() is None:
        check_equal(vector_add(a, b, backend="cuda"), a, b)
    else:
        with pytest.raises(RuntimeError, match="backend='triton'"):
            vector_add(a, b, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32],
                         ids=["fp32", "fp16", "bf16", "fp64", "int32"])
def test_gpu_large(backend, dtype):
    """Large vectors (beyond L2), odd lengths (scalar tails), misaligned views (the CUDA scalar path)."""
    for n in [2**26 + 3, 2**24, 5, 4097]:
        if dtype == torch.int32:
            a = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
            b = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
        else:
            a = torch.randn(n, device="cuda").to(dtype)
            b = torch.randn(n, device="cuda").to(dtype)
        check_equal(vector_add(a, b, backend=backend), a, b)
        a1, b1 = a[1:], b[:-1]                                            # 1 element off 16-byte alignment
        check_equal(vector_add(a1, b1, backend=backend), a1, b1)
