"""Session 28: writes _fv_pairs.py, a variant of _hopper_fwd.py whose pass 3 takes two tiles per iteration (twice the
independent work per warp between the partition's barriers, one barrier pair per two tiles)."""
D = "src/flashfuse/ops/group_norm_details"
s = open(f"{D}/_hopper_fwd.py").read()
OLD = '''            for t in range(n_tiles):
                slot = (k + t) % SLOTS
                s = ring.index(slot).load(tile).to(gl.float32)
                fence_async_shared()      # these generic reads (and the write-back) before the next TMA write
                gl.thread_barrier()
                mbarrier.arrive(empty.index(slot), count=1)
                row = t * TILE_ROWS + rows
                w_row, b_row, w_1, b_1 = w_1, b_1, w_2, b_2
                w_2, b_2 = _affine_rows(p_w, p_b, ch0, row + 2 * TILE_ROWS, inv_rows_per_channel, rows_per_group,
                                        HAS_WEIGHT, HAS_BIAS, TILE_ROWS, tile)
                a = w_row * rstd                                   # z = s a + b: the normalization and the affine
                b = b_row - mean * a
                z = s * gl.expand_dims(a, 1) + gl.expand_dims(b, 1)
                if ACTIVATION == 1:     # z sigmoid(z) = z / (1 + 2^(-z log2 e)), the exponent as its own FMA
                    e = s * gl.expand_dims(a * _NEG_LOG2E, 1) + gl.expand_dims(b * _NEG_LOG2E, 1)
                    z = z * _rcp(1.0 + _ex2(e))
                offs = base + gl.expand_dims(row * TILE_COLS, 1) + gl.expand_dims(cols, 0)
                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)
'''
NEW = '''            for t in range(0, n_tiles - 1, 2):
                slot = (k + t) % SLOTS
                slot_b = (k + t + 1) % SLOTS
                s = ring.index(slot).load(tile).to(gl.float32)
                s_b = ring.index(slot_b).load(tile).to(gl.float32)
                fence_async_shared()      # these generic reads (and the write-back) before the next TMA write
                gl.thread_barrier()
                mbarrier.arrive(empty.index(slot), count=1)
                mbarrier.arrive(empty.index(slot_b), count=1)
                row = t * TILE_ROWS + rows
                wa, ba, wb, bb = w_1, b_1, w_2, b_2
                w_1, b_1 = _affine_rows(p_w, p_b, ch0, row + 2 * TILE_ROWS, inv_rows_per_channel, rows_per_group,
                                        HAS_WEIGHT, HAS_BIAS, TILE_ROWS, tile)
                w_2, b_2 = _affine_rows(p_w, p_b, ch0, row + 3 * TILE_ROWS, inv_rows_per_channel, rows_per_group,
                                        HAS_WEIGHT, HAS_BIAS, TILE_ROWS, tile)
                z = _norm_act(s, wa, ba, mean, rstd, ACTIVATION)
                z_b = _norm_act(s_b, wb, bb, mean, rstd, ACTIVATION)
                offs = base + gl.expand_dims(row * TILE_COLS, 1) + gl.expand_dims(cols, 0)
                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)
                _store_rows(p_y + offs + TILE_ROWS * TILE_COLS, z_b.to(dtype), row + TILE_ROWS, rows_per_group, cols,
                            HAS_PAD)
            if n_tiles % 2 == 1:
                t = n_tiles - 1
                slot = (k + t) % SLOTS
                s = ring.index(slot).load(tile).to(gl.float32)
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(empty.index(slot), count=1)
                row = t * TILE_ROWS + rows
                z = _norm_act(s, w_1, b_1, mean, rstd, ACTIVATION)
                offs = base + gl.expand_dims(row * TILE_COLS, 1) + gl.expand_dims(cols, 0)
                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)
'''
assert OLD in s
s = s.replace(OLD, NEW)
A = "    @gluon.jit\n    def _store_rows("
s = s.replace(A, '''    @gluon.jit
    def _norm_act(s, w_row, b_row, mean, rstd, ACTIVATION: gl.constexpr):
        a = w_row * rstd
        b = b_row - mean * a
        z = s * gl.expand_dims(a, 1) + gl.expand_dims(b, 1)
        if ACTIVATION == 1:
            e = s * gl.expand_dims(a * _NEG_LOG2E, 1) + gl.expand_dims(b * _NEG_LOG2E, 1)
            z = z * _rcp(1.0 + _ex2(e))
        return z

''' + A, 1)
open(f"{D}/_fv_pairs.py", "w").write(s)
