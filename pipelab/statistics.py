"""Statistics across seeds: Student-t intervals, paired differences and Holm's correction.

Arms of one seed share weights and mini-batches, so arms are compared *paired by seed*. A diverged run
(NaN/±inf) is never averaged: it is left out and counted. Holm's step-down adjustment gives strong family-wise
control without independence; the study's verdict rules built on these (winners, the papers' claims) are in
:mod:`pipelab.studies.claims`. Reported half-widths stay unadjusted.

References: Student (1908), "The probable error of a mean"; S. Holm (1979), "A simple sequentially
rejective multiple test procedure", Scand. J. Statist. 6:65-70.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Interval", "PairedDifference", "Values", "t_interval", "paired_difference", "resolved", "holm",
           "check_confidence", "as_values"]

Values = Sequence[float] | np.ndarray | Mapping[Any, float]


@dataclass(frozen=True)
class Interval:
    """A mean with its Student-t half-width; ``n`` finite values used, ``n_nan`` non-finite left out."""

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


def _t() -> Any:
    """Student's t distribution (``scipy.stats`` is imported on first use: it adds ~0.5 s to ``import pipelab``)."""
    from scipy import stats

    return stats.t


def check_confidence(confidence: Any) -> float:
    """``confidence`` as a float in (0, 1) (ValueError otherwise)."""
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0 < float(confidence) < 1:
        raise ValueError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")
    return float(confidence)


def as_values(values: Any, name: str) -> np.ndarray:
    """``values`` (a sequence of numbers, named ``name`` in errors) as a float array (TypeError otherwise)."""
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
    """Mean ± ``t_{(1+c)/2, n-1} · s / sqrt(n)`` (ddof 1, NaN for n < 2) of the finite ``values``; the rest counted."""
    c = check_confidence(confidence)
    arr = as_values(values, "values")
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
        return as_values([a[k] for k in keys], "a"), as_values([b[k] for k in keys], "b")
    x, y = as_values(a, "a"), as_values(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must have one value per seed each, got {x.size} and {y.size}")
    return x, y


def paired_difference(a: Values, b: Values, confidence: float = 0.95, *, null: float = 0.0) -> PairedDifference:
    """Mean of ``a − b`` paired by seed, its t half-width and the paired t test's two-sided p-value.

    ``d_i = a_i − b_i`` where both are finite; ``p = 2 · P(T_{n-1} > |mean(d) − null| sqrt(n) / s_d)``
    (``scipy.stats.ttest_rel``), so ``p < 1 − c`` exactly when the interval excludes ``null`` (−m: non-inferiority
    with margin m). ``s_d = 0``: half-width 0, p 0 or 1; n < 2: both NaN. ``a``, ``b``: aligned or keyed by seed.
    """
    c = check_confidence(confidence)
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
    """Holm's adjusted p-values (NaN as 1): sorted, ``adj_(i) = max_{j <= i} min(1, (m − j + 1) p_(j))`` (Holm 1979)."""
    p = as_values(p_values, "p_values")
    p = np.where(np.isnan(p), 1.0, p)
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"p_values must lie in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    adj_sorted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj_sorted
    return out
