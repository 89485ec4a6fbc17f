"""Learning-curve runs on a device: milliseconds per optimizer step of each arm, alone and beside other processes.

Sizes a study before it is launched (the ``paper`` preset's GPU task above all): for each policy, the seeds of one arm
stacked (:func:`pipelab.studies.learning_curves.run_stacked`) run ``--short`` and ``--long`` steps; the difference
over the extra steps is the per-step time without the fixed costs (data, model, first-call warm-up, evaluation),
and ``fixed`` is what remains. ``--procs P`` then runs P processes of the first policy at once (spawned; each its own
CUDA context) and reports the slowest one's per-step time over the lone run's: the cost of sharing the device.

Usage:
    .venv/bin/python benchmarks/learning_curves_speed.py [--task fashion_mnist_resnet20] [--optimizer sgdm] [--D 4]
        [--batch 128] [--seeds 3] [--device cuda] [--policies sequential stashing ...] [--short 10] [--long 40]
        [--procs 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/...` finds pipelab

from pipelab.studies.learning_curves import RunConfig, run_stacked  # noqa: E402


def _configs(a: argparse.Namespace, policy: str, steps: int) -> list[RunConfig]:
    return [RunConfig(task=a.task, policy=policy, optimizer=a.optimizer, D=a.D, seed=s, epochs=1, batch_size=a.batch,
                      n_train=a.batch * steps, n_test=256, n_eval_train=256, device=a.device)
            for s in range(a.seeds)]


def _wall(a: argparse.Namespace, policy: str, steps: int) -> float:
    t = time.perf_counter()
    run_stacked(_configs(a, policy, steps))
    return time.perf_counter() - t


def per_step(a: argparse.Namespace, policy: str) -> tuple[float, float]:
    """(seconds per step, fixed seconds) of one stacked arm from a short and a long run, after a short warm-up run
    (the process's first run also pays for loading the data and the device's first calls)."""
    _wall(a, policy, a.short)
    short, long = _wall(a, policy, a.short), _wall(a, policy, a.long)
    step = (long - short) / (a.long - a.short)
    return step, short - step * a.short


def _proc(a: argparse.Namespace, policy: str, out: multiprocessing.Queue) -> None:
    out.put(per_step(a, policy)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="fashion_mnist_resnet20")
    ap.add_argument("--optimizer", default="sgdm")
    ap.add_argument("--D", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=3, help="seeds stacked into one run")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--policies", nargs="+", default=["sequential", "stashing", "pipeoptim", "spectrain", "2bw"])
    ap.add_argument("--short", type=int, default=10)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--procs", type=int, default=0, help="also run this many processes of the first policy at once")
    a = ap.parse_args(argv)
    print(f"{a.task} · {a.optimizer} · D={a.D} · batch {a.batch} · {a.seeds} stacked seeds on {a.device}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    alone = {}
    for policy in a.policies:
        step, fixed = per_step(a, policy)
        alone[policy] = step
        print(f"  {policy:12s} {1e3 * step:8.1f} ms/step  (fixed {fixed:5.1f} s)", flush=True)
    if a.procs > 1:
        ctx = multiprocessing.get_context("spawn")
        q: multiprocessing.Queue = ctx.Queue()
        procs = [ctx.Process(target=_proc, args=(a, a.policies[0], q)) for _ in range(a.procs)]
        for p in procs:
            p.start()
        steps = [q.get() for _ in procs]
        for p in procs:
            p.join()
        print(f"  {a.procs} processes of {a.policies[0]} at once: slowest {1e3 * max(steps):.1f} ms/step, "
              f"{max(steps) / alone[a.policies[0]]:.2f}× the lone run", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
