"""The Gluon forward's tile walk and online-softmax step (flash_fwd_hopper.py): which (head, row block) tiles a program
walks, in which order, the key blocks each row block sees, and the softmax of one key block."""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from ._hopper_common import _alibi, _softcap
except ImportError:  # a triton without Gluon: nothing here is defined or used
    gluon = None

if gluon is not None:
    @gluon.jit
    def _softmax_block(s, m_i, l_i, j, m0, seqlen_q, seqlen_k, full_end, left_full, window_left, window_right,
                       qk_scale, softcap_scale, alibi_slope, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                       BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
        """Online-softmax step for key block j: s [BLOCK_M, BLOCK_N] raw Q K^T (fp32, s_layout).
        Returns (p, alpha, m_new, l_new); blocks reaching past full_end get the causal / length mask, blocks starting
        before left_full (HAS_LEFT: the first key every row sees) the left window's. HAS_SOFTCAP: the scores are
        tanh(s * softcap_scale) times qk_scale (= softcap * log2(e)), capped before the mask. HAS_ALIBI: minus
        alibi_slope (_hopper_common._alibi_slope's, in raw score units) times |row + off - key|, after the cap."""
        s = _softcap(s, softcap_scale, HAS_SOFTCAP)
        if HAS_ALIBI:
            # row - key from the block's first key and the tile's first row: the key vector changes with j (kept
            # in the loop, not hoisted), the row vector is two values per thread
            first_key = j * BLOCK_N - m0 - (seqlen_k - seqlen_q if BOTTOM_RIGHT else 0)
            alibi_q = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout)).to(gl.float32)
            alibi_k = (gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)) + first_key).to(gl.float32)
            s = _alibi(s, alibi_slope, gl.expand_dims(alibi_q, 1), gl.expand_dims(alibi_k, 0))
        need_mask = (j + 1) * BLOCK_N > full_end
        if HAS_LEFT:
            need_mask = need_mask | (j * BLOCK_N < left_full)
        if need_mask:
            # Key j * BLOCK_N + c is visible iff c <= last (per row, relative to the block): one compare and one
            # select per score. (cols < seqlen_k and cols <= rows + off + window_right, two compares and an and per
            # score, ran twice the instructions: ptxas hoisted the compares above the S wait and packed the
            # predicates into registers, session 31.)
            rel = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
            rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            if HAS_RIGHT:
                last = gl.minimum(rows + off + window_right, seqlen_k - 1) - j * BLOCK_N
                visible = gl.expand_dims(rel, 0) <= gl.expand_dims(last, 1)
            else:
                visible = gl.expand_dims(rel < seqlen_k - j * BLOCK_N, 0)
            if HAS_LEFT:          # key j * BLOCK_N + c is hidden from row r iff c < r + off - window_left - j * BLOCK_N
                first = rows + off - window_left - j * BLOCK_N
                visible = visible & (gl.expand_dims(rel, 0) >= gl.expand_dims(first, 1))
            s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)   # rows with no visible key yet
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_safe, 1))
        alpha = gl.exp2(m_i - m_safe)
        l_new = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_new

    @gluon.jit
    def _ws_tiles(n_units, PAIRED: gl.constexpr):
        """How many tiles this program walks: units u = program_id, + num_programs, ... of n_units, one tile each or,
        PAIRED, two (see _ws_tile)."""
        n_mine = gl.cdiv(n_units - gl.program_id(0), gl.num_programs(0))
        return 2 * n_mine if PAIRED else n_mine

    @gluon.jit
    def _ws_row_block(k, n_m_blocks, HAS_RIGHT: gl.constexpr, PAIRED: gl.constexpr):
        """This program's k-th tile -> (batch*head, row block). The row blocks of one head side by side (K / V reuse
        in L2), causal heaviest (last) first. PAIRED (persistent causal, an even number n of row blocks): a unit is
        row blocks n - 1 - i and i of one head, one after the other, so that every unit holds about n + 1 key blocks
        and the static round-robin over units stays balanced (one tile per unit gave one program twice another's
        work; causal with all heads' heaviest blocks first measured slower: the K / V in flight no longer fit L2)."""
        if PAIRED:
            t = 2 * (gl.program_id(0) + (k // 2) * gl.num_programs(0)) + k % 2
            i = (t % n_m_blocks) // 2
            i_m = n_m_blocks - 1 - i + (t % 2) * (2 * i + 1 - n_m_blocks)        # odd t: block i
        else:
            t = gl.program_id(0) + k * gl.num_programs(0)
            i_m = t % n_m_blocks
            if HAS_RIGHT:
                i_m = n_m_blocks - 1 - i_m
        return t // n_m_blocks, i_m

    @gluon.jit
    def _ws_key_blocks(m0, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT: gl.constexpr,
                       HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr):
        """(first key block, number of key blocks) of the row block starting at row m0 (the first key block is 0 but
        under a left window, HAS_LEFT)."""
        off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
        hi = seqlen_k
        if HAS_RIGHT:
            last_row = gl.minimum(m0 + BLOCK_M, seqlen_q) - 1
            hi = gl.maximum(gl.minimum(last_row + off + window_right + 1, seqlen_k), 0)
        j0 = 0
        if HAS_LEFT:
            j0 = gl.maximum(m0 + off - window_left, 0) // BLOCK_N
        # A block whose rows see no key still runs one block, fully masked: O = 0, lse = +inf.
        return j0, gl.maximum(gl.cdiv(hi, BLOCK_N) - j0, 1)
