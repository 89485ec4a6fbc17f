"""Reliability probes of the library's entry points: schedule builders, ``split``, the emulator's set-up and run.

Each probe is a call that once gave a silent wrong result, ran unbounded or raised a raw error, and the clear
error it must give now (see ``tests/probes.py``).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import probes
import pytest
import torch
from probes import Probe
from torch import nn
from torch.distributed.pipelining import schedules as ts

from pipelab.emulator import Emulator, build_pipeline
from pipelab.papers import rahimi_row
from pipelab.pipeline import PipelineSpec
from pipelab.schedules import (
    actions,
    construct,
    ddp,
    folded,
    fsdp,
    fslpp,
    gpipe,
    interleaved_1f1b,
    lpp,
    naive,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
)
from pipelab.schedules.torch_actions import from_torch, from_torch_csv

BIG = 10**9
SCHEDULE_PROBES = [
    Probe("naive-absurd-size", lambda: naive(BIG, 1), ValueError, "too large.*MAX_JOBS"),
    Probe("gpipe-absurd-size", lambda: gpipe(BIG, 1), ValueError, "too large.*MAX_JOBS"),
    Probe("1f1b-absurd-size", lambda: one_f_one_b(4, BIG), ValueError, "too large"),
    Probe("pipedream-absurd-steps", lambda: pipedream(4, 1, steps=BIG), ValueError, "too large"),
    Probe("2bw-absurd-size", lambda: pipedream_2bw(4, 4, steps=BIG), ValueError, "too large"),
    Probe("interleaved-absurd-size", lambda: interleaved_1f1b(2, BIG, 2), ValueError, "too large"),
    Probe("folded-absurd-size", lambda: folded(2, BIG), ValueError, "too large"),
    Probe("ddp-absurd-size", lambda: ddp(BIG, 2), ValueError, "too large"),
    Probe("fsdp-absurd-size", lambda: fsdp(BIG, 2), ValueError, "too large"),
    Probe("lpp-absurd-size", lambda: lpp(2, 2, 1, 2, steps=BIG), ValueError, "too large"),
    Probe("fslpp-absurd-size", lambda: fslpp(2, 2, 1, 2, steps=BIG), ValueError, "too large"),
    Probe("construct-absurd-size", lambda: construct(BIG, 1, 1, compute=lambda s, b, d: 0), ValueError, "too large"),
    Probe("gpipe-bool-D", lambda: gpipe(True, 2), ValueError, "D must be an int"),
    Probe("gpipe-float-M", lambda: gpipe(2, 2.0), ValueError, "M must be an int"),
    Probe("gpipe-numpy-bool", lambda: gpipe(np.bool_(True), 2), ValueError, "D must be an int"),
    Probe("table-row-zero-stages", lambda: rahimi_row("PP", 0, 4), ValueError, "S must be an int"),
    Probe("from-torch-absurd-steps", lambda: from_torch({0: ["0F0", "0B0"]}, n_stages=1, n_microbatches=1, steps=BIG),
          ValueError, "too large.*MAX_JOBS"),
    Probe("from-torch-absurd-microbatches", lambda: from_torch({0: ["0F0", "0B0"]}, n_stages=1, n_microbatches=10**12),
          ValueError, "too large.*MAX_JOBS"),
    Probe("from-torch-long-lists", lambda: from_torch({0: ["0F0", "0B0"] * 10**5}, n_stages=1, n_microbatches=1,
                                                      steps=10**3), ValueError, "too large.*MAX_JOBS"),
    Probe("from-torch-float-stage", lambda: from_torch({0: [ts._Action(0.0, ts.F, 0), ts._Action(0, ts.B, 0)]},
                                                       n_stages=1, n_microbatches=1), ValueError,
          r"stage_index must be an int >= 0, got 0\.0 \(float\)"),
    Probe("from-torch-float-microbatch", lambda: from_torch({0: [ts._Action(0, ts.F, 0), ts._Action(0, ts.B, 0.0)]},
                                                            n_stages=1, n_microbatches=1), ValueError,
          r"microbatch_index must be an int >= 0, got 0\.0"),
    Probe("from-torch-float-stage-in-overlap", lambda: from_torch(
        {0: [ts._Action(0, ts.F, 0), ts._Action(-1, ts.OVERLAP_F_B, None, (ts._Action(1.5, ts.F, 0),))]},
        n_stages=2, n_microbatches=1), ValueError, r"stage_index must be an int >= 0, got 1\.5"),
]


@probes.parametrize(SCHEDULE_PROBES)
def test_schedule_probe(probe: Probe) -> None:
    probe.check()


@pytest.mark.parametrize("build", [
    lambda i: naive(i(2), i(2), i(2)), lambda i: gpipe(i(2), i(2), i(2)), lambda i: one_f_one_b(i(2), i(2), i(2)),
    lambda i: pipedream(i(2), i(1), i(3)), lambda i: pipedream_2bw(i(2), i(2), i(3)),
    lambda i: interleaved_1f1b(i(2), i(2), i(2), i(2)), lambda i: folded(i(4), i(2), i(2)),
    lambda i: ddp(i(2), i(2), i(2), i(2)), lambda i: fsdp(i(2), i(2)), lambda i: lpp(i(2), i(2), i(1), i(2)),
    lambda i: fslpp(i(2), i(2), i(1), i(2)),
    lambda i: construct(i(2), i(2), i(2), compute=lambda s, b, d: s, max_in_flight=i(2), steps=i(2)),
], ids=["naive", "gpipe", "1f1b", "pipedream", "2bw", "interleaved", "folded", "ddp", "fsdp", "lpp", "fslpp",
        "construct"])
def test_builders_accept_numpy_integers(build) -> None:
    """``np.int64(4)`` (e.g. from a numpy sweep grid) builds the same schedule as ``4``, with int sizes."""
    ours, theirs = build(int), build(np.int64)
    assert ours.programs == theirs.programs and ours.weight_holders == theirs.weight_holders
    assert all(type(v) is int for v in (theirs.D, theirs.M, theirs.steps))


def test_from_torch_csv_bounds_its_sizes(tmp_path: Path) -> None:
    """A one-rank CSV read with n_microbatches=10**12 used to ask numpy for 36 TiB; now the builders' limit."""
    path = tmp_path / "one.csv"
    path.write_text("0F0,0B0\n")
    with pytest.raises(ValueError, match="too large.*MAX_JOBS"):
        from_torch_csv(path, n_stages=1, n_microbatches=10**12)


def test_job_cap_is_a_module_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is ``actions.MAX_JOBS``; lowering it refuses a schedule just above it and builds one at it."""
    monkeypatch.setattr(actions, "MAX_JOBS", 2 * 2 * 3 * 4)
    assert gpipe(2, 3, 4).n_jobs == actions.MAX_JOBS
    with pytest.raises(ValueError, match="too large"):
        gpipe(2, 3, 5)


# ------------------------------------------------------------------------------------------ emulator set-up


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def _data(T: int = 3, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))
            for _ in range(T)]


def _opt(ps: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(ps, lr=0.1)


def _emu(**kw: object) -> Emulator:
    args: dict = {"schedule": gpipe(2, 2, 3), "policy": "gpipe", "optimizer": _opt}
    args.update(kw)
    return Emulator(args.pop("model", _model()), **args)


def _shared_linear_stages() -> list[nn.Module]:
    lin = nn.Linear(4, 4).double()
    return [nn.Sequential(nn.Linear(4, 4), lin).double(), nn.Sequential(lin, nn.Linear(4, 3)).double()]


EMULATOR_PROBES = [
    Probe("schedule-as-name", lambda: _emu(schedule="gpipe"), TypeError, r"schedule='gpipe' is a name.*gpipe\(D, M"),
    Probe("schedule-as-name-with-D", lambda: _emu(schedule="gpipe", D=2), TypeError, "schedule='gpipe'"),
    Probe("schedule-wrong-type", lambda: _emu(schedule=3), TypeError, "schedule must be"),
    Probe("D-more-than-layers", lambda: _emu(schedule=gpipe(6, 2, 3)), ValueError, "only 5 blocks"),
    Probe("D-numpy-integer", lambda: _emu(D=np.int64(2)), None),
    Probe("optimizer-instance", lambda: _emu(optimizer=torch.optim.SGD(_model().parameters(), lr=0.1)),
          TypeError, "optimizer must be a factory"),
    Probe("loss-fn-not-callable", lambda: _emu(loss_fn=3), TypeError, "loss_fn must be a callable"),
    Probe("lr-scheduler-not-callable", lambda: _emu(lr_scheduler="step"), TypeError, "lr_scheduler must be a factory"),
    Probe("shared-linear-across-stage-modules", lambda: _emu(model=_shared_linear_stages()), ValueError,
          r"stage module 0 \(stage 0\) and stage module 1 \(stage 1\) share parameters"),
    Probe("shared-linear-across-split-stages",
          lambda: _emu(model=(lambda lin: nn.Sequential(lin, nn.Tanh(), lin, nn.Tanh()))(nn.Linear(4, 4).double()),
                       loss_fn=lambda o, y: o.square().mean()),
          ValueError, r"block 0 \(stage 0\) and block 2 \(stage 1\) share parameters"),
    Probe("build-pipeline-only-out-of-range",
          lambda: build_pipeline(_model(), schedule=gpipe(2, 2, 3), policy="gpipe", optimizer=_opt, only=[2]),
          ValueError, r"only=\[2\] must name stages in 0\.\.1"),
    Probe("batch-as-dict", lambda: _emu().run([{"x": x, "y": y} for x, y in _data()]), TypeError,
          r"mini-batch 0 must be a tuple \(x, y\): the input a tensor \(or a tuple or dict of tensors\).*got dict"),
    Probe("batch-as-triple", lambda: _emu().run([(x, y, y) for x, y in _data()]), TypeError, "tuple of 3"),
    Probe("batches-none", lambda: _emu().run(None), TypeError, "batches must be a sequence"),
    Probe("batches-one-tensor", lambda: _emu().run(torch.randn(3, 4, 4)), TypeError, "got Tensor"),
    Probe("batch-wrong-dtype", lambda: _emu().run([(x.float(), y) for x, y in _data()]), TypeError,
          "input dtype torch.float32 differs from the model's torch.float64"),
    Probe("batch-target-length", lambda: _emu().run([(x, y[:2]) for x, y in _data()]), ValueError,
          "same number of examples"),
    Probe("batch-not-divisible-by-M", lambda: _emu(schedule=gpipe(2, 3, 3)).run(_data()), ValueError,
          "not divisible by the M=3"),
    Probe("too-few-batches", lambda: _emu().run(_data(2)), ValueError, "only 2 mini-batches"),
]

SPEC = {"schedule": gpipe(2, 2, 3), "policy": "gpipe", "optimizer": _opt}

# PipelineSpec: the one declaration of a run's arguments, shared by build_pipeline, Emulator and PipelineRuntime
SPEC_PROBES = [
    Probe("spec-unknown-field", lambda: _emu(lr=0.1), TypeError,
          r"Emulator got unexpected keyword argument\(s\) 'lr'; the pipeline's arguments are schedule, policy, "
          r"optimizer, D, loss_fn, predictor, lr_scheduler, balance, recompute"),
    Probe("spec-unknown-field-build", lambda: build_pipeline(_model(), **SPEC, stages=2), TypeError,
          r"build_pipeline got unexpected keyword argument\(s\) 'stages'"),
    Probe("spec-missing-optimizer", lambda: Emulator(_model(), schedule=gpipe(2, 2, 3), policy="gpipe"), TypeError,
          r"Emulator needs optimizer \(or spec=PipelineSpec"),
    Probe("spec-not-a-spec", lambda: Emulator(_model(), SPEC), TypeError,
          r"spec must be a pipelab.pipeline.PipelineSpec"),
    Probe("spec-D-string", lambda: PipelineSpec(**SPEC, D="2"), TypeError, r"D must be an int .* got str"),
    Probe("spec-D-bool", lambda: PipelineSpec(**SPEC, D=True), TypeError, r"D must be an int"),
    Probe("spec-policy-number", lambda: PipelineSpec(**{**SPEC, "policy": 3}), TypeError,
          r"policy must be a Policy or its name"),
    Probe("spec-policy-unknown", lambda: PipelineSpec(**{**SPEC, "policy": "nosuch"}), ValueError, "nosuch"),
    Probe("spec-recompute-string", lambda: PipelineSpec(**SPEC, recompute="yes"), TypeError,
          r"recompute must be a bool, got 'yes'"),
    Probe("spec-predictor-unknown", lambda: PipelineSpec(**SPEC, predictor="nosuch"), ValueError,
          r"unknown predictor 'nosuch'"),
    Probe("spec-predictor-number", lambda: PipelineSpec(**SPEC, predictor=3), TypeError,
          r"predictor must be a name, a Predictor or a factory"),
    Probe("spec-optimizer-instance", lambda: PipelineSpec(**{**SPEC, "optimizer": torch.optim.SGD(
        _model().parameters(), lr=0.1)}), TypeError, "optimizer must be a factory"),
    Probe("spec-schedule-name", lambda: PipelineSpec(**{**SPEC, "schedule": "gpipe"}), TypeError,
          r"schedule='gpipe' is a name"),
    Probe("spec-is-frozen", lambda: setattr(PipelineSpec(**SPEC), "D", 3), AttributeError, ""),
]


@probes.parametrize(SPEC_PROBES)
def test_spec_probe(probe: Probe) -> None:
    probe.check()


def test_a_spec_and_keywords_build_the_same_run() -> None:
    """Emulator(model, spec) and Emulator(model, **fields) train identically; keywords replace a spec's fields."""
    spec = PipelineSpec(**SPEC)
    a = Emulator(_model(), spec).run(_data())
    b = _emu().run(_data())
    assert a.losses == b.losses
    assert Emulator(_model(), spec, recompute=True).plan.stages[0].recompute is True
    assert PipelineSpec(**spec.fields()) == spec


@probes.parametrize(EMULATOR_PROBES)
def test_emulator_probe(probe: Probe) -> None:
    probe.check()


def test_second_run_is_refused_clearly() -> None:
    """An Emulator's schedule, version table and rings are one pass: a second run() says so (was a KeyError)."""
    emu = _emu()
    first = emu.run(_data())
    assert first.steps_done == 3
    with pytest.raises(RuntimeError, match="runs its schedule once.*build a new Emulator"):
        emu.run(_data())


def test_continuing_with_a_new_emulator_trains_on() -> None:
    """The documented way to continue: a new Emulator on the same (trained) model."""
    model = _model()
    before = copy.deepcopy(model)
    _emu(model=model).run(_data())
    after_one = copy.deepcopy(model)
    _emu(model=model).run(_data())
    moved = [(a - b).abs().max().item() for a, b in zip(after_one.parameters(), model.parameters())]
    assert max(moved) > 0 and any((a - b).abs().max() > 0 for a, b in zip(before.parameters(), after_one.parameters()))


def test_a_refused_batch_leaves_the_emulator_usable() -> None:
    """Data checked before the first event runs: after a bad first mini-batch the same Emulator still runs."""
    emu = _emu()
    with pytest.raises(TypeError):
        emu.run([{"x": x, "y": y} for x, y in _data()])
    assert emu.run(_data()).steps_done == 3


def test_evaluation_on_an_empty_set_is_refused() -> None:
    """It used to report loss 0.0 and accuracy 0.0, which reads as a result."""
    import torch
    from torch import nn

    from pipelab.emulator.reference import evaluate

    stages = [nn.Linear(3, 2).double()]
    with pytest.raises(ValueError, match="empty evaluation set"):
        evaluate(stages, torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, dtype=torch.long))
    loss, acc = evaluate(stages, torch.zeros(4, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    assert loss > 0 and 0.0 <= acc <= 1.0


# ------------------------------------------------------------------------------- validation of the arguments
# Each was accepted and then gave a wrong result: "false" read as True, an infinite loss scale skipping every step,
# a negative cost in a closed form, a calibration case that silently became "not runnable", figures written into
# the current directory.

INF, NAN = float("inf"), float("nan")


def _calibration(**kw: object) -> None:
    from pipelab.studies.calibration import CalibrationCase, CalibrationConfig

    if "policy" in kw:
        kw = {"cases": (CalibrationCase("gpipe", policy=kw.pop("policy")),), **kw}
    CalibrationConfig(**kw).check()  # type: ignore[arg-type]


def _scaling(**kw: object) -> object:
    from pipelab.precision import LossScaling

    return LossScaling(**kw)  # type: ignore[arg-type]


def _hybrid(**kw: object) -> object:
    from pipelab.schedules import hybrid

    return hybrid(2, 4, 2, **kw)  # type: ignore[arg-type]


def _zb(name: str, **kw: float) -> object:
    from pipelab.papers import zero_bubble_closed_form

    return zero_bubble_closed_form(name, 4, **kw)


def _zb_table(**kw: float) -> object:
    from pipelab.studies.figures.zero_bubble import zero_bubble_table

    return zero_bubble_table([2], [4], **kw)


def _steady(**kw: float) -> object:
    from pipelab.schedules import zb_h1
    from pipelab.simulator import steady_state

    return steady_state(zb_h1, 2, 4, **kw)


VALIDATION_PROBES = [
    Probe("hybrid-asynchronous-string", lambda: _hybrid(asynchronous="false"), TypeError,
          "asynchronous must be True or False, got str 'false'"),
    Probe("hybrid-asynchronous-int", lambda: _hybrid(asynchronous=1), TypeError, "asynchronous must be True or False"),
    Probe("loss-scaling-inf", lambda: _scaling(init_scale=INF), ValueError, "init_scale must be finite, got inf"),
    Probe("loss-scaling-string", lambda: _scaling(init_scale="65536"), TypeError,
          "init_scale must be a number, got str '65536'"),
    Probe("loss-scaling-growth-inf", lambda: _scaling(growth_factor=INF), ValueError, "growth_factor must be finite"),
    Probe("loss-scaling-backoff-bool", lambda: _scaling(backoff_factor=True), TypeError, "backoff_factor must be a"),
    Probe("zb-closed-form-negative", lambda: _zb("ZB-H1", t_w=-1.0), ValueError, r"t_w must be >= 0.*got -1\.0"),
    Probe("zb-closed-form-nan", lambda: _zb("1F1B", t_f=NAN), ValueError, "t_f must be finite, got nan"),
    Probe("zb-closed-form-inf", lambda: _zb("ZB-H2", t_i=INF), ValueError, "t_i must be finite, got inf"),
    Probe("zb-closed-form-string", lambda: _zb("ZB-H2", t_i="1"), TypeError, "t_i must be a number"),
    Probe("zb-table-negative", lambda: _zb_table(t_w=-0.5), ValueError, r"t_w must be > 0.*got -0\.5"),
    Probe("steady-state-negative-scale", lambda: _steady(scale=-1.0), ValueError, r"scale must be > 0"),
    Probe("steady-state-inf-activation", lambda: _steady(activation=INF), ValueError, "activation must be finite"),
    Probe("calibration-float-ranks", lambda: _calibration(ranks=2.0), ValueError,
          r"ranks must be an int >= 1, got 2\.0"),
    Probe("calibration-unknown-policy", lambda: _calibration(policy="nope"), ValueError,
          r"case 'gpipe': policy must be one of .*stashing.*got 'nope'"),
    Probe("calibration-unknown-optimizer", lambda: _calibration(optimizer="nope"), ValueError,
          r"optimizer must be one of .*sgdm.*got 'nope'"),
    Probe("calibration-zero-microbatches", lambda: _calibration(microbatches=0), ValueError,
          "microbatches must be an int >= 1, got 0"),
]


@probes.parametrize(VALIDATION_PROBES)
def test_validation_probe(probe: Probe) -> None:
    probe.check()


@pytest.mark.parametrize("out", ["", "  ", "afile"])
def test_figures_out_empty_or_a_file_is_refused_before_any_experiment(out: str, tmp_path, monkeypatch, capsys) -> None:
    """``--out ''`` wrote the figures into the current directory; a file as --out failed only after the figure."""
    from pipelab.studies import figures
    from pipelab.studies.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("keep")
    want = "is a file, not a directory" if out == "afile" else rf"output directory \(outdir, --out\) is {out!r}"
    assert main(["figures", "model_stages", "--preset", "tiny", "--out", out]) == 2
    assert re.search(want, capsys.readouterr().err)
    with pytest.raises(ValueError, match=want):
        figures.render(["model_stages"], "tiny", out)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").read_text() == "keep"
