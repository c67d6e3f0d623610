"""GroupNorm fused with a broadcast residual add and an activation: ``act(GN(x + residual))``, forward and
backward in Triton.

The diffusion block's ``norm -> SiLU`` (diffusers ResnetBlock2D: ``silu(norm(x + temb))`` with the time
embedding temb of shape (N, C, 1, 1)) in one kernel per direction instead of four to six memory passes.
x is (N, C, *spatial): NCHW contiguous, channels_last, (N, C, L) or any layout whose spatial dims flatten to
one stride, read in place through (stride_n, stride_c, stride_hw); y comes out in x's layout
(``torch.empty_like``), never copied. The math and the kernels are in ``group_norm_details/_kernels.py``
(CHUNKED mode: ``_chunked*.py``; on Hopper, in Gluon: the NCHW forward ``_hopper_fwd.py`` and backward
``_hopper_bwd.py``, the channels_last forward ``_hopper_fwd_cl.py``);
this file holds the launch plan, the launchers, the torch.library ops and the public function.

Layers: kernels -> launchers ``group_norm_forward`` / ``group_norm_backward`` -> torch.library ops
``flashfuse::group_norm_fwd`` / ``_bwd`` with fake and autograd registrations (``torch.compile(fullgraph=
True)`` sees one op; eager calls skip the dispatcher, see ``_custom_op.py``) -> public ``group_norm``.
The plain PyTorch reference is ``reference/group_norm.py``.

Saved for backward: x, the residual as given (for the (N, C, 1, 1) time embedding a few KB), weight, bias,
and mean / rstd per (n, g). The sum s = x + residual is recomputed in the backward rather than saved: saving
it would cost the forward a full-tensor write (a third more traffic) and the memory of a full activation,
to save the backward one read of a full residual; a broadcast residual is nearly free to re-read.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .._checks import check_same, check_tensor
from ._custom_op import FlashfuseOp
from ._triton import cdiv, next_power_of_2, sm_count
from .group_norm_details._kernels import (
    _channel_sums_kernel,
    _group_norm_bwd_kernel,
    _group_norm_bwd_sums_kernel,
    _group_norm_fwd_kernel,
    _group_norm_fwd_stats_kernel,
)
from .group_norm_details._chunked_launch import ChunkConfig, chunk_plan, chunked_backward, chunked_forward  # noqa: F401
from .group_norm_details import _hopper_bwd as hopper_bwd
from .group_norm_details import _hopper_fwd as hopper_fwd
from .group_norm_details import _hopper_fwd_cl as hopper_fwd_cl

ACTIVATIONS = {"none": 0, "silu": 1, "mish": 2, "gelu": 3}      # codes of group_norm_details/_kernels.py
MODE_ONE_TILE, MODE_LOOP, MODE_SPLIT = 0, 1, 2
RES_NONE, RES_STRIDED, RES_PER_CHANNEL = 0, 1, 2                # residual codes of the same file

# Largest group held in registers as one tile (BLOCK_C x BLOCK_HW, padded to powers of 2). Forward: 16384
# values on 16 warps are 32 fp32 per thread, as norm.py's 16384-column rows (no spills on sm_90). Backward
# holds s, dy and the derived x_hat, dz, g per element: half as many.
ONE_TILE_FWD, ONE_TILE_BWD = 16384, 8192
# Larger groups loop over tiles of LOOP_TILE elements (glu.py measured 1024..8192-element blocks at copy
# bandwidth on an H200). 2048 on 8 warps: the largest that compiles without spills in every variant
# (ptxas sm_90, triton 3.6: 4096 on 16 warps spilled 28 bytes in the split channels_last backward).
LOOP_TILE = 2048
# Warps from the tile size: one-tile forward 16 values per thread (two 16-byte bf16 vectors, as norm.py),
# one-tile backward 8 (it keeps s, dy and three derived fp32 values per element), at most 16 warps. Looped
# tiles (LOOP, SPLIT) take 8 values per thread in both directions: ptxas (sm_90, triton 3.6) spilled the
# looped forward at 16 per thread (80 registers, 40 bytes spilled) and not at 8 (51 registers).
FWD_ELEMENTS_PER_WARP, BWD_ELEMENTS_PER_WARP, LOOP_ELEMENTS_PER_WARP, MAX_WARPS = 512, 256, 256, 16
# LOOP runs one program per group. Below 2 groups per SM it would leave SMs idle (SD's (2, 320, 64, 64)
# has 64 groups for 132 SMs), so the groups are SPLIT into chunks for ~4 programs per SM, each chunk at
# least MIN_CHUNK_ELEMENTS (4 KiB of bf16: smaller chunks cost more in launch and partials than they
# gain). The price is a second kernel and a second read of x, from L2 for tensors that fit there (a
# tensor small enough to leave SMs idle usually does: (2, 320, 64, 64) bf16 is 5 MiB).
SPLIT_BELOW_GROUPS_PER_SM, SPLIT_PROGRAMS_PER_SM, MIN_CHUNK_ELEMENTS = 2, 4, 2048
# NCHW channel blocks (_nchw_channel_block): at most this share of padding lanes, and at least MIN_RUN pixels per
# channel row of a LOOP_TILE tile (unless the block divides the group).
NCHW_PAD_SHARE, MIN_RUN = 1 / 8, 64
INTERPRETER_SMS = 1   # in the interpreter (tests raise it to force SPLIT)

# (A RESIDENT mode that read x once, register-resident chunks meeting at global counters, measured far slower
# than LOOP / SPLIT in session 4 and was removed in session 15; the read-once designs measured since are in
# benchmarks/NOTES.md, sessions 8-13.)
# CHUNKED mode (group_norm_details/_chunked*.py; the arithmetic is in _chunked_launch.py): programs over
# (sample, pixel chunk, channel block) slabs with per-channel partials, a tiny per-group finalize, then x
# re-read. On for channels_last, where the old per-group programs read 20..80-byte runs at a C-element stride.
# Measured (H200, bf16, CUDA graphs, benchmarks/tune_group_norm.py, session 5; % of copy, fwd / fwd+bwd):
# channels_last (8,320,128,128) 10 / 12 -> 36 / 30, (16,640,64,64) 26 / 21 -> 34 / 30, (16,1280,32,32)
# 26 / 19 -> 25 / 24 (before the 3 stages below). NCHW groups of at least CHUNKED_NCHW_MIN_GROUP elements
# too (3 stages: (8,320,128,128) 52 / 47 vs LOOP 52 / 44, (16,640,64,64) 53 / 48 vs 50 / 39); smaller ones
# stay on LOOP / SPLIT ((16,1280,32,32), 40960 per group: 47 / 43 vs CHUNKED 39 / 34).
CHUNKED_CHANNELS_LAST, CHUNKED_NCHW = True, True
# ... except for channels_last tensors of at most CL_PER_GROUP_MAX_BYTES, where one launch of per-group programs
# (ONE_TILE, or LOOP / SPLIT) beats CHUNKED's three (H200, bf16, CUDA graphs, session 12: (2, 640, 32, 32), 2.6 MB,
# fwd 9.3 vs 17.1 us, fwd+bwd 32.3 vs 46.3; (2, 320, 64, 64), 5.2 MB, stays CHUNKED: 15.2 vs 17.1 us).
CL_PER_GROUP_MAX_BYTES = 4 << 20
CHUNKED_NCHW_MIN_GROUP = 65536
CHUNK_TILE, CHUNK_ELEMENTS_PER_WARP, CHUNK_PROGRAMS_PER_SM = 4096, 512, 4   # 8 KB bf16 tiles on 8 warps
# Input bytes per wave (0: the whole tensor at once). Waves of 24 MB, meant to keep the re-read in L2, measured
# slower everywhere (channels_last (8,320,128,128) fwd 125 vs 111 us, NCHW 101 vs 82 us): the launches and
# their tails cost more than the L2 hits save.
WAVE_BYTES = 0
# tl.range pipelining of the tile loops. Measured (channels_last fwd / fwd+bwd, % of copy, session 5): 1 stage
# 35 / 30 (8,320,128,128), 34 / 29 (16,640,64,64), 25 / 24 (16,1280,32,32); 2 stages 39 / 33, 37 / 32, 38 / 27;
# 3 stages 46 / 41, 44 / 40, 44 / 32 (torch.compile's forward: 17, 37, 36).
CHUNK_STAGES = 3
# Round the chunk count down so that the grid fits one wave of CHUNK_PROGRAMS_PER_SM programs per SM (the stats
# kernel's occupancy), not up: channels_last (8, 320, 128, 128) had 560 programs for 528 slots, a second wave of
# 32. Measured (H200, bf16, session 13, fwd / fwd+bwd us): channels_last (8, 320, 128, 128) 79.8 / 224 vs
# 85.3 / 243, (16, 640, 64, 64) 80.9 / 229 vs 88.3 / 249, (16, 1280, 32, 32) 39.2 / 144 vs 42.4 / 150; NCHW
# unchanged (its grids are N x channel blocks at one chunk). 8 or 12 programs per SM: slower in channels_last.
CHUNK_FIT_WAVE = True
# The backward's CHUNKED kernels (channels_last on Hopper: no Gluon backward there) at 2 programs per SM, not 4: larger
# chunks, half the per-chunk partials. Measured (H100, bf16, SiLU, fwd+bwd graph-timed, session 33, `cl_sweep.log`):
# channels_last (8, 320, 128, 128) 269.5 -> 265.4 us, (16, 640, 64, 64) 264.5 -> 253.2, (16, 1280, 32, 32) 162.0 ->
# 145.8; tiles of 2048 / 8192, 8 programs per SM, 2 or 4 stages: none faster over the three.
CHUNK_PROGRAMS_PER_SM_BWD = 2
# The second pass over x (normalize; dx) of LOOP, SPLIT and CHUNKED walks its tiles backwards, so that it
# starts on the tiles the first pass read last, still in L2 (see _kernels._tile_start), with this L2 eviction
# policy on its loads and stores ("" or "evict_first": lines it reads for the last time and lines it writes).
# Measured (H200, bf16, session 10): backwards +1.6..5.7 points of copy at the 42-84 MB shapes, noise elsewhere;
# evict_first no gain in either order (off).
REVERSE_SECOND_PASS = True
SECOND_PASS_EVICT = ""


# On sm_90 with triton 3.6 the forward of contiguous NCHW x runs group_norm_details/_hopper_fwd.py (one HBM read of x,
# each group held in shared memory, split over programs that meet where it overflows the ring) and channels_last x
# _hopper_fwd_cl.py, where their plans fill the SMs (see their eligible); everything else, and the CPU interpreter,
# takes the plans below.
HOPPER_FWD = True
# The backward of contiguous NCHW x with a plan (group_norm_details/_hopper_bwd.py: x and dy read once, groups split
# over programs that meet) likewise.
HOPPER_BWD = True


class _Plan(NamedTuple):
    mode: int
    block_c: int
    block_hw: int
    chunk_hw: int        # pixels per chunk (HW unless SPLIT)
    n_chunks: int
    num_warps: int


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return sm_count(device)


def _plan(n: int, groups: int, cpg: int, hw: int, channels_contiguous: bool, one_tile: int, per_warp: int,
          device: torch.device) -> _Plan:
    """Tile shape and mode for groups of cpg channels x hw pixels (per_warp: elements per warp of a one-tile
    group)."""
    block_c, block_hw = next_power_of_2(cpg), next_power_of_2(hw)
    if block_c * block_hw <= one_tile:
        return _Plan(MODE_ONE_TILE, block_c, block_hw, hw, 1,
                     min(MAX_WARPS, max(1, block_c * block_hw // per_warp)))
    sms = _num_sms(device)
    split = n * groups < SPLIT_BELOW_GROUPS_PER_SM * sms
    if not channels_contiguous:
        # Pixels are contiguous (NCHW): long runs of HW per channel, and a channel block that divides the group
        # (10 channels -> 2) so no lanes idle on padding channels; split groups, whose chunks are short, in padded
        # blocks where the dividing one is tiny (_nchw_channel_block).
        block_c = _nchw_channel_block(cpg) if split else cpg & -cpg
    # channels_last: a pixel's cpg channels are the contiguous run, so the tile spans all of them.
    block_c = min(block_c, LOOP_TILE)
    block_hw = max(1, min(block_hw, LOOP_TILE // block_c))
    chunk_hw, n_chunks = hw, 1
    if split:
        want = cdiv(SPLIT_PROGRAMS_PER_SM * sms, n * groups)
        chunk_hw = max(cdiv(hw, want), cdiv(MIN_CHUNK_ELEMENTS, cpg))
        block_hw = min(block_hw, next_power_of_2(chunk_hw))
        chunk_hw = cdiv(chunk_hw, block_hw) * block_hw
        n_chunks = cdiv(hw, chunk_hw)
        if n_chunks == 1:
            chunk_hw = hw
    mode = MODE_SPLIT if n_chunks > 1 else MODE_LOOP
    return _Plan(mode, block_c, block_hw, chunk_hw, n_chunks,
                 min(MAX_WARPS, max(1, block_c * block_hw // LOOP_ELEMENTS_PER_WARP)))


def _nchw_channel_block(cpg: int) -> int:
    """Channels per tile row block of the NCHW SPLIT plan: the largest power of two whose blocks pad the group's cpg
    channels by at most NCHW_PAD_SHARE and leave rows of at least MIN_RUN pixels (or that divides cpg). The largest
    dividing power of two (cpg & -cpg, which LOOP keeps) is tiny for SD's up-block concatenations: 960 channels (30
    per group) made [2, 128] tiles of one warp, 15 per split chunk, 12.6 us at (2, 960, 32, 32) against
    torch.compile's 9.8 in the same run; blocks of 32 channels take 7.3 (H100, session 34). In LOOP the padded
    blocks measured mixed (forward 3-10% slower, forward + backward 9-20% faster at most shapes, 12% slower at
    (16, 3840, 16, 16))."""
    divides = cpg & -cpg
    block = next_power_of_2(cpg)
    while block > divides and (cdiv(cpg, block) * block > (1 + NCHW_PAD_SHARE) * cpg
                               or block * MIN_RUN > LOOP_TILE):
        block //= 2
    return block


def _use_chunked(groups: int, cpg: int, hw: int, channels_last: bool, one_tile: int, nbytes: int) -> bool:
    """CHUNKED for x of nbytes (x's own bytes) in groups of cpg channels x hw pixels."""
    if channels_last:
        return CHUNKED_CHANNELS_LAST and nbytes > CL_PER_GROUP_MAX_BYTES
    return (CHUNKED_NCHW and next_power_of_2(cpg) * next_power_of_2(hw) > one_tile
            and cpg * hw >= CHUNKED_NCHW_MIN_GROUP)


def _chunk_config(device: torch.device, backward: bool = False) -> ChunkConfig:
    programs_per_sm = CHUNK_PROGRAMS_PER_SM_BWD if backward else CHUNK_PROGRAMS_PER_SM
    return ChunkConfig(CHUNK_TILE, CHUNK_ELEMENTS_PER_WARP, programs_per_sm, WAVE_BYTES, CHUNK_STAGES,
                       REVERSE_SECOND_PASS, SECOND_PASS_EVICT, _num_sms(device), CHUNK_FIT_WAVE)


def _alloc(shape, dtype, device) -> Tensor:
    """Every fp32 buffer a kernel writes comes from here or _alloc_like (tests replace both with NaN
    fills: an element a kernel forgets to write then fails the comparison)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _alloc_like(t: Tensor) -> Tensor:
    """An output in t's layout (channels_last stays channels_last)."""
    return torch.empty_like(t)


def _nchw_strides(t: Tensor) -> Optional[tuple[int, int, int]]:
    """(stride_n, stride_c, stride_hw) of an (N, C, *spatial) tensor whose spatial dims flatten into one
    stride (NCHW, channels_last, (N, C, L), broadcast dims of stride 0), else None. stride_hw is 0 when
    there is at most one pixel."""
    dims = [(size, stride) for size, stride in zip(t.shape[2:], t.stride()[2:]) if size != 1]
    for (_, outer), (size, inner) in zip(dims, dims[1:]):
        if outer != inner * size:
            return None
    return t.stride(0), t.stride(1), dims[-1][1] if dims else 0


def _as_nchw(t: Tensor) -> Tensor:
    """t itself when its spatial dims flatten into one stride; a contiguous copy otherwise (rare layouts)."""
    return t if _nchw_strides(t) is not None else t.contiguous()


def _expand_residual(residual: Tensor, x: Tensor) -> Tensor:
    """The residual broadcast to x's shape as a strided view (stride 0 on broadcast dims)."""
    return _as_nchw(residual.expand(x.shape))


def _residual_code(residual: Optional[Tensor], sr: tuple[int, int, int]) -> int:
    """HAS_RESIDUAL of the kernels: none, per channel (constant over the pixels: stride_hw 0) or strided."""
    return RES_NONE if residual is None else RES_PER_CHANNEL if sr[2] == 0 else RES_STRIDED


def _dres_in_kernel(x: Tensor, residual: Optional[Tensor]) -> bool:
    """The residual is broadcast over the pixels (the (N, C, 1, 1) time embedding): the backward kernel
    sums dx over HW per (n, c) itself instead of writing a full-size gradient for torch to reduce."""
    return residual is not None and _nchw_strides(_expand_residual(residual, x))[2] == 0


def _geometry(x: Tensor, num_groups: int):
    n, c = x.shape[0], x.shape[1]
    hw = math.prod(x.shape[2:])
    return n, c, hw, c // num_groups


# ----------------------------------------------------------------------------------------------------
# Launchers (no argument checks: the public function does them)
# ----------------------------------------------------------------------------------------------------

def group_norm_forward(x: Tensor, num_groups: int, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                       eps: float = 1e-5, activation: str = "none",
                       residual: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """y = act(GN(x + residual)). x: (N, C, *spatial) whose spatial dims flatten into one stride; residual
    broadcastable to x, same dtype; weight, bias: (C,) or None. Returns (y in x's layout and dtype,
    mean (N, G) fp32, rstd (N, G) fp32)."""
    n, c, hw, cpg = _geometry(x, num_groups)
    y = _alloc_like(x)
    mean = _alloc((n, num_groups), torch.float32, x.device)
    rstd = _alloc((n, num_groups), torch.float32, x.device)
    if x.numel() == 0:
        return y, mean.zero_(), rstd.zero_()
    r = x if residual is None else _expand_residual(residual, x)
    sx, sr, sy = _nchw_strides(x), _nchw_strides(r), _nchw_strides(y)
    res = _residual_code(residual, sr)
    if HOPPER_FWD:
        for kernel in (hopper_fwd, hopper_fwd_cl):      # NCHW groups held whole; channels_last samples in chunks
            if kernel.eligible(x, num_groups, activation, None if residual is None else sr, y):
                return kernel.forward(x, num_groups, weight, bias, eps, activation, None if residual is None else r,
                                      sr, y, mean, rstd)
    cl = sx[1] == 1 and hw > 1
    if _use_chunked(num_groups, cpg, hw, cl, ONE_TILE_FWD, x.numel() * x.element_size()):
        chunked_forward(x, r, weight, bias, y, mean, rstd, (sx, sr, sy), res, num_groups, eps,
                        ACTIVATIONS[activation], _chunk_config(x.device), _alloc)
        return y, mean, rstd
    plan = _plan(n, num_groups, cpg, hw, sx[1] == 1 and hw > 1, ONE_TILE_FWD, FWD_ELEMENTS_PER_WARP, x.device)
    grid = (n * num_groups, plan.n_chunks)
    part = mean  # stands in when there are no partials (never touched: MODE is not SPLIT)
    if plan.mode == MODE_SPLIT:
        part = _alloc((n * num_groups, plan.n_chunks, 2), torch.float32, x.device)
        _group_norm_fwd_stats_kernel[grid](
            x, r, part, hw, cpg, num_groups, plan.chunk_hw, plan.n_chunks, *sx, *sr,
            HAS_RESIDUAL=res, BLOCK_C=plan.block_c, BLOCK_HW=plan.block_hw,
            num_warps=plan.num_warps)
    dummy = x  # stands in for absent weight / bias (HAS_* is False: never touched)
    _group_norm_fwd_kernel[grid](
        x, r, dummy if weight is None else weight, dummy if bias is None else bias, y, part, mean, rstd,
        hw, cpg, num_groups, plan.chunk_hw, plan.n_chunks, float(cpg * hw), *sx, *sr, *sy, float(eps),
        MODE=plan.mode, HAS_RESIDUAL=res, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, ACTIVATION=ACTIVATIONS[activation], BLOCK_C=plan.block_c,
        BLOCK_HW=plan.block_hw, BLOCK_K=next_power_of_2(plan.n_chunks), REVERSE=REVERSE_SECOND_PASS,
        EVICT=SECOND_PASS_EVICT, num_warps=plan.num_warps)
    return y, mean, rstd


def _backward(dy, x, residual, weight, bias, mean, rstd, num_groups, activation, compute_dw, compute_db,
              compute_dres):
    """(dx, dw or None, db or None, dresidual reduced in the kernel or None): see group_norm_backward."""
    n, c, hw, cpg = _geometry(x, num_groups)
    dy = _as_nchw(dy)
    dx = _alloc_like(x)
    dres_in_kernel = compute_dres and _dres_in_kernel(x, residual)
    if HOPPER_BWD and x.numel() > 0:
        r = None if residual is None else _expand_residual(residual, x)
        sr = None if r is None else _nchw_strides(r)
        if hopper_bwd.eligible(x, dy, dx, num_groups, activation, sr):
            parts = hopper_bwd.backward(dy, x, r, sr, weight, bias, mean, rstd, num_groups, activation, dx,
                                        compute_dw, compute_db, dres_in_kernel, _alloc)       # [N, C, rows] each
            return dx, *_reduce_parts(x, residual, weight, bias, *parts)
    if x.numel() > 0 and _use_chunked(num_groups, cpg, hw, x.stride(1) == 1 and hw > 1, ONE_TILE_BWD,
                                      x.numel() * x.element_size()):
        r = x if residual is None else _expand_residual(residual, x)
        strides = tuple(_nchw_strides(t) for t in (x, r, dy, dx))
        dw_part, db_part, dres_part = chunked_backward(
            dy, x, r, weight, bias, mean, rstd, dx, strides, _residual_code(residual, strides[1]), num_groups,
            ACTIVATIONS[activation], dres_in_kernel, _chunk_config(x.device, backward=True), _alloc)
        return dx, *_reduce_parts(x, residual, weight, bias, *(None if t is None else t.transpose(1, 2) for t in (
            dw_part if compute_dw else None, db_part if compute_db else None, dres_part)))
    plan = _plan(n, num_groups, cpg, hw, x.stride(1) == 1 and hw > 1, ONE_TILE_BWD, BWD_ELEMENTS_PER_WARP,
                 x.device)
    k = plan.n_chunks
    dw_part = _alloc((n, k, c), torch.float32, x.device) if compute_dw else None
    db_part = _alloc((n, k, c), torch.float32, x.device) if compute_db else None
    dres_part = _alloc((n, k, c), torch.float32, x.device) if dres_in_kernel else None
    if x.numel() > 0:
        r = x if residual is None else _expand_residual(residual, x)
        sx, sr, sdy, sdx = _nchw_strides(x), _nchw_strides(r), _nchw_strides(dy), _nchw_strides(dx)
        grid = (n * num_groups, k)
        dummy = mean  # stands in for absent tensors (their HAS_* / COMPUTE_* is False: never touched)
        sums = dummy
        w, b = dummy if weight is None else weight, dummy if bias is None else bias
        flags = dict(HAS_RESIDUAL=_residual_code(residual, sr), HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                     ACTIVATION=ACTIVATIONS[activation], COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
                     BLOCK_C=plan.block_c, BLOCK_HW=plan.block_hw, num_warps=plan.num_warps)
        if plan.mode == MODE_SPLIT:
            sums = _alloc((n * num_groups, k, 2), torch.float32, x.device)
            _group_norm_bwd_sums_kernel[grid](
                x, r, dy, w, b, mean, rstd, sums, dummy if dw_part is None else dw_part,
                dummy if db_part is None else db_part, c, hw, cpg, num_groups, plan.chunk_hw, k,
                *sx, *sr, *sdy, **flags)
        _group_norm_bwd_kernel[grid](
            x, r, dy, w, b, mean, rstd, sums, dx, dummy if dw_part is None else dw_part,
            dummy if db_part is None else db_part, dummy if dres_part is None else dres_part,
            c, hw, cpg, num_groups, plan.chunk_hw, k, float(cpg * hw), *sx, *sr, *sdy, *sdx,
            MODE=plan.mode, HAS_DRES=dres_in_kernel, BLOCK_K=next_power_of_2(k), REVERSE=REVERSE_SECOND_PASS,
            EVICT=SECOND_PASS_EVICT, **flags)
    return dx, *_reduce_parts(x, residual, weight, bias, *(None if t is None else t.transpose(1, 2)
                                                          for t in (dw_part, db_part, dres_part)))


# [BLOCK_N, BLOCK_C, BLOCK_R] partials per step of _channel_sums_kernel (4 warps), BLOCK_R at most CHANNEL_SUMS_MAX_R
CHANNEL_SUMS_TILE, CHANNEL_SUMS_MAX_R = 4096, 256


def _channel_sums(a: Tensor, b: Optional[Tensor], out_a: Tensor, out_b: Optional[Tensor], sum_n: bool) -> None:
    """out_a[c] = sum over (n, r) of a[n, c, r] (sum_n; else out_a[n, c] = sum over r), a: fp32 partials [N, C, R]
    with any strides, out_a contiguous in its own dtype; the same for b (a's shape and strides) into out_b."""
    n, c, r = a.shape
    if out_a.numel() == 0 or a.numel() == 0:        # no channels; or no samples / pixels: sums of nothing
        for out in (out_a, out_b):
            if out is not None:
                out.zero_()
        return
    block_r = min(next_power_of_2(r), CHANNEL_SUMS_MAX_R)
    block_n = min(next_power_of_2(n), CHANNEL_SUMS_TILE // block_r) if sum_n else 1
    block_c = min(next_power_of_2(c), max(1, CHANNEL_SUMS_TILE // (block_r * block_n)))
    _channel_sums_kernel[(cdiv(c, block_c), 1 if sum_n else n)](
        a, a if b is None else b, out_a, out_a if out_b is None else out_b, n, c, r, *a.stride(),
        HAS_B=b is not None, SUM_N=sum_n, BLOCK_N=block_n, BLOCK_C=block_c, BLOCK_R=block_r, num_warps=4)


def _reduce_parts(x, residual, weight, bias, dw_part, db_part, dres_part):
    """dw, db and dresidual (None where their partials are) in their parameters' dtypes from the kernels' fp32
    partials, each [N, C, R] (R: chunks or rows per channel), in one launch for dw and db and one for dresidual.
    An empty x (no kernel wrote the partials) gives sums of nothing: 0."""
    if x.numel() == 0:
        for part in (dw_part, db_part, dres_part):
            if part is not None:
                part.zero_()
    dw = None if dw_part is None else _alloc(weight.shape, weight.dtype, weight.device)
    db = None if db_part is None else _alloc(bias.shape, bias.dtype, bias.device)
    if dw is not None and db is not None and dw.dtype == db.dtype:
        _channel_sums(dw_part, db_part, dw, db, sum_n=True)
    else:
        for part, out in ((dw_part, dw), (db_part, db)):
            if part is not None:
                _channel_sums(part, None, out, None, sum_n=True)
    dres = None
    if dres_part is not None:                      # the residual is broadcast over the pixels (see _dres_in_kernel)
        n, c = x.shape[0], x.shape[1]
        shape = (1,) * (x.dim() - residual.dim()) + tuple(residual.shape)          # (1 or N, 1 or C, 1, ...)
        if shape[1] == c and shape[0] in (1, n):   # (N, C, 1, 1), the time embedding, or (1, C, 1, 1)
            sum_n = shape[0] != n
            dres = _alloc(residual.shape, residual.dtype, residual.device)
            _channel_sums(dres_part, None, dres, None, sum_n=sum_n)
        else:                                       # broadcast over C too: per (n, c) in fp32, then torch
            per_nc = _alloc((n, c), torch.float32, x.device)
            _channel_sums(dres_part, None, per_nc, None, sum_n=False)
            dres = per_nc.view(n, c, *(1,) * (x.dim() - 2)).sum_to_size(residual.shape).to(residual.dtype)
    return dw, db, dres


def group_norm_backward(dy: Tensor, x: Tensor, num_groups: int, weight: Optional[Tensor], bias: Optional[Tensor],
                        mean: Tensor, rstd: Tensor, activation: str = "none", residual: Optional[Tensor] = None,
                        compute_dw: bool = True, compute_db: bool = True,
                        compute_dres: bool = True) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of y = act(GN(x + residual)) given dy (x's shape, any layout): (dx in x's layout, dweight,
    dbias, dresidual of the residual's shape); None for an absent or unrequested one. mean / rstd from
    group_norm_forward; s = x + residual and z are recomputed."""
    compute_dw = compute_dw and weight is not None
    compute_db = compute_db and bias is not None
    compute_dres = compute_dres and residual is not None
    dx, dw, db, dres = _backward(dy, x, residual, weight, bias, mean, rstd, num_groups, activation, compute_dw,
                                 compute_db, compute_dres)
    if compute_dres and dres is None:
        dres = dx.sum_to_size(residual.shape)        # a full-spatial residual: dres = dx (summed over N / C)
    return dx, dw, db, dres


# ----------------------------------------------------------------------------------------------------
# torch.library ops; an absent dw / db / in-kernel dresidual is an empty tensor (ops cannot return None)
# ----------------------------------------------------------------------------------------------------

def _empty(t: Tensor) -> Tensor:
    return t.new_empty(0)


def _group_norm_fwd_impl(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor],
                         num_groups: int, eps: float, activation: str) -> tuple[Tensor, Tensor, Tensor]:
    return group_norm_forward(x, num_groups, weight, bias, eps, activation, residual)


def _group_norm_fwd_fake(x, residual, weight, bias, num_groups, eps, activation):
    stat = x.new_empty((x.shape[0], num_groups), dtype=torch.float32)
    return torch.empty_like(x), stat, stat.new_empty(stat.shape)


def _group_norm_bwd_impl(dy: Tensor, x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
                         bias: Optional[Tensor], mean: Tensor, rstd: Tensor, num_groups: int, activation: str,
                         compute_dw: bool, compute_db: bool,
                         compute_dres: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dx, dw, db, dres = _backward(dy, x, residual, weight, bias, mean, rstd, num_groups, activation, compute_dw,
                                 compute_db, compute_dres)
    return dx, *(_empty(x) if t is None else t for t in (dw, db, dres))


def _group_norm_bwd_fake(dy, x, residual, weight, bias, mean, rstd, num_groups, activation, compute_dw,
                         compute_db, compute_dres):
    dw = weight.new_empty(weight.shape) if compute_dw else _empty(x)
    db = bias.new_empty(bias.shape) if compute_db else _empty(x)
    dres = residual.new_empty(residual.shape) if compute_dres and _dres_in_kernel(x, residual) else _empty(x)
    return torch.empty_like(x), dw, db, dres


def _setup_context(ctx, inputs, output):
    x, residual, weight, bias, num_groups, _eps, activation = inputs
    _y, mean, rstd = output
    ctx.num_groups, ctx.activation = num_groups, activation
    ctx.save_for_backward(x, residual, weight, bias, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _backward_formula(ctx, dy, _dmean, _drstd):
    x, residual, weight, bias, mean, rstd = ctx.saved_tensors
    compute_dw = weight is not None and ctx.needs_input_grad[2]
    compute_db = bias is not None and ctx.needs_input_grad[3]
    compute_dres = residual is not None and ctx.needs_input_grad[1]
    dx, dw, db, dres = _group_norm_bwd(_as_nchw(dy), x, residual, weight, bias, mean, rstd, ctx.num_groups,
                                       ctx.activation, compute_dw, compute_db, compute_dres)
    if compute_dres and not _dres_in_kernel(x, residual):
        dres = dx.sum_to_size(residual.shape)
    return (dx, dres if compute_dres else None, dw if compute_dw else None, db if compute_db else None,
            None, None, None)


_group_norm_bwd = FlashfuseOp("flashfuse::group_norm_bwd", _group_norm_bwd_impl, fake=_group_norm_bwd_fake)
_group_norm_fwd = FlashfuseOp("flashfuse::group_norm_fwd", _group_norm_fwd_impl, fake=_group_norm_fwd_fake,
                              setup_context=_setup_context, backward=_backward_formula)


# ----------------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------------

def _check_inputs(x, num_groups, weight, bias, eps, activation, residual):
    check_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected (N, C, *spatial) with at least 2 dims")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups is {num_groups!r}; supported: an int >= 1 that divides the channels")
    c = x.shape[1]
    if c % num_groups != 0:
        raise ValueError(f"x has {c} channels (x.shape[1]), not divisible by num_groups={num_groups}")
    if activation not in (None, "silu", "mish", "gelu"):
        raise ValueError(f"activation is {activation!r}; supported: None, 'silu', 'mish', 'gelu'")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        check_tensor(name, p)
        check_same(("x", name), (x, p), dtype=False)
        if tuple(p.shape) != (c,):
            raise ValueError(f"{name} has shape {tuple(p.shape)}; expected ({c},), the channels (x.shape[1])")
    if residual is not None:
        check_tensor("residual", residual)
        check_same(("x", "residual"), (x, residual))
        # broadcastable to x: aligned from the right, each size 1 or x's (torch.broadcast_shapes costs ~20 us)
        ok = residual.dim() <= x.dim() and all(
            r in (1, n) for r, n in zip(reversed(residual.shape), reversed(x.shape)))
        if not ok:
            raise ValueError(f"residual has shape {tuple(residual.shape)}, not broadcastable to x's "
                             f"{tuple(x.shape)} (e.g. the time embedding (N, C, 1, 1) or x's shape)")
    if not torch.compiler.is_compiling() and (
            isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0):
        raise ValueError(f"eps is {eps!r}; supported: a finite number >= 0")
    span = sum((size - 1) * abs(stride) for size, stride in zip(x.shape[1:], x.stride()[1:]))
    if not torch.compiler.is_compiling() and span >= 2**31:
        raise ValueError(f"x has shape {tuple(x.shape)}: one sample spans >= 2^31 elements, which the kernels' "
                         "32-bit offsets within a sample do not cover")


def group_norm(x: Tensor, num_groups: int, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5, activation: Optional[str] = None, residual: Optional[Tensor] = None) -> Tensor:
    """``act(GroupNorm(x + residual))`` in one Triton kernel, differentiable in x, weight, bias and residual.

    Shapes: x (N, C, *spatial), e.g. (N, C, H, W) in NCHW or channels_last, or (N, C, L); read in place
    whenever the spatial dims flatten into one stride (NCHW, channels_last, (N, C, L)); y has x's shape,
    dtype and layout. weight, bias: (C,) or None (their dtype may differ from x's, e.g. fp32 parameters
    with bf16 activations). residual: broadcastable to x, same dtype, e.g. the time embedding (N, C, 1, 1)
    of diffusers' ResnetBlock2D, or a full tensor; its gradient is summed over the broadcast dims.
    fp16, bf16 or fp32; statistics (mean, biased variance per (sample, group)) in fp32.

    Computes s = x + residual (rounded to x's dtype, like torch's add), z = (s - mean) / sqrt(var + eps) *
    weight + bias over each group of C / num_groups channels x all pixels, y = act(z) with activation None,
    "silu", "mish" (z * tanh(softplus(z))) or "gelu" (exact, erf).

    Example::

        x = torch.randn(2, 320, 64, 64, device="cuda", dtype=torch.float16)
        temb = torch.randn(2, 320, 1, 1, device="cuda", dtype=torch.float16)
        gn = torch.nn.GroupNorm(32, 320, device="cuda", dtype=torch.float16)
        y = group_norm(x, 32, gn.weight, gn.bias, gn.eps, activation="silu", residual=temb)
        # == torch.nn.functional.silu(gn(x + temb))
    """
    _check_inputs(x, num_groups, weight, bias, eps, activation, residual)
    y, _, _ = _group_norm_fwd(_as_nchw(x), residual, weight, bias, num_groups, float(eps),
                              "none" if activation is None else activation)
    return y
