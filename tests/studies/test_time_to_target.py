"""Time to target on constructed curves: interpolation, not reached counted, divergence, t intervals, crossovers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pipelab.studies.time_to_target import crossover, steps_to_target, time_to_target


def test_steps_interpolate_linearly_between_the_evaluations_around_the_crossing():
    steps = [0, 100, 200, 300]
    loss = [[2.0, 1.0, 0.5, 0.2], [2.0, 1.5, 1.2, 1.1]]
    # run 0 crosses 0.8 between 100 (1.0) and 200 (0.5): 100 + 100 * (0.8 - 1.0) / (0.5 - 1.0) = 140
    np.testing.assert_allclose(steps_to_target(steps, loss, 0.8), [140.0, math.inf], rtol=0, atol=1e-12)
    # met at the first evaluation: its step, no extrapolation before it
    assert steps_to_target(steps, loss, 2.5).tolist() == [0.0, 0.0]
    # met exactly at an evaluation: that evaluation's step
    assert steps_to_target(steps, loss[0], 0.5).tolist() == [200.0]


def test_accuracy_is_met_from_below():
    acc = [0.1, 0.5, 0.7, 0.69]
    assert steps_to_target([0, 10, 20, 30], acc, 0.6, higher=True).tolist() == [15.0]
    assert steps_to_target([0, 10, 20, 30], acc, 0.71, higher=True).tolist() == [math.inf]


def test_a_diverged_run_is_not_reached_even_if_values_after_its_nan_meet_the_target():
    # divergence ends the curve: a value past the first NaN (a restart, a bug) does not count
    assert steps_to_target([0, 1, 2, 3], [1.0, math.nan, 0.1, 0.1], 0.5).tolist() == [math.inf]
    assert steps_to_target([0, 1, 2], [1.0, 0.4, math.inf], 0.5).tolist() == [pytest.approx(5 / 6)]


@pytest.mark.parametrize("steps, values, target, match", [
    ([0, 2, 1], [1.0, 0.5, 0.2], 0.5, "strictly increasing"),
    ([0, 1], [1.0, 0.5, 0.2], 0.5, "shape"),
    ([0, 1], [1.0, 0.5], math.nan, "target"),
])
def test_steps_errors(steps, values, target, match):
    with pytest.raises(ValueError, match=match):
        steps_to_target(steps, values, target)


def test_time_to_target_is_the_t_interval_of_step_time_times_steps():
    steps = [100.0, 120.0, 110.0, 130.0]
    r = time_to_target(steps, 0.25)
    x = 0.25 * np.array(steps)
    h = stats.t.ppf(0.975, 3) * x.std(ddof=1) / 2
    assert r.seconds == pytest.approx(x.mean(), rel=1e-12) and r.half_width == pytest.approx(h, rel=1e-12)
    assert r.reached == 4 and r.low < r.seconds < r.high
    assert r.label() == f"{x.mean():.4g} ± {h:.2g} s"
    assert math.isnan(time_to_target([100.0], 0.25).half_width)  # one seed: no interval
    assert time_to_target([100.0], 0.25).label() == "25 s"


def test_a_seed_not_reached_is_counted_and_the_arm_is_not_reached():
    r = time_to_target([100.0, math.inf, 90.0], 0.5)
    assert r.reached == 2 and len(r.steps) == 3 and r.seconds == math.inf
    assert r.label() == "not reached (2 of 3)"


@pytest.mark.parametrize("steps, step_time, match", [
    ([], 1.0, "steps"), ([1.0, math.nan], 1.0, "steps"), ([-1.0], 1.0, "steps"),
    ([1.0], 0.0, "step_time"), ([1.0], math.inf, "step_time"), ([1.0], True, "step_time"),
])
def test_time_to_target_errors(steps, step_time, match):
    with pytest.raises(ValueError, match=match):
        time_to_target(steps, step_time)


# Constructed setting: b (synchronous) takes T_b(x) = 1 + 4/x per step on bandwidth x, a (asynchronous) T_a = 1 + 1/x;
# gain log(T_b/T_a) falls from log 5/2 (x = 1) toward 0. a needs ρ = S_a/S_b more steps: a pays below the x where
# (1 + 4/x) / (1 + 1/x) = ρ, i.e. x* = (4 − ρ) / (ρ − 1).
X = np.linspace(0.5, 20.0, 2000)
TA, TB = 1 + 1 / X, 1 + 4 / X


def _exact(rho):
    return (4 - rho) / (rho - 1)


def test_crossover_of_the_constructed_setting_and_its_interval():
    b = np.array([100.0, 110.0, 90.0, 105.0])
    ratios = np.array([1.5, 1.6, 1.4, 1.5])
    c = crossover(X, TA, TB, b * ratios, b)
    logs = np.log(ratios)
    h = stats.t.ppf(0.975, 3) * logs.std(ddof=1) / 2
    rho, lo, hi = (math.exp(logs.mean() + d) for d in (0.0, -h, h))
    assert c.reached and c.ratio == pytest.approx(rho, rel=1e-12)
    assert (c.ratio_low, c.ratio_high) == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12))
    # the grid is fine, linear interpolation between its points: within 1e-4 of the closed form
    assert c.value == pytest.approx(_exact(rho), abs=1e-4)
    # a larger ratio needs a larger gain, found at lower bandwidth: the high ratio gives the low end
    assert (c.low, c.high) == (pytest.approx(_exact(hi), abs=1e-4), pytest.approx(_exact(lo), abs=1e-4))
    assert c.crossings == (c.value,)
    wins = np.array(c.a_wins)
    assert wins[X < c.value - 0.02].all() and not wins[X > c.value + 0.02].any()


def test_crossover_interval_end_beyond_the_grid_is_infinite_and_one_seed_has_no_interval():
    b = np.array([100.0, 100.0, 100.0])
    c = crossover(X, TA, TB, b * [1.2, 3.0, 1.3], b)  # a wide interval: its low ratio crosses past x = 20
    assert math.isfinite(c.value) and c.high == math.inf and c.low < c.value
    one = crossover(X, TA, TB, [150.0], [100.0])
    assert one.value == pytest.approx(_exact(1.5), abs=1e-4) and math.isnan(one.low) and math.isnan(one.high)


def test_crossover_without_a_crossing_and_with_a_seed_not_reached():
    never = crossover(X, TA, TB, [600.0, 610.0], [100.0, 100.0])  # ρ ≈ 6 > 5/2: a never pays on this grid
    assert math.isnan(never.value) and never.crossings == () and not any(never.a_wins)
    always = crossover(X, TA, TB, [90.0, 95.0], [100.0, 100.0])  # ρ < 1: a pays everywhere
    assert math.isnan(always.value) and all(always.a_wins)
    lost = crossover(X, TA, TB, [150.0, math.inf], [100.0, 100.0])
    assert not lost.reached and math.isnan(lost.value) and not any(lost.a_wins)
    won = crossover(X, TA, TB, [150.0, 140.0], [100.0, math.inf])  # b not reached on a seed, a on all: a wins
    assert not won.reached and all(won.a_wins)


def test_several_crossings_are_reported_and_none_chosen():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    c = crossover(x, [1.0, 1.0, 1.0, 1.0], [1.0, 3.0, 1.0, 3.0], [2.0], [1.0])  # gain 0, log 3, 0, log 3 vs log 2
    assert len(c.crossings) == 3 and math.isnan(c.value)


@pytest.mark.parametrize("kw, match", [
    ({"x": [2.0, 1.0]}, "increasing"), ({"step_time_a": [1.0]}, "increasing"),
    ({"step_time_b": [1.0, 0.0]}, "> 0"), ({"steps_b": [1.0, 2.0]}, "per seed"),
])
def test_crossover_errors(kw, match):
    args = {"x": [1.0, 2.0], "step_time_a": [1.0, 1.0], "step_time_b": [2.0, 1.0], "steps_a": [1.0], "steps_b": [1.0]}
    with pytest.raises(ValueError, match=match):
        crossover(**(args | kw))
