"""Reliability probes of the weight predictors and of predictor selection: bad input gets a one-line error.

Each probe once misbehaved: a raw AttributeError deep inside (a string or a Module where an optimizer is
expected), a silent stale prediction (history predictors never observed), an unknown predictor name
silently ignored (policies that predict nothing).
"""

from __future__ import annotations

import warnings

import probes
import pytest
import torch
from probes import Probe
from torch import nn

from pipelab.emulator import Emulator, build_pipeline
from pipelab.predictors import (
    LinearExtrapolation,
    PipeMare,
    PipeOptim,
    Repeat,
    make_predictor,
)

DT = torch.float64


def _opt(cls=torch.optim.SGD, steps: int = 1, **kw) -> torch.optim.Optimizer:
    """An optimizer over two float64 parameters, ``steps`` real steps taken."""
    gen = torch.Generator().manual_seed(0)
    params = [nn.Parameter(torch.randn(3, 2, generator=gen, dtype=DT)), nn.Parameter(torch.randn(2, dtype=DT))]
    opt = cls(params, **({"lr": 0.1} | kw))
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=DT)
        opt.step()
    return opt


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def _emulator(policy: str, predictor) -> Emulator:
    from pipelab.schedules import pipedream

    return Emulator(_model(), D=2, schedule=pipedream(2, 1, 3), policy=policy,
                    optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), predictor=predictor)


def _plan(policy: str, predictor):
    from pipelab.schedules import pipedream

    return build_pipeline(_model(), D=2, schedule=pipedream(2, 1, 3), policy=policy,
                          optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), predictor=predictor)


SGDM = _opt(momentum=0.9)
NAMES = ["stale", "spectrain", "pipeoptim", "pipeoptim_code", "repeat", "zero_grad_rollout", "linear", "pipemare"]

PROBES = [
    # 2. history predictors asked to extrapolate a history they were never given
    Probe("linear-never-observed", lambda: LinearExtrapolation().predict(SGDM, 2), ValueError, r"observe\(optimizer\)"),
    Probe("pipemare-never-observed", lambda: PipeMare().predict(SGDM, 1), ValueError, r"observe\(optimizer\)"),
    Probe("pipemare-never-observed-all", lambda: PipeMare().predict_all(SGDM, 2), ValueError, "observe"),
    # 3. an unknown predictor name is rejected whatever the policy
    Probe("emulator-stashing-unknown-name", lambda: _emulator("stashing", "nonsense"), ValueError,
          r"unknown predictor 'nonsense'.*pipeoptim.*oracle"),
    Probe("build-pipeline-vanilla-unknown-name", lambda: _plan("vanilla", "nonsense"), ValueError,
          "unknown predictor 'nonsense'"),
    Probe("emulator-pipeoptim-unknown-name", lambda: _emulator("pipeoptim", "nonsense"), ValueError,
          "unknown predictor 'nonsense'"),
    Probe("emulator-stashing-bad-type", lambda: _emulator("stashing", 3), TypeError, "predictor must be"),
    Probe("emulator-stashing-unused-predictor", lambda: _emulator("stashing", "pipeoptim"), None,
          "predictor 'pipeoptim' is unused.*stashing", warns=UserWarning),
    # 4. wrong argument types to the predictors' public entry points
    *[Probe(f"{n}-predict-str-optimizer", lambda n=n: make_predictor(n).predict("adam", 2), TypeError,
            r"optimizer must be a torch\.optim\.Optimizer.*str") for n in NAMES],
    Probe("predict-module-as-optimizer", lambda: PipeOptim().predict(nn.Linear(2, 2), 1), TypeError,
          r"got Linear.*torch\.optim\.SGD\(model\.parameters\(\)"),
    Probe("predict-all-str-optimizer", lambda: Repeat().predict_all("sgd", 2), TypeError, "optimizer must be"),
    Probe("check-str-optimizer", lambda: PipeOptim().check("adam"), TypeError, "optimizer must be"),
    Probe("observe-str-optimizer", lambda: PipeMare().observe("adam"), TypeError, "optimizer must be"),
    Probe("state-dict-str-optimizer", lambda: PipeMare().state_dict("adam"), TypeError, "optimizer must be"),
    Probe("s-negative", lambda: PipeOptim().predict(SGDM, -1), ValueError, "non-negative"),
    Probe("s-float", lambda: PipeOptim().predict(SGDM, 2.0), TypeError, "integer"),
    Probe("s-str", lambda: Repeat().predict(SGDM, "2"), TypeError, "integer"),
    Probe("max-s-negative", lambda: Repeat().predict_all(SGDM, -2), ValueError, "non-negative"),
    Probe("params-wrong-length", lambda: PipeOptim().predict(SGDM, 1, params=[torch.zeros(3, 2, dtype=DT)]),
          ValueError, "params has 1 tensors but the optimizer has 2"),
    Probe("params-one-tensor", lambda: PipeOptim().predict(SGDM, 1, params=torch.zeros(2, dtype=DT)), TypeError,
          "params must be a sequence of tensors"),
    Probe("params-not-iterable", lambda: PipeOptim().predict(SGDM, 1, params=5), TypeError,
          "params must be a sequence of tensors"),
    Probe("params-non-tensor", lambda: PipeOptim().predict(SGDM, 1, params=[1.0, 2.0]), TypeError,
          r"params\[0\] must be a Tensor"),
    Probe("make-predictor-non-str", lambda: make_predictor(3), TypeError, "name must be"),
    Probe("pipemare-gamma-str", lambda: PipeMare(gamma="0.9"), TypeError, "gamma must be a number"),
    Probe("pipeoptim-eps-str", lambda: PipeOptim(eps="1e-8"), TypeError, "eps must be"),
    Probe("pipeoptim-weight-decay-str", lambda: PipeOptim(weight_decay="no"), TypeError, "weight_decay must be"),
    Probe("repeat-weight-decay-str", lambda: Repeat(weight_decay="no"), TypeError, "weight_decay must be"),
    Probe("pipeoptim-extra-steps-bool", lambda: PipeOptim(extra_steps=True), TypeError, "extra_steps"),
    Probe("pipemare-load-garbage-state", lambda: PipeMare().load_state_dict(SGDM, {"x": 1}), ValueError,
          "state must be"),
    # exact rebuild impossible when the last step erased W_{t-1} (lr·weight_decay = 1)
    Probe("pipeoptim-lr-times-wd-one", lambda: PipeOptim().predict(_opt(lr=1.0, weight_decay=1.0), 1), ValueError,
          "erased"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


def test_history_predictors_without_steps_predict_stale_weights() -> None:
    """One observation (the starting point) and no step yet: no motion seen, so the stale weights; s = 0 never
    needs a history."""
    opt = _opt(steps=0)
    for pred in (LinearExtrapolation(), PipeMare()):
        for w, p in zip(pred.predict(opt, 0), (p for g in opt.param_groups for p in g["params"])):
            assert torch.equal(w, p.detach())
        pred.observe(opt)
        for w, p in zip(pred.predict(opt, 3), (p for g in opt.param_groups for p in g["params"])):
            assert torch.equal(w, p.detach())


def test_history_predictor_param_groups_changed_since_observed() -> None:
    opt = _opt()
    lin = LinearExtrapolation()
    lin.observe(opt)
    opt.step()
    lin.observe(opt)
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(2, dtype=DT))]})
    with pytest.raises(ValueError, match="observed 2 parameters.*has 3"):
        lin.predict(opt, 1)


def test_predicting_policy_with_oracle_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _plan("pipeoptim", "oracle")
        _plan("pipeoptim", "repeat")
        _plan("stashing", None)


# ----------------------------------------------------------------------- optimizer subclasses with their own step

class _ClippedAdam(torch.optim.Adam):
    """An Adam subclass whose step() differs from Adam's (it clips the gradients first)."""

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.clamp_(-0.1, 0.1)
        return super().step(closure)


class _NamedAdam(torch.optim.Adam):
    """An Adam subclass that keeps Adam's step()."""


class _NesterovSGD(torch.optim.SGD):
    def step(self, closure=None):  # type: ignore[override]
        return super().step(closure)


OVERRIDES = r"subclasses torch\.optim\.adam\.Adam but overrides step\(\).*register_rule\(_ClippedAdamRule\(\)\)"
SUBCLASS_PROBES = [
    # each used to predict with the parent's rule: Adam's prediction for an optimizer that clips first
    Probe("pipeoptim-adam-subclass-own-step", lambda: PipeOptim().predict(_opt(_ClippedAdam), 2), TypeError, OVERRIDES),
    Probe("repeat-adam-subclass-own-step", lambda: Repeat().predict(_opt(_ClippedAdam), 1), TypeError, OVERRIDES),
    Probe("check-sgd-subclass-own-step", lambda: make_predictor("spectrain").check(_opt(_NesterovSGD, momentum=0.9)),
          TypeError, r"_NesterovSGD subclasses torch\.optim\.sgd\.SGD.*rules\.SGDRule"),
    Probe("emulator-pipeoptim-adam-subclass", lambda: Emulator(
        _model(), D=2, schedule=__import__("pipelab.schedules").schedules.pipedream(2, 1, 3), policy="pipeoptim",
        optimizer=lambda ps: _ClippedAdam(ps, lr=0.1)), ValueError, "cannot follow stage 0's optimizer.*" + OVERRIDES),
    Probe("adam-subclass-keeping-step", lambda: PipeOptim().predict(_opt(_NamedAdam), 2), None),
]


@probes.parametrize(SUBCLASS_PROBES)
def test_subclass_probe(probe: Probe) -> None:
    probe.check()


def _seeded_opt(cls: type, **kw) -> torch.optim.Optimizer:
    torch.manual_seed(0)  # _opt draws its second parameter from the global generator
    return _opt(cls, **kw)


def test_subclass_keeping_step_predicts_as_its_parent() -> None:
    for pred in (PipeOptim(), Repeat()):
        ours, theirs = (pred.predict(_seeded_opt(c, steps=3), 2) for c in (_NamedAdam, torch.optim.Adam))
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_a_registered_rule_serves_the_subclass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The way the error names: a rule registered for the subclass is used (here Adam's, for a step that only
    adds clipping, which the rule's rebuild of the last update from the optimizer state does not need)."""
    from pipelab.predictors import rules
    from pipelab.predictors.rules_adam import AdamRule

    monkeypatch.setattr(rules, "_RULES", dict(rules._RULES))  # registering is global: undo it after the test

    class _ClippedAdamRule(AdamRule):
        optimizer_types = (_ClippedAdam,)

    rules.register_rule(_ClippedAdamRule())
    opt = _opt(_ClippedAdam, steps=3)
    assert isinstance(rules.rule_for(opt), _ClippedAdamRule)
    assert all(torch.isfinite(w).all() for w in PipeOptim().predict(opt, 2))


# ------------------------------------------------ torch's optimizer implementations (for-loop, foreach, fused)

def _implementations(name: str) -> list[dict[str, bool]]:
    """The implementations of registry optimizer ``name`` that torch offers on the CPU: for-loop, foreach, fused."""
    from pipelab.optim import optimizer_spec

    accepted = optimizer_spec(name).accepted()
    out = [{"foreach": False}, {"foreach": True}] if "foreach" in accepted else [{}]
    return out + ([{"fused": True}] if "fused" in accepted else [])


def _predictions_after_steps(opt_name: str, impl: dict[str, bool], pred_name: str, **overrides: object
                             ) -> list[list[torch.Tensor]] | None:
    """Three real steps of ``opt_name`` built with ``impl``, then ``pred_name``'s predictions for s = 1, 2, 3."""
    from pipelab.optim import make_optimizer

    gen = torch.Generator().manual_seed(0)
    params = [nn.Parameter(torch.randn(s, generator=gen, dtype=DT)) for s in ((4, 3), (3, 5))]
    opt = make_optimizer(opt_name, params, **impl, **overrides)
    pred = make_predictor(pred_name)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=DT)
        opt.step()
        pred.observe(opt)
    try:
        return [pred.predict(opt, s) for s in (1, 2, 3)]
    except (ValueError, TypeError):  # a predictor that does not serve this optimizer refuses whatever the impl
        return None


IMPL_CASES = [(o, impl, overrides) for o in ("sgd", "sgdm", "nesterov", "adam", "adamw", "rmsprop", "rmsprop_momentum",
                                             "adagrad", "nadam", "nadam_async", "radam", "adamax", "muon")
              for impl in _implementations(o)[1:]
              for overrides in ([{}, {"weight_decay": 0.1}, {"maximize": True}] if o in ("sgd", "sgdm", "nesterov")
                                else [{}])]


@pytest.mark.parametrize(("opt_name", "impl", "overrides"), IMPL_CASES,
                         ids=[f"{o}-{next(iter(i))}-{'-'.join(v) or 'default'}" for o, i, v in IMPL_CASES])
def test_every_predictor_equal_under_every_torch_implementation(opt_name: str, impl: dict[str, bool],
                                                                overrides: dict[str, object]) -> None:
    """torch's foreach SGD with Nesterov (weight_decay 0, maximize False) leaves g + μ·b_t in p.grad after a step,
    the for-loop leaves g: every predictor predicts the same weights (float64, 1e-12) whatever the implementation."""
    from pipelab.predictors import available_predictors

    served = 0
    for name in available_predictors():
        if name == "oracle":
            continue
        ref = _predictions_after_steps(opt_name, _implementations(opt_name)[0], name, **overrides)
        got = _predictions_after_steps(opt_name, impl, name, **overrides)
        assert (ref is None) == (got is None), name
        if ref is None or got is None:
            continue
        served += 1
        for ws, rs in zip(got, ref):
            for w, r in zip(ws, rs):
                torch.testing.assert_close(w, r, rtol=1e-12, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
    assert served >= 2


PIPELINE_CASES = [("pipeoptim", None), ("pipeoptim", "repeat"), ("spectrain", "spectrain_code"), ("spectrain", None),
                  ("nesterov_async", None)]


@pytest.mark.parametrize(("policy", "predictor"), PIPELINE_CASES, ids=[f"{p}-{q}" for p, q in PIPELINE_CASES])
def test_pipeline_with_foreach_nesterov_equals_for_loop(policy: str, predictor: str | None) -> None:
    """The emulator trains a Nesterov-SGD pipeline to the same weights and losses (float64, 1e-12) whether the
    stages' optimizers run torch's foreach or for-loop SGD (the stage's p.grad holds g + μ·b_t under foreach)."""
    from pipelab.optim import optimizer_factory
    from pipelab.schedules import pipedream

    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=gen, dtype=DT), torch.randint(0, 3, (8,), generator=gen))
               for _ in range(6)]

    def run(foreach: bool) -> tuple[list[float], list[torch.Tensor]]:
        model = _model()
        res = Emulator(model, D=3, schedule=pipedream(3, 1, 6), policy=policy, predictor=predictor,
                       optimizer=optimizer_factory("nesterov", lr=0.1, foreach=foreach)).run(batches)
        return res.losses, [p.detach() for p in model.parameters()]

    (ref_losses, ref_w), (losses, w) = run(False), run(True)
    assert losses == pytest.approx(ref_losses, rel=1e-12, abs=1e-12)
    for a, b in zip(w, ref_w):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


class _DoublingSGD(torch.optim.SGD):
    """An SGD whose step leaves 2·g in p.grad afterwards: no rule can rebuild the step from what p.grad holds."""

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.mul_(2)
        return loss


def test_a_step_that_overwrites_p_grad_unrecoverably_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Predictions that read p.grad refuse (they used to read 2·g as the gradient); those that do not still work."""
    from pipelab.predictors import rules

    monkeypatch.setattr(rules, "_RULES", dict(rules._RULES))

    class _DoublingSGDRule(rules.SGDRule):
        optimizer_types = (_DoublingSGD,)

    rules.register_rule(_DoublingSGDRule())
    opt = _opt(_DoublingSGD, steps=2, momentum=0.9, nesterov=True)
    for name in ("pipeoptim", "repeat", "spectrain_code"):
        with pytest.raises(ValueError, match=r"_DoublingSGD\.step\(\).*cannot rebuild the step.*foreach=False"):
            make_predictor(name).predict(opt, 1)
    assert all(torch.isfinite(w).all() for w in make_predictor("spectrain").predict(opt, 1))
