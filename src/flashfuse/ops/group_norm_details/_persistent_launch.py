"""Launch plan and launchers of the PERSISTENT mode (kernels and math in ``_persistent.py``).

Arithmetic behind the plan (H200: 132 SMs, ~4.2 TB/s of HBM for read + write, 50 MB of L2):

- Tiles are CHUNKED's (``_chunked_launch.chunk_plan``): [BLOCK_C, BLOCK_HW] of 4096 elements, 8 KB of bf16 per
  load burst on 8 warps, whole 128-byte lines in both layouts.
- Grid: P = SMs x programs per SM, at most what the compiled kernel's registers and shared memory let be
  resident at once (the CUDA occupancy query on the compiled kernel) and at most PROGRAMS_PER_SM.
- Slabs: ``tiles`` tiles of pixels per item, chosen so that a round (P items) reads about ROUND_BYTES of input.
  Between the two reads of a slab the GPU streams lag rounds of input in and as much output out, so
  (lag + 1) x ROUND_BYTES x (1 + outputs / inputs) must stay well inside L2. lag is the fewest rounds that
  keep the launch deadlock-free (a sample's items span at most lag + 1 rounds) plus EXTRA_LAG, slack for
  the sample whose last slab is still streaming when its first slabs want their statistics.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from ..._env import INTERPRET
from .._triton import cdiv, next_power_of_2
from ._chunked_launch import ChunkConfig, chunk_plan
from ._persistent import _persistent_bwd_kernel, _persistent_fwd_kernel

FINALIZE_ELEMENTS = 2048    # the finalize's [BLOCK_K, BLOCK_CF] and [BLOCK_G, BLOCK_CPG] blocks


class PersistentConfig(NamedTuple):
    chunk: ChunkConfig      # the tile (CHUNKED's plan)
    programs_per_sm: int    # at most this many programs per SM (fewer if the kernel does not fit)
    round_bytes: int        # input bytes a round of P slabs reads
    extra_lag: int          # rounds of slack between a slab's two reads beyond the deadlock-free minimum
    spin_limit: int


class PersistentPlan(NamedTuple):
    block_c: int
    block_hw: int
    chunk_hw: int           # pixels per slab, a multiple of block_hw
    n_chunks: int
    n_cblocks: int
    num_warps: int
    n_items: int
    per_sample: int         # items per sample
    tiles: int              # tiles per slab


@functools.lru_cache(maxsize=1024)
def persistent_plan(n: int, c: int, hw: int, channels_last: bool, input_bytes_per_element: int, programs: int,
                    cfg: PersistentConfig) -> PersistentPlan:
    """Slabs for x of N x C x HW read by `programs` resident programs (cached per shape)."""
    tile = chunk_plan(n, c, hw, channels_last, 0, cfg.chunk)
    tile_bytes = tile.block_c * tile.block_hw * input_bytes_per_element
    pixel_blocks = cdiv(hw, tile.block_hw)
    tiles = max(1, min(pixel_blocks, cfg.round_bytes // max(1, programs * tile_bytes)))
    chunk_hw = tiles * tile.block_hw
    n_chunks = cdiv(hw, chunk_hw)
    per_sample = n_chunks * tile.n_cblocks
    return PersistentPlan(tile.block_c, tile.block_hw, chunk_hw, n_chunks, tile.n_cblocks, tile.num_warps,
                          n * per_sample, per_sample, tiles)


def _rounds_and_lag(plan: PersistentPlan, programs: int, extra_lag: int) -> tuple[int, int]:
    """Rounds of the persistent loop and the lag between a slab's A and B (a sample's items, consecutive,
    span at most cdiv(per_sample - 1, P) + 1 rounds)."""
    return cdiv(plan.n_items, programs), max(1, cdiv(plan.per_sample - 1, programs)) + extra_lag


def _finalize_blocks(n_chunks: int, c: int, groups: int) -> dict:
    cpg = c // groups
    block_cf = min(next_power_of_2(c), 512, FINALIZE_ELEMENTS)
    block_cpg = min(next_power_of_2(cpg), FINALIZE_ELEMENTS)
    return dict(BLOCK_K=max(1, min(next_power_of_2(n_chunks), FINALIZE_ELEMENTS // block_cf)), BLOCK_CF=block_cf,
                BLOCK_G=max(1, min(next_power_of_2(groups), FINALIZE_ELEMENTS // block_cpg)), BLOCK_CPG=block_cpg)


# ----------------------------------------------------------------------------------------------------
# Residency: how many programs of a compiled kernel an SM holds at once
# ----------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
            ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):
        return None


def _resident_per_sm(compiled) -> int:
    """Programs of `compiled` (a triton CompiledKernel) one SM holds at once: the driver's occupancy query
    (registers, shared memory, warps), or 0 when it cannot answer (the caller then does not go persistent)."""
    compiled._init_handles()
    lib = _libcuda()
    if lib is None:
        return 0
    blocks = ctypes.c_int(0)
    threads = compiled.metadata.num_warps * 32
    err = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), ctypes.c_void_p(compiled.function),
                                                          threads, compiled.metadata.shared)
    return blocks.value if err == 0 else 0


_PROGRAMS: dict = {}


def _specialization(a):
    """What Triton specializes a launch argument on (ints: == 1, divisible by 16; pointers: 16-byte aligned)."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if isinstance(a, int) and not isinstance(a, bool):
        return int, a == 1, a % 16 == 0
    return type(a)


def _programs(kernel, args, flags, sms: int, programs_per_sm: int) -> int:
    """Resident grid size for this specialization of the kernel (compiled without launching; cached)."""
    key = (kernel, tuple(sorted(flags.items())), tuple(map(_specialization, args)), sms, programs_per_sm)
    p = _PROGRAMS.get(key)
    if p is None:
        compiled = kernel.warmup(*args, grid=(1,), **flags)
        p = sms * min(programs_per_sm, _resident_per_sm(compiled))
        _PROGRAMS[key] = p
    return p


# ----------------------------------------------------------------------------------------------------
# Counters
# ----------------------------------------------------------------------------------------------------

_COUNTERS: dict = {}
_OUTGROWN_COUNTERS: list = []   # replaced buffers, kept alive for the graphs that captured them


def counters(device: torch.device, size: int) -> torch.Tensor:
    """Per-sample counters (int32, zero between launches: the kernels reset them), one buffer per device and
    stream (two streams must not share counters). Grown, never freed: a captured CUDA graph keeps using the
    buffer it saw."""
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < size:
        if buf is not None:
            _OUTGROWN_COUNTERS.append(buf)
        buf = torch.zeros(max(size, 1024, 0 if buf is None else 2 * buf.numel()), dtype=torch.int32,
                          device=device)
        _COUNTERS[key] = buf
    return buf


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------

def _launch(kernel, before, after, flags, plan: PersistentPlan, cfg: PersistentConfig, device) -> None:
    """One persistent launch (PHASE 0) on a GPU whose residency is known; two launches otherwise (PHASE 1, 2:
    the interpreter, or a driver without the occupancy query). The kernel's arguments are
    (*before, rounds, lag, *after)."""
    sms = cfg.chunk.sms
    programs = min(plan.n_items, sms * cfg.programs_per_sm)
    if device.type == "cuda" and not INTERPRET:
        rounds, lag = _rounds_and_lag(plan, programs, cfg.extra_lag)
        resident = _programs(kernel, (*before, rounds, lag, *after), dict(flags, PHASE=0), sms,
                             cfg.programs_per_sm)
        if resident > 0:
            programs = min(plan.n_items, resident)
            rounds, lag = _rounds_and_lag(plan, programs, cfg.extra_lag)
            kernel[(programs,)](*before, rounds, lag, *after, PHASE=0, **flags)
            return
    rounds = cdiv(plan.n_items, programs)
    for phase in (1, 2):
        kernel[(programs,)](*before, rounds, 0, *after, PHASE=phase, **flags)


def persistent_forward(x, r, weight, bias, y, mean, rstd, strides, has_residual, num_groups, eps, activation,
                       cfg: PersistentConfig, alloc):
    """y, mean, rstd written in place (arguments as ``_chunked_launch.chunked_forward``)."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg = c // num_groups
    sx, sr, sy = strides
    inputs = 2 if has_residual and sr[2] != 0 else 1
    programs_guess = cfg.chunk.sms * cfg.programs_per_sm
    plan = persistent_plan(n, c, hw, sx[1] == 1 and hw > 1, x.element_size() * inputs, programs_guess, cfg)
    k = plan.n_chunks
    pa = alloc((n, k, c), torch.float32, x.device)
    pb = alloc((n, k, c), torch.float32, x.device)
    scratch = alloc((n, 2, c), torch.float32, x.device)
    counter = counters(x.device, n)
    dummy = x   # stands in for absent weight / bias (HAS_* is False: never touched)
    w, b = dummy if weight is None else weight, dummy if bias is None else bias
    flags = dict(HAS_RESIDUAL=has_residual, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                 ACTIVATION=activation, BLOCK_C=plan.block_c, BLOCK_HW=plan.block_hw, STAGES=cfg.chunk.stages,
                 num_warps=plan.num_warps, **_finalize_blocks(k, c, num_groups))
    before = (x, r, w, b, y, pa, pb, scratch, mean, rstd, counter, c, hw, cpg, num_groups, plan.chunk_hw, k,
              plan.n_cblocks, plan.n_items)
    after = (cfg.spin_limit, float(cpg * hw), float(eps), *sx, *sr, *sy)
    _launch(_persistent_fwd_kernel, before, after, flags, plan, cfg, x.device)


def persistent_backward(dy, x, r, weight, bias, mean, rstd, dx, strides, has_residual, num_groups, activation,
                        dres_in_kernel, cfg: PersistentConfig, alloc):
    """dx written in place; returns (dw_part, db_part, dres_part or None), each [N, chunks, C] fp32
    (arguments as ``_chunked_launch.chunked_backward``)."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg = c // num_groups
    sx, sr, sdy, sdx = strides
    inputs = 3 if has_residual and sr[2] != 0 else 2
    programs_guess = cfg.chunk.sms * cfg.programs_per_sm
    plan = persistent_plan(n, c, hw, sx[1] == 1 and hw > 1, x.element_size() * inputs, programs_guess, cfg)
    k = plan.n_chunks
    dw_part = alloc((n, k, c), torch.float32, x.device)
    db_part = alloc((n, k, c), torch.float32, x.device)
    dres_part = alloc((n, k, c), torch.float32, x.device) if dres_in_kernel else None
    scratch = alloc((n, 2, c), torch.float32, x.device)
    c1 = alloc((n, num_groups), torch.float32, x.device)
    c2 = alloc((n, num_groups), torch.float32, x.device)
    counter = counters(x.device, n)
    dummy = mean   # stands in for absent tensors (HAS_* is False: never touched)
    w, b = dummy if weight is None else weight, dummy if bias is None else bias
    flags = dict(HAS_RESIDUAL=has_residual, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                 ACTIVATION=activation, HAS_DRES=dres_in_kernel, BLOCK_C=plan.block_c, BLOCK_HW=plan.block_hw,
                 STAGES=cfg.chunk.stages, num_warps=plan.num_warps, **_finalize_blocks(k, c, num_groups))
    before = (x, r, dy, w, b, mean, rstd, dw_part, db_part, scratch, c1, c2, counter, dx,
              dummy if dres_part is None else dres_part, c, hw, cpg, num_groups, plan.chunk_hw, k, plan.n_cblocks,
              plan.n_items)
    after = (cfg.spin_limit, float(cpg * hw), *sx, *sr, *sdy, *sdx)
    _launch(_persistent_bwd_kernel, before, after, flags, plan, cfg, x.device)
    return dw_part, db_part, dres_part
