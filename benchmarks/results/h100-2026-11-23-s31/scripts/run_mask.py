import sys
sys.path.insert(0, "/tmp/s31")
from maskvar import SRC, run
OLD = '''            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            visible = gl.expand_dims(cols < seqlen_k, 0)
            if HAS_RIGHT:
                off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
                visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + off + window_right, 1))
            s = gl.where(visible, s, float("-inf"))'''
assert OLD in SRC
A = '''            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            if HAS_RIGHT:
                rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
                off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
                last = gl.minimum(rows + off + window_right, seqlen_k - 1)
                visible = gl.expand_dims(cols, 0) <= gl.expand_dims(last, 1)
            else:
                visible = gl.expand_dims(cols < seqlen_k, 0)
            s = gl.where(visible, s, float("-inf"))'''
B = '''            rel = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            if HAS_RIGHT:
                rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
                off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
                last = gl.minimum(rows + off + window_right, seqlen_k - 1) - j * BLOCK_N
                visible = gl.expand_dims(rel, 0) <= gl.expand_dims(last, 1)
            else:
                visible = gl.expand_dims(rel < seqlen_k - j * BLOCK_N, 0)
            s = gl.where(visible, s, float("-inf"))'''
V = {"base": SRC, "A": SRC.replace(OLD, A), "B": SRC.replace(OLD, B)}
cases = [(64, True, dict(NUM_STAGES=3))]
for name in sys.argv[1:]:
    print("==", name, flush=True)
    run(name, V[name], cases)
