"""Statistics across seeds against scipy.stats, closed forms and brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from pipelab.statistics import (
    Interval,
    holm,
    paired_difference,
    resolved,
    t_interval,
)

T975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t_{0.975, 2}: closed form (2p - 1) / sqrt(2p(1 - p)) for 2 df


def test_t_interval_by_hand() -> None:
    iv = t_interval([1.0, 2.0, 3.0])  # mean 2, s = 1 (ddof 1)
    assert iv.mean == 2.0 and iv.n == 3 and iv.n_nan == 0
    assert iv.half_width == pytest.approx(T975_DF2 / math.sqrt(3), rel=1e-12)
    assert (iv.low, iv.high) == pytest.approx((2 - T975_DF2 / math.sqrt(3), 2 + T975_DF2 / math.sqrt(3)))


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_t_interval_matches_scipy(n: int, confidence: float) -> None:
    x = np.random.default_rng(n).normal(0.8, 0.05, n)
    iv = t_interval(x, confidence)
    lo, hi = stats.t.interval(confidence, n - 1, loc=x.mean(), scale=stats.sem(x, ddof=1))
    assert iv.low == pytest.approx(lo, rel=1e-12) and iv.high == pytest.approx(hi, rel=1e-12)
    assert iv.half_width == pytest.approx(stats.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))


def test_t_interval_divergences_are_left_out_and_counted() -> None:
    iv = t_interval([1.0, math.nan, 3.0, math.inf])
    assert (iv.mean, iv.n, iv.n_nan) == (2.0, 2, 2)
    assert iv.half_width == pytest.approx(stats.t.ppf(0.975, 1) * math.sqrt(2) / math.sqrt(2))
    one = t_interval([0.7])
    assert one.mean == 0.7 and math.isnan(one.half_width) and not resolved(one)
    none = t_interval([math.nan])
    assert math.isnan(none.mean) and none.n == 0 and none.n_nan == 1


def test_t_interval_covers_at_its_confidence() -> None:
    # Monte Carlo: 4000 normal samples of 5; coverage 0.95 ± 3 binomial sd (0.0034)
    rng = np.random.default_rng(0)
    samples = rng.normal(1.0, 2.0, (4000, 5))
    hits = 0
    for s in samples:
        iv = t_interval(s)
        hits += iv.low <= 1.0 <= iv.high
    assert abs(hits / 4000 - 0.95) < 0.011


def test_paired_difference_by_hand() -> None:
    # d = [2, 3, 4]: mean 3, s_d = 1, t = 3 sqrt(3); with 2 df, P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2
    d = paired_difference([3, 5, 7], [1, 2, 3])
    t = 3 * math.sqrt(3)
    assert d.mean == 3.0 and d.n == 3
    assert d.half_width == pytest.approx(T975_DF2 / math.sqrt(3), rel=1e-12)
    assert d.p_value == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-10)
    assert resolved(d) and not resolved(paired_difference([3, 5, 7], [1, 6, 3]))


@pytest.mark.parametrize("seed", range(6))
def test_paired_difference_matches_ttest_rel(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 3 + seed
    a = rng.normal(0.80, 0.02, n)
    b = a - rng.normal(0.01 * seed, 0.015, n)
    d = paired_difference(a, b, 0.9)
    ref = stats.ttest_rel(a, b)
    lo, hi = ref.confidence_interval(0.9)
    assert d.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert (d.low, d.high) == pytest.approx((lo, hi), rel=1e-9, abs=1e-14)
    assert resolved(paired_difference(a, b)) == (ref.pvalue < 0.05)


def test_paired_difference_pairs_by_seed_and_drops_diverged_pairs() -> None:
    a = {0: 0.9, 1: 0.8, 2: 0.85}
    b = {2: 0.80, 0: 0.86, 1: 0.77}  # another order: paired by key
    ref = paired_difference([0.9, 0.8, 0.85], [0.86, 0.77, 0.80])
    assert paired_difference(a, b) == ref
    d = paired_difference([0.9, math.nan, 0.8, 0.7], [0.8, 0.8, math.inf, 0.6])
    assert (d.n, d.n_nan) == (2, 2) and d.mean == pytest.approx(0.1)
    same = paired_difference([1.0, 2.0], [0.5, 1.5])  # zero spread: half-width 0, p 0
    assert same.half_width == 0 and same.p_value == 0 and resolved(same)
    tie = paired_difference([1.0, 2.0], [1.0, 2.0])
    assert tie.p_value == 1 and not resolved(tie)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1, 2], confidence=95)
    with pytest.raises(ValueError, match="confidence"):
        paired_difference([1, 2], [1, 2], confidence=True)
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="same seeds"):
        paired_difference({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})
    with pytest.raises(TypeError, match="values"):
        t_interval("abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one-dimensional"):
        t_interval([[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="Interval"):
        resolved((1.0, 0.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([0.5, 1.5])


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04 -> 3*0.01, max(0.03, 2*0.03), max(0.06, 1*0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([math.nan, 0.01]) == pytest.approx([1.0, 0.02])


def _closed_bonferroni(p: np.ndarray, alpha: float) -> list[bool]:
    """Brute force: H_i is rejected iff every intersection hypothesis containing i is rejected by Bonferroni."""
    m = len(p)
    out = []
    for i in range(m):
        subsets = (s for r in range(1, m + 1) for s in itertools.combinations(range(m), r) if i in s)
        out.append(all(min(p[j] for j in s) <= alpha / len(s) for s in subsets))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_holm_equals_closed_testing_with_bonferroni(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 0.1, 1 + seed % 6)
    assert list(holm(p) <= 0.05) == _closed_bonferroni(p, 0.05)


def test_interval_is_the_base_of_paired_difference() -> None:
    assert isinstance(paired_difference([1, 2], [0, 0]), Interval)


@pytest.mark.parametrize("seed", range(5))
def test_paired_difference_against_a_margin_matches_ttest_1samp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0.8, 0.01, 7), rng.normal(0.805, 0.01, 7)
    d = paired_difference(a, b, null=-0.01)
    assert d.null == -0.01
    assert d.p_value == pytest.approx(stats.ttest_1samp(a - b, -0.01).pvalue, rel=1e-9)
    # the test rejects at alpha exactly when the interval at 1 - alpha excludes the null
    assert (d.p_value < 0.05) == (not d.low <= -0.01 <= d.high)
    assert paired_difference(a, b).p_value == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
