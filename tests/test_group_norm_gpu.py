"""group_norm, GPU tier: Stable Diffusion shapes in fp16 / bf16, NCHW and channels_last, every gradient against
the float64 reference, the three launch modes at real sizes, GroupNormAct against torch, and
torch.compile(fullgraph=True) with inductor."""

import pytest
import torch
import torch.nn.functional as F

import flashfuse.ops.group_norm as gn_ops
from flashfuse.ops.group_norm_details import _hopper_bwd, _hopper_fwd, _hopper_fwd_cl
from flashfuse.nn.group_norm import GroupNormAct
from flashfuse.ops.group_norm import group_norm
from flashfuse.reference.group_norm import group_norm_ref
from test_group_norm import (CHANNEL_SUM_SHAPES, CL, check, check_channel_sums, leaf, make, poison,  # noqa: F401
                             rel_err)   # (poison: autouse NaN fills)

pytestmark = pytest.mark.gpu

BF16, F16 = torch.bfloat16, torch.float16
# Relative error against float64: the output and dx are rounded once to the dtype (bf16 unit roundoff
# 2^-9, fp16 2^-12), s = x + residual once more; dw / db / dresidual are fp32 sums rounded once.
TOL = {BF16: 1e-2, F16: 2e-3}

# SD-1.5 / SDXL UNet GroupNorms (32 groups): ResnetBlock2D at 64x64 latents and the 128x128 / 32x32 levels.
SD_SHAPES = [(2, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32), (2, 320, 128, 128),
             (2, 640, 64, 64)]


@pytest.mark.parametrize("shape", SD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
def test_sd_shapes_gpu(shape, dtype, layout):
    """silu(GN(x + temb)) as in ResnetBlock2D, temb (N, C, 1, 1); x keeps its layout."""
    t = make(shape, dtype, "cuda", layout=layout, residual=shape[:2] + (1, 1))
    y = check(t, 32, "silu", TOL[dtype], eps=1e-6)
    if layout is CL:
        assert y.is_contiguous(memory_format=CL)


# SD-1.5's up blocks normalize concatenations: 960 / 1920 channels (30 / 60 per group: at batch 2 the NCHW split plan
# takes blocks of 32 channels with padding lanes), and 90 per group for a wider one (three blocks of 32).
@pytest.mark.parametrize("shape", [(2, 960, 32, 32), (2, 1920, 32, 32), (2, 2880, 16, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
def test_sd_concat_shapes_gpu(shape, layout):
    t = make(shape, BF16, "cuda", layout=layout, residual=shape[:2] + (1, 1))
    check(t, 32, "silu", TOL[BF16], eps=1e-6)


def test_channel_sums_gpu():
    """The per-channel sums of the backward's partials, compiled (a first version indexed its flattened (n, r) with // and %
    by a runtime R and gave wrong per-sample sums at (16, 1280, 4) on an H100, right ones in the interpreter)."""
    check_channel_sums("cuda", CHANNEL_SUM_SHAPES + [(16, 2560, 4), (8, 1280, 2), (1, 4096, 1)])


@pytest.mark.parametrize("activation", [None, "mish", "gelu"])
@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
def test_activations_full_residual_gpu(activation, layout):
    t = make((4, 640, 32, 32), BF16, "cuda", layout=layout, residual="full", shift=3.0)
    check(t, 32, activation, TOL[BF16])


@pytest.mark.parametrize("shape, groups", [((3, 96, 37, 41), 32), ((1, 1280, 8, 8), 32), ((4, 64, 1000), 8),
                                           ((1, 30, 300, 301), 3), ((5, 12, 1, 1), 4)],
                         ids=["cpg3-odd", "small", "ncl", "big-groups", "hw1"])
@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
def test_odd_shapes_gpu(shape, groups, layout):
    if layout is CL and len(shape) != 4:
        layout = None
    t = make(shape, F16, "cuda", layout=layout, residual=shape[:2] + (1,) * (len(shape) - 2))
    check(t, groups, "silu", TOL[F16])


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_module_matches_torch_gpu(dtype):
    ours = GroupNormAct(32, 640, eps=1e-6, activation="silu", device="cuda", dtype=dtype)
    theirs = torch.nn.GroupNorm(32, 640, eps=1e-6, device="cuda", dtype=dtype)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.3)
        theirs.bias.normal_(0.0, 0.3)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 640, 64, 64, device="cuda", dtype=dtype).to(memory_format=CL)
    xa, xb = leaf(x), leaf(x)
    ya, yb = ours(xa), F.silu(theirs(xb))
    # torch rounds GN's output before the SiLU: two roundings against our one.
    assert rel_err(ya, yb) < 2 * TOL[dtype]
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    for a, b in ((xa.grad, xb.grad), (ours.weight.grad, theirs.weight.grad), (ours.bias.grad, theirs.bias.grad)):
        assert rel_err(a, b) < 2 * TOL[dtype]


@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_compile_inductor_gpu(layout, dtype):
    """torch.compile(fullgraph=True) (inductor) around the op equals eager, forward and every gradient: the
    op is one opaque node, the glue (a multiply by 2) is exact."""
    t = make((8, 320, 64, 64), dtype, "cuda", layout=layout, residual=(8, 320, 1, 1))

    def block(x, weight, bias, residual):
        return group_norm(x, 32, weight, bias, 1e-6, "silu", residual) * 2

    compiled = torch.compile(block, fullgraph=True)
    eager_in = {k: leaf(v) for k, v in t.items()}
    comp_in = {k: leaf(v) for k, v in t.items()}
    outs = []
    for fn, inputs in ((block, eager_in), (compiled, comp_in)):
        y = fn(**inputs)
        y.float().pow(2).sum().backward()
        outs.append(y)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    for k in t:
        torch.testing.assert_close(comp_in[k].grad, eager_in[k].grad)


@pytest.mark.parametrize("wave_bytes", [24 << 20, 0], ids=["waves", "one-wave"])
@pytest.mark.parametrize("shape", SD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
def test_chunked_sd_shapes_gpu(monkeypatch, wave_bytes, shape, layout):
    """CHUNKED mode (forced for NCHW too) at SD sizes, bf16: several waves of samples for the 84 MB tensors
    (24 MB waves) and one wave; silu(GN(x + temb)) and every gradient against float64."""
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    monkeypatch.setattr(gn_ops, "CHUNKED_NCHW", True)
    monkeypatch.setattr(gn_ops, "CHUNKED_NCHW_MIN_GROUP", 0)
    monkeypatch.setattr(gn_ops, "CHUNKED_CHANNELS_LAST", True)
    monkeypatch.setattr(gn_ops, "CL_PER_GROUP_MAX_BYTES", 0)
    monkeypatch.setattr(gn_ops, "WAVE_BYTES", wave_bytes)
    n, c = shape[:2]
    hw = shape[2] * shape[3]
    assert gn_ops._use_chunked(32, c // 32, hw, layout is CL, gn_ops.ONE_TILE_FWD, n * c * hw * 2)
    t = make(shape, BF16, "cuda", layout=layout, residual=shape[:2] + (1, 1), shift=3.0)
    check(t, 32, "silu", TOL[BF16], eps=1e-6)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
def test_chunked_stages_and_full_residual_gpu(monkeypatch, stages, layout):
    """The tune knob CHUNK_STAGES (software-pipelined tile loops) and a full residual, fp16, mish."""
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    monkeypatch.setattr(gn_ops, "CHUNKED_NCHW", True)
    monkeypatch.setattr(gn_ops, "CHUNKED_NCHW_MIN_GROUP", 0)
    monkeypatch.setattr(gn_ops, "CHUNK_STAGES", stages)
    t = make((4, 640, 64, 64), F16, "cuda", layout=layout, residual="full", shift=3.0)
    check(t, 32, "mish", TOL[F16])


def test_chunked_cuda_graph_gpu(monkeypatch):
    """The waves' launches replay in a CUDA graph (the tune script and the bench time them that way)."""
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    monkeypatch.setattr(gn_ops, "CHUNKED_NCHW", True)
    monkeypatch.setattr(gn_ops, "CHUNKED_NCHW_MIN_GROUP", 0)
    x = torch.randn(8, 320, 128, 128, device="cuda", dtype=BF16).to(memory_format=CL)
    w, b = torch.randn(320, device="cuda"), torch.randn(320, device="cuda")
    y_ref = group_norm(x, 32, w, b, 1e-5, "silu")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = group_norm(x, 32, w, b, 1e-5, "silu")
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y_ref)


# The Gluon forward (group_norm_details/_hopper_fwd.py): (shape, groups, dtype, weight, bias, residual, activation).
# Whole groups (K = 1) of 10 and 20 ring tiles, several groups per program (16 x 32 groups on 132 SMs), groups that
# overflow the ring split over K programs that meet ((8, 320, 128, 128): 4 rounds of 20-tile chunks; K = 2 chunks of
# 270 rows, 9 per channel: padding rows, not a power of 2; fp32 with K = 4), a group of 3 rows, 90 rows (9 per
# channel), a residual broadcast over the samples (C, 1, 1), no affine, fp32 (128-column rows); MIN_FILL off and
# ONE_ROUND_MEETINGS on so that the small cases take it too; "ring-sized": a 28-tile chunk (the whole ring) whose last
# tile is padded.
HOPPER_CASES = [
    pytest.param((2, 320, 64, 64), 32, BF16, True, True, (2, 320, 1, 1), "silu", id="sd-64"),
    pytest.param((16, 1280, 32, 32), 32, F16, True, True, (16, 1280, 1, 1), "silu", id="sd-32-many-groups"),
    pytest.param((16, 640, 64, 64), 32, BF16, True, True, (16, 640, 1, 1), "silu", id="sd-64-640"),
    pytest.param((8, 320, 128, 128), 32, BF16, True, True, (8, 320, 1, 1), "silu", id="sd-128-k2-rounds"),
    pytest.param((2, 120, 48, 48), 2, F16, True, True, (2, 120, 1, 1), "silu", id="k2-pad-9-rows-per-channel"),
    pytest.param((2, 58, 60, 64), 2, F16, True, True, (2, 58, 1, 1), "silu", id="ring-sized-chunk-last-tile-held"),
    pytest.param((1, 64, 64, 64), 2, torch.float32, False, False, None, "silu", id="fp32-noaffine-k4"),
    pytest.param((3, 96, 16, 16), 32, F16, True, False, None, None, id="pad-3-rows"),
    pytest.param((1, 30, 48, 48), 3, BF16, False, True, (30, 1, 1), "silu", id="pad-90-rows-9-per-channel"),
    pytest.param((2, 64, 32, 32), 8, torch.float32, False, False, None, "silu", id="fp32-noaffine"),
]


@pytest.mark.parametrize("shape, groups, dtype, weight, bias, residual, activation", HOPPER_CASES)
def test_hopper_forward_gpu(monkeypatch, shape, groups, dtype, weight, bias, residual, activation):
    """The Gluon forward where it is available (sm_90, triton 3.6; elsewhere the Triton plans, counted as such):
    output and every gradient against float64 (the backward starts from its mean / rstd), with a shifted mean (the
    exact two-pass variance), and equal to the Triton forward within one rounding."""
    monkeypatch.setattr(_hopper_fwd, "MIN_FILL", 0.0)      # small cases too
    monkeypatch.setattr(_hopper_fwd, "ONE_ROUND_MEETINGS", True)
    calls = []
    forward = _hopper_fwd.forward
    monkeypatch.setattr(_hopper_fwd, "forward", lambda *a: calls.append(1) or forward(*a))
    t = make(shape, dtype, "cuda", weight=weight, bias=bias, residual=residual, shift=3.0)
    y = check(t, groups, activation, TOL.get(dtype, 1e-5), eps=1e-6)
    assert len(calls) == (1 if _hopper_fwd.available(torch.device("cuda")) else 0)
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    y_triton = group_norm(t["x"], groups, t["weight"], t["bias"], 1e-6, activation, t["residual"])
    assert rel_err(y, y_triton) < TOL.get(dtype, 1e-5)


def test_hopper_forward_stats_and_graph_gpu(monkeypatch):
    """mean / rstd of the Gluon forward equal the Triton plan's (fp32, the same sums in another order), and its
    launch replays in a CUDA graph."""
    x = torch.randn(16, 640, 64, 64, device="cuda", dtype=BF16) + 2.0
    w, b = torch.randn(640, device="cuda"), torch.randn(640, device="cuda")
    temb = torch.randn(16, 640, 1, 1, device="cuda", dtype=BF16)
    y, mean, rstd = gn_ops.group_norm_forward(x, 32, w, b, 1e-6, "silu", temb)
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    y_ref, mean_ref, rstd_ref = gn_ops.group_norm_forward(x, 32, w, b, 1e-6, "silu", temb)
    torch.testing.assert_close(mean, mean_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd, rstd_ref, rtol=1e-5, atol=0)
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y_graph, _, _ = gn_ops.group_norm_forward(x, 32, w, b, 1e-6, "silu", temb)
    y_graph.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_graph, y)


# The channels_last Gluon forward (group_norm_details/_hopper_fwd_cl.py): (shape, groups, dtype, weight, bias,
# residual, activation), each a plan that fills the SMs (MIN_FILL). Chunks of 1-2 pixel tiles, 1-8 rounds (both
# compute partitions), a partial last chunk ((8, 320, 61, 64): 61 pixel tiles in chunks of 2), pixel counts not a
# multiple of the tile (HAS_PAD), groups across the 64-channel blocks (cpg 20, 40), 1 channel block, fp32
# (32-channel blocks), a residual broadcast over the samples, no affine, one-channel groups. C = 1280 in 16 bits is
# not taken (two chunks of all channels overflow the ring), nor are shapes that leave SMs idle.
HOPPER_CL_CASES = [
    pytest.param((2, 320, 64, 64), 32, BF16, True, True, (2, 320, 1, 1), "silu", id="sd-64"),
    pytest.param((16, 640, 64, 64), 32, BF16, True, True, (16, 640, 1, 1), "silu", id="sd-64-640-rounds"),
    pytest.param((4, 640, 61, 64), 16, F16, True, True, None, "silu", id="cpg40"),
    pytest.param((8, 320, 128, 128), 32, BF16, True, True, (8, 320, 1, 1), "silu", id="sd-128"),
    pytest.param((8, 320, 61, 64), 16, BF16, True, True, None, None, id="partial-last-chunk"),
    pytest.param((8, 128, 44, 47), 8, BF16, False, False, None, "silu", id="pad-2068-pixels"),
    pytest.param((8, 64, 44, 47), 4, torch.float32, True, False, (64, 1, 1), "silu", id="fp32-pad"),
    pytest.param((5, 64, 39, 39), 64, F16, True, True, None, None, id="one-channel-groups"),
]


@pytest.mark.parametrize("shape, groups, dtype, weight, bias, residual, activation", HOPPER_CL_CASES)
def test_hopper_forward_channels_last_gpu(monkeypatch, shape, groups, dtype, weight, bias, residual, activation):
    """The channels_last Gluon forward where it is available (elsewhere the Triton plans, counted as such): output
    and every gradient against float64, a shifted mean, and equal to the Triton forward within one rounding."""
    calls = []
    forward = _hopper_fwd_cl.forward
    monkeypatch.setattr(_hopper_fwd_cl, "forward", lambda *a: calls.append(1) or forward(*a))
    t = make(shape, dtype, "cuda", layout=CL, weight=weight, bias=bias, residual=residual, shift=3.0)
    y = check(t, groups, activation, TOL.get(dtype, 1e-5), eps=1e-6)
    assert len(calls) == (1 if _hopper_fwd_cl.available(torch.device("cuda")) else 0)
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    y_triton = group_norm(t["x"], groups, t["weight"], t["bias"], 1e-6, activation, t["residual"])
    assert rel_err(y, y_triton) < TOL.get(dtype, 1e-5)


def test_hopper_forward_channels_last_stats_and_graph_gpu(monkeypatch):
    """mean / rstd of the channels_last Gluon forward equal the Triton plan's, and its launch (the zeroed meeting
    counters included) replays in a CUDA graph, twice."""
    x = (torch.randn(16, 640, 64, 64, device="cuda", dtype=BF16) + 2.0).to(memory_format=CL)
    w, b = torch.randn(640, device="cuda"), torch.randn(640, device="cuda")
    temb = torch.randn(16, 640, 1, 1, device="cuda", dtype=BF16)
    y, mean, rstd = gn_ops.group_norm_forward(x, 32, w, b, 1e-6, "silu", temb)
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    y_ref, mean_ref, rstd_ref = gn_ops.group_norm_forward(x, 32, w, b, 1e-6, "silu", temb)
    torch.testing.assert_close(mean, mean_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd, rstd_ref, rtol=1e-5, atol=0)
    assert rel_err(y, y_ref) < TOL[BF16]
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y_graph, _, _ = gn_ops.group_norm_forward(x, 32, w, b, 1e-6, "silu", temb)
    for _ in range(2):
        y_graph.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_graph, y)


# (shape, groups, dtype, time embedding, layout, the Gluon forward that takes it): several rounds each
REPEAT_CASES = [
    pytest.param((16, 640, 64, 64), 32, BF16, True, CL, _hopper_fwd_cl, id="cl-temb"),
    pytest.param((8, 320, 128, 128), 32, BF16, False, CL, _hopper_fwd_cl, id="cl-long-chunks"),
    pytest.param((4, 640, 61, 64), 16, F16, False, CL, _hopper_fwd_cl, id="cl-cpg40"),
    pytest.param((16, 640, 64, 64), 32, BF16, True, torch.contiguous_format, _hopper_fwd, id="nchw-temb"),
    pytest.param((16, 1280, 32, 32), 32, F16, False, torch.contiguous_format, _hopper_fwd, id="nchw-cpg40"),
    pytest.param((8, 320, 128, 128), 32, BF16, True, torch.contiguous_format, _hopper_fwd, id="nchw-split-groups"),
    pytest.param((2, 1280, 64, 64), 32, BF16, True, torch.contiguous_format, _hopper_fwd, id="nchw-k4-two-rounds"),
]


@pytest.mark.parametrize("shape, groups, dtype, temb, layout, kernel", REPEAT_CASES)
def test_hopper_forward_repeats_gpu(monkeypatch, shape, groups, dtype, temb, layout, kernel):
    """Over several rounds (with and without a time embedding) the Gluon forwards give the same bits run after run
    and the Triton plan's output (session 21: without a proxy fence between the compute warps' reads of a ring slot
    and the loader's next TMA write to it, a few outputs of later rounds came out wrong now and then)."""
    calls = []
    forward = kernel.forward
    monkeypatch.setattr(kernel, "forward", lambda *a: calls.append(1) or forward(*a))
    x = (torch.randn(shape, device="cuda", dtype=dtype) * 2 + 1).to(memory_format=layout)
    w, b = torch.randn(shape[1], device="cuda"), torch.randn(shape[1], device="cuda")
    r = torch.randn(shape[0], shape[1], 1, 1, device="cuda", dtype=dtype) * 3 if temb else None
    y = gn_ops.group_norm_forward(x, groups, w, b, 1e-6, "silu", r)[0]
    for _ in range(8):
        assert torch.equal(gn_ops.group_norm_forward(x, groups, w, b, 1e-6, "silu", r)[0], y)
    assert len(calls) == (9 if kernel.available(torch.device("cuda")) else 0)
    monkeypatch.setattr(gn_ops, "HOPPER_FWD", False)
    assert rel_err(y, gn_ops.group_norm_forward(x, groups, w, b, 1e-6, "silu", r)[0]) < TOL[dtype]


# The NCHW Gluon backward (group_norm_details/_hopper_bwd.py): (shape, groups, dtype, weight, bias, residual,
# activation). Groups split into K = 2, 4, 5, 10 chunks that meet (SD's levels: one round, 8 rounds, 10 rounds of
# 8-tile chunks), K = 1 (no meeting) over 4 rounds and with 3-row chunks, 9 rows per channel in 16-row tiles (padding
# rows in every chunk, K = 10), fp32 (128-column rows), no affine, a residual broadcast over the samples; MIN_FILL
# off so that the small cases take it too.
HOPPER_BWD_CASES = [
    pytest.param((2, 320, 64, 64), 32, BF16, True, True, (2, 320, 1, 1), "silu", id="sd-64-k2"),
    pytest.param((16, 1280, 32, 32), 32, F16, True, True, (16, 1280, 1, 1), "silu", id="sd-32-k1-rounds"),
    pytest.param((16, 640, 64, 64), 32, BF16, True, True, None, "silu", id="sd-64-640-k2-rounds"),
    pytest.param((8, 320, 128, 128), 32, BF16, True, True, (8, 320, 1, 1), "silu", id="sd-128-k5"),
    pytest.param((3, 96, 16, 16), 32, F16, True, False, None, None, id="k1-pad-3-rows"),
    pytest.param((1, 30, 48, 48), 3, BF16, False, True, (30, 1, 1), "silu", id="k10-pad-9-rows-per-channel"),
    pytest.param((2, 64, 32, 32), 8, torch.float32, False, False, None, "silu", id="fp32-noaffine-k4"),
]


@pytest.mark.parametrize("shape, groups, dtype, weight, bias, residual, activation", HOPPER_BWD_CASES)
def test_hopper_backward_gpu(monkeypatch, shape, groups, dtype, weight, bias, residual, activation):
    """The Gluon backward where it is available (sm_90, triton 3.6; elsewhere the Triton plans, counted as such): every
    gradient against float64 with a shifted mean, and dx equal to the Triton plans' within one rounding."""
    monkeypatch.setattr(_hopper_bwd, "MIN_FILL", 0.0)
    calls = []
    backward = _hopper_bwd.backward
    monkeypatch.setattr(_hopper_bwd, "backward", lambda *a: calls.append(1) or backward(*a))
    t = make(shape, dtype, "cuda", weight=weight, bias=bias, residual=residual, shift=3.0)
    check(t, groups, activation, TOL.get(dtype, 1e-5), eps=1e-6)
    assert len(calls) == (1 if _hopper_bwd.available(torch.device("cuda")) else 0)
    x, w, b, r = t["x"], t["weight"], t["bias"], t["residual"]
    y, mean, rstd = gn_ops.group_norm_forward(x, groups, w, b, 1e-6, activation or "none", r)
    dy = torch.randn_like(y)
    grads = gn_ops.group_norm_backward(dy, x, groups, w, b, mean, rstd, activation or "none", r)
    monkeypatch.setattr(gn_ops, "HOPPER_BWD", False)
    grads_triton = gn_ops.group_norm_backward(dy, x, groups, w, b, mean, rstd, activation or "none", r)
    for ours, theirs in zip(grads, grads_triton):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            assert rel_err(ours, theirs) < TOL.get(dtype, 1e-5)


@pytest.mark.parametrize("layout", [torch.contiguous_format, CL], ids=["nchw", "cl"])
def test_hopper_backward_repeats_and_graph_gpu(layout):
    """Over several rounds of meetings the backward (NCHW: Gluon, its chunks' sums added in chunk order and dw / db /
    dresidual by torch; channels_last: the Triton plans) gives the same bits run after run, and its launch (the zeroed
    meeting counters included) replays in a CUDA graph."""
    x = (torch.randn(16, 640, 64, 64, device="cuda", dtype=BF16) * 2 + 1).to(memory_format=layout)
    w, b = torch.randn(640, device="cuda"), torch.randn(640, device="cuda")
    temb = torch.randn(16, 640, 1, 1, device="cuda", dtype=BF16)
    y, mean, rstd = gn_ops.group_norm_forward(x, 32, w, b, 1e-6, "silu", temb)
    dy = torch.randn_like(y)
    assert dy.is_contiguous(memory_format=layout)
    grads = gn_ops.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", temb)
    for _ in range(8):
        again = gn_ops.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", temb)
        assert all(torch.equal(a, g) for a, g in zip(again, grads))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed = gn_ops.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", temb)
    for _ in range(2):
        for t in graphed:
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, g) for a, g in zip(graphed, grads))


# The channels_last backward (the Triton plans): (shape, groups, dtype, weight, bias, residual, activation). SD shapes
# with the time embedding, pixel counts not a multiple of 64, groups across 64-channel blocks (cpg 10, 20, 40), fp32,
# a residual broadcast over the samples, no affine, one-channel groups, many samples.
BACKWARD_CL_CASES = [
    pytest.param((2, 320, 64, 64), 32, BF16, True, True, (2, 320, 1, 1), "silu", id="sd-64"),
    pytest.param((16, 640, 64, 64), 32, BF16, True, True, (16, 640, 1, 1), "silu", id="sd-64-640"),
    pytest.param((8, 320, 128, 128), 32, BF16, True, True, (8, 320, 1, 1), "silu", id="sd-128"),
    pytest.param((4, 640, 61, 64), 16, F16, True, True, None, "silu", id="cpg40"),
    pytest.param((8, 320, 61, 64), 32, BF16, True, False, (8, 320, 1, 1), None, id="no-act"),
    pytest.param((8, 128, 44, 47), 8, BF16, False, False, None, "silu", id="pad-2068-pixels"),
    pytest.param((8, 64, 44, 47), 4, torch.float32, True, False, (64, 1, 1), "silu", id="fp32-pad"),
    pytest.param((5, 64, 39, 39), 64, F16, True, True, None, None, id="one-channel-groups"),
    pytest.param((200, 64, 8, 8), 8, F16, True, True, (200, 64, 1, 1), "silu", id="many-samples"),
]


def _backward_cl(t, groups, activation, dy, fn=group_norm):
    """(y, (dx, dw, db, dresidual)) of fn (group_norm or the reference) through autograd with the cotangent dy."""
    leaves = {k: leaf(v) for k, v in t.items()}
    y = fn(leaves["x"], groups, leaves["weight"], leaves["bias"], 1e-6, activation, leaves["residual"])
    y.backward(dy)
    return y, tuple(None if leaves[k] is None else leaves[k].grad for k in ("x", "weight", "bias", "residual"))


@pytest.mark.parametrize("shape, groups, dtype, weight, bias, residual, activation", BACKWARD_CL_CASES)
def test_backward_channels_last_gpu(shape, groups, dtype, weight, bias, residual, activation):
    """The channels_last backward with a channels_last cotangent (as a channels_last network passes it): every gradient
    against float64 with a shifted mean, dx in x's layout."""
    t = make(shape, dtype, "cuda", layout=CL, weight=weight, bias=bias, residual=residual, shift=3.0)
    dy = torch.randn(shape, device="cuda").to(dtype).to(memory_format=CL)
    y, grads = _backward_cl(t, groups, activation, dy)
    _, grads_ref = _backward_cl({k: None if v is None else v.double() for k, v in t.items()}, groups, activation,
                                dy.double(), group_norm_ref)
    tol = TOL.get(dtype, 1e-5)
    assert grads[0].stride() == t["x"].stride(), "dx must keep x's layout"
    for name, ours, ref in zip(("dx", "dw", "db", "dresidual"), grads, grads_ref):
        assert (ours is None) == (ref is None), name
        if ours is not None:
            assert torch.isfinite(ours).all(), f"non-finite {name}"
            assert rel_err(ours, ref) < tol, f"{name} rel err {rel_err(ours, ref):.2e}"

