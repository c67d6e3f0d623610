"""Attention dropout: a counter-based (Philox) mask that the backward pass regenerates bit for bit.

Element (b, h, i, j) of the mask, i and j counted inside their own sequence, is kept when

    uniform(philox(seed, counter = (j, i, b * nheads_q + h, offset))) >= dropout_p

so nothing is stored between forward and backward: both passes call ``dropout_keep`` on the same
counters. ``rng_state = (seed, offset)`` is drawn from torch's generator on the inputs' device, so
``torch.manual_seed`` makes a run reproducible. ``dropout_mask`` materializes the mask for tests.
"""

import torch
import triton
import triton.language as tl

from .._triton import cdiv


def new_rng_state(device) -> torch.Tensor:
    """(seed, offset) as an int64 tensor on ``device``, drawn from torch's default generator there."""
    return torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64, device=device)


@triton.jit
def dropout_keep(p_rng, bh, rows, cols, dropout_p):
    """Keep-mask for query rows ``rows`` and key columns ``cols`` of (batch * nheads_q + head) ``bh``.

    rows and cols broadcast against each other: rows[:, None] with cols[None, :] gives a [M, N] tile,
    rows[None, :] with cols[:, None] its transpose [N, M] (the backward's layout).
    """
    seed = tl.load(p_rng)
    offset = tl.load(p_rng + 1).to(tl.uint32)
    c0 = (cols + rows * 0).to(tl.uint32)
    c1 = (rows + cols * 0).to(tl.uint32)
    r0, _, _, _ = tl.philox(seed, c0, c1, c0 * 0 + bh.to(tl.uint32), c0 * 0 + offset)
    return tl.uint_to_uniform_float(r0) >= dropout_p


@triton.jit
def _dropout_mask_kernel(p_rng, p_mask, seqlen_q, seqlen_k, dropout_p,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    p_mask += i_bh.to(tl.int64) * seqlen_q * seqlen_k
    for start_n in range(0, seqlen_k, BLOCK_N):
        o_n = start_n + tl.arange(0, BLOCK_N)
        keep = dropout_keep(p_rng, i_bh, o_m[:, None], o_n[None, :], dropout_p)
        m_store = (o_m[:, None] < seqlen_q) & (o_n[None, :] < seqlen_k)
        tl.store(p_mask + o_m[:, None] * seqlen_k + o_n[None, :], keep.to(tl.int8), mask=m_store)


def dropout_mask(rng_state: torch.Tensor, batch: int, nheads_q: int, seqlen_q: int, seqlen_k: int,
                 dropout_p: float) -> torch.Tensor:
    """The keep-mask the attention kernels use for ``rng_state``: bool (batch, nheads_q, seqlen_q, seqlen_k)."""
    mask = torch.empty(batch, nheads_q, seqlen_q, seqlen_k, dtype=torch.int8, device=rng_state.device)
    grid = (cdiv(seqlen_q, 32), batch * nheads_q)
    _dropout_mask_kernel[grid](rng_state, mask, seqlen_q, seqlen_k, float(dropout_p), BLOCK_M=32, BLOCK_N=32)
    return mask.bool()
