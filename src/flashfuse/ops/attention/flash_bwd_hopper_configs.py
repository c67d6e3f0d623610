"""The Gluon backward's tile configs per head dim (flash_bwd_hopper's kernel, flash_bwd_dq_hopper's pass), what they
measured, and which one a call takes. Moved out of flash_bwd_hopper.py (session 48) as they were."""

from __future__ import annotations

from . import flash_bwd_dq_hopper
from .flash_fwd_hopper_configs import forward_head_dim, kernel_head_dim

_CONFIG = dict(BLOCK_M=64, BLOCK_N=128, NUM_STAGES=2, SCORES_T=True, DQ_PASS=False, TAIL_DIM=0, num_warps=8)
_CONFIG_ROWS = dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, SCORES_T=False, DQ_PASS=False, TAIL_DIM=0, num_warps=8)
_CONFIG_WIDE = dict(BLOCK_M=64, BLOCK_N=64, NUM_STAGES=2, SCORES_T=False, DQ_PASS=True, TAIL_DIM=0, num_warps=8)

# head dim -> config; other head dims stay on flash_bwd's grid. bf16, 16384 tokens, model dim 2048, do_bench on the
# launchers, TFLOP/s at S = 1K / 2K / 8K. hd128 (H200, session 16): 429 / 479 / 527 (causal 319 / 402 / 503) vs the
# Triton grid's 346 / 382 / 421 (253 / 319 / 389) and cuDNN's 421 / 474 / 525 (313 / 389 / 492). hd64 (H100, session
# 22, `results/h100-2026-11-23-s22/c1`): row layout, 128-row blocks 337 / 388 / 444 (causal 239 / 313 / 418) vs the
# transposed 64-row blocks' 325 / 356 / 425 (235 / 305 / 364) and cuDNN's 345 / 397 / 450 (230 / 312 / 403). Session
# 45 (`results/h100-2026-11-24-s45/c3`, CUDA-graph timed, 3 rounds): S and dP split by queries 345 / 400 / 454 (causal
# 248 / 323 / 422) vs by keys 329 / 376 / 426 (239 / 312 / 401), cuDNN (eager) 337 / 383 / 438 (230 / 310 / 400).
# Slower: at hd64 3 stages (+-1%), 128-row blocks in the transposed layout (spills), a rotated query walk, P and dS
# behind one barrier (`c3`); a deferred dQ store (session 16). dQ issued before dK with its store beside dK's
# product crashes ptxas 3.6 (SIGSEGV) under some integer specializations (session 22, call 2). Head dims padded to
# 256 (H100, session 38, `results/h100-2026-11-24-s38/`, CUDA-graph timed, S = 1K / 2K / 4K), with the dQ pass (`c5`):
# 302 / 339 / 337 (causal 237 / 286 / 315) vs cuDNN's 285 / 333 / 324 (224 / 285 / 333); one pass adding dQ by atomics
# 230 / 250 / 260 (187 / 222 / 246), the Triton grid 171 / 180 / 187; one pass with no dQ at all 640 at 4K (`c3`).
# Head dims 129..160 / 161..192 (session 44): the wide config at 128 columns plus a 32- / 64-column tail (TAIL_DIM,
# as the forward's: forward_head_dim), in both passes. 65..80 (session 46): hd128's transposed layout at 64 columns
# plus a 16-column tail (dQ's tail reduce-added through slots and a descriptor of its own). Same process
# (`results/h100-2026-11-24-s46/c4`, graph-timed; cuDNN eager), S = 1K / 2K / 4K / 8K: hd80 307 / 346 / 367 / 385
# (causal 225 / 288 / 329 / 358) vs 287 / 317 / 338 / 346 (211 / 265 / 303 / 327) padded to 128, cuDNN 286 / 336 / 356 /
# 362 (214 / 271 / 304 / 344); hd72 1.05-1.10x padded. Three stages 0.92-0.99x two. At 81..96 the tail (32) measured
# 0.98-1.02x padded (hd96 330 / 366 / 395 / 411 vs 323 / 365 / 389 / 403): 96 stays padded.
HOPPER_BWD_CONFIGS = {64: _CONFIG_ROWS, 80: dict(_CONFIG, TAIL_DIM=16), 96: _CONFIG, 128: _CONFIG,
                      160: dict(_CONFIG_WIDE, TAIL_DIM=32), 192: dict(_CONFIG_WIDE, TAIL_DIM=64), 256: _CONFIG_WIDE}


# Under a softcap or ALiBi (session 48): hd64's row layout spills 160-172 bytes (the tanh's slope, 1 - t^2, is one
# more tile beside P while dP is in flight) / 144-188 (ALiBi's per-key vector; ptxas 3.6 offline), the transposed
# layout at 64 columns none: measured with a softcap 314 vs 293 TFLOP/s causal at 4K keys.
HOPPER_BWD_SCORE_MOD_CONFIGS = {64: _CONFIG}


def hopper_backward_config(head_dim: int, varlen: bool = False, score_mod: bool = False):
    """This file's config for a call, or None where flash_bwd's grid is used: head dims computed as
    flash_fwd_hopper.forward_head_dim says, or, varlen, padded as kernel_head_dim says (129..192 to 256: the
    producers' zeroing of rows past cu_seqlens[-1], _hopper_common._zero_rows, takes one box); score_mod (a softcap
    or ALiBi): the HOPPER_BWD_SCORE_MOD_CONFIGS entry where there is one."""
    width = (kernel_head_dim if varlen else forward_head_dim)(head_dim)
    config = (HOPPER_BWD_SCORE_MOD_CONFIGS.get(width) if score_mod else None) or HOPPER_BWD_CONFIGS.get(width)
    return None if config is None else dict(config)


def vector_block(config) -> int:
    """What lse2 / delta's rows are rounded up to: the largest query block that reads them (this kernel's, and with
    DQ_PASS the dQ pass's; powers of two)."""
    if config["DQ_PASS"]:
        return max(config["BLOCK_M"], flash_bwd_dq_hopper.dq_config(config["TAIL_DIM"])["BLOCK_M"])
    return config["BLOCK_M"]
