"""Point-to-point transfers of a schedule: which tensor crosses from which worker to which, and when.

A transfer is an edge that carries a tensor (:data:`pipelab.schedules.dependencies.EDGES`) between jobs on
different workers. The channel of a tensor into stage k is ``2k`` (activation) or ``2k + 1`` (gradient);
matching on a channel is FIFO, so its sends and receives must come in the same order.

Reference: K. M. Chandy and L. Lamport, "Distributed Snapshots" (ACM TOCS 1985).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from .actions import Schedule
from .dependencies import ACTIVATION, Job, edges_into, gradient_job, is_split

__all__ = ["Message", "messages", "channels", "channel", "consistent_cut", "ACT", "GRAD"]

#: Kinds of tensor a transfer carries into a stage: its input activation or the gradient of its output.
ACT, GRAD = 0, 1


def channel(kind: int, stage: int) -> int:
    """The channel of a tensor of ``kind`` (:data:`ACT` or :data:`GRAD`) *into* ``stage``: 2·stage + kind."""
    return 2 * stage + kind


class Message(NamedTuple):
    """A cross-worker transfer: sent by ``src`` at program position ``send_pos``, received by ``dst`` at
    ``recv_pos``, on ``channel``, for micro-batch ``(t, j)``."""

    src: int
    send_pos: int
    dst: int
    recv_pos: int
    channel: int
    t: int
    j: int


def messages(schedule: Schedule) -> list[Message]:
    """Every cross-worker transfer of ``schedule``, ordered by sender and send position."""
    split = schedule.split_set
    where: dict[Job, tuple[int, int]] = {}
    for w, prog in enumerate(schedule.programs):
        for pos, a in enumerate(prog):
            if a.op != "U":
                where[(a.op, a.stage, a.step, a.micro)] = (w, pos)
    out: list[Message] = []
    for (op, k, t, j), (w, pos) in where.items():
        for edge in edges_into(op):
            kk = k + edge.stage
            if edge.carries is None or not 0 <= kk < schedule.D:
                continue
            producer = gradient_job(is_split(split, kk, t, j)) if edge.on == "grad" else edge.on
            src, send_pos = where[(producer, kk, t, j)]
            if src != w:
                kind = ACT if edge.carries == ACTIVATION else GRAD
                out.append(Message(src, send_pos, w, pos, channel(kind, k), t, j))
    out.sort(key=lambda m: (m.src, m.send_pos))
    return out


def channels(schedule: Schedule, msgs: Sequence[Message] | None = None
             ) -> dict[tuple[int, int, int], tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Per channel ``(src, dst, channel)``: (send order, receive order) of the ``(t, j)`` of its messages."""
    grouped: dict[tuple[int, int, int], list[Message]] = defaultdict(list)
    for m in messages(schedule) if msgs is None else msgs:
        grouped[(m.src, m.dst, m.channel)].append(m)
    return {key: ([(m.t, m.j) for m in sorted(ms, key=lambda m: m.send_pos)],
                  [(m.t, m.j) for m in sorted(ms, key=lambda m: m.recv_pos)]) for key, ms in grouped.items()}


def consistent_cut(schedule: Schedule, step: int) -> tuple[list[int], set[tuple[int, int, int, int, int]]]:
    """Cut positions per worker for a checkpoint at mini-batch ``step``, and the messages in flight.

    Each worker stops before its first action of step ``step`` or later, and earlier before any receive of a
    message sent after its sender's cut, until nothing changes (Chandy–Lamport's condition on the static programs).
    ``in_flight``: ``(src, dst, channel, t, j)`` of the messages the sender keeps for the resumed run.
    """
    if not 0 <= step <= schedule.steps:
        raise ValueError(f"step must be in 0..{schedule.steps}, got {step}")
    cut = [next((i for i, a in enumerate(prog) if a.step >= step), len(prog)) for prog in schedule.programs]
    msgs = messages(schedule)
    changed = True
    while changed:
        changed = False
        for m in msgs:
            if m.send_pos >= cut[m.src] and m.recv_pos < cut[m.dst]:  # orphan: received before the cut, sent after
                cut[m.dst] = m.recv_pos
                changed = True
    in_flight = {(m.src, m.dst, m.channel, m.t, m.j) for m in msgs
                 if m.send_pos < cut[m.src] and m.recv_pos >= cut[m.dst]}
    return cut, in_flight
