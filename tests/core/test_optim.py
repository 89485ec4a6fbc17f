"""The optimizer registry (pipelab.optim), and the hyper-parameters every experiment builds with it.

The pins below are the values each experiment used before the registry existed (its own table): an
experiment must build exactly the same optimizer, every hyper-parameter of its param group included, so
that its results and figures stay bit-identical.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from pipelab.optim import (
    OPTIMIZERS,
    OptimizerSpec,
    available_optimizers,
    make_optimizer,
    optimizer_factory,
    optimizer_hyperparameters,
    optimizer_label,
)
from pipelab.studies.learning_curves import RunConfig, arm_optimizer
from pipelab.studies.prediction_error import prediction_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import predictors as bench_predictors  # noqa: E402
from benchmarks.runtime import _make_optimizer as bench_runtime_optimizer  # noqa: E402

SGD, Adam, AdamW = torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW

#: what pipelab.prediction_error.OPTIMIZERS held before the registry
PREDICTION_ERROR_BEFORE: dict[str, tuple[type, dict[str, Any]]] = {
    "sgd": (SGD, {"lr": 0.05}),
    "sgdm": (SGD, {"lr": 0.05, "momentum": 0.9}),
    "nesterov": (SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    "adam": (Adam, {"lr": 1e-3}),
    "adamw": (AdamW, {"lr": 1e-3, "weight_decay": 0.05}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 3e-4}),
    "rmsprop_momentum": (torch.optim.RMSprop, {"lr": 1e-4, "momentum": 0.9, "centered": True}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.02}),
    "nadam": (torch.optim.NAdam, {"lr": 1e-3}),
    "radam": (torch.optim.RAdam, {"lr": 1e-3}),
    "adamax": (torch.optim.Adamax, {"lr": 2e-3}),
}
#: pipelab.studies.learning_curves.OPTIMIZERS before the registry (PipeOptim §V-A)
LEARNING_CURVES_BEFORE = {
    "sgdm": (SGD, {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4}),
    "adam": (Adam, {"lr": 1e-3}),
    "adamw": (AdamW, {"lr": 1e-3, "weight_decay": 1e-2}),
}
#: benchmarks/predictors.py's table and benchmarks/runtime.py's _make_optimizer before the registry
BENCH_PREDICTORS_BEFORE = {
    "SGDM": (SGD, {"lr": 0.01, "momentum": 0.9}),
    "Adam": (Adam, {"lr": 1e-3}),
    "AdamW": (AdamW, {"lr": 1e-3, "weight_decay": 0.01}),
    "RMSprop": (torch.optim.RMSprop, {"lr": 1e-3}),
}
BENCH_RUNTIME_BEFORE = {"adam": (Adam, {"lr": 1e-4}), "sgdm": (SGD, {"lr": 1e-3, "momentum": 0.9})}


def _params(cls: type | None = None) -> list[torch.nn.Parameter]:
    if cls is torch.optim.Muon:  # Muon takes only 2-D parameters
        return [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(2, 2))]
    return [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]


def _groups(opt: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def assert_same_optimizer(opt: torch.optim.Optimizer, cls: type, hp: dict[str, Any]) -> None:
    ref = cls(_params(), **hp)
    assert type(opt) is cls
    assert _groups(opt) == _groups(ref)


@pytest.mark.parametrize("name", list(PREDICTION_ERROR_BEFORE))
def test_prediction_error_builds_todays_optimizers(name):
    assert_same_optimizer(prediction_optimizer(name, _params()), *PREDICTION_ERROR_BEFORE[name])


@pytest.mark.parametrize("name", list(LEARNING_CURVES_BEFORE))
def test_learning_curves_build_todays_optimizers(name):
    cls, hp = LEARNING_CURVES_BEFORE[name]
    assert_same_optimizer(arm_optimizer(name)(_params()), cls, hp)
    assert_same_optimizer(arm_optimizer(name, 0.123)(_params()), cls, {**hp, "lr": 0.123})



def test_benchmarks_build_todays_optimizers():
    built = {optimizer_label(n): make_optimizer(n, _params(), **o) for n, o in bench_predictors.OPTIMIZERS.items()}
    assert built.keys() == BENCH_PREDICTORS_BEFORE.keys()
    for label, (cls, hp) in BENCH_PREDICTORS_BEFORE.items():
        assert_same_optimizer(built[label], cls, hp)
    for name, (cls, hp) in BENCH_RUNTIME_BEFORE.items():
        assert_same_optimizer(bench_runtime_optimizer(name)(_params()), cls, hp)


def test_registry_defaults_are_torch_defaults_plus_the_variant():
    assert available_optimizers() == ["sgd", "sgdm", "nesterov", "adam", "adamw", "rmsprop", "rmsprop_momentum",
                                      "adagrad", "nadam", "nadam_async", "radam", "adamax", "muon"]
    for name, spec in OPTIMIZERS.items():
        assert isinstance(spec, OptimizerSpec) and spec.label and spec.description and spec.reference
        variant = {k: v for k, v in spec.defaults.items() if k not in ("lr", "weight_decay")}
        torch_default = spec.cls(_params(spec.cls), **variant)  # torch's own lr and weight decay
        assert _groups(make_optimizer(name, _params(spec.cls))) == _groups(torch_default), name
    assert OPTIMIZERS["sgdm"].defaults["momentum"] == 0.9
    assert optimizer_label("rmsprop_momentum") == "RMSprop (centered, momentum)"
    # Muon's entry writes out every one of torch's defaults (the variant is the optimizer itself)
    muon = torch.optim.Muon(_params(torch.optim.Muon))
    assert _groups(make_optimizer("muon", _params(torch.optim.Muon))) == _groups(muon)
    assert dict(OPTIMIZERS["muon"].defaults).keys() == set(OPTIMIZERS["muon"].accepted())
    assert optimizer_label("muon") == "Muon"
    assert make_optimizer("nadam_async", _params()).defaults["betas"] == (0.99, 0.999)  # 2505.01099's β1


def test_overrides_and_factory():
    opt = make_optimizer("adamw", _params(), lr=0.5, amsgrad=True)
    assert opt.defaults["lr"] == 0.5 and opt.defaults["amsgrad"] and opt.defaults["weight_decay"] == 1e-2
    f = optimizer_factory("sgdm", lr=0.2)
    assert pickle.loads(pickle.dumps(f))(_params()).defaults["lr"] == 0.2  # picklable: spawned ranks build it
    assert optimizer_hyperparameters("sgdm", lr=0.2) == {"lr": 0.2, "momentum": 0.9}
    groups = [{"params": _params()[:1]}, {"params": _params()[1:], "lr": 0.3}]
    assert make_optimizer("adam", groups).param_groups[1]["lr"] == 0.3


def test_errors_name_the_choices():
    with pytest.raises(ValueError, match="unknown optimizer 'lion'; choose one of sgd, sgdm"):
        make_optimizer("lion", _params())
    with pytest.raises(ValueError, match="unknown optimizer"):
        optimizer_factory("lion")
    with pytest.raises(TypeError, match="does not accept betas, foo"):
        optimizer_factory("sgd", foo=1, betas=(0.9, 0.99))
    with pytest.raises(TypeError, match="name must be a str"):
        optimizer_label(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        OPTIMIZERS["sgd"].defaults["lr"] = 1.0  # type: ignore[index]


def test_run_config_and_cli_accept_every_registered_optimizer():
    from pipelab.studies.run import choices

    assert choices()["optimizer"] == available_optimizers()
    for name in available_optimizers():
        RunConfig(task="digits_mlp", policy="stashing", optimizer=name, D=2, seed=0)
    with pytest.raises(ValueError, match="optimizer="):
        RunConfig(task="digits_mlp", policy="stashing", optimizer="lion", D=2, seed=0)
