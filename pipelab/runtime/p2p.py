"""The runtime's transport: ``torch.distributed`` point-to-point hand-overs between the workers' programs.

A hand-over between two jobs of this rank stays in memory; the others cross ranks on the rank's device (CUDA
tensors stay on the GPU), in one of two orders:

- ``eager`` (gloo's default): the producer ``isend`` s as soon as its job ran, tagged with the channel of the
  receiving stage and kind (:func:`pipelab.schedules.transfers.channel`), and the consumer waits on ``irecv``
  when its job is about to run. Gloo buffers a send, so a valid schedule cannot deadlock; under NCCL this order
  deadlocks 1F1B already with two ranks.
- ``rendezvous`` (NCCL's default, valid on gloo too): every rank issues its operations in one global message
  order (:mod:`pipelab.runtime.nccl_order` states the rule and proves it deadlock-free). ``prefetch`` posts
  receives as soon as the order reaches them, ``batch`` groups the operations released at one moment in one
  ``batch_isend_irecv``; both only relax waits, and ``benchmarks/gpu.py`` measures whether they help.

A completed send is released once known received (receiving the peer's message sent at position p proves its
earlier receives finished). A send across a checkpoint's cut (:attr:`P2PTransport.retain`) is kept in the
:attr:`~P2PTransport.outbox`, saved, and sent by the resumed run where each channel's FIFO order puts it.

Reference: Chandy & Lamport, "Distributed Snapshots", ACM TOCS 1985 (messages in flight at a cut); NCCL and
``torch.distributed`` point-to-point semantics: see :mod:`pipelab.runtime.nccl_order`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..distributed import waiting
from ..pipeline.transport import Layout, pack
from ..schedules.dependencies import Job
from ..schedules.transfers import ACT, GRAD, channel, channels, messages
from .nccl_order import ORDERS, Issue, MessageOrder, Op, RankOrder, Wait

__all__ = ["P2PTransport"]

#: ``(t, j, boundary) -> Layout`` of the hand-over crossing the boundary into stage ``boundary`` (its activation;
#: the gradient going back is :meth:`~pipelab.pipeline.transport.Layout.gradient`)
ShapeOf = Callable[[int, int, int], Layout]


class P2PTransport:
    """Point-to-point transport of rank ``rank`` for ``schedule`` (tensors received onto ``device``).

    Args:
        order: ``"eager"``, ``"rendezvous"`` (module docstring), or ``None``: rendezvous under NCCL, else eager.
        prefetch, batch: rendezvous options (module docstring).
        record: keep the issued operations and waits in :attr:`log`.
        backend: the process group's backend (default: the initialised group's, else gloo).

    Attributes:
        local: same-rank hand-overs waiting for their consumer, ``(kind, stage, t, j) -> tensor``.
        outbox: messages kept at a checkpoint's cut, ``(dst, tag, t, j, tensor)``, sent by the resumed run.
        retain: ``(dst, tag, t, j)`` of the sends to keep in the outbox (set per run by the runtime).
        shape_of: the :class:`~pipelab.pipeline.transport.Layout` of a received hand-over (set per run).
        log: with ``record``, the :class:`~pipelab.runtime.nccl_order.Issue` and ``Wait`` items in host order.

    Raises:
        ValueError: a channel whose send and receive orders differ (point-to-point matching is FIFO); an
            unknown ``order``; the eager order, or a non-CUDA device, under NCCL.
    """

    def __init__(self, schedule: Any, rank: int, device: torch.device, *, order: str | None = None,
                 prefetch: bool = False, batch: bool = False, record: bool = False,
                 backend: str | None = None) -> None:
        self.schedule, self.rank, self.device = schedule, rank, torch.device(device)
        if backend is None:
            backend = str(dist.get_backend()) if dist.is_initialized() else "gloo"
        self.backend = backend
        if order is None:
            order = "rendezvous" if backend == "nccl" else "eager"
        if order not in ORDERS:
            raise ValueError(f"order must be None or one of {', '.join(ORDERS)}, got {order!r}")
        if backend == "nccl":
            if order == "eager":
                raise ValueError("order='eager' relies on gloo's buffered sends and tags; under NCCL it can "
                                 "deadlock (pipelab.runtime.nccl_order): use order='rendezvous' (the default)")
            if self.device.type != "cuda":
                raise ValueError(f"the NCCL backend moves CUDA tensors only, but rank {rank}'s device is "
                                 f"{self.device}: pass device='cuda' (or None), or use the gloo backend on CPU")
        self.order, self.prefetch, self.batch, self.record = order, prefetch, batch, record
        msgs = messages(schedule)
        for key, (sends, recvs) in channels(schedule, msgs).items():
            if sends != recvs:
                raise ValueError(f"channel {key} (src, dst, tag): the sender's order {sends[:6]}... differs from "
                                 f"the receiver's {recvs[:6]}...; point-to-point matching would pair wrong messages")
        # where each of our sends is received, and where each message we receive was sent (for releasing sends)
        self._recv_pos = {(m.dst, m.channel, m.t, m.j): m.recv_pos for m in msgs if m.src == rank}
        self._send_pos = {(m.src, m.channel, m.t, m.j): m.send_pos for m in msgs if m.dst == rank}
        self.local: dict[tuple[int, int, int, int], Tensor] = {}
        # dst -> (recv pos, work, tensor, op) of issued sends not yet waited on
        self._pending: dict[int, list[tuple[int, Any, Tensor, Op]]] = defaultdict(list)
        self.outbox: list[tuple[int, int, int, int, Tensor]] = []
        self.retain: set[tuple[int, int, int, int]] = set()
        self.shape_of: ShapeOf | None = None
        self.log: list[Issue | Wait] = []
        self._messages = MessageOrder(schedule) if order == "rendezvous" else None
        self._cursor: RankOrder | None = None
        self._ready: dict[tuple, Tensor] = {}  # rendezvous: produced sends not issued yet, by message key
        # issued receives, key -> (work, buffer, layout)
        self._posted: dict[tuple, tuple[Any, Tensor, Layout]] = {}

    @staticmethod
    def _kind(dst: Job) -> int:
        return ACT if dst[0] == "F" else GRAD

    # ------------------------------------------------------------------------------------- per run

    def begin(self, position: int = 0, end: int | None = None) -> None:
        """Start a run of ``programs[rank][position:end]`` (after :attr:`retain` and :attr:`shape_of` are set):
        the messages kept by a checkpoint are sent (eager: now; rendezvous: at their place in the order)."""
        if self._messages is None:
            self.resend_outbox()
            return
        mine = [(self.rank, dst, tag, t, j) for dst, tag, t, j, _ in self.outbox]
        self._ready = {(self.rank, dst, tag, t, j): tensor for dst, tag, t, j, tensor in self.outbox}
        self.outbox = []
        retain = [(self.rank, dst, tag, t, j) for dst, tag, t, j in self.retain]
        ops = self._messages.for_rank(self.rank, position, end, retain=retain, outbox=mine)
        self._cursor = RankOrder(ops, prefetch=self.prefetch, ready=mine)
        self._issue(self._cursor.start())

    def send(self, src: Job, dst: Job, tensor: Any) -> None:
        op, k, t, j = dst
        kind = self._kind(dst)
        peer = self.schedule.worker_of(op, k, t, j)
        if peer == self.rank:
            self.local[(kind, k, t, j)] = tensor
            return
        tag = channel(kind, k)
        tensor = pack(tensor)  # one buffer per message: a structure's tensors packed together
        if (peer, tag, t, j) in self.retain:  # crosses a checkpoint's cut: the resumed run sends it
            self.outbox.append((peer, tag, t, j, tensor))
            return
        key = (self.rank, peer, tag, t, j)
        if self._cursor is None:
            if self._messages is not None:
                raise RuntimeError("P2PTransport.begin() must be called before a run in the rendezvous order")
            self._issue([[Op("send", self.rank, peer, tag, t, j)]], {key: tensor})
            return
        self._ready[key] = tensor
        self._issue(self._cursor.produced(key))

    def post(self, src: Job, dst: Job) -> None:
        """Eager order: post the receive of ``dst``'s input from ``src`` now, so that the transfer goes on while
        this rank does something else until :meth:`receive` (the meter's hold: gloo moves a buffered send's data
        once the receive is posted, and the sender's thread must run for it). Nothing for a hand-over on this
        rank, a receive already posted, or the rendezvous order (its receives follow the global order)."""
        if self._messages is not None:
            return
        op = self._recv_op(src, dst)
        if op is not None and op.key not in self._posted:
            self._issue([[op]])

    def _recv_op(self, src: Job, dst: Job) -> Op | None:
        """The receive of ``dst``'s input from ``src`` (``None``: a hand-over on this rank)."""
        _, k, t, j = dst
        peer = self.schedule.worker_of(src[0], src[1], t, j)
        if peer == self.rank:
            return None
        if self.shape_of is None:
            raise RuntimeError("P2PTransport.shape_of must be set before receiving")
        return Op("recv", self.rank, peer, channel(self._kind(dst), k), t, j)

    def receive(self, src: Job, dst: Job) -> Any:
        op = self._recv_op(src, dst)
        if op is None:
            _, k, t, j = dst
            return self.local.pop((self._kind(dst), k, t, j))
        peer, tag, t, j, key = op.peer, op.channel, op.t, op.j, op.key
        if self._cursor is None:
            if self._messages is not None:
                raise RuntimeError("P2PTransport.begin() must be called before a run in the rendezvous order")
            if key not in self._posted:  # not posted ahead (:meth:`post`)
                self._issue([[op]])
        else:
            self._issue(self._cursor.needed(key))
        work, buf, layout = self._posted.pop(key)
        self._wait(work, op)
        self._release(peer, self._send_pos[(peer, tag, t, j)])
        return layout.unpack(buf)

    def resend_outbox(self) -> None:
        """Eager order: send the messages that were in flight when the checkpoint was taken, in their order."""
        outbox, self.outbox = self.outbox, []
        for dst, tag, t, j, tensor in outbox:
            self._issue([[Op("send", self.rank, dst, tag, t, j)]], {(self.rank, dst, tag, t, j): tensor})

    # ------------------------------------------------------------------------------------- issuing

    def _issue(self, groups: list[list[Op]], tensors: dict[tuple, Tensor] | None = None) -> None:
        """Post ``groups`` of operations (tensors of sends from ``tensors`` or the produced ones)."""
        tensors = self._ready if tensors is None else tensors
        for group in groups:
            if not group:
                continue
            items = []
            layouts: dict[tuple, Layout] = {}
            for op in group:
                if op.kind == "send":
                    items.append((op, tensors.pop(op.key)))
                else:
                    layout = self.shape_of(op.t, op.j, op.channel // 2 + (op.channel % 2))  # type: ignore[misc]
                    layouts[op.key] = layout.gradient() if op.channel % 2 == GRAD else layout
                    items.append((op, layouts[op.key].empty(self.device)))
            works: list[Any]
            if self.batch and len(items) > 1:
                works = dist.batch_isend_irecv([dist.P2POp(dist.isend if op.kind == "send" else dist.irecv, x,
                                                           op.peer, tag=self._tag(op)) for op, x in items])
                if self.record:
                    self.log.append(Issue(tuple(op for op, _ in items)))
            else:
                works = []
                for op, x in items:
                    fn = dist.isend if op.kind == "send" else dist.irecv
                    works.append(fn(x, op.peer, tag=self._tag(op)))
                    if self.record:
                        self.log.append(Issue((op,)))
            for (op, x), work in zip(items, works):
                if op.kind == "send":
                    self._pending[op.peer].append((self._recv_pos[(op.peer, op.channel, op.t, op.j)], work, x, op))
                else:
                    self._posted[op.key] = (work, x, layouts[op.key])

    def _tag(self, op: Op) -> int:
        return 0 if self.backend == "nccl" else op.channel  # NCCL has no tags: pairs match in issue order

    def _wait(self, work: Any, op: Op) -> None:
        kind = "receive" if op.kind == "recv" else "send"
        with waiting((op.peer,), f"the {kind} of step {op.t}, micro-batch {op.j} (channel {op.channel})"):
            _wait(work)
        if self.record:
            self.log.append(Wait(op))

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
        for entry in pending:
            if entry[0] < sent_at:
                self._wait(entry[1], entry[3])
            else:
                keep.append(entry)
        self._pending[peer] = keep

    def flush(self) -> None:
        if self._cursor is not None:
            self._issue(self._cursor.drain())
            self._cursor = None
        for peer in sorted(self._pending):
            for _, work, _, op in self._pending[peer]:
                self._wait(work, op)
        self._pending.clear()

    def held(self) -> int:
        """Sends not completed: issued and not waited on, or (rendezvous) produced and not issued yet."""
        return sum(len(p) for p in self._pending.values()) + len(self._ready)


def _wait(work: Any) -> None:
    """Wait for an ``isend``/``irecv`` (``None`` when the backend completed it at once)."""
    if work is not None:
        work.wait()
