"""The producer warp of flash_bwd_hopper's kernel: K and V once per program, then each step's Q + lse2 and dO + delta
into the ring's slots by TMA (varlen boxes reaching past cu_seqlens[-1] zeroed first). Moved out of
flash_bwd_hopper.py (session 48) as it was, beside flash_bwd_hopper_stores.py's hand-outs."""

from __future__ import annotations

from .flash_fwd_hopper import gluon

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    from ._hopper_common import _packed_end, _tma_box, _zero_rows
    from .flash_bwd_hopper_tiles import _key_block, _step

    @gluon.jit
    def _bwd_producer(descs, smem, bars, shape, cu_seqlens, windows, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                      BOTTOM_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                      TAIL_DIM: gl.constexpr, zfill):
        """One warp: K and V once, then per step (query head of the group, query block) Q + lse2 and dO + delta
        into slot i % NUM_STAGES once the consumer released it. Varlen: boxes reaching past cu_seqlens[-1] land on
        zfill, have those rows zeroed (_hopper_common._zero_rows: 0 * NaN in dS^T Q, P^T dO, dO V^T or dS K would
        reach the sequences), then are released on their ready barriers. TAIL_DIM: each tile's columns past
        HEAD_DIM in a second box of their own on the same barrier (q, k, v, dO: descs[9:13] into smem[8:12])."""
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc = descs[:9]
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem = smem[:8]
        kv_ready, q_ready, do_ready, empty = bars
        nheads_q, nheads_k, group, seqlen_q, seqlen_k = shape
        n_seqs = gl.num_programs(0) // (gl.cdiv(seqlen_k, BLOCK_N) * nheads_k)        # (_program's grid)
        q_end = _packed_end(cu_seqlens[0], n_seqs, IS_VARLEN)
        k_end = _packed_end(cu_seqlens[1], n_seqs, IS_VARLEN)
        b, q_start, k_start, _, _, i_hk, n0, _, m_first, n_steps, live, vec0 = _key_block(
            cu_seqlens, seqlen_q, seqlen_k, nheads_k, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, IS_VARLEN, BLOCK_M,
            BLOCK_N)
        zphase = 0
        if live:
            if IS_VARLEN and k_start + n0 + BLOCK_N > k_end:
                _load_kv(descs, smem, zfill, [b, k_start + n0, i_hk, 0], BLOCK_N, HEAD_DIM, TAIL_DIM)
                mbarrier.wait(zfill, zphase)
                zphase ^= 1
                _zero_rows(k_smem, k_end - k_start - n0)
                _zero_rows(v_smem, k_end - k_start - n0)
                mbarrier.arrive(kv_ready, count=1)
            else:
                _load_kv(descs, smem, kv_ready, [b, k_start + n0, i_hk, 0], BLOCK_N, HEAD_DIM, TAIL_DIM)
            for i in range(group * n_steps):
                i_h, m0 = _step(i, i_hk, group, m_first, n_steps, BLOCK_M)
                row = q_start + m0
                slot = i % NUM_STAGES
                mbarrier.wait(empty.index(slot), ((i // NUM_STAGES) & 1) ^ 1)    # the first pass finds slots free
                coords = ([b, row, i_h, 0], [b * nheads_q + i_h, vec0 + m0])
                if IS_VARLEN and row + BLOCK_M > q_end:
                    _load_query_rows(descs, smem, slot, zfill, zfill, coords, BLOCK_M, HEAD_DIM, TAIL_DIM, True)
                    mbarrier.wait(zfill, zphase)
                    zphase ^= 1
                    _zero_rows(q_smem.index(slot), q_end - row)
                    _zero_rows(do_smem.index(slot), q_end - row)
                    mbarrier.arrive(q_ready.index(slot), count=1)
                    mbarrier.arrive(do_ready.index(slot), count=1)
                else:
                    _load_query_rows(descs, smem, slot, q_ready.index(slot), do_ready.index(slot), coords, BLOCK_M,
                                     HEAD_DIM, TAIL_DIM, False)

    @gluon.jit
    def _load_kv(descs, smem, bar, coord, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, TAIL_DIM: gl.constexpr):
        """K and V (and, TAIL_DIM, their columns from HEAD_DIM on: descs[10], [11] into smem[9], [10]) onto bar."""
        mbarrier.expect(bar, 2 * BLOCK_N * (HEAD_DIM + TAIL_DIM) * 2)
        tma.async_copy_global_to_shared(descs[1], coord, bar, _tma_box(smem[1], descs[1]))
        tma.async_copy_global_to_shared(descs[2], coord, bar, _tma_box(smem[2], descs[2]))
        if TAIL_DIM > 0:
            b, row, h, _ = coord
            tma.async_copy_global_to_shared(descs[10], [b, row, h, HEAD_DIM], bar, _tma_box(smem[9], descs[10]))
            tma.async_copy_global_to_shared(descs[11], [b, row, h, HEAD_DIM], bar, _tma_box(smem[10], descs[11]))

    @gluon.jit
    def _load_query_rows(descs, smem, slot, q_bar, do_bar, coords, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                         TAIL_DIM: gl.constexpr, ONE_BAR: gl.constexpr):
        """Q + lse2 onto q_bar, dO + delta onto do_bar, or, ONE_BAR, all four onto q_bar (one expect: a second
        arrival would complete the barrier's phase early or count toward the next). TAIL_DIM: Q's and dO's columns
        from HEAD_DIM on (descs[9], [12] into smem[8], [11]) with them."""
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc = descs[:9]
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem = smem[:8]
        tile_coord, vec_coord = coords
        nbytes: gl.constexpr = BLOCK_M * (HEAD_DIM + TAIL_DIM) * 2 + BLOCK_M * 4
        mbarrier.expect(q_bar, 2 * nbytes if ONE_BAR else nbytes)
        tma.async_copy_global_to_shared(q_desc, tile_coord, q_bar, _tma_box(q_smem.index(slot), q_desc))
        tma.async_copy_global_to_shared(lse_desc, vec_coord, q_bar, _tma_box(lse_smem.index(slot), lse_desc))
        if not ONE_BAR:
            mbarrier.expect(do_bar, nbytes)
        tma.async_copy_global_to_shared(do_desc, tile_coord, do_bar, _tma_box(do_smem.index(slot), do_desc))
        tma.async_copy_global_to_shared(delta_desc, vec_coord, do_bar, _tma_box(delta_smem.index(slot), delta_desc))
        if TAIL_DIM > 0:
            b, row, h, _ = tile_coord
            tma.async_copy_global_to_shared(descs[9], [b, row, h, HEAD_DIM], q_bar,
                                            _tma_box(smem[8].index(slot), descs[9]))
            tma.async_copy_global_to_shared(descs[12], [b, row, h, HEAD_DIM], do_bar,
                                            _tma_box(smem[11].index(slot), descs[12]))
