"""The planner's best plans, drawn: each plan's timeline around one steady step, with its critical path outlined.

:func:`pipelab.planner.plan` ranks partition × schedule × micro-batch plans for a model given per block; the
figure shows, for the best few, which jobs and transfers bound the step (:func:`pipelab.planner.critical_path`) and
the stage or link to relieve. :func:`draw_critical_path` draws any plan the same way (notebook 06 uses it on a
profiled ``nn.Sequential``); :func:`plans_markdown` tabulates a ranking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from ...planner import Blocks, Plan, Plans, plan
from ..config import from_preset
from . import FigureOutput, register
from .schedules import _legend, draw_gantt

__all__ = ["PlannerConfig", "example_blocks", "draw_critical_path", "plans_markdown", "plans_csv"]


@dataclass(frozen=True)
class PlannerConfig:
    """An uneven model of ``blocks`` blocks (forward ~1 time unit each, backward 2, the ``heavy`` ones
    ``heavy_cost`` times more), planned on ``devices`` devices over ``schedules`` × ``micro_batches`` for a global
    batch of ``batch`` samples (costs given per sample, so M changes the job sizes, not the work), with a transfer of
    ``link`` time units per message between devices; ``top`` plans drawn."""

    blocks: int = 16
    devices: int = 4
    heavy: tuple[int, ...] = (1, 10)
    heavy_cost: float = 3.0
    batch: int = 32
    micro_batches: tuple[int, ...] = (4, 8, 16)
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved:2", "zb_h1", "zb_h2", "zb_v", "pipedream")
    link: float = 0.05
    top: int = 3
    seed: int = 0


_PLANNER = {
    "tiny": PlannerConfig(blocks=8, devices=2, heavy=(1,), batch=8, micro_batches=(2, 4),
                          schedules=("1f1b", "zb_h1", "zb_v"), top=2),
    "quick": PlannerConfig(),
    "paper": PlannerConfig(blocks=32, devices=8, heavy=(1, 20), batch=64, micro_batches=(8, 16, 32)),
}


def example_blocks(cfg: PlannerConfig) -> Blocks:
    """The config's model: per-sample forward costs 1 ± 20 % (seeded), backward twice, the heavy blocks scaled."""
    rng = np.random.default_rng(cfg.seed)
    f = rng.uniform(0.8, 1.2, cfg.blocks)
    f[list(cfg.heavy)] *= cfg.heavy_cost
    return Blocks(f.tolist(), (2 * f).tolist(), activation_bytes=(4096 * f).round().tolist(),
                  output_bytes=[1024] * cfg.blocks, weight_bytes=(65536 * f).round().tolist(), batch=1)


def draw_critical_path(ax: Axes, p: Plan, *, title: str | None = None, unit: str = "s") -> None:
    """Draw ``p``'s simulated timeline (:func:`~pipelab.studies.figures.schedules.draw_gantt`) from a step before
    its measured one, shade the measured step, outline its critical path's jobs in red and draw each transfer on the
    path (a gap before a job, its input crossing from another device) as a red arrow."""
    r, cp = p.sim, p.critical
    draw_gantt(ax, r, title=title or p.explain())
    for text in ax.texts:  # the labels of jobs outside the window stay inside the axes
        text.set_clip_on(True)
    ax.axvspan(cp.start, cp.end, color="0.85", zorder=0)
    prev = None
    for j in cp.jobs:
        w, t0, t1 = int(r.compiled.worker[j]), float(r.start[j]), float(r.end[j])
        ax.add_patch(Rectangle((max(t0, cp.start), w - 0.45), t1 - max(t0, cp.start), 0.9, fill=False,
                               edgecolor="crimson", lw=1.8, zorder=5))
        if prev is not None and t0 > float(r.end[prev]) + 1e-12:
            ax.annotate("", xy=(t0, w), xytext=(float(r.end[prev]), int(r.compiled.worker[prev])),
                        arrowprops={"arrowstyle": "->", "color": "crimson", "lw": 1.2}, zorder=6)
        prev = j
    span = cp.end - cp.start
    ax.set_xlim(cp.start - span, cp.end + 0.05 * span)
    ax.set_xlabel(f"time ({unit}); shaded: a steady step, outlined: its critical path", fontsize=8)


def plans_markdown(plans: Plans, unit: str = "s") -> str:
    """The ranking as a markdown table: schedule, M, policy, stages, step time, bubble, peak bytes, what to relieve."""
    rows = ["| # | schedule | M | policy | blocks per stage | step | bubble | peak memory | relieve |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, p in enumerate(plans):
        rows.append(f"| {i + 1} | {p.schedule} | {p.M} | {p.policy} | {list(p.sizes)} | {p.step_time:.4g} {unit} | "
                    f"{p.bubble:.0%} | {max(p.peak_memory):,} B | {p.critical.relieve()} |")
    return "\n".join(rows)


def plans_csv(plans: Plans) -> str:
    """The ranking as CSV (one row per plan)."""
    lines = ["rank,schedule,M,policy,recompute,sizes,step_time,bubble,objective,peak_bytes,relieve"]
    for i, p in enumerate(plans):
        lines.append(f"{i + 1},{p.schedule},{p.M},{p.policy},{p.recompute},\"{list(p.sizes)}\",{p.step_time:.6g},"
                     f"{p.bubble:.4f},{p.objective:.6g},{max(p.peak_memory)},\"{p.critical.relieve()}\"")
    return "\n".join(lines) + "\n"


@register("planner_critical_path", "The planner's best plans for an uneven model: each plan's timeline around one "
          "steady step with its critical path (jobs and transfers) outlined, and the stage or link to relieve",
          budget={"tiny": 5, "quick": 14})  # quick: 11.6 s measured
def planner_critical_path(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_PLANNER, preset)
    plans = plan(example_blocks(cfg), cfg.devices, math.inf, global_batch=cfg.batch, link=cfg.link,
                 schedules=cfg.schedules, micro_batches=cfg.micro_batches)
    best: dict[str, Plan] = {}
    for p in plans:  # the best plan of each schedule, best first
        best.setdefault(p.schedule, p)
    shown = list(best.values())[: cfg.top]
    heights = [p.sim.schedule.W + 1.6 for p in shown]
    fig, axes = plt.subplots(len(shown), 1, figsize=(12, 0.5 * sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for i, (ax, p) in enumerate(zip(axes[:, 0], shown)):
        draw_critical_path(ax, p, unit="time units", title=(
            f"#{plans.index(p) + 1}: {p.schedule}, M={p.M}, {p.policy}, blocks per stage {list(p.sizes)}: step "
            f"{p.step_time:.4g}, bubble {p.bubble:.0%}, peak {max(p.peak_memory) / 2**20:.2f} MiB; relieve "
            f"{p.critical.relieve()}"))
        if i < len(shown) - 1:
            ax.set_xlabel("")
    fig.suptitle(f"Best plans for a {cfg.blocks}-block model (heavy blocks {list(cfg.heavy)}) on {cfg.devices} "
                 f"devices, global batch {cfg.batch}, link {cfg.link:g} per message: the best plan of each schedule "
                 f"({preset} preset)", x=0.01,
                 ha="left", fontsize=11)
    _legend(fig, split=any(p.sim.schedule.split_backward for p in shown))
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    notes = {"exact": plans.exact, "simulations": plans.simulations,
             "plans": [{"explain": p.explain(), "step_time": p.step_time, "bubble": p.bubble,
                        "sizes": list(p.sizes), "relieve": p.critical.relieve()} for p in plans]}
    return FigureOutput(fig, cfg, cfg.seed, tables={"csv": plans_csv(plans)}, notes=notes, data=plans)
