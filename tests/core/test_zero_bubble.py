"""Zero-bubble schedules (ZB-H1, ZB-H2, the no-flush split-backward variant) against the paper and torch.

References: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Figure 3 (the orders, D = 4, M = 8)
and Table 1 (bubble and peak memory); torch.distributed.pipelining's ScheduleInterleavedZeroBubble, whose
order with one stage per rank is ZB-H1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from pipelab.papers import zero_bubble_closed_form
from pipelab.schedules import Action, Schedule, ScheduleError, one_f_one_b, pipedream, validate
from pipelab.schedules.builders import BUILDERS
from pipelab.schedules.zero_bubble import (
    split_order,
    zb_async,
    zb_h1,
    zb_h2,
)
from pipelab.simulator import SimResult, simulate


def _order(s: Schedule, w: int) -> str:
    """Worker w's program as 'F0 I0 W0 ... U' (op and micro-batch; one step, one stage per worker)."""
    return " ".join("U" if a.op == "U" else f"{a.op}{a.micro}" for a in s.programs[w])


def _unit(s: Schedule) -> SimResult:
    """Simulate with T_F = T_I = T_W = 1 (1F1B's fused B costs 2)."""
    return simulate(s, 1.0, 2.0, i_cost=1.0, w_cost=1.0)


# --------------------------------------------------------------------------- the paper's Figure 3, D=4, M=8
# Written out by hand (the paper's B is I here; micro-batches counted from 0, the paper's from 1). Workers 0 and 3
# are read off Figure 3; workers 1 and 2 follow the caption's rule (more warm-up forwards, W passes moved to the
# tail) and are checked by the timing they must have (ZB-H1: torch's order; ZB-H2: the gap-free parallelogram).
FIG3_ZB_H1 = [
    "F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7 U",
    "F0 F1 F2 I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7 U",
    "F0 F1 I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7 U",
    "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7 U",
]
FIG3_ZB_H2 = [
    "F0 F1 F2 F3 F4 F5 F6 I0 W0 F7 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 I7 W7 U",
    "F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 W0 F7 I3 W1 I4 W2 I5 W3 I6 W4 I7 W5 W6 W7 U",
    "F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 W0 F7 I5 W1 I6 W2 I7 W3 W4 W5 W6 W7 U",
    "F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 F7 I7 W1 W2 W3 W4 W5 W6 W7 U",
]


def test_zb_h1_is_figure_3_top() -> None:
    """ZB-H1 (D=4, M=8) on every worker is the paper's Figure 3 (top), and its unit-cost timing too: worker 0
    idles 3 slots between F3 and I0, the last worker runs F, I pairs and defers its first W by 3."""
    s = zb_h1(4, 8)
    assert [_order(s, w) for w in range(4)] == FIG3_ZB_H1
    r = _unit(s)
    assert r.time_of("F", 0, 0, 3) == (3.0, 4.0) and r.time_of("I", 0, 0, 0) == (7.0, 8.0)
    assert r.time_of("I", 3, 0, 0)[0] == 4.0 and r.time_of("W", 3, 0, 0)[0] == 11.0


def test_zb_h2_is_figure_3_bottom() -> None:
    """ZB-H2 (D=4, M=8) is Figure 3 (bottom); with unit costs each worker is busy without a gap from its first
    F to its last W (the parallelogram): span 3M on every worker, and worker 0 starts I0 right after F6."""
    s = zb_h2(4, 8)
    assert [_order(s, w) for w in range(4)] == FIG3_ZB_H2
    r = _unit(s)
    c = r.compiled
    for w in range(4):
        mine = c.worker == w
        assert r.end[mine].max() - r.start[mine].min() == 3 * 8
        assert r.start[mine].min() == w
    assert r.time_of("I", 0, 0, 0) == (7.0, 8.0)


# --------------------------------------------------------------------------- torch's ZB1P, one stage per rank
def _torch_zb1p(D: int, M: int) -> list[str]:
    """torch's ScheduleInterleavedZeroBubble rank orders for one local stage, as 'F0 I0 W0 ...' strings."""
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    rounds = max(1, M // D)
    fake = SimpleNamespace(n_local_stages=1, pp_group_size=D, microbatches_per_round=M // rounds,
                           _n_microbatches=M)
    out = []
    for rank in range(D):
        ops = sched.ScheduleInterleavedZeroBubble._calculate_single_rank_operations(fake, rank)
        assert all(a is None or a.stage_index == rank for a in ops)
        out.append(" ".join(f"{a.computation_type.value}{a.microbatch_index}" for a in ops if a is not None))
    return out


@pytest.mark.parametrize("D", [2, 3, 4, 8])
def test_zb_h1_equals_torch_zero_bubble_with_one_stage_per_rank(D: int) -> None:
    """pipelab's ZB-H1 order equals torch's ScheduleInterleavedZeroBubble ("ZB1P") with one stage per rank."""
    for M in (D, 2 * D, 3 * D):
        s = zb_h1(D, M)
        ours = [_order(s, w).removesuffix(" U") for w in range(D)]
        assert ours == _torch_zb1p(D, M), (D, M)


# --------------------------------------------------------------------------- Table 1: bubble and memory



def test_zero_bubble_closed_form_refuses_unknown_schedule() -> None:
    with pytest.raises(ValueError, match="schedule must be one of"):
        zero_bubble_closed_form("ZB-V", 4)


# --------------------------------------------------------------------------- the order rule and bad input
def test_split_order_runs_every_job_once_in_dependency_order() -> None:
    for n in (1, 2, 5):
        for warm in range(1, n + 1):
            for defer in (0, 1, 3, 9):
                o = split_order(n, warm, defer)
                assert sorted(o) == sorted((op, j) for op in "FIW" for j in range(n))
                pos = {x: i for i, x in enumerate(o)}
                assert all(pos[("F", j)] < pos[("I", j)] < pos[("W", j)] for j in range(n))
                # I_j before W_{j-defer}: W lags I by exactly `defer` micro-batches while I passes remain
                assert all(pos[("I", j + defer)] < pos[("W", j)] for j in range(n - defer))
    with pytest.raises(ValueError, match="warm must be <= n"):
        split_order(2, 3, 0)
    with pytest.raises(ValueError, match="defer must be an int >= 0"):
        split_order(2, 1, -1)


@pytest.mark.parametrize("build, args, match", [
    (zb_h1, (4, 2), r"zb_h1 needs M >= D"),
    (zb_h1, (4, 3), r"zb_h1 needs M >= D"),
    (zb_h2, (4, 6), r"zb_h2 needs M >= 2D-1"),
    (zb_h2, (2, 2), r"zb_h2 needs M >= 2D-1"),
    (zb_h1, (0, 2), r"D must be an int >= 1"),
    (zb_h2, (3, 5.0), r"M must be an int >= 1"),
    (zb_async, (3, 1, 4, -1), r"defer must be an int >= 0"),
    (zb_async, (3, 1, 4, [0, 1]), r"defer must be an int or one int per worker \(D=3\)"),
    (zb_async, (3, 1, 4, [0, 1, -2]), r"defer\[2\] must be an int >= 0"),
])
def test_bad_input_is_a_clear_value_error(build: Callable[..., Schedule], args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build(*args)


def _split(s: Schedule) -> list[list[Action]]:
    def split_b(a: Action) -> tuple[Action, ...]:
        return (Action("I", a.stage, a.step, a.micro), Action("W", a.stage, a.step, a.micro)) if a.op == "B" else (a,)
    return [[x for a in p for x in split_b(a)] for p in s.programs]


def test_validate_names_missing_w_and_w_before_its_i() -> None:
    """A schedule whose W job is missing, or whose W comes before its I on the worker, gets a clear error."""
    s = one_f_one_b(2, 2)
    progs = _split(s)
    validate(dataclasses.replace(s, programs=tuple(map(tuple, progs))))
    missing = [list(p) for p in progs]
    missing[1].remove(Action("W", 1, 0, 1))
    with pytest.raises(ScheduleError, match=r"1 B \(or I and W\) job\(s\) missing, e\.g\. stage 1 of step 0 "
                                            r"micro-batch 1"):
        validate(dataclasses.replace(s, programs=tuple(map(tuple, missing))))
    early = [list(p) for p in progs]
    i, w = early[1].index(Action("I", 1, 0, 0)), early[1].index(Action("W", 1, 0, 0))
    early[1][i], early[1][w] = early[1][w], early[1][i]
    with pytest.raises(ScheduleError, match=r"worker 1's action W1\.0 \(step 0, position 1\) can never run; it "
                                            r"waits for I1\.0 \(step 0\), which is later on the same worker"):
        validate(dataclasses.replace(s, programs=tuple(map(tuple, early))))


# --------------------------------------------------------------------------- every builder validates
def test_every_builder_validates_over_a_grid() -> None:
    """zb_h1, zb_h2 and zb_async (three defer rules) pass validate, as schedules and as simulated timelines
    (unit and uneven per-stage costs), for D in 1..5, every M allowed up to 2D+1, steps 1..3."""
    n = 0
    for D in range(1, 6):
        for M in range(1, 2 * D + 2):
            for steps in (1, 2, 3):
                cands = [zb_async(D, M, steps), zb_async(D, M, steps, defer=0),
                         zb_async(D, M, steps, defer=[2 * k + 1 for k in range(D)])]
                cands += [zb_h1(D, M, steps)] if M >= D else []
                cands += [zb_h2(D, M, steps)] if M >= 2 * D - 1 else []
                for s in cands:
                    validate(s)
                    assert s.split_backward and s.n_jobs == 3 * D * M * steps
                    validate(_unit(s))
                    validate(simulate(s, [1.0 + k for k in range(D)], 2.0, i_cost=1.5, w_cost=0.5, u_cost=0.25,
                                      transfer_cost=0.1))
                    n += 1
    assert n > 300


def test_registered_in_builders() -> None:
    assert BUILDERS["zb_h1"] is zb_h1 and BUILDERS["zb_h2"] is zb_h2 and BUILDERS["zb_async"] is zb_async


def test_flushed_steps_repeat_one_step_and_update_after_the_last_w() -> None:
    s = zb_h2(3, 5, steps=3)
    assert s.sync_lag == 0 and s.weight_rule == "current"
    for p in s.programs:
        per_step = [[(a.op, a.micro) for a in p if a.step == t] for t in range(3)]
        assert per_step[0] == per_step[1] == per_step[2]
        assert per_step[0][-1] == ("U", -1) and per_step[0][-2][0] == "W"
    vt = _unit(s).version_table
    assert np.all(vt.staleness("F") == 0) and np.all(vt.staleness("B") == 0)


# --------------------------------------------------------------------------- the no-flush variant
ASYNC_D3_T4 = [  # zb_async(D=3, M=1, steps=4): step t's micro-batch is written "F<t>" (M = 1), by hand
    "F0 F1 F2 I0 W0 U0 F3 I1 W1 U1 I2 W2 U2 I3 W3 U3",
    "F0 F1 I0 F2 I1 W0 U0 F3 I2 W1 U1 I3 W2 U2 W3 U3",
    "F0 I0 F1 I1 F2 I2 W0 U0 F3 I3 W1 U1 W2 U2 W3 U3",
]


def _async_order(s: Schedule, w: int) -> str:
    return " ".join(f"{a.op}{a.step}" for a in s.programs[w])


def test_zb_async_order_and_versions_on_a_small_case() -> None:
    """D=3, M=1, T=4 with the default lag d_k = k: the order by hand, never flushed (no barrier), and the
    versions the simulator's table gives with unit costs, checked against the timeline read by hand:

        w0  F0 F1 F2 .  .  I0 W0 F3 I1 W1 I2 W2 I3 W3      U0(t) right after W0(t)
        w1  .  F0 F1 .  I0 F2 I1 W0 F3 I2 W1 I3 W2 W3
        w2  .  .  F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3

    F(k, 3) starts exactly when U(k, 0) ends (the version counts it: version 1); every other forward sees
    version 0. Forward staleness t - version: [0, 1, 2, 2] at every stage (D-1 = 2 in steady state, where
    PipeDream has D-1-k). W(k, t) runs just before U(k, t), at version t; but the backward's weights are
    decided at I (W reuses I's graph), and I(k, t) runs before U(k, t-1) on workers 1 and 2: the backward
    is stale by up to k there, where PipeDream's is fresh."""
    s = zb_async(3, 1, 4)
    assert [_async_order(s, w) for w in range(3)] == ASYNC_D3_T4
    assert s.sync_lag is None and s.params["defer"] == (0, 1, 2)
    r = _unit(s)
    assert r.makespan == 3 * 4 + 2
    assert [r.time_of("F", k, 3, 0)[0] for k in range(3)] == [7.0, 8.0, 9.0]
    assert [r.time_of("U", k, 0)[1] for k in range(3)] == [7.0, 8.0, 9.0]
    vt = r.version_table
    assert vt.used("F")[:, :, 0].tolist() == [[0, 0, 0, 1]] * 3
    assert vt.used("B")[:, :, 0].tolist() == [[0, 1, 2, 3], [0, 0, 1, 2], [0, 0, 0, 1]]  # at I
    assert vt.weight_pass[:, :, 0].tolist() == [[0, 1, 2, 3]] * 3  # at W, right before U(k, t)
    assert vt.staleness("F")[:, :, 0].tolist() == [[0, 1, 2, 2]] * 3
    assert vt.staleness("B")[:, :, 0].tolist() == [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2]]


def test_zb_async_first_step_is_zb_h1() -> None:
    for D, M in ((2, 2), (3, 4), (4, 8)):
        assert zb_async(D, M, 1).programs == zb_h1(D, M).programs


@pytest.mark.parametrize("D", [2, 3, 4, 6])
def test_zb_async_defer_trades_makespan_for_staleness_and_memory(D: int) -> None:
    """The documented trade-off, unit costs, M = 1, T = 16 (n = 16 micro-batches):

    - defer = 0: PipeDream with B split in place; the same forward staleness (D-1-k at stage k in steady
      state) and peak memory (D-k) as PipeDream; makespan 3n + 2(D-1) against PipeDream's 3n + 3(D-1);
    - default d_k = k: makespan 3n + (D-1), the lower bound; forward staleness D-1 and peak D everywhere."""
    T = 16
    n = T
    pd = _unit(pipedream(D, 1, T))
    r0 = _unit(zb_async(D, 1, T, defer=0))
    rk = _unit(zb_async(D, 1, T))
    assert pd.makespan == 3 * n + 3 * (D - 1)
    assert r0.makespan == 3 * n + 2 * (D - 1)
    assert rk.makespan == 3 * n + (D - 1)
    steady = slice(D, T - D)
    stale_pd = pd.version_table.staleness("F")[:, steady, 0]
    stale_0 = r0.version_table.staleness("F")[:, steady, 0]
    stale_k = rk.version_table.staleness("F")[:, steady, 0]
    assert np.array_equal(stale_0, stale_pd)
    assert stale_0.tolist() == [[D - 1 - k] * stale_0.shape[1] for k in range(D)]
    assert np.all(stale_k == D - 1)
    assert r0.peak_activations.tolist() == pd.peak_activations.tolist() == [D - k for k in range(D)]
    assert rk.peak_activations.tolist() == [D] * D
