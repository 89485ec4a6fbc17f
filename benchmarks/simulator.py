"""Simulator throughput: asynchronous 1F1B (D=64, 2048 mini-batches ≈ 262k jobs), a GPipe step (D=64, M=1024), a
ZB-H1 step (D=64, M=1024) and no-flush ZB (``zb_async``, D=64, 1366 mini-batches ≈ 262k jobs), each against a
10× smaller instance, to show cost grows linearly with the number of jobs.

Run: ``.venv/bin/python benchmarks/simulator.py [--repeat 3] [--threads 1]``. Per case the big and the small
instance's phases run alternately, round after round (``--repeat`` rounds after one warm-up round,
:mod:`benchmarks._harness`): build the schedule; simulate (compile + job costs + timing + the result); simulate
with a network (α = 0.05, n/β = 0.5 per message on every boundary: every message queues on its receiver's
wire); simulate and build the version table; validate. Each time is the median over rounds and each big/small
ratio the median of the per-round ratios, with its interquartile range and the load average.
Targets (issue 29): the 262k-job asynchronous 1F1B simulation in under 0.5 s on one core, and ×10 jobs costing
at most ×11 time. Beside each ratio, the minor page faults per call. The script re-runs itself with glibc's malloc
keeping freed memory (:func:`benchmarks._harness.use_caching_malloc`), so that both sizes run in the same allocator
state; with ``--system-malloc`` (glibc's defaults) a big instance's arrays (tens of MB) go back to the kernel when
freed and are faulted in again at the next call, a page at a time, while a small one's stay in malloc's heap.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/simulator.py` finds the harness

from benchmarks._harness import (  # noqa: E402
    CLOCKS,
    Rounds,
    add_clock_argument,
    add_malloc_argument,
    add_thread_argument,
    alternate,
    header,
    use_caching_malloc,
)
from pipelab.links import Link, Network  # noqa: E402
from pipelab.schedules import Schedule, gpipe, pipedream, validate, zb_async, zb_h1  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402

PHASES = ("build", "simulate", "simulate+network", "simulate+versions", "validate")


def measure(big: Callable[[], Schedule], small: Callable[[], Schedule], repeat: int,
            clock: Callable[[], float]) -> tuple[Rounds, dict]:
    """Each phase of ``big`` then of ``small``, alternated over ``repeat`` rounds; also the instances and their
    simulations (for jobs, actions, makespan and bubble)."""
    inst = {"big": big(), "small": small()}
    sides: dict[str, Callable[[], object]] = {}
    for phase in PHASES:
        for size, build in (("big", big), ("small", small)):
            s = inst[size]
            net = Network.uniform(s.D, Link(0.05, 2.0))
            sides[f"{size} {phase}"] = {"build": build, "simulate": lambda s=s: simulate(s),
                                        "simulate+network": lambda s=s, net=net: simulate(s, network=net,
                                                                                          message_bytes=1.0),
                                        "simulate+versions": lambda s=s: simulate(s).version_table,
                                        "validate": lambda s=s: validate(s)}[phase]
    return alternate(sides, repeat, warmup=1, clock=clock), {size: (s, simulate(s)) for size, s in inst.items()}


def report(names: tuple[str, str], r: Rounds, inst: dict) -> list[str]:
    lines = []
    for name, size in zip(names, ("big", "small")):
        s, sim = inst[size]
        times = " | ".join(f"{phase} {r.median(f'{size} {phase}'):6.3f} s" for phase in PHASES)
        rate = " | ".join(f"{s.n_jobs / r.median(f'{size} {p}') / 1e3:4.0f}" for p in PHASES[1:4])
        lines.append(f"{name:<36} {s.n_jobs:>7d} jobs {s.n_actions:>7d} actions | {times} | k jobs/s (simulate | "
                     f"network | versions) {rate} | makespan {sim.makespan:.0f}, bubble {sim.bubble:.4f}")
    jr = inst["big"][0].n_jobs / inst["small"][0].n_jobs
    lines.append(f"  ratio big/small: jobs ×{jr:.2f} (linear ≈ ×{jr:.0f}, quadratic ≈ ×{jr * jr:.0f}); time, median "
                 "of the per-round ratios [IQR], load; minor page faults per call (big, small):")
    for phase in PHASES:
        faults = f"{r.median_faults(f'big {phase}'):>8.0f} {r.median_faults(f'small {phase}'):>6.0f}"
        lines.append(f"    {phase:<18} {r.ratio(f'big {phase}', f'small {phase}')!s:<36} faults {faults}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    add_clock_argument(ap)
    add_thread_argument(ap)
    add_malloc_argument(ap)
    args = ap.parse_args()
    cases = [
        (("async 1F1B D=64, 2048 mini-batches", "async 1F1B D=64, 205 mini-batches"),
         lambda: pipedream(64, 1, steps=2048), lambda: pipedream(64, 1, steps=205)),
        (("GPipe D=64, M=1024 (one step)", "GPipe D=64, M=102 (one step)"), lambda: gpipe(64, 1024),
         lambda: gpipe(64, 102)),
        (("ZB-H1 D=64, M=1024 (one step)", "ZB-H1 D=64, M=102 (one step)"), lambda: zb_h1(64, 1024),
         lambda: zb_h1(64, 102)),
        (("no-flush ZB D=64, 1366 mini-batches", "no-flush ZB D=64, 137 mini-batches"),
         lambda: zb_async(64, 1, steps=1366), lambda: zb_async(64, 1, steps=137)),
    ]
    with torch_threads(args.threads):
        print(header("pipelab simulator benchmark") + f"\nclock: {args.clock}")
        for names, big, small in cases:
            r, inst = measure(big, small, args.repeat, CLOCKS[args.clock])
            print("\n".join(report(names, r, inst)))
    print("targets: 262k-job async 1F1B simulate < 0.5 s on one core; x10 jobs <= x11 time")


if __name__ == "__main__":
    use_caching_malloc()
    main()
