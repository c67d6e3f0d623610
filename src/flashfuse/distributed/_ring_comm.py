"""Point-to-point ring exchange for ring attention: every rank sends a buffer to the next rank and receives
one from the previous rank, asynchronously, so the transfer overlaps the attention kernels that run while
it is in flight.

    rank r:  send -> (r + 1) % world,  recv <- (r - 1) % world          (ranks of ``group``)

Both directions are posted together with ``torch.distributed.batch_isend_irecv`` (one NCCL group call;
on gloo, plain isend / irecv). Every rank posts its exchanges in the same order, so messages between a
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

    def exchange(self, send: torch.Tensor) -> "PendingRecv":
        """Post send -> next rank and a receive of a tensor like ``send`` <- previous rank; returns at once.
        ``send`` must stay unmodified until the returned handle's wait() (it is read asynchronously)."""
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next_global, self.group),
               dist.P2POp(dist.irecv, recv, self.prev_global, self.group)]
        return PendingRecv(dist.batch_isend_irecv(ops), send, recv)


class PendingRecv:
    """An exchange in flight: wait() blocks (on NCCL: makes the current stream wait) and returns the
    received tensor. The send buffer is held until then so it is not freed while being read."""

    def __init__(self, works, send, recv):
        self._works, self._send, self._recv = works, send, recv

    def wait(self) -> torch.Tensor:
        for work in self._works:
            work.wait()
        recv, self._works, self._send, self._recv = self._recv, None, None, None
        return recv
