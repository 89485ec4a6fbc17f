"""Schedules as data: builders, the general constructor, validate() and its failure reports."""

from __future__ import annotations

import dataclasses

import pytest

from pipelab.schedules import (
    Action,
    Schedule,
    ScheduleError,
    construct,
    ddp,
    folded,
    format_grid,
    fsdp,
    fslpp,
    gpipe,
    interleaved_1f1b,
    lpp,
    lpp_hash,
    naive,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
    validate,
)

ALL = [
    lambda: naive(4, 3, steps=2),
    lambda: gpipe(4, 8, steps=2),
    lambda: one_f_one_b(4, 8, steps=2),
    lambda: one_f_one_b(5, 3),
    lambda: pipedream(4, 1, steps=10),
    lambda: pipedream(3, 4, steps=5),
    lambda: pipedream_2bw(4, 4, steps=5),
    lambda: interleaved_1f1b(W=2, V=3, M=4, steps=2),
    lambda: interleaved_1f1b(W=4, V=2, M=8),
    lambda: folded(6, 8, steps=2),
    lambda: ddp(4, 4, steps=2),
    lambda: ddp(3, 6, W=3),
    lambda: fsdp(4, 4, steps=2),
    lambda: lpp(4, 8, G=2, R=2, steps=2),
    lambda: lpp(6, 4, G=2, R=3),
    lambda: fslpp(4, 8, G=2, R=2, steps=2),
]


@pytest.mark.parametrize("build", ALL, ids=[f"b{i}" for i in range(len(ALL))])
def test_every_builder_validates_and_has_every_job_once(build) -> None:
    s = build()
    validate(s)
    jobs = [(a.op, a.stage, a.step, a.micro) for p in s.programs for a in p if a.op != "U"]
    expected = {(op, k, t, j) for op in "FB" for k in range(s.D) for t in range(s.steps) for j in range(s.M)}
    assert len(jobs) == len(set(jobs)) == len(expected) and set(jobs) == expected
    ups = sorted((a.stage, a.step, w) for w, p in enumerate(s.programs) for a in p if a.op == "U")
    assert ups == sorted((k, t, h) for k in range(s.D) for t in range(s.steps) for h in s.weight_holders[k])
    assert s.update_rule


@pytest.mark.parametrize("D,M,T", [(4, 8, 1), (3, 5, 2), (5, 3, 3), (2, 1, 4)])
def test_closed_form_builders_equal_the_general_constructor(D: int, M: int, T: int) -> None:
    """GPipe, 1F1B, PipeDream and naive are presets of Rahimi's greedy scheduler: same programs."""
    stage = lambda s, b, d: s  # noqa: E731  (w_compute = s: one stage per worker)
    in_flight = [D - k for k in range(D)]
    assert construct(D, M, D, compute=stage, priority="forward_first", steps=T).programs == gpipe(D, M, T).programs
    assert construct(D, M, D, compute=stage, max_in_flight=in_flight, steps=T).programs == \
        one_f_one_b(D, M, T).programs
    assert construct(D, M, D, compute=stage, max_in_flight=in_flight, steps=T, sync_lag=None).programs == \
        pipedream(D, M, T).programs
    assert construct(D, M, D, compute=stage, max_in_flight=1, steps=T).programs == naive(D, M, T).programs


def test_construct_splits_the_backward_counts_activations_and_keeps_a_fixed_order() -> None:
    """split=True: every B becomes an I and a W on B's worker; admission="activations" counts every F until its W
    (two stages of one micro-batch on one worker are two activations, one micro-batch); ``order`` is kept."""
    both = lambda s, b, d: 0  # noqa: E731  (one worker computes both stages)
    s = construct(2, 2, 1, compute=both, split=True, b_cost=2.0)
    validate(s)
    assert {a.op for a in s.programs[0]} == {"F", "I", "W", "U"} and s.split_backward
    assert [str(a) for a in s.programs[0]][:3] == ["F0.0", "F1.0", "I1.0"]  # a micro-batch already resident
    with pytest.raises(ScheduleError, match="deadlocked"):  # F1.0 would be a second activation: never admitted
        construct(2, 2, 1, compute=both, split=True, max_in_flight=1, admission="activations")
    assert construct(2, 2, 1, compute=both, split=True, max_in_flight=2, admission="activations").programs == \
        s.programs
    reverse = [[("F", 0, 0, 1), ("F", 0, 0, 0)], []]
    stage = lambda k, b, d: k  # noqa: E731
    assert [str(a) for a in construct(2, 2, 2, compute=stage, order=reverse).programs[0] if a.op == "F"] == \
        ["F0.1", "F0.0"]
    with pytest.raises(ValueError, match="admission must be"):
        construct(2, 2, 2, compute=stage, admission="bytes")
    with pytest.raises(ValueError, match="do not run on worker 1"):
        construct(2, 2, 2, compute=stage, order=[[], [("F", 0, 0, 0), ("F", 0, 0, 1)]])


def test_one_f_one_b_order_and_pipedream_warmup() -> None:
    assert [str(a) for a in one_f_one_b(3, 4).programs[0]] == \
        ["F0.0", "F0.1", "F0.2", "B0.0", "F0.3", "B0.1", "B0.2", "B0.3", "U0"]
    # PipeOptim Fig. 1(d): D=4, stage 0 admits 4 mini-batches before its first backward.
    p0 = pipedream(4, 1, steps=6).programs[0]
    assert [(a.op, a.step) for a in p0[:7]] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("U", 0), ("F", 4)]


def test_lpp_hash_interpolates_between_gpipe_and_ddp() -> None:
    assert [lpp_hash(s, b, G=1, R=4) for s in range(4) for b in range(3)] == [s for s in range(4) for _ in range(3)]
    assert [lpp_hash(s, b, G=4, R=1) for s in range(3) for b in range(4)] == [b for _ in range(3) for b in range(4)]
    assert lpp(4, 4, G=1, R=4).programs == construct(4, 4, 4, compute=lambda s, b, d: s).programs
    # FSLPP keeps exactly one copy of each stage; LPP one per group.
    assert all(len(h) == 1 for h in fslpp(4, 4, G=2, R=2).weight_holders)
    assert all(len(h) == 2 for h in lpp(4, 4, G=2, R=2).weight_holders)


def test_interleaved_places_stage_on_worker_mod_W_and_records_chunks() -> None:
    s = interleaved_1f1b(W=2, V=3, M=4)
    assert s.D == 6
    for w, p in enumerate(s.programs):
        assert {a.stage % 2 for a in p} == {w}
        assert all(a.chunk == a.stage // 2 for a in p)


def test_folded_pairs_first_and_last_stages() -> None:
    s = folded(8, 4)
    assert s.W == 4
    for w, p in enumerate(s.programs):
        assert {a.stage for a in p} == {w, 7 - w}


@pytest.mark.parametrize("call,match", [
    (lambda: interleaved_1f1b(W=4, V=2, M=6), "M divisible by W"),
    (lambda: pipedream_2bw(4, 3), "M >= D"),
    (lambda: ddp(4, 6, W=4), "M divisible by W"),
    (lambda: lpp(6, 4, G=2, R=4), "D divisible by R"),
    (lambda: lpp(4, 3, G=2, R=2), "M divisible by G"),
    (lambda: folded(5, 4), "even"),
    (lambda: gpipe(0, 4), "D must be"),
    (lambda: one_f_one_b(4, -1), "M must be"),
    (lambda: construct(2, 2, 2, compute=lambda s, b, d: 5), "not a worker"),
    (lambda: construct(2, 2, 2, compute=lambda s, b, d: s, max_in_flight=[1]), "one per worker"),
    (lambda: construct(2, 2, 2, compute=lambda s, b, d: s, f_cost=-1.0), r"f_cost must be > 0 for every stage"),
    (lambda: construct(2, 2, 2, compute=lambda s, b, d: s, u_cost=[0.0, -1.0]), r"u_cost must be >= 0"),
    (lambda: construct(2, 2, 2, compute=lambda s, b, d: s, priority="fastest"), "priority"),
])
def test_bad_parameters_raise_clear_errors(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def _replace(s: Schedule, w: int, programs_w: list[Action]) -> Schedule:
    progs = list(s.programs)
    progs[w] = tuple(programs_w)
    return dataclasses.replace(s, programs=tuple(progs))


def test_validate_marks_a_duplicated_job() -> None:
    s = one_f_one_b(3, 4)
    p = list(s.programs[1])
    p.insert(3, p[0])
    with pytest.raises(ScheduleError, match="more than once") as err:
        validate(_replace(s, 1, p))
    assert "worker × time grid" in str(err.value)
    row = next(line for line in str(err.value).splitlines() if line.startswith("w1"))
    assert ">>F1.0<<" in row


def test_validate_reports_a_missing_job_and_an_out_of_range_action() -> None:
    s = gpipe(3, 2)
    with pytest.raises(ScheduleError, match="missing"):
        validate(_replace(s, 2, [a for a in s.programs[2] if str(a) != "B2.1"]))
    with pytest.raises(ScheduleError, match="out of range"):
        validate(_replace(s, 0, list(s.programs[0]) + [Action("F", 7, 0, 0)]))
    with pytest.raises(ScheduleError, match="does not hold"):
        validate(_replace(s, 0, list(s.programs[0]) + [Action("U", 1, 0, -1)]))


def test_validate_marks_the_cell_that_breaks_a_dependency() -> None:
    """B before its own F on stage 2 can never run: the grid marks that cell on worker 2."""
    s = gpipe(3, 2)
    p = list(s.programs[2])
    p[0], p[2] = p[2], p[0]  # B2.0 moved in front of F2.0
    with pytest.raises(ScheduleError, match="dependency violated") as err:
        validate(_replace(s, 2, p))
    row = next(line for line in str(err.value).splitlines() if line.startswith("w2"))
    assert ">>B2.0<<" in row
    # A cycle across workers: stage 1 waits for stage 0's second forward, which waits behind a backward.
    s = one_f_one_b(2, 2)
    p0 = [Action("F", 0, 0, 0), Action("B", 0, 0, 0), Action("F", 0, 0, 1), Action("B", 0, 0, 1),
          Action("U", 0, 0, -1)]
    p1 = [Action("F", 1, 0, 0), Action("F", 1, 0, 1), Action("B", 1, 0, 0), Action("B", 1, 0, 1),
          Action("U", 1, 0, -1)]
    bad = dataclasses.replace(s, programs=(tuple(p0), tuple(p1)))
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(bad)


def test_validate_rejects_other_types_and_grid_is_readable() -> None:
    with pytest.raises(TypeError):
        validate([1, 2])
    text = format_grid(one_f_one_b(2, 3))
    lines = text.splitlines()
    assert lines[2].split() == ["w0", "F0.0", "F0.1", ".", "B0.0", "F0.2", "B0.1", ".", "B0.2*"]


def test_schedule_rejects_bad_fields() -> None:
    s = gpipe(2, 2)
    with pytest.raises(ValueError, match="weight_rule"):
        dataclasses.replace(s, weight_rule="newest")
    with pytest.raises(ValueError, match="sync_lag"):
        dataclasses.replace(s, sync_lag=-1)
    with pytest.raises(ValueError, match="weight_holders"):
        dataclasses.replace(s, weight_holders=((0,),))
    assert s.worker_of("B", 1, 0, 1) == 1
    with pytest.raises(ValueError, match="not in schedule"):
        s.worker_of("B", 1, 3, 1)


@pytest.mark.parametrize("build", [
    lambda: gpipe(3, 2, steps=2), lambda: one_f_one_b(4, 4, steps=2), lambda: pipedream(3, 2, steps=3),
    lambda: interleaved_1f1b(2, 2, 4, steps=2), lambda: ddp(2, 2, steps=2), lambda: fsdp(3, 2, steps=2),
])
def test_compiled_dependencies_are_the_one_rule(build) -> None:
    """The compiled arrays the simulator and validator time with hold exactly the jobs that
    pipelab.schedules.dependencies lists for every action (data edges; an update's weight-gradient jobs)."""
    from pipelab.schedules.compiled import compile_schedule
    from pipelab.schedules.dependencies import dependencies

    s = build()
    c = compile_schedule(s)
    flat = [a for p in s.programs for a in p]
    job = [(a.op, a.stage, a.step, a.micro) for a in flat]
    udeps = {int(u): row for u, row in zip(c.u_ids.tolist(), c.udeps.tolist())}
    for i, a in enumerate(job):
        got = [job[d] for d in ((udeps[i]) if a[0] == "U" else (int(c.dep1[i]), int(c.dep2[i]))) if d >= 0]
        assert got == dependencies(a, s.D, s.M), a


def test_the_dependency_rule_of_a_split_backward() -> None:
    from pipelab.schedules.dependencies import dependencies, update_dependency

    assert dependencies(("I", 1, 0, 2), D=3, M=4, split=True) == [("F", 1, 0, 2), ("I", 2, 0, 2)]
    assert dependencies(("W", 1, 0, 2), D=3, M=4, split=True) == [("I", 1, 0, 2)]
    assert dependencies(("U", 1, 5, -1), D=3, M=2, split=True) == [("W", 1, 5, 0), ("W", 1, 5, 1)]
    assert dependencies(("F", 0, 0, 0), D=3, M=1) == [] and dependencies(("B", 2, 0, 0), D=3, M=1) == [("F", 2, 0, 0)]
    assert update_dependency(("F", 2, 3, 0), sync_lag=0) == (2, 2)
    assert update_dependency(("F", 2, 0, 0), sync_lag=0) is None and update_dependency(("U", 2, 3, -1), 0) is None
    assert update_dependency(("B", 1, 3, 0), sync_lag=None) is None


def test_transfers_of_a_two_stage_1f1b_worked_by_hand() -> None:
    """Worker 0 runs F0.0 F0.1 B0.0 B0.1 U0, worker 1 runs F1.0 B1.0 F1.1 B1.1 U1: each F0 sends the activation
    into stage 1 (channel 2) and each B1 the gradient into stage 0 (channel 1) to the matching job."""
    from pipelab.schedules.transfers import Message, channels, consistent_cut, messages

    s = one_f_one_b(D=2, M=2, steps=1)
    assert [[str(a) for a in p] for p in s.programs] == [["F0.0", "F0.1", "B0.0", "B0.1", "U0"],
                                                         ["F1.0", "B1.0", "F1.1", "B1.1", "U1"]]
    assert messages(s) == [Message(0, 0, 1, 0, 2, 0, 0), Message(0, 1, 1, 2, 2, 0, 1),
                           Message(1, 1, 0, 2, 1, 0, 0), Message(1, 3, 0, 3, 1, 0, 1)]
    assert channels(s) == {(0, 1, 2): ([(0, 0), (0, 1)], [(0, 0), (0, 1)]),
                           (1, 0, 1): ([(0, 0), (0, 1)], [(0, 0), (0, 1)])}
    assert consistent_cut(s, 0) == ([0, 0], set()) and consistent_cut(s, 1) == ([5, 5], set())
    with pytest.raises(ValueError, match="step must be in 0..1"):
        consistent_cut(s, 2)


@pytest.mark.parametrize("split", [False, True])
def test_hand_overs_are_the_tensor_carrying_dependencies_and_their_inverse(split: bool) -> None:
    """received_from lists exactly the dependencies that carry a tensor, and handed_to is its inverse."""
    from pipelab.schedules.dependencies import dependencies, handed_to, received_from

    D, ops = 4, (("F", "I", "W") if split else ("F", "B"))
    jobs = [(op, k, 1, 2) for op in ops for k in range(D)]
    for job in jobs:
        got = received_from(job, D, split)
        assert set(got) <= set(dependencies(job, D, 3, split)) and len(got) <= 1
        at_an_end = job[0] == "W" or (job[0] == "F" and job[1] == 0) or (job[0] != "F" and job[1] == D - 1)
        assert (got == []) == at_an_end, job
    inverse = {(src, dst) for dst in jobs for src in received_from(dst, D, split)}
    assert inverse == {(src, dst) for src in jobs for dst in handed_to(src, D, split)}
    assert len(inverse) == 2 * (D - 1)  # one activation and one gradient per stage boundary


def test_send_after_delays_only_the_tensor_for_another_worker() -> None:
    """1F1B on 2 workers, F0.0's activation sent after F0.1 (``send_after``): F1.0 starts when F0.1 ends (2, not
    1), worked by hand; a tensor to the producer's own worker is not delayed; a later job elsewhere or earlier on
    the worker, or an unknown job, is reported with the grid."""
    from pipelab.simulator import simulate

    s = one_f_one_b(D=2, M=2)
    late = dataclasses.replace(s, send_after={("F", 0, 0, 0): ("F", 0, 0, 1)})
    assert simulate(s).time_of("F", 1, 0, 0) == (1.0, 2.0)
    r = simulate(late)
    assert r.time_of("F", 1, 0, 0) == (2.0, 3.0) and r.makespan == simulate(s).makespan + 1
    validate(r)
    local = dataclasses.replace(interleaved_1f1b(1, 2, 2), send_after={("F", 0, 0, 0): ("F", 0, 0, 1)})
    assert simulate(local).makespan == simulate(interleaved_1f1b(1, 2, 2)).makespan
    for bad, match in [({("F", 0, 0, 0): ("F", 1, 0, 0)}, r"cannot send after F1\.0 \(step 0\), which is on another"),
                       ({("F", 0, 0, 1): ("F", 0, 0, 0)}, r"cannot send after F0\.0 \(step 0\), which is earlier"),
                       ({("F", 0, 0, 0): ("B", 0, 3, 0)}, r"send_after names B0\.0 of step 3, which is not a job")]:
        with pytest.raises(ScheduleError, match=match):
            validate(dataclasses.replace(s, send_after=bad))
    with pytest.raises(ValueError, match=r"send_after key must be a job \(op, stage, step, micro\) with integer"):
        dataclasses.replace(s, send_after={("F", 0.5, 0, 0): ("F", 0, 0, 1)})
    with pytest.raises(ValueError, match=r"with op one of \['B', 'F', 'I', 'W'\]"):
        dataclasses.replace(s, send_after={("U", 0, 0, -1): ("F", 0, 0, 1)})
    with pytest.raises(TypeError, match="send_after must be a mapping"):
        dataclasses.replace(s, send_after=[("F", 0, 0, 0)])


def _idle_with_work_ready(r) -> int:
    """Idle gaps in a simulated timeline during which a job later in the worker's program was already ready
    (all its dependencies ended): 0 for the constructor's greedy order at the costs it was built with, which
    starts a ready job whenever a worker is free."""
    import numpy as np

    c = r.compiled
    ready = np.zeros(c.n)
    for dep in (c.dep1, c.dep2, c.dep3):
        m = dep >= 0
        ready[m] = np.maximum(ready[m], r.end[dep[m]])
    for u, row in zip(c.u_ids.tolist(), c.udeps.tolist()):
        ready[u] = max(ready[u], max(r.end[row]))
    gaps = 0
    for w in range(r.schedule.W):
        ids = np.arange(int(c.offsets[w]), int(c.offsets[w + 1]))
        for i in range(1, len(ids)):
            free, nxt = r.end[ids[i - 1]], r.start[ids[i]]
            if nxt > free + 1e-9 and ready[ids[i:]].min() < nxt - 1e-9:
                gaps += 1
    return gaps


@pytest.mark.parametrize("costs", [(1.0, 2.0, 0.0), (1.0, 3.0, 0.5), ([1.0, 2.0, 1.0, 3.0], [2.0, 1.0, 3.0, 2.0], 0.0)])
def test_lpp_and_the_constructor_order_jobs_at_the_costs_given(costs) -> None:
    """Built at the costs it is simulated with, the greedy order never leaves a worker idle while one of its
    jobs is ready; built at unit costs and simulated at others, it does. LPP backward-first on the quick
    figure's sizes (D = 8, G = 2, R = 4, B = 2F): 21 % bubble at M = 64 ordered at unit costs, 6.8 % at B = 2F,
    falling with M; the forward-first order is the same at both costs. Without costs, nothing changes."""
    import numpy as np

    from pipelab.simulator import simulate

    f, b, u = costs
    D = 8 if np.ndim(f) == 0 else len(f)
    at = {"f_cost": f, "b_cost": b, "u_cost": u}
    for M in (4, 16, 32):
        ordered = simulate(lpp(D, M, 2, D // 2, **at), f, b, u_cost=u)
        assert _idle_with_work_ready(ordered) == 0
        s = construct(D, M, 3, compute=lambda s, j, d: (s + j) % 3, f_cost=np.asarray(f), b_cost=b, u_cost=u,
                      steps=2)
        assert _idle_with_work_ready(simulate(s, f, b, u_cost=u)) == 0
    assert _idle_with_work_ready(simulate(lpp(D, 64, 2, D // 2), f, b, u_cost=u)) > 0
    if costs == (1.0, 2.0, 0.0):
        unit = [simulate(lpp(8, M, 2, 4), 1.0, 2.0).bubble for M in (16, 32, 64)]
        real = [simulate(lpp(8, M, 2, 4, b_cost=2.0), 1.0, 2.0).bubble for M in (16, 32, 64)]
        assert unit[-1] == pytest.approx(0.20988, abs=1e-4) and real[-1] == pytest.approx(0.06796, abs=1e-4)
        assert real == sorted(real, reverse=True) and real[-1] < unit[-1] - 0.1
        for M in (16, 64):
            assert (lpp(8, M, 2, 4, priority="forward_first", b_cost=2.0).programs
                    == lpp(8, M, 2, 4, priority="forward_first").programs)
    # the defaults are unit F and B, zero U: the order of a build without costs
    assert lpp(8, 16, 2, 4).programs == lpp(8, 16, 2, 4, f_cost=1.0, b_cost=1.0, u_cost=0.0).programs
    assert ([[a for a in p if a.op != "U"] for p in fslpp(8, 16, 2, 4, b_cost=2.0).programs]
            == [[a for a in p if a.op != "U"] for p in lpp(8, 16, 2, 4, b_cost=2.0).programs])
