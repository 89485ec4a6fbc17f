"""The version table of an execution sequence: which weight version every job runs at.

Stage k's weights after v optimizer updates are *version v*, ``W_k^(v)``. :class:`VersionTable`: for an
ordered execution sequence of F/B/U events (the simulator's), the version of stage k current when every job
ran, ``cur(job)``, and the version its own update is applied to, ``own(k, t)`` (the version current just
before ``U(k, t)``). The staleness of a job is ``own(k, t) − cur(job)`` (DESIGN §3).
:meth:`VersionTable.version_at` answers "which version did stage k have when event i started?" (SpecTrain's
round-trip target needs it).

The execution order a policy's waiting implies lives in :mod:`pipelab.pipeline.order`, the bounded stores
of weight versions in :mod:`pipelab.pipeline.rings`.

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
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobKey", "VersionTable"]

#: ``(op, stage, step, micro)``; ``micro = -1`` for ``U``.
JobKey = tuple[str, int, int, int]


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
