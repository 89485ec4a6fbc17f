"""Linearised optimizers with stale gradients as linear recurrences in the weight.

Every method here is run on the scalar quadratic ``L(w) = ½·λ·w²`` (one eigen-direction of a quadratic
loss), whose gradient is ``λ·w``. Writing ``z = η·λ`` (complex: a complex λ stands for a non-symmetric
Jacobian, as in the stability analysis of linear multistep methods), each method is a linear recurrence in
the weight alone,

    Σ_{k=0..n} (a_k + z·b_k) · w_{t+1-k} = 0,        a_0 = 1, b_0 = 0,

so its characteristic polynomial is ``P(r; z) = A(r) + z·B(r)`` with
``A(r) = Σ a_k r^(n-k)`` and ``B(r) = Σ b_k r^(n-k)``. The iteration matrix on the state
``x_t = (w_t, w_{t-1}, …, w_{t-n+1})`` is the companion matrix of ``P``: first row
``-(a_1 + z b_1, …, a_n + z b_n)``, ones on the sub-diagonal. The method converges for every start
iff all roots of ``P`` lie strictly inside the unit disk (spectral radius < 1).

Most methods are one special case of (the issue's "general form")

    w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·Σ_j c_j · w_{t−τ−j},

i.e. ``a = (1, −(1+β), β)`` and ``b_{τ+1+j} = g·c_j``, where τ is the gradient delay (the gradient
applied at step t was computed at weights τ updates old), β the momentum, ``g`` a gradient scale
(``1`` for torch's momentum buffer ``v ← μ·v + g``; ``1−β`` for the papers' smoothed gradient
``v ← γ·v + (1−γ)·g``) and ``c`` says at which combination of past weights the gradient is evaluated.
A :class:`LinearMethod` stores ``a`` and ``b`` and a record of its parameters; :func:`general` builds it.

Derivations (state vector, elimination of the momentum buffer) are in each builder's docstring; the
tests check every builder against a direct simulation of the method in its natural form.

Example:
    >>> m = delayed_gd(1)            # w_{t+1} = w_t − z·w_{t−1}
    >>> m.a, m.b
    ((1.0, -1.0, 0.0), (0.0, 0.0, 1.0))
    >>> char_poly(m, 0.5).tolist()   # r² − r + 0.5
    [(1+0j), (-1+0j), (0.5+0j)]

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
    """A linearised optimizer: ``Σ_k (a_k + z·b_k)·w_{t+1−k} = 0`` with ``a_0 = 1``, ``b_0 = 0``.

    Attributes:
        name: short label (used in figure legends).
        a: lag coefficients of the gradient-free part (``a[0] == 1``).
        b: lag coefficients multiplying ``z = η·λ`` (``b[0] == 0``: the methods are explicit).
        params: the builder's parameters, as ``(name, value)`` pairs (for records and legends).
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
    """The general form ``w_{t+1} = (1+β)w_t − βw_{t−1} − scale·z·Σ_j c_j·w_{t−τ−j}``.

    Args:
        beta: momentum β in [0, 1); β = 0 gives gradient descent.
        c: the gradient is evaluated at ``Σ_j c_j w_{t−τ−j}`` (``(1,)``: at the stale weights).
        tau: gradient delay τ ≥ 0 (in optimizer steps).
        scale: multiplies z (1 for torch's ``μ·v + g`` buffer, ``1−β`` for a smoothed gradient).

    Returns:
        the :class:`LinearMethod` with ``a = (1, −(1+β), β)`` and ``b_{τ+1+j} = scale·c_j``.

    Example:
        >>> general(0.0, (1.0,), 2).b      # delayed GD, τ = 2
        (0.0, 0.0, 0.0, 1.0)
    """
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
    """Gradient descent ``w_{t+1} = w_t − z·w_t``; state ``(w_t)``, matrix ``[1 − z]``.

    Stable iff ``|1 − z| < 1`` (the disk of radius 1 centred at z = 1).

    Example:
        >>> char_poly(gd(), 0.5).tolist()
        [(1+0j), (-0.5+0j)]
    """
    return LinearMethod("GD", (1.0, -1.0), (0.0, 1.0), (("beta", 0.0), ("tau", 0)))


def delayed_gd(tau: int) -> LinearMethod:
    """Gradient descent with gradient delay τ: ``w_{t+1} = w_t − z·w_{t−τ}``.

    State ``(w_t, …, w_{t−τ})``; companion matrix with first row ``(1, 0, …, 0, −z)``; characteristic
    polynomial ``r^(τ+1) − r^τ + z``. For real z the recurrence is asymptotically stable iff
    ``0 < z < 2·cos(τπ/(2τ+1)) = 2·sin(π/(2(2τ+1)))`` (see :func:`pipelab.stability.delayed_gd_threshold`).

    Args:
        tau: the delay τ ≥ 0 (τ = 0 is plain GD).

    Example:
        >>> delayed_gd(2).order
        3
    """
    tau = _check_tau(tau)
    m = general(0.0, (1.0,), tau, name=f"GD τ={tau}")
    return m


def heavy_ball(beta: float, tau: int = 0, *, form: MomentumForm = "code") -> LinearMethod:
    """Heavy-ball (Polyak) momentum with gradient delay τ, eliminated to a recurrence in w.

    ``form="code"`` (``torch.optim.SGD(momentum=β)``): ``v_t = β·v_{t−1} + λ·w_{t−τ}``,
    ``w_{t+1} = w_t − η·v_t``. Since ``η·v_{t−1} = w_{t−1} − w_t``,

        w_{t+1} = (1+β)·w_t − β·w_{t−1} − z·w_{t−τ}.

    ``form="paper"`` (smoothed gradient, SpecTrain eq. 1: ``v_t = β·v_{t−1} + (1−β)·λ·w_{t−τ}``) gives
    the same recurrence with z replaced by ``(1−β)·z``. State ``(w_t, …, w_{t−max(1,τ)})``;
    characteristic polynomial ``r^(τ+1)·(r − 1) − β·r^τ·(r − 1) + z`` up to a power of r, i.e. for
    τ = 0: ``r² − (1+β−z)·r + β``, stable for real z iff ``0 < z < 2(1+β)`` (code form).

    Args:
        beta: momentum β in [0, 1).
        tau: gradient delay τ ≥ 0.
        form: ``"code"`` (``v ← β·v + g``) or ``"paper"`` (``v ← β·v + (1−β)·g``).
    """
    beta = _check_beta(beta)
    tau = _check_tau(tau)
    return general(beta, (1.0,), tau, scale=_gradient_scale(beta, form), name=f"HB β={beta:g} τ={tau}",
                   params=(("beta", beta), ("tau", tau), ("form", form)))


def nesterov(beta: float, tau: int = 0, *, form: MomentumForm = "code") -> LinearMethod:
    """Nesterov momentum (torch's ``nesterov=True``) with gradient delay τ.

    ``v_t = β·v_{t−1} + g_t``, ``w_{t+1} = w_t − η·(g_t + β·v_t)`` with ``g_t = λ·w_{t−τ}``. Let
    ``d_t = w_{t+1} − w_t = −η(g_t + β v_t)``; then ``d_t − β·d_{t−1} = −η((1+β)·g_t − β·g_{t−1})``, so

        w_{t+1} = (1+β)·w_t − β·w_{t−1} − z·((1+β)·w_{t−τ} − β·w_{t−τ−1}),

    the general form with ``c = (1+β, −β)``: Nesterov is heavy-ball whose gradient is taken at the
    extrapolated point ``w + β·(w − w_prev)``. ``form="paper"`` scales z by ``1−β``. For τ = 0 the
    characteristic polynomial is ``r² − (1+β)(1−z)·r + β(1−z)``, stable for real z iff
    ``0 < z < 2(1+β)/(1+2β)``.

    Args:
        beta: momentum β in [0, 1).
        tau: gradient delay τ ≥ 0.
        form: ``"code"`` or ``"paper"`` (see :func:`heavy_ball`).
    """
    beta = _check_beta(beta)
    tau = _check_tau(tau)
    return general(beta, (1.0 + beta, -beta), tau, scale=_gradient_scale(beta, form),
                   name=f"Nesterov β={beta:g} τ={tau}", params=(("beta", beta), ("tau", tau), ("form", form)))


def predicted_momentum(beta: float, tau: int, s: float | None = None, *, form: MomentumForm = "code",
                       velocity_scale: float = 1.0) -> LinearMethod:
    """Delayed momentum SGD whose stale weights are extrapolated (SpecTrain / PipeOptim prediction).

    The gradient applied at step t is computed at the *predicted* weights
    ``ŵ = w_{t−τ} − s·κ·η·v_{t−τ−1}``: the stage reads the stale weights ``w_{t−τ}`` together with the
    momentum buffer that produced them and extrapolates s steps ahead (SpecTrain eq. 4,
    ``Ŵ_{t+s} = W_t − s·η·v_{t−1}``; PipeOptim eq. 5 with ``ΔW_t = v_t``). Because the optimizer's own
    buffer satisfies ``η·v_{t−τ−1} = w_{t−τ−1} − w_{t−τ}``,

        ŵ = (1 + κs)·w_{t−τ} − κs·w_{t−τ−1},
        w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·((1+κs)·w_{t−τ} − κs·w_{t−τ−1}),

    the general form with ``c = (1+κs, −κs)``. With β = 0 (plain SGD, ``v`` = last gradient) the same
    formula is "repeat the last update s times".

    The two readings of "momentum":

    - ``form="code"`` — what the published code computes with ``torch.optim.SGD``: buffer
      ``v ← μ·v + g``, update ``w ← w − η·v``, prediction from the same buffer: ``g = 1``, ``κ = 1``.
    - ``form="paper"`` — as SpecTrain states it: smoothed gradient ``v ← γ·v + (1−γ)·g`` drives both
      the update and the prediction: ``g = 1−β``, ``κ = 1``. It is the code form at learning rate
      ``(1−β)·η``: the region is the code form's scaled by ``1/(1−β)``.

    Mixing them — the paper's smoothed gradient used to predict while the optimizer is torch's — is
    ``form="code", velocity_scale=1−β`` (the smoothed gradient is exactly ``(1−β)`` times torch's buffer),
    which extrapolates only a fraction ``1−β`` of the actual velocity.

    Args:
        beta: momentum β in [0, 1).
        tau: gradient delay τ ≥ 0.
        s: version difference (prediction horizon); default τ (predict the current weights).
        form: ``"code"`` or ``"paper"``.
        velocity_scale: κ, the ratio of the predicting velocity to the optimizer's own buffer.
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

    In an asynchronous pipeline the forward pass of a stage used weights ``w_{t−τf}`` and its backward
    pass uses newer weights ``u_b`` (delay ``τb ≤ τf``). On the quadratic we model the gradient as

        g_t = λ·((1−ρ)·w_{t−τf} + ρ·u_b),

    where ρ is the gradient's sensitivity to the backward-pass weights relative to the curvature
    (PipeMare's ``∇f(u_fwd, u_bkwd) ≈ λ·u_fwd + Δ·(u_bkwd − u_fwd)`` with ``Δ = ρ·λ``, in our
    parametrisation). ρ = 0: delayed GD with delay τf; ρ = 1: delay τb; ρ ∈ (0, 1) interpolates the two
    delays; ρ < 0 or ρ > 1 is a gradient that the weight *discrepancy* itself perturbs — the case the
    correction targets (on this model it enlarges the stable step there, and can shrink it for
    ρ ∈ (0, 1], where it pushes the backward weights back to the older forward weights).
    Without correction ``u_b = w_{t−τb}``. PipeMare's discrepancy correction (the form implemented
    here) moves the backward weights back towards the forward weights along an EMA of the weight
    velocity:

        δ_t = γ·δ_{t−1} + (1−γ)·(w_t − w_{t−1}),      u_b = w_{t−τb} − (τf − τb)·δ_{t−τb}

    (``δ_{t−τb}``: the velocity estimate the stage held when the backward weights were current).

    The weight update is momentum SGD with this gradient (β = 0: plain SGD). To eliminate δ, apply
    ``(1 − γ·q⁻¹)`` (q⁻¹ the lag operator) to the whole recurrence: both lag polynomials are convolved
    with ``(1, −γ)`` and the correction adds ``−ρ(τf−τb)(1−γ)·(w_{t−τb} − w_{t−τb−1})`` to the
    gradient part. The roots of the resulting polynomial are the eigenvalues of the iteration matrix on
    the natural state ``(w_t, …, w_{t−n}, δ_{t−1})`` (the tests check the growth rate against a direct
    simulation with an explicit δ); the extra root γ at z = 0 is the EMA's own decay.

    Args:
        tau_fwd: forward delay τf ≥ 0.
        tau_bkwd: backward delay, 0 ≤ τb ≤ τf.
        rho: sensitivity of the gradient to the backward weights, ``Δ/λ`` (any finite real).
        gamma: EMA decay γ of the velocity estimate, in [0, 1) (PipeMare ties it to the stage's
            delays; here it is an explicit argument).
        beta: momentum β in [0, 1).
        correction: apply the discrepancy correction.
        form: ``"code"`` or ``"paper"`` momentum (see :func:`heavy_ball`).
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
    """Adam linearised with a frozen preconditioner, with gradient delay τ.

    Late in training (or on a quadratic after the second moment has settled) Adam's second-moment
    estimate changes slowly; freezing it at ``v̂`` makes the step linear:
    ``m_t = β1·m_{t−1} + (1−β1)·λ·w_{t−τ}``, ``w_{t+1} = w_t − η·m_t/(√v̂ + ε)`` (bias correction of m
    → 1 for large t). On the eigen-direction this is :func:`heavy_ball` in ``"paper"`` form with
    ``z = η·λ/(√v̂ + ε)``, the *preconditioned* step:

        w_{t+1} = (1+β1)·w_t − β1·w_{t−1} − (1−β1)·z·w_{t−τ}.

    Args:
        beta1: Adam's β1 in [0, 1).
        tau: gradient delay τ ≥ 0.
    """
    beta1 = _check_beta(beta1, "beta1")
    tau = _check_tau(tau)
    m = general(beta1, (1.0,), tau, scale=1.0 - beta1, name=f"Adam (frozen) β1={beta1:g} τ={tau}",
                params=(("beta1", beta1), ("tau", tau)))
    return m


def nesterov_async(beta1: float = 0.99, tau: int = 1, *, mu: float | None = None) -> LinearMethod:
    """Nesterov look-ahead for asynchronous pipelines (Ajanthan et al., arXiv:2505.01099), as NAdam computes it.

    The recursion analysed here is the one the paper's public code runs: ``torch.optim.NAdam`` with a high
    β1 (0.99 in its scripts) and the gradient of step t taken at the weights its micro-batch's forward used,
    τ updates old: ``g_t = λ·w_{t−τ}`` (the code stashes and recomputes the backward at that version; the
    policy ``nesterov_async`` of :mod:`pipelab.policies` with ``backward="current"`` mixes in the current
    weights, the PipeMare model of :func:`pipemare`). With the second moment frozen (as in :func:`adam_frozen`,
    ``z = η·λ/(√v̂ + ε)``) and the bias corrections at their late-training limit 1, NAdam's step is

        m_t = β1·m_{t−1} + (1−β1)·g_t,        w_{t+1} = w_t − η·(μ·m_t + (1−μ)·g_t),

    where μ is NAdam's momentum weight ``μ_t = β1·(1 − ½·0.96^(t·ψ))`` (ψ = ``momentum_decay`` = 0.004), which
    tends to β1. Applying ``(1 − β1·q⁻¹)`` to the update ``d_t = w_{t+1} − w_t`` eliminates m:
    ``d_t − β1·d_{t−1} = −η·((1 − μβ1)·g_t − (1−μ)·β1·g_{t−1})``, i.e.

        w_{t+1} = (1+β1)·w_t − β1·w_{t−1} − z·((1 − μβ1)·w_{t−τ} − (1−μ)·β1·w_{t−τ−1}),

    the general form with ``c = (1 − μβ1, −(1−μ)β1)``. For μ = β1 it is :func:`nesterov` in ``"paper"`` form
    (``c = (1−β1)·(1+β1, −β1)``): the look-ahead ``β1·m_t + (1−β1)·g_t`` is the smoothed gradient one step
    ahead. The paper's text (its modified look-ahead) was not available to us; the search found only its
    abstract ("we modify the look-ahead step in NAG") and its code, so this builder pins the code's rule. The
    code's option that raises β1 with the stage's delay is, here, a choice of ``beta1`` per τ.

    Args:
        beta1: NAdam's β1 in [0, 1) (the paper's code: 0.99).
        tau: gradient delay τ ≥ 0 (τ = 0: NAdam without delay).
        mu: NAdam's momentum weight μ in [0, 1); default β1 (the limit of NAdam's schedule).

    Example:
        >>> m = nesterov_async(0.5, 0)
        >>> [round(x, 6) for x in m.b]
        [0.0, 0.75, -0.25]
    """
    beta1 = _check_beta(beta1, "beta1")
    tau = _check_tau(tau)
    mu_ = beta1 if mu is None else _check_beta(mu, "mu")
    return general(beta1, (1.0 - mu_ * beta1, -(1.0 - mu_) * beta1), tau, name=f"NAdam β1={beta1:g} τ={tau}",
                   params=(("beta1", beta1), ("tau", tau), ("mu", mu_)))


def delay_compensated(tau: int, strength: float = 1.0, *, beta: float = 0.0,
                      form: MomentumForm = "code") -> LinearMethod:
    """Delay-compensated SGD (DC-ASGD, Zheng et al., ICML 2017), ideal compensation of strength λ_c.

    DC-ASGD corrects the stale gradient with a cheap Hessian approximation,
    ``g̃ = g(w_used) + λ_dc·g⊙g⊙(w_now − w_used)``, where ``λ_dc·g⊙g`` stands for the diagonal of the Hessian
    (the outer-product approximation ``E[g gᵀ] ≈ H`` of the Fisher information). Taken literally on the
    quadratic ``½λw²`` the correction ``λ_dc·λ²w²·(w_now − w_used)`` is cubic in w: it vanishes to first order
    and the linear analysis of the literal rule is that of the uncompensated method. We analyse the view the
    paper motivates, the compensation as a first-order Taylor step with the Hessian ``H = λ``, scaled by a
    strength ``λ_c ∈ [0, 1]`` (how much of the true curvature the proxy captures):

        g̃_t = λ·w_{t−τ} + λ_c·λ·(w_t − w_{t−τ}) = λ·((1−λ_c)·w_{t−τ} + λ_c·w_t),

    applied by momentum SGD (``v ← β·v + g̃``, or the smoothed ``"paper"`` form):

        w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·(λ_c·w_t + (1−λ_c)·w_{t−τ}).

    λ_c = 0 is :func:`heavy_ball` with delay τ; λ_c = 1 is the undelayed method (the gradient is exact on a
    quadratic); τ = 0 is the undelayed method for every λ_c.

    Args:
        tau: gradient delay τ ≥ 0.
        strength: λ_c, any finite real (λ_c ∈ [0, 1] interpolates; > 1 over-compensates).
        beta: momentum β in [0, 1) (0: DC-ASGD as published, on plain SGD).
        form: ``"code"`` or ``"paper"`` momentum (see :func:`heavy_ball`).

    Example:
        >>> delay_compensated(2, 0.25).b
        (0.0, 0.25, 0.0, 0.75)
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
    """Error feedback for a delayed gradient: the previous step's staleness error is fed back.

    Zmushko et al. (arXiv:2606.30634) propose "an Error Feedback-inspired correction" for the one-step delay of
    PipeDream-2BW; their exact rule was not available to us (only the abstract and summaries were found), so
    this is the closest citable form: error feedback (Seide et al. 2014; Stich & Karimireddy, arXiv:1909.05350,
    where delayed SGD is itself an error-feedback method) with the *staleness error* as the error. At step t
    the optimizer receives ``g_t = λ·w_{t−τ}``; the step before it applied ``g_{t−1}`` when the fresher ``g_t``
    was the better estimate, so its error ``e_t = g_t − g_{t−1}`` is known now and is fed back with weight α:

        g̃_t = g_t + α·(g_t − g_{t−1}) = λ·((1+α)·w_{t−τ} − α·w_{t−τ−1}),

    which the optimizer (momentum SGD here, any optimizer in practice: the rule acts on its input) applies:

        w_{t+1} = (1+β)·w_t − β·w_{t−1} − g·z·((1+α)·w_{t−τ} − α·w_{t−τ−1}).

    On the quadratic this is exactly :func:`predicted_momentum` with ``s = α`` (a linear, time-invariant
    correction commutes with the optimizer's linear filter: correcting the gradient, the update, or the weights
    the gradient is taken at are the same linear method) — the tests check the identity. α = 1 extrapolates one
    step (the one-step delay); α = τ extrapolates the whole delay — the policy ``error_feedback`` of
    :mod:`pipelab.policies` uses ``α = γ·τ`` (its γ = 1 by default). With τ = 0 there is no staleness error and
    the method is the undelayed optimizer for every α.

    Args:
        tau: gradient delay τ ≥ 0 (the paper's setting: 1).
        alpha: feedback weight α, finite real (1: the full one-step error).
        beta: momentum β in [0, 1).
        form: ``"code"`` or ``"paper"`` momentum (see :func:`heavy_ball`).

    Example:
        >>> error_feedback(1).b
        (0.0, 0.0, 2.0, -1.0)
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
    """Coefficients of ``P(r; z) = A(r) + z·B(r)``, highest power first, shape ``z.shape + (n+1,)``.

    Args:
        method: the linearised optimizer.
        z: ``η·λ``, a complex scalar or array.

    Example:
        >>> char_poly(heavy_ball(0.5), 1.0).real.tolist()    # r² − (1.5 − 1)·r + 0.5
        [1.0, -0.5, 0.5]
    """
    zz = _as_z(z)[..., None]
    return np.asarray(method.a) + zz * np.asarray(method.b)


def companion(method: LinearMethod, z: complex | np.ndarray) -> np.ndarray:
    """The iteration matrix on ``x_t = (w_t, …, w_{t−n+1})``: companion matrix of ``P(·; z)``.

    ``x_{t+1} = C·x_t`` with ``C[0, :] = −(a_1 + z b_1, …, a_n + z b_n)`` and ``C[i, i−1] = 1``.

    Returns:
        array of shape ``z.shape + (n, n)`` (complex).

    Example:
        >>> companion(delayed_gd(1), 0.25).real.tolist()
        [[1.0, -0.25], [1.0, 0.0]]
    """
    p = char_poly(method, z)
    n = method.order
    out = np.zeros(p.shape[:-1] + (n, n), dtype=np.complex128)
    out[..., 0, :] = -p[..., 1:]
    if n > 1:
        idx = np.arange(1, n)
        out[..., idx, idx - 1] = 1.0
    return out
