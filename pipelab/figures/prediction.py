"""Figures of the prediction-error notebook: how well can a stage predict its weights s updates ahead?

- ``prediction_rmse_<optimizer>`` (SGDM, Adam, AdamW, RMSprop): SpecTrain Fig. 8 analogue — overall RMSE of
  predicted and of stale weights against the true future weights over training, s = 1, 2, 3.
- ``prediction_ratio_summary``: RMSE ratio predicted/stale (time-averaged) for every predictor ×
  optimizer and s (heatmaps; under ``paper`` one row of panels per model).

All runs go through :func:`pipelab.cache.cached` keyed by their :class:`PredictionErrorConfig`, so the
summary and the per-optimizer figures share them. Every figure names its learning rate(s), the weight
initialisation and the preset.

The models are He-initialised (``PredictionErrorConfig.init = "he"``). With PyTorch's default init the
8-block ReLU MLP of ``quick`` sits at chance (loss ln 10) for about 100 SGDM steps at lr 0.05, and plain SGD
never leaves it in 600 steps: the weights barely move on the plateau, so the stale RMSE is tiny and then
jumps when the loss drops — the unexplained jump near step 110 of the old SGDM figure, an artefact of the
init rather than of prediction.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.image import AxesImage

from ..cache import cached
from ..config import from_preset
from ..optim import available_optimizers, optimizer_label
from ..prediction_error import (
    PredictionErrorConfig,
    PredictionErrorResult,
    prediction_optimizer,
    run_prediction_error,
)
from . import FigureOutput, register

__all__ = ["PredictionFigureConfig", "PRESET_CONFIGS", "prediction_run", "PREDICTOR_LABELS", "run_lr"]

PREDICTOR_LABELS = {
    "stale": "stale (no prediction)", "spectrain": "SpecTrain (paper)", "spectrain_code": "SpecTrain (code)",
    "pipeoptim": "PipeOptim (paper)", "pipeoptim_code": "PipeOptim (code)", "repeat": "repeat last step",
    "zero_grad_rollout": "zero-gradient rollout", "linear": "linear extrapolation", "pipemare": "PipeMare δ (γ=0.9)",
}
_COLORS = {"spectrain": "#0072B2", "pipeoptim": "#0072B2", "repeat": "#E69F00", "zero_grad_rollout": "#009E73",
           "pipemare": "#CC79A7", "linear": "#56B4E9"}
# Lines drawn over training (the summary shows every predictor).
_CURVES = ("pipeoptim", "repeat", "zero_grad_rollout", "pipemare")
# Every registered optimizer, in registry order, but the centered-momentum RMSprop variant and Muon (2-D parameters
# only, the MLP has 1-D biases).
_ALL_OPTIMIZERS = tuple(n for n in available_optimizers() if n not in ("rmsprop_momentum", "muon"))


@dataclass(frozen=True)
class PredictionFigureConfig:
    """Runs behind the prediction figures: a base run config, the optimizers and the models swept."""

    base: PredictionErrorConfig
    optimizers: tuple[str, ...] = _ALL_OPTIMIZERS
    models: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()
    smooth: int = 5


_TINY = PredictionErrorConfig(steps=40, batch_size=32, train_subset=2000, measure_every=2,
                              model_options=(("depth", 4), ("width", 32)))
_QUICK = PredictionErrorConfig(steps=600, batch_size=128, measure_every=5, model_options=(("depth", 8), ("width", 128)))
_PAPER = PredictionErrorConfig(steps=4000, batch_size=128, measure_every=5, max_s=4, device="auto", threads=None,
                               model_options=(("depth", 16), ("width", 512)))

PRESET_CONFIGS = {
    "tiny": PredictionFigureConfig(_TINY, ("sgdm", "adam", "adamw", "rmsprop"), smooth=1),
    "quick": PredictionFigureConfig(_QUICK),
    "paper": PredictionFigureConfig(_PAPER, models=(("deep_mlp", (("depth", 16), ("width", 512))),
                                                    ("small_cnn", ()), ("small_resnet", ())), smooth=10),
}


def prediction_run(cfg: PredictionFigureConfig, optimizer: str, model: tuple | None = None) -> PredictionErrorResult:
    """The (cached) run of ``optimizer`` (and ``model`` = (name, options)) under ``cfg``."""
    run = replace(cfg.base, optimizer=optimizer)
    if model is not None:
        run = replace(run, model=model[0], model_options=model[1])
    return cached("prediction_error", run, run_prediction_error)


def run_lr(cfg: PredictionFigureConfig, optimizer: str) -> float:
    """The learning rate ``optimizer`` runs with under ``cfg`` (its settings, then the config's overrides)."""
    import torch

    opt = prediction_optimizer(optimizer, [torch.zeros(1, requires_grad=True)], **dict(cfg.base.optimizer_options))
    return float(opt.param_groups[0]["lr"])


_INIT_LABEL = {"he": "He init", "torch": "PyTorch default init"}


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    """Centred moving average over ``k`` points, NaN-aware and unbiased at the ends."""
    if k <= 1:
        return y
    ok = np.isfinite(y)
    kernel = np.ones(k)
    num = np.convolve(np.where(ok, y, 0.0), kernel, mode="same")
    den = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _rmse_over_training(optimizer: str, preset: str) -> FigureOutput:
    cfg = from_preset(PRESET_CONFIGS, preset)
    res = prediction_run(cfg, optimizer)
    S = min(3, res.max_s)
    fig, axes = plt.subplots(1, S, figsize=(4.2 * S, 4.1), sharey=True, layout="constrained")
    axes = np.atleast_1d(axes)
    names = ["spectrain"] if "spectrain" in res.predictors else []
    # PipeOptim is identical to SpecTrain for SGD with momentum (tested), so it is drawn once.
    names += [n for n in _CURVES if n in res.predictors and not (n == "pipeoptim" and names)]
    short = {"spectrain": "SpecTrain", "pipeoptim": "PipeOptim", "repeat": "repeat",
             "zero_grad_rollout": "zero-grad", "pipemare": "PipeMare"}
    ratios = res.summary_ratio()
    for si, ax in enumerate(axes):
        x = res.origins + si + 1
        ax.plot(x, _smooth(res.stale[si, :, -1], cfg.smooth), color="black", ls="--", lw=1.4,
                label=PREDICTOR_LABELS["stale"])
        lines = []
        for n in names:
            pi = res.predictors.index(n)
            ax.plot(x, _smooth(res.rmse[pi, si, :, -1], cfg.smooth), lw=1.2, color=_COLORS[n],
                    label=PREDICTOR_LABELS[n] + (" = PipeOptim" if n == "spectrain" else ""))
            lines.append(f"{short[n]:<10s}{ratios[pi, si]:5.2f}")
        ax.text(0.98, 0.97, "RMSE / stale\n" + "\n".join(lines), transform=ax.transAxes, ha="right", va="top",
                fontsize=7, family="monospace", bbox={"boxstyle": "round", "fc": "white", "ec": "0.8", "alpha": 0.9})
        ax.set_yscale("log")
        ax.set_title(f"s = {si + 1}")
        ax.set_xlabel("training step t + s")
    axes[0].set_ylabel("RMSE vs true weights $W_{t+s}$")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8, frameon=False)
    label = optimizer_label(optimizer)
    lr = run_lr(cfg, optimizer)
    div = f", diverged at step {res.diverged_at}" if res.diverged_at else ""
    left = res.left_chance_at()
    chance = (f"loss below 0.9·ln 10 from step {left}" if left is not None
              else f"loss never below 0.9·ln 10 in {res.meta['steps']} steps")
    fig.suptitle(f"{label}, lr {lr:g}: RMSE of predicted and stale weights over training ({res.meta['steps']} steps, "
                 f"{cfg.base.model}, {_INIT_LABEL[cfg.base.init]}{div}; moving average of {cfg.smooth} "
                 f"measurements; {preset} preset)\n{chance}. PyTorch's default init would hold this MLP at chance "
                 "for ~100 SGDM steps, then jump: an init artefact, not prediction", fontsize=9)
    notes: dict[str, object] = {f"ratio/{n}/s={s + 1}": float(ratios[i, s])
                                for i, n in enumerate(res.predictors) for s in range(res.max_s)}
    notes["final_loss"] = float(np.nanmean(res.loss[-20:]))
    notes["lr"] = lr
    notes["init"] = cfg.base.init
    notes["left_chance_at"] = left
    return FigureOutput(fig, replace(cfg.base, optimizer=optimizer), cfg.base.seed, tables={"csv": res.to_csv()},
                        notes=notes, data=res)


@register("prediction_rmse_sgdm",
          "SpecTrain Fig. 8 analogue for SGD with momentum: RMSE of predicted vs stale weights, s=1..3")
def prediction_rmse_sgdm(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("sgdm", preset)


@register("prediction_rmse_adam", "RMSE of predicted vs stale weights over training with Adam, s=1..3")
def prediction_rmse_adam(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("adam", preset)


@register("prediction_rmse_adamw", "RMSE of predicted vs stale weights over training with AdamW, s=1..3")
def prediction_rmse_adamw(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("adamw", preset)


@register("prediction_rmse_rmsprop", "RMSE of predicted vs stale weights over training with RMSprop, s=1..3")
def prediction_rmse_rmsprop(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("rmsprop", preset)


def summary_table(cfg: PredictionFigureConfig, model: tuple | None = None, *, progress: bool = False
                  ) -> tuple[list[str], list[str], np.ndarray]:
    """``(predictors, optimizers, ratio[P, O, S])``, NaN where a predictor does not apply."""
    from ..predictors import available_predictors

    preds = [p for p in available_predictors() if p in cfg.base.predictors]
    opts = list(cfg.optimizers)
    S = cfg.base.max_s
    table = np.full((len(preds), len(opts), S), np.nan)
    items = opts
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(opts, desc="prediction error runs", unit="run")
    for oi, o in enumerate(items):
        res = prediction_run(cfg, o, model)
        ratio = res.summary_ratio()
        for pi, p in enumerate(preds):
            if p in res.predictors:
                table[pi, oi] = ratio[res.predictors.index(p)]
    return preds, opts, table


@register("prediction_ratio_summary", "RMSE ratio predicted/stale for every predictor × optimizer and s (heatmaps)")
def prediction_ratio_summary(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(PRESET_CONFIGS, preset)
    models: list[tuple[str, tuple[tuple[str, object], ...]] | None] = list(cfg.models) or [None]
    S = cfg.base.max_s
    fig, axes = plt.subplots(len(models), S, figsize=(3.6 * S + 1.2, 4.2 * len(models)), squeeze=False,
                             layout="constrained")
    norm = LogNorm(vmin=0.25, vmax=4.0)
    notes, rows, data = {}, ["model,predictor,optimizer,s,ratio"], {}
    im: AxesImage | None = None
    for mi, model in enumerate(models):
        preds, opts, table = summary_table(cfg, model, progress=progress)
        mname = model[0] if model else cfg.base.model
        data[mname] = (preds, opts, table)
        for si in range(S):
            ax = axes[mi, si]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im = ax.imshow(table[:, :, si], cmap="RdBu_r", norm=norm, aspect="auto")
            for pi in range(len(preds)):
                for oi in range(len(opts)):
                    v = table[pi, oi, si]
                    ax.text(oi, pi, "—" if not np.isfinite(v) else f"{v:.2f}", ha="center", va="center",
                            fontsize=6.5, color="white" if np.isfinite(v) and abs(np.log(v)) > 0.8 else "black")
                    if np.isfinite(v):
                        rows.append(f"{mname},{preds[pi]},{opts[oi]},{si + 1},{v:.6g}")
            ax.set_xticks(range(len(opts)), [f"{optimizer_label(o)}, lr {run_lr(cfg, o):g}" for o in opts],
                          rotation=60, ha="right", fontsize=7)
            ax.set_yticks(range(len(preds)), [PREDICTOR_LABELS.get(p, p) for p in preds] if si == 0 else [],
                          fontsize=7)
            ax.grid(False)
            ax.set_title(f"{mname}, s = {si + 1}", fontsize=9)
        for o in ("sgdm", "adam"):
            if o in opts:
                for p in preds:
                    for si in range(S):
                        notes[f"{mname}/{o}/{p}/s={si + 1}"] = float(table[preds.index(p), opts.index(o), si])
    if im is None:
        raise ValueError(f"preset {preset!r}: max_s={S}; the summary needs max_s >= 1")
    cb = fig.colorbar(im, ax=axes, shrink=0.8, label="RMSE predicted / stale (< 1: better)")
    cb.set_ticks([0.25, 0.5, 1, 2, 4], labels=["0.25", "0.5", "1", "2", "4"])
    cb.minorticks_off()
    fig.suptitle("Weight prediction error relative to stale weights (time-averaged over training; "
                 f"— : predictor needs SGD momentum; {_INIT_LABEL[cfg.base.init]}; {preset} preset)", fontsize=10)
    return FigureOutput(fig, cfg, cfg.base.seed, tables={"csv": "\n".join(rows) + "\n"}, notes=notes, data=data)
