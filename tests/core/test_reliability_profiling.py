"""Reliability probes of the stage profiler (see ``tests/probes.py``)."""

from __future__ import annotations

import probes
import torch
from probes import Probe
from torch import nn

from pipelab.profiling import profile_stage, profile_stages

PROBES = [
    # a block without parameters (an activation, a reshape) is a stage the planner profiles on its own
    Probe("profile-parameter-free-stage", lambda: profile_stage(nn.ReLU(), torch.randn(2, 3), reps=1, warmup=0),
          None),
    Probe("profile-parameter-free-blocks",
          lambda: profile_stages([nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)], torch.randn(2, 3),
                                 torch.tensor([0, 1]), reps=1, warmup=0), None),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


def test_parameter_free_stage_has_no_update_or_weights() -> None:
    c = profile_stage(nn.ReLU(), torch.randn(2, 3), reps=1, warmup=0)
    assert c.u == 0.0 and c.weight_bytes == 0 and c.f > 0
