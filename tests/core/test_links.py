"""pipelab.links: links and networks, bytes from real tensors, the codecs' bills, collective formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipelab.links import (
    CODECS,
    Bf16,
    Identity,
    Int8,
    Link,
    LowRank,
    MessageBytes,
    Network,
    boundary_bytes,
    collective_time,
    message_bytes,
)
from pipelab.partition import split
from pipelab.precision import Precision
from pipelab.studies.models import deep_mlp


def test_link_from_megabits_and_time() -> None:
    link = Link.mbps(200, latency_ms=50)
    assert (link.latency, link.bandwidth) == (0.05, 25e6)
    assert link.time(50e6) == 0.05 + 2.0 and Link().time(10**9) == 0.0


@pytest.mark.parametrize("kwargs, match", [({"latency": -1.0}, "latency"), ({"latency": math.inf}, "latency"),
                                           ({"bandwidth": 0.0}, "bandwidth"), ({"bandwidth": math.nan}, "bandwidth")])
def test_link_refuses_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Link(**kwargs)


def test_network_shapes_and_collective_link() -> None:
    slow, fast = Link(0.5, 100.0), Link(0.1, 1e6)
    net = Network([fast, slow, fast], [fast, fast, fast])
    assert net.D == 4 and isinstance(net.forward, tuple)
    assert net.collective_link([0, 2], 1000.0) == fast and net.collective_link([1], 1000.0) == slow
    assert net.collective_link([], 1000.0) == Link()
    assert Network.uniform(3, slow, collective=fast).collective_link([0, 1], 1e9) == fast
    with pytest.raises(ValueError, match="one forward and one backward"):
        Network([fast], [fast, fast])
    with pytest.raises(TypeError, match="sequence of Link"):
        Network([0.1], [fast])


def test_codec_bills() -> None:
    shape, f32 = (3, 5, 8), torch.float32  # 15 rows of 8
    assert Identity().encoded_bytes(shape, f32) == 480 and Bf16().encoded_bytes(shape, f32) == 240
    assert Int8().encoded_bytes(shape, f32) == 120 + 4 * 15
    assert LowRank(2).encoded_bytes(shape, torch.bfloat16) == 15 * 2 * 2 and LowRank(2).name == "lowrank(2)"
    assert sorted(CODECS) == ["bf16", "identity", "int8"]
    with pytest.raises(ValueError, match="rank"):
        LowRank(0)


def test_collective_formulas_by_hand() -> None:
    link = Link(0.5, 1000.0)  # n = 4000 bytes: n/β = 4 s
    assert collective_time("all_reduce", 4, 4000, link) == 2 * 3 * 0.5 + 2 * 3 / 4 * 4  # 9
    assert collective_time("all_gather", 4, 4000, link) == collective_time("reduce_scatter", 4, 4000, link) == 4.5
    assert collective_time("broadcast", 5, 4000, link) == collective_time("reduce", 5, 4000, link) == 3 * 4.5
    assert collective_time("all_reduce", 4, 4000, link, "tree") == 2 * 2 * 4.5
    assert collective_time("all_reduce", 1, 4000, link) == collective_time("broadcast", 1, 4000, link) == 0.0
    with pytest.raises(ValueError, match="need kind in"):
        collective_time("gather", 2, 1, link)


def test_boundary_bytes_are_the_stage_inputs() -> None:
    stages = split(deep_mlp(in_features=5, width=7, depth=3, num_classes=2), 3)
    x = torch.zeros(4, 5)
    want, h = [], x
    for s in stages:
        want.append(h.numel() * h.element_size())
        h = s(h)
    assert boundary_bytes(stages, x) == want == [80, 112, 112]


class Split(nn.Module):
    """Hands over ``(hidden, mask)``: a floating tensor and an integer one."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, (x[..., 0] > 0).long()


class Join(nn.Module):
    def forward(self, h: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return h[0] * h[1][..., None]


def test_message_bytes_from_a_tuple_hand_over_in_bf16() -> None:
    """Against the real hand-over: the stages run under bf16 autocast, each output cast as the pipeline casts it."""
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(6, 16), Split()), nn.Sequential(Join(), nn.Linear(16, 16)), nn.Linear(16, 3)]
    x = torch.randn(5, 6)
    precision = Precision("bf16")
    want_act, want_grad, h = [], [], x
    with precision.autocast("cpu"):
        for s in stages[:-1]:
            out = s(h)
            parts = [precision.handover(t) for t in (out if isinstance(out, tuple) else (out,))]
            want_act.append(sum(t.numel() * t.element_size() for t in parts))
            want_grad.append(sum(t.numel() * t.element_size() for t in parts if t.is_floating_point()))
            h = out
    got = message_bytes(stages, x, dtype=precision.dtype)
    assert got == MessageBytes(tuple(want_act), tuple(want_grad)) == MessageBytes((5 * 16 * 2 + 5 * 8, 160),
                                                                                  (160, 160))
    assert message_bytes(stages, x) == MessageBytes((5 * 16 * 4 + 5 * 8, 320), (320, 320))
    billed = message_bytes(stages, x, codec=[Int8(), LowRank(4)])
    assert billed == MessageBytes((5 * 16 + 4 * 5 + 5 * 8, 5 * 4 * 4), (5 * 16 + 4 * 5, 5 * 4 * 4))
    with pytest.raises(ValueError, match="one per boundary"):
        message_bytes(stages, x, codec=[Int8()])
