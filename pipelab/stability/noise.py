"""Stationary variance of a linearised optimizer driven by gradient noise (the noise floor of a stable step).

With gradient ``λ·w + ξ_t`` (ξ white, unit variance) entering through a filter n,
``Σ_k (a_k + z·b_k)·w_{t+1−k} = −Σ_j n_j·ξ_{t−j}`` (heavy-ball: ``n = (η,)``; smoothed form: ``((1−β)·η,)``;
torch's Nesterov: ``η·(1+β, −β)``). On the state ``x_t = (w_t, …, w_{t−n+1}, ξ_{t−1}, …)``,
``x_{t+1} = F·x_t + G·ξ_t``, and ``Var w = P[0, 0]`` with ``P = F·P·Fᵀ + G·Gᵀ`` (discrete Lyapunov).

Reference: K. J. Åström, "Introduction to Stochastic Control Theory" (1970), ch. 3; for SGD on a quadratic
``Var w = η²σ²/(1 − (1−z)²)``.
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
    """Stationary ``Var w`` at real step z under unit white noise through the filter ``noise``; ``inf`` if unstable."""
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
