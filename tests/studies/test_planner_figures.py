"""The planner figure renders under `tiny`, draws the best plan of each schedule with its critical path, and its
table is the planner's ranking."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from matplotlib.patches import Rectangle  # noqa: E402

from pipelab.planner import plan  # noqa: E402
from pipelab.studies import figures  # noqa: E402
from pipelab.studies.figures.planner import _PLANNER, example_blocks, plans_markdown  # noqa: E402


def test_renders_under_tiny_with_the_critical_path_outlined() -> None:
    out = figures.make("planner_critical_path", "tiny")
    plans = out.data
    shown = {p.schedule for p in plans}
    assert len(out.figure.axes) == min(_PLANNER["tiny"].top, len(shown))
    for ax in out.figure.axes:  # one red outline per job of the critical path in the window
        outlined = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
        assert outlined
    rows = out.tables["csv"].strip().splitlines()
    assert len(rows) == len(plans) + 1 and rows[1].startswith(f"1,{plans[0].schedule},{plans[0].M},")
    assert out.notes["plans"][0]["step_time"] == plans[0].step_time


def test_the_figure_ranks_what_the_planner_ranks() -> None:
    cfg = _PLANNER["tiny"]
    plans = plan(example_blocks(cfg), cfg.devices, global_batch=cfg.batch, link=cfg.link, schedules=cfg.schedules,
                 micro_batches=cfg.micro_batches)
    table = plans_markdown(plans)
    assert table.count("\n") == len(plans) + 1 and f"| 1 | {plans[0].schedule} | {plans[0].M} |" in table
    out = figures.make("planner_critical_path", "tiny")
    assert [p.explain() for p in out.data] == [p.explain() for p in plans]
