"""Launch plan and launchers of the CHUNKED mode (kernels and math in ``_chunked.py``).

Arithmetic behind the plan (H200: 132 SMs, ~4.2 TB/s of HBM for read + write, ~32 GB/s per SM, ~1 us of
HBM latency under load, 50 MB of L2):

- Bytes in flight. By Little's law an SM must keep ~32 GB/s x ~1 us = ~32 KB of loads in flight to run at
  its share of the copy rate. A tile of CHUNK_TILE = 4096 elements is 8 KB of bf16 per load burst; at
  CHUNK_PROGRAMS_PER_SM = 4 programs of 8 warps (32 warps, 16 fp32 values per thread in the tile plus two
  accumulators: ~60 registers, 4 x 256 threads x 64 fit the 64K registers) that is ~32 KB per SM. The grid
  has N x K x C/BLOCK_C programs; K (pixel chunks per sample) is chosen so that a wave has ~4 programs per
  SM (the backward: 2, measured faster on an H100, group_norm.CHUNK_PROGRAMS_PER_SM_BWD), and each program loops
  over its chunk (several tiles when the wave is large).
- channels_last tiles are BLOCK_HW pixel rows of BLOCK_C contiguous channels, BLOCK_C the largest power of
  two dividing C up to 256 (C = 320 / 640 / 1280: 64 / 128 / 256 channels, 128 / 256 / 512 bytes per row:
  whole 128-byte lines, 16-byte vectors). NCHW tiles are channel rows of up to 1024 contiguous pixels
  (2 KB of bf16 per row).
- Waves for L2 reuse. Kernel 1 reads x and kernel 3 reads it again. If the second read came from HBM the
  forward would move 3 tensors' bytes instead of 2 (at most 67% of the copy rate). SD's 84 MB activations
  do not fit the 50 MB L2, so the launcher runs kernels 1-3 on waves of samples of at most WAVE_BYTES of
  input (x, plus a full residual, plus dy in the backward). Kernel 3 writes a wave's output while it
  re-reads its input, so input + output of a wave (~2 x WAVE_BYTES) should stay below the L2: 24 MB is
  2 samples of (8, 320, 128, 128), 4 of (16, 640, 64, 64), 9 of (16, 1280, 32, 32). The price is three
  launches per wave (~1-2 us of drain and fill each): (8, 320, 128, 128) runs 4 waves, 12 launches, against
  ~40 us of HBM time at the copy rate. A tensor that fits is one wave. Measured on an H200 (session 5), the
  waves were slower at every SD shape (the launches and tails cost more than the L2 hits saved), so the
  default is WAVE_BYTES = 0: one wave.
- The per-channel partials are [N, K, C] fp32 x 2: at most ~4 x 132 programs x BLOCK_C channels x 8 bytes
  (~1 MB at C = 1280), written and read once from L2: a few % of the traffic.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .._triton import cdiv, next_power_of_2
from ._chunked import (
    _chunked_bwd_dx_kernel,
    _chunked_bwd_sums_kernel,
    _chunked_finalize_kernel,
    _chunked_fwd_apply_kernel,
    _chunked_fwd_stats_kernel,
)
from ._kernels import RES_STRIDED

CL_MAX_BLOCK_C = 256        # 512 bytes of bf16 per pixel row (4 lines); larger C takes several channel blocks
NCHW_MAX_BLOCK_HW = 1024    # 2 KB of bf16 per channel row
MIN_RUN = 16                # channels_last: below 16 contiguous channels (32 bytes, one sector) per row, pad
FINALIZE_ELEMENTS = 2048    # finalize block [BLOCK_K, BLOCK_CPG]: 2048 fp32 on 4 warps, 16 per thread


class ChunkConfig(NamedTuple):
    tile: int               # elements per [BLOCK_C, BLOCK_HW] tile
    per_warp: int           # tile elements per warp
    programs_per_sm: int    # programs per SM a wave aims for
    wave_bytes: int         # input bytes per wave (0: one wave)
    stages: int             # software-pipelining stages of the tile loops (1: none)
    reverse: bool           # kernel 3 walks its slab's tiles backwards (the re-read starts in L2)
    evict: str              # kernel 3's L2 eviction policy ("" or "evict_first")
    sms: int
    fit_wave: bool = False  # at most programs_per_sm x sms programs (round the chunk count down, not up)


class ChunkPlan(NamedTuple):
    block_c: int
    block_hw: int
    chunk_hw: int           # pixels per chunk (a multiple of block_hw)
    n_chunks: int
    n_cblocks: int
    num_warps: int
    wave: int               # samples per wave


@functools.lru_cache(maxsize=1024)
def chunk_plan(n: int, c: int, hw: int, channels_last: bool, bytes_per_sample: int, cfg: ChunkConfig) -> ChunkPlan:
    """Tile, chunks and waves for x of N samples x C channels x HW pixels (cached: the eager path runs it every
    call)."""
    if channels_last:
        block_c = min(c & -c, CL_MAX_BLOCK_C, cfg.tile)
        if block_c < MIN_RUN:
            block_c = min(next_power_of_2(c), CL_MAX_BLOCK_C, cfg.tile)
        block_hw = max(1, min(cfg.tile // block_c, next_power_of_2(hw)))
    else:
        block_hw = min(next_power_of_2(hw), NCHW_MAX_BLOCK_HW, cfg.tile)
        block_c = max(1, min(c & -c, cfg.tile // block_hw))
    n_cblocks = cdiv(c, block_c)
    wave = n if cfg.wave_bytes <= 0 else max(1, min(n, cfg.wave_bytes // max(1, bytes_per_sample)))
    slots = cfg.programs_per_sm * cfg.sms
    want = max(1, slots // (wave * n_cblocks)) if cfg.fit_wave else cdiv(slots, wave * n_cblocks)
    n_chunks = max(1, min(cdiv(hw, block_hw), want))
    chunk_hw = cdiv(cdiv(hw, n_chunks), block_hw) * block_hw
    n_chunks = cdiv(hw, chunk_hw)
    warps = min(16, max(1, block_c * block_hw // cfg.per_warp))
    return ChunkPlan(block_c, block_hw, chunk_hw, n_chunks, n_cblocks, warps, wave)


def _finalize_blocks(plan: ChunkPlan, cpg: int) -> dict:
    block_cpg = next_power_of_2(cpg)
    return dict(BLOCK_K=min(next_power_of_2(plan.n_chunks), max(1, FINALIZE_ELEMENTS // block_cpg)),
                BLOCK_CPG=block_cpg, num_warps=4)


def _waves(n: int, wave: int):
    for n0 in range(0, n, wave):
        yield slice(n0, min(n, n0 + wave))


def chunked_forward(x, r, weight, bias, y, mean, rstd, strides, residual_code, num_groups, eps, activation,
                    cfg: ChunkConfig, alloc):
    """y, mean, rstd written in place. x, r, y: (N, C, *spatial) with strides = ((sx), (sr), (sy)) from
    group_norm._nchw_strides; residual_code, activation: the kernels' codes (HAS_RESIDUAL, ACTIVATION);
    alloc(shape, dtype, device) for fp32 buffers."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg = c // num_groups
    sx, sr, sy = strides
    inputs = 2 if residual_code == RES_STRIDED.value else 1        # a full residual is read with x
    plan = chunk_plan(n, c, hw, sx[1] == 1 and hw > 1, c * hw * x.element_size() * inputs, cfg)
    k = plan.n_chunks
    delta_part = alloc((n, k, c), torch.float32, x.device)
    m2_part = alloc((n, k, c), torch.float32, x.device)
    dummy = x   # stands in for absent weight / bias (HAS_* is False: never touched)
    w, b = dummy if weight is None else weight, dummy if bias is None else bias
    tile = dict(BLOCK_C=plan.block_c, BLOCK_HW=plan.block_hw, STAGES=cfg.stages, num_warps=plan.num_warps)
    for sl in _waves(n, plan.wave):
        grid = (sl.stop - sl.start, k, plan.n_cblocks)
        xs, rs = x[sl], r[sl]
        _chunked_fwd_stats_kernel[grid](xs, rs, delta_part[sl], m2_part[sl], c, hw, cpg, plan.chunk_hw, k,
                                        *sx, *sr, HAS_RESIDUAL=residual_code, **tile)
        _chunked_finalize_kernel[((sl.stop - sl.start) * num_groups,)](
            xs, rs, delta_part[sl], m2_part[sl], mean, mean[sl], rstd[sl], c, hw, cpg, num_groups,
            plan.chunk_hw, k, float(cpg * hw), float(eps), sx[0], sx[1], sr[0], sr[1], FORWARD=True,
            HAS_RESIDUAL=residual_code, HAS_WEIGHT=False, **_finalize_blocks(plan, cpg))
        _chunked_fwd_apply_kernel[grid](
            xs, rs, w, b, y[sl], mean[sl], rstd[sl], c, hw, cpg, num_groups, plan.chunk_hw, *sx, *sr, *sy,
            HAS_RESIDUAL=residual_code, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            ACTIVATION=activation, REVERSE=cfg.reverse, EVICT=cfg.evict, **tile)


def chunked_backward(dy, x, r, weight, bias, mean, rstd, dx, strides, residual_code, num_groups, activation,
                     dres_in_kernel, cfg: ChunkConfig, alloc):
    """dx written in place; returns (dw_part, db_part, dres_part or None), each [N, chunks, C] fp32: the
    per-channel sums of dz x_hat, dz and (dres_in_kernel) dx over each chunk's pixels."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg = c // num_groups
    sx, sr, sdy, sdx = strides
    inputs = 3 if residual_code == RES_STRIDED.value else 2        # x, dy (and a full residual)
    plan = chunk_plan(n, c, hw, sx[1] == 1 and hw > 1, c * hw * x.element_size() * inputs, cfg)
    k = plan.n_chunks
    dw_part = alloc((n, k, c), torch.float32, x.device)
    db_part = alloc((n, k, c), torch.float32, x.device)
    dres_part = alloc((n, k, c), torch.float32, x.device) if dres_in_kernel else None
    c1 = alloc((n, num_groups), torch.float32, x.device)
    c2 = alloc((n, num_groups), torch.float32, x.device)
    dummy = mean   # stands in for absent tensors (HAS_* is False: never touched)
    w, b = dummy if weight is None else weight, dummy if bias is None else bias
    flags = dict(HAS_RESIDUAL=residual_code, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                 ACTIVATION=activation, BLOCK_C=plan.block_c, BLOCK_HW=plan.block_hw, STAGES=cfg.stages,
                 num_warps=plan.num_warps)
    for sl in _waves(n, plan.wave):
        grid = (sl.stop - sl.start, k, plan.n_cblocks)
        xs, rs, dys = x[sl], r[sl], dy[sl]
        _chunked_bwd_sums_kernel[grid](xs, rs, dys, w, b, mean[sl], rstd[sl], dw_part[sl], db_part[sl],
                                       c, hw, cpg, num_groups, plan.chunk_hw, k, *sx, *sr, *sdy, **flags)
        _chunked_finalize_kernel[((sl.stop - sl.start) * num_groups,)](
            xs, rs, dw_part[sl], db_part[sl], w, c1[sl], c2[sl], c, hw, cpg, num_groups, plan.chunk_hw, k,
            float(cpg * hw), 0.0, sx[0], sx[1], sr[0], sr[1], FORWARD=False, HAS_RESIDUAL=residual_code,
            HAS_WEIGHT=weight is not None, **_finalize_blocks(plan, cpg))
        _chunked_bwd_dx_kernel[grid](
            xs, rs, dys, w, b, mean[sl], rstd[sl], c1[sl], c2[sl], dx[sl],
            dummy if dres_part is None else dres_part[sl], c, hw, cpg, num_groups, plan.chunk_hw, k,
            *sx, *sr, *sdy, *sdx, HAS_DRES=dres_in_kernel, REVERSE=cfg.reverse, EVICT=cfg.evict, **flags)
    return dw_part, db_part, dres_part
