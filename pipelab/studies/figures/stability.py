"""Figures of the stability notebook: stable regions in the complex ηλ plane and max stable steps vs delay."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes

from ...stability import (
    LinearMethod,
    delay_compensated,
    delayed_gd,
    delayed_gd_threshold,
    error_feedback,
    gd,
    heavy_ball,
    max_stable_step,
    nesterov,
    nesterov_async,
    pipemare,
    predicted_momentum,
    region_area,
    region_mask,
    stationary_variance,
)
from ..cache import cached
from ..config import from_preset
from ..stability_practice import least_squares_problem, max_stable_lr
from . import FigureOutput, register

__all__ = ["RegionsConfig", "ThresholdConfig", "BisectionConfig", "MomentumMapConfig", "MomentumDelayConfig",
           "momentum_claims_markdown", "modern_thresholds_markdown",
           "ModernStabilityConfig"]


@dataclass(frozen=True)
class RegionsConfig:
    grid: int = 600          # grid points per axis of each panel
    beta: float = 0.5        # momentum of the heavy-ball / Nesterov panels
    beta_pred: float = 0.9   # momentum of the prediction panel
    tau_pred: int = 4        # delay of the prediction panels


_REGIONS = {"tiny": RegionsConfig(grid=120), "quick": RegionsConfig(), "paper": RegionsConfig(grid=1200)}


def _extent(methods: list[LinearMethod], pad: float = 0.25) -> tuple[tuple[float, float], tuple[float, float]]:
    zs = max(max_stable_step(m) for m in methods)
    return (-pad * zs, (1 + pad) * zs), (-(0.5 + pad) * zs, (0.5 + pad) * zs)


def _draw_regions(ax: Axes, entries: list[tuple[LinearMethod, str]], grid: int, *,
                  extent: tuple[tuple[float, float], tuple[float, float]] | None = None, fill_first: bool = True
                  ) -> dict[str, dict[str, float]]:
    """Overlay the stable regions (filled lightly, outlined) of ``entries = [(method, label), ...]``."""
    re, im = extent if extent is not None else _extent([m for m, _ in entries])
    colors = sns.color_palette("colorblind", len(entries))
    records: dict[str, dict[str, float]] = {}
    handles = []
    for i, ((m, label), col) in enumerate(zip(entries, colors)):
        z, mask = region_mask(m, re, im, (grid, grid))
        ext = [re[0], re[1], im[0], im[1]]
        if i == 0 and fill_first:
            ax.contourf(mask.astype(float), levels=[0.5, 1.5], colors=[col], alpha=0.18, extent=ext)
        else:
            ax.contourf(mask.astype(float), levels=[0.5, 1.5], colors=[col], alpha=0.07, extent=ext)
        ax.contour(mask.astype(float), levels=[0.5], colors=[col], linewidths=1.6, extent=ext)
        zs = max_stable_step(m)
        if re[0] <= zs <= re[1]:
            ax.plot([zs], [0.0], "o", color=col, ms=4)
        handles.append(plt.Line2D([], [], color=col, lw=2, label=f"{label} (z*={zs:.3g})"))
        # the exact area of the whole region (Green's theorem on the locus), not a pixel count of the window
        records[label] = {"max_stable_real": zs, "area": region_area(m)}
    ax.axhline(0, color="0.6", lw=0.6, zorder=0)
    ax.axvline(0, color="0.6", lw=0.6, zorder=0)
    ax.set_xlim(*re)
    ax.set_ylim(*im)
    ax.set_aspect("equal")
    ax.set_xlabel("Re ηλ")
    ax.set_ylabel("Im ηλ")
    # below the panel: inside it the legend covers a region's outline (the no-delay disk reaches the upper right)
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    return records


@register("stability_gd_regions", "Stable regions of GD with gradient delay τ = 0..4 in the complex ηλ plane",
          budget={"tiny": 5, "quick": 3})
def stability_gd_regions(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_REGIONS, preset)
    fig, ax = plt.subplots(figsize=(6.2, 5.4), layout="constrained")
    entries = [(gd(), "GD (τ = 0)")] + [(delayed_gd(t), f"GD, delay τ = {t}") for t in range(1, 5)]
    rec = _draw_regions(ax, entries, cfg.grid, extent=((-0.6, 2.4), (-1.4, 1.4)))
    ax.set_title("Gradient descent with stale gradients: $w_{t+1} = w_t - \\eta\\lambda\\, w_{t-\\tau}$\n"
                 "stable where all roots of $r^{\\tau+1} - r^{\\tau} + \\eta\\lambda$ lie inside $|r| < 1$; "
                 "dots: largest stable real ηλ", fontsize=9)
    return FigureOutput(fig, cfg, None, data=rec, notes=rec)


@register("stability_momentum_regions", "Stable regions of heavy-ball and Nesterov momentum, with and without delay",
          budget={"tiny": 5, "quick": 4})
def stability_momentum_regions(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_REGIONS, preset)
    b = cfg.beta
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8), layout="constrained")
    rec = {}
    rec["delay-free"] = _draw_regions(axes[0], [(gd(), "GD"), (heavy_ball(b), f"heavy-ball β={b:g}"),
                                                (nesterov(b), f"Nesterov β={b:g}")], cfg.grid)
    axes[0].set_title("No delay (torch's momentum: v ← βv + g, w ← w − ηv)", fontsize=9)
    hb = [(heavy_ball(b, t), f"heavy-ball τ={t}") for t in (1, 2, 4)]
    nv = [(nesterov(b, t), f"Nesterov τ={t}") for t in (1, 2, 4)]
    ext = _extent([m for m, _ in hb + nv])
    rec["heavy-ball"] = _draw_regions(axes[1], hb, cfg.grid, extent=ext)
    axes[1].set_title(f"Heavy-ball β={b:g} with delay τ", fontsize=9)
    rec["nesterov"] = _draw_regions(axes[2], nv, cfg.grid, extent=ext)
    axes[2].set_title(f"Nesterov β={b:g} with delay τ", fontsize=9)
    fig.suptitle("Heavy-ball and Nesterov momentum without delay (left) and with gradient delay τ (middle, right); "
                 "ηλ in torch's lr units (effective step = η/(1−β))", fontsize=10)
    return FigureOutput(fig, cfg, None, data=rec, notes=rec)


@register("stability_prediction_regions",
          "Stable regions with SpecTrain/PipeOptim weight prediction and with PipeMare's discrepancy correction",
          budget={"tiny": 5, "quick": 4})
def stability_prediction_regions(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_REGIONS, preset)
    t, b = cfg.tau_pred, cfg.beta_pred
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8), layout="constrained")
    rec = {}
    rec["gd"] = _draw_regions(axes[0], [(delayed_gd(t), f"GD τ={t}, stale"),
                                        (predicted_momentum(0.0, t), f"GD τ={t}, predicted s={t}"),
                                        (delayed_gd(0), "GD, no delay")], cfg.grid, extent=((-0.4, 2.2), (-1.2, 1.2)))
    axes[0].set_title(f"Plain SGD, delay τ={t}: predict ŵ = w + s·(last update)", fontsize=9)
    entries = [(heavy_ball(b, t), f"stale (τ={t})"),
               (predicted_momentum(b, t), f"predicted, code: ŵ = w − sηv, s={t}"),
               (predicted_momentum(b, t, velocity_scale=1 - b), "predicted with EMA v on torch SGD")]
    rec["momentum"] = _draw_regions(axes[1], entries, cfg.grid)
    axes[1].set_title(f"Momentum SGD β={b:g}, delay τ={t} (no delay: z* = {2 * (1 + b):g})", fontsize=9)
    tf, tb, rho = 3, 1, -1.0
    entries = [(pipemare(tf, tb, rho=rho, correction=False), f"τf={tf}, τb={tb}, uncorrected"),
               (pipemare(tf, tb, rho=rho, gamma=0.5), "with discrepancy correction, γ=0.5"),
               (delayed_gd(tf), f"GD τ={tf} (no discrepancy)")]
    rec["pipemare"] = _draw_regions(axes[2], entries, cfg.grid)
    axes[2].set_title(f"PipeMare discrepancy, sensitivity Δ/λ = {rho:g}", fontsize=9)
    return FigureOutput(fig, cfg, None, data=rec, notes=rec)


@dataclass(frozen=True)
class ThresholdConfig:
    taus: int = 9                        # τ = 0..taus−1
    betas: tuple[float, ...] = (0.5, 0.9)


_THRESH = {"tiny": ThresholdConfig(taus=5), "quick": ThresholdConfig(), "paper": ThresholdConfig(taus=17)}


@register("stability_threshold_vs_delay", "Largest stable real ηλ vs delay τ (root-finding), with the closed form",
          budget={"tiny": 5, "quick": 3})
def stability_threshold_vs_delay(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_THRESH, preset)
    taus = np.arange(cfg.taus)
    curves: dict[str, list[float]] = {
        "GD": [max_stable_step(delayed_gd(int(t))) for t in taus],
        "GD, predicted s=τ": [max_stable_step(predicted_momentum(0.0, int(t))) for t in taus]}
    for b in cfg.betas:
        curves[f"heavy-ball β={b:g}"] = [max_stable_step(heavy_ball(b, int(t))) for t in taus]
        curves[f"Nesterov β={b:g}"] = [max_stable_step(nesterov(b, int(t))) for t in taus]
        curves[f"heavy-ball β={b:g}, predicted s=τ"] = [max_stable_step(predicted_momentum(b, int(t))) for t in taus]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    fine = np.linspace(0, taus[-1], 400)
    ax.plot(fine, 2 * np.sin(np.pi / (2 * (2 * fine + 1))), color="k", lw=1, ls=":",
            label="closed form 2·sin(π/(2(2τ+1)))")
    styles = {"GD": ("o", "-"), "predicted": ("s", "--"), "Nesterov": ("^", "-.")}
    colors = sns.color_palette("colorblind", len(curves))
    for (name, ys), col in zip(curves.items(), colors):
        kind = "predicted" if "predicted" in name else "Nesterov" if "Nesterov" in name else "GD"
        mk, ls = styles[kind]
        ax.plot(taus, ys, marker=mk, ls=ls, color=col, ms=4, lw=1.2, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("gradient delay τ (optimizer steps)")
    ax.set_ylabel("largest stable real ηλ  (η·λ_max with torch's lr)")
    ax.set_title("Max stable step vs staleness (markers: boundary-locus root-finding)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    closed = [delayed_gd_threshold(int(t)) for t in taus]
    lines = ["tau,closed_form," + ",".join(f'"{k}"' for k in curves)]
    for i, t in enumerate(taus):
        lines.append(f"{t},{closed[i]:.10g}," + ",".join(f"{curves[k][i]:.10g}" for k in curves))
    notes = {"closed_form": closed, **curves,
             "max_abs_err_gd_vs_closed_form": float(np.max(np.abs(np.array(curves["GD"]) - closed)))}
    return FigureOutput(fig, cfg, None, tables={"csv": "\n".join(lines) + "\n"}, data=curves, notes=notes)


@dataclass(frozen=True)
class BisectionConfig:
    taus: int = 9
    dim: int = 20
    lam_max: float = 1.0
    lam_min: float = 0.01
    steps: int = 2000
    rel_tol: float = 1e-3
    momentum: float = 0.9
    seed: int = 0


_BISECT = {"tiny": BisectionConfig(taus=3, dim=4, steps=300, rel_tol=1e-2), "quick": BisectionConfig(),
           "paper": BisectionConfig(taus=17, dim=50, steps=6000, rel_tol=2e-4)}


def _bisection_sweep(cfg: BisectionConfig) -> dict[str, list[float]]:
    prob = least_squares_problem(cfg.dim, lam_max=cfg.lam_max, lam_min=cfg.lam_min, seed=cfg.seed)
    out: dict[str, list[float]] = {"tau": [], "sgd": [], "momentum": [], "momentum_pred": []}
    for t in range(cfg.taus):
        out["tau"].append(t)
        kw: dict[str, Any] = dict(steps=cfg.steps, rel_tol=cfg.rel_tol)
        out["sgd"].append(max_stable_lr(prob, t, **kw) * prob.lam_max)
        out["momentum"].append(max_stable_lr(prob, t, momentum=cfg.momentum, **kw) * prob.lam_max)
        out["momentum_pred"].append(max_stable_lr(prob, t, momentum=cfg.momentum, predict_s=t, **kw) * prob.lam_max)
    return out


@register("stability_lr_bisection",
          "Largest stable learning rate of delayed torch.optim.SGD on least squares (bisection) vs theory",
          budget={"tiny": 10, "quick": 42})  # quick: 41 CPU s measured on one thread
def stability_lr_bisection(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_BISECT, preset)
    meas = cached("stability_lr_bisection", cfg, _bisection_sweep)
    taus = np.array(meas["tau"])
    b = cfg.momentum
    theory = {"sgd": [max_stable_step(delayed_gd(int(t))) for t in taus],
              "momentum": [max_stable_step(heavy_ball(b, int(t))) for t in taus],
              "momentum_pred": [max_stable_step(predicted_momentum(b, int(t))) for t in taus]}
    labels = {"sgd": "SGD", "momentum": f"SGD momentum={b:g}", "momentum_pred": f"momentum={b:g} + prediction s=τ"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    colors = sns.color_palette("colorblind", 3)
    for key, col in zip(labels, colors):
        axes[0].plot(taus, theory[key], "-", color=col, lw=1.2, label=f"{labels[key]}: theory")
        axes[0].plot(taus, meas[key], "x", color=col, ms=7, mew=1.5, label=f"{labels[key]}: bisection")
        rel = np.array(meas[key]) / np.array(theory[key]) - 1
        axes[1].plot(taus, 100 * rel, "o-", color=col, ms=4, label=labels[key])
    axes[0].set_yscale("log")
    axes[0].set_xlabel("gradient delay τ")
    axes[0].set_ylabel("largest stable η·λ_max")
    axes[0].set_title(f"torch.optim.SGD on least squares (d={cfg.dim}, λ ∈ [{cfg.lam_min:g}, {cfg.lam_max:g}])",
                      fontsize=9)
    axes[0].legend(fontsize=7)
    axes[1].axhline(0, color="0.5", lw=0.8)
    tol = 100 * cfg.rel_tol
    axes[1].axhspan(-tol, tol, color="0.85", zorder=0, label=f"bisection tolerance ±{tol:g}%")
    axes[1].set_xlabel("gradient delay τ")
    axes[1].set_ylabel("measured / theory − 1  (%)")
    axes[1].set_title(f"Bisection ({cfg.steps} steps per trial) vs boundary-locus threshold", fontsize=9)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    buf = io.StringIO()
    buf.write("tau,closed_form_gd,theory_gd,measured_gd,theory_momentum,measured_momentum,"
              "theory_momentum_pred,measured_momentum_pred\n")
    for i, t in enumerate(taus):
        buf.write(f"{t},{delayed_gd_threshold(int(t)):.6f},{theory['sgd'][i]:.6f},{meas['sgd'][i]:.6f},"
                  f"{theory['momentum'][i]:.6f},{meas['momentum'][i]:.6f},"
                  f"{theory['momentum_pred'][i]:.6f},{meas['momentum_pred'][i]:.6f}\n")
    notes = {"measured": meas, "theory": theory,
             "max_rel_err": {k: float(np.max(np.abs(np.array(meas[k]) / np.array(theory[k]) - 1))) for k in theory}}
    return FigureOutput(fig, cfg, cfg.seed, tables={"csv": buf.getvalue()}, data={"measured": meas, "theory": theory},
                        notes=notes)


@dataclass(frozen=True)
class MomentumMapConfig:
    n_beta: int = 40
    beta_max: float = 0.98
    taus: int = 9


_MAP = {"tiny": MomentumMapConfig(n_beta=8, taus=4), "quick": MomentumMapConfig(),
        "paper": MomentumMapConfig(n_beta=100, beta_max=0.99, taus=17)}


def _momentum_map(cfg: MomentumMapConfig) -> dict[str, np.ndarray]:
    betas = np.linspace(0.0, cfg.beta_max, cfg.n_beta)
    taus = np.arange(cfg.taus)
    zmap = np.array([[max_stable_step(heavy_ball(float(b), int(t))) for b in betas] for t in taus])
    return {"betas": betas, "taus": taus, "z": zmap}


@register("stability_momentum_map", "Max stable real step of delayed heavy-ball over momentum β and delay τ",
          budget={"tiny": 5, "quick": 4})
def stability_momentum_map(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_MAP, preset)
    res = cached("stability_momentum_map", cfg, _momentum_map)
    betas, taus, zmap = res["betas"], res["taus"], res["z"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    db = betas[1] - betas[0] if len(betas) > 1 else 1.0
    ext = [betas[0] - db / 2, betas[-1] + db / 2, taus[0] - 0.5, taus[-1] + 0.5]
    im0 = axes[0].imshow(np.log10(zmap), origin="lower", aspect="auto", extent=ext, cmap="viridis")
    cs = axes[0].contour(betas, taus, np.log10(zmap), levels=[-2, -1.5, -1, -0.5, 0, 0.5], colors="w", linewidths=0.7,
                         linestyles="solid")
    axes[0].clabel(cs, fmt=lambda v: f"{10 ** v:.2g}", fontsize=7)
    fig.colorbar(im0, ax=axes[0], label="log10 z*  (z* = largest stable η·λ, torch lr)")
    axes[0].set_title("Heavy-ball, v ← βv + g: largest stable ηλ", fontsize=9)
    ratio = zmap / zmap[0:1, :]
    im1 = axes[1].imshow(np.log10(ratio), origin="lower", aspect="auto", extent=ext, cmap="magma")
    cs = axes[1].contour(betas, taus, ratio, levels=[0.01, 0.03, 0.1, 0.3], colors="w", linewidths=0.7,
                         linestyles="solid")
    axes[1].clabel(cs, fmt=lambda v: f"{v:g}", fontsize=7)
    fig.colorbar(im1, ax=axes[1], label="log10 z*(β, τ) / z*(β, 0)")
    axes[1].set_title("Learning-rate cut needed vs the same β without delay", fontsize=9)
    for ax in axes:
        ax.grid(False)
        ax.set_xlabel("momentum β")
        ax.set_ylabel("gradient delay τ")
    fig.tight_layout()
    notes = {"tau_rows": taus.tolist(), "beta_cols": [round(float(b), 4) for b in betas],
             "z_star_beta0.9_index": int(np.argmin(np.abs(betas - 0.9)))}
    return FigureOutput(fig, cfg, None, data=res, notes=notes)


@dataclass(frozen=True)
class MomentumDelayConfig:
    betas: tuple[float, ...] = (0.0, 0.5, 0.9, 0.99)
    taus: int = 9                          # τ = 0..taus−1
    z_noise: float = 0.1                   # effective step of the noise-floor panel
    n_eff: int = 120                       # effective steps of the stable-delay panel (log-spaced)
    eff_range: tuple[float, float] = (0.05, 3.0)


_MDELAY = {"tiny": MomentumDelayConfig(n_eff=30), "quick": MomentumDelayConfig(),
           "paper": MomentumDelayConfig(n_eff=400)}


def _extra_delay_threshold(x: np.ndarray | float) -> np.ndarray:
    """Levin–May's ``2·sin(π/(2(2x+1)))`` at a real delay x (the "momentum = extra delay β/(1−β)" reading)."""
    x = np.asarray(x, dtype=float)
    return 2.0 * np.sin(np.pi / (2.0 * (2.0 * x + 1.0)))


def _momentum_delay(cfg: MomentumDelayConfig) -> dict[str, Any]:
    taus = list(range(cfg.taus))
    rows: list[dict[str, float]] = []
    sync = stationary_variance(gd(), cfg.z_noise)          # synchronous SGD at the same effective step
    for b in cfg.betas:
        for t in taus:
            z_torch = max_stable_step(heavy_ball(b, t))
            z_eff = max_stable_step(heavy_ball(b, t, form="paper"))
            z_nadam = max_stable_step(nesterov_async(b, t))
            var = stationary_variance(heavy_ball(b, t, form="paper"), cfg.z_noise, noise=(1.0 - b,))
            var_n = stationary_variance(nesterov_async(b, t), cfg.z_noise, noise=(1.0 - b * b, -(1.0 - b) * b))
            rows.append({"beta": b, "tau": t, "z_star_torch": z_torch, "z_star_eff": z_eff,
                         "z_star_eff_nadam": z_nadam,
                         "z_star_gd_extra_delay": float(_extra_delay_threshold(t + b / (1.0 - b))),
                         "noise_ratio": var / sync, "noise_ratio_nadam": var_n / sync})
    eff = np.geomspace(cfg.eff_range[0], cfg.eff_range[1], cfg.n_eff)
    stable_delay: dict[str, list[int]] = {}
    for b in cfg.betas:
        zs = np.array([r["z_star_eff"] for r in rows if r["beta"] == b])
        # the largest τ such that every delay up to τ is stable at this effective step (−1: not even τ = 0)
        stable_delay[f"{b:g}"] = [int(np.argmin(np.append(e < zs, False))) - 1 for e in eff]
    return {"rows": rows, "eff": eff.tolist(), "stable_delay": stable_delay}


@register("stability_momentum_delay",
          "Momentum as extra delay vs momentum absorbing staleness: heavy-ball and NAdam in torch and effective units",
          budget={"tiny": 5, "quick": 5})
def stability_momentum_delay(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_MDELAY, preset)
    res = cached("stability_momentum_delay", cfg, _momentum_delay)
    rows, eff, sdel = res["rows"], np.array(res["eff"]), res["stable_delay"]
    taus = np.arange(cfg.taus)
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    colors = sns.color_palette("colorblind", len(cfg.betas))

    def col(b: float, key: str) -> np.ndarray:
        return np.array([r[key] for r in rows if r["beta"] == b])

    fine = np.linspace(0, taus[-1], 300)
    for b, c in zip(cfg.betas, colors):
        axes[0, 0].plot(taus, col(b, "z_star_torch"), "o-", color=c, ms=4, label=f"heavy-ball β={b:g}")
        axes[0, 0].plot(fine, _extra_delay_threshold(fine + b / (1 - b)), ":", color=c, lw=1.2)
        axes[0, 1].plot(taus, col(b, "z_star_eff"), "o-", color=c, ms=4, label=f"heavy-ball β={b:g}")
        axes[0, 1].plot(taus, col(b, "z_star_eff_nadam"), "^--", color=c, ms=4, lw=1, label=f"NAdam β1={b:g}")
        axes[1, 0].step(eff, sdel[f"{b:g}"], where="post", color=c, lw=1.6, label=f"β={b:g}")
        axes[1, 1].plot(taus, col(b, "noise_ratio"), "o-", color=c, ms=4, label=f"heavy-ball β={b:g}")
        axes[1, 1].plot(taus, col(b, "noise_ratio_nadam"), "^--", color=c, ms=4, lw=1, label=f"NAdam β1={b:g}")
    axes[0, 0].set_yscale("log")
    axes[0, 0].set_ylabel("largest stable η·λ  (torch lr: v ← βv + g)")
    axes[0, 0].set_title("Torch units: momentum ≈ extra delay β/(1−β)\n"
                         "(dotted: delayed GD at delay τ + β/(1−β), Levin–May)", fontsize=9)
    axes[0, 1].set_yscale("log")
    axes[0, 1].set_ylabel("largest stable effective step η·λ/(1−β)")
    axes[0, 1].set_title("Effective-step units: v ← βv + (1−β)g (NAdam: preconditioned step)", fontsize=9)
    axes[1, 0].set_xscale("log")
    axes[1, 0].set_xlabel("effective step η·λ/(1−β)")
    axes[1, 0].set_ylabel(f"largest stable delay τ (capped at {cfg.taus - 1}; −1: unstable at τ = 0)")
    axes[1, 0].set_title("At a fixed effective step: how much delay each β tolerates (heavy-ball)", fontsize=9)
    axes[1, 1].set_yscale("log")
    axes[1, 1].set_ylabel("stationary Var w / that of synchronous SGD")
    axes[1, 1].set_title(f"Noise floor at effective step {cfg.z_noise:g} (gradient noise, linear model)",
                         fontsize=9)
    for ax in (axes[0, 0], axes[0, 1], axes[1, 1]):
        ax.set_xlabel("gradient delay τ (optimizer steps)")
    for ax in axes.ravel():
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    keys = ["beta", "tau", "z_star_torch", "z_star_eff", "z_star_eff_nadam", "z_star_gd_extra_delay", "noise_ratio",
            "noise_ratio_nadam"]
    lines = [",".join(keys)] + [",".join(f"{r[k]:.10g}" for k in keys) for r in rows]
    sd_lines = ["z_eff," + ",".join(f"beta={b:g}" for b in cfg.betas)]
    sd_lines += [f"{e:.6g}," + ",".join(str(sdel[f'{b:g}'][i]) for b in cfg.betas) for i, e in enumerate(eff)]
    notes = {"z_noise": cfg.z_noise, "rows": rows}
    return FigureOutput(fig, cfg, None, tables={"csv": "\n".join(lines) + "\n",
                                                "stable_delay.csv": "\n".join(sd_lines) + "\n"},
                        data=res, notes=notes)


@dataclass(frozen=True)
class ModernStabilityConfig:
    taus: int = 9                 # τ = 0..taus−1
    grid: int = 500               # region grid points per axis
    tau_region: int = 1           # delay of the region panel (PipeDream-2BW's one-step delay)


_MODERN = {"tiny": ModernStabilityConfig(grid=120), "quick": ModernStabilityConfig(),
           "paper": ModernStabilityConfig(grid=1000)}


def _modern_methods() -> dict[str, Any]:
    """Label → builder of τ, every method in effective-step units (smoothed-gradient form; NAdam preconditioned)."""
    return {
        "GD (stale)": lambda t: delayed_gd(t),
        "heavy-ball β=0.9": lambda t: heavy_ball(0.9, t, form="paper"),
        "NAdam β1=0.9": lambda t: nesterov_async(0.9, t),
        "NAdam β1=0.99": lambda t: nesterov_async(0.99, t),
        "DC λc=0.5": lambda t: delay_compensated(t, 0.5),
        "DC λc=0.9": lambda t: delay_compensated(t, 0.9),
        "DC λc=0.5, heavy-ball β=0.9": lambda t: delay_compensated(t, 0.5, beta=0.9, form="paper"),
        "EF α=1": lambda t: error_feedback(t, 1.0),
        "EF α=τ (= prediction s=τ)": lambda t: error_feedback(t, float(max(t, 1))),
        "EF α=1, heavy-ball β=0.9": lambda t: error_feedback(t, 1.0, beta=0.9, form="paper"),
    }


@register("stability_modern_vs_delay",
          "Stable regions at one-step delay and max stable step vs τ for NAdam look-ahead, delay compensation and "
          "error feedback",
          budget={"tiny": 5, "quick": 4})
def stability_modern_vs_delay(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_MODERN, preset)
    taus = np.arange(cfg.taus)
    builders = _modern_methods()
    curves = {name: [max_stable_step(f(int(t))) for t in taus] for name, f in builders.items()}
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.4))
    t1 = cfg.tau_region
    entries = [(delayed_gd(t1), f"GD τ={t1}, stale"), (delay_compensated(t1, 0.5), f"DC λc=0.5, τ={t1}"),
               (error_feedback(t1, 1.0), f"EF α=1, τ={t1}"), (gd(), "GD, no delay")]
    rec = _draw_regions(axes[0], entries, cfg.grid, extent=((-0.6, 2.6), (-1.6, 1.6)))
    axes[0].set_title(f"Plain SGD with delay τ={t1}: ideal delay compensation and error feedback", fontsize=9)
    colors = sns.color_palette("colorblind", len(curves))
    for (name, ys), c in zip(curves.items(), colors):
        ls = "--" if "NAdam" in name else "-." if "EF" in name else ":" if "DC" in name else "-"
        axes[1].plot(taus, ys, marker="o", ls=ls, color=c, ms=4, lw=1.3, label=name)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("gradient delay τ (optimizer steps)")
    axes[1].set_ylabel("largest stable effective step  η·λ/(1−β)  (NAdam: η·λ/√v̂)")
    axes[1].set_title("Max stable step vs staleness (boundary-locus root-finding)", fontsize=9)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    lines = ["tau," + ",".join(f'"{k}"' for k in curves)]
    lines += [f"{t}," + ",".join(f"{curves[k][i]:.10g}" for k in curves) for i, t in enumerate(taus)]
    notes = {"regions_tau": t1, "regions": rec, **curves}
    return FigureOutput(fig, cfg, None, tables={"csv": "\n".join(lines) + "\n"}, data=curves, notes=notes)


def _read_csv(text: str) -> list[dict[str, float]]:
    import csv

    return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]


def momentum_claims_markdown(csv_text: str, stable_delay_csv: str, z_noise: float | None = None) -> str:
    """The two momentum claims decided from ``stability_momentum_delay``'s CSVs (numbers generated, not typed).

    Args:
        csv_text: the figure's ``csv`` table (one row per β, τ).
        stable_delay_csv: its ``stable_delay.csv`` table (largest stable delay per effective step and β).
        z_noise: the effective step of the noise-floor columns (the figure's config), quoted when given.

    Returns:
        Markdown bullets for notebook 03.
    """
    rows = _read_csv(csv_text)
    betas = sorted({r["beta"] for r in rows})
    taus = sorted({int(r["tau"]) for r in rows})
    at = {(r["beta"], int(r["tau"])): r for r in rows}
    bmax, tmax = betas[-1], taus[-1]
    out = []
    cuts = ", ".join(f"{at[(b, 0)]['z_star_torch'] / at[(b, 1)]['z_star_torch']:.3g}× at β={b:g}"
                     for b in betas if b > 0)
    ratio = {(b, t): at[(b, t)]["z_star_torch"] / at[(b, t)]["z_star_gd_extra_delay"] for b in betas if b > 0
             for t in taus if t >= 1}
    r1 = [ratio[(b, 1)] for b in betas if b > 0]
    worst = min(ratio, key=lambda k: ratio[k])
    out.append(f"- **Torch's learning rate (v ← βv + g).** One step of delay cuts the largest stable ηλ by {cuts}; "
               f"at τ = {tmax}, z* is {at[(bmax, tmax)]['z_star_torch']:.3g} for β = {bmax:g} against "
               f"{at[(0.0, tmax)]['z_star_torch']:.3g} for plain SGD. Reading momentum as extra delay β/(1−β) "
               f"(Levin–May at τ + β/(1−β)) gives the right order at τ = 1 (exact/predicted "
               f"{min(r1):.2f}–{max(r1):.2f} over β > 0) but is optimistic: the exact z* is as low as "
               f"{ratio[worst]:.2f}× the prediction (β = {worst[0]:g}, τ = {worst[1]}). In these units the "
               f"linear-analysis claim holds, and understates the damage.")
    rel = {t: at[(bmax, t)]["z_star_eff"] / at[(0.0, t)]["z_star_eff"] for t in taus if t >= 1}
    t_worst = min(rel, key=lambda t: rel[t])
    one = [at[(b, 1)]["z_star_eff"] for b in betas]
    one_txt = (f"z*_eff = {one[0]:.4g} for every β" if max(one) - min(one) < 1e-6 * max(one)
               else f"z*_eff between {min(one):.4g} and {max(one):.4g}")
    out.append(f"- **Effective step η/(1−β).** At τ = 1, {one_txt}; for larger delays β = {bmax:g} keeps "
               f"{100 * min(rel.values()):.0f}–{100 * max(rel.values()):.0f} % of plain SGD's stable step (least "
               f"at τ = {t_worst}). In the units momentum users tune in, momentum costs at most "
               f"{100 * (1 - min(rel.values())):.0f} % of the stable step: most of the \"extra delay\" is the "
               f"(1−β) change of units, not a loss of stability.")
    sd = _read_csv(stable_delay_csv)
    cols = [f"beta={b:g}" for b in betas]
    grow = [r for r in sd if any(r[cols[i + 1]] > r[cols[i]] for i in range(len(cols) - 1))]
    shrink = sum(r[cols[-1]] < r[cols[0]] for r in sd)
    loss = max(r[cols[0]] - r[cols[-1]] for r in sd)
    grow_txt = (f"grows the largest stable delay at {len(grow)} of them (all at effective steps ≥ "
                f"{min(r['z_eff'] for r in grow):.3g}, where plain SGD is unstable even without delay)"
                if grow else "never grows the largest stable delay")
    out.append(f"- **At a fixed effective step** (heavy-ball, {len(sd)} steps from {sd[0]['z_eff']:.3g} to "
               f"{sd[-1]['z_eff']:.3g}, delays up to {tmax}): raising β {grow_txt}, and shrinks it (β = {bmax:g} vs "
               f"0) at {shrink}, by at most {loss:.0f} step(s) of delay.")
    nad = {t: at[(bmax, t)]["z_star_eff_nadam"] / at[(bmax, t)]["z_star_eff"] for t in taus}
    helps = [t for t in taus if t >= 1 and nad[t] > 1.15]
    nad_one = ", ".join(f"{at[(b, 1)]['z_star_eff_nadam']:.3g} (β1={b:g})" for b in betas)
    out.append(f"- **NAdam's look-ahead** (the 2505.01099 code's optimizer) at τ = 1: z*_eff = {nad_one} — raising β1 "
               f"*grows* the stable step under delay. At β1 = {bmax:g} it beats heavy-ball by more than 15 % for "
               f"τ ∈ {{{', '.join(map(str, helps))}}} and by {100 * (nad[tmax] - 1):.0f} % at τ = {tmax}.")
    hb1 = {b: at[(b, 1)]["noise_ratio"] for b in betas}
    na1 = {b: at[(b, 1)]["noise_ratio_nadam"] for b in betas}
    below_hb = [t for t in taus if at[(bmax, t)]["noise_ratio"] < at[(0.0, t)]["noise_ratio"]]
    below_na = [t for t in taus if at[(bmax, t)]["noise_ratio_nadam"] < at[(0.0, t)]["noise_ratio"]]
    where = f" {z_noise:g}" if z_noise is not None else ""
    out.append(f"- **Noise floor at a fixed effective step{where}** (stationary variance under gradient noise, "
               f"relative to synchronous SGD at the same effective step): at τ = 1, plain SGD {hb1[0.0]:.3f}, "
               f"heavy-ball β = {bmax:g} {hb1[bmax]:.3f}, NAdam β1 = {bmax:g} {na1[bmax]:.3f}. High momentum has a "
               f"lower floor than plain SGD at the same delay for τ ∈ {{{', '.join(map(str, below_hb))}}} "
               f"(heavy-ball) and τ ∈ {{{', '.join(map(str, below_na))}}} (NAdam), a higher one beyond.")
    return "\n".join(out)


def modern_thresholds_markdown(csv_text: str) -> str:
    """Max stable step of each method at τ = 1 and the last τ, relative to stale GD, from the figure's CSV."""
    rows = _read_csv(csv_text)
    taus = [int(r["tau"]) for r in rows]
    names = [k for k in rows[0] if k != "tau"]
    tmax = max(taus)
    by = {int(r["tau"]): r for r in rows}
    base = "GD (stale)"
    lines = ["| method | z* at τ = 0 | z* at τ = 1 | vs stale GD (τ = 1) | z* at τ = " + str(tmax) + " | vs stale GD "
             f"(τ = {tmax}) |", "|---|---|---|---|---|---|"]
    for n in names:
        lines.append(f"| {n} | {by[0][n]:.3g} | {by[1][n]:.3g} | {by[1][n] / by[1][base]:.2f}× | {by[tmax][n]:.3g} | "
                     f"{by[tmax][n] / by[tmax][base]:.2f}× |")
    return "\n".join(lines)
