"""Measured runs (pipelab.runtime.trace) against the simulator: bytes over point-to-point, memory, job times.

Every rank runs GPipe, 1F1B, PipeDream (stashing), 2BW and interleaved 1F1B with ``record=True``; the bytes it
counts must equal the simulator's transfer counts × the tensor sizes, exactly, and its memory report the
simulator's figures (:func:`pipelab.calibration.compare_memory`).
"""

from __future__ import annotations

import math

import pytest
import torch

from pipelab.calibration import compare_memory, simulated_collectives, simulated_traffic
from pipelab.distributed import spawn
from pipelab.links import boundary_bytes
from pipelab.partition import split
from pipelab.runtime import PipelineRuntime
from pipelab.runtime.trace import JobClock, MeasuredTransport, Timeline
from pipelab.schedules import (
    ddp,
    fsdp,
    fslpp,
    gpipe,
    hybrid,
    interleaved_1f1b,
    lpp,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
)
from pipelab.simulator import simulate
from pipelab.studies.models import deep_mlp

BATCH, IN, WIDTH, CLASSES = 8, 6, 12, 4


def schedule_of(name: str, W: int, M: int, steps: int):
    name = name.removesuffix("-frozen")  # the same schedule, on a model with frozen parameters
    if name == "gpipe":
        return gpipe(W, M, steps)
    if name == "1f1b":
        return one_f_one_b(W, M, steps)
    if name == "pipedream":
        return pipedream(W, M, steps)
    if name == "2bw":
        return pipedream_2bw(W, M, steps)
    if name == "interleaved":
        return interleaved_1f1b(W, 2, M, steps)
    raise ValueError(name)


#: (schedule, policy, M, steps, optimizer); "-frozen": every bias frozen (neither versioned nor stepped nor sent)
CASES = [("gpipe", "gpipe", 4, 2, "sgdm"), ("1f1b", "1f1b", 4, 2, "adam"), ("pipedream", "stashing", 2, 6, "sgdm"),
         ("2bw", "2bw", 4, 4, "adam"), ("interleaved", "1f1b", 4, 2, "sgdm"),
         ("pipedream-frozen", "stashing", 2, 6, "adam")]


def model_of(D: int, name: str = "") -> torch.nn.Sequential:
    torch.manual_seed(0)
    model = deep_mlp(in_features=IN, width=WIDTH, depth=D, num_classes=CLASSES).double()
    if name.endswith("-frozen"):
        for n, p in model.named_parameters():
            p.requires_grad_(not n.endswith("bias"))
    return model


def optimizer_of(name: str):
    if name == "adam":
        return lambda ps: torch.optim.Adam(ps, lr=0.01)
    return lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, IN, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (BATCH,), generator=g))
            for _ in range(steps)]


def _run(rank: int, world: int) -> list:
    out = []
    for name, policy, M, steps, opt in CASES:
        sched = schedule_of(name, world, M, steps)
        rt = PipelineRuntime(model_of(sched.D, name), schedule=sched, policy=policy, optimizer=optimizer_of(opt),
                             record=True)
        out.append(rt.run(data(steps)))
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def measured(request: pytest.FixtureRequest) -> tuple[int, list]:
    return request.param, spawn(_run, request.param)


def _sim(name: str, world: int, M: int, steps: int):
    sched = schedule_of(name, world, M, steps)
    stages = split(model_of(sched.D, name), sched.D)
    sizes = boundary_bytes(stages, torch.zeros(BATCH // M, IN, dtype=torch.float64))
    return sched, stages, sizes


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[0] for c in CASES])
def test_counted_bytes_equal_the_simulators_transfers(measured: tuple[int, list], i: int) -> None:
    world, per_rank = measured
    name, _, M, steps, _ = CASES[i]
    sched, _, sizes = _sim(name, world, M, steps)
    sim = simulate(sched)
    # every boundary tensor of this model is (micro-batch, WIDTH) float64: counts × that size, rank by rank
    size = (BATCH // M) * WIDTH * 8
    assert sizes[1:] == [size] * (sched.D - 1)
    for w in range(world):
        tl = per_rank[w][i].timeline
        assert tl.received["activation"] == int(sim.activation_transfers[w]) * size
        assert tl.received["gradient"] == int(sim.gradient_transfers[w]) * size
        assert tl.messages_received["activation"] == int(sim.activation_transfers[w])
    # what one rank sends, another receives; and the per-kind, per-worker prediction matches too
    traffic = simulated_traffic(sim, sizes)
    for w in range(world):
        tl = per_rank[w][i].timeline
        assert tl.sent == traffic[w]["sent"] and tl.received == traffic[w]["received"]
    assert sum(per_rank[w][i].timeline.bytes_sent for w in range(world)) == sum(
        per_rank[w][i].timeline.bytes_received for w in range(world)) > 0


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[0] for c in CASES])
def test_memory_and_transfers_match_the_simulator(measured: tuple[int, list], i: int) -> None:
    world, per_rank = measured
    name, policy, M, steps, opt = CASES[i]
    sched, stages, sizes = _sim(name, world, M, steps)
    rows = compare_memory([per_rank[w][i] for w in range(world)], sched, stages,
                          torch.zeros(BATCH // M, IN, dtype=torch.float64), policy=policy,
                          optimizer=optimizer_of(opt))
    quantities = {r["quantity"] for r in rows}
    assert quantities == {"weight versions", "activations", "optimizer state", "sent", "received"}
    assert len(rows) == 5 * world
    for r in rows:
        assert r["ok"], r
        if r["exact"]:
            assert r["measured"] == r["simulated"], r
        else:
            assert abs(r["measured"] - r["simulated"]) <= r["tolerance"], r


@pytest.mark.slow
def test_timeline_is_ordered_and_complete(measured: tuple[int, list]) -> None:
    world, per_rank = measured
    for i, (name, _, M, steps, _) in enumerate(CASES):
        sched = schedule_of(name, world, M, steps)
        ends = {}
        for w in range(world):
            tl = per_rank[w][i].timeline
            assert [r.job for r in tl.jobs] == [(a.op, a.stage, a.step, a.micro) for a in sched.programs[w]]
            prev = 0.0
            for r in tl.jobs:
                assert prev <= r.start <= r.end, r  # a job starts after the previous one ended
                prev = r.end
                ends[r.job] = r.end
            assert tl.makespan == prev and tl.shared_clock
        # causality across ranks (one host: one clock): a job that received starts after its producer ended
        for w in range(world):
            for r in per_rank[w][i].timeline.jobs:
                if r.op == "F" and r.stage > 0 and r.received:
                    assert r.start >= ends[("F", r.stage - 1, r.step, r.micro)], (name, r)


def test_recording_changes_nothing_but_the_timeline() -> None:
    sched = gpipe(1, 2, 3)  # one rank holding the whole (2-block) model, no process group: hand-overs in memory
    out = []
    for record in (False, True):
        rt = PipelineRuntime(model_of(2), schedule=sched, policy="gpipe", optimizer=optimizer_of("adam"), rank=0,
                             world_size=1, record=record)
        out.append(rt.run(data(3)))
    off, on = out
    assert off.timeline is None and on.timeline is not None
    assert on.losses == off.losses and all(torch.equal(a, b) for a, b in zip(on.weights[0], off.weights[0]))
    assert [r.job for r in on.timeline.jobs] == [(a.op, a.stage, a.step, a.micro) for a in sched.programs[0]]
    assert on.timeline.bytes_sent == on.timeline.bytes_received == 0  # same-rank hand-overs are not counted
    assert not on.timeline.shared_clock  # no process group: nothing to re-base on


def test_the_wrapper_counts_cross_rank_bytes_and_forwards_the_rest() -> None:
    class Inner:
        def __init__(self) -> None:
            self.schedule, self.rank, self.local, self.sent = gpipe(2, 2), 0, {}, []

        def send(self, src, dst, tensor):  # noqa: ANN001, ANN201
            self.sent.append(dst)

        def receive(self, src, dst):  # noqa: ANN001, ANN201
            return torch.ones(3, dtype=torch.float64)

        def flush(self) -> None:
            pass

        def held(self) -> int:
            return 0

    inner = Inner()
    tr = MeasuredTransport(inner)
    tr.local = {"x": 1}  # written through to the wrapped transport
    assert inner.local == {"x": 1} and tr.local is inner.local
    tr.send(("F", 0, 0, 0), ("F", 1, 0, 0), torch.ones(5))  # F(1) runs on rank 1: 5 float32 = 20 bytes
    tr.send(("B", 1, 0, 0), ("B", 0, 0, 0), torch.ones(5))  # B(0) on rank 0: local, not counted
    assert tr.timeline.sent == {"activation": 20, "gradient": 0} and tr.timeline.sent_to == {1: 20}
    clock = JobClock(tr, [("B", 0, 0, 1), ("B", 0, 0, 0)])
    clock.begin(barrier=False)
    tr.receive(("B", 1, 0, 1), ("B", 0, 0, 1))  # from rank 1: 3 float64
    clock.job_done(1)
    clock.job_done(2)
    assert tr.timeline.received == {"activation": 0, "gradient": 24}
    a, b = tr.timeline.jobs
    assert a.received and not b.received and 0 <= a.start <= a.end <= b.start <= b.end
    with pytest.raises(TypeError, match="schedule"):
        MeasuredTransport(object())
    assert isinstance(Timeline(0).makespan, float) and math.isfinite(Timeline(0).busy)


def _stop_and_go(rank: int, world: int) -> list:
    sched = pipedream(world, 1, 8)
    rt = PipelineRuntime(model_of(sched.D), schedule=sched, policy="stashing", optimizer=optimizer_of("sgdm"),
                         record=True)
    first = rt.run(data(8), stop_at_step=3)  # messages crossing the cut wait in the outbox (set through the wrapper)
    return [first, rt.run(data(8))]


@pytest.mark.slow
def test_a_run_stopped_at_a_cut_and_continued_counts_every_byte_once() -> None:
    per_rank = spawn(_stop_and_go, 2)
    sched = pipedream(2, 1, 8)
    sim = simulate(sched)
    size = BATCH * WIDTH * 8
    for w in range(2):
        first, second = (r.timeline for r in per_rank[w])
        jobs = [r.job for r in first.jobs] + [r.job for r in second.jobs]
        assert jobs == [(a.op, a.stage, a.step, a.micro) for a in sched.programs[w]]  # each job timed once
        got = first.received["activation"] + second.received["activation"]
        assert got == int(sim.activation_transfers[w]) * size
        assert first.bytes_sent + second.bytes_sent == sum(simulated_traffic(sim, [IN * BATCH * 8] + [size])[w][
            "sent"].values())


# ------------------------------------------------------------------ placed schedules: collectives vs simulator

#: (label, builder of the schedule, policy) per world size: DDP, FSDP, LPP, FSLPP, hybrid PP × DP (and its
#: asynchronous, PipeDream-style replicated stages on 4 ranks). FSDP with M = 2W runs two micro-batches of each
#: fetched stage per worker per step, where Rahimi's per-F-job count is twice the runtime's fetches.
PLACED = {
    2: [("ddp", lambda: ddp(2, 4, 2, 2), "gpipe"), ("fsdp", lambda: fsdp(2, 4, 2, 3), "gpipe"),
        ("lpp", lambda: lpp(4, 4, 2, 1, 2), "gpipe"), ("fslpp", lambda: fslpp(4, 4, 2, 1, 2), "gpipe"),
        ("hybrid", lambda: hybrid(1, 4, 2, 2), "gpipe")],
    4: [("ddp", lambda: ddp(2, 4, 4, 2), "gpipe"), ("fsdp", lambda: fsdp(4, 8, 4, 2), "gpipe"),
        ("lpp", lambda: lpp(4, 4, 2, 2, 2), "gpipe"), ("fslpp", lambda: fslpp(4, 4, 2, 2, 2), "gpipe"),
        ("hybrid", lambda: hybrid(2, 4, 2, 2), "gpipe"),
        ("hybrid async", lambda: hybrid(2, 4, 2, 3, asynchronous=True), "stashing")],
}


def _run_placed(rank: int, world: int) -> list:
    out = []
    for _, make, policy in PLACED[world]:
        sched = make()
        rt = PipelineRuntime(model_of(max(sched.D, 2)), schedule=sched, policy=policy, D=sched.D,
                             optimizer=optimizer_of("sgdm"), record=True)
        out.append(rt.run(data(sched.steps)))
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def placed(request: pytest.FixtureRequest) -> tuple[int, list]:
    return request.param, spawn(_run_placed, request.param)


@pytest.mark.slow
def test_placed_collectives_and_memory_match_the_simulator(placed: tuple[int, list]) -> None:
    """Every row exact: p2p bytes, activations, held and fetched weight versions, broadcast bytes (one fetch per
    (stage, version, worker)), reduce/all-reduce bytes; optimizer state within its stated tolerance."""
    world, per_rank = placed
    for i, (label, make, policy) in enumerate(PLACED[world]):
        sched = make()
        stages = split(model_of(max(sched.D, 2)), sched.D)
        rows = compare_memory([per_rank[w][i] for w in range(world)], sched, stages,
                              torch.zeros(BATCH // sched.M, IN, dtype=torch.float64), policy=policy,
                              optimizer=optimizer_of("sgdm"))
        assert len(rows) == 10 * world
        for r in rows:
            assert r["simulated"] is not None and r["ok"], (label, r)
        sim = simulate(sched)
        wb = [sum(p.numel() * p.element_size() for p in s.parameters()) for s in stages]
        want = simulated_collectives(sim, wb)
        for w in range(world):  # the whole counter, calls included, kind by kind
            assert per_rank[w][i].collectives == want[w], (label, w)
        moved = sum(sum(per_rank[w][i].collectives["bytes_sent"].values()) for w in range(world))
        assert moved == sum(sum(per_rank[w][i].collectives["bytes_received"].values()) for w in range(world)) > 0
        # Rahimi's count (one fetch per F job) against the runtime's (one per stage, version, worker): here every
        # fetching worker runs n = M/W (FSDP) or M/G (FSLPP) = 2 F jobs of each fetched stage per step
        got = [per_rank[w][i].collectives["bytes_received"].get("broadcast", 0) for w in range(world)]
        if label in ("fsdp", "fslpp"):
            n = sched.M // (world if label == "fsdp" else sched.params["G"])
            assert n == 2 and sim.weight_fetches.any() and any(got)
            assert (sim.weight_transfers == n * sim.weight_fetches).all()
        else:  # replicated: nothing fetched, by either count
            assert got == [0] * world and not sim.weight_fetches.any() and not sim.weight_transfers.any()
