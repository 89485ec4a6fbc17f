"""Figures of the prediction-error notebook: how well can a stage predict its weights s updates ahead?

- ``prediction_rmse_<optimizer>`` (SGDM, Adam, AdamW, RMSprop, NAdam, Muon): SpecTrain Fig. 8 analogue — overall
  RMSE of predicted and of stale weights against the true future weights over training, s = 1, 2, 3.
- ``prediction_ratio_summary``: RMSE ratio predicted/stale (time-averaged) for every predictor ×
  optimizer and s (heatmaps; under ``paper`` one row of panels per model).
- ``prediction_in_pipeline``: the same ratio *inside the pipeline*
  (:func:`pipelab.prediction_error.measure_in_pipeline`): per stage at its real staleness and per layer, over
  windows of the run, one panel per policy × optimizer, with the CSV the notebook's per-layer statements are
  written from (:func:`in_pipeline_markdown`).
- ``gradient_correction_in_pipeline``: what the gradient-correcting policies (error feedback, DC-ASGD), which
  predict no weights, change: the error of the corrected vs the uncorrected gradient against the gradient at the
  current weights, per stage at its real staleness and per layer, with its CSV (:func:`correction_markdown`).

Muon (``torch.optim.Muon``) takes only matrices, so its runs use the MLP without biases
(:func:`pipelab.studies.models.deep_mlp` ``bias=False``, :func:`model_for`); the other optimizers keep the MLP
with biases.

All runs go through the result cache (:func:`pipelab.studies.cache.cached`, the summary's through
:func:`~pipelab.studies.cache.run_sweep`) keyed by their :class:`PredictionErrorConfig`, so the summary and the
per-optimizer figures share them, also when drawn side by side. Every figure names its learning rate(s), the weight
initialisation and the preset.

The models are He-initialised (``PredictionErrorConfig.init = "he"``). With PyTorch's default init the
8-block ReLU MLP of ``quick`` sits at chance (loss ln 10) for about 100 SGDM steps at lr 0.05, and plain SGD
never leaves it in 600 steps: the weights barely move on the plateau, so the stale RMSE is tiny and then
jumps when the loss drops — the unexplained jump near step 110 of the old SGDM figure, an artefact of the
init rather than of prediction.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.image import AxesImage

from ...optim import available_optimizers, optimizer_label
from ...prediction_error import InPipelineResult, PredictionErrorResult
from ..cache import cached, run_sweep
from ..config import from_preset
from ..prediction_error import (
    InPipelineConfig,
    PredictionErrorConfig,
    in_pipeline_rows,
    left_chance_at,
    prediction_optimizer,
    result_csv,
    rows_to_csv,
    run_in_pipeline,
    run_prediction_error,
    window_ratio,
)
from ..settings import CORRECTION_ARMS, IN_PIPELINE_ARMS, IN_PIPELINE_LRS
from . import FigureOutput, register

__all__ = ["PredictionFigureConfig", "PRESET_CONFIGS", "prediction_run", "PREDICTOR_LABELS", "run_lr",
           "InPipelineFigureConfig", "IN_PIPELINE_CONFIGS", "in_pipeline_run", "in_pipeline_markdown",
           "plain_layer_markdown", "MATRIX_ONLY_OPTIMIZERS", "model_for", "CORRECTION_CONFIGS", "correction_markdown"]

PREDICTOR_LABELS = {
    "stale": "stale (no prediction)", "spectrain": "SpecTrain (paper)", "spectrain_code": "SpecTrain (code)",
    "pipeoptim": "PipeOptim (paper)", "pipeoptim_code": "PipeOptim (code)", "repeat": "repeat last step",
    "zero_grad_rollout": "zero-gradient rollout", "linear": "linear extrapolation", "pipemare": "PipeMare δ (γ=0.9)",
}
_COLORS = {"spectrain": "#0072B2", "pipeoptim": "#0072B2", "repeat": "#E69F00", "zero_grad_rollout": "#009E73",
           "pipemare": "#CC79A7", "linear": "#56B4E9"}
# Lines drawn over training (the summary shows every predictor).
_CURVES = ("pipeoptim", "repeat", "zero_grad_rollout", "pipemare")
# Every registered optimizer, in registry order, but the centered-momentum RMSprop variant and NAdam with β1 0.99
# (NAdam's rule is there; its β1 setting is the learning curves' arm of the asynchronous-Nesterov paper).
_ALL_OPTIMIZERS = tuple(n for n in available_optimizers() if n not in ("rmsprop_momentum", "nadam_async"))

#: optimizers that take only 2-D parameters: they run on the bias-free MLP (:func:`model_for`)
MATRIX_ONLY_OPTIMIZERS = ("muon",)


def model_for(optimizer: str, model: str, options: tuple[tuple[str, object], ...]
              ) -> tuple[str, tuple[tuple[str, object], ...]] | None:
    """The ``(model, options)`` ``optimizer`` runs on: unchanged, or for Muon (:data:`MATRIX_ONLY_OPTIMIZERS`) the
    MLP with ``bias=False`` (every parameter a matrix); ``None`` when the model has non-matrix parameters it cannot
    drop (the CNNs' 4-D kernels)."""
    if optimizer not in MATRIX_ONLY_OPTIMIZERS:
        return model, options
    if model != "deep_mlp":
        return None
    return model, tuple(o for o in options if o[0] != "bias") + (("bias", False),)


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
    "tiny": PredictionFigureConfig(_TINY, ("sgdm", "adam", "adamw", "rmsprop", "nadam", "muon"), smooth=1),
    "quick": PredictionFigureConfig(_QUICK),
    "paper": PredictionFigureConfig(_PAPER, models=(("deep_mlp", (("depth", 16), ("width", 512))),
                                                    ("small_cnn", ()), ("small_resnet", ())), smooth=10),
}


def prediction_config(cfg: PredictionFigureConfig, optimizer: str, model: tuple | None = None
                      ) -> PredictionErrorConfig:
    """The run of ``optimizer`` (and ``model`` = (name, options)) under ``cfg``; Muon on the bias-free MLP
    (:func:`model_for`).

    Raises:
        ValueError: Muon with a model that has non-matrix parameters (a CNN).
    """
    name, options = model if model is not None else (cfg.base.model, cfg.base.model_options)
    chosen = model_for(optimizer, name, options)
    if chosen is None:
        raise ValueError(f"optimizer {optimizer!r} takes only 2-D parameters; model {name!r} has others")
    return replace(cfg.base, optimizer=optimizer, model=chosen[0], model_options=chosen[1])


def prediction_run(cfg: PredictionFigureConfig, optimizer: str, model: tuple | None = None) -> PredictionErrorResult:
    """The cached run of :func:`prediction_config` (one entry for every figure that draws it)."""
    return cached("prediction_error", prediction_config(cfg, optimizer, model), run_prediction_error)


def run_lr(cfg: PredictionFigureConfig, optimizer: str) -> float:
    """The learning rate ``optimizer`` runs with under ``cfg`` (its settings, then the config's overrides)."""
    import torch

    opt = prediction_optimizer(optimizer, [torch.zeros(1, 1, requires_grad=True)], **dict(cfg.base.optimizer_options))
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
    left = left_chance_at(res)
    chance = (f"loss below 0.9·ln 10 from step {left}" if left is not None
              else f"loss never below 0.9·ln 10 in {res.meta['steps']} steps")
    model = cfg.base.model + (" without biases" if optimizer in MATRIX_ONLY_OPTIMIZERS else "")
    fig.suptitle(f"{label}, lr {lr:g}: RMSE of predicted and stale weights over training ({res.meta['steps']} steps, "
                 f"{model}, {_INIT_LABEL[cfg.base.init]}{div}; moving average of {cfg.smooth} "
                 f"measurements; {preset} preset)\n{chance}. PyTorch's default init would hold this MLP at chance "
                 "for ~100 SGDM steps, then jump: an init artefact, not prediction", fontsize=9)
    notes: dict[str, object] = {f"ratio/{n}/s={s + 1}": float(ratios[i, s])
                                for i, n in enumerate(res.predictors) for s in range(res.max_s)}
    notes["final_loss"] = float(np.nanmean(res.loss[-20:]))
    notes["lr"] = lr
    notes["init"] = cfg.base.init
    notes["left_chance_at"] = left
    return FigureOutput(fig, replace(cfg.base, optimizer=optimizer), cfg.base.seed, tables={"csv": result_csv(res)},
                        notes=notes, data=res)


@register("prediction_rmse_sgdm",
          "SpecTrain Fig. 8 analogue for SGD with momentum: RMSE of predicted vs stale weights, s=1..3",
          budget={"tiny": 10, "quick": 5})
def prediction_rmse_sgdm(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("sgdm", preset)


@register("prediction_rmse_adam", "RMSE of predicted vs stale weights over training with Adam, s=1..3",
          budget={"tiny": 10, "quick": 5})
def prediction_rmse_adam(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("adam", preset)


@register("prediction_rmse_adamw", "RMSE of predicted vs stale weights over training with AdamW, s=1..3",
          budget={"tiny": 10, "quick": 5})
def prediction_rmse_adamw(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("adamw", preset)


@register("prediction_rmse_rmsprop", "RMSE of predicted vs stale weights over training with RMSprop, s=1..3",
          budget={"tiny": 10, "quick": 5})
def prediction_rmse_rmsprop(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("rmsprop", preset)


@register("prediction_rmse_nadam", "RMSE of predicted vs stale weights over training with NAdam (the asynchronous "
          "Nesterov policy's optimizer), s=1..3",
          budget={"tiny": 10, "quick": 5})
def prediction_rmse_nadam(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("nadam", preset)


@register("prediction_rmse_muon", "RMSE of predicted vs stale weights over training with Muon (bias-free MLP), s=1..3",
          budget={"tiny": 10, "quick": 5})
def prediction_rmse_muon(preset: str, *, progress: bool = False) -> FigureOutput:
    return _rmse_over_training("muon", preset)


def summary_table(cfg: PredictionFigureConfig, model: tuple | None = None, *, progress: bool = False
                  ) -> tuple[list[str], list[str], np.ndarray]:
    """``(predictors, optimizers, ratio[P, O, S])``, NaN where a predictor does not apply."""
    from ...predictors import available_predictors

    preds = [p for p in available_predictors() if p in cfg.base.predictors]
    opts = list(cfg.optimizers)
    S = cfg.base.max_s
    table = np.full((len(preds), len(opts), S), np.nan)
    name, options = model if model is not None else (cfg.base.model, cfg.base.model_options)
    runs = [o for o in opts if model_for(o, name, options) is not None]  # Muon on a CNN: its column stays NaN
    results = run_sweep("prediction_error", [prediction_config(cfg, o, model) for o in runs], run_prediction_error,
                        progress=progress, desc="prediction error runs")
    for o, res in zip(runs, results):
        oi = opts.index(o)
        ratio = res.summary_ratio()
        for pi, p in enumerate(preds):
            if p in res.predictors:
                table[pi, oi] = ratio[res.predictors.index(p)]
    return preds, opts, table


@register("prediction_ratio_summary", "RMSE ratio predicted/stale for every predictor × optimizer and s (heatmaps)",
          budget={"tiny": 20, "quick": 90})  # quick: 71 s measured
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
            ax.set_xticks(range(len(opts)), [f"{optimizer_label(o)}, lr {run_lr(cfg, o):g}"
                                             + (" (no biases)" if o in MATRIX_ONLY_OPTIMIZERS else "") for o in opts],
                          rotation=60, ha="right", fontsize=7)
            ax.set_yticks(range(len(preds)), [PREDICTOR_LABELS.get(p, p) for p in preds] if si == 0 else [],
                          fontsize=7)
            ax.grid(False)
            ax.set_title(f"{mname}, s = {si + 1}", fontsize=9)
        for o in ("sgdm", "adam", "nadam", "muon"):
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
                 f"— : predictor needs SGD momentum, or Muon on a model with non-matrix parameters; Muon runs on the "
                 f"MLP without biases; {_INIT_LABEL[cfg.base.init]}; {preset} preset)", fontsize=10)
    return FigureOutput(fig, cfg, cfg.base.seed, tables={"csv": "\n".join(rows) + "\n"}, notes=notes, data=data)


# --------------------------------------------------------------------------------- inside the pipeline

@dataclass(frozen=True)
class InPipelineFigureConfig:
    """Runs behind ``prediction_in_pipeline``: a base run, the (policy, optimizer) panels, the lr per optimizer.

    ``lrs`` overrides :data:`~pipelab.studies.settings.PREDICTION_OPTIMIZER_SETTINGS`' learning rate per optimizer
    (:data:`~pipelab.studies.settings.IN_PIPELINE_LRS`); ``phases`` windows of the run are the heatmap's columns,
    plus one for the whole run.
    """

    base: InPipelineConfig
    arms: tuple[tuple[str, str], ...] = IN_PIPELINE_ARMS
    lrs: tuple[tuple[str, float], ...] = IN_PIPELINE_LRS
    phases: int = 5

    def run_config(self, policy: str, optimizer: str) -> InPipelineConfig:
        """The run of one panel (Muon's on the bias-free MLP, :func:`model_for`)."""
        lr = dict(self.lrs).get(optimizer)
        opts = tuple(o for o in self.base.optimizer_options if o[0] != "lr") + ((("lr", lr),) if lr else ())
        chosen = model_for(optimizer, self.base.model, self.base.model_options)
        if chosen is None:
            raise ValueError(f"optimizer {optimizer!r} takes only 2-D parameters; model {self.base.model!r} has others")
        return replace(self.base, policy=policy, optimizer=optimizer, optimizer_options=opts, model=chosen[0],
                       model_options=chosen[1])


_IN_TINY = InPipelineConfig(steps=40, batch_size=32, train_subset=2000, D=4, anneal_steps=10,
                            model_options=(("depth", 4), ("width", 32)))
_IN_QUICK = InPipelineConfig(steps=250, batch_size=128, D=4, anneal_steps=50,
                             model_options=(("depth", 8), ("width", 128)))
_IN_PAPER = InPipelineConfig(steps=2000, batch_size=128, D=8, anneal_steps=250, threads=None, device="auto",
                             model_options=(("depth", 16), ("width", 512)))

IN_PIPELINE_CONFIGS = {
    "tiny": InPipelineFigureConfig(_IN_TINY, phases=2),
    "quick": InPipelineFigureConfig(_IN_QUICK),
    "paper": InPipelineFigureConfig(_IN_PAPER),
}
IN_PIPELINE_CONFIGS["study"] = IN_PIPELINE_CONFIGS["quick"]

#: the gradient-correcting policies' panels (:data:`~pipelab.studies.settings.CORRECTION_ARMS`), at the in-pipeline
#: figure's runs and rates
CORRECTION_CONFIGS = {name: replace(c, arms=CORRECTION_ARMS) for name, c in IN_PIPELINE_CONFIGS.items()}


def in_pipeline_run(cfg: InPipelineFigureConfig, policy: str, optimizer: str) -> InPipelineResult:
    """The (cached) in-pipeline run of one panel."""
    return cached("prediction_in_pipeline", cfg.run_config(policy, optimizer), run_in_pipeline)


def in_pipeline_markdown(rows: list[dict]) -> str:
    """Per-layer statements for notebook 02, written from the CSV rows of ``prediction_in_pipeline``.

    One bullet per panel (policy × optimizer): the whole-run RMSE ratio predicted/stale of each stage (its range
    over the stage's layers, at the stage's s), the layer where prediction helps most and least, and whether
    the ratio rises or falls from the first to the last window.
    """
    from ...policies import make_policy

    panels: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        panels.setdefault((r["policy"], r["optimizer"]), []).append(r)
    lines = []
    spreads, rising, multi = [], 0, False
    for rs in panels.values():
        whole = [r for r in rs if r["phase"] == "all" and np.isfinite(r["ratio"])]
        by_stage: dict[int, list[float]] = {}
        for r in whole:
            by_stage.setdefault(r["stage"], []).append(r["ratio"])
        spreads += [max(v) - min(v) for v in by_stage.values()]
        multi |= any(len(v) > 1 for v in by_stage.values())
        s_of = {r["stage"]: abs(r["s"]) for r in whole}
        means = [float(np.mean(by_stage[k])) for k in sorted(by_stage, key=lambda k: s_of[k])]
        rising += len(means) > 1 and all(b >= a for a, b in zip(means, means[1:]))
    if spreads:
        within = (f"Within one stage the layers' whole-run ratios differ by at most {max(spreads):.2f}" if multi
                  else "Each stage holds one layer here, so layers differ only as their stages do")
        lines += [f"{within}; the stage mean does not fall as the stage's |s| grows in {rising} of {len(panels)} "
                  "panels.", ""]
    for (pol, opt), rs in panels.items():
        whole = [r for r in rs if r["phase"] == "all" and np.isfinite(r["ratio"])]
        if not whole:
            lines.append(f"- **{make_policy(pol).title} · {optimizer_label(opt)}**: no stage predicted anything.")
            continue
        parts = []
        for k in sorted({r["stage"] for r in rs}):
            ks = [r for r in whole if r["stage"] == k]
            s = next(r["s"] for r in rs if r["stage"] == k)
            if not ks:
                parts.append(f"stage {k} (s = {s}) predicts nothing")
                continue
            lo, hi = min(r["ratio"] for r in ks), max(r["ratio"] for r in ks)
            span = f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"
            parts.append(f"stage {k} (s = {s}) {span}")
        best, worst = min(whole, key=lambda r: r["ratio"]), max(whole, key=lambda r: r["ratio"])
        phased = [r for r in rs if r["phase"] not in ("all",) and np.isfinite(r["ratio"])]
        first = [r["ratio"] for r in phased if r["phase"] == "0"]
        last_phase = max((int(r["phase"]) for r in phased), default=0)
        last = [r["ratio"] for r in phased if int(r["phase"]) == last_phase]
        trend = ""
        if first and last and last_phase > 0:
            trend = (f"; mean over layers {np.mean(first):.2f} in the first window of steps, "
                     f"{np.mean(last):.2f} in the last")
        lines.append(f"- **{make_policy(pol).title} · {optimizer_label(opt)}** ({whole[0]['op']} jobs; "
                     f"ratio predicted/stale per stage, range over its layers): {'; '.join(parts)}. Most help at "
                     f"layer `L{best['layer']}` ({best['ratio']:.2f}), least at `L{worst['layer']}` "
                     f"({worst['ratio']:.2f}){trend}.")
    return "\n".join(lines)


@register("prediction_in_pipeline",
          "Prediction error inside the pipeline: per stage (its real staleness) and layer, predicted/stale RMSE",
          budget={"tiny": 15, "quick": 60})
def prediction_in_pipeline(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(IN_PIPELINE_CONFIGS, preset)
    b = cfg.base
    return _ratio_panels(
        cfg, preset, progress, "RMSE predicted / stale (< 1: prediction helps)",
        f"Prediction error inside the pipeline: async 1F1B, D = {b.D}, M = 1, {b.steps} steps, {b.model} "
        f"({dict(b.model_options).get('depth', '?')} blocks) on {b.dataset}, {_INIT_LABEL[b.init]}; Muon without "
        f"biases; {preset} preset\nrows: layers by stage k at its staleness s (version difference from the table; "
        "PipeMare predicts back, s < 0); each job's weights vs the version they stand for; — : no prediction")


@register("gradient_correction_in_pipeline",
          "Gradient corrections inside the pipeline (error feedback, DC-ASGD): per stage at its staleness and layer, "
          "error of the corrected vs the uncorrected gradient against the gradient at the current weights",
          budget={"tiny": 15, "quick": 60})
def gradient_correction_in_pipeline(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(CORRECTION_CONFIGS, preset)
    b = cfg.base
    return _ratio_panels(
        cfg, preset, progress, "RMSE corrected / uncorrected gradient (< 1: the correction helps)",
        f"Gradient corrections inside the pipeline: error feedback on PipeDream-2BW (M = D), DC-ASGD on stashing "
        f"(async 1F1B, M = 1)\nD = {b.D}, {b.steps} steps, {b.model} ({dict(b.model_options).get('depth', '?')} "
        f"blocks) on {b.dataset}, {_INIT_LABEL[b.init]}; Muon without biases; {preset} preset\nrows: layers by stage "
        "k at its gradient's staleness s; each update's gradient vs the mini-batch's gradient at the weights\nthe "
        "pipeline holds then; — : no delayed update")


def _ratio_panels(cfg: InPipelineFigureConfig, preset: str, progress: bool, label: str, title: str) -> FigureOutput:
    """One heatmap per (policy, optimizer) arm of :func:`measure_in_pipeline` results: layers × windows of the run
    (and the whole run), the ratio of the policy's error to the baseline's; the CSV holds every panel's rows."""
    from ...policies import make_policy

    policies = list(dict.fromkeys(p for p, _ in cfg.arms))
    optimizers = list(dict.fromkeys(o for _, o in cfg.arms))
    arms: Iterable[tuple[str, str]] = cfg.arms
    if progress:
        from ..progress import bar

        arms = bar(cfg.arms, desc="in-pipeline runs", unit="run")
    results = {arm: in_pipeline_run(cfg, *arm) for arm in arms}
    first = next(iter(results.values()))
    L, P = len(first.layers), cfg.phases
    fig, axes = plt.subplots(len(optimizers), len(policies), figsize=(3.3 * len(policies) + 1.4,
                                                                      0.36 * L * len(optimizers) + 2.4),
                             squeeze=False, layout="constrained")
    norm = LogNorm(vmin=0.25, vmax=4.0)
    im: AxesImage | None = None
    rows: list[dict] = []
    notes: dict[str, object] = {}
    cols = [f"{i + 1}" for i in range(P)] + ["all"]
    for oi, opt in enumerate(optimizers):
        for pi, pol in enumerate(policies):
            ax = axes[oi, pi]
            ax.grid(False)
            res = results.get((pol, opt))
            if res is None:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{make_policy(pol).title} · {optimizer_label(opt)}:\nnot run"
                        + ("\n(SpecTrain needs SGD momentum)" if pol == "spectrain" else ""),
                        ha="center", va="center", transform=ax.transAxes, fontsize=8)
                continue
            rows += in_pipeline_rows(res, P)
            ratio = window_ratio(res, P)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im = ax.imshow(ratio, cmap="RdBu_r", norm=norm, aspect="auto")
            for li in range(L):
                for w in range(P + 1):
                    v = ratio[li, w]
                    ax.text(w, li, "—" if not np.isfinite(v) else f"{v:.2f}", ha="center", va="center",
                            fontsize=6, color="white" if np.isfinite(v) and abs(np.log(v)) > 0.8 else "black")
            ax.axvline(P - 0.5, color="black", lw=1.2)
            ss = res.stage_s()
            for li in range(1, L):
                if res.layer_stage[li] != res.layer_stage[li - 1]:
                    ax.axhline(li - 0.5, color="black", lw=1.0)
            for k in range(res.D):
                lis = [li for li in range(L) if res.layer_stage[li] == k]
                if lis:
                    ax.text(P + 0.6, (lis[0] + lis[-1]) / 2, f"k={k}\ns={ss[k]}", fontsize=6, va="center",
                            ha="left", transform=ax.transData, clip_on=False)
            ax.set_xticks(range(P + 1), cols, fontsize=7)
            ax.set_yticks(range(L), [f"L{n}" for n in res.layers] if pi == 0 else [], fontsize=7)
            ax.set_xlabel(f"window of {res.steps // P} steps · all", fontsize=7)
            div = f", diverged at {res.diverged_at}" if res.diverged_at is not None else ""
            lr = float(res.meta.get("lr", math.nan))
            jobs = "updates' gradients" if res.predicted_op == "G" else f"{res.predicted_op} jobs"
            ax.set_title(f"{make_policy(pol).title} · {optimizer_label(opt)}, lr {lr:g}\n({jobs}{div})", fontsize=8)
            whole = ratio[:, -1]
            for k in range(res.D):
                vals = whole[[li for li in range(L) if res.layer_stage[li] == k]]
                vals = vals[np.isfinite(vals)]
                notes[f"{pol}/{opt}/stage{k}/s"] = ss[k]
                notes[f"{pol}/{opt}/stage{k}/ratio"] = float(vals.mean()) if vals.size else None
    if im is None:
        raise ValueError(f"preset {preset!r}: no panel was run")
    cb = fig.colorbar(im, ax=axes, shrink=0.8, label=label)
    cb.set_ticks([0.25, 0.5, 1, 2, 4], labels=["0.25", "0.5", "1", "2", "4"])
    cb.minorticks_off()
    fig.suptitle(title, fontsize=9)
    return FigureOutput(fig, cfg, cfg.base.seed, tables={"csv": rows_to_csv(rows)}, notes=notes, data=rows)


def correction_markdown(rows: list[dict]) -> str:
    """Statements for notebook 02, written from the CSV rows of ``gradient_correction_in_pipeline``: per panel
    (policy × optimizer), each stage's whole-run ratio corrected/uncorrected gradient error (mean over its layers)
    at its staleness s, and the range over the panel's stages."""
    from ...policies import make_policy

    panels: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        panels.setdefault((r["policy"], r["optimizer"]), []).append(r)
    lines = []
    for (pol, opt), rs in panels.items():
        whole = [r for r in rs if r["phase"] == "all" and np.isfinite(r["ratio"])]
        if not whole:
            lines.append(f"- **{make_policy(pol).title} · {optimizer_label(opt)}**: no delayed update.")
            continue
        parts = []
        for k in sorted({r["stage"] for r in whole}):
            ks = [r["ratio"] for r in whole if r["stage"] == k]
            parts.append(f"stage {k} (s = {next(r['s'] for r in whole if r['stage'] == k)}) {np.mean(ks):.2f}")
        means = [round(float(np.mean([r["ratio"] for r in whole if r["stage"] == k])), 2)
                 for k in {r["stage"] for r in whole}]
        verdict = ("the correction barely changes the gradient (every stage at 1.00 to two decimals)"
                   if all(m == 1.0 for m in means) else
                   "the correction brings every stage's gradient closer to the current weights' one"
                   if max(means) < 1 else "the correction moves every stage's gradient away from the current weights' "
                   "one" if min(means) > 1 else "the correction helps some stages and hurts others")
        lines.append(f"- **{make_policy(pol).title} · {optimizer_label(opt)}** (ratio corrected/uncorrected gradient "
                     f"RMSE, mean over each stage's layers): {'; '.join(parts)} — {verdict}.")
    return "\n".join(lines)


def plain_layer_markdown(res: PredictionErrorResult, predictors: tuple[str, ...] = ("spectrain", "pipeoptim",
                                                                                     "zero_grad_rollout"),
                         s: int = 3) -> str:
    """Per-layer statement of a *plain-training* run (:class:`PredictionErrorResult`) at staleness ``s``: each
    predictor's range of time-averaged ratio predicted/stale over the layers, and the layer where it is largest."""
    s = min(s, res.max_s)
    r = res.summary_ratio(per_layer=True)[:, s - 1]
    parts = []
    for name in predictors:
        if name not in res.predictors:
            continue
        v = r[res.predictors.index(name), :-1]
        worst = int(np.nanargmax(v))
        parts.append(f"{PREDICTOR_LABELS.get(name, name)} {np.nanmin(v):.2f}–{np.nanmax(v):.2f} over the layers "
                     f"(largest at `L{res.layers[worst]}`), {r[res.predictors.index(name), -1]:.2f} overall")
    return (f"Plain training (no pipeline), s = {s}, ratio predicted/stale per layer: " + "; ".join(parts) + ".")
