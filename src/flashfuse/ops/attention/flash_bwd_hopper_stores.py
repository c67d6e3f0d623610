"""How flash_bwd_hopper's kernel hands its results out: dQ_i of each step reduce-added into the fp32 dQ buffer by TMA
(_hand_off_dq), and the program's dK, dV at the end, by TMA through K / V's shared-memory tiles or from registers with
rows masked (_store_dkdv). Moved out of flash_bwd_hopper.py (session 42) as they were; the kernel's PTX is unchanged."""

from __future__ import annotations

from .flash_fwd_hopper import gluon

if gluon is not None:
    from triton._C.libtriton import ir
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    from ._hopper_common import _tma_box

    @builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """dst[box at coord] += src (a shared-memory tile), one bulk TMA reduction (cp.reduce.async.bulk.tensor);
        completes like a TMA store (tma.store_wait). Triton 3.6 has the op but no Gluon wrapper for it."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)

    @gluon.jit
    def _hand_off_dq(dq, dq_smem, dq_desc, empty, slot, i, b, row, i_h, dqt, dqt_smem, dqt_desc,
                     HEAD_DIM: gl.constexpr, TAIL_DIM: gl.constexpr):
        """End of step i: dQ_i -> dq_smem[i % 2] (whose last reader, the reduce-add of dQ_{i-2}, the wait at the end
        of step i - 1 saw done), the slot released, dQ_i reduce-added into the buffer. (Storing dQ_{i-1} while the
        next step's first products run instead spills at hd128 and measured slower at hd64: session 16.) TAIL_DIM > 0:
        dQ's columns HEAD_DIM.. (dqt) likewise through dqt_smem and dqt_desc; else those three are unused."""
        dq_smem.index(i % 2).store(dq)
        if TAIL_DIM > 0:
            dqt_smem.index(i % 2).store(dqt)
        fence_async_shared()
        # TMA bulk groups belong to the thread that issued them: it waits here for the reduce-add issued a step's
        # products ago. The barrier then tells the other threads, orders every warp's dQ_i stores before the
        # reduce-add below, and holds the slot release (one thread's arrive) and the next step's writes to the
        # score tiles in shared memory (and, after the loop, to K / V's tiles) until every product is done.
        tma.store_wait(pendings=0)
        gl.thread_barrier()
        mbarrier.arrive(empty.index(slot), count=1)
        # Rows past seqlen_q are dropped; varlen's add zeros into the next sequence's rows (their dS is 0).
        _tma_reduce_add(dq_desc, [b, row, i_h, 0], _tma_box(dq_smem.index(i % 2), dq_desc))
        if TAIL_DIM > 0:
            _tma_reduce_add(dqt_desc, [b, row, i_h, HEAD_DIM], _tma_box(dqt_smem.index(i % 2), dqt_desc))

    @gluon.jit
    def _store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, fp32_out, b, k_start, i_hk, n0, seqlen_k,
                    kv_layout: gl.constexpr, FP32_GRADS: gl.constexpr, IS_VARLEN: gl.constexpr, BLOCK_N: gl.constexpr,
                    HEAD_DIM: gl.constexpr):
        """The program's dK, dV [BLOCK_N, HEAD_DIM] (kv_layout, keys n0.. of the sequence from row k_start) to
        global memory: by TMA through K / V's tiles (free now), or from registers with rows past seqlen_k masked:
        fp32 dK, dV (partial gradients that a caller sums, as ring attention does) and a varlen sequence's last key
        block (a TMA box would overwrite the next sequence's first rows)."""
        if FP32_GRADS:
            _store_dkdv_rows(dk, dv, fp32_out, b, k_start, i_hk, n0, seqlen_k, 0, kv_layout, IS_VARLEN)
        elif IS_VARLEN:
            if n0 + BLOCK_N > seqlen_k:
                _store_dkdv_rows(dk, dv, fp32_out, b, k_start, i_hk, n0, seqlen_k, 0, kv_layout, IS_VARLEN)
            else:
                _store_dkdv_tma(dk, dv, k_smem, v_smem, dk_desc, dv_desc, b, k_start + n0, i_hk)
        else:
            _store_dkdv_tma(dk, dv, k_smem, v_smem, dk_desc, dv_desc, b, n0, i_hk)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _store_dkdv_tma(dk, dv, k_smem, v_smem, dk_desc, dv_desc, b, row, i_hk):
        k_smem.store(dk.to(k_smem.dtype))
        v_smem.store(dv.to(v_smem.dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(dk_desc, [b, row, i_hk, 0], _tma_box(k_smem, dk_desc))
        tma.async_copy_shared_to_global(dv_desc, [b, row, i_hk, 0], _tma_box(v_smem, dv_desc))

    @gluon.jit
    def _store_dkdv_rows(dk, dv, fp32_out, b, k_start, i_hk, n0, seqlen_k, COL0: gl.constexpr, kv_layout: gl.constexpr,
                         IS_VARLEN: gl.constexpr):
        """dK, dV [rows, W] (kv_layout) into columns COL0.. of dk / dv (fp32_out: pointers, strides, head_dim), rows
        past seqlen_k and columns past head_dim masked."""
        p_dk, p_dv, stride_dkv_b, stride_dkv_s, stride_dkv_h, head_dim = fp32_out
        cols = COL0 + gl.arange(0, dk.shape[1], layout=gl.SliceLayout(0, kv_layout))
        rows = n0 + gl.arange(0, dk.shape[0], layout=gl.SliceLayout(1, kv_layout))
        offs = (i_hk * stride_dkv_h + gl.expand_dims((k_start + rows).to(gl.int64) * stride_dkv_s, 1)
                + gl.expand_dims(cols, 0))
        if not IS_VARLEN:           # (varlen: one batch entry)
            offs += b.to(gl.int64) * stride_dkv_b
        in_bounds = gl.expand_dims(rows < seqlen_k, 1) & gl.expand_dims(cols < head_dim, 0)
        gl.store(p_dk + offs, dk.to(p_dk.dtype.element_ty), mask=in_bounds)
        gl.store(p_dv + offs, dv.to(p_dv.dtype.element_ty), mask=in_bounds)
