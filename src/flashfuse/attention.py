"""The attention teaching progression, in torch SDPA's layout: naive -> basic -> vectorized -> blocked -> flash.

Every function takes ``(q, k, v, is_causal=False, scale=None)`` and computes torch SDPA's attention:

    q: (batch, nheads_q, seqlen_q, headdim)   or the single-head (seqlen_q, headdim)
    k: (batch, nheads_k, seqlen_k, headdim)   or (seqlen_k, headdim); nheads_q a multiple of nheads_k
    v: (batch, nheads_k, seqlen_k, headdim)   or (seqlen_k, headdim)
    returns (batch, nheads_q, seqlen_q, headdim) (or (seqlen_q, headdim)) in q's dtype

    out = softmax(scale * q k^T + causal_mask) v,   scale = 1/sqrt(headdim) by default,
    causal: query i sees keys j <= i (top-left aligned, as torch SDPA, also when seqlen_q != seqlen_k),
    GQA/MQA: query head h reads kv head h // (nheads_q // nheads_k).

fp16, bf16 and fp32; any sequence lengths; headdim 1..256; any strides with a contiguous last dim.
naive_attention is plain PyTorch (materializes the scores); basic, vectorized and blocked are the Triton
kernels of ``flashfuse.ops.attention.progression`` (forward only); flash_attention is FlashAttention
(with autograd). docs/attention-progression.md explains what changes from one step to the next.

Example::

    q, k, v = (torch.randn(2, 8, 1000, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = blocked_attention(q, k, v, is_causal=True)          # (2, 8, 1000, 64) bf16
"""

from __future__ import annotations

import torch

from ._checks import check_same, check_tensor, last_dim_contiguous
from .ops.attention import progression
from .reference.attention import naive_attention

__all__ = ["naive_attention", "basic_attention", "vectorized_attention", "blocked_attention", "flash_attention"]

MAX_HEADDIM = 256


def _validate(fn_name: str, q, k, v, is_causal, scale):
    """Checks every argument; returns 4-D (q, k, v) with a contiguous last dim and the single-head flag."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndims=(2, 4))
    check_same(("q", "k", "v"), (q, k, v))
    if not q.dim() == k.dim() == v.dim():
        raise ValueError(f"q, k and v must all be 4-D (batch, nheads, seqlen, headdim) or all 2-D "
                         f"(seqlen, headdim); got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be None (1/sqrt(headdim)) or a float, got {scale!r}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError(
            f"{fn_name} is forward-only (a teaching kernel with no backward), but an input requires grad "
            "with grad mode on; use flashfuse.attention.flash_attention, which has autograd, or call it "
            "under torch.no_grad()")

    single_head = q.dim() == 2
    if single_head:
        q, k, v = (t[None, None] for t in (q, k, v))
    batch, nheads_q, _, headdim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != batch:
        raise ValueError(f"k has batch size {k.shape[0]} but q has {batch}; they must match")
    if k.shape[3] != headdim:
        raise ValueError(f"k has head dim {k.shape[3]} but q has {headdim}; q, k and v must share it")
    if not 1 <= headdim <= MAX_HEADDIM:
        raise ValueError(f"head dim {headdim} is not supported; supported: 1..{MAX_HEADDIM}")
    nheads_k = k.shape[1]
    if nheads_k == 0 or nheads_q % nheads_k != 0:
        raise ValueError(f"q has {nheads_q} heads and k/v have {nheads_k}; nheads_q must be a multiple of "
                         "nheads_k (GQA/MQA: query head h reads kv head h // (nheads_q // nheads_k))")
    return (last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)), single_head


def _run(fn_name, launcher, q, k, v, is_causal, scale):
    (q, k, v), single_head = _validate(fn_name, q, k, v, is_causal, scale)
    out = launcher(q, k, v, is_causal=is_causal, scale=scale)
    return out[0, 0] if single_head else out


def basic_attention(q, k, v, is_causal=False, scale=None):
    """One program per query row, one key per loop trip (2 * seqlen_k trips): slow but simple.

    Shapes and semantics as in the module docstring. Forward only.
    """
    return _run("basic_attention", progression.basic_attention_forward, q, k, v, is_causal, scale)


def vectorized_attention(q, k, v, is_causal=False, scale=None):
    """One program per query row; all keys, then all values, in one 2-D load each.

    Limited by on-chip memory: raises ValueError when next_pow2(seqlen_k) * next_pow2(headdim) exceeds
    ``progression.VECTORIZED_MAX_ELEMENTS`` (seqlen_k <= 512 at headdim 64, 256 at 128, 128 at 256).
    Shapes and semantics as in the module docstring. Forward only.
    """
    return _run("vectorized_attention", progression.vectorized_attention_forward, q, k, v, is_causal, scale)


def blocked_attention(q, k, v, is_causal=False, scale=None):
    """The fused MHA core: blocks of queries, tl.dot over tiles of K and V, exact two-pass softmax.

    O(seqlen) memory (no seqlen_q x seqlen_k buffer), any sequence length.
    Shapes and semantics as in the module docstring. Forward only.
    """
    return _run("blocked_attention", progression.blocked_attention_forward, q, k, v, is_causal, scale)


def flash_attention(q, k, v, is_causal=False, scale=None):
    """FlashAttention (one pass, online softmax), with autograd: the progression's last step.

    A thin wrapper over ``flashfuse.ops.attention.interface.scaled_dot_product_attention`` that also
    takes the single-head (seqlen, headdim) layout and turns GQA on when k/v have fewer heads.
    Shapes and semantics as in the module docstring.
    """
    from .ops.attention.interface import scaled_dot_product_attention

    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndims=(2, 4))
    single_head = q.dim() == 2
    if single_head:
        if not k.dim() == v.dim() == 2:
            raise ValueError(f"q is single-head (seqlen, headdim) {tuple(q.shape)}, so k and v must be too; "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        q, k, v = (t[None, None] for t in (q, k, v))
    out = scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
                                       enable_gqa=(k.shape[-3] != q.shape[-3]))
    return out[0, 0] if single_head else out
