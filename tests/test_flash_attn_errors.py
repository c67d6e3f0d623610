"""FlashAttention API, bad input: each raises ValueError / TypeError / NotImplementedError whose message
names the argument (and, where it prints unambiguously, the offending value). Validation happens before
any kernel runs, so these are cheap in either tier.

Exception types follow flashfuse._checks: a wrong dtype (or a non-tensor) is a TypeError, a wrong shape,
rank, device or value is a ValueError.
"""

import pytest
import torch

from attention_utils import cu_seqlens
from flashfuse import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                       flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                       flash_attn_varlen_qkvpacked_func, scaled_dot_product_attention)


def names(*words, value=None):
    """Regex: the message contains one of ``words`` as a whole word (so "k" does not match inside
    "nheads_k" or "kernel"), and ``value`` (as a whole token) when given."""
    alternatives = "|".join(words)
    pattern = rf"(?s)(?=.*(?<![\w.])({alternatives})(?![\w]))"
    if value is not None:
        pattern += rf"(?=.*(?<![\w.]){value}(?![\w]))"
    return pattern


def qkv(device, batch=2, seqlen_q=17, seqlen_k=17, nheads_q=4, nheads_k=4, headdim=32, dtype=torch.float16):
    q = torch.randn(batch, seqlen_q, nheads_q, headdim, device=device).to(dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim, device=device).to(dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim, device=device).to(dtype)
    return q, k, v


def other_device(device):
    """A device the inputs are not on: meta on a CPU machine (the interpreter runs CPU tensors), cpu on a
    GPU machine."""
    return "meta" if device == "cpu" else "cpu"


# ----------------------------------------------------------------------------------------------------
# flash_attn_func
# ----------------------------------------------------------------------------------------------------

def test_heads_not_divisible(device):
    q, k, v = qkv(device, nheads_q=6, nheads_k=4)
    with pytest.raises(ValueError, match=names("k", "nheads_k", "q", "nheads_q", "nheads", value="4")):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("headdim", [300, 0])
def test_headdim_out_of_range(device, headdim):
    q, k, v = qkv(device, headdim=headdim)
    with pytest.raises(ValueError, match=names("q", "headdim", "head_dim", "head dim", value=str(headdim))):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8])
def test_integer_dtype(device, dtype):
    q, k, v = qkv(device)
    q = torch.randint(-3, 3, q.shape, device=device, dtype=dtype)
    with pytest.raises(TypeError, match=names("q", value=str(dtype).replace("torch.", "(torch\\.)?"))):
        flash_attn_func(q, k, v)


def test_float64_dtype(device):
    q, k, v = (t.double() for t in qkv(device))
    with pytest.raises(TypeError, match=names("q", value="(torch\\.)?float64")):
        flash_attn_func(q, k, v)


def test_mismatched_dtypes(device):
    q, k, v = qkv(device)
    with pytest.raises(TypeError, match=names("k", value="(torch\\.)?float32")):
        flash_attn_func(q, k.float(), v)
    with pytest.raises(TypeError, match=names("v", value="(torch\\.)?bfloat16")):
        flash_attn_func(q, k, v.bfloat16())


def test_kv_length_mismatch(device):
    q, k, v = qkv(device, seqlen_k=17)
    with pytest.raises(ValueError, match=names("v", "k")):
        flash_attn_func(q, k, v[:, :16])


def test_kv_heads_mismatch(device):
    q, k, v = qkv(device, nheads_q=4, nheads_k=2)
    with pytest.raises(ValueError, match=names("v", "k")):
        flash_attn_func(q, k, v[:, :, :1])


def test_batch_mismatch(device):
    q, k, v = qkv(device)
    with pytest.raises(ValueError, match=names("k", "v", "q", "batch")):
        flash_attn_func(q, k[:1], v[:1])


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_wrong_rank(device, which):
    tensors = dict(zip("qkv", qkv(device)))
    tensors[which] = tensors[which][0]                                         # 3-D instead of 4-D
    with pytest.raises(ValueError, match=names(which, value="3")):
        flash_attn_func(tensors["q"], tensors["k"], tensors["v"])


def test_not_a_tensor(device):
    q, k, v = qkv(device)
    with pytest.raises(TypeError, match=names("q")):
        flash_attn_func(q.tolist(), k, v)


def test_different_devices(device):
    q, k, v = qkv(device)
    with pytest.raises(ValueError, match=names("k")):
        flash_attn_func(q, k.to(other_device(device)), v)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 4, 1)])
def test_alibi_wrong_shape(device, shape):
    q, k, v = qkv(device, batch=2, nheads_q=4)
    slopes = torch.rand(shape, device=device)
    with pytest.raises(ValueError, match=names("alibi_slopes")):
        flash_attn_func(q, k, v, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_alibi_not_fp32(device, dtype):
    q, k, v = qkv(device, nheads_q=4)
    with pytest.raises(TypeError, match=names("alibi_slopes", value=str(dtype).replace("torch.", "(torch\\.)?"))):
        flash_attn_func(q, k, v, alibi_slopes=torch.rand(4, device=device, dtype=dtype))


@pytest.mark.parametrize("dropout_p", [1.0, 1.5, -0.1])
def test_dropout_p_out_of_range(device, dropout_p):
    q, k, v = qkv(device)
    with pytest.raises(ValueError, match=names("dropout_p")):
        flash_attn_func(q, k, v, dropout_p=dropout_p)


@pytest.mark.parametrize("window", [(-2, 0), (4, -5)])
def test_window_below_minus_one(device, window):
    q, k, v = qkv(device)
    with pytest.raises(ValueError, match=names("window_size", value=str(min(window)))):
        flash_attn_func(q, k, v, window_size=window)


# ----------------------------------------------------------------------------------------------------
# Packed variants
# ----------------------------------------------------------------------------------------------------

def test_qkvpacked_wrong_shape(device):
    qkv_bad = torch.randn(2, 17, 2, 4, 32, device=device).half()              # dim 2 must be 3
    with pytest.raises(ValueError, match=names("qkv")):
        flash_attn_qkvpacked_func(qkv_bad)
    with pytest.raises(ValueError, match=names("qkv")):
        flash_attn_qkvpacked_func(qkv_bad[:, :, 0])                            # 4-D


def test_kvpacked_wrong_shape(device):
    q = torch.randn(2, 17, 4, 32, device=device).half()
    kv_bad = torch.randn(2, 17, 3, 4, 32, device=device).half()               # dim 2 must be 2
    with pytest.raises(ValueError, match=names("kv")):
        flash_attn_kvpacked_func(q, kv_bad)


# ----------------------------------------------------------------------------------------------------
# Varlen: cu_seqlens
# ----------------------------------------------------------------------------------------------------

def varlen(device, lens_q=(5, 9, 3), lens_k=(7, 2, 8), nheads_q=4, nheads_k=2, headdim=32):
    q = torch.randn(sum(lens_q), nheads_q, headdim, device=device).half()
    k = torch.randn(sum(lens_k), nheads_k, headdim, device=device).half()
    v = torch.randn(sum(lens_k), nheads_k, headdim, device=device).half()
    return q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device), max(lens_q), max(lens_k)


def test_varlen_ok(device):
    """The baseline the cases below break: valid as given."""
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_not_int32(device, which):
    args = dict(zip(("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"), varlen(device)))
    args[which] = args[which].long()
    with pytest.raises(TypeError, match=names(which, value="(torch\\.)?int64")):
        flash_attn_varlen_func(**args)


def test_cu_seqlens_not_1d(device):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)
    with pytest.raises(ValueError, match=names("cu_seqlens_q")):
        flash_attn_varlen_func(q, k, v, cu_q[None], cu_k, max_q, max_k)


def test_cu_seqlens_not_monotone(device):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)
    bad = cu_k.clone()
    bad[1] = 12                                                                # [0, 12, 9, 17]
    with pytest.raises(ValueError, match=names("cu_seqlens_k")):
        flash_attn_varlen_func(q, k, v, cu_q, bad, max_q, max_k)


def test_cu_seqlens_checked_again_when_changed(device):
    """The data check is kept per cu_seqlens pair (the layers of one batch pass the same tensors), but a pair changed
    in place, or a new tensor with other values, is checked again."""
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)
    flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
    flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)                 # passes again, unchanged
    cu_k[1] = 12                                                               # [0, 12, 9, 17], in place
    with pytest.raises(ValueError, match=names("cu_seqlens_k")):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
    with pytest.raises(ValueError, match=names("max_seqlen_q")):              # cu_seqlens_q again, a smaller max
        flash_attn_varlen_func(q, k, v, cu_q, cu_seqlens((5, 9, 3), device), max_q - 1, max_k)


def test_cu_seqlens_wrong_length(device):
    """cu_seqlens_q and cu_seqlens_k must describe the same number of sequences."""
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)
    with pytest.raises(ValueError, match=names("cu_seqlens_k", "cu_seqlens_q")):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k[:-1], max_q, max_k)


def test_cu_seqlens_past_the_end(device):
    """The last entry must not exceed the packed length (that would read out of bounds)."""
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)
    with pytest.raises(ValueError, match=names("cu_seqlens_q", "q")):
        flash_attn_varlen_func(q[:10], k, v, cu_q, cu_k, max_q, max_k)


def test_varlen_wrong_rank(device):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)
    with pytest.raises(ValueError, match=names("q", value="4")):
        flash_attn_varlen_func(q[None], k, v, cu_q, cu_k, max_q, max_k)


def test_varlen_heads_not_divisible(device):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device, nheads_q=5, nheads_k=2)
    with pytest.raises(ValueError, match=names("k", "nheads_k", "q", "nheads_q", "nheads")):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)


def test_varlen_alibi_wrong_batch(device):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device)                         # 3 sequences, 4 heads
    with pytest.raises(ValueError, match=names("alibi_slopes")):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes=torch.rand(2, 4, device=device))


def test_varlen_packed_wrong_shape(device):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(device, lens_k=(5, 9, 3), nheads_k=4)
    with pytest.raises(ValueError, match=names("qkv")):
        flash_attn_varlen_qkvpacked_func(torch.stack([q, k], dim=1), cu_q, max_q)
    with pytest.raises(ValueError, match=names("kv")):
        flash_attn_varlen_kvpacked_func(q, torch.stack([k, v, v], dim=1), cu_q, cu_k, max_q, max_k)


# ----------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ----------------------------------------------------------------------------------------------------

def sdpa_inputs(device, nheads_q=4, nheads_k=4):
    query = torch.randn(2, nheads_q, 17, 32, device=device).half()
    key = torch.randn(2, nheads_k, 23, 32, device=device).half()
    value = torch.randn(2, nheads_k, 23, 32, device=device).half()
    return query, key, value


def test_sdpa_mask_and_causal(device):
    query, key, value = sdpa_inputs(device)
    mask = torch.ones(17, 23, dtype=torch.bool, device=device)
    with pytest.raises(ValueError, match=names("attn_mask", "is_causal")):
        scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=True)


def test_sdpa_gqa_without_enable_gqa(device):
    query, key, value = sdpa_inputs(device, nheads_q=4, nheads_k=2)
    with pytest.raises(ValueError, match=names("enable_gqa")):
        scaled_dot_product_attention(query, key, value)


def test_sdpa_gqa_not_divisible(device):
    query, key, value = sdpa_inputs(device, nheads_q=6, nheads_k=4)
    with pytest.raises(ValueError, match=names("key", "query", "nheads", "enable_gqa")):
        scaled_dot_product_attention(query, key, value, enable_gqa=True)


def test_sdpa_mask_requires_grad(device):
    query, key, value = sdpa_inputs(device)
    mask = torch.zeros(17, 23, device=device).half().requires_grad_(True)
    with pytest.raises(NotImplementedError, match=names("attn_mask")):
        scaled_dot_product_attention(query, key, value, attn_mask=mask)


def test_sdpa_wrong_rank(device):
    query, key, value = sdpa_inputs(device)
    with pytest.raises(ValueError, match=names("query", value="2")):
        scaled_dot_product_attention(query[0, 0], key, value)


def test_sdpa_integer_dtype(device):
    query, key, value = sdpa_inputs(device)
    with pytest.raises(TypeError, match=names("key", value="(torch\\.)?int32")):
        scaled_dot_product_attention(query, key.int(), value)


def test_sdpa_dropout_out_of_range(device):
    query, key, value = sdpa_inputs(device)
    with pytest.raises(ValueError, match=names("dropout_p")):
        scaled_dot_product_attention(query, key, value, dropout_p=1.0)
