"""Simulator throughput: asynchronous 1F1B (D=64, 2048 mini-batches ≈ 262k jobs) and a GPipe step (D=64,
M=1024), each against a 10× smaller instance, to show cost grows linearly with the number of jobs.

Run: ``.venv/bin/python benchmarks/simulator.py [--repeat 3] [--threads 1]``. Per case the big and the small
instance's phases (build, simulate, simulate with the version table, validate) run alternately, round after round
(``--repeat`` rounds after one warm-up round, :mod:`benchmarks._harness`); each time is the median over rounds and
each big/small ratio the median of the per-round ratios, with its interquartile range and the load average.
Target: the 262k-job simulation in under 2 s on one core.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/simulator.py` finds the harness

from benchmarks._harness import Rounds, add_thread_argument, alternate, header  # noqa: E402
from pipelab.schedules import Schedule, gpipe, pipedream, validate  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402

PHASES = ("build", "simulate", "simulate+versions", "validate")


def measure(big: Callable[[], Schedule], small: Callable[[], Schedule], repeat: int) -> tuple[Rounds, dict]:
    """Each phase of ``big`` then of ``small``, alternated over ``repeat`` rounds; also the instances and their
    simulations (for jobs, actions, makespan and bubble)."""
    inst = {"big": big(), "small": small()}
    sides: dict[str, Callable[[], object]] = {}
    for phase in PHASES:
        for size, build in (("big", big), ("small", small)):
            s = inst[size]
            sides[f"{size} {phase}"] = {"build": build, "simulate": lambda s=s: simulate(s),
                                        "simulate+versions": lambda s=s: simulate(s).version_table,
                                        "validate": lambda s=s: validate(s)}[phase]
    return alternate(sides, repeat, warmup=1), {size: (s, simulate(s)) for size, s in inst.items()}


def report(names: tuple[str, str], r: Rounds, inst: dict) -> list[str]:
    lines = []
    for name, size in zip(names, ("big", "small")):
        s, sim = inst[size]
        times = " | ".join(f"{phase} {r.median(f'{size} {phase}'):6.3f} s" for phase in PHASES)
        lines.append(f"{name:<34} {s.n_jobs:>8d} jobs {s.n_actions:>8d} actions | {times} | "
                     f"{s.n_jobs / r.median(f'{size} simulate') / 1e3:6.0f} k jobs/s | makespan {sim.makespan:.0f}, "
                     f"bubble {sim.bubble:.4f}")
    jr = inst["big"][0].n_jobs / inst["small"][0].n_jobs
    lines.append(f"  ratio big/small: jobs ×{jr:.2f} (linear ≈ ×{jr:.0f}, quadratic ≈ ×{jr * jr:.0f}); time, median "
                 "of the per-round ratios [IQR], load:")
    for phase in PHASES:
        lines.append(f"    {phase:<18} {r.ratio(f'big {phase}', f'small {phase}')}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    add_thread_argument(ap)
    args = ap.parse_args()
    cases = [
        (("async 1F1B D=64, 2048 mini-batches", "async 1F1B D=64, 205 mini-batches"),
         lambda: pipedream(64, 1, steps=2048), lambda: pipedream(64, 1, steps=205)),
        (("GPipe D=64, M=1024 (one step)", "GPipe D=64, M=102 (one step)"), lambda: gpipe(64, 1024),
         lambda: gpipe(64, 102)),
    ]
    with torch_threads(args.threads):
        print(header("pipelab simulator benchmark"))
        for names, big, small in cases:
            r, inst = measure(big, small, args.repeat)
            print("\n".join(report(names, r, inst)))
    print("target: 262k-job async 1F1B simulate < 2 s on one core")


if __name__ == "__main__":
    main()
