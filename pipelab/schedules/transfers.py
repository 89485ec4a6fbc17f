"""Cross-worker transfers of a schedule: which tensors travel between workers, on which channel, when.

A pipeline hands two kinds of tensors between neighbouring stages: ``F(k, t, j)``'s output is the input of
``F(k+1, t, j)`` (an *activation*, kind :data:`ACT`), and ``B(k, t, j)``'s input gradient is the output
gradient of ``B(k−1, t, j)`` (a *gradient*, kind :data:`GRAD`). When the two jobs run on different workers
the tensor is a *message*, sent at one position of the sender's program and received at one position of
the receiver's. Each (receiving stage, kind) is its own channel (:func:`channel_tag`); point-to-point
transports match the messages of one channel in FIFO order, so a runnable schedule lists them in the same
order on both sides (:func:`channels`).

:func:`consistent_cut` places a checkpoint's cut so that no message is received before its receiver's cut
but sent after its sender's (Chandy & Lamport, "Distributed Snapshots", ACM TOCS 1985).

Example:
    >>> from pipelab.schedules import gpipe
    >>> sched = gpipe(2, 2, 1)
    >>> [(m.src, m.dst, m.tag, m.t, m.j) for m in messages(sched)][:2]
    [(0, 1, 2, 0, 0), (0, 1, 2, 0, 1)]
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

__all__ = ["ACT", "GRAD", "Message", "messages", "channels", "channel_tag", "consistent_cut"]

#: message kinds: the input of stage k (an activation) or the gradient of stage k's output
ACT, GRAD = 0, 1


def channel_tag(kind: int, stage: int) -> int:
    """Channel of the message *into* ``stage``: its input activation (ACT) or its output gradient (GRAD)."""
    return 2 * stage + kind


_tag = channel_tag


class Message(NamedTuple):
    """A cross-worker transfer: sent by ``src`` at program position ``send_pos``, received by ``dst`` at
    ``recv_pos``, on channel ``tag``, for micro-batch ``(t, j)``."""

    src: int
    send_pos: int
    dst: int
    recv_pos: int
    tag: int
    t: int
    j: int


def messages(schedule: Any) -> list[Message]:
    """Every cross-worker message of a schedule, with its send and receive positions in the programs."""
    D = schedule.D
    sends: dict[tuple[int, int, int, int], tuple[int, int]] = {}
    recvs: dict[tuple[int, int, int, int], tuple[int, int]] = {}
    for w, prog in enumerate(schedule.programs):
        for pos, a in enumerate(prog):
            k, t, j = a.stage, a.step, a.micro
            if a.op == "F":
                if k < D - 1 and schedule.worker_of("F", k + 1, t, j) != w:
                    sends[(_tag(ACT, k + 1), t, j, w)] = (w, pos)
                if k > 0 and (src := schedule.worker_of("F", k - 1, t, j)) != w:
                    recvs[(_tag(ACT, k), t, j, src)] = (w, pos)
            elif a.op == "B":
                if k > 0 and schedule.worker_of("B", k - 1, t, j) != w:
                    sends[(_tag(GRAD, k - 1), t, j, w)] = (w, pos)
                if k < D - 1 and (src := schedule.worker_of("B", k + 1, t, j)) != w:
                    recvs[(_tag(GRAD, k), t, j, src)] = (w, pos)
    return [Message(src, spos, recvs[key][0], recvs[key][1], key[0], key[1], key[2])
            for key, (src, spos) in sends.items()]


def channels(schedule: Any) -> dict[tuple[int, int, int], tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Cross-worker messages per channel ``(src, dst, tag)``: (send order, receive order) of their ``(t, j)``.

    A point-to-point runtime requires the two orders to be equal on every channel (matching is FIFO).
    """
    grouped: dict[tuple[int, int, int], list[Message]] = defaultdict(list)
    for m in messages(schedule):
        grouped[(m.src, m.dst, m.tag)].append(m)
    return {key: ([(m.t, m.j) for m in sorted(ms, key=lambda m: m.send_pos)],
                  [(m.t, m.j) for m in sorted(ms, key=lambda m: m.recv_pos)]) for key, ms in grouped.items()}


def consistent_cut(schedule: Any, step: int) -> tuple[list[int], set[tuple[int, int, int, int, int]]]:
    """Cut positions per worker for a checkpoint at mini-batch ``step``, and the messages in flight.

    The cut starts, on every worker r, at the first action of a mini-batch t ≥ ``step``; while some
    message is an orphan (sent at or after the sender's cut, received before the receiver's), the
    receiver's cut moves back to that receive. Positions only decrease, so this terminates.

    Returns:
        ``(positions, in_flight)``: worker r runs ``programs[r][:positions[r]]``; ``in_flight`` holds
        ``(src, dst, tag, t, j)`` of the messages its sender must keep for the resumed run.
    """
    if not 0 <= step <= schedule.steps:
        raise ValueError(f"step must be in 0..{schedule.steps}, got {step}")
    cut = [next((i for i, a in enumerate(prog) if a.step >= step), len(prog)) for prog in schedule.programs]
    msgs = messages(schedule)
    changed = True
    while changed:
        changed = False
        for src, spos, dst, rpos, *_ in msgs:
            if spos >= cut[src] and rpos < cut[dst]:  # orphan: received before the cut, sent after it
                cut[dst] = rpos
                changed = True
    in_flight = {(src, dst, tag, t, j) for src, spos, dst, rpos, tag, t, j in msgs
                 if spos < cut[src] and rpos >= cut[dst]}
    return cut, in_flight
