"""Reliability probes for the study's verdicts (issue 26): silent wrong results of the tables, figures and winners,
each a constructed case that main's code got wrong."""

from __future__ import annotations

import math

import numpy as np
import pytest


def _rec(policy: str, seed: int, test: list[float], val: list[float], *, task: str = "digits_mlp", D: int = 4,
         diverged: bool = False) -> dict:
    return {"task": task, "optimizer": "adam", "D": D, "policy": policy, "seed": seed, "test_acc": test,
            "val_acc": val, "epoch": list(range(len(test))), "train_loss": [1.0] * len(test), "diverged": diverged,
            "n_test": 2000, "n_val": 100, "lr": 1e-3, "weight_copies": [1] * D, "seconds": 0.0, "steps_per_epoch": 10}


def test_the_epoch_a_run_is_read_at_is_chosen_on_validation_not_test() -> None:
    from pipelab.studies.figures.learning_curves import summary_rows

    # validation peaks at epoch 1; the test set's best epoch is 2: reading it there selects on the test set
    recs = [_rec("sequential", s, [0.1, 0.80 + s / 100, 0.90], [0.1, 0.85, 0.84]) for s in range(3)]
    (row,) = summary_rows(recs)
    assert row["best_mean"] == pytest.approx(0.81)


def test_a_diverged_seed_stays_out_of_the_gap_interval() -> None:
    from pipelab.studies.figures.learning_curves import gap_rows

    seq = [_rec("sequential", s, [0.1, 0.85 + s / 1000], [0.1, 0.85]) for s in range(5)]
    pip = [_rec("pipeoptim", s, [0.1, 0.84 + s / 1000], [0.1, 0.84]) for s in range(4)]
    pip.append(_rec("pipeoptim", 4, [0.1, 0.42], [0.1, 0.42], diverged=True))  # diverged late: a finite accuracy
    (g,) = gap_rows(seq + pip)
    assert g["gap"].n == 4 and g["gap"].n_nan == 1 and g["gap"].half_width < 0.001  # no ±42-pp bar
    assert g["gap"].mean == pytest.approx(-0.01)


def test_a_never_run_common_rate_is_blank_not_diverged() -> None:
    from pipelab.studies.figures.study import _cell, tuned_rows

    (row,) = tuned_rows([_rec("stashing", s, [0.1, 0.9], [0.1, 0.9]) for s in range(3)], [])
    assert "diverged" not in _cell(row["common_mean"], row["common_ci95"], row["common_diverged"],
                                   row.get("common_runs", 0))


def test_a_winner_found_among_rows_searched_is_corrected_for_the_search() -> None:
    from pipelab.studies.figures.learning_curves import summary_rows

    # row t0: pipeoptim beats stashing with p ~ 0.035 (alone: a winner); three more rows searched without a winner
    base = np.array([0.80, 0.86, 0.83, 0.89, 0.84, 0.82])
    near = [0.003, 0.001, 0.006, 0.002, 0.0, 0.005]
    recs = []
    for k in range(4):
        for s in range(6):
            up = near[s] if k == 0 else [0.002, -0.003, 0.001, 0.004, -0.002, 0.0][s] * (k + 1)
            for pol, acc in (("pipeoptim", base[s] + (up if k == 0 else 0.0)), ("stashing", base[s] + (0.0 if k == 0
                                                                                                         else up))):
                # four rows (task, D) on data that ships with the packages: no download, no Debian package
                task, D = [("digits_mlp", 4), ("mnist1d_mlp", 4), ("digits_mlp", 8), ("mnist1d_mlp", 8)][k]
                recs.append(_rec(pol, s, [0.1, acc], [0.1, acc], task=task, D=D))
    rows = summary_rows(recs)
    assert len(rows) == 8 and not any(r["winner"] for r in rows)
    alone = summary_rows([r for r in recs if r["task"] == "digits_mlp" and r["D"] == 4])
    assert [r["policy"] for r in alone if r["winner"]] == ["pipeoptim"]
    assert math.isfinite(alone[0]["best_mean"])
