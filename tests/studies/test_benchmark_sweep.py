"""Smoke test of ``benchmarks/sweep.py`` at a toy size: every way runs the same grid. No timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.sweep import SweepBench, format_report, run_benchmark  # noqa: E402


@pytest.mark.slow
def test_every_way_runs_the_same_arms() -> None:
    bench = SweepBench(task="digits_mlp", policies=("stashing",), optimizer="sgdm", D=2, seeds=2, n_train=128,
                       n_test=64, batch_size=32, workers=2, rounds=2)
    rows = run_benchmark(bench)
    assert [r["way"] for r in rows] == ["one at a time", "processes", "stacked", "stacked + processes"]
    assert rows[0]["ratio"] == 1.0 and all(r["ratio"] > 0 and r["ratio_iqr"][0] <= r["ratio_iqr"][1] for r in rows)
    # SGDM on a tiny arm for 4 steps: float32 rounding of the stacked layers stays far below this
    assert all(r["max_diff"] < 1e-4 for r in rows)
    assert "arm·steps/s" in format_report(bench, rows)
