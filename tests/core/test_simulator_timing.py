"""The timing loop (pipelab.schedules.compiled.run) against a frozen copy of the loop it replaced (issue 29): the
same starts, ends, timing order and blocked workers, on every builder at random costs and latencies."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from pipelab.schedules import BUILDERS, Schedule, gpipe
from pipelab.schedules.compiled import Compiled, compile_schedule, run


def frozen_run(c: Compiled, cost: np.ndarray, lat1: np.ndarray, lat2: np.ndarray, lat3: np.ndarray) -> Any:
    """pipelab 6d48b5a's ``run``, kept verbatim as the reference (per-worker cursors and a wait list)."""
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


def every_builder() -> list[Schedule]:
    """Each builder of the registry at two sizes (a split backward, placements and send_after included)."""
    args = {"interleaved": [(2, 2, 4), (3, 2, 6)], "interleaved_zb": [(2, 2, 4), (3, 2, 6)],
            "lpp": [(4, 4, 2, 2), (4, 8, 2, 2)], "fslpp": [(4, 4, 2, 2), (4, 8, 2, 2)],
            "hybrid": [(4, 4, 2), (4, 8, 2)], "folded": [(4, 8), (6, 6)], "dualpipe": [(4, 8), (6, 12)]}
    out = []
    for name, build in BUILDERS.items():
        for a in args.get(name, [(4, 8), (3, 6)]):
            out.append(build(*a, steps=2))
    return out


SCHEDULES = every_builder()


@pytest.mark.parametrize("s", SCHEDULES, ids=[s.name for s in SCHEDULES])
def test_timing_equals_the_frozen_loop(s: Schedule) -> None:
    c = compile_schedule(s)
    rng = np.random.default_rng(len(s.name))
    for _ in range(3):
        cost = rng.uniform(0.1, 1.0, c.n) * (c.op != 2) + rng.uniform(0.0, 0.3) * (c.op == 2)
        lats = [rng.uniform(0.0, 0.5, c.n) * (rng.random(c.n) < 0.5) for _ in range(3)]
        want, got = frozen_run(c, cost, *lats), run(c, cost, *lats)
        for a, b in zip(want[:3], got[:3]):
            np.testing.assert_array_equal(a, b)
        assert want[3] == got[3] == []


def test_a_deadlock_blocks_the_same_workers() -> None:
    s = gpipe(3, 2)
    p1 = s.programs[1]
    stuck = dataclasses.replace(s, programs=(s.programs[0], p1[2:4] + p1[:2] + p1[4:], s.programs[2]))
    c = compile_schedule(stuck)
    cost, z = np.ones(c.n), np.zeros(c.n)
    want, got = frozen_run(c, cost, z, z, z), run(c, cost, z, z, z)
    assert got.blocked == want[3] and got.blocked
    np.testing.assert_array_equal(got.end, want[1])
