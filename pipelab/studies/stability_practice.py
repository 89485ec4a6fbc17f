"""The stability study in practice: the largest stable learning rate of a real optimizer under delay, by bisection.

A least-squares problem ``f(w) = ½‖Xw − y‖²`` with a prescribed Hessian spectrum ``XᵀX = V·diag(λ)·Vᵀ``
is trained with a ``torch.optim`` optimizer whose gradient is *delayed*: the gradient applied at step t
is computed at the weights of τ updates earlier, kept in a ring buffer of past weights (and, for
prediction, past momentum buffers). On every eigen-direction this is exactly a linear recurrence of
:mod:`pipelab.stability.methods`, so the largest stable learning rate is ``η* = z*/λ_max`` with ``z*`` from
:func:`pipelab.stability.max_stable_step` — the theory is checked against the real optimizer.

Two trainers produce the delayed gradient: :func:`delayed_training`, a small explicit loop, and
:func:`pipeline_training`, which runs the same problem through the pipeline emulator with asynchronous
1F1B (PipeDream) so that the delay comes from the schedule's version table; both give the same
trajectory (tested), and :func:`max_stable_lr` bisects either (``trainer=``).

Example:
    >>> prob = least_squares_problem(dim=8, lam_max=1.0, lam_min=0.1, seed=0)
    >>> run = delayed_training(prob, lr=0.5, tau=1, steps=300)
    >>> run.diverged
    False
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..optim import optimizer_factory

__all__ = ["LeastSquares", "least_squares_problem", "DelayedRun", "delayed_training", "pipeline_training",
           "max_stable_lr"]


@dataclass(frozen=True)
class LeastSquares:
    """``f(w) = ½‖Xw − y‖²`` with known Hessian eigenvalues ``lams`` (so ``XᵀX = V·diag(lams)·Vᵀ``).

    Attributes:
        X: design matrix ``(m, d)``; y: targets ``(m,)``; w_star: the minimiser; w0: the start;
        lams: the Hessian eigenvalues (descending).
    """

    X: torch.Tensor
    y: torch.Tensor
    w_star: torch.Tensor
    w0: torch.Tensor
    lams: np.ndarray

    @property
    def lam_max(self) -> float:
        return float(self.lams.max())

    def grad(self, w: torch.Tensor) -> torch.Tensor:
        """``Xᵀ(Xw − y)``."""
        return self.X.T @ (self.X @ w - self.y)


def least_squares_problem(dim: int = 20, *, lam_max: float = 1.0, lam_min: float = 0.01, rows: int | None = None,
                          seed: int = 0, dtype: torch.dtype = torch.float64,
                          device: str | torch.device = "cpu") -> LeastSquares:
    """A least-squares problem whose Hessian has eigenvalues log-spaced in ``[lam_min, lam_max]``.

    ``X = U·diag(√λ)·Vᵀ`` with random orthonormal U (m×d) and V (d×d); ``y = X·w_true`` plus noise, so
    the minimiser ``w*`` is the least-squares solution.

    Args:
        dim: number of weights d (≥ 1).
        lam_max, lam_min: the extreme eigenvalues (``0 < lam_min ≤ lam_max``).
        rows: m ≥ d (default 2d).
        seed: seed of U, V, w_true, the noise and the start w0.
        dtype, device: of the tensors.
    """
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not 0 < lam_min <= lam_max:
        raise ValueError(f"need 0 < lam_min <= lam_max, got lam_min={lam_min}, lam_max={lam_max}")
    m = rows if rows is not None else 2 * dim
    if m < dim:
        raise ValueError(f"rows must be >= dim, got rows={m}, dim={dim}")
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, dim, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    lams = np.geomspace(lam_max, lam_min, dim) if dim > 1 else np.array([lam_max])
    X = U @ torch.diag(torch.from_numpy(np.sqrt(lams))) @ V.T
    w_true = torch.randn(dim, generator=g, dtype=torch.float64)
    y = X @ w_true + 0.1 * torch.randn(m, generator=g, dtype=torch.float64)
    w_star = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1)
    w0 = w_star + torch.randn(dim, generator=g, dtype=torch.float64)
    to = dict(dtype=dtype, device=device)
    return LeastSquares(X.to(**to), y.to(**to), w_star.to(**to), w0.to(**to), lams)


@dataclass
class DelayedRun:
    """Result of :func:`delayed_training`.

    Attributes:
        dist: ``‖w_t − w*‖`` for t = 0..T (shorter when stopped early on blow-up).
        diverged: True when the distance grew (asymptotic rate > 1, estimated over the last half) or blew up.
        rate: estimated per-step growth factor of the distance over the second half of the run.
    """

    dist: np.ndarray
    diverged: bool
    rate: float


def _sgd(name: str, lr: float, momentum: float, nesterov: bool) -> Callable[[Any], torch.optim.Optimizer]:
    """The registry's ``"sgd"`` with these hyper-parameters (the delayed recurrences here are SGD's only)."""
    if name != "sgd":
        raise ValueError(f"optimizer must be 'sgd', got {name!r}")
    return optimizer_factory("sgd", lr=lr, momentum=momentum, nesterov=nesterov)


def _check_training(problem: LeastSquares, lr: float, tau: int, steps: int, momentum: float, nesterov: bool,
                    blowup: float) -> None:
    """Refuse arguments of the trainers that torch or the emulator would turn into raw errors or garbage."""
    if not isinstance(problem, LeastSquares):
        raise TypeError(f"problem must be a LeastSquares (see least_squares_problem), got {type(problem).__name__}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float, np.integer, np.floating)):
        raise TypeError(f"lr must be a real number > 0, got {lr!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite real number > 0, got {lr}")
    if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)) or tau < 0:
        raise ValueError(f"tau must be a non-negative integer, got {tau!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 4:
        raise ValueError(f"steps must be an integer >= 4, got {steps!r}")
    if not (isinstance(momentum, (int, float, np.integer, np.floating)) and math.isfinite(momentum)
            and momentum >= 0):
        raise ValueError(f"momentum must be a finite real number >= 0, got {momentum!r}")
    if nesterov and momentum == 0:
        raise ValueError("nesterov=True needs momentum > 0 (torch.optim.SGD's Nesterov momentum)")
    if not (isinstance(blowup, (int, float, np.integer, np.floating)) and math.isfinite(blowup) and blowup > 1):
        raise ValueError(f"blowup must be a finite real number > 1, got {blowup!r}")


def delayed_training(problem: LeastSquares, lr: float, tau: int, *, steps: int = 2000, momentum: float = 0.0,
                     nesterov: bool = False, predict_s: float | None = None, optimizer: str = "sgd",
                     blowup: float = 1e8) -> DelayedRun:
    """Train ``problem`` with ``torch.optim.SGD`` on gradients delayed by τ steps.

    Rule: ``g_t = ∇f(ŵ_t)`` with ``ŵ_t = w_{t−τ}`` (weights before the first step for ``t < τ``), or,
    with prediction (SpecTrain/PipeOptim as their code computes it), ``ŵ_t = w_{t−τ} − s·η·v_{t−τ−1}``
    where ``v_{t−τ−1}`` is the optimizer's momentum buffer that produced ``w_{t−τ}`` (zero for plain
    SGD: then ``v`` is the last gradient, read from the weight difference). The ring buffer holds the
    last τ+1 (weights, buffer) snapshots; ``optimizer.step()`` applies ``g_t`` to the current weights.

    Args:
        problem: the least-squares problem.
        lr: learning rate η.
        tau: delay τ ≥ 0.
        steps: optimizer steps T.
        momentum, nesterov: passed to ``torch.optim.SGD``.
        predict_s: prediction horizon s (``None``: no prediction).
        optimizer: only ``"sgd"`` for now.
        blowup: stop early once the distance exceeds ``blowup`` times its start.

    Returns:
        a :class:`DelayedRun`.
    """
    _check_training(problem, lr, tau, steps, momentum, nesterov, blowup)
    if nesterov and predict_s is not None:
        raise ValueError("predict_s is implemented for heavy-ball momentum (nesterov=False) only")
    if predict_s is not None and not (isinstance(predict_s, (int, float, np.integer, np.floating))
                                      and math.isfinite(predict_s)):
        raise ValueError(f"predict_s must be a finite real number or None, got {predict_s!r}")
    w = problem.w0.clone().requires_grad_(True)
    opt = _sgd(optimizer, lr, momentum, nesterov)([w])
    zero = torch.zeros_like(w)
    # ring[0] is (w_{t−τ}, v_{t−τ−1}); the last-update velocity is w_{t−τ−1} − w_{t−τ} = η·v for SGD.
    ring: deque[tuple[torch.Tensor, torch.Tensor]] = deque([(w.detach().clone(), zero)] * (tau + 1), maxlen=tau + 1)
    prev_w = deque([w.detach().clone()] * (tau + 2), maxlen=tau + 2)  # w_{t−τ−1} .. w_t
    dist = [float(torch.linalg.vector_norm(problem.w0 - problem.w_star))]
    limit = blowup * dist[0]
    for _ in range(steps):
        stale_w, stale_v = ring[0]
        if predict_s is not None and predict_s != 0:
            if momentum > 0:
                point = stale_w - predict_s * lr * stale_v
            else:  # plain SGD: repeat the last update s times
                point = stale_w + predict_s * (stale_w - prev_w[0])
        else:
            point = stale_w
        with torch.no_grad():
            w.grad = problem.grad(point)
        opt.step()
        buf = opt.state[w].get("momentum_buffer") if momentum > 0 else None
        snap = w.detach().clone()
        ring.append((snap, buf.clone() if buf is not None else zero))
        prev_w.append(snap)
        d = float(torch.linalg.vector_norm(snap - problem.w_star))
        dist.append(d)
        if not math.isfinite(d) or d > limit:
            return DelayedRun(np.asarray(dist), True, math.inf)
    return _verdict(dist, steps)


def _verdict(dist: list[float], steps: int) -> DelayedRun:
    """Diverged iff the distance's growth factor between the maxima of two windows (each spanning
    oscillation periods) in the second half of the run exceeds 1."""
    arr = np.asarray(dist)
    win = max(steps // 10, 1)
    late, mid = arr[-win:].max(), arr[steps // 2 - win // 2: steps // 2 + win // 2 + 1].max()
    span = (steps - win // 2) - steps // 2
    rate = float(np.exp((np.log(late) - np.log(mid)) / max(span, 1))) if mid > 0 and late > 0 else 0.0
    return DelayedRun(arr, bool(rate > 1.0), rate)


class _Delay(torch.nn.Module):
    """A pipeline stage that passes its input through: ``x + 0·p`` (one parameter, always zero gradient)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros((), dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.0 * self.p


def pipeline_training(problem: LeastSquares, lr: float, tau: int, *, steps: int = 2000, momentum: float = 0.0,
                      nesterov: bool = False, policy: str = "stashing", blowup: float = 1e8) -> DelayedRun:
    """Train ``problem`` through the pipeline emulator: asynchronous 1F1B (PipeDream) with D = τ+1 stages.

    Stage 0 is the linear model ``x ↦ xᵀw`` (all the weights), stages 1..τ pass activations through, and
    the last stage's loss is ``½(xᵀw − y)²`` summed over the full batch. The version table gives stage 0 a
    forward staleness of D−1 = τ in steady state, and weight stashing (or vanilla: stage 0's weight
    gradient does not depend on its own weights) computes ``g_t = ∇f(w_{t−τ})`` — the recurrence of
    :func:`delayed_training`, produced by the schedule instead of a ring buffer written for it.

    Args and returns as for :func:`delayed_training` (``policy``: an emulator policy name). Arguments are
    checked as there: ``lr`` finite and > 0, τ a non-negative integer, ``steps`` ≥ 4, ``momentum`` ≥ 0
    (and > 0 with ``nesterov``), ``blowup`` > 1.
    """
    from ..emulator import Emulator
    from ..schedules import pipedream

    _check_training(problem, lr, tau, steps, momentum, nesterov, blowup)
    dtype = problem.X.dtype
    first = torch.nn.Linear(problem.X.shape[1], 1, bias=False).to(dtype=dtype, device=problem.X.device)
    with torch.no_grad():
        first.weight.copy_(problem.w0.unsqueeze(0))
    stages = [first] + [_Delay(dtype).to(problem.X.device) for _ in range(tau)]
    emu = Emulator(stages, schedule=pipedream(tau + 1, 1, steps), policy=policy,
                   optimizer=_sgd("sgd", lr, momentum, nesterov),
                   loss_fn=lambda out, y: 0.5 * ((out.squeeze(1) - y) ** 2).sum())
    dist = [float(torch.linalg.vector_norm(problem.w0 - problem.w_star))]
    limit = blowup * dist[0]

    class _Stop(Exception):
        pass

    def record(v: int, weights: list[tuple[torch.Tensor, ...]]) -> None:
        if v == 0:
            return
        d = float(torch.linalg.vector_norm(weights[0][0].detach().squeeze(0) - problem.w_star))
        dist.append(d)
        if not math.isfinite(d) or d > limit:
            raise _Stop

    try:
        emu.run(lambda t: (problem.X, problem.y), snapshot_every=1, on_snapshot=record)
    except _Stop:
        return DelayedRun(np.asarray(dist), True, math.inf)
    return _verdict(dist, steps)


def max_stable_lr(problem: LeastSquares, tau: int, *, lo: float = 0.0, hi: float | None = None, rel_tol: float = 1e-3,
                  steps: int = 2000, max_iter: int = 40, trainer: Callable[..., DelayedRun] | None = None,
                  **kwargs: Any) -> float:
    """Largest stable learning rate of :func:`delayed_training`, by bisection on ``diverged``.

    Args:
        problem: the least-squares problem.
        tau: delay τ.
        lo: a learning rate known to be stable (0 by default; a positive lo is checked, ``ValueError`` if it
            diverges).
        hi: one known to diverge (checked: ``ValueError`` if it does not); default ``4/λ_max·(1 + momentum)``,
            doubled until it diverges.
        rel_tol: stop when ``hi − lo < rel_tol·hi``.
        steps: training steps per trial (longer resolves the threshold more finely: the growth per step
            near it is ~ ``(η − η*)·const``).
        trainer: :func:`delayed_training` (default) or :func:`pipeline_training` (through the emulator).
        kwargs: passed to the trainer (``momentum``, ``nesterov``, ``predict_s``, ``policy``).

    Returns:
        the midpoint of the final bracket.
    """
    train = trainer or delayed_training
    if not callable(train):
        raise TypeError(f"trainer must be callable (delayed_training or pipeline_training), got {trainer!r}")
    for name, val in (("lo", lo), ("hi", hi)):
        if val is not None and not (isinstance(val, (int, float, np.integer, np.floating)) and math.isfinite(val)
                                    and val >= 0):
            raise ValueError(f"{name} must be a finite learning rate >= 0, got {val!r}")
    if not (isinstance(rel_tol, (int, float)) and 0 < rel_tol < 1):
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    if hi is not None and hi <= lo:
        raise ValueError(f"need lo < hi for the bracket, got lo={lo}, hi={hi}")
    if lo > 0 and train(problem, lo, tau, steps=steps, **kwargs).diverged:
        raise ValueError(f"lo={lo} diverges (tau={tau}, {steps} steps): the bracket must start at a stable "
                         f"learning rate; pass a smaller lo (0 is always accepted)")
    if hi is None:
        hi = 4.0 * (1.0 + kwargs.get("momentum", 0.0)) / problem.lam_max
        for _ in range(20):
            if train(problem, hi, tau, steps=steps, **kwargs).diverged:
                break
            hi *= 2.0
        else:
            raise RuntimeError("no diverging learning rate found")
    elif not train(problem, hi, tau, steps=steps, **kwargs).diverged:
        raise ValueError(f"hi={hi} does not diverge (tau={tau}, {steps} steps), so [lo, hi] does not bracket the "
                         f"largest stable learning rate; pass a larger hi, or hi=None to search for one")
    for _ in range(max_iter):
        if hi - lo < rel_tol * hi:
            break
        mid = 0.5 * (lo + hi)
        if train(problem, mid, tau, steps=steps, **kwargs).diverged:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)
