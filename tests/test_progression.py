"""The attention progression (flashfuse.attention): basic, vectorized, blocked (+ the flash_attention entry).

Every kernel is compared with attention_ref in float64 (flash-attn layout, so the tensors are transposed
and ``bottom_right=False`` gives torch SDPA's top-left causal mask). Error = ||out - ref|| / ||ref||.
The CPU tier keeps shapes tiny: basic_attention runs one interpreted loop trip per (row, key), about a
millisecond each, so its shapes keep B * H * Sq * Sk small.
"""

import math

import pytest
import torch

from flashfuse.attention import (basic_attention, blocked_attention, flash_attention, naive_attention,
                                 vectorized_attention)
from flashfuse.ops.attention import progression
from flashfuse.reference.attention import attention_ref
from testing import rel_err  # noqa: E402

KERNELS = [basic_attention, vectorized_attention, blocked_attention]
KERNEL_IDS = ["basic", "vectorized", "blocked"]
LAUNCHERS = {
    "basic": progression.basic_attention_forward,
    "vectorized": progression.vectorized_attention_forward,
    "blocked": progression.blocked_attention_forward,
}

# Relative error bounds per input dtype: fp32 allows tf32x3 dots on the GPU (~1e-6); fp16/bf16 allow a
# few units of their rounding (2^-11, 2^-8): the output is rounded once, blocked rounds P once more.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(q, k, v, is_causal=False, scale=None):
    """float64 attention of the given (already rounded) inputs, in their SDPA layout (or (S, D))."""
    single_head = q.dim() == 2
    if single_head:
        q, k, v = (t[None, None] for t in (q, k, v))
    out, _ = attention_ref(*(t.double().transpose(1, 2) for t in (q, k, v)), softmax_scale=scale,
                           causal=is_causal, bottom_right=False)
    out = out.transpose(1, 2)
    return out[0, 0] if single_head else out


def check(out, ref, dtype, tol=None):
    assert out.dtype == dtype and out.shape == ref.shape, (out.dtype, tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all(), "non-finite values in the output"
    err = rel_err(out, ref)
    assert err <= (tol or TOL[dtype]), f"relative error {err:.3e} > {tol or TOL[dtype]:.1e}"


def make(shape_q, shape_kv, dtype, device):
    q = torch.randn(shape_q, dtype=dtype, device=device)
    k = torch.randn(shape_kv, dtype=dtype, device=device)
    v = torch.randn(shape_kv, dtype=dtype, device=device)
    return q, k, v


def test_reference_conventions_agree(device):
    """The test's layout conversion of attention_ref is torch SDPA's (naive_attention), causal top-left."""
    q, k, v = make((2, 4, 7, 16), (2, 2, 11, 16), torch.float64, device)
    for is_causal in (False, True):
        expect = naive_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=is_causal)
        assert rel_err(reference(q, k, v, is_causal), expect) < 1e-6      # naive's softmax runs in fp32
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=is_causal)
        assert rel_err(reference(q, k, v, is_causal), sdpa) < 1e-12


# (batch, nheads_q, nheads_k, seqlen_q, seqlen_k, headdim): GQA, one query, Sq > Sk (causal rows past
# the last key see every key), padded head dims, batch > 1 with MQA and Sq < Sk.
SHAPES = [
    (1, 2, 1, 17, 17, 40),
    (1, 1, 1, 1, 131, 64),
    (1, 1, 1, 77, 5, 111),
    (2, 2, 1, 9, 37, 16),
]


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_progression_fp32(kernel, shape, is_causal, device):
    batch, nheads_q, nheads_k, seqlen_q, seqlen_k, headdim = shape
    q, k, v = make((batch, nheads_q, seqlen_q, headdim), (batch, nheads_k, seqlen_k, headdim),
                   torch.float32, device)
    check(kernel(q, k, v, is_causal=is_causal), reference(q, k, v, is_causal), torch.float32)


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_progression_half(kernel, dtype, device):
    q, k, v = make((1, 2, 13, 40), (1, 1, 23, 40), dtype, device)
    check(kernel(q, k, v, is_causal=True), reference(q, k, v, True), dtype)


# blocked is cheap in the interpreter: shapes with several query blocks and key tiles (BLOCK_M = 64/128,
# BLOCK_N = 16..64), every dtype, and the fp32 head-dim-256 configuration.
@pytest.mark.parametrize("shape", [(1, 4, 2, 131, 77, 96), (1, 2, 2, 77, 131, 64), (1, 1, 1, 131, 131, 200)],
                         ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_blocked_many_tiles(shape, dtype, is_causal, device):
    batch, nheads_q, nheads_k, seqlen_q, seqlen_k, headdim = shape
    q, k, v = make((batch, nheads_q, seqlen_q, headdim), (batch, nheads_k, seqlen_k, headdim), dtype, device)
    check(blocked_attention(q, k, v, is_causal=is_causal), reference(q, k, v, is_causal), dtype)


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_single_head_layout(kernel, device):
    q, k, v = make((17, 59), (29, 59), torch.float32, device)
    out = kernel(q, k, v, is_causal=True)
    assert out.shape == (17, 59)
    check(out, reference(q, k, v, True), torch.float32)


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_strided_inputs_and_scale(kernel, device):
    """q a (B, S, H, D) buffer seen as (B, H, S, D); k/v halves of a packed kv buffer, head dim sliced
    out of a wider one: every stride differs from the contiguous one, nothing needs a copy."""
    batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim = 2, 11, 19, 4, 2, 24
    q = torch.randn(batch, seqlen_q, nheads_q, headdim + 8, device=device)[..., :headdim].transpose(1, 2)
    kv = torch.randn(batch, seqlen_k, 2, nheads_k, headdim, device=device)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    assert not q.is_contiguous() and not k.is_contiguous() and q.stride(-1) == 1
    out = kernel(q, k, v, is_causal=True, scale=0.3)
    check(out, reference(q, k, v, True, scale=0.3), torch.float32)
    assert out.shape == (batch, nheads_q, seqlen_q, headdim)


def test_last_dim_strided_is_copied(device):
    q, k, v = make((1, 2, 9, 16), (1, 2, 12, 16), torch.float32, device)
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)               # same values, last-dim stride 9
    assert qt.stride(-1) != 1
    check(blocked_attention(qt, k, v), reference(q, k, v), torch.float32)


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_launcher_writes_every_output_element(name, device):
    """Launchers write into a given, strided, NaN-poisoned buffer: every element of the view is written
    and nothing outside it is touched."""
    q, k, v = make((1, 2, 19, 24), (1, 1, 7, 24), torch.float32, device)
    buf = torch.full((1, 19, 2, 24 + 5), float("nan"), device=device)
    out = buf[..., :24].transpose(1, 2)
    result = LAUNCHERS[name](q, k, v, is_causal=True, out=out)
    assert result.data_ptr() == out.data_ptr()
    check(out, reference(q, k, v, True), torch.float32)
    assert torch.isnan(buf[..., 24:]).all()


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_degenerate_sizes(kernel, device):
    q, k, v = make((1, 1, 5, 1), (1, 1, 7, 1), torch.float32, device)  # head dim 1
    check(kernel(q, k, v, is_causal=True), reference(q, k, v, True), torch.float32)
    q, k, v = make((1, 2, 0, 8), (1, 2, 5, 8), torch.float32, device)  # no queries
    assert kernel(q, k, v).shape == (1, 2, 0, 8)
    q, k, v = make((1, 2, 3, 8), (1, 2, 0, 8), torch.float32, device)  # no keys: every row is 0
    out = kernel(q, k, v)
    assert out.shape == (1, 2, 3, 8) and (out == 0).all()


def test_vectorized_limit(device):
    headdim = 256
    limit = progression.vectorized_max_seqlen(headdim)
    assert limit == progression.VECTORIZED_MAX_ELEMENTS // 256 == 128
    q, k, v = make((1, 1, 3, 200), (1, 1, limit, 200), torch.float32, device)  # 200 pads to 256
    check(vectorized_attention(q, k, v), reference(q, k, v), torch.float32)
    k, v = (torch.cat([t, t[:, :, :1]], dim=2) for t in (k, v))         # one key more
    with pytest.raises(ValueError, match=r"seqlen_k=129.*32768.*blocked_attention or flash_attention"):
        vectorized_attention(q, k, v)
    q, k, v = make((1, 1, 1, 64), (1, 1, 513, 64), torch.float32, device)
    with pytest.raises(ValueError, match=r"seqlen_k <= 512 at headdim 64"):
        vectorized_attention(q, k, v)


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_requires_grad_is_refused(kernel, device):
    q, k, v = make((1, 1, 4, 16), (1, 1, 4, 16), torch.float32, device)
    k.requires_grad_(True)
    with pytest.raises(NotImplementedError, match=r"forward-only.*flash_attention"):
        kernel(q, k, v)
    with torch.no_grad():                                                 # no graph: fine
        check(kernel(q, k, v), reference(q, k, v), torch.float32)


def _bad_inputs(device):
    f32 = dict(dtype=torch.float32, device=device)
    q, k = torch.randn(1, 4, 8, 16, **f32), torch.randn(1, 2, 8, 16, **f32)
    return {
        "q is list": (([1.0], k, k), {}, TypeError, "q must be a torch.Tensor"),
        "3-D q": ((q[0], k[0], k[0]), {}, ValueError, "q must have 2 or 4 dimensions"),
        "int dtype": ((q.int(), k.int(), k.int()), {}, TypeError, "q has dtype torch.int32; supported"),
        "mixed dtypes": ((q, k.half(), k.half()), {}, TypeError, "k has dtype torch.float16 but q"),
        "mixed ranks": ((q[0, 0], k, k), {}, ValueError, "must all be 4-D .* or all 2-D"),
        "heads": ((torch.randn(1, 3, 8, 16, **f32), k, k), {}, ValueError, "multiple of nheads_k"),
        "headdim 257": ((torch.randn(1, 2, 8, 257, **f32),) * 3, {}, ValueError, "head dim 257 .* 1..256"),
        "headdim q vs k": ((torch.randn(1, 4, 8, 32, **f32), k, k), {}, ValueError, "k has head dim 16 but q"),
        "k vs v": ((q, k, k[:, :, :5]), {}, ValueError, "k and v must have the same shape"),
        "batch": ((torch.randn(2, 4, 8, 16, **f32), k, k), {}, ValueError, "k has batch size 1 but q has 2"),
        "is_causal": ((q, k, k), {"is_causal": 1}, TypeError, "is_causal must be a bool"),
        "scale": ((q, k, k), {"scale": "0.1"}, TypeError, "scale must be None"),
        "device": ((q.to("meta"), k.to("meta"), k.to("meta")), {}, ValueError, "q is on meta"),
    }


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("case", list(_bad_inputs("cpu")))
def test_bad_inputs(kernel, case, device):
    args, kwargs, error, message = _bad_inputs(device)[case]
    with pytest.raises(error, match=message):
        kernel(*args, **kwargs)


def test_flash_attention_progression_entry(device):
    """flash_attention: the same API on FlashAttention, with autograd (4-D GQA causal and (S, D))."""
    tol_grad = 1e-4                                                       # grads sum over more terms
    for shape_q, shape_kv, is_causal in [((2, 4, 13, 40), (2, 2, 21, 40), True), ((17, 24), (9, 24), False)]:
        q, k, v = (t.requires_grad_(True) for t in make(shape_q, shape_kv, torch.float32, device))
        out = flash_attention(q, k, v, is_causal=is_causal)
        q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
        ref = reference(q64, k64, v64, is_causal)
        check(out, ref.detach(), torch.float32)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        ref.backward(grad_out.double())
        for name, t, t64 in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
            assert torch.isfinite(t.grad).all(), name
            err = rel_err(t.grad, t64.grad)
            assert err <= tol_grad, f"{name}: relative error {err:.3e}"


# ---------------------------------------------------------------------------------------------------
# GPU tier: real dtypes and sizes.
# ---------------------------------------------------------------------------------------------------
def _gpu_shapes(kernel_id, headdim):
    """(Sq, Sk) pairs per kernel: vectorized up to its limit, the others up to 2048."""
    if kernel_id == "vectorized":
        longest = progression.vectorized_max_seqlen(headdim)
        return [(1023, longest), (2048, longest - 1)]
    if kernel_id == "basic":
        return [(2048, 2048), (777, 1031)]
    return [(2048, 2048), (1999, 1333)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_progression_gpu(kernel_id, dtype, headdim, is_causal):
    kernel = KERNELS[KERNEL_IDS.index(kernel_id)]
    for seqlen_q, seqlen_k in _gpu_shapes(kernel_id, headdim):
        q, k, v = make((2, 4, seqlen_q, headdim), (2, 2, seqlen_k, headdim), dtype, "cuda")
        check(kernel(q, k, v, is_causal=is_causal), reference(q, k, v, is_causal), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_progression_gpu_fp32(kernel_id, headdim):
    """fp32: basic/vectorized in fp32 FMAs, blocked with tf32x3 dots and its fp32 tile configurations."""
    kernel = KERNELS[KERNEL_IDS.index(kernel_id)]
    seqlen_q, seqlen_k = _gpu_shapes(kernel_id, headdim)[1]
    q, k, v = make((1, 4, seqlen_q, headdim), (1, 4, seqlen_k, headdim), torch.float32, "cuda")
    check(kernel(q, k, v, is_causal=True), reference(q, k, v, True), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_progression_gpu_strided_single_head(kernel_id):
    """(B, S, H, D) views (packed qkv), large B * H, and the single-head layout on the GPU."""
    kernel = KERNELS[KERNEL_IDS.index(kernel_id)]
    seqlen = 255 if kernel_id == "vectorized" else 1537
    qkv = torch.randn(3, seqlen, 3, 16, 128, dtype=torch.bfloat16, device="cuda")
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    check(kernel(q, k, v, is_causal=True), reference(q, k, v, True), torch.bfloat16)
    q, k, v = (t[0, 0] for t in (q, k, v))
    check(kernel(q, k, v, scale=1 / math.sqrt(64)), reference(q, k, v, scale=1 / math.sqrt(64)), torch.bfloat16)
