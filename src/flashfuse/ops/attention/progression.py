"""The attention teaching progression: three Triton kernels between naive PyTorch and FlashAttention.

Every kernel here computes the same thing. For query row i of one (batch, head), reading kv head
h // group (GQA), with keys j < seqlen_k (and j <= i when causal: top-left aligned, as torch SDPA):

    s_ij = scale * q_i . k_j
    m_i  = max_j s_ij,   l_i = sum_j exp(s_ij - m_i)          (softmax statistics, always fp32)
    o_i  = sum_j (exp(s_ij - m_i) / l_i) v_j

They differ only in how the work is cut into programs and how the data travels from HBM:

    basic       one program per query row, one key per loop trip       2 * seqlen_k tiny loads per row
    vectorized  one program per query row, all keys in one 2-D load    limited by on-chip memory
    blocked     BLOCK_M query rows per program, tiles of BLOCK_N keys  tensor cores, each K/V tile shared
                through tl.dot, exact two-pass softmax                 by BLOCK_M rows, O(S) memory

The step after "blocked" is FlashAttention (ops/attention/flash_fwd.py): one pass over K/V instead of
two, by rescaling the output accumulator online. docs/attention-progression.md tells the whole story.

Launchers take (batch, nheads, seqlen, headdim) tensors whose last dim is contiguous, any other strides
(every stride is passed, nothing is copied). They trust their input: flashfuse.attention validates.
Forward only: there is no autograd here (flash_attention has it).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._triton import cdiv, dot, next_power_of_2

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): exp2 is the native instruction (MUFU.EX2)


# ----------------------------------------------------------------------------------------------------
# 1. basic: one query row per program, one key per loop trip.
#
# Pass 1 walks the keys one at a time: s_j = scale * q . k_j, keeping a running max m and a running
# sum l (when the max grows from m to m', the sum so far is rescaled: l <- l * exp(m - m') + exp(s_j - m')).
# Pass 2 walks them again, recomputes s_j (there is nowhere to keep a row of scores: no S x S buffer),
# and adds exp(s_j - m) / l * v_j to the output row.
#
# Why it is slow, although it moves the "right" bytes: every trip is one headdim-long load (k_j, then
# k_j and v_j), a reduction across the warp, and a few scalar flops that depend on that load. Nothing
# overlaps: the program waits a full L2/HBM round trip (hundreds of cycles) per key, 2 * seqlen_k
# times, with one warp busy. Each query row reads all of K (twice) and V on its own: seqlen_q * 3 * seqlen_k * headdim
# elements go through L2 for seqlen_k * headdim * 2 of real data. No tensor cores (the dot products are
# warp reductions on CUDA cores). It is the "write the math as loops" version, and it is correct.
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _basic_attention_kernel(
    p_q, p_k, p_v, p_o,
    stride_q_b, stride_q_h, stride_q_s,
    stride_k_b, stride_k_h, stride_k_s,
    stride_v_b, stride_v_h, stride_v_s,
    stride_o_b, stride_o_h, stride_o_s,
    nheads_q, seqlen_q, seqlen_k, headdim, group, scale,
    IS_CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (batch, head, query row), rows fastest: programs that run at the same time read
    # the same head's K/V, so it is served from L2 after the first reads.
    i_pid = tl.program_id(0)
    i_q = i_pid % seqlen_q
    i_bh = (i_pid // seqlen_q).to(tl.int64)
    i_b, i_h = i_bh // nheads_q, i_bh % nheads_q
    i_hk = i_h // group                                                   # GQA: kv head of this query head
    p_q += i_b * stride_q_b + i_h * stride_q_h + i_q.to(tl.int64) * stride_q_s
    p_k += i_b * stride_k_b + i_hk * stride_k_h
    p_v += i_b * stride_v_b + i_hk * stride_v_h
    p_o += i_b * stride_o_b + i_h * stride_o_h + i_q.to(tl.int64) * stride_o_s

    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < headdim                                                   # headdim padded to a power of 2
    b_q = tl.load(p_q + o_d, mask=m_d, other=0.0).to(tl.float32) * scale  # [BLOCK_D]

    hi = seqlen_k
    if IS_CAUSAL:
        hi = tl.minimum(seqlen_k, i_q + 1)                                # keys 0..i (top-left diagonal)

    # Pass 1: running max and sum of exp, one key per trip.
    m_i = tl.full([], float("-inf"), tl.float32)
    l_i = tl.zeros([], tl.float32)
    p_kj = p_k
    for _ in range(0, hi):
        b_k = tl.load(p_kj + o_d, mask=m_d, other=0.0).to(tl.float32)  # [BLOCK_D]
        s = tl.sum(b_q * b_k)                                             # scalar score
        m_new = tl.maximum(m_i, s)
        l_i = l_i * tl.exp(m_i - m_new) + tl.exp(s - m_new)
        m_i = m_new
        p_kj += stride_k_s                                                # pointer walk: no int32 overflow

    # Pass 2: recompute each score, weight its value row, accumulate. hi >= 1 (key 0 is always
    # visible), so l_i >= 1 here and the division is safe.
    inv_l = 1.0 / l_i
    acc = tl.zeros([BLOCK_D], tl.float32)
    p_kj = p_k
    p_vj = p_v
    for _ in range(0, hi):
        b_k = tl.load(p_kj + o_d, mask=m_d, other=0.0).to(tl.float32)
        p = tl.exp(tl.sum(b_q * b_k) - m_i) * inv_l                       # probability of key j
        b_v = tl.load(p_vj + o_d, mask=m_d, other=0.0).to(tl.float32)  # [BLOCK_D]
        acc += p * b_v
        p_kj += stride_k_s
        p_vj += stride_v_s
    tl.store(p_o + o_d, acc.to(p_o.dtype.element_ty), mask=m_d)


# ----------------------------------------------------------------------------------------------------
# 2. vectorized: one query row per program, every key in one 2-D load.
#
#   K_tile = K[o_s[:, None], o_d[None, :]]        [BLOCK_S, BLOCK_D]  (o_s * stride + o_d: one load)
#   s      = sum(K_tile * q[None, :], axis=1)     [BLOCK_S]
#   p      = exp(s - max(s)) / sum(exp(s - max(s)))
#   o      = sum(p[:, None] * V_tile, axis=0)     [BLOCK_D]
#
# Why it is faster than basic: the whole K (then V) of the head is requested at once. Consecutive
# lanes read consecutive headdim elements (coalesced 16-byte accesses), and thousands of loads are in
# flight together, so the program pays the memory latency twice, not 2 * seqlen_k times. The softmax is
# a handful of block-wide reductions instead of a serial chain.
# Why it is still slow: every query row re-reads all of K and V (seqlen_q-fold traffic through L2), the
# dot products run on CUDA cores (multiply + tree reduction), not tensor cores, and it cannot scale: one
# program holds next_pow2(seqlen_k) * next_pow2(headdim) elements of K (then V) on chip at once.
# ----------------------------------------------------------------------------------------------------

# The on-chip limit. One program runs on one SM, whose register file holds 64K 32-bit registers
# (256 KiB; the same on A100, H100 and H200) and a thread can own at most 255 of them. A tile of
# 32768 fp32 elements (128 KiB) is half of that file: with 16 warps (512 threads, the most that still
# leaves 128 registers per thread when they share the file) it is 64 registers per thread for the tile,
# leaving the other 64 for q, the products and the addresses. Twice that (65536 elements) would need the
# whole register file for the tile alone and spill to local memory on every access. So the largest tile
# is 32768 elements: seqlen_k <= 512 at headdim 64, 256 at headdim 128, 128 at headdim 256.
# Checked by compiling for sm_90 with Triton 3.6 and 3.9 (ptxas resource usage): at 32768 elements and
# 16 warps the kernel takes ~90-130 registers and no stack, fp16 and fp32; at 65536 it hits the
# 128-register cap of 16 warps and spills 96-448 bytes per thread (32 warps, 64 registers each: too).
VECTORIZED_MAX_ELEMENTS = 32768
# 64 tile elements per thread (see above), so small tiles get fewer warps: 2048 elements per warp.
_VECTORIZED_ELEMENTS_PER_WARP = 64 * 32


def vectorized_max_seqlen(headdim: int) -> int:
    """The longest seqlen_k vectorized_attention accepts at this head dim."""
    return VECTORIZED_MAX_ELEMENTS // next_power_of_2(headdim)


@triton.jit
def _vectorized_attention_kernel(
    p_q, p_k, p_v, p_o,
    stride_q_b, stride_q_h, stride_q_s,
    stride_k_b, stride_k_h, stride_k_s,
    stride_v_b, stride_v_h, stride_v_s,
    stride_o_b, stride_o_h, stride_o_s,
    nheads_q, seqlen_q, seqlen_k, headdim, group, scale,
    IS_CAUSAL: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_pid = tl.program_id(0)                                              # same grid as basic
    i_q = i_pid % seqlen_q
    i_bh = (i_pid // seqlen_q).to(tl.int64)
    i_b, i_h = i_bh // nheads_q, i_bh % nheads_q
    i_hk = i_h // group
    p_q += i_b * stride_q_b + i_h * stride_q_h + i_q.to(tl.int64) * stride_q_s
    p_k += i_b * stride_k_b + i_hk * stride_k_h
    p_v += i_b * stride_v_b + i_hk * stride_v_h
    p_o += i_b * stride_o_b + i_h * stride_o_h + i_q.to(tl.int64) * stride_o_s

    o_s = tl.arange(0, BLOCK_S)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < headdim
    m_s = o_s < seqlen_k
    if IS_CAUSAL:
        m_s = m_s & (o_s <= i_q)                                          # masked keys are not even read
    m_sd = m_s[:, None] & m_d[None, :]                                    # [BLOCK_S, BLOCK_D]
    o_sd = o_s[:, None].to(tl.int64) * stride_k_s + o_d[None, :]          # the 2-D broadcast offsets

    b_q = tl.load(p_q + o_d, mask=m_d, other=0.0).to(tl.float32) * scale  # [BLOCK_D]
    b_k = tl.load(p_k + o_sd, mask=m_sd, other=0.0).to(tl.float32)       # [BLOCK_S, BLOCK_D]
    b_s = tl.sum(b_k * b_q[None, :], axis=1)                              # [BLOCK_S]
    b_s = tl.where(m_s, b_s, float("-inf"))
    m_i = tl.max(b_s, axis=0)                                             # finite: key 0 is visible
    b_p = tl.exp(b_s - m_i)                                               # [BLOCK_S], 0 where masked
    l_i = tl.sum(b_p, axis=0)

    o_sd = o_s[:, None].to(tl.int64) * stride_v_s + o_d[None, :]
    b_v = tl.load(p_v + o_sd, mask=m_sd, other=0.0).to(tl.float32)       # [BLOCK_S, BLOCK_D]
    b_o = tl.sum(b_p[:, None] * b_v, axis=0) / l_i                        # [BLOCK_D]
    tl.store(p_o + o_d, b_o.to(p_o.dtype.element_ty), mask=m_d)


# ----------------------------------------------------------------------------------------------------
# 3. blocked: the fused MHA core. BLOCK_M query rows per program, K and V in tiles of BLOCK_N rows.
#
#   pass 1, for each key tile:  S = Q K^T * scale          [BLOCK_M, BLOCK_N]  (tl.dot: tensor cores)
#                               m' = max(m, rowmax(S));  l = l * exp(m - m') + rowsum(exp(S - m'));  m = m'
#   pass 2, for each key tile:  P = exp(S - m) / l          (S recomputed, P exact and final)
#                               O += P V                    [BLOCK_M, BLOCK_D]  (tl.dot)
#
# Why it is faster: a K/V tile loaded once serves BLOCK_M query rows, so HBM/L2 traffic drops by that
# factor against the row-per-program kernels; both products are matrix multiplies on tensor cores
# (HGMMA on Hopper) instead of CUDA-core reductions; the loop over tiles is software-pipelined (the next
# tile is loading while this one is multiplied). Memory is O(S): scores live only as one
# [BLOCK_M, BLOCK_N] tile in registers, never as S x S in HBM, so any sequence length works.
# Why it is not FlashAttention: the exact softmax needs the final row max and sum before any P can be
# normalized, so K is read and Q K^T computed twice (pass 1 only for the statistics). FlashAttention
# keeps an unnormalized O and rescales it by exp(m - m') whenever the max grows, which needs one pass.
# Exponentials use exp2 with log2(e) folded into the scale (one multiply saved per score).
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _blocked_attention_kernel(
    p_q, p_k, p_v, p_o,
    stride_q_b, stride_q_h, stride_q_s,
    stride_k_b, stride_k_h, stride_k_s,
    stride_v_b, stride_v_h, stride_v_s,
    stride_o_b, stride_o_h, stride_o_s,
    nheads_q, seqlen_q, seqlen_k, headdim, group, qk_scale,
    IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (batch, head, block of query rows), one grid axis (axis 1 is capped at 65535),
    # query blocks fastest so that the programs running together share a head's K/V in L2.
    i_pid = tl.program_id(0)
    num_m = tl.cdiv(seqlen_q, BLOCK_M)
    i_m = i_pid % num_m
    i_bh = (i_pid // num_m).to(tl.int64)
    i_b, i_h = i_bh // nheads_q, i_bh % nheads_q
    i_hk = i_h // group
    p_q += i_b * stride_q_b + i_h * stride_q_h
    p_k += i_b * stride_k_b + i_hk * stride_k_h
    p_v += i_b * stride_v_b + i_hk * stride_v_h
    p_o += i_b * stride_o_b + i_h * stride_o_h

    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    m_m = o_m < seqlen_q
    m_d = o_d < headdim
    m_md = m_m[:, None] & m_d[None, :]
    o_md = o_m[:, None].to(tl.int64) * stride_q_s + o_d[None, :]
    b_q = tl.load(p_q + o_md, mask=m_md, other=0.0)                       # [BLOCK_M, BLOCK_D], input dtype

    hi = seqlen_k
    if IS_CAUSAL:
        hi = tl.minimum(seqlen_k, (i_m + 1) * BLOCK_M)                    # later tiles are fully masked

    # Pass 1: row max and row sum of exp2 over all key tiles.
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    p_kn = p_k + o_n[:, None] * stride_k_s + o_d[None, :]                 # [BLOCK_N, BLOCK_D] pointers
    for start_n in range(0, hi, BLOCK_N):
        b_s = _blocked_scores(b_q, p_kn, o_m, start_n + o_n, m_d, seqlen_k, qk_scale, IS_CAUSAL)
        m_new = tl.maximum(m_i, tl.max(b_s, axis=1))                      # finite: key 0 is in tile 0
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(b_s - m_new[:, None]), axis=1)
        m_i = m_new
        p_kn += BLOCK_N * stride_k_s                                      # pointer walk: no int32 overflow

    # Pass 2: exact probabilities, O = sum over tiles of P V.
    inv_l = 1.0 / l_i                                                     # l_i >= 1 (the max term)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    p_kn = p_k + o_n[:, None] * stride_k_s + o_d[None, :]
    p_vn = p_v + o_n[:, None] * stride_v_s + o_d[None, :]
    for start_n in range(0, hi, BLOCK_N):
        b_s = _blocked_scores(b_q, p_kn, o_m, start_n + o_n, m_d, seqlen_k, qk_scale, IS_CAUSAL)
        b_p = tl.exp2(b_s - m_i[:, None]) * inv_l[:, None]                # [BLOCK_M, BLOCK_N], final P
        m_nd = ((start_n + o_n) < seqlen_k)[:, None] & m_d[None, :]
        b_v = tl.load(p_vn, mask=m_nd, other=0.0)                         # [BLOCK_N, BLOCK_D]
        acc = dot(b_p.to(b_v.dtype), b_v, acc)                            # [BLOCK_M, BLOCK_D]
        p_kn += BLOCK_N * stride_k_s
        p_vn += BLOCK_N * stride_v_s

    o_md = o_m[:, None].to(tl.int64) * stride_o_s + o_d[None, :]
    tl.store(p_o + o_md, acc.to(p_o.dtype.element_ty), mask=m_md)


@triton.jit
def _blocked_scores(b_q, p_kn, o_m, o_n, m_d, seqlen_k, qk_scale, IS_CAUSAL: tl.constexpr):
    """Scores of one key tile in the log2 domain, -inf where a key is past the end or in the future."""
    m_n = o_n < seqlen_k                                                  # [BLOCK_N]
    b_k = tl.load(p_kn, mask=m_n[:, None] & m_d[None, :], other=0.0)     # [BLOCK_N, BLOCK_D]
    b_s = dot(b_q, tl.trans(b_k), tl.zeros([b_q.shape[0], b_k.shape[0]], tl.float32)) * qk_scale
    visible = m_n[None, :]                                                # [1, BLOCK_N]
    if IS_CAUSAL:
        visible = visible & (o_n[None, :] <= o_m[:, None])                # [BLOCK_M, BLOCK_N]
    return tl.where(visible, b_s, float("-inf"))


# (BLOCK_M, BLOCK_N, num_warps, num_stages) for Hopper, by element size and padded head dim.
#
# Registers: the fp32 accumulator [BLOCK_M, BLOCK_D], the score tile [BLOCK_M, BLOCK_N] and the Q tile
# stay in registers for the whole loop, so the tiles are sized to keep a thread under the 255-register
# cap without spilling. Shared memory: the K/V tiles of the software pipeline, num_stages copies, must
# stay under Hopper's 227 KiB per block. Each entry was checked by compiling the kernel for sm_90 with
# Triton 3.6 and 3.9 and reading ptxas's resource usage (cuobjdump --dump-resource-usage); the numbers
# below are those. They are sound starting points, not timed optima.
# - 16-bit, headdim <= 64: BLOCK_M = 128 (a wgmma covers 64 rows per 4-warp warpgroup; 128 rows halve
#   the K/V traffic per query against 64), BLOCK_N = 64 keys per tile, 4 warps, 3 stages (a third
#   buffer hides the load latency behind two dots; more only takes shared memory): <= 237 regs, no
#   spill, 24 KiB.
# - 16-bit, headdim 128: the same tiles with 8 warps (acc is 128*128/256 = 64 regs per thread):
#   <= 241 regs, 48 KiB.
# - 16-bit, headdim 256: BLOCK_M = 64 (128 rows would need 128 regs per thread for acc alone) and
#   BLOCK_N = 32 (64 spills), 8 warps, 2 stages: <= 228 regs, 48 KiB.
# - fp32 (tf32x3 dots split each operand in a high and a low tf32 part, which roughly doubles operand
#   registers and shared memory): headdim <= 64 with 8 warps and 2 stages (<= 233 regs, 128 KiB; 4
#   warps spill, 3 stages take 160 KiB); headdim 128 with BLOCK_N = 32 and 1 stage (160 KiB, a 16-40
#   byte spill: every larger tile or deeper pipeline spills more or needs 192-256 KiB); headdim 256
#   with 64 x 16 tiles and 1 stage (160 KiB, spills 0.5-1.4 KiB per thread whatever the tiles: fp32 at
#   headdim 256 is correct but not what this kernel is for).
_BLOCKED_CONFIGS = {
    # (element bytes, BLOCK_D): (BLOCK_M, BLOCK_N, num_warps, num_stages)
    (2, 64): (128, 64, 4, 3),
    (2, 128): (128, 64, 8, 3),
    (2, 256): (64, 32, 8, 2),
    (4, 64): (128, 64, 8, 2),
    (4, 128): (128, 32, 8, 1),
    (4, 256): (32, 32, 4, 1),      # 64 x 16 with 8 warps hit an illegal address on an H200 (triton 3.6)
}


def _blocked_config(block_d: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this padded head dim (16..256) and dtype."""
    elem = 4 if dtype == torch.float32 else 2
    return _BLOCKED_CONFIGS[(elem, max(block_d, 64))]


# ----------------------------------------------------------------------------------------------------
# Launchers: (batch, nheads, seqlen, headdim) in, same layout out; any strides with a contiguous last dim.
# ----------------------------------------------------------------------------------------------------
def _strides(q, k, v, out):
    return (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])


def _prepare(q, k, v, out):
    """Output buffer and the integer arguments every kernel takes."""
    batch, nheads_q, seqlen_q, headdim = q.shape
    if out is None:
        out = torch.empty(batch, nheads_q, seqlen_q, headdim, dtype=q.dtype, device=q.device)
    group = nheads_q // k.shape[1]
    return out, (nheads_q, seqlen_q, k.shape[2], headdim, group)


def _nothing_to_compute(out, k) -> bool:
    """Empty output: nothing to do. No keys (seqlen_k == 0): every row attends to nothing and is 0."""
    if out.numel() == 0 or k.shape[2] == 0:
        out.zero_()
        return True
    return False


def _default_scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def basic_attention_forward(q, k, v, is_causal=False, scale=None, out=None):
    """basic kernel: q (B, Hq, Sq, D), k/v (B, Hk, Sk, D) -> out (B, Hq, Sq, D) (written into ``out``)."""
    out, ints = _prepare(q, k, v, out)
    batch, nheads_q, seqlen_q, headdim = q.shape
    if _nothing_to_compute(out, k):
        return out
    # One warp per program: the only parallel work is one headdim-long vector (<= 256 elements, 8 per
    # lane); more warps would idle, fewer programs per SM would run.
    grid = (batch * nheads_q * seqlen_q,)
    _basic_attention_kernel[grid](
        q, k, v, out, *_strides(q, k, v, out), *ints, _default_scale(q, scale),
        IS_CAUSAL=bool(is_causal), BLOCK_D=next_power_of_2(headdim), num_warps=1,
    )
    return out


def vectorized_attention_forward(q, k, v, is_causal=False, scale=None, out=None):
    """vectorized kernel, same contract as basic; seqlen_k must be <= vectorized_max_seqlen(headdim)."""
    out, ints = _prepare(q, k, v, out)
    batch, nheads_q, seqlen_q, headdim = q.shape
    seqlen_k = k.shape[2]
    block_s, block_d = next_power_of_2(seqlen_k), next_power_of_2(headdim)
    if block_s * block_d > VECTORIZED_MAX_ELEMENTS:
        raise ValueError(
            f"vectorized_attention loads all keys of a head into one program: next_pow2(seqlen_k={seqlen_k}) "
            f"* next_pow2(headdim={headdim}) = {block_s * block_d} elements, over its on-chip limit of "
            f"{VECTORIZED_MAX_ELEMENTS} (seqlen_k <= {vectorized_max_seqlen(headdim)} at headdim {headdim}); "
            "use blocked_attention or flash_attention for longer sequences")
    if _nothing_to_compute(out, k):
        return out
    num_warps = max(1, min(16, block_s * block_d // _VECTORIZED_ELEMENTS_PER_WARP))
    grid = (batch * nheads_q * seqlen_q,)
    _vectorized_attention_kernel[grid](
        q, k, v, out, *_strides(q, k, v, out), *ints, _default_scale(q, scale),
        IS_CAUSAL=bool(is_causal), BLOCK_S=block_s, BLOCK_D=block_d, num_warps=num_warps,
    )
    return out


def blocked_attention_forward(q, k, v, is_causal=False, scale=None, out=None):
    """blocked kernel, same contract as basic; any seqlen."""
    out, ints = _prepare(q, k, v, out)
    batch, nheads_q, seqlen_q, headdim = q.shape
    if _nothing_to_compute(out, k):
        return out
    block_d = next_power_of_2(headdim, 16)                                # tl.dot needs K >= 16
    block_m, block_n, num_warps, num_stages = _blocked_config(block_d, q.dtype)
    grid = (batch * nheads_q * cdiv(seqlen_q, block_m),)
    _blocked_attention_kernel[grid](
        q, k, v, out, *_strides(q, k, v, out), *ints, _default_scale(q, scale) * LOG2E,
        IS_CAUSAL=bool(is_causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
