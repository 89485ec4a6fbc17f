"""Placed schedules on real processes (gloo, CPU, float64): DDP, FSDP, LPP, FSLPP and hybrid PP × DP.

Each run's weights equal the emulator's and plain training's (<= 1e-10); DDP equals torch's
DistributedDataParallel; the bytes each rank moves per collective kind equal the emulator's count; a rank
that fails inside or before a collective makes the run end with its traceback in bounded time.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pipelab.distributed import RankFailure, spawn
from pipelab.emulator import Emulator, train_plain
from pipelab.runtime import PipelineRuntime
from pipelab.schedules import ddp, dualpipe, fsdp, fslpp, hybrid, lpp
from pipelab.studies.models import deep_mlp

TOL = 1e-10
BATCH = 8


def make_schedule(case: dict) -> Any:
    name, steps = case["schedule"], case["steps"]
    if name == "ddp":
        return ddp(D=case["D"], M=case["M"], W=case["W"], steps=steps)
    if name == "fsdp":
        return fsdp(D=case["D"], M=case["M"], W=case["W"], steps=steps)
    if name == "lpp":
        return lpp(D=case["D"], M=case["M"], G=case["G"], R=case["R"], steps=steps)
    if name == "fslpp":
        return fslpp(D=case["D"], M=case["M"], G=case["G"], R=case["R"], steps=steps)
    if name == "dualpipe":
        return dualpipe(W=case["W"], M=case["M"], steps=steps)
    if name == "hybrid":
        return hybrid(D=case["D"], M=case["M"], R=case["R"], steps=steps, asynchronous=case.get("async", False))
    raise ValueError(name)


def optimizer(case: dict) -> Any:
    if case.get("optimizer") == "adam":
        return lambda ps: torch.optim.Adam(ps, lr=0.01)
    return lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def make_model(case: dict) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return deep_mlp(in_features=6, width=8, depth=case["D"] + 1, num_classes=4).double()


def batches(steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(steps)]


def _run_cases(rank: int, world: int, cases: list[dict]) -> list:
    out = []
    for case in cases:
        rt = PipelineRuntime(make_model(case), schedule=make_schedule(case), policy=case.get("policy", "gpipe"),
                             D=case["D"], optimizer=optimizer(case))
        out.append(rt.run(batches(case["steps"])))
    return out


def emulate(case: dict) -> tuple[Emulator, Any, torch.nn.Sequential]:
    model = make_model(case)
    emu = Emulator(model, schedule=make_schedule(case), policy=case.get("policy", "gpipe"), D=case["D"],
                   optimizer=optimizer(case))
    return emu, emu.run(batches(case["steps"])), model


CASES_2 = [dict(schedule="ddp", D=2, M=4, W=2, steps=3),
           dict(schedule="ddp", D=3, M=4, W=2, steps=2, optimizer="adam"),
           dict(schedule="fsdp", D=2, M=4, W=2, steps=3),
           dict(schedule="fsdp", D=3, M=2, W=2, steps=2, optimizer="adam"),
           dict(schedule="lpp", D=2, M=4, G=2, R=1, steps=3),
           dict(schedule="fslpp", D=2, M=4, G=2, R=1, steps=3, optimizer="adam"),
           dict(schedule="dualpipe", D=2, M=4, W=2, steps=2, optimizer="adam")]
CASES_4 = [dict(schedule="lpp", D=4, M=4, G=2, R=2, steps=2),
           dict(schedule="fslpp", D=4, M=4, G=2, R=2, steps=2, optimizer="adam"),
           dict(schedule="ddp", D=2, M=4, W=4, steps=2),
           dict(schedule="fsdp", D=4, M=4, W=4, steps=2),
           dict(schedule="hybrid", D=2, M=4, R=2, steps=3),
           dict(schedule="hybrid", D=2, M=4, R=2, steps=6, policy="stashing", optimizer="adam", **{"async": True}),
           dict(schedule="hybrid", D=2, M=4, R=2, steps=6, policy="pipeoptim", optimizer="adam", **{"async": True})]


def _name(c: dict) -> str:
    return f"{c['schedule']}{'-async-' + c['policy'] if c.get('async') else ''}-D{c['D']}-M{c['M']}"


@pytest.fixture(scope="module")
def results_2() -> list:
    return spawn(_run_cases, 2, (CASES_2,), timeout_s=120)


@pytest.fixture(scope="module")
def results_4() -> list:
    return spawn(_run_cases, 4, (CASES_4,), timeout_s=120)


def check(case: dict, per_rank: list) -> None:
    emu, res, model = emulate(case)
    sched = make_schedule(case)
    copies = res.extra["copies"]
    for r in per_rank:
        for k, W in r.weights.items():
            assert r.rank in sched.weight_holders[k]
            for a, b in zip(W, copies[(r.rank, k)]):
                assert (a - b).abs().max().item() <= TOL, (case, k, r.rank)
        assert r.losses == pytest.approx(res.losses, abs=TOL)
        assert r.collectives == res.extra["collectives"][r.rank], (case, r.rank)
    held = {(r.rank, k) for r in per_rank for k in r.weights}
    assert held == {(h, k) for k in range(sched.D) for h in sched.weight_holders[k]}
    observed = {key: v for r in per_rank for key, v in r.current.items()}
    assert observed == res.current
    if not case.get("async"):  # the synchronous placements are plain mini-batch training
        ref = copy.deepcopy(make_model(case))
        train_plain(ref, D=case["D"], optimizer=optimizer(case), batches=batches(case["steps"]))
        for k, stage_ref in enumerate(_stages(ref, case["D"])):
            for a, b in zip(copies[(sched.weight_holders[k][0], k)], stage_ref.parameters()):
                assert (a - b).abs().max().item() <= TOL


def _stages(model: torch.nn.Sequential, D: int) -> list:
    from pipelab.partition import split

    return list(split(model, D))


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES_2)), ids=[_name(c) for c in CASES_2])
def test_two_ranks_equal_emulator_and_plain_training(results_2: list, i: int) -> None:
    check(CASES_2[i], [results_2[r][i] for r in range(2)])


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES_4)), ids=[_name(c) for c in CASES_4])
def test_four_ranks_equal_emulator_and_plain_training(results_4: list, i: int) -> None:
    check(CASES_4[i], [results_4[r][i] for r in range(4)])


@pytest.mark.slow
def test_fsdp_memory_and_traffic(results_2: list) -> None:
    """FSDP holds one stage's weights per rank plus fetched versions; broadcast and reduce volumes are exact."""
    r0, r1 = results_2[0][2], results_2[1][2]
    assert sorted(r0.weights) == [0] and sorted(r1.weights) == [1]
    stage_bytes = r0.memory["stage_bytes"]
    assert r0.memory["fetched_weights"] == stage_bytes[1]  # one version of stage 1 at a time (flushed)
    c = r0.collectives
    assert c["calls"] == {"broadcast": 2 * 3, "reduce": 2 * 3}  # versions 0..2 of both stages, 3 steps × 2 stages
    assert c["bytes_sent"]["broadcast"] == 3 * stage_bytes[0] and c["bytes_received"]["broadcast"] == 3 * stage_bytes[1]
    assert c["bytes_sent"]["reduce"] == 3 * stage_bytes[1] and c["bytes_received"]["reduce"] == 3 * stage_bytes[0]


# --------------------------------------------------------------------------- torch's engines


def _torch_ddp(rank: int, world: int, case: dict) -> list[torch.Tensor]:
    """torch DDP on the same model and data: rank r takes micro-batches j ≡ r (mod W) of each mini-batch,
    the loss is scaled by W/M so that DDP's gradient average is the mini-batch mean's gradient."""
    from torch.nn.parallel import DistributedDataParallel

    model = make_model(case)
    net = DistributedDataParallel(model)
    opt = optimizer(case)(list(net.parameters()))
    M, W = case["M"], world
    for x, y in batches(case["steps"]):
        opt.zero_grad()
        xs, ys = x.chunk(M), y.chunk(M)
        mine = [j for j in range(M) if j % W == rank]
        with net.no_sync():
            for j in mine[:-1]:
                (torch.nn.functional.cross_entropy(net(xs[j]), ys[j]) * W / M).backward()
        (torch.nn.functional.cross_entropy(net(xs[mine[-1]]), ys[mine[-1]]) * W / M).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _both(rank: int, world: int, case: dict, theirs: Any) -> tuple[list[torch.Tensor], Any]:
    """torch's engine, then pipelab's runtime, in the same processes (one start-up for the two)."""
    reference = theirs(rank, world, case)
    rt = PipelineRuntime(make_model(case), schedule=make_schedule(case), policy="gpipe", D=case["D"],
                         optimizer=optimizer(case))
    return reference, rt.run(batches(case["steps"]))


@pytest.mark.slow
def test_ddp_equals_torch_distributed_data_parallel() -> None:
    """Tolerance 1e-10 (float64): the two sum the same micro-batch gradients in different orders."""
    case = dict(schedule="ddp", D=2, M=4, W=2, steps=3, optimizer="adam")
    out = spawn(_both, 2, (case, _torch_ddp), timeout_s=120)
    theirs, ours = [o[0] for o in out], [o[1] for o in out]
    flat_ours = [p for k in range(case["D"]) for p in ours[0].weights[k]]
    assert len(flat_ours) == len(theirs[0])
    for a, b in zip(flat_ours, theirs[0]):
        assert (a - b).abs().max().item() <= TOL
    assert all(torch.equal(a, b) for a, b in zip(theirs[0], theirs[1]))


def fsdp2_unsupported_reason() -> str | None:
    """Why torch's FSDP2 (``fully_shard``) cannot be compared here, or None when it can."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as exc:  # pragma: no cover - torch without FSDP2
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard ({exc})"
    return None


def _torch_fsdp2(rank: int, world: int, case: dict) -> list[torch.Tensor]:
    """FSDP2 on CPU/gloo: every Linear and the root sharded across the ranks; same micro-batching as DDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = make_model(case)
    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if any(True for _ in m.parameters()):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = optimizer(case)(list(model.parameters()))
    M, W = case["M"], world
    for x, y in batches(case["steps"]):
        opt.zero_grad()
        xs, ys = x.chunk(M), y.chunk(M)
        mine = [j for j in range(M) if j % W == rank]
        for i, j in enumerate(mine):
            model.set_requires_gradient_sync(i == len(mine) - 1)
            (torch.nn.functional.cross_entropy(model(xs[j]), ys[j]) * W / M).backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


@pytest.mark.slow
def test_fsdp_equals_torch_fully_shard() -> None:
    """Tolerance 1e-10 (float64): FSDP2's reduce-scatter averages; ours sums onto the owner."""
    reason = fsdp2_unsupported_reason()
    if reason:
        pytest.skip(reason)
    case = dict(schedule="fsdp", D=2, M=4, W=2, steps=3, optimizer="adam")
    out = spawn(_both, 2, (case, _torch_fsdp2), timeout_s=120)
    theirs, ours = [o[0] for o in out], [o[1] for o in out]
    flat_ours = [p for r in ours for k in sorted(r.weights) for p in r.weights[k]]
    assert len(flat_ours) == len(theirs[0])
    for a, b in zip(flat_ours, theirs[0]):
        assert (a - b).abs().max().item() <= TOL


# --------------------------------------------------------------------------- faults


def _fail_in_collective(rank: int, world: int, where: str) -> None:
    """Rank 1 fails in step 1: inside its all-reduce call, or in the backward just before it (its peer then
    waits inside the all-reduce either way)."""
    import pipelab.runtime.collectives as coll

    case = dict(schedule="ddp", D=2, M=4, W=2, steps=3)
    rt = PipelineRuntime(make_model(case), schedule=make_schedule(case), policy="gpipe", D=2,
                         optimizer=optimizer(case))
    if rank == 1 and where == "inside":
        original = coll.dist.all_reduce
        calls = {"n": 0}

        def broken(tensor: torch.Tensor, *args: Any, **kw: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("rank 1 fails inside its third all-reduce")
            return original(tensor, *args, **kw)

        coll.dist = _Patched(dist, all_reduce=broken)  # type: ignore[assignment]
    elif rank == 1:
        ex = rt.executors[0]
        backward = ex.backward

        def failing(t: int, j: int, g: Any) -> Any:
            if t == 1:
                raise RuntimeError("rank 1 fails before its third all-reduce")
            return backward(t, j, g)

        ex.backward = failing  # type: ignore[method-assign]
    rt.run(batches(case["steps"]))


class _Patched:
    """``torch.distributed`` with some functions replaced (for the fault test)."""

    def __init__(self, base: Any, **replaced: Any) -> None:
        self._base, self._replaced = base, replaced

    def __getattr__(self, name: str) -> Any:
        return self._replaced.get(name, getattr(self._base, name))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before", "inside"])
def test_a_rank_failing_at_a_collective_ends_the_run_with_its_traceback(where: str) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure) as err:
        spawn(_fail_in_collective, 2, (where,), timeout_s=90, comm_timeout_s=10)
    assert f"rank 1 fails {where} its third all-reduce" in str(err.value)
    assert "Traceback" in str(err.value)
    assert time.monotonic() - start < 60


def _bucketed_and_unbucketed(rank: int, world: int, case: dict) -> tuple[Any, Any]:
    import pipelab.pipeline.placement as placement

    out = []
    for cap in (None, 0):  # the default 25 MiB buckets (overlapped), then one blocking-order call per stage
        saved = placement.BUCKET_BYTES
        if cap is not None:
            placement.BUCKET_BYTES = cap
        try:
            rt = PipelineRuntime(make_model(case), schedule=make_schedule(case), policy="gpipe", D=case["D"],
                                 optimizer=optimizer(case))
            out.append(rt.run(batches(case["steps"])))
        finally:
            placement.BUCKET_BYTES = saved
    return out[0], out[1]


def test_bucketed_all_reduces_equal_unbucketed_with_fewer_calls() -> None:
    """DDP's per-step all-reduces fused into one bucket (launched asynchronously after the last backward):
    the same weights and losses (≤ 1e-12) as one all-reduce per stage, the same bytes, D times fewer calls."""
    case = dict(schedule="ddp", D=3, M=4, W=2, steps=3, optimizer="adam")
    for bucketed, single in spawn(_bucketed_and_unbucketed, 2, (case,), timeout_s=120):
        assert bucketed.weights.keys() == single.weights.keys() == {0, 1, 2}
        for k in range(3):
            for a, b in zip(bucketed.weights[k], single.weights[k]):
                assert (a - b).abs().max().item() <= 1e-12
        assert bucketed.losses == pytest.approx(single.losses, abs=1e-12)
        assert single.collectives["calls"] == {"all_reduce": 3 * 3}
        assert bucketed.collectives["calls"] == {"all_reduce": 3}
        assert bucketed.collectives["bytes_sent"] == single.collectives["bytes_sent"]
        assert bucketed.collectives["bytes_received"] == single.collectives["bytes_received"]
