"""Attention with a KV cache (flash-attn's ``flash_attn_with_kvcache``) in plain PyTorch, one sequence at a time.

For sequence b of the batch:

1. its cache: entry ``cache_batch_idx[b]`` (or b) of a contiguous cache (batch_cache, seqlen_cache, H_k, D),
   or for a paged cache (num_blocks, page_size, H_k, D) the pages block_table[b, 0], block_table[b, 1], ...
   laid end to end, so cache position p is row p % page_size of page block_table[b, p // page_size];
2. the new keys/values k, v (seqlen_new tokens), rotated first if rotary tables are given, are written at
   positions cache_seqlens[b], ..., cache_seqlens[b] + seqlen_new - 1 (into the cache itself: in place);
3. q attends to the keys at positions [leftpad[b], cache_seqlens[b] + seqlen_new): seqlen_k of them, with
   key j the one at position leftpad[b] + j; causal / window / ALiBi align q's last token with the last key.

Rotary: a new key at position p is rotated by the angle of table row p. The queries are rotated at positions
cache_seqlens[b] + i when causal or windowed (query i is the (i + 1)-th new token), else all of them at
cache_seqlens[b] (flash-attn's rule). Rotated keys and queries are rounded to the input dtype (the keys live
in the cache; the kernels' rotated q is a tensor of q's dtype).
"""

from __future__ import annotations

import torch

from .attention import attention_ref
from .rope import apply_rotary_emb_ref


def _positions(cache_seqlens, b):
    return int(cache_seqlens[b]) if isinstance(cache_seqlens, torch.Tensor) else int(cache_seqlens)


def flash_attn_with_kvcache_ref(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, compute_dtype=torch.float64):
    """Returns (out (batch, seqlen_q, nheads_q, D) in q's dtype, lse (batch, nheads_q, seqlen_q) fp32).
    k_cache and v_cache are updated in place when k, v are given (as the kernel does)."""
    batch = q.shape[0]
    seqlen_new = 0 if k is None else k.shape[1]
    paged = block_table is not None
    page_size = k_cache.shape[1]
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    if cache_seqlens is None:
        cache_seqlens = capacity
    outs, lses = [], []
    for b in range(batch):
        start = _positions(cache_seqlens, b)
        left = int(cache_leftpad[b]) if cache_leftpad is not None else 0
        pos = torch.arange(capacity, device=q.device)
        if paged:
            pages, rows = block_table[b].long()[pos // page_size], pos % page_size
            where = (pages, rows)                                          # cache position -> (page, row)
        else:
            entry = int(cache_batch_idx[b]) if cache_batch_idx is not None else b
            where = (torch.full_like(pos, entry), pos)

        if k is not None:                                                  # step 2: append in place
            k_new = k[b:b + 1]
            if rotary_cos is not None:
                k_new = apply_rotary_emb_ref(k_new.to(compute_dtype), rotary_cos.to(compute_dtype),
                                             rotary_sin.to(compute_dtype), interleaved=rotary_interleaved,
                                             seqlen_offsets=start)
            new = (where[0][start:start + seqlen_new], where[1][start:start + seqlen_new])
            k_cache[new] = k_new[0].to(k_cache.dtype)
            v_cache[new] = v[b].to(v_cache.dtype)

        keys = k_cache[where][left:start + seqlen_new]                     # (seqlen_k, H_k, D), step 3
        values = v_cache[where][left:start + seqlen_new]
        q_b = q[b:b + 1].to(compute_dtype)
        if rotary_cos is not None:
            cos, sin = rotary_cos.to(compute_dtype), rotary_sin.to(compute_dtype)
            if causal or window_size[0] >= 0 or window_size[1] >= 0:
                q_b = apply_rotary_emb_ref(q_b, cos, sin, interleaved=rotary_interleaved, seqlen_offsets=start)
            else:                                                          # every query token at `start`
                flat = q_b.reshape(1, 1, -1, q_b.shape[-1])
                q_b = apply_rotary_emb_ref(flat, cos, sin, interleaved=rotary_interleaved,
                                           seqlen_offsets=start).reshape(q_b.shape)
            q_b = q_b.to(q.dtype)           # the rotated queries are in q's dtype, like the rotated keys
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        out, lse = attention_ref(q_b, keys[None], values[None], softmax_scale=softmax_scale, causal=causal,
                                 window_size=window_size, softcap=softcap, alibi_slopes=slopes,
                                 compute_dtype=compute_dtype)
        outs.append(out.to(q.dtype))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)
