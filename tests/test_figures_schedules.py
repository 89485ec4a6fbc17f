"""The schedule figures draw what their titles say: version labels follow the weight rule a panel names
(PipeDream = weight stashing), and LPP's bubble follows Rahimi's latency under the priority he assumes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import re  # noqa: E402

import matplotlib.figure  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from pipelab import figures  # noqa: E402
from pipelab.figures.schedules import LPP_PRIORITIES, draw_gantt, lpp_bubble  # noqa: E402
from pipelab.schedules import gpipe, lpp, pipedream  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402

_CELL = re.compile(r"^([FBIW])(\d+)\n(?:s\d+\n)?v(\d+)$")


def _cell_versions(ax: Axes) -> dict[tuple[str, int, int], int]:
    """(op, worker, micro-batch g) -> the version written in the cell, read back from the drawn texts."""
    out = {}
    for t in ax.texts:
        m = _CELL.match(t.get_text())
        if m:
            out[(m[1], int(round(t.get_position()[1])), int(m[2]))] = int(m[3])
    return out


@pytest.mark.parametrize("preset", ["tiny", "quick"])
def test_async_panels_label_versions_by_the_rule_in_their_title(preset: str) -> None:
    out = figures.make("schedules_async", preset)
    assert f"({preset} preset)" in out.figure.texts[0].get_text()  # the suptitle names the preset
    panels = {ax.get_title(loc="left"): _cell_versions(ax) for ax in out.figure.axes if ax.get_title(loc="left")}
    assert len(panels) == 3
    checked = set()
    for title, cells in panels.items():
        assert cells, title
        pairs = [(v, cells[("F", w, g)]) for (op, w, g), v in cells.items() if op == "B"]
        assert len(pairs) == sum(op == "F" for op, _, _ in cells)  # every F has its B drawn
        if "PipeDream" in title and "2BW" not in title:
            # PipeDream stashes weights: the drawn version of every B equals its F's
            assert "stash" in title
            assert all(b == f for b, f in pairs), title
            checked.add("stash")
        elif "vanilla" in title:
            # vanilla: the backward uses the version current when it runs, newer than its forward's once
            # the pipeline is full (so this panel and the stashing one really differ)
            assert all(b >= f for b, f in pairs) and any(b > f for b, f in pairs), title
            checked.add("vanilla")
    assert checked == {"stash", "vanilla"}


def test_stash_labels_match_the_version_table() -> None:
    r = simulate(pipedream(4, 1, 10))
    vt = r.version_table
    fig = matplotlib.figure.Figure()
    ax = fig.add_subplot()
    draw_gantt(ax, r, versions=True, rule="stash")
    cells = _cell_versions(ax)
    for (op, w, g), v in cells.items():  # one stage per worker (k = w), M = 1 (t = g)
        assert v == vt.forward[w, g, 0], (op, w, g)
    vanilla = fig.add_subplot()
    draw_gantt(vanilla, r, versions=True)
    cur = _cell_versions(vanilla)
    assert all(v == vt.backward[w, g, 0] for (op, w, g), v in cur.items() if op == "B")
    with pytest.raises(ValueError, match="rule must be one of"):
        draw_gantt(fig.add_subplot(), r, versions=True, rule="newest")


def _closed_form(S: int, B: int, G: int, R: int) -> float:
    """Rahimi's latency S + B/G − 1 (Table 1), or a looped worker's own (S/R)(B/G) jobs + fill R − 1."""
    work = (S // R) * (B // G)
    return 1 - work / max(S + B // G - 1, work + R - 1)


@pytest.mark.parametrize("b_over_f", [1.0, 2.0])
def test_lpp_forward_first_follows_the_closed_form_across_M(b_over_f: float) -> None:
    for S, G, R in [(4, 2, 2), (8, 2, 4), (8, 1, 8), (8, 4, 2), (6, 2, 3), (16, 2, 8)]:
        Ms = [M for M in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64) if M % G == 0 and (M // G <= R or M // G % R == 0)]
        bubbles = [simulate(lpp(S, M, G, R, priority="forward_first"), 1.0, b_over_f).bubble for M in Ms]
        assert bubbles == pytest.approx([_closed_form(S, M, G, R) for M in Ms], abs=1e-9), (S, G, R)
        assert bubbles == pytest.approx([lpp_bubble(S, M, G, R) for M in Ms], abs=1e-12)
        assert np.all(np.diff(bubbles) <= 1e-12), (S, G, R)  # never rises with M
        assert bubbles[-1] < 0.5 * bubbles[0]
    # G = 1, R = S is GPipe: (S−1)/(M+S−1), the same schedule
    assert lpp(4, 6, 1, 4, priority="forward_first").programs == gpipe(4, 6).programs


def test_lpp_backward_first_plateau_is_the_priority() -> None:
    # The quick preset's LPP (S = W = 8, G = 2, R = 4): backward-first stays far above the closed form at
    # large M (the plateau the figure used to show as LPP's), forward-first is on it.
    back = [simulate(lpp(8, M, 2, 4), 1.0, 2.0).bubble for M in (32, 64)]
    fwd = [simulate(lpp(8, M, 2, 4, priority="forward_first"), 1.0, 2.0).bubble for M in (32, 64)]
    closed = [lpp_bubble(8, M, 2, 4) for M in (32, 64)]
    assert fwd == pytest.approx(closed, abs=1e-9)
    assert min(b - c for b, c in zip(back, closed)) > 0.1
    with pytest.raises(ValueError, match="priority must be"):
        lpp(8, 4, 2, 4, priority="fifo")
    with pytest.raises(ValueError, match="R | S"):
        lpp_bubble(8, 4, 2, 3)


def test_bubble_figure_draws_lpp_under_both_rules() -> None:
    out = figures.make("schedules_bubble", "tiny")
    cfg = out.config
    lpp_rows = {n: dict(p) for n, p in out.data.items() if n.startswith("LPP")}
    assert {n.rsplit(", ", 1)[1] for n in lpp_rows} == set(LPP_PRIORITIES.values())
    fwd = lpp_rows[f"LPP G=2, R=W/2, {LPP_PRIORITIES['forward_first']}"]
    assert list(fwd.values()) == pytest.approx([_closed_form(cfg.D, M, 2, cfg.D // 2) for M in fwd], abs=1e-9)
    legend = [t.get_text() for ax in out.figure.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert any("forward-first" in t for t in legend) and any("backward-first" in t for t in legend)
    assert "(tiny preset)" in out.figure.texts[0].get_text()
    assert "forward-first (GPipe order)" in out.tables["csv"]
