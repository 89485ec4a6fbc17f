"""Figures of the learning-curves notebook: how the staleness policies train, compared with sequential.

- ``learning_curves``: training loss and test accuracy per epoch (mean ± 1 std over seeds) for every
  task × optimizer, all policies at depth D;
- ``final_accuracy_table``: best test accuracy (max over epochs, as PipeOptim's Table IV) as mean ± std
  over seeds, per task × optimizer × policy, drawn as a table and written as CSV;
- ``accuracy_gap_vs_depth``: best test accuracy minus the sequential baseline's, against D.

All runs go through :func:`pipelab.learning_curves.sweep` (cached per run), so the three figures share
their D=4 runs.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from ..config import from_preset
from ..learning_curves import ARM_POLICIES, grid, sweep
from ..optim import optimizer_label
from ..policies import policy_info
from . import FigureOutput, register

#: the learning-curve arms in registry order, and their legend labels (:attr:`pipelab.policies.Policy.title`)
POLICY_ORDER = tuple(ARM_POLICIES)
LABELS = {p: policy_info(p).title for p in POLICY_ORDER}


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class LearningCurvesConfig:
    """The learning-curve grid (see :class:`pipelab.learning_curves.RunConfig` for the run fields)."""

    tasks: tuple[str, ...]
    optimizers: tuple[str, ...]
    policies: tuple[str, ...]
    D: int
    seeds: tuple[int, ...]
    epochs: int
    batch_size: int
    n_train: int | None
    n_test: int | None
    n_eval_train: int
    depths: tuple[int, ...]
    gap_tasks: tuple[str, ...]
    device: str = "cpu"

    def common(self) -> dict:
        return dict(epochs=self.epochs, batch_size=self.batch_size, n_train=self.n_train, n_test=self.n_test,
                    n_eval_train=self.n_eval_train, device=self.device)


_QUICK_POLICIES = ("sequential", "vanilla", "stashing", "2bw", "spectrain", "pipeoptim", "pipemare")


def _presets() -> dict[str, LearningCurvesConfig]:
    return {
        "tiny": LearningCurvesConfig(("digits_mlp",), ("sgdm",), ("sequential", "stashing", "pipeoptim"), 4, (0,),
                                     epochs=1, batch_size=32, n_train=512, n_test=200, n_eval_train=200,
                                     depths=(4,), gap_tasks=("digits_mlp",)),
        "quick": LearningCurvesConfig(("fashion_mnist_mlp", "mnist1d_mlp", "digits_mlp"), ("sgdm", "adam", "adamw"),
                                      _QUICK_POLICIES, 4, (0, 1, 2), epochs=5, batch_size=64, n_train=5120,
                                      n_test=2000, n_eval_train=2000, depths=(4, 8),
                                      gap_tasks=("fashion_mnist_mlp",)),
        "paper": LearningCurvesConfig(("fashion_mnist_mlp", "fashion_mnist_cnn", "fashion_mnist_resnet",
                                       "mnist1d_mlp", "digits_mlp"), ("sgdm", "adam", "adamw"), POLICY_ORDER, 4,
                                      (0, 1, 2, 3, 4), epochs=20, batch_size=64, n_train=None, n_test=None,
                                      n_eval_train=10_000, depths=(4, 8),
                                      gap_tasks=("fashion_mnist_mlp", "fashion_mnist_resnet", "mnist1d_mlp"),
                                      device=_device()),
    }


def _config(preset: str) -> LearningCurvesConfig:
    return from_preset(_presets(), preset)


def _runs(cfg: LearningCurvesConfig, Ds: tuple[int, ...], tasks: tuple[str, ...], progress: bool) -> list[dict]:
    configs = grid(tasks, cfg.policies, cfg.optimizers, Ds, cfg.seeds, **cfg.common())
    return sweep(configs, progress=progress)


def _group(records: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        out[(r["task"], r["optimizer"], r["D"], r["policy"])].append(r)
    return out


_COLOR_INDEX = {"pipemare": 0, "vanilla": 5, "spectrain": 2, "pipeoptim": 3, "stashing": 4, "vertical_sync": 7,
                "2bw": 6, "gpipe": 9, "1f1b": 8}


def _colors(policies: Sequence[str]) -> dict[str, tuple]:
    """One distinct colour-blind-safe colour per policy; sequential in black."""
    import seaborn as sns

    pal = sns.color_palette("colorblind", 10)
    return {p: ((0, 0, 0) if p == "sequential" else pal[_COLOR_INDEX[p]]) for p in policies}


def _best(r: dict) -> float:
    acc = np.asarray(r["test_acc"], dtype=float)
    return float(np.nanmax(acc)) if np.isfinite(acc).any() else math.nan


def summary_rows(records: list[dict]) -> list[dict]:
    """Per (task, optimizer, D, policy): best and final test accuracy, mean and std over seeds, divergences."""
    rows = []
    for (task, opt, D, pol), rs in sorted(_group(records).items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2], POLICY_ORDER.index(kv[0][3]))):
        best = np.array([_best(r) for r in rs])
        final = np.array([r["test_acc"][-1] for r in rs], dtype=float)
        rows.append({"task": task, "optimizer": opt, "D": D, "policy": pol, "seeds": len(rs),
                     "diverged": int(sum(r["diverged"] for r in rs)),
                     "best_mean": float(np.nanmean(best)) if np.isfinite(best).any() else math.nan,
                     "best_std": float(np.nanstd(best)) if np.isfinite(best).any() else math.nan,
                     "final_mean": float(np.nanmean(final)) if np.isfinite(final).any() else math.nan,
                     "final_std": float(np.nanstd(final)) if np.isfinite(final).any() else math.nan,
                     "weight_copies": rs[0]["weight_copies"]})
    return rows


@register("learning_curves", "Training loss and test accuracy per epoch of every staleness policy (mean ± std "
                             "over seeds), per task and optimizer")
def learning_curves(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    records = _runs(cfg, (cfg.D,), cfg.tasks, progress)
    groups = _group(records)
    nrow, ncol = len(cfg.tasks), 2 * len(cfg.optimizers)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.3 * ncol, 2.7 * nrow + 0.9), squeeze=False)
    colors = _colors(cfg.policies)
    handles: dict[str, Any] = {}
    for i, task in enumerate(cfg.tasks):
        for o, opt in enumerate(cfg.optimizers):
            ax_l, ax_a = axes[i, 2 * o], axes[i, 2 * o + 1]
            for pol in cfg.policies:
                rs = groups.get((task, opt, cfg.D, pol))
                if not rs:
                    continue
                ep = np.asarray(rs[0]["epoch"])
                div = sum(r["diverged"] for r in rs)
                label = LABELS[pol] + (f" ({div}/{len(rs)} diverged)" if div else "")
                style = dict(color=colors[pol], lw=2.0 if pol in ("sequential", "pipeoptim") else 1.3,
                             ls="--" if pol == "sequential" else "-")
                for ax, key in ((ax_l, "train_loss"), (ax_a, "test_acc")):
                    y = np.array([r[key] for r in rs], dtype=float)
                    if key == "test_acc":
                        y = 100 * y
                    with np.errstate(invalid="ignore"), _quiet():
                        m, s = np.nanmean(y, 0), np.nanstd(y, 0)
                    (h,) = ax.plot(ep, m, label=label, **style)
                    ax.fill_between(ep, m - s, m + s, color=colors[pol], alpha=0.15, lw=0)
                handles.setdefault(pol, h)
            ax_l.set_yscale("log")
            ax_l.set_title(f"{task} · {optimizer_label(opt)}: train loss", fontsize=9)
            ax_a.set_title(f"{task} · {optimizer_label(opt)}: test acc. (%)", fontsize=9)
            for ax in (ax_l, ax_a):
                ax.set_xlabel("epoch")
    fig.suptitle(f"Learning curves, D={cfg.D} stages, mean ± 1 std over {len(cfg.seeds)} seed(s) "
                 "(SpecTrain runs with SGDM only)", y=0.998, fontsize=11)
    top = 1 - 0.75 / fig.get_figheight()
    fig.legend(handles=[handles[p] for p in cfg.policies if p in handles],
               labels=[LABELS[p] for p in cfg.policies if p in handles], loc="upper center",
               bbox_to_anchor=(0.5, top + 0.02), ncol=min(len(handles), 7), frameon=False,
               fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, top - 0.01))
    rows = summary_rows(records)
    return FigureOutput(fig, cfg, cfg.seeds[0], data=records,
                        notes={"runs": len(records), "seconds": round(sum(r["seconds"] for r in records), 1),
                               "final_test_acc": {f"{r['task']}/{r['optimizer']}/{r['policy']}":
                                                  round(100 * r["final_mean"], 2) for r in rows}})


def _fmt(mean: float, std: float) -> str:
    return "diverged" if not math.isfinite(mean) else f"{100 * mean:.2f} ± {100 * std:.2f}"


def table_csv(rows: list[dict]) -> str:
    """CSV of :func:`summary_rows` (accuracies in percent)."""
    buf = io.StringIO()
    cols = ["task", "optimizer", "D", "policy", "seeds", "diverged", "best_mean", "best_std", "final_mean",
            "final_std", "weight_copies"]
    buf.write(",".join(cols) + "\n")
    for r in rows:
        vals = []
        for c in cols:
            v = r[c]
            if c.endswith(("_mean", "_std")):
                v = "" if not math.isfinite(v) else f"{100 * v:.2f}"
            elif c == "weight_copies":
                v = " ".join(map(str, v))
            vals.append(str(v))
        buf.write(",".join(vals) + "\n")
    return buf.getvalue()


@register("final_accuracy_table", "Best test accuracy (mean ± std over seeds) per task, optimizer and policy, "
                                  "as PipeOptim's Table IV; also written as CSV")
def final_accuracy_table(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    records = _runs(cfg, (cfg.D,), cfg.tasks, progress)
    rows = summary_rows(records)
    pols = [p for p in cfg.policies if any(r["policy"] == p for r in rows)]
    keys = sorted({(r["task"], r["optimizer"]) for r in rows},
                  key=lambda k: (cfg.tasks.index(k[0]), cfg.optimizers.index(k[1])))
    by = {(r["task"], r["optimizer"], r["policy"]): r for r in rows}
    cells: list[list[str]] = []
    bold: list[int | None] = []
    for task, opt in keys:
        line: list[str] = []
        best_val, best_j = -1.0, None
        for j, p in enumerate(pols):
            r = by.get((task, opt, p))
            if r is None:
                line.append("n/a")
                continue
            txt = _fmt(r["best_mean"], r["best_std"]) + (f" ({r['diverged']}✗)" if r["diverged"] else "")
            line.append(txt)
            if p != "sequential" and math.isfinite(r["best_mean"]) and r["best_mean"] > best_val:
                best_val, best_j = r["best_mean"], j
        cells.append(line)
        bold.append(best_j)
    fig, ax = plt.subplots(figsize=(1.55 * len(pols) + 2.4, 0.3 * len(keys) + 0.8))
    ax.axis("off")
    tab = ax.table(cellText=cells, rowLabels=[f"{t} · {optimizer_label(o)}" for t, o in keys],
                   colLabels=[LABELS[p] for p in pols], loc="center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(8)
    tab.scale(1, 1.35)
    for i, col in enumerate(bold):
        if col is not None:
            tab[i + 1, col].set_text_props(fontweight="bold")
    ax.set_title(f"Best test accuracy (%) over {cfg.epochs} epochs, D={cfg.D}, mean ± std over {len(cfg.seeds)} "
                 "seed(s); bold: best pipelined policy; n/a: SpecTrain needs SGDM; ✗: diverged runs", fontsize=9)
    fig.tight_layout()
    return FigureOutput(fig, cfg, cfg.seeds[0], tables={"csv": table_csv(rows)}, data=rows,
                        notes={"rows": len(rows)})


@register("accuracy_gap_vs_depth", "Best test accuracy of each policy minus the sequential baseline's, "
                                   "against the number of stages D")
def accuracy_gap_vs_depth(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    records = _runs(cfg, cfg.depths, cfg.gap_tasks, progress)
    groups = _group(records)
    colors = _colors(cfg.policies)
    panels = [(t, o) for t in cfg.gap_tasks for o in cfg.optimizers]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    gaps: dict[str, float] = {}
    for ax, (task, opt) in zip(axes[0], panels):
        for pol in cfg.policies:
            if pol == "sequential":
                continue
            xs: list[int] = []
            ms: list[float] = []
            ss: list[float] = []
            for D in cfg.depths:
                base, rs = groups.get((task, opt, D, "sequential")), groups.get((task, opt, D, pol))
                if not base or not rs:
                    continue
                # same seed, same data order: the gap is paired by seed
                b = {r["seed"]: _best(r) for r in base}
                g = np.array([100 * (_best(r) - b[r["seed"]]) for r in rs if r["seed"] in b])
                with _quiet():
                    xs.append(D)
                    ms.append(float(np.nanmean(g)))
                    ss.append(float(np.nanstd(g)))
                gaps[f"{task}/{opt}/{pol}/D={D}"] = round(float(ms[-1]), 2)
            if xs:
                ax.errorbar(xs, ms, yerr=ss, color=colors[pol], marker="o", capsize=3, label=LABELS[pol])
        ax.axhline(0, color="k", ls="--", lw=1)
        ax.set_xticks(list(cfg.depths))
        ax.set_xlabel("stages D")
        ax.set_title(f"{task} · {optimizer_label(opt)}", fontsize=9)
    axes[0, 0].set_ylabel("best test acc. − sequential (pp)")
    # one legend for all panels: a policy may run in some panels only (SpecTrain with SGDM)
    handles = {label: h for ax in axes[0] for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"Accuracy gap to sequential training vs pipeline depth ({len(cfg.seeds)} seed(s), "
                 "paired by seed; bars: ±1 std)", fontsize=10)
    fig.tight_layout()
    return FigureOutput(fig, cfg, cfg.seeds[0], data=records, notes={"gap_pp": gaps})


class _quiet:
    """Silence numpy's warnings about all-NaN slices (diverged arms)."""

    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: Any) -> None:
        self._w.__exit__(*exc)
