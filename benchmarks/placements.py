"""Throughput of Rahimi's placements on pipelab's runtime — DDP, FSDP, GPipe, 1F1B, LPP, FSLPP, hybrid PP × DP —
against torch's
``DistributedDataParallel`` and ``fully_shard`` (FSDP2), with the simulator's forecast error per schedule.

What runs: for each ``--ranks`` value W, one :func:`pipelab.distributed.spawn` of W processes (gloo, 1 thread
each; start-up never timed). Every rank builds the same ``deep_mlp`` from the same seed and runs
:func:`pipelab.studies.calibration.calibrate_rank`: it profiles every stage (F, B, U) and the transfer between
ranks, then, ``--repeats`` times, runs each pipelab row with the runtime's trace and, at the end of the same
repeat, the torch rows — so that pipelab's and torch's figures come from one run, interleaved:

=====================  =============================================================================
row                    what (same model, micro-batches of b samples, M per step, ``--steps`` steps)
=====================  =============================================================================
``DDP``                :func:`~pipelab.schedules.ddp` (D = 2W stages, M, W): M/W micro-batches per rank
``DDP, one stage``      :func:`~pipelab.schedules.ddp` with D = 1: the model uncut, as torch's DDP runs it
                       (the gap between the two DDP rows is pipelab's per-stage-job overhead)
``FSDP``               :func:`~pipelab.schedules.fsdp`: DDP's compute, stage s's weights on rank s mod W
``GPipe``, ``1F1B``    :func:`~pipelab.schedules.gpipe`, :func:`~pipelab.schedules.one_f_one_b` (D = W)
``LPP``, ``FSLPP``     :func:`~pipelab.schedules.lpp` / :func:`~pipelab.schedules.fslpp` (D = 2W, G = 2
                       groups of R = W/2; on 2 ranks R = 1: each group one worker holding (LPP) or
                       fetching (FSLPP) every stage)
``Hybrid``             :func:`~pipelab.schedules.hybrid`: D = W/2 stages × 2 replicas (1F1B per replica,
                       gradients all-reduced between the replicas of a stage)
``torch DDP``          ``DistributedDataParallel``: M/W micro-batches per rank, gradients accumulated
                       under ``no_sync`` but the last, then ``optimizer.step``
``torch FSDP2``        ``fully_shard`` on every block and the model, the same micro-batches, then
                       ``optimizer.step``
=====================  =============================================================================

Timing: a run's makespan is the time from t0 (every rank, right after a barrier; one host clock) to the
last rank's last job; throughput = samples per run / makespan, the median over repeats. The simulator's
forecast (:func:`pipelab.simulator.simulate` with the profiled costs) is printed against it with its
error (forecast / measured − 1) and the *replay* error (the simulation with the run's own mean job
times). The simulator has no cost for collectives (all-reduce, reduce, broadcast) of its own: a placement's
forecast charges each stage's update with its collectives profiled on the ranks before the runs, the replay
with the measured ones, and the report prints each row's measured collective share of the run beside its
error. A row the runtime refuses says "not runnable" with the runtime's reason; its ratio to
torch is then not measured.

On a small shared CPU box (more ranks than cores, other processes running) the numbers are dominated by
the operating system's scheduling: medians of repeats, and the machine's load is printed. Each ratio to torch is
the median of the per-repeat ratios (torch's rows run at the end of the same repeat as pipelab's), with its
interquartile range and the median of rank 0's load average at the end of each repeat
(:func:`benchmarks._harness.paired_ratio`).

Usage:
    .venv/bin/python benchmarks/placements.py [--ranks 2 4] [--width 512] [--depth 8] [--micro 32]
        [--steps 4] [--repeats 3] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/placements.py` finds the harness

from benchmarks._harness import Ratio, header, load_average, paired_ratio  # noqa: E402
from pipelab.distributed import spawn  # noqa: E402
from pipelab.optim import optimizer_factory  # noqa: E402
from pipelab.studies.calibration import (  # noqa: E402
    CalibrationCase,
    CalibrationConfig,
    CalibrationRow,
    calibrate_rank,
    calibration_rows,
)
from pipelab.studies.models import deep_mlp  # noqa: E402

__all__ = ["PlacementConfig", "PIPELAB_ROWS", "TORCH_ROWS", "run_benchmark", "format_report", "main",
           "torch_ddp_run", "torch_fsdp_run"]

#: the pipelab rows: (label, kind of :data:`pipelab.studies.settings.CALIBRATION_KINDS`)
PIPELAB_ROWS = (("DDP", "ddp"), ("DDP, one stage", "ddp_whole"), ("FSDP", "fsdp"), ("GPipe", "gpipe"),
                ("1F1B", "1f1b"), ("LPP", "lpp"),
                ("FSLPP", "fslpp"), ("Hybrid", "hybrid"))
#: torch's rows and the pipelab row each is compared with
TORCH_ROWS = (("torch DDP", "DDP"), ("torch DDP", "DDP, one stage"), ("torch FSDP2", "FSDP"))


@dataclass(frozen=True)
class PlacementConfig:
    """ranks: the world sizes to run; the model (``deep_mlp`` float32), micro-batch, steps and repeats as in
    :class:`~pipelab.studies.calibration.CalibrationConfig` (M = 2·ranks micro-batches per step)."""

    ranks: tuple[int, ...] = (2, 4)
    width: int = 512
    depth: int = 8
    in_features: int = 64
    micro: int = 32
    steps: int = 4
    repeats: int = 3
    profile_reps: int = 10
    optimizer: str = "sgdm"
    seed: int = 0
    torch_rows: bool = True
    timeout_s: float = 900.0
    kinds: tuple[tuple[str, str], ...] = field(default=PIPELAB_ROWS)

    def calibration(self, ranks: int) -> CalibrationConfig:
        return CalibrationConfig(ranks=ranks, cases=tuple(CalibrationCase(k, label=n) for n, k in self.kinds),
                                 width=self.width, depth=self.depth, in_features=self.in_features, micro=self.micro,
                                 steps=self.steps, repeats=self.repeats, profile_reps=self.profile_reps,
                                 optimizer=self.optimizer, seed=self.seed, timeout_s=self.timeout_s)


# ------------------------------------------------------------------------------------------- torch rows


def _micro_batches(cfg: CalibrationConfig, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batches of one step: M/W of the step's M, as pipelab's DDP hands them out."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    n = cfg.M * cfg.micro
    x, y = torch.randn(n, cfg.in_features, generator=g), torch.randint(0, 10, (n,), generator=g)
    return [(x[j * cfg.micro:(j + 1) * cfg.micro], y[j * cfg.micro:(j + 1) * cfg.micro])
            for j in range(cfg.M) if j % world == rank]


def _timed_steps(model: nn.Module, opt: torch.optim.Optimizer, micro: list[tuple[torch.Tensor, torch.Tensor]],
                 steps: int, last_syncs: Any) -> tuple[float, float]:
    """(t0, end) on the host clock: ``steps`` steps of gradient accumulation over ``micro``, t0 after a barrier."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        for i, (x, y) in enumerate(micro):
            with last_syncs(i == len(micro) - 1):
                loss = nn.functional.cross_entropy(model(x), y) / len(micro)
                loss.backward()
        opt.step()
    return t0, time.perf_counter()


def torch_ddp_run(cfg: CalibrationConfig, rank: int, world: int) -> tuple[float, float]:
    """One timed run of ``DistributedDataParallel`` on this rank's micro-batches (``no_sync`` but the last)."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(cfg.seed)
    model = DistributedDataParallel(deep_mlp(in_features=cfg.in_features, width=cfg.width, depth=cfg.depth))
    opt = optimizer_factory(cfg.optimizer)(model.parameters())
    return _timed_steps(model, opt, _micro_batches(cfg, rank, world), cfg.steps,
                        lambda sync: contextlib.nullcontext() if sync else model.no_sync())


def torch_fsdp_run(cfg: CalibrationConfig, rank: int, world: int) -> tuple[float, float]:
    """One timed run of FSDP2 (``fully_shard`` on every block, then the model) on the same micro-batches
    (gradient synchronisation only after the last micro-batch of a step)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(cfg.seed)
    model = deep_mlp(in_features=cfg.in_features, width=cfg.width, depth=cfg.depth)
    mesh = init_device_mesh("cpu", (world,))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = optimizer_factory(cfg.optimizer)(model.parameters())

    class _Sync:
        def __init__(self, sync: bool) -> None:
            self.sync = sync

        def __enter__(self) -> None:
            model.set_requires_gradient_sync(self.sync)  # type: ignore[operator]

        def __exit__(self, *exc: object) -> None:
            return None

    return _timed_steps(model, opt, _micro_batches(cfg, rank, world), cfg.steps, _Sync)


def _rank_main(rank: int, world: int, cfg: CalibrationConfig, torch_rows: bool) -> dict[str, Any]:
    def extra(rep: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, fn in (("torch DDP", torch_ddp_run), ("torch FSDP2", torch_fsdp_run)):
            if not torch_rows:
                continue
            try:
                out[name] = fn(cfg, rank, world)
            except Exception as exc:  # torch lacks this path on the backend: reported, not fatal
                out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return {"torch": out, "load": load_average()}  # the load at the end of the repeat

    return calibrate_rank(rank, world, cfg, extra)


# ------------------------------------------------------------------------------------------- driver


@dataclass
class Result:
    """Per world size: the pipelab rows (:class:`~pipelab.studies.calibration.CalibrationRow`), the torch rows
    (name → every repeat's makespan in seconds, or the reason it did not run), the ratios
    (:class:`~benchmarks._harness.Ratio`, or why not measured), rank 0's load average at the end of each repeat,
    and the spawn's seconds."""

    config: PlacementConfig
    rows: dict[int, list[CalibrationRow]]
    torch: dict[int, dict[str, list[float] | str]]
    ratios: dict[int, dict[str, Ratio | str]]
    loads: dict[int, list[float]]
    wall_s: dict[int, float]


def _torch_spans(per_rank: list[dict[str, Any]], repeats: int) -> dict[str, list[float] | str]:
    """Per torch row, every repeat's makespan (seconds), or the reason it did not run."""
    out: dict[str, list[float] | str] = {}
    names = per_rank[0]["extra"][0]["torch"].keys() if per_rank[0]["extra"] else []
    for name in names:
        first = per_rank[0]["extra"][0]["torch"][name]
        if isinstance(first, str):
            out[name] = first
            continue
        spans = []
        for rep in range(repeats):
            t0 = min(p["extra"][rep]["torch"][name][0] for p in per_rank)  # one host clock: the earliest barrier exit
            spans.append(max(p["extra"][rep]["torch"][name][1] for p in per_rank) - t0)
        out[name] = spans
    return out


def run_benchmark(cfg: PlacementConfig) -> Result:
    """Spawn each world size, run every row, forecast it, and compute pipelab / torch throughput ratios."""
    rows, torch_rows, ratios, loads, wall = {}, {}, {}, {}, {}
    for W in cfg.ranks:
        ccfg = cfg.calibration(W)
        ccfg.check()
        t0 = time.perf_counter()
        per_rank = spawn(_rank_main, W, (ccfg, cfg.torch_rows), timeout_s=cfg.timeout_s, comm_timeout_s=120.0)
        wall[W] = time.perf_counter() - t0
        rows[W] = calibration_rows(per_rank, ccfg)
        torch_rows[W] = _torch_spans(per_rank, ccfg.repeats)
        loads[W] = [e["load"] for e in per_rank[0]["extra"]]
        by = {r.label: r for r in rows[W]}
        ratios[W] = {}
        for tname, pname in TORCH_ROWS:
            ref, ours = torch_rows[W].get(tname), by.get(pname)
            key = f"pipelab {pname} / {tname}, samples/s"
            if ours is None or ref is None:
                continue
            if not ours.runnable:
                ratios[W][key] = f"not measured: pipelab {pname} not runnable yet"
            elif isinstance(ref, str):
                ratios[W][key] = f"not measured: {tname} failed ({ref})"
            else:  # same samples: throughput ratio = time ratio inverted
                ratios[W][key] = paired_ratio(ref, ours.measured_all, loads[W])
    return Result(cfg, rows, torch_rows, ratios, loads, wall)


def format_report(res: Result) -> str:
    """The configuration, per world size a table of every row, the ratios against torch, and the errors."""
    cfg = res.config
    lines = [header("pipelab placements benchmark", threads="gloo, 1 intra-op thread per rank"),
             f"model deep_mlp(in={cfg.in_features}, width={cfg.width}, depth={cfg.depth}) float32, {cfg.optimizer}; "
             f"micro-batch {cfg.micro}, M = 2·ranks per step, {cfg.steps} steps; median of {cfg.repeats} repeats"]
    for W in cfg.ranks:
        samples = cfg.steps * 2 * W * cfg.micro
        lines += ["", f"{W} ranks (spawn {res.wall_s[W]:.0f} s), {samples} samples per run; load average at the end "
                      f"of each repeat: {', '.join(f'{v:.1f}' for v in res.loads[W])}:",
                  f"  {'row':<13} {'schedule':<28} {'ms/run':>8} {'samples/s':>9} {'forecast ms':>11} {'error':>7} "
                  f"{'replay':>7} {'coll.':>6}"]
        for r in res.rows[W]:
            if not r.runnable:
                lines.append(f"  {r.label:<13} {r.schedule:<28} not runnable: {r.note[:90]}")
                continue
            lines.append(f"  {r.label:<13} {r.schedule:<28} {1e3 * r.measured_s:>8.1f} {r.throughput:>9.0f} "
                         f"{1e3 * r.forecast_s:>11.1f} {100 * r.error:>+6.1f}% {100 * r.replay_error:>+6.1f}% "
                         f"{100 * r.collective_s / r.measured_s:>5.0f}%")
        for name, v in res.torch[W].items():
            if isinstance(v, str):
                lines.append(f"  {name:<13} {'(torch)':<28} not available: {v[:90]}")
            else:
                t = statistics.median(v)
                lines.append(f"  {name:<13} {'(torch)':<28} {1e3 * t:>8.1f} {samples / t:>9.0f}")
        for key, r in res.ratios[W].items():
            lines.append(f"  ratio {key}: " + (r if isinstance(r, str) else f"{r.median:.3f} [IQR {r.q1:.3f}–"
                                               f"{r.q3:.3f}] load {r.load:.1f} (target ≥ 0.91, within 10%)"))
        lines.append("  coll.: the most time a rank spent in collectives, share of the run (forecast: profiled "
                     "collectives charged to the updates; replay: the measured ones)")
        errs = [abs(r.error) for r in res.rows[W] if r.runnable]
        if errs:
            lines.append(f"  forecast |error|: {sum(e <= 0.10 for e in errs)}/{len(errs)} runnable rows within 10%, "
                         f"max {100 * max(errs):.0f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Result:
    """Parse the command line, run, print the report (and write JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    d = PlacementConfig()
    ap.add_argument("--ranks", type=int, nargs="+", default=list(d.ranks))
    ap.add_argument("--width", type=int, default=d.width)
    ap.add_argument("--depth", type=int, default=d.depth)
    ap.add_argument("--micro", type=int, default=d.micro, help="samples per micro-batch")
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--repeats", type=int, default=d.repeats)
    ap.add_argument("--optimizer", default=d.optimizer)
    ap.add_argument("--no-torch", action="store_true", help="skip torch's DDP and FSDP2 rows")
    ap.add_argument("--quick", action="store_true", help="a short run: width 128, 2 steps, 2 repeats, few profiles")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    a = ap.parse_args(argv)
    cfg = PlacementConfig(ranks=tuple(a.ranks), width=a.width, depth=a.depth, micro=a.micro, steps=a.steps,
                          repeats=a.repeats, optimizer=a.optimizer, torch_rows=not a.no_torch)
    if a.quick:
        cfg = PlacementConfig(ranks=cfg.ranks, width=128, depth=max(a.depth, 2 * max(cfg.ranks)), micro=16, steps=2,
                              repeats=2, profile_reps=3, optimizer=a.optimizer, torch_rows=cfg.torch_rows)
    res = run_benchmark(cfg)
    print(format_report(res))
    if a.json:
        with open(a.json, "w") as fh:
            skip = ("timelines", "sim_schedule")
            ratios = {W: {k: v if isinstance(v, str) else asdict(v) for k, v in rs.items()}
                      for W, rs in res.ratios.items()}
            json.dump({"config": asdict(cfg), "torch": res.torch, "ratios": ratios, "loads": res.loads,
                       "wall_s": res.wall_s,
                       "rows": {W: [{f.name: getattr(r, f.name) for f in fields(r) if f.name not in skip}
                                    for r in rows] for W, rows in res.rows.items()}}, fh, indent=1, default=str)
    return res


if __name__ == "__main__":
    main()
