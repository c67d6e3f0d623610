"""group_norm, CPU tier: outputs and every gradient against the float64 reference (Triton's interpreter on CPU
tensors; the GPU tier is test_group_norm_gpu.py) in NCHW, channels_last and (N, C, L), every activation,
full and broadcast residuals, the three launch modes (one tile, loop, split), torch's GroupNorm, the nn
module, torch.compile, and error messages.

Every buffer the kernels write starts as NaN (fixture ``poison``), so an element a kernel forgets to
write fails the comparison; NaN never passes (rel_err of a NaN is NaN, and NaN < tol is False).
"""

import pytest
import torch
import torch.nn.functional as F

import flashfuse.ops.group_norm as gn_ops
from flashfuse.nn.group_norm import GroupNormAct
from flashfuse.ops.group_norm import group_norm
from flashfuse.reference.group_norm import group_norm_ref
from testing import rel_err  # noqa: E402

F32, F16 = torch.float32, torch.float16
# Relative error ||out - ref|| / ||ref|| against float64: fp32 kernels measure ~1e-7; fp16 rounds the
# residual sum and each output once, ~3e-4.
TOL = {F32: 1e-5, F16: 2e-3}
CL = torch.channels_last


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    def alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(gn_ops, "_alloc", alloc)
    monkeypatch.setattr(gn_ops, "_alloc_like", lambda t: torch.full_like(t, float("nan")))


def leaf(t, dtype=None):
    return None if t is None else t.detach().to(dtype or t.dtype).requires_grad_()


def make(shape, dtype, device, *, layout=None, weight=True, bias=True, residual=None, shift=0.0):
    """x (+ weight, bias, residual). residual: None, "full" or a shape to broadcast (e.g. (N, C, 1, 1))."""
    c = shape[1]
    x = (torch.randn(shape, device=device) * 2 + shift).to(dtype)
    t = {"x": x if layout is None else x.to(memory_format=layout)}
    t["weight"] = (1 + 0.5 * torch.randn(c, device=device)).to(dtype) if weight else None
    t["bias"] = (0.5 * torch.randn(c, device=device)).to(dtype) if bias else None
    if residual == "full":
        r = torch.randn(shape, device=device).to(dtype)
        t["residual"] = r if layout is None else r.to(memory_format=layout)
    elif residual is not None:
        t["residual"] = torch.randn(residual, device=device).to(dtype)
    else:
        t["residual"] = None
    return t


def check(tensors, num_groups, activation, tol, eps=1e-5):
    """group_norm vs the float64 reference on the same tensors: output, its layout, and the gradient of
    every input (the same random cotangent through both)."""
    ours = {k: leaf(v) for k, v in tensors.items()}
    refs = {k: leaf(v, torch.float64) for k, v in tensors.items()}
    y = group_norm(ours["x"], num_groups, ours["weight"], ours["bias"], eps, activation, ours["residual"])
    ref = group_norm_ref(refs["x"], num_groups, refs["weight"], refs["bias"], eps, activation, refs["residual"])
    x = tensors["x"]
    assert y.shape == x.shape and y.dtype == x.dtype
    assert y.stride() == x.stride(), "the output must keep x's layout (no copy)"
    assert torch.isfinite(y).all(), "non-finite output"
    err = rel_err(y, ref)
    assert err < tol, f"output rel err {err:.2e} >= {tol:.0e}"
    cot = torch.randn(x.shape, dtype=torch.float64, device=x.device)
    (y.double() * cot).sum().backward()
    (ref * cot).sum().backward()
    for name, t in ours.items():
        if t is None:
            continue
        assert t.grad is not None, f"no gradient for {name}"
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
        assert torch.isfinite(t.grad).all(), f"non-finite d{name}"
        err = rel_err(t.grad, refs[name].grad)
        assert err < tol, f"d{name} rel err {err:.2e} >= {tol:.0e}"
    assert ours["x"].grad.stride() == x.stride(), "dx must keep x's layout"
    return y


# (shape, dtype, layout, activation, weight, bias, residual)
CASES = [
    pytest.param((2, 12, 5, 7), F32, None, "silu", True, True, (2, 12, 1, 1), id="nchw-silu-temb"),
    pytest.param((2, 12, 5, 7), F32, CL, "silu", True, True, (2, 12, 1, 1), id="cl-silu-temb"),
    pytest.param((2, 12, 5, 7), F32, CL, "mish", True, True, "full", id="cl-mish-full"),
    pytest.param((2, 12, 5, 7), F32, None, "gelu", False, False, "full", id="nchw-gelu-full-noaffine"),
    pytest.param((3, 12, 11), F32, None, "mish", True, False, (3, 12, 1), id="ncl-mish-temb"),
    pytest.param((3, 12, 11), F32, None, None, False, True, None, id="ncl-none-bias"),
    pytest.param((2, 12, 5, 7), F32, None, None, True, False, (12, 1, 1), id="nchw-none-channel-residual"),
    pytest.param((2, 12, 5, 7), F32, CL, "gelu", True, True, (1, 1, 5, 7), id="cl-gelu-spatial-residual"),
    pytest.param((2, 12, 5, 7), F16, None, "silu", True, True, (2, 12, 1, 1), id="nchw-silu-temb-fp16"),
    pytest.param((2, 12, 5, 7), F16, CL, "silu", True, True, "full", id="cl-silu-full-fp16"),
]


@pytest.mark.parametrize("shape, dtype, layout, activation, weight, bias, residual", CASES)
def test_group_norm(device, shape, dtype, layout, activation, weight, bias, residual):
    t = make(shape, dtype, device, layout=layout, weight=weight, bias=bias, residual=residual)
    y = check(t, 3, activation, TOL[dtype])
    if layout is CL:
        assert y.is_contiguous(memory_format=CL)


@pytest.mark.parametrize("order", [(True, ""), (False, "evict_first")], ids=["reverse", "forward-evict"])
@pytest.mark.parametrize("mode", ["loop", "split"])
@pytest.mark.parametrize("layout", [None, CL], ids=["nchw", "cl"])
def test_launch_modes(device, monkeypatch, mode, layout, order):
    """Small caps force the looped (two passes in one program) and the split (stats kernel + partials)
    paths, with partial last tiles and chunks (5 x 7 = 35 pixels: tiles of 4 x 4, chunks of 12, 12 and 11 pixels),
    the second pass walking its tiles backwards (the default) or forwards with an eviction policy."""
    monkeypatch.setattr(gn_ops, "REVERSE_SECOND_PASS", order[0])
    monkeypatch.setattr(gn_ops, "SECOND_PASS_EVICT", order[1])
    monkeypatch.setattr(gn_ops, "CHUNKED_CHANNELS_LAST", False)   # the legacy per-group programs
    monkeypatch.setattr(gn_ops, "ONE_TILE_FWD", 16)
    monkeypatch.setattr(gn_ops, "ONE_TILE_BWD", 16)
    monkeypatch.setattr(gn_ops, "LOOP_TILE", 16)
    if mode == "split":
        monkeypatch.setattr(gn_ops, "INTERPRETER_SMS", 4)
        monkeypatch.setattr(gn_ops, "MIN_CHUNK_ELEMENTS", 16)
    x = torch.randn(2, 12, 5, 7, device=device)
    cl = layout is CL
    plan = gn_ops._plan(2, 3, 4, 35, cl, 16, gn_ops.FWD_ELEMENTS_PER_WARP, x.device)
    assert plan.mode == (gn_ops.MODE_SPLIT if mode == "split" else gn_ops.MODE_LOOP)
    assert plan.n_chunks == (3 if mode == "split" else 1) and plan.block_hw == 4
    # A mean far from 0 checks that the variance is not E[s^2] - mean^2.
    t = make((2, 12, 5, 7), F32, device, layout=layout, residual=(2, 12, 1, 1) if cl else "full", shift=300.0)
    check(t, 3, "silu", TOL[F32])


@pytest.mark.parametrize("mode", ["loop", "split"])
def test_nchw_padded_channel_block(device, monkeypatch, mode):
    """NCHW groups of 30 channels split over programs run in blocks of 32 (two padding channels masked), not the
    dividing block of 2 (which the looped plan keeps); the rule: 90 channels as three blocks of 32."""
    monkeypatch.setattr(gn_ops, "ONE_TILE_FWD", 16)
    monkeypatch.setattr(gn_ops, "ONE_TILE_BWD", 16)
    if mode == "split":
        monkeypatch.setattr(gn_ops, "INTERPRETER_SMS", 4)
        monkeypatch.setattr(gn_ops, "MIN_CHUNK_ELEMENTS", 16)
    assert [gn_ops._nchw_channel_block(c) for c in (30, 60, 90, 20, 15, 64)] == [32, 32, 32, 4, 16, 64]
    plan = gn_ops._plan(2, 2, 30, 35, False, 16, gn_ops.FWD_ELEMENTS_PER_WARP, torch.device(device))
    assert plan.block_c == (32 if mode == "split" else 2)
    assert plan.mode == (gn_ops.MODE_SPLIT if mode == "split" else gn_ops.MODE_LOOP)
    t = make((2, 60, 5, 7), F32, device, residual=(2, 60, 1, 1), shift=300.0)
    check(t, 2, "silu", TOL[F32])


# (layout, shape, groups, activation, weight, residual, tile, SMs, wave samples, dtype): tiny tiles, many
# "SMs" and small waves force several pixel chunks (a ragged last chunk and last tile), channel blocks that
# straddle groups (NCHW: 2 channels of groups of 3) or masked channels (channels_last: 16 of 12), and waves.
CHUNKED_CASES = [
    pytest.param(None, (2, 12, 5, 7), 4, "silu", True, (2, 12, 1, 1), 128, 16, 0, F32, id="nchw-silu-temb"),
    pytest.param(CL, (2, 12, 5, 7), 3, "silu", True, (2, 12, 1, 1), 32, 4, 0, F32, id="cl-silu-temb"),
    pytest.param(None, (2, 12, 5, 7), 3, "mish", True, "full", 32, 16, 1, F32, id="nchw-mish-full-waves"),
    pytest.param(CL, (3, 12, 5, 7), 3, "mish", True, "full", 32, 4, 2, F32, id="cl-mish-full-waves"),
    pytest.param(None, (3, 12, 11), 3, "gelu", False, (3, 12, 1), 8, 8, 2, F32, id="ncl-gelu-noaffine"),
    pytest.param(CL, (2, 12, 5, 7), 4, "gelu", True, (1, 1, 5, 7), 32, 4, 1, F32, id="cl-gelu-spatial-res"),
    pytest.param(CL, (2, 12, 5, 7), 3, None, True, None, 32, 4, 0, F32, id="cl-none-nores"),
    pytest.param(None, (2, 12, 5, 7), 3, None, False, (12, 1, 1), 16, 8, 0, F32, id="nchw-none-channel-res"),
    pytest.param(CL, (2, 12, 5, 7), 3, "silu", True, "full", 32, 4, 1, F16, id="cl-silu-full-fp16"),
    pytest.param(None, (2, 12, 5, 7), 3, "silu", True, (2, 12, 1, 1), 32, 8, 1, F16, id="nchw-silu-temb-fp16"),
]


@pytest.mark.parametrize("order", [(True, ""), (False, "evict_first")], ids=["reverse", "forward-evict"])
@pytest.mark.parametrize("layout, shape, groups, activation, weight, residual, tile, sms, wave, dtype",
                         CHUNKED_CASES)
def test_chunked_mode(device, monkeypatch, layout, shape, groups, activation, weight, residual, tile, sms, wave,
                      dtype, order):
    """CHUNKED (per-channel partials over pixel chunks, per-group finalize, waves of samples): output and
    every gradient, a mean far from 0 (no E[s^2] - mean^2). NCHW is forced in with a tiny one-tile cap. Kernel 3
    walks its tiles backwards (the default) or forwards with an eviction policy."""
    monkeypatch.setattr(gn_ops, "REVERSE_SECOND_PASS", order[0])
    monkeypatch.setattr(gn_ops, "SECOND_PASS_EVICT", order[1])
    x = torch.empty(shape, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    inputs = 3 if residual == "full" else 2                 # the backward's wave counts x, dy (and residual)
    for name, value in (("CHUNKED_NCHW", True), ("CHUNKED_NCHW_MIN_GROUP", 0),
                        ("CHUNKED_CHANNELS_LAST", True), ("CL_PER_GROUP_MAX_BYTES", 0),
                        ("ONE_TILE_FWD", 16), ("ONE_TILE_BWD", 16), ("CHUNK_TILE", tile),
                        ("INTERPRETER_SMS", sms), ("WAVE_BYTES", wave * x[0].numel() * itemsize * inputs)):
        monkeypatch.setattr(gn_ops, name, value)
    cl = layout is CL
    hw = x[0, 0].numel()
    assert gn_ops._use_chunked(groups, shape[1] // groups, hw, cl, 16, x.numel() * itemsize)
    cpg = shape[1] // groups
    for backward in (False, True):      # the backward plans with its own programs per SM
        plan = gn_ops.chunk_plan(shape[0], shape[1], hw, cl, x[0].numel() * itemsize * inputs,
                                 gn_ops._chunk_config(x.device, backward))
        assert plan.block_c * plan.block_hw <= tile and plan.chunk_hw % plan.block_hw == 0
        assert plan.n_chunks > 1 or plan.chunk_hw > plan.block_hw or cpg % plan.block_c, \
            "several chunks, several tiles per chunk, or channel blocks straddling groups"
        assert plan.wave == (wave or shape[0])
    t = make(shape, dtype, device, layout=layout, weight=weight, bias=weight, residual=residual,
             shift=300.0 if dtype is F32 else 3.0)
    check(t, groups, activation, TOL[dtype])


def test_channels_last_routing():
    """channels_last: small tensors (SD's batch-2 levels up to 32 x 32) take the one-launch per-group plan,
    larger ones CHUNKED; NCHW takes CHUNKED only for large groups."""
    for (n, c, hw), chunked in (((2, 640, 1024), False), ((2, 1280, 256), False), ((2, 320, 4096), True),
                                ((8, 320, 16384), True)):
        assert gn_ops._use_chunked(32, c // 32, hw, True, gn_ops.ONE_TILE_FWD, n * c * hw * 2) == chunked
        assert gn_ops._use_chunked(32, c // 32, hw, True, gn_ops.ONE_TILE_BWD, n * c * hw * 2) == chunked
    assert not gn_ops._use_chunked(32, 40, 1024, False, gn_ops.ONE_TILE_FWD, 16 * 1280 * 1024 * 2)
    assert gn_ops._use_chunked(32, 10, 16384, False, gn_ops.ONE_TILE_FWD, 8 * 320 * 16384 * 2)


def test_hopper_channels_last_plan():
    """The channels_last Gluon forward's plan on 132 SMs (pure Python, no GPU): chunks of whole pixel tiles that
    cover HW, at most half the ring each, a sample's programs all in one round, and at least MIN_FILL of the SMs'
    time on pixels; None where that fails (few programs, a partial last round) or C = 1280 in 16 bits."""
    from flashfuse.ops.group_norm_details import _hopper_fwd_cl as cl
    for (n, c, hw, size), planned in (((2, 320, 4096, 2), True), ((8, 320, 4096, 2), True), ((8, 320, 16384, 2), True),
                                      ((16, 640, 4096, 2), True), ((8, 64, 2068, 4), True), ((2, 640, 1024, 2), False),
                                      ((12, 640, 1600, 2), False), ((16, 1280, 1024, 2), False),
                                      ((2, 330, 4096, 2), False)):
        p = cl.plan(n, c, hw, size, 132)
        assert (p is not None) == planned, (n, c, hw, p)
        if p is not None:
            n_cb = c * size // cl.BOX_BYTES
            assert p.chunk_px % p.tile_p == 0 and p.chunk_px // p.tile_p * n_cb <= p.slots // cl.PARTS
            assert (p.n_chunks - 1) * p.chunk_px < hw <= p.n_chunks * p.chunk_px
            assert p.per_round * p.n_chunks <= 132
            rounds = -(-n // p.per_round)
            assert n * hw >= cl.MIN_FILL * rounds * p.chunk_px * 132


def test_hopper_forward_plan():
    """The NCHW Gluon forward's plan on 132 SMs: whole groups where they fit the ring (K = 1, one round or more), split
    over K programs where not ((8, 320, 128, 128): 40 tiles); a single round of chunks that meet is split further for
    two rounds ((2, 1280, 64, 64): K = 2 -> 4) or left to the Triton plans ((2, 320, 128, 128), no K <= MAX_SPLIT
    gives two); None where the SMs would idle ((2, 320, 64, 64): 64 groups) or HW is not a multiple of a 512-byte
    row. ONE_ROUND_MEETINGS keeps the single round."""
    from flashfuse.ops.group_norm_details import _hopper_fwd as fwd
    for (n, c, hw), k in (((2, 320, 4096), None), ((8, 320, 16384), 2), ((16, 640, 4096), 1), ((16, 1280, 1024), 1),
                          ((8, 320, 4096), 1), ((2, 640, 1024), None), ((4, 64, 1000), None), ((2, 640, 4096), None),
                          ((2, 320, 16384), None), ((2, 1280, 4096), 4), ((4, 320, 4096), 1), ((3, 640, 4096), None),
                          ((4, 320, 16384), 2)):
        p = fwd.plan(n, c, hw, 32, 2, 132)
        assert (p and p.n_chunks) == k, (n, c, hw, p)
        if p is not None:
            assert -(-p.chunk_rows // 16) <= fwd.SLOTS and p.per_round * k <= 132
            assert k == 1 or -(-n * 32 // p.per_round) >= 2          # chunks that meet: two rounds or more
    for n in (1, 2, 3, 4, 8, 16):      # every plan over a grid of shapes: meeting chunks run two rounds or more
        for c in (128, 320, 640, 960, 1280, 2560):
            for hw, size in ((1024, 2), (4096, 2), (9216, 2), (16384, 2), (4096, 4)):
                p = fwd.plan(n, c, hw, 32, size, 132)
                if p is not None:
                    rounds = -(-n * 32 // p.per_round)
                    assert p.n_chunks == 1 or rounds >= 2, (n, c, hw, size, p)
                    tiles = -(-p.chunk_rows // 16)
                    assert n * 32 * p.chunk_rows * p.n_chunks >= fwd.MIN_FILL * rounds * tiles * 16 * 132
    try:
        fwd.ONE_ROUND_MEETINGS = True
        assert fwd.plan(2, 320, 16384, 32, 2, 132).n_chunks == 2 and fwd.plan(2, 1280, 4096, 32, 2, 132).n_chunks == 2
    finally:
        fwd.ONE_ROUND_MEETINGS = False


def test_hopper_backward_plan():
    """The NCHW Gluon backward's plan on 132 SMs (pure Python, no GPU): K chunks of whole channels per group, at most
    MAX_CHUNK_TILES of x + dy tiles each, a group's programs all in one round, and at least MIN_FILL of the SMs' time on
    rows, K by the time model (two rounds of K = 4 over one of K = 2 at (2, 640, 64, 64); whole groups in 8 rounds,
    not 1-tile chunks in 79, at (32, 320, 64, 64)); None where HW is not a multiple of a 512-byte row or the SMs would
    idle."""
    from flashfuse.ops.group_norm_details import _hopper_bwd as bwd
    tile_rows = bwd.TILE_BYTES // bwd.ROW_BYTES
    for (n, c, hw, size), k in (((2, 320, 4096, 2), 2), ((8, 320, 16384, 2), 5), ((16, 640, 4096, 2), 2),
                                ((16, 1280, 1024, 2), 1), ((8, 320, 4096, 2), 1), ((2, 320, 4096, 4), 2),
                                ((2, 640, 1024, 2), None), ((16, 1280, 256, 2), None), ((4, 64, 1000, 2), None),
                                ((2, 640, 4096, 2), 4), ((32, 320, 4096, 2), 1), ((2, 320, 16384, 2), 10)):
        p = bwd.plan(n, c, hw, 32 if c > 64 else 8, size, 132)
        assert (p and p.n_chunks) == k, (n, c, hw, p)
        if p is not None:
            cpg, rows_per_channel = c // 32, hw * size // bwd.ROW_BYTES
            assert p.chunk_rows == cpg // k * rows_per_channel and -(-p.chunk_rows // tile_rows) <= bwd.MAX_CHUNK_TILES
            assert p.per_round * k <= 132
            rounds = -(-n * 32 // p.per_round)
            assert n * 32 * cpg * rows_per_channel >= bwd.MIN_FILL * rounds * -(-p.chunk_rows // tile_rows) * tile_rows * 132


def test_slot_barrier_offset():
    """The ring kernels' `empty` barriers located in PTX as triton 3.6 writes it (pure Python): the run of mbarriers
    initialised with the compute warps' count, whatever order the inits come in; anything else raises."""
    from flashfuse.ops.group_norm_details._hopper_fwd import slot_barrier_offset

    def ptx(inits):
        lines = ["\tmov.b32 \t%r640, global_smem;"]
        for i, (offset, count) in enumerate(inits):
            lines += [f"\tadd.s32 \t%r{700 + i}, %r640, {offset};",
                      f"\t@%p31 mbarrier.init.shared::cta.b64 [%r{700 + i}], {count};"]
        return "\n".join(lines)

    ready, empty = 229552, 229664
    inits = [(ready + 8 * i, 1) for i in range(14)] + [(empty + 8 * i, 8) for i in range(14)]
    assert slot_barrier_offset(ptx(inits[::-1]), 8, 14) == empty
    with pytest.raises(RuntimeError, match="14 mbarriers initialised with 8"):
        slot_barrier_offset(ptx(inits[:14]), 8, 14)                              # no barrier with 8 arrivals
    with pytest.raises(RuntimeError, match="14 mbarriers"):
        slot_barrier_offset(ptx(inits[:-1]), 8, 14)                              # one short
    with pytest.raises(RuntimeError, match="14 mbarriers"):
        slot_barrier_offset(ptx(inits[:14] + [(empty + 16 * i, 8) for i in range(14)]), 8, 14)   # not one run


def test_chunk_plan_at_real_sizes():
    """SD shapes on 132 SMs: >= 2 programs per SM in every wave, whole 128-byte channels_last rows, waves
    within WAVE_BYTES (or one sample; WAVE_BYTES = 0: one wave), chunks that cover HW exactly once, and with
    CHUNK_FIT_WAVE no more programs than one wave holds wherever the chunk count is free (> 1)."""
    for n, c, hw in ((2, 320, 4096), (8, 320, 16384), (16, 640, 4096), (16, 1280, 1024), (1, 30, 90601)):
        for cl in (False, True):
            for inputs in (1, 2):
                cfg = gn_ops.ChunkConfig(gn_ops.CHUNK_TILE, gn_ops.CHUNK_ELEMENTS_PER_WARP,
                                         gn_ops.CHUNK_PROGRAMS_PER_SM, gn_ops.WAVE_BYTES, 1, True, "", 132,
                                         gn_ops.CHUNK_FIT_WAVE)
                p = gn_ops.chunk_plan(n, c, hw, cl, c * hw * 2 * inputs, cfg)
                if gn_ops.CHUNK_FIT_WAVE and p.n_chunks > 1:
                    assert p.wave * p.n_chunks * p.n_cblocks <= gn_ops.CHUNK_PROGRAMS_PER_SM * 132, p
                assert p.block_c * p.block_hw <= gn_ops.CHUNK_TILE
                assert p.chunk_hw % p.block_hw == 0 and (p.n_chunks - 1) * p.chunk_hw < hw <= p.n_chunks * p.chunk_hw
                if gn_ops.WAVE_BYTES:
                    assert p.wave == 1 or p.wave * c * hw * 2 * inputs <= gn_ops.WAVE_BYTES
                else:
                    assert p.wave == n, p          # one wave: the whole tensor
                if c % 64 == 0:
                    assert p.block_c * p.block_hw == gn_ops.CHUNK_TILE and p.num_warps == 8
                    assert p.wave * p.n_chunks * p.n_cblocks >= 2 * 132
                    if cl:
                        assert p.block_c * 2 >= 128 and c % p.block_c == 0


def test_matches_torch_group_norm(device):
    """Equal to torch's GroupNorm followed by torch's activation (fp32; exact gelu)."""
    x = torch.randn(2, 12, 5, 7, device=device)
    w, b = torch.randn(12, device=device), torch.randn(12, device=device)
    temb = torch.randn(2, 12, 1, 1, device=device)
    base = F.group_norm(x + temb, 3, w, b, 1e-6)
    for activation, fn in (("silu", F.silu), ("mish", F.mish), ("gelu", F.gelu), (None, lambda t: t)):
        y = group_norm(x, 3, w, b, 1e-6, activation, temb)
        torch.testing.assert_close(y, fn(base), rtol=1e-5, atol=1e-5)
    xc = x.to(memory_format=CL)
    torch.testing.assert_close(group_norm(xc, 4, w, b), F.group_norm(x, 4, w, b), rtol=1e-5, atol=1e-5)


def test_module_matches_torch(device):
    """GroupNormAct loads torch.nn.GroupNorm's state dict and equals GroupNorm + SiLU, forward and backward."""
    ours = GroupNormAct(3, 12, eps=1e-6, activation="silu", device=device)
    theirs = torch.nn.GroupNorm(3, 12, eps=1e-6, device=device)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.3)
        theirs.bias.normal_(0.0, 0.3)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 12, 5, 7, device=device).to(memory_format=CL)
    temb = torch.randn(2, 12, 1, 1, device=device)
    xa, xb, ta, tb = leaf(x), leaf(x), leaf(temb), leaf(temb)
    ya, yb = ours(xa, residual=ta), F.silu(theirs(xb + tb))
    assert rel_err(ya, yb) < TOL[F32]
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    for a, b in ((xa.grad, xb.grad), (ta.grad, tb.grad), (ours.weight.grad, theirs.weight.grad),
                 (ours.bias.grad, theirs.bias.grad)):
        assert rel_err(a, b) < TOL[F32]
    plain = GroupNormAct(3, 12, affine=False, device=device)
    torch.testing.assert_close(plain(x), F.group_norm(x, 3), rtol=1e-5, atol=1e-5)
    assert "activation='silu'" in repr(ours)
    with pytest.raises(ValueError, match="activation is 'relu'; supported: None, 'silu', 'mish', 'gelu'"):
        GroupNormAct(3, 12, activation="relu")
    with pytest.raises(ValueError, match=r"x has 6 channels \(x.shape\[1\]\); this GroupNormAct expects 12"):
        ours(torch.randn(2, 6, 5, device=device))


def test_compile_fullgraph(device):
    """The custom ops trace as one node each (fake + autograd registrations), forward and backward."""
    t = make((2, 12, 5, 7), F32, device, layout=CL, residual=(2, 12, 1, 1))

    def block(x, weight, bias, residual):
        return group_norm(x, 3, weight, bias, 1e-5, "silu", residual) * 2

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    eager_in = {k: leaf(v) for k, v in t.items()}
    comp_in = {k: leaf(v) for k, v in t.items()}
    outs = []
    for fn, inputs in ((block, eager_in), (compiled, comp_in)):
        y = fn(**inputs)
        y.pow(2).sum().backward()
        outs.append(y)
    torch.testing.assert_close(outs[1], outs[0])
    assert outs[1].stride() == t["x"].stride()
    for k in t:
        torch.testing.assert_close(comp_in[k].grad, eager_in[k].grad)


def test_opcheck(device):
    x = torch.randn(2, 4, 3, device=device, requires_grad=True)
    w = torch.randn(4, device=device, requires_grad=True)
    r = torch.randn(2, 4, 1, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.flashfuse.group_norm_fwd, (x, r, w, None, 2, 1e-5, "mish"))


def test_odd_layouts_and_unused_grads(device):
    """A layout whose spatial dims do not flatten (W-major) is copied, not misread; (N, C) inputs; only
    some inputs requiring grad."""
    x = torch.randn(2, 12, 7, 5, device=device).transpose(2, 3)          # (2, 12, 5, 7), strides (420, 35, 1, 5)
    assert gn_ops._nchw_strides(x) is None
    w = torch.randn(12, device=device)
    torch.testing.assert_close(group_norm(x, 3, w), F.group_norm(x, 3, w), rtol=1e-5, atol=1e-5)
    x2 = torch.randn(5, 12, device=device)
    torch.testing.assert_close(group_norm(x2, 4, activation="gelu"), F.gelu(F.group_norm(x2, 4)), rtol=1e-5,
                               atol=1e-5)
    xl, r = leaf(torch.randn(2, 12, 5, device=device)), torch.randn(2, 12, 1, device=device)
    wl = leaf(w)
    group_norm(xl, 3, wl, None, residual=r).sum().backward()
    ref_x, ref_w = leaf(xl), leaf(w)
    F.group_norm(ref_x + r, 3, ref_w).sum().backward()
    torch.testing.assert_close(xl.grad, ref_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wl.grad, ref_w.grad, rtol=1e-5, atol=1e-5)


# (N, C, R) of the backward's partials: the Gluon backward's rows per channel (SD levels: R = 4, 16, 64) and the
# Triton plans' chunks (transposed [N, R, C] buffers), single rows, odd sizes, R past one block.
CHANNEL_SUM_SHAPES = [(16, 1280, 4), (16, 640, 16), (8, 320, 64), (4, 640, 33), (3, 7, 5), (2, 1280, 1), (5, 33, 300)]


def check_channel_sums(device, shapes):
    """_channel_sums against torch's sums, over (n, r) into bf16 outputs and over r alone into fp32, both layouts."""
    for n, c, r in shapes:
        for transposed in (False, True):
            def part():
                return torch.randn(n, r, c, device=device).transpose(1, 2) if transposed else torch.randn(
                    n, c, r, device=device)
            a, b = part(), part()
            out_a = torch.full((c,), float("nan"), device=device, dtype=torch.bfloat16)
            out_b = torch.full((c,), float("nan"), device=device, dtype=torch.bfloat16)
            gn_ops._channel_sums(a, b, out_a, out_b, sum_n=True)
            per_n = torch.full((n, c), float("nan"), device=device)
            gn_ops._channel_sums(b, None, per_n, None, sum_n=False)
            for out, ref, tol in ((out_a, a.sum((0, 2)), 8e-3), (out_b, b.sum((0, 2)), 8e-3), (per_n, b.sum(2), 1e-6)):
                assert rel_err(out, ref) < tol, ((n, c, r), transposed)


def test_channel_sums(device):
    check_channel_sums(device, CHANNEL_SUM_SHAPES)


@pytest.mark.parametrize("shape", [(2, 4, 0), (0, 4, 3), (2, 4, 0, 5)])
def test_empty_inputs(device, shape):
    """No pixels or no samples: an empty y and dx, and dweight, dbias and the time embedding's gradient are sums over
    nothing, 0 (torch's own GroupNorm gives NaN for dweight when there are no pixels)."""
    x = leaf(torch.randn(shape, device=device))
    w, b = leaf(torch.randn(4, device=device)), leaf(torch.randn(4, device=device))
    temb = leaf(torch.randn(shape[0], 4, *(1,) * (len(shape) - 2), device=device))
    y = group_norm(x, 2, w, b, activation="silu", residual=temb)
    assert y.shape == x.shape
    grads = torch.autograd.grad(y, (x, w, b, temb), torch.randn_like(y))
    assert grads[0].shape == x.shape
    for g, t in zip(grads[1:], (w, b, temb)):
        assert g.shape == t.shape and torch.equal(g, torch.zeros_like(t))


def test_errors(device):
    x = torch.randn(2, 12, 5, device=device)
    with pytest.raises(ValueError, match=r"x has 12 channels \(x.shape\[1\]\), not divisible by num_groups=5"):
        group_norm(x, 5)
    with pytest.raises(ValueError, match="activation is 'relu'; supported: None, 'silu', 'mish', 'gelu'"):
        group_norm(x, 3, activation="relu")
    with pytest.raises(ValueError, match=r"residual has shape \(2, 12, 4\), not broadcastable to x's \(2, 12, 5\)"):
        group_norm(x, 3, residual=torch.randn(2, 12, 4, device=device))
    with pytest.raises(ValueError, match=r"residual has shape \(3, 2, 12, 5\), not broadcastable"):
        group_norm(x, 3, residual=torch.randn(3, 2, 12, 5, device=device))
    with pytest.raises(TypeError, match="x has dtype torch.int64; supported: float16, bfloat16, float32"):
        group_norm(torch.ones(2, 12, 5, dtype=torch.int64, device=device), 3)
    with pytest.raises(TypeError, match="residual has dtype torch.float16 but x has torch.float32"):
        group_norm(x, 3, residual=torch.randn(2, 12, 1, device=device, dtype=F16))
    with pytest.raises(ValueError, match=r"weight has shape \(6,\); expected \(12,\)"):
        group_norm(x, 3, torch.randn(6, device=device))
    with pytest.raises(ValueError, match="num_groups is 0; supported: an int >= 1"):
        group_norm(x, 0)
    with pytest.raises(ValueError, match="eps is -1.0; supported: a finite number >= 0"):
        group_norm(x, 3, eps=-1.0)
    with pytest.raises(ValueError, match=r"x has shape \(12,\); expected \(N, C, \*spatial\)"):
        group_norm(torch.randn(12, device=device), 3)
