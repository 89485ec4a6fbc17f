"""The general schedule constructor: Rahimi's placement functions, a priority and an admission rule.

A greedy list scheduler, event by event: an idle worker starts its ready job of smallest priority that passes
admission; updates run as soon as their gradients are done. An F bringing a *new* micro-batch onto a full worker
waits (one of a resident micro-batch never does, which keeps the rule deadlock-free); ``admission="activations"``
counts activations instead. The start order per worker is the schedule. O(J log J) for J jobs.

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025): w(s,b,d) =
(w_weights, w_compute), priority n(s,b,d), and the greedy scheduler of its appendix.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .actions import Action, Schedule, check_int, check_jobs, gc_paused
from .compiled import Cost, _per_stage
from .dependencies import Job, dependencies, update_dependency, weight_gradient_job

__all__ = ["construct", "PRIORITIES", "priority_key"]

Priority = Callable[[Action, int], tuple]


def _backward_first(a: Action, M: int) -> tuple:
    g = a.step * M + a.micro
    if a.op == "F":
        return (2, g, a.stage)
    return (1, g, -a.stage)


def _forward_first(a: Action, M: int) -> tuple:
    g = a.step * M + a.micro
    if a.op == "F":
        return (a.step, 1, g, a.stage)
    return (a.step, 2, g, -a.stage)


#: Named priorities n(job): "backward_first" (1F1B / depth-first: B before F, older micro-batch first),
#: "forward_first" (GPipe / breadth-first: all forwards of a step before its backwards).
PRIORITIES: dict[str, Priority] = {"backward_first": _backward_first, "forward_first": _forward_first}


def priority_key(priority: str | Priority) -> Priority:
    """Resolve a priority name (see :data:`PRIORITIES`) or pass a callable ``(action, M) -> key`` through."""
    if callable(priority):
        return priority
    try:
        return PRIORITIES[priority]
    except KeyError:
        raise ValueError(f"priority must be a callable or one of {sorted(PRIORITIES)}, got {priority!r}") from None


def _limits(max_in_flight: int | Sequence[int | None] | None, W: int) -> list[int | None]:
    """The admission bound of every worker (None: unbounded)."""
    if max_in_flight is None or not isinstance(max_in_flight, Sequence):
        limit: list[int | None] = [max_in_flight] * W
    else:
        limit = list(max_in_flight)
        if len(limit) != W:
            raise ValueError(f"max_in_flight has {len(limit)} entries, expected one per worker (W={W})")
    for w, lim in enumerate(limit):
        if lim is not None:
            try:
                limit[w] = check_int(f"max_in_flight[{w}]", lim)
            except ValueError:
                raise ValueError(f"max_in_flight[{w}] must be None or an int >= 1, got {lim!r}") from None
    return limit


def _placement(compute: Callable[[int, int, str], int], weights: Any, D: int, M: int, W: int
               ) -> tuple[dict[tuple[str, int, int], int], tuple[tuple[int, ...], ...]]:
    """w_compute of every ``(d, s, b)`` and w_weights of every stage (default: the workers that compute it)."""
    where: dict[tuple[str, int, int], int] = {}
    for s in range(D):
        for b in range(M):
            for d in ("F", "B"):
                w = compute(s, b, d)
                if not isinstance(w, int) or not 0 <= w < W:
                    raise ValueError(f"compute({s}, {b}, {d!r}) = {w!r} is not a worker in 0..{W - 1}")
                where[(d, s, b)] = w
    if weights is None:
        workers: list[set[int]] = [set() for _ in range(D)]
        for (_, s, _), w in where.items():
            workers[s].add(w)
        return where, tuple(tuple(sorted(ws)) for ws in workers)
    holders = []
    for k in range(D):
        h = weights(k) if callable(weights) else weights[k]
        hs = (int(h),) if isinstance(h, int) else tuple(int(x) for x in h)
        if not hs or any(not 0 <= x < W for x in hs):
            raise ValueError(f"weights({k}) = {hs}: holders must be non-empty workers in 0..{W - 1}")
        holders.append(hs)
    return where, tuple(holders)


@dataclass
class _Graph:
    """The jobs by integer id: the action, its worker, its unmet dependencies and its successors."""

    jobs: list[Action]
    worker: list[int]
    index: dict[tuple[str, int, int, int, int], int]  # (op, s, t, b, holder or -1) -> id
    n_dep: list[int]
    succ: list[list[int]]


def _job_graph(D: int, M: int, steps: int, split: bool, sync_lag: int | None, where: dict[tuple[str, int, int], int],
               holders: tuple[tuple[int, ...], ...], chunk: Callable[[int, int], int] | None,
               order: Sequence[Sequence[Job]] | None) -> _Graph:
    """Every job (U once per holder) with its edges: dependency rule, barrier at the weight source, ``order``."""
    g = _Graph([], [], {}, [], [])

    def add_job(op: str, s: int, t: int, b: int, w: int, holder: int = -1) -> None:
        g.index[(op, s, t, b, holder)] = len(g.jobs)
        g.jobs.append(Action(op, s, t, b, chunk(s, w) if chunk is not None else 0))
        g.worker.append(w)

    for t in range(steps):
        for s in range(D):
            for b in range(M):
                for d in ("F", "I", "W") if split else ("F", "B"):
                    add_job(d, s, t, b, where[("F" if d == "F" else "B", s, b)])
            for h in holders[s]:
                add_job("U", s, t, -1, h, h)
    g.n_dep, g.succ = [0] * len(g.jobs), [[] for _ in g.jobs]

    def edge(dep: int, job: int) -> None:
        g.succ[dep].append(job)
        g.n_dep[job] += 1

    for i, a in enumerate(g.jobs):
        job = (a.op, a.stage, a.step, a.micro)
        for dep in dependencies(job, D, M, split):
            edge(g.index[dep + (-1,)], i)
        barrier = update_dependency(job, sync_lag)
        if barrier is not None:  # U(s, t−1−L) at the weight source: the worker itself if it holds s
            hs = holders[a.stage]
            edge(g.index[("U", barrier[0], barrier[1], -1, g.worker[i] if g.worker[i] in hs else hs[0])], i)
    for w, seq_w in enumerate(order or ()):
        ids = [g.index[(op, s, t, b, -1)] for op, s, t, b in seq_w]
        if any(g.worker[i] != w for i in ids):
            raise ValueError(f"order[{w}] names jobs that do not run on worker {w}")
        for before, after in zip(ids, ids[1:]):
            edge(before, after)
    return g


def _greedy(g: _Graph, W: int, M: int, key: Priority, limit: list[int | None], admission: str,
            cost_of: dict[str, list[float]], releases: str) -> tuple[list[list[Action]], int]:
    """List scheduling: each worker's start order and the jobs run; ``resident`` counts activations per micro-batch."""
    ready: list[list[tuple]] = [[] for _ in range(W)]  # per worker, a heap of (priority, id)
    keys = [(-1,) if a.op == "U" else key(a, M) for a in g.jobs]  # updates outrank compute
    for i, n in enumerate(g.n_dep):
        if n == 0:
            heapq.heappush(ready[g.worker[i]], (keys[i], i))
    resident: list[dict[int, int]] = [{} for _ in range(W)]
    busy = [False] * W
    events: list[tuple[float, int, int]] = []  # (end time, tie-break, id)
    programs: list[list[Action]] = [[] for _ in range(W)]
    now, done, seq = 0.0, 0, 0

    def admitted(a: Action, w: int) -> bool:
        bound, held = limit[w], resident[w]
        if a.op != "F" or bound is None:
            return True
        if admission == "activations":
            return sum(held.values()) < bound
        return a.step * M + a.micro in held or len(held) < bound  # a resident micro-batch is never held back

    def try_start(w: int) -> None:
        nonlocal seq
        if busy[w]:
            return
        held_back = []
        while ready[w] and not admitted(g.jobs[ready[w][0][1]], w):
            held_back.append(heapq.heappop(ready[w]))
        if ready[w]:
            i = heapq.heappop(ready[w])[1]
            a = g.jobs[i]
            if a.op == "F":
                gm = a.step * M + a.micro
                resident[w][gm] = resident[w].get(gm, 0) + 1
            busy[w] = True
            programs[w].append(a)
            heapq.heappush(events, (now + cost_of[a.op][a.stage], seq, i))
            seq += 1
        for item in held_back:
            heapq.heappush(ready[w], item)

    for w in range(W):
        try_start(w)
    while events:
        now = events[0][0]
        touched = set()
        while events and events[0][0] <= now:  # every job ending now, before any worker starts again
            i = heapq.heappop(events)[2]
            a, w = g.jobs[i], g.worker[i]
            busy[w] = False
            touched.add(w)
            done += 1
            if a.op == releases:
                fw = g.worker[g.index[("F", a.stage, a.step, a.micro, -1)]]
                r, gm = resident[fw], a.step * M + a.micro
                r[gm] -= 1
                if r[gm] == 0:
                    del r[gm]
                touched.add(fw)
            for nxt in g.succ[i]:
                g.n_dep[nxt] -= 1
                if g.n_dep[nxt] == 0:
                    heapq.heappush(ready[g.worker[nxt]], (keys[nxt], nxt))
                    touched.add(g.worker[nxt])
        for w in sorted(touched):
            try_start(w)
    return programs, done


@gc_paused
def construct(D: int, M: int, W: int, *, compute: Callable[[int, int, str], int],
              weights: Callable[[int], int | Sequence[int]] | Sequence[int | Sequence[int]] | None = None,
              priority: str | Priority = "backward_first",
              max_in_flight: int | Sequence[int | None] | None = None, steps: int = 1,
              sync_lag: int | None = 0, f_cost: Cost = 1.0, b_cost: Cost = 1.0, u_cost: Cost = 0.0,
              i_cost: Cost | None = None, w_cost: Cost | None = None, split: bool = False,
              admission: str = "micro_batches", order: Sequence[Sequence[Job]] | None = None,
              chunk: Callable[[int, int], int] | None = None, name: str = "constructed",
              weight_rule: str = "current", update_rule: str | None = None,
              params: dict | None = None) -> Schedule:
    """Build a :class:`Schedule` from placement functions, a priority and an admission rule.

    Args:
        compute: w_compute(s, b, d), b the micro-batch within the step, d in {"F", "B"} (I and W go where B would).
        weights: w_weights(s): the worker(s) holding stage s, each running U(s, t) (default: those computing s).
        priority: n(job): a name in :data:`PRIORITIES` or ``(action, M) -> sortable key``.
        max_in_flight: admission bound per worker (int, per-worker sequence, or None: unbounded).
        order: per worker, jobs ``(op, s, t, b)`` it runs in this relative order, the others filling in.
        f_cost, b_cost, u_cost, i_cost, w_cost: the costs the scheduler orders with; simulate at the same costs
            (LPP's order built at unit costs idles 21 % at B = 2F, S = 8, M = 64, G = 2, R = 4; built at B = 2F,
            6.8 %). Transfer latencies are not seen.

    Raises:
        ValueError: bad sizes, a placement outside 0..W−1, negative costs, or a deadlock (e.g. an admission
            bound too small to ever run a backward), reported with the partial grid.
    """
    # The constructor in four named steps:
    #   _limits, costs   the admission bound per worker; the simulator's per-stage job costs
    #   _placement       w_compute of every (d, s, b) and w_weights of every stage
    #   _job_graph       the jobs and their edges, from the one dependency rule (schedules/dependencies.py)
    #   _greedy          the list scheduler: the start order on every worker is the schedule
    D, M, W, steps = (check_int(n, v) for n, v in (("D", D), ("M", M), ("W", W), ("steps", steps)))
    check_jobs(f"{name}(D={D}, M={M}, W={W}, steps={steps})", (3 if split else 2) * D * M * steps)
    key = priority_key(priority)
    if admission not in ("micro_batches", "activations"):
        raise ValueError(f"admission must be 'micro_batches' or 'activations', got {admission!r}")
    limit = _limits(max_in_flight, W)
    bc = _per_stage("b_cost", b_cost, D, positive=True).tolist()
    cost_of = {"F": _per_stage("f_cost", f_cost, D, positive=True).tolist(), "B": bc,
               "U": _per_stage("u_cost", u_cost, D, positive=False).tolist(),
               "I": [b / 2 for b in bc] if i_cost is None else _per_stage("i_cost", i_cost, D, positive=True).tolist(),
               "W": [b / 2 for b in bc] if w_cost is None else _per_stage("w_cost", w_cost, D, positive=True).tolist()}
    where, holders = _placement(compute, weights, D, M, W)
    graph = _job_graph(D, M, steps, split, sync_lag, where, holders, chunk, order)
    programs, done = _greedy(graph, W, M, key, limit, admission, cost_of, weight_gradient_job(split))
    if done != len(graph.jobs):
        from .validate import ScheduleError, format_grid
        partial = Schedule(name, tuple(tuple(p) for p in programs), D, M, steps, holders, sync_lag)
        raise ScheduleError(f"construct({name!r}) deadlocked after {done} of {len(graph.jobs)} jobs: the admission "
                            f"bound max_in_flight={max_in_flight} or the placement leaves no runnable job.\n"
                            + format_grid(partial))
    rule = update_rule or ("U(s,t) on each holder of stage s as soon as all B(s,·) of step t are done"
                           + ("; step t+1 waits for it (flush)" if sync_lag == 0 else ""))
    return Schedule(name, tuple(tuple(p) for p in programs), D, M, steps, holders, sync_lag, weight_rule,
                    rule, dict(params or {}))
