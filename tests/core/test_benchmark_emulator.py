"""``benchmarks/emulator.py``: the work it counts per policy is the plan's, and the benchmark runs at a toy size.

The count wraps stage methods of the emulator from outside the library; if the library stops calling them, the
counts would silently drop to zero and "inherent work" would shrink to a plain step. These tests compare the
counts with the plan's weight specs, which say independently where the policy recomputes and predicts.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.emulator import count_work, main, schedule_of  # noqa: E402
from pipelab.emulator import Emulator  # noqa: E402
from pipelab.optim import optimizer_factory  # noqa: E402
from pipelab.policies import Predicted, Stored  # noqa: E402
from pipelab.studies.models import deep_mlp  # noqa: E402

D, STEPS = 3, 6


def _counted(policy: str) -> tuple[Emulator, object]:
    torch.manual_seed(0)
    emu = Emulator(deep_mlp(in_features=5, width=8, depth=D), schedule=schedule_of(policy, D, D, STEPS),
                   policy=policy, optimizer=optimizer_factory("sgdm"))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 5, generator=g), torch.randint(0, 10, (6,), generator=g)) for _ in range(STEPS)]
    return emu, count_work(emu, data)


@pytest.mark.parametrize("policy", ["gpipe", "stashing", "2bw", "spectrain", "pipeoptim", "pipemare"])
def test_counted_work_is_the_plans(policy: str) -> None:
    emu, work = _counted(policy)
    specs = emu.plan.specs.items()
    recompute = Counter(k for (k, _, _), (f, b) in specs if not (f == b and isinstance(f, Stored)))
    # a backward's predicted weights are fetched only by its recompute, and a predicted backward always recomputes
    predicted = sum(isinstance(f, Predicted) + isinstance(b, Predicted) for _, (f, b) in specs)
    assert work.recomputes == dict(recompute)
    assert len(work.predictions) == predicted
    history = policy == "pipemare"  # PipeMare's δ: one observe per update of each stage that predicts
    assert work.observes == ({k: STEPS for k in emu.plan.predicted_stages} if history else {})
    if policy in ("spectrain", "pipeoptim", "pipemare"):
        assert work.recomputes and work.predictions  # the asynchronous predicting policies do both
    else:
        assert not work.recomputes and not work.predictor_calls
    # a stage copies its weights at every update where its ring holds more than one version, else shares them
    assert work.copies == {st.k: STEPS for st in emu.stages if not st.share_live}
    # stashing and 2BW keep older versions; the flushed schedule keeps one, the predicting policies predict
    # from the newest version alone
    assert bool(work.copies) == (policy in ("stashing", "2bw"))
    for st in emu.stages:
        views = {w.data_ptr() for w in st.snapshot()} == {p.data_ptr() for p in st.params}
        assert views == st.share_live
    for st in emu.stages:  # the wrappers are gone: the classes' methods again
        assert not {"weights", "snapshot"} & set(vars(st))
        assert st.predictor is None or "observe" not in vars(st.predictor)


def test_the_benchmark_runs_and_reports_finite_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    rows = main(["--width", "16", "--depth", "4", "--batch", "8", "--steps", "4", "--rounds", "2", "--device", "cpu",
                 "--policies", "stashing", "pipemare", "--profile", "worst", "--profile-top", "3", "--clock", "cpu",
                 "--bookkeeping", "8"])
    assert [r.policy for r in rows] == ["stashing", "pipemare"]
    for r in rows:
        assert len(r.vs_inherent.values) == 2 and math.isfinite(r.vs_inherent.median) and r.vs_inherent.median > 0
        assert r.inherent == pytest.approx(r.plain + r.recompute + r.predictions + r.copies)
    assert rows[0].recompute == rows[0].predictions == 0.0 and rows[1].recompute > 0 and rows[1].predictions > 0
    assert rows[0].copies > 0 and rows[0].copies_per_step == 3 and rows[1].copies == 0.0  # stashing: D - 1 stages
    out = capsys.readouterr().out
    assert "1 intra-op thread" in out and "emulator / inherent" in out and "cProfile" in out and "clock: cpu" in out
    assert "bookkeeping (emulator − inherent at width 8)" in out and [r.jobs_per_step for r in rows] == [12.0, 12.0]
    assert "timed in place" in out and "own work" in out


def test_the_hand_written_2bw_trains_as_the_emulators_2bw() -> None:
    """The reference the 2BW row is also compared with (``double_buffered``) is 2BW: in float64 its weights after 6
    steps equal the emulator's 2BW weights (same model, data, M and optimizer)."""
    from benchmarks.emulator import double_buffered
    from pipelab.schedules import pipedream_2bw

    torch.manual_seed(0)
    model = deep_mlp(in_features=5, width=8, depth=2 * D).double()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 10, (6,), generator=g))
            for _ in range(STEPS)]
    hand = copy.deepcopy(model)
    double_buffered(hand, optimizer_factory("sgdm"), data, D, 3)
    emu = Emulator(copy.deepcopy(model), D=D, schedule=pipedream_2bw(D, 3, STEPS), policy="2bw",
                   optimizer=optimizer_factory("sgdm"))
    emu.run(data)
    got = [w for Wk in emu.weights() for w in Wk]
    want = [p.detach() for p in hand.parameters()]
    assert len(got) == len(want) and max((a - b).abs().max().item() for a, b in zip(got, want)) <= 1e-12
    plain_moved = max((a - b).abs().max().item() for a, b in zip(want, model.parameters()))
    assert plain_moved > 1e-3  # it trained


@pytest.mark.parametrize("policy", ["2bw", "pipemare"])
def test_the_attribution_times_every_job_where_it_runs(policy: str) -> None:
    """``attribute`` times, inside the runs, one module call per forward and recompute, one autograd call per
    backward, one optimizer step per update, every prediction and observe and every version copy (the counts of
    ``count_work``), none of them on plain training's side, and puts torch's functions back afterwards."""
    from benchmarks.emulator import PARTS, attribute

    held = nn.Module.__call__, torch.autograd.backward, torch.autograd.grad
    emu, work = _counted(policy)
    torch.manual_seed(0)
    base = deep_mlp(in_features=5, width=8, depth=D)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 5, generator=g), torch.randint(0, 10, (6,), generator=g)) for _ in range(STEPS)]
    plain, emulated = attribute(policy, base, data, D, D, 2, optimizer_factory("sgdm"), time.process_time)
    jobs = Counter(job[0] for job in emu.order)
    calls = (jobs["F"] + sum(work.recomputes.values()) + jobs["B"] + jobs["U"] + work.predictor_calls
             + sum(work.copies.values()))
    assert emulated.calls * STEPS == pytest.approx(calls)
    assert plain.parts["predictions"] == plain.parts["copies"] == 0.0
    assert (emulated.parts["predictions"] > 0, emulated.parts["copies"] > 0) == (policy == "pipemare", policy == "2bw")
    for sp in (plain, emulated):
        assert all(sp.parts[p] >= 0 for p in PARTS) and sp.total > 0 and sp.timers > 0
        assert sp.rest == pytest.approx(sp.total - sum(sp.parts.values()) - sp.timers)
    assert (nn.Module.__call__, torch.autograd.backward, torch.autograd.grad) == held


@pytest.mark.parametrize("family", ["gpipe", "1f1b", "pipedream", "2bw", "zb_h1", "zb_v", "interleaved"])
def test_the_stage_major_order_keeps_every_stages_sequence_and_inputs(family: str) -> None:
    """``--order stage-major`` only merges the stages' own sequences again: each stage's jobs in the schedule's
    order, every job after the jobs whose tensors it consumes, no job lost or repeated; and it does reorder."""
    from benchmarks.emulator import stage_major
    from pipelab.schedules.builders import BUILDERS
    from pipelab.schedules.dependencies import received_from

    args = {"interleaved": (2, 2, 4, 2), "zb_v": (2, 4, 2)}.get(family, (4, 4, 3))
    blocks = 2 * args[0] * (2 if family in ("interleaved", "zb_v") else 1)  # two per (virtual) stage
    policy = "stashing" if family in ("pipedream", "2bw") else "gpipe"
    emu = Emulator(deep_mlp(in_features=5, width=8, depth=blocks), schedule=BUILDERS[family](*args), policy=policy,
                   optimizer=optimizer_factory("sgdm"))
    order = [tuple(job[:4]) for job in emu.order]
    merged = [tuple(job[:4]) for job in stage_major(emu.order, emu.D, emu.table.split_set)]
    assert sorted(merged) == sorted(order) and merged != order
    for k in range(emu.D):
        assert [j for j in merged if j[1] == k] == [j for j in order if j[1] == k]
    at = {job: i for i, job in enumerate(merged)}
    for job in merged:
        assert all(at[src] < at[job] for src in received_from(job, emu.D, emu.table.split_set))


@pytest.mark.parametrize("policy", ["gpipe", "1f1b", "2bw", "stashing", "pipemare"])
def test_the_stage_major_order_trains_bit_for_bit_as_the_schedules(policy: str) -> None:
    """On a model that draws no random numbers the stage-major order gives the schedule order's losses and final
    weights exactly (float64)."""
    from benchmarks.emulator import build

    torch.manual_seed(0)
    model = deep_mlp(in_features=5, width=8, depth=2 * D).double()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 10, (6,), generator=g))
            for _ in range(STEPS)]
    runs = []
    for order in ("schedule", "stage-major"):
        emu = build(model, D, schedule_of(policy, D, D, STEPS), policy, optimizer_factory("sgdm"), order)
        runs.append((emu.order, emu.run(data).losses, emu.weights()))
    assert runs[0][0] != runs[1][0] and runs[0][1] == runs[1][1]
    assert all(torch.equal(a, b) for Wa, Wb in zip(runs[0][2], runs[1][2]) for a, b in zip(Wa, Wb))


def test_the_stage_major_order_changes_what_dropout_draws() -> None:
    """Why the library keeps the schedule's order: forwards draw random numbers in execution order, so with dropout
    the stage-major order trains on other masks (the same seed, other losses)."""
    from benchmarks.emulator import build

    losses = []
    for order in ("schedule", "stage-major"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.5), nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 10))
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(6, 5, generator=g), torch.randint(0, 10, (6,), generator=g)) for _ in range(STEPS)]
        emu = build(model.double(), D, schedule_of("gpipe", D, D, STEPS), "gpipe", optimizer_factory("sgdm"), order)
        torch.manual_seed(2)
        losses.append(emu.run([(x.double(), y) for x, y in data]).losses)
    assert losses[0][0] != losses[1][0]
