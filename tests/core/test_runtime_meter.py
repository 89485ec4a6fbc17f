"""The metered runtime (pipelab.runtime.meter): weights of a metered run ≡ an unmetered run ≡ the emulator (float64),
and each rank's wires follow the link model of pipelab.links on the measured send stamps."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from pipelab.distributed import spawn
from pipelab.emulator import Emulator
from pipelab.links import Link, Network, message_bytes
from pipelab.partition import split
from pipelab.runtime import PipelineRuntime
from pipelab.runtime.meter import MeteredTransport
from pipelab.runtime.p2p import P2PTransport
from pipelab.schedules import BUILDERS, ddp, one_f_one_b
from pipelab.schedules.transfers import ACT, messages
from pipelab.studies.models import deep_mlp

BATCH, STEPS = 8, 3
#: (builder, policy, M, network): every schedule family the benchmark meters, half and full duplex
CASES = [("gpipe", "gpipe", 2, Network.uniform(2, Link.mbps(0.2, latency_ms=50))),
         ("1f1b", "1f1b", 4, Network.uniform(2, Link.mbps(0.5, latency_ms=50), duplex=True)),
         ("pipedream", "stashing", 2, Network.uniform(2, Link.mbps(0.5, latency_ms=50))),
         ("2bw", "2bw", 2, Network.uniform(2, Link.mbps(1.0, latency_ms=50))),
         ("zb_h1", "1f1b", 2, Network((Link.mbps(0.5, latency_ms=60),), (Link.mbps(2.0, latency_ms=50),)))]


def build(name: str, policy: str, M: int) -> tuple[torch.nn.Sequential, Any, Any]:
    torch.manual_seed(0)
    model = deep_mlp(in_features=6, width=8, depth=2, num_classes=4).double()
    return model, BUILDERS[name](2, M, STEPS), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(STEPS)]


def _both(rank: int, world: int) -> list[dict[str, Any]]:
    out = []
    for name, policy, M, net in CASES:
        runs = {}
        for key, network in (("plain", None), ("metered", net)):
            model, sched, opt = build(name, policy, M)
            rt = PipelineRuntime(model, schedule=sched, policy=policy, optimizer=opt, network=network, record=True)
            runs[key] = rt.run(batches())
        out.append(runs)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[list[dict[str, Any]]]:
    return spawn(_both, 2, timeout_s=500.0)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_metered_weights_equal_unmetered_and_emulator(ranks: list, case: int) -> None:
    name, policy, M, _ = CASES[case]
    model, sched, opt = build(name, policy, M)
    emu = Emulator(model, schedule=sched, policy=policy, optimizer=opt)
    res = emu.run(batches())
    ref = emu.weights()
    for per_rank in ranks:
        plain, metered = per_rank[case]["plain"], per_rank[case]["metered"]
        assert plain.meter is None and metered.meter is not None
        assert metered.losses == plain.losses == pytest.approx(res.losses, abs=1e-12)
        for k, W in metered.weights.items():
            for a, b, c in zip(W, plain.weights[k], ref[k]):
                assert torch.equal(a, b)  # metering changes when tensors arrive, never what they are
                assert (a - c).abs().max().item() <= 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_metered_wires_follow_the_link_model(ranks: list, case: int) -> None:
    """Per rank: one record per message it receives, billed the shape pass's bytes; on each wire, in the order the
    meter placed them, arrival = max(send + α, previous arrival) + n/β, and that order is the order of ready time
    (ties: send, sender) unless a message was late, i.e. placed after a later-ready message, or its stamp found by
    a waiting job only after its arrival (the machine too loaded for the condition of pipelab.runtime.meter:
    counted, not hidden); no job started before its input's arrival."""
    name, policy, M, net = CASES[case]
    model, sched, _ = build(name, policy, M)
    mb = message_bytes(split(model, 2), batches()[0][0][:BATCH // M])
    for rank, per_rank in enumerate(ranks):
        stats, tl = per_rank[case]["metered"].meter, per_rank[case]["metered"].timeline
        expected = sorted((m.channel % 2, m.channel // 2, m.t, m.j) for m in messages(sched) if m.dst == rank)
        assert sorted((x.kind, x.stage, x.step, x.micro) for x in stats.messages) == expected
        assert stats.late == sum(x.late for x in stats.messages) <= len(expected) // 4
        placed: dict[int, list] = {}
        for x in stats.messages:
            link = net.forward[x.stage - 1] if x.kind == ACT else net.backward[x.stage]
            assert x.nbytes == (mb.activation[x.stage - 1] if x.kind == ACT else mb.gradient[x.stage])
            wire = placed.setdefault(x.kind if net.duplex else 0, [])
            assert x.ready == x.send + link.latency
            assert x.begin == max(x.ready, wire[-1].arrival if wire else -math.inf)
            assert x.arrival == pytest.approx(x.begin + x.nbytes / link.bandwidth, abs=1e-12)
            out_of_order = any((y.ready, y.send, y.sender) > (x.ready, x.send, x.sender) for y in wire)
            assert x.late == out_of_order or (x.late and x.seen > x.arrival)  # or a waiting job found it late
            wire.append(x)
        starts = {j.job: j.start + tl.t0_monotonic for j in tl.jobs}
        for x in stats.messages:
            job = ("F" if x.kind == ACT else ("I" if sched.split_set else "B"), x.stage, x.step, x.micro)
            assert starts[job] >= x.arrival - 1e-6


def test_meter_refuses_a_network_of_another_depth_or_type() -> None:
    inner = P2PTransport(one_f_one_b(2, 2, 1), 0, torch.device("cpu"))
    with pytest.raises(ValueError, match="network has 3 stages"):
        MeteredTransport(inner, Network.uniform(3, Link(0.01)))
    with pytest.raises(TypeError, match="network must be"):
        MeteredTransport(inner, Link(0.01))  # type: ignore[arg-type]


def test_runtime_refuses_to_meter_a_placed_schedule() -> None:
    model = deep_mlp(in_features=6, width=8, depth=4, num_classes=4)
    with pytest.raises(ValueError, match="placed schedules"):
        PipelineRuntime(model, schedule=ddp(4, 2, 2, 1), policy="1f1b", rank=0, world_size=2,
                        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), network=Network.uniform(4, Link(0.01)))
