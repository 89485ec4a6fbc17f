"""Learning-rate tuning: the grid, the halving schedule, selection on the validation split only."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pipelab.studies import learning_curves as lc
from pipelab.studies.learning_curves import RunConfig
from pipelab.studies.tuning import (
    close_decisions,
    final_val_acc,
    halving_schedule,
    lr_grid,
    selected_configs,
    selected_epoch,
    selected_test_acc,
    successive_halving,
)

ARM = dict(task="digits_mlp", optimizer="sgdm", D=4, epochs=9, n_train=256, n_test=100, n_eval_train=100,
           batch_size=32, n_val=64)


def test_lr_grid_is_log_spaced_with_exact_ends() -> None:
    g = lr_grid(1e-4, 1.0, 9)
    assert g[0] == 1e-4 and g[-1] == 1.0 and len(g) == 9
    assert g == pytest.approx(list(np.geomspace(1e-4, 1.0, 9)), rel=1e-12)
    ratios = [b / a for a, b in zip(g, g[1:])]
    assert ratios == pytest.approx([10 ** 0.5] * 8, rel=1e-12)
    with pytest.raises(ValueError, match="n must be an int >= 5"):
        lr_grid(1e-3, 1e-1, 4)
    with pytest.raises(ValueError, match="need 0 < low < high"):
        lr_grid(1e-1, 1e-3, 5)
    with pytest.raises(ValueError, match="need 0 < low < high"):
        lr_grid(0.0, 1e-3, 5)
    with pytest.raises(ValueError, match="low must be a finite number"):
        lr_grid(math.nan, 1e-3, 5)


def test_halving_schedule_is_as_documented() -> None:
    assert halving_schedule(9, eta=3) == [(9, 1), (3, 3)]
    assert halving_schedule(27, eta=3) == [(27, 1), (9, 3), (3, 9)]
    assert halving_schedule(27, eta=3, max_epochs=4) == [(27, 1), (9, 3), (3, 4)]
    assert halving_schedule(27, eta=3, rounds=2) == [(27, 1), (9, 3)]
    assert halving_schedule(5, eta=2, min_epochs=2) == [(5, 2), (3, 4), (2, 8)]  # ⌈5/2⌉ = 3, ⌈3/2⌉ = 2
    assert halving_schedule(1) == []
    assert halving_schedule(27, eta=3, max_epochs=20, last_full=True) == [(27, 1), (9, 3), (3, 20)]
    assert halving_schedule(6, eta=3, max_epochs=12, last_full=True) == [(6, 1), (2, 12)]
    with pytest.raises(ValueError, match="last_full needs max_epochs"):
        halving_schedule(9, last_full=True)
    with pytest.raises(ValueError, match="eta must be an int >= 2"):
        halving_schedule(9, eta=1)


# ------------------------------------------------------------------------------------------------ stub runs

#: known validation accuracy per (policy, lr) after e epochs: the long-run winner is not the 1-epoch leader
_SCORES: dict[tuple[str, float], Any] = {}
_CALLS: list[RunConfig] = []


def _stub(cfg: RunConfig) -> dict[str, Any]:
    _CALLS.append(cfg)
    score, diverged = _SCORES[(cfg.policy, cfg.lr)](cfg.epochs, cfg.seed)
    return {"n_val": cfg.n_val, "val_acc": [0.0, score], "diverged": diverged, "test_acc": [0.0, -1.0]}


def test_successive_halving_selects_the_right_lr_with_the_documented_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", "off")  # every call reaches the stub
    grid9 = lr_grid(1e-3, 1.0, 9)
    grid5 = lr_grid(1e-2, 1.0, 5)
    for i, lr in enumerate(grid9):
        # i = 6 wins after 3 epochs; i = 8 looks best after 1 epoch but diverges at 3; i = 7 leads after one
        # epoch but stalls; seed 1 lowers everything by 0.1 (the mean over seeds decides)
        def s9(e: int, seed: int, i: int = i) -> tuple[float, bool]:
            base = {8: 0.95, 7: 0.9, 6: 0.85}.get(i, 0.1 * i) if e == 1 else {8: math.nan, 7: 0.7, 6: 0.92}.get(i, 0.05)
            return base - 0.1 * seed, i == 8 and e > 1
        _SCORES[("stashing", lr)] = s9
    for i, lr in enumerate(grid5):
        # a tie between i = 1 and i = 3 at every budget: the smaller rate wins
        _SCORES[("pipeoptim", lr)] = lambda e, seed, i=i: ({1: 0.8, 3: 0.8}.get(i, 0.3), False)
    cfgs = [RunConfig(**ARM, policy="stashing", seed=s, lr=lr) for lr in grid9 for s in (0, 1)]
    cfgs += [RunConfig(**ARM, policy="pipeoptim", seed=s, lr=lr) for lr in grid5 for s in (0, 1)]
    _CALLS.clear()
    out = successive_halving(cfgs, _stub, eta=3, min_epochs=1)
    stash, popt = out
    assert stash.lr == grid9[6] and popt.lr == grid5[1]
    assert stash.seeds == (0, 1) and stash.base.lr is None and stash.base.epochs == ARM["epochs"]
    # budgets: 9 rates × 1 epoch, then the best ⌈9/3⌉ = 3 × 3 epochs; 5 rates × 1 epoch, then 2 × 3 epochs
    assert [(len(r.lrs), r.epochs) for r in stash.rounds] == [(9, 1), (3, 3)]
    assert [(len(r.lrs), r.epochs) for r in popt.rounds] == [(5, 1), (2, 3)]
    assert stash.rounds[0].kept == (grid9[8], grid9[7], grid9[6]) and stash.rounds[1].lrs == tuple(sorted(
        (grid9[6], grid9[7], grid9[8])))
    assert stash.rounds[1].scores[stash.rounds[1].lrs.index(grid9[8])] == -math.inf  # divergence = worst
    assert stash.rounds[1].scores[stash.rounds[1].lrs.index(grid9[6])] == pytest.approx(0.87)  # mean of 0.92, 0.82
    # exactly these runs, in this order, each with both seeds: round 0 of both arms, then round 1 of both
    want = [(p, lr, s, e) for p, lrs, e in (("stashing", grid9, 1), ("pipeoptim", grid5, 1)) for lr in lrs
            for s in (0, 1)]
    want += [(p, lr, s, 3) for p, lrs in (("stashing", sorted(grid9[6:])), ("pipeoptim", [grid5[1], grid5[3]]))
             for lr in lrs for s in (0, 1)]
    assert [(c.policy, c.lr, c.seed, c.epochs) for c in _CALLS] == want
    assert len(stash.records) == 2 * (9 + 3) and len(popt.records) == 2 * (5 + 2)
    finals = selected_configs(out, seeds=range(5))
    assert [(c.policy, c.lr, c.seed, c.epochs, c.n_val) for c in finals] == (
        [("stashing", grid9[6], s, 9, 64) for s in range(5)] + [("pipeoptim", grid5[1], s, 9, 64) for s in range(5)])
    assert selected_configs(out, seeds=[0], epochs=20)[0].epochs == 20
    # stopped after one round: the best of that round (the 1-epoch leader), not the smallest survivor
    one = successive_halving(cfgs, _stub, eta=3, rounds=1)
    assert [h.lr for h in one] == [grid9[8], grid5[1]] and [len(h.rounds) for h in one] == [1, 1]
    # a single rate needs no run at all
    (single,) = successive_halving([RunConfig(**ARM, policy="stashing", seed=0, lr=0.1)], _stub)
    assert single.lr == 0.1 and single.rounds == () and single.records == []


def test_halving_rejects_unfair_or_inconsistent_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", "off")
    with pytest.raises(ValueError, match="n_val >= 1"):
        successive_halving([RunConfig(**{**ARM, "n_val": 0}, policy="stashing", seed=0, lr=0.1)], _stub)
    with pytest.raises(ValueError, match="explicit lr"):
        successive_halving([RunConfig(**ARM, policy="stashing", seed=0)], _stub)
    with pytest.raises(ValueError, match="every lr needs the same seeds"):
        successive_halving([RunConfig(**ARM, policy="stashing", seed=0, lr=0.1),
                            RunConfig(**ARM, policy="stashing", seed=1, lr=0.2)], _stub)
    with pytest.raises(ValueError, match="disagree on epochs"):
        successive_halving([RunConfig(**ARM, policy="stashing", seed=0, lr=0.1),
                            RunConfig(**{**ARM, "epochs": 3}, policy="stashing", seed=0, lr=0.2)], _stub)
    with pytest.raises(ValueError, match="configs is empty"):
        successive_halving([], _stub)
    with pytest.raises(ValueError, match="no validation split"):
        final_val_acc({"n_val": 0, "val_acc": [0.5], "diverged": False})
    assert final_val_acc({"n_val": 5, "val_acc": [0.0, 0.6], "diverged": True}) == -math.inf


def _by_rate(score: Any) -> Any:
    """A stub run whose validation accuracy is ``score(lr, seed) -> (accuracy, diverged)``."""
    def run(cfg: RunConfig) -> dict[str, Any]:
        acc, diverged = score(cfg.lr, cfg.seed)
        return {"n_val": cfg.n_val, "val_acc": [0.0, acc], "diverged": diverged, "test_acc": [0.0, -1.0]}
    return run


def test_edge_extension_follows_the_optimum_past_the_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", "off")
    grid = lr_grid(1e-3, 1e-1, 5)  # spacing 10^0.5; the score peaks at 1 (two steps above the grid), diverges above
    step = 10 ** 0.5
    stub = _by_rate(lambda lr, seed: (1 - abs(math.log10(lr)) / 10 - 0.001 * seed, lr > 1.01))
    cfgs = [RunConfig(**ARM, policy="stashing", seed=s, lr=lr) for lr in grid for s in (0, 1, 2)]
    (h,) = successive_halving(cfgs, stub, eta=3, extend=2)
    assert h.lr == pytest.approx(1.0) and h.on_edge  # the allowance ran out exactly at the optimum: flagged
    assert h.extended == pytest.approx([grid[-1] * step, grid[-1] * step ** 2])
    assert h.grid == pytest.approx(sorted([*grid, *h.extended]))
    (h3,) = successive_halving(cfgs, stub, eta=3, extend=3)  # one more: the rate past it diverges, 1.0 is interior
    assert h3.lr == pytest.approx(1.0) and not h3.on_edge and len(h3.extended) == 3
    (h0,) = successive_halving(cfgs, stub, eta=3)  # no extension: stuck on the edge, and flagged
    assert h0.lr == grid[-1] and h0.on_edge and h0.extended == ()
    # every rate of the grid diverges: the grid grows downwards until one trains
    below = _by_rate(lambda lr, seed: (0.5, False) if lr < grid[0] * 0.99 else (math.nan, True))
    (hd,) = successive_halving([RunConfig(**ARM, policy="pipeoptim", seed=s, lr=lr) for lr in grid for s in (0, 1)],
                               below, extend=1)
    assert hd.lr == pytest.approx(grid[0] / step) and hd.on_edge
    (hn,) = successive_halving([RunConfig(**ARM, policy="pipeoptim", seed=s, lr=lr) for lr in grid for s in (0, 1)],
                               below)
    assert hn.all_diverged


def test_last_round_runs_the_full_budget_and_decisions_are_judged_against_seed_noise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", "off")
    grid = lr_grid(1e-2, 1.0, 6)
    # rate i scores 0.5 + 0.01 i with seed noise: seed s adds noise[s][i]; rates 4 and 5 differ by less than it
    noise = [[0.0, 0.0, 0.0, 0.0, 0.02, -0.02], [0.0, 0.0, 0.0, 0.0, -0.02, 0.02], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    for i, lr in enumerate(grid):
        _SCORES[("vanilla", lr)] = lambda e, seed, i=i: (0.5 + 0.1 * (i >= 4) + 0.001 * i + noise[seed][i], False)
    cfgs = [RunConfig(**ARM, policy="vanilla", seed=s, lr=lr) for lr in grid for s in (0, 1, 2)]
    _CALLS.clear()
    (h,) = successive_halving(cfgs, _stub, eta=3, last_full=True, max_epochs=ARM["epochs"])
    assert [(len(r.lrs), r.epochs) for r in h.rounds] == [(6, 1), (2, ARM["epochs"])]
    assert h.rounds[0].seed_scores[4] == pytest.approx((0.624, 0.584, 0.604))
    # round 0 keeps rates 5 and 4 and drops 3 by 0.1 (resolved); round 1 picks 5 over 4 by 0.001 (within noise)
    assert h.rounds[0].decision() == (grid[4], grid[3]) and h.rounds[1].decision() == (grid[5], grid[4])
    assert close_decisions([h]) == (1, 2)
    assert close_decisions([h], confidence=0.5) == (1, 2)


def test_selection_reads_the_epoch_off_the_validation_split() -> None:
    rec = {"n_val": 10, "val_acc": [0.1, 0.7, 0.8, 0.8, 0.6], "test_acc": [0.1, 0.9, 0.75, 0.7, 0.95]}
    assert selected_epoch(rec) == 2 and selected_test_acc(rec) == 0.75  # not the test set's best (0.95)
    assert selected_epoch({"n_val": 0, "val_acc": [math.nan] * 4, "test_acc": [0.1, 0.9, 0.8, math.nan]}) == 2
    assert selected_epoch({"test_acc": [0.1, 0.9, 0.8]}) == 2  # no split: the last finite epoch, nothing selected
    diverged = {"n_val": 10, "val_acc": [0.1, math.nan], "test_acc": [0.1, math.nan]}
    assert selected_epoch(diverged) is None and math.isnan(selected_test_acc(diverged))
    late = {"n_val": 10, "val_acc": [0.1, 0.6, 0.7, math.nan], "test_acc": [0.1, 0.5, 0.65, math.nan]}
    assert selected_epoch(late) == 2  # a run that diverged later is read at its best validated epoch


# ------------------------------------------------------------------------------------------- a real task


class _Poison:
    """Stands in for the test metrics: any read of them fails the test."""

    def __getitem__(self, _: Any) -> Any:
        raise AssertionError("the tuner read a test metric")

    def __iter__(self) -> Any:
        raise AssertionError("the tuner read a test metric")

    def __len__(self) -> int:
        raise AssertionError("the tuner read a test metric")


def _poisoned_run(cfg: RunConfig) -> dict[str, Any]:
    rec = lc.run(cfg)
    rec["test_acc"], rec["test_loss"] = _Poison(), _Poison()
    return rec


def test_real_task_end_to_end_never_reads_the_test_set(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path))
    arm = {**ARM, "epochs": 2}
    grid = lr_grid(1e-3, 3.0, 5)
    cfgs = [RunConfig(**arm, policy="stashing", seed=0, lr=lr) for lr in grid]
    (h,) = successive_halving(cfgs, _poisoned_run, eta=2)
    assert [(len(r.lrs), r.epochs) for r in h.rounds] == [(5, 1), (3, 2), (2, 2)]  # budgets capped at epochs=2
    assert len(h.records) == 5 + 3 + 2 and all(isinstance(r["test_acc"], _Poison) for r in h.records)
    assert all(r["n_val"] == 64 and len(r["val_acc"]) == r["epochs"] + 1 for r in h.records)
    last = h.rounds[-1]
    assert h.lr in grid and h.lr == last.kept[0] and last.scores[last.lrs.index(h.lr)] == max(last.scores)
    assert max(last.scores) > 0.2  # something learnt (10 classes: chance is 0.1)
    # the same selection from the unpoisoned runner (which has real test metrics to be tempted by)
    (plain,) = successive_halving(cfgs, eta=2)
    assert plain.lr == h.lr and [r.scores for r in plain.rounds] == [r.scores for r in h.rounds]
    (final,) = selected_configs([h], seeds=[3])
    assert (final.lr, final.seed, final.epochs, final.n_val) == (h.lr, 3, 2, 64)
