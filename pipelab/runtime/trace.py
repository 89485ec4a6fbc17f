"""Measured runs: a per-rank timeline of every job and the bytes each rank sent and received.

Opt-in (``PipelineRuntime(..., record=True)``) and cheap: two ``time.perf_counter()`` reads per job.
:class:`MeasuredTransport` counts the bytes of every hand-over to or from another rank, per kind and peer, and
notes when each receive returned; :class:`JobClock` records every job's times since a t0 taken after a barrier:

    start(job) = when its last receive returned (its input arrived)  if it received from another rank,
                 end of the previous job of this rank                 otherwise,
    end(job)   = when its output was ready: its first send (before posting it, so the record stays causal
                 across ranks), or, for a job that sends nothing, when the driver finished it,
    asked(job) = when it asked for its first input from another rank (NaN if none): the rank's own time from
                 the previous job's end to here (sends, bookkeeping) is its dispatch time.

This is the simulator's rule ``start(j) = max(end of the worker's previous job, arrival of its inputs)`` read off
a real run, so a :class:`Timeline` and a :class:`~pipelab.simulator.SimResult` compare job for job.

On one host the ranks share the monotonic clock and :meth:`JobClock.finish` re-bases them on the earliest t0 (a
rank descheduled after the barrier would shift its timeline by a time slice); across hosts they agree to within
the barrier's exit skew.

Reference: the measured-vs-modelled timelines of PipeDream's profiler (Narayanan et al., SOSP 2019, §3.1).
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from ..pipeline.transport import handover_bytes
from ..schedules.dependencies import Job
from ..schedules.transfers import ACT, GRAD

__all__ = ["JobRecord", "Timeline", "MeasuredTransport", "JobClock"]

#: kind names used in :class:`Timeline`'s byte counters
KINDS = {ACT: "activation", GRAD: "gradient"}


@dataclass(frozen=True)
class JobRecord:
    """One job a rank ran: ``(op, stage, step, micro)`` (``micro`` is −1 for an update) and its times in
    seconds since the rank's t0; ``received``: whether its start waited on a tensor from another rank;
    ``asked``: when it asked for the first such tensor (NaN if it received none)."""

    op: str
    stage: int
    step: int
    micro: int
    start: float
    end: float
    received: bool = False
    asked: float = math.nan

    @property
    def job(self) -> tuple[str, int, int, int]:
        return (self.op, self.stage, self.step, self.micro)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """What one rank measured during a run (see the module docstring).

    Attributes:
        sent, received: bytes by kind (``"activation"``, ``"gradient"``); ``sent_to``, ``received_from``: by peer.
        t0_monotonic: the raw ``perf_counter`` reading taken as t0 (common to all ranks when ``shared_clock``).
    """

    rank: int
    jobs: list[JobRecord] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=lambda: {"activation": 0, "gradient": 0})
    received: dict[str, int] = field(default_factory=lambda: {"activation": 0, "gradient": 0})
    sent_to: dict[int, int] = field(default_factory=dict)
    received_from: dict[int, int] = field(default_factory=dict)
    messages_sent: dict[str, int] = field(default_factory=lambda: {"activation": 0, "gradient": 0})
    messages_received: dict[str, int] = field(default_factory=lambda: {"activation": 0, "gradient": 0})
    t0_monotonic: float = 0.0
    shared_clock: bool = False

    @property
    def makespan(self) -> float:
        """End of this rank's last job (seconds since t0)."""
        return max((r.end for r in self.jobs), default=0.0)

    @property
    def busy(self) -> float:
        """Sum of this rank's job durations."""
        return sum(r.duration for r in self.jobs)

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())


class Wrapper:
    """A transport wrapping ``inner``: attributes outside ``_own`` are read from and written to ``inner`` (which
    must expose ``schedule`` and ``rank``), so ``transport.shape_of`` and ``transport.outbox`` work unchanged."""

    _own: tuple[str, ...] = ("inner",)
    inner: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


class MeasuredTransport(Wrapper):
    """A transport wrapper that counts cross-rank bytes and notes receive times (see the module docstring)."""

    _own = ("inner", "timeline", "arrived", "produced", "asked")

    def __init__(self, inner: Any, timeline: Timeline | None = None) -> None:
        for name in ("schedule", "rank", "send", "receive"):
            if not hasattr(inner, name):
                raise TypeError(f"inner must be a rank's transport with a {name!r} attribute, "
                                f"got {type(inner).__name__}")
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "timeline", timeline if timeline is not None else Timeline(inner.rank))
        object.__setattr__(self, "arrived", None)  # perf_counter when the current job's last receive returned
        object.__setattr__(self, "produced", None)  # perf_counter at the current job's first send
        object.__setattr__(self, "asked", None)  # perf_counter at the current job's first receive from another rank

    @staticmethod
    def _kind(dst: Job) -> str:
        return KINDS[ACT if dst[0] == "F" else GRAD]

    def send(self, src: Job, dst: Job, tensor: Any) -> None:
        if self.produced is None:
            object.__setattr__(self, "produced", time.perf_counter())
        peer = self.inner.schedule.worker_of(*dst[:4])
        self.inner.send(src, dst, tensor)
        if peer != self.inner.rank:
            n = handover_bytes(tensor)
            kind, tl = self._kind(dst), self.timeline
            tl.sent[kind] += n
            tl.messages_sent[kind] += 1
            tl.sent_to[peer] = tl.sent_to.get(peer, 0) + n

    def receive(self, src: Job, dst: Job) -> Any:
        peer = self.inner.schedule.worker_of(src[0], src[1], dst[2], dst[3])
        if peer != self.inner.rank and self.asked is None:
            object.__setattr__(self, "asked", time.perf_counter())
        tensor = self.inner.receive(src, dst)
        if peer != self.inner.rank:
            object.__setattr__(self, "arrived", time.perf_counter())
            n = handover_bytes(tensor)
            kind, tl = self._kind(dst), self.timeline
            tl.received[kind] += n
            tl.messages_received[kind] += 1
            tl.received_from[peer] = tl.received_from.get(peer, 0) + n
        return tensor

    def flush(self) -> None:
        self.inner.flush()

    def held(self) -> int:
        return int(self.inner.held())


class JobClock:
    """Times a rank's jobs as the driver runs them (``after_job`` hook); see the module docstring.

    Args:
        transport: the rank's :class:`MeasuredTransport` (its receive times mark when inputs arrived).
        program: the rank's program (jobs ``(op, k, t, j, ...)``), to name the job at each position.
    """

    def __init__(self, transport: MeasuredTransport, program: Sequence[Any]) -> None:
        self.transport = transport
        self.program = program
        self.t0 = 0.0
        self._last_end = 0.0

    @property
    def timeline(self) -> Timeline:
        return self.transport.timeline

    def begin(self, barrier: bool = True) -> None:
        """Take t0 (after a barrier over the default process group when one is initialised and ``barrier``)."""
        if barrier and dist.is_available() and dist.is_initialized():
            dist.barrier()
        self.t0 = time.perf_counter()
        self._last_end = self.t0
        self.timeline.t0_monotonic = self.t0
        self.transport.arrived = self.transport.produced = self.transport.asked = None

    def finish(self) -> Timeline:
        """Re-base the times on the earliest rank's t0 when all ranks share one host's clock (collective over
        the default process group when one is initialised); return the timeline."""
        tl = self.timeline
        if not (dist.is_available() and dist.is_initialized()):
            return tl
        seen: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(seen, (socket.gethostname(), self.t0))
        if len({host for host, _ in seen}) == 1:
            t0 = min(t for _, t in seen)
            shift = self.t0 - t0
            tl.jobs = [JobRecord(r.op, r.stage, r.step, r.micro, r.start + shift, r.end + shift, r.received,
                                 r.asked + shift) for r in tl.jobs]
            tl.t0_monotonic, tl.shared_clock = t0, True
        return tl

    def job_done(self, position: int) -> None:
        """The driver finished the job at ``position − 1`` of the program (``after_job`` receives the new
        position)."""
        now = time.perf_counter()
        arrived, produced, asked = self.transport.arrived, self.transport.produced, self.transport.asked
        start = self._last_end if arrived is None else max(arrived, self._last_end)
        end = now if produced is None else max(produced, start)
        op, k, t, j = tuple(self.program[position - 1][:4])
        self.timeline.jobs.append(JobRecord(str(op), int(k), int(t), int(j), start - self.t0, end - self.t0,
                                            arrived is not None, math.nan if asked is None else asked - self.t0))
        self._last_end = now
        self.transport.arrived = self.transport.produced = self.transport.asked = None

