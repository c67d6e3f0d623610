"""Attention dropout: a counter-based (Philox4x32-7) mask that every kernel, forward and backward, regenerates bit for
bit, so nothing is stored between the passes.

Scores (query i, key j), counted inside their own sequence, are drawn in groups of sixteen, one Philox call (4 x 32
random bits) per group, each score an 8-bit uniform:

    group       queries {16 a + 2 s + e + 8 f}  x  keys {16 b + 2 q + d + 8 g}     (s, q < 4; e, f, d, g in {0, 1})
    counter     (b, 16 a + 4 s + q, batch * nheads_q + head, offset), key = seed         (tl.philox, 7 rounds)
    score       word 2 f + g, byte 2 e + d (byte 0 = the low 8 bits): u in [0, 256)
    kept        iff u >= threshold = min(round(fp32(dropout_p) * 256), 255); kept scores scaled by 1 / (1 - p)

Why this shape: in Hopper's wgmma accumulator layout a thread holds rows r and r + 8 of each 16-row block and the
column pairs 2c, 2c + 1 eight apart. Of S = Q K^T (the forward, the dQ pass) the thread with row r = 2 s + e holds the
8 scores of a group with its e (two threads per group); of S^T = K Q^T (the backward's transposed layout) the thread
with row r = 2 q + d holds the 8 with its d. So both layouts make one call per eight scores (a group of 16-bit uniforms,
as this mask was drawn in session 50, gave the transposed layout one call per four, and one call per score before it
cost more instructions than the matrix products). 7 rounds and 8 bits are flash-attn's own choices (its CUDA kernels'
philox.cuh; 7 rounds pass BigCrush, Salmon et al. 2011). The drop probability is realized in steps of 2^-8, within
2^-9 of dropout_p up to 511 / 512 (255 / 256 above); the scale is 1 / (1 - dropout_p) as given (flash-attn's too).

``rng_state = (seed, offset)`` is drawn from torch's generator on the inputs' device, so ``torch.manual_seed`` makes a
run reproducible. ``dropout_keep`` is the Triton kernels' per-score form (one call per score: those kernels are the
portable fallback), ``_hopper_common._dropout_keep`` the Gluon kernels' per-group one, ``dropout_mask`` materializes the
mask for tests and ``reference_dropout_mask`` is the definition above in plain PyTorch.
"""

import torch
import triton
import triton.language as tl

from .._triton import cdiv

PHILOX_ROUNDS = tl.constexpr(7)      # flash-attn's; Triton's default is 10


def new_rng_state(device) -> torch.Tensor:
    """(seed, offset) as an int64 tensor on ``device``, drawn from torch's default generator there."""
    return torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64, device=device)


@triton.jit
def dropout_threshold(dropout_p):
    """u >= this keeps a score: round(dropout_p * 256) in fp32, at most 255."""
    p = tl.cast(dropout_p, tl.float32)        # (a Python float in the interpreter)
    return tl.minimum((p * 256.0 + 0.5).to(tl.int32), 255).to(tl.uint32)


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
    c1 = (((i >> 4) << 4) | (((i >> 1) & 3) << 2) | ((j >> 1) & 3)).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c0 * 0 + bh.to(tl.uint32), c0 * 0 + offset, PHILOX_ROUNDS)
    upper_row = ((i >> 3) & 1) != 0
    word = tl.where(upper_row, tl.where(((j >> 3) & 1) != 0, r3, r2), tl.where(((j >> 3) & 1) != 0, r1, r0))
    u = (word >> (((i & 1) * 16) + ((j & 1) * 8)).to(tl.uint32)) & 0xFF
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


def _philox4x32(c, k0, k1, rounds=PHILOX_ROUNDS):
    """Philox4x32 on int64 tensors holding uint32 values (c: four counters, k0 / k1: the key's halves)."""
    m32 = 0xFFFFFFFF

    def mul_wide(a: int, b):          # (high, low) 32 bits of a * b, in 16-bit halves (a * b overflows int64)
        a1, a0, b1, b0 = a >> 16, a & 0xFFFF, b >> 16, b & 0xFFFF
        low48 = ((a1 * b0 + a0 * b1) << 16) + a0 * b0
        return a1 * b1 + (low48 >> 32), low48 & m32

    c0, c1, c2, c3 = c
    for _ in range(int(rounds)):
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
    a, s, e, f = i >> 4, (i >> 1) & 3, i & 1, (i >> 3) & 1
    b, q, d, g = j >> 4, (j >> 1) & 3, j & 1, (j >> 3) & 1
    counters = (b + 0 * i + 0 * bh, (a << 4 | s << 2 | q) + 0 * bh, bh + 0 * i + 0 * j,
                torch.full_like(bh + i + j, offset & 0xFFFFFFFF))
    words = torch.stack(_philox4x32(counters, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    word = torch.gather(words, 0, (2 * f + g + 0 * bh)[None]).squeeze(0)
    u = (word >> (8 * (2 * e + d))) & 0xFF
    p32 = torch.tensor(dropout_p, dtype=torch.float32)
    threshold = min(int((p32 * 256.0 + 0.5).item()), 255)
    keep = u >= threshold
    return keep.reshape(batch, nheads_q, seqlen_q, seqlen_k).to(rng_state.device)
