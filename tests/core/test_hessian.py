"""Top Hessian eigenvalue by power iteration vs closed forms and dense Hessians; the lr threshold z*/λ."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import functional_call

from pipelab.stability import gd, heavy_ball, heavy_ball_threshold, max_stable_step
from pipelab.stability.hessian import hessian_vector_product, lr_threshold, top_eigenvalue


def _half_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((out - y) ** 2).sum(dim=1).mean()


def test_linear_least_squares_equals_the_top_eigenvalue_of_xtx_over_n() -> None:
    """L = ½·mean‖Wx + b − y‖² has Hessian [X 1]ᵀ[X 1]/n per output (a block diagonal): closed form via eigvalsh."""
    g = torch.Generator().manual_seed(0)
    n, d = 120, 6
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(0.3, 3.0, d, dtype=torch.float64)
    Y = torch.randn(n, 2, generator=g, dtype=torch.float64)
    model = torch.nn.Linear(d, 2).double()
    # batches of unequal size: the size-weighted mean over them is the loss over all n examples
    batches = [(X[:50], Y[:50]), (X[50:70], Y[50:70]), (X[70:], Y[70:])]
    est = top_eigenvalue(model, _half_mse, batches, iters=2000, tol=1e-13, seed=1)
    Xa = torch.cat([X, torch.ones(n, 1, dtype=torch.float64)], dim=1).numpy()
    want = np.linalg.eigvalsh(Xa.T @ Xa / n).max()
    assert est.converged and est.n_params == 2 * (d + 1)
    assert est.value == pytest.approx(want, rel=1e-9)
    assert est.history[-1] == est.value and len(est.history) >= 2
    # the Rayleigh quotients of power iteration increase monotonically to λ_max on a PSD Hessian
    assert all(b >= a - 1e-12 * want for a, b in zip(est.history, est.history[1:]))


def _flat_hessian_top(model: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor) -> float:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    sizes = [p.numel() for _, p in model.named_parameters()]
    flat0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def f(flat: torch.Tensor) -> torch.Tensor:
        parts = torch.split(flat, sizes)
        params = {n: t.reshape(s) for n, t, s in zip(names, parts, shapes)}
        return loss_fn(functional_call(model, params, (x,)), y)

    H = torch.autograd.functional.hessian(f, flat0)
    assert torch.allclose(H, H.T, atol=1e-12)
    return float(torch.linalg.eigvalsh(H).max())


@pytest.mark.parametrize("as_stages", [False, True, "modulelist"])
def test_tiny_mlp_equals_the_dense_hessian(as_stages: bool | str) -> None:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 4)).double()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (40,), generator=g)
    ce = torch.nn.functional.cross_entropy
    want = _flat_hessian_top(model, ce, x, y)
    target = [model[:2], model[2:]] if as_stages else model
    if as_stages == "modulelist":
        target = torch.nn.ModuleList(target)
    est = top_eigenvalue(target, ce, [(x[:25], y[:25]), (x[25:], y[25:])], iters=5000, tol=1e-14, seed=0)
    assert est.value == pytest.approx(want, rel=1e-7)


def test_indefinite_hessian_gives_the_largest_algebraic_eigenvalue() -> None:
    """½wᵀAw with eigenvalues (−5, 2, 1, 0.5): the dominant one is −5, the top one 2 (found by the shifted run)."""
    g = torch.Generator().manual_seed(7)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    A = Q @ torch.diag(torch.tensor([-5.0, 2.0, 1.0, 0.5], dtype=torch.float64)) @ Q.T

    class Quad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, generator=g, dtype=torch.float64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 0.5 * self.w @ A @ self.w + 0.0 * x.sum()

    est = top_eigenvalue(Quad(), lambda out, y: out, [(torch.zeros(1, 1), torch.zeros(1))], iters=3000, tol=1e-14)
    assert est.dominant == pytest.approx(-5.0, rel=1e-9)
    assert est.value == pytest.approx(2.0, rel=1e-9)


def test_float64_copy_leaves_the_callers_model_untouched() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    ce = torch.nn.functional.cross_entropy
    est64 = top_eigenvalue(model, ce, [(x, y)], dtype=torch.float64, iters=500, tol=1e-12)
    est32 = top_eigenvalue(model, ce, [(x, y)], iters=500, tol=1e-6)
    assert all(p.dtype == torch.float32 and torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(p.grad is None for p in model.parameters())
    assert est32.value == pytest.approx(est64.value, rel=1e-4)
    # the same seed gives the same history; a budget too small to converge says so
    again = top_eigenvalue(model, ce, [(x, y)], dtype=torch.float64, iters=500, tol=1e-12)
    assert again.history == est64.history
    short = top_eigenvalue(model, ce, [(x, y)], dtype=torch.float64, iters=2, tol=1e-15)
    assert not short.converged and len(short.history) == 2


def test_hessian_vector_product_matches_the_dense_hessian() -> None:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
    x, y = torch.randn(10, 2, dtype=torch.float64), torch.randint(0, 2, (10,))
    ce = torch.nn.functional.cross_entropy
    v = [torch.randn_like(p) for p in model.parameters()]
    hv = torch.cat([t.reshape(-1) for t in hessian_vector_product([model], ce, [(x, y)], v)])
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    names, shapes = [n for n, _ in model.named_parameters()], [p.shape for p in model.parameters()]

    def f(w: torch.Tensor) -> torch.Tensor:
        parts = torch.split(w, [int(np.prod(s)) for s in shapes])
        return ce(functional_call(model, {n: t.reshape(s) for n, t, s in zip(names, parts, shapes)}, (x,)), y)

    H = torch.autograd.functional.hessian(f, flat)
    assert torch.allclose(hv, H @ torch.cat([t.reshape(-1) for t in v]), rtol=1e-10, atol=1e-12)


def test_lr_threshold_is_z_star_over_lambda() -> None:
    lam = 4.0
    assert lr_threshold(max_stable_step(gd()), lam) == pytest.approx(2.0 / lam, rel=1e-9)  # GD: η·λ < 2
    assert lr_threshold(max_stable_step(heavy_ball(0.9)), lam) == pytest.approx(heavy_ball_threshold(0.9) / lam,
                                                                                 rel=1e-9)
    assert lr_threshold(math.inf, lam) == math.inf



def test_errors() -> None:
    model = torch.nn.Linear(2, 1)
    batch = [(torch.randn(4, 2), torch.randn(4, 1))]
    with pytest.raises(ValueError, match="iters must be an int >= 1"):
        top_eigenvalue(model, _half_mse, batch, iters=0)
    with pytest.raises(ValueError, match="tol must be a finite number > 0"):
        top_eigenvalue(model, _half_mse, batch, tol=0.0)
    with pytest.raises(ValueError, match="batches is empty"):
        top_eigenvalue(model, _half_mse, [])
    with pytest.raises(TypeError, match="model_or_stages must be"):
        top_eigenvalue("mlp", _half_mse, batch)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no parameters that require grad"):
        top_eigenvalue(torch.nn.ReLU(), _half_mse, batch)
    with pytest.raises(ValueError, match="eigenvalue must be a finite number > 0"):
        lr_threshold(2.0, 0.0)
    with pytest.raises(ValueError, match="z_star must be a number >= 0"):
        lr_threshold(-1.0, 1.0)
