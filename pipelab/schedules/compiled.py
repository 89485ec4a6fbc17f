"""A schedule compiled to arrays, and its timing: the core shared by the simulator and the validator.

:func:`compile_schedule` flattens the programs and looks up every action's dependencies, read from the one
dependency rule (:mod:`pipelab.schedules.dependencies`); :func:`run` times them. The schedule fixes each
worker's order, so timing needs no search: a job starts at

    start(j) = max( end of the previous job on its worker,
                    max over dependencies d of end(d) + latency(d → j) ),   end(j) = start(j) + cost(j).

:func:`run` resolves this with per-worker cursors and a wait list: a worker advances through its program
until its next job waits on an unfinished dependency, parks on that dependency, and resumes when it
finishes. Every job is examined a bounded number of times, so the cost is linear in the number of actions
(no argmin over a frontier). A worker that can never resume means the program order contradicts the
dependencies (deadlock): :func:`run` reports the blocked workers instead of times.

Op codes: F=0, B=1, U=2, I=3, W=4. Dependency slots: ``dep1``/``dep2`` hold a compute job's data edges in
the order of :func:`~pipelab.schedules.dependencies.edges_into` (for a tensor from another worker, the job
whose end sends it: its producer, or a later job of the producer's worker named by
``Schedule.send_after``); ``dep3`` its weight barrier (:func:`~pipelab.schedules.dependencies.update_dependency`,
at its weight source); an update's weight-gradient jobs are in ``udeps``.

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), pred(s,b,d).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .actions import OPS, Schedule
from .dependencies import barrier_step, edges_into

__all__ = ["Compiled", "compile_schedule", "run", "OP_CODE", "check_cost"]

OP_CODE: dict[str, int] = {op: i for i, op in enumerate(OPS)}
F, B, U, Iop, Wop = (OP_CODE[o] for o in ("F", "B", "U", "I", "W"))


@dataclass
class Compiled:
    """A schedule as flat arrays (one entry per action, workers concatenated in program order).

    Attributes:
        op, stage, step, micro, worker, g: int arrays (g = t·M + j, −1 for U).
        offsets: worker w's actions are ids offsets[w]..offsets[w+1]−1.
        table: table[op, k, g] = id of the compute job (−1 if absent).
        dep1, dep2, dep3: up to three dependency ids per action (−1: none); U's dependencies are in udeps.
        udeps: for U ids, the ids of the gradient jobs of its step (2-D array, one row per U, M columns).
        src: the weight-source worker of each compute job (its own worker for U).
        problems: human-readable problems found while compiling, each with the (worker, position) to mark.
    """

    schedule: Schedule
    op: np.ndarray
    stage: np.ndarray
    step: np.ndarray
    micro: np.ndarray
    worker: np.ndarray
    g: np.ndarray
    offsets: np.ndarray
    table: np.ndarray
    dep1: np.ndarray
    dep2: np.ndarray
    dep3: np.ndarray
    u_ids: np.ndarray
    udeps: np.ndarray
    src: np.ndarray
    problems: list[tuple[str, tuple[int, int] | None]]

    @property
    def n(self) -> int:
        return len(self.op)

    def position(self, i: int) -> tuple[int, int]:
        """(worker, index in the worker's program) of action id i."""
        w = int(self.worker[i])
        return w, int(i - self.offsets[w])


def compile_schedule(s: Schedule) -> Compiled:
    """Flatten ``s`` into arrays, look up dependencies, and collect structural problems (never raises)."""
    D, M, T, Wn = s.D, s.M, s.steps, s.W
    G = T * M
    lens = [len(p) for p in s.programs]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = [a for p in s.programs for a in p]
    n = len(flat)
    problems: list[tuple[str, tuple[int, int] | None]] = []
    if n == 0:
        z = np.zeros(0, np.int64)
        return Compiled(s, z, z, z, z, z, z, offsets, np.full((5, D, G), -1), z, z, z, z,
                        np.zeros((0, M), np.int64), z, [("the schedule has no actions", None)])
    ops, stages, steps, micros, _ = (list(c) for c in zip(*flat))
    try:
        op = np.array([OP_CODE[o] for o in ops], np.int64)
    except KeyError:
        first_bad = next(i for i, o in enumerate(ops) if o not in OP_CODE)
        op = np.array([OP_CODE.get(o, -1) for o in ops], np.int64)
        problems.append((f"unknown op {ops[first_bad]!r} (allowed: {', '.join(OPS)})", None))
    stage = np.asarray(stages, np.int64)
    step = np.asarray(steps, np.int64)
    micro = np.asarray(micros, np.int64)
    worker = np.repeat(np.arange(Wn, dtype=np.int64), lens)
    ids = np.arange(n, dtype=np.int64)

    def where(i: int) -> tuple[int, int]:
        w = int(worker[i])
        return w, int(i - offsets[w])

    isu = op == U
    bad = (op < 0) | (stage < 0) | (stage >= D) | (step < 0) | (step >= T) | np.where(isu, micro != -1,
                                                                                        (micro < 0) | (micro >= M))
    for i in np.flatnonzero(bad)[:3]:
        problems.append((f"action {flat[i]} is out of range (D={D}, steps={T}, M={M}; U has micro=-1)", where(i)))
    ok = ~bad
    g = np.where(isu, -1, step * M + micro)

    # Compute jobs: each (op, k, g) at most once.
    table = np.full((5, D, G), -1, np.int64)
    comp = ok & ~isu
    ci = ids[comp]
    keys = (op[ci] * D + stage[ci]) * G + g[ci]
    order = np.argsort(keys, kind="stable")
    dup = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    for d in dup[:3]:
        i = ci[order][d + 1]
        problems.append((f"job {flat[i]} of step {step[i]} appears more than once", where(i)))
    uniq, first = np.unique(keys, return_index=True)
    table.reshape(-1)[uniq] = ci[first]  # the first occurrence counts; later duplicates are reported
    has = table >= 0
    split = has[Iop] | has[Wop]
    # Completeness: F always; B, or I and W.
    miss = []
    if not has[F].all():
        miss.append(("F", np.argwhere(~has[F])))
    if (split & has[B]).any():
        k, gg = np.argwhere(split & has[B])[0]
        problems.append((f"stage {k} micro-batch g={gg} has both B and I/W", where(int(table[B, k, gg]))))
    if not (has[B] | (has[Iop] & has[Wop])).all():
        miss.append(("B (or I and W)", np.argwhere(~(has[B] | (has[Iop] & has[Wop])))))
    for name, where_missing in miss:
        k, gg = where_missing[0]
        problems.append((f"{len(where_missing)} {name} job(s) missing, e.g. stage {k} of step {gg // M} "
                         f"micro-batch {gg % M}", None))

    # Updates: U(k, t) exactly once on each holder of stage k.
    hidx = np.full((D, Wn), -1, np.int64)
    for k, hs in enumerate(s.weight_holders):
        hidx[k, list(hs)] = np.arange(len(hs))
    H = max(len(h) for h in s.weight_holders)
    u_tab = np.full((D, T, H), -1, np.int64)
    ui = ids[ok & isu]
    hpos = hidx[stage[ui], worker[ui]]
    for i in ui[hpos < 0][:3]:
        problems.append((f"update U{stage[i]} of step {step[i]} on worker {worker[i]}, which does not hold "
                         f"stage {stage[i]}'s weights (holders {s.weight_holders[stage[i]]})", where(i)))
    ui, hpos = ui[hpos >= 0], hpos[hpos >= 0]
    ukeys = (stage[ui] * T + step[ui]) * H + hpos
    uorder = np.argsort(ukeys, kind="stable")
    for d in np.flatnonzero(ukeys[uorder][1:] == ukeys[uorder][:-1])[:3]:
        i = ui[uorder][d + 1]
        problems.append((f"update U{stage[i]} of step {step[i]} appears twice on worker {worker[i]}", where(i)))
    uq, ufirst = np.unique(ukeys, return_index=True)
    u_tab.reshape(-1)[uq] = ui[ufirst]
    n_needed = sum(len(h) for h in s.weight_holders) * T
    if (u_tab >= 0).sum() < n_needed:
        for k, hs in enumerate(s.weight_holders):
            for t in range(T):
                for hi, h in enumerate(hs):
                    if u_tab[k, t, hi] < 0:
                        problems.append((f"update U{k} of step {t} missing on holder worker {h}", None))
                        break
                else:
                    continue
                break
            else:
                continue
            break

    # Dependencies: the data edges of the one rule, vectorised per op and slot.
    dep1 = np.full(n, -1, np.int64)
    dep2 = np.full(n, -1, np.int64)
    dep3 = np.full(n, -1, np.int64)
    gradjob = np.where(has[B], table[B], table[Iop])  # the job that sends stage k's input gradient
    wjob = np.where(has[B], table[B], table[Wop])  # the job that finishes stage k's weight gradient
    depart = _departures(s, table, worker, ids, problems, where)
    for name in ("F", "B", "I", "W"):
        sel = ids[ok & (op == OP_CODE[name])]
        k, gg = stage[sel], g[sel]
        for slot, edge in zip((dep1, dep2), edges_into(name)):
            kk = k + edge.stage
            m = (kk >= 0) & (kk < D)
            producer = gradjob if edge.on == "grad" else table[OP_CODE[edge.on]]
            p = producer[kk[m], gg[m]]
            if depart is not None and edge.carries is not None:
                # a tensor for another worker leaves at its departure job (Schedule.send_after)
                cross = (p >= 0) & (worker[np.maximum(p, 0)] != worker[sel[m]])
                p = np.where(cross, depart[np.maximum(p, 0)], p)
            slot[sel[m]] = p
    src = worker.copy()
    comp_ids = ids[comp]
    if comp_ids.size:
        k, w = stage[comp_ids], worker[comp_ids]
        first = np.array([hs[0] for hs in s.weight_holders], np.int64)
        own = hidx[k, w] >= 0
        src[comp_ids] = np.where(own, w, first[k])
        if s.sync_lag is not None:
            tt = barrier_step(step[comp_ids], s.sync_lag)
            m = tt >= 0
            sel = comp_ids[m]
            dep3[sel] = u_tab[k[m], tt[m], hidx[k[m], src[sel]]]
    u_ids = ui[uorder] if ui.size else ui
    if u_ids.size:
        ks, ts = stage[u_ids], step[u_ids]
        udeps = wjob[ks[:, None], ts[:, None] * M + np.arange(M)[None, :]]
    else:
        udeps = np.zeros((0, M), np.int64)
    return Compiled(s, op, stage, step, micro, worker, g, offsets, table, dep1, dep2, dep3, u_ids, udeps, src,
                    problems)


def _departures(s: Schedule, table: np.ndarray, worker: np.ndarray, ids: np.ndarray,
                problems: list[tuple[str, tuple[int, int] | None]], where: Callable[[int], tuple[int, int]]
                ) -> np.ndarray | None:
    """For every action id, the id of the job whose end sends its tensor to another worker: itself, or
    ``Schedule.send_after``'s later job (which must exist, on the same worker, not before it); None when
    the schedule has no ``send_after``."""
    if not s.send_after:
        return None
    D, G = table.shape[1], table.shape[2]
    depart = ids.copy()

    def find(job: tuple[str, int, int, int]) -> int:
        op, k, t, j = job
        gg = t * s.M + j
        ok = 0 <= k < D and 0 <= j < s.M and 0 <= gg < G
        return int(table[OP_CODE[op], k, gg]) if ok else -1

    for job, later in s.send_after.items():
        i, d = find(job), find(later)
        if i < 0 or d < 0:
            missing = job if i < 0 else later
            problems.append((f"send_after names {missing[0]}{missing[1]}.{missing[3]} of step {missing[2]}, which "
                             f"is not a job of the schedule", None if i < 0 else where(i)))
            continue
        if worker[d] != worker[i] or d < i:
            problems.append((f"send_after: {s.programs[worker[i]][where(i)[1]]} (step {job[2]}) cannot send after "
                             f"{later[0]}{later[1]}.{later[3]} (step {later[2]}), which is "
                             + ("on another worker" if worker[d] != worker[i] else "earlier on its worker"),
                             where(i)))
            continue
        depart[i] = d
    return depart


def _per_stage(name: str, value: float | Sequence[float] | np.ndarray, D: int, *, positive: bool) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if np.ndim(value) == 0:  # a number, numpy scalar or 0-d array: the same for every stage
        arr = np.full(D, arr[0])
    if arr.shape != (D,):
        raise ValueError(f"{name} must be a scalar or one value per stage (D={D}), got shape {arr.shape}")
    return _checked_costs(name, arr, arr.tolist(), positive)


def _checked_costs(name: str, arr: np.ndarray, shown: object, positive: bool) -> np.ndarray:
    """The one rule for costs: finite, and > 0 (``positive``) or >= 0; ``shown`` is what the message quotes."""
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {shown}")
    if positive and np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0 for every stage, got {shown}")
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0 (negative costs are meaningless), got {shown}")
    return arr


def check_cost(name: str, value: object, *, positive: bool = False) -> float:
    """One scalar cost (a time, in any unit) as a float, by the simulator's rule for costs.

    Raises:
        TypeError: ``value`` not a real number (a bool or a string included).
        ValueError: NaN or ±inf, negative, or not > 0 when ``positive``.

    Example:
        >>> check_cost("t_w", 0.5)
        0.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(_checked_costs(name, np.array([float(value)]), value, positive)[0])


Cost = float | Sequence[float] | np.ndarray


def job_costs(c: Compiled, f_cost: Cost, b_cost: Cost, u_cost: Cost, i_cost: Cost | None = None,
              w_cost: Cost | None = None) -> np.ndarray:
    """Cost of every action: per-stage F/B (I/W default to half of B each), scalar or per-stage U."""
    D = c.schedule.D
    fc = _per_stage("f_cost", f_cost, D, positive=True)
    bc = _per_stage("b_cost", b_cost, D, positive=True)
    uc = _per_stage("u_cost", u_cost, D, positive=False)
    ic = bc / 2 if i_cost is None else _per_stage("i_cost", i_cost, D, positive=True)
    wc = bc / 2 if w_cost is None else _per_stage("w_cost", w_cost, D, positive=True)
    table = np.stack([fc, bc, uc, ic, wc])  # rows in op-code order
    # Clipping keeps malformed actions (reported by compile) drawable in the validator's grid.
    return table[np.clip(c.op, 0, 4), np.clip(c.stage, 0, D - 1)]


def run(c: Compiled, cost: np.ndarray, lat1: np.ndarray, lat2: np.ndarray, lat3: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Time every action of ``c`` (see the module docstring).

    Args:
        cost: duration of each action.
        lat1, lat2, lat3: latency added to dep1/dep2/dep3's end (transfers between workers).

    Returns:
        (start, end, seq, blocked): times, the order in which jobs were timed (a dependency-respecting
        topological order), and for a deadlock the list of (worker, program position) that can never run
        (empty when everything ran; then start/end are complete).
    """
    n = c.n
    W = c.schedule.W
    start = [0.0] * n
    end = [-1.0] * n
    seqs = [0] * n
    d1, d2, d3 = c.dep1.tolist(), c.dep2.tolist(), c.dep3.tolist()
    l1, l2, l3 = lat1.tolist(), lat2.tolist(), lat3.tolist()
    cst = cost.tolist()
    slots = ((d1, l1), (d2, l2), (d3, l3))
    udeps = {int(u): row for u, row in zip(c.u_ids.tolist(), c.udeps.tolist())}
    ucursor: dict[int, tuple[int, float]] = {}
    offs = c.offsets.tolist()
    ptr = offs[:-1]
    stop = offs[1:]
    free = [0.0] * W
    waiting: dict[int, list[int]] = {}
    stack = list(range(W - 1, -1, -1))
    seq = 0
    while stack:
        w = stack.pop()
        i = ptr[w]
        e_w = stop[w]
        t_free = free[w]
        while i < e_w:
            t0 = t_free
            blocked_on = -1
            for deps, lats in slots:  # dep1..dep3: the data edges and the weight barrier
                j = deps[i]
                if j >= 0:
                    e = end[j]
                    if e < 0:
                        blocked_on = j
                        break
                    e += lats[i]
                    if e > t0:
                        t0 = e
            if blocked_on >= 0:
                waiting.setdefault(blocked_on, []).append(w)
                break
            row = udeps.get(i)
            if row is not None:
                pos, tmax = ucursor.pop(i, (0, 0.0))
                blocked = False
                for p in range(pos, len(row)):
                    e = end[row[p]]
                    if e < 0:
                        ucursor[i] = (p, tmax)
                        waiting.setdefault(row[p], []).append(w)
                        blocked = True
                        break
                    if e > tmax:
                        tmax = e
                if blocked:
                    break
                if tmax > t0:
                    t0 = tmax
            start[i] = t0
            t_free = t0 + cst[i]
            end[i] = t_free
            seqs[i] = seq
            seq += 1
            ws = waiting.pop(i, None)
            if ws is not None:
                stack.extend(ws)
            i += 1
        ptr[w] = i
        free[w] = t_free
    stuck = [(w, ptr[w] - offs[w]) for w in range(W) if ptr[w] < stop[w]]
    return np.asarray(start), np.asarray(end), np.asarray(seqs), stuck
