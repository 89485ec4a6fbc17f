"""Reliability of the metered transport (pipelab.runtime.meter) on a busy machine: probes that once misbehaved."""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from pipelab.distributed import spawn
from pipelab.links import Link, Network
from pipelab.runtime import PipelineRuntime
from pipelab.schedules import gpipe

#: how long each stage keeps its interpreter busy per forward, against the link's latency
SEND_S, SPIN_S, LATENCY_S = 0.03, 0.2, 0.02


class Spin(nn.Module):
    """The identity after ``seconds`` of pure Python (the interpreter is not released)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return x


def _busy_receiver(rank: int, world: int) -> Any:
    sys.setswitchinterval(1.0)  # no other thread of this process runs while a forward spins
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), Spin(SEND_S)), Spin(SPIN_S))
    rt = PipelineRuntime(model, schedule=gpipe(2, 4, 2), policy="gpipe", network=Network.uniform(2, Link(LATENCY_S)),
                         optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 4, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = rt.run(data)
    assert res.meter is not None
    # step 0 sets the connections up (a pair's first message is slow): step 1 is the probe
    return [(m.micro, m.late, m.handed - m.asked) for m in res.meter.messages if m.step == 1 and m.kind == 0]


@pytest.mark.slow
def test_a_stamp_sent_while_its_receiver_computes_is_not_late() -> None:
    """GPipe on 2 ranks, α = 20 ms, forwards of 30 ms on stage 0 and 200 ms on stage 1, the second step: F0.1 to
    F0.3 are sent (30 to 90 ms into the step) while stage 1 is busy in F1.0 (from 50 ms on, 200 ms). Their stamps
    were taken in by a thread of the receiver, which could not run until F1.0 ended, after their modelled arrival:
    they were counted late, and their wire order was whatever the thread saw. On the shared board they are there
    when F1.1 to F1.3 ask: on time, and handed over at once."""
    received = spawn(_busy_receiver, 2, timeout_s=120.0)[1]
    assert [(j, late) for j, late, _ in received if j > 0] == [(1, False), (2, False), (3, False)]
    assert all(wait < SPIN_S / 4 for j, _, wait in received if j > 0)
