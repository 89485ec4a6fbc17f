"""Point-to-point ordering that cannot deadlock under NCCL, and a checker that plays it.

Why an order is needed. Gloo's ``isend`` copies the tensor out and completes on its own, so the runtime's
first transport (send eagerly when a job produces, receive when a job consumes) cannot deadlock for a valid
schedule. NCCL gives no such buffering. Its documented semantics, which this module models:

1. **Rendezvous.** ``ncclSend`` "is blocking for the GPU": it completes only once the peer has posted the
   matching ``ncclRecv`` and the data has moved, and likewise for a receive (NCCL user guide, API
   "Point To Point Communication Functions", and usage "Point-to-point communication").
2. **Issue order on a stream.** Operations a rank issues run in issue order on the communicator's stream;
   an operation that cannot complete holds back every later one on that stream. Only operations fused in
   one group (``ncclGroupStart/End``; ``torch.distributed.batch_isend_irecv``) progress concurrently (NCCL
   user guide, "Group Calls"). The checker's strict model puts all of a rank's point-to-point operations
   on one stream (``streams="rank"``, as when one communicator serves every peer); one stream per pair of
   ranks (``streams="pair"``, as with a communicator per pair) only removes waits, so an order that passes
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

The checker (:func:`check_order`) plays per-rank issue sequences (:func:`issue_sequences` builds them
for the runtime's transports, the same :class:`RankOrder` the transport runs) under rules 1-4 and
reports either success or a deadlock with its blocking cycle, and any mismatched pairing.

Scope: schedules whose traffic is point-to-point only. Placed schedules (DDP, FSDP, LPP, FSLPP, DualPipe,
``hybrid``) interleave collectives with the transfers (:mod:`pipelab.pipeline.placement`); a collective
completes only when every rank of its group reaches it, which this checker does not model yet, so their order
under NCCL is unproven (on gloo they are tested).

References: NVIDIA NCCL user guide, "Point-to-point communication" (docs.nvidia.com/deeplearning/nccl/user-guide/
docs/usage/p2p.html), "Group Calls" (.../usage/groups.html) and the API page of ``ncclSend``/``ncclRecv``
(.../api/p2p.html: "This operation is blocking for the GPU"); PyTorch ``torch.distributed.isend`` ("tag is not
supported with the NCCL backend") and ``batch_isend_irecv`` (the order between a pair of ranks in one direction
matters; sends and receives of one batch do not block each other);
D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
(SC 2021), whose 1F1B fuses a send with the opposite receive for the same reason.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..schedules.actions import Schedule
from ..schedules.transfers import Message, messages

__all__ = ["Op", "Issue", "Wait", "MessageOrder", "RankOrder", "issue_sequences", "check_order", "OrderReport",
           "NCCLOrderError", "ORDERS", "STREAMS"]

#: transports whose issue sequences :func:`issue_sequences` builds: ``eager`` (send when produced, the gloo
#: transport) and ``rendezvous`` (the global message order of this module)
ORDERS = ("eager", "rendezvous")
#: stream models of :func:`check_order`: one stream per rank (strict) or one per pair of ranks
STREAMS = ("rank", "pair")

#: identity of a message: ``(src, dst, channel, t, j)``
Key = tuple[int, int, int, int, int]


class NCCLOrderError(ValueError):
    """An issue order that deadlocks or mispairs messages under NCCL's semantics (the message says where)."""


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

    Each method returns the operations to issue now, as groups (a list of lists; one group per call):
    :meth:`produced` after a job made a tensor to send, :meth:`needed` before a job receives, :meth:`drain`
    at the end of the run. A send waits for its tensor; a receive is issued when needed, or as soon as the
    order reaches it with ``prefetch`` (so that the transfer overlaps the compute before its consumer).

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


def issue_sequences(schedule: Schedule, order: str = "rendezvous", *, prefetch: bool = False,
                    batch: bool = False) -> list[list[Item]]:
    """What each rank's transport issues and waits on over a whole run of ``schedule``, in host order.

    ``eager``: the gloo transport (:class:`pipelab.runtime.p2p.P2PTransport` with ``order="eager"``): a
    receive is issued and waited on when its job runs, a send issued right after its job. ``rendezvous``:
    the order of :class:`RankOrder` (``prefetch``, ``batch`` as in the transport: with ``batch`` the
    operations issued at one moment form one group). Both transports wait on a send once the peer is known
    to have received it, and on every send at the end.

    Raises:
        ValueError: an unknown ``order``.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    msgs = messages(schedule)
    mo = MessageOrder(schedule) if order == "rendezvous" else None
    cursors = [None if mo is None else RankOrder(mo.for_rank(r), prefetch=prefetch) for r in range(schedule.W)]
    return [_rank_sequence(r, len(prog), msgs, cursors[r], batch) for r, prog in enumerate(schedule.programs)]


def _rank_sequence(rank: int, length: int, msgs: Sequence[Message], cursor: RankOrder | None,
                   batch: bool) -> list[Item]:
    """One rank's items for :func:`issue_sequences` (``cursor`` None: the eager order)."""
    recvs: dict[int, list[Message]] = defaultdict(list)
    sends: dict[int, list[Message]] = defaultdict(list)
    for m in msgs:
        if m.dst == rank:
            recvs[m.recv_pos].append(m)
        if m.src == rank:
            sends[m.send_pos].append(m)
    mine = {_key(m): m for m in msgs if m.src == rank}
    items: list[Item] = []
    pending: dict[int, list[Message]] = defaultdict(list)  # peer -> issued sends not yet waited on

    def emit(groups: list[list[Op]]) -> None:
        for group in groups:
            items.extend([Issue(tuple(group))] if batch else [Issue((op,)) for op in group])
            for op in group:
                if op.kind == "send":
                    pending[op.peer].append(mine[op.key])

    if cursor is not None:
        emit(cursor.start())
    for pos in range(length):
        for m in recvs[pos]:
            emit([[_recv_op(m)]] if cursor is None else cursor.needed(_key(m)))
            items.append(Wait(_recv_op(m)))
            keep = []  # the peer sent m at m.send_pos: it has received everything it receives earlier
            for s in pending[m.src]:
                if s.recv_pos < m.send_pos:
                    items.append(Wait(_send_op(s)))
                else:
                    keep.append(s)
            pending[m.src] = keep
        for m in sends[pos]:
            emit([[_send_op(m)]] if cursor is None else cursor.produced(_key(m)))
    if cursor is not None:
        emit(cursor.drain())
    items.extend(Wait(_send_op(s)) for peer in sorted(pending) for s in pending[peer])
    return items


@dataclass
class OrderReport:
    """Outcome of :func:`check_order`.

    Attributes:
        ok: every operation completed and every pairing matched.
        completed, total: operations completed and issued in all.
        cycle: for a deadlock, the blocking cycle, one line per waiting stream or host (empty otherwise).
        mismatches: pairings NCCL would make between different messages (tags are ignored).
        unmatched: operations whose peer never issues a counterpart.
    """

    ok: bool
    completed: int
    total: int
    cycle: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.ok:
            return f"no deadlock: all {self.total} operations complete"
        lines = []
        if self.cycle:
            lines.append(f"deadlock after {self.completed} of {self.total} operations; blocking cycle:")
            lines += [f"  {c}" for c in self.cycle]
        if self.mismatches:
            lines.append("mismatched pairings (NCCL matches sends and receives between two ranks in order, "
                         "without tags):")
            lines += [f"  {c}" for c in self.mismatches[:8]]
        if self.unmatched:
            lines.append("operations without a counterpart:")
            lines += [f"  {c}" for c in self.unmatched[:8]]
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise NCCLOrderError(self.describe())


def check_order(sequences: Sequence[Sequence[Item]], *, streams: str = "rank") -> OrderReport:
    """Play every rank's issue sequence under NCCL's semantics (module docstring, rules 1-4).

    Args:
        sequences: per rank, its :class:`Issue` and :class:`Wait` items in host order (e.g. from
            :func:`issue_sequences`, or a transport's ``log``).
        streams: ``"rank"``: all of a rank's operations on one stream (strict); ``"pair"``: one stream per
            pair of ranks.

    Returns:
        :class:`OrderReport`; for a deadlock, ``cycle`` lists the streams and hosts waiting on each other.

    Raises:
        ValueError: an unknown ``streams``; a wait on an operation its rank has not issued.
    """
    if streams not in STREAMS:
        raise ValueError(f"streams must be one of {', '.join(STREAMS)}, got {streams!r}")
    # instances: (rank, n) numbered in issue order; pairing is FIFO per (src, dst), ignoring channels
    ops: list[Op] = []
    group_of: list[int] = []
    ident: dict[tuple[int, Op], int] = {}
    fifo_send: dict[tuple[int, int], list[int]] = defaultdict(list)
    fifo_recv: dict[tuple[int, int], list[int]] = defaultdict(list)
    n_groups = 0
    for rank, seq in enumerate(sequences):
        for item in seq:
            if isinstance(item, Issue):
                for op in item.ops:
                    if op.rank != rank:
                        raise ValueError(f"rank {rank}'s sequence issues {op}, an operation of rank {op.rank}")
                    i = len(ops)
                    ops.append(op)
                    group_of.append(n_groups)
                    ident[(rank, op)] = i
                    (fifo_send if op.kind == "send" else fifo_recv)[op.key[:2]].append(i)
                n_groups += 1
    partner: dict[int, int] = {}
    mismatches, unmatched = [], []
    for pair in set(fifo_send) | set(fifo_recv):
        s, r = fifo_send.get(pair, []), fifo_recv.get(pair, [])
        for a, b in zip(s, r):
            partner[a], partner[b] = b, a
            if ops[a].key != ops[b].key:
                mismatches.append(f"rank {pair[0]}'s {ops[a]} would be received by rank {pair[1]}'s {ops[b]}")
        unmatched += [f"rank {ops[i].rank}: {ops[i]}" for i in (s[len(r):] + r[len(s):])]

    def stream(i: int) -> tuple[int, int]:
        op = ops[i]
        return (op.rank, -1 if streams == "rank" else op.peer)

    queues: dict[tuple[int, int], deque[list[int]]] = defaultdict(deque)
    issued: set[int] = set()
    done: set[int] = set()
    host = [0] * len(sequences)

    def head(i: int) -> bool:
        q = queues[stream(i)]
        return bool(q) and i in q[0]

    changed = True
    while changed:
        changed = False
        for rank, seq in enumerate(sequences):
            while host[rank] < len(seq):
                item = seq[host[rank]]
                if isinstance(item, Wait):
                    w = ident.get((rank, item.op))
                    if w is None or w not in issued:
                        raise ValueError(f"rank {rank} waits on {item.op} before issuing it")
                    if w not in done:
                        break
                else:
                    by_stream: dict[tuple[int, int], list[int]] = defaultdict(list)
                    for op in item.ops:
                        i = ident[(rank, op)]
                        issued.add(i)
                        by_stream[stream(i)].append(i)
                    for key, members in by_stream.items():
                        queues[key].append(members)
                host[rank] += 1
                changed = True
        for q in queues.values():
            while q:
                for i in q[0]:
                    p = partner.get(i)
                    if i not in done and p is not None and p in issued and head(p):
                        done.update((i, p))
                        changed = True
                if all(i in done for i in q[0]):
                    q.popleft()
                    changed = True
                else:
                    break
    total = len(ops)
    finished = all(host[r] == len(seq) for r, seq in enumerate(sequences)) and len(done) == total
    if finished:
        return OrderReport(not mismatches and not unmatched, len(done), total, [], mismatches, unmatched)
    return OrderReport(False, len(done), total, _cycle(sequences, ops, partner, queues, issued, done, host, ident,
                                                       stream), mismatches, unmatched)


def _cycle(sequences: Sequence[Sequence[Item]], ops: list[Op], partner: dict[int, int],
           queues: dict[tuple[int, int], deque[list[int]]], issued: set[int], done: set[int], host: list[int],
           ident: dict[tuple[int, Op], int], stream: object) -> list[str]:
    """Follow "waits for" edges between stuck streams from any stuck one until a stream repeats."""
    stream_of = stream  # callable (rank, peer) key of an operation

    def name(key: tuple[int, int]) -> str:
        return f"rank {key[0]}'s stream" + ("" if key[1] < 0 else f" to rank {key[1]}")

    def edge(key: tuple[int, int]) -> tuple[str, tuple[int, int] | None]:
        i = next(i for i in queues[key][0] if i not in done)
        p = partner.get(i)
        op = ops[i]
        if p is None:
            return f"{name(key)}: {op} has no counterpart on rank {op.peer}", None
        peer = ops[p].rank
        if p in issued:
            blocker = stream_of(p)  # type: ignore[operator]
            first = next(b for b in queues[blocker][0] if b not in done)
            return (f"{name(key)}: {op} waits for rank {peer} to reach its {ops[p]}, queued behind its "
                    f"{ops[first]}", blocker)
        item = sequences[peer][host[peer]]
        assert isinstance(item, Wait)
        blocker = stream_of(ident[(peer, item.op)])  # type: ignore[operator]
        return (f"{name(key)}: {op} waits for rank {peer} to issue its {ops[p]}; rank {peer}'s host is blocked "
                f"waiting for its {item.op}", blocker)

    stuck = [k for k, q in queues.items() if q]
    if not stuck:
        return ["no stream is stuck, yet some host never finished (a wait on an operation never completed)"]
    seen: dict[tuple[int, int], int] = {}
    lines: list[str] = []
    key: tuple[int, int] | None = sorted(stuck)[0]
    while key is not None and key not in seen:
        seen[key] = len(lines)
        text, key = edge(key)
        lines.append(text)
    return lines if key is None else lines[seen[key]:]
