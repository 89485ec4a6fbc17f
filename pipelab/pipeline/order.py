"""Execution order: the schedule's order, except that a job waits for the weight versions it needs.

For every realisable policy this is the schedule's own order; for the oracle (true future weights) jobs wait,
which turns any schedule into sequential training.

Reference: PipeOptim's oracle-free prediction vs. waiting (Guan et al., arXiv:2312.00839, §III).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable

from ..schedules.dependencies import Job, dependencies
from ..schedules.versions import VersionTable

__all__ = ["resolve_order", "DeadlockError"]


class DeadlockError(ValueError):
    """No event can run: some job needs a weight version that depends on its own result."""


def resolve_order(table: VersionTable, needs: Callable[[Job], int]) -> list[Job]:
    """Execution order: the schedule's order, except that a job waits for the versions it needs.

    An event is ready when its data dependencies ran and its stage has reached version ``needs(event)``; among
    ready events the earliest in the schedule runs first.

    Raises:
        DeadlockError: events remain but none is ready (a job needs a version its own gradient helps produce,
            e.g. SpecTrain's round-trip target with a perfect predictor).
    """
    order, D, M = table.order, table.D, table.M
    index = table.index
    unmet = [0] * len(order)
    children: dict[int, list[int]] = defaultdict(list)
    waiting: dict[tuple[int, int], list[int]] = defaultdict(list)
    version = [0] * D
    for i, key in enumerate(order):
        for dep in dependencies(key, D, M, table.split_set):
            d = index.get(dep)
            if d is None:
                raise ValueError(f"event {key} depends on {dep}, which the schedule never runs")
            children[d].append(i)
            unmet[i] += 1
        v = needs(key)
        if v > 0:
            waiting[(key[1], v)].append(i)
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
