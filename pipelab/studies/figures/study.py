"""Figures of the learning-curve study: the learning-rate map with the stability threshold, and tuned vs common rates.

- ``study_lr_map``: for every task × optimizer (rows) and depth D (columns), the validation accuracy of each policy
  (y) at each rate of its grid (x) after the first round of successive halving (every rate, ``min_epochs`` epochs);
  × marks a diverged run and a box the rate the halving selected. On the SGDM panels two vertical lines place the
  linear stability analysis on the same axis: the heavy-ball threshold η* = z*(β, τ)/λ_max for delay τ = 0
  (sequential) and τ = D − 1 (the first stage of asynchronous 1F1B), with z* =
  :func:`~pipelab.stability.max_stable_step` of :func:`~pipelab.stability.heavy_ball` (β = 0.9, torch's form) and
  λ_max the top Hessian eigenvalue of the task's training loss at initialisation (:func:`curvature`). Adam has no
  such line: its threshold is in preconditioned units (notebook 03).
- ``study_tuned_table``: each arm's best test accuracy at its tuned rate beside the common rate's
  (:data:`pipelab.studies.settings.ARM_OPTIMIZER_SETTINGS`), mean ± 95% t over the seeds, and the paired difference.

:data:`STUDY_FIGURES` lists what ``pipelab figures --preset study`` draws (into ``figures/study/``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from ...optim import optimizer_label
from ...statistics import paired_difference, resolved, t_interval
from ..cache import cached
from ..tuning import close_decisions
from . import FigureOutput, register
from .learning_curves import LABELS, POLICY_ORDER, _best, _config, _lr, _runs, tuned_arms

__all__ = ["STUDY_FIGURES", "CurvatureConfig", "curvature", "threshold_lrs", "lr_map_rows", "tuned_rows"]

#: the figures of the ``study`` preset, in the order the CLI draws them
STUDY_FIGURES: tuple[str, ...] = ("study_lr_map", "study_tuned_table", "learning_curves", "learning_curves_by_policy",
                                  "final_accuracy_table", "accuracy_gap_vs_depth", "time_to_accuracy")

_TUNED_PRESETS = ("tiny", "study", "paper")


@dataclass(frozen=True)
class CurvatureConfig:
    """Where the top Hessian eigenvalue is measured: ``task``'s model at its He initialisation for ``seed``, on its
    first ``n_examples`` training examples, in float64."""

    task: str
    seed: int = 0
    n_examples: int = 1024
    iters: int = 100


def _curvature(cfg: CurvatureConfig) -> float:
    import torch

    from ...stability import top_eigenvalue
    from ..learning_curves import RunConfig, prepare

    prep = prepare(RunConfig(task=cfg.task, policy="sequential", optimizer="sgd", D=1, seed=cfg.seed, epochs=1,
                             batch_size=1, n_train=cfg.n_examples, n_test=1, dtype="float64"))
    x, y = prep.data.x_train[: cfg.n_examples], prep.data.y_train[: cfg.n_examples]
    return top_eigenvalue(prep.stages, torch.nn.functional.cross_entropy, [(x, y)], iters=cfg.iters,
                          dtype=torch.float64).value


def curvature(task: str, seed: int = 0, n_examples: int = 1024) -> float:
    """λ_max: the top Hessian eigenvalue of ``task``'s mean training loss at initialisation (cached)."""
    return float(cached("hessian_top", CurvatureConfig(task, seed, n_examples), _curvature))


def threshold_lrs(eigenvalue: float, D: int, beta: float = 0.9) -> dict[int, float]:
    """``τ -> η*``: the heavy-ball learning rate at which the quadratic with curvature ``eigenvalue`` turns unstable
    under gradient delay τ, for τ = 0 and τ = D − 1 (:func:`~pipelab.stability.max_stable_step`)."""
    from ...stability import heavy_ball, lr_threshold, max_stable_step

    return {tau: lr_threshold(max_stable_step(heavy_ball(beta, tau)), eigenvalue) for tau in sorted({0, D - 1})}


def _grid_position(lr: float, lrs: list[float]) -> float:
    """Where ``lr`` falls on a heat map whose columns are the log-spaced ``lrs`` (clipped to the map's edges)."""
    return float(np.interp(math.log(lr), np.log(np.asarray(lrs)), np.arange(len(lrs)), left=-0.5,
                           right=len(lrs) - 0.5))


def lr_map_rows(halvings: list[Any]) -> list[dict]:
    """One row per (arm, rate): the first round's validation accuracy (NaN when diverged), the later rounds' scores
    where the rate ran, and whether the halving selected it."""
    rows = []
    for h in halvings:
        b = h.base
        for r, rnd in enumerate(h.rounds):
            for lr, score in zip(rnd.lrs, rnd.scores):
                rows.append({"task": b.task, "optimizer": b.optimizer, "D": b.D, "policy": b.policy, "round": r,
                             "epochs": rnd.epochs, "lr": lr, "val_acc": score if math.isfinite(score) else math.nan,
                             "diverged": score == -math.inf, "selected": lr == h.lr})
    return rows


def _csv(rows: list[dict], cols: tuple[str, ...]) -> str:
    buf = io.StringIO()
    buf.write(",".join(cols) + "\n")
    for r in rows:
        buf.write(",".join("" if (isinstance(r[c], float) and not math.isfinite(r[c])) else
                           (f"{r[c]:.6g}" if isinstance(r[c], float) else str(r[c])) for c in cols) + "\n")
    return buf.getvalue()


@register("study_lr_map", "Validation accuracy per policy and learning rate (first halving round) per task, optimizer "
          "and D, divergence marked, the selected rate boxed, with the heavy-ball stability threshold from the "
          "measured top Hessian eigenvalue", presets=_TUNED_PRESETS,
          budget={"tiny": 60})
def study_lr_map(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    if cfg.tuning is None:
        raise ValueError(f"preset {preset!r} tunes no learning rates; study_lr_map needs one of {_TUNED_PRESETS}")
    halvings = tuned_arms(cfg, cfg.depths, cfg.tasks, progress)
    rows = lr_map_rows(halvings)
    panels = sorted({(r["task"], r["optimizer"], r["D"]) for r in rows},
                    key=lambda p: (cfg.tasks.index(p[0]), cfg.optimizers.index(p[1]), p[2]))
    # only the SGDM panels carry a threshold (and torch has no double backward through CPU flash attention, so the
    # Transformer's Hessian could not be measured here anyway)
    lams = {task: curvature(task) for task in cfg.tasks if "sgdm" in cfg.optimizers_of(task)}
    ncol = min(len(panels), 4)
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.9 * ncol, 2.9 * nrow + 0.9), squeeze=False)
    thresholds: dict[str, dict[int, float]] = {}
    for ax, (task, opt, D) in zip(axes.flat, panels):
        first = [r for r in rows if (r["task"], r["optimizer"], r["D"], r["round"]) == (task, opt, D, 0)]
        pols = [p for p in POLICY_ORDER if any(r["policy"] == p for r in first)]
        lrs = sorted({r["lr"] for r in first})
        img = np.full((len(pols), len(lrs)), np.nan)
        for r in first:
            img[pols.index(r["policy"]), lrs.index(r["lr"])] = 100 * r["val_acc"]
        im = ax.imshow(img, aspect="auto", cmap="viridis", vmin=np.nanmin(img) if np.isfinite(img).any() else 0,
                       vmax=np.nanmax(img) if np.isfinite(img).any() else 100)
        for r in first:
            i, j = pols.index(r["policy"]), lrs.index(r["lr"])
            if r["diverged"]:
                ax.text(j, i, "×", ha="center", va="center", color="red", fontsize=11, fontweight="bold")
            else:
                ax.text(j, i, f"{100 * r['val_acc']:.0f}", ha="center", va="center", color="white", fontsize=6.5)
        for h in halvings:
            b = h.base
            if (b.task, b.optimizer, b.D) == (task, opt, D) and b.policy in pols and h.lr is not None:
                ax.add_patch(plt.Rectangle((lrs.index(h.lr) - 0.5, pols.index(b.policy) - 0.5), 1, 1, fill=False,
                                           ec="orange", lw=2))
        if opt == "sgdm" and len(lrs) > 1:
            thr = threshold_lrs(lams[task], D)
            thresholds[f"{task}/D={D}"] = thr
            for tau, lr in thr.items():
                x = _grid_position(lr, lrs)
                ax.axvline(x, color="white" if tau == 0 else "red", ls="-" if tau == 0 else "--", lw=1.5)
                ax.text(x, len(pols) - 0.55, f"τ={tau}", color="red" if tau else "white", fontsize=6.5, ha="center",
                        va="bottom", fontweight="bold")
        ax.set_xticks(range(len(lrs)), [f"{lr:.0e}" for lr in lrs], fontsize=7)
        ax.set_yticks(range(len(pols)), [LABELS[p] for p in pols], fontsize=7)
        ax.set_xlabel("learning rate", fontsize=8)
        ax.set_title(f"{task} · {optimizer_label(opt)} · D={D}", fontsize=8.5)
        fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02).ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_axis_off()
    tn = cfg.tuning
    lam_text = ", ".join(f"{t}: λ_max={v:.3g}" for t, v in lams.items())
    fig.suptitle(f"Validation accuracy (%) after {tn.min_epochs} epoch(s), every rate of the grid (n_val={cfg.n_val}, "
                 f"tuning seed(s) {list(tn.seeds)}); × diverged; orange box: rate selected by successive halving "
                 f"(η={tn.eta}, up to {tn.max_epochs or 'the full budget of'} epochs)\n"
                 f"SGDM panels: heavy-ball threshold z*(β=0.9, τ)/λ_max, "
                 f"white τ=0, red dashed τ=D−1 ({lam_text}, at initialisation); preset {preset}", fontsize=8.5)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    cols = ("task", "optimizer", "D", "policy", "round", "epochs", "lr", "val_acc", "diverged", "selected")
    return FigureOutput(fig, cfg, tn.seeds[0], tables={"csv": _csv(rows, cols)}, data=rows,
                        notes={"eigenvalue": lams, "threshold_lr": {k: {str(t): v for t, v in thr.items()}
                                                                    for k, thr in thresholds.items()},
                               "selected_lr": {f"{h.base.task}/{h.base.optimizer}/{h.base.policy}/D={h.base.D}": h.lr
                                               for h in halvings},
                               "close_decisions": list(close_decisions(halvings)),
                               "extended": {_arm_name(h): list(h.extended) for h in halvings if h.extended},
                               "on_edge": [_arm_name(h) for h in halvings if h.on_edge]})


def _arm_name(h: Any) -> str:
    return f"{h.base.task}/{h.base.optimizer}/{h.base.policy}/D={h.base.D}"


def tuned_rows(tuned: list[dict], common: list[dict]) -> list[dict]:
    """Per arm: test accuracy at the validation-selected epoch, at the tuned and at the common rate (mean and 95% t
    over the seeds that did not diverge, the diverged counted), their paired difference tuned − common (by seed), and
    ``common_runs`` (0: the arm was never run at the common rate)."""
    def by_arm(records: list[dict]) -> dict[tuple, list[dict]]:
        out: dict[tuple, list[dict]] = {}
        for r in records:
            out.setdefault((r["task"], r["optimizer"], r["D"], r["policy"]), []).append(r)
        return out

    t_arms, c_arms = by_arm(tuned), by_arm(common)
    rows = []
    for key in sorted(t_arms, key=lambda k: (k[0], k[1], k[2], POLICY_ORDER.index(k[3]))):
        task, opt, D, pol = key
        ts, cs = t_arms[key], c_arms.get(key, [])
        # a diverged run is counted beside the interval, never inside it
        tb = {r["seed"]: math.nan if r["diverged"] else _best(r) for r in ts}
        cb = {r["seed"]: math.nan if r["diverged"] else _best(r) for r in cs}
        ti, ci = t_interval(list(tb.values())), t_interval(list(cb.values()))
        shared = sorted(set(tb) & set(cb))
        diff = paired_difference({s: tb[s] for s in shared}, {s: cb[s] for s in shared}) if shared else None
        rows.append({"task": task, "optimizer": opt, "D": D, "policy": pol, "seeds": len(ts),
                     "tuned_lr": _lr(ts[0]), "tuned_mean": ti.mean, "tuned_ci95": ti.half_width,
                     "tuned_diverged": sum(r["diverged"] for r in ts),
                     "common_runs": len(cs),
                     "common_lr": _lr(cs[0]) if cs else math.nan, "common_mean": ci.mean, "common_ci95": ci.half_width,
                     "common_diverged": sum(r["diverged"] for r in cs),
                     "diff_mean": diff.mean if diff else math.nan, "diff_ci95": diff.half_width if diff else math.nan,
                     "diff_resolved": bool(diff and resolved(diff)), "n_test": int(ts[0]["n_test"])})
    return rows


def _cell(mean: float, half: float, div: int, runs: int) -> str:
    """One arm's cell: blank when it was never run, ``diverged (k✗)`` when every run diverged, else mean ± 95% t
    over the finite runs with the diverged ones counted."""
    if not runs:
        return ""
    if not math.isfinite(mean):
        return f"diverged ({div}✗)"
    return f"{100 * mean:.1f}" + (f"±{100 * half:.1f}" if math.isfinite(half) else "") + (f" {div}✗" if div else "")


@register("study_tuned_table", "Best test accuracy per arm at its tuned learning rate vs the common rate (mean ± 95% "
          "t over seeds, paired difference), per task, optimizer, D and policy", presets=_TUNED_PRESETS,
          budget={"tiny": 60})
def study_tuned_table(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    if cfg.tuning is None:
        raise ValueError(f"preset {preset!r} tunes no learning rates; study_tuned_table needs one of {_TUNED_PRESETS}")
    tuned = _runs(cfg, cfg.depths, cfg.tasks, progress, lr="tuned")
    common = _runs(cfg, cfg.depths, cfg.tasks, progress, lr="common")
    rows = tuned_rows(tuned, common)
    keys = sorted({(r["task"], r["optimizer"], r["D"]) for r in rows},
                  key=lambda k: (cfg.tasks.index(k[0]), cfg.optimizers.index(k[1]), k[2]))
    pols = [p for p in POLICY_ORDER if any(r["policy"] == p for r in rows)]
    by = {(r["task"], r["optimizer"], r["D"], r["policy"]): r for r in rows}
    cells, labels = [], []
    for task, opt, D in keys:
        n_test = next(r["n_test"] for k, r in by.items() if k[:3] == (task, opt, D))
        labels.append(f"{task} · {optimizer_label(opt)} · D={D} (n_test={n_test})")
        line = []
        for p in pols:
            r = by.get((task, opt, D, p))
            if r is None:
                line.append("n/a")
                continue
            d = (f"{100 * r['diff_mean']:+.1f}" + ("*" if r["diff_resolved"] else "")) if math.isfinite(
                r["diff_mean"]) else "–"
            at_common = _cell(r['common_mean'], r['common_ci95'], r['common_diverged'], r['common_runs'])
            # never run at the common rate: blank, not "diverged"
            at_common = f"\n{at_common} (Δ {d})" if r["common_runs"] else ""
            line.append(f"{_cell(r['tuned_mean'], r['tuned_ci95'], r['tuned_diverged'], r['seeds'])} "
                        f"@{r['tuned_lr']:.0e}{at_common}")
        cells.append(line)
    fig, ax = plt.subplots(figsize=(1.9 * len(pols) + 3.4, 0.62 * len(keys) + 1.3))
    ax.axis("off")
    tab = ax.table(cellText=cells, rowLabels=labels, colLabels=[LABELS[p] for p in pols], loc="center",
                   cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(7)
    tab.scale(1, 2.6)
    seeds = len(cfg.seeds)
    ax.set_title(f"Test accuracy (%) at the validation-selected epoch, mean ± 95% t half-width over {seeds} seeds: "
                 f"first line at the arm's tuned rate (@lr, selected on the validation split), second at the common "
                 f"rate ({_common_text(common)}; no second line: not run at it);\nΔ = tuned − common, paired by seed "
                 f"(*: resolved at 95%); k✗: diverged runs, left out of the interval; preset {preset}", fontsize=8)
    fig.tight_layout()
    cols = ("task", "optimizer", "D", "policy", "seeds", "tuned_lr", "tuned_mean", "tuned_ci95", "tuned_diverged",
            "common_runs", "common_lr", "common_mean", "common_ci95", "common_diverged", "diff_mean", "diff_ci95",
            "diff_resolved", "n_test")
    pct = ("tuned_mean", "tuned_ci95", "common_mean", "common_ci95", "diff_mean", "diff_ci95")
    shown = [{c: (100 * r[c] if c in pct else r[c]) for c in cols} for r in rows]
    return FigureOutput(fig, cfg, cfg.seeds[0], tables={"csv": _csv(shown, cols)}, data=rows,
                        notes={"arms": len(rows), "tuned_better_resolved": sum(r["diff_resolved"] and r["diff_mean"] > 0
                                                                              for r in rows),
                               "common_better_resolved": sum(r["diff_resolved"] and r["diff_mean"] < 0 for r in rows)})


def _common_text(records: list[dict]) -> str:
    rates = sorted({(r["optimizer"], _lr(r)) for r in records})
    return ", ".join(f"{optimizer_label(o)} {lr:g}" for o, lr in rates)


# --- notebook 04's statements about the study, written from the committed files -------------------------------


def convergence_markdown(records: list[dict], tol: float = 0.003, window: int = 2) -> str:
    """Which rows converged, by the stated criterion (:class:`~pipelab.studies.settings.Convergence`, read from the
    sidecar's ``config.convergence``): the sequential baseline's validation accuracy (mean over seeds) gains less
    than ``tol`` over its last ``window`` epochs of the stated budget. Lists the converged rows and the others."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r["policy"] == "sequential":
            groups.setdefault((r["task"], r["optimizer"], r["D"]), []).append(r)
    lines = [f"Criterion: a row is converged when its sequential baseline's validation accuracy (mean over seeds) "
             f"gains less than {100 * tol:g} pp over the last {window} epoch(s) of its budget (constant tuned rate; "
             f"the test set plays no part).", ""]
    for (task, opt, D), rs in sorted(groups.items()):
        val = np.nanmean(np.array([r["val_acc"] for r in rs], dtype=float), axis=0)
        if val.size < window + 2 or not np.isfinite(val[-1 - window:]).all():
            lines.append(f"- {task} · {optimizer_label(opt)} · D={D}: no validation curve long enough to judge")
            continue
        gain = float(val[-1] - val[-1 - window])
        verdict = "converged" if gain < tol else "**not converged**"
        lines.append(f"- {task} · {optimizer_label(opt)} · D={D} (lr {_lr(rs[0]):.2g}, {len(val) - 1} epochs): "
                     f"{verdict} — validation accuracy {100 * val[-1 - window]:.2f}% → {100 * val[-1]:.2f}% over the "
                     f"last {window} epoch(s) ({100 * gain:+.2f} pp, {len(rs)} seeds).")
    return "\n".join(lines)


def convergence_of(sidecar: dict) -> dict[str, Any]:
    """``{"tol", "window"}`` of the study's criterion from a sidecar (the preset's ``convergence``); the defaults of
    :func:`convergence_markdown` when the sidecar predates it."""
    conv = sidecar["config"].get("convergence") or {}
    return {"tol": conv.get("tol", 0.003), "window": conv.get("window", 2)}


def read_periods(path: Any) -> dict[str, dict[str, float]]:
    """``task -> policy -> seconds per step`` from ``time_to_accuracy.csv``."""
    import csv

    out: dict[str, dict[str, float]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            out.setdefault(row["task"], {})[row["policy"]] = float(row["period_s"])
    return out


def time_to_target_rows(records: list[dict], periods: dict[str, dict[str, float]], optimizer: str, D: int,
                        margin: float = 0.01) -> list[dict]:
    """Per task and policy: forecast seconds to reach the target test accuracy (the sequential arm's best mean
    minus ``margin``), with the mean curve over seeds; ``None`` when the policy never reaches it."""
    rows = []
    for task, per in periods.items():
        arms: dict[str, list[dict]] = {}
        for r in records:
            if (r["task"], r["optimizer"], r["D"]) == (task, optimizer, D):
                arms.setdefault(r["policy"], []).append(r)
        if "sequential" not in arms:
            continue
        seq = np.nanmean(np.array([r["test_acc"] for r in arms["sequential"]], dtype=float), axis=0)
        target = float(np.nanmax(seq)) - margin
        for pol, rs in arms.items():
            if pol not in per:
                continue
            acc = np.nanmean(np.array([r["test_acc"] for r in rs], dtype=float), axis=0)
            hit = np.flatnonzero(acc >= target)
            epoch = int(hit[0]) if hit.size else None
            seconds = None if epoch is None else epoch * rs[0]["steps_per_epoch"] * per[pol]
            rows.append({"task": task, "policy": pol, "target": target, "epoch": epoch, "seconds": seconds,
                         "period": per[pol]})
    return rows


def time_to_target_markdown(rows: list[dict]) -> str:
    """The time-to-accuracy ranking per task, fastest first."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        rs = [r for r in rows if r["task"] == task]
        reached = sorted((r for r in rs if r["seconds"] is not None), key=lambda r: r["seconds"])
        missed = [LABELS[r["policy"]] for r in rs if r["seconds"] is None]
        parts = [f"{LABELS[r['policy']]} {r['seconds']:.0f} s (epoch {r['epoch']}, {1e3 * r['period']:.1f} ms/step)"
                 for r in reached]
        out.append(f"- **{task}** (target {100 * rs[0]['target']:.1f}% = sequential's best − 1 pp): "
                   + ("; ".join(parts) or "no arm reaches it")
                   + (f"; never reached: {', '.join(missed)}" if missed else "") + ".")
    return "\n".join(out)


def read_table(path: Any) -> list[dict]:
    """A figure's CSV as a list of dicts (values as strings)."""
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def tuned_markdown(rows: list[dict]) -> str:
    """What tuning changed, from ``study_tuned_table.csv`` (values in percent): per optimizer × D, the arms where
    the tuned rate is resolved better or worse than the common rate, and the largest differences."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["common_mean"] == "":
            continue
        groups.setdefault((r["task"], r["optimizer"], r["D"]), []).append(r)
    lines = []
    for (task, opt, D), rs in sorted(groups.items()):
        better = [r for r in rs if r["diff_resolved"] == "True" and float(r["diff_mean"]) > 0]
        worse = [r for r in rs if r["diff_resolved"] == "True" and float(r["diff_mean"]) < 0]
        top = max(rs, key=lambda r: float(r["diff_mean"]) if r["diff_mean"] else -math.inf)
        lines.append(f"- **{task} · {optimizer_label(opt)} · D={D}**: tuned resolved better in {len(better)} of "
                     f"{len(rs)} arms, resolved worse in {len(worse)}; largest gain {LABELS[top['policy']]} "
                     f"{float(top['diff_mean']):+.1f} pp (± {float(top['diff_ci95'] or 'nan'):.1f}; tuned lr "
                     f"{float(top['tuned_lr']):.2g} vs common {float(top['common_lr']):.2g}; common-rate runs that "
                     f"diverged: {sum(int(r['common_diverged']) for r in rs)}).")
    return "\n".join(lines)


def _plan_of(config: dict, task: str) -> dict:
    for name, plan in config.get("tasks_apart", []):
        if name == task:
            return plan
    return {}


def study_setup_markdown(sidecar: dict) -> str:
    """The study's settings, from a study figure's sidecar (its ``config``): one bullet per task, then the tuning."""
    cfg = sidecar["config"]
    lines = []
    for task in cfg["tasks"]:
        plan = _plan_of(cfg, task)
        n_train = plan.get("n_train") or cfg["n_train"]
        size = "the whole training set" if not n_train else f"{n_train} training examples"
        opts = ", ".join(optimizer_label(o) for o in (plan.get("optimizers") or cfg["optimizers"]))
        depths = ", ".join(str(d) for d in (plan.get("depths") or cfg["depths"]))
        epochs = plan.get("epochs") or cfg["epochs"]
        lines.append(f"- **{task}**: {size} minus {cfg['n_val']} held out for validation, the whole test set, "
                     f"{epochs} epoch(s) at batch {cfg['batch_size']}; {opts}; D = {depths}.")
    tn = cfg["tuning"]
    grids = "; ".join(f"{optimizer_label(o)} {n} rates from {lo:g} to {hi:g}" for o, lo, hi, n in tn["grids"])
    budget = f"at most {tn['max_epochs']}" if tn.get("max_epochs") else "up to the arm's full budget"
    extra = (" the last round at the full budget;" if tn.get("last_full") else "") + (
        f" a selection on an end of the grid adds up to {tn['extend']} rate(s) past it;" if tn.get("extend") else "")
    lines.append(f"- **Rates**: {grids}, log-spaced; successive halving (η = {tn['eta']}, {tn['min_epochs']} epoch "
                 f"first, {budget});{extra} on the validation accuracy (mean over tuning seeds "
                 f"{', '.join(map(str, tn['seeds']))}); then seeds {', '.join(map(str, cfg['seeds']))} at the selected "
                 f"rate, each run read at its validation-selected epoch. Common-rate runs: "
                 f"{', '.join(cfg.get('common_tasks') or cfg['tasks'])}, "
                 f"{', '.join(optimizer_label(o) for o in (cfg.get('common_optimizers') or cfg['optimizers']))}.")
    conv = cfg.get("convergence")
    if conv:
        lines.append(f"- **Convergence criterion**: the sequential baseline's validation accuracy gains less than "
                     f"{100 * conv['tol']:g} pp over the last {conv['window']} epochs of the budget above (constant "
                     f"tuned rate, no decaying schedule).")
    lines.append(f"- **Made at** commit `{sidecar['commit'][:12]}` (clean: {sidecar['code_clean']}), torch "
                 f"{sidecar['torch_version']}.")
    return "\n".join(lines)


def lr_map_markdown(notes: dict, rows: list[dict]) -> str:
    """The measured curvature, the thresholds it implies and where the selected SGDM rates fall, from
    ``study_lr_map``'s sidecar notes and CSV."""
    lines = []
    if "close_decisions" in notes:
        close, total = notes["close_decisions"]
        lines.append(f"- **Tuning against seed noise**: {close} of {total} halving decisions (last rate kept against "
                     f"best rate dropped) are within seed noise (their paired 95% t interval over the tuning seeds "
                     f"includes 0); grids extended past an edge: {len(notes.get('extended', {}))} arm(s); selections "
                     f"still on an edge: {', '.join(notes.get('on_edge', [])) or 'none'}.")
    for task, lam in notes["eigenvalue"].items():
        lines.append(f"- **{task}**: λ_max = {lam:.3g} at initialisation.")
    for key, thr in notes["threshold_lr"].items():
        task, d = key.rsplit("/D=", 1)
        D = int(d)
        chosen = {k.split("/")[2]: v for k, v in notes["selected_lr"].items()
                  if k.startswith(f"{task}/sgdm/") and k.endswith(f"/D={D}")}
        delayed = thr[str(D - 1)] if str(D - 1) in thr else thr["0"]
        above = sum(v > delayed for v in chosen.values())
        first = [r for r in rows if (r["task"], r["optimizer"], r["D"], r["round"]) == (task, "sgdm", str(D), "0")]
        div = sum(r["diverged"] == "True" for r in first)
        lines.append(f"- **{task} · SGDM · D={D}**: threshold {thr['0']:.2g} without delay and {delayed:.2g} for "
                     f"τ = {D - 1}; the selected rates "
                     f"({', '.join(f'{LABELS[p]} {v:.2g}' for p, v in chosen.items())}) lie above the delayed "
                     f"threshold in {above} of {len(chosen)} arms; {div} of {len(first)} first-round runs diverged.")
    return "\n".join(lines)


def study_caveat(sidecar: dict) -> str:
    """The caveat every verdict of the study carries, from its sidecar."""
    cfg = sidecar["config"]
    n_tune = len(cfg["tuning"]["seeds"])
    return (f"Caveat: small models on a CPU (float32, one core per arm), {len(cfg['seeds'])} seeds, budgets fixed in "
            f"advance (constant rates; which rows meet the convergence criterion is stated above), rates tuned on "
            f"{n_tune} tuning seed(s); the verdicts hold for these tasks and this scale, not for the papers' "
            "ImageNet-size runs. Float32 rounding alone (the same arm run stacked with other seeds or alone, or on "
            "another CPU) moves a single run by amounts comparable to the seed spread, which is why every comparison "
            "is paired by seed, read through its interval and Holm-corrected over the rows it is drawn from.")
