"""The multi-process runtime (gloo, CPU, float64) equals the emulator, torch's pipelining, and itself resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pipelab.distributed import RankFailure, spawn
from pipelab.emulator import Emulator
from pipelab.runtime import PipelineRuntime, channels, consistent_cut, load_checkpoint, save_checkpoint
from pipelab.schedules import gpipe, interleaved_1f1b, one_f_one_b, pipedream, pipedream_2bw
from pipelab.studies.models import deep_mlp

TOL = 1e-12
BATCH = 8


def schedule_of(name: str, D: int, M: int, steps: int, W: int):
    if name == "gpipe":
        return gpipe(D, M, steps)
    if name == "1f1b":
        return one_f_one_b(D, M, steps)
    if name == "pipedream":
        return pipedream(D, M, steps)
    if name == "2bw":
        return pipedream_2bw(D, M, steps)
    if name == "interleaved":
        return interleaved_1f1b(W, D // W, M, steps)
    raise ValueError(name)


def build(case: dict) -> tuple[torch.nn.Sequential, Any, Any]:
    torch.manual_seed(case.get("seed", 0))
    model = deep_mlp(in_features=6, width=8, depth=case.get("depth", case["D"]), num_classes=4).double()
    sched = schedule_of(case["schedule"], case["D"], case["M"], case["steps"], case["W"])
    if case.get("optimizer", "sgdm") == "adam":
        opt = lambda ps: torch.optim.Adam(ps, lr=0.01)  # noqa: E731
    elif case.get("optimizer") == "nadam":
        opt = lambda ps: torch.optim.NAdam(ps, lr=0.01, betas=(0.99, 0.999))  # noqa: E731
    else:
        opt = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)  # noqa: E731
    return model, sched, opt


def batches(steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(steps)]


def _run_cases(rank: int, world: int, cases: list[dict], ckpt: str | None = None, mode: str = "full") -> list:
    out = []
    for case in cases:
        model, sched, opt = build(case)
        rt = PipelineRuntime(model, schedule=sched, policy=case["policy"], optimizer=opt)
        if mode == "resume":
            load_checkpoint(rt, ckpt)
        res = rt.run(batches(case["steps"]), stop_at_step=case["stop"] if mode == "stop" else None)
        if mode == "stop":
            save_checkpoint(rt, ckpt)
        out.append(res)
    return out


def emulate(case: dict) -> tuple[list[tuple[torch.Tensor, ...]], Any]:
    model, sched, opt = build(case)
    emu = Emulator(model, schedule=sched, policy=case["policy"], optimizer=opt)
    res = emu.run(batches(case["steps"]))
    return emu.weights(), res


def check_equal(case: dict, per_rank: list) -> None:
    weights, emu = emulate(case)
    observed: dict = {}
    for r in per_rank:
        observed.update(r.current)
        for k, W in r.weights.items():
            for a, b in zip(W, weights[k]):
                assert (a - b).abs().max().item() <= TOL, (case, k)
        assert r.losses == pytest.approx(emu.losses, abs=TOL, nan_ok=True)
    assert observed == emu.current, case  # the runtime's version table is the emulator's (= the simulator's)


CASES_2 = [dict(schedule="gpipe", policy="gpipe", D=2, M=4, steps=3),
           dict(schedule="1f1b", policy="1f1b", D=2, M=4, steps=3, optimizer="adam"),
           dict(schedule="2bw", policy="2bw", D=2, M=2, steps=6),
           dict(schedule="interleaved", policy="1f1b", D=4, M=4, steps=2)]
CASES_2 += [dict(schedule="pipedream", policy=p, D=2, M=1, steps=10, optimizer=o)
            for p, o in [("vanilla", "sgdm"), ("stashing", "adam"), ("vertical_sync", "sgdm"), ("spectrain", "sgdm"),
                         ("pipeoptim", "adam"), ("pipemare", "sgdm")]]
# the gradient-correcting and Nesterov policies (pipelab.policies): the executor's correction hook in the runtime
CASES_2 += [dict(schedule="pipedream", policy="nesterov_async", D=2, M=1, steps=10, optimizer="nadam"),
            dict(schedule="pipedream", policy="dc_asgd", D=2, M=2, steps=8),
            dict(schedule="2bw", policy="error_feedback", D=2, M=2, steps=6)]
CASES_4 = [dict(schedule="gpipe", policy="gpipe", D=4, M=4, steps=2),
           dict(schedule="pipedream", policy="stashing", D=4, M=1, steps=16),
           dict(schedule="pipedream", policy="pipeoptim", D=4, M=2, steps=8, optimizer="adam"),
           dict(schedule="2bw", policy="2bw", D=4, M=4, steps=6),
           dict(schedule="interleaved", policy="1f1b", D=8, M=4, steps=2)]
for c in CASES_2:
    c["W"] = 2
for c in CASES_4:
    c["W"] = 4


@pytest.fixture(scope="module")
def results_2() -> list:
    return spawn(_run_cases, 2, (CASES_2,))


@pytest.fixture(scope="module")
def results_4() -> list:
    return spawn(_run_cases, 4, (CASES_4,))


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES_2)), ids=[f"{c['schedule']}-{c['policy']}" for c in CASES_2])
def test_two_ranks_equal_the_emulator(results_2: list, i: int) -> None:
    check_equal(CASES_2[i], [results_2[r][i] for r in range(2)])


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES_4)), ids=[f"{c['schedule']}-{c['policy']}" for c in CASES_4])
def test_four_ranks_equal_the_emulator(results_4: list, i: int) -> None:
    check_equal(CASES_4[i], [results_4[r][i] for r in range(4)])


@pytest.mark.slow
def test_weight_version_memory_matches_each_policy(results_4: list) -> None:
    stashing = {k: v for r in results_4 for k, v in r[1].memory["versions_peak"].items()}
    assert stashing == {0: 4, 1: 3, 2: 2, 3: 1}  # D − k stashed versions at stage k
    twobw = {k: v for r in results_4 for k, v in r[3].memory["versions_peak"].items()}
    assert twobw == {0: 2, 1: 2, 2: 2, 3: 2}  # double buffering at every stage (the last stage too)
    pipeoptim = {k: v for r in results_4 for k, v in r[2].memory["versions_peak"].items()}
    assert max(pipeoptim.values()) <= 2
    for r in results_4:
        mem = r[1].memory
        assert mem["weight_versions"] == sum(mem["versions_peak"][k] * mem["stage_bytes"][k] for k in r[1].stages)
        assert mem["optimizer_state"] > 0 and mem["activations"] > 0


@pytest.mark.slow
def test_nothing_grows_over_a_long_run(results_4: list) -> None:
    for r in results_4:
        trace = r[1].trace  # stashing, 16 steps: (versions, saved inputs, pending grads, unfinished sends)
        assert len(trace) == 16
        # steady state (before the last D steps' drain, whose sends are completed at the end of the run)
        # holds no more than the first half did: unfinished sends are released as their receipt is known
        first, later = trace[:8], trace[8:16 - 4]
        for i in range(4):
            assert max(x[i] for x in later) <= max(x[i] for x in first), trace
        assert max(x[3] for x in trace) <= 4


def _pipelining_reference(rank: int, world: int, kind: str) -> tuple[torch.Tensor, ...]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from pipelab.partition import split

    case = dict(schedule=kind, D=2, M=4, steps=3, W=2)
    model, _, opt = build(case)
    stage_mod = split(model, 2)[rank]
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    sched = (ScheduleGPipe if kind == "gpipe" else Schedule1F1B)(stage, n_microbatches=4,
                                                                  loss_fn=torch.nn.functional.cross_entropy)
    o = opt(list(stage_mod.parameters()))
    for x, y in batches(3):
        o.zero_grad()
        sched.step(x) if rank == 0 else sched.step(target=y)
        o.step()
    return tuple(p.detach().clone() for p in stage_mod.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_flushed_schedules_equal_torch_pipelining(kind: str, results_2: list) -> None:
    ref = spawn(_pipelining_reference, 2, (kind,))
    i = 0 if kind == "gpipe" else 1
    if kind == "1f1b":  # that case uses Adam in CASES_2; compare a plain-SGDM run instead
        case = dict(CASES_2[1], optimizer="sgdm")
        ours = spawn(_run_cases, 2, ([case],))
        per_rank = [ours[r][0] for r in range(2)]
    else:
        per_rank = [results_2[r][i] for r in range(2)]
    for r in range(2):
        for a, b in zip(per_rank[r].weights[r], ref[r]):
            assert (a - b).abs().max().item() <= TOL


CKPT_CASES = [dict(schedule="pipedream", policy="stashing", D=2, M=1, steps=10, W=2, stop=5),
              dict(schedule="pipedream", policy="pipeoptim", D=2, M=2, steps=8, W=2, stop=3, optimizer="adam"),
              # two blocks per stage: PipeMare's corrected backward weights change the gradient
              dict(schedule="pipedream", policy="pipemare", D=2, M=1, steps=10, W=2, stop=6, depth=4),
              # error feedback's previous gradient is policy state the checkpoint carries
              dict(schedule="2bw", policy="error_feedback", D=2, M=2, steps=6, W=2, stop=3)]


def _checkpoint_phase(rank: int, world: int, root: str, mode: str) -> list:
    """One phase (full run, stop and save, or load and resume) of every checkpoint case, in one spawn."""
    return [_run_cases(rank, world, [case], str(Path(root) / f"case{i}"), mode)[0] for i, case in enumerate(CKPT_CASES)]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list]:
    """Full runs and stopped-then-resumed runs of CKPT_CASES: three spawns in all (fresh processes per phase)."""
    root = str(tmp_path_factory.mktemp("checkpoints"))
    full = spawn(_checkpoint_phase, 2, (root, "full"))
    spawn(_checkpoint_phase, 2, (root, "stop"))
    return full, spawn(_checkpoint_phase, 2, (root, "resume"))


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CKPT_CASES)), ids=["stashing", "pipeoptim", "pipemare-history",
                                                                 "error-feedback-state"])
def test_checkpoint_resume_continues_identically(resumed: tuple[list, list], i: int) -> None:
    case = CKPT_CASES[i]
    cut, in_flight = consistent_cut(build(case)[1], case["stop"])
    assert in_flight, "the cut of an asynchronous pipeline has messages in flight"
    full, again = resumed
    for r in range(2):
        a, b = full[r][i], again[r][i]
        for k in a.weights:
            for x, y in zip(a.weights[k], b.weights[k]):
                assert torch.equal(x, y)
        assert a.losses == b.losses and a.current == b.current
        assert b.steps_done == case["steps"] and not b.diverged


def test_cut_has_no_orphans() -> None:
    for sched in (pipedream(4, 1, 12), pipedream(4, 2, 8), pipedream_2bw(4, 4, 6), interleaved_1f1b(2, 2, 4, 3)):
        for step in range(sched.steps + 1):
            cut, in_flight = consistent_cut(sched, step)
            assert all(0 <= c <= len(p) for c, p in zip(cut, sched.programs))
            for src, dst, *_ in in_flight:
                assert src != dst


def test_channel_orders_match_for_supported_schedules() -> None:
    for sched in (gpipe(4, 4), one_f_one_b(4, 8), pipedream(4, 1, 8), pipedream_2bw(4, 4, 4),
                  interleaved_1f1b(2, 2, 4)):
        for key, (sends, recvs) in channels(sched).items():
            assert sends == recvs, (sched.name, key)


def _bad_world(rank: int, world: int) -> None:
    model, sched, opt = build(dict(schedule="gpipe", D=4, M=4, steps=1, W=4))
    PipelineRuntime(model, schedule=sched, policy="gpipe", optimizer=opt)


def _mismatched(rank: int, world: int) -> None:
    model, sched, opt = build(dict(schedule="gpipe", D=2, M=2 if rank == 0 else 4, steps=1, W=2))
    PipelineRuntime(model, schedule=sched, policy="gpipe", optimizer=opt)


@pytest.mark.slow
def test_start_up_errors() -> None:
    with pytest.raises(RankFailure, match="world size is 2"):
        spawn(_bad_world, 2)
    with pytest.raises(RankFailure, match="ranks disagree on the pipeline configuration"):
        spawn(_mismatched, 2)
    from pipelab.schedules import hybrid

    model = deep_mlp(in_features=6, width=8, depth=2).double()
    # placed schedules run (tests/core/test_runtime_placements.py), but not with a per-copy gradient correction
    placed = hybrid(2, 2, 2, steps=2, asynchronous=True)
    with pytest.raises(ValueError, match="placed schedules"):
        PipelineRuntime(model, schedule=placed, policy="error_feedback",
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.1), rank=0, world_size=placed.W)


def _precision_mismatch(rank: int, world: int) -> None:
    model, sched, opt = build(dict(schedule="gpipe", D=2, M=2, steps=1, W=2))
    PipelineRuntime(model.float(), schedule=sched, policy="gpipe", optimizer=opt,
                    precision="bf16" if rank == 1 else "fp32")


@pytest.mark.slow
def test_ranks_disagreeing_on_precision_are_refused() -> None:
    with pytest.raises(RankFailure, match=r"(?s)ranks disagree on the pipeline configuration.*precision"):
        spawn(_precision_mismatch, 2)


WEIGHTLESS_CASES = [dict(schedule="gpipe", policy="gpipe", M=2, steps=3),
                    dict(schedule="pipedream", policy="stashing", M=1, steps=5),
                    dict(schedule="pipedream", policy="pipeoptim", M=1, steps=5)]


def _weightless_setup(case: dict) -> tuple[torch.nn.Sequential, Any, Any]:
    """Linear | Tanh | Linear on three stages: the middle stage has no parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).double()
    sched = schedule_of(case["schedule"], 3, case["M"], case["steps"], 3)
    return model, sched, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def _run_weightless(rank: int, world: int) -> list:
    out = []
    for case in WEIGHTLESS_CASES:
        model, sched, opt = _weightless_setup(case)
        out.append(PipelineRuntime(model, schedule=sched, policy=case["policy"], optimizer=opt).run(
            batches(case["steps"])))
    return out


@pytest.mark.slow
def test_stage_without_parameters_runs_on_three_ranks_like_the_emulator() -> None:
    """A parameter-free middle stage on its own rank: no optimizer, no weight copies, same weights and
    versions as the emulator (float64)."""
    per_rank = spawn(_run_weightless, 3)
    for i, case in enumerate(WEIGHTLESS_CASES):
        model, sched, opt = _weightless_setup(case)
        emu = Emulator(model, schedule=sched, policy=case["policy"], optimizer=opt)
        ref = emu.run(batches(case["steps"]))
        weights = emu.weights()
        observed: dict = {}
        for r in (per_rank[w][i] for w in range(3)):
            observed.update(r.current)
            for k, W in r.weights.items():
                assert len(W) == len(weights[k])
                for a, b in zip(W, weights[k]):
                    assert (a - b).abs().max().item() <= TOL, (case, k)
            assert r.losses == pytest.approx(ref.losses, abs=TOL)
        assert observed == ref.current, case
        middle = per_rank[1][i]
        assert middle.stages == [1] and middle.weights[1] == ()
        assert middle.memory["weight_copies"] == {1: 0} and middle.memory["optimizer_state"] == 0
