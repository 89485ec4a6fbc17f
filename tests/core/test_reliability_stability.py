"""Reliability probes for the stability analyses (pipelab.stability): bad input gets a clear error, not a number."""

from __future__ import annotations

import math

import numpy as np
import probes
from probes import Probe

from pipelab.stability import (
    LinearMethod,
    complex_grid,
    delayed_gd,
    gd,
    general,
    heavy_ball,
    heavy_ball_threshold,
    max_stable_step,
    nesterov_threshold,
    pipemare,
    predicted_momentum,
    region_area,
    region_mask,
    schur_stable,
    spectral_radius,
    stable_mask,
)

NAN, INF = math.nan, math.inf

PROBES = [
    # closed forms outside their domain used to return numbers (heavy_ball_threshold(1.5) == 5.0)
    Probe("hb-threshold-beta-1.5", lambda: heavy_ball_threshold(1.5), ValueError, r"beta must be in \[0, 1\)"),
    Probe("hb-threshold-beta-neg", lambda: heavy_ball_threshold(-0.1), ValueError, r"beta must be in \[0, 1\)"),
    Probe("hb-threshold-beta-nan", lambda: heavy_ball_threshold(NAN), ValueError, "beta"),
    Probe("nesterov-threshold-beta-1", lambda: nesterov_threshold(1.0), ValueError, r"beta must be in \[0, 1\)"),
    Probe("hb-threshold-beta-str", lambda: heavy_ball_threshold("0.5"), TypeError, "beta"),
    # non-finite coefficients used to give max_stable_step == 0.0
    Probe("method-nan-coefficient", lambda: max_stable_step(LinearMethod("x", (1.0, NAN), (0.0, 1.0))),
          ValueError, "finite"),
    Probe("method-inf-coefficient", lambda: LinearMethod("x", (1.0, -1.0), (0.0, INF)), ValueError, "finite"),
    Probe("general-nan-c", lambda: general(0.5, (NAN,)), ValueError, "c must hold finite"),
    Probe("general-inf-scale", lambda: general(0.5, (1.0,), scale=INF), ValueError, "scale"),
    Probe("predicted-nan-s", lambda: predicted_momentum(0.5, 2, NAN), ValueError, "s must be a finite"),
    Probe("predicted-nan-velocity", lambda: predicted_momentum(0.5, 2, velocity_scale=NAN), ValueError,
          "velocity_scale"),
    Probe("pipemare-nan-rho", lambda: pipemare(2, 1, rho=NAN), ValueError, "rho"),
    # non-finite steps z = η·λ used to be classified (NaN → "unstable")
    Probe("stable-mask-nan-z", lambda: stable_mask(gd(), NAN), ValueError, "z must be finite"),
    Probe("stable-mask-inf-z", lambda: stable_mask(delayed_gd(1), np.array([0.5, INF])), ValueError, "finite"),
    Probe("spectral-radius-nan-z", lambda: spectral_radius(heavy_ball(0.5), NAN), ValueError, "finite"),
    Probe("schur-nan-coeffs", lambda: schur_stable(np.array([1.0, NAN])), ValueError, "finite"),
    Probe("stable-mask-radius-0", lambda: stable_mask(gd(), 0.5, radius=0.0), ValueError, "radius"),
    # grids, radii and sample counts
    Probe("grid-nan-range", lambda: complex_grid((0.0, NAN), (-1.0, 1.0), (3, 3)), ValueError, "re must"),
    Probe("grid-float-shape", lambda: complex_grid((0.0, 1.0), (-1.0, 1.0), (3.5, 3)), ValueError, "shape"),
    Probe("region-mask-nan-radius", lambda: region_mask(gd(), (0, 2), (-1, 1), (5, 5), radius=NAN), ValueError,
          "radius"),
    Probe("region-mask-n-theta-2", lambda: region_mask(gd(), (0, 2), (-1, 1), (5, 5), n_theta=2), ValueError,
          "n_theta"),
    Probe("region-area-neg-radius", lambda: region_area(gd(), radius=-1.0), ValueError, "radius"),
    Probe("region-area-inf-radius", lambda: region_area(gd(), radius=INF), ValueError, "radius"),
    Probe("region-area-levels", lambda: region_area(gd(), levels=-1), ValueError, "levels"),
    Probe("max-stable-step-n-theta", lambda: max_stable_step(gd(), n_theta=0), ValueError, "n_theta"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()

