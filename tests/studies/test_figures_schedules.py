"""The schedule figures draw what their titles say: version labels follow the weight rule a panel names
(PipeDream = weight stashing), LPP's bubble follows Rahimi's latency under the priority he assumes, and the
Table 1 and throughput-bound figures build LPP under both priority rules, name them, and pin the LPP rows
to the note's values (or to the closed form where the note's latency is below a worker's own work)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import csv as csv_module  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402

import matplotlib.figure  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from pipelab.papers import rahimi_row  # noqa: E402
from pipelab.schedules import Schedule, fslpp, gpipe, lpp, pipedream  # noqa: E402
from pipelab.simulator import simulate  # noqa: E402
from pipelab.studies import figures  # noqa: E402
from pipelab.studies.figures.schedules import (  # noqa: E402
    _RAHIMI,
    LPP_PRIORITIES,
    RAHIMI_PRIORITIES,
    RahimiConfig,
    draw_gantt,
    lpp_bubble,
    lpp_latency,
    rahimi_rows,
    rahimi_table_markdown,
    throughput_bound_markdown,
)

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


def test_lpp_backward_first_plateau_was_the_ordering_costs() -> None:
    # The quick preset's LPP (S = W = 8, G = 2, R = 4) at B = 2F: backward-first ordered at unit costs stays far
    # above the closed form at large M (the plateau the figure used to show); ordered at B = 2F, as the figure
    # now builds it, it falls with M and ends near it; forward-first is on it.
    Ms = (16, 32, 64)
    unit = [simulate(lpp(8, M, 2, 4), 1.0, 2.0).bubble for M in Ms]
    back = [simulate(lpp(8, M, 2, 4, b_cost=2.0), 1.0, 2.0).bubble for M in Ms]
    fwd = [simulate(lpp(8, M, 2, 4, priority="forward_first", b_cost=2.0), 1.0, 2.0).bubble for M in Ms]
    closed = [lpp_bubble(8, M, 2, 4) for M in Ms]
    assert fwd == pytest.approx(closed, abs=1e-9)
    assert min(u - c for u, c in zip(unit[1:], closed[1:])) > 0.1
    assert back == sorted(back, reverse=True) and back[-1] - closed[-1] < 0.03
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
    back = lpp_rows[f"LPP G=2, R=W/2, {LPP_PRIORITIES['backward_first']}"]  # ordered at the simulated costs
    assert back == {M: simulate(lpp(cfg.D, M, 2, cfg.D // 2, b_cost=cfg.b_over_f), 1.0, cfg.b_over_f).bubble
                    for M in back}
    legend = [t.get_text() for ax in out.figure.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert any("forward-first" in t for t in legend) and any("backward-first" in t for t in legend)
    assert "(tiny preset)" in out.figure.texts[0].get_text()
    assert "forward-first (GPipe order)" in out.tables["csv"]


# ----------------------------------------------------------------------------- Rahimi's Table 1, LPP rows
def _peak_from_programs(s: Schedule) -> int:
    """Brute force: walk each worker's program; an F makes an activation resident, its B frees it."""
    peak = 0
    for prog in s.programs:
        held = 0
        for a in prog:
            held += {"F": 1, "B": -1}.get(a.op, 0)
            peak = max(peak, held)
    return peak


def _weight_fetches_from_programs(s: Schedule) -> int:
    """Brute force: the most forwards a worker runs on a stage whose weights it does not hold."""
    return max(sum(a.op == "F" and w not in s.weight_holders[a.stage] for a in prog)
               for w, prog in enumerate(s.programs))


@pytest.mark.parametrize("preset", ["tiny", "quick", "paper"])
def test_rahimi_lpp_rows_pinned_to_the_note(preset: str) -> None:
    cfg = _RAHIMI[preset]
    rows = {r["case"]: r for r in rahimi_rows(cfg)}
    S, B, G = cfg.S, cfg.B, cfg.G
    looped = [r for r in rows.values() if r["priority"] is not None]
    assert len(looped) == 6 and {r["priority"] for r in looped} == set(RAHIMI_PRIORITIES)
    for r in looped:
        R = r["params"]["R"]
        note, sim = rahimi_row("LPP", S, B, G, R), r["simulated"]
        build = lpp if r["scheme"] == "LPP" else fslpp
        s = build(S, B, G, R, priority=r["priority"])
        assert sim["activation_storage"] == _peak_from_programs(s), r["case"]
        assert sim["weight_xmit"] == _weight_fetches_from_programs(s), r["case"]
        if r["scheme"] == "LPP":
            assert sim["weight_xmit"] == note["weight_xmit"] == r["note"]["weight_xmit"]
        if r["priority"] == "forward_first":
            # the note's rule: latency S + B/G − 1 whenever a worker's own work fits in it, else the closed form
            fits = (S // R) * (B // G) + R - 1 <= note["latency"]
            assert sim["latency"] == pytest.approx(note["latency"] if fits else lpp_latency(S, B, G, R)), r["case"]
            assert (R == S) <= fits
            # forward-first holds all of a worker's (S/R)(B/G) micro-batch stages: the note's (S/R)·min(S, B/G)
            # while B/G ≤ S (every preset)
            assert B // G <= S
            assert sim["activation_storage"] == note["activation_storage"] == (S // R) * (B // G), r["case"]
        else:
            # backward-first: never faster, never more activations than forward-first
            fwd = rows[r["case"].replace("backward-first", "forward-first")]["simulated"]
            assert sim["latency"] >= fwd["latency"] and sim["activation_storage"] <= fwd["activation_storage"]
    # the quick preset's numbers, as the notebook states them: S = 4, B = 8, G = 2
    if preset == "quick":
        got = {c: (r["simulated"]["latency"], r["simulated"]["activation_storage"]) for c, r in rows.items()
               if r["priority"]}
        assert got == {"LPP G=2, R=S, forward-first": (7, 4), "LPP G=2, R=S, backward-first": (7, 4),
                       "LPP G=2, R=S/2, forward-first": (9, 8), "LPP G=2, R=S/2, backward-first": (9.5, 5),
                       "FSLPP G=2, R=S/2, forward-first": (9, 8), "FSLPP G=2, R=S/2, backward-first": (9.5, 5)}


def test_lpp_latency_closed_form_and_errors() -> None:
    for S, B, G, R in [(4, 8, 2, 4), (4, 8, 2, 2), (8, 16, 4, 4), (8, 16, 4, 8), (8, 8, 1, 2), (6, 12, 2, 3)]:
        r = simulate(lpp(S, B, G, R, priority="forward_first"))
        assert r.latency_units == pytest.approx(lpp_latency(S, B, G, R)), (S, B, G, R)
    assert lpp_latency(4, 8, 2, 2) == 9.0 > rahimi_row("LPP", 4, 8, 2, 2)["latency"]
    with pytest.raises(ValueError, match="R | S"):
        lpp_latency(8, 4, 2, 3)
    with pytest.raises(ValueError, match="priority must be"):
        fslpp(4, 4, 2, 2, priority="fifo")


def test_fslpp_priority_gives_lpp_timeline() -> None:
    for prio in RAHIMI_PRIORITIES:
        a, b = lpp(4, 8, 2, 2, priority=prio), fslpp(4, 8, 2, 2, priority=prio)
        compute = [[x for x in prog if x.op != "U"] for prog in a.programs]
        assert compute == [[x for x in prog if x.op != "U"] for prog in b.programs], prio  # same compute order
        assert simulate(a).latency_units == simulate(b).latency_units, prio
    assert fslpp(4, 8, 2, 2).programs == fslpp(4, 8, 2, 2, priority="backward_first").programs  # default unchanged


def test_rahimi_table_figure_names_the_priority() -> None:
    out = figures.make("schedules_rahimi_table", "tiny")
    ax = out.figure.axes[0]
    title = ax.get_title()
    assert "(tiny preset)" in title and all(name in title for name in LPP_PRIORITIES.values())
    labels = [c.get_text().get_text() for (i, j), c in ax.tables[0].get_celld().items() if j == -1]
    lpp_labels = [t for t in labels if "LPP" in t]
    assert len(lpp_labels) == 6
    assert all(t.endswith(("forward-first", "backward-first")) for t in lpp_labels)
    csv = list(csv_module.reader(io.StringIO(out.tables["csv"])))
    assert csv[0] == ["case", "priority", "column", "note", "simulated"]
    assert all(len(line) == 5 for line in csv)  # labels with commas are quoted
    by_prio = {line[1] for line in csv[1:] if "LPP" in line[0]}
    assert by_prio == set(RAHIMI_PRIORITIES)
    assert out.notes["note_priority"] == "forward_first"
    # the notebook's generated Markdown states the CSV's numbers
    md = rahimi_table_markdown(out.data, "tiny")
    cells = {(line[0], line[2]): (line[3], line[4]) for line in csv[1:]}
    for case in {c for c, _ in cells if "LPP" in c}:
        head, rule = case.rsplit(", ", 1)
        bullet = next(b for b in md.splitlines() if b.startswith(f"- **{head}**, {rule}"))
        for col, short in [("latency", "latency"), ("activation_storage", "act. storage")]:
            note, sim = cells[(case, col)]
            if note != sim:
                assert f"{short} {note} vs {sim}" in bullet, (case, col)
            else:
                assert short in bullet.split("differs")[0], (case, col)


@pytest.mark.parametrize("preset", ["tiny", "quick"])
def test_throughput_bound_draws_lpp_under_both_rules(preset: str) -> None:
    out = figures.make("schedules_throughput_bound", preset)
    ax = out.figure.axes[0]
    assert f"({preset} preset)" in ax.get_title() and "both priority rules" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    names = [f"LPP, {LPP_PRIORITIES[p]}" for p in RAHIMI_PRIORITIES]
    assert all(n in legend for n in names)
    fwd, bwd = (np.array(out.data[n]) for n in names)
    assert len(fwd) == len(bwd) > 0 and not np.allclose(fwd, bwd)  # the rules give different points
    assert np.all(fwd[:, 1] <= fwd[:, 0] + 1e-12) and np.all(bwd[:, 1] <= bwd[:, 0] + 1e-12)  # ρ ≤ M/S
    # the notes (and the notebook's generated sentence) count what the data holds
    assert out.notes["n"] == sum(len(p) for p in out.data.values())
    for n in names:
        pts = np.array(out.data[n])
        assert out.notes["series"][n]["attained"] == int(np.sum(np.abs(pts[:, 1] - pts[:, 0]) <= 1e-12))
    # notebook 01: "backward-first ... sits on the bound more often"
    assert out.notes["series"][names[1]]["attained"] > out.notes["series"][names[0]]["attained"]
    md = throughput_bound_markdown(out.notes, preset)
    assert f"({out.notes['n']} configurations under `{preset}`)" in md
    for n in names:
        v = out.notes["series"][n]
        assert f"{n.removeprefix('LPP, ')}, {v['attained']} of {v['n']} configurations" in md
    assert isinstance(_RAHIMI["tiny"], RahimiConfig)
