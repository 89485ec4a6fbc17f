"""Stability of NAdam's asynchronous look-ahead, delay compensation and error feedback; the noise floor.

Each method is checked three ways: its lag coefficients against a hand derivation, its companion matrix against a
direct simulation of the method in its natural form (EMA buffer, stale-weight ring, previous gradient), and its
largest stable step against closed forms and reductions to the older builders.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from pipelab.stability import (
    delay_compensated,
    delayed_gd,
    delayed_gd_threshold,
    error_feedback,
    gd,
    heavy_ball,
    max_stable_step,
    nesterov,
    nesterov_async,
    predicted_momentum,
    spectral_radius,
    stationary_variance,
)

# ---------------------------------------------------------------------------------------------------------------
# Natural-form simulations on L = ½·λ·w² with η = 1, λ = z (independent of the lag coefficients)
# ---------------------------------------------------------------------------------------------------------------


def _simulate(z, steps, *, kind, tau, beta=0.0, mu=None, strength=0.0, alpha=0.0, form="code", xi=None, w0=None):
    """|w_t| of one method; ``xi``: additive gradient noise sequence (default none), ``w0``: start history."""
    rng = np.random.default_rng(7)
    n = tau + 2
    start = w0 if w0 is not None else rng.normal(size=n) + 1j * rng.normal(size=n)
    hist = deque([complex(x) for x in start], maxlen=n)       # w_{t−τ−1} .. w_t
    v = 0j
    g_prev = None
    out = np.empty(steps, dtype=complex)
    for t in range(steps):
        noise = 0.0 if xi is None else xi[t]
        w_now, w_stale = hist[-1], hist[-1 - tau]
        g = z * w_stale + noise
        if kind == "nadam":          # m ← β1·m + (1−β1)·g ; step μ·m + (1−μ)·g
            m_ = beta if mu is None else mu
            v = beta * v + (1 - beta) * g
            step = m_ * v + (1 - m_) * g
        else:
            if kind == "dc":         # g + λ_c·H·(w_now − w_used), H = λ = z
                g = g + strength * z * (w_now - w_stale)
            elif kind == "ef" and tau > 0:   # g + α·(g − g_prev): the previous step's staleness error
                g_used = g + alpha * (g - (g if g_prev is None else g_prev))
                g_prev = g
                g = g_used
            if form == "code":
                v = beta * v + g
            else:
                v = beta * v + (1 - beta) * g
            step = v
        hist.append(w_now - step)
        out[t] = hist[-1]
    return out


def _growth(traj: np.ndarray) -> float:
    T = len(traj)
    win = T // 8
    a = np.abs(traj[T // 2 - win: T // 2]).max()
    b = np.abs(traj[T - win:]).max()
    return float(np.exp((np.log(b) - np.log(a)) / (T // 2)))


CASES = [
    ("nadam_tau0", nesterov_async(0.7, 0), dict(kind="nadam", tau=0, beta=0.7)),
    ("nadam_tau2", nesterov_async(0.6, 2), dict(kind="nadam", tau=2, beta=0.6)),
    ("nadam_tau1_mu", nesterov_async(0.8, 1, mu=0.5), dict(kind="nadam", tau=1, beta=0.8, mu=0.5)),
    ("dc_sgd_tau3", delay_compensated(3, 0.6), dict(kind="dc", tau=3, strength=0.6)),
    ("dc_momentum_tau2", delay_compensated(2, 0.4, beta=0.5), dict(kind="dc", tau=2, strength=0.4, beta=0.5)),
    ("dc_paper_tau1", delay_compensated(1, 0.8, beta=0.6, form="paper"),
     dict(kind="dc", tau=1, strength=0.8, beta=0.6, form="paper")),
    ("ef_sgd_tau1", error_feedback(1), dict(kind="ef", tau=1, alpha=1.0)),
    ("ef_momentum_tau3", error_feedback(3, 0.5, beta=0.7), dict(kind="ef", tau=3, alpha=0.5, beta=0.7)),
    ("ef_paper_tau2", error_feedback(2, 2.0, beta=0.5, form="paper"),
     dict(kind="ef", tau=2, alpha=2.0, beta=0.5, form="paper")),
]


@pytest.mark.parametrize("name,method,kw", CASES, ids=[c[0] for c in CASES])
def test_companion_matches_natural_form_simulation(name, method, kw):
    """The simulated per-step growth equals the spectral radius, inside and outside the region (complex z)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    scale = min(max_stable_step(method), 4.0)
    z = scale * (rng.uniform(-0.3, 1.4, 600) + 1j * rng.uniform(-0.7, 0.7, 600))
    rad = spectral_radius(method, z)
    inside = z[(rad > 0.6) & (rad < 0.985)][:4]
    outside = z[(rad > 1.015) & (rad < 1.5)][:4]
    assert len(inside) >= 3 and len(outside) >= 3, "sampling found too few points"
    for zz in np.concatenate([inside, outside]):
        rate = _growth(_simulate(zz, 1200, **kw))
        r = float(spectral_radius(method, zz))
        assert (rate < 1) == (r < 1), f"{name} at z={zz:.4f}: simulated rate {rate:.4f}, radius {r:.4f}"
        assert abs(np.log(rate) - np.log(r)) < 0.004, f"{name} at z={zz:.4f}: rate {rate:.5f} vs radius {r:.5f}"


@pytest.mark.parametrize("name,method,kw", CASES, ids=[c[0] for c in CASES])
def test_simulation_agrees_with_threshold_on_both_sides(name, method, kw):
    """On the real axis the recurrence decays just below z* and grows just above it (1-D quadratic)."""
    zs = max_stable_step(method)
    w0 = np.linspace(1.0, 0.5, kw["tau"] + 2)
    below = _growth(_simulate(zs * 0.97, 6000, w0=w0, **kw))
    above = _growth(_simulate(zs * 1.03, 6000, w0=w0, **kw))
    assert below < 1.0 < above, f"{name}: z*={zs:.5f}, growth below {below:.6f}, above {above:.6f}"
    r_below, r_above = spectral_radius(method, np.array([zs * 0.97, zs * 1.03]))
    assert abs(np.log(below) - np.log(r_below)) < 1e-3 and abs(np.log(above) - np.log(r_above)) < 1e-3


# ---------------------------------------------------------------------------------------------------------------
# Lag coefficients against hand derivations
# ---------------------------------------------------------------------------------------------------------------


def test_nesterov_async_coefficients_by_hand():
    # β1 = 0.9, μ = 0.6, τ = 2: w_{t+1} = 1.9 w_t − 0.9 w_{t−1} − z·((1 − 0.54)·w_{t−2} − 0.4·0.9·w_{t−3})
    m = nesterov_async(0.9, 2, mu=0.6)
    np.testing.assert_allclose(m.a, [1.0, -1.9, 0.9, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(m.b, [0.0, 0.0, 0.0, 0.46, -0.36], atol=1e-15)
    # μ = β1: the smoothed-gradient ("paper") form of torch's Nesterov, for every delay
    for beta, tau in [(0.5, 0), (0.9, 1), (0.99, 4)]:
        a, b = nesterov_async(beta, tau), nesterov(beta, tau, form="paper")
        np.testing.assert_allclose(a.a, b.a, atol=1e-15)
        np.testing.assert_allclose(a.b, b.b, atol=1e-15)


def test_delay_compensation_coefficients_and_reductions():
    # β = 0.5, τ = 3, λ_c = 0.25: gradient λ·(0.25·w_t + 0.75·w_{t−3})
    m = delay_compensated(3, 0.25, beta=0.5)
    assert m.a == (1.0, -1.5, 0.5, 0.0, 0.0) and m.b == (0.0, 0.25, 0.0, 0.0, 0.75)
    for beta in (0.0, 0.5, 0.9):
        for tau in range(0, 5):
            no_comp, stale = delay_compensated(tau, 0.0, beta=beta), heavy_ball(beta, tau)
            assert (no_comp.a, no_comp.b) == (stale.a, stale.b)
            full, fresh = delay_compensated(tau, 1.0, beta=beta), heavy_ball(beta, 0)
            assert (full.a, full.b) == (fresh.a, fresh.b)
            zero = delay_compensated(0, 0.37, beta=beta)
            assert (zero.a, zero.b) == (fresh.a, fresh.b)


def test_error_feedback_coefficients_and_identity_with_prediction():
    m = error_feedback(2, 0.5, beta=0.3)          # gradient λ·(1.5·w_{t−2} − 0.5·w_{t−3})
    np.testing.assert_allclose(m.a, [1.0, -1.3, 0.3, 0.0, 0.0])
    np.testing.assert_allclose(m.b, [0.0, 0.0, 0.0, 1.5, -0.5])
    for beta, tau, alpha in [(0.0, 1, 1.0), (0.9, 3, 1.0), (0.5, 4, 4.0), (0.9, 2, 0.3)]:
        ef, pred = error_feedback(tau, alpha, beta=beta), predicted_momentum(beta, tau, alpha)
        assert (ef.a, ef.b) == (pred.a, pred.b)
    for alpha in (0.5, 1.0, 3.0):                 # no delay, no staleness error: the undelayed optimizer
        ef0, hb0 = error_feedback(0, alpha, beta=0.6), heavy_ball(0.6, 0)
        assert (ef0.a, ef0.b) == (hb0.a, hb0.b)


# ---------------------------------------------------------------------------------------------------------------
# Largest stable step: closed forms
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", range(9))
def test_uncompensated_delay_is_levin_may(tau):
    assert max_stable_step(delay_compensated(tau, 0.0)) == pytest.approx(delayed_gd_threshold(tau), rel=1e-10)
    assert max_stable_step(delay_compensated(tau, 0.0)) == pytest.approx(2 * np.sin(np.pi / (2 * (2 * tau + 1))),
                                                                         rel=1e-10)


@pytest.mark.parametrize("lc", [0.0, 0.2, 0.5, 0.6, 0.75, 0.9, 0.97])
def test_delay_compensation_tau1_closed_form(lc):
    """τ = 1, SGD: P(r) = r² − (1 − λ_c z)·r + (1−λ_c)·z; Jury: z* = min(1/(1−λ_c), 2/(2λ_c − 1) if λ_c > ½)."""
    exact = 1.0 / (1.0 - lc)
    if lc > 0.5:
        exact = min(exact, 2.0 / (2.0 * lc - 1.0))
    assert max_stable_step(delay_compensated(1, lc)) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 0.99])
def test_nesterov_async_without_delay_closed_form(beta):
    """τ = 0, μ = β1: torch Nesterov's z* = 2(1+β)/(1+2β) at the scaled step (1−β)·z."""
    exact = 2 * (1 + beta) / ((1 + 2 * beta) * (1 - beta))
    assert max_stable_step(nesterov_async(beta, 0)) == pytest.approx(exact, rel=1e-9)


def test_error_feedback_one_step_delay_threshold_by_jury():
    """τ = 1, α = 1, SGD: P(r) = r³ − r² + 2z·r − z. Bisection on the roots' modulus (numpy) gives z*."""
    lo, hi = 1e-6, 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if np.abs(np.roots([1.0, -1.0, 2 * mid, -mid])).max() < 1.0:
            lo = mid
        else:
            hi = mid
    assert max_stable_step(error_feedback(1)) == pytest.approx(lo, rel=1e-9)


# ---------------------------------------------------------------------------------------------------------------
# Noise floor
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("z", [0.05, 0.5, 1.5])
def test_stationary_variance_of_sgd_closed_form(z):
    assert stationary_variance(gd(), z) == pytest.approx(1.0 / (1.0 - (1.0 - z) ** 2), rel=1e-12)


@pytest.mark.parametrize("name,method,kw,noise", [
    ("hb_code_tau2", heavy_ball(0.7, 2), dict(kind="dc", tau=2, beta=0.7), (1.0,)),
    ("hb_paper_tau1", heavy_ball(0.9, 1, form="paper"), dict(kind="dc", tau=1, beta=0.9, form="paper"), (0.1,)),
    ("nadam_tau1", nesterov_async(0.8, 1), dict(kind="nadam", tau=1, beta=0.8), (0.2 * 1.8, -0.2 * 0.8)),
    ("dc_tau3", delay_compensated(3, 0.5), dict(kind="dc", tau=3, strength=0.5), (1.0,)),
])
def test_stationary_variance_matches_impulse_response(name, method, kw, noise):
    """Var = Σ h_k² of the natural-form recurrence's response to one unit gradient-noise impulse."""
    z = 0.5 * max_stable_step(method)
    T = 4000
    xi = np.zeros(T)
    xi[0] = 1.0
    h = _simulate(z, T, xi=xi, w0=np.zeros(kw["tau"] + 2), **kw).real
    assert abs(h[-200:]).max() < 1e-10                                # the response has died out
    assert stationary_variance(method, z, noise) == pytest.approx(float(np.sum(h ** 2)), rel=1e-8)


def test_stationary_variance_is_infinite_outside_and_checks_arguments():
    assert stationary_variance(delayed_gd(2), 1.01 * delayed_gd_threshold(2)) == np.inf
    with pytest.raises(ValueError, match="z"):
        stationary_variance(gd(), 0.5j)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="noise"):
        stationary_variance(gd(), 0.5, ())


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="beta1"):
        nesterov_async(1.0, 1)
    with pytest.raises(ValueError, match="mu"):
        nesterov_async(0.9, 1, mu=-0.1)
    with pytest.raises(ValueError, match="tau"):
        delay_compensated(-1)
    with pytest.raises(ValueError, match="strength"):
        delay_compensated(1, float("nan"))
    with pytest.raises(ValueError, match="alpha"):
        error_feedback(1, float("inf"))
    with pytest.raises(ValueError, match="form"):
        error_feedback(1, form="torch")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# The two figures: their CSVs agree with the builders and with closed forms
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_momentum_delay_figure_tables(monkeypatch):
    import io

    import pandas as pd

    from pipelab.studies import figures

    monkeypatch.setenv("PIPELAB_CACHE", "off")
    out = figures.make("stability_momentum_delay", "tiny")
    df = pd.read_csv(io.StringIO(out.tables["csv"]))
    assert set(df["beta"]) == {0.0, 0.5, 0.9, 0.99} and set(df["tau"]) == set(range(9))
    # torch's lr and the effective step differ by exactly (1−β) (the paper form is the code form at (1−β)·z)
    np.testing.assert_allclose(df["z_star_torch"], (1 - df["beta"]) * df["z_star_eff"], rtol=1e-8)
    gd_rows = df[df["beta"] == 0.0]
    np.testing.assert_allclose(gd_rows["z_star_eff"], [delayed_gd_threshold(t) for t in gd_rows["tau"]], rtol=1e-8)
    np.testing.assert_allclose(df["z_star_gd_extra_delay"],
                               2 * np.sin(np.pi / (2 * (2 * (df["tau"] + df["beta"] / (1 - df["beta"])) + 1))),
                               rtol=1e-8)
    no_delay = df[df["tau"] == 0]
    np.testing.assert_allclose(no_delay["z_star_eff"], 2 * (1 + no_delay["beta"]) / (1 - no_delay["beta"]), rtol=1e-8)
    assert float(df[(df["beta"] == 0) & (df["tau"] == 0)]["noise_ratio"].iloc[0]) == pytest.approx(1.0, abs=1e-12)
    # the stable-delay table is the z* table read at fixed effective steps
    sd = pd.read_csv(io.StringIO(out.tables["stable_delay.csv"]))
    for b in (0.0, 0.5, 0.9, 0.99):
        zs = df[df["beta"] == b].sort_values("tau")["z_star_eff"].to_numpy()
        for e, tmax in zip(sd["z_eff"], sd[f"beta={b:g}"]):
            ok = e < zs
            assert tmax == (len(zs) - 1 if ok.all() else int(np.argmin(ok)) - 1)
    # the notebook's sentences carry the CSV's numbers
    from pipelab.studies.figures.stability import momentum_claims_markdown

    md = momentum_claims_markdown(out.tables["csv"], out.tables["stable_delay.csv"], 0.1)
    row = df[(df["beta"] == 0.9)].set_index("tau")
    assert f"{row.loc[0, 'z_star_torch'] / row.loc[1, 'z_star_torch']:.3g}× at β=0.9" in md
    assert f"{df[(df['beta'] == 0.99) & (df['tau'] == 1)]['z_star_eff_nadam'].iloc[0]:.3g} (β1=0.99)" in md
    assert "effective step 0.1**" in md


@pytest.mark.slow
def test_modern_vs_delay_figure_table(monkeypatch):
    import io

    import pandas as pd

    from pipelab.studies import figures

    monkeypatch.setenv("PIPELAB_CACHE", "off")
    out = figures.make("stability_modern_vs_delay", "tiny")
    df = pd.read_csv(io.StringIO(out.tables["csv"]))
    assert list(df["tau"]) == list(range(9))
    np.testing.assert_allclose(df["GD (stale)"], [delayed_gd_threshold(t) for t in range(9)], rtol=1e-8)
    np.testing.assert_allclose(df["NAdam β1=0.99"], [max_stable_step(nesterov(0.99, t, form="paper"))
                                                     for t in range(9)], rtol=1e-8)
    np.testing.assert_allclose(df["EF α=τ (= prediction s=τ)"][1:],
                               [max_stable_step(predicted_momentum(0.0, t)) for t in range(1, 9)], rtol=1e-8)
    assert df["DC λc=0.9"][1] == pytest.approx(2.5, rel=1e-9)   # τ = 1 closed form min(1/(1−λc), 2/(2λc−1))
    from pipelab.studies.figures.stability import modern_thresholds_markdown

    md = modern_thresholds_markdown(out.tables["csv"]).splitlines()
    assert len(md) == 2 + len(df.columns) - 1
    assert md[2].startswith("| GD (stale) | 2 | 1 | 1.00× |")
    assert "| DC λc=0.9 | 2 | 2.5 | 2.50× |" in md[7]
