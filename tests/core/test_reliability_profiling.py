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


class _Pair(nn.Module):
    """x -> (tanh(lin x), integer mask): a tuple hand-over with a tensor that carries no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.lin(x)), (x[:, 0] > 0).long()


class _Head(nn.Module):
    """(h, mask) -> {"logits"} as a dict, then the loss's input: a dict hand-over read by the next stage."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        h, mask = pair
        return {"h": self.lin(h) * (1 + mask[:, None]), "mask": mask}


class _Out(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.lin(d["h"])


def test_stages_handing_over_tuples_and_dicts_are_profiled() -> None:
    """Probe: a stage returning a tuple (or a dict) stopped the profiler at its backward ('tuple' object has no
    attribute 'backward'), and a structured input was refused: now every floating output needing a gradient is
    seeded with ones, and the input gradient is taken for the floating inputs only (as the pipeline does)."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 1, 0])
    p = profile_stages([_Pair(), _Head(), _Out()], x, y, reps=2, warmup=1)
    for costs in (p.f_cost, p.b_cost, p.i_cost, p.w_cost, p.u_cost):
        assert all(c > 0 for c in costs)
    assert all(a > 0 for a in p.activation_bytes)
    # the weights: each stage's Linear, in float32
    assert p.weight_bytes == [(3 * 4 + 4) * 4, (4 * 4 + 4) * 4, (4 * 2 + 2) * 4]
