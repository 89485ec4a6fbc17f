"""The modern-optimizer figure: its paired gaps and claim verdicts against scipy, and the tiny preset end to end."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from pipelab.studies.figures.modern_optimizers import (
    CLAIMS,
    LOSS_MARGIN,
    PRESETS,
    claim_rows,
    claim_verdicts,
    claims_markdown,
    gap_rows,
    gaps_markdown,
    modern_configs,
    modern_runs_csv,
    read_modern_runs,
)

SEEDS = (0, 1, 2, 3, 4)
BASE = np.array([1.00, 1.10, 0.90, 1.05, 0.95])  # sequential's final test loss per seed


def _rec(opt: str, pol: str, seed: int, loss: float, acc: float = 0.8) -> dict:
    diverged = not math.isfinite(loss)
    return {"task": "digits_mlp_nobias", "optimizer": opt, "D": 4, "policy": pol, "seed": seed, "lr": 0.01,
            "epochs": 1, "diverged": diverged, "test_loss": [2.3, loss], "test_acc": [0.1, math.nan if diverged
                                                                                      else acc],
            "train_loss": [2.3, loss], "seconds": 0.5}


def _records(offsets: dict[tuple[str, str], list[float]]) -> list[dict]:
    out = []
    for opt in ("sgdm", "adamw", "nadam", "muon"):
        out += [_rec(opt, "sequential", s, BASE[s]) for s in SEEDS]
    for (opt, pol), off in offsets.items():
        out += [_rec(opt, pol, s, BASE[s] + off[s], 0.8 - off[s] / 10) for s in SEEDS]
    return out


def _t(d: np.ndarray) -> tuple[float, float]:
    """Reference: mean and 95% t half-width of paired differences (scipy)."""
    return float(d.mean()), float(stats.t.ppf(0.975, d.size - 1) * stats.sem(d))


SMALL = [0.001, 0.003, -0.002, 0.002, 0.001]
LARGE = [0.30, 0.25, 0.35, 0.28, 0.32]


def _claims_case() -> list[dict]:
    return _records({
        ("muon", "2bw"): SMALL, ("muon", "error_feedback"): [0.003, 0.0, 0.0, 0.004, -0.002],
        ("adamw", "2bw"): LARGE, ("adamw", "error_feedback"): [0.05, 0.04, 0.06, 0.03, 0.05],
        ("nadam", "nesterov_async"): [-0.01, -0.02, 0.0, -0.015, -0.005],
        ("sgdm", "vanilla"): [0.5, 0.6, 0.4, 0.55, 0.45], ("sgdm", "dc_asgd"): [0.7, 0.8, 0.75, 0.72, 0.78],
        ("sgdm", "stashing"): [0.7, 0.8, 0.75, 0.72, 0.78],
    })


def test_gaps_are_paired_t_intervals() -> None:
    rows = {(r["optimizer"], r["policy"]): r for r in gap_rows(_claims_case())}
    m, h = _t(np.array(LARGE))
    r = rows[("adamw", "2bw")]
    assert r["loss_gap"] == pytest.approx(m, abs=1e-12) and r["loss_gap_ci95"] == pytest.approx(h, rel=1e-9)
    assert r["loss_gap_resolved"] and r["pairs"] == 5 and r["diverged"] == 0
    # accuracy: 0.8 − gap/10 against sequential's 0.8, in points
    assert r["acc_gap_pp"] == pytest.approx(-100 * m / 10, rel=1e-9)
    assert rows[("muon", "2bw")]["sequential_loss"] == pytest.approx(BASE.mean())
    assert "PipeDream-2BW" in gaps_markdown(list(rows.values()))


def test_claim_verdicts_on_a_constructed_case() -> None:
    rows = claim_rows(_claims_case())
    by = {(r["claim"], r["optimizer"]): r for r in rows}
    verdicts = {v["claim"]: v["verdict"] for v in claim_verdicts(rows)}
    # Muon's 2BW gap lies below the margin; AdamW's is larger than Muon's, paired by seed
    m, h = _t(np.array(SMALL))
    assert by[("muon_small_gap", "muon")]["quantity"] == pytest.approx(m) and m + h < LOSS_MARGIN
    assert verdicts["muon_small_gap"] == "reproduced"
    m, h = _t(np.array(LARGE) - np.array(SMALL))
    assert by[("adamw_gap_larger", "adamw vs muon")]["quantity"] == pytest.approx(m)
    assert by[("adamw_gap_larger", "adamw vs muon")]["ci95"] == pytest.approx(h, rel=1e-9)
    assert verdicts["adamw_gap_larger"] == "reproduced"
    # error feedback removes (2BW − EF) of AdamW's gap: most of it; Muon's gap is too small to resolve a removal
    ef = by[("ef_closes_most", "adamw")]
    assert ef["fraction"] == pytest.approx(1 - np.mean([0.05, 0.04, 0.06, 0.03, 0.05]) / np.mean(LARGE))
    assert ef["outcome"] == "good" and by[("ef_closes_most", "muon")]["outcome"] == "open"
    assert verdicts["ef_closes_most"] == "inconclusive"
    assert verdicts["nesterov_matches_sync"] == "reproduced"
    # DC-ASGD resolved worse than vanilla refutes; equal to stashing (its base) stays open
    assert by[("dc_beats_vanilla", "sgdm")]["outcome"] == "bad" and verdicts["dc_beats_vanilla"] == "refuted"
    assert by[("dc_beats_asgd", "sgdm")]["quantity"] == 0.0 and verdicts["dc_beats_asgd"] == "inconclusive"
    assert set(verdicts) == {c[0] for c in CLAIMS}
    assert "**refuted**" in claims_markdown(rows)


def test_a_diverging_arm_cannot_win_its_claim() -> None:
    off = [0.0, -0.5, -0.5, -0.5, -0.5]
    recs = _records({("sgdm", "vanilla"): [0.0] * 5, ("sgdm", "dc_asgd"): off})
    recs = [r if not (r["policy"] == "dc_asgd" and r["seed"] == 0) else _rec("sgdm", "dc_asgd", 0, math.nan)
            for r in recs]
    row = next(r for r in claim_rows(recs) if r["claim"] == "dc_beats_vanilla")
    assert row["pairs"] == 4 and row["outcome"] == "bad"  # resolved lower on the 4 pairs, but one run diverged
    assert next(g for g in gap_rows(recs) if g["policy"] == "dc_asgd")["diverged"] == 1


def test_the_grid_runs_only_served_pairs_and_muons_policies() -> None:
    cfg = PRESETS["quick"]
    configs = modern_configs(cfg)
    pairs = {(c.optimizer, c.policy) for c in configs}
    assert ("sgdm", "nesterov_async") not in pairs and ("nadam", "nesterov_async") in pairs
    assert {p for o, p in pairs if o == "muon"} == {"sequential", "2bw", "error_feedback"}
    assert {p for o, p in pairs if o == "nadam_async"} == {"sequential", "vanilla", "nesterov_async"}
    assert len(configs) == len(cfg.seeds) * (6 + 6 + 7 + 3 + 3)
    assert {c.lr for c in configs if c.optimizer == "muon"} == {0.02}
    assert all(c.task == "fashion_mnist_mlp_nobias" and c.D == 4 for c in configs)


def test_tiny_preset_end_to_end(tmp_path: Path) -> None:
    from pipelab.studies import figures

    out = figures.make("modern_optimizers", preset="tiny")
    records = out.data["records"]
    assert len(records) == 2 * (6 + 6 + 7 + 3 + 3)
    assert out.notes["rates"]["sgdm"]["how"] == "tuned" and out.notes["rates"]["muon"] == {"lr": 0.02,
                                                                                           "how": "common"}
    assert set(out.notes["verdicts"]) == {c[0] for c in CLAIMS}
    title = out.figure.get_suptitle()  # the verdicts in words, not the claims' keys
    assert all(f"{name}: {out.notes['verdicts'][key]}" in title and key not in title for key, name, *_ in CLAIMS)
    by = {(r["optimizer"], r["policy"], r["seed"]): r for r in records}
    # the Nesterov policy's default (stashed backward) runs NAdam exactly as weight stashing does
    for s in (0, 1):
        assert by[("nadam", "nesterov_async", s)]["test_loss"] == by[("nadam", "stashing", s)]["test_loss"]
    path = tmp_path / "runs.csv"
    path.write_text(out.tables["runs.csv"])
    again = read_modern_runs(path)
    assert modern_runs_csv(again) == out.tables["runs.csv"]
    assert [g["loss_gap"] for g in gap_rows(again)] == pytest.approx([g["loss_gap"] for g in out.data["gaps"]],
                                                                      abs=2e-5, nan_ok=True)
    assert out.tables["csv"].splitlines()[0].startswith("optimizer,D,policy,lr,pairs")
