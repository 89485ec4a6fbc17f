"""Stability of stale-gradient methods on the quadratic ``L = ½·λ·w²`` (terms: :mod:`pipelab`).

- :mod:`.methods` — linearised optimizers (GD, delayed GD, heavy-ball, Nesterov, SpecTrain/PipeOptim
  prediction, PipeMare discrepancy correction, Adam with a frozen preconditioner, NAdam's look-ahead for
  asynchronous pipelines, delay compensation, error feedback) as recurrences
  ``Σ_k (a_k + z·b_k)·w_{t+1−k} = 0`` in ``z = η·λ``; characteristic polynomials and companion matrices.
- :mod:`.regions` — vectorised stability tests over complex grids (Schur–Cohn), spectral radius
  (batched eigenvalues), boundary locus, and the area of a region (Green's theorem on the locus).
- :mod:`.thresholds` — largest stable real step by root-finding on the boundary locus; closed forms.
- :mod:`.noise` — stationary variance under gradient noise (the noise floor of a stable step; Lyapunov).
- :mod:`.hessian` — a real model's top Hessian eigenvalue λ_max (power iteration on Hessian-vector
  products) and ``lr_threshold(z*, λ_max) = z*/λ_max``: the stability threshold as a learning rate.

The theory checked against real delayed training with ``torch.optim`` is a study:
:mod:`pipelab.studies.stability_practice`.

Example:
    >>> from pipelab.stability import delayed_gd, max_stable_step
    >>> round(max_stable_step(delayed_gd(1)), 9)
    1.0
"""

from __future__ import annotations

from .hessian import HessianEigen, hessian_vector_product, lr_threshold, top_eigenvalue
from .methods import (
                      LinearMethod,
                      adam_frozen,
                      char_poly,
                      companion,
                      delay_compensated,
                      delayed_gd,
                      error_feedback,
                      gd,
                      general,
                      heavy_ball,
                      nesterov,
                      nesterov_async,
                      pipemare,
                      predicted_momentum,
)
from .noise import stationary_variance
from .regions import boundary_locus, complex_grid, region_area, region_mask, schur_stable, spectral_radius, stable_mask
from .thresholds import (
                      boundary_crossings,
                      delayed_gd_threshold,
                      heavy_ball_threshold,
                      max_stable_step,
                      nesterov_threshold,
)

__all__ = [
    "LinearMethod", "general", "gd", "delayed_gd", "heavy_ball", "nesterov", "predicted_momentum", "pipemare",
    "adam_frozen", "nesterov_async", "delay_compensated", "error_feedback", "char_poly", "companion",
    "stationary_variance",
    "complex_grid", "stable_mask", "region_mask", "region_area", "schur_stable", "spectral_radius", "boundary_locus",
    "max_stable_step", "boundary_crossings", "delayed_gd_threshold", "heavy_ball_threshold", "nesterov_threshold",
    "HessianEigen", "top_eigenvalue", "hessian_vector_product", "lr_threshold",
]
