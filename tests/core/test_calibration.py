"""pipelab.calibration: the simulator's traffic per worker, optimizer-state slots, costs from a timeline, and a
calibration run end to end (profile, forecast, measure) on 2 spawned ranks."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest
import torch

from pipelab.calibration import optimizer_state_slots, simulated_collectives, simulated_traffic
from pipelab.emulator import Emulator
from pipelab.links import Link, MessageBytes, Network
from pipelab.partition import split
from pipelab.pipeline.placement import COLLECTIVE_KINDS
from pipelab.runtime.trace import JobRecord, Timeline
from pipelab.schedules import (
    ddp,
    dualpipe,
    fsdp,
    fslpp,
    gpipe,
    hybrid,
    interleaved_1f1b,
    lpp,
    messages,
    one_f_one_b,
    pipedream_2bw,
    zb_h1,
)
from pipelab.simulator import simulate
from pipelab.studies.calibration import (
    CalibrationCase,
    CalibrationConfig,
    _message_bytes,
    _micro_data,
    calibrate,
    forecast_costs,
    format_rows,
    measured_costs,
    probe_summary,
    receive_overhead,
    rows_csv,
    sampled_forecast,
    schedule_for,
    steady_step,
    step_ends,
)
from pipelab.studies.models import deep_mlp
from pipelab.studies.settings import CALIBRATION_KINDS
from pipelab.studies.time_to_target import NANOGPT


@pytest.mark.parametrize("sched", [one_f_one_b(3, 4, 2), interleaved_1f1b(2, 2, 4, 2), zb_h1(3, 4),
                                   pipedream_2bw(3, 3, 3), schedule_for("lpp", 4, 8, 1), schedule_for("fsdp", 2, 4, 1)],
                         ids=["1f1b", "interleaved", "zb_h1", "2bw", "lpp", "fsdp"])
def test_simulated_traffic_equals_a_count_over_the_schedules_messages(sched) -> None:  # noqa: ANN001
    sizes = [11 * (k + 1) for k in range(sched.D)]  # distinct per boundary, to catch an off-by-one stage
    got = simulated_traffic(simulate(sched), sizes)
    want = [{"sent": {"activation": 0, "gradient": 0}, "received": {"activation": 0, "gradient": 0}}
            for _ in range(sched.W)]
    for m in messages(sched):  # brute force: every cross-worker message, its channel = 2·(receiving stage) + kind
        stage, kind = divmod(m.channel, 2)
        name, n = ("activation", sizes[stage]) if kind == 0 else ("gradient", sizes[stage + 1])
        want[m.src]["sent"][name] += n
        want[m.dst]["received"][name] += n
    assert got == want


def test_simulated_traffic_checks_sizes() -> None:
    with pytest.raises(ValueError, match="one entry per stage"):
        simulated_traffic(simulate(one_f_one_b(2, 2)), [1, 2, 3])


@pytest.mark.parametrize("make", [lambda p: torch.optim.SGD(p, lr=0.1),
                                  lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.Adam(p),
                                  lambda p: torch.optim.AdamW(p, amsgrad=True), lambda p: torch.optim.NAdam(p),
                                  lambda p: torch.optim.RMSprop(p, momentum=0.5, centered=True),
                                  lambda p: torch.optim.Adagrad(p)],
                         ids=["sgd", "sgdm", "adam", "adamw-amsgrad", "nadam", "rmsprop-centered", "adagrad"])
def test_optimizer_state_slots_match_the_state_torch_keeps(make) -> None:  # noqa: ANN001
    model = torch.nn.Linear(3, 4)
    opt = make(list(model.parameters()))
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    weight = sum(p.numel() for p in model.parameters())
    tensors = sum(v.numel() for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.ndim > 0)
    assert optimizer_state_slots(opt) * weight == tensors


def test_unknown_optimizer_has_no_slots() -> None:
    assert optimizer_state_slots(torch.optim.LBFGS([torch.zeros(2, requires_grad=True)])) is None


def test_measured_costs_are_per_stage_means_and_the_runs_own_latency() -> None:
    tl0 = Timeline(0, [JobRecord("F", 0, 0, 0, 0.0, 1.0), JobRecord("F", 0, 0, 1, 1.0, 3.0),
                       JobRecord("F", 0, 1, 0, 3.0, 9.0), JobRecord("B", 0, 0, 0, 9.5, 14.0, received=True),
                       JobRecord("U", 0, 0, -1, 14.0, 14.5)])
    tl1 = Timeline(1, [JobRecord("F", 1, 0, 0, 1.25, 2.0, received=True), JobRecord("B", 1, 0, 0, 2.0, 3.5),
                       JobRecord("F", 1, 0, 1, 3.5, 5.0, received=True)])  # busy when F(0, 0, 1) ended: no sample
    c = measured_costs([tl0, tl1], 2, 0.25)
    assert c["f_cost"] == [3.0, 1.125] and c["b_cost"] == [4.5, 1.5]  # means (durations 1, 2, 6: median 2)
    assert c["u_cost"] == [0.5, 1e-9] and "i_cost" not in c  # a stage without updates costs (almost) nothing
    # waits of idle consumers only: F(1,0,0) 1.25 − 1.0; B(0,0,0) got B(1,0,0)'s gradient (end 3.5) while busy
    assert c["transfer_cost"] == pytest.approx(0.25)
    split_tl = Timeline(0, [JobRecord("F", 0, 0, 0, 0.0, 1.0), JobRecord("I", 0, 0, 0, 1.0, 1.5),
                            JobRecord("W", 0, 0, 0, 1.5, 3.5)])
    c = measured_costs([split_tl], 1, 0.125)
    assert c["i_cost"] == [0.5] and c["w_cost"] == [2.0] and c["b_cost"] == [2.5] and c["transfer_cost"] == 0.125


def test_dispatch_is_a_ranks_own_time_between_jobs_and_the_steady_step_leaves_out_the_first() -> None:
    tl0 = Timeline(0, [JobRecord("F", 0, 0, 0, 0.0, 1.0), JobRecord("F", 0, 0, 1, 1.5, 2.5),
                       JobRecord("B", 0, 0, 1, 6.0, 7.0, received=True, asked=2.75),
                       JobRecord("U", 0, 0, -1, 7.5, 8.0)])
    tl1 = Timeline(1, [JobRecord("F", 1, 0, 0, 2.0, 3.0, received=True, asked=0.0), JobRecord("B", 1, 0, 0, 3.25, 4.0),
                       JobRecord("F", 1, 1, 0, 5.0, 6.0, received=True)])  # asked unknown: no sample
    c = measured_costs([tl0, tl1], 2, 0.25)
    # stage 0: F 0.5 (start − previous end), B 0.25 (asked − previous end: the wait for the gradient is the
    # link's), U 0.5; stage 1: B 0.25 (each rank's first job has no previous end)
    assert c["dispatch_cost"] == {"F": [0.5, 0.0], "B": [0.25, 0.25], "U": [0.5, 0.0]}
    assert "dispatch_cost" not in measured_costs([Timeline(0, [JobRecord("F", 0, 0, 0, 0.0, 1.0)])], 1, 0.0)
    assert step_ends([tl0, tl1]) == {0: 8.0, 1: 6.0}
    assert steady_step({0: 10.0, 1: 13.0, 2: 17.0, 3: 20.0}) == 3.0  # the first step's 10 left out
    assert math.isnan(steady_step({0: 1.0}))
    sim = simulate(gpipe(2, 2, steps=3), 1.0, 2.0)  # a flushed step: (M + D − 1)(f + b) = 9
    assert step_ends(sim) == {0: 9.0, 1: 18.0, 2: 27.0} and steady_step(step_ends(sim)) == 9.0


def test_sampled_forecast_is_the_mean_forecast_without_spread_and_longer_with_it() -> None:
    """Durations drawn job by job from the pilots' own: none spread, the mean-cost simulation exactly; spread,
    a longer mean makespan (a max-plus makespan is convex in the durations: Jensen)."""
    s = gpipe(2, 4, steps=3)

    def pilot(spread: float) -> list[Timeline]:
        jobs = [[], []]
        for t in range(3):
            for j in range(4):
                for k in range(2):
                    d = 1.0 + (spread if (t + j + k) % 2 else -spread)
                    jobs[k].append(JobRecord("F", k, t, j, 0.0, d))
                    jobs[k].append(JobRecord("B", k, t, j, 0.0, 2 * d))
        return [Timeline(k, jobs[k]) for k in range(2)]

    for spread in (0.0, 0.75):
        tls = pilot(spread)
        costs = measured_costs(tls, 2, 0.25)
        mean = simulate(s, **costs)
        span, step = sampled_forecast(s, costs, tls, draws=64)
        if spread == 0.0:
            assert (span, step) == (mean.makespan, steady_step(step_ends(mean)))
        else:
            assert span > 1.05 * mean.makespan and step > 1.05 * steady_step(step_ends(mean))


def test_forecast_costs_add_a_weight_copy_where_versions_are_kept() -> None:
    prof = {"f_cost": [1.0, 2.0], "b_cost": [2.0, 4.0], "u_cost": [0.5, 0.25], "copy_cost": [0.125, 0.0625],
            "i_cost": [1.0, 2.0], "w_cost": [1.0, 2.0]}
    c = forecast_costs(prof, 0.1, [2, 1], split_backward=False)
    assert c == {"f_cost": [1.0, 2.0], "b_cost": [2.0, 4.0], "u_cost": [0.625, 0.25], "transfer_cost": 0.1}
    assert forecast_costs(prof, 0.1, [1, 1], split_backward=True)["w_cost"] == [1.0, 2.0]
    assert forecast_costs(prof, 0.1, [2, 1], False, collective=[1.0, 2.0])["u_cost"] == [1.625, 2.25]


def test_a_metered_forecast_takes_the_network_and_bytes_instead_of_the_transfer() -> None:
    prof = {"f_cost": [1.0, 2.0], "b_cost": [2.0, 4.0], "u_cost": [0.5, 0.25], "copy_cost": [0.0, 0.0]}
    net, mb = Network.uniform(2, Link.mbps(10, latency_ms=5)), MessageBytes((1000,), (1000,))
    c = forecast_costs(prof, 0.1, [1, 1], False, network=net, message_bytes=mb)
    assert "transfer_cost" not in c and c["network"] is net and c["message_bytes"] is mb
    tl = Timeline(0, [JobRecord("F", 0, 0, 0, 0.0, 1.0), JobRecord("B", 0, 0, 0, 1.0, 3.0)])
    r = measured_costs([tl], 2, 0.25, network=net, message_bytes=mb)
    assert "transfer_cost" not in r and r["network"] is net
    with pytest.raises(ValueError, match="message_bytes"):
        forecast_costs(prof, 0.1, [1, 1], False, network=net)
    # the receive overhead o (LogP) is the network's, after each arrival (not the links'), forecast and replay alike
    o = forecast_costs(prof, 0.1, [1, 1], False, network=net, message_bytes=mb, receive_overhead=0.002)["network"]
    assert o == Network.uniform(2, Link.mbps(10, latency_ms=5), receive_overhead=0.002)
    assert measured_costs([tl], 2, 0.25, network=net, message_bytes=mb, receive_overhead=0.002)["network"] == o
    # pooled over every case and rank of a calibration: the median of the probes' samples
    per_rank = [{"cases": [{"probes": [{"overhead": [0.001], "late": [0.0, 1.0]}, {"overhead": [0.009]}]}, {}]},
                {"cases": [{"probes": [{"overhead": [0.002], "busy": [1e-4]}]}, {"probes": [{"overhead": []}]}]}]
    assert receive_overhead(per_rank) == 0.002 and receive_overhead([{"cases": [{}]}]) == 0.0
    summary = probe_summary(per_rank)
    assert (summary["overhead"], summary["samples"], summary["busy"], summary["late"]) == (0.002, 3, 1e-4, 0.5)
    # the quartiles of [1, 2, 9] ms
    assert (summary["overhead_q1"], summary["overhead_q3"]) == pytest.approx((0.0015, 0.0055), rel=1e-12)
    assert math.isnan(probe_summary([{"cases": [{}]}])["overhead"])


@pytest.mark.slow
def test_metered_calibration_forecasts_with_the_network_and_counts_late_messages() -> None:
    """A metered calibration (CalibrationConfig.link): every run held to the link model, the forecast simulated
    with the same network and the shape pass's bytes; the rows report late messages and the link share."""
    cfg = CalibrationConfig(ranks=2, cases=(CalibrationCase("1f1b"), CalibrationCase("zb_h1")), width=64, depth=4,
                            in_features=64, micro=64, steps=2, repeats=1, profile_reps=3,
                            link=Link.mbps(20, latency_ms=50))
    rows = calibrate(cfg)
    for r in rows:
        # the metered link and the profiled receive overhead (LogP's o, the meter's wake-up)
        want = Network.uniform(2, cfg.link, receive_overhead=r.receive_overhead)
        assert r.costs["network"] == want and "transfer_cost" not in r.costs
        assert 0 <= r.receive_overhead < cfg.link.latency
        assert r.costs["message_bytes"] == MessageBytes((64 * 64 * 4,), (64 * 64 * 4,))
        # the forecast: a mean over durations drawn from the pilots' (near the mean-cost simulation's makespan)
        assert r.forecast_s == pytest.approx(r.simulate().makespan, rel=0.2) and 0.5 < r.link_time <= 1.0
        assert r.forecast_steady_s > 0 and r.steady_s > 0 and math.isfinite(r.steady_error)
        assert r.profile_s > 0 and math.isfinite(r.profile_error)  # the stage profile's forecast, kept beside
        assert 0 <= r.late <= 4 and r.overshoot >= 0
        # the links alone bound a run from below: every micro-batch's activation crosses at 20 Mb/s plus α
        assert r.measured_s > cfg.steps * cfg.M * 64 * 64 * 4 / cfg.link.bandwidth
    with pytest.raises(TypeError, match="link must be"):
        CalibrationConfig(link=10.0).check()  # type: ignore[arg-type]


def test_schedule_for_and_config_errors() -> None:
    for kind in CALIBRATION_KINDS:
        s = schedule_for(kind, 2, 4, 2)
        assert s.W == 2 and s.M == 4 and s.steps == 2
    with pytest.raises(ValueError, match="kind must be one of"):
        schedule_for("nope", 2, 4, 1)
    with pytest.raises(ValueError, match="kind must be one of"):
        CalibrationConfig(cases=(CalibrationCase("nope"),)).check()
    with pytest.raises(ValueError, match="depth"):
        CalibrationConfig(ranks=4, depth=6).check()
    with pytest.raises(ValueError, match="steps"):
        CalibrationConfig(steps=0).check()
    with pytest.raises(ValueError, match="fewer than ranks"):
        CalibrationConfig(ranks=4, model=replace(NANOGPT["cpu"], D=2)).check()


def test_a_transformer_setting_replaces_the_deep_mlp() -> None:
    """CalibrationConfig(model=NANOGPT["cpu"]): one encoder block per stage, micro-batches (micro, seq, d_model) and
    a mean-squared-error loss; the metered forecast bills micro · seq · d_model float32 bytes per message."""
    s = NANOGPT["cpu"]
    cfg = CalibrationConfig(ranks=8, cases=(CalibrationCase("1f1b"),), micro=s.micro, microbatches=s.M, model=s)
    cfg.check()  # depth (the deep_mlp's) is not asked for
    n = s.micro * s.seq * s.d_model * 4
    assert _message_bytes(8, cfg) == MessageBytes((n,) * 7, (n,) * 7)
    x, y = _micro_data(cfg, torch.device("cpu"))[0]
    assert x.shape == y.shape == (s.M * s.micro, s.seq, s.d_model) and y.is_floating_point()


@pytest.mark.slow
def test_calibration_on_two_ranks_reports_every_row() -> None:
    """Every schedule runs on real processes, the placements (DDP, FSDP, LPP and FSLPP with G = 2 groups, hybrid)
    included; a policy the runtime refuses on a placement gives a not-runnable row with the runtime's reason."""
    placed = ("ddp", "fsdp", "lpp", "fslpp", "hybrid")
    cases = (CalibrationCase("1f1b"), CalibrationCase("zb_h1"), *(CalibrationCase(k) for k in placed),
             CalibrationCase("fsdp", policy="spectrain", label="FSDP + SpecTrain"))
    cfg = CalibrationConfig(ranks=2, cases=cases, width=64, depth=4, micro=8, steps=2, repeats=3, profile_reps=3)
    rows = calibrate(cfg)
    assert [r.kind for r in rows] == ["1f1b", "zb_h1", *placed, "fsdp"]
    assert [r.schedule.split("(")[0] for r in rows[2:7]] == ["DDP", "FSDP", "LPP", "FSLPP", "hybrid PP×DP"]
    assert "G=2" in rows[4].schedule and "G=2" in rows[5].schedule
    for r in rows[:7]:
        assert r.runnable and len(r.measured_all) == 3 and r.measured_s == statistics.median(r.measured_all), r.note
        # the forecast is the simulation with the profiled costs; the error is relative to the median run
        assert r.simulate().makespan == r.forecast_s > 0
        assert r.error == pytest.approx(r.forecast_s / r.measured_s - 1, rel=1e-12)
        assert math.isfinite(r.replay_error) and math.isfinite(r.busy_error)
        # the median run's timelines: every rank, every job of its program; the makespan is the last end
        assert [tl.rank for tl in r.timelines] == [0, 1]
        assert max(tl.makespan for tl in r.timelines) == r.measured_s  # 3 repeats: the median is one of them
        assert all(0 < tl.busy <= tl.makespan for tl in r.timelines)  # a rank's jobs never overlap
        sched = r.sim_schedule
        for w, tl in enumerate(r.timelines):  # every job of the rank's program, and its collectives timed too
            ran = [j.job for j in tl.jobs if j.op not in COLLECTIVE_KINDS]
            program = [(a.op, a.stage, a.step, a.micro) for a in sched.programs[w]]
            # a placed run moves a replicated stage's U after the step's last backward (bucketed all-reduce)
            assert (sorted(ran) if r.kind in placed else ran) == (sorted(program) if r.kind in placed else program)
        assert any(j.op in COLLECTIVE_KINDS for tl in r.timelines for j in tl.jobs) == (r.kind in placed)
        # the profiled collectives are in the forecast's update costs, stage by stage
        assert (len(r.collective_cost) == sched.D and all(c > 0 for c in r.collective_cost)) == (r.kind in placed)
        assert all(u >= c for u, c in zip(r.costs["u_cost"], r.collective_cost))
        assert r.samples == cfg.steps * cfg.M * cfg.micro and r.throughput == pytest.approx(r.samples / r.measured_s)
    assert "i_cost" in rows[1].costs and "i_cost" not in rows[0].costs  # ZB-H1 splits its backward
    refused = rows[7]
    assert not refused.runnable and "not runnable" not in refused.note and "spectrain" in refused.note
    assert math.isnan(refused.error) and refused.label == "FSDP + SpecTrain"
    table = format_rows(rows)
    assert table.count("not runnable") == 1 and table.count("\n") == len(rows)
    csv = rows_csv(rows).splitlines()
    assert len(csv) == 1 + len(rows) and csv[0].startswith("label,kind,policy")


# ---------------------------------------------------------------------------------- benchmarks/placements.py


def _placements():  # noqa: ANN202
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # spawned ranks import benchmarks.placements too
    import benchmarks.placements as bp

    return bp


def test_torch_rows_hand_out_the_step_micro_batches_as_pipelab_ddp_does() -> None:
    bp = _placements()
    cfg = CalibrationConfig(ranks=4, micro=3, in_features=5)
    parts = [bp._micro_batches(cfg, r, 4) for r in range(4)]
    assert [len(p) for p in parts] == [cfg.M // 4] * 4  # M/W micro-batches per rank
    sched = schedule_for("ddp", 4, cfg.M, 1)
    for r in range(4):  # the same micro-batch indices as the DDP schedule's worker r computes
        mine = sorted({a.micro for a in sched.programs[r] if a.op == "F"})
        assert mine == [j for j in range(cfg.M) if j % 4 == r]
    xs = torch.cat([x for p in parts for x, _ in p])
    assert xs.shape == (cfg.M * cfg.micro, 5) and torch.unique(xs, dim=0).shape[0] == xs.shape[0]


@pytest.mark.slow
def test_placements_benchmark_runs_and_reports_every_row() -> None:
    bp = _placements()
    cfg = bp.PlacementConfig(ranks=(2,), width=16, depth=4, in_features=8, micro=4, steps=2, repeats=1, profile_reps=2)
    res = bp.run_benchmark(cfg)
    rows = res.rows[2]
    assert [r.label for r in rows] == [n for n, _ in bp.PIPELAB_ROWS]
    assert {"DDP", "FSDP", "GPipe", "1F1B", "LPP", "FSLPP", "Hybrid"} <= {r.label for r in rows}
    for r in rows:  # every placement runs now: a real measurement and forecast
        assert r.runnable and r.measured_s > 0 and math.isfinite(r.error), (r.label, r.note)
        assert (r.collective_s > 0) == (r.kind in ("ddp", "ddp_whole", "fsdp", "lpp", "fslpp", "hybrid")), r.label
    by = {r.label: r for r in rows}
    for tname, pname in bp.TORCH_ROWS:  # torch's DDP and FSDP2 both run on gloo/CPU: ratios, not reasons
        ref = res.torch[2][tname]
        assert isinstance(ref, list) and len(ref) == cfg.repeats and min(ref) > 0, ref
        ratio = res.ratios[2][f"pipelab {pname} / {tname}, samples/s"]
        assert not isinstance(ratio, str) and ratio.median == pytest.approx(ref[0] / by[pname].measured_s)
        assert len(res.loads[2]) == cfg.repeats and ratio.load == res.loads[2][0]
    report = bp.format_report(res)
    assert "torch DDP" in report and "forecast |error|" in report and report.count("\n") >= 10


@pytest.mark.parametrize("sched, policy", [
    (ddp(2, 4, 2, 2), "gpipe"), (fsdp(2, 4, 2, 3), "gpipe"), (fsdp(4, 4, 4, 2), "gpipe"), (lpp(4, 4, 2, 2, 2), "gpipe"),
    (fslpp(4, 4, 2, 2, 2), "gpipe"), (hybrid(2, 4, 2, 2), "gpipe"), (hybrid(2, 4, 2, 3, asynchronous=True), "2bw"),
    (dualpipe(W=2, M=4, steps=2), "gpipe")],
    ids=["ddp", "fsdp", "fsdp-M=W", "lpp", "fslpp", "hybrid", "hybrid-async-2bw", "dualpipe"])
def test_simulated_collectives_equal_the_emulators_counter(sched, policy) -> None:  # noqa: ANN001
    """Bytes and calls per kind and rank, exactly, against what the emulator's collectives counted."""
    torch.manual_seed(0)
    model = deep_mlp(in_features=6, width=8, depth=sched.D, num_classes=4).double()
    wb = [sum(p.numel() * p.element_size() for p in s.parameters()) for s in split(model, sched.D)]
    assert len(set(wb)) > 1  # stages of different sizes: a stage mixed up would show
    emu = Emulator(model, schedule=sched, policy=policy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05))
    g = torch.Generator().manual_seed(1)
    res = emu.run([(torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))
                   for _ in range(sched.steps)])
    want = simulated_collectives(simulate(sched), wb)
    assert [res.extra["collectives"][w] for w in range(sched.W)] == want
    assert any(want[w]["calls"] for w in range(sched.W))
    with pytest.raises(ValueError, match="one entry per stage"):
        simulated_collectives(simulate(sched), wb[:-1])


def test_measured_costs_charge_a_stages_collectives_to_its_update() -> None:
    """Per (stage, step) the longest rank's collective time, averaged over steps, is added to that stage's U."""
    tl0 = Timeline(0, [JobRecord("F", 0, 0, 0, 0.0, 1.0), JobRecord("B", 0, 0, 0, 1.0, 3.0),
                       JobRecord("all_reduce", 0, 0, -1, 3.0, 3.5), JobRecord("U", 0, 0, -1, 3.5, 3.75),
                       JobRecord("F", 0, 1, 0, 4.0, 5.0), JobRecord("B", 0, 1, 0, 5.0, 7.0),
                       JobRecord("all_reduce", 0, 1, -1, 7.0, 7.25), JobRecord("U", 0, 1, -1, 7.25, 7.5)])
    tl1 = Timeline(1, [JobRecord("broadcast", 0, -1, -1, 0.0, 9.0),  # version 0, before any step: not charged
                       JobRecord("F", 0, 0, 1, 0.0, 1.0), JobRecord("B", 0, 0, 1, 1.0, 3.0),
                       JobRecord("all_reduce", 0, 0, -1, 3.0, 4.0), JobRecord("U", 0, 0, -1, 4.0, 4.25),
                       JobRecord("F", 0, 1, 1, 4.25, 5.25), JobRecord("B", 0, 1, 1, 5.25, 7.25),
                       JobRecord("all_reduce", 0, 1, -1, 7.25, 7.5), JobRecord("reduce", 0, 1, -1, 7.5, 7.75),
                       JobRecord("U", 0, 1, -1, 7.75, 8.0)])
    c = measured_costs([tl0, tl1], 1, 0.0)
    # U: mean 0.25; collectives: step 0 max(0.5, 1.0) = 1.0, step 1 max(0.25, 0.5) = 0.5 -> mean 0.75
    assert c["u_cost"] == [pytest.approx(0.25 + 0.75)] and c["f_cost"] == [1.0] and c["b_cost"] == [2.0]
