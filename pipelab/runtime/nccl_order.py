"""Point-to-point ordering that cannot deadlock under NCCL.

Why an order is needed: gloo buffers an ``isend``, so sending eagerly cannot deadlock a valid schedule; NCCL
does not. Its documented semantics, which this module models:

1. **Rendezvous.** ``ncclSend`` "is blocking for the GPU": it completes only once the peer has posted the
   matching ``ncclRecv`` and the data has moved, and likewise for a receive (NCCL user guide, API
   "Point To Point Communication Functions", and usage "Point-to-point communication").
2. **Issue order on a stream.** Operations a rank issues run in issue order on the communicator's stream;
   an operation that cannot complete holds back every later one on that stream. Only operations fused in
   one group (``ncclGroupStart/End``; ``torch.distributed.batch_isend_irecv``) progress concurrently (NCCL
   user guide, "Group Calls"). The checker's strict model puts a rank's operations on one stream
   (``streams="rank"``); one per pair of ranks (``streams="pair"``) only removes waits, so an order that passes
   the strict model passes both, whichever torch's process group uses.
3. **No tags.** ``tag`` "is not supported with the NCCL backend" (``torch.distributed.isend``): the k-th
   send from rank a to rank b meets the k-th receive on b from a, whatever the channel. Both ends must
   therefore issue the messages between a pair in the same order, across channels.
4. **Host waits.** The host may block on a received tensor (a loss's ``.item()``, a gloo-style wait); the
   checker assumes it does at every receive, the conservative case.

The rule (:class:`MessageOrder`). Give every cross-worker message ``m`` (:func:`pipelab.schedules.messages`)
one global rank ``g(m)``: the end time of its producing job in the schedule simulated with positive costs
(:func:`pipelab.simulator.simulate`, F = 1, B = 2), ties broken by sender and program position. Every rank
issues its sends and receives in increasing ``g``; a send is issued once its job has produced the tensor,
a receive at the latest when its consuming job is about to run (:class:`RankOrder`).

Why it cannot deadlock. If rank r receives b at or before the program position where it sends a, then
the job producing a ends after the job consuming b starts, which is after b's producer ended:
g(b) < g(a). Hence (i) a receive that a job needs never waits behind a send that job has not produced,
and (ii) every operation before the unfinished message of least g, on its sender and on its receiver,
belongs to a finished message; both ends reach it, it completes, and by induction every message does.
Both ends of a pair issue its messages in g order, so NCCL's tag-less FIFO matching pairs them right.

The tests play the transport's issue sequences (its ``log``, the :class:`Issue` and :class:`Wait` items)
under rules 1-4 (``tests/core/nccl_model.py``). Scope: point-to-point traffic only; placed schedules (DDP,
FSDP, LPP, FSLPP, DualPipe, ``hybrid``) interleave collectives, whose order under NCCL is unproven (on gloo they
are tested).

References: NVIDIA NCCL user guide, "Point-to-point communication" (docs.nvidia.com/deeplearning/nccl/user-guide/
docs/usage/p2p.html), "Group Calls" (.../usage/groups.html) and the API page of ``ncclSend``/``ncclRecv``
(.../api/p2p.html: "This operation is blocking for the GPU"); PyTorch ``torch.distributed.isend`` ("tag is not
supported with the NCCL backend") and ``batch_isend_irecv`` (the order between a pair of ranks in one direction
matters; sends and receives of one batch do not block each other);
D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
(SC 2021), whose 1F1B fuses a send with the opposite receive for the same reason.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..schedules.actions import Schedule
from ..schedules.transfers import Message, messages

__all__ = ["Op", "Issue", "Wait", "Item", "MessageOrder", "RankOrder", "ORDERS"]

#: the transport's orders: ``eager`` (send when produced, gloo's) and ``rendezvous`` (this module's global order)
ORDERS = ("eager", "rendezvous")

#: identity of a message: ``(src, dst, channel, t, j)``
Key = tuple[int, int, int, int, int]


class Op(NamedTuple):
    """One point-to-point operation issued by ``rank``: ``kind`` ``"send"`` to or ``"recv"`` from ``peer``
    of the message ``(src, dst, channel, t, j)``."""

    kind: str
    rank: int
    peer: int
    channel: int
    t: int
    j: int

    @property
    def key(self) -> Key:
        src, dst = (self.rank, self.peer) if self.kind == "send" else (self.peer, self.rank)
        return (src, dst, self.channel, self.t, self.j)

    def __str__(self) -> str:
        what = "activation" if self.channel % 2 == 0 else "gradient"
        into = self.channel // 2
        way = f"to rank {self.peer}" if self.kind == "send" else f"from rank {self.peer}"
        return f"{self.kind} {way} ({what} into stage {into}, t={self.t}, j={self.j})"


@dataclass(frozen=True)
class Issue:
    """Operations issued together: one NCCL group (``batch_isend_irecv``) when several, else one operation."""

    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Wait:
    """The host blocks until ``op`` (issued earlier by this rank) has completed."""

    op: Op


Item = Issue | Wait


def _send_op(m: Message) -> Op:
    return Op("send", m.src, m.dst, m.channel, m.t, m.j)


def _recv_op(m: Message) -> Op:
    return Op("recv", m.dst, m.src, m.channel, m.t, m.j)


def _key(m: Message) -> Key:
    return (m.src, m.dst, m.channel, m.t, m.j)


class MessageOrder:
    """The global message order g of ``schedule`` (see the module docstring for the rule and its proof).

    Attributes:
        messages: every cross-worker message, in g order; ``rank``: ``(src, dst, channel, t, j) -> g``.

    Raises:
        ValueError: the schedule cannot be simulated (its programs deadlock), or (a bug) the order breaks
            the property g(b) < g(a) whenever a rank receives b no later than it sends a.
    """

    def __init__(self, schedule: Schedule) -> None:
        from ..simulator import simulate

        self.schedule = schedule
        msgs = messages(schedule)
        if msgs:
            sim = simulate(schedule, 1.0, 2.0)
            progs = schedule.programs

            def produced(m: Message) -> float:
                a = progs[m.src][m.send_pos]
                return sim.time_of(a.op, a.stage, a.step, a.micro)[1]

            msgs = sorted(msgs, key=lambda m: (produced(m), m.src, m.send_pos, m.dst, m.channel))
        self.messages: list[Message] = msgs
        self.rank: dict[Key, int] = {_key(m): g for g, m in enumerate(msgs)}
        self._check()

    def _check(self) -> None:
        """g(b) < g(a) whenever some rank receives b at a position <= the one where it sends a."""
        events: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # rank -> (pos, 0 recv / 1 send, g)
        for g, m in enumerate(self.messages):
            events[m.dst].append((m.recv_pos, 0, g))
            events[m.src].append((m.send_pos, 1, g))
        for r, evs in events.items():
            latest_recv = -1
            for _, kind, g in sorted(evs):
                if kind == 0:
                    latest_recv = max(latest_recv, g)
                elif g < latest_recv:
                    raise ValueError(f"message order of {self.schedule.name!r} on rank {r}: a send (g={g}) comes "
                                     f"after a receive with a later rank (g={latest_recv})")

    def for_rank(self, rank: int, start: int = 0, end: int | None = None, *, retain: Iterable[Key] = (),
                 outbox: Iterable[Key] = ()) -> list[Op]:
        """Rank ``rank``'s operations for a run of ``programs[rank][start:end]``, in g order.

        ``retain``: sends kept for a later run (a checkpoint's cut); ``outbox``: sends kept by an earlier run,
        issued by this one.
        """
        end = len(self.schedule.programs[rank]) if end is None else end
        retain, outbox = set(retain), set(outbox)
        ops = []
        for m in self.messages:
            key = _key(m)
            if m.src == rank and ((start <= m.send_pos < end and key not in retain) or key in outbox):
                ops.append(_send_op(m))
            if m.dst == rank and start <= m.recv_pos < end:
                ops.append(_recv_op(m))
        return ops


class RankOrder:
    """The cursor a rank's transport follows through its g-ordered operations (:meth:`MessageOrder.for_rank`).

    :meth:`produced` (after a job made a tensor), :meth:`needed` (before a job receives) and :meth:`drain` (at the
    end) return the groups of operations to issue now; with ``prefetch`` a receive is issued as soon as the order
    reaches it.

    Raises:
        RuntimeError: a receive ordered behind a send whose tensor is not produced (impossible for an order
            of :class:`MessageOrder`: it would contradict the program).
    """

    def __init__(self, ops: Sequence[Op], *, prefetch: bool = False, ready: Iterable[Key] = ()) -> None:
        self.ops, self.prefetch = list(ops), prefetch
        self.cursor = 0
        self.ready: set[Key] = set(ready)
        self.issued: set[Key] = set()

    def start(self) -> list[list[Op]]:
        """Operations issuable before the first job (kept sends of a checkpoint; with prefetch, receives)."""
        return self._advance()

    def produced(self, key: Key) -> list[list[Op]]:
        self.ready.add(key)
        return self._advance()

    def needed(self, key: Key) -> list[list[Op]]:
        if key in self.issued:
            return [] if not self.prefetch else self._advance()
        group = []
        while self.cursor < len(self.ops):
            op = self.ops[self.cursor]
            if op.kind == "send" and op.key not in self.ready:
                raise RuntimeError(f"rank {op.rank}: the receive of {key} is ordered after {op}, whose tensor is "
                                   "not produced yet: the message order contradicts the program")
            group.append(self._take())
            if op.key == key:
                break
        else:
            raise RuntimeError(f"rank {self.ops[0].rank if self.ops else '?'}: receive {key} is not in this "
                               "run's operations")
        rest = self._advance()
        return [group + (rest[0] if rest else [])]

    def drain(self) -> list[list[Op]]:
        """The sends still to issue at the end of the run, in order; operations of jobs that did not run (a run
        stopped early) are dropped."""
        group = [op for op in self.ops[self.cursor:] if op.kind == "send" and op.key in self.ready]
        self.cursor = len(self.ops)
        self.issued.update(op.key for op in group)
        return [group] if group else []

    def _take(self) -> Op:
        op = self.ops[self.cursor]
        self.cursor += 1
        self.issued.add(op.key)
        return op

    def _advance(self) -> list[list[Op]]:
        group = []
        while self.cursor < len(self.ops):
            op = self.ops[self.cursor]
            if (op.kind == "send" and op.key in self.ready) or (op.kind == "recv" and self.prefetch):
                group.append(self._take())
            else:
                break
        return [group] if group else []
