"""Weight versions for the emulator: the version table, bounded version rings, and the execution order.

Stage k's weights after v optimizer updates are *version v*, ``W_k^(v)``. Three pieces live here:

- :class:`VersionTable`: for an ordered execution sequence of F/B/U events (the simulator's), the version
  of stage k current when every job ran, ``cur(job)``, and the version its own update is applied to,
  ``own(k, t)`` (the version current just before ``U(k, t)``). The staleness of a job is
  ``own(k, t) − cur(job)`` (see :mod:`pipelab`). :meth:`VersionTable.version_at` answers "which version did stage
  k have when event i started?" (SpecTrain's round-trip target needs it).
- :func:`resolve_order`: a ready-queue over the schedule order. An event runs once its data dependencies
  ran *and* the weight versions it needs exist. For every realisable policy the result is the schedule's
  own order; for the oracle (true future weights) jobs wait, which turns any schedule into sequential
  training. A policy that needs a version depending on its own gradient is reported as a deadlock.
- :class:`VersionRing`: a bounded store of explicit weight tensors keyed by version number. Stored
  versions are never mutated; a version is dropped after its last use, and the capacity (the peak number
  of versions alive at once, :func:`ring_capacities`) is exactly the number of weight copies a real
  stage would hold.

Example:
    >>> from pipelab.schedules import Action
    >>> order = [Action("F", 0, 0, 0), Action("B", 0, 0, 0), Action("U", 0, 0, -1), Action("F", 0, 1, 0)]
    >>> table = VersionTable.from_order(order, D=1, M=1, steps=2)
    >>> table.current[("F", 0, 1, 0)], table.own[(0, 0)]
    (1, 0)

Reference: PipeDream's weight versions (Narayanan et al., SOSP 2019); PipeOptim's version difference
(Guan et al., arXiv:2312.00839, §III-A2).
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

__all__ = ["JobKey", "VersionTable", "VersionRing", "resolve_order", "ring_capacities", "DeadlockError"]

#: ``(op, stage, step, micro)``; ``micro = -1`` for ``U``.
JobKey = tuple[str, int, int, int]


class DeadlockError(ValueError):
    """No event can run: some job needs a weight version that depends on its own result."""


def _key(a: Any) -> JobKey:
    return (a.op, int(a.stage), int(a.step), int(a.micro) if a.op != "U" else -1)


@dataclass
class VersionTable:
    """Versions of every job of an execution sequence.

    Attributes:
        D, M, steps: stages, micro-batches per step, steps.
        order: the execution sequence as :data:`JobKey` s (each ``U(k, t)`` once).
        current: ``cur(job)``, the version of the job's stage current when it ran (F and B jobs).
        own: ``own(k, t)``, the version that ``U(k, t)`` updates (its gradient is applied to it).
        index: position of every event in ``order``.
        round_trip: optional ``R(job)``, the version of the job's stage when its micro-batch's round trip
            ends (the backward at stage 0 starts), from the simulator (SpecTrain's target).
        counted: the table obtained by counting updates along ``order`` (set by the simulator adapter).
        source: the simulation result the table came from, if any.
    """

    D: int
    M: int
    steps: int
    order: list[JobKey]
    current: dict[JobKey, int]
    own: dict[tuple[int, int], int]
    index: dict[JobKey, int] = field(default_factory=dict)
    round_trip: dict[JobKey, int] | None = None
    counted: "VersionTable | None" = None
    source: Any = None
    _updates: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.index:
            self.index = {key: i for i, key in enumerate(self.order)}
        if not self._updates:
            ups: dict[int, list[int]] = defaultdict(list)
            for i, (op, k, _, _) in enumerate(self.order):
                if op == "U":
                    ups[k].append(i)
            self._updates = dict(ups)

    @classmethod
    def from_order(cls, order: Iterable[Any], D: int, M: int, steps: int) -> "VersionTable":
        """Count updates along an execution sequence of actions (objects with op/stage/step/micro).

        ``U(k, t)`` listed more than once (several weight holders, e.g. data parallelism) counts once;
        ops other than F/B/U (a split backward's I/W) are not supported by the emulator.
        """
        keys: list[JobKey] = []
        seen_u: set[tuple[int, int]] = set()
        for a in order:
            if a.op not in ("F", "B", "U"):
                raise ValueError(f"the emulator runs F/B/U events only, got op {a.op!r} ({a}); "
                                 "use a schedule without a split backward")
            if a.op == "U":
                if (a.stage, a.step) in seen_u:
                    continue
                seen_u.add((a.stage, a.step))
            keys.append(_key(a))
        version = [0] * D
        current: dict[JobKey, int] = {}
        own: dict[tuple[int, int], int] = {}
        for key in keys:
            op, k, t, _ = key
            if not 0 <= k < D:
                raise ValueError(f"event {key} names stage {k}, outside 0..{D - 1}")
            if op == "U":
                own[(k, t)] = version[k]
                version[k] += 1
            else:
                current[key] = version[k]
        return cls(D, M, steps, keys, current, own)

    def version_at(self, k: int, index: int) -> int:
        """Version of stage k when the event at position ``index`` of :attr:`order` starts."""
        return bisect.bisect_left(self._updates.get(k, []), index)

    def round_trip_target(self, key: JobKey) -> int:
        """R(job): stage k's version when micro-batch (t, j)'s backward at stage 0 starts.

        From the simulator when available (updates ending strictly before that moment); otherwise counted
        along :attr:`order` (updates placed before that backward).
        """
        if self.round_trip is not None:
            return self.round_trip[key]
        _, k, t, j = key
        return self.version_at(k, self.index[("B", 0, t, j)])

    def staleness(self, key: JobKey) -> int:
        """``own(k, t) − cur(job)`` for an F or B job."""
        op, k, t, _ = key
        return self.own[(k, t)] - self.current[key]

    def max_staleness(self) -> list[int]:
        """Largest staleness of any F/B job, per stage."""
        out = [0] * self.D
        for key in self.current:
            out[key[1]] = max(out[key[1]], self.staleness(key))
        return out

    def compare(self, other: "VersionTable") -> list[str]:
        """Differences with another table (empty when both assign the same versions)."""
        diffs = []
        for key, v in self.current.items():
            w = other.current.get(key)
            if w != v:
                diffs.append(f"cur{key}: {v} vs {w}")
        for key, v in self.own.items():
            w = other.own.get(key)
            if w != v:
                diffs.append(f"own{key}: {v} vs {w}")
        if len(self.current) != len(other.current):
            diffs.append(f"{len(self.current)} vs {len(other.current)} jobs")
        return diffs


def _dependencies(key: JobKey, D: int, M: int) -> list[JobKey]:
    op, k, t, j = key
    if op == "F":
        return [("F", k - 1, t, j)] if k > 0 else []
    if op == "B":
        return [("F", k, t, j)] + ([("B", k + 1, t, j)] if k < D - 1 else [])
    return [("B", k, t, jj) for jj in range(M)]


def resolve_order(table: VersionTable, needs: Mapping[JobKey, Sequence[tuple[int, int]]]) -> list[JobKey]:
    """Execution order: the schedule's order, except that a job waits for the versions it needs.

    An event is *ready* when its data dependencies ran (F after the previous stage's F, B after its F and
    the next stage's B, U(k, t) after every B(k, t, ·)) and, for every ``(k, v)`` in ``needs[event]``,
    stage k has reached version v. Among ready events the earliest in the schedule runs first.

    Args:
        table: version table of the schedule's execution sequence.
        needs: ``(stage, version)`` requirements per F/B job.

    Returns:
        The executed order (equal to ``table.order`` when every needed version already exists).

    Raises:
        DeadlockError: when events remain but none is ready (a job needs a version that its own gradient
            helps produce, e.g. SpecTrain's round-trip target with a perfect predictor).
    """
    order, D, M = table.order, table.D, table.M
    index = table.index
    unmet = [0] * len(order)
    children: dict[int, list[int]] = defaultdict(list)
    waiting: dict[tuple[int, int], list[int]] = defaultdict(list)
    version = [0] * D
    for i, key in enumerate(order):
        for dep in _dependencies(key, D, M):
            d = index.get(dep)
            if d is None:
                raise ValueError(f"event {key} depends on {dep}, which the schedule never runs")
            children[d].append(i)
            unmet[i] += 1
        for k, v in needs.get(key, ()):
            if v > 0:
                waiting[(k, v)].append(i)
                unmet[i] += 1
    ready = [i for i in range(len(order)) if unmet[i] == 0]
    heapq.heapify(ready)
    out: list[JobKey] = []

    def release(i: int) -> None:
        unmet[i] -= 1
        if unmet[i] == 0:
            heapq.heappush(ready, i)

    while ready:
        i = heapq.heappop(ready)
        key = order[i]
        out.append(key)
        for c in children.pop(i, ()):
            release(c)
        if key[0] == "U":
            k = key[1]
            version[k] += 1
            for c in waiting.pop((k, version[k]), ()):
                release(c)
    if len(out) != len(order):
        stuck = [order[i] for i in range(len(order)) if unmet[i] > 0][:6]
        raise DeadlockError(f"{len(order) - len(out)} events can never run; e.g. {stuck}: they wait for weight "
                            "versions that need their own gradients (a perfect predictor of a target beyond the "
                            "job's own update is not realisable)")
    return out


def ring_capacities(order: Sequence[JobKey], uses: Mapping[JobKey, Sequence[tuple[int, int]]], D: int
                    ) -> tuple[list[int], dict[tuple[int, int], int]]:
    """Peak number of versions stage k must hold, and the last use of every ``(stage, version)``.

    A version is alive from its creation (version 0 at the start, version v+1 at ``U``) while it is the
    newest version (the live weights) or until its last use by a job in ``order``.

    Returns:
        ``(capacity per stage, last_use)`` with ``last_use[(k, v)]`` a position in ``order``.
    """
    last_use: dict[tuple[int, int], int] = {}
    for i, key in enumerate(order):
        for kv in uses.get(key, ()):
            last_use[kv] = i
    version = [0] * D
    alive: list[set[int]] = [{0} for _ in range(D)]
    peak = [1] * D
    expiring: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for kv, i in last_use.items():
        expiring[i].append(kv)
    for i, key in enumerate(order):
        if key[0] == "U":
            k = key[1]
            old = version[k]
            version[k] += 1
            if last_use.get((k, old), -1) <= i:  # updated in place: no copy of the old version remains
                alive[k].discard(old)
            alive[k].add(version[k])
            peak[k] = max(peak[k], len(alive[k]))
        for k, v in expiring.pop(i, ()):
            if v != version[k]:
                alive[k].discard(v)
        for k, v in uses.get(key, ()):
            if v > version[k]:  # the job used a version that is not produced yet: the order is wrong
                raise ValueError(f"job {key} uses version {v} of stage {k} before it exists")
    return peak, last_use


class VersionRing:
    """Explicit weight versions of one stage, keyed by version number, at most ``capacity`` at once.

    Stored tensors are leaves (``requires_grad`` when asked) that are never written to; :meth:`put`
    stores a fresh version, :meth:`drop` forgets one after its last use.

    Example:
        >>> import torch
        >>> ring = VersionRing(capacity=2)
        >>> ring.put(0, [torch.zeros(2)]); ring.put(1, [torch.ones(2)]); ring.drop(0)
        >>> sorted(ring.versions())
        [1]
    """

    def __init__(self, capacity: int, stage: int = 0) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.stage = stage
        self._store: dict[int, tuple[Tensor, ...]] = {}
        self.peak = 0

    def put(self, version: int, tensors: Sequence[Tensor]) -> None:
        if version in self._store:
            raise ValueError(f"stage {self.stage}: version {version} is already stored (versions are immutable)")
        if len(self._store) >= self.capacity:
            raise RuntimeError(f"stage {self.stage}: version ring full ({self.capacity} versions: "
                               f"{sorted(self._store)}) when storing version {version}")
        self._store[version] = tuple(tensors)
        self.peak = max(self.peak, len(self._store))

    def get(self, version: int) -> tuple[Tensor, ...]:
        try:
            return self._store[version]
        except KeyError:
            raise KeyError(f"stage {self.stage}: version {version} is not stored (have {sorted(self._store)})") from None

    def drop(self, version: int) -> None:
        self._store.pop(version, None)

    def versions(self) -> list[int]:
        return list(self._store)

    def __contains__(self, version: object) -> bool:
        return version in self._store

    def __len__(self) -> int:
        return len(self._store)
