"""Weight versions for the emulator: bounded version rings and the execution order.

Stage k's weights after v optimizer updates are *version v*, ``W_k^(v)``; which version every job uses
comes from the one version table (:class:`pipelab.schedules.VersionTable`). Two pieces live here:

- :func:`resolve_order`: a ready-queue over the table's execution order. An event runs once its data
  dependencies ran (:func:`pipelab.schedules.dependencies.dependencies`) *and* the weight versions it needs
  exist. For every realisable policy the result is the schedule's own order; for the oracle (true future
  weights) jobs wait, which turns any schedule into sequential training. A policy that needs a version
  depending on its own gradient is reported as a deadlock.
- :class:`VersionRing`: a bounded store of explicit weight tensors keyed by version number. Stored
  versions are never mutated; a version is dropped after its last use, and the capacity (the peak number
  of versions alive at once, :func:`ring_capacities`) is exactly the number of weight copies a real
  stage would hold.

Example:
    >>> from pipelab.schedules import pipedream
    >>> from pipelab.simulator import simulate
    >>> table = simulate(pipedream(D=2, M=1, steps=3)).version_table
    >>> resolve_order(table, {}) == list(table.order)
    True

Reference: PipeDream's weight versions (Narayanan et al., SOSP 2019); PipeOptim's version difference
(Guan et al., arXiv:2312.00839, §III-A2).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence

from torch import Tensor

from ..schedules import VersionTable
from ..schedules.dependencies import Job, dependencies

__all__ = ["VersionRing", "resolve_order", "ring_capacities", "DeadlockError"]

class DeadlockError(ValueError):
    """No event can run: some job needs a weight version that depends on its own result."""


def resolve_order(table: VersionTable, needs: Mapping[Job, Sequence[tuple[int, int]]]) -> list[Job]:
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
        for dep in dependencies(key, D, M):
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
    out: list[Job] = []

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


def ring_capacities(order: Sequence[Job], uses: Mapping[Job, Sequence[tuple[int, int]]], D: int
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
