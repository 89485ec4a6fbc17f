"""Validate a schedule (or a simulated timeline) and print its worker × time grid on failure.

Invariants checked by :func:`validate`:

1. every action is well formed (known op, stage in 0..D−1, step in 0..T−1, micro-batch in 0..M−1);
2. every job exactly once: F(k,g) and B(k,g) (or I and W) for all k, g; U(k,t) once on each holder of
   stage k and nowhere else;
3. dependencies respected: F(k,g) after F(k−1,g); B(D−1,g) after F(D−1,g); B(k,g) after B(k+1,g) and
   F(k,g); U(k,t) after all B(k,·) of step t; jobs after their weight barrier. Programs are fixed orders,
   so this means the orders admit an execution (no worker waits on a job that is stuck behind it);
4. for a :class:`~pipelab.simulator.SimResult`: no worker runs two jobs at once and every job starts
   after its dependencies ended (plus transfer latency).

A failure raises :class:`ScheduleError` with the worker × time grid (unit costs) and the offending cell
marked ``>>…<<``. Cost: linear in the number of actions (one compile, one timing pass).

Example:
    >>> from pipelab.schedules import gpipe, validate
    >>> validate(gpipe(D=4, M=8))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .actions import Schedule, gc_paused
from .compiled import Compiled, Timing, compile_schedule, job_costs, run
from .dependencies import received_from

__all__ = ["ScheduleError", "validate", "format_grid", "unit_timeline"]


class ScheduleError(ValueError):
    """A schedule violates an invariant; the message includes the worker × time grid."""


def unit_timeline(s: Schedule, c: Compiled | None = None) -> tuple[Compiled, Timing]:
    """Time ``s`` with unit F/B/I/W costs, zero-cost updates and no latency (for grids and checks)."""
    c = compile_schedule(s) if c is None else c
    cost = job_costs(c, 1.0, 1.0, 0.0, 1.0, 1.0)
    z = np.zeros(c.n)
    return c, run(c, cost, z, z, z)


def format_grid(s: Schedule, mark: tuple[int, int] | None = None, *, max_cols: int = 36,
                max_rows: int = 16, timeline: Any = None) -> str:
    """Text grid of ``s``: one row per worker, one column per unit of time, cells like ``F2.5`` (op, stage,
    micro-batch); ``*`` after a cell: the worker applies an update right after it.

    Args:
        mark: (worker, program position) of the cell to mark ``>>…<<``; a job that never ran (deadlock) is
            drawn after the worker's last job.
        max_cols, max_rows: window size; the window is centred on the mark.
    """
    cells, horizon = _cells(s, mark, unit_timeline(s) if timeline is None else timeline)
    mcol = next((col for (w, col), v in cells.items() if v.startswith(">>")), 0)
    c0 = max(0, min(mcol - max_cols // 2, horizon - max_cols))
    r0 = max(0, min((mark[0] if mark else 0) - max_rows // 2, s.W - max_rows))
    cols, rows = range(c0, min(horizon, c0 + max_cols)), range(r0, min(s.W, r0 + max_rows))
    width = max([len(v) for v in cells.values()] + [4])
    lines = [f"{s.name}: worker × time grid (unit costs; cols {cols.start}..{cols.stop - 1} of {horizon}, "
             f"workers {rows.start}..{rows.stop - 1} of {s.W})", "t=   " + " ".join(f"{t:<{width}}" for t in cols)]
    lines += [f"w{w:<3} " + " ".join(f"{cells.get((w, t), '.'):<{width}}" for t in cols) for w in rows]
    return "\n".join(lines)


def _cells(s: Schedule, mark: tuple[int, int] | None, timeline: Any) -> tuple[dict[tuple[int, int], str], int]:
    """The grid's cells ``(worker, column) -> text`` and its width in columns, from a unit-cost timeline."""
    c, (start, end, *_) = timeline
    ran = end >= 0
    horizon = int(np.ceil(end[ran].max())) if ran.any() else 0
    cells: dict[tuple[int, int], str] = {}
    for w in range(s.W):
        lo, hi = int(c.offsets[w]), int(c.offsets[w + 1])
        last = None
        for i in range(lo, hi):
            a, marked = s.programs[w][i - lo], mark == (w, i - lo)
            if not ran[i]:  # the first job that never ran (deadlock), after the worker's last job
                col = int(np.ceil(end[lo:i][ran[lo:i]].max())) if ran[lo:i].any() else 0
                cells[(w, col)] = f">>{a}<<" if marked else str(a) + "?"
                horizon = max(horizon, col + 1)
                break
            col = int(round(start[i]))
            if a.op == "U":  # drawn as a star after the worker's previous job
                if last is not None and not cells[last].endswith("*"):
                    cells[last] += "*"
                if marked:
                    cells[(w, col)] = f">>{a}<<"
                continue
            label = f">>{a}<<" if marked else str(a)
            if (w, col) in cells:  # two jobs in one slot (only in corrupted timelines)
                label = cells[(w, col)] + "|" + label
            cells[(w, col)] = label
            last = (w, col)
    return cells, horizon


def _fail(s: Schedule, msg: str, mark: tuple[int, int] | None, timeline: Any = None) -> None:
    raise ScheduleError(msg + "\n" + format_grid(s, mark, timeline=timeline))


@gc_paused
def validate(obj: Any) -> None:
    """Check the invariants of a :class:`Schedule` or of a simulated ``SimResult``; raise on the first failure.

    Args:
        obj: a :class:`Schedule`, or a result of :func:`pipelab.simulator.simulate`.

    Raises:
        ScheduleError: with the worker × time grid and the offending cell marked.
        TypeError: for anything else.
    """
    if isinstance(obj, Schedule):
        _validate_schedule(obj)
        return
    if hasattr(obj, "schedule") and hasattr(obj, "start") and hasattr(obj, "compiled"):
        _validate_schedule(obj.schedule, obj.compiled)
        _validate_timeline(obj)
        return
    raise TypeError(f"validate() takes a Schedule or a SimResult, got {type(obj).__name__}")


def _validate_schedule(s: Schedule, c: Compiled | None = None) -> None:
    c = compile_schedule(s) if c is None else c
    if c.problems:
        msg, where = c.problems[0]
        extra = f" (+{len(c.problems) - 1} more problems)" if len(c.problems) > 1 else ""
        _fail(s, f"invalid schedule {s.name!r}: {msg}{extra}", where)
    tl = unit_timeline(s, c)
    blocked = tl[1][3]
    if not blocked:
        return
    end = tl[1][1]
    at = {w: pos for w, pos in blocked}

    def waits_for(i: int) -> int:
        for d in (int(c.dep1[i]), int(c.dep2[i]), int(c.dep3[i])):
            if d >= 0 and end[d] < 0:
                return d
        if int(c.op[i]) == 2:  # an update: the first unfinished gradient of its step
            row = c.udeps[int(np.searchsorted(c.u_ids, i))]
            return next(int(d) for d in row if end[d] < 0)
        return -1

    def action(i: int) -> Any:
        w, pos = c.position(i)
        return s.programs[w][pos]

    def late(i: int, d: int) -> str:
        """The producer whose tensor job i waits for and which leaves after job d (Schedule.send_after)."""
        a, dep = action(i), action(d)
        for p in received_from((a.op, a.stage, a.step, a.micro), s.D, s.split_set):
            if s.send_after.get(p) == (dep.op, dep.stage, dep.step, dep.micro):
                return f"{p[0]}{p[1]}.{p[3]}"
        return ""

    # Follow "waits for" from worker to worker until a worker repeats: that job closes the cycle.
    w, seen = blocked[0][0], []
    while w not in seen:
        seen.append(w)
        d = waits_for(int(c.offsets[w]) + at[w])
        if d < 0:
            break
        w = int(c.worker[d])
    pos = at[w]
    i = int(c.offsets[w]) + pos
    a = s.programs[w][pos]
    d = waits_for(i)
    why = ""
    if d >= 0:
        dw, dpos = c.position(d)
        dep = s.programs[dw][dpos]
        place = "later on the same worker" if dw == w else f"at position {dpos} on worker {dw}, behind a blocked job"
        why = f"; it waits for {dep} (step {dep.step}), which is {place}"
    # a wait in the cycle on a tensor sent late (Schedule.send_after) is the likely cause: name it
    for v in seen[seen.index(w):]:
        j = int(c.offsets[v]) + at[v]
        dj = waits_for(j)
        if dj >= 0 and (p := late(j, dj)):
            why += f"; worker {v}'s {action(j)} waits for {action(dj)}, after which {p} sends its tensor (send_after)"
            break
    _fail(s, f"dependency violated in {s.name!r}: worker {w}'s action {a} (step {a.step}, position {pos}) "
             f"can never run{why}; {len(blocked)} worker(s) blocked (deadlock)", (w, pos), tl)


def _validate_timeline(r: Any) -> None:
    s, c = r.schedule, r.compiled
    start, end = np.asarray(r.start), np.asarray(r.end)
    tol = 1e-9 * max(1.0, float(np.abs(end).max()) if end.size else 1.0)
    if np.any(end < start - tol):
        i = int(np.flatnonzero(end < start - tol)[0])
        _fail(s, f"{s.name!r}: action {s.programs[c.worker[i]][c.position(i)[1]]} ends before it starts",
              c.position(i))
    for w in range(s.W):
        lo, hi = int(c.offsets[w]), int(c.offsets[w + 1])
        o = lo + np.argsort(start[lo:hi], kind="stable")
        over = np.flatnonzero(start[o][1:] < end[o][:-1] - tol)
        if over.size:
            i, prev = int(o[over[0] + 1]), int(o[over[0]])
            _fail(s, f"{s.name!r}: worker {w} runs two jobs at once: {s.programs[w][c.position(prev)[1]]} "
                     f"[{start[prev]:g}, {end[prev]:g}) and {s.programs[w][c.position(i)[1]]} starting at "
                     f"{start[i]:g}", c.position(i))
    for dep, lat in ((c.dep1, r.latency[0]), (c.dep2, r.latency[1]), (c.dep3, r.latency[2])):
        m = dep >= 0
        bad = np.flatnonzero(m & (start < np.where(m, end[dep] + lat, -np.inf) - tol))
        if bad.size:
            i = int(bad[0])
            d = int(dep[i])
            _fail(s, f"{s.name!r}: {s.programs[c.worker[i]][c.position(i)[1]]} starts at {start[i]:g} before its "
                     f"dependency {s.programs[c.worker[d]][c.position(d)[1]]} ended (+latency) at "
                     f"{end[d] + lat[i]:g}", c.position(i))
    if c.u_ids.size:
        last = end[c.udeps].max(axis=1)
        bad = np.flatnonzero(start[c.u_ids] < last - tol)
        if bad.size:
            i = int(c.u_ids[bad[0]])
            _fail(s, f"{s.name!r}: update {s.programs[c.worker[i]][c.position(i)[1]]} of step {c.step[i]} starts "
                     f"before all its gradients are done", c.position(i))
