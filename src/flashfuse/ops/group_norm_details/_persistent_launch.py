"""Launch plan and launchers of the PERSISTENT mode (kernels and math in ``_persistent.py``).

Arithmetic behind the plan (H200: 132 SMs, ~4.2 TB/s of HBM for read + write, ~32 GB/s per SM, 50 MB of L2):

- Tiles of TILE = 2048 elements on 4 warps (16 per thread, two 16-byte bf16 vectors), so that four programs
  fit an SM at up to 128 registers each: while one waits at its unit's counter, three stream.
  NCHW: BLOCK_C channel rows of one group (the largest power of two dividing C / G) x BLOCK_HW contiguous
  pixels. channels_last: a unit of GB groups whose GB x C / G channels are one contiguous run per pixel of at
  least MIN_RUN_BYTES (the GB with the least lane padding), BLOCK_HW pixel rows of them.
- Grid: P = SMs x programs per SM, at most what the compiled kernel's registers and shared memory let be
  resident at once (the CUDA occupancy query on the compiled kernel) and at most programs_per_sm.
- Items: ``tiles`` tiles of pixels each, so that a round (P items) reads about round_bytes of input. Between an
  item's two reads the GPU streams lag rounds of input in and of output out, so (lag + 1) x round_bytes x
  (1 + outputs / inputs) must stay inside L2. lag is the fewest rounds that keep the launch deadlock-free (a
  unit's items span at most lag + 1 rounds) plus extra_lag, slack for a unit whose last item is still
  streaming when its first items want their statistics.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from ..._env import INTERPRET
from .._triton import cdiv, next_power_of_2
from ._persistent import _persistent_bwd_kernel, _persistent_fwd_kernel

UNIT_SUM_ELEMENTS = 2048    # the partial sums' [BLOCK_K, BLOCK_G] block


class PersistentConfig(NamedTuple):
    tile: int               # elements per [BLOCK_C, BLOCK_HW] tile
    per_warp: int           # tile elements per warp
    min_run_bytes: int      # channels_last: bytes of a unit's contiguous channel run per pixel, at least
    programs_per_sm: int    # at most this many programs per SM (fewer if the kernel does not fit)
    round_bytes: int        # input bytes a round of P items reads
    extra_lag: int          # rounds of slack between an item's two reads beyond the deadlock-free minimum
    stages: int             # software-pipelining stages of the tile loops
    spin_limit: int
    sms: int


class PersistentPlan(NamedTuple):
    gb: int                 # groups per unit
    block_c: int
    block_hw: int
    block_g: int
    n_cblocks: int          # channel blocks per unit
    chunk_hw: int           # pixels per item, a multiple of block_hw
    n_chunks: int
    per_unit: int           # items per unit (n_cblocks x n_chunks)
    units_per_sample: int
    n_items: int
    num_warps: int
    tiles: int              # tiles per item


def _channels_last_unit(groups: int, cpg: int, tile: int, min_run: int) -> int:
    """Groups per unit: the least lane padding (channels / lanes over all units) among runs of >= min_run
    channels (ties: fewer groups); all groups if none qualifies."""
    best = None
    for gb in range(1, groups + 1):
        width = next_power_of_2(gb * cpg)
        if width > tile or (gb * cpg < min_run and gb < groups):
            continue
        eff = groups * cpg / (cdiv(groups, gb) * width)
        if best is None or eff > best[0]:
            best = (eff, gb)
    return 1 if best is None else best[1]


@functools.lru_cache(maxsize=1024)
def persistent_plan(n: int, groups: int, cpg: int, hw: int, channels_last: bool, element_bytes: int, inputs: int,
                    programs: int, cfg: PersistentConfig) -> PersistentPlan:
    """Units, tiles and items for `inputs` tensors like x, N x (groups x cpg) x HW, read by `programs` resident
    programs (cached)."""
    if channels_last:
        gb = _channels_last_unit(groups, cpg, cfg.tile, max(1, cfg.min_run_bytes // element_bytes))
        block_c = min(next_power_of_2(gb * cpg), cfg.tile)
        block_hw = max(1, min(next_power_of_2(hw), cfg.tile // block_c))
    else:
        gb = 1
        block_hw = min(next_power_of_2(hw), cfg.tile)
        block_c = max(1, min(cpg & -cpg, cfg.tile // block_hw))
    n_cblocks = cdiv(gb * cpg, block_c)
    tile_bytes = block_c * block_hw * element_bytes * inputs
    tiles = max(1, min(cdiv(hw, block_hw), cfg.round_bytes // max(1, programs * tile_bytes)))
    chunk_hw = tiles * block_hw
    n_chunks = cdiv(hw, chunk_hw)
    per_unit = n_cblocks * n_chunks
    units_per_sample = cdiv(groups, gb)
    warps = min(16, max(1, block_c * block_hw // cfg.per_warp))
    return PersistentPlan(gb, block_c, block_hw, next_power_of_2(gb), n_cblocks, chunk_hw, n_chunks, per_unit,
                          units_per_sample, n * units_per_sample * per_unit, warps, tiles)


def _rounds_and_lag(plan: PersistentPlan, programs: int, extra_lag: int) -> tuple[int, int]:
    """Rounds of the persistent loop and the lag between an item's A and B (a unit's items, consecutive,
    span at most cdiv(per_unit - 1, P) + 1 rounds)."""
    return cdiv(plan.n_items, programs), max(1, cdiv(plan.per_unit - 1, programs)) + extra_lag


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


def sync_buffer(device: torch.device, units: int) -> tuple[torch.Tensor, int]:
    """(the int32 SYNC buffer of ``_persistent.py``: generation, exit count, two banks of `cap` unit counters;
    cap). One buffer per device and stream (two streams must not share it); grown, never freed: a captured CUDA
    graph keeps using the buffer it saw."""
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    buf = _COUNTERS.get(key)
    if buf is None or (buf.numel() - 2) // 2 < units:
        if buf is not None:
            _OUTGROWN_COUNTERS.append(buf)
        cap = max(units, 1024, 0 if buf is None else buf.numel() - 2)
        buf = torch.zeros(2 + 2 * cap, dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf, (buf.numel() - 2) // 2


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------

def _launch(kernel, before, after, flags, plan: PersistentPlan, cfg: PersistentConfig, device) -> None:
    """One persistent launch (PHASE 0) on a GPU whose residency is known; two launches otherwise (PHASE 1, 2:
    the interpreter, or a driver without the occupancy query). The kernel's arguments are
    (*before, rounds, lag, *after)."""
    programs = min(plan.n_items, cfg.sms * cfg.programs_per_sm)
    if device.type == "cuda" and not INTERPRET:
        rounds, lag = _rounds_and_lag(plan, programs, cfg.extra_lag)
        resident = _programs(kernel, (*before, rounds, lag, *after), dict(flags, PHASE=0), cfg.sms,
                             cfg.programs_per_sm)
        if resident > 0:
            programs = min(plan.n_items, resident)
            rounds, lag = _rounds_and_lag(plan, programs, cfg.extra_lag)
            kernel[(programs,)](*before, rounds, lag, *after, PHASE=0, **flags)
            return
    rounds = cdiv(plan.n_items, programs)
    for phase in (1, 2):
        kernel[(programs,)](*before, rounds, 0, *after, PHASE=phase, **flags)


def _setup(x, num_groups, inputs, cfg: PersistentConfig, alloc):
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg = c // num_groups
    cl = x.stride(1) == 1 and hw > 1
    plan = persistent_plan(n, num_groups, cpg, hw, cl, x.element_size(), inputs, cfg.sms * cfg.programs_per_sm, cfg)
    part = alloc((plan.n_items, plan.block_g, 2), torch.float32, x.device)
    sync, cap = sync_buffer(x.device, n * plan.units_per_sample)
    blocks = dict(BLOCK_C=plan.block_c, BLOCK_HW=plan.block_hw, BLOCK_G=plan.block_g,
                  BLOCK_K=max(1, min(next_power_of_2(plan.per_unit), UNIT_SUM_ELEMENTS // plan.block_g)),
                  STAGES=cfg.stages, num_warps=plan.num_warps)
    geometry = (hw, cpg, num_groups, plan.gb, plan.units_per_sample, plan.per_unit, plan.n_chunks, plan.chunk_hw,
                plan.n_items, cap)
    return plan, part, sync, blocks, geometry


def persistent_forward(x, r, weight, bias, y, mean, rstd, strides, has_residual, num_groups, eps, activation,
                       cfg: PersistentConfig, alloc):
    """y, mean, rstd written in place. x, r, y: (N, C, *spatial) with strides = ((sx), (sr), (sy)) from
    group_norm._nchw_strides; activation: the kernels' code; alloc(shape, dtype, device) for fp32 buffers."""
    sx, sr, sy = strides
    inputs = 2 if has_residual and sr[2] != 0 else 1
    plan, part, sync, blocks, geometry = _setup(x, num_groups, inputs, cfg, alloc)
    dummy = x   # stands in for absent weight / bias (HAS_* is False: never touched)
    w, b = dummy if weight is None else weight, dummy if bias is None else bias
    cpg, hw = geometry[1], geometry[0]
    flags = dict(HAS_RESIDUAL=has_residual, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                 ACTIVATION=activation, **blocks)
    _launch(_persistent_fwd_kernel, (x, r, w, b, y, part, mean, rstd, sync, *geometry),
            (cfg.spin_limit, float(cpg * hw), float(eps), *sx, *sr, *sy), flags, plan, cfg, x.device)


def persistent_backward(dy, x, r, weight, bias, mean, rstd, dx, strides, has_residual, num_groups, activation,
                        compute_dw, compute_db, dres_in_kernel, cfg: PersistentConfig, alloc):
    """dx written in place; returns (dw_part, db_part, dres_part), each [N, chunks, C] fp32 or None: the
    per-channel sums of dz x_hat, dz and dx over each chunk's pixels."""
    sx, sr, sdy, sdx = strides
    inputs = 3 if has_residual and sr[2] != 0 else 2
    plan, part, sync, blocks, geometry = _setup(x, num_groups, inputs, cfg, alloc)
    n, c = x.shape[0], x.shape[1]
    cpg, hw = geometry[1], geometry[0]
    parts = [alloc((n, plan.n_chunks, c), torch.float32, x.device) if want else None
             for want in (compute_dw, compute_db, dres_in_kernel)]
    dummy = mean   # stands in for absent tensors (HAS_* / COMPUTE_* is False: never touched)
    w, b = dummy if weight is None else weight, dummy if bias is None else bias
    flags = dict(HAS_RESIDUAL=has_residual, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                 ACTIVATION=activation, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, HAS_DRES=dres_in_kernel,
                 **blocks)
    _launch(_persistent_bwd_kernel,
            (x, r, dy, w, b, mean, rstd, part, sync, dx, *(dummy if t is None else t for t in parts), c, *geometry),
            (cfg.spin_limit, float(cpg * hw), *sx, *sr, *sdy, *sdx), flags, plan, cfg, x.device)
    return parts
