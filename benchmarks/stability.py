"""Benchmark: stability region of delayed heavy-ball (β = 0.9, τ = 8) on a 1000×1000 grid of ηλ.

Fast path: :func:`pipelab.stability.region_mask` (boundary-locus winding numbers, rasterised) and
:func:`pipelab.stability.stable_mask` (Schur–Cohn, vectorised). Reference: the straightforward per-grid-point
``numpy.linalg.eigvals`` of the companion matrix, looped in Python. Prints the times, the speed-up and the
grid points where the classifications differ (allowed only on the boundary: |radius − 1| tiny).

Run: ``.venv/bin/python benchmarks/stability.py [--n 1000] [--beta 0.9] [--tau 8]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipelab.stability import companion, heavy_ball, max_stable_step, region_mask, spectral_radius, stable_mask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="grid points per axis (default 1000)")
    ap.add_argument("--beta", type=float, default=0.9)
    ap.add_argument("--tau", type=int, default=8)
    args = ap.parse_args()
    method = heavy_ball(args.beta, args.tau)
    zs = max_stable_step(method)
    re, im = (-0.5 * zs, 1.5 * zs), (-zs, zs)
    shape = (args.n, args.n)
    print(f"{method.name}: companion matrices {method.order}×{method.order}, grid {args.n}×{args.n}, "
          f"Re ηλ ∈ [{re[0]:.4g}, {re[1]:.4g}], Im ηλ ∈ [{im[0]:.4g}, {im[1]:.4g}] (z* = {zs:.6g})")

    region_mask(method, re, im, (50, 50))  # warm-up (imports, caches)
    t0 = time.perf_counter()
    z, locus = region_mask(method, re, im, shape)
    t_locus = time.perf_counter() - t0

    t0 = time.perf_counter()
    schur = stable_mask(method, z)
    t_schur = time.perf_counter() - t0

    flat = z.reshape(-1)
    naive = np.empty(flat.size, dtype=bool)
    t0 = time.perf_counter()
    for i, zi in enumerate(flat):
        naive[i] = np.abs(np.linalg.eigvals(companion(method, zi))).max() < 1.0
    t_naive = time.perf_counter() - t0
    naive = naive.reshape(shape)

    print(f"boundary locus (rasterised winding): {t_locus:8.3f} s   stable points {int(locus.sum())}")
    print(f"Schur–Cohn (vectorised):             {t_schur:8.3f} s   stable points {int(schur.sum())}")
    print(f"per-point numpy.linalg.eigvals loop: {t_naive:8.3f} s   stable points {int(naive.sum())}")
    print(f"speed-up vs the loop: boundary locus {t_naive / t_locus:.0f}×, Schur–Cohn {t_naive / t_schur:.1f}×")
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
