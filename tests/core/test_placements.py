"""Placed schedules executed (emulator): DDP, FSDP, LPP, FSLPP, DualPipe and hybrid PP × DP against plain training.

Every synchronous placement must reproduce plain mini-batch training (float64, <= 1e-10) with SGD momentum and
Adam, and every holder's copy of a stage must equal the others bit for bit (they apply the same reduced
gradient). The asynchronous hybrid must have PipeDream's version table per replica.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import pipelab.emulator.emulator as emulator_module
import pipelab.pipeline.placement as placement
from pipelab.emulator import Emulator, train_plain
from pipelab.optim import optimizer_factory
from pipelab.pipeline.placement import (
    Collective,
    PlacedJob,
    collective_bytes,
    emulate_collective,
    is_placed,
    placed_sequence,
    stage_placements,
    worker_sequence,
)
from pipelab.schedules import BUILDERS, ddp, dualpipe, fsdp, fslpp, gpipe, hybrid, lpp, one_f_one_b, pipedream
from pipelab.simulator import simulate
from pipelab.studies.models import deep_mlp

TOL = 1e-10
OPTIMIZERS = {"sgdm": optimizer_factory("sgd", lr=0.05, momentum=0.9), "adam": optimizer_factory("adam", lr=1e-2)}

# (name, builder, D) : several D, M, W/G/R and steps
CASES = [
    ("ddp_W2", lambda: ddp(D=2, M=4, W=2, steps=3), 2),
    ("ddp_W4", lambda: ddp(D=3, M=4, W=4, steps=2), 3),
    ("fsdp_W2", lambda: fsdp(D=3, M=4, W=2, steps=3), 3),
    ("fsdp_W4", lambda: fsdp(D=4, M=4, W=4, steps=2), 4),
    ("lpp_G2R2", lambda: lpp(D=4, M=4, G=2, R=2, steps=3), 4),
    ("lpp_G2R2_ff", lambda: lpp(D=4, M=4, G=2, R=2, steps=3, priority="forward_first"), 4),
    ("lpp_G1R2", lambda: lpp(D=4, M=2, G=1, R=2, steps=2), 4),
    ("fslpp_G2R2", lambda: fslpp(D=4, M=4, G=2, R=2, steps=3), 4),
    ("fslpp_G2R2_ff", lambda: fslpp(D=4, M=4, G=2, R=2, steps=2, priority="forward_first"), 4),
    ("dualpipe_W2", lambda: dualpipe(W=2, M=4, steps=2), 2),
    ("dualpipe_W4", lambda: dualpipe(W=4, M=8, steps=2), 4),
    ("hybrid_D2R2", lambda: hybrid(D=2, M=4, R=2, steps=3), 2),
    ("hybrid_D3R2", lambda: hybrid(D=3, M=6, R=2, steps=2), 3),
]


def make_model(D: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return deep_mlp(in_features=6, width=8, depth=max(D, 2) + 1, activation="tanh").double()


def make_data(T: int, n: int = 8, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g))
            for _ in range(T)]


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def run_case(schedule, D: int, opt_name: str, policy: str = "gpipe"):
    model = make_model(D)
    ref = copy.deepcopy(model)
    data = make_data(schedule.steps, n=2 * schedule.M)
    emu = Emulator(model, schedule=schedule, policy=policy, D=D, optimizer=OPTIMIZERS[opt_name])
    res = emu.run(data)
    ref_losses = train_plain(ref, D=D, optimizer=OPTIMIZERS[opt_name], batches=data)
    return model, ref, res, ref_losses, emu


def test_kinds_of_the_builders():
    kinds = {name: {p.kind for p in stage_placements(make())} for name, make, _ in CASES}
    assert kinds["ddp_W2"] == kinds["lpp_G2R2"] == kinds["dualpipe_W2"] == kinds["hybrid_D2R2"] == {"replicated"}
    assert kinds["fsdp_W2"] == kinds["fslpp_G2R2"] == {"sharded"}
    assert {p.kind for p in stage_placements(one_f_one_b(3, 2))} == {"single"}
    assert not is_placed(gpipe(2, 2)) and is_placed(ddp(2, 2))
    assert BUILDERS["hybrid"] is hybrid


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name,make,D", CASES, ids=[c[0] for c in CASES])
def test_placed_schedules_equal_plain_training(name, make, D, opt_name):
    schedule = make()
    model, ref, res, ref_losses, emu = run_case(schedule, D, opt_name)
    assert max_diff(model, ref) <= TOL
    assert np.allclose(res.losses, ref_losses, rtol=0, atol=TOL)
    # every holder's copy equals the owner's (the user's model) exactly
    places = stage_placements(schedule) if is_placed(schedule) else ()  # lpp with G = 1 is a looped pipeline
    for k, p in enumerate(places):
        owner = res.extra["copies"][(p.holders[0], k)]
        for h in p.holders[1:]:
            assert all(torch.equal(a, b) for a, b in zip(owner, res.extra["copies"][(h, k)])), (k, h)
    # the versions jobs ran at are the version table's
    table = emu.table
    assert all(v == table.version(job) for job, v in res.current.items())


def test_skipping_the_all_reduce_breaks_equivalence(monkeypatch):
    """Without the all-reduce each DDP replica applies its own micro-batches' gradient: far from plain training."""
    schedule = ddp(D=2, M=4, W=2, steps=3)

    def no_all_reduce(c, copies, counter=None):
        if c.kind == "all_reduce":
            for w in c.holders:
                copies[(w, c.stage)].acc.setdefault(c.step, [torch.zeros_like(p) for p in copies[(w, c.stage)].params])
            return
        emulate_collective(c, copies, counter)

    monkeypatch.setattr(emulator_module, "emulate_collective", no_all_reduce)
    model, ref, res, _, _ = run_case(schedule, 2, "sgdm")
    assert max_diff(model, ref) > 1e-4
    copies = res.extra["copies"]
    assert any(not torch.equal(a, b) for a, b in zip(copies[(0, 0)], copies[(1, 0)]))


def test_sequence_places_collectives_between_gradients_updates_and_uses():
    s = fsdp(D=2, M=4, W=2, steps=2)
    sim = simulate(s)
    table = sim.version_table
    seq = placed_sequence(sim, table.version)
    colls = [e for e in seq if isinstance(e, Collective)]
    # stage k owned by worker k: version 0 and 1 broadcast, one reduce per (k, t)
    assert sorted((c.kind, c.stage, c.version) for c in colls if c.kind == "broadcast") == [
        ("broadcast", 0, 0), ("broadcast", 0, 1), ("broadcast", 1, 0), ("broadcast", 1, 1)]
    assert sorted((c.stage, c.step, c.root) for c in colls if c.kind == "reduce") == [(0, 0, 0), (0, 1, 0),
                                                                                      (1, 0, 1), (1, 1, 1)]
    for c in colls:
        pos = seq.index(c)
        if c.kind == "reduce":  # after every B of its step, before every U
            assert all(seq.index(PlacedJob("B", c.stage, c.step, j, s.worker_of("B", c.stage, c.step, j))) < pos
                       for j in range(4))
            assert seq.index(PlacedJob("U", c.stage, c.step, -1, c.root)) > pos
        else:  # before every use by a receiver
            for j in range(4):
                w = s.worker_of("F", c.stage, c.version, j)
                if w in c.holders and c.version < 2:
                    assert seq.index(PlacedJob("F", c.stage, c.version, j, w)) > pos
    # each worker's part keeps its program order
    for w in range(2):
        mine = [(e.op, e.stage, e.step, e.micro) for e in worker_sequence(seq, w) if isinstance(e, PlacedJob)]
        assert mine == [(a.op, a.stage, a.step, a.micro) for a in s.programs[w]]


def test_collective_byte_conventions_balance():
    for kind in ("all_reduce", "reduce", "broadcast"):
        for P in (2, 3, 4):
            sent = sum(collective_bytes(kind, 800, P, r == 0)[0] for r in range(P))
            got = sum(collective_bytes(kind, 800, P, r == 0)[1] for r in range(P))
            assert sent == got
    assert collective_bytes("all_reduce", 800, 2, False) == (800, 800)
    with pytest.raises(ValueError, match="kind must be one of"):
        collective_bytes("gather", 8, 2, True)


@pytest.mark.parametrize("bucket_bytes, calls", [(0, 2 * 3), (None, 3), (1, 2 * 3)])
def test_ddp_collective_counts(monkeypatch, bucket_bytes, calls):
    """Unbucketed (cap 0, or a cap below every stage): one all-reduce per stage and step; bucketed (25 MiB):
    both stages' gradients fused into one all-reduce per step. Bytes are the same either way."""
    if bucket_bytes is not None:
        monkeypatch.setattr(placement, "BUCKET_BYTES", bucket_bytes)
    schedule = ddp(D=2, M=4, W=2, steps=3)
    _, _, res, _, emu = run_case(schedule, 2, "sgdm")
    stage_bytes = [sum(p.numel() * p.element_size() for p in st.params) for st in emu.stages]
    for w in range(2):
        c = res.extra["collectives"][w]
        assert c["calls"] == {"all_reduce": calls}
        assert c["bytes_sent"]["all_reduce"] == c["bytes_received"]["all_reduce"] == 3 * sum(stage_bytes)


def test_ddp_all_reduces_of_a_step_form_one_run_after_its_last_backward():
    """DDP's all-reduces of step t meet after the step's last B (its updates deferred), are marked as one run,
    and each is launched right after this worker's last B of its own stage."""
    seq = placed_sequence(simulate(ddp(D=3, M=4, W=2, steps=2)))
    for w in range(2):
        prog = worker_sequence(seq, w)
        L = placement.launch_positions(prog)
        ars = [i for i, e in enumerate(prog) if isinstance(e, placement.Collective)]
        assert [(prog[i].stage, prog[i].step) for i in ars] == [(2, 0), (1, 0), (0, 0), (2, 1), (1, 1), (0, 1)]
        for i in ars:
            c = prog[i]
            assert c.bucket == ((2, c.step), (1, c.step), (0, c.step))
            last_b = max(j for j, e in enumerate(prog) if not isinstance(e, placement.Collective)
                         and e[:3] == ("B", c.stage, c.step))
            assert L[i] == last_b + 1
        # the first stage's all-reduce overlaps the other stages' last backwards; all are launched by the run's
        # first entry, where the fused bucket is waited for
        assert L[ars[0]] < L[ars[1]] < L[ars[2]] <= ars[0]
        assert [e[:2] for e in prog[L[ars[0]]:ars[0]]] == [("B", 1), ("B", 0)]


def test_bucket_parts_caps_buckets_in_order():
    c = placement.Collective("all_reduce", 0, 0, -1, (0, 1), -1, (0, 1), ((2, 0), (1, 0), (0, 0)))
    size = {0: 30, 1: 10, 2: 10}.__getitem__
    assert placement.bucket_parts(c, size, 20) == ((0, 0),)  # a stage larger than the cap: alone
    assert placement.bucket_parts(c._replace(stage=1), size, 20) == ((2, 0), (1, 0))
    assert placement.bucket_parts(c._replace(stage=1), size, 0) == ((1, 0),)
    assert placement.bucket_parts(c._replace(stage=1), size, 50) == ((2, 0), (1, 0), (0, 0))
    with pytest.raises(ValueError, match="bucket_bytes"):
        placement.bucket_parts(c, size, -1)


def test_async_hybrid_version_table_is_pipedreams_per_replica():
    for D, M, R in ((3, 4, 2), (2, 3, 3), (4, 4, 4)):
        a = simulate(hybrid(D, M, R, steps=6, asynchronous=True)).version_table
        b = simulate(pipedream(D, M // R, steps=6)).version_table
        for r in range(R):
            assert np.array_equal(a.forward[:, :, r::R], b.forward)
            assert np.array_equal(a.backward[:, :, r::R], b.backward)
        assert np.array_equal(a.staleness("F")[:, :, ::R], b.staleness("F"))
        assert a.max_staleness() == b.max_staleness()


@pytest.mark.parametrize("policy", ["stashing", "pipeoptim"])
def test_async_hybrid_replicas_share_versions(policy):
    schedule = hybrid(D=3, M=4, R=2, steps=5, asynchronous=True)
    model = make_model(3)
    emu = Emulator(model, schedule=schedule, policy=policy, optimizer=OPTIMIZERS["adam"])
    res = emu.run(make_data(5))
    assert all(np.isfinite(res.losses))
    for k in range(3):
        assert all(torch.equal(a, b) for a, b in zip(res.extra["copies"][(k, k)], res.extra["copies"][(3 + k, k)]))
    # each replica holds the versions PipeDream with M/R micro-batches per update holds
    single = Emulator(make_model(3), schedule=pipedream(3, 2, steps=5), policy=policy, optimizer=OPTIMIZERS["adam"])
    assert res.ring_capacity == single.capacity


def test_hybrid_rejects_bad_sizes():
    with pytest.raises(ValueError, match="M divisible by R"):
        hybrid(D=2, M=3, R=2)


def test_placed_schedules_refuse_what_they_cannot_run():
    model = make_model(2)
    with pytest.raises(ValueError, match="does not hold them"):
        Emulator(model, schedule=_async_fsdp(), policy="pipeoptim", D=2, optimizer=OPTIMIZERS["adam"])
    with pytest.raises(ValueError, match="corrects the step's gradient"):
        Emulator(model, schedule=hybrid(D=2, M=2, R=2, steps=2, asynchronous=True), policy="error_feedback",
                 optimizer=OPTIMIZERS["sgdm"])


def test_a_fetched_copy_keeps_no_dropped_version():
    """A non-holder's copy receives its versions and makes none, so the ring's reuse of dropped versions' tensors
    (rings.py), which only a stage's own copies use, must not keep them: its dropped versions are freed."""
    s = _async_fsdp()
    emu = Emulator(make_model(2), schedule=s, D=2, policy="stashing", optimizer=OPTIMIZERS["adam"])
    emu.run(make_data(s.steps))
    fetched = [st for st in emu.plan.copies.values() if isinstance(st, placement.FetchedStage)]
    assert fetched and max(st.ring.capacity for st in fetched) > 1  # where the ring would have kept one
    assert all(not st.ring.recycle and not st.ring._retired for st in fetched)


def _async_fsdp():
    from pipelab.schedules import construct

    # asynchronous 1F1B placement with both stages' weights on worker 1: worker 0 computes stage 0 stale
    return construct(2, 1, 2, compute=lambda s, b, d: s, weights=lambda s: 1, sync_lag=None, steps=4,
                     max_in_flight=[2, 1], name="async sharded")


@pytest.mark.parametrize("D,M,R", [(2, 4, 2), (3, 6, 2), (3, 6, 3)])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_hybrid_is_the_general_constructor(D, M, R, asynchronous):
    """The closed form equals construct() with w_compute = (b mod R)·D + s, every replica holding its stages,
    1F1B's priority and admission D − k: the closed form is only the faster way to write it."""
    from pipelab.schedules import construct

    h = hybrid(D, M, R, steps=3, asynchronous=asynchronous)
    c = construct(D, M, D * R, compute=lambda s, b, d: (b % R) * D + s,
                  weights=lambda s: tuple(r * D + s for r in range(R)), priority="backward_first",
                  max_in_flight=[D - k for _ in range(R) for k in range(D)], steps=3,
                  sync_lag=None if asynchronous else 0)
    assert h.programs == c.programs and h.weight_holders == c.weight_holders


def test_sharded_stage_with_two_holders_and_a_non_holder():
    """Stage weights on workers 0 and 1, computed by 0, 1 and 2: worker 2 fetches, gradients are all-reduced
    among all three and both holders apply the same update."""
    from pipelab.schedules import construct

    s = construct(2, 3, 3, compute=lambda st, b, d: b % 3, weights=lambda st: (0, 1), steps=3, name="2-holder")
    assert {p.kind for p in stage_placements(s)} == {"sharded"}
    model, ref, res, ref_losses, _ = run_case(s, 2, "adam")
    assert max_diff(model, ref) <= TOL
    kinds = res.extra["collectives"][2]["calls"]
    assert kinds == {"broadcast": 2 * 3, "all_reduce": 2 * 3}
    for k in range(2):
        assert all(torch.equal(a, b) for a, b in zip(res.extra["copies"][(0, k)], res.extra["copies"][(1, k)]))


@pytest.mark.parametrize("builder", ["ddp", "fsdp"])
def test_placed_schedules_in_bf16_equal_plain_bf16_training(builder: str) -> None:
    """bf16 autocast with fp32 masters on replicated and sharded stages is plain micro-batched bf16 training
    (measured: bitwise equal; bound 1e-6 for a summation order a future all-reduce might change)."""
    from functools import partial

    from pipelab.schedules import BUILDERS

    def model() -> torch.nn.Sequential:
        torch.manual_seed(0)
        return deep_mlp(in_features=6, width=8, depth=4)

    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=gen), torch.randint(0, 10, (8,), generator=gen)) for _ in range(3)]
    opt = partial(torch.optim.Adam, lr=1e-2)
    em = Emulator(model(), schedule=BUILDERS[builder](4, 2, steps=3), policy="gpipe", optimizer=opt,
                  precision="bf16")
    em.run(batches)
    plain = model()
    train_plain(plain, optimizer=opt, batches=batches, micro_batches=2, precision="bf16")
    for got, ref in zip((w for ws in em.weights() for w in ws), plain.parameters()):
        assert torch.allclose(got, ref.detach(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="fp16 with loss scaling is not supported on placed schedules"):
        Emulator(model(), schedule=BUILDERS[builder](4, 2, steps=3), policy="gpipe", optimizer=opt, precision="fp16")
