"""Throughput of pipelab's multi-process runtime vs ``torch.distributed.pipelining``, and the simulator's forecast.

What runs: one :func:`pipelab.distributed.spawn` of ``--ranks`` = D processes (one pipeline stage each,
1 thread each), so process start-up is never timed. Every rank builds the same ``deep_mlp`` from the same
seed and, ``--repeats`` times, runs each row below on the same data, rows interleaved within a repeat so
that load from other processes hits all rows alike:

=========================  ==========================================================  ================
row                        what                                                        samples per
                                                                                       mini-batch
=========================  ==========================================================  ================
``torch GPipe``            ``ScheduleGPipe`` (M micro-batches), then ``optimizer.step``  M·b
``pipelab GPipe``          :func:`~pipelab.schedules.gpipe`, policy ``"gpipe"``         M·b
``torch 1F1B``             ``Schedule1F1B`` (M micro-batches), then ``optimizer.step``   M·b
``pipelab 1F1B``           :func:`~pipelab.schedules.one_f_one_b`, policy ``"1f1b"``    M·b
``async stashing M=1``     :func:`~pipelab.schedules.pipedream` (D, 1), ``"stashing"``  b
``async pipeoptim M=1``    the same order, policy ``"pipeoptim"`` (weight prediction)   b
``async stashing M=M``     :func:`~pipelab.schedules.pipedream` (D, M), ``"stashing"``  M·b
=========================  ==========================================================  ================

All rows use the same micro-batch of b = ``--batch`` / M samples (M = ``--microbatches``, default D), so
every F and B job does the same work in every row.

Timing: the steady-state period from stage 0's intake. Rank 0 (stage 0) records the moment each
mini-batch t enters the pipeline — for pipelab, when the runtime asks the data callable for mini-batch t
(at the start of F(0, t, 0)); for torch, just before the step's ``schedule.step``. A run has
w + n + 1 mini-batches (w = ``--warmup``, n = ``--steps``; async M=1 rows M times as many, so that every
row's timed window holds the same samples), and the time per mini-batch is

    t_mb = (entry(w + n) − entry(w)) / n,

the same quantity as the period of a long run: it leaves out the warm-up and the async pipeline's fill
and drain, while a flushed step's own fill and drain (its bubble) is inside every period, as it should
be. On CUDA, rank 0 synchronises its device before each timestamp, so that it marks when the device got
there rather than the host. Throughput = samples per mini-batch / t_mb; a row's figure is the median over
repeats, and each ratio the median of the ratios within a repeat (rows of one repeat ran close in time), with
their interquartile range and the median of rank 0's load average at the end of each repeat
(:func:`benchmarks._harness.paired_ratio`).
Each run starts from fresh weights in a fresh ``PipelineRuntime`` / ``PipelineStage``; the whole run
(barrier to barrier) is also timed, for the simulator.

Fair comparison of async 1F1B with GPipe at M = D: both run micro-batches of b samples; one GPipe
mini-batch (M = D micro-batches, one flush, one update) is compared with D async mini-batches of one
micro-batch each (one update each, PipeDream's setting) by samples per second. The async run applies D×
as many optimizer updates and weight snapshots per sample and pays for them in the measured time; the
``async stashing M=M`` row has GPipe's mini-batch and update count instead.

Simulator check: each rank profiles its own stage with the plain module (1 thread, like the runs; the
profiler is :mod:`pipelab.profiling`):
forward, backward and optimizer step for one micro-batch (medians over repeats), and the one-way time of
an activation between neighbouring ranks (ping-pong / 2). :func:`pipelab.simulator.simulate` then predicts,
for each row's schedule (torch rows: the pipelab schedule of the same order), the same period from the
simulated start times of F(0, t, 0), and the whole run's makespan; both are printed against the
measurements. The torch rows measure the simulator's error; the pipelab rows' extra error is the
runtime's overhead beyond compute and transfer (e.g. the weight snapshot after every update).

Correctness of the comparison: the last pipelab GPipe / 1F1B run and the last torch run of the same kind
start from the same weights and see the same data, so their final weights must agree (to float32
rounding); the script prints the largest difference.

Allocator: on CPU the runtime allocates parameter-sized buffers per job (each backward's weight
gradients, each update's weight snapshot), and with glibc's default malloc tuning freed memory goes back
to the OS, so these buffers page-fault again every time; that costs pipelab's flushed rows ~10% on a
small CPU box. The report's header names any ``MALLOC_*`` variables set, since they change the numbers
(e.g. ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296`` keeps freed memory).

Targets (issue 7): pipelab's flushed schedules within 10% of the torch equivalents (time ratio ≤ 1.10);
async 1F1B ≥ 1.2× GPipe's throughput at M = D.

Usage:
    .venv/bin/python benchmarks/runtime.py [--ranks 2] [--width 1024] [--depth 8] [--batch 128]
        [--microbatches D] [--steps 20] [--warmup 4] [--repeats 5] [--backend gloo|nccl] [--json PATH]

``--backend nccl`` puts rank r on ``cuda:r`` (one GPU per rank, e.g. ``--ranks 4`` on a 4-GPU machine).
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
import torch.distributed as dist
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/runtime.py` finds the harness

from benchmarks._harness import Ratio, header, load_average, paired_ratio  # noqa: E402
from pipelab.distributed import spawn  # noqa: E402
from pipelab.optim import optimizer_factory  # noqa: E402
from pipelab.partition import split  # noqa: E402
from pipelab.profiling import profile_stage, transfer_times  # noqa: E402
from pipelab.runtime import PipelineRuntime  # noqa: E402
from pipelab.schedules import gpipe, one_f_one_b, pipedream  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.studies.models import deep_mlp  # noqa: E402

__all__ = ["RunSetting", "BenchConfig", "Row", "Result", "rows_of", "run_benchmark", "format_report", "main",
           "measured_window", "simulated_window", "add_model_and_run_arguments", "timed_pipelab_run", "report_header",
           "load_line"]


@dataclass(frozen=True)
class RunSetting:
    """What both runtime benchmarks depend on (:class:`BenchConfig` here, ``ZBConfig`` in zero_bubble.py).

    Attributes:
        ranks: processes; width, depth, in_features: the ``deep_mlp`` (at least one block per stage); batch:
        samples per flushed mini-batch (M micro-batches of batch / M); microbatches: M (None: ``chunks`` ×
        ranks); steps: n, mini-batches in the timed window; warmup: w, mini-batches before it; repeats: runs per
        row; backend: ``gloo`` (CPU) or ``nccl`` (GPU r for rank r); optimizer: ``sgdm`` or ``adam``;
        profile_reps: repeats of each profiled job; seed: model and data seed; timeout_s: bound on the spawn.
    """

    #: stages a rank computes in the benchmark's deepest schedule (its depth needs a block per stage)
    chunks: ClassVar[int] = 1

    ranks: int = 2
    width: int = 1024
    depth: int = 8
    in_features: int = 784
    batch: int = 128
    microbatches: int | None = None
    steps: int = 20
    warmup: int = 4
    repeats: int = 5
    backend: str = "gloo"
    optimizer: str = "sgdm"
    profile_reps: int = 20
    seed: int = 0
    timeout_s: float = 900.0

    @property
    def M(self) -> int:
        """Micro-batches per flushed mini-batch (default: one per stage, ``chunks`` × ranks)."""
        return self.chunks * self.ranks if self.microbatches is None else self.microbatches

    @property
    def micro(self) -> int:
        """Samples per micro-batch."""
        return self.batch // self.M

    def check(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        if self.ranks < 2:
            raise ValueError(f"ranks must be >= 2 (a pipeline of one rank has nothing to compare), got {self.ranks}")
        if self.M < 1 or self.batch % self.M:
            raise ValueError(f"batch ({self.batch}) must be a positive multiple of microbatches ({self.M})")
        if self.depth < self.chunks * self.ranks:
            raise ValueError(f"depth ({self.depth}) must be at least {self.chunks} × ranks "
                             f"({self.chunks * self.ranks}): one block per stage")
        if self.steps < 1 or self.warmup < 1 or self.repeats < 1:
            raise ValueError(f"steps, warmup and repeats must be >= 1, got {self.steps}, {self.warmup}, "
                             f"{self.repeats}")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if self.optimizer not in ("sgdm", "adam"):
            raise ValueError(f"optimizer must be 'sgdm' or 'adam', got {self.optimizer!r}")


@dataclass(frozen=True)
class BenchConfig(RunSetting):
    """Everything one benchmark run depends on: :class:`RunSetting` (ranks = pipeline stages D, M = D by
    default) and pipeoptim: include the PipeOptim row."""

    pipeoptim: bool = True


@dataclass(frozen=True)
class Row:
    """One timed configuration: ``impl`` is ``torch`` or ``pipelab``; ``kind`` names the schedule.

    ``scale`` is the number of this row's mini-batches that hold one flushed mini-batch's samples.
    """

    name: str
    impl: str
    kind: str  # gpipe | 1f1b | pipedream
    policy: str | None
    M: int
    scale: int = 1

    def schedule(self, D: int, steps: int) -> Any:
        """This row's schedule over ``steps`` mini-batches (torch rows: pipelab's schedule of the same order)."""
        if self.kind == "gpipe":
            return gpipe(D, self.M, steps)
        if self.kind == "1f1b":
            return one_f_one_b(D, self.M, steps)
        return pipedream(D, self.M, steps)

    def window(self, cfg: BenchConfig) -> tuple[int, int, int]:
        """(first timed mini-batch w, mini-batches in the window n, mini-batches in a run)."""
        w, n = cfg.warmup * self.scale, cfg.steps * self.scale
        return w, n, w + n + 1


def rows_of(cfg: BenchConfig) -> list[Row]:
    """The rows the benchmark runs, in the order they run within a repeat."""
    M = cfg.M
    rows = [Row("torch GPipe", "torch", "gpipe", None, M), Row("pipelab GPipe", "pipelab", "gpipe", "gpipe", M),
            Row("torch 1F1B", "torch", "1f1b", None, M), Row("pipelab 1F1B", "pipelab", "1f1b", "1f1b", M),
            Row("async stashing M=1", "pipelab", "pipedream", "stashing", 1, M)]
    if cfg.pipeoptim:
        rows.append(Row("async pipeoptim M=1", "pipelab", "pipedream", "pipeoptim", 1, M))
    if M > 1:
        rows.append(Row(f"async stashing M={M}", "pipelab", "pipedream", "stashing", M))
    return rows


# ------------------------------------------------------------------------------------------- on each rank


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _make_optimizer(name: str) -> Callable[[Any], torch.optim.Optimizer]:
    """The registry's optimizer ``name`` with this benchmark's setting: Adam at lr 1e-4 (SGDM: the defaults)."""
    return optimizer_factory(name, **({"lr": 1e-4} if name == "adam" else {}))


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    _sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    dist.barrier()
    return time.perf_counter() - t0, out


def _profile(rank: int, world: int, cfg: BenchConfig, base: nn.Sequential, x: Tensor, y: Tensor,
             device: torch.device) -> dict[str, Any]:
    """Forward, backward, optimizer step of this rank's stage for one micro-batch; transfer to the next rank.

    The measurements are :func:`pipelab.profiling.profile_stage` (this rank's stage, from its input: stages
    0..rank−1 run first, untimed) and :func:`pipelab.profiling.transfer_times` (ping-pong / 2 per boundary).
    """
    stages = [s.to(device) for s in split(copy.deepcopy(base), world)]
    last = rank == world - 1
    with torch.no_grad():
        h = x
        for s in stages[:rank]:
            h = s(h)
        out = None if last else stages[rank](h)
    c = profile_stage(stages[rank], h, y if last else None, optimizer=_make_optimizer(cfg.optimizer),
                      reps=cfg.profile_reps, warmup=3, input_grad=rank > 0)
    transfer = transfer_times(out, h if rank > 0 else None, reps=cfg.profile_reps, warmup=3)
    return {"f": c.f, "b": c.b, "u": c.u, "copy": c.copy, "transfer": transfer}


def _torch_run(row: Row, rank: int, world: int, base: nn.Sequential, data: list[tuple[Tensor, Tensor]],
               steps: int, cfg: BenchConfig, device: torch.device) -> tuple[float, list[float], tuple[Tensor, ...]]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage_mod = split(copy.deepcopy(base), world)[rank].to(device)
    stage = PipelineStage(stage_mod, rank, world, device)
    cls = ScheduleGPipe if row.kind == "gpipe" else Schedule1F1B
    sched = cls(stage, n_microbatches=row.M, loss_fn=nn.functional.cross_entropy)
    opt = _make_optimizer(cfg.optimizer)(list(stage_mod.parameters()))
    first, last = rank == 0, rank == world - 1
    entries: list[float] = []

    def go() -> None:
        for t in range(steps):
            x, y = data[t % len(data)]
            _sync(device)  # on CUDA: when the device, not the host, gets there
            entries.append(time.perf_counter())  # mini-batch t enters this rank's stage
            opt.zero_grad()
            if first:
                sched.step(x)
            elif last:
                sched.step(target=y)
            else:
                sched.step()
            opt.step()

    seconds, _ = _timed(go, device)
    return seconds, entries, tuple(p.detach().cpu().clone() for p in stage_mod.parameters())


def timed_pipelab_run(base: nn.Sequential, schedule: Any, policy: str, optimizer: str,
                      data: list[tuple[Tensor, Tensor]], steps: int, device: torch.device
                      ) -> tuple[float, list[float], Any]:
    """One timed :class:`PipelineRuntime` run on this rank: (barrier-to-barrier seconds, the moment each
    mini-batch t entered this rank's first stage, the run's result)."""
    rt = PipelineRuntime(copy.deepcopy(base), schedule=schedule, policy=policy, optimizer=_make_optimizer(optimizer),
                         device=device)
    entries: dict[int, float] = {}

    def get(t: int) -> tuple[Tensor, Tensor]:
        if t not in entries:  # the runtime asks for mini-batch t at its first forward on this rank
            _sync(device)
            entries[t] = time.perf_counter()
        return data[t % len(data)]

    seconds, res = _timed(lambda: rt.run(get), device)
    return seconds, [entries.get(t, float("nan")) for t in range(steps)], res


def _pipelab_run(row: Row, rank: int, world: int, base: nn.Sequential, data: list[tuple[Tensor, Tensor]],
                 steps: int, cfg: BenchConfig, device: torch.device) -> tuple[float, list[float], tuple[Tensor, ...]]:
    assert row.policy is not None  # pipelab rows name their policy
    seconds, entries, res = timed_pipelab_run(base, row.schedule(world, steps), row.policy, cfg.optimizer, data,
                                              steps, device)
    return seconds, entries, res.weights[rank]


def _rank_main(rank: int, world: int, cfg: BenchConfig) -> dict[str, Any]:
    """Profile this rank's stage, then run every row ``repeats`` times (rows interleaved within a repeat)."""
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.backend == "nccl" else torch.device("cpu")
    torch.manual_seed(cfg.seed)
    base = deep_mlp(in_features=cfg.in_features, width=cfg.width, depth=cfg.depth)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    pool = 4

    def batch(n: int) -> tuple[Tensor, Tensor]:
        return (torch.randn(n, cfg.in_features, generator=g).to(device),
                torch.randint(0, 10, (n,), generator=g).to(device))

    # the same samples in both granularities: mini-batch i = micro-batches i·M .. i·M + M − 1
    full = [batch(cfg.batch) for _ in range(pool)]
    micro_data = [(x[j * cfg.micro:(j + 1) * cfg.micro], y[j * cfg.micro:(j + 1) * cfg.micro])
                  for x, y in full for j in range(cfg.M)]
    prof = _profile(rank, world, cfg, base, *micro_data[0], device)
    rows = rows_of(cfg)
    runs: dict[str, list[dict[str, Any]]] = {r.name: [] for r in rows}
    weights: dict[str, tuple[Tensor, ...]] = {}
    loads = []
    for _ in range(cfg.repeats):
        for row in rows:
            data = micro_data if row.M == 1 and cfg.M > 1 else full
            fn = _torch_run if row.impl == "torch" else _pipelab_run
            seconds, entries, w = fn(row, rank, world, base, data, row.window(cfg)[2], cfg, device)
            runs[row.name].append({"seconds": seconds, "entries": [e - entries[0] for e in entries]})
            weights[row.name] = w
        loads.append(load_average())  # at the end of each repeat: the load its rows ran under
    diffs = {}
    for kind in ("GPipe", "1F1B"):
        a, b = weights[f"pipelab {kind}"], weights[f"torch {kind}"]
        diffs[kind] = max(float((p - q).abs().max()) for p, q in zip(a, b))
    return {"rank": rank, "profile": prof, "runs": runs, "weight_diff": diffs, "loads": loads}


# ------------------------------------------------------------------------------------------- driver


@dataclass
class Result:
    """What :func:`run_benchmark` returns.

    Attributes:
        config: the :class:`BenchConfig`; rows: one record per row (times in seconds, per repeat and
            median, the simulator's predictions); ratios: name → :class:`~benchmarks._harness.Ratio` over the
            repeats (median, IQR, load); simulated: name → the simulator's ratio;
        profile: per-stage ``f``, ``b``, ``u``, ``copy`` (clone of the stage's weights) and per-boundary
            ``transfer`` seconds; weight_diff: max |W_pipelab − W_torch| for GPipe and 1F1B; wall_s: the spawn;
            loads: rank 0's load average at the end of each repeat.
    """

    config: BenchConfig
    rows: list[dict[str, Any]]
    ratios: dict[str, Ratio]
    simulated: dict[str, float]
    profile: dict[str, list[float]]
    weight_diff: dict[str, float]
    wall_s: float
    loads: list[float]


def measured_window(per_rank: list[dict[str, Any]], name: str, w: int, n: int, repeats: int
                    ) -> tuple[list[float], list[float]]:
    """Per repeat of row ``name``: the time per mini-batch, (entry(w + n) − entry(w)) / n from stage 0's intake
    times, and the barrier-to-barrier run time (max over ranks: they differ only by the barrier's exit skew)."""
    t_mb = [(run["entries"][w + n] - run["entries"][w]) / n for run in per_rank[0]["runs"][name]]
    t_run = [max(p["runs"][name][i]["seconds"] for p in per_rank) for i in range(repeats)]
    return t_mb, t_run


def simulated_window(sim: Any, w: int, n: int) -> float:
    """The simulator's time per mini-batch over the same window: spacing of F(0, t, 0) from t = w to w + n."""
    return (sim.time_of("F", 0, w + n, 0)[0] - sim.time_of("F", 0, w, 0)[0]) / n


def run_benchmark(cfg: BenchConfig) -> Result:
    """Spawn ``cfg.ranks`` processes, time every row, simulate it, and compute the ratios."""
    cfg.check()
    t0 = time.perf_counter()
    per_rank = spawn(_rank_main, cfg.ranks, (cfg,), backend=cfg.backend, timeout_s=cfg.timeout_s,
                     comm_timeout_s=300.0)
    wall = time.perf_counter() - t0
    D = cfg.ranks
    prof = {key: [per_rank[r]["profile"][key] for r in range(D)] for key in ("f", "b", "u", "copy")}
    prof["transfer"] = [per_rank[k]["profile"]["transfer"][k] for k in range(D - 1)]
    costs = dict(f_cost=prof["f"], b_cost=prof["b"], u_cost=prof["u"], transfer_cost=prof["transfer"])
    records = []
    for row in rows_of(cfg):
        w, n, total = row.window(cfg)
        t_mb, t_run = measured_window(per_rank, row.name, w, n, cfg.repeats)
        sim = simulate(row.schedule(D, total), **costs)
        sim_mb = simulated_window(sim, w, n)
        samples = row.M * cfg.micro
        mb = statistics.median(t_mb)
        records.append({
            "name": row.name, "impl": row.impl, "kind": row.kind, "policy": row.policy, "M": row.M,
            "mini_batches": total, "window": (w, n), "samples_per_mb": samples,
            "mb_s_all": t_mb, "mb_s": mb, "throughput": samples / mb, "run_s_all": t_run,
            "run_s": statistics.median(t_run), "sim_mb_s": sim_mb, "sim_run_s": sim.makespan,
            "sim_mb_error": sim_mb / mb - 1.0, "sim_run_error": sim.makespan / statistics.median(t_run) - 1.0,
        })
    by = {r["name"]: r for r in records}
    loads = per_rank[0]["loads"]

    def paired(num: str, den: str, throughput: bool) -> Ratio:
        a, b = by[num], by[den]
        if throughput:  # (samples_a / t_a) / (samples_b / t_b)
            return paired_ratio(b["mb_s_all"], a["mb_s_all"], loads, a["samples_per_mb"] / b["samples_per_mb"])
        return paired_ratio(a["mb_s_all"], b["mb_s_all"], loads)

    M = cfg.M
    ratios = {"pipelab/torch GPipe, time per mini-batch": paired("pipelab GPipe", "torch GPipe", False),
              "pipelab/torch 1F1B, time per mini-batch": paired("pipelab 1F1B", "torch 1F1B", False),
              f"async stashing M=1 / pipelab GPipe M={M}, samples/s":
                  paired("async stashing M=1", "pipelab GPipe", True),
              f"async stashing M=1 / torch GPipe M={M}, samples/s": paired("async stashing M=1", "torch GPipe", True)}
    if cfg.pipeoptim:
        ratios[f"async pipeoptim M=1 / pipelab GPipe M={M}, samples/s"] = paired("async pipeoptim M=1",
                                                                                 "pipelab GPipe", True)
    if M > 1:
        ratios[f"async stashing M={M} / pipelab GPipe M={M}, samples/s"] = paired(f"async stashing M={M}",
                                                                                  "pipelab GPipe", True)
    sim_ratio = (by["pipelab GPipe"]["sim_mb_s"] / by["pipelab GPipe"]["samples_per_mb"]) / (
        by["async stashing M=1"]["sim_mb_s"] / by["async stashing M=1"]["samples_per_mb"])
    diff = {k: max(per_rank[r]["weight_diff"][k] for r in range(D)) for k in ("GPipe", "1F1B")}
    return Result(cfg, records, ratios, {"simulated async M=1 / GPipe, samples/s": sim_ratio}, prof, diff, wall,
                  loads)


def report_header(title: str, cfg: RunSetting, wall_s: float) -> str:
    """The harness's header for a spawned benchmark: ranks × 1 intra-op thread (:func:`pipelab.distributed.spawn`),
    backend, the spawn's seconds."""
    return header(title, threads=f"{cfg.ranks} ranks × 1 intra-op thread") + (
        f"; backend {cfg.backend}, spawn {wall_s:.0f} s")


def load_line(loads: list[float]) -> str:
    """Rank 0's load average at the end of the repeats: median [min–max]."""
    return f"load average at the end of each repeat: median {statistics.median(loads):.1f} " \
           f"[{min(loads):.1f}–{max(loads):.1f}]"


def format_report(res: Result) -> str:
    """The configuration, the table, the ratios against the issue's targets, and the simulator's errors."""
    cfg = res.config
    D, M = cfg.ranks, cfg.M
    P = res.profile
    lines = [
        report_header("pipelab runtime benchmark", cfg, res.wall_s),
        f"model deep_mlp(in={cfg.in_features}, width={cfg.width}, depth={cfg.depth}) float32, {cfg.optimizer}, "
        f"{D} stages; flushed mini-batch {cfg.batch} = M={M} × micro-batch {cfg.micro}",
        f"time per mini-batch = stage 0's intake period over {cfg.steps} flushed mini-batches after {cfg.warmup} "
        f"(async M=1: ×{M}), median of {cfg.repeats} repeats [min–max]; {load_line(res.loads)}",
        "profile (ms per micro-batch): " + "; ".join(
            f"stage {k} F {1e3 * P['f'][k]:.2f} B {1e3 * P['b'][k]:.2f} U {1e3 * P['u'][k]:.2f} "
            f"snapshot (clone) {1e3 * P['copy'][k]:.2f}" for k in range(D))
        + "; transfer " + ", ".join(f"{1e3 * t:.2f}" for t in P["transfer"]),
        "",
        f"{'row':<21} {'samples':>7} {'ms/mini-batch [min–max]':>25} {'samples/s':>9} {'sim ms':>7} {'err':>6} "
        f"{'run s':>6} {'sim s':>6} {'err':>6}",
    ]
    for r in res.rows:
        spread = f"{1e3 * r['mb_s']:.1f} [{1e3 * min(r['mb_s_all']):.1f}–{1e3 * max(r['mb_s_all']):.1f}]"
        lines.append(f"{r['name']:<21} {r['samples_per_mb']:>7d} {spread:>25} {r['throughput']:>9.0f} "
                     f"{1e3 * r['sim_mb_s']:>7.1f} {100 * r['sim_mb_error']:>+5.0f}% {r['run_s']:>6.2f} "
                     f"{r['sim_run_s']:>6.2f} {100 * r['sim_run_error']:>+5.0f}%")
    lines += ["", "ratios, median [IQR] of the per-repeat ratios, load average (target):"]
    targets = {"pipelab/torch GPipe, time per mini-batch": ("≤ 1.10", lambda v: v <= 1.10),
               "pipelab/torch 1F1B, time per mini-batch": ("≤ 1.10", lambda v: v <= 1.10),
               f"async stashing M=1 / pipelab GPipe M={M}, samples/s": ("≥ 1.2", lambda v: v >= 1.2)}
    for key, r in res.ratios.items():
        tgt = ""
        if key in targets:
            text, ok = targets[key]
            tgt = f"  ({text}: {'met' if ok(r.median) else 'MISSED'})"
        lines.append(f"  {key:<50} {r.median:6.3f} [{r.q1:.3f}–{r.q3:.3f}] load {r.load:.1f}{tgt}")
    lines += [f"  {key:<50} {v:6.3f}" for key, v in res.simulated.items()]
    flushed = [abs(r["sim_mb_error"]) for r in res.rows if r["impl"] == "torch"]
    ours = [abs(r["sim_mb_error"]) for r in res.rows if r["impl"] == "pipelab"]
    lines += [
        f"simulator |error| per mini-batch: torch rows max {100 * max(flushed):.0f}%, pipelab rows max "
        f"{100 * max(ours):.0f}%",
        f"same computation: max |W_pipelab − W_torch| after the last run: GPipe {res.weight_diff['GPipe']:.1e}, "
        f"1F1B {res.weight_diff['1F1B']:.1e}",
        f"async vs GPipe: micro-batches of {cfg.micro} samples in both; one GPipe mini-batch of M={M} micro-batches "
        f"is compared with {M} async mini-batches of one micro-batch (one update each), by samples/s.",
    ]
    return "\n".join(lines)


def add_model_and_run_arguments(ap: argparse.ArgumentParser, d: Any) -> None:
    """The command-line options both runtime benchmarks share, with defaults from config ``d``: the deep_mlp
    (width, depth, input size), repeats, backend, optimizer, time bound and JSON output."""
    ap.add_argument("--width", type=int, default=d.width)
    ap.add_argument("--depth", type=int, default=d.depth)
    ap.add_argument("--in-features", type=int, default=d.in_features)
    ap.add_argument("--repeats", type=int, default=d.repeats)
    ap.add_argument("--backend", choices=["gloo", "nccl"], default=d.backend)
    ap.add_argument("--optimizer", choices=["sgdm", "adam"], default=d.optimizer)
    ap.add_argument("--timeout", type=float, default=d.timeout_s, help="bound on the whole run, seconds")
    ap.add_argument("--json", default=None, help="also write the records to this file")


def main(argv: list[str] | None = None) -> Result:
    """Parse the command line, run the benchmark, print the report (and write JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = BenchConfig()
    ap.add_argument("--ranks", type=int, default=d.ranks, help="processes = pipeline stages")
    ap.add_argument("--batch", type=int, default=d.batch, help="samples per flushed mini-batch")
    ap.add_argument("--microbatches", type=int, default=None, help="M per flushed mini-batch (default: ranks)")
    ap.add_argument("--steps", type=int, default=d.steps, help="flushed mini-batches in the timed window")
    ap.add_argument("--warmup", type=int, default=d.warmup, help="flushed mini-batches before the window")
    ap.add_argument("--no-pipeoptim", action="store_true", help="skip the PipeOptim row")
    add_model_and_run_arguments(ap, d)
    args = ap.parse_args(argv)
    cfg = BenchConfig(ranks=args.ranks, width=args.width, depth=args.depth, in_features=args.in_features,
                      batch=args.batch, microbatches=args.microbatches, steps=args.steps, warmup=args.warmup,
                      repeats=args.repeats, backend=args.backend, optimizer=args.optimizer,
                      pipeoptim=not args.no_pipeoptim, timeout_s=args.timeout)
    res = run_benchmark(cfg)
    print(format_report(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": asdict(cfg), "rows": res.rows, "ratios": {k: asdict(v) for k, v in res.ratios.items()},
                       "simulated": res.simulated, "profile": res.profile, "weight_diff": res.weight_diff,
                       "wall_s": res.wall_s, "loads": res.loads}, fh, indent=1)
    return res


if __name__ == "__main__":
    main()
