"""Where flash_fwd_hopper's Gluon forward runs and with which tiles: the configs per (head dim, mask) and key-loop
length, measured against flash_fwd's Triton kernels (benchmarks/NOTES.md under each session), the grid rules, and
the varlen routing. flash_fwd_hopper re-exports these names (flash_fwd calls them through it, and tests patch them
there)."""

from __future__ import annotations

from typing import Optional

from .._triton import cdiv

_WARP_SPECIALIZED = dict(CONSUMERS=2, BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, Q_STAGES=2, num_warps=4,
                         CONSUMER_REGS=240, SPLIT_PV_WAIT=False, O_FROM_REGS=False, TAIL_DIM=0)

# (head dim, right window / causal) -> ((shortest key loop, config), ...): where this kernel measured faster than
# flash_fwd's (bf16, 16384 tokens, model dim 2048, CUDA-graph timed; the numbers are in benchmarks/NOTES.md under each
# session and in this file's history). A call takes the last entry whose key loop is at most seqlen_k.
# - hd128 without a mask: persistent, two Q slots (session 17, H200: 513-620 TFLOP/s at S = 512..16K, one slot 461-605,
#   cuDNN 472-602).
# - hd128 causal: paired row blocks, one Q slot (session 17: 297-597, cuDNN 315-554); below 1K keys 64-key tiles with
#   3 stages and two Q slots, the lower warpgroup releasing the tile's unseen last block unread (session 27, H100: 328
#   vs 282 at S = 512); from 2K keys SPLIT_PV_WAIT, the softmax overlapping its own P V (session 30: +1-2% there,
#   0.5-5% slower at every other entry).
# - hd64 without a mask: two Q slots (session 17: 385-450, cuDNN 366-452); three consumer warpgroups (192-row tiles,
#   160 registers each) from 8K (475 / 478).
# - hd64 causal: 64-key tiles with 3 stages below 1K keys (session 23, H100: 255 vs 218 at 512), 128-key tiles with a
#   third stage at 1K (session 29: 307 vs 297 / 302), two stages from 2K.
# - Head dims padded to 256: _WIDE below (session 38).
# Tried and dropped (sessions 15-31): the next tile's first Q K^T beside this tile's last P V, the key loop split at
# its first masked block, three consumers causal (ptxas spills 408 bytes), 128 x 64 key tiles elsewhere, 4 stages,
# ping-pong turns, per-warp K / V releases. ptxas, two consumers: 168 registers at launch (12 warps), 240 per consumer
# warpgroup, no spill (16 bytes at hd128 causal); 225 KB of shared memory at hd128 with two Q slots. Three: 128 at
# launch (16 warps), 160 per consumer.
_THREE_CONSUMERS = dict(_WARP_SPECIALIZED, CONSUMERS=3, BLOCK_M=192, CONSUMER_REGS=160)
# Head dims padded to 256 (session 38): Q 2 x 32 KB and K / V 2 x 2 x 32 KB fill 192 KB of shared memory, so one Q slot
# per consumer, 64-key tiles and O stored from registers.
# H100, S = 1K / 2K / 4K, CUDA-graph timed (`results/h100-2026-11-24-s38/c2`): hd256 513 / 571 / 603 (causal 392 /
# 488 / 550) vs Triton's 362 / 377 / 392 and cuDNN's 574 / 615 / 623; hd160 368 / 407 / 418 vs 301 / 342 / 365 (cuDNN
# 470-511).
_WIDE = dict(_WARP_SPECIALIZED, BLOCK_N=64, Q_STAGES=1, O_FROM_REGS=True)
# Head dims 129..160 and 161..192 (session 43): 128 columns plus a 32- / 64-column tail in tiles of their own
# (forward_head_dim), instead of 256; O from registers (two accumulators). H100, S = 1K / 2K / 4K, CUDA-graph timed
# (`results/h100-2026-11-24-s43/c1`): hd160 128-key tiles 504 / 565 / 611 (causal 355 / 446 / 516), 64-key tiles
# 466-540, padded to 256 379-430, cuDNN 468 / 497 / 522 (350 / 414 / 455); hd192 64-key tiles 499 / 539 / 572 (366 /
# 447 / 501), padded 423-498, cuDNN 543 / 599 / 632 (412 / 485 / 529). 128-key tiles at hd192 need 240 KB.
_TAIL_32 = dict(_WARP_SPECIALIZED, BLOCK_N=128, Q_STAGES=1, O_FROM_REGS=True, TAIL_DIM=32)
_TAIL_64 = dict(_WARP_SPECIALIZED, BLOCK_N=64, Q_STAGES=1, O_FROM_REGS=True, TAIL_DIM=64)
# Head dims 65..80 and 81..96 (session 46): 64 columns plus a 16- / 32-column tail, instead of 128; O's first 64
# columns leave through the O slots by TMA, the tail from registers; a third K / V stage. H100, bf16, 16384 tokens,
# CUDA-graph timed, S = 512 / 1K / 2K / 4K / 8K (`results/h100-2026-11-24-s46/c1`): hd80 409 / 427 / 445 / 464 / 477
# (padded to 128: 359 / 381 / 391 / 403 / 415; cuDNN 330-406), causal 259 (64-key tiles) / 317 / 377 / 421 / 450 (one Q
# slot, two stages from 2K: 373 / 405 / 426 with three); hd96 410 / 456 / 496 / 520 / 531 (412 / 438 / 465 / 480 /
# 486; cuDNN 371-481), causal 263 / 344 / 414 / 464 / 491. hd72 (DiT) as hd80: 1.12-1.17x padded, 1.16-1.27x cuDNN.
# Three consumers spill (156 / 392 bytes, ptxas offline). Odd row-block counts (`c2`, S = 1152 / 4224): two stages,
# hd80 292 / 398 (three: 285 / 399), hd96 314 / 431 (306 / 423; cuDNN 320 / 390).
_NARROW_TAIL_16 = dict(_WARP_SPECIALIZED, NUM_STAGES=3, TAIL_DIM=16)
_NARROW_TAIL_32 = dict(_WARP_SPECIALIZED, NUM_STAGES=3, TAIL_DIM=32)
# Key loops of 128..384 (session 47; DiT-XL/2 at 256x256 attends over 256 tokens at hd72): each width's 512-key
# config, run at S = 128 / 256 / 384 (8192 tokens, 16 heads, fp16, CUDA-graph timed, `results/h100-2026-11-24-s47/
# c2`) against flash_fwd's kernels there, TFLOP/s, ours / Triton's / cuDNN's at S = 256: hd64 282 / 213 / 277 (causal
# 153 / 114 / 146), hd72 232 / 165 / 198 (127 / 103 / 111), hd96 285 / 205 / 274, hd128 332 / 216 / 322 (164 / 135 /
# 165), hd160 253 / 216 / 278, hd192 258 / 157 / 320, hd256 267 / 169 / 332 (129 / 113 / 177). The entries start
# where ours measured faster: 128 keys without a mask (hd160: 256), 256 causal (hd160: 512, 127 vs 130); odd causal
# row-block counts (one tile per program) at 384 for hd128 / hd160 (201 vs 173, 180 vs 168), 128 for hd192 / hd256,
# not below 512 at 65..96 (S = 384: 120 vs 128). 64-key tiles were within 2% of these or slower but for hd128 odd causal
# at 384 (211).
HOPPER_CONFIGS = {
    (64, False): ((128, dict(_WARP_SPECIALIZED, PERSISTENT=True)), (8192, dict(_THREE_CONSUMERS, PERSISTENT=True))),
    (64, True): ((256, dict(_WARP_SPECIALIZED, PERSISTENT=True, BLOCK_N=64, NUM_STAGES=3)),
                 (1024, dict(_WARP_SPECIALIZED, PERSISTENT=True, NUM_STAGES=3)),
                 (2048, dict(_WARP_SPECIALIZED, PERSISTENT=True))),
    (128, False): ((128, dict(_WARP_SPECIALIZED, PERSISTENT=True)), ),
    (128, True): ((256, dict(_WARP_SPECIALIZED, PERSISTENT=True, BLOCK_N=64, NUM_STAGES=3)),
                  (1024, dict(_WARP_SPECIALIZED, PERSISTENT=True, Q_STAGES=1)),
                  (2048, dict(_WARP_SPECIALIZED, PERSISTENT=True, Q_STAGES=1, SPLIT_PV_WAIT=True))),
    (80, False): ((128, dict(_NARROW_TAIL_16, PERSISTENT=True)), ),
    (80, True): ((256, dict(_NARROW_TAIL_16, PERSISTENT=True, BLOCK_N=64)),
                 (1024, dict(_NARROW_TAIL_16, PERSISTENT=True)),
                 (2048, dict(_NARROW_TAIL_16, PERSISTENT=True, NUM_STAGES=2, Q_STAGES=1))),
    (96, False): ((128, dict(_NARROW_TAIL_32, PERSISTENT=True)), ),
    (96, True): ((256, dict(_NARROW_TAIL_32, PERSISTENT=True, BLOCK_N=64)),
                 (1024, dict(_NARROW_TAIL_32, PERSISTENT=True))),
    (160, False): ((256, dict(_TAIL_32, PERSISTENT=True)), ),
    (160, True): ((512, dict(_TAIL_32, PERSISTENT=True)), ),
    (192, False): ((128, dict(_TAIL_64, PERSISTENT=True)), ),
    (192, True): ((256, dict(_TAIL_64, PERSISTENT=True)), ),
    (256, False): ((128, dict(_WIDE, PERSISTENT=True)), ),
    (256, True): ((256, dict(_WIDE, PERSISTENT=True)), ),
}
# Causal with an odd number of row blocks (no pairs): one tile per program, heaviest first, where it measured faster
# than Triton's kernel (sessions 15-17: hd128 from 512 keys, hd64 from 4096).
HOPPER_ODD_CAUSAL_CONFIGS = {
    64: ((4096, dict(_WARP_SPECIALIZED, PERSISTENT=False, Q_STAGES=1)), ),
    80: ((512, dict(_NARROW_TAIL_16, PERSISTENT=False, Q_STAGES=1, NUM_STAGES=2)), ),
    96: ((512, dict(_NARROW_TAIL_32, PERSISTENT=False, Q_STAGES=1, NUM_STAGES=2)), ),
    128: ((384, dict(_WARP_SPECIALIZED, PERSISTENT=False, Q_STAGES=1)), ),
    160: ((384, dict(_TAIL_32, PERSISTENT=False)), ),
    192: ((128, dict(_TAIL_64, PERSISTENT=False)), ),
    256: ((128, dict(_WIDE, PERSISTENT=False)), ),
}


# Grids: this kernel from MIN_WAVE waves of tiles (BLOCK_M rows of one head), persistent from MIN_WAVE waves of units
# (causal pairs two tiles per unit), one tile per program in between. Measured on an H100 (session 23, `results/
# h100-2026-11-23-s23/c1`, CUDA-graph timed, TFLOP/s, persistent / one tile per program / flash_fwd's pointer kernel /
# cuDNN): B1 H32 hd128 causal S = 1024 (256 tiles, 128 units) 414 / 275 / 161 / 276, S = 512 (128 tiles, 64 units)
# 144 / 180 / 158 / 169; B1 H32 hd128 S = 512 (128 tiles) 374 / 380 / 306 / 347, S = 1024 555 / 491 / 255 / 516;
# B1 H16 hd64 S = 2048 (256 tiles) 422 / 401 / 337 / 417, S = 512 (64 tiles) 118 / 120 / 129 / 116: half a wave of
# 128-row tiles stays with the pointer kernel's 64-row ones.
MIN_WAVE = 0.9


def hopper_forward_config(head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int, programs_per_row_block: int,
                          num_sms: int, left_window: bool = False, tail: bool = True, dropout: bool = False):
    """This file's config for a call, or None where flash_fwd's kernels measured faster: head dims and masks
    without a HOPPER_CONFIGS entry, key loops shorter than the entry's, grids under MIN_WAVE waves of tiles. Causal
    calls whose row blocks do not pair up take HOPPER_ODD_CAUSAL_CONFIGS; persistent configs whose units fill under
    MIN_WAVE waves run one tile per program. A left window or dropout takes two consumer warpgroups (three spill 160
    bytes with the window's mask, ptxas offline, session 37; with dropout's draws hd64 at 8K keys ran 178 TFLOP/s
    against two's ~265, session 51). tail=False: head dims 129..192 padded to 256 (varlen_config)."""
    width = forward_head_dim(head_dim) if tail else kernel_head_dim(head_dim)
    config = _table_entry(HOPPER_CONFIGS.get((width, causal), ()), seqlen_k)
    if causal and cdiv(seqlen_q, _WARP_SPECIALIZED["BLOCK_M"]) % 2:      # every causal entry has 128-row tiles
        config = _table_entry(HOPPER_ODD_CAUSAL_CONFIGS.get(width, ()), seqlen_k)
    if config is None:
        return None
    if (left_window or dropout) and config["CONSUMERS"] == 3:
        config = dict(config, **{key: _WARP_SPECIALIZED[key] for key in ("CONSUMERS", "BLOCK_M", "CONSUMER_REGS")})
    tiles = cdiv(seqlen_q, config["BLOCK_M"]) * programs_per_row_block
    if tiles < MIN_WAVE * num_sms:
        return None
    units = tiles // 2 if causal and config["PERSISTENT"] else tiles
    if config["PERSISTENT"] and units < MIN_WAVE * num_sms:
        return dict(config, PERSISTENT=False, Q_STAGES=1)
    return dict(config)


def kernel_head_dim(head_dim: int) -> Optional[int]:
    """The head dim that this file's kernel and flash_bwd_hopper's compute with for inputs of head_dim: 64 for 33..64,
    128 for 65..128, 256 for 129..256, else None (the forward computes 65..96 narrower and both compute 129..192
    narrower, but for varlen: forward_head_dim). The
    descriptors keep the tensors' own head dim with boxes of the kernel's, so TMA zero-fills the padding columns on
    loads and drops them on stores: no copies, and zero columns add nothing to Q K^T, P V or any gradient. SD's head
    dims 40, 80 and 160 and DiT's 72 run so (Triton's kernels there, H100, S = 2048: forward 0.67-0.90x cuDNN, backward
    0.39-0.82x at 40..96 and 0.46x at 160; sessions 36 and 38)."""
    if 32 < head_dim <= 64:
        return 64
    if 64 < head_dim <= 128:
        return 128
    if 128 < head_dim <= 256:
        return 256
    return None


def forward_head_dim(head_dim: int) -> Optional[int]:
    """The width the forward computes for inputs of head_dim (its HOPPER_CONFIGS key): 80 for 65..80 and 96 for 81..96
    (64 columns, then a tail box of 16 / 32: TAIL_DIM; session 46), 160 for 129..160 and 192 for 161..192 (128 columns,
    then a tail box of 32 / 64; session 43), else kernel_head_dim's 64 / 128 / 256. The backward
    (flash_bwd_hopper_configs.HOPPER_BWD_CONFIGS) takes the widths above 128 since session 44 and pads 65..96 to 128;
    varlen pads as kernel_head_dim says in both."""
    if 64 < head_dim <= 80:
        return 80
    if 80 < head_dim <= 96:
        return 96
    if 128 < head_dim <= 160:
        return 160
    if 160 < head_dim <= 192:
        return 192
    return kernel_head_dim(head_dim)


def main_width(head_dim: int, tail: int) -> int:
    """The width of the main part of a tile the Gluon kernels compute for inputs of head_dim: with a tail of `tail`
    columns (a config's TAIL_DIM), forward_head_dim's width less the tail (64 or 128), else kernel_head_dim's padded
    width (head_dim where there is none)."""
    return forward_head_dim(head_dim) - tail if tail else kernel_head_dim(head_dim) or head_dim


def _table_entry(entries, seqlen_k: int):
    """The config of the last (shortest key loop, config) entry whose key loop is at most seqlen_k, or None."""
    config = None
    for min_seqlen_k, entry in entries:
        if seqlen_k >= min_seqlen_k:
            config = entry
    return config


def varlen_config(head_dim: int, causal: bool, left_window: bool, max_seqlen_q: int, max_seqlen_k: int,
                  programs_per_row_block: int, num_sms: int, dropout: bool = False):
    """The config for a varlen call (sequences of at most max_seqlen_q / _k), or None: O stored from registers (a
    sequence's last row block reaches into the next sequence, which no TMA store may cover). Measured (session 39, H100,
    16384 tokens in sequences of [max / 8, max], kernel time): 1.1-1.3x the Triton kernel but at hd64 without a mask
    below 4K keys (0.91-0.96x: None there); one tile per program beyond hd64 (the hardware balances the unequal
    sequences; 1.0-1.16x the persistent grid)."""
    kernel_dim = kernel_head_dim(head_dim)
    if kernel_dim == 64 and not causal and max_seqlen_k < 4096:
        return None
    config = hopper_forward_config(head_dim, causal, max_seqlen_q, max_seqlen_k, programs_per_row_block, num_sms,
                                   left_window, tail=False, dropout=dropout)   # tail: _zero_rows takes one box
    if config is None:
        return None
    config["O_FROM_REGS"] = True
    if kernel_dim != 64:
        config.update(PERSISTENT=False, Q_STAGES=1)
    return config
