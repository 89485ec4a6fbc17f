"""Execution order: the schedule's order, except that a job waits for the weight versions it needs.

:func:`resolve_order` runs a ready-queue over the version table's execution order. An event runs once its
data dependencies ran (the one rule, :func:`pipelab.schedules.dependencies.dependencies`) *and* the weight
versions its policy asks for exist. For every realisable policy the result is the schedule's own order;
for the oracle (true future weights) jobs wait, which turns any schedule into sequential training. A policy
that needs a version depending on its own gradient is reported as a :class:`DeadlockError`.

Example:
    >>> from pipelab.schedules import pipedream
    >>> from pipelab.simulator import simulate
    >>> table = simulate(pipedream(D=2, M=1, steps=3)).version_table
    >>> resolve_order(table, lambda job: 0) == list(table.order)
    True

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

    An event is *ready* when its data dependencies ran (F after the previous stage's F, B after its F and
    the next stage's B, U(k, t) after every B(k, t, ·); I and W as B when the backward is split) and its
    stage k has reached version ``needs(event)``. Among ready events the earliest in the schedule runs first.

    Args:
        table: version table of the schedule's execution sequence.
        needs: ``job -> v``, the version of its own stage a job needs (0 for none).

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
