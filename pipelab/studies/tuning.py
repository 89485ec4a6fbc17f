"""Fair learning-rate tuning: a log-spaced grid, successive halving on the validation split, then full seeds.

Every arm (task × optimizer × policy × D) gets its own learning rate, chosen the same way for all:

1. a log-spaced grid (:func:`lr_grid`) ``η_i = low·(high/low)^(i/(n−1))``, i = 0..n−1, n ≥ 5;
2. successive halving (:func:`successive_halving`; Jamieson & Talwalkar 2016, the inner loop of Li et al.'s
   Hyperband): round r runs every surviving rate for a budget of

       epochs_r = min(min_epochs·ηₑ^r, max_epochs)          (ηₑ = ``eta``, r = 0, 1, ...)

   scores each by the validation accuracy at the end of its budget (:func:`final_val_acc`, averaged over
   the tuning seeds; a diverged run scores −∞, the worst), and keeps the best ``⌈n_r/ηₑ⌉``; it stops when
   one rate is left (or after ``rounds`` rounds, keeping the best of the last). With n candidates the
   rounds run ``n_0 = n, n_{r+1} = ⌈n_r/ηₑ⌉`` rates (:func:`halving_schedule`); e.g. 9 rates, ηₑ = 3,
   min_epochs = 1: 9 rates × 1 epoch, then 3 × 3 epochs, then the winner. Ties go to the smaller rate
   (the more stable one). When every rate of a round diverges no rate is selected (``Halving.lr`` is
   ``None``, :attr:`Halving.all_diverged`, :attr:`Halving.message` says so) and the arm runs no further
   round (a longer run repeats the diverged prefix). With ``last_full``, the last round runs at ``max_epochs``
   (the full budget), so the rate is finally chosen on what the full runs will do;
3. edge extension (``extend``): a selection on an end of the arm's grid says the optimum may lie beyond it, so
   the grid grows by one rate past that end, at the grid's own log spacing (``η_0²/η_1`` below, ``η_{n−1}²/η_{n−2}``
   above; below when every rate diverged), and the halving is run again (cached runs are reused), at most
   ``extend`` times per end; :attr:`Halving.on_edge` flags a selection still on an end;
4. the full runs, every seed, only for the selected rate (:func:`selected_configs`).

Seed noise. Each halving decision (the last rate kept against the best rate dropped, in every round) is
*within seed noise* when the 95% paired t interval of their per-seed scores over the tuning seeds includes 0
(:func:`close_decisions`); with one tuning seed every decision is (there is no spread to compare with).

Model selection on validation only: :func:`selected_epoch` picks a run's epoch by its validation accuracy, and
:func:`selected_test_acc` reports the test accuracy there; the test set never picks an epoch.

Selection reads only ``val_acc``/``diverged`` (the validation split is carved from the training set, see
``RunConfig.n_val``); the test set is never used to select. Every round is one sweep through
:func:`pipelab.studies.learning_curves.sweep` (so :func:`pipelab.studies.cache.run_sweep`: cached per run, resumable),
and because an arm's first e epochs do not depend on its total epoch count, a longer round repeats the shorter one's
prefix exactly.

Example:
    >>> from pipelab.studies.learning_curves import RunConfig
    >>> lrs = lr_grid(1e-3, 1e-1, 5)
    >>> [round(x, 6) for x in lrs]
    [0.001, 0.003162, 0.01, 0.031623, 0.1]
    >>> cfgs = [RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=4, seed=0, epochs=6,
    ...                   n_val=200, lr=lr) for lr in lrs]
    >>> halving_schedule(len(cfgs), eta=3, min_epochs=1, max_epochs=6)
    [(5, 1), (2, 3)]
    >>> [h.lr for h in successive_halving(cfgs)]                      # doctest: +SKIP
    >>> finals = selected_configs(successive_halving(cfgs), seeds=range(5))  # doctest: +SKIP

References: K. Jamieson and A. Talwalkar, "Non-stochastic best arm identification and hyperparameter
optimization", AISTATS 2016; L. Li et al., "Hyperband", JMLR 18 (2018).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..statistics import paired_difference, resolved
from .learning_curves import RunConfig, sweep

__all__ = ["lr_grid", "halving_schedule", "final_val_acc", "selected_epoch", "selected_test_acc", "HalvingRound",
           "Halving", "successive_halving", "close_decisions", "check_selected", "selected_configs"]

RunFn = Callable[[RunConfig], dict[str, Any]]


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _int(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)


def lr_grid(low: float, high: float, n: int = 5) -> list[float]:
    """``n`` log-spaced learning rates from ``low`` to ``high`` (both included): ``low·(high/low)^(i/(n−1))``.

    Raises:
        ValueError: ``low``/``high`` not finite, ``low <= 0`` or ``high <= low``; ``n`` not an int >= 5
            (fewer points cannot show where the optimum lies between two divergent or slow ends).
    """
    lo, hi = _real("low", low), _real("high", high)
    if lo <= 0 or hi <= lo:
        raise ValueError(f"need 0 < low < high, got low={low!r}, high={high!r}")
    n = _int("n", n, 5)
    ratio = math.log(hi / lo)
    return [lo] + [lo * math.exp(ratio * i / (n - 1)) for i in range(1, n - 1)] + [hi]


def halving_schedule(n: int, *, eta: int = 3, min_epochs: int = 1, max_epochs: int | None = None,
                     rounds: int | None = None, last_full: bool = False) -> list[tuple[int, int]]:
    """``(rates run, epochs)`` of each round: ``n_0 = n``, ``n_{r+1} = ⌈n_r/eta⌉``, ``epochs_r =
    min(min_epochs·eta^r, max_epochs)``, while ``n_r > 1`` (and ``r < rounds``); with ``last_full`` (which needs
    ``max_epochs``) the last round runs ``max_epochs``. One candidate: no rounds."""
    n, eta, min_epochs = _int("n", n, 1), _int("eta", eta, 2), _int("min_epochs", min_epochs, 1)
    if max_epochs is not None:
        max_epochs = _int("max_epochs", max_epochs, min_epochs)
    if rounds is not None:
        rounds = _int("rounds", rounds, 1)
    out: list[tuple[int, int]] = []
    while n > 1 and (rounds is None or len(out) < rounds):
        epochs = min_epochs * eta ** len(out)
        out.append((n, epochs if max_epochs is None else min(epochs, max_epochs)))
        n = -(-n // eta)
    if last_full and out:
        if max_epochs is None:
            raise ValueError("last_full needs max_epochs (the full budget the last round runs)")
        out[-1] = (out[-1][0], max_epochs)
    return out


def final_val_acc(record: dict[str, Any]) -> float:
    """Selection score of one run: validation accuracy after its last epoch; ``−inf`` if it diverged (or is NaN).

    Raises:
        ValueError: a record without a validation split (``n_val = 0``): selecting on the test set is not fair.
    """
    if not record.get("n_val"):
        raise ValueError("the record has no validation split (n_val = 0); tune with RunConfig(n_val > 0)")
    value = float(record["val_acc"][-1])
    return -math.inf if record["diverged"] or not math.isfinite(value) else value


def selected_epoch(record: dict[str, Any]) -> int | None:
    """The epoch a run is read at, chosen on the validation split: the epoch >= 1 of highest validation accuracy
    (the earliest on ties); without a validation curve (``n_val = 0``: every ``val_acc`` NaN) the last epoch, which
    selects nothing; ``None`` when no such epoch has a finite accuracy (a run that diverged in its first epoch)."""
    val = np.asarray(record.get("val_acc") or [math.nan], dtype=float)
    with_val = bool(np.isfinite(val).any())  # epoch 0 (the initial weights) is evaluated whenever there is a split
    acc = (val if with_val else np.asarray(record["test_acc"], dtype=float))[1:]
    if not np.isfinite(acc).any():
        return None
    if not with_val:
        return int(np.flatnonzero(np.isfinite(acc))[-1]) + 1
    return int(np.nanargmax(acc)) + 1


def selected_test_acc(record: dict[str, Any]) -> float:
    """Test accuracy at :func:`selected_epoch` (NaN when there is none): the figure of merit of every comparison."""
    e = selected_epoch(record)
    return math.nan if e is None else float(record["test_acc"][e])


@dataclass(frozen=True)
class HalvingRound:
    """One round: the rates run (ascending), their scores (mean over the seeds), the survivors (best first), and
    each rate's per-seed scores (``seed_scores[i][j]``: rate i, tuning seed j; ``−inf`` diverged)."""

    epochs: int
    lrs: tuple[float, ...]
    scores: tuple[float, ...]
    kept: tuple[float, ...]
    seed_scores: tuple[tuple[float, ...], ...] = ()

    def decision(self) -> tuple[float, float] | None:
        """``(last kept, best dropped)`` rates of this round (``None`` when nothing was dropped)."""
        dropped = [lr for lr, _ in sorted(zip(self.lrs, self.scores), key=lambda x: (-x[1], x[0]))
                   if lr not in self.kept]
        return (self.kept[-1], dropped[0]) if dropped else None


@dataclass(frozen=True)
class Halving:
    """Successive halving of one arm.

    Attributes:
        base: the arm's config as given (its ``epochs`` is the full-run budget), with ``lr=None``.
        seeds: the tuning seeds (each rate ran with all of them).
        lr: the selected learning rate; ``None`` when every rate of the last round diverged
            (:attr:`all_diverged`; :attr:`message` says which rates and budget).
        rounds: every round, in order.
        records: every run's record, in the order run.
        grid: every rate tuned over (ascending), the extension included; extended: the rates edge extension
            added (:func:`successive_halving`'s ``extend``).
    """

    base: RunConfig
    seeds: tuple[int, ...]
    lr: float | None
    rounds: tuple[HalvingRound, ...]
    records: list[dict[str, Any]] = field(repr=False)
    grid: tuple[float, ...] = ()
    extended: tuple[float, ...] = ()

    @property
    def on_edge(self) -> bool:
        """Whether the selected rate is still an end of the (extended) grid: the optimum may lie beyond it."""
        return self.lr is not None and len(self.grid) > 1 and self.lr in (self.grid[0], self.grid[-1])

    @property
    def all_diverged(self) -> bool:
        """Whether no rate was selected because every rate of the last round diverged (on some seed)."""
        return self.lr is None

    @property
    def message(self) -> str:
        """One line on the outcome: the selected rate, or that (and where) every rate diverged."""
        b = self.base
        name = f"arm {b.task}/{b.optimizer}/{b.policy}/D={b.D}"
        if self.lr is not None:
            return f"{name}: selected lr={self.lr:.4g}"
        if not self.rounds:
            return f"{name}: no learning rate selected: no round ran"
        last = self.rounds[-1]
        return (f"{name}: no learning rate selected: every rate of round {len(self.rounds) - 1} "
                f"({', '.join(f'{lr:.4g}' for lr in last.lrs)}) diverged within {last.epochs} epoch(s) on some "
                f"seed of {list(self.seeds)}; tune over smaller rates")


def _arm_key(cfg: RunConfig) -> RunConfig:
    return replace(cfg, lr=None, seed=0, epochs=1)


def successive_halving(configs: Iterable[RunConfig], run_fn: RunFn | None = None, *, eta: int = 3,
                       min_epochs: int = 1, max_epochs: int | None = None, rounds: int | None = None,
                       metric: Callable[[dict[str, Any]], float] = final_val_acc, last_full: bool = False,
                       extend: int = 0, progress: bool = False,
                       stack: int | Callable[[RunConfig], int] | None = None) -> list[Halving]:
    """Select a learning rate per arm by successive halving on the validation split (see the module docstring).

    Args:
        configs: one :class:`RunConfig` per (arm, rate, seed); configs that differ only in ``lr`` and ``seed``
            are one arm. Every config needs ``n_val >= 1`` and an explicit ``lr``; within an arm every rate
            must come with the same seeds and the same ``epochs`` (the full-run budget, which caps the rounds'
            budgets unless ``max_epochs`` is given).
        run_fn: runs one config (default :func:`pipelab.studies.learning_curves.run`), through the result cache.
        eta: the reduction factor (>= 2); min_epochs: the first round's budget; max_epochs: the largest budget;
        rounds: at most this many rounds (``None``: until one rate is left).
        metric: score of a record (higher is better; ``−inf`` for a diverged run).
        last_full: the last round runs the largest budget (the full-run budget unless ``max_epochs``).
        extend: at most this many rates added past each end of an arm's grid where the selection lands on that end
            (or below the grid when every rate diverged); the halving is then run again over the larger grid.
        progress: show a progress bar per round.
        stack: the most seeds stacked into one run, or a cap per arm (:func:`pipelab.studies.learning_curves.sweep`).

    Returns:
        one :class:`Halving` per arm, in the order the arms first appear.

    Raises:
        ValueError: an empty ``configs``, a config without a validation split or without an lr, an arm whose
            rates have different seeds or epochs, bad ``eta``/``min_epochs``/``max_epochs``/``rounds``/``extend``.
    """
    extend = _int("extend", extend, 0)
    configs = list(configs)
    if not configs:
        raise ValueError("configs is empty: give one RunConfig per (arm, learning rate, seed)")
    arms: dict[RunConfig, list[RunConfig]] = {}
    for c in configs:
        if not isinstance(c, RunConfig):
            raise TypeError(f"configs must be RunConfig instances, got {type(c).__name__}")
        if c.lr is None:
            raise ValueError(f"every config needs an explicit lr to tune over, got lr=None in {c}")
        if c.n_val < 1:
            raise ValueError(f"tuning selects on the validation split: every config needs n_val >= 1, got {c}")
        arms.setdefault(_arm_key(c), []).append(c)
    plans = []
    for key, members in arms.items():
        lrs = sorted({float(c.lr) for c in members if c.lr is not None})
        seeds = sorted({int(c.seed) for c in members})
        have = {(float(c.lr), int(c.seed)) for c in members if c.lr is not None}
        name = f"arm {key.task}/{key.optimizer}/{key.policy}/D={key.D}"
        if have != {(lr, s) for lr in lrs for s in seeds}:
            raise ValueError(f"{name}: every lr needs the same seeds {seeds}")
        if len({c.epochs for c in members}) > 1:
            raise ValueError(f"{name}: the configs disagree on epochs (the full-run budget): "
                             f"{sorted({c.epochs for c in members})}")
        cap = members[0].epochs if max_epochs is None else max_epochs
        plans.append(_Plan(key, members[0], tuple(seeds), lrs, cap))

    def schedule(p: _Plan) -> list[tuple[int, int]]:
        return halving_schedule(len(p.grid), eta=eta, min_epochs=min_epochs, max_epochs=p.cap, rounds=rounds,
                                last_full=last_full)

    todo = plans
    while todo:
        for p in todo:
            p.start(schedule(p))
        for r in range(max((len(p.schedule) for p in todo), default=0)):
            active = [p for p in todo if r < len(p.schedule)]
            batch = [replace(p.key, lr=lr, seed=s, epochs=p.schedule[r][1]) for p in active for lr in p.alive
                     for s in p.seeds]
            records = iter(sweep(batch, progress=progress, desc=f"lr halving, round {r}", run_fn=run_fn,
                                 stack=stack))
            for p in active:
                p.advance(r, [[next(records) for _ in p.seeds] for _ in p.alive], metric, eta)
        todo = [p for p in todo if p.extend_edge(extend)]
    return [p.result() for p in plans]


@dataclass
class _Plan:
    """The running state of one arm's halving (:meth:`start` begins a halving over ``grid``)."""

    key: RunConfig
    first: RunConfig
    seeds: tuple[int, ...]
    grid: list[float]
    cap: int
    alive: list[float] = field(default_factory=list)
    schedule: list[tuple[int, int]] = field(default_factory=list)
    rounds: list[HalvingRound] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    extended: list[float] = field(default_factory=list)
    added: dict[str, int] = field(default_factory=lambda: {"low": 0, "high": 0})

    def start(self, schedule: list[tuple[int, int]]) -> None:
        self.alive, self.schedule, self.rounds = list(self.grid), schedule, []
        self.best = self.grid[0]  # a single candidate needs no round

    def extend_edge(self, limit: int) -> bool:
        """Add one rate past the end the selection landed on (below the grid when every rate diverged), at the
        grid's log spacing; ``False`` when the selection is inside the grid or that end is extended ``limit``
        times (or the grid has one rate: no spacing)."""
        g = self.grid
        if len(g) < 2:
            return False
        side = "low" if self.best is None or self.best == g[0] else "high" if self.best == g[-1] else None
        if side is None or self.added[side] >= limit:
            return False
        new = g[0] ** 2 / g[1] if side == "low" else g[-1] ** 2 / g[-2]
        self.added[side] += 1
        self.extended.append(new)
        self.grid = sorted([*g, new])
        return True

    def advance(self, r: int, recs: list[list[dict[str, Any]]], metric: Callable[[dict[str, Any]], float],
                eta: int) -> None:
        scores, per_rate = [], []
        for per_seed in recs:
            vals = [float(metric(rec)) for rec in per_seed]
            vals = [-math.inf if math.isnan(v) else v for v in vals]
            per_rate.append(tuple(vals))
            scores.append(-math.inf if -math.inf in vals else sum(vals) / len(vals))
            self.records += per_seed
        order = sorted(range(len(self.alive)), key=lambda i: (-scores[i], self.alive[i]))
        keep = [self.alive[i] for i in order[: -(-len(self.alive) // eta)]]
        self.rounds.append(HalvingRound(self.schedule[r][1], tuple(self.alive), tuple(scores), tuple(keep),
                                        tuple(per_rate)))
        self.alive = sorted(keep)
        if max(scores) == -math.inf:  # every rate diverged: none is selected, and longer runs diverge as well
            self.best = None
            del self.schedule[r + 1:]
        else:
            self.best = keep[0]

    def result(self) -> Halving:
        return Halving(replace(self.first, lr=None), self.seeds, self.best, tuple(self.rounds), self.records,
                       tuple(self.grid), tuple(sorted(self.extended)))


def close_decisions(halvings: Iterable[Halving], confidence: float = 0.95) -> tuple[int, int]:
    """``(within seed noise, all)``: the halving decisions (each round's last kept rate against its best dropped
    rate, over the final halving of every arm) whose per-seed scores' paired 95% t interval includes 0. A decision
    where either rate diverged on a seed is decisive (not within noise); one tuning seed leaves every decision
    within noise (no spread to compare with)."""
    close = total = 0
    for h in halvings:
        for rnd in h.rounds:
            pair = rnd.decision()
            if pair is None:
                continue
            a, b = (rnd.seed_scores[rnd.lrs.index(lr)] for lr in pair)
            total += 1
            if not all(map(math.isfinite, (*a, *b))):
                continue
            close += not resolved(paired_difference(list(a), list(b), confidence))
    return close, total


def check_selected(halvings: Iterable[Halving]) -> list[Halving]:
    """The halvings, after checking that every arm selected a rate.

    Raises:
        ValueError: listing :attr:`Halving.message` of every arm whose rates all diverged (running it at some
            other rate, e.g. the optimizer's default, would not be a tuned result).
    """
    halvings = list(halvings)
    failed = [h.message for h in halvings if h.lr is None]
    if failed:
        raise ValueError("\n".join(failed))
    return halvings


def selected_configs(halvings: Iterable[Halving], seeds: Iterable[int], *, epochs: int | None = None,
                     **changes: Any) -> list[RunConfig]:
    """The full runs: for every arm, its selected lr with every seed in ``seeds``.

    Each config is the arm's ``base`` (same task, policy, D, ``n_val`` — the training set the rate was tuned
    on) with ``lr`` = the selected rate, ``seed`` = s, ``epochs`` (default: the base's, the full budget) and any
    other field in ``changes``.

    Raises:
        ValueError: an arm without a selected rate (:func:`check_selected`), or no seeds.
    """
    halvings = check_selected(halvings)
    seeds = list(seeds)
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in seeds):
        raise ValueError(f"seeds must be ints, got {seeds!r}")
    if not seeds:
        raise ValueError("seeds is empty: the full runs need at least one seed")
    out: list[RunConfig] = []
    for h in halvings:
        ep = h.base.epochs if epochs is None else epochs
        out += [replace(h.base, lr=h.lr, seed=s, epochs=ep, **changes) for s in seeds]
    return out
