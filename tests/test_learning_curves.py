"""Learning-curve runner: identical seeding, consistent arms, divergence as a result, cached sweeps, figures."""

from __future__ import annotations

import functools
import math

import pytest

from pipelab import learning_curves as lc
from pipelab.learning_curves import RunConfig, grid, run, sweep

SMALL = dict(task="digits_mlp", optimizer="adam", D=4, seed=0, epochs=2, batch_size=32, n_train=256, n_test=100,
             n_eval_train=100)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="task="):
        RunConfig(**{**SMALL, "task": "cifar"}, policy="stashing")
    with pytest.raises(ValueError, match="policy="):
        RunConfig(**SMALL, policy="oracle")
    with pytest.raises(ValueError, match="optimizer="):
        RunConfig(**{**SMALL, "optimizer": "lion"}, policy="stashing")
    with pytest.raises(ValueError, match="schedule="):
        RunConfig(**SMALL, policy="stashing", schedule="zb_v")
    with pytest.raises(ValueError, match="cannot run policy 'stashing'.*gpipe, 1f1b"):
        RunConfig(**SMALL, policy="stashing", schedule="zb_h1")


def test_same_config_same_curve_and_shared_start() -> None:
    a = run(RunConfig(**SMALL, policy="pipeoptim"))
    b = run(RunConfig(**SMALL, policy="pipeoptim"))
    c = run(RunConfig(**SMALL, policy="stashing"))
    assert a["test_acc"] == b["test_acc"] and a["train_loss"] == b["train_loss"]
    assert a["train_loss"][0] == c["train_loss"][0]  # every arm starts from the same weights
    assert a["train_loss"][-1] != c["train_loss"][-1]
    assert len(a["test_acc"]) == SMALL["epochs"] + 1 and all(math.isfinite(v) for v in a["test_acc"])
    assert a["weight_copies"] == [2, 2, 2, 1] and c["weight_copies"] == [4, 3, 2, 1]


def test_flushed_arms_equal_the_sequential_arm_in_float64() -> None:
    cfg = {**SMALL, "dtype": "float64", "M": 4}
    seq = run(RunConfig(**cfg, policy="sequential"))
    for pol, schedule in (("gpipe", None), ("1f1b", None), ("1f1b", "zb_h1")):
        r = run(RunConfig(**cfg, policy=pol, schedule=schedule))
        for key in ("train_loss", "test_loss", "running_loss"):
            assert max(abs(x - y) for x, y in zip(seq[key][1:], r[key][1:])) <= 1e-9, (pol, key)


def test_asynchronous_arms_run_on_the_split_backward_schedule() -> None:
    fused = run(RunConfig(**SMALL, policy="stashing"))
    split = run(RunConfig(**SMALL, policy="stashing", schedule="zb_async"))
    assert split["schedule"] == "zb_async" and not split["diverged"]
    assert all(math.isfinite(v) for v in split["test_acc"])
    assert split["train_loss"][0] == fused["train_loss"][0] and split["train_loss"][-1] != fused["train_loss"][-1]
    # deferred W passes keep every forward in flight longer: stage k stashes D versions, not D - k
    assert split["weight_copies"] == [4, 4, 4, 4] and fused["weight_copies"] == [4, 3, 2, 1]


def test_divergence_is_recorded() -> None:
    r = run(RunConfig(**{**SMALL, "optimizer": "sgdm"}, policy="vanilla", lr=1e6))
    assert r["diverged"] and r["diverged_step"] is not None
    assert math.isnan(r["test_acc"][-1])


def test_grid_skips_impossible_arms() -> None:
    g = grid(["digits_mlp", "fashion_mnist_cnn"], ["sequential", "spectrain"], ["sgdm", "adam"], [4, 8], [0, 1])
    assert not any(c.policy == "spectrain" and c.optimizer != "sgdm" for c in g)
    assert not any(c.task == "fashion_mnist_cnn" and c.D == 8 for c in g)  # 4 blocks only
    assert len(g) == 2 * (3 + 3 + 3)


def test_sweep_is_cached_and_resumes(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path))
    cfgs = [RunConfig(**{**SMALL, "epochs": 1}, policy=p) for p in ("sequential", "stashing")]
    first = sweep(cfgs[:1])
    calls = []
    real = lc.run
    # wraps: the spy is keyed on the code of the real run (the cache keys entries on the code of fn)
    monkeypatch.setattr(lc, "run", functools.wraps(real)(lambda c: calls.append(c) or real(c)))
    both = sweep(cfgs)
    assert calls == [cfgs[1]]  # the finished run came from the cache
    assert both[0]["test_acc"] == first[0]["test_acc"]


def test_figures_under_tiny() -> None:
    from pipelab import figures

    out = figures.make("final_accuracy_table", "tiny")
    header = out.tables["csv"].splitlines()[0]
    assert header.startswith("task,optimizer,D,policy,seeds,diverged,best_mean")
    assert len(out.tables["csv"].splitlines()) == 1 + 3  # three policies in the tiny preset
    assert figures.make("learning_curves", "tiny").notes["runs"] == 3
