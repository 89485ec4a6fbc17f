"""Bounded stores of explicit weight versions, and how many versions each stage must hold.

A version is dropped when no use of it is left and it is not the newest (the live weights), so a ring's
capacity, the peak number of versions alive at once, is exactly the number of weight copies a real stage holds
(weight stashing: D − k at stage k). A ring of copies writes a new version into a dropped one's tensors once nothing
else refers to them, as a real stage reuses its buffers: fresh ones faulted in ~400 pages a step (2BW, width 512).

Reference: PipeDream's weight stashing (Narayanan et al., SOSP 2019).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from operator import itemgetter

import numpy as np
import torch
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
    """Most versions alive at once; version i appears at ``born[i]``, is last used at ``last[i]`` (−1: never).

    A version dies at max(last use, the next version's creation), so the count at creation i is
    ``1 + i − #{deaths ≤ born[i]}``.
    """
    death = np.maximum(last, np.append(born[1:], np.iinfo(np.int64).max))
    alive = 1 + np.arange(len(born)) - np.searchsorted(np.sort(death), born, side="right")
    return max(1, int(alive.max(initial=1)))


class StageEvents:
    """One stage's (or copy's) events in execution order (op codes of :data:`OPS`), its version uses and ring size.

    ``need``: the version each event reads (−1 for U); ``arrivals``: ``(event position, version)`` a fetched copy
    receives (default: version 0 first, v + 1 at the v-th U); ``uses[v]`` is counted down as the jobs run.
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


def _counts(W: Sequence[Tensor]) -> list[tuple[int, int, int]]:
    """Per tensor: its Python references, its TensorImpl's (an autograd graph holds one), its storage's (views)."""
    uses = _STORAGE_USES
    return [(sys.getrefcount(w), w._use_count(), uses(w.untyped_storage()._cdata) if uses else sys.maxsize) for w in W]  # type: ignore[attr-defined]


_STORAGE_USES = getattr(torch._C, "_storage_Use_Count", None)  # private, looked up once: without it nothing is unshared
_PRIVATE = _counts([torch.empty(1)])[0]  # a tensor nothing else refers to, counted the same way


def unshared(W: Sequence[Tensor]) -> bool:
    """Whether nothing but ``W`` refers to its tensors or their memory (a reference, autograd graph or view)."""
    return all(c <= p for counts in _counts(W) for c, p in zip(counts, _PRIVATE))


class VersionRing:
    """Weight versions of one stage by number, at most ``capacity``: leaves never written to, dropped after last use;
    with ``recycle``, dropped ones kept (``capacity`` tensor sets in all) for :meth:`reusable`."""

    def __init__(self, capacity: int, stage: int = 0, recycle: bool = False) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.stage = stage
        self._store: dict[int, tuple[Tensor, ...]] = {}
        self.peak = 0
        self.recycle = recycle
        self._retired: list[tuple[Tensor, ...]] = []

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
        W = self._store.pop(version, None)
        if self.recycle and W is not None and len(self._store) + len(self._retired) < self.capacity:
            self._retired.append(W)

    def reusable(self) -> tuple[Tensor, ...] | None:
        """A dropped version's tensors nothing else refers to (None: none); those still held are let go."""
        while self._retired:
            if unshared(W := self._retired.pop()):
                return W
        return None

    def versions(self) -> list[int]:
        return list(self._store)

    def __contains__(self, version: object) -> bool:
        return version in self._store

    def __len__(self) -> int:
        return len(self._store)
