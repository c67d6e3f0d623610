"""Attention dropout: a counter-based (Philox4x32-10) mask that every kernel, forward and backward, regenerates bit for
bit, so nothing is stored between the passes.

Scores (query i, key j), counted inside their own sequence, are drawn in groups of eight, one Philox call (4 x 32 random
bits) per group, each score a 16-bit uniform:

    group       queries {16 a + r, 16 a + r + 8}  x  keys {16 b + 2 q + e : e in 0, 1, 8, 9}      (r < 8, q < 4)
    counter     (b, 32 a + 4 r + q, batch * nheads_q + head, offset), key = seed        (Triton's tl.philox)
    score       word (i >> 3 & 1) + 2 (j >> 3 & 1), half j & 1 (the low 16 bits first): u in [0, 2^16)
    kept        iff u >= threshold = min(round(fp32(dropout_p) * 2^16), 2^16 - 1); kept scores scaled by 1 / (1 - p)

Why this shape: a group is what one thread holds of a 16 x 16 block of S = Q K^T in Hopper's wgmma accumulator layout
(rows r and r + 8, column pairs 2q, 2q + 1 eight apart), so the Gluon forward makes one call per eight scores; in the
backward's transposed layout (S^T = K Q^T) a thread holds the four scores of a group with its key's parity, one call per
four. (One call per score, as this mask was drawn before session 50, cost more instructions than the matrix products
themselves.) The drop probability is realized in steps of 2^-16, within 2^-17 of dropout_p (flash-attn's CUDA kernels
take 8 bits); the scale is 1 / (1 - dropout_p) as given.

``rng_state = (seed, offset)`` is drawn from torch's generator on the inputs' device, so ``torch.manual_seed`` makes a
run reproducible. ``dropout_keep`` is the Triton kernels' per-score form (one call per score: those kernels are the
portable fallback), ``_hopper_common._dropout_keep`` the Gluon kernels' per-group one, ``dropout_mask`` materializes the
mask for tests and ``reference_dropout_mask`` is the definition above in plain PyTorch.
"""

import torch
import triton
import triton.language as tl

from .._triton import cdiv

DROPOUT_BITS = 16


def new_rng_state(device) -> torch.Tensor:
    """(seed, offset) as an int64 tensor on ``device``, drawn from torch's default generator there."""
    return torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64, device=device)


@triton.jit
def dropout_threshold(dropout_p):
    """u >= this keeps a score: round(dropout_p * 2^16) in fp32, at most 2^16 - 1."""
    p = tl.cast(dropout_p, tl.float32)        # (a Python float in the interpreter)
    return tl.minimum((p * 65536.0 + 0.5).to(tl.int32), 65535).to(tl.uint32)


@triton.jit
def dropout_keep(p_rng, bh, rows, cols, dropout_p):
    """Keep-mask for query rows ``rows`` and key columns ``cols`` of (batch * nheads_q + head) ``bh``.

    rows and cols broadcast against each other: rows[:, None] with cols[None, :] gives a [M, N] tile,
    rows[None, :] with cols[:, None] its transpose [N, M] (the backward's layout).
    """
    seed = tl.load(p_rng)
    offset = tl.load(p_rng + 1).to(tl.uint32)
    i = rows + cols * 0
    j = cols + rows * 0
    c0 = (j >> 4).to(tl.uint32)
    c1 = (((i >> 4) << 5) | ((i & 7) << 2) | ((j >> 1) & 3)).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c0 * 0 + bh.to(tl.uint32), c0 * 0 + offset)
    upper_row = ((i >> 3) & 1) != 0
    word = tl.where(((j >> 3) & 1) != 0, tl.where(upper_row, r3, r2), tl.where(upper_row, r1, r0))
    u = (word >> ((j & 1) * 16).to(tl.uint32)) & 0xFFFF
    return u >= dropout_threshold(dropout_p)


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


_PHILOX_ROUND = (0xD2511F53, 0xCD9E8D57)
_PHILOX_KEY = (0x9E3779B9, 0xBB67AE85)


def _philox4x32(c, k0, k1):
    """Philox4x32-10 on int64 tensors holding uint32 values (c: four counters, k0 / k1: the key's halves)."""
    m32 = 0xFFFFFFFF

    def mul_wide(a: int, b):          # (high, low) 32 bits of a * b, in 16-bit halves (a * b overflows int64)
        a1, a0, b1, b0 = a >> 16, a & 0xFFFF, b >> 16, b & 0xFFFF
        low48 = ((a1 * b0 + a0 * b1) << 16) + a0 * b0
        return a1 * b1 + (low48 >> 32), low48 & m32

    c0, c1, c2, c3 = c
    for _ in range(10):
        (hi_a, lo_a), (hi_b, lo_b) = mul_wide(_PHILOX_ROUND[0], c0), mul_wide(_PHILOX_ROUND[1], c2)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _PHILOX_KEY[0]) & m32, (k1 + _PHILOX_KEY[1]) & m32
    return c0, c1, c2, c3


def reference_dropout_mask(rng_state: torch.Tensor, batch: int, nheads_q: int, seqlen_q: int, seqlen_k: int,
                           dropout_p: float) -> torch.Tensor:
    """The module docstring's definition in plain PyTorch (int64 arithmetic on the CPU): what dropout_mask returns."""
    seed, offset = (int(x) for x in rng_state.cpu())
    i = torch.arange(seqlen_q, dtype=torch.int64)[:, None]
    j = torch.arange(seqlen_k, dtype=torch.int64)[None, :]
    bh = torch.arange(batch * nheads_q, dtype=torch.int64)[:, None, None]
    counters = ((j >> 4) + 0 * i + 0 * bh, ((i >> 4) << 5 | (i & 7) << 2 | (j >> 1) & 3) + 0 * bh,
                bh + 0 * i + 0 * j, torch.full_like(bh + i + j, offset & 0xFFFFFFFF))
    words = torch.stack(_philox4x32(counters, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    word = torch.gather(words, 0, (((i >> 3) & 1) + 2 * ((j >> 3) & 1) + 0 * bh)[None]).squeeze(0)
    u = (word >> (16 * (j & 1))) & 0xFFFF
    p32 = torch.tensor(dropout_p, dtype=torch.float32)
    threshold = min(int((p32 * 65536.0 + 0.5).item()), 65535)
    keep = u >= threshold
    return keep.reshape(batch, nheads_q, seqlen_q, seqlen_k).to(rng_state.device)
