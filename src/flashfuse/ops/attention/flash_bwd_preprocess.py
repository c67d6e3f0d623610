"""The backward's preprocess, shared by flash_bwd's Triton grid and flash_bwd_hopper's Gluon kernels: delta =
rowsum(dO * O) per query row (flash_bwd's docstring: the softmax VJP's row term), in one pass over O and dO; for the
Gluon kernels also lse2 = lse * log2(e) and the zeroed fp32 dQ buffer, laid out as their TMA boxes read them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import Launch, LaunchCache, PlanCache, cdiv, launch_device, next_power_of_2
from ._flash_common import LOG2E, seq_bounds


@triton.jit
def _bwd_preprocess_kernel(p_o, p_do, p_delta, p_lse, p_lse2, p_dqa, p_cu_seqlens_q,
                           stride_o_b, stride_o_s, stride_o_h, stride_do_b, stride_do_s, stride_do_h,
                           stride_delta_b, stride_delta_h, stride_lse_b, stride_lse_h, stride_dqa_b, stride_dqa_s,
                           stride_dqa_h, nheads_q, seqlen_q, rows_out, head_dim, IS_VARLEN: tl.constexpr,
                           WRITE_LSE2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta[row] = sum_d dO[row, d] * O[row, d], in fp32. WRITE_LSE2 (flash_bwd_hopper's inputs): also
    lse2[row] = lse[row] * log2(e), laid out like delta, both for rows < rows_out (0 past seqlen_q), and the fp32 dQ
    buffer's rows zeroed; varlen: the sequence's rows alone (the caller allocates lse2, delta and dQ zeroed)."""
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = i_bh // nheads_q
    i_h = i_bh % nheads_q
    q_start, seqlen_q = seq_bounds(p_cu_seqlens_q, i_b, seqlen_q, IS_VARLEN)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    m_o = (o_m[:, None] < seqlen_q) & (o_d[None, :] < head_dim)
    i_b64 = i_b.to(tl.int64)
    p_o += i_b64 * stride_o_b + q_start * stride_o_s + i_h * stride_o_h
    p_do += i_b64 * stride_do_b + q_start * stride_do_s + i_h * stride_do_h
    b_o = tl.load(p_o + o_m[:, None] * stride_o_s + o_d[None, :], mask=m_o, other=0.0).to(tl.float32)
    b_do = tl.load(p_do + o_m[:, None] * stride_do_s + o_d[None, :], mask=m_o, other=0.0).to(tl.float32)
    vec0 = q_start              # the column of the sequence's first row in delta / lse2
    if WRITE_LSE2 and IS_VARLEN:
        vec0 = (q_start + 3) // 4 * 4 + 4 * i_b     # 16-byte aligned (flash_bwd_dq_hopper._vec_start)
    p_delta += i_b64 * stride_delta_b + i_h * stride_delta_h + vec0
    # WRITE_LSE2 writes padded rows (not varlen: seqlen_q is the batch's); varlen's rows end with the sequence.
    rows_written = seqlen_q
    if WRITE_LSE2 and not IS_VARLEN:
        rows_written = rows_out
    tl.store(p_delta + o_m, tl.sum(b_o * b_do, 1), mask=o_m < rows_written)
    if WRITE_LSE2:
        lse = tl.load(p_lse + i_b64 * stride_lse_b + i_h * stride_lse_h + q_start + o_m, mask=o_m < seqlen_q,
                      other=0.0)
        p_lse2 += i_b64 * stride_delta_b + i_h * stride_delta_h + vec0
        tl.store(p_lse2 + o_m, lse * LOG2E, mask=o_m < rows_written)
        if not IS_VARLEN:
            p_dqa += i_b64 * stride_dqa_b + i_h * stride_dqa_h
            zeros = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            tl.store(p_dqa + o_m[:, None].to(tl.int64) * stride_dqa_s + o_d[None, :], zeros, mask=m_o)


_launch_preprocess = LaunchCache(_bwd_preprocess_kernel)


def vector_rows(seqlen_q: int, block_m: int, nseq: int | None = None) -> int:
    """The length of hopper_backward_inputs's delta / lse2 rows: seqlen_q rounded up to block_m (whole query blocks
    are read), or, varlen (nseq sequences packed in seqlen_q = total_q rows), room for each sequence to start at a
    multiple of 4 (up to 3 + 4 * nseq more), rounded up to block_m."""
    return cdiv(seqlen_q + (0 if nseq is None else 4 * nseq), block_m) * block_m


def hopper_backward_inputs(out, dout, lse, block_m: int, cu_seqlens_q=None, max_seqlen_q: int = 0,
                           rows_block: int = 0):
    """The preprocess for flash_bwd_hopper: (delta, lse2 = lse * log2(e), dq_acc). delta and lse2 are
    [batch * nheads_q, rows] fp32 with rows = seqlen_q rounded up to rows_block (default block_m, the tiles this
    kernel takes; the Gluon kernels' largest query block, a multiple of it), 0 past seqlen_q (the kernels read
    whole query blocks); dq_acc is the zeroed fp32 dQ buffer, shaped like out. Varlen (out, dout (total_q, heads,
    head_dim), lse (heads, total_q), cu_seqlens_q int32): delta, lse2 [nheads_q, vector_rows], sequence b's rows
    from column cu_seqlens_q[b] rounded up to 4, plus 4 b (every TMA box 16-byte aligned), 0 elsewhere; dq_acc zeroed
    (its rows outside every sequence too)."""
    if rows_block % block_m:
        raise ValueError(f"rows_block={rows_block} must be a multiple of block_m={block_m} (whole query blocks)")
    lse = lse.contiguous()
    varlen = cu_seqlens_q is not None
    if varlen:
        (total, nheads_q, head_dim), batch, seqlen_q = out.shape, cu_seqlens_q.numel() - 1, max_seqlen_q
        rows = vector_rows(total, rows_block or block_m, batch)
        delta = torch.zeros((nheads_q, rows), dtype=torch.float32, device=out.device)
        dq_acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
        grid = (cdiv(seqlen_q, block_m), batch * nheads_q)
        strides = (0, *out.stride()[:2], 0, *dout.stride()[:2], 0, rows, 0, *lse.stride()[:1], 0,
                   *dq_acc.stride()[:2])
    else:
        batch, seqlen_q, nheads_q, head_dim = out.shape
        rows = vector_rows(seqlen_q, rows_block or block_m)
        delta = torch.empty((batch * nheads_q, rows), dtype=torch.float32, device=out.device)
        dq_acc = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        grid = (rows // block_m, batch * nheads_q)
        strides = (*out.stride()[:3], *dout.stride()[:3], nheads_q * rows, rows, *lse.stride()[:2],
                   *dq_acc.stride()[:3])
    lse2 = torch.zeros_like(delta) if varlen else torch.empty_like(delta)
    # The launch's plan per call signature (ops/_triton.PlanCache): pointer alignments are part of its specialization.
    key = (out.shape, out.stride(), dout.stride(), lse.stride(), out.dtype, dout.dtype, out.data_ptr() % 16,
           dout.data_ptr() % 16, lse.data_ptr() % 16, block_m, rows, varlen and (batch, seqlen_q), launch_device())
    launch, sizes = _PREPROCESS_PLANS.get(key, lambda: (
        Launch(_launch_preprocess, grid, IS_VARLEN=varlen, WRITE_LSE2=True, BLOCK_M=block_m,
               BLOCK_D=next_power_of_2(head_dim)),
        (*strides, nheads_q, seqlen_q, rows, head_dim)))
    launch(out, dout, delta, lse, lse2, dq_acc, cu_seqlens_q if varlen else delta, *sizes)
    return delta, lse2, dq_acc


_PREPROCESS_PLANS = PlanCache()
