"""FlashAttention, public side: flash-attn 2.x compatible functions and torch SDPA's signature.

Layers, top to bottom:
- public functions (``flash_attn_func`` and its packed / varlen variants, ``scaled_dot_product_attention``)
  validate their arguments with messages that name the argument, the value and what is supported, then
  call one op;
- two ops, ``flashfuse::flash_attn_fwd`` and ``flashfuse::flash_attn_bwd``: torch.library custom ops with
  fake (meta) implementations and an autograd formula, so ``torch.compile(fullgraph=True)`` sees one op
  per call, not a graph break; eager calls skip the custom-op dispatcher (``FlashfuseOp``, ops/_custom_op.py:
  about 100 us of Python per forward + backward, the small-seqlen floor of the benchmark);
- the launchers in flash_fwd.py / flash_bwd.py.
"""

from __future__ import annotations

import math
import weakref
from typing import Optional

import torch
from torch import Tensor

from ..._checks import check_same, check_tensor, last_dim_contiguous
from .._custom_op import FlashfuseOp
from .dropout import new_rng_state
from .flash_bwd import flash_attn_backward
from .flash_fwd import flash_attn_forward

MAX_HEAD_DIM = 256


# ----------------------------------------------------------------------------------------------------
# torch.library ops
# ----------------------------------------------------------------------------------------------------

# The ops take every argument positionally (FlashfuseOp's eager path calls the implementation directly):
# q, k, v, then _OPTIONS in this order; the backward op takes dout, q, k, v, out, lse, then the same options.
_OPTIONS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale",
            "window_left", "window_right", "bottom_right", "softcap", "alibi_slopes", "attn_bias",
            "dropout_p", "rng_state", "deterministic")


def _flash_attn_fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                         cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                         softmax_scale: float, window_left: int, window_right: int, bottom_right: bool,
                         softcap: float, alibi_slopes: Optional[Tensor], attn_bias: Optional[Tensor],
                         dropout_p: float, rng_state: Optional[Tensor],
                         deterministic: bool) -> tuple[Tensor, Tensor]:
    return flash_attn_forward(
        q, k, v, softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
        bottom_right=bottom_right, softcap=softcap, alibi_slopes=alibi_slopes, attn_bias=attn_bias,
        dropout_p=dropout_p, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)


def _flash_attn_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                         window_left, window_right, bottom_right, softcap, alibi_slopes, attn_bias, dropout_p,
                         rng_state, deterministic):
    out = q.new_empty(q.shape)
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


def _flash_attn_bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                         cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
                         max_seqlen_k: int, softmax_scale: float, window_left: int, window_right: int,
                         bottom_right: bool, softcap: float, alibi_slopes: Optional[Tensor],
                         attn_bias: Optional[Tensor], dropout_p: float, rng_state: Optional[Tensor],
                         deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    return flash_attn_backward(
        dout, q, k, v, out, lse, softmax_scale=softmax_scale, window_left=window_left,
        window_right=window_right, bottom_right=bottom_right, softcap=softcap, alibi_slopes=alibi_slopes,
        attn_bias=attn_bias, dropout_p=dropout_p, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        deterministic=deterministic)


def _flash_attn_bwd_fake(dout, q, k, v, out, lse, *options):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_NO_OPTION_GRADS = (None,) * len(_OPTIONS)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
     window_right, bottom_right, softcap, alibi_slopes, attn_bias, dropout_p, rng_state, deterministic) = inputs
    out, lse = output
    # Optional tensors are saved as they are (save_for_backward takes None); the scalars ride on ctx.
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, attn_bias, rng_state)
    ctx.scalars = (max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right, bottom_right, softcap)
    ctx.dropout_p, ctx.deterministic = dropout_p, deterministic
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, attn_bias, rng_state = ctx.saved_tensors
    dq, dk, dv = _flash_attn_bwd(last_dim_contiguous(dout), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                 *ctx.scalars, alibi_slopes, attn_bias, ctx.dropout_p, rng_state,
                                 ctx.deterministic)
    return (dq, dk, dv) + _NO_OPTION_GRADS


_flash_attn_bwd = FlashfuseOp("flashfuse::flash_attn_bwd", _flash_attn_bwd_impl, fake=_flash_attn_bwd_fake)
_flash_attn_fwd = FlashfuseOp("flashfuse::flash_attn_fwd", _flash_attn_fwd_impl, fake=_flash_attn_fwd_fake,
                              setup_context=_setup_context, backward=_backward)


# ----------------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------------

def _check_qkv(q, k, v, *, varlen: bool):
    ndims = (3,) if varlen else (4,)
    check_tensor("q", q, ndims=ndims)
    check_tensor("k", k, ndims=ndims)
    check_tensor("v", v, ndims=ndims)
    _check_qkv_shapes(q, k, v, varlen=varlen)


def _check_qkv_shapes(q, k, v, *, varlen: bool):
    """_check_qkv past the per-tensor checks (type, rank, dtype, device), for callers that made them."""
    check_same(("q", "k", "v"), (q, k, v))
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    head_dim = q_shape[-1]
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        layout = "(total, nheads, headdim)" if varlen else "(batch, seqlen, nheads, headdim)"
        raise ValueError(f"q has head dim {head_dim}; supported: 1..{MAX_HEAD_DIM} (layout {layout})")
    for name, shape in (("k", k_shape), ("v", v_shape)):
        if shape[-1] != head_dim:
            raise ValueError(f"{name} has head dim {shape[-1]} but q has {head_dim}; they must match")
    if k_shape != v_shape:      # head dims are equal by now: the other dims differ
        agree = "total, nheads" if varlen else "batch, seqlen, nheads"
        raise ValueError(f"k has shape {tuple(k_shape)} but v has {tuple(v_shape)}; k and v must agree "
                         f"in {agree}")
    if not varlen and k_shape[0] != q_shape[0]:
        raise ValueError(f"k has batch {k_shape[0]} but q has batch {q_shape[0]}")
    nheads_q, nheads_k = q_shape[-2], k_shape[-2]
    if nheads_k == 0 or nheads_q % nheads_k != 0:
        raise ValueError(f"q has {nheads_q} heads and k/v have {nheads_k}: the number of query heads must "
                         "be a multiple of the number of key/value heads (MHA, GQA or MQA)")


def _finite_number(x) -> bool:
    # Comparisons, not math.isfinite: under torch.compile with dynamic shapes the default scale (from the
    # head dim) and float arguments arrive symbolic, which math.isfinite cannot trace. NaN fails both.
    return isinstance(x, (int, float)) and not isinstance(x, bool) and -math.inf < x < math.inf


def _check_options(q, *, batch: int, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes):
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p is {dropout_p}; supported: 0 <= dropout_p < 1")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    if not _finite_number(softmax_scale):
        raise ValueError(f"softmax_scale is {softmax_scale!r}; supported: a finite number or None")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and w >= -1 for w in window_size)):
        raise ValueError(f"window_size is {window_size!r}; supported: (left, right) ints >= -1 (-1 = unbounded)")
    window_left, window_right = window_size
    if causal:
        window_right = 0
    if not _finite_number(softcap) or softcap < 0:
        raise ValueError(f"softcap is {softcap!r}; supported: 0 (off) or a positive number")
    nheads_q = q.shape[-2]
    if alibi_slopes is not None:
        check_tensor("alibi_slopes", alibi_slopes, ndims=(1, 2), dtypes=(torch.float32,))
        check_same(("q", "alibi_slopes"), (q, alibi_slopes), dtype=False)
        if tuple(alibi_slopes.shape) not in ((nheads_q,), (batch, nheads_q)):
            raise ValueError(f"alibi_slopes has shape {tuple(alibi_slopes.shape)}; supported: "
                             f"({nheads_q},) or ({batch}, {nheads_q}) (nheads,) or (batch, nheads)")
        alibi_slopes = alibi_slopes if alibi_slopes.stride(-1) == 1 else alibi_slopes.contiguous()
    return float(softmax_scale), window_left, window_right, float(softcap), alibi_slopes


def _check_cu_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(name, cu, ndims=(1,), dtypes=(torch.int32,))
        check_same(("q", name), (q, cu), dtype=False)
        if cu.numel() < 2:
            raise ValueError(f"{name} has {cu.numel()} entries; it needs nseq + 1 >= 2 (a leading 0, then "
                             "the running total of sequence lengths)")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.numel()} entries but cu_seqlens_k has "
                         f"{cu_seqlens_k.numel()}; both describe the same sequences")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} is {value!r}; supported: an int >= the longest sequence")
    if torch.compiler.is_compiling():
        return  # the checks below read the tensors (a host sync); under torch.compile they are skipped
    checked = (q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k, cu_seqlens_q._version, cu_seqlens_k._version)
    last = _CHECKED_CU_SEQLENS.get((id(cu_seqlens_q), id(cu_seqlens_k)))
    if last is not None and last[0]() is cu_seqlens_q and last[1]() is cu_seqlens_k and last[2] == checked:
        return  # these very tensors, unmodified, passed with these sizes (the layers of one batch share them)
    # One host sync for every data check: [first, min step, last, max step] of each (both have the same
    # length by now, so they stack into one (2, nseq + 1) tensor: five small ops in all).
    cu = torch.stack((cu_seqlens_q, cu_seqlens_k))
    steps = torch.diff(cu, dim=1)
    stats = torch.stack((cu[:, 0], steps.amin(dim=1), cu[:, -1], steps.amax(dim=1)), dim=1).tolist()
    for (first, min_step, last, max_step), name, total, max_len, max_name in (
            (stats[0], "cu_seqlens_q", q.shape[0], max_seqlen_q, "max_seqlen_q"),
            (stats[1], "cu_seqlens_k", k.shape[0], max_seqlen_k, "max_seqlen_k")):
        if first != 0 or min_step < 0:
            raise ValueError(f"{name} must start at 0 and never decrease (cumulative sequence lengths); "
                             f"got first={first}, smallest step={min_step}")
        if last > total:
            raise ValueError(f"{name} ends at {last} but the packed tensor has only {total} rows")
        if max_step > max_len:
            raise ValueError(f"{max_name} is {max_len} but a sequence in {name} has {max_step} tokens; "
                             f"{max_name} must be >= the longest sequence")
    if len(_CHECKED_CU_SEQLENS) >= 64:
        _CHECKED_CU_SEQLENS.clear()
    _CHECKED_CU_SEQLENS[(id(cu_seqlens_q), id(cu_seqlens_k))] = (weakref.ref(cu_seqlens_q),
                                                                 weakref.ref(cu_seqlens_k), checked)


# cu_seqlens pairs whose data passed _check_cu_seqlens: (weak references to both, the sizes and the tensors' version
# counters then). The check reads the tensors (a host sync: ~17% of a 1 ms varlen forward on an H100, session 39), and
# a model calls attention once per layer with the same pair; a dead reference (a new tensor at a reused id) or an
# in-place change (a new version) checks again.
_CHECKED_CU_SEQLENS: dict = {}


def binding_window(seqlen_q: int, seqlen_k: int, window_left: int, window_right: int,
                   bottom_right: bool) -> tuple[int, int]:
    """(window_left, window_right) with -1 for a side that hides no key at these lengths (or below them: varlen
    passes its max_seqlen_q / _k): the same attention, and the unwindowed kernels (Hopper's Gluon ones take no left
    window) run it. Query i sees keys [i + off - left, i + off + right], off = seqlen_k - seqlen_q bottom-right, else
    0: the left side hides a key iff left < seqlen_q - 1 + off, the right side iff right < seqlen_k - 1 - off (a
    window of 4096 over 4096 keys, as Mistral's, is plain causal attention)."""
    if seqlen_q == 0 or seqlen_k == 0:
        return -1, -1
    off = seqlen_k - seqlen_q if bottom_right else 0
    if window_left >= seqlen_q - 1 + off:
        window_left = -1
    if window_right >= seqlen_k - 1 - off:
        window_right = -1
    return window_left, window_right


def _run(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
         softmax_scale, window_left, window_right, bottom_right=True, softcap=0.0, alibi_slopes=None,
         attn_bias=None, dropout_p=0.0, deterministic=False):
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    varlen = cu_seqlens_q is not None
    window_left, window_right = binding_window(max_seqlen_q if varlen else q.shape[1],
                                               max_seqlen_k if varlen else k.shape[1], window_left, window_right,
                                               bottom_right)
    rng_state = new_rng_state(q.device) if dropout_p > 0 else None
    return _flash_attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                           window_left, window_right, bottom_right, softcap, alibi_slopes, attn_bias,
                           float(dropout_p), rng_state, bool(deterministic))


# ----------------------------------------------------------------------------------------------------
# flash-attn compatible API
# ----------------------------------------------------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Exact attention, FlashAttention-2 style: O(seqlen) memory, forward and backward in Triton.

    Shapes: q (batch, seqlen_q, nheads_q, headdim); k, v (batch, seqlen_k, nheads_k, headdim) with
    nheads_q a multiple of nheads_k (GQA/MQA: query head h reads kv head h // (nheads_q // nheads_k)).
    headdim 1..256; fp16, bf16 or fp32 (fp32 dot products use tf32x3 on the GPU, about fp32 accuracy);
    any strides with a contiguous last dim (slices of a packed QKV are not copied).

    Options: softmax_scale (default 1/sqrt(headdim)); causal (bottom-right aligned when seqlen_q !=
    seqlen_k, as flash-attn >= 2.1); window_size (left, right): query i sees keys
    [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right], -1 = unbounded; softcap > 0:
    scores become softcap * tanh(scores / softcap); alibi_slopes fp32 (nheads,) or (batch, nheads) add
    -slope * |i + seqlen_k - seqlen_q - j|; dropout_p on the probabilities (Philox4x32-7, 8-bit uniforms, so p
    is realized in steps of 1/256 as in flash-attn; regenerated in the backward; seeded from torch's generator;
    kept values scaled by 1 / (1 - dropout_p)). deterministic=True: bit-identical gradients run to run
    (flash_bwd's grid, no atomics); with False, Hopper GPUs may add dQ with fp32 atomics (5 matrix
    products instead of 7; the last bits of dq vary run to run). A query row that sees no key gets
    output 0 (and lse +inf).

    Returns out (batch, seqlen_q, nheads_q, headdim), or with return_attn_probs=True
    ``(out, softmax_lse (batch, nheads_q, seqlen_q) fp32 natural log, None)``.

    Example::

        q = torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = torch.randn_like(q), torch.randn_like(q)
        out = flash_attn_func(q, k, v, causal=True)   # (2, 1024, 16, 128)
    """
    _check_qkv(q, k, v, varlen=False)
    scale, left, right, softcap, alibi_slopes = _check_options(
        q, batch=q.shape[0], dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    out, lse = _run(q, k, v, softmax_scale=scale, window_left=left, window_right=right, softcap=softcap,
                    alibi_slopes=alibi_slopes, dropout_p=dropout_p, deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on a packed qkv (batch, seqlen, 3, nheads, headdim); slices are not copied."""
    check_tensor("qkv", qkv, ndims=(5,))
    if qkv.shape[2] != 3:
        raise ValueError(f"qkv has shape {tuple(qkv.shape)}; expected (batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with a packed kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    check_tensor("kv", kv, ndims=(5,))
    if kv.shape[2] != 2:
        raise ValueError(f"kv has shape {tuple(kv.shape)}; expected (batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func over a packed batch of variable-length sequences.

    q: (total_q, nheads_q, headdim), k, v: (total_k, nheads_k, headdim); cu_seqlens_q/k: int32
    (nseq + 1,), the running sums of the sequence lengths starting at 0 (sequence b is rows
    cu_seqlens[b] : cu_seqlens[b + 1]); max_seqlen_q/k: >= the longest sequence. Causal and windows
    align each sequence's own diagonal. alibi_slopes: (nheads,) or (nseq, nheads). Validating
    cu_seqlens reads them once per (cu_seqlens_q, cu_seqlens_k) pair (one host sync), except under torch.compile.
    Rows past cu_seqlens[-1] (a buffer longer than its sequences, as static shapes pad it) are in no sequence:
    out 0, lse +inf and gradients 0 there, and whatever they hold (uninitialized memory, NaN) reaches no
    sequence. Within the sequences, on Hopper a NaN or infinity in one sequence's q / k / v / dout rows can
    reach the sequence before it (whose last blocks read those rows, weighted by zero; flash-attn's FA2
    kernels keep sequences apart even then).
    With return_attn_probs=True returns (out, softmax_lse (nheads_q, total_q) fp32, None).
    """
    _check_qkv(q, k, v, varlen=True)
    _check_cu_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale, left, right, softcap, alibi_slopes = _check_options(
        q, batch=cu_seqlens_q.numel() - 1, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    out, lse = _run(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                    max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k), softmax_scale=scale,
                    window_left=left, window_right=right, softcap=softcap, alibi_slopes=alibi_slopes,
                    dropout_p=dropout_p, deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                     deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func on a packed qkv (total, 3, nheads, headdim)."""
    check_tensor("qkv", qkv, ndims=(4,))
    if qkv.shape[1] != 3:
        raise ValueError(f"qkv has shape {tuple(qkv.shape)}; expected (total, 3, nheads, headdim)")
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen,
                                  max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                    softcap=0.0, alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash_attn_varlen_func with a packed kv (total_k, 2, nheads_k, headdim)."""
    check_tensor("kv", kv, ndims=(4,))
    if kv.shape[1] != 2:
        raise ValueError(f"kv has shape {tuple(kv.shape)}; expected (total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


# ----------------------------------------------------------------------------------------------------
# torch SDPA signature
# ----------------------------------------------------------------------------------------------------

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on the flashfuse kernels.

    Shapes: query (batch, nheads_q, seqlen_q, headdim), key/value (batch, nheads_k, seqlen_k, headdim);
    3-D (nheads, seqlen, headdim) works too. Semantics are torch's: is_causal is top-left aligned;
    attn_mask bool (True = may attend) or float (added to the scores), broadcastable to
    (batch, nheads_q, seqlen_q, seqlen_k); nheads_q != nheads_k needs enable_gqa=True. Differences:
    a row that may attend to nothing gives 0 rather than NaN; value must share query's head dim; a float
    attn_mask that requires grad is not supported (NotImplementedError). Returns (batch, nheads_q,
    seqlen_q, headdim), a transposed view of a (batch, seqlen_q, nheads_q, headdim) buffer.
    """
    check_tensor("query", query, ndims=(3, 4))
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = (t.unsqueeze(0) if isinstance(t, torch.Tensor) else t for t in (query, key, value))
    for name, t in (("key", key), ("value", value)):
        check_tensor(name, t, ndims=(4,))
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"value has head dim {value.shape[-1]} but query has {query.shape[-1]}; "
                                  "flashfuse attention needs equal head dims")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads but key has {key.shape[1]}; "
                         "set enable_gqa=True for grouped-query attention")
    if attn_mask is not None and is_causal:
        raise ValueError("attn_mask and is_causal are both set; pass one of them (as torch SDPA requires)")
    # (batch, seqlen, nheads, headdim); check_tensor ran on query, key and value above.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    _check_qkv_shapes(q, k, v, varlen=False)
    scale, left, right, _, _ = _check_options(
        q, batch=q.shape[0], dropout_p=dropout_p, softmax_scale=scale, causal=is_causal,
        window_size=(-1, -1), softcap=0.0, alibi_slopes=None)
    bias = None
    if attn_mask is not None:
        bias = _mask_to_bias(attn_mask, q, k, squeeze)
    out, _ = _run(q, k, v, softmax_scale=scale, window_left=left, window_right=right,
                  bottom_right=False, attn_bias=bias, dropout_p=dropout_p,
                  deterministic=torch.are_deterministic_algorithms_enabled())
    out = out.transpose(1, 2)
    return out[0] if squeeze else out


def _mask_to_bias(attn_mask, q, k, squeezed):
    check_tensor("attn_mask", attn_mask, dtypes=(torch.bool, torch.float16, torch.bfloat16, torch.float32))
    check_same(("query", "attn_mask"), (q, attn_mask), dtype=False)
    if attn_mask.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError("attn_mask requires grad; flashfuse attention does not differentiate "
                                  "with respect to the mask (pass attn_mask.detach())")
    batch, seqlen_q, nheads, _ = q.shape
    target = (batch, nheads, seqlen_q, k.shape[1])
    if squeezed and attn_mask.dim() == 3:
        attn_mask = attn_mask.unsqueeze(0)
    # torch.broadcast_shapes(attn_mask.shape, target) == target, spelled out (13 us cheaper per call):
    # at most 4 dims, each 1 or equal to target's, aligned from the right.
    shape = attn_mask.shape
    if len(shape) > 4 or any(m != 1 and m != t for m, t in zip(shape, target[4 - len(shape):])):
        shown = target[1:] if squeezed else target
        raise ValueError(f"attn_mask has shape {tuple(attn_mask.shape)}, which does not broadcast to "
                         f"{shown} (batch, nheads, seqlen_q, seqlen_k)")
    if attn_mask.dtype == torch.bool:
        # 0 where attending, -inf elsewhere, at the mask's own (un-broadcast) size (two ops: fill, masked fill).
        attn_mask = torch.full(shape, float("-inf"), dtype=q.dtype, device=q.device).masked_fill_(attn_mask, 0.0)
    return attn_mask.expand(target)                       # broadcast dims get stride 0: no copy
