"""The prediction-error study: configs and runs over the measurement of :mod:`pipelab.prediction_error`.

:class:`PredictionErrorConfig` / :func:`run_prediction_error` build a task's data, model and optimizer and measure
every predictor along plain training (:func:`~pipelab.prediction_error.measure_prediction_error`);
:class:`InPipelineConfig` / :func:`run_in_pipeline` do the same inside the pipeline
(:func:`~pipelab.prediction_error.measure_in_pipeline`); :func:`rows_to_csv` / :func:`read_rows_csv` write and read
the in-pipeline rows (:meth:`~pipelab.prediction_error.InPipelineResult.rows`) as the figures' CSV.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..distributed import resolve_device
from ..optim import make_optimizer
from ..prediction_error import (
    CORRECTING_POLICIES,
    IN_PIPELINE_POLICIES,
    InPipelineResult,
    PredictionErrorResult,
    measure_in_pipeline,
    measure_prediction_error,
)
from ..predictors import make_predictor
from ..threads import torch_threads
from .settings import PREDICTION_OPTIMIZER_SETTINGS

__all__ = ["INITS", "prediction_optimizer", "PredictionErrorConfig", "run_prediction_error",
           "InPipelineConfig", "run_in_pipeline", "rows_to_csv", "read_rows_csv", "layer_text", "summary_text",
           "result_csv", "phase_edges", "window_means", "window_ratio", "in_pipeline_rows", "left_chance_at"]

log = logging.getLogger(__name__)

#: Weight initialisations of :class:`PredictionErrorConfig` (``init``).
INITS = ("he", "torch")

def prediction_optimizer(name: str, params: Iterable[Tensor], **overrides: Any) -> torch.optim.Optimizer:
    """The registry's optimizer ``name`` with this experiment's settings, then ``overrides``, applied.

    Raises:
        ValueError: ``name`` is not in :data:`pipelab.optim.OPTIMIZERS`.
        TypeError: an override the ``torch.optim`` class does not accept.
    """
    return make_optimizer(name, params, **{**PREDICTION_OPTIMIZER_SETTINGS.get(name, {}), **overrides})


@dataclass(frozen=True)
class PredictionErrorConfig:
    """One prediction-error run: model × data × optimizer × predictors.

    ``optimizer`` is a name of :data:`pipelab.optim.OPTIMIZERS`, built with
    :data:`~pipelab.studies.settings.PREDICTION_OPTIMIZER_SETTINGS`; ``optimizer_options`` are ``(name, value)`` pairs
    overriding both;
    ``model_options`` likewise for :func:`pipelab.studies.models.build_model`.
    ``init`` (one of :data:`INITS`): ``"he"`` re-initialises Linear/Conv weights He-normal, W ~ N(0, 2/fan_in),
    zero biases (He et al., ICCV 2015; the learning curves' initialisation), seeded by ``seed``; ``"torch"``
    keeps PyTorch's default U(±1/sqrt(fan_in)), under which the 8-block ReLU MLP of the figures sits at
    chance (loss ln 10) for about 100 steps with SGDM at lr 0.05 — and never leaves it with plain SGD in
    600 steps — so its weights barely move and then jump (the step-110 jump of the old SGDM figure).
    """

    optimizer: str = "sgdm"
    optimizer_options: tuple[tuple[str, Any], ...] = ()
    model: str = "deep_mlp"
    model_options: tuple[tuple[str, Any], ...] = (("depth", 8), ("width", 128))
    dataset: str = "fashion_mnist"
    train_subset: int | None = None
    batch_size: int = 128
    steps: int = 600
    max_s: int = 3
    measure_every: int = 4
    predictors: tuple[str, ...] = ("stale", "spectrain", "spectrain_code", "pipeoptim", "pipeoptim_code",
                                   "repeat", "zero_grad_rollout", "linear", "pipemare")
    dtype: str = "float32"
    device: str = "cpu"  # or "auto": CUDA when available
    seed: int = 0
    #: CPU threads during the run (restored after); 1 avoids the thread contention that makes small
    #: element-wise ops orders of magnitude slower on a loaded machine. ``None`` keeps torch's setting.
    threads: int | None = 1
    init: str = "he"

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        _check_sizes(self)


def _check_sizes(cfg: PredictionErrorConfig | InPipelineConfig) -> None:
    """Refuse a batch size, step count or training subset that would make an empty (NaN-loss) mini-batch."""
    from ..schedules.actions import check_int

    for name in ("batch_size", "steps"):
        check_int(name, getattr(cfg, name))
    if cfg.train_subset is not None:
        check_int("train_subset", cfg.train_subset)


def run_prediction_error(cfg: PredictionErrorConfig) -> PredictionErrorResult:
    """Build data, model and optimizer from ``cfg`` and run :func:`measure_prediction_error`.

    Predictors that cannot follow the optimizer (SpecTrain without SGD momentum) are left out and
    listed in ``result.meta["skipped"]``.
    """
    from .data import load_dataset
    from .models import build_model, he_init

    dtype = getattr(torch, cfg.dtype)
    device = str(resolve_device(cfg.device, argument="device"))  # "auto": CUDA when available
    ds = load_dataset(cfg.dataset).to(device, dtype)
    if cfg.train_subset is not None:
        ds = ds.subset(cfg.train_subset)
    model = build_model(cfg.model, seed=cfg.seed, dtype=dtype, device=device,
                        **dict(cfg.model_options))
    if cfg.init == "he":
        he_init(model, cfg.seed)
    opt = prediction_optimizer(cfg.optimizer, model.parameters(), **dict(cfg.optimizer_options))
    gen = torch.Generator().manual_seed(cfg.seed)
    n = len(ds.x_train)
    idx = [torch.randint(0, n, (cfg.batch_size,), generator=gen).to(device) for _ in range(cfg.steps)]
    batches = [(ds.x_train[i], ds.y_train[i]) for i in idx]
    usable, skipped = [], []
    for name in cfg.predictors:
        try:
            make_predictor(name).check(opt)
            usable.append(name)
        except (TypeError, ValueError) as exc:
            skipped.append(name)
            log.info("predictor %s skipped for %s: %s", name, cfg.optimizer, exc)
    with torch_threads(cfg.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        res = measure_prediction_error(model, opt, batches, usable, max_s=cfg.max_s,
                                       measure_every=cfg.measure_every)
    res.meta.update({"config_optimizer": cfg.optimizer, "skipped": skipped, "device": device, "init": cfg.init,
                     "lr": float(opt.param_groups[0]["lr"])})
    return res


_ROW_FIELDS = ("policy", "optimizer", "D", "stage", "s", "op", "layer", "phase", "step_from", "step_to", "jobs",
               "rmse_predicted", "rmse_stale", "ratio")


def rows_to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """CSV of :meth:`InPipelineResult.rows` (several results' rows may be concatenated); NaN as an empty cell."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.6g}" if math.isfinite(v) else ""
        return str(v)

    return "\n".join([",".join(_ROW_FIELDS)] + [",".join(cell(r[f]) for f in _ROW_FIELDS) for r in rows]) + "\n"


def read_rows_csv(text: str) -> list[dict[str, Any]]:
    """The rows of a :func:`rows_to_csv` text, typed again (integers, floats; an empty cell is NaN)."""
    import csv
    import io

    ints = {"D", "stage", "s", "step_from", "step_to", "jobs"}
    floats = {"rmse_predicted", "rmse_stale", "ratio"}
    out = []
    for r in csv.DictReader(io.StringIO(text)):
        if set(r) != set(_ROW_FIELDS):
            raise ValueError(f"text is not an in-pipeline CSV: columns {sorted(r)}, expected {list(_ROW_FIELDS)}")
        out.append({f: int(v) if f in ints else (float(v) if v else math.nan) if f in floats else v
                    for f, v in r.items()})
    return out


@dataclass(frozen=True)
class InPipelineConfig:
    """One in-pipeline prediction-error run: model × data × optimizer × predicting policy × D.

    The fields mean what they mean in :class:`PredictionErrorConfig` (the optimizer is built with
    :data:`~pipelab.studies.settings.PREDICTION_OPTIMIZER_SETTINGS`, then ``optimizer_options``; ``init="he"``
    re-initialises He-normal); ``policy`` is one of :data:`IN_PIPELINE_POLICIES` (SpecTrain needs SGD with momentum),
    run on asynchronous 1F1B with ``D`` stages and M = 1 for ``steps`` mini-batches, or one of
    :data:`CORRECTING_POLICIES`, run on its own schedule family (error feedback: PipeDream-2BW, M = D);
    ``anneal_steps`` is PipeMare's K.
    """

    policy: str = "pipeoptim"
    optimizer: str = "sgdm"
    D: int = 4
    optimizer_options: tuple[tuple[str, Any], ...] = ()
    model: str = "deep_mlp"
    model_options: tuple[tuple[str, Any], ...] = (("depth", 8), ("width", 128))
    dataset: str = "fashion_mnist"
    train_subset: int | None = None
    batch_size: int = 128
    steps: int = 300
    anneal_steps: int = 100
    dtype: str = "float32"
    device: str = "cpu"  # or "auto": CUDA when available
    seed: int = 0
    threads: int | None = 1
    init: str = "he"

    def __post_init__(self) -> None:
        if self.policy not in IN_PIPELINE_POLICIES + CORRECTING_POLICIES:
            raise ValueError(f"policy must be one of {IN_PIPELINE_POLICIES + CORRECTING_POLICIES}, got {self.policy!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if not isinstance(self.D, int) or self.D < 1:
            raise ValueError(f"D must be a positive integer, got {self.D!r}")
        _check_sizes(self)

    @property
    def lr(self) -> float:
        """The learning rate the run's optimizer uses."""
        opt = prediction_optimizer(self.optimizer, [torch.zeros(1, 1, requires_grad=True)],
                                   **dict(self.optimizer_options))
        return float(opt.param_groups[0]["lr"])


def run_in_pipeline(cfg: InPipelineConfig) -> InPipelineResult:
    """Build data, model, optimizer factory and policy from ``cfg`` and run :func:`measure_in_pipeline`."""
    from ..optim import optimizer_factory
    from ..policies import make_policy
    from .data import load_dataset
    from .models import build_model, he_init

    dtype = getattr(torch, cfg.dtype)
    device = str(resolve_device(cfg.device, argument="device"))  # "auto": CUDA when available
    ds = load_dataset(cfg.dataset).to(device, dtype)
    if cfg.train_subset is not None:
        ds = ds.subset(cfg.train_subset)
    model = build_model(cfg.model, seed=cfg.seed, dtype=dtype, device=device, **dict(cfg.model_options))
    if cfg.init == "he":
        he_init(model, cfg.seed)
    factory = optimizer_factory(cfg.optimizer, **{**PREDICTION_OPTIMIZER_SETTINGS.get(cfg.optimizer, {}),
                                                  **dict(cfg.optimizer_options)})
    policy = make_policy(cfg.policy, **({"anneal_steps": cfg.anneal_steps} if cfg.policy == "pipemare" else {}))
    gen = torch.Generator().manual_seed(cfg.seed)
    n = len(ds.x_train)
    idx = [torch.randint(0, n, (cfg.batch_size,), generator=gen).to(device) for _ in range(cfg.steps)]
    batches = [(ds.x_train[i], ds.y_train[i]) for i in idx]
    with torch_threads(cfg.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        res = measure_in_pipeline(model, batches, policy=policy, optimizer=factory, D=cfg.D)
    res.meta.update({"lr": cfg.lr, "init": cfg.init, "model": cfg.model, "dataset": cfg.dataset, "device": device})
    return res

# ----------------------------------------------------------------------------------- tables of a measurement

def layer_text(res: PredictionErrorResult, s: int = 1, skip_fraction: float = 0.1) -> str:
    """A text table of the per-layer RMSE ratio to stale at staleness ``s`` (rows: predictors)."""
    if not 1 <= s <= res.max_s:
        raise ValueError(f"s must be in 1..{res.max_s}, got {s}")
    r = res.summary_ratio(skip_fraction, per_layer=True)[:, s - 1]
    width = max(len(n) for n in res.predictors)
    cols = [f"L{n}" for n in res.layers] + ["all"]
    lines = [f"{'predictor':<{width}}  " + " ".join(f"{c:>6s}" for c in cols)]
    for i, n in enumerate(res.predictors):
        lines.append(f"{n:<{width}}  " + " ".join(f"{v:6.2f}" for v in r[i]))
    return "\n".join(lines)


def summary_text(res: PredictionErrorResult, skip_fraction: float = 0.1) -> str:
    """A text table: per predictor, the RMSE ratio to stale and the mean cosine for each s."""
    ratio, cos = res.summary_ratio(skip_fraction), res.summary_cosine(skip_fraction)
    S = res.max_s
    width = max(len(n) for n in res.predictors)
    head = (f"{'predictor':<{width}}  " + " ".join(f"ratio s={s + 1:<2d}" for s in range(S)) + "   "
            + " ".join(f"cos s={s + 1:<2d}" for s in range(S)))
    lines = [head]
    for i, n in enumerate(res.predictors):
        lines.append(f"{n:<{width}}  " + " ".join(f"{ratio[i, s]:>10.3f}" for s in range(S)) + "   "
                     + " ".join(f"{cos[i, s]:>8.3f}" for s in range(S)))
    return "\n".join(lines)


def result_csv(res: PredictionErrorResult) -> str:
    """Long-form CSV of the overall metrics: predictor, s, origin, rmse, stale, ratio, cosine."""
    rows = ["predictor,s,origin,rmse,stale_rmse,ratio,cosine"]
    ratio = res.ratio()
    for pi, name in enumerate(res.predictors):
        for si in range(res.max_s):
            for ti, t in enumerate(res.origins):
                r = res.rmse[pi, si, ti, -1]
                if np.isfinite(r):
                    rows.append(f"{name},{si + 1},{t},{r:.6g},{res.stale[si, ti, -1]:.6g},"
                                f"{ratio[pi, si, ti, -1]:.6g},{res.cosine[pi, si, ti, -1]:.6g}")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------ windows and rows of an in-pipeline run

def phase_edges(res: InPipelineResult, phases: int) -> np.ndarray:
    """``phases + 1`` step boundaries cutting the run into equal windows ``[edges[i], edges[i+1])``."""
    if not isinstance(phases, int) or phases < 1:
        raise ValueError(f"phases must be a positive integer, got {phases!r}")
    return np.linspace(0, res.steps, phases + 1).round().astype(int)


def window_means(res: InPipelineResult, phases: int = 5, op: str | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pred, stale, count)``, each ``[layers, phases + 1]``: mean RMSEs over the predicted jobs (s ≠ 0) of
    ``op`` in each window of steps; the last column is the whole run. The ratio of the means is the
    time-averaged RMSE over the time-averaged stale RMSE, as
    :meth:`~pipelab.prediction_error.PredictionErrorResult.summary_ratio`."""
    op = op or res.predicted_op
    edges = phase_edges(res, phases)
    L = len(res.layers)
    pred, stale, count = (np.full((L, phases + 1), np.nan) for _ in range(3))
    sel = (res.op == op) & (res.s != 0)
    for w in range(phases + 1):
        inw = sel if w == phases else sel & (res.step >= edges[w]) & (res.step < edges[w + 1])
        for li in range(L):
            v = inw & np.isfinite(res.pred[:, li])
            count[li, w] = v.sum()
            if v.any():
                pred[li, w] = res.pred[v, li].mean()
                stale[li, w] = res.stale[v, li].mean()
    return pred, stale, count


def window_ratio(res: InPipelineResult, phases: int = 5, op: str | None = None) -> np.ndarray:
    """``[layers, phases + 1]``: RMSE predicted / stale per window (< 1: prediction helps); NaN where nothing
    was predicted (or the stale weights were exact)."""
    pred, stale, _ = window_means(res, phases, op)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(stale > 0, pred / stale, np.nan)


def in_pipeline_rows(res: InPipelineResult, phases: int = 5) -> list[dict[str, Any]]:
    """One row per stage × layer × window (and ``"all"``) of the predicted op: the CSV's records."""
    op = res.predicted_op
    pred, stale, count = window_means(res, phases, op)
    edges, ss = phase_edges(res, phases), res.stage_s(op)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(stale > 0, pred / stale, np.nan)
    out = []
    for li, name in enumerate(res.layers):
        k = res.layer_stage[li]
        for w in range(phases + 1):
            first, last = (0, res.steps) if w == phases else (int(edges[w]), int(edges[w + 1]))
            out.append({"policy": res.policy, "optimizer": res.optimizer, "D": res.D, "stage": k,
                        "s": ss[k], "op": op, "layer": name, "phase": "all" if w == phases else str(w),
                        "step_from": first, "step_to": last, "jobs": int(count[li, w]),
                        "rmse_predicted": float(pred[li, w]), "rmse_stale": float(stale[li, w]),
                        "ratio": float(ratio[li, w])})
    return out


def left_chance_at(res: PredictionErrorResult, classes: int = 10, window: int = 10, fraction: float = 0.9
                   ) -> int | None:
    """First step t whose trailing mean loss, over steps t − window + 1 .. t, is below fraction · ln(classes).

    ln(classes) is the cross-entropy of a uniform guess (chance level); a run that starts on the plateau
    there leaves it at the returned step (``None``: never, or diverged first). Steps count from 1.
    """
    if classes < 2 or window < 1 or not 0 < fraction < 1:
        raise ValueError(f"need classes >= 2, window >= 1 and 0 < fraction < 1, got {classes}, {window}, "
                         f"{fraction}")
    loss = np.asarray(res.loss, float)
    if len(loss) < window:
        return None
    trailing = np.convolve(loss, np.ones(window) / window, mode="valid")  # trailing[i]: steps i+1..i+window
    below = np.flatnonzero(trailing < fraction * math.log(classes))
    return int(below[0]) + window if below.size else None
