"""Linearised optimizers with stale gradients as linear recurrences in the weight.

On the scalar quadratic ``L(w) = ½·λ·w²`` with ``z = η·λ`` (complex z stands for a non-symmetric Jacobian),
each method is ``Σ_{k=0..n} (a_k + z·b_k)·w_{t+1−k} = 0`` with ``a_0 = 1``, ``b_0 = 0``; its characteristic
polynomial is ``P(r; z) = A(r) + z·B(r)`` and it converges iff every root of P lies strictly inside the unit
disk. Most methods are the general form

    w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·Σ_j c_j·w_{t−τ−j},

τ the gradient delay, β the momentum, g the gradient scale (1 for torch's ``v ← μ·v + g``, ``1−β`` for the
papers' ``v ← γ·v + (1−γ)·g``), c the combination of past weights the gradient is taken at.

References:
    SpecTrain: Chen et al., "Efficient and Robust Parallel DNN Training through Model Parallelism on
    Multi-GPU Platform", arXiv:1809.02839, eqs. (1)–(4). PipeOptim: Guan et al., arXiv:2312.00839,
    eq. (5) and Table I. PipeMare: Yang et al., "PipeMare: Asynchronous Pipeline Parallel DNN Training",
    MLSys 2021, §3 (discrepancy correction). "Idle Speculations on Pipeline Parallelism" (2024) for the
    complex-plane stability picture of stale gradient descent. Nesterov look-ahead for asynchronous pipelines:
    Ajanthan et al., arXiv:2505.01099 (ICML 2025). Delay compensation: Zheng et al., "Asynchronous Stochastic
    Gradient Descent with Delay Compensation", ICML 2017. Error feedback for a one-step delay: Zmushko et al.,
    arXiv:2606.30634 (ICML 2026); Stich & Karimireddy, "The Error-Feedback Framework", arXiv:1909.05350.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "LinearMethod", "general", "gd", "delayed_gd", "heavy_ball", "nesterov", "predicted_momentum",
    "pipemare", "adam_frozen", "nesterov_async", "delay_compensated", "error_feedback", "char_poly", "companion",
    "MomentumForm",
]

MomentumForm = Literal["code", "paper"]
_FORMS = ("code", "paper")


@dataclass(frozen=True)
class LinearMethod:
    """A linearised optimizer: ``Σ_k (a_k + z·b_k)·w_{t+1−k} = 0`` with ``a_0 = 1``, ``b_0 = 0`` (explicit).

    ``params``: the builder's parameters as ``(name, value)`` pairs, for records and legends.
    """

    name: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    params: tuple[tuple[str, float | int | str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.a) == 0 or self.a[0] != 1.0:
            raise ValueError(f"a must start with 1 (monic recurrence), got a={self.a}")
        if len(self.b) == 0 or self.b[0] != 0.0:
            raise ValueError(f"b must start with 0 (explicit method: no gradient at w_(t+1)), got b={self.b}")
        if not (np.all(np.isfinite(np.asarray(self.a, dtype=float)))
                and np.all(np.isfinite(np.asarray(self.b, dtype=float)))):
            raise ValueError(f"a and b must be finite real coefficients, got a={self.a}, b={self.b}")
        n = max(len(self.a), len(self.b))
        a = tuple(float(x) for x in self.a) + (0.0,) * (n - len(self.a))
        b = tuple(float(x) for x in self.b) + (0.0,) * (n - len(self.b))
        # Trailing lags that are zero in both parts only add roots at r = 0: drop them.
        while n > 2 and a[-1] == 0.0 and b[-1] == 0.0:
            a, b, n = a[:-1], b[:-1], n - 1
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)

    @property
    def order(self) -> int:
        """Degree n of the characteristic polynomial (= size of the companion matrix)."""
        return len(self.a) - 1

    def param(self, key: str) -> float | int | str:
        return dict(self.params)[key]


def _check_beta(beta: float, name: str = "beta") -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number in [0, 1), got {beta!r}")
    beta = float(beta)
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {beta}")
    return beta


def _check_tau(tau: int, name: str = "tau") -> int:
    if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)) or tau < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {tau!r}")
    return int(tau)


def _gradient_scale(beta: float, form: str) -> float:
    if form not in _FORMS:
        raise ValueError(f"form must be one of {_FORMS}, got {form!r}")
    return 1.0 if form == "code" else 1.0 - beta


def general(beta: float, c: Sequence[float], tau: int = 0, *, scale: float = 1.0, name: str = "general",
            params: tuple[tuple[str, float | int | str], ...] = ()) -> LinearMethod:
    """The general form ``w_{t+1} = (1+β)w_t − βw_{t−1} − scale·z·Σ_j c_j·w_{t−τ−j}``."""
    beta = _check_beta(beta)
    tau = _check_tau(tau)
    c = tuple(float(x) for x in c)
    if not c:
        raise ValueError("c must hold at least one coefficient")
    if not all(np.isfinite(c)):
        raise ValueError(f"c must hold finite coefficients, got {c}")
    if not np.isfinite(scale):
        raise ValueError(f"scale must be a finite real number, got {scale}")
    a = (1.0, -(1.0 + beta), beta)
    b = (0.0,) * (tau + 1) + tuple(scale * x for x in c)
    return LinearMethod(name, a, b, params or (("beta", beta), ("tau", tau)))


def gd() -> LinearMethod:
    """Gradient descent ``w_{t+1} = w_t − z·w_t``, stable iff ``|1 − z| < 1``."""
    return LinearMethod("GD", (1.0, -1.0), (0.0, 1.0), (("beta", 0.0), ("tau", 0)))


def delayed_gd(tau: int) -> LinearMethod:
    """Gradient descent with gradient delay τ: ``w_{t+1} = w_t − z·w_{t−τ}``.

    ``P(r) = r^(τ+1) − r^τ + z``; for real z stable iff ``0 < z < 2·sin(π/(2(2τ+1)))``
    (:func:`pipelab.stability.delayed_gd_threshold`).
    """
    tau = _check_tau(tau)
    return general(0.0, (1.0,), tau, name=f"GD τ={tau}")


def heavy_ball(beta: float, tau: int = 0, *, form: MomentumForm = "code") -> LinearMethod:
    """Heavy-ball (Polyak) momentum with gradient delay τ: ``w_{t+1} = (1+β)·w_t − β·w_{t−1} − z·w_{t−τ}``.

    ``form="code"`` is ``torch.optim.SGD`` (``v_t = β·v_{t−1} + λ·w_{t−τ}``, ``w_{t+1} = w_t − η·v_t``);
    ``form="paper"`` (SpecTrain eq. 1, smoothed gradient) replaces z by ``(1−β)·z``. τ = 0, code form: stable for
    real z iff ``0 < z < 2(1+β)``.
    """
    beta = _check_beta(beta)
    tau = _check_tau(tau)
    return general(beta, (1.0,), tau, scale=_gradient_scale(beta, form), name=f"HB β={beta:g} τ={tau}",
                   params=(("beta", beta), ("tau", tau), ("form", form)))


def nesterov(beta: float, tau: int = 0, *, form: MomentumForm = "code") -> LinearMethod:
    """Nesterov momentum (torch's ``nesterov=True``) with gradient delay τ, ``g_t = λ·w_{t−τ}``:

        w_{t+1} = (1+β)·w_t − β·w_{t−1} − z·((1+β)·w_{t−τ} − β·w_{t−τ−1}),

    ``form="paper"`` scales z by ``1−β``. τ = 0: stable for real z iff ``0 < z < 2(1+β)/(1+2β)``.
    """
    beta = _check_beta(beta)
    tau = _check_tau(tau)
    return general(beta, (1.0 + beta, -beta), tau, scale=_gradient_scale(beta, form),
                   name=f"Nesterov β={beta:g} τ={tau}", params=(("beta", beta), ("tau", tau), ("form", form)))


def predicted_momentum(beta: float, tau: int, s: float | None = None, *, form: MomentumForm = "code",
                       velocity_scale: float = 1.0) -> LinearMethod:
    """Delayed momentum SGD whose stale weights are extrapolated (SpecTrain / PipeOptim prediction).

    The gradient is taken at ``ŵ = w_{t−τ} − s·κ·η·v_{t−τ−1}`` (SpecTrain eq. 4, PipeOptim eq. 5), i.e.

        w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·((1+κs)·w_{t−τ} − κs·w_{t−τ−1}),

    g = 1 (``form="code"``, torch's buffer) or ``1−β`` (``"paper"``, SpecTrain's smoothed gradient); the paper's
    gradient predicting for torch's optimizer is ``form="code", velocity_scale=κ=1−β``. ``s`` defaults to τ.
    """
    beta = _check_beta(beta)
    tau = _check_tau(tau)
    s = float(tau if s is None else s)
    if not (np.isfinite(s) and s >= 0):
        raise ValueError(f"s must be a finite real number >= 0, got {s}")
    if not np.isfinite(velocity_scale):
        raise ValueError(f"velocity_scale must be a finite real number, got {velocity_scale}")
    k = float(velocity_scale) * s
    return general(beta, (1.0 + k, -k), tau, scale=_gradient_scale(beta, form),
                   name=f"predicted β={beta:g} τ={tau} s={s:g}",
                   params=(("beta", beta), ("tau", tau), ("s", s), ("form", form),
                           ("velocity_scale", float(velocity_scale))))


def pipemare(tau_fwd: int, tau_bkwd: int, *, rho: float = 0.5, gamma: float = 0.5, beta: float = 0.0,
             correction: bool = True, form: MomentumForm = "code") -> LinearMethod:
    """PipeMare's forward/backward weight discrepancy, with or without its discrepancy correction.

    Forward at ``w_{t−τf}``, backward at ``u_b`` (τb ≤ τf), gradient ``g_t = λ·((1−ρ)·w_{t−τf} + ρ·u_b)`` (PipeMare's
    ``∇f ≈ λ·u_fwd + Δ·(u_bkwd − u_fwd)``, ``Δ = ρ·λ``). Uncorrected ``u_b = w_{t−τb}``; corrected

        δ_t = γ·δ_{t−1} + (1−γ)·(w_t − w_{t−1}),      u_b = w_{t−τb} − (τf − τb)·δ_{t−τb},

    δ eliminated by convolving both lag polynomials with ``(1, −γ)`` (an extra root γ at z = 0).
    """
    tau_fwd, tau_bkwd = _check_tau(tau_fwd, "tau_fwd"), _check_tau(tau_bkwd, "tau_bkwd")
    if tau_bkwd > tau_fwd:
        raise ValueError(f"tau_bkwd must be <= tau_fwd, got tau_bkwd={tau_bkwd}, tau_fwd={tau_fwd}")
    if not np.isfinite(rho):
        raise ValueError(f"rho must be a finite real number, got {rho}")
    gamma = _check_beta(gamma, "gamma")
    beta = _check_beta(beta)
    g = _gradient_scale(beta, form)
    n = tau_fwd + 3
    a = np.zeros(n)
    a[:3] = (1.0, -(1.0 + beta), beta)
    b = np.zeros(n)
    b[tau_fwd + 1] += g * (1.0 - rho)
    b[tau_bkwd + 1] += g * rho
    params = (("tau_fwd", tau_fwd), ("tau_bkwd", tau_bkwd), ("rho", float(rho)), ("gamma", gamma),
              ("beta", beta), ("correction", int(correction)), ("form", form))
    label = f"PipeMare τf={tau_fwd} τb={tau_bkwd}" + (" corrected" if correction else "")
    if not correction:
        return LinearMethod(label, tuple(a), tuple(b), params)
    ema = np.array([1.0, -gamma])
    a2 = np.convolve(a, ema)
    b2 = np.convolve(b, ema)
    k = g * rho * (tau_fwd - tau_bkwd) * (1.0 - gamma)
    b2[tau_bkwd + 1] -= k
    b2[tau_bkwd + 2] += k
    return LinearMethod(label, tuple(a2), tuple(b2), params)


def adam_frozen(beta1: float = 0.9, tau: int = 0) -> LinearMethod:
    """Adam with a frozen second moment ``v̂`` and gradient delay τ (bias corrections → 1).

    With ``z = η·λ/(√v̂ + ε)`` it is :func:`heavy_ball` in ``"paper"`` form:
    ``w_{t+1} = (1+β1)·w_t − β1·w_{t−1} − (1−β1)·z·w_{t−τ}``.
    """
    beta1 = _check_beta(beta1, "beta1")
    tau = _check_tau(tau)
    return general(beta1, (1.0,), tau, scale=1.0 - beta1, name=f"Adam (frozen) β1={beta1:g} τ={tau}",
                   params=(("beta1", beta1), ("tau", tau)))


def nesterov_async(beta1: float = 0.99, tau: int = 1, *, mu: float | None = None) -> LinearMethod:
    """Nesterov look-ahead for asynchronous pipelines (Ajanthan et al., arXiv:2505.01099), as NAdam computes it.

    The public code's rule (``torch.optim.NAdam``, β1 = 0.99), second moment frozen, bias corrections at 1:
    ``m_t = β1·m_{t−1} + (1−β1)·g_t``, ``w_{t+1} = w_t − η·(μ·m_t + (1−μ)·g_t)``, i.e.

        w_{t+1} = (1+β1)·w_t − β1·w_{t−1} − z·((1 − μβ1)·w_{t−τ} − (1−μ)·β1·w_{t−τ−1}).

    μ (default β1, the limit of NAdam's schedule) = β1 gives :func:`nesterov` in ``"paper"`` form. The paper's
    text was not available, so the code's rule is pinned here.
    """
    beta1 = _check_beta(beta1, "beta1")
    tau = _check_tau(tau)
    mu_ = beta1 if mu is None else _check_beta(mu, "mu")
    return general(beta1, (1.0 - mu_ * beta1, -(1.0 - mu_) * beta1), tau, name=f"NAdam β1={beta1:g} τ={tau}",
                   params=(("beta1", beta1), ("tau", tau), ("mu", mu_)))


def delay_compensated(tau: int, strength: float = 1.0, *, beta: float = 0.0,
                      form: MomentumForm = "code") -> LinearMethod:
    """Delay-compensated SGD (DC-ASGD, Zheng et al., ICML 2017) with ideal compensation of strength λ_c.

    The literal ``λ_dc·g⊙g⊙(w_now − w_used)`` is cubic on a quadratic (no linear effect), so this is the Taylor
    step it approximates: ``w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·(λ_c·w_t + (1−λ_c)·w_{t−τ})`` (λ_c = 0: delayed
    heavy-ball; 1: undelayed; > 1 over-compensates).
    """
    tau = _check_tau(tau)
    beta = _check_beta(beta)
    if isinstance(strength, bool) or not isinstance(strength, (int, float, np.integer, np.floating)) \
            or not np.isfinite(strength):
        raise ValueError(f"strength must be a finite real number, got {strength!r}")
    lc = float(strength)
    g = _gradient_scale(beta, form)
    b = np.zeros(tau + 2)
    b[1] += g * lc
    b[tau + 1] += g * (1.0 - lc)
    return LinearMethod(f"DC β={beta:g} τ={tau} λc={lc:g}", (1.0, -(1.0 + beta), beta), tuple(b),
                        (("beta", beta), ("tau", tau), ("strength", lc), ("form", form)))


def error_feedback(tau: int = 1, alpha: float = 1.0, *, beta: float = 0.0,
                   form: MomentumForm = "code") -> LinearMethod:
    """Error feedback for a delayed gradient: the previous step's staleness error fed back with weight α.

    Zmushko et al. (arXiv:2606.30634) give only "an Error Feedback-inspired correction"; this is the closest citable
    form (Stich & Karimireddy, arXiv:1909.05350), ``e_t = g_t − g_{t−1}``:

        w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·((1+α)·w_{t−τ} − α·w_{t−τ−1}),

    :func:`predicted_momentum` with ``s = α``; τ = 0 is the undelayed optimizer for every α.
    """
    tau = _check_tau(tau)
    beta = _check_beta(beta)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not np.isfinite(alpha):
        raise ValueError(f"alpha must be a finite real number, got {alpha!r}")
    a_ = float(alpha) if tau > 0 else 0.0
    return general(beta, (1.0 + a_, -a_), tau, scale=_gradient_scale(beta, form),
                   name=f"EF β={beta:g} τ={tau} α={float(alpha):g}",
                   params=(("beta", beta), ("tau", tau), ("alpha", float(alpha)), ("form", form)))


def _as_z(z: complex | np.ndarray) -> np.ndarray:
    arr = np.asarray(z)
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"z must be numeric (real or complex), got dtype {arr.dtype}")
    out = arr.astype(np.complex128)
    if not np.all(np.isfinite(out)):
        raise ValueError("z must be finite (η·λ with finite step and curvature); got NaN or inf")
    return out


def char_poly(method: LinearMethod, z: complex | np.ndarray) -> np.ndarray:
    """Coefficients of ``P(r; z) = A(r) + z·B(r)``, highest power first, shape ``z.shape + (n+1,)``."""
    zz = _as_z(z)[..., None]
    return np.asarray(method.a) + zz * np.asarray(method.b)


def companion(method: LinearMethod, z: complex | np.ndarray) -> np.ndarray:
    """The companion matrix of ``P(·; z)``: ``C[0, :] = −(a_1 + z b_1, …)``, ``C[i, i−1] = 1``."""
    p = char_poly(method, z)
    n = method.order
    out = np.zeros(p.shape[:-1] + (n, n), dtype=np.complex128)
    out[..., 0, :] = -p[..., 1:]
    if n > 1:
        idx = np.arange(1, n)
        out[..., idx, idx - 1] = 1.0
    return out
