"""The papers' claims and the resolved winners, decided from per-seed runs of every row by one stated rule.

A *row* is one task × optimizer × depth D; every row that holds both arms of a claim decides it, D = 4 and
D = 8 alike. Each run is read at the epoch its validation accuracy selects
(:func:`pipelab.studies.tuning.selected_test_acc`: the test set never picks an epoch), and two arms are compared
paired by seed (:func:`pipelab.statistics.paired_difference`).

Rule for one claim "a beats b" (``kind = "beats"``, null δ₀ = 0) or "a matches b" (``"matches"``: non-inferiority,
null δ₀ = −:data:`MATCH_MARGIN`), over its R rows:

1. per row, the two-sided paired t test of ``mean(a − b) = δ₀`` on the seeds where neither run diverged gives p_r;
2. the R p-values are Holm-adjusted together (:func:`pipelab.statistics.holm`), p̃_r: the family is the claim's
   rows, so a claim is not refuted by whichever of many rows happens to fall on the wrong side;
3. a row is *for* the claim when ``mean > δ₀`` and ``p̃_r < α``; *against* when ``mean < δ₀`` and ``p̃_r < α``,
   or when arm a diverged on any seed (a divergence at the arm's own tuned rate is a failure, not a missing value);
   seeds where only b diverged are left out of the test (they favour a: leaving them out can only make a row harder
   to resolve for a) and counted;
4. the claim is *refuted* when a row is against it, *reproduced* when every row is for it, else *inconclusive*;
   beside the verdict stands the adjusted p that decided it (reproduced: the largest p̃ of its rows; refuted: the
   smallest p̃ of the rows against it, or "divergence"; inconclusive: the largest p̃, the one that would have to
   fall below α).

"matches" claims also state the fixed target both arms are held to: the steps each seed needs until its
validation accuracy first reaches b's mean best validation accuracy minus the margin (:func:`steps_to_target`).

Winners: in every row the pipelined policy with the highest mean is the winner only when its paired difference to
every other pipelined policy is resolved (Holm over those comparisons) *and* the row's p-value survives a second
Holm correction over the rows searched (:func:`winners_across_rows`).

References: S. Holm (1979), Scand. J. Statist. 6:65-70; non-inferiority margins: S. Wellek, *Testing Statistical
Hypotheses of Equivalence and Noninferiority* (2010), ch. 2.

Example:
    >>> [c[2] for c in CLAIMS][:4]
    ['beats', 'beats', 'beats', 'matches']
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..optim import optimizer_label
from ..policies import make_policy
from ..statistics import PairedDifference, Values, as_values, check_confidence, holm, paired_difference
from .tuning import selected_test_acc

__all__ = ["CLAIMS", "MATCH_MARGIN", "RowEvidence", "ClaimVerdict", "merge_runs", "seed_scores", "steps_to_target",
           "decide", "decide_all", "claims_markdown", "CORRECTIONS", "WinnerTest", "winner_test", "winners_across_rows",
           "winners_markdown"]

#: multiple-comparison corrections :func:`winner_test` accepts
CORRECTIONS = ("holm", "none")

#: the papers' claims: (claim, source, kind, a, b); kind "beats": a − b > 0; "matches": a − b > −MATCH_MARGIN
CLAIMS: tuple[tuple[str, str, str, str, str], ...] = (
    ("Prediction beats weight stashing", "PipeOptim §V-B, Table IV", "beats", "pipeoptim", "stashing"),
    ("SpecTrain's prediction beats weight stashing", "SpecTrain §4.4, Table 1", "beats", "spectrain", "stashing"),
    ("PipeOptim beats PipeDream-2BW", "PipeOptim Tables IV and VI", "beats", "pipeoptim", "2bw"),
    ("PipeOptim matches (or beats) GPipe", "PipeOptim Table IV", "matches", "pipeoptim", "sequential"),
    ("SpecTrain reaches the staleness-free accuracy", "SpecTrain Table 1", "matches", "spectrain", "sequential"),
    ("PipeDream-2BW matches the accuracy of flushed training", "Narayanan et al., PipeDream-2BW (ICML 2021)",
     "matches", "2bw", "sequential"),
    ("Weight stashing is worse than vanilla", "SpecTrain Table 1", "beats", "vanilla", "stashing"),
    ("PipeMare's rescheduling and correction beat vanilla", "PipeMare (Yang et al., MLSys 2021)", "beats",
     "pipemare", "vanilla"),
)

#: "matches" claims: a − b must be resolved above −MATCH_MARGIN (1 percentage point of accuracy)
MATCH_MARGIN = 0.01

Row = tuple[str, str, int]
Arm = tuple[str, str, int, str]


def _label(policy: str) -> str:
    return make_policy(policy).title


def merge_runs(*runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of several figures' runs, each (task, optimizer, D, policy, seed) once (the first kept)."""
    seen: dict[tuple, dict[str, Any]] = {}
    for records in runs:
        for r in records:
            seen.setdefault((r["task"], r["optimizer"], r["D"], r["policy"], r["seed"]), r)
    return list(seen.values())


def seed_scores(records: Iterable[dict[str, Any]]) -> tuple[dict[Arm, dict[int, float]], dict[Arm, set[int]]]:
    """``(scores, diverged)``: per arm, seed -> test accuracy at the validation-selected epoch (NaN for a diverged
    run), and the seeds that diverged."""
    scores: dict[Arm, dict[int, float]] = defaultdict(dict)
    diverged: dict[Arm, set[int]] = defaultdict(set)
    for r in records:
        arm = (r["task"], r["optimizer"], int(r["D"]), r["policy"])
        bad = bool(r["diverged"])
        scores[arm][int(r["seed"])] = math.nan if bad else selected_test_acc(r)
        if bad:
            diverged[arm].add(int(r["seed"]))
    return dict(scores), dict(diverged)


def steps_to_target(records: Iterable[dict[str, Any]], row: Row, a: str, b: str,
                    margin: float = MATCH_MARGIN) -> dict[str, Any] | None:
    """The fixed target of a "matches" row and the steps each arm's seeds need to reach it on the validation split.

    Target: the mean over b's seeds of b's best validation accuracy (over epochs >= 1) minus ``margin``. A seed
    reaches it at the first epoch e >= 1 with ``val_acc[e] >= target``: ``e × steps_per_epoch`` steps; ``None`` when
    it never does (a diverged run included). Returns ``{"target", a: [steps or None per seed], b: [...]}`` (seeds
    in ascending order), or ``None`` without a validation curve.
    """
    arms: dict[str, list[dict[str, Any]]] = {a: [], b: []}
    for r in records:
        if (r["task"], r["optimizer"], int(r["D"])) == row and r["policy"] in arms:
            arms[r["policy"]].append(r)
    if not arms[a] or not arms[b] or not all(r.get("val_acc") for r in arms[a] + arms[b]):
        return None
    best = [np.asarray(r["val_acc"], dtype=float)[1:] for r in arms[b]]
    if not all(np.isfinite(v).any() for v in best):
        return None
    target = float(np.mean([np.nanmax(v) for v in best])) - margin

    def steps(r: dict[str, Any]) -> int | None:
        hit = np.flatnonzero(np.asarray(r["val_acc"], dtype=float)[1:] >= target)
        return None if not hit.size else int(hit[0] + 1) * int(r["steps_per_epoch"])

    return {"target": target, **{p: [steps(r) for r in sorted(rs, key=lambda r: r["seed"])] for p, rs in arms.items()}}


@dataclass(frozen=True)
class RowEvidence:
    """One row of a claim: ``diff`` (a − b paired by seed, p against the claim's null), ``p_adjusted`` (Holm over
    the claim's rows), the seeds each arm diverged on, and ``outcome``: ``"for"``, ``"against"`` or ``"open"``."""

    row: Row
    diff: PairedDifference
    p_adjusted: float
    diverged_a: int
    diverged_b: int
    outcome: str


@dataclass(frozen=True)
class ClaimVerdict:
    """A claim's verdict (``"reproduced"``, ``"refuted"``, ``"inconclusive"``, ``"not run"``), the adjusted p
    that decided it (NaN: decided by a divergence, or not run) and its rows."""

    claim: str
    source: str
    kind: str
    a: str
    b: str
    verdict: str
    p: float
    rows: tuple[RowEvidence, ...]
    alpha: float


def decide(claim: tuple[str, str, str, str, str], scores: dict[Arm, dict[int, float]],
           diverged: dict[Arm, set[int]], confidence: float = 0.95) -> ClaimVerdict:
    """One claim over every row holding both of its arms, by the module's rule.

    Raises:
        ValueError: a claim kind other than ``"beats"``/``"matches"``.
    """
    name, source, kind, a, b = claim
    if kind not in ("beats", "matches"):
        raise ValueError(f"claim kind={kind!r}; choose 'beats' or 'matches'")
    null = 0.0 if kind == "beats" else -MATCH_MARGIN
    alpha = 1 - confidence
    rows: list[Row] = sorted({(t, o, D) for t, o, D, p in scores if p == a and (t, o, D, b) in scores})
    diffs = []
    for row in rows:
        sa, sb = scores[row + (a,)], scores[row + (b,)]
        shared = sorted(set(sa) & set(sb))
        diffs.append(paired_difference({s: sa[s] for s in shared}, {s: sb[s] for s in shared}, confidence,
                                       null=null))
    adj = holm([d.p_value for d in diffs]) if diffs else np.array([])
    evidence = []
    for row, d, p in zip(rows, diffs, map(float, adj)):
        div_a, div_b = len(diverged.get(row + (a,), ())), len(diverged.get(row + (b,), ()))
        if div_a or (p < alpha and d.mean < null):
            outcome = "against"
        elif p < alpha and d.mean > null:
            outcome = "for"
        else:
            outcome = "open"
        evidence.append(RowEvidence(row, d, p, div_a, div_b, outcome))
    if not evidence:
        return ClaimVerdict(name, source, kind, a, b, "not run", math.nan, (), alpha)
    against = [e for e in evidence if e.outcome == "against"]
    if against:
        tested = [e.p_adjusted for e in against if not e.diverged_a]
        verdict, p = "refuted", min(tested) if tested else math.nan
    else:
        verdict = "reproduced" if all(e.outcome == "for" for e in evidence) else "inconclusive"
        p = max(e.p_adjusted for e in evidence)
    return ClaimVerdict(name, source, kind, a, b, verdict, p, tuple(evidence), alpha)


def decide_all(records: Iterable[dict[str, Any]], claims: Sequence[tuple[str, str, str, str, str]] = CLAIMS,
               confidence: float = 0.95) -> list[ClaimVerdict]:
    """Every claim of ``claims`` decided from ``records`` (runs of any rows and depths)."""
    scores, diverged = seed_scores(records)
    return [decide(c, scores, diverged, confidence) for c in claims]


def _row_text(row: Row) -> str:
    return f"{row[0]} · {optimizer_label(row[1])} · D={row[2]}"


def _p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _steps_text(st: dict[str, Any] | None, a: str, b: str) -> str:
    if st is None:
        return ""

    def one(vals: list[int | None]) -> str:
        hit = [v for v in vals if v is not None]
        return (f"{np.mean(hit):.0f}" if hit else "–") + (f" ({len(vals) - len(hit)} never)" if len(hit) < len(vals)
                                                          else "")

    return (f"; steps to {100 * st['target']:.1f}% val.: {_label(a)} {one(st[a])}, {_label(b)} {one(st[b])}")


def claims_markdown(records: Sequence[dict[str, Any]], confidence: float = 0.95) -> str:
    """The claims (:data:`CLAIMS`) as a Markdown table: the rule, then per claim its verdict with the adjusted p and
    per row a − b (pp, 95% t, paired by seed), its Holm-adjusted p, the divergences and, for "matches", the steps to
    the fixed target."""
    m, a_ = f"{100 * MATCH_MARGIN:g}", f"{1 - confidence:.2g}"
    rule = (f"Rule: each run is read at the epoch its validation accuracy selects; per row (task · optimizer · D), "
            f"a − b is tested paired by seed (two-sided t, against 0 for *beats*, against −{m} pp for *matches*) "
            f"and the p-values of a claim's rows are Holm-adjusted together (p̃). A row is for the claim when its "
            f"mean is on the claim's side with p̃ < {a_}, against it when on the other side with p̃ < {a_} or when "
            f"a diverged on any seed (counted as a failure; seeds where only b diverged are left out and counted). "
            f"Reproduced: every row for; refuted: one row against; otherwise inconclusive. *matches* rows also give "
            f"the steps to a fixed target: b's mean best validation accuracy − {m} pp.")
    out = [rule, "",
           "| claim | source | verdict (p̃) | per row: a − b in pp (95% t), p̃; ✗ diverged seeds |", "|---|---|---|---|"]
    verdicts = decide_all(records, confidence=confidence)
    for v in verdicts:
        cells = []
        for e in v.rows:
            d = e.diff
            num = f"{100 * d.mean:+.1f}" + (f" ± {100 * d.half_width:.1f}" if math.isfinite(d.half_width) else "")
            div = "".join(f", {k} ✗ {_label(p)}" for k, p in ((e.diverged_a, v.a), (e.diverged_b, v.b)) if k)
            st = _steps_text(steps_to_target(records, e.row, v.a, v.b), v.a, v.b) if v.kind == "matches" else ""
            cells.append(f"{_row_text(e.row)}: {num}, p̃ {_p(e.p_adjusted)} ({e.outcome}{div}){st}")
        p = "divergence" if v.verdict == "refuted" and not math.isfinite(v.p) else f"p̃ = {_p(v.p)}"
        out.append(f"| {v.claim} ({_label(v.a)} vs {_label(v.b)}) | {v.source} | **{v.verdict}** "
                   f"({p if v.rows else 'no row holds both'}) | {'; '.join(cells) or '–'} |")
    return "\n".join(out)


@dataclass(frozen=True)
class WinnerTest:
    """The outcome of :func:`winner_test`: ``winner`` is ``candidate`` when every difference to it is resolved.

    ``candidate``: the highest mean among arms without a diverged value; ``differences``/``adjusted_p``: per other
    arm, :func:`paired_difference` (candidate − arm) and its corrected p-value; ``diverged``: arms diverged on every
    seed (they lose untested); ``family_p``: :attr:`p_value` Holm-adjusted over the rows searched, else NaN.
    """

    candidate: str | None
    winner: str | None
    differences: dict[str, PairedDifference] = field(default_factory=dict)
    adjusted_p: dict[str, float] = field(default_factory=dict)
    alpha: float = 0.05
    correction: str = "holm"
    diverged: tuple[str, ...] = ()
    family_p: float = math.nan

    @property
    def p_value(self) -> float:
        """The smallest α at which ``candidate`` wins (1: a difference <= 0 or no candidate; 0: nothing to compare)."""
        if self.candidate is None or any(d.mean <= 0 or not math.isfinite(d.mean) for d in self.differences.values()):
            return 1.0
        return max(self.adjusted_p.values(), default=0.0)


def winner_test(arms: Mapping[str, Values], confidence: float = 0.95, correction: str = "holm") -> WinnerTest:
    """Test whether the arm with the highest mean beats every other arm, paired by seed.

    The candidate (highest mean among arms with all values finite) wins when every paired difference to another
    arm with a finite value has a positive mean and a p-value below α = 1 − confidence after the correction
    (``"holm"``; ``"none"``: raw p-values). A diverged seed is a loss: such an arm never wins, and one diverged on
    every seed loses untested. "A is best" needs all k − 1 differences resolved (an intersection–union test: R. L.
    Berger 1982, Technometrics 24:295-300), and A is chosen after seeing the data, hence Holm over the k − 1.
    """
    c = check_confidence(confidence)
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r}; choose one of {', '.join(CORRECTIONS)}")
    if not isinstance(arms, Mapping) or len(arms) < 2:
        raise ValueError(f"arms must map at least two arm names to per-seed values, got {arms!r}")
    means: dict[str, float] = {}
    diverged: list[str] = []
    for name, vals in arms.items():
        arr = as_values(list(vals.values()) if isinstance(vals, Mapping) else vals, f"arms[{name!r}]")
        if np.isfinite(arr).all() and arr.size:
            means[name] = float(arr.mean())
        elif arr.size and not np.isfinite(arr).any():
            diverged.append(name)
    alpha = 1 - c
    if not means:
        return WinnerTest(None, None, alpha=alpha, correction=correction, diverged=tuple(diverged))
    cand = max(means, key=lambda k: means[k])
    diffs = {name: paired_difference(arms[cand], vals, c) for name, vals in arms.items()
             if name != cand and name not in diverged}
    raw = np.array([d.p_value for d in diffs.values()])
    adj = holm(raw) if correction == "holm" else np.where(np.isnan(raw), 1.0, raw)
    adjusted = dict(zip(diffs, map(float, adj)))
    ok = all(d.mean > 0 and adjusted[k] < alpha for k, d in diffs.items())
    return WinnerTest(cand, cand if ok else None, diffs, adjusted, alpha, correction, tuple(diverged))


def winners_across_rows(rows: Mapping[Any, Mapping[str, Values]], confidence: float = 0.95,
                        correction: str = "holm") -> dict[Any, WinnerTest]:
    """:func:`winner_test` in every row, a winner kept only where it survives the search over the
    rows.

    The rows' :attr:`WinnerTest.p_value` are Holm-adjusted (``"none"``: left) into ``family_p``; a
    row keeps its winner only when ``family_p < α`` (p = 0.040 among 4 rows: ``family_p`` >= 0.16, no winner at
    α = 0.05).
    """
    tests = {key: winner_test(arms, confidence, correction) for key, arms in rows.items()}
    if not tests:
        return {}
    raw = np.array([t.p_value for t in tests.values()])
    adj = holm(raw) if correction == "holm" else raw
    out = {}
    for (key, t), p in zip(tests.items(), map(float, adj)):
        out[key] = replace(t, winner=t.winner if p < t.alpha else None, family_p=p)
    return out


def winners_markdown(records: Iterable[dict[str, Any]], confidence: float = 0.95) -> str:
    """Per row, the pipelined policy with the highest mean and whether it is the resolved winner: Holm over its
    comparisons within the row (p), then over the rows searched (p̃, :func:`winners_across_rows`).
    """
    scores, _ = seed_scores(records)
    rows: dict[Row, dict[str, dict[int, float]]] = defaultdict(dict)
    for (task, opt, D, pol), by_seed in scores.items():
        if pol != "sequential":
            rows[(task, opt, D)][pol] = by_seed
    tests = winners_across_rows({k: v for k, v in sorted(rows.items()) if len(v) >= 2}, confidence)
    n_win = sum(t.winner is not None for t in tests.values())
    lines = [f"A pipelined policy is the resolved winner of its row when its paired difference to every other "
             f"pipelined policy is resolved after Holm within the row (p) and again after Holm over the {len(tests)} "
             f"rows searched (p̃ < {1 - confidence:.2g}): {n_win} of {len(tests)} rows.", ""]
    for row, t in tests.items():
        cand = _label(t.candidate) if t.candidate else "none (every arm diverged on some seed)"
        verdict = "**resolved winner**" if t.winner else "not resolved"
        lines.append(f"- {_row_text(row)}: highest mean {cand}, p = {_p(t.p_value)}, p̃ = {_p(t.family_p)}: {verdict}.")
    return "\n".join(lines)
