"""The runtime's transport: ``torch.distributed`` point-to-point hand-overs between the workers' programs.

Implements :class:`pipelab.pipeline.transport.Transport` for one rank:

- a hand-over between two jobs of this rank (interleaved or folded stages) stays in memory;
- otherwise the producer sends eagerly (``isend``, so a valid schedule cannot deadlock) on the channel of
  the receiving stage and kind (:func:`pipelab.schedules.transfers.channel`), and the consumer blocks on
  ``irecv().wait()`` into a buffer of the shape the caller's ``shape_of`` gives;
- a completed send is released as soon as it is known to be received: receiving a message the peer sent at
  program position p proves that every receive the peer placed before p has finished;
- a send that crosses a checkpoint's consistent cut (:attr:`P2PTransport.retain`) is kept in the
  :attr:`~P2PTransport.outbox` instead, saved with the checkpoint, and sent first on resume
  (:meth:`~P2PTransport.resend_outbox`), which keeps every channel's FIFO order.

Reference: Chandy & Lamport, "Distributed Snapshots", ACM TOCS 1985 (messages in flight at a cut).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..schedules.dependencies import Job
from ..schedules.transfers import ACT, GRAD, channel, channels, messages

__all__ = ["P2PTransport"]

#: ``(t, j, boundary) -> (shape, dtype)`` of the tensor crossing the boundary into stage ``boundary``
ShapeOf = Callable[[int, int, int], tuple[torch.Size, torch.dtype]]


class P2PTransport:
    """Point-to-point transport of rank ``rank`` for ``schedule`` (tensors received onto ``device``).

    Attributes:
        local: same-rank hand-overs waiting for their consumer, ``(kind, stage, t, j) -> tensor``.
        outbox: messages kept at a checkpoint's cut, ``(dst, tag, t, j, tensor)``, sent first on resume.
        retain: ``(dst, tag, t, j)`` of the sends to keep in the outbox (set per run by the runtime).
        shape_of: shape and dtype of a received tensor (set per run by the runtime).

    Raises:
        ValueError: a channel whose send and receive orders differ (point-to-point matching is FIFO).
    """

    def __init__(self, schedule: Any, rank: int, device: torch.device) -> None:
        self.schedule, self.rank, self.device = schedule, rank, device
        msgs = messages(schedule)
        for key, (sends, recvs) in channels(schedule, msgs).items():
            if sends != recvs:
                raise ValueError(f"channel {key} (src, dst, tag): the sender's order {sends[:6]}... differs from "
                                 f"the receiver's {recvs[:6]}...; point-to-point matching would pair wrong messages")
        # where each of our sends is received, and where each message we receive was sent (for releasing sends)
        self._recv_pos = {(m.dst, m.channel, m.t, m.j): m.recv_pos for m in msgs if m.src == rank}
        self._send_pos = {(m.src, m.channel, m.t, m.j): m.send_pos for m in msgs if m.dst == rank}
        self.local: dict[tuple[int, int, int, int], Tensor] = {}
        self._pending: dict[int, list[tuple[int, Any, Tensor]]] = defaultdict(list)  # dst -> (recv pos, work, t)
        self.outbox: list[tuple[int, int, int, int, Tensor]] = []
        self.retain: set[tuple[int, int, int, int]] = set()
        self.shape_of: ShapeOf | None = None

    @staticmethod
    def _kind(dst: Job) -> int:
        return ACT if dst[0] == "F" else GRAD

    def send(self, src: Job, dst: Job, tensor: Tensor) -> None:
        op, k, t, j = dst
        kind = self._kind(dst)
        peer = self.schedule.worker_of(op, k, t, j)
        if peer == self.rank:
            self.local[(kind, k, t, j)] = tensor
            return
        tag = channel(kind, k)
        tensor = tensor.contiguous()
        if (peer, tag, t, j) in self.retain:  # crosses a checkpoint's cut: the resumed run sends it
            self.outbox.append((peer, tag, t, j, tensor))
            return
        self._pending[peer].append((self._recv_pos[(peer, tag, t, j)], dist.isend(tensor, peer, tag=tag), tensor))

    def receive(self, src: Job, dst: Job) -> Tensor:
        _, k, t, j = dst
        kind = self._kind(dst)
        peer = self.schedule.worker_of(src[0], src[1], t, j)
        if peer == self.rank:
            return self.local.pop((kind, k, t, j))
        if self.shape_of is None:
            raise RuntimeError("P2PTransport.shape_of must be set before receiving")
        shape, dtype = self.shape_of(t, j, max(src[1], k))
        tag = channel(kind, k)
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        _wait(dist.irecv(buf, peer, tag=tag))
        self._release(peer, self._send_pos[(peer, tag, t, j)])
        return buf

    def resend_outbox(self) -> None:
        """Send the messages that were in flight when the checkpoint was taken, in their order."""
        outbox, self.outbox = self.outbox, []
        for dst, tag, t, j, tensor in outbox:
            self._pending[dst].append((self._recv_pos[(dst, tag, t, j)], dist.isend(tensor, dst, tag=tag), tensor))

    def _release(self, peer: int, sent_at: int) -> None:
        """Complete our sends to ``peer`` that it received before position ``sent_at`` of its program.

        ``peer`` sent the message we just received at ``sent_at``, so every receive it placed earlier has
        finished: waiting on those sends returns at once and frees their tensors. (Gloo reports a send as
        unfinished until it is waited on, so polling would keep every sent tensor alive for the whole run.)
        """
        pending = self._pending.get(peer)
        if not pending:
            return
        keep = []
        for recv_pos, work, tensor in pending:
            if recv_pos < sent_at:
                _wait(work)
            else:
                keep.append((recv_pos, work, tensor))
        self._pending[peer] = keep

    def flush(self) -> None:
        for pending in self._pending.values():
            for _, work, _ in pending:
                _wait(work)
        self._pending.clear()

    def held(self) -> int:
        return sum(len(p) for p in self._pending.values())


def _wait(work: Any) -> None:
    """Wait for an ``isend`` (``None`` when the backend completed it at once)."""
    if work is not None:
        work.wait()
