"""Benchmark: stability region of delayed heavy-ball (β = 0.9, τ = 8) on a 1000×1000 grid of ηλ.

Fast path: :func:`pipelab.stability.region_mask` (boundary-locus winding numbers, rasterised) and
:func:`pipelab.stability.stable_mask` (Schur–Cohn, vectorised). Reference: the straightforward per-grid-point
``numpy.linalg.eigvals`` of the companion matrix, looped in Python. Prints the times, the speed-up and the
grid points where the classifications differ (allowed only on the boundary: |radius − 1| tiny).

The three run in turn, round after round (``--rounds``, after one warm-up of the fast paths,
:mod:`benchmarks._harness`); times are medians over rounds and each speed-up the median of the per-round ratios,
with its interquartile range and the load average.

Run: ``.venv/bin/python benchmarks/stability.py [--n 1000] [--beta 0.9] [--tau 8] [--rounds 3] [--threads 1]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/stability.py` finds the harness

from benchmarks._harness import CLOCKS, add_clock_argument, add_thread_argument, alternate, header  # noqa: E402
from pipelab.stability import (  # noqa: E402
    companion,
    heavy_ball,
    max_stable_step,
    region_mask,
    spectral_radius,
    stable_mask,
)
from pipelab.threads import torch_threads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="grid points per axis (default 1000)")
    ap.add_argument("--beta", type=float, default=0.9)
    ap.add_argument("--tau", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    add_thread_argument(ap)
    add_clock_argument(ap)
    args = ap.parse_args()
    with torch_threads(args.threads):
        run(args)


def run(args: argparse.Namespace) -> None:
    print(header("pipelab stability benchmark") + f"; medians of {args.rounds} rounds")
    method = heavy_ball(args.beta, args.tau)
    zs = max_stable_step(method)
    re, im = (-0.5 * zs, 1.5 * zs), (-zs, zs)
    shape = (args.n, args.n)
    print(f"{method.name}: companion matrices {method.order}×{method.order}, grid {args.n}×{args.n}, "
          f"Re ηλ ∈ [{re[0]:.4g}, {re[1]:.4g}], Im ηλ ∈ [{im[0]:.4g}, {im[1]:.4g}] (z* = {zs:.6g})")

    region_mask(method, re, im, (50, 50))  # warm-up (imports, caches)
    z, _ = region_mask(method, re, im, shape)
    flat = z.reshape(-1)
    out: dict[str, np.ndarray] = {}

    def locus_run() -> None:
        out["locus"] = region_mask(method, re, im, shape)[1]

    def schur_run() -> None:
        out["schur"] = stable_mask(method, z)

    def naive_run() -> None:
        naive = np.empty(flat.size, dtype=bool)
        for i, zi in enumerate(flat):
            naive[i] = np.abs(np.linalg.eigvals(companion(method, zi))).max() < 1.0
        out["naive"] = naive.reshape(shape)

    r = alternate({"locus": locus_run, "schur": schur_run, "naive": naive_run}, args.rounds, warmup=0,
                  clock=CLOCKS[args.clock])
    locus, schur, naive = out["locus"], out["schur"], out["naive"]
    print(f"boundary locus (rasterised winding): {r.median('locus'):8.3f} s   stable points {int(locus.sum())}")
    print(f"Schur–Cohn (vectorised):             {r.median('schur'):8.3f} s   stable points {int(schur.sum())}")
    print(f"per-point numpy.linalg.eigvals loop: {r.median('naive'):8.3f} s   stable points {int(naive.sum())}")
    print(f"speed-up vs the loop: boundary locus {r.ratio('naive', 'locus')}, Schur–Cohn {r.ratio('naive', 'schur')}")
    for name, mask in [("boundary locus", locus), ("Schur–Cohn", schur)]:
        diff = mask != naive
        n_diff = int(diff.sum())
        if n_diff:
            rad = spectral_radius(method, z[diff])
            worst = np.abs(rad - 1).max()
            print(f"{name}: {n_diff} points classified differently, all with |radius − 1| ≤ {worst:.2e}")
        else:
            print(f"{name}: identical classification at all {naive.size} points")


if __name__ == "__main__":
    main()
