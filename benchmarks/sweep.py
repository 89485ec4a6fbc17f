"""Throughput of a learning-curve sweep: arms·steps per second, one arm at a time vs stacked seeds and processes.

The same grid (``--policies`` × ``--seeds`` of one task, optimizer and D, one epoch of ``--n-train`` examples) is run
through :func:`pipelab.learning_curves.sweep` with the result cache off, four ways, all in this one run:

- ``one at a time``: every arm alone, in this process (``stack=1, workers=1``) — how sweeps ran before stacking;
- ``processes``: every arm alone, ``--workers`` worker processes;
- ``stacked``: the seeds of each arm as one stacked model (:mod:`pipelab.stacking`), in this process;
- ``stacked + processes``: both.

It prints wall time, arms·steps per second and the ratio to ``one at a time``, and checks that every way computed the
same runs (largest difference of the final test loss; stacking changes float32 rounding only).

Usage:
    .venv/bin/python benchmarks/sweep.py [--task fashion_mnist_mlp] [--policies stashing pipeoptim vanilla 2bw]
        [--seeds 5] [--n-train 10240] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import torch

from pipelab.learning_curves import RunConfig, sweep


@dataclass(frozen=True)
class SweepBench:
    task: str = "fashion_mnist_mlp"
    policies: tuple[str, ...] = ("stashing", "pipeoptim", "vanilla", "2bw")
    optimizer: str = "adam"
    D: int = 4
    seeds: int = 5
    n_train: int = 10_240
    n_test: int = 1_000
    batch_size: int = 64
    workers: int = 2

    def configs(self) -> list[RunConfig]:
        return [RunConfig(task=self.task, policy=p, optimizer=self.optimizer, D=self.D, seed=s, epochs=1,
                          batch_size=self.batch_size, n_train=self.n_train, n_test=self.n_test,
                          n_eval_train=self.n_test) for p in self.policies for s in range(self.seeds)]


def run_benchmark(bench: SweepBench) -> list[dict]:
    """Rows ``{way, stack, workers, seconds, arm_steps_per_s, ratio, max_diff}`` in the order of the docstring."""
    cfgs = bench.configs()
    steps = (bench.n_train // bench.batch_size) * len(cfgs)
    ways = [("one at a time", 1, 1), ("processes", 1, bench.workers), ("stacked", bench.seeds, 1),
            ("stacked + processes", bench.seeds, bench.workers)]
    rows: list[dict] = []
    reference: list[dict] | None = None
    saved = os.environ.get("PIPELAB_CACHE")
    for way, stack, workers in ways:
        os.environ["PIPELAB_CACHE"] = "off"  # every way computes every run; spawned workers inherit it
        try:
            t0 = time.perf_counter()
            recs = sweep(cfgs, stack=stack, workers=workers)
            seconds = time.perf_counter() - t0
        finally:
            if saved is None:
                os.environ.pop("PIPELAB_CACHE", None)
            else:
                os.environ["PIPELAB_CACHE"] = saved
        if reference is None:
            reference = recs
        diff = max(abs(a["test_loss"][-1] - b["test_loss"][-1]) for a, b in zip(recs, reference))
        rows.append({"way": way, "stack": stack, "workers": workers, "seconds": seconds,
                     "arm_steps_per_s": steps / seconds, "max_diff": diff})
    base = rows[0]["arm_steps_per_s"]
    for r in rows:
        r["ratio"] = r["arm_steps_per_s"] / base
    return rows


def format_report(bench: SweepBench, rows: list[dict]) -> str:
    lines = [f"torch {torch.__version__}, {os.cpu_count()} CPUs; {bench.task}, {bench.optimizer}, D={bench.D}, "
             f"policies {', '.join(bench.policies)} × {bench.seeds} seeds, 1 epoch of {bench.n_train} examples "
             f"(batch {bench.batch_size}), cache off",
             f"{'way':<22}{'stack':>6}{'workers':>8}{'seconds':>10}{'arm·steps/s':>13}{'ratio':>8}{'Δ test loss':>13}"]
    for r in rows:
        lines.append(f"{r['way']:<22}{r['stack']:>6}{r['workers']:>8}{r['seconds']:>10.1f}"
                     f"{r['arm_steps_per_s']:>13.1f}{r['ratio']:>8.2f}{r['max_diff']:>13.2e}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = SweepBench()
    ap.add_argument("--task", default=d.task)
    ap.add_argument("--policies", nargs="+", default=list(d.policies))
    ap.add_argument("--optimizer", default=d.optimizer)
    ap.add_argument("--D", type=int, default=d.D)
    ap.add_argument("--seeds", type=int, default=d.seeds)
    ap.add_argument("--n-train", type=int, default=d.n_train)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or d.workers)
    a = ap.parse_args()
    bench = SweepBench(task=a.task, policies=tuple(a.policies), optimizer=a.optimizer, D=a.D, seeds=a.seeds,
                       n_train=a.n_train, workers=a.workers)
    print(format_report(bench, run_benchmark(bench)))


if __name__ == "__main__":
    main()
