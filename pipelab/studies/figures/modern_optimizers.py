"""Figure ``modern_optimizers``: the modern-optimizer claims about pipeline staleness, tested on learning curves.

Three papers say how much staleness costs depends on the optimizer, and that cheap corrections remove the cost:

- Zmushko et al., "One-Step Gradient Delay is Not a Barrier for Large-Scale Asynchronous Pipeline Parallel LLM
  Pretraining" (ICML 2026, arXiv:2606.30634): under PipeDream-2BW's one-step delay Muon's validation-loss gap to
  synchronous training is small (≈ 0.01) while AdamW's is large (> 0.2); an error-feedback correction closes most of
  what is left, for any optimizer;
- Ajanthan et al., "Nesterov Method for Asynchronous Pipeline Parallel Optimization" (ICML 2025, arXiv:2505.01099):
  asynchronous pipeline training with NAdam's Nesterov look-ahead matches or beats the synchronous baseline;
- Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation" (ICML 2017): DC-ASGD beats
  uncompensated asynchronous SGD.

The runs: the learning-curve runner (:func:`pipelab.studies.learning_curves.sweep`, exact emulator, cached per run)
on the bias-free Fashion-MNIST MLP (``fashion_mnist_mlp_nobias``: torch's Muon takes only matrices, and every
optimizer runs on the same net), every (policy, optimizer) pair the registry serves
(:func:`~pipelab.studies.learning_curves.serves`: the Nesterov policy takes NAdam), D stages, the same seeds for
every arm (same initial weights, same mini-batches), so that every comparison is paired by seed. The metric is the
held-out loss at the end of training (the final epoch's test loss, never used to select anything: the papers'
validation loss), with the final test accuracy beside it.

Every comparison is a paired difference over seeds with its 95% Student-t interval
(:func:`pipelab.statistics.paired_difference`; ``*``: resolved, the interval excludes 0). The claims
(:data:`CLAIMS`) are decided per (optimizer, D) row and then over the rows, as notebook 04's claims are
(:mod:`pipelab.studies.figures.learning_curves`): *beats*: reproduced when a's loss is resolved lower than b's in
every row, refuted when resolved higher in one; *small gap*: reproduced when the interval of the loss gap lies below
:data:`LOSS_MARGIN` (0.01, the paper's "≈ 0.01") in every row, refuted when it lies above it in one; *closes most*:
error feedback's loss is resolved lower than 2BW's and the mean gap it removes is at least half of 2BW's mean gap,
in every row; otherwise inconclusive. Runs that diverge are counted and left out of the pairs.

Learning rates: one per optimizer, the same for every policy, so that a gap is the price of staleness at the rate
that trains the synchronous baseline. ``quick`` uses each optimizer's common rate (SGDM 0.01, AdamW 1e-3, NAdam
2e-3, Muon 0.02, Jordan et al.'s); with a :class:`~pipelab.studies.settings.Tuning` (``tiny`` for SGDM,
``study``) the rate is selected by successive halving on the *sequential* arm's validation split
(:func:`pipelab.studies.tuning.successive_halving`). Muon runs alone (not stacked) and torch's Newton–Schulz iteration
runs in bfloat16, about 18 times slower than float32 on a CPU, so ``quick`` runs Muon under the arms claim (i)
needs (sequential, 2BW, error feedback) only.
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

from ...optim import optimizer_label
from ...statistics import PairedDifference, paired_difference, resolved, t_interval
from ..config import from_preset
from ..learning_curves import RunConfig, grid, sweep, with_
from ..settings import (
    MODERN_LRS,
    MODERN_ONLY,
    MODERN_OPTIMIZERS,
    MODERN_POLICIES,
    MODERN_TUNING,
    MUON_POLICIES,
    TINY_TUNING,
    Tuning,
)
from . import FigureOutput, register
from .learning_curves import LABELS, _colors, _lr, lr_label, test_set_size

__all__ = ["ModernOptimizersConfig", "PRESETS", "CLAIMS", "LOSS_MARGIN", "modern_configs", "modern_rates",
           "modern_runs", "gap_rows", "claim_rows", "claim_verdicts", "claims_markdown", "gaps_markdown",
           "read_modern_runs", "parse_modern_runs", "modern_runs_csv", "setup_markdown"]

#: the largest held-out-loss gap called "small" (nats): the paper's Muon gap, ≈ 0.01
LOSS_MARGIN = 0.01


@dataclass(frozen=True)
class ModernOptimizersConfig:
    """The runs of ``modern_optimizers`` (the run fields mean what they mean in
    :class:`~pipelab.studies.learning_curves.RunConfig`).

    Attributes:
        task: a task whose parameters are all matrices (Muon); optimizers, policies: the grid (only the pairs
            :func:`~pipelab.studies.learning_curves.serves` accepts run); muon_policies: the policies Muon runs
            (``None``: all); only: other optimizers' policy lists, ``((optimizer, policies), ...)`` (the β1 = 0.99 NAdam
            runs the asynchronous-Nesterov claim's arms only); depths, seeds: D values and seeds; lrs: each
            optimizer's common rate; tuning: select each optimizer's rate on the sequential arm instead (its grids
            name the optimizers tuned; the others keep
            ``lrs``); n_val: validation examples carved from ``n_train`` (needed by the tuning).
    """

    task: str
    optimizers: tuple[str, ...]
    policies: tuple[str, ...]
    depths: tuple[int, ...]
    seeds: tuple[int, ...]
    epochs: int
    batch_size: int
    n_train: int | None
    n_test: int | None
    n_eval_train: int
    lrs: tuple[tuple[str, float], ...]
    muon_policies: tuple[str, ...] | None = None
    only: tuple[tuple[str, tuple[str, ...]], ...] = ()
    tuning: Tuning | None = None
    n_val: int = 0
    device: str = "cpu"

    def common(self) -> dict[str, Any]:
        return dict(epochs=self.epochs, batch_size=self.batch_size, n_train=self.n_train, n_test=self.n_test,
                    n_eval_train=self.n_eval_train, n_val=self.n_val, device=self.device)


PRESETS: dict[str, ModernOptimizersConfig] = {
    "tiny": ModernOptimizersConfig("digits_mlp_nobias", MODERN_OPTIMIZERS, MODERN_POLICIES, (4,), (0, 1), epochs=1,
                                   batch_size=32, n_train=192, n_test=100, n_eval_train=64, lrs=MODERN_LRS,
                                   muon_policies=MUON_POLICIES, only=MODERN_ONLY, tuning=TINY_TUNING, n_val=64),
    "quick": ModernOptimizersConfig("fashion_mnist_mlp_nobias", MODERN_OPTIMIZERS, MODERN_POLICIES, (4,),
                                    (0, 1, 2, 3, 4), epochs=3, batch_size=64, n_train=4096, n_test=2000,
                                    n_eval_train=2000, lrs=MODERN_LRS, muon_policies=MUON_POLICIES, only=MODERN_ONLY),
    "study": ModernOptimizersConfig("fashion_mnist_mlp_nobias", MODERN_OPTIMIZERS, MODERN_POLICIES, (4, 8),
                                    (0, 1, 2, 3, 4), epochs=6, batch_size=128, n_train=None, n_test=None,
                                    n_eval_train=5000, lrs=MODERN_LRS, only=MODERN_ONLY, tuning=MODERN_TUNING,
                                    n_val=5000),
}
PRESETS["paper"] = PRESETS["study"]


def _config(preset: str) -> ModernOptimizersConfig:
    return from_preset(PRESETS, preset)


def modern_configs(cfg: ModernOptimizersConfig, lrs: dict[str, float] | None = None) -> list[RunConfig]:
    """Every run of the grid that can run (served pairs, Muon's policies), each at its optimizer's rate."""
    rates = {**dict(cfg.lrs), **(lrs or {})}
    out = []
    for opt in cfg.optimizers:
        pols = cfg.policies if opt != "muon" or cfg.muon_policies is None else \
            tuple(p for p in cfg.policies if p in cfg.muon_policies)
        if opt in dict(cfg.only):
            pols = tuple(p for p in pols if p in dict(cfg.only)[opt])
        out += [with_(c, lr=rates.get(opt)) for c in grid([cfg.task], pols, [opt], cfg.depths, cfg.seeds,
                                                          **cfg.common())]
    return out


def modern_rates(cfg: ModernOptimizersConfig, progress: bool = False) -> dict[str, tuple[float, str]]:
    """Each optimizer's rate and how it was chosen: ``"common"``, or ``"tuned"`` by successive halving of its
    grid (:class:`Tuning`) on the sequential arm (first depth, tuning seeds; validation accuracy)."""
    from ..tuning import check_selected, successive_halving

    out = {opt: (float(lr), "common") for opt, lr in cfg.lrs if opt in cfg.optimizers}
    tn = cfg.tuning
    if tn is None:
        return out
    tuned = [g[0] for g in tn.grids if g[0] in cfg.optimizers]
    candidates = [RunConfig(task=cfg.task, policy="sequential", optimizer=opt, D=cfg.depths[0], seed=s, lr=lr,
                            **cfg.common()) for opt in tuned for lr in tn.lrs(opt) for s in tn.seeds]
    for h in check_selected(successive_halving(candidates, eta=tn.eta, min_epochs=tn.min_epochs,
                                               max_epochs=tn.max_epochs, progress=progress)):
        assert h.lr is not None  # check_selected
        out[h.base.optimizer] = (float(h.lr), "tuned")
    return out


def modern_runs(cfg: ModernOptimizersConfig, progress: bool = False) -> tuple[list[dict], dict[str, tuple[float, str]]]:
    """The records of every run (through the learning-curve cache) and the rates they ran at."""
    rates = modern_rates(cfg, progress)
    records = sweep(modern_configs(cfg, {o: r for o, (r, _) in rates.items()}), progress=progress,
                    desc="modern optimizers")
    return records, rates


# ----------------------------------------------------------------------------------------------- comparisons

def _final(r: dict, key: str) -> float:
    v = float(r[key][-1])
    return v if math.isfinite(v) else math.nan


def _by_seed(records: Sequence[dict], key: str) -> dict[tuple, dict[int, float]]:
    """(optimizer, D, policy) -> seed -> final ``key`` (NaN for a diverged run)."""
    out: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in records:
        out[(r["optimizer"], r["D"], r["policy"])][r["seed"]] = _final(r, key)
    return out


def _diff(a: dict[int, float], b: dict[int, float]) -> PairedDifference:
    seeds = sorted(set(a) & set(b))
    return paired_difference([a[s] for s in seeds], [b[s] for s in seeds])


def gap_rows(records: Sequence[dict]) -> list[dict]:
    """Per (optimizer, D, policy ≠ sequential): the paired gap to sequential of the final test loss (policy −
    sequential, > 0: worse) and of the final test accuracy (policy − sequential, in points, < 0: worse), each with
    its 95% t half-width, resolved flag and number of seed pairs, and the policy's diverged runs."""
    loss, acc = _by_seed(records, "test_loss"), _by_seed(records, "test_acc")
    div: dict[tuple, int] = defaultdict(int)
    lrs: dict[tuple, float] = {}
    for r in records:
        div[(r["optimizer"], r["D"], r["policy"])] += bool(r["diverged"])
        lrs[(r["optimizer"], r["D"], r["policy"])] = _lr(r)
    rows = []
    for (opt, D, pol), a in loss.items():
        base = loss.get((opt, D, "sequential"))
        if pol == "sequential" or base is None:
            continue
        dl, da = _diff(a, base), _diff(acc[(opt, D, pol)], acc[(opt, D, "sequential")])
        seq_mean = t_interval(list(base.values())).mean
        rows.append({"optimizer": opt, "D": D, "policy": pol, "lr": lrs[(opt, D, pol)], "pairs": dl.n,
                     "diverged": div[(opt, D, pol)], "sequential_loss": seq_mean,
                     "loss_gap": dl.mean, "loss_gap_ci95": dl.half_width, "loss_gap_resolved": resolved(dl),
                     "acc_gap_pp": 100 * da.mean, "acc_gap_ci95_pp": 100 * da.half_width,
                     "acc_gap_resolved": resolved(da)})
    order = {p: i for i, p in enumerate(MODERN_POLICIES)}
    return sorted(rows, key=lambda r: (r["D"], r["optimizer"], order.get(r["policy"], len(order))))


#: the claims: (key, name, claim, source, kind, optimizers, a, b); ``name``: the claim in a few words, for the
#: figure's title (``key`` names it in the CSV and the notes). Kinds (on the final test loss, paired by seed):
#: ``small_gap``: loss(a) − loss(b) below LOSS_MARGIN; ``beats``: loss(a) < loss(b); ``larger_gap``: the gap of
#: 2BW to sequential is larger with optimizer a than with b; ``closes_most``: a (error feedback) removes at least
#: half of b's (2BW's) gap to sequential. ``optimizers``: the rows (``None``: every optimizer running both arms).
CLAIMS: tuple[tuple[str, str, str, str, str, tuple[str, ...] | None, str, str], ...] = (
    ("muon_small_gap", "Muon's 2BW gap is small",
     "Under 2BW's one-step delay Muon's gap to sequential is small (≈ 0.01)",
     "arXiv:2606.30634", "small_gap", ("muon",), "2bw", "sequential"),
    ("adamw_gap_larger", "AdamW's 2BW gap exceeds Muon's",
     "AdamW's 2BW gap to sequential is larger than Muon's",
     "arXiv:2606.30634", "larger_gap", None, "adamw", "muon"),
    ("ef_closes_most", "error feedback closes most of 2BW's gap",
     "Error feedback closes most of 2BW's gap, for any optimizer",
     "arXiv:2606.30634", "closes_most", None, "error_feedback", "2bw"),
    ("nesterov_matches_sync", "async Nesterov matches sync",
     "Asynchronous Nesterov (NAdam) matches or beats the synchronous baseline",
     "arXiv:2505.01099", "small_gap", ("nadam", "nadam_async"), "nesterov_async", "sequential"),
    ("dc_beats_vanilla", "DC-ASGD beats vanilla async",
     "DC-ASGD beats vanilla asynchronous training",
     "Zheng et al., ICML 2017", "beats", None, "dc_asgd", "vanilla"),
    ("dc_beats_asgd", "DC-ASGD beats ASGD",
     "DC-ASGD beats ASGD (its own base, weight stashing, without the compensation)",
     "Zheng et al., ICML 2017", "beats", None, "dc_asgd", "stashing"),
)


def claim_rows(records: Sequence[dict]) -> list[dict]:
    """One row per claim × (optimizer, D) holding both arms: the paired quantity, its interval and the row's
    outcome (``good``, ``bad`` or ``open``).

    ``quantity``: for ``small_gap`` and ``beats`` the mean of loss(a) − loss(b); for ``larger_gap`` the mean of
    gap_a − gap_b with gap = loss(2BW) − loss(sequential) per seed and optimizer; for ``closes_most`` the mean of
    loss(b) − loss(a) (the gap removed), with ``fraction`` = that mean over the mean of loss(b) − loss(sequential).
    """
    loss = _by_seed(records, "test_loss")
    depths = sorted({r["D"] for r in records})
    opts = list(dict.fromkeys(r["optimizer"] for r in records))
    rows = []

    def add(key: str, opt: str, D: int, d: PairedDifference, outcome: str, fraction: float = math.nan) -> None:
        rows.append({"claim": key, "optimizer": opt, "D": D, "pairs": d.n, "quantity": d.mean,
                     "ci95": d.half_width, "resolved": resolved(d), "fraction": fraction, "outcome": outcome})

    for key, _, _, _, kind, only, a, b in CLAIMS:
        for D in depths:
            if kind == "larger_gap":
                ga, gb = ((_gap(loss, o, D, "2bw")) for o in (a, b))
                if ga is not None and gb is not None:
                    d = _diff(ga, gb)
                    add(key, f"{a} vs {b}", D, d, _outcome("beats_up", d))
                continue
            for opt in opts:
                if only is not None and opt not in only:
                    continue
                xa, xb = loss.get((opt, D, a)), loss.get((opt, D, b))
                if xa is None or xb is None:
                    continue
                # the arm claimed better diverging more often than the other refutes the row
                worse = _diverged(xa) > _diverged(xb)
                if kind == "small_gap":
                    d = _diff(xa, xb)
                    add(key, opt, D, d, "bad" if worse else _outcome("small", d))
                elif kind == "beats":
                    d = _diff(xa, xb)
                    add(key, opt, D, d, "bad" if worse else _outcome("beats_down", d))
                else:  # closes_most: a = error feedback, b = 2BW
                    gap = _gap(loss, opt, D, b)
                    if gap is None:
                        continue
                    d = _diff(xb, xa)
                    whole = t_interval([v for v in gap.values() if math.isfinite(v)]).mean
                    fraction = d.mean / whole if whole > 0 else math.nan
                    outcome = "bad" if worse else _outcome("beats_up", d)
                    if outcome == "good" and not fraction >= 0.5:
                        outcome = "open"
                    add(key, opt, D, d, outcome, fraction)
    return rows


def _diverged(values: dict[int, float]) -> int:
    return sum(not math.isfinite(v) for v in values.values())


def _gap(loss: dict[tuple, dict[int, float]], opt: str, D: int, pol: str) -> dict[int, float] | None:
    """Seed -> loss(pol) − loss(sequential) for one optimizer and D (``None`` when an arm is missing)."""
    a, s = loss.get((opt, D, pol)), loss.get((opt, D, "sequential"))
    if a is None or s is None:
        return None
    return {k: a[k] - s[k] for k in sorted(set(a) & set(s))}


def _outcome(rule: str, d: PairedDifference) -> str:
    """A row's outcome: ``small``: the interval below ±LOSS_MARGIN's upper side (good) or above it (bad);
    ``beats_down``: resolved negative (good) or positive (bad); ``beats_up``: resolved positive (good) or negative."""
    if not math.isfinite(d.half_width):
        return "open"
    if rule == "small":
        return "good" if d.high < LOSS_MARGIN else "bad" if d.low > LOSS_MARGIN else "open"
    sign = -1.0 if rule == "beats_down" else 1.0
    if resolved(d):
        return "good" if sign * d.mean > 0 else "bad"
    return "open"


def claim_verdicts(rows: Sequence[dict]) -> list[dict]:
    """Per claim: ``reproduced`` (every row good), ``refuted`` (a row bad), ``inconclusive``, or ``not run``, with
    the counts."""
    out = []
    for key, name, claim, source, kind, _, a, b in CLAIMS:
        rs = [r for r in rows if r["claim"] == key]
        good, bad = sum(r["outcome"] == "good" for r in rs), sum(r["outcome"] == "bad" for r in rs)
        verdict = "not run" if not rs else "refuted" if bad else "reproduced" if good == len(rs) else "inconclusive"
        out.append({"claim": key, "name": name, "text": claim, "source": source, "kind": kind, "a": a, "b": b,
                    "rows": len(rs), "good": good, "bad": bad, "verdict": verdict})
    return out


# ----------------------------------------------------------------------------------------------- text and tables

def _pm(mean: float, half: float, digits: int = 3, star: bool = False) -> str:
    if not math.isfinite(mean):
        return "n/a"
    s = f"{mean:+.{digits}f}" + (f" ± {half:.{digits}f}" if math.isfinite(half) else "")
    return s + ("*" if star else "")


def _csv(rows: Sequence[dict], cols: Sequence[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.6g}" if math.isfinite(v) else ""
        return "" if v is None else str(v)

    return ",".join(cols) + "\n" + "".join(",".join(cell(r[c]) for c in cols) + "\n" for r in rows)


GAP_COLUMNS = ("optimizer", "D", "policy", "lr", "pairs", "diverged", "sequential_loss", "loss_gap", "loss_gap_ci95",
               "loss_gap_resolved", "acc_gap_pp", "acc_gap_ci95_pp", "acc_gap_resolved")
CLAIM_COLUMNS = ("claim", "optimizer", "D", "pairs", "quantity", "ci95", "resolved", "fraction", "outcome")
#: the per-run CSV (``NAME.runs.csv``): per-epoch lists space-separated; no wall-clock ``seconds``, which is no
#: result (see :data:`pipelab.studies.figures.learning_curves.RUN_COLUMNS`)
RUN_COLUMNS = ("task", "optimizer", "D", "policy", "seed", "lr", "epochs", "diverged", "test_loss", "test_acc",
               "train_loss")


def modern_runs_csv(records: Sequence[dict]) -> str:
    """One line per run (:data:`RUN_COLUMNS`), enough to redo every comparison of the figure."""
    buf = io.StringIO()
    buf.write(",".join(RUN_COLUMNS) + "\n")
    for r in records:
        vals = []
        for c in RUN_COLUMNS:
            v: Any = r[c]
            if c == "lr":
                v = f"{_lr(r):.6g}"
            elif c in ("test_loss", "test_acc", "train_loss"):
                v = " ".join(f"{float(x):.6g}" for x in v)
            vals.append(str(v))
        buf.write(",".join(vals) + "\n")
    return buf.getvalue()


def read_modern_runs(path: Any) -> list[dict]:
    """The records of a :func:`modern_runs_csv` file (lists of floats per epoch, NaN where diverged)."""
    with open(path, newline="") as fh:
        return parse_modern_runs(fh.read())


def parse_modern_runs(text: str) -> list[dict]:
    """The records of a :func:`modern_runs_csv` text (the figure's ``runs.csv`` table)."""
    import csv

    out = []
    for row in csv.DictReader(io.StringIO(text)):
        rec: dict[str, Any] = dict(row)
        for c in ("D", "seed", "epochs"):
            rec[c] = int(row[c])
        rec["lr"] = float(row["lr"])
        rec["diverged"] = row["diverged"] == "True"
        for c in ("test_loss", "test_acc", "train_loss"):
            rec[c] = [float(x) for x in row[c].split()]
        rec["epoch"] = list(range(len(rec["test_loss"])))
        out.append(rec)
    return out


def setup_markdown(config: Any, notes: dict[str, Any], records: Sequence[dict]) -> str:
    """One paragraph on what ran: task, depths, seeds, epochs, each optimizer's rate and how it was chosen, and the
    runs that diverged (from the figure's config and notes, or its sidecar's)."""
    cfg = config if isinstance(config, dict) else {f: getattr(config, f) for f in config.__dataclass_fields__}
    rates = "; ".join(f"{optimizer_label(o)} {v['lr']:g} ({v['how']})" for o, v in notes["rates"].items())
    div = sum(bool(r["diverged"]) for r in records)
    n_train = "all" if cfg["n_train"] is None else cfg["n_train"]
    return (f"Task `{cfg['task']}`, D = {', '.join(str(d) for d in cfg['depths'])}, {len(cfg['seeds'])} seeds "
            f"(the same initial weights and mini-batches in every arm of a seed), {cfg['epochs']} epochs on "
            f"{n_train} training examples, batch {cfg['batch_size']}; {len(records)} runs, {div} diverged. Learning "
            f"rates, one per optimizer for every policy: {rates} (common: the optimizer's usual rate; tuned: "
            "successive halving on the sequential arm's validation split). Muon runs "
            + ("every policy." if cfg.get("muon_policies") is None else
               "only " + ", ".join(LABELS[p] for p in cfg["muon_policies"]) + " (its Newton–Schulz iteration runs "
               "in bfloat16, slow on a CPU).")
            + "".join(f" {optimizer_label(o)} runs only " + ", ".join(LABELS[p] for p in pols) + "."
                      for o, pols in cfg.get("only", ()))
            + " Intervals: 95% Student t over seeds, paired by seed (ddof = 1).")


def gaps_markdown(rows: Sequence[dict]) -> str:
    """The gap table (:func:`gap_rows`) as Markdown: loss gap and accuracy gap to sequential, ``*`` resolved."""
    out = ["| optimizer (lr) | D | policy | seeds paired | final test loss − sequential | final test accuracy − "
           "sequential (pp) |", "|---|---|---|---|---|---|"]
    for r in rows:
        div = f" ({r['diverged']} diverged)" if r["diverged"] else ""
        out.append(f"| {optimizer_label(r['optimizer'])} ({r['lr']:g}) | {r['D']} | {LABELS[r['policy']]}{div} | "
                   f"{r['pairs']} | {_pm(r['loss_gap'], r['loss_gap_ci95'], 3, r['loss_gap_resolved'])} | "
                   f"{_pm(r['acc_gap_pp'], r['acc_gap_ci95_pp'], 1, r['acc_gap_resolved'])} |")
    return "\n".join(out)


def claims_markdown(rows: Sequence[dict]) -> str:
    """The claims with their verdict here and the per-row evidence (mean ± 95% t, paired by seed; * resolved)."""
    out = [f"Rule (final test loss, paired by seed, 95% t): *small gap*: the interval of the gap lies below "
           f"{LOSS_MARGIN:g}; *beats*: resolved lower loss; *larger gap*: the 2BW gap resolved larger; *closes most*: "
           "error feedback's loss resolved below 2BW's and at least half of the mean gap removed. Reproduced when "
           "every row holds, refuted when one row resolves the other way, otherwise inconclusive. The quantity per "
           "row: *small gap* loss(policy) − loss(sequential); *larger gap* AdamW's 2BW gap − Muon's; *closes most* "
           "loss(2BW) − loss(error feedback), the gap removed, with its share of 2BW's mean gap; *beats* "
           "loss(DC-ASGD) − loss(baseline) (< 0 favours DC-ASGD).", "",
           "| claim | source | verdict here | per row (optimizer · D): quantity ± 95% t |", "|---|---|---|---|"]
    for v in claim_verdicts(rows):
        rs = [r for r in rows if r["claim"] == v["claim"]]
        parts = []
        for r in rs:
            frac = f", {100 * r['fraction']:.0f}% of the gap" if math.isfinite(r["fraction"]) else ""
            label = (" − ".join(optimizer_label(o) for o in r["optimizer"].split(" vs ")) if " vs " in r["optimizer"]
                     else optimizer_label(r["optimizer"]))
            parts.append(f"{label} · D={r['D']}: {_pm(r['quantity'], r['ci95'], 3, r['resolved'])}{frac} "
                         f"({r['outcome']})")
        out.append(f"| {v['text']} | {v['source']} | **{v['verdict']}** ({v['good']}/{v['rows']} rows hold) | "
                   + ("; ".join(parts) or "no row holds both arms") + " |")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- the figure

@register("modern_optimizers", "Muon, NAdam, AdamW and SGDM under 2BW, error feedback, DC-ASGD and asynchronous "
          "Nesterov: learning curves and paired gaps to sequential, with a verdict on each paper's claim",
          budget={"tiny": 30, "quick": 170})  # quick: 141 s measured
def modern_optimizers(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = _config(preset)
    records, rates = modern_runs(cfg, progress)
    gaps, claims = gap_rows(records), claim_rows(records)
    verdicts = claim_verdicts(claims)
    D = cfg.depths[0]
    opts = [o for o in cfg.optimizers if any(r["optimizer"] == o for r in records)]
    colors = _colors(MODERN_POLICIES)
    pipelined = [p for p in MODERN_POLICIES if p != "sequential" and any(g["policy"] == p for g in gaps)]
    fig, axes = plt.subplots(2, len(opts), figsize=(3.4 * len(opts) + 1.6, 7.2), squeeze=False,
                             gridspec_kw={"height_ratios": (1.1, 1.0)})
    handles: dict[str, Any] = {}
    for i, opt in enumerate(opts):
        ax = axes[0, i]
        for pol in MODERN_POLICIES:
            rs = [r for r in records if r["optimizer"] == opt and r["D"] == D and r["policy"] == pol]
            if not rs:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                y = np.log(np.array([r["test_loss"] for r in rs], dtype=float))
            ivs = [t_interval(y[:, e]) for e in range(y.shape[1])]
            m = np.array([iv.mean for iv in ivs])
            h = np.array([iv.half_width for iv in ivs])
            ep = np.arange(y.shape[1])
            (line,) = ax.plot(ep, np.exp(m), color=colors[pol], ls="--" if pol == "sequential" else "-",
                              lw=2.0 if pol == "sequential" else 1.3)
            handles.setdefault(pol, line)
            ax.fill_between(ep, np.exp(m - h), np.exp(m + h), color=colors[pol], alpha=0.12, lw=0)
            div = sum(r["diverged"] for r in rs)
            if div:
                ax.text(ep[-1], np.exp(m[np.isfinite(m)][-1]) if np.isfinite(m).any() else 1.0,
                        f" {div}/{len(rs)} diverged", color=colors[pol], fontsize=6.5, va="center")
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_title(f"{optimizer_label(opt)}, lr {rates[opt][0]:g} ({rates[opt][1]}), D={D}", fontsize=9)
        ax = axes[1, i]
        for g in (g for g in gaps if g["optimizer"] == opt and g["D"] == D):
            j = pipelined.index(g["policy"])
            ax.errorbar(g["loss_gap"], j, xerr=g["loss_gap_ci95"] if math.isfinite(g["loss_gap_ci95"]) else None,
                        fmt="o", color=colors[g["policy"]], capsize=3,
                        mfc=colors[g["policy"]] if g["loss_gap_resolved"] else "white")
        ax.axvline(0, color="black", lw=0.8)
        ax.axvspan(-LOSS_MARGIN, LOSS_MARGIN, color="0.8", lw=0)
        ax.set_ylim(len(pipelined) - 0.5, -0.5)
        ax.set_yticks(range(len(pipelined)), [LABELS[p] for p in pipelined] if i == 0 else [], fontsize=7)
        ax.set_xlabel("final test loss − sequential\n(paired by seed, 95% t)", fontsize=8)
    axes[0, 0].set_ylabel("test loss (geometric mean, 95% t band)")
    # the verdicts in words, three claims a line (the keys are for the CSV and the notes)
    said = [f"{v['name']}: {v['verdict']}" for v in verdicts]
    text = "\n".join("; ".join(said[i:i + 3]) for i in range(0, len(said), 3))
    n_test = test_set_size(cfg.task, cfg.n_test)
    fig.suptitle(f"Modern optimizers under pipeline staleness: {cfg.task}, {len(cfg.seeds)} seeds, {cfg.epochs} "
                 f"epochs, n_test={n_test}, preset {preset}; filled dot: gap resolved; grey band: |gap| < "
                 f"{LOSS_MARGIN:g}\n{text}", fontsize=8.5)
    drawn = [p for p in MODERN_POLICIES if p in handles]
    fig.legend([handles[p] for p in drawn], [LABELS[p] for p in drawn], loc="lower center", ncol=4, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 0.93))
    notes = {"runs": len(records), "lr": lr_label(records),
             "rates": {o: {"lr": lr, "how": how} for o, (lr, how) in rates.items()},
             "seeds": list(cfg.seeds), "depths": list(cfg.depths), "task": cfg.task,
             "verdicts": {v["claim"]: v["verdict"] for v in verdicts}, "loss_margin": LOSS_MARGIN,
             "loss_gap": {f"{g['optimizer']}/D={g['D']}/{g['policy']}": [round(g["loss_gap"], 4),
                                                                         round(g["loss_gap_ci95"], 4)]
                          for g in gaps if math.isfinite(g["loss_gap"]) and math.isfinite(g["loss_gap_ci95"])}}
    return FigureOutput(fig, cfg, cfg.seeds[0], data={"records": records, "gaps": gaps, "claims": claims},
                        tables={"csv": _csv(gaps, GAP_COLUMNS), "claims.csv": _csv(claims, CLAIM_COLUMNS),
                                "runs.csv": modern_runs_csv(records)}, notes=notes)
