"""The links_timeline figure: one schedule unmetered and metered on real processes, forecast against measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelab.studies import figures


@pytest.mark.slow
def test_links_timeline_renders_under_tiny(tmp_path: Path) -> None:
    written = figures.render(["links_timeline"], "tiny", tmp_path)
    assert sorted(p.name for p in written["links_timeline"])[:3] == ["links_timeline.csv", "links_timeline.json",
                                                                     "links_timeline.pdf"]
    notes = json.loads((tmp_path / "links_timeline.json").read_text())["notes"]
    assert set(notes["forecast_error"]) == {"unmetered", "metered"} and notes["late_messages"] >= 0
    assert 0.5 < notes["link_share"] <= 1.0  # 50 Mb/s, 5 ms against a width-64 MLP: the links bound the run
    csv = (tmp_path / "links_timeline.csv").read_text().splitlines()
    assert len(csv) == 3 and csv[1].startswith('"1F1B(D=2, M=4)"')


def test_links_timeline_is_registered_for_tiny_and_quick() -> None:
    spec = figures.get("links_timeline")
    assert spec.presets == ("tiny", "quick")
