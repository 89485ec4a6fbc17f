"""Smoke test of ``benchmarks/zero_bubble.py`` at a toy size: it runs, and it compares the same computation.

No timing is asserted. What can fail: for ZB-V, interleaved zero bubble, DualPipeV and ZB-H1, pipelab's
runtime and torch's own schedule class must end at the same weights (same model, data and steps; and the
weights must have moved, so the agreement is not that of two untrained copies), torch's action lists must
be the pipelab builder's order, every row must be timed and forecast from the profiled costs of the rank
that holds each stage, and every ratio must be finite.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # spawned ranks import benchmarks.zero_bubble too

from benchmarks.zero_bubble import (  # noqa: E402
    SCHEDULES,
    Row,
    ZBConfig,
    ZBResult,
    forecast_costs,
    format_report,
    rows_of,
    run_benchmark,
)
from pipelab.schedules import dualpipe_v, interleaved_zero_bubble, zb_h1, zb_v  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402

TOY = ZBConfig(width=16, depth=4, in_features=12, batch=8, steps=3, warmup=1, repeats=2, profile_reps=3)
COMPARED = ("ZB-V", "interleaved ZB", "DualPipeV", "ZB-H1")


@pytest.fixture(scope="module")
def result() -> ZBResult:
    return run_benchmark(TOY)


@pytest.mark.slow
def test_pipelab_and_torch_compute_the_same_weights_in_the_same_order(result: ZBResult) -> None:
    assert set(result.weight_diff) == set(COMPARED)
    for kind in COMPARED:
        assert result.weight_diff[kind] <= 1e-6, kind
        assert result.weight_moved[kind] > 1e-5, kind  # trained: agreeing to 1e-6 means something
    assert result.same_order == {f"torch {kind}": True for kind in COMPARED}


@pytest.mark.slow
def test_every_row_is_timed_and_forecast(result: ZBResult) -> None:
    rows = rows_of(TOY)
    assert [r["name"] for r in result.rows] == [r.name for r in rows]
    for rec, row in zip(result.rows, rows):
        assert len(rec["mb_s_all"]) == len(rec["run_s_all"]) == TOY.repeats
        assert all(math.isfinite(t) and t > 0 for t in rec["mb_s_all"] + rec["run_s_all"]), rec["name"]
        w, n, total = row.window(TOY)
        sched = row.schedule(TOY.ranks, TOY.M, total)
        sim = simulate(sched, **forecast_costs(sched, result.profile))
        assert rec["sim_run_s"] == pytest.approx(sim.makespan)
        expected = (sim.time_of("F", 0, w + n, 0)[0] - sim.time_of("F", 0, w, 0)[0]) / n
        assert rec["sim_mb_s"] == pytest.approx(expected) and expected > 0
        assert math.isfinite(rec["sim_mb_error"]) and math.isfinite(rec["sim_run_error"])
    for key, r in result.ratios.items():
        assert all(math.isfinite(x) and x > 0 for x in (r.median, r.q1, r.q3)) and r.q1 <= r.median <= r.q3, key
        assert len(r.values) == len(result.loads) == TOY.repeats and math.isfinite(r.load), key
    assert all(math.isfinite(v) and v > 0 for v in result.simulated.values()) and result.simulated
    assert {f"pipelab/torch {k}, time per mini-batch" for k in COMPARED} <= set(result.ratios)
    text = format_report(result)
    assert "pipelab/torch DualPipeV" in text and "forecast |error|" in text


def test_forecast_costs_take_each_stage_from_its_rank() -> None:
    """ZB-V on 2 ranks: stages 0 and 3 on rank 0, 1 and 2 on rank 1; boundary 1 → 2 stays on rank 1."""
    prof = [{"stages": {f"4:{k}": dict(f=10 * r + k, b=2.0, i=1.0, w=1.0, u=0.5) for k in range(4)},
             "transfer": [0.25]} for r in range(2)]
    c = forecast_costs(zb_v(2, 4), prof)
    assert c["f_cost"] == [0.0, 11.0, 12.0, 3.0]
    assert c["transfer_cost"] == [0.25, 0.0, 0.25]
    c = forecast_costs(interleaved_zero_bubble(2, 2, 4), prof)  # stages 0, 2 on rank 0; 1, 3 on rank 1
    assert c["f_cost"] == [0.0, 11.0, 2.0, 13.0] and c["transfer_cost"] == [0.25] * 3
    prof4 = [{"stages": {f"8:{k}": dict(f=1.0, b=2.0, i=1.0, w=1.0, u=0.0) for k in range(8)},
              "transfer": [0.1, 0.2, 0.3]} for _ in range(4)]
    c = forecast_costs(interleaved_zero_bubble(4, 2, 8), prof4)  # boundary 3: rank 3 → 0, not measured: mean
    assert c["transfer_cost"] == pytest.approx([0.1, 0.2, 0.3, 0.2, 0.1, 0.2, 0.3])


def test_rows_place_stages_as_torch_does() -> None:
    for W in (2, 4):
        for kind, builder in (("ZB-V", zb_v), ("DualPipeV", dualpipe_v), ("ZB-H1", zb_h1),
                              ("interleaved ZB", lambda W, M: interleaved_zero_bubble(W, 2, M))):
            s = builder(W, 2 * W)
            row = Row(f"pipelab {kind}", "pipelab", kind)
            assert row.D(W) == s.D
            for r in range(W):
                assert row.stages_of(r, W) == sorted({a.stage for a in s.programs[r]}), (kind, W, r)
    assert all(SCHEDULES[k][1] for k in COMPARED) and SCHEDULES["1F1B"][1] is None


@pytest.mark.parametrize("kwargs, match", [(dict(ranks=1), "ranks"), (dict(batch=10, microbatches=4), "batch"),
                                           (dict(depth=3), "depth"), (dict(backend="mpi"), "backend"),
                                           (dict(steps=0), "steps"), (dict(optimizer="lion"), "optimizer"),
                                           (dict(batch=12, microbatches=3), "microbatches")])
def test_bad_configs_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ZBConfig(**kwargs).check()
