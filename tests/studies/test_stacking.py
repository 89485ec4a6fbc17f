"""Stacked arms (pipelab.studies.stacking): K seeds of one arm trained as one model equal K separate runs.

References: each arm's separate run (``pipelab.studies.learning_curves.run``), plain ``nn.Module`` forwards, and
``pipelab.emulator.evaluate``; float64, explicit tolerances.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipelab.emulator import Emulator, evaluate
from pipelab.schedules import pipedream
from pipelab.studies.learning_curves import RunConfig, run, run_stacked, with_
from pipelab.studies.models import deep_mlp, he_init, small_cnn, transformer_classifier
from pipelab.studies.settings import ARM_POLICIES
from pipelab.studies.stacking import Stacked, check_stackable, evaluate_arms, stack_models, stacked_batch, stacked_loss

TOL = 1e-10
METRICS = ("train_loss", "running_loss", "test_loss", "test_acc", "val_loss", "val_acc")


def _close(a: list[float], b: list[float], tol: float = TOL) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def _models(factory, K: int) -> list[nn.Sequential]:
    out = []
    for a in range(K):
        torch.manual_seed(a)
        out.append(factory().double())
    return out


@pytest.mark.parametrize("factory,shape", [
    (lambda: deep_mlp(in_features=12, width=8, depth=4), (5, 12)),
    (lambda: small_cnn(width=4, image_size=8), (5, 1, 8, 8)),
    (lambda: transformer_classifier(in_features=16, seq_len=4, d_model=8, nhead=2, num_layers=2,
                                    dim_feedforward=16), (5, 16)),
])
def test_a_stacked_model_computes_every_arm_as_its_own_model(factory, shape) -> None:
    K = 3
    models = _models(factory, K)
    stacked = stack_models(models)
    x = torch.randn(shape[0], K, *shape[1:], dtype=torch.float64)
    out = stacked(x)
    for a, m in enumerate(models):
        torch.testing.assert_close(out[:, a], m(x[:, a]), rtol=1e-12, atol=1e-12)


def test_stacked_gradients_are_each_arms_own() -> None:
    K = 3
    models = _models(lambda: deep_mlp(in_features=6, width=5, depth=3), K)
    stacked = stack_models(models)
    x = torch.randn(4, K, 6, dtype=torch.float64)
    y = torch.randint(0, 10, (4, K))
    stacked_loss()(stacked(x), y).sum().backward()
    for a, m in enumerate(models):
        nn.functional.cross_entropy(m(x[:, a]), y[:, a]).backward()
        for (name, p), sp in zip(m.named_parameters(), (p for b in stacked for p in b.parameters())):
            assert sp.grad is not None and p.grad is not None, name
            torch.testing.assert_close(sp.grad[a], p.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("policy", list(ARM_POLICIES))
def test_stacked_seeds_equal_separate_runs_for_every_policy(policy: str) -> None:
    opt = "sgdm" if policy in ("spectrain", "sequential", "vanilla") else "adam"
    if policy == "nesterov_async":  # NAdam or SGD-Nesterov only (it refuses Adam)
        opt = "nadam"
    base = RunConfig(task="digits_mlp", policy=policy, optimizer=opt, D=4, seed=0, epochs=2, batch_size=16,
                     n_train=256, n_test=100, n_eval_train=64, n_val=32, dtype="float64")
    cfgs = [with_(base, seed=s) for s in (0, 3, 7)]
    stacked = run_stacked(cfgs)
    for cfg, rec in zip(cfgs, stacked):
        alone = run(cfg)
        assert rec["seed"] == cfg.seed and rec["stacked_arms"] == 3
        for key in METRICS:
            assert _close(rec[key], alone[key]), (policy, key, rec[key], alone[key])
        assert rec["weight_copies"] == alone["weight_copies"]
        assert rec["diverged"] == alone["diverged"] and rec["n_test"] == alone["n_test"]
    # the seeds are not copies of one another: the check above compares different trajectories
    assert stacked[0]["train_loss"][-1] != stacked[1]["train_loss"][-1]


def test_stacked_zero_bubble_arm_equals_separate_runs() -> None:
    base = RunConfig(task="digits_mlp", policy="pipeoptim", optimizer="adam", D=4, seed=0, epochs=1, batch_size=16,
                     n_train=192, n_test=64, n_eval_train=64, dtype="float64", schedule="zb_async")
    cfgs = [with_(base, seed=s) for s in (1, 2)]
    for cfg, rec in zip(cfgs, run_stacked(cfgs)):
        alone = run(cfg)
        for key in ("train_loss", "test_loss", "test_acc"):
            assert _close(rec[key], alone[key]), key


def test_one_arm_diverging_leaves_the_others_untouched() -> None:
    K, steps = 2, 6
    models = _models(lambda: deep_mlp(in_features=6, width=5, depth=4), K)
    with torch.no_grad():                    # arm 1 starts diverged: a NaN weight
        next(models[1].parameters())[0, 0] = math.nan
    reference = [m for m in _models(lambda: deep_mlp(in_features=6, width=5, depth=4), 1)]
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(steps, 4, K, 6, generator=gen, dtype=torch.float64)
    ys = torch.randint(0, 10, (steps, 4, K), generator=gen)
    emu = Emulator(stack_models(models), D=2, schedule=pipedream(2, 1, steps), policy="vanilla",
                   optimizer=lambda ps: torch.optim.SGD(ps, lr=1.0), loss_fn=stacked_loss())
    res = emu.run(lambda t: (xs[t], ys[t]))
    alone = Emulator(reference[0], D=2, schedule=pipedream(2, 1, steps), policy="vanilla",
                     optimizer=lambda ps: torch.optim.SGD(ps, lr=1.0)).run(lambda t: (xs[t, :, 0], ys[t, :, 0]))
    arm = res.extra["arm_losses"]
    assert res.diverged_at is None and res.steps_done == steps       # the healthy arm kept the run going
    assert all(not math.isfinite(row[1]) for row in arm)
    assert _close([row[0] for row in arm], alone.losses, 1e-12)


def test_evaluate_arms_equals_evaluate_per_arm() -> None:
    K = 3
    models = _models(lambda: deep_mlp(in_features=6, width=5, depth=3), K)
    stacked = stack_models(models)
    x, y = torch.randn(50, 6, dtype=torch.float64), torch.randint(0, 10, (50,))
    losses, accs = evaluate_arms([stacked], x, y, K, batch_size=16)
    xs, ys = torch.randn(40, K, 6, dtype=torch.float64), torch.randint(0, 10, (40, K))
    own_losses, own_accs = evaluate_arms([stacked], xs, ys, K)
    for a, m in enumerate(models):
        loss, acc = evaluate([m], x, y)
        assert abs(losses[a] - loss) < 1e-12 and accs[a] == acc
        loss, acc = evaluate([m], xs[:, a], ys[:, a])
        assert abs(own_losses[a] - loss) < 1e-12 and own_accs[a] == acc


def test_stacked_batch_puts_arms_on_axis_one() -> None:
    x, y = stacked_batch([(torch.zeros(4, 3), torch.zeros(4)), (torch.ones(4, 3), torch.ones(4))])
    assert x.shape == (4, 2, 3) and y.shape == (4, 2) and x[:, 1].eq(1).all()


@pytest.mark.parametrize("policy", ["sequential", "2bw", "error_feedback"])
def test_stacked_muon_arms_equal_separate_runs(policy: str) -> None:
    """Muon orthogonalises each arm's own matrix (StackedMuon): the stacked run equals the separate torch.optim.Muon
    runs (the Newton-Schulz iteration is bfloat16 in both, on the same matrices)."""
    base = RunConfig(task="digits_mlp_nobias", policy=policy, optimizer="muon", D=4, seed=0, epochs=2, batch_size=16,
                     n_train=192, n_test=100, n_eval_train=64, dtype="float64", lr=0.02)
    cfgs = [with_(base, seed=s) for s in (0, 5)]
    stacked = run_stacked(cfgs)
    for cfg, rec in zip(cfgs, stacked):
        alone = run(cfg)
        for key in ("train_loss", "running_loss", "test_loss", "test_acc"):
            assert _close(rec[key], alone[key]), (policy, key, rec[key], alone[key])
    assert stacked[0]["test_loss"][-1] != stacked[1]["test_loss"][-1]


def test_stacked_muon_refuses_unstacked_matrices_and_the_stack_group_keeps_predicted_muon_alone() -> None:
    from pipelab.studies.learning_curves import _stack_group
    from pipelab.studies.stacking import StackedMuon, stacked_optimizer

    with pytest.raises(ValueError, match="arms, rows, columns"):
        StackedMuon([nn.Parameter(torch.zeros(3, 3))])
    factory = stacked_optimizer(lambda ps: torch.optim.Muon(ps, lr=0.5, momentum=0.8))
    opt = factory([nn.Parameter(torch.zeros(2, 3, 3))])
    assert isinstance(opt, StackedMuon) and opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[0]["momentum"] == 0.8
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    assert stacked_optimizer(sgd) is sgd
    muon = RunConfig(task="digits_mlp_nobias", policy="2bw", optimizer="muon", D=2, seed=3)
    assert _stack_group(muon) == with_(muon, seed=0)                       # stacked with its other seeds
    predicted = with_(muon, policy="pipeoptim")
    assert _stack_group(predicted) == predicted                           # alone


def test_what_cannot_be_stacked_is_refused() -> None:
    with pytest.raises(ValueError, match="muon.*predicting"):
        check_stackable(deep_mlp(in_features=4, width=4, depth=2), "muon", predicts=True)
    check_stackable(deep_mlp(in_features=4, width=4, depth=2), "muon")
    with pytest.raises(ValueError, match="buffers"):
        Stacked([nn.BatchNorm1d(3), nn.BatchNorm1d(3)])
    with pytest.raises(ValueError, match="dropout"):
        Stacked([nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))] * 2)
    with pytest.raises(ValueError, match="same parameter"):
        Stacked([nn.Linear(2, 2), nn.Linear(3, 2)])
    with pytest.raises(ValueError, match=r"\(batch, 2, \.\.\.\)"):
        Stacked([nn.Linear(2, 2), nn.Linear(2, 2)])(torch.zeros(4, 3, 2))
    base = RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=0, epochs=1)
    with pytest.raises(ValueError, match="differ only in their seed"):
        run_stacked([base, with_(base, seed=1, lr=0.1)])


def test_he_init_seeds_differ_between_stacked_arms() -> None:
    models = [deep_mlp(in_features=4, width=4, depth=2) for _ in range(2)]
    for a, m in enumerate(models):
        he_init(m, a)
    stacked = stack_models(models)
    w = next(stacked[0].parameters())
    assert not torch.equal(w[0], w[1])


def _tiny(seed: int, **kw) -> RunConfig:
    return RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=seed, epochs=1, batch_size=16,
                     n_train=128, n_test=64, n_eval_train=32, dtype="float64", **kw)


def test_sweep_stacks_seeds_and_caches_each_run_under_its_own_key(tmp_path, monkeypatch) -> None:
    from pipelab.studies.learning_curves import sweep

    monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path))
    cfgs = [_tiny(s) for s in range(3)] + [_tiny(0, lr=0.05)]
    recs = sweep(cfgs, stack=2)
    assert [r.get("stacked_arms", 1) for r in recs] == [2, 2, 1, 1]    # seeds 0,1 together; seed 2 and lr 0.05 alone
    for cfg, rec in zip(cfgs, recs):
        assert _close(rec["test_loss"], run(cfg)["test_loss"])
    again = sweep([cfgs[1]], stack=1)             # a stacked result is the cached entry of the single run
    assert again[0]["stacked_arms"] == 2 and again[0]["seconds"] == recs[1]["seconds"]


@pytest.mark.slow
def test_sweep_with_worker_processes_equals_the_serial_sweep(tmp_path, monkeypatch) -> None:
    from pipelab.studies.learning_curves import sweep

    monkeypatch.setenv("PIPELAB_CACHE", "off")
    cfgs = [_tiny(s) for s in range(2)] + [_tiny(s, lr=0.05) for s in range(2)]
    parallel = sweep(cfgs, stack=2, workers=2)
    serial = sweep(cfgs, stack=2, workers=1)
    for a, b in zip(parallel, serial):
        assert a["seed"] == b["seed"] and a["lr"] == b["lr"]
        assert _close(a["test_loss"], b["test_loss"], 0.0)


def test_bad_worker_counts_are_refused(monkeypatch) -> None:
    from pipelab.studies.cache import run_sweep
    from pipelab.studies.learning_curves import sweep

    with pytest.raises(ValueError, match="workers"):
        run_sweep("x", [], lambda c: c, workers=0)
    monkeypatch.setenv("PIPELAB_WORKERS", "two")
    with pytest.raises(ValueError, match="PIPELAB_WORKERS"):
        sweep([])


METRIC_KEYS = ("train_loss", "test_loss", "test_acc", "val_loss", "val_acc")


def test_the_records_do_not_depend_on_the_stack_cap(tmp_path, monkeypatch) -> None:
    from pipelab.studies.learning_curves import sweep

    cfgs = [with_(_tiny(s, n_val=32), policy=p) for p in ("stashing", "pipeoptim") for s in range(4)]
    records = {}
    for stack in (1, 3):
        monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path / f"stack{stack}"))  # every run recomputed
        records[stack] = sweep(cfgs, stack=stack)
    assert [r.get("stacked_arms", 1) for r in records[3]] == [3, 3, 3, 1] * 2
    for cfg, a, b in zip(cfgs, records[1], records[3]):
        assert (a["seed"], a["policy"], b["seed"], b["policy"]) == (cfg.seed, cfg.policy) * 2
        for key in METRIC_KEYS:
            assert _close(b[key], a[key]), (cfg, key)


#: (task, size) of every job the stubbed sweep was handed, in order
JOBS: list[tuple[str, int]] = []


def _stub_record(cfg: RunConfig) -> dict:
    score = -abs(math.log10(cfg.lr / 1e-2))  # the halving selects the rate nearest 1e-2
    return {"task": cfg.task, "optimizer": cfg.optimizer, "D": cfg.D, "policy": cfg.policy, "seed": cfg.seed,
            "lr": cfg.lr, "n_val": cfg.n_val, "diverged": False, "val_acc": [0.0, score], "test_acc": [0.0, score]}


def _stub_run(cfg: RunConfig) -> dict:
    JOBS.append((cfg.task, 1))
    return _stub_record(cfg)


def _stub_run_stacked(cfgs: list[RunConfig]) -> list[dict]:
    JOBS.append((cfgs[0].task, len(cfgs)))
    return [_stub_record(c) for c in cfgs]


@pytest.mark.parametrize("env,expected", [
    (None, {"digits_mlp": [5], "mnist1d_mlp": [2, 2, 1]}),    # each task's plan: 8 (the default) and 2
    ("3", {"digits_mlp": [3, 2], "mnist1d_mlp": [3, 2]}),     # $PIPELAB_STACK: one cap for every task
    ("1", {"digits_mlp": [1] * 5, "mnist1d_mlp": [1] * 5}),
])
def test_every_sweep_of_the_learning_curve_figures_honours_the_cap(env, expected, tmp_path, monkeypatch) -> None:
    """The tuning's sweeps and the full runs' sweep hand ``run_stacked`` no more seeds than each task's cap."""
    from pipelab.studies import learning_curves
    from pipelab.studies.figures.learning_curves import LearningCurvesConfig, TaskPlan, _runs
    from pipelab.studies.settings import Tuning

    monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path))
    if env is None:
        monkeypatch.delenv("PIPELAB_STACK", raising=False)
    else:
        monkeypatch.setenv("PIPELAB_STACK", env)
    monkeypatch.setattr(learning_curves, "run", _stub_run)
    monkeypatch.setattr(learning_curves, "run_stacked", _stub_run_stacked)
    tuning = Tuning(grids=(("sgdm", 1e-3, 1e-1, 5),), seeds=tuple(range(100, 105)), max_epochs=1)
    cfg = LearningCurvesConfig(("digits_mlp", "mnist1d_mlp"), ("sgdm",), ("sequential", "stashing"), 4,
                               tuple(range(5)), epochs=1, batch_size=32, n_train=64, n_test=32, n_eval_train=32,
                               depths=(4,), gap_tasks=(), n_val=16, tuning=tuning,
                               tasks_apart=(("mnist1d_mlp", TaskPlan(stack=2)),))
    JOBS.clear()
    records = _runs(cfg, (4,), cfg.tasks, progress=False)
    assert len(records) == 2 * 2 * 5 and all(r["lr"] == pytest.approx(1e-2) for r in records)
    # per task 2 arms, each tuned over 5 rates in one round (a 1-epoch budget) with 5 seeds, then run at the selected
    # rate with its 5 seeds: 6 groups of 5 seeds, each cut to the cap
    groups_per_task = 2 * (5 + 1)
    for task, sizes in expected.items():
        jobs = [n for t, n in JOBS if t == task]
        assert jobs == sizes * groups_per_task, (task, jobs)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_stack_variable_is_refused_naming_it(value, monkeypatch) -> None:
    from pipelab.studies.learning_curves import stack_cap, sweep

    monkeypatch.setenv("PIPELAB_STACK", value)
    for call in (stack_cap, lambda: sweep([])):
        with pytest.raises(ValueError, match=rf"\$PIPELAB_STACK='{value}' is not a number of stacked seeds; use an "
                                             r"integer >= 1"):
            call()
