"""Stability of stale-gradient methods on the quadratic ``L = ½·λ·w²`` (terms: :mod:`pipelab`).

:mod:`.methods` (optimizers as recurrences in ``z = η·λ``), :mod:`.regions` (stability over complex grids),
:mod:`.thresholds` (largest stable real step), :mod:`.noise` (noise floor), :mod:`.hessian` (a model's
``λ_max`` and the learning rate it allows). Checked against delayed training: :mod:`pipelab.studies.stability_practice`.
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
