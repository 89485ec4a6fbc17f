"""Bounded stores of explicit weight versions, and how many versions each stage must hold.

:class:`VersionRing`: a stage's weight versions keyed by version number. Stored versions are never mutated.
:class:`StageEvents`: a stage's events in execution order, as arrays, with how many of them use each version
and the ring's capacity. A version is dropped when no use of it is left and it is not the newest (the live
weights), so the capacity, the peak number of versions alive at once, is exactly the number of weight copies a
real stage holds (weight stashing: D − k at stage k). Set-up is linear in the jobs: one pass over the order
(:func:`job_columns`), then array operations.

Reference: PipeDream's weight stashing (Narayanan et al., SOSP 2019).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import numpy as np
from torch import Tensor

from ..schedules.dependencies import Job

__all__ = ["VersionRing", "StageEvents", "OPS", "job_columns", "peak_versions"]

#: event codes of :class:`StageEvents` and :func:`job_columns` (an event's op is ``OPS[code]``)
OPS = ("F", "B", "I", "W", "U")
_CODE = {op: i for i, op in enumerate(OPS)}


def job_columns(order: Sequence[Job]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(op code, k, t, j)`` of every job of ``order``, as arrays (one pass over the tuples)."""
    n = len(order)
    ops = np.fromiter(map(_CODE.__getitem__, map(itemgetter(0), order)), np.int8, n)
    return (ops, *(np.fromiter(map(itemgetter(i), order), np.int32, n) for i in (1, 2, 3)))  # type: ignore[return-value]


def peak_versions(born: np.ndarray, last: np.ndarray) -> int:
    """Most versions alive at once: version i (in creation order) appears at position ``born[i]`` and its last use
    is at ``last[i]`` (−1: never used); it stays while it is the newest or until its last use.

    A version counts at the creation of a newer one when its death, max(last use, the next version's creation),
    comes later; the old newest version is gone first when its last use came before (updated in place). The
    count at creation i is therefore 1 + i − #{deaths ≤ born[i]} (later versions die after born[i]).

    Example:
        >>> int(peak_versions(np.array([-1, 2, 6]), np.array([8, 7, -1])))  # versions 0, 1 used after 2 appears
        3
    """
    death = np.maximum(last, np.append(born[1:], np.iinfo(np.int64).max))
    alive = 1 + np.arange(len(born)) - np.searchsorted(np.sort(death), born, side="right")
    return max(1, int(alive.max(initial=1)))


class StageEvents:
    """One stage's (or stage copy's) events in execution order, the uses of each version, and its ring size.

    Args:
        op, t, j: the events (op codes of :data:`OPS`; ``j = -1`` for U), as arrays.
        need: the version each event uses (its spec's stored version, or a prediction's base; −1 for U).
        arrivals: for a copy that receives its versions (:class:`~pipelab.pipeline.placement.FetchedStage`):
            ``(event position, version)`` of each arrival, before that event; default: version 0 before the
            first event and version v + 1 at the v-th U.

    Attributes:
        uses: ``uses[v]``, how many events use version v (a stage executor counts them down as its jobs run).
        capacity: the peak number of versions alive at once (:func:`peak_versions`).
    """

    def __init__(self, op: np.ndarray, t: np.ndarray, j: np.ndarray, need: np.ndarray,
                 arrivals: Sequence[tuple[int, int]] = ()) -> None:
        self.op, self.t, self.j = op, t, j
        used = need >= 0
        # positions doubled, so that an arrival before event p sits at 2p − 1, between two events
        if arrivals:
            born = np.array([2 * p - 1 for p, _ in arrivals], np.int64)
            versions = np.array([v for _, v in arrivals], np.int64)
        else:
            born = np.concatenate([[-1], 2 * np.flatnonzero(op == _CODE["U"])]).astype(np.int64)
            versions = np.arange(len(born))
        n = int(max(versions.max(initial=0), need.max(initial=0))) + 1
        self.uses = np.bincount(need[used], minlength=n)
        last = np.full(n, -1, np.int64)
        np.maximum.at(last, need[used], 2 * np.flatnonzero(used))
        self.capacity = peak_versions(born, last[versions])

    def __len__(self) -> int:
        return len(self.op)

    def __getitem__(self, i: int) -> tuple[str, int, int]:
        return OPS[self.op[i]], int(self.t[i]), int(self.j[i])


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
