"""The key-block walk of flash_bwd_hopper's dK / dV programs (Gluon, Hopper): which key block, batch entry and kv head
a program owns, which query blocks see its keys, and the order its steps take them (every query head of the GQA
group). Shared by flash_bwd_hopper's producer and consumers; moved out of flash_bwd_hopper.py (session 44) as they
were."""

from __future__ import annotations

from .flash_fwd_hopper import gluon

if gluon is not None:
    from triton.experimental.gluon import language as gl

    from ._hopper_common import _seq_bounds
    from .flash_bwd_dq_hopper import _vec_start

    @gluon.jit
    def _query_range(i_n, seqlen_q, off, windows, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Key block i_n -> (first query block that sees any of its keys, number of query blocks from there, 0 when
        none does). Query q sees key k iff q + off - window_left <= k <= q + off + window_right (windows: (window_left,
        window_right); off = seqlen_k - seqlen_q when bottom-right, else 0)."""
        window_left, window_right = windows
        n_m = gl.cdiv(seqlen_q, BLOCK_M)
        m_first = 0
        if HAS_RIGHT:
            m_first = gl.minimum(gl.maximum(i_n * BLOCK_N - off - window_right, 0) // BLOCK_M, n_m)
        m_end = n_m
        # the last query seeing the block's last key: i_n * BLOCK_N + BLOCK_N - 1 + window_left - off
        if HAS_LEFT:
            m_end = gl.minimum(gl.cdiv(gl.maximum(i_n * BLOCK_N + BLOCK_N + window_left - off, 0), BLOCK_M), n_m)
        return m_first, gl.maximum(m_end - m_first, 0)

    @gluon.jit
    def _program(seqlen_k, nheads_k, BLOCK_N: gl.constexpr):
        """This program's (key block, batch, kv head): the key blocks of one head side by side, so the programs in
        flight share their Q / dO in L2 (and, causal, the heaviest, first key blocks start first). A 1-D grid."""
        n_blocks = gl.cdiv(seqlen_k, BLOCK_N)
        pid = gl.program_id(0)
        i_bhk = pid // n_blocks
        return pid % n_blocks, i_bhk // nheads_k, i_bhk % nheads_k

    @gluon.jit
    def _key_block(cu_seqlens, seqlen_q, seqlen_k, nheads_k, windows, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                   BOTTOM_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """This program's (TMA batch coordinate b, first query row, first key row of its sequence, the sequence's
        seqlen_q and seqlen_k, kv head, first key n0 within the sequence, the causal offset off, first query block,
        number of query blocks, live, the column of the sequence's first row in lse2 / delta). Query q sees key k
        iff q + off - window_left <= k <= q + off + window_right.
        Varlen (_hopper_common._seq_bounds): sequence i_b of the packed tensors, seqlen_q / _k the longest
        sequence's (the grid has that many key blocks per sequence); a key block past its sequence's end is not live:
        it has no steps and loads and stores nothing."""
        i_n, i_b, i_hk = _program(seqlen_k, nheads_k, BLOCK_N)
        b, q_start, k_start, sq, sk = _seq_bounds(i_b, cu_seqlens, seqlen_q, seqlen_k, IS_VARLEN)
        off = 0
        if BOTTOM_RIGHT:
            off = sk - sq
        m_first, n_steps = _query_range(i_n, sq, off, windows, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
        live = True
        if IS_VARLEN:
            live = i_n * BLOCK_N < sk
            if i_n * BLOCK_N >= sk:
                n_steps = 0
        return b, q_start, k_start, sq, sk, i_hk, i_n * BLOCK_N, off, m_first, n_steps, live, _vec_start(
            i_b, q_start, IS_VARLEN)

    @gluon.jit
    def _step(i, i_hk, group, m_first, n_steps, BLOCK_M: gl.constexpr):
        """Step i of a key block's walk -> (query head, first query row): the group's heads one after the other,
        each over query blocks [m_first, m_first + n_steps). (Starting each key block's walk at its own diagonal,
        so that the programs of one head add into different dQ rows at a time, measured slower: session 16.)"""
        return i_hk * group + i // n_steps, (m_first + i % n_steps) * BLOCK_M
