"""The time-to-target study: FLOP-model blocks, step times equal to the simulator's steady period, codec bills, steps
from learning-curve records, the benchmark-like forecast, and the figure under tiny."""

from __future__ import annotations

import csv
import io
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from pipelab.links import Link, MessageBytes, Network  # noqa: E402
from pipelab.schedules import one_f_one_b  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.studies.time_to_target import (  # noqa: E402
    NANOGPT,
    arm_steps,
    benchmark_forecast,
    codec_ratios,
    flop_blocks,
    steady_plan,
)

STAGES = [nn.Linear(8, 16, bias=False), nn.Linear(16, 32, bias=False), nn.Linear(32, 4, bias=False)]


def test_flop_blocks_count_matmuls_per_sample_and_the_hand_over_bytes() -> None:
    b = flop_blocks(STAGES, torch.zeros(5, 8), 1e9)
    # forward 2·B·in·out; backward 2·B·in·out for the weight, and as much again for the input gradient after stage 0
    assert b.f == pytest.approx([2 * 5 * 8 * 16 / 1e9, 2 * 5 * 16 * 32 / 1e9, 2 * 5 * 32 * 4 / 1e9], rel=1e-12)
    assert b.b == pytest.approx([2 * 5 * 8 * 16 / 1e9, 4 * 5 * 16 * 32 / 1e9, 4 * 5 * 32 * 4 / 1e9], rel=1e-12)
    assert b.output_bytes == (5 * 16 * 4, 5 * 32 * 4, 0) and b.batch == 5
    assert flop_blocks(STAGES, torch.zeros(5, 8), 1e9, dtype=torch.bfloat16).output_bytes == (5 * 16 * 2, 5 * 32 * 2,
                                                                                               0)
    assert STAGES[0].weight.device.type == "cpu"  # counted on a copy
    with pytest.raises(ValueError, match="flops_per_second"):
        flop_blocks(STAGES, torch.zeros(5, 8), 0.0)


def test_int8_ratio_is_its_bill_over_float32() -> None:
    ra, rg = codec_ratios(STAGES, torch.zeros(5, 8), "int8", None)
    np.testing.assert_allclose(ra, [(5 * 16 + 4 * 5) / (5 * 16 * 4), (5 * 32 + 4 * 5) / (5 * 32 * 4)], rtol=1e-12)
    np.testing.assert_array_equal(ra, rg)
    with pytest.raises(ValueError, match="codec='zip'"):
        codec_ratios(STAGES, torch.zeros(5, 8), "zip", None)


@pytest.mark.parametrize("link", [Link(0.003, math.inf), Link.mbps(10, latency_ms=2.0)])
def test_steady_step_time_of_1f1b_is_the_simulators_period(link: Link) -> None:
    """Flushed: the period is makespan(3 steps) − makespan(2 steps), simulated here directly on the network."""
    D, M, batch = 3, 4, 20
    blocks = flop_blocks(STAGES, torch.zeros(1, 8), 1e6)  # per-sample costs; 5 samples per micro-batch
    ratios = codec_ratios(STAGES, torch.zeros(1, 8), "int8", None)
    got = steady_plan(blocks, "1f1b", M, batch, link, ratios).step_time
    n = batch // M
    f, b = np.array(blocks.f) * n, np.array(blocks.b) * n
    out = np.array(blocks.output_bytes[:-1]) * n * ratios[0]
    mb = MessageBytes(tuple(out), tuple(out))
    ends = [simulate(one_f_one_b(D, M, steps), f, b, i_cost=b / 2, w_cost=b / 2, network=Network.uniform(D, link),
                     message_bytes=mb).makespan for steps in (2, 3)]
    assert got == pytest.approx(ends[1] - ends[0], rel=1e-12)
    if math.isinf(link.bandwidth):  # the scalar model: one α per message, no wire
        scalar = [simulate(one_f_one_b(D, M, s), f, b, transfer_cost=link.latency).makespan for s in (2, 3)]
        assert got == pytest.approx(scalar[1] - scalar[0], rel=1e-12)


def test_arm_steps_reads_each_seeds_epoch_curve() -> None:
    recs = [{"epoch": [0, 1, 2], "steps_per_epoch": 10, "test_acc": [0.1, 0.5, 0.9]},
            {"epoch": [0, 1, 2], "steps_per_epoch": 10, "test_acc": [0.1, 0.4, float("nan")]},
            {"epoch": [0, 1, 2], "steps_per_epoch": 10, "test_loss": [2.0, 1.0, 0.5]}]
    assert arm_steps(recs[:2], "test_acc", 0.7).tolist() == [pytest.approx(15.0, rel=1e-12), math.inf]
    assert arm_steps(recs[2:], "test_loss", 0.75).tolist() == [15.0]
    with pytest.raises(ValueError, match="no learning-curve records"):
        arm_steps([], "test_acc", 0.5)


def test_benchmark_forecast_full_size_is_link_bound_and_above_the_wire_bound() -> None:
    s = NANOGPT["full"]
    r = benchmark_forecast(s)
    n = s.micro * s.seq * s.d_model * 2  # bf16 hand-over
    assert r["message_bytes"] == n == 1_572_864
    # a middle worker's one inbound wire carries M activations and M gradients per step at 200 Mb/s
    wire = 2 * s.M * n / (s.mbps * 1e6 / 8)
    assert r["step_time"] >= wire and 0.9 < r["link_share"] < 1.0
    cpu = benchmark_forecast(NANOGPT["cpu"])
    assert 0.0 < cpu["link_share"] < 1.0 and cpu["step_time"] > 2 * (s.D - 1) * s.latency_ms / 1e3


@pytest.mark.slow
def test_figure_renders_under_tiny_with_every_arm_and_its_csv() -> None:
    from pipelab.studies import figures
    from pipelab.studies.figures.time_to_target import crossover_markdown, ranking_markdown
    from pipelab.studies.time_to_target import ARMS

    out = figures.make("time_to_target", "tiny")
    res = out.data
    assert set(res.times) == {a.label for a in ARMS}
    int8, sync = res.steps["sync 1F1B, int8"], res.steps["sync 1F1B"]
    assert int8 is not None and sync is not None and len(int8) == len(sync)  # its own runs, through the int8 codec
    assert any(r["policy"] == "gpipe" for r in res.records)
    ranking = ranking_markdown(res, "bandwidth", 0)
    assert "int8" in ranking and "pending" not in ranking
    rows = list(csv.DictReader(io.StringIO(out.tables["csv"])))
    n = len(res.config.bandwidths_mbps) + len(res.config.latencies_ms)
    assert sum(r["kind"] == "time" for r in rows) == len(ARMS) * n
    assert sum(r["kind"] == "crossover" for r in rows) == 2 * len(res.crossovers)
    assert {r["arm"] for r in rows} == {a.label for a in ARMS}  # labels with commas survive the CSV
    assert crossover_markdown(res).count("\n") == len(res.crossovers) - 1


def test_rank_arms_orders_by_time_to_target_and_leaves_out_codecs_without_their_bill() -> None:
    from pipelab.studies.figures.time_to_target import rank_arms, rows_markdown
    from pipelab.studies.time_to_target import ARMS

    blocks = flop_blocks(STAGES, torch.zeros(1, 8), 1e6)
    steps = {a.label: (None if a.steps_from is None else np.array([100.0 + 10 * i, 110.0 + 10 * i]))
             for i, a in enumerate(ARMS)}
    steps["2BW"] = np.array([100.0, math.inf])
    steps["sync 1F1B, int8"] = None  # a codec arm without runs yet: pending
    link = Link.mbps(100, latency_ms=5.0)
    rows = rank_arms(blocks, link, steps, batch=24)
    assert {r["arm"] for r in rows} == {a.label for a in ARMS if a.codec == "identity"}
    seconds = [r["time"].seconds for r in rows]
    assert seconds == sorted(seconds) and rows[-1]["arm"] == "2BW"
    assert rows[-1]["time"].label() == "not reached (1 of 2)"
    sync = next(r for r in rows if r["arm"] == "sync 1F1B")
    assert sync["step_time"] == steady_plan(blocks, "1f1b", 4, 24, link).step_time
    ratios = {"int8": codec_ratios(STAGES, torch.zeros(1, 8), "int8", None)}
    with_codec = rank_arms(blocks, link, steps, batch=24, ratios=ratios)
    coded = with_codec[-1]  # pending: ranked last, timed at the synchronous arm's steps (a bound)
    assert coded["arm"] == "sync 1F1B, int8" and coded["steps"] is None
    assert coded["time"].steps == sync["time"].steps and coded["step_time"] < sync["step_time"]
    assert "pending" in rows_markdown(with_codec).splitlines()[-1]
