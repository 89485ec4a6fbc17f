"""Figures of the learning-curves notebook: how the staleness policies train, compared with sequential.

- ``learning_curves``: training loss and test accuracy per epoch (mean and 95% Student-t band over seeds,
  ddof = 1; for the loss, on its log axis, the geometric mean and the t band of log loss) for every task ×
  optimizer, all policies at depth D;
- ``final_accuracy_table``: best test accuracy (max over epochs, as PipeOptim's Table IV) as mean ± 95% t
  half-width over seeds, per task × optimizer × policy, drawn as a table and written as CSV; a pipelined
  policy is bold only when it beats every other pipelined policy of its row with a resolved paired
  difference (:func:`pipelab.studies.claims.winner_test`, Holm-corrected);
- ``accuracy_gap_vs_depth``: best test accuracy minus the sequential baseline's against D, paired by seed,
  with 95% t intervals of the paired difference;
- ``time_to_accuracy``: test accuracy against the simulator's forecast wall-clock (profiled stage costs, each
  policy's recompute, predictions and weight copies; :func:`step_times`);
- ``policy_memory``: bytes per stage per policy measured by the emulator (weight versions, predicted copies,
  optimizer state, activations) beside the weight copies each paper states (PipeOptim's Table II);
- ``learning_curves_by_policy``: the same runs as small multiples, one panel per task and pipelined policy,
  the policy highlighted against sequential and the others in grey (the preset's first optimizer).

Every figure states the preset, the learning rate(s) and the test-set size. The Markdown helpers
(:func:`ranking_markdown`, :func:`comparison_markdown`, :func:`gap_markdown`; the claims:
:mod:`pipelab.studies.claims`) write notebook 04's statements from the same rows, so its prose cannot drift from
the CSV.

All runs go through :func:`pipelab.studies.learning_curves.sweep` (cached per run), so the three figures share
their D=4 runs.
"""

from __future__ import annotations

import functools
import io
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from ...optim import OPTIMIZERS, optimizer_label
from ...policies import make_policy
from ...statistics import PairedDifference, paired_difference, resolved, t_interval
from ..claims import winners_across_rows
from ..config import from_preset
from ..data import load_dataset
from ..learning_curves import grid, stack_cap, sweep, with_
from ..settings import (
    ARM_OPTIMIZER_SETTINGS,
    POLICY_ORDER,
    QUICK_POLICIES,
    STUDY_CONVERGENCE,
    STUDY_TUNING,
    TASKS,
    TINY_TUNING,
    Convergence,
    Tuning,
)
from . import FigureOutput, register

#: the learning-curve arms' legend labels (:attr:`pipelab.policies.Policy.title`)
LABELS = {p: make_policy(p).title for p in POLICY_ORDER}


def _device() -> str:
    from ...distributed import resolve_device

    return str(resolve_device("auto"))


@dataclass(frozen=True)
class TaskPlan:
    """How one task departs from its preset (``None``: the preset's value): its optimizers, the depths it runs at
    (within the preset's), its epochs, its training-subset size (``n_train``; 0 means the whole set) and the most
    seeds of one arm stacked into one run (``stack``; :func:`pipelab.studies.learning_curves.stack_cap`:
    ``$PIPELAB_STACK`` overrides it, ``None`` means 8)."""

    optimizers: tuple[str, ...] | None = None
    depths: tuple[int, ...] | None = None
    epochs: int | None = None
    n_train: int | None = None
    stack: int | None = None


@dataclass(frozen=True)
class LearningCurvesConfig:
    """The learning-curve grid (see :class:`pipelab.studies.learning_curves.RunConfig` for the run fields).

    ``tasks_apart`` gives some tasks their own plan (:class:`TaskPlan`: optimizers, depths, epochs, training-set
    size); the others use the fields above. With ``tuning``, every arm runs at its own learning rate, selected on an
    ``n_val`` validation split (:class:`~pipelab.studies.settings.Tuning`); the common-rate runs
    (:data:`~pipelab.studies.settings.ARM_OPTIMIZER_SETTINGS`' rates, same
    splits and seeds) are made for ``common_tasks`` and ``common_optimizers`` (``None``: all) for comparison.
    ``convergence`` states the criterion a row is called converged by (:class:`~pipelab.studies.settings.Convergence`;
    the budget is each task's ``epochs``); both land in every figure's sidecar.
    """

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
    n_val: int = 0
    tuning: Tuning | None = None
    tasks_apart: tuple[tuple[str, TaskPlan], ...] = ()
    common_tasks: tuple[str, ...] | None = None
    common_optimizers: tuple[str, ...] | None = None
    convergence: Convergence | None = None

    def common(self) -> dict:
        return dict(epochs=self.epochs, batch_size=self.batch_size, n_train=self.n_train, n_test=self.n_test,
                    n_eval_train=self.n_eval_train, device=self.device, n_val=self.n_val)

    def plan(self, task: str) -> TaskPlan:
        return dict(self.tasks_apart).get(task, TaskPlan())

    def optimizers_of(self, task: str) -> tuple[str, ...]:
        return self.plan(task).optimizers or self.optimizers

    def epochs_of(self, task: str) -> int:
        return self.plan(task).epochs or self.epochs

    def stack_of(self, run: Any) -> int:
        """The most seeds stacked into one run of ``run``'s arm (a :class:`~pipelab.studies.learning_curves.
        RunConfig`): its task's cap (:func:`~pipelab.studies.learning_curves.stack_cap`)."""
        return stack_cap(self.plan(run.task).stack)


def _presets() -> dict[str, LearningCurvesConfig]:
    return {
        "tiny": LearningCurvesConfig(("digits_mlp",), ("sgdm",), ("sequential", "stashing", "pipeoptim"), 4, (0,),
                                     epochs=1, batch_size=32, n_train=512, n_test=200, n_eval_train=200,
                                     depths=(4,), gap_tasks=("digits_mlp",), n_val=64,
                                     tuning=TINY_TUNING),
        "quick": LearningCurvesConfig(("fashion_mnist_mlp", "mnist1d_mlp", "digits_mlp"), ("sgdm", "adam", "adamw"),
                                      QUICK_POLICIES, 4, (0, 1, 2), epochs=5, batch_size=64, n_train=5120,
                                      n_test=2000, n_eval_train=2000, depths=(4, 8),
                                      gap_tasks=("fashion_mnist_mlp",)),
        # the study: ten seeds; the CNN for 10 epochs (1170 steps) and the Transformer for 12 (3276 steps), so that
        # their sequential baselines can meet the convergence criterion (their earlier 351 steps and 4 epochs did
        # not); the CNN keeps 20k training examples (≈ 0.13 s per step and seed on this CPU: the whole set would cost
        # ≈ 3× more); it has 4 blocks (no D = 8), the Transformer runs D = 4 and 8. Stacked runs of 8 CNN seeds took
        # 1070–1570 s, past the 600 s chunks the study runs in (a run killed mid-way is lost): the CNN stacks 2 seeds,
        # the Transformer none (one seed of 2BW at D = 8 took 124 ms per step at load 7 on this CPU: ≈ 450 s with
        # its evaluations), the MLP keeps 8 (2BW at D = 8, 8 seeds: 111 ms per step, ≈ 400 s at load 7.6)
        "study": LearningCurvesConfig(("fashion_mnist_mlp", "fashion_mnist_cnn", "wordlang_transformer"),
                                      ("adam", "sgdm"), QUICK_POLICIES, 4, tuple(range(10)), epochs=8, batch_size=128,
                                      n_train=None, n_test=None, n_eval_train=5000, depths=(4, 8),
                                      gap_tasks=("fashion_mnist_mlp", "wordlang_transformer"), n_val=5000,
                                      tuning=STUDY_TUNING,
                                      tasks_apart=(("fashion_mnist_cnn",
                                                    TaskPlan(("adam",), (4,), 10, 20_000, stack=2)),
                                                   ("wordlang_transformer",
                                                    TaskPlan(("adam",), (4, 8), 12, stack=1))),
                                      common_tasks=("fashion_mnist_mlp",), common_optimizers=("sgdm",),
                                      convergence=STUDY_CONVERGENCE),
        "paper": LearningCurvesConfig(("fashion_mnist_mlp", "fashion_mnist_cnn", "fashion_mnist_resnet",
                                       "mnist1d_mlp", "digits_mlp"), ("sgdm", "adam", "adamw"), POLICY_ORDER, 4,
                                      (0, 1, 2, 3, 4), epochs=20, batch_size=64, n_train=None, n_test=None,
                                      n_eval_train=10_000, depths=(4, 8),
                                      gap_tasks=("fashion_mnist_mlp", "fashion_mnist_resnet", "mnist1d_mlp"),
                                      device=_device(), n_val=5000, tuning=STUDY_TUNING),
    }


def _config(preset: str) -> LearningCurvesConfig:
    return from_preset(_presets(), preset)


def arm_configs(cfg: LearningCurvesConfig, Ds: tuple[int, ...], tasks: tuple[str, ...]) -> list[Any]:
    """The preset's runs at the common learning rates: the grid, each task with its own plan (:class:`TaskPlan`)."""
    out = []
    for task in tasks:
        plan = cfg.plan(task)
        common = {**cfg.common(), "epochs": cfg.epochs_of(task)}
        if plan.n_train is not None:
            common["n_train"] = plan.n_train or None
        depths = tuple(d for d in Ds if plan.depths is None or d in plan.depths)
        out += grid([task], cfg.policies, cfg.optimizers_of(task), depths, cfg.seeds, **common)
    return out


def tuned_arms(cfg: LearningCurvesConfig, Ds: tuple[int, ...], tasks: tuple[str, ...],
               progress: bool = False) -> list[Any]:
    """Successive halving (:func:`pipelab.studies.tuning.successive_halving`) of every arm of the grid over its
    optimizer's grid (:class:`Tuning`), on the validation split; one :class:`~pipelab.studies.tuning.Halving` per
    arm."""
    from ..tuning import successive_halving

    if cfg.tuning is None:
        raise ValueError("this preset has no tuning")
    tn = cfg.tuning
    arms = {with_(c, seed=tn.seeds[0], lr=None) for c in arm_configs(cfg, Ds, tasks)}
    candidates = [with_(a, lr=lr, seed=s) for a in sorted(arms, key=_arm_order) for lr in tn.lrs(a.optimizer)
                  for s in tn.seeds]
    return successive_halving(candidates, eta=tn.eta, min_epochs=tn.min_epochs, max_epochs=tn.max_epochs,
                              last_full=tn.last_full, extend=tn.extend, progress=progress, stack=cfg.stack_of)


def _arm_order(c: Any) -> tuple:
    return (c.task, c.optimizer, c.D, POLICY_ORDER.index(c.policy))


def _runs(cfg: LearningCurvesConfig, Ds: tuple[int, ...], tasks: tuple[str, ...], progress: bool,
          lr: str = "tuned") -> list[dict]:
    """The preset's runs: with tuning (``lr="tuned"``) every arm at its selected rate, else the common rates."""
    if lr == "common" and cfg.common_tasks is not None:
        tasks = tuple(t for t in tasks if t in cfg.common_tasks)
    configs = arm_configs(cfg, Ds, tasks)
    if lr == "common" and cfg.common_optimizers is not None:
        configs = [c for c in configs if c.optimizer in cfg.common_optimizers]
    if cfg.tuning is not None and lr == "tuned":
        from ..tuning import check_selected

        chosen = {(h.base.task, h.base.optimizer, h.base.D, h.base.policy): h.lr
                  for h in check_selected(tuned_arms(cfg, Ds, tasks, progress))}
        configs = [with_(c, lr=chosen[(c.task, c.optimizer, c.D, c.policy)]) for c in configs]
    return sweep(configs, progress=progress, stack=cfg.stack_of)


def _group(records: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        out[(r["task"], r["optimizer"], r["D"], r["policy"])].append(r)
    return out


_COLOR_INDEX = {"pipemare": 0, "vanilla": 5, "spectrain": 2, "pipeoptim": 3, "stashing": 4, "vertical_sync": 7,
                "2bw": 6, "gpipe": 9, "1f1b": 8, "nesterov_async": 1}
#: policies beyond the colour-blind palette's ten colours take the "dark" palette's, in this order
_EXTRA_COLORS = ("error_feedback", "dc_asgd")


def _colors(policies: Sequence[str]) -> dict[str, tuple]:
    """One distinct colour-blind-safe colour per policy; sequential in black."""
    import seaborn as sns

    pal, dark = sns.color_palette("colorblind", 10), sns.color_palette("dark", 10)

    def color(p: str) -> tuple:
        if p == "sequential":
            return (0, 0, 0)
        if p in _COLOR_INDEX:
            return pal[_COLOR_INDEX[p]]
        return dark[(_EXTRA_COLORS.index(p) if p in _EXTRA_COLORS else len(_EXTRA_COLORS)) % 10]

    return {p: color(p) for p in policies}


def _best(r: dict) -> float:
    """A run's figure of merit: the test accuracy at the epoch its validation accuracy selects (the last epoch
    without a validation split; :func:`pipelab.studies.tuning.selected_test_acc`): the test set never picks it."""
    from ..tuning import selected_test_acc

    return selected_test_acc(r)


def _final(r: dict) -> float:
    return float(r["test_acc"][-1])


@functools.lru_cache(maxsize=32)
def test_set_size(task: str, n_test: int | None) -> int:
    """Test examples a run of ``task`` evaluates on: its dataset's test split cut to ``n_test`` (``None``: all).

    A run's ``n_test`` is an upper bound (digits has 359 test images, whatever ``n_test`` asks for), so the
    figures state this count next to every accuracy; its binomial standard error is sqrt(p(1 − p)/n).
    """
    if task not in TASKS:
        raise ValueError(f"task={task!r}; choose one of {', '.join(TASKS)}")
    dataset, dkw, _, _ = TASKS[task]
    return int(load_dataset(dataset, **dkw).y_test[:n_test].shape[0])


def _lr(r: dict) -> float:
    """The learning rate a record ran with (its ``lr``, else the experiment's or the registry's default)."""
    if r.get("lr") is not None:
        return float(r["lr"])
    opt = r["optimizer"]
    return float(ARM_OPTIMIZER_SETTINGS.get(opt, {}).get("lr", OPTIMIZERS[opt].defaults["lr"]))


def lr_label(records: Sequence[dict]) -> str:
    """``"lr: SGDM 0.01, Adam 0.001"``: each optimizer's learning rate, or its range when arms differ."""
    by: dict[str, set[float]] = defaultdict(set)
    for r in records:
        by[r["optimizer"]].add(_lr(r))
    parts = []
    order = list(OPTIMIZERS)
    for opt, lrs in sorted(by.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
        lo, hi = min(lrs), max(lrs)
        label = optimizer_label(opt)
        parts.append(f"{label} {lo:g}" if lo == hi else f"{label} {lo:g}–{hi:g} (per arm)")
    return "lr: " + ", ".join(parts)


def _ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, 95% t half-width and sample std (ddof = 1) of the finite values (NaN where undefined)."""
    iv = t_interval(values)
    fin = np.asarray(values, dtype=float)
    fin = fin[np.isfinite(fin)]
    return iv.mean, iv.half_width, float(fin.std(ddof=1)) if fin.size > 1 else math.nan


def summary_rows(records: list[dict]) -> list[dict]:
    """Per (task, optimizer, D, policy): best and final test accuracy over seeds, with 95% t intervals.

    Each row: ``seeds``, ``diverged``, ``best_mean``/``best_ci95``/``best_std`` and the same for ``final``
    (mean, Student-t 95% half-width and sample std with ddof = 1, over the finite values; a diverged run's
    final accuracy is NaN and is left out of the final mean, counted in ``diverged``), ``n_test`` (test
    examples), ``winner`` (this pipelined policy beats every other pipelined policy of its task × optimizer ×
    D with resolved paired differences, Holm-corrected; :func:`pipelab.studies.claims.winner_test`),
    ``best_by_seed`` (seed -> best accuracy, for paired comparisons) and ``weight_copies``.
    """
    rows = []
    for (task, opt, D, pol), rs in sorted(_group(records).items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2], POLICY_ORDER.index(kv[0][3]))):
        best = [_best(r) for r in rs]
        final = [_final(r) for r in rs]
        bm, bh, bs = _ci(best)
        fm, fh, fs = _ci(final)
        rows.append({"task": task, "optimizer": opt, "D": D, "policy": pol, "seeds": len(rs),
                     "diverged": int(sum(r["diverged"] for r in rs)),
                     "best_mean": bm, "best_ci95": bh, "best_std": bs,
                     "final_mean": fm, "final_ci95": fh, "final_std": fs,
                     "n_test": int(rs[0]["n_test"]), "winner": False,  # a run records what it evaluated
                     "lr": _lr(rs[0]), "best_by_seed": {r["seed"]: b for r, b in zip(rs, best)},
                     "weight_copies": rs[0]["weight_copies"]})
    by_row: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if row["policy"] != "sequential":
            by_row[(row["task"], row["optimizer"], row["D"])].append(row)
    tests = winners_across_rows({k: {g["policy"]: g["best_by_seed"] for g in group} for k, group in by_row.items()
                                 if len(group) >= 2})  # Holm within each row, then over the rows searched
    for k, t in tests.items():
        for g in by_row[k]:
            g["winner"] = g["policy"] == t.winner
    return rows


@register("learning_curves", "Training loss and test accuracy per epoch of every staleness policy (mean and "
                             "95% t band over seeds), per task and optimizer",
          budget={"tiny": 30, "quick": 200})  # quick: 160 s measured (2 workers, idle)
def learning_curves(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    records = _runs(cfg, (cfg.D,), cfg.tasks, progress)
    groups = _group(records)
    nrow, ncol = len(cfg.tasks), 2 * len(cfg.optimizers)
    fig, axes = plt.subplots(nrow, ncol, figsize=(PANEL_WIDTH * ncol, 2.7 * nrow + 0.9), squeeze=False)
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
                # the loss is drawn on a log axis: its band is the t interval of log(loss), i.e. a geometric mean
                # times/divided by a factor (an arithmetic band would cross 0); per epoch over the seeds still
                # finite (diverged ones drop out)
                with np.errstate(divide="ignore", invalid="ignore"):
                    log_loss = np.log(np.array([r["train_loss"] for r in rs], dtype=float))
                ivs = [t_interval(log_loss[:, e]) for e in range(log_loss.shape[1])]
                m, h = np.array([iv.mean for iv in ivs]), np.array([iv.half_width for iv in ivs])
                for ax, (_, mean, lo, hi) in ((ax_l, (ep, np.exp(m), np.exp(m - h), np.exp(m + h))),
                                              (ax_a, _acc_band(rs))):
                    (line,) = ax.plot(ep, mean, label=label, **style)
                    ax.fill_between(ep, lo, hi, color=colors[pol], alpha=0.15, lw=0)
                handles.setdefault(pol, line)
            n_test = test_set_size(task, cfg.n_test)
            if not any(groups.get((task, opt, cfg.D, p)) for p in cfg.policies):
                for ax in (ax_l, ax_a):
                    ax.set_axis_off()
                    ax.text(0.5, 0.5, f"{task} · {optimizer_label(opt)}:\nnot run in this preset", ha="center",
                            va="center", fontsize=8, color="0.4", transform=ax.transAxes)
                continue
            ax_l.set_yscale("log")
            for ax, title in zip((ax_l, ax_a), _panel_titles(task, opt, n_test)):
                ax.set_title(title, fontsize=PANEL_TITLE_SIZE)
            for ax in (ax_l, ax_a):
                ax.set_xlabel("epoch")
    band = (f"mean and 95% t band (ddof=1) over {len(cfg.seeds)} seeds" if len(cfg.seeds) > 1
            else "1 seed, no band")
    fig.suptitle(f"Learning curves, D={cfg.D} stages, {band}; preset {preset}, {lr_label(records)} "
                 "(SpecTrain runs with SGDM only)", y=0.998, fontsize=11)
    top = 1 - 0.75 / fig.get_figheight()
    fig.legend(handles=[handles[p] for p in cfg.policies if p in handles],
               labels=[LABELS[p] for p in cfg.policies if p in handles], loc="upper center",
               bbox_to_anchor=(0.5, top + 0.02), ncol=min(len(handles), 7), frameon=False,
               fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, top - 0.01))
    rows = summary_rows(records)
    return FigureOutput(fig, cfg, cfg.seeds[0], data=records,
                        notes={"runs": len(records), "lr": lr_label(records),
                               "final_test_acc": {f"{r['task']}/{r['optimizer']}/{r['policy']}":
                                                  round(100 * r["final_mean"], 2) for r in rows},
                               "final_test_acc_ci95": {f"{r['task']}/{r['optimizer']}/{r['policy']}":
                                                       _round_pp(r["final_ci95"]) for r in rows}})


#: the font size of :func:`learning_curves`' panel titles, and its panels' width in inches
PANEL_TITLE_SIZE, PANEL_WIDTH = 9, 3.3


def _panel_titles(task: str, opt: str, n_test: int) -> tuple[str, str]:
    """The loss and accuracy panels' titles; on two lines, since a panel is narrower than the task's and the
    optimizer's names plus the quantity (side by side, one-line titles ran into each other)."""
    head = f"{task} · {optimizer_label(opt)}"
    return f"{head}\ntrain loss (geom. mean)", f"{head}\ntest acc. (%, n={n_test})"


def _acc_band(rs: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Epochs, mean test accuracy (%) and its 95% t band over the seeds still finite at each epoch, the band cut to
    [0, 100] %: with few seeds the t interval reaches past what an accuracy can be."""
    y = 100 * np.array([r["test_acc"] for r in rs], dtype=float)
    ivs = [t_interval(y[:, e]) for e in range(y.shape[1])]
    m = np.array([iv.mean for iv in ivs])
    h = np.array([iv.half_width for iv in ivs])
    return np.asarray(rs[0]["epoch"]), m, np.clip(m - h, 0, 100), np.clip(m + h, 0, 100)


@register("learning_curves_by_policy", "Test accuracy per epoch as small multiples: one panel per pipelined "
          "policy and task, the policy highlighted against sequential, the other policies in grey",
          budget={"tiny": 10, "quick": 5})
def learning_curves_by_policy(preset: str, *, progress: bool = False) -> FigureOutput:
    """The ``learning_curves`` runs of the preset's first optimizer, one panel per (task, pipelined policy).

    Each panel draws its policy (colour, 95% t band over seeds), the sequential baseline (black dashed, band)
    and the other pipelined policies' means (thin grey) for context: no panel overlays seven banded series.
    """
    cfg = _config(preset)
    records = _runs(cfg, (cfg.D,), cfg.tasks, progress)
    groups = _group(records)
    opt = cfg.optimizers[0]
    policies = [p for p in cfg.policies if p != "sequential" and any(groups.get((t, opt, cfg.D, p))
                                                                     for t in cfg.tasks)]
    colors = _colors(cfg.policies)
    nrow, ncol = len(cfg.tasks), max(len(policies), 1)
    fig, axes = plt.subplots(nrow, ncol, figsize=(2.6 * ncol + 0.6, 2.3 * nrow + 1.0), squeeze=False,
                             sharey="row")
    for i, task in enumerate(cfg.tasks):
        seq = groups.get((task, opt, cfg.D, "sequential"))
        for j, pol in enumerate(policies):
            ax = axes[i, j]
            for other in policies:
                rs = groups.get((task, opt, cfg.D, other))
                if rs and other != pol:
                    ep, m, _, _ = _acc_band(rs)
                    ax.plot(ep, m, color="0.75", lw=0.8, zorder=1)
            if seq:
                ep, m, lo, hi = _acc_band(seq)
                ax.plot(ep, m, color="black", ls="--", lw=1.5, zorder=3)
                ax.fill_between(ep, lo, hi, color="black", alpha=0.1, lw=0, zorder=2)
            rs = groups.get((task, opt, cfg.D, pol))
            if rs:
                ep, m, lo, hi = _acc_band(rs)
                div = sum(r["diverged"] for r in rs)
                ax.plot(ep, m, color=colors[pol], lw=2.0, zorder=4)
                ax.fill_between(ep, lo, hi, color=colors[pol], alpha=0.25, lw=0, zorder=2)
                if div:
                    ax.text(0.97, 0.05, f"{div}/{len(rs)} diverged", transform=ax.transAxes, ha="right",
                            fontsize=7, color="C3")
            else:
                ax.text(0.5, 0.5, f"n/a with {optimizer_label(opt)}", transform=ax.transAxes, ha="center",
                        fontsize=8, color="0.4")
            if i == 0:
                ax.set_title(LABELS[pol], fontsize=9, color=colors[pol])
            if i == nrow - 1:
                ax.set_xlabel("epoch")
        axes[i, 0].set_ylabel(f"{task}\ntest acc. (%, n={test_set_size(task, cfg.n_test)})", fontsize=8)
    band = f"95% t band (ddof=1) over {len(cfg.seeds)} seeds" if len(cfg.seeds) > 1 else "1 seed, no band"
    fig.suptitle(f"Each pipelined policy (colour) against sequential training (black dashed) and the other policies "
                 f"(grey): {optimizer_label(opt)}, D={cfg.D}, {band}; preset {preset}, {lr_label(records)}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return FigureOutput(fig, cfg, cfg.seeds[0], data=records,
                        notes={"optimizer": opt, "policies": policies, "lr": lr_label(records)})


def _short_arms(task: str, optimizer: str, D: int, policies: Sequence[str], batch_size: int, steps: int,
                device: str) -> list[Any]:
    """One short run config per arm that can run (the learning-curve grid's rule): seed 0, ``steps`` mini-batches."""
    return grid([task], policies, [optimizer], [D], [0], epochs=1, batch_size=batch_size, n_train=steps * batch_size,
                n_test=10, device=device)


def memory_rows(task: str, optimizer: str, D: int, policies: Sequence[str], batch_size: int = 64,
                device: str = "cpu") -> list[dict]:
    """Bytes each stage holds at its peak under each policy, measured by the emulator on ``task``'s model.

    Per stage k: the weight versions it stores (``ring_peak`` × its weight bytes), its predicted copies and
    extra buffers (PipeMare's δ), its optimizer state, and the peak of the stage inputs it saves for the
    backward (activations) — over 3D mini-batches of ``batch_size``, enough for every stage to reach its
    steady state — beside the copies the policy's paper states (:meth:`~pipelab.policies.Policy.
    stated_weight_copies`, PipeOptim's Table II). ``bf16_versions_bytes`` / ``bf16_predicted_bytes``: the same
    versions and copies kept as bf16 working copies beside fp32 masters (``Precision("bf16", versions="compute")``,
    :func:`pipelab.precision.weight_memory`; PipeDream-2BW's half-precision copy), the run itself being fp32.
    """
    from ...emulator import Emulator
    from ...precision import FP32, Precision, weight_memory
    from ..learning_curves import prepare

    half = Precision("bf16", versions="compute")

    rows = []
    for cfg in _short_arms(task, optimizer, D, policies, batch_size, 3 * D, device):
        pol = cfg.policy
        prep = prepare(cfg)
        emu = Emulator(prep.stages, schedule=prep.schedule, policy=prep.policy, optimizer=prep.optimizer)
        res = emu.run(prep.batch)
        for k, st in enumerate(emu.stages):
            versions = res.extra["ring_peak"][k]
            copies = res.weight_copies[k]
            fp32 = weight_memory(FP32, st.params, versions, copies - versions, st.optimizer)
            wbytes, opt_bytes = fp32["masters"], fp32["optimizer_state"]
            bf16 = weight_memory(half, st.params, versions, copies - versions)
            rows.append({"task": task, "optimizer": optimizer, "D": D, "policy": pol, "stage": k,
                         "weight_bytes": wbytes, "versions": versions, "extra_copies": copies - versions,
                         "weight_copies": copies, "stated_copies": prep.policy.stated_weight_copies(k, D),
                         "optimizer_state_bytes": opt_bytes,
                         "activation_bytes": res.extra["stage_activation_peak"][k],
                         "bf16_versions_bytes": bf16["versions"], "bf16_predicted_bytes": bf16["predicted"]})
    return rows


@register("policy_memory", "Bytes per stage per policy, measured by the emulator (weight versions, predicted "
          "copies, optimizer state, activations), beside the weight copies each paper states (PipeOptim Table II)",
          budget={"tiny": 10, "quick": 10})
def policy_memory(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    task, opt = cfg.tasks[0], cfg.optimizers[0]
    policies = [p for p in cfg.policies if p != "sequential"]
    rows = memory_rows(task, opt, cfg.D, policies, cfg.batch_size, cfg.device)
    shown = [p for p in policies if any(r["policy"] == p for r in rows)]
    fig, axes = plt.subplots(1, len(shown), figsize=(2.4 * len(shown) + 0.8, 3.6), sharey=True, squeeze=False)
    parts = (("stored versions", lambda r: r["versions"] * r["weight_bytes"], "C0"),
             ("predicted copies / buffers", lambda r: r["extra_copies"] * r["weight_bytes"], "C1"),
             ("optimizer state", lambda r: r["optimizer_state_bytes"], "C2"),
             ("activations (peak)", lambda r: r["activation_bytes"], "C7"))
    mib = 2.0 ** 20
    for ax, pol in zip(axes[0], shown):
        rs = [r for r in rows if r["policy"] == pol]
        k = np.array([r["stage"] for r in rs])
        bottom = np.zeros(len(rs))
        for label, value, color in parts:
            v = np.array([value(r) for r in rs], dtype=float) / mib
            ax.bar(k, v, bottom=bottom, color=color, label=label, width=0.7)
            bottom += v
        stated = [(r["stage"], r["stated_copies"] * r["weight_bytes"] / mib) for r in rs
                  if r["stated_copies"] is not None]
        if stated:
            ax.plot(*zip(*stated), "kx", ms=8, mew=2, label="weights the paper states")
        half = [(r["stage"], (r["bf16_versions_bytes"] + r["bf16_predicted_bytes"]) / mib) for r in rs]
        ax.plot(*zip(*half), "o", mfc="none", mec="C3", ms=7, mew=1.5,
                label="versions + copies as bf16 working copies")
        ax.set_title(LABELS[pol], fontsize=9)
        ax.set_xlabel("stage k")
        ax.set_xticks(k)
    axes[0, 0].set_ylabel("MiB held at the peak")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=6, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.93))
    fig.suptitle(f"Memory per stage per policy, measured by the emulator: {task}, {optimizer_label(opt)}, D={cfg.D}, "
                 f"mini-batch {cfg.batch_size}; × = the paper's weight copies (PipeOptim Table II); preset {preset}",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.86))
    cols = ["policy", "stage", "weight_bytes", "versions", "extra_copies", "weight_copies", "stated_copies",
            "optimizer_state_bytes", "activation_bytes", "bf16_versions_bytes", "bf16_predicted_bytes"]
    csv = ",".join(cols) + "\n" + "".join(",".join("" if r[c] is None else str(r[c]) for c in cols) + "\n"
                                          for r in rows)
    return FigureOutput(fig, cfg, 0, tables={"csv": csv}, data=rows,
                        notes={"task": task, "optimizer": opt, "D": cfg.D,
                               "weight_copies": {p: [r["weight_copies"] for r in rows if r["policy"] == p]
                                                 for p in shown},
                               "stated_copies": {p: [r["stated_copies"] for r in rows if r["policy"] == p]
                                                 for p in shown}})


def step_times(task: str, optimizer: str, D: int, policies: Sequence[str], batch_size: int = 64, *,
               reps: int = 10, device: str = "cpu") -> dict[str, dict[str, Any]]:
    """Forecast seconds per optimizer step of each arm: the simulator on profiled stage costs, each policy's
    extra work included.

    Stage k of the task's model is profiled (:func:`pipelab.profiling.profile_stages`, one thread) for the arm's
    micro-batch (the mini-batch for M = 1, mini-batch / D for 2BW). The policy's plan on its schedule says, per
    stage in the steady state, the share r_k of backwards that recompute the forward (forward and backward
    weights differ), the predictions per job p_k, and whether each update stores a copy (ring > 1). The costs

        F'_k = F_k + p_k·U_k,   B'_k = B_k + r_k·F_k,   U'_k = U_k + copy_k·[ring_k > 1]

    (a prediction costs about one optimizer step's arithmetic) go to :func:`pipelab.simulator.simulate`; the
    period is the steady spacing of F(0, t, 0). The sequential arm runs the whole model on one worker: Σ_k
    (F_k + B_k + U_k). Wall-clock profiles vary from run to run by a few percent; the ranking they give is the
    figure's point.
    """
    from ...pipeline import build_pipeline
    from ...policies import Predicted, Stored
    from ...profiling import profile_stages
    from ...simulator import simulate
    from ..learning_curves import prepare
    from ..settings import arm_schedule

    out: dict[str, dict[str, Any]] = {}
    profiles: dict[int, Any] = {}
    for cfg in _short_arms(task, optimizer, D, policies, batch_size, 6 * D, device):
        pol = cfg.policy
        prep = prepare(cfg)
        M = 1 if prep.schedule is None else prep.schedule.M
        if M not in profiles:
            x, y = prep.batch(0)
            profiles[M] = profile_stages(prep.stages, x[: batch_size // M], y[: batch_size // M],
                                         optimizer=prep.optimizer, reps=reps, warmup=2, threads=1)
        prof = profiles[M]
        f, b, u, c = (np.array(v, dtype=float) for v in (prof.f_cost, prof.b_cost, prof.u_cost, prof.copy_cost))
        if prep.schedule is None:
            out[pol] = {"period": float((f + b + u).sum()), "recompute": [0.0] * D, "predictions": [0.0] * D,
                        "copies": [0] * D}
            continue
        sched = arm_schedule(cfg.policy, cfg.D, cfg.M, 6 * D, cfg.schedule)
        plan = build_pipeline(prep.stages, schedule=sched, policy=prep.policy, optimizer=prep.optimizer)
        steady = [(k, t, j) for (k, t, j) in plan.specs if D <= t < 5 * D]
        r, p = np.zeros(D), np.zeros(D)
        n = np.zeros(D)
        for k, t, j in steady:
            fs, bs = plan.specs[(k, t, j)]
            n[k] += 1
            r[k] += not (fs == bs and isinstance(fs, Stored))
            p[k] += isinstance(fs, Predicted) + isinstance(bs, Predicted)
        r, p = r / n, p / n
        copies = np.array([cap > 1 for cap in plan.capacity], dtype=float)
        sim = simulate(sched, f + p * u, b + r * f, u_cost=u + copies * c)
        t0 = sim.version_table.forward_start[0, :, 0]
        out[pol] = {"period": float(np.diff(t0[D:5 * D]).mean()), "recompute": r.tolist(), "predictions": p.tolist(),
                    "copies": copies.astype(int).tolist()}
    return out


@register("time_to_accuracy", "Test accuracy against forecast wall-clock time: each arm's epochs placed at the "
          "simulator's time per step from profiled stage costs, with each policy's extra work",
          budget={"tiny": 15, "quick": 15}, measured=True)
def time_to_accuracy(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    opt = cfg.optimizers[0]
    records = _runs(cfg, (cfg.D,), cfg.tasks, progress)
    groups = _group(records)
    colors = _colors(cfg.policies)
    fig, axes = plt.subplots(1, len(cfg.tasks), figsize=(4.4 * len(cfg.tasks), 3.8), squeeze=False)
    periods: dict[str, dict[str, Any]] = {}
    for ax, task in zip(axes[0], cfg.tasks):
        times = step_times(task, opt, cfg.D, cfg.policies, cfg.batch_size, device=cfg.device)
        periods[task] = times
        for pol in cfg.policies:
            rs = groups.get((task, opt, cfg.D, pol))
            if not rs or pol not in times:
                continue
            ep, m, lo, hi = _acc_band(rs)
            seconds = ep * rs[0]["steps_per_epoch"] * times[pol]["period"]
            ax.plot(seconds, m, marker="o", ms=3, color=colors[pol], lw=2.0 if pol == "sequential" else 1.3,
                    ls="--" if pol == "sequential" else "-", label=f"{LABELS[pol]} ({1e3 * times[pol]['period']:.1f} "
                    "ms/step)")
        ax.set_xlabel("forecast wall-clock (s)")
        ax.set_title(f"{task} (n_test={test_set_size(task, cfg.n_test)})", fontsize=9)
        ax.legend(fontsize=6.5)
    axes[0, 0].set_ylabel("test accuracy (%, mean over seeds)")
    fig.suptitle(f"Time to accuracy: epochs at the simulator's time per step (profiled stage costs on this CPU, "
                 f"recompute, predictions and weight copies included), {optimizer_label(opt)}, D={cfg.D}; "
                 f"preset {preset}, {lr_label(records)}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    csv = "task,policy,period_s,recompute_share,predictions_per_job,stores_copies\n" + "".join(
        f"{task},{pol},{v['period']:.6g},{' '.join(f'{x:.2f}' for x in v['recompute'])},"
        f"{' '.join(f'{x:.2f}' for x in v['predictions'])},{' '.join(map(str, v['copies']))}\n"
        for task, tp in periods.items() for pol, v in tp.items())
    return FigureOutput(fig, cfg, cfg.seeds[0], tables={"csv": csv}, data=periods,
                        notes={task: {pol: v["period"] for pol, v in tp.items()} for task, tp in periods.items()})


def _round_pp(x: float) -> float | None:
    """Percentage points, 2 decimals; ``None`` (JSON null) where undefined."""
    return round(100 * x, 2) if math.isfinite(x) else None


def _fmt(mean: float, half: float) -> str:
    if not math.isfinite(mean):
        return "diverged"
    return f"{100 * mean:.2f}" + (f" ± {100 * half:.2f}" if math.isfinite(half) else "")


#: the CSV's columns, in order (accuracies and their intervals in percent)
CSV_COLUMNS = ("task", "optimizer", "D", "policy", "seeds", "diverged", "best_mean", "best_ci95", "best_std",
               "final_mean", "final_ci95", "final_std", "n_test", "winner", "lr", "weight_copies")


#: the per-run CSV's columns (``NAME.runs.csv``): the epoch-by-epoch metrics as space-separated lists. A run's
#: wall-clock ``seconds`` is not among them: it is no result (the cache record keeps it, the runner's
#: ``timings.csv`` each figure's), and it would make every recomputation rewrite the committed file.
RUN_COLUMNS = ("task", "optimizer", "D", "policy", "seed", "lr", "epochs", "steps_per_epoch", "n_test", "diverged",
               "diverged_step", "weight_copies", "test_acc", "val_acc", "train_loss")


def runs_csv(records: list[dict]) -> str:
    """One line per run (:data:`RUN_COLUMNS`): what the paired comparisons, the claims and the time-to-accuracy
    ranking need, so that notebook 04 reads them from the committed files rather than from a cache."""
    buf = io.StringIO()
    buf.write(",".join(RUN_COLUMNS) + "\n")
    for r in records:
        vals = []
        for c in RUN_COLUMNS:
            v = r.get(c)
            if c == "lr":
                v = f"{_lr(r):.6g}"
            elif c in ("test_acc", "val_acc", "train_loss", "weight_copies"):
                v = " ".join(f"{x:.6g}" if isinstance(x, float) else str(x) for x in (v or ()))
            vals.append("" if v is None else str(v))
        buf.write(",".join(vals) + "\n")
    return buf.getvalue()


def read_runs(path: Any) -> list[dict]:
    """The records of a ``runs.csv`` file (:func:`parse_runs`)."""
    with open(path, newline="") as fh:
        return parse_runs(fh.read())


def parse_runs(text: str) -> list[dict]:
    """The records of a ``runs.csv`` text (:func:`runs_csv`), with the fields :func:`summary_rows`, the claims and
    the notebook's statements read (lists of floats per epoch, NaN where undefined)."""
    import csv

    out = []
    for row in csv.DictReader(io.StringIO(text)):
        rec: dict[str, Any] = dict(row)
        for c in ("D", "seed", "epochs", "steps_per_epoch", "n_test"):
            rec[c] = int(row[c])
        rec["lr"] = float(row["lr"])
        rec["diverged"] = row["diverged"] == "True"
        rec["diverged_step"] = int(row["diverged_step"]) if row["diverged_step"] else None
        rec["weight_copies"] = [int(x) for x in row["weight_copies"].split()]
        for c in ("test_acc", "val_acc", "train_loss"):
            rec[c] = [float(x) for x in row[c].split()]
        rec["epoch"] = list(range(len(rec["test_acc"])))
        out.append(rec)
    return out


def table_csv(rows: list[dict]) -> str:
    """CSV of :func:`summary_rows` (accuracies in percent; ``*_ci95``: 95% t half-widths; empty: undefined)."""
    buf = io.StringIO()
    buf.write(",".join(CSV_COLUMNS) + "\n")
    for r in rows:
        vals = []
        for c in CSV_COLUMNS:
            v = r[c]
            if c.endswith(("_mean", "_std", "_ci95")):
                v = "" if not math.isfinite(v) else f"{100 * v:.2f}"
            elif c == "weight_copies":
                v = " ".join(map(str, v))
            elif c == "lr":
                v = f"{v:g}"
            vals.append(str(v))
        buf.write(",".join(vals) + "\n")
    return buf.getvalue()


@register("final_accuracy_table", "Best test accuracy (mean ± 95% t half-width over seeds) per task, optimizer and "
                                  "policy, as PipeOptim's Table IV, bold only for a resolved winner; also as CSV",
          budget={"tiny": 10, "quick": 5})
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
        win = None
        for j, p in enumerate(pols):
            r = by.get((task, opt, p))
            if r is None:
                line.append("n/a")
                continue
            line.append(_fmt(r["best_mean"], r["best_ci95"]) + (f" ({r['diverged']}✗)" if r["diverged"] else ""))
            if r["winner"]:
                win = j
        cells.append(line)
        bold.append(win)
    n_tests = {t: by[(t, o, pols[0])]["n_test"] if (t, o, pols[0]) in by else None for t, o in keys}
    fig, ax = plt.subplots(figsize=(1.75 * len(pols) + 3.0, 0.3 * len(keys) + 1.1))
    ax.axis("off")
    labels = [f"{t} · {optimizer_label(o)} ({cfg.epochs_of(t)} epochs, n_test={n_tests[t]})" for t, o in keys]
    tab = ax.table(cellText=cells, rowLabels=labels,
                   colLabels=[LABELS[p] for p in pols], loc="center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(8)
    tab.scale(1, 1.35)
    for i, col in enumerate(bold):
        if col is not None:
            tab[i + 1, col].set_text_props(fontweight="bold")
    seeds = len(cfg.seeds)
    spread = f"mean ± 95% t half-width (ddof=1) over {seeds} seeds" if seeds > 1 else "1 seed (no interval)"
    read = "at the validation-selected epoch" if cfg.n_val else "after the last epoch"
    ax.set_title(f"Test accuracy (%) {read} (of each row's budget), D={cfg.D}, {spread}; preset {preset}, "
                 f"{lr_label(records)}\nbold: the pipelined policy whose paired difference (by seed) to every other "
                 "pipelined policy is resolved (t test, Holm, 95%); none bold: no resolved winner; "
                 "n/a: SpecTrain needs SGDM; ✗: diverged runs", fontsize=8)
    fig.tight_layout()
    return FigureOutput(fig, cfg, cfg.seeds[0], tables={"csv": table_csv(rows), "runs.csv": runs_csv(records)},
                        data=rows,
                        notes={"rows": len(rows), "lr": lr_label(records),
                               "n_test": {t: n for t, n in n_tests.items()},
                               "winners": {f"{t}/{o}": next((p for p in pols if (t, o, p) in by
                                                             and by[(t, o, p)]["winner"]), None)
                                           for t, o in keys}})


def gap_rows(records: list[dict]) -> list[dict]:
    """Per (task, optimizer, D, pipelined policy): accuracy minus sequential's, paired by seed.

    Each row holds ``gap`` (:class:`~pipelab.statistics.PairedDifference` of the per-seed accuracies at the
    validation-selected epoch, policy − sequential, 95% t) over the seeds where neither run diverged, ``diverged``
    (the seeds left out because either run diverged, counted in ``gap.n_nan``), ``diverged_gaps`` (the policy's
    diverged seeds' gaps where they have a finite accuracy, to draw as markers, never inside an interval) and
    ``n_test``.
    """
    groups = _group(records)
    out = []
    for (task, opt, D, pol), rs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][1], POLICY_ORDER.index(kv[0][3]), kv[0][2])):
        base = groups.get((task, opt, D, "sequential"))
        if pol == "sequential" or not base:
            continue
        b = {r["seed"]: math.nan if r["diverged"] else _best(r) for r in base}
        mine = {r["seed"]: r for r in rs if r["seed"] in b}
        a = {s: math.nan if r["diverged"] else _best(r) for s, r in mine.items()}
        gap = paired_difference(a, {s: b[s] for s in a})
        div = [s for s, r in mine.items() if r["diverged"]]
        out.append({"task": task, "optimizer": opt, "D": D, "policy": pol, "gap": gap, "diverged": len(div),
                    "diverged_gaps": [_best(mine[s]) - b[s] for s in div
                                      if math.isfinite(_best(mine[s]) - b[s])],
                    "n_test": int(rs[0]["n_test"])})
    return out


def _gap_limits(gaps: list[dict]) -> tuple[float, float]:
    """y-limits (pp) that hold 0 and every interval of the non-diverged seeds, with a margin: a diverged seed's
    marker far below does not flatten the panel (it is drawn on the edge instead)."""
    ends = [0.0]
    for g in gaps:
        iv = g["gap"]
        if math.isfinite(iv.mean):
            h = iv.half_width if math.isfinite(iv.half_width) else 0.0
            ends += [100 * (iv.mean - h), 100 * (iv.mean + h)]
    lo, hi = min(ends), max(ends)
    pad = max(0.15 * (hi - lo), 0.25)
    return lo - pad, hi + pad


@register("accuracy_gap_vs_depth", "Test accuracy of each policy minus the sequential baseline's (paired by "
                                   "seed, 95% t intervals, diverged seeds apart), against the number of stages D",
          budget={"tiny": 20, "quick": 150})
def accuracy_gap_vs_depth(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    records = _runs(cfg, cfg.depths, cfg.gap_tasks, progress)
    colors = _colors(cfg.policies)
    panels = [(t, o) for t in cfg.gap_tasks for o in cfg.optimizers_of(t)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    gaps = gap_rows(records)
    for ax, (task, opt) in zip(axes[0], panels):
        mine = [g for g in gaps if (g["task"], g["optimizer"]) == (task, opt)]
        lo, hi = _gap_limits(mine)
        for pol in cfg.policies:
            pts = [g for g in mine if g["policy"] == pol]
            if not pts:
                continue
            xs = [g["D"] for g in pts]
            ms = [100 * g["gap"].mean for g in pts]
            hs = [100 * g["gap"].half_width if math.isfinite(g["gap"].half_width) else 0.0 for g in pts]
            ax.errorbar(xs, ms, yerr=hs, color=colors[pol], marker="none", capsize=3, label=LABELS[pol])
            for g, x, m in zip(pts, xs, ms):  # filled marker: the gap is resolved (its interval excludes 0)
                ax.plot([x], [m], marker="o", color=colors[pol],
                        markerfacecolor=colors[pol] if resolved(g["gap"]) else "white")
                for v in g["diverged_gaps"]:  # a diverged seed: a cross, on the panel's edge when beyond it
                    ax.plot([x], [min(max(100 * v, lo), hi)], marker="x", color=colors[pol], ms=7, mew=1.5)
                if g["diverged"]:
                    ax.annotate(f"{g['diverged']}✗", (x, m), textcoords="offset points", xytext=(5, -9), fontsize=7,
                                color=colors[pol])
        ax.set_ylim(lo, hi)
        ax.axhline(0, color="k", ls="--", lw=1)
        ax.set_xticks(list(cfg.depths))
        ax.set_xlabel("stages D")
        ax.set_title(f"{task} · {optimizer_label(opt)} (n_test={test_set_size(task, cfg.n_test)})", fontsize=9)
    axes[0, 0].set_ylabel("test acc. − sequential (pp)")
    # one legend for all panels: a policy may run in some panels only (SpecTrain with SGDM)
    handles = {label: h for ax in axes[0] for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    bars = "bars: 95% t interval of the paired difference" if len(cfg.seeds) > 1 else "1 seed, no interval"
    fig.suptitle(f"Accuracy gap to sequential training vs pipeline depth ({len(cfg.seeds)} seed(s), paired by seed, "
                 f"each run at its validation-selected epoch; {bars}; filled: resolved;\n×: a diverged seed, left out "
                 f"of the interval (k✗: how many), drawn on the edge when beyond it) preset {preset}, "
                 f"{lr_label(records)}", fontsize=9)
    fig.tight_layout()
    key = "{task}/{optimizer}/{policy}/D={D}"
    return FigureOutput(fig, cfg, cfg.seeds[0], data=records, tables={"runs.csv": runs_csv(records)},
                        notes={"lr": lr_label(records),
                               "gap_pp": {key.format(**g): round(100 * g["gap"].mean, 2) for g in gaps},
                               "gap_ci95_pp": {key.format(**g): _round_pp(g["gap"].half_width) for g in gaps},
                               "gap_resolved": {key.format(**g): resolved(g["gap"]) for g in gaps},
                               "gap_diverged": {key.format(**g): g["diverged"] for g in gaps}})


# --- notebook 04's statements, written from the rows (so the prose cannot drift from the CSV) ---------------


def _pp(iv: Any, signed: bool = False) -> str:
    """``"82.4 ± 0.9"`` in percent (points), or the mean alone when there is no interval."""
    m = f"{100 * iv.mean:+.1f}" if signed else f"{100 * iv.mean:.1f}"
    return m + (f" ± {100 * iv.half_width:.1f}" if math.isfinite(iv.half_width) else "")


def _row_label(task: str, opt: str, D: int, many_D: bool) -> str:
    return f"{task} · {optimizer_label(opt)}" + (f" · D={D}" if many_D else "")


def ranking_markdown(rows: list[dict]) -> str:
    """One bullet per task × optimizer (× D): policies by mean best accuracy with 95% t intervals, the winner.

    The winner is named only when resolved (:func:`summary_rows`' ``winner``); otherwise the bullet says that
    no pipelined policy is resolved best.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["optimizer"], r["D"])].append(r)
    many_D = len({k[2] for k in groups}) > 1
    seq_top = sum(max(rs, key=lambda r: r["best_mean"] if math.isfinite(r["best_mean"]) else -math.inf)["policy"]
                  == "sequential" for rs in groups.values() if any(r["policy"] == "sequential" for r in rs))
    n_win = sum(any(r["winner"] for r in rs) for rs in groups.values())
    lines = [f"Sequential training has the highest mean in {seq_top} of {len(groups)} rows; a pipelined policy is "
             f"resolved best (paired by seed, Holm, 95%) in {n_win} of {len(groups)} rows. Best test accuracy in %, "
             "mean ± 95% t half-width:", ""]
    for (task, opt, D), rs in groups.items():
        ranked = sorted(rs, key=lambda r: -r["best_mean"] if math.isfinite(r["best_mean"]) else math.inf)
        parts = [f"{LABELS[r['policy']]} {_pp(t_interval(list(r['best_by_seed'].values())))}"
                 + (f" ({r['diverged']} diverged)" if r["diverged"] else "") for r in ranked]
        win = next((r for r in rs if r["winner"]), None)
        verdict = (f"resolved best pipelined policy: **{LABELS[win['policy']]}**" if win
                   else "no pipelined policy is resolved best")
        lines.append(f"- **{_row_label(task, opt, D, many_D)}** (n_test = {rs[0]['n_test']}, {rs[0]['seeds']} "
                     f"seed(s)): {'; '.join(parts)} — {verdict}.")
    return "\n".join(lines)


def _pairs(rows: list[dict], a: str, b: str) -> list[tuple[tuple, PairedDifference]]:
    """(task, optimizer, D) -> paired difference a − b of the best accuracies, for the rows holding both."""
    by = {(r["task"], r["optimizer"], r["D"], r["policy"]): r for r in rows}
    out = []
    for (task, opt, D, pol), r in by.items():
        other = by.get((task, opt, D, b))
        if pol == a and other is not None:
            out.append(((task, opt, D), paired_difference(r["best_by_seed"], other["best_by_seed"])))
    return out


def comparison_markdown(rows: list[dict], a: str, b: str) -> str:
    """A Markdown list of ``a − b`` (pp, 95% t, paired by seed) per row; ``*``: resolved (each row on its own)."""
    pairs = _pairs(rows, a, b)
    many_D = len({k[2] for k, _ in pairs}) > 1
    return "; ".join(f"{_row_label(k[0], k[1], k[2], many_D)} {_pp(d, signed=True)}{'*' if resolved(d) else ''}"
                     for k, d in pairs) or "no row holds both"


def gap_markdown(gap_notes: dict) -> str:
    """The gap to sequential per policy and D, from ``accuracy_gap_vs_depth``'s notes, as a Markdown table."""
    gaps, cis, res = gap_notes["gap_pp"], gap_notes["gap_ci95_pp"], gap_notes["gap_resolved"]
    div = gap_notes.get("gap_diverged", {})
    cells: dict[str, dict[int, str]] = defaultdict(dict)
    depths: set[int] = set()
    for key, g in gaps.items():
        head, d = key.rsplit("/D=", 1)
        depths.add(int(d))
        ci = cis[key]
        cells[head][int(d)] = (f"{g:+.1f}" + (f" ± {ci:.1f}" if ci is not None else "") + ("*" if res[key] else "")
                               + (f" ({div[key]}✗ left out)" if div.get(key) else ""))
    ds = sorted(depths)
    out = ["| task / optimizer / policy | " + " | ".join(f"D = {d}" for d in ds) + " |",
           "|---|" + "---|" * len(ds)]
    for head, row in cells.items():
        task, opt, pol = head.split("/")
        out.append(f"| {task} · {optimizer_label(opt)} · {LABELS[pol]} | "
                   + " | ".join(row.get(d, "n/a") for d in ds) + " |")
    return "\n".join(out)


def scale_caveat(cfg: LearningCurvesConfig, preset: str, lr: str) -> str:
    """The one-line caveat every conclusion of notebook 04 carries, from the preset's config."""
    n_train = "all" if cfg.n_train is None else f"{cfg.n_train}"
    rates = f"learning rates chosen per arm ({lr})" if "per arm" in lr else \
        f"one fixed {lr} for every policy and depth (no tuning per arm)"
    return (f"Scale: preset `{preset}`, {len(cfg.seeds)} seed(s), {cfg.epochs} epoch(s) on {n_train} training "
            f"examples per task, {rates}; intervals are 95% "
            "Student t over seeds (ddof = 1), winners are named only when resolved. Read every verdict as about "
            "this setting only; the tuned ten-seed study at full scale is section 6 (`figures/study/`).")
