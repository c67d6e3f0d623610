"""Ring attention (context parallelism): exact attention over a sequence sharded across the ranks of a
process group, forward and backward, on flashfuse's FlashAttention kernels.

Layout and sharding
-------------------
Every rank holds the same number L of tokens: q (B, L, Hq, D), k, v (B, L, Hk, D). Two layouts of the
global sequence (S = world * L tokens) are supported:
- "zigzag" (default): the sequence is cut into 2 * world chunks of c = L / 2 tokens; rank r holds chunks
  r and 2 * world - 1 - r, in that order (``zigzag_shard``). Under a causal mask every rank then does
  the same amount of work (one early and one late chunk each).
- "contiguous": rank r holds tokens [r * L, (r + 1) * L) (``x.chunk(world, dim=1)[r]``). Fine without a
  mask; under a causal mask the last rank does world times the work of the first.
A local piece of sequence is a list of segments (local start, length, global offset).

Ring
----
K/V blocks travel around the ring: at step s (0 .. world-1) rank r holds the K/V of rank
src = (r - s) mod world; it posts the exchange that brings the next block (send to r + 1, receive from
r - 1) *before* computing on the current one, so the transfer overlaps the kernels.

Which keys a query sees (global positions i', j'; causal is right = 0; -1 = unbounded):

    j' visible to i'  <=>  i' - left <= j' <= i' + right

For a query segment (global offset Oq, length Lq) and a key segment (Ok, Lk), with local indices
i' = Oq + i, j' = Ok + j and d = Oq - Ok:   i + d - left <= j <= i + d + right.
The kernels take a top-left aligned window (bottom_right=False: j visible iff i - wl <= j <= i + wr), so
wl = left - d and wr = right + d. Those can be negative, and the kernels read any negative value as
"unbounded"; so the pair is first trimmed to the rows and columns that see anything:

    rows i in [max(0, -d - right), min(Lq, Lk - d + left))        (nothing visible elsewhere)
    cols j in [max(0, r0 + d - left), min(Lk, r1 - 1 + d + right + 1))

and d becomes d + r0 - c0. In the trimmed rectangle both wl and wr are >= 0: the first row's window
starts at the first column (wl >= 0) and holds at least one column (wr >= 0). An empty range means no
kernel launch at all. A bound that masks nothing in the rectangle (wl >= rows - 1, wr >= cols - 1) is
dropped to -1, so fully visible blocks take the kernels' unmasked path. Adjacent fully visible pieces
are fused into one launch (zigzag causal: one launch per step past the first, three on the first).

Forward merge (fp32, per query row; o_b, lse_b of one launch, natural-log LSE):

    lse   = logaddexp(lse_acc, lse_b)
    o_acc = exp(lse_acc - lse) * o_acc + exp(lse_b - lse) * o_b

The kernels write lse = +inf for a row with no visible key; the merge reads it as -inf (no mass), and a
row that saw no key anywhere keeps o = 0 (the weights are set to 0, never NaN) and returns lse = +inf,
flash_attn_func's convention. (A valid window always shows a query itself, so that needs an empty shard.)

Backward (the standard ring-attention backward): with the final O and LSE, P_ij = exp(s_ij - lse_i)
is exact for every (query, key) pair, and delta_i = rowsum(dO_i * O_i) is global, so each launch of
flash_attn_backward(dO, Q, K_blk, V_blk, O, LSE) with the pair's window gives exact partial gradients:

    dQ  = sum over blocks of dQ_blk                      (local fp32 accumulator; partials come in fp32)
    dK_blk, dV_blk = sum over ranks of their partials    (fp32 buffers that travel with the block)

The dK/dV buffers follow their K/V block around the ring: at step s rank r adds its partials to the
buffer received from r - 1 (posted after r - 1's step s - 1, waited after r's own kernels of step s) and
sends the sum on; after the last step one more hop brings every block's full gradient home.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from ..ops.attention.flash_bwd import flash_attn_backward
from ..ops.attention.flash_fwd import flash_attn_forward
from ..ops.attention.interface import _check_options, _check_qkv
from ._ring_comm import RingComm

LAYOUTS = ("zigzag", "contiguous")


# ----------------------------------------------------------------------------------------------------
# Sharding helpers
# ----------------------------------------------------------------------------------------------------

def zigzag_shard(x: Tensor, rank: int, world_size: int, dim: int = 1) -> Tensor:
    """Rank ``rank``'s zig-zag shard of the full sequence ``x`` along ``dim``: of 2 * world_size equal
    chunks, chunk rank and chunk 2 * world_size - 1 - rank, concatenated (a new tensor).

    Example: 8 tokens on 2 ranks -> rank 0 holds tokens [0, 1, 6, 7], rank 1 holds [2, 3, 4, 5]."""
    if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r} / world_size {world_size!r}; supported: ints with 0 <= rank < world_size")
    seqlen = x.shape[dim]
    if seqlen % (2 * world_size):
        raise ValueError(f"x has {seqlen} tokens along dim {dim}; zig-zag sharding needs a multiple of "
                         f"2 * world_size = {2 * world_size}")
    chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat((chunks[rank], chunks[2 * world_size - 1 - rank]), dim=dim)


def zigzag_unshard(shards, dim: int = 1) -> Tensor:
    """The inverse of zigzag_shard: the full sequence from the shards of ranks 0 .. world-1 (in order)."""
    world_size = len(shards)
    if world_size == 0:
        raise ValueError("shards is empty; pass the shards of ranks 0 .. world_size-1 in order")
    halves = [s.chunk(2, dim=dim) for s in shards]
    if any(s.shape[dim] % 2 for s in shards):
        raise ValueError(f"shard lengths {[s.shape[dim] for s in shards]} along dim {dim}; zig-zag shards "
                         "have an even number of tokens")
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)


def _segments(layout: str, rank: int, world_size: int, seqlen: int) -> tuple:
    """The local sequence of ``rank`` as segments (local start, length, global offset)."""
    if layout == "contiguous":
        return ((0, seqlen, rank * seqlen),)
    c = seqlen // 2
    return ((0, c, rank * c), (c, c, (2 * world_size - 1 - rank) * c))


# ----------------------------------------------------------------------------------------------------
# Planning: which kernel launches one (query shard, key block) pair needs
# ----------------------------------------------------------------------------------------------------

def _pair_launch(q_seg, k_seg, left: int, right: int):
    """(q_lo, q_hi, k_lo, k_hi, window_left, window_right), local and top-left aligned, for one query
    segment against one key segment; None when no query sees any key (see the comment at the top)."""
    q_start, len_q, off_q = q_seg
    k_start, len_k, off_k = k_seg
    d = off_q - off_k                          # j visible to i  <=>  i + d - left <= j <= i + d + right
    r0, r1 = 0, len_q
    if right >= 0:
        r0 = max(r0, -d - right)
    if left >= 0:
        r1 = min(r1, len_k - d + left)
    if r0 >= r1:
        return None
    c0 = max(0, r0 + d - left) if left >= 0 else 0
    c1 = min(len_k, r1 + d + right) if right >= 0 else len_k
    d += r0 - c0
    wl = left - d if left >= 0 and left - d < r1 - r0 - 1 else -1
    wr = right + d if right >= 0 and right + d < c1 - c0 - 1 else -1
    return (q_start + r0, q_start + r1, k_start + c0, k_start + c1, wl, wr)


def _plan(q_segs, k_segs, left: int, right: int) -> list:
    """Every launch for the query shard against one key block, fully visible neighbours fused."""
    launches = [p for qs in q_segs for ks in k_segs if (p := _pair_launch(qs, ks, left, right)) is not None]
    fused = True
    while fused:
        fused = False
        for a in launches:
            for b in launches:
                if a is b or a[4:] != (-1, -1) or b[4:] != (-1, -1):
                    continue
                if a[:2] == b[:2] and a[3] == b[2]:           # same rows, adjacent key columns
                    merged = (a[0], a[1], a[2], b[3], -1, -1)
                elif a[2:4] == b[2:4] and a[1] == b[0]:       # same columns, adjacent query rows
                    merged = (a[0], b[1], a[2], a[3], -1, -1)
                else:
                    continue
                launches = [p for p in launches if p is not a and p is not b] + [merged]
                fused = True
                break
            if fused:
                break
    return sorted(launches)


def ring_plans(layout: str, rank: int, world_size: int, seqlen: int, left: int, right: int) -> list:
    """plans[step]: the launches of ``rank`` at ring step ``step`` (holding rank (rank - step)'s K/V)."""
    q_segs = _segments(layout, rank, world_size, seqlen)
    return [_plan(q_segs, _segments(layout, (rank - step) % world_size, world_size, seqlen), left, right)
            for step in range(world_size)]


# ----------------------------------------------------------------------------------------------------
# Forward and backward rings
# ----------------------------------------------------------------------------------------------------

def _merge(out_acc: Tensor, lse_acc: Tensor, out: Tensor, lse: Tensor) -> None:
    """Fold one launch's (out (B, M, Hq, D), lse (B, Hq, M)) into the fp32 accumulators, in place."""
    lse = lse.masked_fill(lse == float("inf"), float("-inf"))          # kernel: +inf = no visible key
    new = torch.logaddexp(lse_acc, lse)
    safe = new.masked_fill(new == float("-inf"), 0.0)                 # nothing seen yet: both weights 0
    w_acc = torch.exp(lse_acc - safe).transpose(1, 2).unsqueeze(-1)    # (B, M, Hq, 1)
    w_new = torch.exp(lse - safe).transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_acc).add_(out.float() * w_new)
    lse_acc.copy_(new)


def ring_attn_forward(q, k, v, comm: RingComm, plans, *, softmax_scale: float, softcap: float = 0.0):
    """The forward ring on validated, last-dim-contiguous inputs. Returns (out in q's dtype, lse
    (B, Hq, L) fp32, +inf for rows that saw no key)."""
    out_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse_acc = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=torch.float32,
                         device=q.device)
    kv = (k.contiguous(), v.contiguous())                              # P2P sends need dense buffers
    for step, launches in enumerate(plans):
        pending = comm.exchange(kv) if step + 1 < len(plans) else None  # next block, in flight meanwhile
        k_blk, v_blk = kv
        for q0, q1, k0, k1, wl, wr in launches:
            o, lse = flash_attn_forward(q[:, q0:q1], k_blk[:, k0:k1], v_blk[:, k0:k1],
                                        softmax_scale=softmax_scale, window_left=wl, window_right=wr,
                                        bottom_right=False, softcap=softcap)
            _merge(out_acc[:, q0:q1], lse_acc[:, :, q0:q1], o, lse)
        if pending is not None:
            kv = pending.wait()
    lse_acc.masked_fill_(lse_acc == float("-inf"), float("inf"))
    return out_acc.to(q.dtype), lse_acc


def ring_attn_backward(dout, q, k, v, out, lse, comm: RingComm, plans, *, softmax_scale: float,
                       softcap: float = 0.0, deterministic: bool = False):
    """The backward ring: (dq, dk, dv) of this rank's shard, in the inputs' dtypes."""
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = (k.contiguous(), v.contiguous())
    pending_dkv = None
    for step, launches in enumerate(plans):
        pending_kv = comm.exchange(kv) if step + 1 < len(plans) else None
        k_blk, v_blk = kv
        dk_acc = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv_acc = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for q0, q1, k0, k1, wl, wr in launches:
            dq, dk, dv = flash_attn_backward(
                dout[:, q0:q1], q[:, q0:q1], k_blk[:, k0:k1], v_blk[:, k0:k1], out[:, q0:q1],
                lse[:, :, q0:q1], softmax_scale=softmax_scale, window_left=wl, window_right=wr,
                bottom_right=False, softcap=softcap, deterministic=deterministic, fp32_grads=True)
            dq_acc[:, q0:q1] += dq
            dk_acc[:, k0:k1] += dk
            dv_acc[:, k0:k1] += dv
        if pending_dkv is not None:                  # the partial sums of this block from earlier ranks
            dk_prev, dv_prev = pending_dkv.wait()
            dk_acc += dk_prev
            dv_acc += dv_prev
        if len(plans) > 1:                           # on to the next holder (after the last step: home)
            pending_dkv = comm.exchange((dk_acc, dv_acc))
        if pending_kv is not None:
            kv = pending_kv.wait()
    if pending_dkv is not None:
        dk_acc, dv_acc = pending_dkv.wait()
    return dq_acc.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)


class RingFlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm, plans, softmax_scale, softcap, deterministic):
        out, lse = ring_attn_forward(q, k, v, comm, plans, softmax_scale=softmax_scale, softcap=softcap)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.plans = comm, plans
        ctx.options = dict(softmax_scale=softmax_scale, softcap=softcap, deterministic=deterministic)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        dq, dk, dv = ring_attn_backward(dout, q, k, v, out, lse, ctx.comm, ctx.plans, **ctx.options)
        return dq, dk, dv, None, None, None, None, None


# ----------------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------------

@torch.compiler.disable
def ring_flash_attn_func(q, k, v, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                         softcap=0.0, layout="zigzag", dropout_p=0.0, alibi_slopes=None,
                         deterministic=False, return_attn_probs=False):
    """Exact attention over a sequence sharded across the ranks of ``group`` (ring / context parallel).

    Shapes (this rank's shard of L tokens; every rank passes the same shapes):
    q (batch, L, nheads_q, headdim); k, v (batch, L, nheads_k, headdim), nheads_q a multiple of nheads_k.
    The result equals ``flash_attn_func`` on the gathered sequence, sharded the same way, for the output
    and for the gradients of q, k and v.

    layout: "zigzag" (default; build shards with ``zigzag_shard(x, rank, world_size)``: rank r holds
    chunks r and 2*world-1-r of 2*world equal chunks, so L must be even; balanced under a causal mask)
    or "contiguous" (rank r holds tokens [r*L, (r+1)*L): ``x.chunk(world_size, dim=1)[rank]``).
    causal / window_size (left, right) act on global positions: query i' sees keys
    [i' - left, i' + right] (-1 = unbounded; causal sets right = 0). softmax_scale (default
    1/sqrt(headdim)) and softcap as in flash_attn_func. deterministic=True: the ring's sums run in a fixed
    order and the kernels' backward without atomics, so gradients repeat bit for bit; False (the default) lets
    Hopper GPUs add dQ with atomics (flash_attn_func's rule).
    Not supported: dropout_p > 0, alibi_slopes (NotImplementedError).

    K/V travel around the ring with torch.distributed P2P (batch_isend_irecv), overlapped with the
    kernels; partial outputs merge exactly through their log-sum-exp (docs/distributed.md has the math).
    Runs eagerly (torch.compile graph-breaks around it: it talks to other processes).

    Returns out (batch, L, nheads_q, headdim) in q's dtype, or with return_attn_probs=True
    ``(out, softmax_lse (batch, nheads_q, L) fp32 natural log over the whole sequence, None)``.

    Example (2 ranks, torchrun --nproc-per-node 2)::

        dist.init_process_group("nccl"); rank, world = dist.get_rank(), dist.get_world_size()
        q, k, v = (zigzag_shard(t, rank, world) for t in (q_full, k_full, v_full))  # (B, S/world, H, D)
        out = ring_flash_attn_func(q, k, v, causal=True)     # rank's zig-zag shard of the full output
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout is {layout!r}; supported: 'zigzag' or 'contiguous'")
    if isinstance(dropout_p, (int, float)) and dropout_p != 0:
        raise NotImplementedError(f"dropout_p is {dropout_p}; ring_flash_attn_func supports only "
                                  "dropout_p=0 (attention dropout is not implemented across the ring)")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes is not supported by ring_flash_attn_func (ALiBi needs the "
                                  "global query/key distance inside the kernel); pass alibi_slopes=None")
    _check_qkv(q, k, v, varlen=False)
    seqlen = q.shape[1]
    if k.shape[1] != seqlen:
        raise ValueError(f"k has {k.shape[1]} tokens but q has {seqlen}; in ring attention each rank holds "
                         "q, k and v of the same tokens (self-attention over the sharded sequence)")
    if seqlen == 0 or (layout == "zigzag" and seqlen % 2):
        raise ValueError(f"q has {seqlen} tokens per rank; layout {layout!r} needs "
                         f"{'an even number >= 2 (two zig-zag chunks)' if layout == 'zigzag' else '>= 1'}")
    scale, left, right, softcap, _ = _check_options(
        q, batch=q.shape[0], dropout_p=0.0, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=None)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"group is {group!r} but torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group(...) first (ring attention needs a process group)")
    comm = RingComm(group)
    plans = ring_plans(layout, comm.rank, comm.world_size, seqlen, left, right)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out, lse = RingFlashAttnFunction.apply(q, k, v, comm, plans, scale, softcap, bool(deterministic))
    return (out, lse, None) if return_attn_probs else out
