"""Statistics across seeds: Student-t intervals, paired differences, and winners only when resolved.

Every comparison of the learning-curve study is a handful of seeds per arm, and every arm of a seed starts
from the same weights and sees the same mini-batches, so two arms are compared *paired by seed*.

Each function states its rule: one arm's t interval (:func:`t_interval`), the paired difference and its t test
(:func:`paired_difference`), Holm's adjustment (:func:`holm`), and the winner, declared only when its paired
difference to *every* other arm is resolved after a Holm correction (:func:`winner_test`), and across the rows of a
table only where that p-value survives a second Holm correction over the rows searched (:func:`winners_across_rows`).

Divergence. A diverged run is recorded as NaN (or ±inf) and is never silently averaged: :func:`t_interval`
leaves non-finite values out and counts them (``n_nan``) so a caller states them next to the interval;
:func:`paired_difference` leaves out the seeds where *either* arm is non-finite and counts them; an arm with a
non-finite value is never declared the winner (a diverged seed is a loss, not a missing value), an arm that
diverged on every seed loses to the candidate outright (it is not tested: there is no seed to compare on, and
every seed favours the candidate), and a comparison against an arm that diverged on some seeds uses the
remaining seeds only, which can only make the winner harder to resolve (those seeds would have favoured it).

Why Holm. Declaring "A is best" needs all k − 1 differences A − B_j resolved. Testing each at level α is an
intersection–union test for one *pre-chosen* A, but here A is chosen after seeing the data (the highest mean),
so the k − 1 tests are adjusted by Holm's method (strong family-wise error control, no independence needed,
never less powerful than Bonferroni). The reported half-widths stay the unadjusted ones at ``confidence``;
the Holm condition implies each of those intervals excludes 0. A table of R rows searched for winners is one more
search: a winner somewhere among R rows is found by chance up to R times as often as in one row, so
:func:`winners_across_rows` adjusts the R row p-values by Holm once more (strong control of the family-wise error
over every row's winner claim; nested Holm is conservative, never anti-conservative).

References: Student (1908), "The probable error of a mean"; S. Holm (1979), "A simple sequentially
rejective multiple test procedure", Scand. J. Statist. 6:65-70; R. L. Berger (1982), intersection–union
tests, Technometrics 24:295-300.

Example:
    >>> iv = t_interval([0.81, 0.83, 0.82])
    >>> round(iv.mean, 3), round(iv.half_width, 4), iv.n
    (0.82, 0.0248, 3)
    >>> resolved(paired_difference([3, 5, 7], [1, 2, 3]))
    True
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["Interval", "PairedDifference", "WinnerTest", "t_interval", "paired_difference", "resolved", "holm",
           "winner_test", "resolved_winner", "winners_across_rows", "CORRECTIONS"]

#: multiple-comparison corrections :func:`winner_test` accepts
CORRECTIONS = ("holm", "none")

Values = Sequence[float] | np.ndarray | Mapping[Any, float]


@dataclass(frozen=True)
class Interval:
    """A mean with its Student-t half-width.

    Attributes:
        mean: mean of the finite values (NaN when there are none).
        half_width: ``t_{(1+c)/2, n-1} · s / sqrt(n)`` (ddof = 1); NaN when ``n < 2``.
        n: finite values used; n_nan: non-finite (diverged) values left out; confidence: c.
    """

    mean: float
    half_width: float
    n: int
    n_nan: int
    confidence: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


@dataclass(frozen=True)
class PairedDifference(Interval):
    """:class:`Interval` of the per-seed differences a − b, with the paired t test's two-sided p-value against the
    null mean ``null`` (0: no difference; −m: a non-inferiority margin m)."""

    p_value: float = math.nan
    null: float = 0.0


@dataclass(frozen=True)
class WinnerTest:
    """The outcome of :func:`winner_test`.

    Attributes:
        candidate: the arm with the highest mean among arms without a diverged value (``None``: none).
        winner: ``candidate`` when every difference to it is resolved after the correction, else ``None``.
        differences: other arm -> :func:`paired_difference` (candidate − arm), for every other arm with a
            finite value.
        adjusted_p: the same arms -> p-value after the correction (``"none"``: the raw p-value).
        alpha: 1 − confidence; correction: ``"holm"`` or ``"none"``.
        diverged: the arms that diverged on every seed (no finite value): they lose to the candidate without a
            test.
        family_p: the row's :attr:`p_value` after a Holm correction over the rows searched for a winner
            (:func:`winners_across_rows`); NaN when the row was tested alone.
    """

    candidate: str | None
    winner: str | None
    differences: dict[str, PairedDifference] = field(default_factory=dict)
    adjusted_p: dict[str, float] = field(default_factory=dict)
    alpha: float = 0.05
    correction: str = "holm"
    diverged: tuple[str, ...] = ()
    family_p: float = math.nan

    @property
    def p_value(self) -> float:
        """The smallest α at which ``candidate`` is declared the winner: the largest corrected p-value of its
        comparisons (every one must fall below α), 1 when some difference has a mean <= 0 or there is no candidate,
        0 when every other arm diverged on every seed (no comparison is left: it wins outright)."""
        if self.candidate is None or any(d.mean <= 0 or not math.isfinite(d.mean) for d in self.differences.values()):
            return 1.0
        return max(self.adjusted_p.values(), default=0.0)


def _t() -> Any:
    """Student's t distribution (``scipy.stats`` is imported on first use: it adds ~0.5 s to ``import pipelab``)."""
    from scipy import stats

    return stats.t


def _check_confidence(confidence: Any) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0 < float(confidence) < 1:
        raise ValueError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")
    return float(confidence)


def _array(values: Any, name: str) -> np.ndarray:
    if isinstance(values, (str, bytes)) or isinstance(values, Mapping):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers, got {values!r}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per seed), got shape {arr.shape}")
    return arr


def _interval(x: np.ndarray, confidence: float) -> tuple[float, float]:
    n = x.size
    mean = float(x.mean()) if n else math.nan
    if n < 2:
        return mean, math.nan
    sd = float(x.std(ddof=1))
    return mean, float(_t().ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """Mean ± Student-t half-width of ``values`` (one per seed), non-finite values left out and counted.

    Rule: ``h = t_{(1+c)/2, n-1} · s / sqrt(n)``, ``s`` the sample standard deviation (ddof = 1), over the
    n finite values. ``n < 2`` gives a NaN half-width (no interval from one seed).

    Raises:
        ValueError: ``confidence`` not in (0, 1); ``values`` not one-dimensional.
        TypeError: ``values`` not numbers.
    """
    c = _check_confidence(confidence)
    arr = _array(values, "values")
    ok = np.isfinite(arr)
    mean, hw = _interval(arr[ok], c)
    return Interval(mean, hw, int(ok.sum()), int((~ok).sum()), c)


def _pair(a: Values, b: Values) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise TypeError("a and b must both be sequences (aligned by seed) or both mappings seed -> value")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise ValueError(f"a and b must hold the same seeds; a only: {sorted(set(a) - set(b), key=str)}, "
                             f"b only: {sorted(set(b) - set(a), key=str)}")
        keys = list(a)
        return _array([a[k] for k in keys], "a"), _array([b[k] for k in keys], "b")
    x, y = _array(a, "a"), _array(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must have one value per seed each, got {x.size} and {y.size}")
    return x, y


def paired_difference(a: Values, b: Values, confidence: float = 0.95, *, null: float = 0.0) -> PairedDifference:
    """Mean of ``a − b`` paired by seed, its t half-width and the paired t test's two-sided p-value.

    Rule: ``d_i = a_i − b_i`` over the seeds where both are finite; ``mean(d) ± t_{(1+c)/2, n-1} s_d/sqrt(n)``;
    ``p = 2 · P(T_{n-1} > |mean(d) − null| sqrt(n) / s_d)`` (``scipy.stats.ttest_rel``; with ``null ≠ 0``
    ``scipy.stats.ttest_1samp(d, null)``). ``p < 1 − c`` exactly when the interval excludes ``null``. With
    ``s_d = 0`` the half-width is 0 and p is 0 (mean ≠ null) or 1 (mean = null); with ``n < 2`` both are NaN.

    Args:
        a, b: one value per seed, aligned sequences or mappings seed -> value with the same seeds.
        confidence: c in (0, 1).
        null: the mean difference under the null hypothesis (0; −m tests non-inferiority with margin m).

    Raises:
        ValueError: lengths or seeds differ; ``confidence`` not in (0, 1); ``null`` not a finite number.
        TypeError: not numbers.
    """
    c = _check_confidence(confidence)
    if isinstance(null, bool) or not isinstance(null, numbers.Real) or not math.isfinite(null):
        raise ValueError(f"null must be a finite number (the null mean difference), got {null!r}")
    x, y = _pair(a, b)
    ok = np.isfinite(x) & np.isfinite(y)
    d = x[ok] - y[ok]
    n, n_nan = int(ok.sum()), int((~ok).sum())
    mean, hw = _interval(d, c)
    if n < 2:
        p = math.nan
    else:
        sd = float(d.std(ddof=1))
        if sd == 0.0:
            p = 1.0 if mean == null else 0.0
        else:
            p = float(2 * _t().sf(abs(mean - null) * math.sqrt(n) / sd, n - 1))
    return PairedDifference(mean, hw, n, n_nan, c, p_value=p, null=float(null))


def resolved(interval: Interval) -> bool:
    """Whether ``interval`` excludes 0: ``|mean| > half_width`` with both finite (a NaN never resolves)."""
    if not isinstance(interval, Interval):
        raise TypeError(f"interval must be an Interval or PairedDifference, got {type(interval).__name__}")
    m, h = interval.mean, interval.half_width
    return math.isfinite(m) and math.isfinite(h) and abs(m) > h


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN counts as 1).

    Rule: with the m p-values sorted, ``p_(1) <= ... <= p_(m)``, ``adj_(i) = max_{j <= i} min(1, (m − j + 1)
    p_(j))``; rejecting ``adj < α`` controls the family-wise error rate at α (Holm 1979).
    """
    p = _array(p_values, "p_values")
    p = np.where(np.isnan(p), 1.0, p)
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"p_values must lie in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    adj_sorted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj_sorted
    return out


def winner_test(arms: Mapping[str, Values], confidence: float = 0.95, correction: str = "holm") -> WinnerTest:
    """Test whether the arm with the highest mean beats every other arm, paired by seed.

    The candidate is the arm with the highest mean among arms whose values are all finite (an arm with a
    diverged seed cannot win). It is the winner when, for every other arm j with a finite value, the paired
    difference (candidate − j) has a positive mean and a p-value below α = 1 − confidence after the correction
    (``"holm"`` over those comparisons; ``"none"``: raw p-values, i.e. every unadjusted interval excludes 0).
    An arm that diverged on every seed loses to the candidate without a test (listed in ``diverged``). See
    the module docstring for why Holm.

    Args:
        arms: arm name -> one value per seed (aligned sequences, or mappings seed -> value); at least two.
        confidence: c in (0, 1); correction: one of :data:`CORRECTIONS`.

    Raises:
        ValueError: fewer than two arms, an unknown correction, arms with different seeds or lengths.
    """
    c = _check_confidence(confidence)
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r}; choose one of {', '.join(CORRECTIONS)}")
    if not isinstance(arms, Mapping) or len(arms) < 2:
        raise ValueError(f"arms must map at least two arm names to per-seed values, got {arms!r}")
    means: dict[str, float] = {}
    diverged: list[str] = []
    for name, vals in arms.items():
        arr = _array(list(vals.values()) if isinstance(vals, Mapping) else vals, f"arms[{name!r}]")
        if np.isfinite(arr).all() and arr.size:
            means[name] = float(arr.mean())
        elif arr.size and not np.isfinite(arr).any():
            diverged.append(name)
    alpha = 1 - c
    if not means:
        return WinnerTest(None, None, alpha=alpha, correction=correction, diverged=tuple(diverged))
    cand = max(means, key=lambda k: means[k])
    diffs = {name: paired_difference(arms[cand], vals, c) for name, vals in arms.items()
             if name != cand and name not in diverged}
    raw = np.array([d.p_value for d in diffs.values()])
    adj = holm(raw) if correction == "holm" else np.where(np.isnan(raw), 1.0, raw)
    adjusted = dict(zip(diffs, map(float, adj)))
    ok = all(d.mean > 0 and adjusted[k] < alpha for k, d in diffs.items())
    return WinnerTest(cand, cand if ok else None, diffs, adjusted, alpha, correction, tuple(diverged))


def resolved_winner(arms: Mapping[str, Values], confidence: float = 0.95, correction: str = "holm") -> str | None:
    """The arm that beats every other arm with resolved paired differences, else ``None`` (:func:`winner_test`)."""
    return winner_test(arms, confidence, correction).winner


def winners_across_rows(rows: Mapping[Any, Mapping[str, Values]], confidence: float = 0.95,
                        correction: str = "holm") -> dict[Any, WinnerTest]:
    """:func:`winner_test` in every row, a winner kept only where it survives the search over the rows.

    Rule: each row r gives its p-value ``p_r`` (:attr:`WinnerTest.p_value`: the largest Holm-adjusted p of its
    candidate's comparisons); the R rows' p-values are Holm-adjusted (``"holm"``; ``"none"``: left as they are),
    and row r keeps its winner only when its adjusted ``family_p < α``. E.g. a row with p = 0.040 among 4 rows
    searched has ``family_p`` >= 0.16: no winner at α = 0.05.

    Args:
        rows: row key -> (arm name -> one value per seed), as :func:`winner_test` takes; confidence, correction:
            as there (the same correction is used within and across rows).

    Returns:
        row key -> :class:`WinnerTest` with ``family_p`` set and ``winner`` cleared where it did not survive.
    """
    tests = {key: winner_test(arms, confidence, correction) for key, arms in rows.items()}
    if not tests:
        return {}
    raw = np.array([t.p_value for t in tests.values()])
    adj = holm(raw) if correction == "holm" else raw
    out = {}
    for (key, t), p in zip(tests.items(), map(float, adj)):
        out[key] = replace(t, winner=t.winner if p < t.alpha else None, family_p=p)
    return out
