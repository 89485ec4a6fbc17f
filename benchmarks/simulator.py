"""Simulator throughput: asynchronous 1F1B (D=64, 2048 mini-batches ≈ 262k jobs) and a GPipe step (D=64,
M=1024), each against a 10× smaller instance, to show cost grows linearly with the number of jobs.

Run: ``.venv/bin/python benchmarks/simulator.py`` (one CPU core; best of ``--repeat`` runs per phase).
Target: the 262k-job simulation in under 2 s on one core.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from pipelab.schedules import gpipe, pipedream, validate
from pipelab.simulator import simulate


def best_of(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(name: str, build: Callable[[], object], repeat: int) -> dict[str, float]:
    t_build, s = best_of(build, repeat)
    t_sim, r = best_of(lambda: simulate(s), repeat)
    t_vt, _ = best_of(lambda: simulate(s).version_table, 1)
    t_val, _ = best_of(lambda: validate(s), 1)
    jobs = s.n_jobs
    print(f"{name:<34} {jobs:>8d} jobs {s.n_actions:>8d} actions | build {t_build:6.3f} s | simulate "
          f"{t_sim:6.3f} s ({jobs / t_sim / 1e3:6.0f} k jobs/s) | simulate+versions {t_vt:6.3f} s | "
          f"validate {t_val:6.3f} s | makespan {r.makespan:.0f}, bubble {r.bubble:.4f}")
    return {"jobs": jobs, "build": t_build, "simulate": t_sim, "versions": t_vt, "validate": t_val}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cases = [
        ("async 1F1B D=64, 2048 mini-batches", lambda: pipedream(64, 1, steps=2048),
         "async 1F1B D=64, 205 mini-batches", lambda: pipedream(64, 1, steps=205)),
        ("GPipe D=64, M=1024 (one step)", lambda: gpipe(64, 1024),
         "GPipe D=64, M=102 (one step)", lambda: gpipe(64, 102)),
    ]
    for big_name, big, small_name, small in cases:
        b = measure(big_name, big, args.repeat)
        s = measure(small_name, small, args.repeat)
        jr = b["jobs"] / s["jobs"]
        print(f"  ratio big/small: jobs ×{jr:.2f}, simulate time ×{b['simulate'] / s['simulate']:.2f}, "
              f"build ×{b['build'] / s['build']:.2f}, validate ×{b['validate'] / s['validate']:.2f} "
              f"(linear ≈ ×{jr:.0f}, quadratic ≈ ×{jr * jr:.0f})")
    print("target: 262k-job async 1F1B simulate < 2 s on one core")


if __name__ == "__main__":
    main()
