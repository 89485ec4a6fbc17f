"""The simulator's link model (issue 27): reduction to transfer_cost, wire contention worked by hand, duplex,
collectives against their formulas, utilisation, bytes from real tensors, what bound each start and the
critical path."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from pipelab.links import Link, MessageBytes, Network, collective_time, message_bytes
from pipelab.schedules import Action, Schedule, ddp, fsdp, gpipe, one_f_one_b, validate
from pipelab.simulator import BINDINGS, SimResult, simulate
from tests.core.test_simulator_timing import SCHEDULES


def network_of(D: int, fwd: np.ndarray, bwd: np.ndarray, bandwidth: float = math.inf, **kw: object) -> Network:
    return Network([Link(float(a), bandwidth) for a in fwd], [Link(float(a), bandwidth) for a in bwd], **kw)


def random_costs(s: Schedule, rng: np.random.Generator) -> dict:
    return {"f_cost": rng.uniform(0.5, 2.0, s.D), "b_cost": rng.uniform(1.0, 3.0, s.D),
            "u_cost": rng.uniform(0.0, 0.3, s.D)}


@pytest.mark.parametrize("s", SCHEDULES, ids=[s.name for s in SCHEDULES])
def test_beta_infinite_alpha_transfer_cost_is_todays_model(s: Schedule) -> None:
    """β = ∞, α = transfer_cost[k] in both directions: the same starts, ends and timing order, float for float; and
    through the wires (β finite but every n/β below the last bit of any time) the same starts and ends (the wires
    time the jobs in another topological order)."""
    rng = np.random.default_rng(s.D * 31 + s.M)
    costs = random_costs(s, rng)
    tc = rng.uniform(0.0, 0.6, s.D - 1) * (rng.random(s.D - 1) < 0.8)
    want = simulate(s, **costs, transfer_cost=tc)
    for net, nbytes in ((network_of(s.D, tc, tc, receive_overhead=0.0), None),
                        (network_of(s.D, tc, tc, bandwidth=1e300, receive_overhead=0.0), 1.0)):
        got = simulate(s, **costs, network=net, message_bytes=nbytes)
        np.testing.assert_array_equal(got.start, want.start)
        np.testing.assert_array_equal(got.end, want.end)
        if nbytes is None:
            np.testing.assert_array_equal(got.seq, want.seq)
    assert got.wire_times is not None or not len(got.messages.consumer)  # the second went through the wires
    validate(got)


def crossed() -> Schedule:
    """Two stages on two workers, micro-batches alternating: worker 1 receives micro-batch 1's gradient (from
    B1.1 on worker 0) and micro-batch 2's activation (from F0.2, right after B1.1) on one wire."""
    def job(op: str, k: int, j: int = -1) -> Action:
        return Action(op, k, 0, j)

    return Schedule("crossed", ((job("F", 0, 0), job("F", 1, 1), job("B", 1, 1), job("F", 0, 2), job("B", 0, 0),
                                 job("B", 0, 2), job("U", 0), job("U", 1)),
                                (job("F", 0, 1), job("F", 1, 0), job("B", 1, 0), job("F", 1, 2), job("B", 1, 2),
                                 job("B", 0, 1), job("U", 0), job("U", 1))), D=2, M=3, weight_holders=((0, 1), (0, 1)))


def by_job(r: SimResult) -> dict[str, tuple[float, float]]:
    flat = [str(a) + (f"@{w}" if a.op == "U" else "") for w, p in enumerate(r.schedule.programs) for a in p]
    return {a: (float(r.start[i]), float(r.end[i])) for i, a in enumerate(flat)}


def test_wire_contention_worked_by_hand() -> None:
    """F = 1, B = 2, α = 0.5, n/β = 200 B / 100 B/s = 2 on every message.

    Half duplex: F0.0 and F0.1 end at 1, their activations are ready at 1.5 and arrive at 3.5 (F1.1 and F1.0
    start). B1.1 [4.5, 6.5] sends gradient g1 to worker 1 (ready 7, arrives 9); F0.2 [6.5, 7.5] sends activation
    a2 to worker 1, ready at 8 but the wire carries g1 until 9: a2 arrives at 11 (queued 1). F1.2 [11, 12], B1.2
    [12, 14] sends g2 to worker 0: ready 14.5, arrives 16.5, B0.2 [16.5, 18.5]; the updates wait for it: 18.5.
    Duplex: a2 has the activation wire to itself, arrives at 10; F1.2 [10, 11], B1.2 [11, 13], g2 arrives at 15.5,
    B0.2 [15.5, 17.5].
    """
    half = simulate(crossed(), 1.0, 2.0, network=Network.uniform(2, Link(0.5, 100.0)), message_bytes=200)
    t = by_job(half)
    assert (t["F1.1"], t["F1.0"], t["B1.1"], t["F0.2"]) == ((3.5, 4.5), (3.5, 4.5), (4.5, 6.5), (6.5, 7.5))
    assert (t["B0.0"], t["F1.2"], t["B1.2"], t["B0.1"], t["B0.2"]) == ((9.0, 11.0), (11.0, 12.0), (12.0, 14.0),
                                                                       (14.0, 16.0), (16.5, 18.5))
    assert t["U0@0"] == t["U1@1"] == (18.5, 18.5) and half.makespan == 18.5
    m = half.messages
    a2 = int(np.flatnonzero(m.consumer == list(by_job(half)).index("F1.2"))[0])
    assert (m.send[a2], m.ready[a2], m.begin[a2], m.arrival[a2]) == (7.5, 8.0, 9.0, 11.0)
    duplex = simulate(crossed(), 1.0, 2.0, network=Network.uniform(2, Link(0.5, 100.0), duplex=True),
                      message_bytes=200)
    t = by_job(duplex)
    assert (t["F1.2"], t["B1.2"], t["B0.2"]) == ((10.0, 11.0), (11.0, 13.0), (15.5, 17.5)) and duplex.makespan == 17.5
    # the half-duplex critical path runs through a2's wait behind g1
    path = [(what, i) for what, i, _ in half.critical_path()]
    g1 = int(np.flatnonzero(m.consumer == list(by_job(half)).index("B0.1"))[0])
    assert path[path.index(("transmission", a2)) - 1] == ("transmission", g1)
    assert sum(d for _, _, d in half.critical_path()) == pytest.approx(18.5)
    assert half.link_time == pytest.approx((3 * 0.5 + 4 * 2.0) / 18.5)
    assert BINDINGS[half.binding.kind[list(by_job(half)).index("F1.2")]] == "transmission"
    validate(half), validate(duplex)


def test_activations_serialise_on_one_wire_closed_form() -> None:
    """GPipe on 2 workers, F = 1, n/β = 3 > F: activation j leaves at j + 1 and arrives at 1 + α + 3(j + 1)."""
    M, alpha = 5, 0.25
    r = simulate(gpipe(2, M), 1.0, 1.0, network=Network.uniform(2, Link(alpha, 10.0)), message_bytes=30)
    for j in range(M):
        assert r.time_of("F", 1, 0, j)[0] == 1 + alpha + 3 * (j + 1)
    # only activations reach worker 1 and only gradients worker 0: a second wire changes nothing
    same = simulate(gpipe(2, M), 1.0, 1.0, network=Network.uniform(2, Link(alpha, 10.0), duplex=True),
                    message_bytes=30)
    np.testing.assert_array_equal(same.end, r.end)
    np.testing.assert_allclose(r.wire_utilisation, [M * 3 / r.makespan] * 2)


def chain(o: float) -> SimResult:
    """A 2-stage chain, one micro-batch on 2 workers (F0, F1, B1, B0): F = (1, 2), B = (4, 3), α = 0.25,
    n/β = 200 B / 100 B/s = 2, receive overhead o."""
    return simulate(gpipe(2, 1), [1.0, 2.0], [4.0, 3.0], network=Network.uniform(2, Link(0.25, 100.0),
                                                                                receive_overhead=o), message_bytes=200)


def test_receive_overhead_on_a_two_stage_chain_closed_form() -> None:
    """Both messages wait out α + n/β and then o on an idle receiver (LogP, Culler et al. 1993): F1 starts at
    1 + 0.25 + 2 + o = 3.25 + o, B1 at 5.25 + o, the gradient arrives at 8.25 + o + 2.25 and B0 starts o later,
    at 10.5 + 2o; makespan 1 + 2 + 3 + 4 + 2(2.25 + o). The arrivals are the wire's, o after them; o = 0 is the
    link model without it."""
    for o in (0.0, 0.5, 1.75):
        r = chain(o)
        assert r.time_of("F", 1, 0, 0) == (3.25 + o, 5.25 + o)
        assert r.time_of("B", 0, 0, 0) == (10.5 + 2 * o, 14.5 + 2 * o)
        assert r.makespan == 10 + 2 * (2.25 + o)
        m = r.messages
        np.testing.assert_array_equal(np.sort(m.arrival), [3.25, 10.5 + o])  # o is not on the wire
        assert sum(d for _, _, d in r.critical_path()) == r.makespan
        assert r.link_time == 2 * (2.25 + o) / r.makespan
        assert [x for x in r.critical_path() if x[0] == "overhead"] == ([] if o == 0 else
                                                                       [("overhead", i, o) for i in (0, 1)])
    # the largest part of a message's delay names the binding: o = 1.75 < n/β = 2, o = 2.5 > 2
    kind = BINDINGS[chain(1.75).binding.kind[1]], BINDINGS[chain(2.5).binding.kind[1]]
    assert kind == ("transmission", "overhead")


def test_receive_overhead_stays_off_the_wire_and_overlaps_a_busy_receiver() -> None:
    """GPipe on 2 workers, F = 1, n/β = 3: activation j still arrives at 1 + α + 3(j + 1) (the next transmission
    begins at the arrival, not o later); F1.j starts at arrival + o when o ≤ 2 (idle receiver). With B = 8 on
    stage 1 worker 1 is busy past every later arrival + o: F1.j starts when F1.(j−1) ends, as without o."""
    M, alpha, o = 5, 0.25, 0.5
    net = Network.uniform(2, Link(alpha, 10.0), receive_overhead=o)
    r = simulate(gpipe(2, M), 1.0, 1.0, network=net, message_bytes=30)
    for j in range(M):
        assert r.time_of("F", 1, 0, j)[0] == 1 + alpha + 3 * (j + 1) + o
    without = simulate(gpipe(2, M), 1.0, 1.0, network=replace(net, receive_overhead=0.0), message_bytes=30).messages
    np.testing.assert_array_equal(r.messages.arrival[r.messages.kind == 0], without.arrival[without.kind == 0])
    busy = simulate(gpipe(2, M), [1.0, 8.0], 1.0, network=net, message_bytes=30)
    plain = simulate(gpipe(2, M), [1.0, 8.0], 1.0, network=replace(net, receive_overhead=0.0), message_bytes=30)
    assert busy.time_of("F", 1, 0, 0)[0] == plain.time_of("F", 1, 0, 0)[0] + o
    for j in range(1, M):
        assert busy.time_of("F", 1, 0, j)[0] == busy.time_of("F", 1, 0, j - 1)[1]


@pytest.mark.parametrize("s", SCHEDULES[::2], ids=[s.name for s in SCHEDULES[::2]])
def test_receive_overhead_with_free_links_is_a_longer_latency(s: Schedule) -> None:
    """β = ∞: nothing queues, so o after the arrival is the scalar model with transfer_cost = α + o (up to the
    rounding of (s + α) + o against s + (α + o))."""
    rng = np.random.default_rng(s.D * 13 + s.M)
    costs, tc, o = random_costs(s, rng), rng.uniform(0.0, 0.6, s.D - 1), 0.125
    got = simulate(s, **costs, network=network_of(s.D, tc, tc, receive_overhead=o))
    want = simulate(s, **costs, transfer_cost=tc + o)
    np.testing.assert_allclose(got.end, want.end, rtol=1e-13, atol=1e-13)
    validate(got)


@pytest.mark.parametrize("o", [-0.1, math.inf, math.nan, "1"])
def test_receive_overhead_must_be_seconds(o: object) -> None:
    with pytest.raises(TypeError if isinstance(o, str) else ValueError, match="receive_overhead"):
        Network.uniform(2, Link(), receive_overhead=o)  # type: ignore[arg-type]


@pytest.mark.parametrize("s", SCHEDULES[::3], ids=[s.name for s in SCHEDULES[::3]])
def test_utilisation_binding_and_critical_path_on_random_networks(s: Schedule) -> None:
    rng = np.random.default_rng(s.D + 7 * s.M)
    net = Network([Link(*x) for x in zip(rng.uniform(0, 0.3, s.D - 1), rng.uniform(50, 500, s.D - 1))],
                  [Link(*x) for x in zip(rng.uniform(0, 0.3, s.D - 1), rng.uniform(50, 500, s.D - 1))],
                  duplex=bool(rng.random() < 0.5), receive_overhead=float(rng.choice([0.0, 0.05])))
    dispatch = rng.choice([0.0, 0.03]) * rng.random(s.D)  # a worker's own time before each job (or none)
    r = simulate(s, **random_costs(s, rng), network=net,
                 message_bytes=MessageBytes(*(tuple(rng.uniform(0, 200, s.D - 1)) for _ in range(2))),
                 dispatch_cost=dispatch)
    validate(r)
    for u in (r.link_utilisation, r.wire_utilisation):
        assert np.all((u >= 0) & (u <= 1 + 1e-12))
    m, b = r.messages, r.binding
    assert np.all(m.ready >= m.send) and np.all(m.begin >= m.ready) and np.all(m.arrival >= m.begin)
    path = r.critical_path()
    assert sum(d for _, _, d in path) == pytest.approx(r.makespan, rel=1e-12)
    assert 0 <= r.link_time <= 1
    kinds = np.array(BINDINGS)[b.kind]
    first = np.isin(np.arange(len(r.start)), r.compiled.offsets[:-1])
    d = np.zeros(len(r.start)) if r.dispatch is None else r.dispatch
    assert np.all(r.start[kinds == "start"] == d[kinds == "start"]) and np.all(first[kinds == "start"])
    # the dispatch on the path is exactly that of the jobs its worker (or t = 0) bound, and it is not link time
    assert sum(x for what, _, x in path if what == "dispatch") == pytest.approx(
        sum(d[i] for what, i, _ in path if what == "job" and kinds[i] in ("start", "worker")), abs=1e-12)
    assert r.link_time == pytest.approx(sum(x for what, _, x in path if what not in ("job", "dispatch"))
                                        / r.makespan, rel=1e-12)
    msg = b.message >= 0
    np.testing.assert_array_equal(r.start[msg], m.arrival[b.message[msg]] + net.receive_overhead)
    assert np.all(r.start[m.consumer] >= m.arrival + net.receive_overhead)
    bound = (b.job >= 0) & ~msg
    assert np.all(r.start[bound] >= r.end[b.job[bound]])


def test_ring_all_reduce_lengthens_ddp_updates() -> None:
    """DDP on 4 workers: every U(k, t) on every holder costs u + 2·3·α + 2·3/4 · n/β (n = stage k's weight bytes)."""
    s = ddp(2, 4, steps=2)
    link, wb = Link(0.01, 1e6), [4e4, 8e4]
    r = simulate(s, 1.0, 2.0, u_cost=0.5, weight_bytes=wb, network=Network.uniform(2, Link(), collective=link))
    c = r.compiled
    for k in range(2):
        want = 0.5 + 2 * 3 * 0.01 + 2 * 3 / 4 * wb[k] / 1e6
        assert want == pytest.approx(0.5 + collective_time("all_reduce", 4, wb[k], link))
        np.testing.assert_allclose(r.cost[c.u_ids[c.stage[c.u_ids] == k]], want, rtol=1e-15)
    free = simulate(s, 1.0, 2.0, u_cost=0.5, weight_bytes=wb, network=Network.uniform(2, Link()))
    np.testing.assert_array_equal(free.end, simulate(s, 1.0, 2.0, u_cost=0.5).end)  # a free link: no cost


def test_fsdp_weight_fetch_is_a_tree_broadcast_and_a_reduce() -> None:
    """FSDP, D = 4 on 4 workers: worker w holds stage w, everyone computes every stage. A job reading stage k
    elsewhere waits ⌈log2 4⌉(α + n/β) after the barrier's update; U(k) is a binomial-tree reduce onto the holder."""
    s = fsdp(4, 4, steps=2)
    link, wb = Link(0.02, 1e5), [1e3, 2e3, 3e3, 4e3]
    r = simulate(s, 1.0, 1.0, weight_bytes=wb, network=Network.uniform(4, Link(0.001), collective=link))
    c = r.compiled
    fetch = (c.dep3 >= 0) & (c.src != c.worker)
    assert fetch.any()
    np.testing.assert_allclose(r.latency[2][fetch], [2 * (0.02 + wb[k] / 1e5) for k in c.stage[fetch]], rtol=1e-15)
    np.testing.assert_allclose(r.cost[c.u_ids], [2 * (0.02 + wb[k] / 1e5) for k in c.stage[c.u_ids]], rtol=1e-15)
    assert np.all(r.start[fetch] >= r.end[c.dep3[fetch]] + r.latency[2][fetch])


def test_the_collective_link_is_the_slowest_near_its_members() -> None:
    """Hybrid-like: no explicit collective link, so DDP's all-reduce runs on the slowest boundary link."""
    s = ddp(3, 2)
    slow, fast = Link(0.2, 1e3), Link(0.01, 1e6)
    r = simulate(s, weight_bytes=100.0, network=Network([fast, slow], [fast, fast]), message_bytes=0)
    np.testing.assert_allclose(r.cost[r.compiled.u_ids], collective_time("all_reduce", 2, 100.0, slow))


def test_message_bytes_from_a_real_model_reach_the_messages() -> None:
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(8, 32), nn.ReLU()), nn.Linear(32, 16), nn.Linear(16, 4)]
    mb = message_bytes(stages, torch.zeros(6, 8), dtype=torch.bfloat16)
    assert mb == MessageBytes((6 * 32 * 2, 6 * 16 * 2), (6 * 32 * 2, 6 * 16 * 2))
    r = simulate(one_f_one_b(3, 4), network=Network.uniform(3, Link(0.0, 384.0)), message_bytes=mb)
    m = r.messages
    np.testing.assert_array_equal(m.nbytes, np.array(mb)[m.kind, m.boundary])
    np.testing.assert_allclose(m.arrival - m.begin, m.nbytes / 384.0)
    assert r.makespan > simulate(one_f_one_b(3, 4)).makespan


@pytest.mark.parametrize("kwargs, match", [
    ({"transfer_cost": 0.5}, "not both"),
    ({"network": Network.uniform(3, Link())}, "for D=2 stages"),
    ({"network": Network.uniform(2, Link(0.1, 10.0))}, "pass message_bytes"),
    ({"message_bytes": [1.0, 2.0]}, "one per boundary"),
    ({"message_bytes": -1.0}, ">= 0"),
    ({"weight_bytes": 10.0, "weight_transfer_cost": 0.2}, "leave weight_transfer_cost at 0"),
])
def test_link_model_refuses_mixed_or_missing_inputs(kwargs: dict, match: str) -> None:
    args = {"network": Network.uniform(2, Link(0.1))} | kwargs
    with pytest.raises(ValueError, match=match):
        simulate(gpipe(2, 2), **args)
