"""The claims' rule on constructed rows: Holm over a claim's rows, divergences as failures, scipy's t test as the
reference for every p-value."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from pipelab.statistics import holm, resolved
from pipelab.studies import claims as C
from pipelab.studies.claims import winner_test, winners_across_rows

SEEDS = range(6)
SEED_EFFECT = np.array([0.80, 0.86, 0.83, 0.89, 0.84, 0.82])  # shared by every arm of a seed


def _rec(task: str, D: int, policy: str, seed: int, acc: float, diverged: bool = False,
         curve: list[float] | None = None) -> dict[str, Any]:
    """A run whose validation accuracy peaks at epoch 2, where its test accuracy is ``acc``; epoch 3's test accuracy
    is higher (a test-selected epoch would read it)."""
    val = curve or [0.1, acc - 0.02, acc, acc - 0.01]
    test = [0.1, acc - 0.03, math.nan if diverged else acc, math.nan if diverged else acc + 0.05]
    return {"task": task, "optimizer": "adam", "D": D, "policy": policy, "seed": seed, "diverged": diverged,
            "val_acc": val, "test_acc": test, "steps_per_epoch": 10, "n_val": 100}


def _rows(offsets: dict[tuple[str, int], dict[str, list[float]]]) -> list[dict[str, Any]]:
    return [_rec(task, D, pol, s, SEED_EFFECT[s] + off[s]) for (task, D), arms in offsets.items()
            for pol, off in arms.items() for s in SEEDS]


def _claim(records: list[dict[str, Any]], name: str) -> C.ClaimVerdict:
    return next(v for v in C.decide_all(records) if v.claim == name)


NOISE = [0.002, -0.003, 0.001, 0.004, -0.002, 0.0]


def test_beats_is_holm_adjusted_over_the_rows_of_the_claim() -> None:
    # two rows, each with pipeoptim ~0.3 pp ahead of stashing at 0.025 < p < 0.05: each alone would reproduce
    near = [0.003, 0.001, 0.006, 0.002, 0.0, 0.005]
    near2 = [0.005, 0.002, 0.0, 0.006, 0.001, 0.003]
    records = _rows({("t1", 4): {"pipeoptim": near, "stashing": [0.0] * 6},
                     ("t2", 8): {"pipeoptim": near2, "stashing": [0.0] * 6}})
    raw = [stats.ttest_rel(SEED_EFFECT + x, SEED_EFFECT).pvalue for x in (near, near2)]
    assert all(0.025 < p < 0.05 for p in raw)  # the case this test is about
    v = _claim(records, "Prediction beats weight stashing")
    assert [e.row for e in v.rows] == [("t1", "adam", 4), ("t2", "adam", 8)]  # D = 4 and D = 8 rows both decide
    assert [e.diff.p_value for e in v.rows] == pytest.approx(raw, rel=1e-6)
    assert [e.p_adjusted for e in v.rows] == pytest.approx(list(holm(raw)), rel=1e-6)
    assert [e.outcome for e in v.rows] == ["open", "open"]  # adjusted, 2 × 0.03 > 0.05
    assert v.verdict == "inconclusive" and v.p == pytest.approx(max(holm(raw)))
    alone = _claim([r for r in records if r["task"] == "t2"], "Prediction beats weight stashing")
    assert alone.verdict == "reproduced" and alone.p == pytest.approx(raw[1], rel=1e-6)
    # a third row far ahead (p tiny) is for the claim; the two near rows still need 2 p < 0.05 (Holm steps 2, 3)
    far = [0.02 + n for n in NOISE]
    both = records + _rows({("t3", 4): {"pipeoptim": far, "stashing": [0.0] * 6}})
    assert [e.outcome for e in _claim(both, "Prediction beats weight stashing").rows] == ["open", "open", "for"]
    # a row resolved against (after Holm) refutes it
    against = _rows({("t3", 4): {"pipeoptim": [-x for x in far], "stashing": [0.0] * 6}})
    w = _claim(records + against, "Prediction beats weight stashing")
    assert w.verdict == "refuted" and w.rows[2].outcome == "against"
    assert w.p == pytest.approx(w.rows[2].p_adjusted)


def test_matches_tests_against_the_margin_on_the_validation_selected_epoch() -> None:
    # 2BW is 0.5 pp behind sequential (within the 1-pp margin, resolved); PipeOptim 2 pp behind (resolved outside)
    behind_half = [-0.005 + n / 4 for n in NOISE]
    behind_two = [-0.02 + n / 4 for n in NOISE]
    records = _rows({("t1", 4): {"sequential": [0.0] * 6, "2bw": behind_half, "pipeoptim": behind_two}})
    v2 = _claim(records, "PipeDream-2BW matches the accuracy of flushed training")
    ref = stats.ttest_1samp(np.array(behind_half), -C.MATCH_MARGIN).pvalue
    assert v2.rows[0].diff.p_value == pytest.approx(ref, rel=1e-6) and v2.verdict == "reproduced"
    # the difference is read at the validation-selected epoch (epoch 2), not the test set's best (epoch 3)
    assert v2.rows[0].diff.mean == pytest.approx(np.mean(behind_half))
    vp = _claim(records, "PipeOptim matches (or beats) GPipe")
    assert vp.verdict == "refuted" and vp.rows[0].outcome == "against"
    # the fixed target: sequential's mean best validation accuracy − 1 pp, reached at epoch 2 (or never)
    st = C.steps_to_target(records, ("t1", "adam", 4), "pipeoptim", "sequential")
    assert st is not None and st["target"] == pytest.approx(SEED_EFFECT.mean() - 0.01)
    t = st["target"]
    assert st["sequential"] == [10 if a - 0.02 >= t else 20 if a >= t else None for a in SEED_EFFECT]
    assert st["sequential"].count(None) == 3  # seeds below the mean never reach it: the target is a fixed bar
    md = C.claims_markdown(records)
    assert "steps to" in md and "p̃" in md and "Holm" in md


def test_a_divergence_of_the_claimed_arm_is_a_failure_and_of_the_other_is_left_out() -> None:
    good = [0.02 + n for n in NOISE]
    records = _rows({("t1", 4): {"pipeoptim": good, "stashing": [0.0] * 6}})
    records[0] = _rec("t1", 4, "pipeoptim", 0, 0.5, diverged=True)  # one diverged seed of the claimed arm
    v = _claim(records, "Prediction beats weight stashing")
    e = v.rows[0]
    assert e.diverged_a == 1 and e.diff.n == 5 and e.diff.n_nan == 1
    assert e.outcome == "against" and v.verdict == "refuted" and math.isnan(v.p)
    assert "divergence" in C.claims_markdown(records)
    # the same seed diverging in the other arm is left out of the test, which still resolves the claim
    records = _rows({("t1", 4): {"pipeoptim": good, "stashing": [0.0] * 6}})
    records[6] = _rec("t1", 4, "stashing", 0, 0.5, diverged=True)
    v = _claim(records, "Prediction beats weight stashing")
    assert v.rows[0].diverged_b == 1 and v.rows[0].diff.n == 5 and v.verdict == "reproduced"
    assert _claim(records, "SpecTrain reaches the staleness-free accuracy").verdict == "not run"


def test_winners_are_corrected_over_the_rows_searched() -> None:
    near = [0.003, 0.001, 0.006, 0.002, 0.0, 0.005]  # p ~ 0.03 over its one rival
    rows = {("t1", 4): {"pipeoptim": near, "stashing": [0.0] * 6, "sequential": [0.05] * 6}}
    rows.update({(f"n{k}", 4): {"pipeoptim": [0.0] * 6, "stashing": [n * (k + 1) for n in NOISE]} for k in range(3)})
    md_one = C.winners_markdown(_rows({("t1", 4): rows[("t1", 4)]}))
    assert "**resolved winner**" in md_one and "1 of 1 rows" in md_one  # sequential is no candidate
    md = C.winners_markdown(_rows(rows))
    assert "0 of 4 rows" in md and "**resolved winner**" not in md


def test_winner_across_rows_needs_holm_over_the_rows_searched() -> None:
    # a constructed row whose winner has p ~= 0.03 (every other arm far behind but one), searched among 4 rows
    rng = np.random.default_rng(3)
    seed_effect = rng.normal(0, 0.01, 6)
    close = {"A": list(seed_effect + [0.903, 0.916, 0.899, 0.913, 0.905, 0.909]), "B": list(seed_effect + 0.9),
             "C": list(seed_effect + 0.5)}
    alone = winner_test(close)
    assert 0.01 < alone.p_value < 0.05 and alone.winner == "A"  # the case this test is about
    null = {f"p{j}": list(seed_effect + rng.normal(0, 0.02, 6)) for j in range(3)}
    rows = {"r0": close, "r1": null, "r2": null, "r3": null}
    out = winners_across_rows(rows)
    raw = [winner_test(r).p_value for r in rows.values()]
    assert [out[k].family_p for k in rows] == pytest.approx(list(holm(raw)))
    assert out["r0"].family_p == pytest.approx(min(1.0, 4 * alone.p_value))
    assert out["r0"].candidate == "A" and out["r0"].winner is None
    assert winners_across_rows({"r0": close})["r0"].winner == "A"  # one row searched: no second correction
    clear = {"a": [0.9, 0.91, 0.92], "b": [0.8, 0.82, 0.81], "c": [0.7, 0.69, 0.72]}
    assert winners_across_rows({"x": clear, "y": clear})["x"].winner == "a"
    assert winners_across_rows({}) == {}


# --- the winner test (moved with winner_test from pipelab.statistics): scipy's paired t test and Holm as references


def _resolved_winner(arms: dict) -> object:
    return winner_test(arms).winner


def test_winner_test_bad_input() -> None:
    with pytest.raises(ValueError, match="correction="):
        winner_test({"a": [1, 2], "b": [0, 1]}, correction="bonferroni")
    with pytest.raises(ValueError, match="at least two"):
        winner_test({"a": [1, 2]})


def _arms_with_p() -> dict[str, list[float]]:
    """Candidate A is ahead of B and C; the raw paired p-values are 0.01 < p < 0.05 for both."""
    return {"A": [0.90, 0.92, 0.94, 0.91], "B": [0.89, 0.89, 0.92, 0.90], "C": [0.88, 0.89, 0.93, 0.90]}


def test_winner_needs_every_difference_resolved_after_holm() -> None:
    arms = _arms_with_p()
    t = winner_test(arms, correction="none")
    raw = {k: d.p_value for k, d in t.differences.items()}
    assert raw["B"] == pytest.approx(stats.ttest_rel(arms["A"], arms["B"]).pvalue)
    assert all(0.025 < p < 0.05 for p in raw.values()), raw  # the case this test is about
    assert t.winner == "A" and all(resolved(d) for d in t.differences.values())
    h = winner_test(arms)  # Holm: the smaller p is doubled -> above 0.05
    assert h.candidate == "A" and h.winner is None and winner_test(arms).winner is None
    assert sorted(h.adjusted_p.values()) == pytest.approx(sorted(holm(list(raw.values()))))


def test_winner_clear_tied_and_diverged() -> None:
    clear = {"a": [0.9, 0.91, 0.92], "b": [0.8, 0.82, 0.81], "c": [0.7, 0.69, 0.72]}
    assert _resolved_winner(clear) == "a"
    assert _resolved_winner({"a": [0.9, 0.8, 0.85], "b": [0.89, 0.81, 0.84]}) is None
    # the best mean has a diverged seed: it cannot win, and the next one must beat it on the other seeds
    t = winner_test({"a": [0.99, math.nan, 0.99], "b": [0.9, 0.91, 0.92], "c": [0.7, 0.69, 0.72]})
    assert t.candidate == "b" and t.winner is None  # b - a is negative on the finite seeds
    assert _resolved_winner({"a": [0.5, math.nan, 0.5, 0.52], "b": [0.9, 0.91, 0.92, 0.93],
                            "c": [0.7, 0.69, 0.72, 0.7]}) == "b"
    assert winner_test({"a": [math.nan], "b": [math.nan]}).candidate is None
    assert _resolved_winner({0: {1: 0.9, 2: 0.91, 3: 0.92}, 1: {3: 0.8, 1: 0.79, 2: 0.8}}) == 0


def test_false_winner_rate_under_the_null_is_at_most_alpha() -> None:
    # 5 equal arms, 5 seeds with a shared seed effect: a winner is declared in <= 5% of 1500 draws (+3 sd)
    rng = np.random.default_rng(1)
    wins = 0
    for _ in range(1500):
        seed_effect = rng.normal(0, 1, 5)
        arms = {f"p{j}": seed_effect + rng.normal(0, 0.5, 5) for j in range(5)}
        wins += _resolved_winner(arms) is not None
    assert wins / 1500 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 1500)


def test_winner_p_value_is_the_largest_corrected_comparison() -> None:
    arms = _arms_with_p()
    t = winner_test(arms)
    assert t.p_value == pytest.approx(max(holm([stats.ttest_rel(arms["A"], arms[k]).pvalue for k in "BC"])))
    assert (t.winner is not None) == (t.p_value < t.alpha)
    assert winner_test({"a": [0.9, 0.8, 0.85], "b": [0.9, 0.8, 0.85]}).p_value == 1.0  # tie: mean difference 0
    assert winner_test({"a": [0.9, 0.91], "b": [math.nan, math.nan]}).p_value == 0.0  # b diverged everywhere
