"""Throughput of a learning-curve sweep: arms·steps per second, one arm at a time vs stacked seeds and processes.

The same grid (``--policies`` × ``--seeds`` of one task, optimizer and D, one epoch of ``--n-train`` examples) is run
through :func:`pipelab.studies.learning_curves.sweep` with the result cache off, four ways, all in this one run:

- ``one at a time``: every arm alone, in this process (``stack=1, workers=1``) — how sweeps ran before stacking;
- ``processes``: every arm alone, ``--workers`` worker processes;
- ``stacked``: the seeds of each arm as one stacked model (:mod:`pipelab.studies.stacking`), in this process;
- ``stacked + processes``: both.

The four ways run in turn, round after round (``--rounds``, :mod:`benchmarks._harness`), so that a change of the
machine's load hits all of them alike. It prints each way's median wall time, arms·steps per second and the ratio to
``one at a time`` (the median of the per-round ratios, with its interquartile range and the load average of the
rounds), and checks that every way computed the same runs (largest difference of the final test loss; stacking
changes float32 rounding only). Every arm runs one intra-op thread (:func:`pipelab.studies.learning_curves.run`), so
``--threads`` only sets this process's count.

Usage:
    .venv/bin/python benchmarks/sweep.py [--task fashion_mnist_mlp] [--policies stashing pipeoptim vanilla 2bw]
        [--seeds 5] [--n-train 10240] [--workers 2] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/sweep.py` finds the harness

from benchmarks._harness import add_thread_argument, alternate, header  # noqa: E402
from pipelab.studies.learning_curves import RunConfig, sweep  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402


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
    rounds: int = 3

    def configs(self) -> list[RunConfig]:
        return [RunConfig(task=self.task, policy=p, optimizer=self.optimizer, D=self.D, seed=s, epochs=1,
                          batch_size=self.batch_size, n_train=self.n_train, n_test=self.n_test,
                          n_eval_train=self.n_test) for p in self.policies for s in range(self.seeds)]


def run_benchmark(bench: SweepBench) -> list[dict]:
    """Rows ``{way, stack, workers, seconds, arm_steps_per_s, ratio, ratio_iqr, load, max_diff}`` in the order of the
    docstring; seconds: the median over ``bench.rounds`` rounds; ratio: throughput over one at a time's, the median
    of the per-round ratios."""
    cfgs = bench.configs()
    steps = (bench.n_train // bench.batch_size) * len(cfgs)
    ways = [("one at a time", 1, 1), ("processes", 1, bench.workers), ("stacked", bench.seeds, 1),
            ("stacked + processes", bench.seeds, bench.workers)]
    losses: dict[str, list[float]] = {}

    def runner(way: str, stack: int, workers: int) -> Callable[[], None]:
        def run() -> None:
            losses[way] = [r["test_loss"][-1] for r in sweep(cfgs, stack=stack, workers=workers)]
        return run

    saved = os.environ.get("PIPELAB_CACHE")
    os.environ["PIPELAB_CACHE"] = "off"  # every way computes every run; spawned workers inherit it
    try:
        r = alternate({way: runner(way, stack, workers) for way, stack, workers in ways}, bench.rounds, warmup=0)
    finally:
        if saved is None:
            os.environ.pop("PIPELAB_CACHE", None)
        else:
            os.environ["PIPELAB_CACHE"] = saved
    rows: list[dict] = []
    reference = losses[ways[0][0]]
    for way, stack, workers in ways:
        ratio = r.ratio(ways[0][0], way)  # throughput ratio = time ratio inverted
        rows.append({"way": way, "stack": stack, "workers": workers, "seconds": r.median(way),
                     "arm_steps_per_s": steps / r.median(way), "ratio": ratio.median, "ratio_iqr": (ratio.q1, ratio.q3),
                     "load": ratio.load, "max_diff": max(abs(a - b) for a, b in zip(losses[way], reference))})
    return rows


def format_report(bench: SweepBench, rows: list[dict]) -> str:
    lines = [header("pipelab sweep benchmark"),
             f"{bench.task}, {bench.optimizer}, D={bench.D}, policies {', '.join(bench.policies)} × {bench.seeds} "
             f"seeds, 1 epoch of {bench.n_train} examples (batch {bench.batch_size}), cache off; medians of "
             f"{bench.rounds} rounds",
             f"{'way':<22}{'stack':>6}{'workers':>8}{'seconds':>10}{'arm·steps/s':>13}  {'ratio [IQR]':<20}"
             f"{'load':>5}{'Δ test loss':>13}"]
    for r in rows:
        ratio = f"{r['ratio']:.2f} [{r['ratio_iqr'][0]:.2f}–{r['ratio_iqr'][1]:.2f}]"
        lines.append(f"{r['way']:<22}{r['stack']:>6}{r['workers']:>8}{r['seconds']:>10.1f}"
                     f"{r['arm_steps_per_s']:>13.1f}  {ratio:<20}{r['load']:>5.1f}{r['max_diff']:>13.2e}")
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
    ap.add_argument("--rounds", type=int, default=d.rounds, help="rounds of the four ways, in turn")
    add_thread_argument(ap)
    a = ap.parse_args()
    bench = SweepBench(task=a.task, policies=tuple(a.policies), optimizer=a.optimizer, D=a.D, seeds=a.seeds,
                       n_train=a.n_train, workers=a.workers, rounds=a.rounds)
    with torch_threads(a.threads):
        print(format_report(bench, run_benchmark(bench)))


if __name__ == "__main__":
    main()
