"""Metered transport: the link model of :mod:`pipelab.links` applied for real, so a slow link runs on one machine.

:class:`MeteredTransport` wraps a rank's point-to-point transport (:class:`~pipelab.runtime.p2p.P2PTransport`).
The tensors travel as before (so the weights are those of an unmetered run, bit for bit); what changes is *when*
a receiving job gets its input. For every message to another rank:

- the **sender** stamps it with ``time.perf_counter()`` (``CLOCK_MONOTONIC`` on Linux: one clock for the
  machine's processes) when the model says it is sent; the stamp travels on a process group of its own, taken in
  by a thread of the receiver;
- the **receiver** keeps its inbound wire(s) as the simulator does (:mod:`pipelab.links`: ready at s + α_L,
  arrival = max(ready, free) + n/β_L), and the consuming job sleeps until the arrival. Same-rank hand-overs are free.

**Condition.** To place message m on its wire the receiver must know every message that was ready before m.
It waits until m is ready (``s_m + α``), then commits, in order, every message it knows with an earlier
ready time. A message m' ready earlier was sent at ``s' = ready' − α' < ready_m − α'``, so its stamp is here
provided local delivery takes less than α' — true for α of a few milliseconds against microseconds of
delivery, on a machine that is not overloaded. It is checked as the run goes: a message whose stamp is taken
in after its modelled arrival, or after a message ready later was already placed on its wire, is counted as
**late** (:attr:`MeterStats.late`; a ``RuntimeWarning`` at the end of the run); a late message is placed at
``max(ready, free)`` when it is seen, so the run goes on, but its wire order may differ from the simulator's.

Limits: one host (one clock); placed schedules and checkpoints are not metered. Reference: the α–β (Hockney)
model.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..distributed import waiting
from ..links import Link, Network
from ..pipeline.transport import handover_bytes
from ..schedules.dependencies import Job
from ..schedules.transfers import ACT, GRAD, messages
from .trace import Wrapper

__all__ = ["MeteredTransport", "MeterStats", "MeteredMessage", "sleep_until"]

#: a stamp: sender's clock at the send, bytes, kind (ACT/GRAD), receiving stage, step, micro-batch, sender rank
_STAMP = 7


@dataclass(frozen=True)
class MeteredMessage:
    """One message a rank received under the meter; times in ``perf_counter`` seconds (shared by the ranks).

    ``begin``/``arrival``: its transmission on the wire; ``seen``: when the stamp was taken in; ``late``: the
    condition failed for it (module docstring); ``asked``/``handed``: when the consuming job asked for it and got
    it."""

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
        group: the process group the stamps travel on (``None``: one is created here, a collective call).
        timeout_s: how long a receive waits for a stamp before it raises.

    Raises:
        ValueError: a network for another number of stages.
    """

    _own = ("inner", "network", "group", "timeout_s", "stats", "_lock", "_cond", "_stamps", "_wires", "_placed",
            "_thread", "_sends", "_expect", "_deferred", "_error")
    _thread: threading.Thread | None
    _error: Exception | None

    def __init__(self, inner: Any, network: Network, *, group: Any = None, timeout_s: float = 120.0) -> None:
        if not isinstance(network, Network):
            raise TypeError(f"network must be a pipelab.links.Network, got {type(network).__name__}")
        if network.D != inner.schedule.D:
            raise ValueError(f"network has {network.D} stages but schedule {inner.schedule.name!r} has "
                             f"{inner.schedule.D}: give one link per boundary (Network.uniform(D, link))")
        s = object.__setattr__
        s(self, "inner", inner)
        s(self, "network", network)
        s(self, "group", group if group is not None else dist.new_group(backend="gloo"))
        s(self, "timeout_s", float(timeout_s))
        s(self, "stats", MeterStats())
        s(self, "_lock", threading.Lock())
        s(self, "_cond", threading.Condition(self._lock))
        s(self, "_stamps", {})  # (kind, stage, t, j) -> (send, nbytes, sender, seen) taken in, not yet placed
        s(self, "_wires", {})  # wire -> [free, last placed order key]
        s(self, "_placed", {})  # (kind, stage, t, j) -> MeteredMessage placed on a wire, not yet received
        s(self, "_thread", None)
        s(self, "_sends", [])  # stamp sends not waited on
        s(self, "_expect", 0)
        s(self, "_deferred", {})  # send_after: the departure job -> stamps to send at its end
        s(self, "_error", None)

    # ------------------------------------------------------------------------------------- the model

    def link(self, kind: int, stage: int) -> Link:
        """The link a message of ``kind`` into ``stage`` crosses: ``forward[stage − 1]`` for its input
        activation, ``backward[stage]`` for the gradient of its output."""
        return self.network.forward[stage - 1] if kind == ACT else self.network.backward[stage]

    def _wire(self, kind: int) -> int:
        return kind if self.network.duplex else 0

    # ------------------------------------------------------------------------------------- per run

    def begin(self, position: int = 0, end: int | None = None) -> None:
        """Start a run of the whole program: the stamp thread expects one stamp per message to this rank."""
        program = self.inner.schedule.programs[self.inner.rank]
        if position != 0 or (end is not None and end != len(program)):
            raise ValueError("a metered run covers the whole program: checkpoints (stop_at_step) are not metered")
        self.inner.begin(position, end)
        self.stats = MeterStats()
        self._wires.clear()
        self._expect = sum(1 for m in messages(self.inner.schedule) if m.dst == self.inner.rank)
        self._error = None
        thread = threading.Thread(target=self._take_stamps, args=(self._expect,), daemon=True,
                                  name=f"pipelab-meter-{self.inner.rank}")
        self._thread = thread
        thread.start()

    def _take_stamps(self, n: int) -> None:
        """The receiver's thread: take in ``n`` stamps from any sender as they come (blocking receives)."""
        try:
            for _ in range(n):
                buf = torch.empty(_STAMP, dtype=torch.float64)
                dist.recv(buf, group=self.group)
                seen = time.perf_counter()
                send, nbytes, kind, k, t, j, sender = buf.tolist()
                key = (int(kind), int(k), int(t), int(j))
                with self._cond:
                    self._stamps[key] = (send, int(nbytes), int(sender), seen)
                    # a stamp ready before a message already placed on its wire: the condition failed
                    wire = self._wires.get(self._wire(key[0]))
                    if wire is not None and (send + self.link(key[0], key[1]).latency, send, sender) < wire[1]:
                        self._place(key)
                    self._cond.notify_all()
        except Exception as exc:  # reported by the next receive
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    # ------------------------------------------------------------------------------------- sending

    def send(self, src: Job, dst: Job, tensor: Any) -> None:
        now = time.perf_counter()
        op, k, t, j = dst
        peer = self.inner.schedule.worker_of(op, k, t, j)
        if peer == self.inner.rank:
            self.inner.send(src, dst, tensor)
            return
        kind = ACT if op == "F" else GRAD
        stamp = [now, handover_bytes(tensor), kind, k, t, j, self.inner.rank]
        later = self.inner.schedule.send_after.get(tuple(src[:4])) if self.inner.schedule.send_after else None
        if later is not None:  # the tensor leaves at the end of a later job of this rank (Schedule.send_after)
            self._deferred.setdefault(tuple(later), []).append((peer, stamp))
        else:
            self._stamp(peer, stamp)  # the stamp first: the receiver's wire waits on stamps, not on the data
        self.inner.send(src, dst, tensor)

    def _stamp(self, peer: int, stamp: list[Any]) -> None:
        self._sends.append(dist.isend(torch.tensor(stamp, dtype=torch.float64), peer, group=self.group))

    def job_done(self, job: Job) -> None:
        """The driver finished ``job``: the stamps of tensors that leave at its end (``send_after``) go out now."""
        for peer, stamp in self._deferred.pop(tuple(job[:4]), ()):
            stamp[0] = time.perf_counter()
            self._stamp(peer, stamp)

    # ------------------------------------------------------------------------------------- receiving

    def _order(self, key: tuple[int, int, int, int]) -> tuple[float, float, int]:
        send, _, sender, _ = self._stamps[key]
        return (send + self.link(key[0], key[1]).latency, send, sender)

    def _place(self, key: tuple[int, int, int, int]) -> None:
        """Put the stamped message ``key`` on its wire (under the lock): arrival = max(ready, free) + n/β."""
        send, nbytes, sender, seen = self._stamps.pop(key)
        link = self.link(key[0], key[1])
        ready = send + link.latency
        wire = self._wires.setdefault(self._wire(key[0]), [-math.inf, (-math.inf, -math.inf, -1)])
        out_of_order = (ready, send, sender) < wire[1]
        begin = max(ready, wire[0])
        arrival = begin + link.transmission(nbytes)
        wire[0] = arrival
        if not out_of_order:
            wire[1] = (ready, send, sender)
        msg = MeteredMessage(key[0], key[1], key[2], key[3], sender, nbytes, send, ready, begin, arrival, seen,
                             out_of_order or seen > arrival)
        self._placed[key] = msg
        self.stats.messages.append(msg)

    def _wait_stamp(self, key: tuple[int, int, int, int], peer: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while key not in self._stamps and key not in self._placed:
                if self._error is not None:
                    raise RuntimeError(f"rank {self.inner.rank}'s meter stopped taking stamps") from self._error
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())) \
                        and time.monotonic() >= deadline:
                    raise TimeoutError(f"rank {self.inner.rank} waited {self.timeout_s:.0f} s for the stamp of "
                                       f"{key} from rank {peer}")

    def receive(self, src: Job, dst: Job) -> Any:
        asked = time.perf_counter()
        op, k, t, j = dst
        peer = self.inner.schedule.worker_of(src[0], src[1], t, j)
        if peer == self.inner.rank:
            return self.inner.receive(src, dst)
        key = (ACT if op == "F" else GRAD, k, t, j)
        what = f"the metered arrival of step {t}, micro-batch {j}"
        with waiting((peer,), what):
            self._wait_stamp(key, peer)
            with self._cond:
                ready = None if key in self._placed else self._order(key)[0]
            if ready is not None:
                sleep_until(ready)  # every message ready before it has been stamped by now (the condition)
                with self._cond:
                    if key not in self._placed:
                        wire = self._wire(key[0])
                        mine = self._order(key)
                        for other in sorted((x for x in self._stamps if self._wire(x[0]) == wire
                                             and self._order(x) <= mine), key=self._order):
                            self._place(other)
            with self._cond:
                msg = self._placed.pop(key)
            sleep_until(msg.arrival)
        out = self.inner.receive(src, dst)
        handed = time.perf_counter()
        with self._cond:
            i = self.stats.messages.index(msg)
            self.stats.messages[i] = dataclasses.replace(msg, asked=asked, handed=handed)
        return out

    def flush(self) -> None:
        """Complete the run: outstanding sends (stamps included) and the stamp thread; warn about late messages."""
        for peer, stamp in [x for v in self._deferred.values() for x in v]:
            self._stamp(peer, stamp)
        self._deferred.clear()
        self.inner.flush()
        for work in self._sends:
            work.wait()
        self._sends.clear()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"rank {self.inner.rank}'s meter did not receive its {self._expect} stamps")
            self._thread = None
        if self._error is not None:
            raise RuntimeError(f"rank {self.inner.rank}'s meter stopped taking stamps") from self._error
        if self.stats.late:
            warnings.warn(f"rank {self.inner.rank}: {self.stats.late} of {len(self.stats.messages)} metered messages "
                          "were late (stamped after their modelled arrival, or out of their wire's order): local "
                          "delivery was not small against the links' latency, and those arrivals may differ from "
                          "the simulator's", RuntimeWarning, stacklevel=2)

    def held(self) -> int:
        return int(self.inner.held())


def sleep_until(when: float) -> None:
    """Sleep until ``perf_counter()`` reaches ``when`` (at once if it has): the meter's hold. On a loaded machine
    the process runs again some time after ``when`` (its wake-up), :attr:`MeteredMessage.overshoot`."""
    delay = when - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
