"""The link model's forecast against metered runs: does the simulator predict a run over slow links within 5 %?

What runs: for every rank count (``--ranks``) and every link (``--mbps`` × ``--latency-ms``), one
:func:`pipelab.studies.calibration.calibrate` on spawned gloo ranks (one thread each) with the link metered
on every boundary (:mod:`pipelab.runtime.meter`: each message is held until the link model's arrival), over
the schedules of ``--kinds`` (GPipe, 1F1B, async 1F1B = PipeDream with weight stashing, 2BW, ZB-H1). Right before
each measured run, its schedule runs as a pilot (``--pilot-steps`` metered steps, traced, the first left out): the
forecast is :func:`pipelab.simulator.simulate` with the pilots' mean F, B (I, W), U durations per stage
(jobs as they run metered on this machine, sharing the cores as in the run), the network and the bytes of the
real boundary tensors (a shape pass, :func:`pipelab.links.message_bytes`), and the receive overhead o (LogP's:
the time from a message's modelled arrival to its waiting job running, the wake-up from the meter's hold), the
median over the pilots' waited-for, not late messages, charged after every arrival
(:attr:`pipelab.links.Network.receive_overhead`, apart from the links' α), and each stage's dispatch time (the
pilots' mean time of a rank between two jobs: sends, bookkeeping, asking for the next input;
``simulate(dispatch_cost=)``). The step time compared is the *steady* one
(:func:`pipelab.studies.calibration.steady_step`: the median spacing of step ends after the first step, the traced run's
on one host clock and the forecast's), the median over ``--repeats`` runs (schedules interleaved within a repeat,
so load from other processes hits them alike): the first step's set-up (a rank's first transfer on a connection
took 3–13 ms here) is no more the forecast's than the pilots' first step is, and the error of the whole makespan
(which includes it) is kept beside.

Per row: schedule, ranks, Mb/s, latency, forecast and measured steady step time, error (forecast / measured − 1),
the same for the makespan, the forecast's link share (:attr:`~pipelab.simulator.SimResult.link_time`: the part
of the critical path spent on links), late messages (placed out of their wire's order, or found by a waiting
job after their modelled arrival: the meter's condition failed), o and the run's own mean overshoot, the busy
error (the forecast's busiest rank's compute against the measured one: the pilot's error), the profile error
(the same forecast with each stage profiled alone, after a pause, median of ``--profile-reps``: kept to show
what it missed), the replay (the same simulation with the run's own mean job times, dispatch and overshoot: what is
left is the model's error; steady, as the error) and the 1-minute load average. Per link setting it prints
what the pilots measured of the metered transport (:func:`pipelab.studies.calibration.probe_summary`): o with
its quartiles, the hand-over of a message already there and the share of late messages. ``--csv`` writes the
rows; ``--unmetered`` adds each schedule without a meter (the forecast then takes the stage profile and the
profiled local transfer).

``--nanogpt`` runs the benchmark-like preset instead (:data:`pipelab.studies.time_to_target.NANOGPT` ``["cpu"]``:
eight ranks, one transformer block each, 200 Mb/s and 50 ms on every boundary, torch's 1F1B = pipelab's ``1f1b``)
and reports its *steady* step time (the median spacing of step ends after the first step) and link share (the
steady step's critical path outside compute: traced back from its last job, each job to the one that bound its
start, its input's sender when it waited for a message, else its rank's previous job) three ways: the study's
forecast from FLOPs (:func:`~pipelab.studies.time_to_target.benchmark_forecast`), the simulator with the pilot
run's costs (as the rows above), and the metered run's own timeline; ``--csv`` then writes that row.

    python benchmarks/links.py                       # 2 and 4 ranks, 10/50/200 Mb/s, 5 and 50 ms
    python benchmarks/links.py --ranks 2 --mbps 50 --latency-ms 5 --kinds gpipe 1f1b
    python benchmarks/links.py --nanogpt --csv benchmarks/results/links_nanogpt.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import header, load_average  # noqa: E402

from pipelab.links import Link  # noqa: E402
from pipelab.planner import critical_path  # noqa: E402
from pipelab.schedules.dependencies import received_from  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.studies.calibration import (  # noqa: E402
    CalibrationCase,
    CalibrationConfig,
    calibrate,
    steady_step,
    step_ends,
)
from pipelab.studies.time_to_target import NANOGPT, benchmark_forecast  # noqa: E402

KINDS = ("gpipe", "1f1b", "pipedream", "2bw", "zb_h1")
COLUMNS = ("schedule", "kind", "policy", "ranks", "mbps", "latency_ms", "duplex", "steps", "repeats", "forecast_step_s",
           "measured_step_s", "error_pct", "makespan_error_pct", "link_share", "late", "overhead_ms", "overshoot_ms",
           "dispatch_ms", "replay_error_pct", "busy_error_pct", "profile_error_pct", "makespan_per_step_min_s",
           "makespan_per_step_max_s", "probe_overhead_q1_ms", "probe_overhead_q3_ms", "probe_samples",
           "probe_busy_ms", "probe_late_share", "load1")


def run(ranks: int, mbps: float | None, latency_ms: float, args: argparse.Namespace) -> list[dict[str, object]]:
    """One calibration on ``ranks`` processes with every boundary metered as ``mbps`` Mb/s, ``latency_ms`` ms
    (``mbps=None``: unmetered, the forecast with the profiled local transfer)."""
    cfg = CalibrationConfig(ranks=ranks, cases=tuple(CalibrationCase(k) for k in args.kinds), width=args.width,
                            depth=args.depth, in_features=args.width, micro=args.micro, steps=args.steps,
                            repeats=args.repeats, profile_reps=args.profile_reps, pilot_steps=args.pilot_steps,
                            link=None if mbps is None else Link.mbps(mbps, latency_ms=latency_ms),
                            duplex=args.duplex, timeout_s=3600.0)
    rows = calibrate(cfg)
    load = load_average()
    out = []
    for r in rows:
        replay = steady_step(step_ends(simulate(r.sim_schedule, **r.measured_costs)))
        dispatch = [x for v in r.costs.get("dispatch_cost", {"F": [0.0]}).values() for x in v]
        out.append({"schedule": r.schedule, "kind": r.kind, "policy": r.policy, "ranks": ranks,
                    "mbps": "none" if mbps is None else mbps,
                    "latency_ms": latency_ms, "duplex": args.duplex, "steps": args.steps, "repeats": args.repeats,
                    "forecast_step_s": r.forecast_steady_s, "measured_step_s": r.steady_s,
                    "error_pct": 100 * r.steady_error, "makespan_error_pct": 100 * r.error,
                    "link_share": r.link_time, "late": r.late,
                    "overhead_ms": 1e3 * r.receive_overhead, "overshoot_ms": 1e3 * r.overshoot,
                    "dispatch_ms": 1e3 * statistics.fmean(dispatch),
                    "replay_error_pct": 100 * (replay / r.steady_s - 1), "busy_error_pct": 100 * r.busy_error,
                    "profile_error_pct": 100 * r.profile_error,
                    "makespan_per_step_min_s": min(r.measured_all) / args.steps,
                    "makespan_per_step_max_s": max(r.measured_all) / args.steps,
                    "probe_overhead_q1_ms": 1e3 * r.probe.get("overhead_q1", math.nan),
                    "probe_overhead_q3_ms": 1e3 * r.probe.get("overhead_q3", math.nan),
                    "probe_samples": int(r.probe.get("samples", 0)),
                    "probe_busy_ms": 1e3 * r.probe.get("busy", math.nan),
                    "probe_late_share": r.probe.get("late", math.nan), "load1": load})
    if rows and rows[0].probe:
        p = rows[0].probe
        print(f"  probe: o = {1e3 * p['overhead']:.2f} ms [{1e3 * p['overhead_q1']:.2f}, {1e3 * p['overhead_q3']:.2f}]"
              f" over {p['samples']:.0f} waited messages (α = {latency_ms:g} ms); hand-over when there "
              f"{1e3 * p['busy']:.2f} ms; late {100 * p['late']:.1f} % of the messages", flush=True)
    return out


NANOGPT_COLUMNS = ("setting", "schedule", "ranks", "mbps", "latency_ms", "steps", "flops_step_s", "flops_link_share",
                   "forecast_step_s", "forecast_link_share", "measured_step_s", "measured_link_share", "error_pct",
                   "late", "overhead_ms", "overshoot_ms", "makespan_per_step_min_s", "makespan_per_step_max_s",
                   "load1")


def measured_link_share(timelines: list, D: int, start: float, end: float) -> float:
    """Share of ``[start, end]`` (seconds since t0) that the measured critical path spends outside compute: from
    the last job back, each job to its input's sender when it waited for a message (the sender's end after its
    rank's previous job), else to its rank's previous job."""
    at = {(r.job, tl.rank): r for tl in timelines for r in tl.jobs}
    where = {r.job: tl.rank for tl in timelines for r in tl.jobs if r.op != "U"}
    prev = {(r.job, tl.rank): (tl.jobs[i - 1].job, tl.rank) if i else None for tl in timelines
            for i, r in enumerate(tl.jobs)}
    key = max(at, key=lambda x: at[x].end)
    compute = 0.0
    while key is not None and at[key].end > start:
        r = at[key]
        compute += min(r.end, end) - max(r.start, start)
        before = prev[key]
        senders = [(j, where[j]) for j in received_from(r.job, D) if j in where and where[j] != key[1]]
        waited = [x for x in senders if before is None or at[x].end > at[before].end]
        key = waited[0] if r.received and waited else before
    return 1.0 - compute / (end - start)


def nanogpt(args: argparse.Namespace) -> dict[str, object]:
    """The benchmark-like preset at CPU scale, metered (module docstring)."""
    s = NANOGPT["cpu"]
    flops = benchmark_forecast(s)
    cfg = CalibrationConfig(ranks=s.D, cases=(CalibrationCase("1f1b"),), micro=s.micro, microbatches=s.M,
                            steps=args.steps, repeats=args.repeats, profile_reps=args.profile_reps,
                            pilot_steps=args.pilot_steps, link=Link.mbps(s.mbps, latency_ms=s.latency_ms), model=s,
                            timeout_s=3600.0)
    r = calibrate(cfg)[0]
    load = load_average()
    sim = r.simulate()
    fends, mends = step_ends(sim), step_ends(r.timelines)
    fstep, mstep = steady_step(fends), steady_step(mends)
    last = args.steps - 1
    path = critical_path(sim, fends[last - 1], fends[last])
    flink = sum(path.time_by("transfer").values()) / (fends[last] - fends[last - 1])
    mlink = measured_link_share(r.timelines, s.D, mends[last - 1], mends[last])
    return {"setting": "NANOGPT['cpu']", "schedule": r.schedule, "ranks": s.D, "mbps": s.mbps,
            "latency_ms": s.latency_ms, "steps": args.steps, "flops_step_s": flops["step_time"],
            "flops_link_share": flops["link_share"], "forecast_step_s": fstep, "forecast_link_share": flink,
            "measured_step_s": mstep, "measured_link_share": mlink, "error_pct": 100 * (fstep / mstep - 1),
            "late": r.late, "overhead_ms": 1e3 * r.receive_overhead, "overshoot_ms": 1e3 * r.overshoot,
            "makespan_per_step_min_s": min(r.measured_all) / args.steps,
            "makespan_per_step_max_s": max(r.measured_all) / args.steps, "load1": load}


def write_csv(path: str, columns: tuple[str, ...], rows: list[dict[str, object]]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else v) for k, v in r.items()})


def line(row: dict[str, object]) -> str:
    ok = "yes" if abs(float(row["error_pct"])) <= 5.0 else "MISSED"  # type: ignore[arg-type]
    return (f"{row['schedule']:<26} {row['ranks']:>2} {row['mbps']:>6} {row['latency_ms']:>5g} "
            f"{1e3 * float(row['forecast_step_s']):>10.1f} {1e3 * float(row['measured_step_s']):>10.1f} "  # type: ignore[arg-type]
            f"{float(row['error_pct']):>+7.1f}% {float(row['makespan_error_pct']):>+7.1f}% "  # type: ignore[arg-type]
            f"{100 * float(row['link_share']):>5.0f}% {row['late']:>4} "  # type: ignore[arg-type]
            f"{float(row['overhead_ms']):>5.1f} {float(row['overshoot_ms']):>5.1f} "  # type: ignore[arg-type]
            f"{float(row['busy_error_pct']):>+7.1f}% {float(row['profile_error_pct']):>+7.1f}% "  # type: ignore[arg-type]
            f"{float(row['replay_error_pct']):>+7.1f}% {float(row['load1']):>5.1f}  {ok}")  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--mbps", type=float, nargs="+", default=[10.0, 50.0, 200.0])
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[5.0, 50.0])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--unmetered", action="store_true",
                    help="also run every schedule without a meter (the forecast takes the profiled local transfer)")
    ap.add_argument("--duplex", action="store_true", help="separate wires for activations and gradients")
    ap.add_argument("--width", type=int, default=512, help="deep_mlp width (and input features)")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--micro", type=int, default=32, help="samples per micro-batch")
    ap.add_argument("--steps", type=int, default=8,
                    help="steps per run (the steady step: the median of steps − 1 spacings)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pilot-steps", type=int, default=8, help="steps of each pilot run (its first not sampled)")
    ap.add_argument("--profile-reps", type=int, default=10)
    ap.add_argument("--csv", default=None, help="write the rows here (e.g. benchmarks/results/links.csv)")
    ap.add_argument("--nanogpt", action="store_true",
                    help="the NANOGPT['cpu'] preset instead: 8 ranks, 200 Mb/s + 50 ms, torch's 1F1B (--steps, "
                         "--repeats, --profile-reps apply)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.nanogpt:
        print(header("NANOGPT['cpu'] preset: forecast vs metered run (gloo, CPU)", "1"))
        t0 = time.perf_counter()
        row = nanogpt(args)
        print(f"{row['schedule']}, {row['ranks']} ranks, {row['mbps']:g} Mb/s + {row['latency_ms']:g} ms, "
              f"{args.steps} steps, median of {args.repeats} runs ({time.perf_counter() - t0:.0f} s)")
        for what, step, share in (("FLOP-model forecast", "flops_step_s", "flops_link_share"),
                                  ("forecast (pilot run)", "forecast_step_s", "forecast_link_share"),
                                  ("metered measurement", "measured_step_s", "measured_link_share")):
            print(f"  {what:<21} steady step {1e3 * float(row[step]):8.1f} ms, link share "  # type: ignore[arg-type]
                  f"{100 * float(row[share]):5.1f} %")  # type: ignore[arg-type]
        print(f"  error {float(row['error_pct']):+.1f} % (forecast / measured - 1); late {row['late']}; "  # type: ignore[arg-type]
              f"o {float(row['overhead_ms']):.2f} ms; load {float(row['load1']):.1f}")  # type: ignore[arg-type]
        if args.csv:
            write_csv(args.csv, NANOGPT_COLUMNS, [row])
        return
    print(header("link model: forecast vs metered runs (gloo, CPU)", "1"))
    print(f"deep_mlp width {args.width}, depth {args.depth}; micro-batch {args.micro}; M = 2·ranks; "
          f"{args.steps} steps; median of {args.repeats} runs; {'duplex' if args.duplex else 'half-duplex'} wires; "
          "step times are steady (after the first step), the makespan's error beside")
    cores = len(os.sched_getaffinity(0))
    if max(args.ranks) > cores:
        print(f"note: {max(args.ranks)} ranks on {cores} cores share them; the simulator gives every rank its own")
    print(f"{'schedule':<26} {'W':>2} {'Mb/s':>6} {'ms':>5} {'fcst ms':>10} {'meas ms':>10} {'error':>8} {'mkspan':>8} "
          f"{'link':>6} {'late':>4} {'o ms':>5} {'over':>5} {'busy err':>8} {'profile':>8} {'replay':>8} {'load':>5}  "
          "within ±5%")
    rows = []
    links: list[tuple[float | None, float]] = [(mbps, ms) for mbps in args.mbps for ms in args.latency_ms]
    if args.unmetered:
        links.append((None, 0.0))
    for ranks in args.ranks:
        for mbps, ms in links:
            t0 = time.perf_counter()
            for row in run(ranks, mbps, ms, args):
                rows.append(row)
                print(line(row), flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
            if args.csv:  # after every link setting: an interrupted run keeps the rows it measured
                write_csv(args.csv, COLUMNS, rows)
    missed = [r for r in rows if not abs(float(r["error_pct"])) <= 5.0]  # type: ignore[arg-type]
    print(f"{len(rows) - len(missed)} of {len(rows)} rows within ±5 %; "
          f"mean |error| {sum(abs(float(r['error_pct'])) for r in rows) / max(len(rows), 1):.1f} %")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
