"""Contract tests of the weight predictors (pipelab.predictors) against torch.optim and closed forms."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pipelab.optim import optimizer_factory
from pipelab.predictors import (
    PREDICTORS,
    LinearExtrapolation,
    PipeMare,
    PipeOptim,
    Repeat,
    SpecTrain,
    available_predictors,
    make_predictor,
    rule_for,
    supported_optimizers,
)

DT = torch.float64
TIGHT = {"rtol": 1e-13, "atol": 1e-14}  # float64 rounding of a few operations
SHAPES = [(3, 4), (4,), (2, 2, 2)]
# Muon's: wide, tall (transposed Newton-Schulz, lr ratio sqrt(5/2)) and square
SHAPES_2D: list[tuple[int, ...]] = [(3, 4), (5, 2), (2, 2)]


def shapes(name: str) -> list[tuple[int, ...]]:
    """Parameter shapes of the problem for optimizer ``name`` (Muon takes only 2-D parameters)."""
    return SHAPES_2D if name.startswith("muon") else SHAPES

# Every supported optimizer family and option that changes its update rule.
F = optimizer_factory
OPTIMIZERS = {
    "sgd": F("sgd", lr=0.1),
    "sgd_wd_max": F("sgd", lr=0.1, weight_decay=0.1, maximize=True),
    "sgd_wd": F("sgd", lr=0.1, weight_decay=0.1),
    "sgdm": F("sgdm", lr=0.1),
    "sgdm_damp_wd": F("sgdm", lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.05),
    "sgd_nesterov": F("nesterov", lr=0.1, weight_decay=0.01),
    "sgd_nesterov_wd_max": F("nesterov", lr=0.1, weight_decay=0.1, maximize=True),
    "adam": F("adam", lr=0.01),
    "adam_l2_amsgrad": F("adam", lr=0.01, weight_decay=0.1, amsgrad=True),
    "adamw": F("adamw", lr=0.01, weight_decay=0.1),
    "adamw_amsgrad_wd": F("adamw", lr=0.01, weight_decay=0.1, amsgrad=True),
    "adamw_amsgrad_max": F("adamw", lr=0.01, amsgrad=True, maximize=True, betas=(0.8, 0.95)),
    "rmsprop": F("rmsprop", lr=0.01),
    "rmsprop_centered_mom_wd": F("rmsprop_momentum", lr=0.01, weight_decay=0.1),
    "rmsprop_mom": F("rmsprop", lr=0.01, momentum=0.5),
    "rmsprop_wd": F("rmsprop", lr=0.01, weight_decay=0.1),
    "rmsprop_centered_wd": F("rmsprop", lr=0.01, centered=True, weight_decay=0.1),
    "adagrad": F("adagrad", lr=0.1),
    "adagrad_decay": F("adagrad", lr=0.1, lr_decay=0.05, initial_accumulator_value=0.2, weight_decay=0.1),
    "nadam": F("nadam", lr=0.01),
    "nadam_l2": F("nadam", lr=0.01, weight_decay=0.1),
    "nadam_decoupled": F("nadam", lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
    "radam": F("radam", lr=0.01, weight_decay=0.1),
    "radam_decoupled": F("radam", lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
    "adamax": F("adamax", lr=0.01, weight_decay=0.1),
    "muon": F("muon", lr=0.02),
    "muon_heavy_ball": F("muon", lr=0.02, momentum=0.9, nesterov=False, weight_decay=0.0),
    "muon_rms_adamw": F("muon", lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw", ns_steps=3),
}


def make_problem(name: str, seed: int = 0, warmup: int = 3, groups: bool = False):
    """Parameters with a constant gradient (a linear loss) and an optimizer warmed up ``warmup`` steps."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=DT)) for s in shapes(name)]
    grads = [torch.randn(s, generator=gen, dtype=DT) for s in shapes(name)]
    if groups:
        opt = OPTIMIZERS[name]([{"params": params[:2]}, {"params": params[2:]}])
        opt.param_groups[1]["lr"] *= 0.5
    else:
        opt = OPTIMIZERS[name](params)
    for _ in range(warmup):
        real_step(opt, params, grads)
    return params, grads, opt


def real_step(opt, params, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()


def snapshot(opt, params):
    return copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params], \
        [None if p.grad is None else p.grad.clone() for p in params], len(opt.state)


def assert_same_tree(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_tree(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_tree(x, y)
    else:
        assert a == b


def test_registry_names():
    for name in ["stale", "spectrain", "spectrain_code", "pipeoptim", "pipeoptim_code", "repeat",
                 "zero_grad_rollout", "linear", "pipemare"]:
        assert name in available_predictors()
    assert set(supported_optimizers()) >= {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "NAdam", "RAdam", "Adamax",
                                           "Muon"}


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_repeat_equals_real_steps_under_constant_gradient(opt_name):
    params, grads, opt = make_problem(opt_name, groups=opt_name in ("sgdm_damp_wd", "adamw", "nadam", "muon"))
    pred = Repeat()
    predicted = {s: pred.predict(opt, s) for s in range(1, 8)}
    for s in range(1, 8):
        real_step(opt, params, grads)
        for w_hat, p in zip(predicted[s], params):
            torch.testing.assert_close(w_hat, p.detach(), **TIGHT)


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("name", ["repeat", "zero_grad_rollout", "pipeoptim", "linear"])
def test_predict_all_equals_predict_per_s(opt_name, name):
    """The one-pass trajectory (in-place private state after the first step) equals separate predictions."""
    params, grads, opt = make_problem(opt_name)
    pred = make_predictor(name)
    pred.observe(opt)
    real_step(opt, params, grads)
    pred.observe(opt)
    before = snapshot(opt, params)
    traj = pred.predict_all(opt, 4)
    assert len(traj) == 4
    for s in range(1, 5):
        for x, y in zip(traj[s - 1], pred.predict(opt, s)):
            assert torch.equal(x, y)
    assert len({t.data_ptr() for step in traj for t in step}) == 4 * len(params)  # no aliasing
    assert_same_tree(before[0], snapshot(opt, params)[0])


@pytest.mark.parametrize("opt_name", ["sgdm", "adam", "adagrad_decay", "nadam", "rmsprop", "muon", "muon_heavy_ball"])
def test_repeat_from_fresh_optimizer(opt_name):
    """Before the first step the rollout creates the state torch.optim would (without touching it)."""
    params, grads, opt = make_problem(opt_name, warmup=0)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    n_state = len(opt.state)
    predicted = Repeat().predict(opt, 4)
    assert len(opt.state) == n_state
    for _ in range(4):
        real_step(opt, params, grads)
    for w_hat, p in zip(predicted, params):
        torch.testing.assert_close(w_hat, p.detach(), **TIGHT)


@pytest.mark.parametrize("name", [n for n in PREDICTORS if n != "pipeoptim_code"])
@pytest.mark.parametrize("opt_name", ["sgdm_damp_wd", "adamw", "rmsprop", "nadam", "muon"])
def test_s_zero_is_identity(name, opt_name):
    params, grads, opt = make_problem(opt_name)
    pred = make_predictor(name)
    if name.startswith("spectrain") and not opt_name.startswith("sgd"):
        return
    pred.observe(opt)
    out = pred.predict(opt, 0)
    for w, p in zip(out, params):
        assert torch.equal(w, p.detach()) and w.data_ptr() != p.data_ptr()
    other = [torch.randn_like(p) for p in params]
    for w, o in zip(pred.predict(opt, 0, params=other), other):
        assert torch.equal(w, o)


@pytest.mark.parametrize("name", list(PREDICTORS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_prediction_leaves_optimizer_bit_identical(name, opt_name):
    if name.startswith("spectrain") and not opt_name.startswith("sgdm"):
        return
    params, grads, opt = make_problem(opt_name)
    extra = torch.nn.Parameter(torch.ones((2, 2) if opt_name.startswith("muon") else 2, dtype=DT))  # no grad/state
    opt.add_param_group({"params": [extra]})
    pred = make_predictor(name)
    pred.observe(opt)
    real_step(opt, params, grads)
    pred.observe(opt)
    before = snapshot(opt, params + [extra])
    pred.predict(opt, 3)
    pred.predict(opt, 2, params=[p.detach() * 2 for p in params + [extra]])
    after = snapshot(opt, params + [extra])
    assert_same_tree(before[0], after[0])
    assert_same_tree(before[1:3], after[1:3])
    assert before[3] == after[3]


@pytest.mark.parametrize("opt_name", ["sgdm", "sgdm_damp_wd"])
def test_spectrain_equals_pipeoptim_for_sgdm(opt_name):
    params, grads, opt = make_problem(opt_name, groups=True)
    for s in (1, 2, 5):
        a = make_predictor("spectrain").predict(opt, s)
        b = make_predictor("pipeoptim").predict(opt, s)
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, **TIGHT)


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_apply_last_equals_weights_minus_scaled_last_update(opt_name):
    """The fused fast paths agree with the reference W − scale·last_update for every rule."""
    from pipelab.predictors.base import buckets
    from pipelab.predictors.rules import LastUpdateOptions

    params, grads, opt = make_problem(opt_name)
    rule = rule_for(opt)
    for opts in (LastUpdateOptions(), LastUpdateOptions(weight_decay=False, bias_step="t+1", eps=1e-3)):
        for b in buckets(opt, rule):
            st = rule.read(b.hp, b.states)
            W = [p.detach() for p in b.params]
            g = [p.grad for p in b.params]
            fast = rule.apply_last(b.hp, 0.1, st, W, g, opts, 2.5)
            ref = torch._foreach_add(W, rule.last_update(b.hp, 0.1, st, W, g, opts), alpha=-2.5)
            for x, y in zip(fast, ref):
                torch.testing.assert_close(x, y, **TIGHT)
            assert not torch.equal(fast[0], W[0])


def _assert_rel(x, y, rel, what=""):
    err = float((x - y).norm() / y.norm())
    assert err <= rel, f"{what}: relative error {err:.3g} > {rel:g}"


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_pipeoptim_last_update_is_the_applied_update(opt_name):
    """The rebuilt ``lr·ΔW_t`` is exactly ``W_{t−1} − W_t``, weight decay (coupled or decoupled) included.

    Varying gradients, so the state is not that of a constant gradient; checked through ``last_update``,
    the fused ``apply_last`` and ``PipeOptim.predict`` (also from other starting weights, ``params=``).
    """
    from pipelab.predictors.base import buckets
    from pipelab.predictors.rules import LastUpdateOptions

    params, grads, opt = make_problem(opt_name, warmup=0)
    gen = torch.Generator().manual_seed(7)
    for _ in range(4):
        before = [p.detach().clone() for p in params]
        real_step(opt, params, [torch.randn(g.shape, generator=gen, dtype=DT) for g in grads])
    applied = [w0 - p.detach() for w0, p in zip(before, params)]  # W_{t−1} − W_t = lr·ΔW_t
    rule = rule_for(opt)
    for b in buckets(opt, rule):
        st = rule.read(b.hp, b.states)
        W = [p.detach() for p in b.params]
        g = [p.grad for p in b.params]
        rebuilt = rule.last_update(b.hp, b.hp["lr"], st, W, g, LastUpdateOptions())
        fused = rule.apply_last(b.hp, b.hp["lr"], st, W, g, LastUpdateOptions(), 1.0)
        for i, r, f, w in zip(b.positions, rebuilt, fused, W):
            _assert_rel(r, applied[i], 1e-12, f"last_update[{i}]")
            _assert_rel(w - f, applied[i], 1e-12, f"apply_last[{i}]")
    for s in (1, 3):
        for i, (w, p) in enumerate(zip(PipeOptim().predict(opt, s), params)):
            _assert_rel(p.detach() - w, s * applied[i], 1e-12, f"predict(s={s})[{i}]")
    other = [p.detach() + 1.0 for p in params]
    for i, (w, o) in enumerate(zip(PipeOptim().predict(opt, 2, params=other), other)):
        _assert_rel(o - w, 2 * applied[i], 1e-12, f"predict(params=)[{i}]")


def test_spectrain_closed_forms():
    params, grads, opt = make_problem("sgdm_damp_wd")
    lr, mu = 0.1, 0.8
    bufs = [opt.state[p]["momentum_buffer"] for p in params]
    for w, p, b in zip(SpecTrain().predict(opt, 3), params, bufs):
        torch.testing.assert_close(w, p.detach() - 3 * lr * b, **TIGHT)
    for w, p, b, g in zip(make_predictor("spectrain_code").predict(opt, 3), params, bufs, grads):
        torch.testing.assert_close(w, p.detach() - 3 * lr * (mu * b + g), **TIGHT)


def test_linear_equals_spectrain_for_undamped_sgdm():
    params, grads, opt = make_problem("sgdm", warmup=1)
    lin = LinearExtrapolation()
    lin.observe(opt)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        real_step(opt, params, [torch.randn(g.shape, generator=gen, dtype=DT) for g in grads])
        lin.observe(opt)
    for x, y in zip(lin.predict(opt, 4), SpecTrain().predict(opt, 4)):
        torch.testing.assert_close(x, y, **TIGHT)


def test_pipeoptim_plain_sgd_is_exact_for_constant_gradient():
    """torch.optim.SGD without momentum keeps no state; ΔW_t is then the last gradient itself."""
    params, grads, opt = make_problem("sgd")
    assert len(opt.state) == 0
    for w, p, g in zip(PipeOptim().predict(opt, 4), params, grads):
        torch.testing.assert_close(w, p.detach() - 4 * 0.1 * g, **TIGHT)


def test_zero_grad_rollout_sgdm_closed_form():
    params, grads, opt = make_problem("sgdm")
    lr, mu, s = 0.1, 0.9, 5
    geom = mu * (1 - mu ** s) / (1 - mu)
    for w, p in zip(make_predictor("zero_grad_rollout").predict(opt, s), params):
        torch.testing.assert_close(w, p.detach() - lr * geom * opt.state[p]["momentum_buffer"], **TIGHT)


def test_adam_repeat_closed_form_from_fresh_state():
    """Constant g from zero moments: m̂ = g, v̂ = g², every step moves lr·g/(|g| + eps)."""
    params, grads, opt = make_problem("adam", warmup=0)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    for w, p, g in zip(Repeat().predict(opt, 6), params, grads):
        torch.testing.assert_close(w, p.detach() - 6 * 0.01 * g / (g.abs() + 1e-8), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias_step,placement", [("t", "outside"), ("t+1", "outside"), ("t", "inside")])
def test_pipeoptim_adamw_closed_form(bias_step, placement):
    params, grads, opt = make_problem("adamw", warmup=4)
    lr, wd, b1, b2, eps, s = 0.01, 0.1, 0.9, 0.999, 1e-8, 3
    tau = 4 + (bias_step == "t+1")
    pred = PipeOptim(bias_step=bias_step, eps_placement=placement)
    for w, p in zip(pred.predict(opt, s), params):
        st = opt.state[p]
        m_hat, v_hat = st["exp_avg"] / (1 - b1 ** tau), st["exp_avg_sq"] / (1 - b2 ** tau)
        den = v_hat.sqrt() + eps if placement == "outside" else (v_hat + eps).sqrt()
        # exact decoupled decay: W_{t−1} − W_t = lr·(m̂/den + wd·W_t)/(1 − lr·wd)
        expect = p.detach() - s * lr * (m_hat / den + wd * p.detach()) / (1 - lr * wd)
        torch.testing.assert_close(w, expect, **TIGHT)


def test_pipeoptim_code_preset():
    """s+1 steps, eps = 1e-8 outside the root whatever the optimizer's eps, no AdamW decay, step t."""
    params = [torch.nn.Parameter(torch.randn(5, dtype=DT))]
    opt = torch.optim.AdamW(params, lr=0.01, eps=1e-3, weight_decay=0.5)
    for _ in range(3):
        params[0].grad = torch.randn(5, dtype=DT)
        opt.step()
    st = opt.state[params[0]]
    m_hat, v_hat = st["exp_avg"] / (1 - 0.9 ** 3), st["exp_avg_sq"] / (1 - 0.999 ** 3)
    for s in (0, 1, 3):
        w = make_predictor("pipeoptim_code").predict(opt, s)[0]
        torch.testing.assert_close(w, params[0].detach() - (s + 1) * 0.01 * m_hat / (v_hat.sqrt() + 1e-8), **TIGHT)


def test_pipemare_ema_by_hand():
    w = torch.nn.Parameter(torch.zeros(1, dtype=DT))
    opt = torch.optim.SGD([w], lr=1.0)
    pm = PipeMare(gamma=0.5)
    pm.observe(opt)
    delta = 0.0
    for g in (-1.0, -3.0, 2.0):
        w.grad = torch.tensor([g], dtype=DT)
        opt.step()
        pm.observe(opt)
        delta = 0.5 * delta + 0.5 * (-g)
    assert pm.predict(opt, 4)[0].item() == pytest.approx(w.item() + 4 * delta, abs=1e-15)
    assert pm.observations(opt) == 4


def test_params_argument_predicts_from_given_weights():
    params, grads, opt = make_problem("sgdm_damp_wd")
    other = [p.detach() + 1.0 for p in params]
    for w, o, p in zip(PipeOptim().predict(opt, 2, params=other), other, params):
        torch.testing.assert_close(w, o - 2 * 0.1 * opt.state[p]["momentum_buffer"], **TIGHT)
    # repeat from given weights equals real steps from those weights (weight decay evaluated there)
    predicted = Repeat().predict(opt, 3, params=other)
    with torch.no_grad():
        for p, o in zip(params, other):
            p.copy_(o)
    for _ in range(3):
        real_step(opt, params, grads)
    for w, p in zip(predicted, params):
        torch.testing.assert_close(w, p.detach(), **TIGHT)


@pytest.mark.parametrize("opt_name", ["sgdm", "adamw", "adagrad_decay", "muon"])
def test_repeat_with_lr_schedule_matches_scheduled_steps(opt_name):
    params, grads, opt = make_problem(opt_name, groups=True)
    base = [g["lr"] for g in opt.param_groups]

    def schedule(gi, j):
        return base[gi] * 0.7 ** (j + 1)

    predicted = Repeat(lr_schedule=schedule).predict(opt, 4)
    for j in range(4):
        for gi, g in enumerate(opt.param_groups):
            g["lr"] = schedule(gi, j)
        real_step(opt, params, grads)
    for w, p in zip(predicted, params):
        torch.testing.assert_close(w, p.detach(), **TIGHT)
    # constant-velocity predictors use the sum of the future learning rates
    params, grads, opt = make_problem("sgdm")
    a = PipeOptim(lr_schedule=lambda gi, j: 0.1 * 0.5 ** j).predict(opt, 3)
    for w, p in zip(a, params):
        torch.testing.assert_close(w, p.detach() - 0.1 * 1.75 * opt.state[p]["momentum_buffer"], **TIGHT)


def test_repeat_keeps_parameters_without_gradient_fixed():
    params, grads, opt = make_problem("adam")
    params[1].grad = None
    out = Repeat().predict(opt, 2)
    assert torch.equal(out[1], params[1].detach())
    assert not torch.equal(out[0], params[0].detach())


def test_errors_are_clear():
    params, grads, opt = make_problem("adam")
    with pytest.raises(ValueError, match="SGD"):
        SpecTrain().predict(opt, 1)
    _, _, sgd = make_problem("sgd")
    with pytest.raises(ValueError, match="momentum"):
        SpecTrain().predict(sgd, 1)
    rprop = torch.optim.Rprop(params)
    with pytest.raises(TypeError, match="Adam.*SGD|supported"):
        make_predictor("repeat").predict(rprop, 1)
    with pytest.raises(ValueError, match="differentiable"):
        make_predictor("pipeoptim").predict(torch.optim.SGD(params, lr=0.1, differentiable=True), 1)
    with pytest.raises(ValueError, match="non-negative"):
        make_predictor("pipeoptim").predict(opt, -1)
    with pytest.raises(TypeError, match="integer"):
        make_predictor("pipeoptim").predict(opt, 1.5)
    with pytest.raises(TypeError, match="integer"):
        make_predictor("pipeoptim").predict(opt, True)
    with pytest.raises(ValueError, match="tensors"):
        make_predictor("pipeoptim").predict(opt, 1, params=params[:1])
    with pytest.raises(ValueError, match="float32"):
        make_predictor("pipeoptim").predict(opt, 1, params=[p.detach().float() for p in params])
    with pytest.raises(ValueError, match="shape"):
        make_predictor("pipeoptim").predict(opt, 1, params=[p.detach().reshape(-1) for p in params])
    with pytest.raises(ValueError, match="unknown predictor.*stale"):
        make_predictor("nope")
    with pytest.raises(TypeError, match="pipemare"):
        make_predictor("pipemare", momentum=0.9)
    with pytest.raises(ValueError, match="bias_step"):
        PipeOptim(bias_step="t+2")
    opt.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="gradient"):
        Repeat().predict(opt, 1)
    _, _, nadam = make_problem("nadam")
    nadam.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="gradient"):
        PipeOptim().predict(nadam, 1)


def test_rule_for_subclass_and_names():
    class MyAdamW(torch.optim.AdamW):
        pass

    p = [torch.nn.Parameter(torch.zeros(1))]
    assert rule_for(MyAdamW(p)).name == "Adam"
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        rule_for(object())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("opt_name", ["sgdm", "adamw", "rmsprop_centered_mom_wd"])
def test_repeat_on_cuda(opt_name):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=DT).cuda()) for s in SHAPES]
    grads = [torch.randn(s, generator=gen, dtype=DT).cuda() for s in SHAPES]
    opt = OPTIMIZERS[opt_name](params)
    real_step(opt, params, grads)
    predicted = Repeat().predict(opt, 3)
    for _ in range(3):
        real_step(opt, params, grads)
    for w, p in zip(predicted, params):
        assert w.device == p.device
        torch.testing.assert_close(w, p.detach(), rtol=1e-12, atol=1e-12)


def test_float32_rollout_close_to_real_steps():
    params = [torch.nn.Parameter(torch.randn(50)) for _ in range(2)]
    grads = [torch.randn(50) for _ in range(2)]
    opt = torch.optim.Adam(params, lr=1e-3)
    real_step(opt, params, grads)
    predicted = Repeat().predict(opt, 5)
    for _ in range(5):
        real_step(opt, params, grads)
    for w, p in zip(predicted, params):
        torch.testing.assert_close(w, p.detach(), rtol=1e-6, atol=1e-6)
    assert math.isfinite(float(predicted[0].sum()))


# -- Muon: its Newton-Schulz orthogonalisation, 2-D parameters only -----------------------------------------
def test_muon_newton_schulz_is_torchs_bit_for_bit():
    from pipelab.predictors.rules_muon import lr_ratio, newton_schulz

    muon = pytest.importorskip("torch.optim._muon")  # torch's private helpers, the arithmetic the rule mirrors
    gen = torch.Generator().manual_seed(3)
    for shape in SHAPES_2D:
        m = torch.randn(shape, generator=gen, dtype=DT)
        for coeffs, steps, eps in (((3.4445, -4.7750, 2.0315), 5, 1e-7), ((2.0, -1.5, 0.5), 2, 1e-3)):
            ours = newton_schulz(m, coeffs, steps, eps)
            assert torch.equal(ours, muon._zeropower_via_newtonschulz(m, coeffs, steps, eps))
        for fn in (None, "original", "match_rms_adamw"):
            assert lr_ratio(fn, shape) * 0.02 == muon._adjust_lr(0.02, fn, torch.Size(shape))
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        lr_ratio("spectral", (2, 2))


@pytest.mark.parametrize("name", ["repeat", "zero_grad_rollout", "pipeoptim"])
def test_muon_refuses_parameters_that_are_not_2d(name):
    """torch.optim.Muon refuses non-2-D parameters at construction (and at step() for one added later);
    the predictors refuse them too, with a ValueError that says so."""
    with pytest.raises(ValueError, match="2D"):
        torch.optim.Muon([torch.nn.Parameter(torch.zeros(3, dtype=DT))])
    params, grads, opt = make_problem("muon")
    vec = torch.nn.Parameter(torch.ones(3, dtype=DT))
    opt.add_param_group({"params": [vec]})
    vec.grad = torch.ones(3, dtype=DT)
    with pytest.raises(ValueError, match="2-D parameters"):
        make_predictor(name).predict(opt, 2)
    with pytest.raises(ValueError, match="2-D parameters"):
        make_predictor(name).check(opt)
    with pytest.raises(ValueError, match="2D"):
        opt.step()


def test_muon_last_update_with_nesterov_needs_the_last_gradient():
    params, grads, opt = make_problem("muon")
    opt.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="Muon with nesterov=True.*gradient"):
        PipeOptim().predict(opt, 1)
    params, grads, opt = make_problem("muon_heavy_ball")  # heavy ball: NS(B_t) from the state alone
    opt.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in params]
    assert not torch.equal(PipeOptim().predict(opt, 1)[0], before[0])


def test_muon_zero_grad_rollout_equals_real_steps_with_zero_gradient():
    params, grads, opt = make_problem("muon_rms_adamw")
    predicted = make_predictor("zero_grad_rollout").predict(opt, 4)
    for _ in range(4):
        real_step(opt, params, [torch.zeros_like(g) for g in grads])
    for w, p in zip(predicted, params):
        torch.testing.assert_close(w, p.detach(), rtol=1e-13, atol=1e-14)
