"""Throughput of the zero-bubble schedules: pipelab's runtime vs ``torch.distributed.pipelining``, and the forecast.

Sibling of ``benchmarks/runtime.py`` (same timing rule, same helpers, same report style) for the schedules
with a split backward (I = input gradient, W = weight gradient; Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024, §2).

What runs: one :func:`pipelab.distributed.spawn` of ``--ranks`` = W processes (1 intra-op thread each),
so process start-up is never timed. Every rank builds the same ``deep_mlp`` from the same seed and,
``--repeats`` times, runs each row below on the same data (mini-batches of ``--batch`` samples, M =
``--microbatches`` micro-batches each, default 2W), rows interleaved within a repeat so that load from
other processes hits all rows alike:

==========================  ============================================================  ======  ==================
row                         what                                                          stages  source
==========================  ============================================================  ======  ==================
``torch ZB-V``              ``ScheduleZBVZeroBubble`` (2 ``PipelineStage`` per rank)      2W      ZB §6
``pipelab ZB-V``            :func:`~pipelab.schedules.zb_v` (W, M), policy ``"1f1b"``     2W
``torch interleaved ZB``    ``ScheduleInterleavedZeroBubble``, stages w and w + W         2W      ZB §2, torch
``pipelab interleaved ZB``  :func:`~pipelab.schedules.interleaved_zero_bubble` (W, 2, M)  2W
``torch DualPipeV``         ``ScheduleDualPipeV`` (stages w and 2W − 1 − w)               2W      DeepSeek-V3 §3.2.1
``pipelab DualPipeV``       :func:`~pipelab.schedules.dualpipe_v` (W, M)                  2W
``torch ZB-H1``             ``ScheduleInterleavedZeroBubble`` with one stage per rank     W       ZB §2.1
``pipelab ZB-H1``           :func:`~pipelab.schedules.zb_h1` (W, M)                       W
``pipelab 1F1B``            :func:`~pipelab.schedules.one_f_one_b` (W, M)                 W       baseline
==========================  ============================================================  ======  ==================

The model is cut by :func:`pipelab.partition.split` into D = 2W stages for the two-chunk rows and D = W
for the others, so every rank does the same work per mini-batch in every row. torch rows: per mini-batch
``optimizer.zero_grad()``, ``schedule.step(...)``, ``optimizer.step()`` (one optimizer per local stage;
torch scales the accumulated gradient by 1/M). pipelab rows: a fresh ``PipelineRuntime`` on the flushed
builder over all the run's mini-batches, policy ``"1f1b"`` (flushed: every job uses the current weights).
torch has no ZB-H1 class; ``ScheduleInterleavedZeroBubble`` with one stage per rank runs ZB-H1's order
(``tests/core/test_zero_bubble.py``), so it is the torch ZB-H1 row. Each torch row's action lists are
imported (:func:`pipelab.schedules.torch_actions.from_torch`) and compared with the pipelab builder's
program (``same_order`` in the result): the two rows of a pair run the same jobs in the same order per
rank. torch runs ``OVERLAP_F_B`` (DualPipeV) as its F then its B, pipelab's order.

Timing (``benchmarks/runtime.py``'s rule): rank 0 (it holds stage 0 in every row) records when each
mini-batch t enters the pipeline — torch: just before ``schedule.step``; pipelab: when the runtime asks
the data callable for mini-batch t (at F(0, t, 0)). A run has w + n + 1 mini-batches (w = ``--warmup``,
n = ``--steps``) and the time per mini-batch is t_mb = (entry(w + n) − entry(w)) / n, the period of a long
run with each step's fill and drain (its bubble) inside. A row's figure is the median over repeats; each
ratio pipelab/torch is the median [IQR] of the per-repeat ratios (rows of one repeat ran close in time), printed
with the median of rank 0's load average at the end of each repeat (:func:`benchmarks._harness.paired_ratio`).

Targets (issue 12): pipelab within 10% of torch's throughput on the same schedule (time ratio ≤ 1.10);
the simulator's forecast within 10% of the measured time per mini-batch.

Forecast: each rank profiles its own chunks with :func:`pipelab.profiling.profile_stage` (1 thread, like
the runs; F, B, I, W, U for one micro-batch, medians) — the stages it holds in any row: w, w + W and
2W − 1 − w of the 2W-stage cut and w of the W-stage cut — and :func:`pipelab.profiling.transfer_times`
gives the one-way time of an activation between ranks w and w + 1 (every boundary carries a micro-batch ×
width activation). The profile is taken at the start of every repeat and each cost is the median over
repeats, so that the costs see the same load from other processes as the runs.
:func:`pipelab.simulator.simulate` then forecasts each row's schedule (torch rows: the pipelab schedule
of the same order) with stage k's costs from the rank that holds k in that row and the transfer of
boundary k between the ranks of stages k and k + 1 (0 on one rank; a wrap-around rank pair not measured
directly, e.g. W − 1 → 0 of interleaved ZB with W > 2, takes the mean of the measured ones), and reports
the period from the simulated starts of F(0, t, 0) and the whole run's makespan.

Not in the cost model: the dispatch of each job and each send/receive (Python, autograd and gloo calls;
on CPU, gloo's transport threads also take time from the cores that compute), torch running every
optimizer step after ``schedule.step`` (pipelab: U(k) right after stage k's last W), and pipelab's weight
snapshot after each update. The column ``left/job`` divides what the forecast leaves out of a mini-batch
by the busiest rank's jobs per step (U included): a per-job overhead shows up there as the same value
across rows, whatever the schedule's bubble.

Known miss (2-core CPU box, gloo, 2 ranks): the forecast is 20–55% short. At a toy size (width 16, so
compute ≈ 0) ``left/job`` is 0.45–0.6 ms in every row, torch's and pipelab's alike, and at width 512 it
is about the same (0.45–0.75 ms): the miss is that per-job overhead, which the split-backward schedules
pay more of (one more job per micro-batch than a fused B; the two-chunk rows twice the jobs and
messages per sample). It shrinks relative to compute as jobs grow (wider layers, larger micro-batches).

Correctness of the comparison: the last pipelab run and the last torch run of each schedule start from
the same weights and see the same data, so their final weights must agree to float32 rounding; the
report prints the largest difference per schedule (the smoke test asserts ≤ 1e-6).

References: P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241:
§2 split backward and ZB-H1, §6 ZB-V); DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437, §3.2.1
DualPipe); torch.distributed.pipelining (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble,
ScheduleDualPipeV).

Usage:
    .venv/bin/python benchmarks/zero_bubble.py [--ranks 2] [--width 1024] [--depth 8] [--batch 128]
        [--microbatches 2W] [--steps 20] [--warmup 4] [--repeats 5] [--backend gloo|nccl] [--json PATH]

``--backend nccl`` puts rank r on ``cuda:r`` (one GPU per rank), as in ``benchmarks/runtime.py``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/zero_bubble.py` finds its sibling

from benchmarks._harness import Ratio, load_average, paired_ratio  # noqa: E402
from benchmarks.runtime import (  # noqa: E402
    RunSetting,
    _make_optimizer,
    _sync,
    _timed,
    add_model_and_run_arguments,
    load_line,
    measured_window,
    report_header,
    simulated_window,
    timed_pipelab_run,
)
from pipelab.distributed import spawn  # noqa: E402
from pipelab.partition import split  # noqa: E402
from pipelab.profiling import profile_stage, transfer_times  # noqa: E402
from pipelab.schedules import Schedule, dualpipe_v, interleaved_zero_bubble, one_f_one_b, zb_h1, zb_v  # noqa: E402
from pipelab.schedules.torch_actions import from_torch  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.studies.models import deep_mlp  # noqa: E402

__all__ = ["ZBConfig", "Row", "ZBResult", "SCHEDULES", "rows_of", "forecast_costs", "run_benchmark",
           "format_report", "main"]


@dataclass(frozen=True)
class ZBConfig(RunSetting):
    """Everything one benchmark run depends on (:class:`benchmarks.runtime.RunSetting`): ranks W, the two-chunk
    rows have 2W stages (so depth ≥ 2W) and M defaults to 2W (DualPipeV needs M ≥ 2W)."""

    chunks: ClassVar[int] = 2

    def check(self) -> None:
        """Raise ``ValueError`` naming the first bad field (also: an M that a compared schedule refuses)."""
        super().check()
        for kind in SCHEDULES:
            try:
                SCHEDULES[kind][0](self.ranks, self.M, 1)
            except ValueError as e:
                raise ValueError(f"microbatches ({self.M}) does not fit {kind} on {self.ranks} ranks: {e}") from e


#: kind → (builder (W, M, steps) → Schedule, torch class name or None, chunks per rank, V-shaped placement).
SCHEDULES: dict[str, tuple[Callable[[int, int, int], Schedule], str | None, int, bool]] = {
    "ZB-V": (zb_v, "ScheduleZBVZeroBubble", 2, True),
    "interleaved ZB": (lambda W, M, steps: interleaved_zero_bubble(W, 2, M, steps), "ScheduleInterleavedZeroBubble",
                       2, False),
    "DualPipeV": (dualpipe_v, "ScheduleDualPipeV", 2, True),
    "ZB-H1": (zb_h1, "ScheduleInterleavedZeroBubble", 1, False),
    "1F1B": (one_f_one_b, None, 1, False),
}


@dataclass(frozen=True)
class Row:
    """One timed configuration: ``impl`` is ``torch`` or ``pipelab``; ``kind`` a key of :data:`SCHEDULES`."""

    name: str
    impl: str
    kind: str

    def D(self, W: int) -> int:
        """Stages of this row's cut of the model."""
        return SCHEDULES[self.kind][2] * W

    def stages_of(self, rank: int, W: int) -> list[int]:
        """The stages ``rank`` computes, increasing (torch's local-stage order = pipelab's chunk order)."""
        chunks, v_shaped = SCHEDULES[self.kind][2:]
        if chunks == 1:
            return [rank]
        return [rank, 2 * W - 1 - rank] if v_shaped else [rank, rank + W]

    def schedule(self, W: int, M: int, steps: int) -> Schedule:
        """This row's schedule over ``steps`` mini-batches (torch rows: the pipelab schedule of the same order)."""
        return SCHEDULES[self.kind][0](W, M, steps)

    def window(self, cfg: ZBConfig) -> tuple[int, int, int]:
        """(first timed mini-batch w, mini-batches in the window n, mini-batches in a run)."""
        return cfg.warmup, cfg.steps, cfg.warmup + cfg.steps + 1


def rows_of(cfg: ZBConfig) -> list[Row]:
    """The rows the benchmark runs, in the order they run within a repeat."""
    rows = []
    for kind, (_, torch_cls, _, _) in SCHEDULES.items():
        if torch_cls is not None:
            rows.append(Row(f"torch {kind}", "torch", kind))
        rows.append(Row(f"pipelab {kind}", "pipelab", kind))
    return rows


# ------------------------------------------------------------------------------------------- on each rank


def _profile(rank: int, world: int, cfg: ZBConfig, base: nn.Sequential, x: Tensor, y: Tensor,
             device: torch.device) -> dict[str, Any]:
    """F, B, I, W, U of every stage this rank holds in some row, for one micro-batch; transfer to rank + 1.

    Stage k's input is the output of stages 0..k−1 of the same cut on ``x`` (untimed). Keys ``"D:k"``.
    """
    needed = sorted({(row.D(world), k) for row in rows_of(cfg) for k in row.stages_of(rank, world)})
    out: dict[str, dict[str, float]] = {}
    cuts = {D: [s.to(device) for s in split(copy.deepcopy(base), D)] for D in {D for D, _ in needed}}
    for D, k in needed:
        stages = cuts[D]
        with torch.no_grad():
            h = x
            for s in stages[:k]:
                h = s(h)
        c = profile_stage(stages[k], h, y if k == D - 1 else None, optimizer=_make_optimizer(cfg.optimizer),
                          reps=cfg.profile_reps, warmup=3, input_grad=k > 0)
        out[f"{D}:{k}"] = {"f": c.f, "b": c.b, "i": c.i, "w": c.w, "u": c.u, "copy": c.copy}
    # one stage per rank: stage `rank` of the W-cut sends a micro-batch × width activation to rank + 1
    stages = cuts.get(world) or [s.to(device) for s in split(copy.deepcopy(base), world)]
    with torch.no_grad():
        h = x
        for s in stages[:rank]:
            h = s(h)
        nxt = None if rank == world - 1 else stages[rank](h)
    transfer = transfer_times(nxt, h if rank > 0 else None, reps=cfg.profile_reps, warmup=3)
    return {"stages": out, "transfer": transfer}


def _same_order(sched: Any, row: Row, world: int, cfg: ZBConfig) -> bool:
    """torch's per-rank compute order (imported) equals the pipelab builder's program, U placement aside."""
    imported = from_torch(sched.pipeline_order, n_stages=row.D(world), n_microbatches=cfg.M, name=row.name)
    ours = row.schedule(world, cfg.M, 1)

    def jobs(s: Schedule) -> list[list[tuple[str, int, int]]]:
        return [[(a.op, a.stage, a.micro) for a in p if a.op != "U"] for p in s.programs]

    return jobs(imported) == jobs(ours)


def _torch_run(row: Row, rank: int, world: int, base: nn.Sequential, data: list[tuple[Tensor, Tensor]],
               steps: int, cfg: ZBConfig, device: torch.device) -> tuple[float, list[float], dict[int, tuple], bool]:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as ts

    D, mine = row.D(world), row.stages_of(rank, world)
    mods = split(copy.deepcopy(base), D)
    stages = [PipelineStage(mods[k].to(device), k, D, device) for k in mine]
    cls = getattr(ts, str(SCHEDULES[row.kind][1]))
    sched = cls(stages, n_microbatches=cfg.M, loss_fn=nn.functional.cross_entropy)
    opts = [_make_optimizer(cfg.optimizer)(list(mods[k].parameters())) for k in mine]
    first, last = 0 in mine, D - 1 in mine
    entries: list[float] = []

    def go() -> None:
        for t in range(steps):
            x, y = data[t % len(data)]
            _sync(device)  # on CUDA: when the device, not the host, gets there
            entries.append(time.perf_counter())  # mini-batch t enters this rank's stage 0 (rank 0)
            for o in opts:
                o.zero_grad()
            sched.step(*((x,) if first else ()), target=y if last else None)
            for o in opts:
                o.step()

    seconds, _ = _timed(go, device)
    weights = {k: tuple(p.detach().cpu().clone() for p in mods[k].parameters()) for k in mine}
    return seconds, entries, weights, _same_order(sched, row, world, cfg)


def _pipelab_run(row: Row, rank: int, world: int, base: nn.Sequential, data: list[tuple[Tensor, Tensor]],
                 steps: int, cfg: ZBConfig, device: torch.device) -> tuple[float, list[float], dict[int, tuple], bool]:
    seconds, entries, res = timed_pipelab_run(base, row.schedule(world, cfg.M, steps), "1f1b", cfg.optimizer, data,
                                              steps, device)
    return seconds, entries, dict(res.weights), True


def _rank_main(rank: int, world: int, cfg: ZBConfig) -> dict[str, Any]:
    """Profile this rank's chunks, then run every row ``repeats`` times (rows interleaved within a repeat)."""
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.backend == "nccl" else torch.device("cpu")
    torch.manual_seed(cfg.seed)
    base = deep_mlp(in_features=cfg.in_features, width=cfg.width, depth=cfg.depth)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    data = [(torch.randn(cfg.batch, cfg.in_features, generator=g).to(device),
             torch.randint(0, 10, (cfg.batch,), generator=g).to(device)) for _ in range(4)]
    x0, y0 = data[0]
    rows = rows_of(cfg)
    runs: dict[str, list[dict[str, Any]]] = {r.name: [] for r in rows}
    weights: dict[str, dict[int, tuple]] = {}
    same_order: dict[str, bool] = {}
    profiles, loads = [], []
    for _ in range(cfg.repeats):
        # profiled within every repeat, so that the costs see the same load from other processes as the runs
        profiles.append(_profile(rank, world, cfg, base, x0[:cfg.micro], y0[:cfg.micro], device))
        for row in rows:
            fn = _torch_run if row.impl == "torch" else _pipelab_run
            seconds, entries, w, same = fn(row, rank, world, base, data, row.window(cfg)[2], cfg, device)
            runs[row.name].append({"seconds": seconds, "entries": [e - entries[0] for e in entries]})
            weights[row.name] = w
            same_order[row.name] = same
        loads.append(load_average())  # at the end of each repeat: the load its rows ran under
    diffs, moved = {}, {}
    for kind, (_, torch_cls, chunks, _) in SCHEDULES.items():
        if torch_cls is not None:
            a, b = weights[f"pipelab {kind}"], weights[f"torch {kind}"]
            diffs[kind] = max(float((p - q).abs().max()) for k in a for p, q in zip(a[k], b[k]))
            start = split(base, chunks * world)  # the initial weights: the comparison is not of untrained copies
            moved[kind] = max(float((p - q.detach()).abs().max()) for k in b
                              for p, q in zip(b[k], start[k].parameters()))
    prof = {"stages": {key: {c: statistics.median(p["stages"][key][c] for p in profiles) for c in costs}
                       for key, costs in profiles[0]["stages"].items()},
            "transfer": [statistics.median(p["transfer"][b] for p in profiles) for b in range(world - 1)]}
    return {"rank": rank, "profile": prof, "runs": runs, "weight_diff": diffs, "weight_moved": moved,
            "same_order": same_order, "loads": loads}


# ------------------------------------------------------------------------------------------- driver


def forecast_costs(schedule: Schedule, profile: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Keyword arguments of :func:`~pipelab.simulator.simulate` for ``schedule`` from the ranks' profiles.

    Stage k's F, B, I, W, U are those measured by its holder (worker w = rank w) for stage k of the D-stage
    cut; boundary k costs 0 within a rank, rank a's measured transfer between ranks a and a + 1, and the
    mean of the measured transfers between ranks that are not neighbours (not measured directly).

    Args:
        schedule: a schedule whose workers are the ranks and whose D is a cut the ranks profiled.
        profile: per rank, ``{"stages": {"D:k": {"f", "b", "i", "w", "u": seconds}}, "transfer": [W − 1]}``.
    """
    D = schedule.D
    holder = [schedule.weight_holders[k][0] for k in range(D)]
    transfer = profile[0]["transfer"]

    def per_stage(key: str) -> list[float]:
        return [float(profile[holder[k]]["stages"][f"{D}:{k}"][key]) for k in range(D)]

    tc = []
    for k in range(D - 1):
        a, b = sorted((holder[k], holder[k + 1]))
        tc.append(0.0 if a == b else float(transfer[a]) if b == a + 1 else float(statistics.mean(transfer)))
    return {"f_cost": per_stage("f"), "b_cost": per_stage("b"), "i_cost": per_stage("i"), "w_cost": per_stage("w"),
            "u_cost": per_stage("u"), "transfer_cost": tc}


@dataclass
class ZBResult:
    """What :func:`run_benchmark` returns.

    Attributes:
        config: the :class:`ZBConfig`; rows: one record per row (times in seconds, per repeat and median,
            the simulator's forecasts and errors); ratios: name → :class:`~benchmarks._harness.Ratio` over the
            repeats (median, IQR, load); simulated: name → the simulator's ratio;
        profile: per rank, its stages' costs (``"D:k"`` → f, b, i, w, u, copy seconds) and the transfers;
        weight_diff: kind → max |W_pipelab − W_torch| after the last runs; weight_moved: kind → how far torch's
            final weights moved from the initial ones (min over ranks of the max); same_order: torch row → whether
            its imported action lists equal the pipelab builder's; wall_s: the spawn; loads: rank 0's load average
            at the end of each repeat.
    """

    config: ZBConfig
    rows: list[dict[str, Any]]
    ratios: dict[str, Ratio]
    simulated: dict[str, float]
    profile: list[dict[str, Any]]
    weight_diff: dict[str, float]
    weight_moved: dict[str, float]
    same_order: dict[str, bool]
    wall_s: float
    loads: list[float]


def run_benchmark(cfg: ZBConfig) -> ZBResult:
    """Spawn ``cfg.ranks`` processes, time every row, forecast it, and compute the ratios."""
    cfg.check()
    t0 = time.perf_counter()
    per_rank = spawn(_rank_main, cfg.ranks, (cfg,), backend=cfg.backend, timeout_s=cfg.timeout_s,
                     comm_timeout_s=300.0)
    wall = time.perf_counter() - t0
    W = cfg.ranks
    profile = [per_rank[r]["profile"] for r in range(W)]
    records = []
    for row in rows_of(cfg):
        w, n, total = row.window(cfg)
        t_mb, t_run = measured_window(per_rank, row.name, w, n, cfg.repeats)
        schedule = row.schedule(W, cfg.M, total)
        sim = simulate(schedule, **forecast_costs(schedule, profile))
        sim_mb = simulated_window(sim, w, n)
        mb, run_s = statistics.median(t_mb), statistics.median(t_run)
        jobs = max(len(p) for p in row.schedule(W, cfg.M, 1).programs)  # per step on the busiest rank, U included
        records.append({
            "name": row.name, "impl": row.impl, "kind": row.kind, "D": row.D(W), "M": cfg.M,
            "mini_batches": total, "window": (w, n), "samples_per_mb": cfg.batch,
            "mb_s_all": t_mb, "mb_s": mb, "throughput": cfg.batch / mb, "run_s_all": t_run, "run_s": run_s,
            "sim_mb_s": sim_mb, "sim_run_s": sim.makespan, "sim_bubble": sim.bubble,
            "sim_mb_error": sim_mb / mb - 1.0, "sim_run_error": sim.makespan / run_s - 1.0,
            "jobs_per_mb": jobs, "unmodelled_per_job_s": (mb - sim_mb) / jobs,
        })
    by = {r["name"]: r for r in records}
    loads = per_rank[0]["loads"]

    def paired(num: str, den: str) -> Ratio:
        return paired_ratio(by[num]["mb_s_all"], by[den]["mb_s_all"], loads)

    ratios = {f"pipelab/torch {kind}, time per mini-batch": paired(f"pipelab {kind}", f"torch {kind}")
              for kind, (_, torch_cls, _, _) in SCHEDULES.items() if torch_cls is not None}
    ratios["pipelab ZB-H1 / pipelab 1F1B, time per mini-batch"] = paired("pipelab ZB-H1", "pipelab 1F1B")
    simulated = {"simulated ZB-H1 / 1F1B, time per mini-batch":
                 by["pipelab ZB-H1"]["sim_mb_s"] / by["pipelab 1F1B"]["sim_mb_s"]}
    kinds = per_rank[0]["weight_diff"].keys()
    diff = {k: max(per_rank[r]["weight_diff"][k] for r in range(W)) for k in kinds}
    moved = {k: min(per_rank[r]["weight_moved"][k] for r in range(W)) for k in kinds}
    same = {name: all(per_rank[r]["same_order"][name] for r in range(W))
            for name in per_rank[0]["same_order"] if name.startswith("torch ")}
    return ZBResult(cfg, records, ratios, simulated, profile, diff, moved, same, wall, loads)


def format_report(res: ZBResult) -> str:
    """The configuration, the profile, the table, the ratios against the issue's targets, and the checks."""
    cfg = res.config
    W, M = cfg.ranks, cfg.M
    lines = [
        report_header("pipelab zero-bubble benchmark", cfg, res.wall_s),
        f"model deep_mlp(in={cfg.in_features}, width={cfg.width}, depth={cfg.depth}) float32, {cfg.optimizer}; "
        f"{2 * W} stages (2 chunks per rank) or {W}; mini-batch {cfg.batch} = M={M} × micro-batch {cfg.micro}",
        f"time per mini-batch = stage 0's intake period over {cfg.steps} mini-batches after {cfg.warmup}, "
        f"median of {cfg.repeats} repeats [min–max]; {load_line(res.loads)}",
        "profile (ms per micro-batch, stage of a D-stage cut on its rank: F B I W U):",
    ]
    for rank, p in enumerate(res.profile):
        lines.append(f"  rank {rank}: " + "; ".join(
            f"{key} {1e3 * c['f']:.2f} {1e3 * c['b']:.2f} {1e3 * c['i']:.2f} {1e3 * c['w']:.2f} {1e3 * c['u']:.2f}"
            for key, c in sorted(p["stages"].items(), key=lambda kv: tuple(map(int, kv[0].split(":"))))))
    lines += ["  transfer rank w → w+1 (ms): " + ", ".join(f"{1e3 * t:.2f}" for t in res.profile[0]["transfer"]),
              "",
              f"{'row':<25} {'D':>2} {'ms/mini-batch [min–max]':>25} {'samples/s':>9} {'sim ms':>7} {'err':>6} "
              f"{'run s':>6} {'sim s':>6} {'err':>6} {'jobs':>4} {'left/job':>8}"]
    for r in res.rows:
        spread = f"{1e3 * r['mb_s']:.1f} [{1e3 * min(r['mb_s_all']):.1f}–{1e3 * max(r['mb_s_all']):.1f}]"
        lines.append(f"{r['name']:<25} {r['D']:>2d} {spread:>25} {r['throughput']:>9.0f} "
                     f"{1e3 * r['sim_mb_s']:>7.1f} {100 * r['sim_mb_error']:>+5.0f}% {r['run_s']:>6.2f} "
                     f"{r['sim_run_s']:>6.2f} {100 * r['sim_run_error']:>+5.0f}% {r['jobs_per_mb']:>4d} "
                     f"{1e3 * r['unmodelled_per_job_s']:>8.2f}")
    lines += ["", "ratios, median [IQR] of the per-repeat ratios, load average (target):"]
    for key, r in res.ratios.items():
        tgt = f"  (≤ 1.10: {'met' if r.median <= 1.10 else 'MISSED'})" if key.startswith("pipelab/torch") else ""
        lines.append(f"  {key:<52} {r.median:6.3f} [{r.q1:.3f}–{r.q3:.3f}] load {r.load:.1f}{tgt}")
    lines += [f"  {key:<52} {v:6.3f}" for key, v in res.simulated.items()]
    missed = [r["name"] for r in res.rows if not abs(r["sim_mb_error"]) <= 0.10]
    worst = max(abs(r["sim_mb_error"]) for r in res.rows)
    lines += [
        f"forecast |error| per mini-batch (target ≤ 10%): max {100 * worst:.0f}%"
        + (f"; missed by {', '.join(missed)}" if missed else "; every row met")
        + " (left/job: measured − forecast ms per mini-batch over the busiest rank's jobs per step)",
        "same computation: max |W_pipelab − W_torch| after the last runs: "
        + ", ".join(f"{k} {v:.1e}" for k, v in res.weight_diff.items())
        + f" (training moved them by ≥ {min(res.weight_moved.values()):.1e})",
        "same order (torch's action lists imported = pipelab's builder): "
        + ", ".join(f"{k.removeprefix('torch ')} {'yes' if v else 'NO'}" for k, v in res.same_order.items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> ZBResult:
    """Parse the command line, run the benchmark, print the report (and write JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    d = ZBConfig()
    ap.add_argument("--ranks", type=int, default=d.ranks, help="processes W (2W stages in the two-chunk rows)")
    ap.add_argument("--batch", type=int, default=d.batch, help="samples per mini-batch")
    ap.add_argument("--microbatches", type=int, default=None, help="M per mini-batch (default: 2 × ranks)")
    ap.add_argument("--steps", type=int, default=d.steps, help="mini-batches in the timed window")
    ap.add_argument("--warmup", type=int, default=d.warmup, help="mini-batches before the window")
    add_model_and_run_arguments(ap, d)
    args = ap.parse_args(argv)
    cfg = ZBConfig(ranks=args.ranks, width=args.width, depth=args.depth, in_features=args.in_features,
                   batch=args.batch, microbatches=args.microbatches, steps=args.steps, warmup=args.warmup,
                   repeats=args.repeats, backend=args.backend, optimizer=args.optimizer, timeout_s=args.timeout)
    res = run_benchmark(cfg)
    print(format_report(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": asdict(cfg), "rows": res.rows, "ratios": {k: asdict(v) for k, v in res.ratios.items()},
                       "simulated": res.simulated, "loads": res.loads, "profile": res.profile,
                       "weight_diff": res.weight_diff, "weight_moved": res.weight_moved,
                       "same_order": res.same_order, "wall_s": res.wall_s}, fh, indent=1)
    return res


if __name__ == "__main__":
    main()
