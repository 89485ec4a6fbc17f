"""Smoke test of ``benchmarks/runtime.py`` at a toy size: it runs, and it compares the same computation.

No timing is asserted. What can fail: pipelab's GPipe / 1F1B runs and torch's must end at the same
weights (same model, data and steps), every row's timed window must hold the same samples, and the
simulator's forecast must be the one computed from the profiled costs.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # spawned ranks import benchmarks.runtime too

from benchmarks.runtime import BenchConfig, format_report, rows_of, run_benchmark  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402

TOY = BenchConfig(width=16, depth=4, in_features=12, batch=8, steps=3, warmup=1, repeats=2, profile_reps=3)


@pytest.fixture(scope="module")
def result():
    return run_benchmark(TOY)


@pytest.mark.slow
def test_flushed_rows_compute_what_torch_computes(result) -> None:
    assert set(result.weight_diff) == {"GPipe", "1F1B"}
    for kind, diff in result.weight_diff.items():
        assert diff <= 1e-6, kind


@pytest.mark.slow
def test_every_row_is_timed_and_simulated(result) -> None:
    names = [r["name"] for r in result.rows]
    assert names == [r.name for r in rows_of(TOY)]
    for rec, row in zip(result.rows, rows_of(TOY)):
        assert len(rec["mb_s_all"]) == len(rec["run_s_all"]) == TOY.repeats
        assert all(math.isfinite(t) and t > 0 for t in rec["mb_s_all"] + rec["run_s_all"]), rec["name"]
        w, n, total = row.window(TOY)
        P = result.profile
        sim = simulate(row.schedule(TOY.ranks, total), P["f"], P["b"], u_cost=P["u"], transfer_cost=P["transfer"])
        assert rec["sim_run_s"] == pytest.approx(sim.makespan)
        expected = (sim.time_of("F", 0, w + n, 0)[0] - sim.time_of("F", 0, w, 0)[0]) / n
        assert rec["sim_mb_s"] == pytest.approx(expected)
    for key, r in result.ratios.items():  # medians of the per-repeat ratios, with the load beside them
        assert len(r.values) == TOY.repeats and r.q1 <= r.median <= r.q3 and math.isfinite(r.load), key
    text = format_report(result)
    assert "pipelab/torch GPipe" in text and "async stashing M=1 / pipelab GPipe" in text and "load average" in text


def test_windows_hold_the_same_samples() -> None:
    for cfg in (TOY, BenchConfig(), BenchConfig(ranks=4, batch=256, microbatches=8)):
        samples = {row.window(cfg)[1] * row.M * cfg.micro for row in rows_of(cfg)}
        assert samples == {cfg.steps * cfg.batch}, cfg


@pytest.mark.parametrize("kwargs, match", [(dict(ranks=1), "ranks"), (dict(batch=10, microbatches=4), "batch"),
                                           (dict(depth=1), "depth"), (dict(backend="mpi"), "backend"),
                                           (dict(steps=0), "steps")])
def test_bad_configs_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BenchConfig(**kwargs).check()
