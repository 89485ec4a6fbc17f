"""Policies against the simulator's version table: versions used, version differences, memory, errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pipelab.emulator import DeadlockError, Emulator
from pipelab.optim import optimizer_factory
from pipelab.papers import pipeoptim_staleness, spectrain_version_difference
from pipelab.policies import PipeMarePolicy, Predicted, Stored, make_policy
from pipelab.schedules import gpipe, interleaved_1f1b, pipedream, pipedream_2bw
from pipelab.simulator import simulate
from pipelab.studies.models import deep_mlp

OPTIMIZERS = {
    "nesterov": optimizer_factory("nesterov", lr=0.05, weight_decay=1e-3),
    "adam": optimizer_factory("adam", lr=1e-2),
}


def make_model(seed: int = 0, depth: int = 6) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return deep_mlp(in_features=6, width=8, depth=depth, activation="tanh").double()


def make_data(T: int, n: int = 8, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g))
            for _ in range(T)]


D, T = 4, 10


@pytest.mark.parametrize("policy,schedule", [
    ("vanilla", pipedream(D, 1, T)), ("stashing", pipedream(D, 2, T)), ("vertical_sync", pipedream(D, 1, T)),
    ("2bw", pipedream_2bw(D, 4, 5)), ("pipeoptim", pipedream(D, 1, T)), ("spectrain", pipedream(D, 1, T)),
    ("pipemare", pipedream(D, 3, T)), ("1f1b", interleaved_1f1b(2, 2, 4, 3)),
])
def test_current_versions_equal_the_simulator_table(policy, schedule) -> None:
    steps = schedule.steps
    vt = simulate(schedule).version_table
    m = make_model(depth=6)
    res = Emulator(m, schedule=schedule, policy=policy, optimizer=OPTIMIZERS["nesterov"]).run(
        make_data(steps, n=4 * schedule.M))
    assert not res.waited
    Dk, Tt, M = vt.forward.shape
    for k in range(Dk):
        for t in range(Tt):
            for j in range(M):
                assert res.current[("F", k, t, j)] == vt.forward[k, t, j]
                assert res.current[("B", k, t, j)] == vt.backward[k, t, j]
    # the versions the policy used follow the simulator's weight rules
    rule = {"stashing": "stash", "2bw": "double_buffer", "vanilla": "current"}.get(policy)
    if rule is not None:
        for op in "FB":
            used = vt.used(op, rule)
            assert all(res.used[(op, k, t, j)] == used[k, t, j]
                       for k in range(Dk) for t in range(Tt) for j in range(M))
    if policy == "pipeoptim":  # predicted forward targets the job's own update
        assert all(res.used[("F", k, t, 0)] == vt.update_version[k, t] for k in range(Dk) for t in range(Tt))


def test_version_differences_match_the_papers_formulas_in_steady_state() -> None:
    table = simulate(pipedream(D, 1, 3 * D)).version_table
    po, st = make_policy("pipeoptim"), make_policy("spectrain")
    t = 2 * D  # steady state
    for k in range(D):
        f = po.forward(table, ("F", k, t, 0))
        s = f.s if isinstance(f, Predicted) else 0
        assert s == pipeoptim_staleness(D, k)
        paper = make_policy("spectrain", staleness="paper")
        for op, spec, by_paper in (("F", st.forward, paper.forward), ("B", st.backward, paper.backward)):
            got = spec(table, (op, k, t, 0))
            s = got.s if isinstance(got, Predicted) else 0
            assert s == spectrain_version_difference(D, k, op)
            assert got == by_paper(table, (op, k, t, 0))


@pytest.mark.parametrize("policy,copies", [
    ("vanilla", [1, 1, 1, 1]), ("stashing", [4, 3, 2, 1]), ("vertical_sync", [4, 4, 4, 4]),
    ("pipeoptim", [2, 2, 2, 1]), ("spectrain", [2, 2, 2, 2]), ("pipemare", [3, 3, 3, 1]),
])
def test_weight_copies_of_async_1f1b(policy, copies) -> None:
    emu = Emulator(make_model(depth=4), D=D, schedule=pipedream(D, 1, T), policy=policy,
                   optimizer=OPTIMIZERS["nesterov"])
    assert emu.weight_copies == copies
    res = emu.run(make_data(T))
    assert res.extra["ring_peak"] == emu.capacity  # the ring was filled to its bound, never beyond


def test_2bw_keeps_two_versions() -> None:
    emu = Emulator(make_model(depth=4), D=D, schedule=pipedream_2bw(D, 4, 6), policy="2bw",
                   optimizer=OPTIMIZERS["adam"])
    assert max(emu.weight_copies) == 2


def test_spectrain_with_a_perfect_predictor_deadlocks() -> None:
    with pytest.raises(DeadlockError, match="own gradients"):
        Emulator(make_model(), D=D, schedule=pipedream(D, 1, 6), policy="spectrain",
                 optimizer=OPTIMIZERS["nesterov"], predictor="oracle")


def test_pipemare_learning_rate_rescheduling() -> None:
    table = simulate(pipedream(D, 1, T)).version_table
    pol = PipeMarePolicy(anneal_steps=4)
    # tau_k = D-1-k; factor tau^-(1 - min(t/K, 1))
    assert pol.lr_factor(table, 0, 0) == pytest.approx(3.0 ** -1)
    assert pol.lr_factor(table, 1, 2) == pytest.approx(2.0 ** -0.5)
    assert pol.lr_factor(table, 0, 4) == 1.0 and pol.lr_factor(table, 3, 0) == 1.0
    # the factor is applied to the update and the optimizer's lr restored
    m = make_model()
    emu = Emulator(m, D=D, schedule=pipedream(D, 1, T), policy=pol, optimizer=OPTIMIZERS["nesterov"])
    emu.run(make_data(T))
    assert all(st.optimizer.param_groups[0]["lr"] == 0.05 for st in emu.stages)


def test_policy_specs() -> None:
    table = simulate(pipedream(D, 1, T)).version_table
    key = ("F", 0, 6, 0)
    assert make_policy("stashing").backward(table, ("B", 0, 6, 0)) == Stored(table.version(key))
    assert make_policy("oracle").forward(table, key) == Stored(6)
    vs = make_policy("vertical_sync")
    assert vs.forward(table, ("F", 3, 6, 0)) == Stored(table.version(("F", 0, 6, 0)))


# ------------------------------------------------------------------------------------------ errors


def test_bad_input_errors() -> None:
    opt = OPTIMIZERS["nesterov"]
    with pytest.raises(ValueError, match="only 3 blocks"):
        Emulator(make_model(depth=3), D=4, schedule=pipedream(4, 1, 4), policy="stashing", optimizer=opt)
    with pytest.raises(ValueError, match="not divisible"):
        Emulator(make_model(), D=4, schedule=gpipe(4, 3, 2), policy="gpipe", optimizer=opt).run(make_data(2, n=8))
    with pytest.raises(ValueError, match="cannot follow"):
        Emulator(make_model(), D=4, schedule=pipedream(4, 1, 4), policy="spectrain", optimizer=OPTIMIZERS["adam"])
    with pytest.raises(ValueError, match="flushed schedule"):
        Emulator(make_model(), D=4, schedule=pipedream(4, 1, 4), policy="gpipe", optimizer=opt)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("pipedreamz")
    with pytest.raises(ValueError, match="D=3 stages"):
        Emulator(make_model(), D=4, schedule=gpipe(3, 1, 2), policy="gpipe", optimizer=opt)
    with pytest.raises(TypeError, match="factory"):
        Emulator(make_model(), D=4, schedule=gpipe(4, 1, 2), policy="gpipe", optimizer=None)
    with pytest.raises(ValueError, match="only 1 mini-batches"):
        Emulator(make_model(), D=4, schedule=gpipe(4, 1, 2), policy="gpipe", optimizer=opt).run(make_data(1))


def test_divergence_is_a_result() -> None:
    torch.manual_seed(0)
    m = deep_mlp(in_features=6, width=8, depth=6).double()  # ReLU: unbounded, so a huge step overflows
    res = Emulator(m, D=D, schedule=pipedream(D, 1, 12), policy="vanilla",
                   optimizer=lambda ps: torch.optim.SGD(ps, lr=1e100)).run(make_data(12))
    assert res.diverged_at is not None and res.steps_done == res.diverged_at + 1
    assert math.isnan(res.losses[-1]) or not math.isfinite(res.losses[res.diverged_at])


def test_model_is_trained_in_place_and_copies_are_independent() -> None:
    m = make_model()
    before = copy.deepcopy(m)
    emu = Emulator(m, D=D, schedule=pipedream(D, 1, 5), policy="pipeoptim", optimizer=OPTIMIZERS["adam"])
    emu.run(make_data(5))
    assert any(not torch.equal(a, b) for a, b in zip(m.parameters(), before.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(emu.weights()[0], emu.stages[0].params))


@pytest.mark.slow
@pytest.mark.parametrize("module", ["pipelab.policies", "pipelab.emulator", "pipelab.studies.learning_curves"])
def test_modules_import_first(module) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_paper_staleness_options_use_the_schedule_helpers_and_match_the_table() -> None:
    """``staleness="paper"`` gives the papers' formulas (schedules.versions) and, in steady state, the table's."""
    table = simulate(pipedream(D, 1, 3 * D)).version_table
    t = 2 * D
    for k in range(D):
        base = table.version(("F", k, t, 0))
        s = pipeoptim_staleness(D, k)
        expected = Predicted(base, s) if s else Stored(base)
        assert make_policy("pipeoptim", staleness="paper").forward(table, ("F", k, t, 0)) == expected
        assert make_policy("pipeoptim").forward(table, ("F", k, t, 0)) == expected


def test_policy_metadata_is_the_one_source_of_labels_families_and_choices() -> None:
    from pipelab.policies import SCHEDULE_FAMILIES, available_policies
    from pipelab.schedules.builders import BUILDERS
    from pipelab.studies.figures.learning_curves import LABELS
    from pipelab.studies.settings import ARM_POLICIES, PIPELINE_POLICIES, POLICY_ORDER

    for name in available_policies():
        info = make_policy(name)
        assert info.name == name and info.title and info.summary and info.schedule in SCHEDULE_FAMILIES
        assert info.uses_predictor == (info.default_predictor is not None)
        assert info.synchronous == (info.schedule in ("sequential", "gpipe", "1f1b"))
    assert [n for n in available_policies() if make_policy(n).emulation_only] == ["oracle"]
    assert set(SCHEDULE_FAMILIES) - {"sequential"} <= set(BUILDERS)  # families are builder names
    assert list(ARM_POLICIES) == list(POLICY_ORDER) == [n for n in available_policies() if n != "oracle"]
    assert ARM_POLICIES["vanilla"] == "pipedream" and ARM_POLICIES["2bw"] == "2bw"
    # the figures' legend texts (unchanged: the registry's titles are today's labels)
    assert LABELS == {"sequential": "sequential", "gpipe": "GPipe", "1f1b": "1F1B (flushed)",
                      "vanilla": "vanilla async", "stashing": "PipeDream (stashing)", "vertical_sync": "vertical sync",
                      "2bw": "PipeDream-2BW", "spectrain": "SpecTrain", "pipeoptim": "PipeOptim",
                      "pipemare": "PipeMare", "nesterov_async": "Nesterov (async PP)",
                      "error_feedback": "error feedback (gradient extrapolation)",
                      "dc_asgd": "DC-ASGD (delay compensation)"}
    assert PIPELINE_POLICIES == tuple(n for n in POLICY_ORDER if n != "sequential")
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope")
