"""Delayed torch.optim training on least squares vs the stability theory (pipelab.studies.stability_practice)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelab.stability import delayed_gd, delayed_gd_threshold, heavy_ball, max_stable_step, predicted_momentum
from pipelab.stability.hessian import lr_threshold, top_eigenvalue
from pipelab.studies.stability_practice import _sgd, delayed_training, least_squares_problem, max_stable_lr


@pytest.fixture(scope="module")
def problem():
    return least_squares_problem(12, lam_max=2.0, lam_min=0.05, seed=3)


def test_problem_has_the_requested_spectrum(problem):
    eig = torch.linalg.eigvalsh(problem.X.T @ problem.X).numpy()
    np.testing.assert_allclose(np.sort(eig), np.sort(problem.lams), rtol=1e-10)
    assert torch.linalg.vector_norm(problem.grad(problem.w_star)) < 1e-10


@pytest.mark.parametrize("tau,momentum,s", [(0, 0.0, None), (2, 0.0, None), (3, 0.7, None), (2, 0.7, 2), (3, 0.0, 3)])
def test_delayed_training_follows_the_delayed_recurrence(problem, tau, momentum, s):
    """The ring buffer really delays by τ: compare with the recurrence written out in numpy (float64)."""
    lr, T = 0.05, 60
    run = delayed_training(problem, lr, tau, steps=T, momentum=momentum, predict_s=s)
    X, y = problem.X.numpy(), problem.y.numpy()
    def grad(w: np.ndarray) -> np.ndarray:
        return X.T @ (X @ w - y)
    ws = [problem.w0.numpy().copy()]
    v = np.zeros_like(ws[0])
    for t in range(T):
        stale = ws[max(t - tau, 0)]
        if s:
            prev = ws[max(t - tau - 1, 0)]
            stale = stale + s * (stale - prev)   # = w − s·η·v with v the buffer that produced `stale`
        v = momentum * v + grad(stale)
        ws.append(ws[-1] - lr * v)
    ref = [np.linalg.norm(w - problem.w_star.numpy()) for w in ws]
    np.testing.assert_allclose(run.dist, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tau,kwargs,method", [
    (0, {}, delayed_gd(0)),
    (3, {}, delayed_gd(3)),
    (6, {}, delayed_gd(6)),
    (2, {"momentum": 0.9}, heavy_ball(0.9, 2)),
    (2, {"momentum": 0.9, "predict_s": 2}, predicted_momentum(0.9, 2)),
    (3, {"momentum": 0.5, "nesterov": True}, None),
])
@pytest.mark.slow
def test_bisection_matches_theoretical_threshold(problem, tau, kwargs, method):
    """Largest stable lr of the real optimizer = z*/λ_max within 1 % (bisection to 0.2 %, 1500 steps/trial)."""
    from pipelab.stability import nesterov
    method = method or nesterov(0.5, tau)
    measured = max_stable_lr(problem, tau, steps=1500, rel_tol=2e-3, **kwargs)
    theory = max_stable_step(method) / problem.lam_max
    assert measured == pytest.approx(theory, rel=0.01)


def test_bad_arguments(problem):
    with pytest.raises(ValueError, match="tau"):
        delayed_training(problem, 0.1, -1)
    with pytest.raises(ValueError, match="optimizer"):
        delayed_training(problem, 0.1, 1, optimizer="adam")
    with pytest.raises(ValueError, match="lam_min"):
        least_squares_problem(4, lam_max=1.0, lam_min=2.0)


@pytest.mark.parametrize("tau,momentum,policy", [(1, 0.0, "stashing"), (3, 0.0, "vanilla"), (2, 0.9, "stashing")])
def test_pipeline_training_equals_the_delayed_recurrence(tau: int, momentum: float, policy: str) -> None:
    """Async 1F1B with D = τ+1 stages, weights in stage 0: the schedule delays the gradient by exactly τ."""
    from pipelab.studies.stability_practice import pipeline_training

    prob = least_squares_problem(dim=6, lam_max=1.0, lam_min=0.05, seed=3)
    lr = 0.5 * delayed_gd_threshold(tau) if momentum == 0 else 0.02
    ref = delayed_training(prob, lr, tau, steps=120, momentum=momentum)
    got = pipeline_training(prob, lr, tau, steps=120, momentum=momentum, policy=policy)
    np.testing.assert_allclose(got.dist, ref.dist, rtol=1e-10, atol=1e-12)
    assert got.diverged == ref.diverged


@pytest.mark.slow
def test_bisection_through_the_emulator_finds_the_delayed_threshold() -> None:
    from pipelab.studies.stability_practice import pipeline_training

    prob = least_squares_problem(dim=4, lam_max=1.0, lam_min=0.1, seed=0)
    tau = 2
    theory = delayed_gd_threshold(tau) / prob.lam_max
    lr = max_stable_lr(prob, tau, lo=0.8 * theory, hi=1.2 * theory, rel_tol=5e-3, steps=400, trainer=pipeline_training)
    assert abs(lr / theory - 1) < 0.02  # 400 steps resolve the threshold to about 1 %


def test_measured_eigenvalue_and_z_star_predict_the_bisected_stable_lr() -> None:
    """End to end: λ_max by power iteration on ½‖Xw − y‖² (a torch model), z* of delayed GD, and the largest
    stable lr found by bisection of real delayed training (:func:`max_stable_lr`) agree."""
    prob = least_squares_problem(dim=8, lam_max=3.0, lam_min=0.1, seed=2)
    model = torch.nn.Linear(8, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(prob.w0.unsqueeze(0))
    m = prob.X.shape[0]
    # the practice problem sums over rows (no 1/m): a per-batch mean loss times m
    lam = top_eigenvalue(model, lambda out, y: 0.5 * m * ((out.squeeze(1) - y) ** 2).mean(), [(prob.X, prob.y)],
                         iters=3000, tol=1e-13).value
    assert lam == pytest.approx(prob.lam_max, rel=1e-8)
    tau = 2
    predicted = lr_threshold(max_stable_step(delayed_gd(tau)), lam)
    bisected = max_stable_lr(prob, tau, rel_tol=1e-3, steps=3000)
    assert bisected == pytest.approx(predicted, rel=2e-3)  # measured: 1.8e-4 apart (bisection to 1e-3)


def test_stability_practice_builds_todays_sgd():
    for lr, mom, nest in [(0.1, 0.0, False), (0.05, 0.9, True)]:
        opt = _sgd("sgd", lr, mom, nest)([torch.nn.Parameter(torch.zeros(2))])
        ref = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr, momentum=mom, nesterov=nest)
        assert type(opt) is torch.optim.SGD
        assert {k: v for k, v in opt.param_groups[0].items() if k != "params"} == \
            {k: v for k, v in ref.param_groups[0].items() if k != "params"}
    with pytest.raises(ValueError, match="'sgd'"):
        _sgd("adam", 0.1, 0.0, False)
