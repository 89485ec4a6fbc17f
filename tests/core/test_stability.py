"""Stability analysis (pipelab.stability): matrices vs direct simulation, closed forms, grids, thresholds."""

from __future__ import annotations

import zlib
from collections import deque

import numpy as np
import pytest

from pipelab.stability import (
    LinearMethod,
    adam_frozen,
    boundary_locus,
    char_poly,
    companion,
    complex_grid,
    delay_compensated,
    delayed_gd,
    delayed_gd_threshold,
    error_feedback,
    gd,
    general,
    heavy_ball,
    heavy_ball_threshold,
    max_stable_step,
    nesterov,
    nesterov_async,
    nesterov_threshold,
    pipemare,
    predicted_momentum,
    region_area,
    region_mask,
    spectral_radius,
    stable_mask,
)

# ---------------------------------------------------------------------------------------------------------------
# Reference simulations, each written in the method's natural form (weights, momentum buffer, EMA), independent
# of the lag coefficients in pipelab.stability.methods. λ = z and η = 1, so η·λ = z.
# ---------------------------------------------------------------------------------------------------------------


def _sim_momentum(z, steps, *, beta=0.0, tau=0, form="code", nesterov_=False, s=0.0, kappa=1.0, w0=None):
    """Momentum SGD (torch or EMA buffer) with delay τ and optional SpecTrain-style prediction."""
    rng = np.random.default_rng(1)
    start = w0 if w0 is not None else rng.normal(size=tau + 2) + 1j * rng.normal(size=tau + 2)
    hist = deque([complex(x) for x in start], maxlen=tau + 2)  # w_{t−τ−1} .. w_t
    v = 0j
    out = []
    for _ in range(steps):
        w_stale, w_staler = hist[-1 - tau], hist[-2 - tau]
        # predicting velocity: the optimizer's own buffer that produced w_stale, i.e. (w_staler − w_stale)/η
        point = w_stale + kappa * s * (w_stale - w_staler) if s else w_stale
        g = z * point
        if form == "code":
            v = beta * v + g
            step = g + beta * v if nesterov_ else v
        else:
            v = beta * v + (1 - beta) * g
            step = (1 - beta) * g + beta * v if nesterov_ else v
        hist.append(hist[-1] - step)
        out.append(abs(hist[-1]))
    return np.array(out)


def _sim_pipemare(z, steps, *, tau_f, tau_b, rho, gamma, beta=0.0, correction=True):
    rng = np.random.default_rng(2)
    n = tau_f + 2
    hist = deque(list(rng.normal(size=n) + 1j * rng.normal(size=n)), maxlen=n)  # w_{t−τf−1} .. w_t
    deltas = deque([0j] * (tau_b + 1), maxlen=tau_b + 1)  # δ_{t−τb} .. δ_t
    v = 0j
    out = []
    for _ in range(steps):
        deltas.append(gamma * deltas[-1] + (1 - gamma) * (hist[-1] - hist[-2]))  # δ_t
        w_f = hist[-1 - tau_f]
        u_b = hist[-1 - tau_b] - ((tau_f - tau_b) * deltas[0] if correction else 0.0)  # uses δ_{t−τb}
        g = z * ((1 - rho) * w_f + rho * u_b)
        v = beta * v + g
        hist.append(hist[-1] - v)
        out.append(abs(hist[-1]))
    return np.array(out)


def _sim_adam_frozen(z, steps, *, beta1, tau):
    """Adam with a frozen preconditioner p: m ← β1 m + (1−β1)·g; w ← w − η·p·m, with η·p·λ = z."""
    rng = np.random.default_rng(3)
    hist = deque(list(rng.normal(size=tau + 1) + 1j * rng.normal(size=tau + 1)), maxlen=tau + 1)
    m, p, lam = 0j, 0.25, z / 0.25  # η = 1, p·λ = z
    out = []
    for _ in range(steps):
        m = beta1 * m + (1 - beta1) * lam * hist[0]
        hist.append(hist[-1] - p * m)
        out.append(abs(hist[-1]))
    return np.array(out)


def _growth(traj: np.ndarray) -> float:
    """Per-step growth factor from the maxima of two windows (robust to oscillating modes)."""
    T = len(traj)
    win = T // 8
    a = traj[T // 2 - win: T // 2].max()
    b = traj[T - win:].max()
    return float(np.exp((np.log(b) - np.log(a)) / (T // 2)))


CASES = [
    ("gd", gd(), lambda z, T: _sim_momentum(z, T)),
    ("delayed_gd3", delayed_gd(3), lambda z, T: _sim_momentum(z, T, tau=3)),
    ("hb", heavy_ball(0.6), lambda z, T: _sim_momentum(z, T, beta=0.6)),
    ("hb_delay2", heavy_ball(0.6, 2), lambda z, T: _sim_momentum(z, T, beta=0.6, tau=2)),
    ("hb_paper_delay2", heavy_ball(0.6, 2, form="paper"),
     lambda z, T: _sim_momentum(z, T, beta=0.6, tau=2, form="paper")),
    ("nesterov", nesterov(0.6), lambda z, T: _sim_momentum(z, T, beta=0.6, nesterov_=True)),
    ("nesterov_delay3", nesterov(0.6, 3), lambda z, T: _sim_momentum(z, T, beta=0.6, tau=3, nesterov_=True)),
    ("nesterov_paper_delay1", nesterov(0.6, 1, form="paper"),
     lambda z, T: _sim_momentum(z, T, beta=0.6, tau=1, nesterov_=True, form="paper")),
    ("pred_code", predicted_momentum(0.6, 3), lambda z, T: _sim_momentum(z, T, beta=0.6, tau=3, s=3)),
    ("pred_paper", predicted_momentum(0.6, 3, form="paper"),
     lambda z, T: _sim_momentum(z, T, beta=0.6, tau=3, s=3, form="paper")),
    ("pred_mixed", predicted_momentum(0.6, 3, velocity_scale=0.4),
     lambda z, T: _sim_momentum(z, T, beta=0.6, tau=3, s=3, kappa=0.4)),
    ("pred_gd_s2_tau3", predicted_momentum(0.0, 3, 2), lambda z, T: _sim_momentum(z, T, tau=3, s=2)),
    ("pipemare_nocorr", pipemare(4, 1, rho=0.6, gamma=0.3, correction=False),
     lambda z, T: _sim_pipemare(z, T, tau_f=4, tau_b=1, rho=0.6, gamma=0.3, correction=False)),
    ("pipemare_corr", pipemare(4, 1, rho=0.6, gamma=0.3),
     lambda z, T: _sim_pipemare(z, T, tau_f=4, tau_b=1, rho=0.6, gamma=0.3)),
    ("pipemare_corr_momentum", pipemare(3, 2, rho=0.8, gamma=0.7, beta=0.5),
     lambda z, T: _sim_pipemare(z, T, tau_f=3, tau_b=2, rho=0.8, gamma=0.7, beta=0.5)),
    ("adam_frozen", adam_frozen(0.9, 2), lambda z, T: _sim_adam_frozen(z, T, beta1=0.9, tau=2)),
]


@pytest.mark.parametrize("name,method,sim", CASES, ids=[c[0] for c in CASES])
def test_matrix_matches_direct_simulation(name, method, sim):
    """Simulated growth factor = spectral radius of the companion matrix; decays iff radius < 1."""
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    zstar = max_stable_step(method)
    scale = min(zstar, 4.0)
    # sample complex z around the real stable interval, keep points clearly inside or outside
    z = scale * (rng.uniform(-0.3, 1.4, 400) + 1j * rng.uniform(-0.7, 0.7, 400))
    rad = spectral_radius(method, z)
    inside = z[(rad > 0.6) & (rad < 0.985)][:5]
    outside = z[(rad > 1.015) & (rad < 1.5)][:5]
    assert len(inside) >= 3 and len(outside) >= 3, "sampling found too few points"
    T = 1200
    for zz in np.concatenate([inside, outside]):
        rate = _growth(sim(zz, T))
        r = float(spectral_radius(method, zz))
        assert (rate < 1) == (r < 1), f"{name} at z={zz:.4f}: simulated rate {rate:.4f}, radius {r:.4f}"
        assert abs(np.log(rate) - np.log(r)) < 0.004, f"{name} at z={zz:.4f}: rate {rate:.5f} vs radius {r:.5f}"


def test_companion_eigenvalues_are_roots_of_char_poly():
    rng = np.random.default_rng(0)
    for method in [delayed_gd(4), nesterov(0.7, 2), pipemare(5, 2), predicted_momentum(0.9, 3, form="paper")]:
        for z in rng.normal(size=4) + 1j * rng.normal(size=4):
            eig = np.sort_complex(np.linalg.eigvals(companion(method, z)))
            roots = np.sort_complex(np.roots(char_poly(method, z)))
            np.testing.assert_allclose(eig, roots, atol=1e-6)


def test_gd_region_is_unit_disk_around_one():
    z, mask = region_mask(gd(), (-0.5, 2.5), (-1.5, 1.5), (301, 301))
    d = np.abs(1 - z)
    band = np.abs(d - 1) < 0.02
    assert np.array_equal(mask[~band], (d < 1)[~band])
    assert np.array_equal(stable_mask(gd(), z)[~band], (d < 1)[~band])
    assert mask.mean() == pytest.approx(np.pi / 9, rel=0.01)   # the disk's area over the 3×3 window


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.6, 0.9, 0.99])
def test_heavy_ball_and_nesterov_real_axis_thresholds(beta):
    assert max_stable_step(heavy_ball(beta)) == pytest.approx(heavy_ball_threshold(beta), rel=1e-9)
    assert max_stable_step(heavy_ball(beta, form="paper")) == pytest.approx(2 * (1 + beta) / (1 - beta), rel=1e-9)
    assert max_stable_step(nesterov(beta)) == pytest.approx(nesterov_threshold(beta), rel=1e-9)
    # and the real-axis mask agrees with the condition 0 < z < 2(1+β) away from its end points
    x = np.linspace(-0.5, 2 * (1 + beta) + 0.5, 701)
    far = (np.abs(x) > 1e-3) & (np.abs(x - 2 * (1 + beta)) > 1e-3)
    expected = (x > 0) & (x < 2 * (1 + beta))
    assert np.array_equal(stable_mask(heavy_ball(beta), x)[far], expected[far])


@pytest.mark.parametrize("tau", range(9))
def test_delayed_gd_threshold_matches_closed_form(tau):
    z = max_stable_step(delayed_gd(tau))
    assert z == pytest.approx(delayed_gd_threshold(tau), rel=1e-10)
    assert z == pytest.approx(2 * np.cos(tau * np.pi / (2 * tau + 1)), rel=1e-10)   # Levin & May's form
    # momentum with β = 0 is the same method
    assert max_stable_step(heavy_ball(0.0, tau)) == pytest.approx(z, rel=1e-10)


@pytest.mark.parametrize("beta,tau", [(0.0, 1), (0.0, 4), (0.5, 2), (0.9, 3)])
def test_prediction_restores_delay_free_region_near_origin(beta, tau):
    """Constant-velocity extrapolation with s = τ is exact for linear trajectories, i.e. as |z| → 0.

    The region's boundary near z = 0 is Re z ≈ κ·|z|²; with delay κ grows by τ/(1−β) (a thinner region),
    with prediction s = τ it equals the delay-free value (1+β)/(2(1−β)²). Likewise the dominant root agrees
    with the delay-free one to O(z³) instead of O(z²).
    """
    th = np.array([1e-4])
    def curvature(m):
        zb = boundary_locus(m, th)[0]
        return zb.real / abs(zb) ** 2
    free = (1 + beta) / (2 * (1 - beta) ** 2)
    assert curvature(heavy_ball(beta, 0)) == pytest.approx(free, rel=1e-4)
    assert curvature(heavy_ball(beta, tau)) == pytest.approx(free + tau / (1 - beta), rel=1e-4)
    assert curvature(predicted_momentum(beta, tau)) == pytest.approx(free, rel=1e-4)
    # s ≠ τ does not restore it
    assert curvature(predicted_momentum(beta, tau, s=tau + 1)) == pytest.approx(free - 1 / (1 - beta), rel=1e-4)

    def dominant(m, z):
        r = np.roots(char_poly(m, z))
        return r[np.argmin(np.abs(r - 1))]
    errs = {}
    for key, m in {"pred": predicted_momentum(beta, tau), "stale": heavy_ball(beta, tau)}.items():
        errs[key] = [abs(dominant(m, z) - dominant(heavy_ball(beta, 0), z))
                        for z in (1e-3 * (1 - beta), 5e-4 * (1 - beta))]
    # halving z divides the error by ~8 (third order) with prediction, ~4 (second order) without
    assert errs["pred"][0] / errs["pred"][1] == pytest.approx(8, rel=0.05)
    assert errs["stale"][0] / errs["stale"][1] == pytest.approx(4, rel=0.05)


def test_paper_form_is_code_form_at_scaled_step():
    beta = 0.8
    z = np.array([0.01 + 0.02j, 0.3, 1.1 - 0.4j])
    for code, paper in [(heavy_ball(beta, 2), heavy_ball(beta, 2, form="paper")),
                        (predicted_momentum(beta, 2), predicted_momentum(beta, 2, form="paper"))]:
        np.testing.assert_allclose(char_poly(paper, z), char_poly(code, (1 - beta) * z))
    assert max_stable_step(adam_frozen(0.9, 3)) == pytest.approx(max_stable_step(heavy_ball(0.9, 3, form="paper")))


def test_pipemare_reduces_to_delayed_gd():
    for tf, tb in [(3, 1), (5, 5)]:
        m = pipemare(tf, tb, rho=0.0, gamma=0.5, correction=False)
        assert max_stable_step(m) == pytest.approx(delayed_gd_threshold(tf), rel=1e-9)
        # rho = 1 without correction: the backward delay alone matters
        m1 = pipemare(tf, tb, rho=1.0, correction=False)
        assert max_stable_step(m1) == pytest.approx(delayed_gd_threshold(tb), rel=1e-9)
    # equal delays: the correction term vanishes, only the EMA's root γ is added
    z = np.array([0.2 + 0.1j, 0.5])
    np.testing.assert_allclose(spectral_radius(pipemare(2, 2, gamma=0.3), z),
                               np.maximum(spectral_radius(delayed_gd(2), z), 0.3), rtol=1e-9)


@pytest.mark.parametrize("method", [heavy_ball(0.9, 8), nesterov(0.5, 3), pipemare(4, 2), predicted_momentum(0.9, 4),
                                    delayed_gd(6)], ids=lambda m: m.name)
def test_grid_methods_agree_off_the_boundary(method):
    zs = max_stable_step(method)
    re, im = (-0.4 * zs, 1.3 * zs), (-0.8 * zs, 0.8 * zs)
    z, locus = region_mask(method, re, im, (120, 150))
    schur = stable_mask(method, z)
    rad = spectral_radius(method, z)
    off = np.abs(rad - 1) > 1e-6
    assert np.array_equal(schur[off], rad[off] < 1)
    assert np.array_equal(locus[off], rad[off] < 1)
    assert 0.02 < schur.mean() < 0.98   # the window shows both sides
    # radius levels: the ρ-region of the locus method is where the radius < ρ
    _, lvl = region_mask(method, re, im, (120, 150), radius=0.99)
    off = np.abs(rad - 0.99) > 1e-6
    assert np.array_equal(lvl[off], rad[off] < 0.99)


def test_threshold_is_root_of_the_boundary():
    m = heavy_ball(0.7, 5)
    zs = max_stable_step(m)
    assert stable_mask(m, zs * (1 - 1e-7)) and not stable_mask(m, zs * (1 + 1e-7))
    assert spectral_radius(m, zs) == pytest.approx(1.0, abs=1e-9)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="beta"):
        heavy_ball(1.0)
    with pytest.raises(ValueError, match="tau"):
        delayed_gd(-1)
    with pytest.raises(ValueError, match="form"):
        nesterov(0.5, form="torch")
    with pytest.raises(ValueError, match="tau_bkwd"):
        pipemare(1, 2)
    with pytest.raises(ValueError, match="shape"):
        complex_grid((0, 1), (0, 1), (0, 3))
    with pytest.raises(ValueError, match="c must"):
        general(0.5, ())
    with pytest.raises(TypeError, match="z"):
        stable_mask(gd(), np.array(["a"]))


@pytest.mark.slow
def test_stability_figures_render_under_tiny(tmp_path, monkeypatch):
    """Every stability figure draws under `tiny`; the recorded numbers agree with the theory."""
    monkeypatch.setenv("PIPELAB_CACHE", "off")
    from pipelab.studies import figures

    names = [s.name for s in figures.available() if s.module.endswith(".stability")]
    assert len(names) == 8
    written = figures.render(names, "tiny", tmp_path)
    assert all(p.exists() for paths in written.values() for p in paths)
    import json
    thr = json.loads((tmp_path / "stability_threshold_vs_delay.json").read_text())["notes"]
    assert thr["max_abs_err_gd_vs_closed_form"] < 1e-12
    regions = json.loads((tmp_path / "stability_gd_regions.json").read_text())["notes"]
    assert regions["GD (τ = 0)"]["area"] == pytest.approx(np.pi, rel=1e-9)          # from region_area, not pixels
    assert regions["GD, delay τ = 1"]["area"] == pytest.approx(np.pi - 1.5 * np.sqrt(3.0), rel=1e-9)
    bis = json.loads((tmp_path / "stability_lr_bisection.json").read_text())["notes"]
    assert max(bis["max_rel_err"].values()) < 0.02   # tiny: 300 steps/trial, 1 % bisection tolerance


# ---------------------------------------------------------------------------------------------------------------
# region_mask against the exact per-point classification, on many random grids
# ---------------------------------------------------------------------------------------------------------------


def _every_builder():
    """One or more instances of every method builder, defaults included."""
    return [gd(), delayed_gd(0), delayed_gd(1), delayed_gd(3), heavy_ball(0.5), heavy_ball(0.9, 2),
            heavy_ball(0.5, 1, form="paper"), nesterov(0.5), nesterov(0.9, 3, form="paper"),
            predicted_momentum(0.0, 2), predicted_momentum(0.9, 3), predicted_momentum(0.5, 2, velocity_scale=0.5),
            pipemare(3, 1), pipemare(2, 0, rho=-1.0, gamma=0.3, beta=0.5), pipemare(3, 1, rho=0.2, correction=False),
            adam_frozen(), adam_frozen(0.9, 2), general(0.3, (0.7, 0.3), 1)]


def _distance_to_locus(method, z: np.ndarray, radius: float = 1.0, n: int = 1 << 17) -> np.ndarray:
    """Distance from each z to the polyline through n+1 samples of the (radius-)locus, finite edges only."""
    r = radius * np.exp(1j * np.linspace(0.0, 2.0 * np.pi, n + 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        c = -np.polyval(np.asarray(method.a), r) / np.polyval(np.asarray(method.b), r)
    p0, p1 = c[:-1], c[1:]
    ok = np.isfinite(p0) & np.isfinite(p1)
    p0, p1 = p0[ok], p1[ok]
    d = p1 - p0
    out = np.empty(z.shape)
    for i, zi in enumerate(z):
        t = np.clip(((zi - p0) * np.conj(d)).real / np.maximum(np.abs(d) ** 2, 1e-300), 0.0, 1.0)
        out[i] = np.min(np.abs(p0 + t * d - zi))
    return out


# Points may disagree only within this distance of the locus, relative to a grid cell. The default sampling keeps
# every locus edge reaching into the window shorter than a cell, so the polygon is within its chords' sagitta
# (~ curvature·cell²/8) of the true curve; on these grids the worst disagreement seen is 2e−7 cell from the locus.
_REL_TOL = 1e-3


@pytest.mark.parametrize("method", _every_builder(), ids=lambda m: m.name)
def test_region_mask_agrees_with_schur_cohn_on_random_grids(method):
    rng = np.random.default_rng(zlib.crc32(method.name.encode()))
    zs = max_stable_step(method)
    zs = zs if np.isfinite(zs) and zs > 0 else 2.0
    worst = 0.0
    for trial in range(40):
        shape = (int(rng.integers(1, 42)), int(rng.integers(1, 42)))
        if trial % 2 == 0:           # odd rows on a symmetric range: the real axis is a grid row
            shape = (2 * (shape[0] // 2) + 1, shape[1])
        lo = float(rng.choice([0.0, -0.05 * zs, rng.uniform(-0.6, 0.2) * zs]))
        re = (lo, float(rng.choice([zs, 2.02, rng.uniform(0.3, 1.6) * zs])))
        a = float(rng.choice([1.3, rng.uniform(0.1, 1.0) * zs]))
        im = (-a, a) if trial % 3 != 2 else (float(rng.uniform(-a, 0.0)), a)
        z, mask = region_mask(method, re, im, shape)
        ref = stable_mask(method, z)
        bad = mask != ref
        if bad.any():
            cell = min(abs(re[1] - re[0]) / max(shape[1] - 1, 1), abs(im[1] - im[0]) / max(shape[0] - 1, 1)) or 1.0
            dist = _distance_to_locus(method, z[bad]) / cell
            worst = max(worst, float(dist.max()))
            assert dist.max() <= _REL_TOL, (re, im, shape, z[bad][dist > _REL_TOL][:5])
    assert worst <= _REL_TOL


@pytest.mark.parametrize("method, re, im, wrong_before", [
    (delayed_gd(1), (-0.05, 1.25), (-1.3, 1.3), "-0.05 <= Re z < 0 on the real axis marked stable"),
    (heavy_ball(0.5), (0.0, 2.02), (-1.3, 1.3), "0 < Re z <= 2.02 on the real axis marked unstable"),
], ids=["delayed_gd-1", "heavy_ball-0.5"])
def test_region_mask_real_axis_row_on_locus_vertex(method, re, im, wrong_before):
    """1001×1001 grids whose middle row is the real axis, where the locus has a vertex (θ = 0)."""
    z, mask = region_mask(method, re, im, (1001, 1001))
    ref = stable_mask(method, z)
    bad = mask != ref
    # the only disagreements allowed are points lying on the locus itself (z = 0: the root r = 1)
    assert np.all(np.abs(z[bad]) < 1e-12), (wrong_before, z[bad][:5])
    axis = z[500]
    off = np.abs(axis) > 1e-12
    expected = (axis.real > 0) & (axis.real < max_stable_step(method))
    assert np.array_equal(mask[500][off], expected[off])


# every builder, called with its required arguments only (defaults for the rest)
_DEFAULTS = {"general": lambda: general(0.5, (1.0,)), "gd": gd, "delayed_gd": lambda: delayed_gd(1),
             "heavy_ball": lambda: heavy_ball(0.5), "nesterov": lambda: nesterov(0.5),
             "predicted_momentum": lambda: predicted_momentum(0.5, 2), "pipemare": lambda: pipemare(3, 1),
             "adam_frozen": adam_frozen, "nesterov_async": nesterov_async,
             "delay_compensated": lambda: delay_compensated(2), "error_feedback": error_feedback}


def test_defaults_cover_every_builder():
    from pipelab.stability import methods
    builders = {n for n in methods.__all__ if n not in ("LinearMethod", "MomentumForm", "char_poly", "companion")}
    assert builders == set(_DEFAULTS)


@pytest.mark.parametrize("method", [f() for f in _DEFAULTS.values()] + [
    pipemare(3, 1, correction=False),            # default ρ = 0.5: B(r) ∝ r(r² + 1) vanishes at r = ±i
    pipemare(1, 0, correction=False),            # B(r) ∝ r + 1 vanishes at r = −1
    general(0.3, (0.5, 0.5), 1),                 # B(r) ∝ r + 1
    predicted_momentum(0.5, 2, velocity_scale=-0.25),   # c = (1 − 0.5, 0.5): B(r) ∝ r + 1
    pipemare(3, 1, rho=0.5 + 1e-7, correction=False),  # B's roots at |r| ≈ 1 − 4e−7: locus unresolvable
    pipemare(3, 1, rho=0.5 + 1e-3, correction=False),  # |r| ≈ 1 − 4e−3: a large but resolvable loop
], ids=lambda m: m.name)
@pytest.mark.parametrize("radius", [1.0, 0.95])
def test_region_mask_accepts_every_builder_default(method, radius):
    """B(r) vanishing on |r| = ρ is handled (exact per-point fallback), not refused."""
    re, im = (-0.5, 3.0), (-1.5, 1.5)
    z, mask = region_mask(method, re, im, (61, 71), radius=radius)
    ref = stable_mask(method, z, radius=radius)
    bad = mask != ref
    if bad.any():       # only points on (within a thousandth of a cell of) the locus may disagree
        cell = min(3.5 / 70, 3.0 / 60)
        assert _distance_to_locus(method, z[bad], radius).max() <= _REL_TOL * cell
    rad = spectral_radius(method, z)
    off = np.abs(rad - radius) > 1e-9
    assert np.array_equal(ref[off], rad[off] < radius)


# ---------------------------------------------------------------------------------------------------------------
# region_area: closed forms, and the pixel count of a fine grid
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, radius, exact", [
    (gd(), 1.0, np.pi),                                          # |1 − z| < 1
    (gd(), 0.5, np.pi / 4),                                      # |1 − z| < ρ
    (delayed_gd(0), 1.0, np.pi),
    (delayed_gd(1), 1.0, np.pi - 1.5 * np.sqrt(3.0)),            # inner loop of z = e^{iθ} − e^{2iθ}, |θ| < π/3
    (heavy_ball(0.0), 1.0, np.pi),
    (heavy_ball(0.5), 1.0, np.pi * (1 - 0.25)),                  # ellipse, semi-axes 1 ± β
    (heavy_ball(0.9), 1.0, np.pi * (1 - 0.81)),
    (heavy_ball(0.5), 0.8, np.pi * (0.64 - 0.25 / 0.64)),        # semi-axes ρ ± β/ρ
    (heavy_ball(0.5), 0.6, 0.0),                                 # β > ρ²: the product of the roots is too big
    (adam_frozen(0.5), 1.0, np.pi * (1 - 0.25) / 0.25),          # heavy-ball at z·(1 − β): scaled by 1/(1 − β)²
    (LinearMethod("GD in r²", (1.0, 0.0, -1.0), (0.0, 0.0, 1.0)), 1.0, np.pi),   # P(r) = Q(r²), Q = GD
], ids=["gd", "gd-rho0.5", "delayed0", "delayed1", "hb0", "hb0.5", "hb0.9", "hb0.5-rho0.8", "hb0.5-empty",
        "adam0.5", "gd-in-r2"])
def test_region_area_matches_closed_forms(method, radius, exact):
    area = region_area(method, radius=radius)
    assert area == pytest.approx(exact, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("method", [f() for f in _DEFAULTS.values()] + [
    delayed_gd(3), nesterov(0.9, 2), predicted_momentum(0.9, 4), pipemare(3, 1, correction=False),
    pipemare(2, 0, rho=-1.0, gamma=0.3)], ids=lambda m: m.name)
def test_region_area_matches_pixel_count(method):
    """The area agrees with the pixel count of a fine grid within a quarter of the pixels along its edge."""
    area = region_area(method)
    loc = boundary_locus(method, 1 << 14)
    loc = loc[np.isfinite(loc) & (np.abs(loc) < 100)]
    z = complex_grid((loc.real.min(), loc.real.max()), (loc.imag.min(), loc.imag.max()), (201, 201))
    inside = z[stable_mask(method, z)]          # a coarse look first, to frame the region tightly
    pad = 0.05 * max(np.ptp(inside.real), np.ptp(inside.imag)) + 2 * abs(z[1, 1] - z[0, 0])
    re, im = (inside.real.min() - pad, inside.real.max() + pad), (inside.imag.min() - pad, inside.imag.max() + pad)
    z = complex_grid(re, im, (601, 601))
    mask = stable_mask(method, z)
    cell = (re[1] - re[0]) / 600 * (im[1] - im[0]) / 600
    edge = np.zeros_like(mask)
    edge[1:] |= mask[1:] != mask[:-1]
    edge[:-1] |= mask[1:] != mask[:-1]
    edge[:, 1:] |= mask[:, 1:] != mask[:, :-1]
    edge[:, :-1] |= mask[:, 1:] != mask[:, :-1]
    assert not mask[0].any() and not mask[-1].any() and not mask[:, 0].any() and not mask[:, -1].any()
    assert abs(mask.sum() * cell - area) <= edge.sum() * cell / 4
