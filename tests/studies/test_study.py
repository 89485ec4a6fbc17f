"""The learning-curve study: tuned rates, the lr map with its stability threshold, tuned vs common, the preset."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipelab.stability import heavy_ball_threshold
from pipelab.studies.figures.learning_curves import _config, _runs, tuned_arms
from pipelab.studies.figures.study import STUDY_FIGURES, lr_map_rows, threshold_lrs, tuned_rows
from pipelab.studies.settings import STUDY_TUNING, Tuning
from pipelab.studies.tuning import Halving, HalvingRound


def test_threshold_lrs_are_the_heavy_ball_thresholds_over_the_eigenvalue() -> None:
    thr = threshold_lrs(90.0, D=4)
    assert set(thr) == {0, 3}
    assert thr[0] == pytest.approx(heavy_ball_threshold(0.9) / 90.0, rel=1e-3)   # 2(1 + β)/λ
    assert thr[0] == pytest.approx(3.8 / 90.0, rel=1e-3)
    assert thr[3] < thr[0] / 10                 # a delay of 3 shrinks the stable step by over 10× for β = 0.9
    assert threshold_lrs(90.0, D=1) == {0: thr[0]}


def test_study_grids_straddle_the_measured_thresholds() -> None:
    # λ_max of the Fashion-MNIST MLP at initialisation is about 90 (figure study_lr_map measures it)
    lrs = STUDY_TUNING.lrs("sgdm")
    assert len(lrs) >= 5 and len(STUDY_TUNING.lrs("adam")) >= 5
    for D in (4, 8):
        thr = threshold_lrs(90.0, D)
        assert min(lrs) < thr[D - 1] and thr[0] < max(lrs)
    with pytest.raises(ValueError, match="no learning-rate grid for optimizer 'rmsprop'"):
        STUDY_TUNING.lrs("rmsprop")


def test_the_study_preset_is_full_scale_tuned_on_three_seeds_with_ten_and_a_criterion() -> None:
    cfg = _config("study")
    assert cfg.n_train is None and cfg.n_test is None and cfg.n_val > 0 and cfg.tuning is not None
    assert len(cfg.seeds) >= 10 and {4, 8} <= set(cfg.depths)   # 10 seeds in the rows that decide a verdict
    assert set(cfg.tuning.seeds).isdisjoint(cfg.seeds)          # rates are not chosen on the reported seeds
    assert len(cfg.tuning.seeds) >= 3 and cfg.tuning.extend >= 1 and cfg.tuning.last_full
    assert cfg.convergence is not None and cfg.convergence.tol > 0 and cfg.convergence.window >= 1
    assert "fashion_mnist_cnn" in cfg.tasks and cfg.optimizers_of("fashion_mnist_cnn") == ("adam",)
    assert "wordlang_transformer" in cfg.tasks
    assert cfg.epochs_of("fashion_mnist_mlp") == cfg.epochs and cfg.plan("fashion_mnist_mlp").n_train is None
    from pipelab.studies.figures.learning_curves import arm_configs

    arms = arm_configs(cfg, cfg.depths, cfg.tasks)
    mlp = [c for c in arms if c.task == "fashion_mnist_mlp"]
    assert {c.D for c in mlp} == {4, 8} and {c.optimizer for c in mlp} == {"sgdm", "adam"}
    assert all(c.n_train is None for c in mlp)                  # the full 60k (minus the validation split)
    assert {(c.D, c.optimizer, c.n_train) for c in arms if c.task == "fashion_mnist_cnn"} == {(4, "adam", 20_000)}
    assert {c.D for c in arms if c.task == "wordlang_transformer"} == {4, 8}
    # the CNN and the Transformer run well past their earlier 351 steps and 4 epochs
    assert cfg.epochs_of("fashion_mnist_cnn") >= 10 and cfg.epochs_of("wordlang_transformer") >= 10
    # the D = 8 rows are run (and written per seed) by the depth figure
    assert {"fashion_mnist_mlp", "wordlang_transformer"} <= set(cfg.gap_tasks)


def _halving(policy: str, lrs: list[float], scores: list[float], kept: list[float], selected: float) -> Halving:
    from pipelab.studies.learning_curves import RunConfig

    base = RunConfig(task="digits_mlp", policy=policy, optimizer="sgdm", D=4, seed=100, n_val=10)
    rounds = (HalvingRound(1, tuple(lrs), tuple(scores), tuple(kept)),
              HalvingRound(3, tuple(sorted(kept)), tuple(scores[: len(kept)]), (selected,)))
    return Halving(base, (100,), selected, rounds, [])


def test_lr_map_rows_mark_divergence_and_the_selected_rate() -> None:
    h = _halving("stashing", [0.001, 0.01, 0.1], [0.5, 0.8, -math.inf], [0.01], 0.01)
    rows = lr_map_rows([h])
    first = [r for r in rows if r["round"] == 0]
    assert [r["lr"] for r in first] == [0.001, 0.01, 0.1]
    assert [r["diverged"] for r in first] == [False, False, True]
    assert math.isnan(first[2]["val_acc"]) and first[1]["val_acc"] == 0.8
    assert [r["selected"] for r in first] == [False, True, False]


def _rec(policy: str, seed: int, best: float, lr: float | None) -> dict:
    return {"task": "digits_mlp", "optimizer": "sgdm", "D": 4, "policy": policy, "seed": seed, "lr": lr,
            "test_acc": [0.1, best], "diverged": False, "n_test": 359}


def test_tuned_rows_pair_tuned_and_common_runs_by_seed() -> None:
    tuned = [_rec("stashing", s, b, 0.03) for s, b in enumerate([0.90, 0.91, 0.92])]
    common = [_rec("stashing", s, b, None) for s, b in enumerate([0.85, 0.87, 0.86])]
    (row,) = tuned_rows(tuned, common)
    diffs = [0.05, 0.04, 0.06]
    assert row["tuned_lr"] == 0.03 and row["common_lr"] == 0.01       # the common rate: SGDM's 0.01
    assert row["diff_mean"] == pytest.approx(sum(diffs) / 3)
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * stats.tstd(diffs) / math.sqrt(3)
    assert row["diff_ci95"] == pytest.approx(half)
    assert row["diff_resolved"] and row["n_test"] == 359
    assert row["tuned_mean"] == pytest.approx(0.91)


def test_tuned_cells_are_blank_when_never_run_and_leave_diverged_seeds_out() -> None:
    from pipelab.studies.figures.study import _cell

    tuned = [_rec("stashing", s, b, 0.03) for s, b in enumerate([0.90, 0.91, 0.92, 0.2])]
    tuned[3]["diverged"] = True                                  # its last finite accuracy is not averaged in
    (row,) = tuned_rows(tuned, [])
    assert row["common_runs"] == 0 and _cell(row["common_mean"], row["common_ci95"], row["common_diverged"],
                                             row["common_runs"]) == ""
    assert row["tuned_mean"] == pytest.approx(0.91) and row["tuned_diverged"] == 1
    assert _cell(row["tuned_mean"], row["tuned_ci95"], 1, 4).endswith(" 1✗")
    assert _cell(math.nan, math.nan, 3, 3) == "diverged (3✗)"


def test_the_tiny_preset_selects_each_arm_on_the_validation_split(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path))
    cfg = _config("tiny")
    assert isinstance(cfg.tuning, Tuning)
    halvings = tuned_arms(cfg, (cfg.D,), cfg.tasks)
    assert {h.base.policy for h in halvings} == set(cfg.policies)
    for h in halvings:
        first = h.rounds[0]
        assert h.lr in first.lrs
        # the selected rate has the best first-round validation score among the survivors of every round
        assert h.lr == h.rounds[-1].kept[0]
        assert all(r["n_val"] == cfg.n_val for r in h.records)
    runs = _runs(cfg, (cfg.D,), cfg.tasks, False)
    chosen = {h.base.policy: h.lr for h in halvings}
    assert all(r["lr"] == chosen[r["policy"]] for r in runs)
    assert all(r["seed"] in cfg.seeds for r in runs)
    common = _runs(cfg, (cfg.D,), cfg.tasks, False, lr="common")
    assert all(r["lr"] is None for r in common)


def test_the_cli_draws_the_study_figures_into_figures_study(monkeypatch, tmp_path: Path) -> None:
    from pipelab.studies import cli, figures, runner

    drawn: list[tuple[list[str], str, str, int]] = []
    monkeypatch.setattr(runner, "run_figures", lambda names, preset, out, *, workers, **kw:
                        drawn.append((list(names), preset, out, workers)) or 0)
    monkeypatch.setattr(figures, "check_outdir", lambda out, **kw: None)
    monkeypatch.delenv("PIPELAB_WORKERS", raising=False)
    assert cli.main(["figures", "--preset", "study", "--workers", "3"]) == 0
    assert drawn[-1] == (list(STUDY_FIGURES), "study", "figures/study", 3)
    assert cli.main(["figures", "--preset", "quick", "--out", str(tmp_path)]) == 0
    names, _, _, workers = drawn[-1]
    assert "learning_curves" in names and "study_lr_map" not in names      # quick tunes nothing
    assert workers == runner.default_workers()                             # one per core
    monkeypatch.setenv("PIPELAB_WORKERS", "2")
    assert cli.main(["figures", "--preset", "quick", "learning_curves"]) == 0
    assert drawn[-1][0] == ["learning_curves"] and drawn[-1][3] == 2
    assert cli.main(["figures", "--preset", "quick", "--workers", "0"]) == 2


@pytest.mark.slow
def test_study_figures_render_under_tiny(tmp_path: Path, monkeypatch) -> None:
    from pipelab.studies import figures

    monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path / "cache"))
    for name in ("study_lr_map", "study_tuned_table"):
        figures.render([name], "tiny", tmp_path)
        csv = (tmp_path / f"{name}.csv").read_text().splitlines()
        assert len(csv) > 1
    header = (tmp_path / "study_tuned_table.csv").read_text().splitlines()[0].split(",")
    assert {"tuned_lr", "common_lr", "diff_mean", "diff_resolved", "n_test"} <= set(header)
    with pytest.raises(ValueError, match="tunes no learning rates"):
        figures.make("study_lr_map", preset="quick")


def _run(policy: str, seed: int, acc: list[float], val: list[float], D: int = 4) -> dict:
    return {"task": "digits_mlp", "optimizer": "adam", "D": D, "policy": policy, "seed": seed, "lr": 1e-3,
            "epochs": len(acc) - 1, "steps_per_epoch": 10, "n_test": 359, "diverged": False, "diverged_step": None,
            "weight_copies": [1, 1], "test_acc": acc, "val_acc": val, "train_loss": [2.0] * len(acc),
            "seconds": 1.5, "epoch": list(range(len(acc)))}


def test_runs_csv_round_trips_what_the_notebook_reads(tmp_path: Path) -> None:
    from pipelab.studies.figures.learning_curves import read_runs, runs_csv, summary_rows

    recs = [_run("sequential", 0, [0.1, 0.5, 0.7], [0.1, 0.52, 0.69]), _run("stashing", 0, [0.1, 0.4, 0.6],
                                                                            [0.1, 0.41, 0.62])]
    path = tmp_path / "x.runs.csv"
    path.write_text(runs_csv(recs))
    assert "seconds" not in path.read_text().splitlines()[0].split(",")  # wall-clock time is no result
    back = read_runs(path)
    for a, b in zip(recs, back):
        for key in ("task", "policy", "seed", "D", "steps_per_epoch", "weight_copies", "diverged"):
            assert a[key] == b[key], key
        assert b["test_acc"] == pytest.approx(a["test_acc"], rel=1e-6) and b["lr"] == pytest.approx(1e-3)
    assert [r["best_mean"] for r in summary_rows(back)] == pytest.approx([0.7, 0.6], rel=1e-6)


def test_convergence_reads_the_last_window_of_the_sequential_validation_curve() -> None:
    from pipelab.studies.figures.study import convergence_markdown, convergence_of

    flat = [_run("sequential", s, [0.1, 0.8, 0.85, 0.85], [0.1, 0.800, 0.801, 0.802]) for s in (0, 1)]
    rising = [_run("sequential", s, [0.1, 0.8, 0.85, 0.86], [0.1, 0.80, 0.82, 0.83]) for s in (0, 1)]
    assert "digits_mlp · Adam · D=4 (lr 0.001, 3 epochs): converged" in convergence_markdown(flat)
    assert "+0.20 pp" in convergence_markdown(flat, tol=0.003, window=2)
    md = convergence_markdown(rising, tol=0.003, window=2)
    assert "**not converged**" in md and "+3.00 pp" in md
    assert ": converged" in convergence_markdown(rising, tol=0.02, window=1)  # +1 pp over the last epoch, under 2
    assert convergence_of({"config": {"convergence": {"tol": 0.01, "window": 3}}}) == {"tol": 0.01, "window": 3}
    assert "too short" not in convergence_markdown(flat) and "long enough" in convergence_markdown(flat[:1], window=3)


def test_time_to_target_uses_the_first_epoch_at_the_target_and_the_forecast_period() -> None:
    from pipelab.studies.figures.study import time_to_target_markdown, time_to_target_rows

    recs = [_run("sequential", s, [0.1, 0.6, 0.8], [0] * 3) for s in (0, 1)]
    recs += [_run("stashing", s, [0.1, 0.795, 0.79], [0] * 3) for s in (0, 1)]
    recs += [_run("vanilla", s, [0.1, 0.5, 0.6], [0] * 3) for s in (0, 1)]
    periods = {"digits_mlp": {"sequential": 0.4, "stashing": 0.1, "vanilla": 0.05}}
    rows = {r["policy"]: r for r in time_to_target_rows(recs, periods, "adam", 4)}
    assert rows["sequential"]["target"] == pytest.approx(0.79)
    assert rows["sequential"]["epoch"] == 2 and rows["sequential"]["seconds"] == pytest.approx(2 * 10 * 0.4)
    assert rows["stashing"]["epoch"] == 1 and rows["stashing"]["seconds"] == pytest.approx(10 * 0.1)
    assert rows["vanilla"]["seconds"] is None
    text = time_to_target_markdown(list(rows.values()))
    assert text.index("PipeDream (stashing) 1 s") < text.index("sequential 8 s") and "never reached: vanilla" in text
