"""Cross-entropy over a large vocabulary, and fused with the lm_head matmul so the logits never exist.

    z     = softcap * tanh(l / softcap)   (or z = l without softcap)      l: (N, V) logits
    lse_i = log sum_c exp(z_ic)
    loss_i = (1 - eps) (lse_i - z_{i,y_i}) + eps (lse_i - mean_c z_ic)     eps = label_smoothing
    loss_i = 0 where y_i == ignore_index; "mean" divides the sum by the number of non-ignored rows.

This is torch.nn.functional.cross_entropy(z, y, ignore_index, reduction, label_smoothing) exactly,
including the "mean" of a batch whose rows are all ignored: 0 / 0 = nan (gradients 0), as torch.

fused_linear_cross_entropy (lm_head + loss, the Liger design): for each chunk of tokens,
    logits = hidden_chunk @ weight^T (+ bias)            cuBLAS, (chunk, V) in hidden's dtype
    one Triton program per row: lse, loss, then dloss/dlogits written over the logits in place
    grad_hidden_chunk = dlogits @ weight                  cuBLAS, fp32 output
    grad_weight      += dlogits^T @ hidden_chunk          cuBLAS addmm into a buffer of weight's dtype
    grad_bias        += sum over rows of dlogits          fp32
so the (N, V) logits (4.2 GB in fp32 at N = 8192, V = 128256) and their gradient never exist: the extra
memory is one chunk of logits plus the gradients themselves. The gradients are computed in the forward
(when something requires grad) and the backward only scales them by grad_output.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from ._triton import cdiv, next_power_of_2, tanh

REDUCTIONS = ("mean", "sum", "none")
LABEL_DTYPES = (torch.int64, torch.int32)

# The kernel walks a row of V logits in blocks of BLOCK_V = min(next_pow2(V), MAX_BLOCK_V). 4096 fp32
# lanes at 8 warps are 16 per thread: three lane-wise accumulators (max, sum of exp, sum of z) take 48
# registers, and a 128k vocab is 32 iterations, so the final cross-warp reductions are amortized.
MAX_BLOCK_V = 4096

# Rows of tokens per chunk when the caller does not choose. Liger's rule keeps the chunk's logits about
# the size of hidden: chunk = next_pow2(ceil(N / ceil(V / H))). Each chunk reads weight twice and
# reads + writes the (V, H) grad_weight accumulator once, so a chunk of M rows does 2 M flops per byte
# of that accumulator traffic: the GEMMs stay compute-bound only for M >= ~512 (H100: ~990 TFLOP/s over
# 3.35 TB/s is ~300 flop/byte), and larger chunks give cuBLAS fuller waves. So the chunk is raised to at
# least MIN_CHUNK rows, and up to the largest power of 2 whose logits fit in CHUNK_LOGITS_BYTES but
# holding no more than a quarter of the tokens (the memory saved stays proportional to N). H200,
# Llama-3.2-1B's head (N = 32768, H = 2048, V = 128256, bf16, session 6), fwd + bwd: 1024 rows 97.6 ms,
# 2048 91.4, 4096 88.3, 8192 88.7; extra peak 1.9 / 2.0 / 3.0 / 4.9 GiB. There the rule gives 4096 rows
# (1.05 GB of bf16 logits); at N = 8192 it gives 2048 (H = 4096: 4096 rows peaked at 0.26 x the fp32
# logits path, above the 1/4 that flashfuse promises).
CHUNK_LOGITS_BYTES = 1 << 30
MIN_CHUNK = 1024


# ----------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------
# One program per row i (V logits l, label y). Forward (COMPUTE_LOSS), one pass over the row with
# lane-wise online accumulators (a lane keeps its own running max m, sum of exp(z - m), and sum of z):
#     lse = log sum_c exp(z_c),  loss = lse - (1 - eps) z_y - (eps / V) sum_c z_c.
# VJP (COMPUTE_GRAD), a second pass, written in place of the logits when p_grad == p_logits:
#     dloss/dz_c = softmax(z)_c - (1 - eps) [c == y] - eps / V
#     dz/dl      = 1 - tanh(l / softcap)^2                      (1 without softcap)
#     grad_c     = scale * dloss/dz_c * dz/dl
# scale = *p_scale (1 / number of non-ignored rows for "mean", or grad_output in a backward) times
# p_row_scale[i] ("none": the per-row grad_output). Without COMPUTE_LOSS the row's lse is read from
# p_lse (saved by the forward) and the first pass is skipped. Ignored rows get loss 0 and gradient 0;
# a label outside [0, V) that is not ignore_index gets loss nan and a nan gradient row (never a silent
# wrong result; the public functions also raise on it in eager mode).
@triton.jit
def _cross_entropy_kernel(
    p_logits, p_grad, p_labels, p_loss, p_lse, p_scale, p_row_scale,
    n_cols, stride_logits_row, stride_grad_row, stride_labels_row, stride_row_scale_row,
    ignore_index, label_smoothing, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
    COMPUTE_LOSS: tl.constexpr, COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
):
    i_row = tl.program_id(0).to(tl.int64)
    p_logits += i_row * stride_logits_row                                 # row i of (n_rows, n_cols)
    p_grad += i_row * stride_grad_row
    o_v = tl.arange(0, BLOCK_V)                                           # [BLOCK_V]
    label = tl.load(p_labels + i_row * stride_labels_row).to(tl.int64)
    ignored = label == ignore_index
    bad = (label != ignore_index) & ((label < 0) | (label >= n_cols))
    label = tl.where(bad | ignored, 0, label)                              # a safe address to read
    nan = float("nan")

    if ignored:
        if COMPUTE_LOSS:
            tl.store(p_loss + i_row, 0.0)
            tl.store(p_lse + i_row, 0.0)
        if COMPUTE_GRAD:
            b_zero = tl.zeros([BLOCK_V], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_V):
                o = start + o_v
                tl.store(p_grad + o, b_zero.to(p_grad.dtype.element_ty), mask=o < n_cols)
    else:
        if COMPUTE_LOSS:
            # A finite start (-1e30, below any finite logit that matters) keeps exp(m_old - m_new)
            # from being exp(-inf + inf) = nan in lanes that have only seen masked positions.
            b_m = tl.full([BLOCK_V], -1e30, dtype=tl.float32)             # [BLOCK_V] running max
            b_d = tl.zeros([BLOCK_V], dtype=tl.float32)                   # sum exp(z - b_m)
            b_s = tl.zeros([BLOCK_V], dtype=tl.float32)                   # sum z
            for start in range(0, n_cols, BLOCK_V):
                o = start + o_v
                m_v = o < n_cols
                b_z = tl.load(p_logits + o, mask=m_v, other=0.0).to(tl.float32)
                if HAS_SOFTCAP:
                    b_z = softcap * tanh(b_z / softcap)
                b_s += tl.where(m_v, b_z, 0.0)
                b_z = tl.where(m_v, b_z, float("-inf"))
                b_m_new = tl.maximum(b_m, b_z)
                b_d = b_d * tl.exp(b_m - b_m_new) + tl.exp(b_z - b_m_new)
                b_m = b_m_new
            m = tl.max(b_m, axis=0)
            lse = m + tl.log(tl.sum(b_d * tl.exp(b_m - m), axis=0))
            z_y = tl.load(p_logits + label).to(tl.float32)
            if HAS_SOFTCAP:
                z_y = softcap * tanh(z_y / softcap)
            loss = lse - (1.0 - label_smoothing) * z_y - label_smoothing * (tl.sum(b_s, axis=0) / n_cols)
            tl.store(p_loss + i_row, tl.where(bad, nan, loss))
            tl.store(p_lse + i_row, lse)
        else:
            lse = tl.load(p_lse + i_row)

        if COMPUTE_GRAD:
            scale = 1.0
            if HAS_SCALE:
                scale = tl.load(p_scale).to(tl.float32)
            if HAS_ROW_SCALE:
                scale = scale * tl.load(p_row_scale + i_row * stride_row_scale_row).to(tl.float32)
            scale = tl.where(bad, nan, scale)
            smooth = label_smoothing / n_cols
            for start in range(0, n_cols, BLOCK_V):
                o = start + o_v
                m_v = o < n_cols
                b_l = tl.load(p_logits + o, mask=m_v, other=0.0).to(tl.float32)  # [BLOCK_V]
                if HAS_SOFTCAP:
                    b_t = tanh(b_l / softcap)
                    b_z = softcap * b_t
                else:
                    b_z = b_l
                b_g = tl.exp(b_z - lse) - smooth - tl.where(o == label, 1.0 - label_smoothing, 0.0)
                if HAS_SOFTCAP:
                    b_g = b_g * (1.0 - b_t * b_t)
                tl.store(p_grad + o, (b_g * scale).to(p_grad.dtype.element_ty), mask=m_v)


# ----------------------------------------------------------------------------------------------------
# Launchers (no argument checks: the public functions do them)
# ----------------------------------------------------------------------------------------------------

def cross_entropy_rows(logits: Tensor, labels: Tensor, *, ignore_index: int, label_smoothing: float,
                       softcap: float, loss: Optional[Tensor] = None, lse: Optional[Tensor] = None,
                       grad: Optional[Tensor] = None, scale: Optional[Tensor] = None,
                       row_scale: Optional[Tensor] = None) -> None:
    """Run the kernel over the rows of logits (n_rows, V) (last dim contiguous), labels (n_rows,).

    With loss (n_rows,) fp32: writes each row's loss and its lse (n_rows,) fp32. Without loss: reads lse.
    With grad (n_rows, V) (may be logits itself: in place): writes dloss/dlogits times scale (a (1,) fp32
    tensor) times row_scale[i] ((n_rows,) fp32), each factor 1 when None. softcap 0 = off.
    """
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    block_v = min(next_power_of_2(n_cols), MAX_BLOCK_V)
    # 8 warps for the 4096 blocks of a real vocabulary (16 lanes per thread, see MAX_BLOCK_V); fewer for
    # small vocabularies so no thread holds only masked lanes.
    num_warps = min(max(block_v // 512, 1), 8)
    dummy = lse
    _cross_entropy_kernel[(n_rows,)](
        logits, grad if grad is not None else logits, labels, loss if loss is not None else dummy, lse,
        scale if scale is not None else dummy, row_scale if row_scale is not None else dummy,
        n_cols, logits.stride(0), grad.stride(0) if grad is not None else 0, labels.stride(0),
        row_scale.stride(0) if row_scale is not None else 0,
        int(ignore_index), float(label_smoothing), float(softcap),
        HAS_SOFTCAP=softcap > 0, HAS_SCALE=scale is not None, HAS_ROW_SCALE=row_scale is not None,
        COMPUTE_LOSS=loss is not None, COMPUTE_GRAD=grad is not None, BLOCK_V=block_v, num_warps=num_warps)


def _floor_power_of_2(x: int) -> int:
    return 1 << max(0, x.bit_length() - 1)


def default_chunk_size(n_rows: int, hidden_size: int, vocab_size: int, element_size: int = 2) -> int:
    """Rows per chunk (see MIN_CHUNK): the most of Liger's rule (logits chunk ~ hidden), MIN_CHUNK, and the
    largest power of 2 whose logits (element_size bytes each) fit in CHUNK_LOGITS_BYTES, at most n_rows / 4;
    never above n_rows."""
    liger = next_power_of_2(cdiv(n_rows, cdiv(vocab_size, hidden_size)))
    by_bytes = _floor_power_of_2(CHUNK_LOGITS_BYTES // max(1, vocab_size * element_size))
    large = min(by_bytes, _floor_power_of_2(max(1, n_rows // 4)))
    return max(1, min(max(liger, large, MIN_CHUNK), n_rows))


def fused_linear_cross_entropy_forward(
        hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor] = None, *,
        ignore_index: int, label_smoothing: float, softcap: float, grad_hidden: bool = False,
        grad_weight: bool = False, grad_bias: bool = False, scale: Optional[Tensor] = None,
        row_scale: Optional[Tensor] = None, lse: Optional[Tensor] = None, chunk_size: int = 0,
) -> tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """Chunked lm_head + cross-entropy. hidden (N, H), weight (V, H), labels (N,), bias (V,) or None.

    Returns (loss (N,) fp32, lse (N,) fp32, grad_hidden (N, H) fp32, grad_weight (V, H), grad_bias (V,) fp32),
    the
    gradients of sum_i scale * row_scale[i] * loss_i (None where not asked for). With lse given (saved
    by a forward), the loss is not recomputed and loss is returned empty.
    """
    n_rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    recompute = lse is None
    loss = hidden.new_empty(n_rows if recompute else 0, dtype=torch.float32)
    if recompute:
        lse = hidden.new_empty(n_rows, dtype=torch.float32)
    any_grad = grad_hidden or grad_weight or grad_bias
    # grad_hidden stays fp32 (N * H * 4 bytes, small) so the backward's scaling by grad_output rounds to
    # hidden's dtype once, as the unfused path does (measured: bf16 error 5.1e-3 -> HF's 2.8e-3).
    d_hidden = hidden.new_empty(hidden.shape, dtype=torch.float32) if grad_hidden else None
    # grad_weight accumulates in weight's dtype with cuBLAS addmm (fp32 accumulation inside each GEMM,
    # one rounding per chunk). An fp32 accumulator would be more exact but costs twice the memory
    # (2.1 GB at V = 128256, H = 4096, plus the final cast: the memory bar is 1/4 of the fp32 logits
    # path) and twice the accumulator traffic per chunk; with chunks of >= 1024 rows a batch of 8192
    # tokens rounds 8 times, and once more when the backward scales it by a grad_output that is not a
    # power of 2 (bf16: 4.3e-3 .. 5.6e-3 relative error vs HF's 2.9e-3, measured in the GPU tier).
    d_weight = weight.new_empty(weight.shape) if grad_weight else None
    d_bias = torch.zeros(vocab, dtype=torch.float32, device=hidden.device) if grad_bias else None
    chunk = chunk_size if chunk_size > 0 else default_chunk_size(n_rows, hidden_size, vocab, hidden.element_size())
    options = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, softcap=softcap)
    for i, start in enumerate(range(0, n_rows, chunk)):
        end = min(start + chunk, n_rows)
        h = hidden[start:end]                                             # (m, H)
        logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())   # (m, V)
        cross_entropy_rows(logits, labels[start:end], loss=loss[start:end] if recompute else None,
                           lse=lse[start:end], grad=logits if any_grad else None, scale=scale,
                           row_scale=None if row_scale is None else row_scale[start:end], **options)
        if grad_hidden:
            _mm_fp32(logits, weight, out=d_hidden[start:end])
        if grad_weight:  # beta=0 on the first chunk: the uninitialized buffer is ignored, not read
            d_weight.addmm_(logits.t(), h, beta=0.0 if i == 0 else 1.0)
        if grad_bias:
            d_bias += logits.sum(0, dtype=torch.float32)
    if grad_weight and n_rows == 0:
        d_weight.zero_()
    return loss, lse, d_hidden, d_weight, d_bias


def _mm_fp32(a: Tensor, b: Tensor, out: Tensor) -> None:
    """out (fp32) = a @ b with fp32 accumulation and one rounding, for 16-bit a, b too (cuBLAS out_dtype;
    torch has no CPU kernel for that, so the CPU tier multiplies exact fp32 upcasts)."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
    elif a.is_cuda:
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    else:
        torch.mm(a.float(), b.float(), out=out)


# ----------------------------------------------------------------------------------------------------
# torch.library ops. Optional outputs are returned as empty (0,) tensors (custom ops return tensors).
# ----------------------------------------------------------------------------------------------------

def _empty(t: Tensor) -> Tensor:
    return t.new_empty(0)


def _reduce(loss_rows: Tensor, n_valid: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return loss_rows
    total = loss_rows.sum()
    return total / n_valid if reduction == "mean" else total


def _mean_scale(labels: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """Number of non-ignored rows and its reciprocal (1,) fp32 (inf when 0: then every row is ignored
    and no gradient is multiplied by it). Stays on the device: no host sync."""
    n_valid = (labels != ignore_index).sum().to(torch.float32)
    return n_valid, (1.0 / n_valid).reshape(1)


def _flce_impl(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor], ignore_index: int,
               reduction: str, label_smoothing: float, softcap: float, chunk_size: int, grad_hidden: bool,
               grad_weight: bool, grad_bias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """-> (loss, lse, grad_hidden, grad_weight, grad_bias). For "mean"/"sum" the gradients of the
    reduced loss are computed here (the backward scales them); for "none" none are (the backward
    recomputes them with the per-row grad_output)."""
    n_valid, inv = _mean_scale(labels, ignore_index)
    want = reduction != "none"
    loss, lse, dh, dw, db = fused_linear_cross_entropy_forward(
        hidden, weight, labels, bias, ignore_index=ignore_index, label_smoothing=label_smoothing,
        softcap=softcap, grad_hidden=grad_hidden and want, grad_weight=grad_weight and want,
        grad_bias=grad_bias and want, scale=inv if reduction == "mean" else None, chunk_size=chunk_size)
    outs = [g if g is not None else _empty(hidden) for g in (dh, dw, db)]
    return (_reduce(loss, n_valid, reduction), lse, *outs)


def _flce_fake(hidden, weight, labels, bias, ignore_index, reduction, label_smoothing, softcap, chunk_size,
               grad_hidden, grad_weight, grad_bias):
    n = hidden.shape[0]
    f32 = torch.float32
    loss = hidden.new_empty(n if reduction == "none" else (), dtype=f32)
    want = reduction != "none"
    dh = hidden.new_empty(hidden.shape, dtype=f32) if grad_hidden and want else _empty(hidden)
    dw = weight.new_empty(weight.shape) if grad_weight and want else _empty(hidden)
    db = hidden.new_empty(weight.shape[0], dtype=f32) if grad_bias and want else _empty(hidden)
    return loss, hidden.new_empty(n, dtype=f32), dh, dw, db


def _flce_bwd_none_impl(grad_loss: Tensor, hidden: Tensor, weight: Tensor, labels: Tensor, lse: Tensor,
                        bias: Optional[Tensor], ignore_index: int, label_smoothing: float, softcap: float,
                        chunk_size: int, grad_hidden: bool, grad_weight: bool,
                        grad_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    """reduction="none": the gradients of sum_i grad_loss[i] loss_i, recomputing each chunk's logits
    (one more GEMM per chunk) and reusing the forward's lse."""
    _, _, dh, dw, db = fused_linear_cross_entropy_forward(
        hidden, weight, labels, bias, ignore_index=ignore_index, label_smoothing=label_smoothing,
        softcap=softcap, grad_hidden=grad_hidden, grad_weight=grad_weight, grad_bias=grad_bias,
        row_scale=grad_loss.float(), lse=lse, chunk_size=chunk_size)
    dh = dh.to(hidden.dtype) if dh is not None else None
    return tuple(g if g is not None else _empty(hidden) for g in (dh, dw, db))


def _flce_bwd_none_fake(grad_loss, hidden, weight, labels, lse, bias, ignore_index, label_smoothing, softcap,
                        chunk_size, grad_hidden, grad_weight, grad_bias):
    return (hidden.new_empty(hidden.shape) if grad_hidden else _empty(hidden),
            weight.new_empty(weight.shape) if grad_weight else _empty(hidden),
            hidden.new_empty(weight.shape[0], dtype=torch.float32) if grad_bias else _empty(hidden))


def _flce_setup(ctx, inputs, output):
    hidden, weight, labels, bias, ignore_index, reduction, eps, softcap, chunk, *flags = inputs
    ctx.reduction, ctx.flags = reduction, tuple(flags)
    ctx.options = (ignore_index, eps, softcap, chunk)   # the bwd_none op's arguments, in its schema's order
    _, lse, dh, dw, db = output
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, labels, lse, bias)
    else:
        ctx.save_for_backward(dh, dw, db)
    ctx.hidden_dtype, ctx.bias_dtype = hidden.dtype, None if bias is None else bias.dtype
    ctx.mark_non_differentiable(lse, dh, dw, db)


def _flce_backward(ctx, grad_loss, *_):
    if ctx.reduction == "none":
        hidden, weight, labels, lse, bias = ctx.saved_tensors
        # ignore_index, label_smoothing, softcap, chunk_size, then grad_hidden, grad_weight, grad_bias
        dh, dw, db = _flce_bwd_none_op(grad_loss, hidden, weight, labels, lse, bias, *ctx.options,
                                       *ctx.flags)
    else:
        # Eager (plain tensors, FlashfuseOp's autograd.Function or the custom op's own autograd): scaled in
        # place, so no second (V, H) buffer; the saved gradients are used once (a second backward through
        # the same graph, retain_graph=True, raises autograd's "modified by an inplace operation" error).
        # Traced by torch.compile / AOTAutograd (tensor subclasses): out of place, since a forward output
        # mutated in the backward graph cannot always be partitioned (opcheck's aot_dispatch test hits
        # that); the compiler plans that memory itself.
        if torch.is_grad_enabled():
            # create_graph=True: the gradients were made in the forward as constants, so differentiating
            # them again would silently drop the second-order terms.
            raise RuntimeError("fused_linear_cross_entropy with reduction='mean' or 'sum' has no double "
                               "backward (its gradients are computed in the forward); use reduction='none' "
                               "and reduce outside, or torch.nn.functional.cross_entropy, for higher-order "
                               "gradients")
        dh, dw, db = ctx.saved_tensors
        inplace = type(grad_loss) is torch.Tensor and not torch.compiler.is_compiling()
        dh, dw, db = ((g.mul_(grad_loss) if inplace else g * grad_loss) if flag else g
                      for g, flag in zip((dh, dw, db), ctx.flags))
        dh = dh.to(ctx.hidden_dtype)     # fp32 until here: one rounding (grad_weight: see the forward)
    grads = [g if flag else None for g, flag in zip((dh, dw, db), ctx.flags)]
    if grads[2] is not None:
        grads[2] = grads[2].to(ctx.bias_dtype)
    return (grads[0], grads[1], None, grads[2]) + (None,) * 8


# Eager calls on plain tensors skip the custom-op dispatcher; torch.compile sees the custom ops.
_flce_bwd_none_op = FlashfuseOp("flashfuse::fused_linear_cross_entropy_bwd_none", _flce_bwd_none_impl,
                                fake=_flce_bwd_none_fake)
_flce_op = FlashfuseOp("flashfuse::fused_linear_cross_entropy", _flce_impl, fake=_flce_fake,
                       setup_context=_flce_setup, backward=_flce_backward)


def _ce_impl(logits: Tensor, labels: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
             softcap: float) -> tuple[Tensor, Tensor]:
    """-> (loss, lse). The gradient is computed in the backward from the saved lse (one read and one
    write of the logits), so no (N, V) buffer is kept between forward and backward."""
    n_valid, _ = _mean_scale(labels, ignore_index)
    loss = logits.new_empty(logits.shape[0], dtype=torch.float32)
    lse = torch.empty_like(loss)
    cross_entropy_rows(logits, labels, ignore_index=ignore_index, label_smoothing=label_smoothing,
                       softcap=softcap, loss=loss, lse=lse)
    return _reduce(loss, n_valid, reduction), lse


def _ce_fake(logits, labels, ignore_index, reduction, label_smoothing, softcap):
    n = logits.shape[0]
    return logits.new_empty(n if reduction == "none" else (), dtype=torch.float32), \
        logits.new_empty(n, dtype=torch.float32)


def _ce_bwd_impl(grad_loss: Tensor, logits: Tensor, labels: Tensor, lse: Tensor, ignore_index: int,
                 reduction: str, label_smoothing: float, softcap: float) -> Tensor:
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    if reduction == "none":
        scale, row_scale = None, grad_loss.float()
    else:
        scale, row_scale = grad_loss.float().reshape(1), None
        if reduction == "mean":
            scale = scale * _mean_scale(labels, ignore_index)[1]
    cross_entropy_rows(logits, labels, ignore_index=ignore_index, label_smoothing=label_smoothing,
                       softcap=softcap, lse=lse, grad=grad, scale=scale, row_scale=row_scale)
    return grad


def _ce_bwd_fake(grad_loss, logits, labels, lse, ignore_index, reduction, label_smoothing, softcap):
    return logits.new_empty(logits.shape)


def _ce_setup(ctx, inputs, output):
    logits, labels, *options = inputs
    ctx.options = options
    ctx.save_for_backward(logits, labels, output[1])
    ctx.mark_non_differentiable(output[1])


def _ce_backward(ctx, grad_loss, _):
    logits, labels, lse = ctx.saved_tensors
    return (_ce_bwd_op(grad_loss, logits, labels, lse, *ctx.options),) + (None,) * 5


_ce_bwd_op = FlashfuseOp("flashfuse::cross_entropy_bwd", _ce_bwd_impl, fake=_ce_bwd_fake)
_ce_op = FlashfuseOp("flashfuse::cross_entropy", _ce_impl, fake=_ce_fake, setup_context=_ce_setup,
                     backward=_ce_backward)


# ----------------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------------

def _check_options(ignore_index, reduction, label_smoothing, softcap) -> float:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index is {ignore_index!r}; supported: an int (default -100)")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction is {reduction!r}; supported: {', '.join(map(repr, REDUCTIONS))}")
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing is {label_smoothing!r}; supported: a number in [0, 1]")
    if softcap is None:
        return 0.0
    if not isinstance(softcap, (int, float)) or softcap < 0 or not math.isfinite(softcap):
        raise ValueError(f"softcap is {softcap!r}; supported: None (or 0: off) or a positive number")
    return float(softcap)


def _check_labels(labels, n_rows: int, vocab: int, ignore_index: int, device) -> Tensor:
    check_tensor("labels", labels, dtypes=LABEL_DTYPES)
    if labels.device != device:
        raise ValueError(f"labels is on {labels.device} but the inputs are on {device}")
    if labels.numel() != n_rows:
        raise ValueError(f"labels has shape {tuple(labels.shape)} ({labels.numel()} labels) but there are "
                         f"{n_rows} rows of inputs; one label per row (shift for causal LM before calling)")
    labels = labels.reshape(n_rows)
    if n_rows and not torch.compiler.is_compiling():
        # One host sync (skipped under torch.compile, where the kernel still turns such a row's loss
        # and gradient into nan): a silently wrong loss is worse than waiting for one scalar.
        bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab))
        if bad.any().item():
            value = labels[bad][0].item()
            raise ValueError(f"labels contains {value}, outside [0, {vocab}) (vocab size {vocab}) and not "
                             f"ignore_index={ignore_index}")
    return labels


# ----------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------

def fused_linear_cross_entropy(hidden, weight, labels, ignore_index=-100, reduction="mean",
                               label_smoothing=0.0, softcap=None, bias=None, *, chunk_size=None):
    """cross_entropy(hidden @ weight^T + bias, labels) without ever materializing the (N, V) logits.

    Shapes: hidden (N, H) or (batch, seqlen, H) (flattened to N = batch * seqlen rows); weight (V, H)
    (the lm_head, as nn.Linear stores it); bias (V,) or None; labels (N,) or (batch, seqlen), int64 or
    int32. hidden, weight and bias share one dtype (fp32, fp16 or bf16); any strides with a contiguous
    last dim. The logits are computed chunk by chunk in hidden's dtype (as F.linear would), the loss in
    fp32. Gradients for hidden, weight and bias.

    Options, with torch.nn.functional.cross_entropy's semantics: ignore_index rows count neither in the
    loss nor in the "mean" denominator (all rows ignored: "mean" gives nan, like torch); reduction "mean"
    or "sum" -> fp32 scalar, "none" -> fp32 (N,) (or labels' shape); label_smoothing eps in [0, 1];
    softcap (Gemma 2's final_logit_softcapping): logits = softcap * tanh(logits / softcap) before the
    loss. chunk_size: rows per chunk (default: see default_chunk_size).

    Causal LM: this function does NOT shift. HF's loss predicts token t+1 from position t; shift before
    calling: ``fused_linear_cross_entropy(hidden[:, :-1], lm_head.weight, input_ids[:, 1:])``. HF's
    ``num_items_in_batch`` normalization is ``reduction="sum"`` divided by it.

    Labels outside [0, V) (other than ignore_index) raise ValueError; the check costs one host sync and
    is skipped under torch.compile, where such a row's loss and gradients become nan instead.

    Example::

        hidden = torch.randn(2, 1024, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        lm_head = torch.randn(128256, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, 128256, (2, 1024), device="cuda")
        loss = fused_linear_cross_entropy(hidden, lm_head, labels)   # fp32 scalar
        loss.backward()
    """
    check_tensor("hidden", hidden, ndims=(2, 3))
    check_tensor("weight", weight, ndims=(2,))
    check_same(("hidden", "weight"), (hidden, weight))
    softcap = _check_options(ignore_index, reduction, label_smoothing, softcap)
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight has shape {tuple(weight.shape)} but hidden has hidden size "
                         f"{hidden.shape[-1]}; weight must be (vocab, {hidden.shape[-1]}) like nn.Linear's")
    if bias is not None:
        check_tensor("bias", bias, ndims=(1,))
        check_same(("hidden", "bias"), (hidden, bias))
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias has shape {tuple(bias.shape)}; expected ({weight.shape[0]},) (vocab)")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size is {chunk_size!r}; supported: None (automatic) or an int >= 1")
    hidden2 = last_dim_contiguous(hidden.reshape(-1, hidden.shape[-1]))
    weight = last_dim_contiguous(weight)
    labels_shape = labels.shape if isinstance(labels, torch.Tensor) else None
    labels = _check_labels(labels, hidden2.shape[0], weight.shape[0], ignore_index, hidden.device)
    grad = torch.is_grad_enabled()
    flags = (grad and hidden.requires_grad, grad and weight.requires_grad,
             grad and bias is not None and bias.requires_grad)
    loss = _flce_op(hidden2, weight, labels, bias, ignore_index, reduction, float(label_smoothing), softcap,
                    chunk_size or 0, *flags)[0]
    return loss.reshape(labels_shape) if reduction == "none" else loss


def cross_entropy(logits, labels, ignore_index=-100, reduction="mean", label_smoothing=0.0, softcap=None):
    """torch.nn.functional.cross_entropy over the last dim, in one Triton pass per row (forward) and one
    (backward), with optional softcap. No fp32 copy of the logits is made.

    Shapes: logits (..., V) fp32/fp16/bf16, any strides with a contiguous last dim; labels (...) int64 or
    int32 (one per row of logits). Returns an fp32 scalar ("mean", "sum") or fp32 labels-shaped losses
    ("none"). Options as in fused_linear_cross_entropy (same kernel, same semantics and label checks).

    Example::

        logits = torch.randn(4096, 32000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, 32000, (4096,), device="cuda")
        cross_entropy(logits, labels, label_smoothing=0.1).backward()
    """
    check_tensor("logits", logits)
    softcap = _check_options(ignore_index, reduction, label_smoothing, softcap)
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits has shape {tuple(logits.shape)}; expected (..., vocab) with vocab >= 1")
    logits2 = last_dim_contiguous(logits.reshape(-1, logits.shape[-1]))
    labels_shape = labels.shape if isinstance(labels, torch.Tensor) else None
    labels = _check_labels(labels, logits2.shape[0], logits2.shape[1], ignore_index, logits.device)
    loss = _ce_op(logits2, labels, ignore_index, reduction, float(label_smoothing), softcap)[0]
    return loss.reshape(labels_shape) if reduction == "none" else loss
