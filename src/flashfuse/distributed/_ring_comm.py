"""Point-to-point ring exchange for ring attention: every rank sends a buffer to the next rank and receives
one from the previous rank, asynchronously, so the transfer overlaps the attention kernels that run while
it is in flight.

    rank r:  send -> (r + 1) % world,  recv <- (r - 1) % world          (ranks of ``group``)

Both directions, of one or more tensors, are posted together with ``torch.distributed.batch_isend_irecv``
(one NCCL group call; on gloo, plain isend / irecv). Every rank posts its exchanges in the same order, so messages between a
pair of ranks match first-in first-out even when two exchanges (K/V forward, dK/dV backward) are in
flight at once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class RingComm:
    """The ring of ``group`` (None: the default group) seen from this rank."""

    def __init__(self, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # P2POp takes global ranks (group-local peers need torch >= 2.6; global ones work everywhere).
        next_rank, prev_rank = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        if group is None:
            self.next_global, self.prev_global = next_rank, prev_rank
        else:
            self.next_global = dist.get_global_rank(group, next_rank)
            self.prev_global = dist.get_global_rank(group, prev_rank)

    def exchange(self, sends: tuple) -> "PendingRecv":
        """Post, for each tensor of ``sends``, a send -> next rank and a receive of a tensor like it <- previous
        rank; returns at once. The tensors must be contiguous and stay unmodified until the returned
        handle's wait() (they are read asynchronously)."""
        recvs = tuple(torch.empty_like(t) for t in sends)
        ops = [dist.P2POp(dist.isend, t, self.next_global, self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.prev_global, self.group) for t in recvs]
        return PendingRecv(dist.batch_isend_irecv(ops), sends, recvs)


class PendingRecv:
    """An exchange in flight: wait() blocks (on NCCL: makes the current stream wait) and returns the
    received tensors. The send buffers are held until then so they are not freed while being read."""

    def __init__(self, works, sends, recvs):
        self._works, self._sends, self._recvs = works, sends, recvs

    def wait(self) -> tuple:
        for work in self._works:
            work.wait()
        recvs, self._works, self._sends, self._recvs = self._recvs, None, None, None
        return recvs
