"""A schedule compiled to arrays, and its timing: the core shared by the simulator and the validator.

The schedule fixes each worker's order, so timing needs no search: a job starts at

    start(j) = max( end of the previous job on its worker + dispatch(j),
                    max over dependencies d of end(d) + latency(d → j) ),   end(j) = start(j) + cost(j).

``dispatch`` (default 0) is the worker's own time between two jobs (a runtime's bookkeeping, posting and handing
over tensors): it delays the job but not its inputs, which may still be on their way meanwhile.

Op codes: F=0, B=1, U=2, I=3, W=4. ``dep1``/``dep2``: a compute job's data edges in the order of
:func:`~pipelab.schedules.dependencies.edges_into` (across workers: the job whose end sends the tensor);
``dep3``: its weight barrier at its weight source; ``udeps``: an update's weight-gradient jobs.

:func:`run` is linear in the actions. Its inputs are lists of shared objects (one float per distinct cost) and flat
8-byte arrays (dependency ids, ends): 10^5 distinct retained objects, an int per id or a float per end, miss the
cache as the loop jumps between workers. Dependencies met by program order are dropped. A worker advances while its
next job's dependencies have ended (``end`` is ∞ until timed and −∞ at "none", so a start is one max), else parks
on the first unfinished one. When no worker can advance, the earliest ready message crosses its wire (arrival =
max(ready, wire free) + transmission): every earlier-ready message is queued by then, so each wire serves its
messages in ready order; its consumer may start at arrival + the receiver's overhead (``Wires.overhead``, off the
wire). A worker that never resumes is a deadlock (``blocked``).

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), pred(s,b,d).
"""

from __future__ import annotations

import math
from array import array
from bisect import insort
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from .actions import OPS, Schedule
from .dependencies import barrier_step, edges_into

__all__ = ["Compiled", "compile_schedule", "run", "Wires", "Timing", "OP_CODE", "check_cost"]

OP_CODE: dict[str, int] = {op: i for i, op in enumerate(OPS)}
F, B, U, Iop, Wop = (OP_CODE[o] for o in ("F", "B", "U", "I", "W"))


@dataclass
class Compiled:
    """A schedule as flat arrays (one entry per action, workers concatenated in program order).

    Attributes:
        g: t·M + j (−1 for U); offsets: worker w's ids are offsets[w]..offsets[w+1]−1.
        table: table[op, k, g] = id of the compute job (−1 if absent).
        udeps: per U, the ids of its step's gradient jobs (one row per U, M columns).
        src: each compute job's weight-source worker (its own for U).
        problems: structural problems found, each with the (worker, position) to mark.
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
    """Flatten ``s`` into arrays, look up dependencies, and collect structural problems (never raises).

    Steps: ``_flatten`` (actions out of range), ``_job_table`` (duplicated or missing F, B / I, W), ``_update_table``
    (updates on non-holders, twice, or missing), ``_data_edges`` (dep1/dep2, moved to ``send_after``'s departure
    job), ``_weight_edges`` (weight source, barrier dep3, each update's gradient jobs).
    """
    c, ok = _flatten(s)
    if c.n:
        _job_table(c, ok)
        u_tab, hidx = _update_table(c, ok)
        _data_edges(c, ok)
        _weight_edges(c, ok, u_tab, hidx)
    return c


def _flatten(s: Schedule) -> tuple[Compiled, np.ndarray]:
    D, M, T = s.D, s.M, s.steps
    lens = [len(p) for p in s.programs]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = list(chain.from_iterable(s.programs))
    n = len(flat)
    codes = defaultdict(lambda: -1, OP_CODE)
    op = np.fromiter(map(codes.__getitem__, map(itemgetter(0), flat)), np.int64, n)
    stage, step, micro = (np.fromiter(map(itemgetter(f), flat), np.int64, n) for f in (1, 2, 3))
    z = np.full(n, -1, np.int64)
    c = Compiled(s, op, stage, step, micro, np.repeat(np.arange(s.W, dtype=np.int64), lens), z, offsets,
                 np.full((5, D, T * M), -1, np.int64), z.copy(), z.copy(), z.copy(), z[:0], np.zeros((0, M), np.int64),
                 z.copy(), [] if n else [("the schedule has no actions", None)])
    if (op < 0).any():
        bad = flat[int(np.argmax(op < 0))].op
        c.problems.append((f"unknown op {bad!r} (allowed: {', '.join(OPS)})", None))
    isu = op == U
    wrong = (op < 0) | (stage < 0) | (stage >= D) | (step < 0) | (step >= T) | np.where(isu, micro != -1,
                                                                                          (micro < 0) | (micro >= M))
    for i in np.flatnonzero(wrong)[:3].tolist():
        c.problems.append((f"action {flat[i]} is out of range (D={D}, steps={T}, M={M}; U has micro=-1)",
                           c.position(i)))
    c.g = np.where(isu, -1, step * M + micro)
    return c, ~wrong


def _job_table(c: Compiled, ok: np.ndarray) -> None:
    """Each compute job (op, k, g) at most once; F always, and B or I and W."""
    D, G, M = c.table.shape[1], c.table.shape[2], c.schedule.M
    ci = np.flatnonzero(ok & (c.op != U))
    keys = (c.op[ci] * D + c.stage[ci]) * G + c.g[ci]
    order = np.argsort(keys, kind="stable")
    for d in np.flatnonzero(keys[order][1:] == keys[order][:-1])[:3].tolist():
        i = int(ci[order][d + 1])
        c.problems.append((f"job {c.schedule.programs[c.worker[i]][c.position(i)[1]]} of step {c.step[i]} appears "
                           "more than once", c.position(i)))
    uniq, first = np.unique(keys, return_index=True)
    c.table.reshape(-1)[uniq] = ci[first]  # the first occurrence counts; later duplicates are reported
    has = c.table >= 0
    both = (has[Iop] | has[Wop]) & has[B]
    if both.any():
        k, gg = np.argwhere(both)[0]
        c.problems.append((f"stage {k} micro-batch g={gg} has both B and I/W", c.position(int(c.table[B, k, gg]))))
    for name, missing in (("F", ~has[F]), ("B (or I and W)", ~(has[B] | (has[Iop] & has[Wop])))):
        if missing.any():
            k, gg = np.argwhere(missing)[0]
            c.problems.append((f"{int(missing.sum())} {name} job(s) missing, e.g. stage {k} of step {gg // M} "
                               f"micro-batch {gg % M}", None))


def _update_table(c: Compiled, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """U(k, t) exactly once on each holder of stage k: returns u_tab[k, t, h] (the update's id on the h-th holder)
    and hidx[k, w] (w's rank among stage k's holders, −1 if none); sets ``u_ids`` in (k, t, holder) order."""
    s, stage, step, worker = c.schedule, c.stage, c.step, c.worker
    D, T = s.D, s.steps
    hidx = np.full((D, s.W), -1, np.int64)
    for k, hs in enumerate(s.weight_holders):
        hidx[k, list(hs)] = np.arange(len(hs))
    H = max(len(h) for h in s.weight_holders)
    u_tab = np.full((D, T, H), -1, np.int64)
    ui = np.flatnonzero(ok & (c.op == U))
    hpos = hidx[stage[ui], worker[ui]]
    for i in ui[hpos < 0][:3].tolist():
        c.problems.append((f"update U{stage[i]} of step {step[i]} on worker {worker[i]}, which does not hold "
                           f"stage {stage[i]}'s weights (holders {s.weight_holders[stage[i]]})", c.position(i)))
    ui, hpos = ui[hpos >= 0], hpos[hpos >= 0]
    ukeys = (stage[ui] * T + step[ui]) * H + hpos
    uorder = np.argsort(ukeys, kind="stable")
    for d in np.flatnonzero(ukeys[uorder][1:] == ukeys[uorder][:-1])[:3].tolist():
        i = int(ui[uorder][d + 1])
        c.problems.append((f"update U{stage[i]} of step {step[i]} appears twice on worker {worker[i]}",
                           c.position(i)))
    uq, ufirst = np.unique(ukeys, return_index=True)
    u_tab.reshape(-1)[uq] = ui[ufirst]
    needed = np.arange(H)[None, None, :] < np.array([len(h) for h in s.weight_holders])[:, None, None]
    if (needed & (u_tab < 0)).any():
        k, t, h = np.argwhere(needed & (u_tab < 0))[0]
        c.problems.append((f"update U{k} of step {t} missing on holder worker {s.weight_holders[k][h]}", None))
    c.u_ids = ui[uorder]
    return u_tab, hidx


def _data_edges(c: Compiled, ok: np.ndarray) -> None:
    """dep1/dep2: the data edges of the one rule (:func:`edges_into`), vectorised per op and slot."""
    D, has = c.schedule.D, c.table >= 0
    gradjob = np.where(has[B], c.table[B], c.table[Iop])  # the job that sends stage k's input gradient
    depart = _departures(c)
    for name in ("F", "B", "I", "W"):
        sel = np.flatnonzero(ok & (c.op == OP_CODE[name]))
        k, gg = c.stage[sel], c.g[sel]
        for slot, edge in zip((c.dep1, c.dep2), edges_into(name)):
            kk = k + edge.stage
            m = (kk >= 0) & (kk < D)
            p = (gradjob if edge.on == "grad" else c.table[OP_CODE[edge.on]])[kk[m], gg[m]]
            if depart is not None and edge.carries is not None:
                # a tensor for another worker leaves at its departure job (Schedule.send_after)
                cross = (p >= 0) & (c.worker[np.maximum(p, 0)] != c.worker[sel[m]])
                p = np.where(cross, depart[np.maximum(p, 0)], p)
            slot[sel[m]] = p


def _weight_edges(c: Compiled, ok: np.ndarray, u_tab: np.ndarray, hidx: np.ndarray) -> None:
    """``src`` (own worker if it holds the stage, else the first holder), barrier dep3 there, and ``udeps``."""
    s, has = c.schedule, c.table >= 0
    c.src = c.worker.copy()
    comp = np.flatnonzero(ok & (c.op != U))
    k, w = c.stage[comp], c.worker[comp]
    first = np.array([hs[0] for hs in s.weight_holders], np.int64)
    c.src[comp] = np.where(hidx[k, w] >= 0, w, first[k])
    if s.sync_lag is not None:
        tt = barrier_step(c.step[comp], s.sync_lag)
        m = tt >= 0
        c.dep3[comp[m]] = u_tab[k[m], tt[m], hidx[k[m], c.src[comp[m]]]]
    wjob = np.where(has[B], c.table[B], c.table[Wop])  # the job that finishes stage k's weight gradient
    ks, ts = c.stage[c.u_ids], c.step[c.u_ids]
    c.udeps = wjob[ks[:, None], ts[:, None] * s.M + np.arange(s.M)[None, :]]


def _departures(c: Compiled) -> np.ndarray | None:
    """Per id, the job whose end sends its tensor: itself or its ``send_after`` job; None without ``send_after``."""
    s, table, worker = c.schedule, c.table, c.worker
    if not s.send_after:
        return None
    D, G = table.shape[1], table.shape[2]
    depart = np.arange(c.n, dtype=np.int64)

    def find(job: tuple[str, int, int, int]) -> int:
        op, k, t, j = job
        gg = t * s.M + j
        return int(table[OP_CODE[op], k, gg]) if 0 <= k < D and 0 <= j < s.M and 0 <= gg < G else -1

    for job, later in s.send_after.items():
        i, d = find(job), find(later)
        if i < 0 or d < 0:
            missing = job if i < 0 else later
            c.problems.append((f"send_after names {missing[0]}{missing[1]}.{missing[3]} of step {missing[2]}, "
                               "which is not a job of the schedule", None if i < 0 else c.position(i)))
        elif worker[d] != worker[i] or d < i:
            c.problems.append((f"send_after: {s.programs[worker[i]][c.position(i)[1]]} (step {job[2]}) cannot send "
                               f"after {later[0]}{later[1]}.{later[3]} (step {later[2]}), which is "
                               + ("on another worker" if worker[d] != worker[i] else "earlier on its worker"),
                               c.position(i)))
        else:
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
    """One scalar cost as a float, by the simulator's rule (finite, ≥ 0, > 0 when ``positive``)."""
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


class Wires(NamedTuple):
    """Messages queuing on inbound wires: message m is what ``consumer[m]`` receives in ``slot[m]`` on ``wire[m]``;
    ``overhead``: seconds from a message's arrival until its consumer may start (the receiver's, not the wire's)."""

    consumer: np.ndarray
    slot: np.ndarray
    wire: np.ndarray
    latency: np.ndarray
    transmission: np.ndarray
    overhead: float = 0.0


class Timing(NamedTuple):
    """:func:`run`'s result: start and end (−1: never ran), timing order, blocked workers, messages' begin/arrival."""

    start: np.ndarray
    end: np.ndarray
    seq: np.ndarray
    blocked: list[tuple[int, int]]
    begin: np.ndarray = np.zeros(0)
    arrival: np.ndarray = np.zeros(0)


def run(c: Compiled, cost: np.ndarray, lat1: np.ndarray, lat2: np.ndarray, lat3: np.ndarray,
        wires: Wires | None = None, dispatch: np.ndarray | None = None) -> Timing:
    """Time every action of ``c`` (module docstring): ``cost`` per action, ``lat1..3`` added to dep1..dep3's end,
    ``dispatch`` per action (None: 0) added to its worker's previous end."""
    L = _loop_inputs(c, cost, (lat1, lat2, lat3), wires)
    hd = [0.0] * c.n if dispatch is None else _floats(  # one float per (op, stage), as the costs
        np.asarray(dispatch, dtype=np.float64),
        np.clip(c.op, 0, 4) * c.schedule.D + np.clip(c.stage, 0, c.schedule.D - 1))
    dd1, dd2, ll1, ll2, cst, rows, waiting, us = L.d1, L.d2, L.l1, L.l2, L.cost, L.rows, L.waiting, L.us
    al, tx, wi, sender, sends, stream = L.latency, L.transmission, L.wire, L.sender, L.sends, L.stream
    n, W, inf = c.n, c.schedule.W, math.inf
    end = array("d", [inf]) * (us + 1) + array("d", [-inf])  # 8 bytes a job, not a retained float each
    start = array("d", bytes(8 * n))
    offs = c.offsets.tolist()
    ptr, stop, free = offs[:-1], offs[1:], [0.0] * W
    order = array("q")  # 8 bytes a job, not a retained int object each
    append = order.append
    cursor: dict[int, tuple[int, float]] = {}
    stack = list(range(W - 1, -1, -1))
    wfree, begin = [0.0] * (max(wi, default=-1) + 1), [0.0] * (us - n)
    # Messages wait in streams (one per sender and latency: pushed as the sender's jobs end, so already in ready
    # order) and the heap holds each stream's head: the earliest ready message is found in O(log streams), not
    # O(log messages) — GPipe's forward alone queues M messages per boundary.
    queue: list[list[tuple[float, float, int, int]]] = [[] for _ in range(L.streams)]
    head = [0] * L.streams
    heap: list[tuple[tuple[float, float, int, int], int]] = []

    def post(m: int, t: float) -> None:
        """Message m departs at t (its departure job's end) into its stream, kept in key order."""
        key, s = (t + al[m], t, sender[m], m), stream[m]
        q, h = queue[s], head[s]
        if h == len(q):
            q.clear()
            head[s] = h = 0
        if h < len(q) and key < q[-1]:  # a tie broken by m out of push order: insert in place (rare)
            insort(q, key, lo=h)
            if q[h] is key:  # a new head: its entry is pushed, the old one skipped when popped
                heappush(heap, (key, s))
            return
        q.append(key)
        if len(q) - h == 1:
            heappush(heap, (key, s))

    while True:
        while stack:
            w = stack.pop()
            i, e_w, t_free = ptr[w], stop[w], free[w]
            while i < e_w:
                t0 = t_ready = t_free + hd[i]
                e = end[dd1[i]] + ll1[i]
                if e > t0:
                    t0 = e
                e = end[dd2[i]] + ll2[i]
                if e > t0:
                    t0 = e
                if t0 == inf:  # it waits, or its dependencies are a row
                    j = dd1[i]
                    if j == us:
                        j, t0 = _row_wait(i, rows[i], cursor, end, t_ready)
                    elif end[j] != inf:
                        j = dd2[i]
                    if j >= 0:
                        ws = waiting[j]
                        if ws is None:
                            waiting[j] = [w]
                        else:
                            ws.append(w)
                        break
                start[i] = t0
                t_free = end[i] = t0 + cst[i]
                append(i)
                ws = waiting[i]
                if ws is not None:
                    stack.extend(ws)
                    waiting[i] = None  # freed: the next park reuses its memory; less for the collector to scan
                ms = sends[i]
                if ms is not None:
                    for m in ms:
                        post(m, t_free)
                i += 1
            ptr[w], free[w] = i, t_free
        while heap:  # the earliest ready message: a stream's current head (a displaced head's entry is skipped)
            key, s = heappop(heap)
            h = head[s]
            if h < len(queue[s]) and queue[s][h] is key:
                break
        else:
            break
        head[s] = h + 1
        if h + 1 < len(queue[s]):
            heappush(heap, (queue[s][h + 1], s))
        ready, _, _, m = key
        r = wi[m]
        b = begin[m] = max(wfree[r], ready)
        wfree[r] = end[n + m] = b + tx[m]
        stack.extend(waiting[n + m] or ())
    seq, ran = np.zeros(n, np.int64), np.zeros(n, bool)
    done = np.frombuffer(order, np.int64) if order else np.zeros(0, np.int64)
    seq[done], ran[done] = np.arange(len(done)), True
    st = np.frombuffer(start)
    ends = np.where(ran, st + cost, -1.0)  # t0 + cost, the loop's very sum
    stuck = [(w, ptr[w] - offs[w]) for w in range(W) if ptr[w] < stop[w]]
    return Timing(st, ends, seq, stuck, np.asarray(begin), np.asarray(end[n:us]))


def _row_wait(i: int, row: list[tuple[int, float]], cursor: dict[int, tuple[int, float]], end: array,
              t_free: float) -> tuple[int, float]:
    """Resume job i's (dependency, latency) scan: (first unfinished dependency or −1, latest end + latency so far)."""
    p0, t0 = cursor.pop(i, (0, t_free))
    for p in range(p0, len(row)):
        d, lat = row[p]
        if end[d] == math.inf:
            cursor[i] = (p, t0)
            return d, t0
        t0 = max(t0, end[d] + lat)
    return -1, t0


class _Loop(NamedTuple):
    """The lists :func:`run`'s loop reads (module docstring, step "inputs")."""

    d1: array  # two dependency slots (index us + 1: none; us: see ``rows``) and their latencies
    d2: array
    l1: list[float]
    l2: list[float]
    cost: list[float]
    rows: dict[int, list[tuple[int, float]]]  # (dependency, latency) of a job with three, or an update's wait
    waiting: list[list[int] | None]  # per job (a message: n + m) the workers parked on it
    us: int
    latency: list[float]  # per message m
    transmission: list[float]
    wire: list[int]
    departure: list[int]
    sender: list[int]
    sends: list[list[int] | None]  # per job the messages it sends when it ends
    stream: list[int]  # per message its stream (sender, latency), and the number of streams
    streams: int


def _loop_inputs(c: Compiled, cost: np.ndarray, lats: tuple[np.ndarray, ...], wires: Wires | None) -> _Loop:
    """:class:`_Loop` for ``c``: a dependency met by program order is dropped, the rest moved to the first slots."""
    n, ids = c.n, np.arange(c.n)
    nm = 0 if wires is None else len(wires.consumer)
    us = n + nm
    deps, lat = np.stack([c.dep1, c.dep2, c.dep3]), np.stack(lats)  # new arrays: edited below
    departure = np.zeros(nm, np.int64)
    if wires is not None:
        departure = deps[wires.slot - 1, wires.consumer]
        deps[wires.slot - 1, wires.consumer] = n + np.arange(nm)
        lat[wires.slot - 1, wires.consumer] = wires.overhead
    deps[(deps < ids) & (lat == 0) & (c.worker[np.clip(deps, 0, n - 1)] == c.worker)] = -1
    for a, b in ((1, 2), (0, 1), (1, 2)):  # the remaining dependencies first, in slot order (swap where a gap)
        gap = np.flatnonzero((deps[a] < 0) & (deps[b] >= 0))
        deps[a, gap], deps[b, gap] = deps[b, gap], deps[a, gap]
        lat[a, gap], lat[b, gap] = lat[b, gap], lat[a, gap]
    own = (c.udeps >= 0) & (c.udeps < c.u_ids[:, None]) & (c.worker[c.udeps] == c.worker[c.u_ids][:, None])
    rows = {int(i): list(zip(deps[:, i][deps[:, i] >= 0].tolist(), lat[:, i][deps[:, i] >= 0].tolist()))
            for i in np.flatnonzero(deps[2] >= 0)}
    rows |= {u: [(d, 0.0) for d in row] for u, row in zip(c.u_ids[~own.all(1)].tolist(), c.udeps[~own.all(1)].tolist())}
    deps[0, list(rows)], deps[1, list(rows)] = us, -1
    waiting: list[list[int] | None] = [None] * us
    sends: list[list[int] | None] = [None] * n
    for m, d in enumerate(departure.tolist()):
        sends[d] = (sends[d] or []) + [m]
    sender = c.worker[departure]
    # a stream: the messages of one sender with one latency, which become ready in the order its jobs end
    alphas, kind = np.unique(np.zeros(0) if wires is None else wires.latency, return_inverse=True)
    stream = sender * len(alphas) + kind.reshape(-1)
    stage = np.clip(c.stage, 0, c.schedule.D - 1)
    d1, d2 = (_ints(np.where(d < 0, us + 1, d)) for d in deps[:2])
    l1, l2 = (_floats(x, np.where(x != 0, stage + 1, 0)) if x.any() else [0.0] * n for x in lat[:2])
    msg = Wires(*(np.zeros(0, int),) * 5) if wires is None else wires
    return _Loop(d1, d2, l1, l2, _floats(cost, np.clip(c.op, 0, 4) * c.schedule.D + stage), rows, waiting, us,
                 msg.latency.tolist(), msg.transmission.tolist(), msg.wire.tolist(), departure.tolist(),
                 sender.tolist(), sends, stream.tolist(), c.schedule.W * len(alphas))


def _ints(values: np.ndarray) -> array:
    """``values`` (int64) as an ``array("q")``, copied once."""
    out = array("q")
    # a numpy array is a buffer, which numpy's stubs do not declare
    out.frombytes(memoryview(np.ascontiguousarray(values, dtype=np.int64)).cast("B"))  # type: ignore[arg-type]
    return out


def _floats(values: np.ndarray, codes: np.ndarray) -> list[float]:
    """``values.tolist()``, one shared float object per code where ``values`` is constant within each code."""
    if not values.any():
        return [0.0] * len(values)
    table = np.zeros(int(codes.max(initial=0)) + 1)
    table[codes] = values
    if not np.array_equal(table[codes], values):
        return values.tolist()
    return np.array(table.tolist(), dtype=object)[codes].tolist()
