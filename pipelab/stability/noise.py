"""Stationary variance of a linearised optimizer driven by gradient noise (the noise floor of a stable step).

Inside the stable region the deterministic part of the error decays; with a noisy gradient ``λ·w + ξ_t``
(ξ i.i.d., zero mean, unit variance) the weight settles to a stationary distribution whose variance is the
method's *noise floor* — the regime in which momentum averages noise, outside the pure stability question.
The noise enters the recurrence of :mod:`.methods` through a filter ``n = (n_0, n_1, …)``:

    Σ_k (a_k + z·b_k)·w_{t+1−k} = −Σ_j n_j·ξ_{t−j}

(heavy-ball, torch form: ``n = (η,)``; smoothed-gradient form: ``n = ((1−β)·η,)``; torch's Nesterov step
``g + β·v`` filters the noise like the gradient: ``n = η·(1+β, −β)``). On the state
``x_t = (w_t, …, w_{t−n+1}, ξ_{t−1}, …, ξ_{t−m+1})`` the recursion is ``x_{t+1} = F·x_t + G·ξ_t`` and the
stationary covariance solves the discrete Lyapunov equation ``P = F·P·Fᵀ + G·Gᵀ``; the variance is ``P[0, 0]``.

Reference: the stationary covariance of a linear system driven by white noise, e.g. K. J. Åström,
"Introduction to Stochastic Control Theory" (1970), ch. 3; for SGD on a quadratic ``Var w = η²σ²/(1 − (1−z)²)``.

Example:
    >>> from pipelab.stability import gd
    >>> round(stationary_variance(gd(), 0.5), 12)        # 1 / (1 − 0.25)
    1.333333333333
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.linalg import solve_discrete_lyapunov

from .methods import LinearMethod, char_poly
from .regions import stable_mask

__all__ = ["stationary_variance"]


def stationary_variance(method: LinearMethod, z: float, noise: Sequence[float] = (1.0,)) -> float:
    """Stationary ``Var w`` of the method at real step z, driven by unit white gradient noise through ``noise``.

    Args:
        method: the linearised optimizer.
        z: ``η·λ``, a real number.
        noise: the filter ``(n_0, n_1, …)`` through which ``ξ_t, ξ_{t−1}, …`` enter ``w_{t+1}`` (at least one
            finite coefficient).

    Returns:
        the variance (``inf`` when the method is not stable at z).

    Example:
        >>> from pipelab.stability import heavy_ball
        >>> v = stationary_variance(heavy_ball(0.5, 0, form="paper"), 0.1, noise=(0.5,))
        >>> round(v / stationary_variance(heavy_ball(0.0), 0.1), 4)      # momentum lowers the floor slightly
        0.9661
    """
    if isinstance(z, (bool, complex)) or not isinstance(z, (int, float, np.integer, np.floating)) \
            or not math.isfinite(z):
        raise ValueError(f"z must be a finite real number, got {z!r}")
    nz = np.asarray(noise, dtype=float).ravel()
    if nz.size == 0 or not np.all(np.isfinite(nz)):
        raise ValueError(f"noise must hold at least one finite coefficient, got {noise!r}")
    if not bool(stable_mask(method, float(z))):
        return math.inf
    p = char_poly(method, float(z)).real
    n, m = method.order, nz.size
    size = n + m - 1
    F = np.zeros((size, size))
    F[0, :n] = -p[1:]
    F[0, n:] = -nz[1:]
    for i in range(1, n):
        F[i, i - 1] = 1.0
    for i in range(1, m - 1):
        F[n + i, n + i - 1] = 1.0
    G = np.zeros((size, 1))
    G[0, 0] = -nz[0]
    if m > 1:
        G[n, 0] = 1.0
    P = solve_discrete_lyapunov(F, G @ G.T)
    return float(P[0, 0])
