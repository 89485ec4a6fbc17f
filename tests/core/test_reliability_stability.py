"""Reliability probes for the stability analyses (pipelab.stability): bad input gets a clear error, not a number."""

from __future__ import annotations

import math

import numpy as np
import probes
import pytest
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
from pipelab.stability.practice import delayed_training, least_squares_problem, max_stable_lr, pipeline_training

NAN, INF = math.nan, math.inf
_PROB = least_squares_problem(4, lam_max=1.0, lam_min=0.1, seed=0)

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
    # the trainers: lr = nan used to crash inside the emulator with a raw reduction error
    Probe("pipeline-lr-nan", lambda: pipeline_training(_PROB, NAN, 1, steps=20), ValueError,
          "lr must be a finite real number > 0"),
    Probe("pipeline-lr-inf", lambda: pipeline_training(_PROB, INF, 1, steps=20), ValueError, "lr must"),
    Probe("pipeline-lr-zero", lambda: pipeline_training(_PROB, 0.0, 1, steps=20), ValueError, "lr must"),
    Probe("pipeline-tau-float", lambda: pipeline_training(_PROB, 0.1, 1.5, steps=20), ValueError, "tau"),
    Probe("pipeline-tau-nan", lambda: pipeline_training(_PROB, 0.1, NAN, steps=20), ValueError, "tau"),
    Probe("pipeline-steps", lambda: pipeline_training(_PROB, 0.1, 1, steps=3), ValueError, "steps"),
    Probe("pipeline-momentum-neg", lambda: pipeline_training(_PROB, 0.1, 1, steps=20, momentum=-0.5), ValueError,
          "momentum must be"),
    Probe("pipeline-nesterov-no-momentum", lambda: pipeline_training(_PROB, 0.1, 1, steps=20, nesterov=True),
          ValueError, "nesterov=True needs momentum"),
    Probe("pipeline-blowup", lambda: pipeline_training(_PROB, 0.1, 1, steps=20, blowup=NAN), ValueError, "blowup"),
    Probe("pipeline-problem-type", lambda: pipeline_training("problem", 0.1, 1, steps=20), TypeError,
          "LeastSquares"),
    Probe("pipeline-policy", lambda: pipeline_training(_PROB, 0.1, 1, steps=20, policy="bogus"), ValueError,
          "unknown policy"),
    Probe("delayed-lr-nan", lambda: delayed_training(_PROB, NAN, 1, steps=20), ValueError, "lr must"),
    Probe("delayed-predict-nan", lambda: delayed_training(_PROB, 0.1, 1, steps=20, predict_s=NAN), ValueError,
          "predict_s"),
    # max_stable_lr's bracket
    Probe("bisection-hi-stable", lambda: max_stable_lr(_PROB, 1, hi=0.01, steps=100), ValueError,
          "hi=0.01 does not diverge"),
    Probe("bisection-lo-diverges", lambda: max_stable_lr(_PROB, 1, lo=5.0, hi=10.0, steps=100), ValueError,
          "lo=5.0 diverges"),
    Probe("bisection-lo-above-hi", lambda: max_stable_lr(_PROB, 1, lo=0.5, hi=0.1, steps=100), ValueError,
          "lo < hi"),
    Probe("bisection-hi-nan", lambda: max_stable_lr(_PROB, 1, hi=NAN, steps=100), ValueError, "hi must"),
    Probe("bisection-rel-tol", lambda: max_stable_lr(_PROB, 1, rel_tol=0.0, steps=100), ValueError, "rel_tol"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


def test_bisection_with_a_checked_bracket_still_finds_the_threshold() -> None:
    """A valid explicit bracket is accepted and bisected (the checks cost two extra trials, nothing else)."""
    lr = max_stable_lr(_PROB, 1, lo=0.5, hi=1.5, steps=600, rel_tol=1e-2)
    assert lr * _PROB.lam_max == pytest.approx(1.0, rel=0.03)     # delayed GD τ = 1: z* = 1
