"""From the simulator's result to the emulator's :class:`~pipelab.emulator.versions.VersionTable`.

The emulator replays :meth:`pipelab.simulator.SimResult.order` (every F, B, U in an order where each job
sees exactly the updates that ended before it started) and takes every job's version from the
simulator's version table (``forward``, ``backward``, ``update_version``), never from rank arithmetic.
SpecTrain's round-trip targets come from :meth:`pipelab.schedules.VersionTable.round_trip_difference`.

Example:
    >>> from pipelab.schedules import pipedream
    >>> t = table_from(pipedream(D=4, M=1, steps=8))
    >>> [t.staleness(("F", k, 6, 0)) for k in range(4)]
    [3, 2, 1, 0]
"""

from __future__ import annotations

from typing import Any

from .versions import VersionTable

__all__ = ["table_from", "simulate_schedule"]


def simulate_schedule(schedule: Any) -> Any:
    """Simulate a ``Schedule`` with unit F/B costs (an existing simulation result is returned as is)."""
    if hasattr(schedule, "version_table") and hasattr(schedule, "order"):
        return schedule
    from ..schedules import Schedule
    from ..simulator import simulate

    if not isinstance(schedule, Schedule):
        raise TypeError("schedule must be a pipelab.schedules.Schedule, a simulation result or a VersionTable, "
                        f"got {type(schedule).__name__}")
    return simulate(schedule)


def table_from(schedule: Any) -> VersionTable:
    """The emulator's version table of a schedule or a simulation result."""
    sim = simulate_schedule(schedule)
    s = sim.schedule
    if getattr(s, "split_backward", False):
        raise ValueError(f"schedule {s.name!r} splits the backward into I/W jobs; the emulator runs F/B/U only")
    vt = sim.version_table
    order = sim.order()
    table = VersionTable.from_order(order, s.D, s.M, s.steps)
    D, T, M = s.D, s.steps, s.M
    fw, bw, uv = vt.forward, vt.backward, vt.update_version
    rt_f = vt.round_trip_difference("F")
    rt_b = vt.round_trip_difference("B")
    current, own, target = {}, {}, {}
    for k in range(D):
        for t in range(T):
            own[(k, t)] = int(uv[k, t])
            for j in range(M):
                current[("F", k, t, j)] = int(fw[k, t, j])
                current[("B", k, t, j)] = int(bw[k, t, j])
                target[("F", k, t, j)] = int(fw[k, t, j] + rt_f[k, t, j])
                target[("B", k, t, j)] = int(bw[k, t, j] + rt_b[k, t, j])
    counted = VersionTable(D, M, T, table.order, table.current, table.own)
    table.current, table.own = current, own
    table.round_trip = target
    table.counted = counted  # versions obtained by counting updates along the replay order
    table.source = sim
    return table
