"""The paper-regime task: ResNet-20 trained with SGD momentum under the papers' pipelines, on a GPU.

Figure ``paper_resnet20`` (``paper`` preset): ResNet-20 (He et al., CVPR 2016, §4.2; GroupNorm, Fashion-MNIST:
:data:`~pipelab.studies.settings.TASKS` says why) trained by SGD with momentum (PipeOptim §V-A's setting,
:data:`~pipelab.studies.settings.ARM_OPTIMIZER_SETTINGS`: lr 0.01, momentum 0.9, decay 5e-4), D = 4 stages, batch
128, 3 seeds, under the sequential baseline, PipeDream's weight stashing, PipeOptim's and SpecTrain's weight
prediction and PipeDream-2BW, each run in the exact emulator on the preset's device (``cuda`` when there is one).
No rate is tuned: every arm runs the papers' common rate, so the comparison is of the policies at that rate.

Panels: (a) validation accuracy per epoch, mean and 95 % t band over the seeds; (b) each seed's test accuracy at
the epoch its validation accuracy selects (the test set never selects), the mean and its 95 % t interval, diverged
seeds as crosses below the axis, left out of the interval and counted; (c) the training loss per epoch. The papers'
claims that these five arms can decide are decided by :func:`pipelab.studies.claims.claims_markdown`'s rule (paired
t by seed, Holm over a claim's rows: here one row) and written beside the figure (``NAME.claims.md``), with every run
(``NAME.runs.csv``).

The ``tiny`` preset runs the same code on the digits MLP on the CPU (a check that it runs, not a result).
"""

from __future__ import annotations

from collections import defaultdict

import matplotlib.pyplot as plt
import numpy as np

from ...optim import optimizer_label
from ...statistics import t_interval
from ..claims import claims_markdown
from ..config import from_preset
from ..learning_curves import sweep
from . import FigureOutput, register
from .learning_curves import LABELS, LearningCurvesConfig, _best, _colors, _device, arm_configs, runs_csv

__all__ = ["PAPER_POLICIES"]

#: the arms of the paper-regime task, in plotting order
PAPER_POLICIES = ("sequential", "stashing", "pipeoptim", "spectrain", "2bw")


def _presets() -> dict[str, LearningCurvesConfig]:
    return {
        "tiny": LearningCurvesConfig(("digits_mlp",), ("sgdm",), PAPER_POLICIES, 4, (0, 1), epochs=2, batch_size=32,
                                     n_train=512, n_test=200, n_eval_train=200, depths=(4,), gap_tasks=(), n_val=64),
        # 7 epochs of 156 steps (20,000 training images after the 5,000 held out for validation), sized to one lent
        # GPU's 10-minute command beside the CUDA tests. Measured there with 3 stacked seeds in one process, the
        # evaluations included: on an H100 (2026-11-26, 12 epochs) 49 (sequential), 43 (stashing), 55 (PipeOptim) and
        # 60 ms (SpecTrain) per step, and 2BW (M = D micro-batches: ~3x the kernel launches) past 121 ms (it did not
        # finish in 227 s) -- 12 epochs need ≈ 11 minutes there; on an H200 (benchmarks/learning_curves_speed.py)
        # 27.5, 27.1, 36.0, 31.4 and 76.9 ms. So ≈ 0.36 s per step of all five arms: ≈ 6.5 minutes for 7 epochs;
        # measured on an H100 (2026-11-27, benchmarks/gpu_session.sh after the CUDA tests): the 15 runs in 421 s
        "paper": LearningCurvesConfig(("fashion_mnist_resnet20",), ("sgdm",), PAPER_POLICIES, 4, (0, 1, 2), epochs=7,
                                      batch_size=128, n_train=25_000, n_test=None, n_eval_train=5000, depths=(4,),
                                      gap_tasks=(), device=_device(), n_val=5000),
    }


def _by_policy(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r["seed"]):
        out[r["policy"]].append(r)
    return out


def _band(rs: list[dict], key: str, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Epochs (from 1), the mean of ``key`` over the seeds still finite at each epoch and its 95 % t band."""
    y = scale * np.array([r[key][1:] for r in rs], dtype=float)
    ivs = [t_interval(y[:, e]) for e in range(y.shape[1])]
    m = np.array([iv.mean for iv in ivs])
    h = np.nan_to_num(np.array([iv.half_width for iv in ivs]))
    lo, hi = m - h, m + h
    if scale == 100:  # an accuracy: with few seeds the t band reaches past what an accuracy can be
        lo, hi = np.clip(lo, 0, 100), np.clip(hi, 0, 100)
    return np.asarray(rs[0]["epoch"][1:]), m, lo, hi


@register("paper_resnet20", "ResNet-20 with SGD momentum, D=4, 3 seeds, under sequential, stashing, PipeOptim, "
          "SpecTrain and 2BW on a GPU: validation curves, selected test accuracy, training loss, the claims decided",
          presets=("tiny", "paper"), budget={"tiny": 30})
def paper_resnet20(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_presets(), preset)
    # one process per GPU: processes sharing one card take turns on it (5 at once ran each 4.6× slower, measured)
    workers = 1 if cfg.device.startswith("cuda") else None
    records = sweep(arm_configs(cfg, cfg.depths, cfg.tasks), progress=progress, desc="paper task", workers=workers)
    arms = _by_policy(records)
    colors = _colors(list(arms))
    fig, (ax_val, ax_sel, ax_loss) = plt.subplots(1, 3, figsize=(14, 4.2))
    val_low = 100.0  # the lowest mean validation accuracy plotted: every arm's curve stays inside panel (a)
    for pol, rs in arms.items():
        e, m, lo, hi = _band(rs, "val_acc", 100)
        val_low = min(val_low, float(np.nanmin(m)))
        ax_val.plot(e, m, color=colors[pol], label=LABELS[pol])
        ax_val.fill_between(e, lo, hi, color=colors[pol], alpha=0.15, lw=0)
        e, m, _, _ = _band(rs, "train_loss")
        ax_loss.plot(e, m, color=colors[pol])
    finite = [100 * _best(r) for rs in arms.values() for r in rs if not r["diverged"]]
    low = min(finite, default=0.0)
    summary: dict[str, dict] = {}
    for i, (pol, rs) in enumerate(arms.items()):
        sel = np.array([np.nan if r["diverged"] else 100 * _best(r) for r in rs])
        iv = t_interval(sel)
        jitter = np.linspace(-0.12, 0.12, len(rs))
        ax_sel.scatter(i + jitter, sel, color=colors[pol], s=18, zorder=3)
        ax_sel.errorbar(i + 0.3, iv.mean, yerr=iv.half_width if np.isfinite(iv.half_width) else None, fmt="o",
                        color=colors[pol], capsize=3)
        if iv.n_nan:
            ax_sel.scatter([i] * iv.n_nan, [low - 0.5] * iv.n_nan, marker="x", color=colors[pol], clip_on=False)
        summary[pol] = {"mean_pp": round(iv.mean, 2), "ci95_pp": round(iv.half_width, 2), "seeds": iv.n,
                        "diverged": iv.n_nan}
    ax_sel.set_xticks(range(len(arms)), [LABELS[p] for p in arms], rotation=30, ha="right", fontsize=8)
    ax_sel.set_ylim(low - 1.0, None)
    r0 = records[0]
    head = f"{cfg.tasks[0]} · {optimizer_label(cfg.optimizers[0])} · D={cfg.D} · {len(cfg.seeds)} seeds"
    ax_val.set(xlabel="epoch", ylabel="validation accuracy (%)", title=f"{head}\nvalidation accuracy (n={cfg.n_val})")
    ax_val.set_ylim(max(min(low - 5.0, val_low - 2.0), 0.0), None)
    ax_val.legend(fontsize=8, loc="lower right")
    ax_sel.set(ylabel="test accuracy (%)", title=f"test accuracy at the validation-selected epoch\n"
               f"(n={r0['n_test']}; mean ± 95% t; × diverged)")
    ax_loss.set(xlabel="epoch", ylabel="training loss", yscale="log",
                title=f"training loss (on {cfg.n_eval_train} training examples)")
    fig.tight_layout()
    notes = {
        "device": sorted({r.get("device_name", r["device"]) for r in records}),
        "torch": sorted({r["torch"] for r in records if "torch" in r}),
        "steps": int(r0["steps_per_epoch"]) * cfg.epochs,
        "selected_test_acc": summary,
        "statistic": "mean ± 95% Student-t half-width over seeds, each run read at its validation-selected epoch",
    }
    return FigureOutput(fig, cfg, cfg.seeds[0], data=records, notes=notes,
                        tables={"runs.csv": runs_csv(records), "claims.md": claims_markdown(records) + "\n"})
