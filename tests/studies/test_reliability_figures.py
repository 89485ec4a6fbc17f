"""Reliability probes for the committed figures: what a figure writes beside its images is a result of its runs,
so a fresh clone that recomputes them (an empty cache) rewrites no committed file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelab.studies import figures

#: the figures whose data files once carried each run's wall-clock seconds (the runs.csv and the notes)
RUN_FIGURES = ("learning_curves", "final_accuracy_table", "accuracy_gap_vs_depth", "modern_optimizers")


@pytest.mark.slow
def test_figures_drawn_from_recomputed_runs_write_the_same_data_files(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    written = {}
    for draw in ("first", "second"):
        monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path / draw / "cache"))  # an empty cache: every run recomputes
        figures.render(RUN_FIGURES, "tiny", tmp_path / draw / "figures")
        written[draw] = {p.name: p.read_bytes() for p in sorted((tmp_path / draw / "figures").iterdir())
                         if p.suffix in (".csv", ".json")}
    assert {f"{n}.json" for n in RUN_FIGURES} <= set(written["first"])
    assert any(n.endswith(".runs.csv") for n in written["first"])
    assert written["first"].keys() == written["second"].keys()
    differ = [n for n in written["first"] if written["first"][n] != written["second"][n]]
    assert not differ, f"the data files differ between two draws of the same runs: {differ}"
