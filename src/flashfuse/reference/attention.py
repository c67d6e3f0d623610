"""Plain PyTorch attention, readable like a textbook. Tests and benchmarks compare every kernel with it.

For query row i and key column j of one (batch, head):

    s_ij = scale * q_i . k_j                                  (scale defaults to 1/sqrt(D))
    s_ij = softcap * tanh(s_ij / softcap)                     (if softcap > 0)
    s_ij = s_ij - slope_h * |i + off - j|                     (ALiBi, if slopes are given)
    s_ij = -inf where j is outside [i + off - left, i + off + right]   (causal = window (left, 0))
    p_ij = exp(s_ij - lse_i),  lse_i = log sum_j exp(s_ij)
    o_i  = sum_j (p_ij * keep_ij / (1 - dropout_p)) v_j       (keep: the dropout mask)

``off`` aligns the diagonal: ``seqlen_k - seqlen_q`` (bottom-right, flash-attn) or 0 (top-left, torch SDPA).
A row with no visible key gets o_i = 0 and lse_i = +inf (flash-attn's convention), never NaN.
"""

from __future__ import annotations

import math

import torch


def attention_ref(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, attn_bias=None, dropout_p=0.0, dropout_mask=None,
                  bottom_right=True, compute_dtype=torch.float64):
    """Reference attention in flash-attn's layout.

    q: (batch, seqlen_q, nheads_q, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads_q a
    multiple of nheads_k (query head h reads kv head h // (nheads_q // nheads_k)).
    alibi_slopes: (nheads_q,) or (batch, nheads_q). attn_bias: broadcastable to (batch, nheads_q,
    seqlen_q, seqlen_k), added to the scores (bool: True = may attend). dropout_mask: bool
    (batch, nheads_q, seqlen_q, seqlen_k), True = kept.
    compute_dtype: float64 for the exact reference; None computes in the input dtype (the "low
    precision reference" that bounds what rounding alone can explain).

    Returns (out (batch, seqlen_q, nheads_q, headdim) in q's dtype, lse (batch, nheads_q, seqlen_q) fp32).
    """
    batch, seqlen_q, nheads_q, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    dtype = compute_dtype or q.dtype
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else softmax_scale
    group = nheads_q // nheads_k
    qf = q.to(dtype).transpose(1, 2)                                        # (B, Hq, Sq, D)
    kf = k.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)       # (B, Hq, Sk, D)
    vf = v.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)       # (B, Hq, Sk, Dv)

    scores = scale * (qf @ kf.transpose(-1, -2))                           # (B, Hq, Sq, Sk)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(seqlen_q, device=q.device).view(-1, 1)
    cols = torch.arange(seqlen_k, device=q.device).view(1, -1)
    diag = rows + (seqlen_k - seqlen_q if bottom_right else 0)             # key index on the diagonal
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(dtype)
        slopes = slopes.view(1, nheads_q, 1, 1) if slopes.dim() == 1 else slopes.view(batch, nheads_q, 1, 1)
        scores = scores - slopes * (diag - cols).abs().to(dtype)
    if attn_bias is not None:
        if attn_bias.dtype == torch.bool:
            scores = scores.masked_fill(~attn_bias, float("-inf"))
        else:
            scores = scores + attn_bias.to(dtype)
    left, right = window_size
    if causal:
        right = 0
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= cols >= diag - left
    if right >= 0:
        visible &= cols <= diag + right
    scores = scores.masked_fill(~visible, float("-inf"))

    lse = torch.logsumexp(scores, dim=-1)                                  # (B, Hq, Sq)
    empty = torch.isneginf(lse)
    probs = torch.exp(scores - lse.masked_fill(empty, 0.0).unsqueeze(-1))  # rows with no key: all 0
    if dropout_p > 0:
        probs = probs * dropout_mask.to(dtype) / (1.0 - dropout_p)
    out = probs @ vf                                                       # (B, Hq, Sq, Dv)
    lse = lse.masked_fill(empty, float("inf"))
    return out.transpose(1, 2).to(q.dtype), lse.float()


def naive_attention(q, k, v, is_causal=False, scale=None):
    """The baseline everybody starts from: materializes the (S_q x S_k) scores and probabilities.

    Layout (batch, nheads, seqlen, headdim) or the single-head (seqlen, headdim); torch SDPA semantics
    (causal is top-left aligned). Works on any device, in the input dtype.
    """
    single_head = q.dim() == 2
    if single_head:
        q, k, v = (t[None, None] for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale                             # (B, H, Sq, Sk)
    if is_causal:
        seqlen_q, seqlen_k = scores.shape[-2:]
        mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
    return out[0, 0] if single_head else out
