"""``flash_attn_with_kvcache``: flash-attn 2.x's decoding entry point on the flashfuse kernels (decode.py).

Layers: public function (validation: every check, data checks included, runs before anything is written)
-> two torch.library ops -> the launchers in decode.py.

Why two ops: appending k/v mutates the caches, and ``FlashfuseOp`` registers ops with ``mutates_args=()``
only. So the append is its own ``torch.library.custom_op`` with ``mutates_args=("k_cache", "v_cache")``
(torch.compile's functionalization then orders it before every read of the caches), and the attention is
a FlashfuseOp that only reads them (eager calls skip the dispatcher). Rotary embedding of the new keys runs
inside the append op, of the queries inside the attention op, so a compiled call is exactly two ops.

Inference only: there is no backward (flash-attn's flash_attn_with_kvcache has none either). Where
flash-attn silently returns outputs without a gradient, flashfuse raises NotImplementedError when an input
requires grad with grad mode on, rather than dropping gradients without a word.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..._checks import check_same, check_tensor, last_dim_contiguous
from .._custom_op import FlashfuseOp, _tracing
from .._triton import cdiv
from ..rope import rotary_forward
from .decode import MAX_SPLITS, decode_attention, decode_config, kv_append, num_splits_heuristic
from .interface import MAX_HEAD_DIM, _check_options

INT_DTYPES = (torch.int32, torch.int64)

# ----------------------------------------------------------------------------------------------------
# torch.library ops
# ----------------------------------------------------------------------------------------------------


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, offsets: Tensor, interleaved: bool, per_token: bool) -> Tensor:
    """x (batch, seqlen, nheads, D) rotated at positions offsets[b] + i (per_token) or offsets[b] for
    every token (then the (seqlen, nheads) rows are viewed as one token with seqlen * nheads heads)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not per_token:
        x = x.contiguous()
        x, out_ = x.view(x.shape[0], 1, -1, x.shape[-1]), out.view(x.shape[0], 1, -1, x.shape[-1])
    else:
        out_ = out
    rotary_forward(x, cos, sin, out_, rotary_dim=2 * cos.shape[-1], interleaved=interleaved,
                   seqlen_offsets=offsets)
    return out


def _append_impl(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, cache_seqlens: Tensor,
                 cache_batch_idx: Optional[Tensor], block_table: Optional[Tensor], rotary_cos: Optional[Tensor],
                 rotary_sin: Optional[Tensor], rotary_interleaved: bool) -> None:
    if rotary_cos is not None:
        k = _rotate(k, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved, per_token=True)
    kv_append(k, v, k_cache, v_cache, cache_seqlens, cache_batch_idx=cache_batch_idx, block_table=block_table)


_kvcache_append_op = torch.library.custom_op("flashfuse::kvcache_append", _append_impl,
                                             mutates_args=("k_cache", "v_cache"))


@_kvcache_append_op.register_fake
def _(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
      rotary_interleaved):
    return None


def _kvcache_append(*args) -> None:
    """The append op; eager calls on plain tensors skip the dispatcher (as FlashfuseOp does)."""
    if _tracing(args):
        _kvcache_append_op(*args)
    else:
        _append_impl(*args)


def _kvcache_attn_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                       cache_leftpad: Optional[Tensor], cache_batch_idx: Optional[Tensor],
                       block_table: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                       rotary_interleaved: bool, seqlen_new: int, softmax_scale: float, window_left: int,
                       window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                       num_splits: int) -> tuple[Tensor, Tensor]:
    if rotary_cos is not None:
        per_token = window_left >= 0 or window_right >= 0                  # causal or local (flash-attn)
        q = _rotate(q, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved, per_token)
    return decode_attention(q, k_cache, v_cache, cache_seqlens, seqlen_new=seqlen_new,
                            softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
                            softcap=softcap, alibi_slopes=alibi_slopes, cache_leftpad=cache_leftpad,
                            cache_batch_idx=cache_batch_idx, block_table=block_table, num_splits=num_splits)


def _kvcache_attn_fake(q, k_cache, v_cache, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
                       rotary_cos, rotary_sin, rotary_interleaved, seqlen_new, softmax_scale, window_left,
                       window_right, softcap, alibi_slopes, num_splits):
    batch, seqlen_q, nheads_q, _ = q.shape
    return (q.new_empty(q.shape),
            q.new_empty((batch, nheads_q, seqlen_q), dtype=torch.float32))


_kvcache_attn = FlashfuseOp("flashfuse::kvcache_attn", _kvcache_attn_impl, fake=_kvcache_attn_fake)


# ----------------------------------------------------------------------------------------------------
# Argument checks (all of them run before the append writes anything)
# ----------------------------------------------------------------------------------------------------

def _check_index(name, t, shape, q):
    check_tensor(name, t, ndims=(len(shape),), dtypes=INT_DTYPES)
    check_same(("q", name), (q, t), dtype=False)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)}")


def _check_shapes(q, k_cache, v_cache, k, v, block_table, cache_batch_idx):
    """Types, ranks, dtypes, devices and shapes. Returns (page_size or 0, capacity per sequence)."""
    check_tensor("q", q, ndims=(4,))
    check_tensor("k_cache", k_cache, ndims=(4,))
    check_tensor("v_cache", v_cache, ndims=(4,))
    check_same(("q", "k_cache", "v_cache"), (q, k_cache, v_cache))
    batch, _, nheads_q, head_dim = q.shape
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"q has head dim {head_dim}; supported: 1..{MAX_HEAD_DIM} "
                         "(layout (batch, seqlen_q, nheads, headdim))")
    if k_cache.shape[-1] != head_dim:
        raise ValueError(f"k_cache has head dim {k_cache.shape[-1]} but q has {head_dim}; they must match")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache has shape {tuple(v_cache.shape)} but k_cache has {tuple(k_cache.shape)}; "
                         "they must match")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:           # written in place: a copy would drop the append
            raise ValueError(f"{name} has strides {t.stride()}; its last dim must be contiguous (stride 1)")
    nheads_k = k_cache.shape[2]
    if nheads_k == 0 or nheads_q % nheads_k != 0:
        raise ValueError(f"q has {nheads_q} heads and k_cache has {nheads_k}: the number of query heads must "
                         "be a multiple of the number of key/value heads (MHA, GQA or MQA)")
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new keys and values to append) or both be None")
    if k is not None:
        check_tensor("k", k, ndims=(4,))
        check_tensor("v", v, ndims=(4,))
        check_same(("q", "k", "v"), (q, k, v))
        want = (batch, k.shape[1], nheads_k, head_dim)
        for name, t in (("k", k), ("v", v)):
            if tuple(t.shape) != want:
                raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {want} (batch, seqlen_new, "
                                 "nheads_k, headdim), seqlen_new the same for k and v")
    if block_table is not None:
        check_tensor("block_table", block_table, ndims=(2,), dtypes=INT_DTYPES)
        check_same(("q", "block_table"), (q, block_table), dtype=False)
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table has shape {tuple(block_table.shape)}; expected ({batch}, "
                             "max_blocks_per_seq)")
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx and block_table were both given; a paged cache picks each "
                             "sequence's pages through block_table (pass cache_batch_idx=None)")
        page_size = k_cache.shape[1]
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"k_cache has page size {page_size} (dim 1 of (num_blocks, page_size, nheads_k, "
                             "headdim)); supported: a power of two")
        return page_size, block_table.shape[1] * page_size
    if cache_batch_idx is not None:
        _check_index("cache_batch_idx", cache_batch_idx, (batch,), q)
    elif k_cache.shape[0] != batch:
        raise ValueError(f"k_cache has batch {k_cache.shape[0]} but q has {batch}; they must match (or pass "
                         "cache_batch_idx to pick cache entries)")
    return 0, k_cache.shape[1]


def _check_rotary(rotary_cos, rotary_sin, q, k):
    if rotary_cos is None and rotary_sin is None:
        return None, None
    if rotary_cos is None or rotary_sin is None:
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if k is None:
        raise ValueError("rotary_cos/rotary_sin were given without k and v; rotary embedding applies to q and "
                         "the new keys, so pass k and v (as flash-attn requires)")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        check_tensor(name, t, ndims=(2,))
        check_same(("q", name), (q, t), dtype=False)
    if rotary_cos.shape != rotary_sin.shape:
        raise ValueError(f"rotary_cos has shape {tuple(rotary_cos.shape)} but rotary_sin has "
                         f"{tuple(rotary_sin.shape)}; they must match")
    rotary_dim = 2 * rotary_cos.shape[1]
    if not 0 < rotary_dim <= q.shape[-1]:
        raise ValueError(f"rotary_cos has shape {tuple(rotary_cos.shape)} (seqlen_ro, rotary_dim / 2): "
                         f"rotary_dim {rotary_dim}; supported: 2..headdim ({q.shape[-1]})")
    return last_dim_contiguous(rotary_cos), last_dim_contiguous(rotary_sin)


def _check_data(q, k_cache, cache_seqlens, cache_leftpad, cache_batch_idx, block_table, page_size, capacity,
                seqlen_new, appending):
    """The checks that read tensor values, with one host sync. Returns (longest seqlen_k, largest
    cache_seqlens + seqlen_new)."""
    stats = [(cache_seqlens + seqlen_new).max(), cache_seqlens.min()]
    stats.append((cache_seqlens - cache_leftpad).min() if cache_leftpad is not None else stats[1])
    stats.append(cache_leftpad.min() if cache_leftpad is not None else stats[1] * 0)
    stats.append((cache_seqlens + seqlen_new - (cache_leftpad if cache_leftpad is not None else 0)).max())
    if block_table is not None:
        # Pages that hold the positions [0, cache_seqlens + seqlen_new) must exist.
        used = (torch.arange(block_table.shape[1], device=q.device) * page_size)[None, :] < \
            (cache_seqlens + seqlen_new)[:, None]
        stats.append((((block_table < 0) | (block_table >= k_cache.shape[0])) & used).sum())
    if cache_batch_idx is not None:
        stats += [cache_batch_idx.min(), cache_batch_idx.max(),
                  torch.unique(cache_batch_idx).numel() * torch.ones((), device=q.device, dtype=torch.int64)]
    vals = torch.stack([s.to(torch.int64) for s in stats]).tolist()
    max_end, min_seqlen, min_minus_pad, min_pad, max_seqlen_k = vals[:5]
    if min_seqlen < 0:
        raise ValueError(f"cache_seqlens has a negative entry ({min_seqlen}); supported: >= 0")
    if max_end > capacity:
        where = "max_blocks_per_seq * page_size" if block_table is not None else "k_cache.shape[1]"
        raise ValueError(f"the cache is too small: cache_seqlens + seqlen_new reaches {max_end} but each sequence "
                         f"holds {capacity} positions ({where})")
    if cache_leftpad is not None and (min_pad < 0 or min_minus_pad < 0):
        raise ValueError("cache_leftpad must satisfy 0 <= cache_leftpad <= cache_seqlens for every sequence; got "
                         f"smallest cache_leftpad {min_pad}, smallest cache_seqlens - cache_leftpad "
                         f"{min_minus_pad}")
    rest = vals[5:]
    if block_table is not None:
        if rest[0]:
            raise ValueError(f"block_table has {rest[0]} entries outside [0, {k_cache.shape[0]}) (the pages of "
                             "k_cache) among the pages the sequences use")
        rest = rest[1:]
    if cache_batch_idx is not None:
        lo, hi, distinct = rest
        if lo < 0 or hi >= k_cache.shape[0]:
            raise ValueError(f"cache_batch_idx has entries in [{lo}, {hi}]; supported: [0, {k_cache.shape[0]}) "
                             "(k_cache.shape[0])")
        if appending and distinct != cache_batch_idx.numel():
            raise ValueError("cache_batch_idx repeats an entry while k/v are appended: two sequences would "
                             "write the same cache rows")
    return max_seqlen_k, max_end


# ----------------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------------

def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Attention of a few new query tokens over a KV cache, appending the new keys/values to it in place
    (flash-attn 2.x's ``flash_attn_with_kvcache``, split-KV "flash-decoding" kernels). Inference only:
    no backward; an input that requires grad with grad mode on raises NotImplementedError.

    Shapes: q (batch, seqlen_q, nheads_q, headdim); contiguous cache k_cache, v_cache (batch_cache,
    seqlen_cache, nheads_k, headdim), or paged (num_blocks, page_size, nheads_k, headdim) with
    block_table (batch, max_blocks_per_seq) int32/int64: position p of sequence b lives in row
    p % page_size of page block_table[b, p // page_size]; page_size any power of two (1, 16, 256, ...).
    k, v (batch, seqlen_new, nheads_k, headdim), optional: written at positions cache_seqlens[b] ...
    cache_seqlens[b] + seqlen_new - 1 before the attention. nheads_q a multiple of nheads_k (GQA/MQA).
    headdim 1..256, fp16/bf16/fp32, q, caches and k/v of one dtype.

    Options: cache_seqlens int or (batch,) int tensor, the tokens already in each cache (None: full);
    cache_batch_idx (batch,) int, the cache entry of each sequence (contiguous caches only);
    cache_leftpad (batch,) int, where each sequence starts in its cache (keys before it are not attended);
    rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2): rotate the new keys at their positions and q at
    positions cache_seqlens + i if causal or windowed, else at cache_seqlens (flash-attn's rule);
    rotary_interleaved: GPT-J pairs (True) or GPT-NeoX halves (False). softmax_scale, causal (bottom-right
    aligned: the last query sees every key), window_size, softcap, alibi_slopes as in flash_attn_func, on
    the seqlen_k = cache_seqlens + seqlen_new - cache_leftpad visible keys. num_splits: how many chunks the
    keys are cut into (0: chosen from batch x heads and the GPU's SM count; results do not depend on it
    beyond rounding); at most 128.

    Every check (shapes, dtypes, block_table / cache_batch_idx in range, the cache big enough for the
    append) runs before anything is written; data checks read the index tensors once (one host sync),
    skipped under torch.compile and CUDA-graph capture.

    Returns out (batch, seqlen_q, nheads_q, headdim), or (out, softmax_lse (batch, nheads_q, seqlen_q)
    fp32) with return_softmax_lse=True (lse = +inf for a row that sees no key).

    Example::

        k_cache = torch.zeros(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.zeros_like(k_cache)
        lens = torch.tensor([10, 200, 7, 4000], device="cuda", dtype=torch.int32)
        q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k_new, v_new = torch.randn(2, 4, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
        out = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True)
        lens += 1
    """
    page_size, capacity = _check_shapes(q, k_cache, v_cache, k, v, block_table, cache_batch_idx)
    batch, seqlen_q, nheads_q, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in (q, k, v, k_cache, v_cache)):
        raise NotImplementedError("flash_attn_with_kvcache is inference only (no backward, as in flash-attn) "
                                  "but an input requires grad; call it under torch.no_grad() or "
                                  "torch.inference_mode(), or use flash_attn_func for training")
    rotary_cos, rotary_sin = _check_rotary(rotary_cos, rotary_sin, q, k)
    scale, left, right, softcap, alibi_slopes = _check_options(
        q, batch=batch, dropout_p=0.0, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits is {num_splits!r}; supported: 0 (automatic) or 1..{MAX_SPLITS}")
    seqlen_new = 0 if k is None else k.shape[1]

    if cache_seqlens is None:
        cache_seqlens = capacity
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, Tensor):
        _check_index("cache_seqlens", cache_seqlens, (batch,), q)
    else:
        raise TypeError(f"cache_seqlens is a {type(cache_seqlens).__name__}; supported: None, int or a (batch,) "
                        "int32/int64 tensor")
    if cache_leftpad is not None:
        _check_index("cache_leftpad", cache_leftpad, (batch,), q)

    max_seqlen_k = capacity
    if not (torch.compiler.is_compiling() or (q.is_cuda and torch.cuda.is_current_stream_capturing())):
        max_seqlen_k, max_end = _check_data(q, k_cache, cache_seqlens, cache_leftpad, cache_batch_idx,
                                            block_table, page_size, capacity, seqlen_new, k is not None)
        if rotary_cos is not None:
            last_q = max_end - seqlen_new + (seqlen_q if left >= 0 or right >= 0 else 1)
            if max(max_end, last_q) > rotary_cos.shape[0]:
                raise ValueError(f"rotary_cos/rotary_sin have {rotary_cos.shape[0]} positions but the tokens "
                                 f"reach position {max(max_end, last_q) - 1}; seqlen_ro must cover them")
    if num_splits == 0:
        cfg = decode_config(max(16, head_dim), (nheads_q // nheads_k) * seqlen_q)
        row_tiles = cdiv((nheads_q // nheads_k) * seqlen_q, cfg["BLOCK_M"])
        num_splits = num_splits_heuristic(q.device, batch, nheads_k, row_tiles, max_seqlen_k, cfg["BLOCK_N"])

    if k is not None:
        _kvcache_append(k_cache, v_cache, last_dim_contiguous(k), last_dim_contiguous(v), cache_seqlens,
                        cache_batch_idx, block_table, rotary_cos, rotary_sin, bool(rotary_interleaved))
    out, lse = _kvcache_attn(last_dim_contiguous(q), k_cache, v_cache, cache_seqlens, cache_leftpad,
                             cache_batch_idx, block_table, rotary_cos, rotary_sin, bool(rotary_interleaved),
                             seqlen_new, scale, left, right, softcap, alibi_slopes, num_splits)
    return (out, lse) if return_softmax_lse else out
