"""Time to target: the steps a run needs to reach a target loss or accuracy, times the steady step time of its
schedule on its links, with intervals over seeds; and the link setting where one arm starts to beat another.

**Steps to target** of one run, from its learning curve: values y_0, y_1, … evaluated after s_0 < s_1 < … optimizer
steps, a target y* (a loss: met when y ≤ y*; an accuracy, ``higher=True``: met when y ≥ y*). With i the first
evaluation that meets it,

    steps = s_0 if i = 0,   else s_{i−1} + (s_i − s_{i−1}) · (y* − y_{i−1}) / (y_i − y_{i−1})

(linear between the two evaluations around the crossing). A run that never meets it, or that diverges first (a
non-finite value ends the curve), has steps = ∞: *not reached*. It is counted, never dropped.

**Time to target** of an arm (one schedule × policy × codec on one link setting): T · steps per seed, T the steady
step time — the period of one optimizer step after the fill (:mod:`pipelab.planner`'s T: the spacing of step ends
past the warm-up, measured by the link-model simulator, :func:`pipelab.simulator.simulate` with ``network=``). Across
the n seeds: the mean with its Student-t interval (:func:`pipelab.statistics.t_interval`) when every seed reached the
target; when k < n did, the arm is "not reached (k of n)" and its mean is ∞ (a mean of the reached seeds alone would
favour the arm that failed most).

**Crossover.** Arm a (say asynchronous) beats arm b (synchronous) at a link setting x when
T_a(x)·S_a < T_b(x)·S_b, i.e. log(T_b(x)/T_a(x)) > log ρ, ρ = S_a/S_b. The seeds are paired (same initial weights
and data order), so log ρ is the mean of the per-seed log(a_i/b_i) (ρ: their geometric mean) with its t interval
[L_lo, L_hi]. The crossover is the x where h(x) = log(T_b(x)/T_a(x)) − log ρ changes sign on a grid of settings,
linear in x between the two grid points around it; its interval is the crossings of the interval's ends (±∞: beyond
the grid's lowest or highest setting; NaN with one seed). When h changes sign more than once the crossings are all
reported and none is chosen.

Example:
    >>> steps_to_target([0, 100, 200], [[0.2, 0.6, 0.9], [0.2, 0.3, 0.4]], 0.8, higher=True).tolist()
    [166.66666666666669, inf]
    >>> time_to_target([100.0, 120.0, float("inf")], 0.5).label()
    'not reached (2 of 3)'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .statistics import t_interval

__all__ = ["steps_to_target", "TimeToTarget", "time_to_target", "Crossover", "crossover"]


def steps_to_target(steps: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, target: float, *,
                    higher: bool = False) -> np.ndarray:
    """Steps each run needs to reach ``target`` (module docstring): ``values`` of shape (points,) or (runs, points)
    at the increasing ``steps``; ``higher``: an accuracy (met at ≥), else a loss (met at ≤). ∞: not reached.

    Raises:
        ValueError: ``steps`` not strictly increasing or not matching ``values``' last axis; ``target`` not finite.
    """
    s = np.asarray(steps, dtype=np.float64)
    y = np.atleast_2d(np.asarray(values, dtype=np.float64))
    if s.ndim != 1 or s.size < 1 or y.ndim != 2 or y.shape[1] != s.size:
        raise ValueError(f"values must have shape (points,) or (runs, points) with points = len(steps) = {s.size}, "
                         f"got {np.shape(values)}")
    if np.any(np.diff(s) <= 0) or not np.all(np.isfinite(s)):
        raise ValueError(f"steps must be finite and strictly increasing, got {s.tolist()}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise ValueError(f"target must be a finite number, got {target!r}")
    out = np.full(y.shape[0], math.inf)
    for r, row in enumerate(y):
        bad = np.flatnonzero(~np.isfinite(row))
        row = row[: bad[0]] if bad.size else row  # a diverged run's curve ends at its first non-finite value
        met = np.flatnonzero(row >= target if higher else row <= target)
        if met.size:
            i = int(met[0])
            out[r] = s[0] if i == 0 else s[i - 1] + (s[i] - s[i - 1]) * (target - row[i - 1]) / (row[i] - row[i - 1])
    return out


@dataclass(frozen=True)
class TimeToTarget:
    """An arm's time to target: per-seed ``steps`` (∞: not reached), the steady ``step_time`` (s), ``seconds`` =
    mean of step_time·steps over the seeds (∞ unless all reached) and its t ``half_width`` (NaN with one seed)."""

    steps: tuple[float, ...]
    step_time: float
    seconds: float
    half_width: float
    confidence: float

    @property
    def reached(self) -> int:
        return sum(math.isfinite(x) for x in self.steps)

    @property
    def low(self) -> float:
        return self.seconds - self.half_width

    @property
    def high(self) -> float:
        return self.seconds + self.half_width

    def label(self) -> str:
        """``"12.3 ± 1.2 s"`` (``"12.3 s"`` with one seed), or ``"not reached (k of n)"``."""
        if self.reached < len(self.steps):
            return f"not reached ({self.reached} of {len(self.steps)})"
        return f"{self.seconds:.4g}" + ("" if math.isnan(self.half_width) else f" ± {self.half_width:.2g}") + " s"


def time_to_target(steps: Sequence[float] | np.ndarray, step_time: float, confidence: float = 0.95) -> TimeToTarget:
    """Time to target of one arm from its per-seed steps to target and its steady step time (module docstring).

    Raises:
        ValueError: ``step_time`` not a finite number > 0; ``steps`` empty, negative or NaN.
    """
    if isinstance(step_time, bool) or not isinstance(step_time, (int, float)) or not (
            math.isfinite(step_time) and step_time > 0):
        raise ValueError(f"step_time must be a finite number of seconds > 0, got {step_time!r}")
    s = np.asarray(steps, dtype=np.float64).reshape(-1)
    if s.size == 0 or np.any(np.isnan(s)) or np.any(s < 0):
        raise ValueError(f"steps must be one value >= 0 per seed (inf: not reached), got {s.tolist()}")
    if np.isinf(s).any():
        return TimeToTarget(tuple(s.tolist()), float(step_time), math.inf, math.nan, confidence)
    iv = t_interval(s * step_time, confidence)
    return TimeToTarget(tuple(s.tolist()), float(step_time), iv.mean, iv.half_width, confidence)


@dataclass(frozen=True)
class Crossover:
    """Where arm a starts to beat arm b along a grid of link settings (module docstring).

    ``value``: the one crossing (NaN: none, several, or a seed not reached); ``low``/``high``: the crossings of the
    interval's ends of log ρ (±∞: beyond the grid; NaN: one seed or no single crossing); ``crossings``: every
    crossing of the mean; ``a_wins``: per grid point, whether a's mean time to target is below b's; ``ratio``:
    ρ = S_a/S_b (geometric mean over seeds) and its interval ``ratio_low``/``ratio_high``; ``reached``: every seed of
    both arms reached."""

    value: float
    low: float
    high: float
    crossings: tuple[float, ...]
    a_wins: tuple[bool, ...]
    ratio: float
    ratio_low: float
    ratio_high: float
    reached: bool


def _crossings(x: np.ndarray, h: np.ndarray) -> list[float]:
    out = []
    for i in range(x.size - 1):
        if h[i] == 0:
            out.append(float(x[i]))
        elif h[i] * h[i + 1] < 0:
            out.append(float(x[i] + (x[i + 1] - x[i]) * h[i] / (h[i] - h[i + 1])))
    if h.size and h[-1] == 0:
        out.append(float(x[-1]))
    return out


def crossover(x: Sequence[float] | np.ndarray, step_time_a: Sequence[float] | np.ndarray,
              step_time_b: Sequence[float] | np.ndarray, steps_a: Sequence[float] | np.ndarray,
              steps_b: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Crossover:
    """The setting ``x`` (an increasing grid: bandwidths, latencies) where arm a's time to target crosses arm b's,
    from each arm's step time on the grid and its per-seed steps to target, paired by seed (module docstring).

    Raises:
        ValueError: grids of different lengths or a non-increasing ``x``; step times not > 0; per-seed steps of
            different lengths.
    """
    xs, ta, tb = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (x, step_time_a, step_time_b))
    if not (xs.size == ta.size == tb.size >= 2) or np.any(np.diff(xs) <= 0):
        raise ValueError(f"x must be an increasing grid of >= 2 settings with one step time of each arm per setting, "
                         f"got {xs.size} settings, {ta.size} and {tb.size} step times")
    if not (np.all(ta > 0) and np.all(tb > 0) and np.all(np.isfinite(ta)) and np.all(np.isfinite(tb))):
        raise ValueError("step times must be finite and > 0")
    sa, sb = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (steps_a, steps_b))
    if sa.size != sb.size or sa.size == 0:
        raise ValueError(f"steps_a and steps_b must give one value per seed, paired, got {sa.size} and {sb.size}")
    nan = math.nan
    if not (np.all(np.isfinite(sa)) and np.all(np.isfinite(sb))):
        wins = bool(np.isfinite(sa).all() and not np.isfinite(sb).all())  # a reached on every seed, b did not
        return Crossover(nan, nan, nan, (), (wins,) * xs.size, nan, nan, nan, False)
    iv = t_interval(np.log(sa) - np.log(sb), confidence)
    gain = np.log(tb) - np.log(ta)

    def one(level: float) -> float:
        c = _crossings(xs, gain - level) if math.isfinite(level) else []
        return c[0] if len(c) == 1 else nan

    mean = _crossings(xs, gain - iv.mean)
    value = mean[0] if len(mean) == 1 else nan
    ends = [one(iv.low), one(iv.high)]
    if math.isfinite(value) and not math.isnan(iv.half_width):  # an end beyond the grid: on the side away from value
        known = [e for e in ends if not math.isnan(e)]
        side = math.inf if known and known[0] < value else -math.inf
        ends = known if len(known) == 2 else known + [side] if known else [-math.inf, math.inf]
    low, high = sorted(ends) if not any(math.isnan(e) for e in ends) else (nan, nan)
    return Crossover(value, low, high, tuple(mean),
                     tuple(bool(v) for v in gain > iv.mean), math.exp(iv.mean), math.exp(iv.low),
                     math.exp(iv.high), True)
