"""A task's top Hessian eigenvalue by power iteration with Hessian-vector products, and the lr it implies.

The stability analyses of this package (:mod:`.methods`, :mod:`.thresholds`) work on the quadratic model
``L(w) = ½·λ·w²`` in the variable ``z = η·λ``: a method is stable for ``0 < z < z*``. On a real network the
curvature that matters is the largest eigenvalue ``λ_max`` of the loss Hessian ``H = ∇²L(w)`` (the
quadratic model along its eigenvector), so the largest stable learning rate it predicts is

    η* = z* / λ_max                                     (:func:`lr_threshold`)

e.g. plain GD is stable iff ``η·λ_max < 2`` (``z* = 2``, :func:`pipelab.stability.gd`), and GD with a
delay of τ steps iff ``η·λ_max < 2·sin(π/(2(2τ+1)))`` (Levin & May 1976).

:func:`top_eigenvalue` estimates ``λ_max`` without forming H: power iteration ``v ← Hv/‖Hv‖`` with the
Rayleigh quotient ``λ ≈ vᵀHv`` (``vᵀv = 1``), where ``Hv`` is a Hessian-vector product by double
backward, ``Hv = ∇_w (∇_w L(w) · v)`` (Pearlmutter 1994), on the full parameter vector of the model (all
stages together). Power iteration converges to the eigenvalue of largest *magnitude*; if that one is
negative (a saddle), a second run on the shifted operator ``H − λ_neg·I`` (eigenvalues ``μ − λ_neg ≥ 0``)
finds the largest algebraic eigenvalue, which is the one that limits the step.

References: B. A. Pearlmutter, "Fast exact multiplication by the Hessian", Neural Computation 6 (1994)
147–160; the power-iteration estimate of the sharpness as in J. Cohen et al., "Gradient descent on neural
networks typically occurs at the edge of stability", ICLR 2021 (GD stable on the quadratic iff η·λ < 2).

Example:
    >>> import torch
    >>> from pipelab.stability import gd, max_stable_step
    >>> X = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    >>> y = torch.zeros(2, 1, dtype=torch.float64)
    >>> model = torch.nn.Linear(2, 1, bias=False).double()
    >>> est = top_eigenvalue(model, lambda out, t: 0.5 * ((out - t) ** 2).mean(), [(X, y)], tol=1e-12)
    >>> round(est.value, 9)                  # XᵀX/n = diag(0.5, 2)
    2.0
    >>> round(lr_threshold(max_stable_step(gd()), est.value), 9)
    1.0
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["HessianEigen", "top_eigenvalue", "hessian_vector_product", "lr_threshold"]


@dataclass(frozen=True)
class HessianEigen:
    """Result of :func:`top_eigenvalue`.

    Attributes:
        value: the estimate of the largest eigenvalue of the Hessian.
        history: the Rayleigh quotient after every iteration (of the shifted run, shifted back, when a
            negative dominant eigenvalue forced one; ``dominant`` holds the first run's last value).
        converged: whether the relative change fell below ``tol`` within ``iters`` iterations.
        dominant: the eigenvalue of largest magnitude found by the first run (``== value`` unless negative).
        n_params: length of the parameter vector.
    """

    value: float
    history: tuple[float, ...]
    converged: bool
    dominant: float
    n_params: int


def _modules(model_or_stages: torch.nn.Module | Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    if isinstance(model_or_stages, torch.nn.ModuleList):  # a container of stages, not a model with a forward
        model_or_stages = list(model_or_stages)
    elif isinstance(model_or_stages, torch.nn.Module):
        return [model_or_stages]
    if isinstance(model_or_stages, (str, bytes)) or not isinstance(model_or_stages, Sequence):
        raise TypeError(f"model_or_stages must be a torch.nn.Module or a sequence of stage modules, "
                        f"got {type(model_or_stages).__name__}")
    mods = list(model_or_stages)
    if not mods or not all(isinstance(m, torch.nn.Module) for m in mods):
        raise TypeError("model_or_stages must be a non-empty sequence of torch.nn.Module stages")
    return mods


def hessian_vector_product(
    stages: Sequence[torch.nn.Module],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    vector: Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    """``H·v`` of ``L(w) = Σ_b n_b·ℓ_b(w) / Σ_b n_b`` by double backward, per parameter tensor.

    ``ℓ_b = loss_fn(stages(x_b), y_b)`` with ``n_b = len(x_b)``: for a ``loss_fn`` that averages over its
    batch, L is the loss over the union of the batches. ``vector`` has one tensor per parameter of the
    stages (those with ``requires_grad``), in ``parameters()`` order.
    """
    params = [p for m in stages for p in m.parameters() if p.requires_grad]
    total = sum(int(x.shape[0]) for x, _ in batches)
    out = [torch.zeros_like(p) for p in params]
    for x, y in batches:
        h = x
        for m in stages:
            h = m(h)
        loss = loss_fn(h, y) * (int(x.shape[0]) / total)
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        pairs = [(g, v) for g, v in zip(grads, vector) if g is not None]
        if not pairs:
            continue
        dot = torch.stack([(g * v).sum() for g, v in pairs]).sum()
        hv = torch.autograd.grad(dot, params, allow_unused=True)
        for acc, part in zip(out, hv):
            if part is not None:
                acc.add_(part)
    return out


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def top_eigenvalue(
    model_or_stages: torch.nn.Module | Sequence[torch.nn.Module],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    iters: int = 100,
    tol: float = 1e-6,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> HessianEigen:
    """Largest eigenvalue of the Hessian of the loss over ``batches``, by power iteration on ``H·v``.

    Iteration: ``v₀ ~ N(0, I)`` (seeded) normalised; ``u = H·v_k``, ``λ_k = v_kᵀu``, ``v_{k+1} = u/‖u‖``; stop
    when ``|λ_k − λ_{k−1}| ≤ tol·|λ_k|`` or after ``iters`` products. If the result is negative (the dominant
    eigenvalue of an indefinite H), the same iteration on ``H − λ·I`` gives ``λ_max − λ`` and so ``λ_max``.

    Args:
        model_or_stages: a module, or the stages of a pipeline (a sequence or ``nn.ModuleList``) applied in order
            (``x → stage_{D−1}(…stage_0(x))``);
            the Hessian is over all their parameters that require grad, as one vector. The modules are
            copied (cast to ``dtype``): the caller's model, its buffers and its mode are untouched.
        loss_fn: ``(output, target) -> scalar`` loss of one batch.
        batches: ``(x, y)`` pairs; the loss is their size-weighted mean ``Σ n_b·ℓ_b / Σ n_b``. Floating inputs
            are cast to ``dtype``.
        iters: Hessian-vector products at most (per run), >= 1.
        tol: relative change of the Rayleigh quotient at which to stop, > 0.
        seed: seed of the start vector.
        dtype: precision (e.g. ``torch.float64``); ``None`` keeps the model's.

    Returns:
        :class:`HessianEigen` with the estimate and the iteration history.

    Raises:
        ValueError: ``iters``/``tol`` out of range, no batches, no trainable parameters, or a non-finite
            Hessian-vector product; TypeError: a model that is not a module or a sequence of them.
    """
    iters = _check_positive_int("iters", iters)
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an int, got {seed!r}")
    stages = copy.deepcopy(_modules(model_or_stages))
    if dtype is not None:
        stages = [m.to(dtype) for m in stages]
    params = [p for m in stages for p in m.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model_or_stages has no parameters that require grad")
    ref = params[0]
    data = [(_like(x, ref), _like(y, ref)) for x, y in batches]
    if not data:
        raise ValueError("batches is empty: the loss needs at least one (x, y) batch")
    n_params = sum(p.numel() for p in params)
    gen = torch.Generator().manual_seed(int(seed))
    start = [torch.randn(p.shape, generator=gen, dtype=torch.float64).to(ref.device, p.dtype) for p in params]

    def hvp(v: list[torch.Tensor], shift: float) -> list[torch.Tensor]:
        out = hessian_vector_product(stages, loss_fn, data, v)
        return [o - shift * u for o, u in zip(out, v)] if shift else out

    dominant, hist, ok = _power(hvp, start, 0.0, iters, tol)
    if dominant >= 0:
        return HessianEigen(dominant, tuple(hist), ok, dominant, n_params)
    top, hist2, ok2 = _power(hvp, start, dominant, iters, tol)
    return HessianEigen(top + dominant, tuple(h + dominant for h in hist2), ok2, dominant, n_params)


def _like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``t`` on ``ref``'s device, and in its dtype when floating."""
    return t.to(ref.device, ref.dtype) if t.is_floating_point() else t.to(ref.device)


def _power(hvp: Callable[[list[torch.Tensor], float], list[torch.Tensor]], start: list[torch.Tensor], shift: float,
           iters: int, tol: float) -> tuple[float, list[float], bool]:
    """Power iteration on ``v ↦ hvp(v, shift)``: (last Rayleigh quotient, history, converged)."""
    v = _normalised(start)
    hist: list[float] = []
    for _ in range(iters):
        u = [t.detach() for t in hvp(v, shift)]
        lam = float(sum((a * b).sum() for a, b in zip(v, u)))
        if not math.isfinite(lam):
            raise ValueError(f"the Hessian-vector product is not finite (Rayleigh quotient {lam}); check the "
                             f"model and loss at these weights")
        hist.append(lam)
        if len(hist) > 1 and abs(hist[-1] - hist[-2]) <= tol * abs(hist[-1]):
            return lam, hist, True
        norm = math.sqrt(float(sum((t * t).sum() for t in u)))
        if norm == 0.0:  # v is in H's null space (H = 0 almost surely for a random start): the eigenvalue is 0
            return lam, hist, True
        v = [t / norm for t in u]
    return hist[-1], hist, False


def _normalised(vs: list[torch.Tensor]) -> list[torch.Tensor]:
    norm = math.sqrt(float(sum((t * t).sum() for t in vs)))
    return [t / norm for t in vs]


def lr_threshold(z_star: float, eigenvalue: float) -> float:
    """The learning rate ``η* = z*/λ`` at which a method with stable interval ``0 < η·λ < z*`` turns unstable.

    ``z_star`` is a threshold in units of ``η·λ`` from this package's stability analysis (e.g.
    ``max_stable_step(delayed_gd(τ))``, or ``heavy_ball_threshold(β)``); ``eigenvalue`` the curvature, typically
    :func:`top_eigenvalue`'s. On the quadratic ``½λw²`` GD is stable iff ``η·λ < 2``, so
    ``lr_threshold(2, λ) = 2/λ``. For an adaptive optimizer λ must be the preconditioned curvature
    (:func:`pipelab.stability.adam_frozen` works in those units).

    Raises:
        ValueError: ``z_star`` not a number >= 0 (``inf`` allowed: no threshold), ``eigenvalue`` not a finite
            number > 0.
    """
    if isinstance(z_star, bool) or not isinstance(z_star, numbers.Real) or math.isnan(z_star) or z_star < 0:
        raise ValueError(f"z_star must be a number >= 0 (inf: stable for every step), got {z_star!r}")
    if (isinstance(eigenvalue, bool) or not isinstance(eigenvalue, numbers.Real) or not math.isfinite(eigenvalue)
            or eigenvalue <= 0):
        raise ValueError(f"eigenvalue must be a finite number > 0 (the top Hessian eigenvalue), got {eigenvalue!r}")
    return float(z_star) / float(eigenvalue)
