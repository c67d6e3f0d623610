"""RESIDENT mode's host side (``group_norm.py`` routes to it when ``USE_RESIDENT`` is on): the launch plan of
units, chunk tiles and a co-resident grid (cached per shape), the per-unit arrival counters, and the launch
options. The kernels are in ``_resident.py``; the constants that feed the plan live in ``group_norm.py``."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from ..._env import INTERPRET
from .._triton import cdiv, next_power_of_2

MAX_WARPS = 16     # group_norm.py's cap on warps per program


class _ResidentPlan(NamedTuple):
    gb: int              # groups per unit
    block_c: int
    block_hw: int
    block_g: int
    n_cblocks: int
    n_pblocks: int
    n_units: int
    programs: int        # grid; 0: two launches (phase 1, phase 2) of one program per item
    num_warps: int
    maxnreg: int         # 0: none (interpreter, two-launch)


@functools.lru_cache(maxsize=1024)
def _resident_plan_cached(n, groups, cpg, hw, channels_contiguous, elt_bytes, chunk, per_warp, pps16,
                          min_run_bytes, sync, sms) -> _ResidentPlan:
    """Units, chunk tile and grid (cached per shape: the eager host path runs it every call)."""
    if channels_contiguous:
        # the unit size with the least register padding among runs of >= min_run_bytes (ties: fewer groups)
        best = None
        for gb in range(1, groups + 1):
            width = next_power_of_2(gb * cpg)
            if width > chunk or (gb * cpg * elt_bytes < min_run_bytes and gb < groups):
                continue
            eff = groups * cpg / (cdiv(groups, gb) * width)
            if best is None or eff > best[0]:
                best = (eff, gb, width)
        if best is None:
            best = (0, 1, next_power_of_2(cpg))
        _, gb, block_c = best
        block_c = min(block_c, chunk)
        block_hw = max(1, min(next_power_of_2(hw), chunk // block_c))
        n_cblocks = cdiv(gb * cpg, block_c)
    else:
        # one group per unit; a pixel run as long as the chunk allows, then the channel block (a power of
        # 2, masked past the group) that cuts the group into the fewest chunks
        gb = 1
        block_hw = min(next_power_of_2(hw), chunk)
        block_c, n_cblocks = 1, cpg
        bc = 2
        while bc <= min(next_power_of_2(cpg), chunk // block_hw):
            if cdiv(cpg, bc) < n_cblocks:
                block_c, n_cblocks = bc, cdiv(cpg, bc)
            bc *= 2
    n_pblocks = cdiv(hw, block_hw)
    k = n_cblocks * n_pblocks
    n_units = n * cdiv(groups, gb)
    warps = min(MAX_WARPS, max(1, block_c * block_hw // per_warp))
    # programs per SM at equal threads per SM; maxnreg makes that many fit in the 64K registers
    pps = max(1, min(16, pps16 * 16 // warps))
    maxnreg = min(255, 65536 // (pps * warps * 32)) // 8 * 8
    programs = 0
    items = n_units * k
    if sync or k == 1:
        # one launch: the k programs of a unit must be co-resident (a multiple of k programs in the grid,
        # at most what the SMs hold). In the interpreter only k == 1 (it runs programs one at a time).
        cap = sms * pps // k * k
        if cap > 0:
            programs = min(items, cap)
    if not sync:
        maxnreg = 0
    return _ResidentPlan(gb, block_c, block_hw, next_power_of_2(gb), n_cblocks, n_pblocks, n_units, programs,
                         warps, maxnreg)


_COUNTERS: dict = {}
_OUTGROWN_COUNTERS: list = []   # replaced buffers, kept alive for the graphs that captured them


def _counters(device: torch.device, size: int) -> Tensor:
    """Per-unit arrival counters (int32, zero between launches: the kernels reset them), one buffer per
    device and stream (two streams must not share counters). Grown, never freed: a captured CUDA graph
    keeps using the buffer it saw."""
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < size:
        if buf is not None:
            _OUTGROWN_COUNTERS.append(buf)
        buf = torch.zeros(max(size, 4096, 0 if buf is None else 2 * buf.numel()), dtype=torch.int32,
                          device=device)
        _COUNTERS[key] = buf
    return buf


def _launch_opts(plan: _ResidentPlan) -> dict:
    opts = dict(num_warps=plan.num_warps)
    if plan.maxnreg and not INTERPRET:
        opts["maxnreg"] = plan.maxnreg
    return opts
