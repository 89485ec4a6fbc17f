"""Metered transport: the link model of :mod:`pipelab.links` applied for real, so a slow link runs on one machine.

:class:`MeteredTransport` wraps a rank's point-to-point transport (:class:`~pipelab.runtime.p2p.P2PTransport`).
The tensors travel as before (so the weights are those of an unmetered run, bit for bit); what changes is *when*
a receiving job gets its input. For every message to another rank:

- the **sender** stamps it with ``time.perf_counter()`` (``CLOCK_MONOTONIC`` on Linux: one clock for the
  machine's processes) when the model says it is sent, and writes the stamp to its row of a :class:`StampBoard`,
  memory the host's ranks share: the receiver can read it at once, with no thread of its own to wake and no
  message to deliver;
- the **receiver** keeps its inbound wire(s) as the simulator does (:mod:`pipelab.links`: ready at s + α_L,
  arrival = max(ready, free) + n/β_L), and the consuming job sleeps until the arrival. The receive is posted
  (:meth:`~pipelab.runtime.p2p.P2PTransport.post`) once the stamp is seen, at the end of a job or when the job asks,
  so that the real transfer overlaps the hold or the rank's work. A job that asks before the message's stamp is
  on the board looks again every :data:`POLL_S`. Same-rank hand-overs are free.

**Condition.** To place message m on its wire the receiver must know every message that was ready before m.
It waits until m is ready (``s_m + α``), then places, in order, every stamped message of that wire with an
earlier ready time. A message m' ready earlier was sent at ``s' = ready' − α' < ready_m − α'``, and its sender
wrote the stamp right after reading the clock: it is on the board unless the sender was held up for longer than
α' between the two (or a waiting receiver looked later than the arrival, a poll delayed that long). It is checked
as the run goes: a message placed after a later-ready message of its wire, or whose stamp a waiting job found only
after its modelled arrival, is counted as **late** (:attr:`MeterStats.late`; a ``RuntimeWarning`` at the end of
the run); it is placed at ``max(ready, free)`` when found, so the run goes on, but its wire order may differ from
the simulator's.

Limits: one host (one clock, one shared memory); placed schedules and checkpoints are not metered. The receiver's
own time after an arrival (waking, the hand-over) is not the meter's: the simulator charges it as the network's
:attr:`~pipelab.links.Network.receive_overhead`. Reference: the α–β (Hockney) model.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch.distributed as dist

from ..distributed import waiting
from ..links import Link, Network
from ..pipeline.transport import handover_bytes
from ..schedules.dependencies import Job
from ..schedules.transfers import ACT, GRAD, messages
from .trace import Wrapper

__all__ = ["MeteredTransport", "MeterStats", "MeteredMessage", "StampBoard", "POLL_S", "sleep_until"]

#: seconds between two looks at the board of a job waiting for a stamp not written yet (well below the α of a
#: metered link: the look that finds it must come before the message's ready time)
POLL_S = 0.0005

#: a stamp's columns: the run it belongs to (0: none yet), sender's clock at the send, bytes, sender rank
_RUN, _SEND, _BYTES, _SENDER = range(4)


class StampBoard:
    """One row of four float64 per message of a schedule (:func:`pipelab.schedules.transfers.messages`' order):
    the run it belongs to, written last, then the send time, bytes and sender; in a file under ``/dev/shm`` that
    every rank of the default process group maps (rank 0 creates it and removes its name once all have it
    mapped), or in this process's memory when there is one rank. Collective: every rank constructs it."""

    def __init__(self, rows: int) -> None:
        size = max(rows, 1) * 4 * 8
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world == 1:
            self.table = np.zeros((max(rows, 1), 4))
            return
        name: list[Any] = [None]
        if dist.get_rank() == 0:
            fd, name[0] = tempfile.mkstemp(prefix="pipelab-meter-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                           else None)
            os.ftruncate(fd, size)
            os.close(fd)
        dist.broadcast_object_list(name, src=0)
        with open(name[0], "r+b") as fh:
            self._map = mmap.mmap(fh.fileno(), size)
        dist.barrier()
        if dist.get_rank() == 0:
            os.unlink(name[0])
        self.table = np.frombuffer(self._map, dtype=np.float64).reshape(max(rows, 1), 4)


@dataclass(frozen=True)
class MeteredMessage:
    """One message a rank received under the meter; times in ``perf_counter`` seconds (shared by the ranks).

    ``begin``/``arrival``: its transmission on the wire; ``seen``: when this rank found its stamp on the board
    (looking for it, or placing an earlier message of its wire); ``late``: the condition failed for it (module
    docstring); ``asked``/``handed``: when the consuming job asked for it and got it."""

    kind: int
    stage: int
    step: int
    micro: int
    sender: int
    nbytes: int
    send: float
    ready: float
    begin: float
    arrival: float
    seen: float
    late: bool
    asked: float = math.nan
    handed: float = math.nan

    @property
    def overshoot(self) -> float:
        """``handed − max(arrival, asked)``: how long after its modelled arrival the job got the message."""
        return self.handed - max(self.arrival, self.asked)


@dataclass
class MeterStats:
    """What a rank's meter saw in one run: its received messages (in wire order) and how many were late."""

    messages: list[MeteredMessage] = field(default_factory=list)

    @property
    def late(self) -> int:
        return sum(m.late for m in self.messages)

    @property
    def overshoot(self) -> float:
        """Mean :attr:`MeteredMessage.overshoot` over the messages a job waited for (asked before arrival)."""
        waited = [m.overshoot for m in self.messages if m.asked < m.arrival]
        return sum(waited) / len(waited) if waited else 0.0


class MeteredTransport(Wrapper):
    """A rank's transport with the link model applied on receipt (module docstring).

    Other attributes are those of the wrapped transport (:class:`~pipelab.runtime.trace.Wrapper`).

    Args:
        board: the stamps' shared :class:`StampBoard` (``None``: one is created here, a collective call).
        timeout_s: how long a receive waits for a stamp before it raises.

    Raises:
        ValueError: a network for another number of stages.
    """

    _own = ("inner", "network", "board", "timeout_s", "stats", "_row", "_inbound", "_run", "_wires", "_placed",
            "_seen", "_done", "_jobs", "_posted", "_deferred")

    def __init__(self, inner: Any, network: Network, *, board: StampBoard | None = None,
                 timeout_s: float = 120.0) -> None:
        if not isinstance(network, Network):
            raise TypeError(f"network must be a pipelab.links.Network, got {type(network).__name__}")
        if network.D != inner.schedule.D:
            raise ValueError(f"network has {network.D} stages but schedule {inner.schedule.name!r} has "
                             f"{inner.schedule.D}: give one link per boundary (Network.uniform(D, link))")
        msgs = messages(inner.schedule)
        keys = [(m.channel % 2, m.channel // 2, m.t, m.j) for m in msgs]
        s = object.__setattr__
        s(self, "inner", inner)
        s(self, "network", network)
        s(self, "board", board if board is not None else StampBoard(len(msgs)))
        s(self, "timeout_s", float(timeout_s))
        s(self, "stats", MeterStats())
        s(self, "_row", {key: i for i, key in enumerate(keys)})  # (kind, stage, t, j) -> board row
        mine = [(key, m) for key, m in zip(keys, msgs) if m.dst == inner.rank]
        programs = inner.schedule.programs
        s(self, "_inbound", [key for key, _ in mine])
        s(self, "_jobs", {key: (tuple(programs[m.src][m.send_pos][:4]), tuple(programs[m.dst][m.recv_pos][:4]))
                          for key, m in mine})  # its sending and receiving job
        s(self, "_posted", set())  # inbound messages whose receive is posted
        s(self, "_run", 0)
        s(self, "_wires", {})  # wire -> [free, last placed order key]
        s(self, "_placed", {})  # (kind, stage, t, j) -> MeteredMessage placed on a wire, not yet received
        s(self, "_seen", {})  # (kind, stage, t, j) -> when this rank found the stamp on the board
        s(self, "_done", set())  # the messages placed in this run
        s(self, "_deferred", {})  # send_after: the departure job -> stamps to write at its end

    # ------------------------------------------------------------------------------------- the model

    def link(self, kind: int, stage: int) -> Link:
        """The link a message of ``kind`` into ``stage`` crosses: ``forward[stage − 1]`` for its input
        activation, ``backward[stage]`` for the gradient of its output."""
        return self.network.forward[stage - 1] if kind == ACT else self.network.backward[stage]

    def _wire(self, kind: int) -> int:
        return kind if self.network.duplex else 0

    # ------------------------------------------------------------------------------------- per run

    def begin(self, position: int = 0, end: int | None = None) -> None:
        """Start a run of the whole program: stamps of this run carry its number (every rank counts its runs)."""
        program = self.inner.schedule.programs[self.inner.rank]
        if position != 0 or (end is not None and end != len(program)):
            raise ValueError("a metered run covers the whole program: checkpoints (stop_at_step) are not metered")
        self.inner.begin(position, end)
        self.stats = MeterStats()
        self._run += 1
        self._wires.clear()
        self._placed.clear()
        self._seen.clear()
        self._done.clear()
        self._posted.clear()

    # ------------------------------------------------------------------------------------- sending

    def send(self, src: Job, dst: Job, tensor: Any) -> None:
        now = time.perf_counter()
        op, k, t, j = dst
        peer = self.inner.schedule.worker_of(op, k, t, j)
        if peer == self.inner.rank:
            self.inner.send(src, dst, tensor)
            return
        stamp = (self._row[(ACT if op == "F" else GRAD, k, t, j)], handover_bytes(tensor))
        later = self.inner.schedule.send_after.get(tuple(src[:4])) if self.inner.schedule.send_after else None
        if later is not None:  # the tensor leaves at the end of a later job of this rank (Schedule.send_after)
            self._deferred.setdefault(tuple(later), []).append(stamp)
        else:
            self._stamp(*stamp, now)
        self.inner.send(src, dst, tensor)

    def _stamp(self, row: int, nbytes: int, now: float) -> None:
        """Write a stamp to the board, its run number last (a reader takes the row once that matches)."""
        r = self.board.table[row]
        r[_SEND], r[_BYTES], r[_SENDER] = now, nbytes, self.inner.rank
        r[_RUN] = self._run

    def job_done(self, job: Job) -> None:
        """The driver finished ``job``: the stamps of tensors that leave at its end (``send_after``) are written."""
        now = time.perf_counter()
        for row, nbytes in self._deferred.pop(tuple(job[:4]), ()):
            self._stamp(row, nbytes, now)
        self._post_stamped()

    def _post_stamped(self) -> None:
        """Post the receive of every inbound message stamped since the last look (between jobs: gloo moves a
        buffered send's data only once its receive is posted, so a receiver busy past the arrival would
        otherwise wait for that transfer when it asks)."""
        for key in self._inbound:
            if key not in self._posted and self._stamped(key):
                self.inner.post(*self._jobs[key])
                self._posted.add(key)

    # ------------------------------------------------------------------------------------- receiving

    def _stamped(self, key: tuple[int, int, int, int]) -> bool:
        if key in self._done or key in self._seen:
            return True
        if self.board.table[self._row[key], _RUN] != self._run:
            return False
        self._seen[key] = time.perf_counter()
        return True

    def _order(self, key: tuple[int, int, int, int]) -> tuple[float, float, int]:
        send, sender = self.board.table[self._row[key], [_SEND, _SENDER]].tolist()
        return (send + self.link(key[0], key[1]).latency, send, int(sender))

    def _place(self, key: tuple[int, int, int, int], late: bool = False) -> None:
        """Put the stamped message ``key`` on its wire: arrival = max(ready, free) + n/β."""
        send, nbytes, sender = self.board.table[self._row[key], [_SEND, _BYTES, _SENDER]].tolist()
        link = self.link(key[0], key[1])
        ready = send + link.latency
        wire = self._wires.setdefault(self._wire(key[0]), [-math.inf, (-math.inf, -math.inf, -1)])
        out_of_order = (ready, send, sender) < wire[1]
        begin = max(ready, wire[0])
        arrival = begin + link.transmission(nbytes)
        wire[0] = arrival
        if not out_of_order:
            wire[1] = (ready, send, sender)
        seen = self._seen.pop(key)
        msg = MeteredMessage(key[0], key[1], key[2], key[3], int(sender), int(nbytes), send, ready, begin, arrival,
                             seen, out_of_order or (late and seen > arrival))
        self._placed[key] = msg
        self._done.add(key)
        self.stats.messages.append(msg)

    def _wait_stamp(self, key: tuple[int, int, int, int], peer: int) -> bool:
        """Look at the board until ``key``'s stamp is there; whether it was there at the first look."""
        if self._stamped(key):
            return True
        deadline = time.monotonic() + self.timeout_s
        while not self._stamped(key):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rank {self.inner.rank} waited {self.timeout_s:.0f} s for the stamp of {key} "
                                   f"from rank {peer}")
            time.sleep(POLL_S)
        return False

    def receive(self, src: Job, dst: Job) -> Any:
        asked = time.perf_counter()
        op, k, t, j = dst
        peer = self.inner.schedule.worker_of(src[0], src[1], t, j)
        if peer == self.inner.rank:
            return self.inner.receive(src, dst)
        key = (ACT if op == "F" else GRAD, k, t, j)
        self._post_stamped()
        if key not in self._posted:  # the data moves during the hold, not after it
            self.inner.post(src, dst)
            self._posted.add(key)
        with waiting((peer,), f"the metered arrival of step {t}, micro-batch {j}"):
            waited = not self._wait_stamp(key, peer)
            if key not in self._done:
                mine = self._order(key)
                sleep_until(mine[0])  # every message ready before it is on the board by now (the condition)
                wire = self._wire(key[0])
                earlier = [(self._order(x), x) for x in self._inbound if x not in self._done
                           and self._wire(x[0]) == wire and x != key and self._stamped(x)]
                for _, x in sorted(e for e in earlier if e[0] <= mine):
                    self._place(x)
                self._place(key, late=waited)
            msg = self._placed.pop(key)
            sleep_until(msg.arrival)
        out = self.inner.receive(src, dst)
        handed = time.perf_counter()
        i = self.stats.messages.index(msg)
        self.stats.messages[i] = dataclasses.replace(msg, asked=asked, handed=handed)
        return out

    def flush(self) -> None:
        """Complete the run: stamps still deferred, outstanding sends; warn about late messages."""
        now = time.perf_counter()
        for row, nbytes in [x for v in self._deferred.values() for x in v]:
            self._stamp(row, nbytes, now)
        self._deferred.clear()
        self.inner.flush()
        if self.stats.late:
            warnings.warn(f"rank {self.inner.rank}: {self.stats.late} of {len(self.stats.messages)} metered messages "
                          "were late (placed after a later-ready message of their wire, or found after their "
                          "modelled arrival): the machine held a sender or a waiting receiver up for longer than "
                          "the links' latency, and those arrivals may differ from the simulator's", RuntimeWarning,
                          stacklevel=2)

    def held(self) -> int:
        return int(self.inner.held())


def sleep_until(when: float) -> None:
    """Sleep until ``perf_counter()`` reaches ``when`` (at once if it has): the meter's hold. On a loaded machine
    the process runs again some time after ``when`` (its wake-up), :attr:`MeteredMessage.overshoot`."""
    delay = when - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
