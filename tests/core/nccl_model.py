"""A model of NCCL's point-to-point semantics that plays per-rank issue sequences and finds deadlocks.

The rules (:mod:`pipelab.runtime.nccl_order`): a send and its receive complete together (rendezvous); a rank's
operations on one stream complete in issue order, a group (``batch_isend_irecv``) progresses together; without
tags the k-th send from a to b meets the k-th receive on b from a; the host may block at every wait. The tests
check the runtime's transports with it: :func:`issue_sequences` builds what each transport issues, a transport's
``log`` records what it issued, and :func:`check_order` plays either. It lives with the tests because nothing in
a run calls it: it is the proof harness of the transport's order, not part of the runtime.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipelab.runtime.nccl_order import ORDERS, Issue, Item, MessageOrder, Op, RankOrder, Wait, _key, _recv_op, _send_op
from pipelab.schedules.actions import Schedule
from pipelab.schedules.transfers import Message, messages

#: stream models of :func:`check_order`: one stream per rank (strict) or one per pair of ranks
STREAMS = ("rank", "pair")


class NCCLOrderError(ValueError):
    """An issue order that deadlocks or mispairs messages under NCCL's semantics (the message says where)."""


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
