"""Reliability probes for the stability study in practice (pipelab.studies.stability_practice): the trainers and the
bisection refuse bad input with a clear error."""

from __future__ import annotations

import math

import probes
import pytest
from probes import Probe

from pipelab.studies.stability_practice import delayed_training, least_squares_problem, max_stable_lr, pipeline_training

NAN, INF = math.nan, math.inf
_PROB = least_squares_problem(4, lam_max=1.0, lam_min=0.1, seed=0)

PROBES = [
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
