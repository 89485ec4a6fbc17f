"""Set-up before the first job: building the emulator's plan for millions of jobs, and placed schedules' plans as the
number of workers grows at a fixed number of jobs.

Rows (``--small`` divides every step count by 10, for a quick look):

=========================  ===================================================================================
row                        what is built (``Emulator(stages, schedule=simulated, ...)``, tiny stages)
=========================  ===================================================================================
``sync``                   GPipe, D = 16, M = 64, 1000 steps (2.06 M jobs), policy ``gpipe``
``async``                  PipeDream's asynchronous 1F1B, D = 16, M = 64, 1000 steps, policy ``pipeoptim`` (a
                           prediction per forward: specs, targets and the predictor all set up)
``DDP W=w``, ``FSDP W=w``  D = 8, M = 16, 128 steps (32,768 F/B jobs) on w = 4, 8, 16 workers: every
                           (worker, stage) copy, its events, ring and optimizer, the global sequence
=========================  ===================================================================================

Per row: the simulation (:func:`pipelab.simulator.simulate`, with its version table's execution order; not the
set-up's: the simulator has its own owner) is timed apart in CPU seconds and not counted; **set-up** is the
emulator's construction from the simulation, the median of ``--repeats`` runs, wall-clock and CPU
(``time.process_time``: the goal's measure, robust to other processes on the cores), and **MB** the peak of
Python allocations during one more construction (``tracemalloc``: numpy arrays included, tensors not; the
stages are tiny), with jobs per CPU-second and the 1-minute load average sampled after the row. The first
``torch.optim`` optimizer of a process imports ``torch._dynamo`` (seconds): that is done before any row. Goals
(issue 29): the 2 M-job rows in ≤ 5 CPU-s and ≤ 300 MB; the placed rows' set-up independent of the number of
workers at fixed jobs.

Usage:
    .venv/bin/python benchmarks/setup.py [--repeats 3] [--small] [--rows sync async ddp fsdp] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/setup.py` finds the harness

from benchmarks._harness import add_thread_argument, header, load_average  # noqa: E402
from pipelab.emulator import Emulator  # noqa: E402
from pipelab.schedules import ddp, fsdp, gpipe, pipedream  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402

#: the goals of issue 29 for the 2 M-job rows
GOAL_SECONDS, GOAL_MB = 5.0, 300.0
WORKERS = (4, 8, 16)


@dataclass
class Row:
    """One row: its name, jobs (the version table's execution order), the simulation's CPU seconds, the set-up's
    median wall-clock and CPU seconds over the repeats and peak MB, the load average after the row, and what the
    set-up builds: the entries of its global sequence (placed: every replica's update and the collectives too; else
    the jobs) and the stage copies (one per (worker, stage) computing or holding the stage)."""

    name: str
    jobs: int
    simulate: float
    setup: float
    cpu: float
    mb: float
    load: float
    entries: int
    copies: int

    def __str__(self) -> str:
        return (f"  {self.name:<28} {self.jobs:>9,d} jobs  simulate CPU {self.simulate:6.2f} s | set-up "
                f"{self.setup:6.2f} s (CPU {self.cpu:6.2f} s) {self.mb:7.1f} MB "
                f"{self.jobs / self.cpu / 1e3:6.0f} k jobs/CPU-s | {self.entries:>9,d} entries, "
                f"{self.copies:>3d} stage copies | load {self.load:.1f}")


def cases(small: bool) -> dict[str, list[tuple[str, Callable[[], Any], str]]]:
    """Per row group, ``(name, schedule builder, policy)``."""
    T = 100 if small else 1000
    T_placed = 13 if small else 128
    return {
        "sync": [(f"sync: GPipe D=16 M=64 T={T}", lambda: gpipe(16, 64, T), "gpipe")],
        "async": [(f"async: PipeDream D=16 M=64 T={T}", lambda: pipedream(16, 64, T), "pipeoptim")],
        "ddp": [(f"DDP W={w} D=8 M=16 T={T_placed}", lambda w=w: ddp(8, 16, w, T_placed), "gpipe") for w in WORKERS],
        "fsdp": [(f"FSDP W={w} D=8 M=16 T={T_placed}", lambda w=w: fsdp(8, 16, w, T_placed), "gpipe")
                 for w in WORKERS],
    }


def stages(D: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(4, 4) for _ in range(D)]


def measure(name: str, build: Callable[[], Any], policy: str, repeats: int) -> Row:
    """Simulate once (timed apart), then build the emulator ``repeats`` times (timed) and once under tracemalloc."""
    schedule = build()
    c0 = time.process_time()
    sim = simulate(schedule)
    jobs = len(sim.version_table.order)
    seconds = time.process_time() - c0

    def construct() -> Emulator:
        return Emulator(stages(schedule.D), schedule=sim, policy=policy,
                        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))

    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        emu = construct()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        del emu
    tracemalloc.start()
    emu = construct()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    plan = emu.plan
    entries = len(plan.sequence) or jobs
    return Row(name, jobs, seconds, statistics.median(times), statistics.median(cpu), peak / 2**20, load_average(),
               entries, len(plan.copies) or len(plan.stages))


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a tenth of the steps (a quick look)")
    ap.add_argument("--rows", nargs="+", choices=["sync", "async", "ddp", "fsdp"],
                    default=["sync", "async", "ddp", "fsdp"])
    add_thread_argument(ap)
    args = ap.parse_args(argv)
    rows: list[Row] = []
    with torch_threads(args.threads):
        torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)  # the one-off import of torch._dynamo
        print(header("pipelab set-up benchmark"))
        print(f"set-up: Emulator(...) from a simulated schedule, median of {args.repeats}; MB: tracemalloc peak")
        for group in args.rows:
            for name, build, policy in cases(args.small)[group]:
                rows.append(measure(name, build, policy, args.repeats))
                print(rows[-1], flush=True)
    big = [r for r in rows if r.name.startswith(("sync", "async"))]
    if big and not args.small:
        met = all(r.cpu <= GOAL_SECONDS and r.mb <= GOAL_MB for r in big)
        print(f"2 M-job set-up ≤ {GOAL_SECONDS:g} CPU-s and ≤ {GOAL_MB:g} MB: {'met' if met else 'missed'}")
    for group in ("DDP", "FSDP"):
        placed = [r for r in rows if r.name.startswith(group)]
        if len(placed) > 1:
            a, b = placed[0], placed[-1]
            print(f"{group}: set-up at W={WORKERS[len(placed) - 1]} / W={WORKERS[0]} = {b.cpu / a.cpu:.2f}× (CPU) at "
                  f"the same jobs; what it builds: entries ×{b.entries / a.entries:.2f}, stage copies "
                  f"×{b.copies / a.copies:.2f}")
        if len(placed) > 2:  # CPU = x·entries + y·copies, least squares over the rows
            (x, y), *_ = np.linalg.lstsq(np.array([[r.entries, r.copies] for r in placed], float),
                                         np.array([r.cpu for r in placed]), rcond=None)
            worst = max(abs(x * r.entries + y * r.copies - r.cpu) / r.cpu for r in placed)
            print(f"  fit: {1e6 * x:.2f} µs per entry + {1e3 * y:.2f} ms per stage copy (largest misfit "
                  f"{100 * worst:.0f} %)")
    return rows


if __name__ == "__main__":
    main()
