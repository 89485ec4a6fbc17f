"""Bounded stores of explicit weight versions, and how many versions each stage must hold.

:class:`VersionRing`: a stage's weight versions keyed by version number. Stored versions are never mutated;
a version is dropped after its last use, and the capacity (the peak number of versions alive at once,
:func:`ring_capacities`) is exactly the number of weight copies a real stage would hold (weight stashing:
D − k at stage k).

Reference: PipeDream's weight stashing (Narayanan et al., SOSP 2019).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from torch import Tensor

from ..schedules.dependencies import Job

__all__ = ["VersionRing", "ring_capacities"]


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
            raise KeyError(f"stage {self.stage}: version {version} is not stored "
                           f"(have {sorted(self._store)})") from None

    def drop(self, version: int) -> None:
        self._store.pop(version, None)

    def versions(self) -> list[int]:
        return list(self._store)

    def __contains__(self, version: object) -> bool:
        return version in self._store

    def __len__(self) -> int:
        return len(self._store)
