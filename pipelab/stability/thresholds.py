"""Largest stable real step ``z* = η·λ_max`` by root-finding on the boundary locus, and closed forms.

    z* = min { Re z(θ) > 0 : Im z(θ) = 0, θ ∈ (0, π] },      z(θ) = −A(e^{iθ})/B(e^{iθ}),

bracketed on a θ grid and refined by Brent's method (θ = π always a candidate), then checked by Schur–Cohn.

References: delayed GD, ``z* = 2·sin(π/(2(2τ+1)))``: S. A. Levin and R. M. May, "A note on difference-delay
equations", Theoretical Population Biology 9 (1976) 178–187; S. A. Kuruklis, "The asymptotic stability of
x_{n+1} − a·x_n + b·x_{n−k} = 0", J. Math. Anal. Appl. 188 (1994) 719–731 (a = 1). Heavy-ball and Nesterov
without delay: Jury's conditions ``P(1) > 0``, ``P(−1) > 0``, ``|P(0)| < 1``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq

from .methods import LinearMethod, _check_beta
from .regions import stable_mask

__all__ = ["max_stable_step", "delayed_gd_threshold", "heavy_ball_threshold", "nesterov_threshold",
           "boundary_crossings"]


def delayed_gd_threshold(tau: int) -> float:
    """Closed form ``2·sin(π/(2(2τ+1)))`` of the largest stable real z of GD with delay τ (Levin–May 1976)."""
    if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)) or tau < 0:
        raise ValueError(f"tau must be a non-negative integer, got {tau!r}")
    return 2.0 * math.sin(math.pi / (2.0 * (2 * tau + 1)))


def heavy_ball_threshold(beta: float) -> float:
    """``2(1+β)``: largest stable real z of heavy-ball (torch form, no delay); β in [0, 1)."""
    beta = _check_beta(beta)
    return 2.0 * (1.0 + beta)


def nesterov_threshold(beta: float) -> float:
    """``2(1+β)/(1+2β)``: largest stable real z of Nesterov momentum (torch form, no delay); β in [0, 1)."""
    beta = _check_beta(beta)
    return 2.0 * (1.0 + beta) / (1.0 + 2.0 * beta)


def _locus(method: LinearMethod, theta: np.ndarray) -> np.ndarray:
    r = np.exp(1j * np.asarray(theta, dtype=float))
    A = np.polyval(np.asarray(method.a), r)
    B = np.polyval(np.asarray(method.b), r)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -A / B


def boundary_crossings(method: LinearMethod, *, n_theta: int = 4096) -> list[tuple[float, float]]:
    """All ``(θ, z)`` with real ``z = z(θ)``, ``θ ∈ (0, π]``, sorted by z: where the real axis meets the locus."""
    theta = np.linspace(0.0, np.pi, n_theta + 1)[1:]
    im = _locus(method, theta).imag
    out: list[tuple[float, float]] = []

    def f(t: float) -> float:
        return float(_locus(method, np.array([t]))[0].imag)

    finite = np.isfinite(im)
    for i in range(len(theta) - 1):
        if not (finite[i] and finite[i + 1]):
            continue
        if im[i] == 0.0:
            out.append((float(theta[i]), float(_locus(method, theta[i:i + 1])[0].real)))
        elif im[i] * im[i + 1] < 0:
            # A sign change can also be a pole of z(θ) (B = 0); keep only genuine zeros.
            t = brentq(f, theta[i], theta[i + 1], xtol=1e-15, rtol=1e-15, maxiter=200)
            zt = _locus(method, np.array([t]))[0]
            if abs(zt.imag) <= 1e-9 * max(1.0, abs(zt.real)):
                out.append((float(t), float(zt.real)))
    zpi = _locus(method, np.array([np.pi]))[0]
    if np.isfinite(zpi):
        out.append((float(np.pi), float(zpi.real)))
    return sorted(out, key=lambda p: p[1])


def max_stable_step(method: LinearMethod, *, n_theta: int = 4096, check: bool = True) -> float:
    """Largest z* such that the method is stable for every real ``z ∈ (0, z*)``.

    0.0 when unstable for every small z > 0, ``inf`` without a crossing. ``check`` confirms with Schur–Cohn that
    ``z*(1 ∓ 1e−6)`` is stable / unstable (``RuntimeError`` otherwise).
    """
    if isinstance(n_theta, bool) or not isinstance(n_theta, (int, np.integer)) or n_theta < 2:
        raise ValueError(f"n_theta must be an integer >= 2, got {n_theta!r}")
    small = 1e-7
    if not bool(stable_mask(method, small)):
        return 0.0
    candidates = [z for _, z in boundary_crossings(method, n_theta=n_theta) if z > small]
    if not candidates:
        return math.inf
    zstar = min(candidates)
    if check:
        below, above = stable_mask(method, np.array([zstar * (1 - 1e-6), zstar * (1 + 1e-6)]))
        if not below or above:
            raise RuntimeError(f"{method.name}: boundary root z*={zstar!r} does not separate stable from unstable "
                               f"(stable below: {bool(below)}, stable above: {bool(above)}); "
                               f"try a larger n_theta")
    return float(zstar)
