"""Smoke test of ``benchmarks/planner.py`` at a toy size: the growth table and the measured comparison run, and the
forecast they print is the planner's. No timing is asserted."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # spawned ranks import benchmarks.planner too

from benchmarks.planner import MeasureConfig, format_growth, format_measure, growth, measure  # noqa: E402


def test_growth_rows() -> None:
    rows = growth([(6, 2), (8, 2)])
    assert [(r["blocks"], r["devices"]) for r in rows] == [(6, 2), (8, 2)]
    assert all(r["simulations"] > 0 and r["plans_per_s"] > 0 and r["exact"] for r in rows)
    assert "plans/s" in format_growth(rows)


@pytest.mark.slow
def test_measured_comparison_runs_on_two_ranks() -> None:
    cfg = MeasureConfig(ranks=2, width=16, blocks=4, heavy=3, batch=8, steps=2, warmup=1, repeats=2, profile_reps=2)
    r = measure(cfg)
    assert r["forecast_ratio"] == pytest.approx(r["forecast_even_s"] / r["forecast_best_s"])
    assert r["forecast_ratio"] >= 1  # the even split is one of the partitions the planner searched
    assert math.isfinite(r["measured_ratio"]) and r["measured_best_s"] > 0
    text = format_measure(r)
    assert "forecast even/best" in text and "measured even/best" in text and "load average" in text
