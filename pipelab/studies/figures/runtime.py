"""Measured vs simulated runs of the multi-process runtime: per-rank timelines and the makespan forecast error,
and Rahimi's Table 1 read off real processes.

Figure ``runtime_timeline``: :func:`pipelab.studies.calibration.calibrate` profiles each stage (F, B, I/W, U)
and the transfer between ranks on the machine at hand, forecasts every schedule's makespan with
:func:`pipelab.simulator.simulate`, and runs it for real (gloo, one process per rank, 1 thread each) with
the runtime's trace (:mod:`pipelab.runtime.trace`). Top row: for one schedule per rank count, the measured
timeline of every rank (solid bars, the median of the repeats) over the simulated one (outlined bars,
above); bottom row: forecast error per schedule (forecast / measured − 1; the ±10% target shaded), with
the *replay* error beside it — the simulation re-run with each stage's mean measured job durations, which
isolates the simulator's dependency and transfer model from the profile's error. The placements (DDP, FSDP,
LPP, FSLPP, hybrid) run with their collectives, profiled for the forecast and measured for the replay, both
charged to the updates. The CSV has every row (a schedule the runtime refuses would be marked not runnable).

Figure ``schedules_rahimi_measured``: Rahimi's Table 1 three ways — the note's formulas, the simulator, and
real processes (:func:`pipelab.studies.calibration.rahimi_measured`: DDP, FSDP, PP, LPP and FSLPP run one step each
through the traced runtime on gloo ranks; latency from the timeline in units of one stage's measured F+B,
transfers from the byte counters, storage from the memory report). Weight transfers are shown by both
counts: Rahimi's (one per F job) and the runtime's (one per fetched stage version), which differ by the
micro-batches a worker runs per step. The CSV has every cell.

Measurements are wall-clock times on whatever machine draws the figure; on a small shared CPU box (several
ranks per core, other processes running) the errors are dominated by the operating system's scheduling,
which the simulator does not model: the sidecar records the machine's core count and load.

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025); PipeDream (Narayanan
et al., SOSP 2019, §3.1: profile, then forecast).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ...papers import RAHIMI_COLUMNS
from ..calibration import (
    CalibrationCase,
    CalibrationConfig,
    CalibrationRow,
    RahimiRunConfig,
    calibrate,
    rahimi_measured,
    rows_csv,
)
from ..config import from_preset
from . import FigureOutput, register

__all__ = ["RuntimeFigureConfig", "OP_COLORS", "draw_timelines", "rahimi_measured_csv", "rahimi_measured_markdown"]

#: colour of each job kind in the timeline panels
OP_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#8172B3", "U": "#55A868"}


@dataclass(frozen=True)
class RuntimeFigureConfig:
    """ranks: the rank counts (one column each); kinds: the schedules (:data:`pipelab.studies.calibration.KINDS`);
    gantt: the schedule whose timeline is drawn; run: the model, micro-batches, steps, repeats and profiling of
    every calibration (:class:`~pipelab.studies.calibration.CalibrationConfig`; its ranks and cases are set per
    column)."""

    ranks: tuple[int, ...] = (2, 4)
    kinds: tuple[str, ...] = ("gpipe", "1f1b", "pipedream", "2bw", "interleaved", "zb_h1", "ddp", "fsdp", "lpp",
                              "fslpp", "hybrid")
    gantt: str = "1f1b"
    run: CalibrationConfig = CalibrationConfig()

    def calibration(self, ranks: int) -> CalibrationConfig:
        return replace(self.run, ranks=ranks, cases=tuple(CalibrationCase(k) for k in self.kinds))


_CONFIGS = {
    "tiny": RuntimeFigureConfig(ranks=(2,), kinds=("gpipe", "1f1b", "ddp"),
                                run=CalibrationConfig(width=64, depth=4, micro=8, steps=2, repeats=1, profile_reps=3)),
    "quick": RuntimeFigureConfig(),
    "paper": RuntimeFigureConfig(run=CalibrationConfig(width=1024, steps=8, repeats=5, profile_reps=20)),
}
_CONFIGS["study"] = _CONFIGS["paper"]


def draw_timelines(ax: Any, row: CalibrationRow) -> None:
    """Measured (solid, lower) and simulated (outlined, upper) job bars of every rank of ``row``, in ms."""
    sim = row.simulate()
    jobs = sim.jobs()
    for w in range(row.ranks):
        m = jobs["worker"] == w
        for op, s0, s1 in zip(jobs["op"][m], jobs["start"][m], jobs["end"][m]):
            ax.add_patch(Rectangle((1e3 * s0, w - 0.38), 1e3 * (s1 - s0), 0.36, facecolor="none",
                                   edgecolor=OP_COLORS[str(op)], lw=0.8))
    for tl in row.timelines:
        for r in tl.jobs:
            ax.add_patch(Rectangle((1e3 * r.start, tl.rank + 0.02), 1e3 * max(r.duration, 1e-6), 0.36,
                                   facecolor=OP_COLORS[r.op], edgecolor="none"))
    end = max(row.measured_s, row.forecast_s)
    ax.set_xlim(0, 1e3 * end * 1.02)
    ax.set_ylim(row.ranks - 0.5, -0.5)
    ax.set_yticks(range(row.ranks), [f"rank {w}" for w in range(row.ranks)])
    ax.set_xlabel("time since t0 (ms)")
    ax.set_title(f"{row.label}: measured (solid) vs simulated (outlined)\nmakespan {1e3 * row.measured_s:.0f} ms "
                 f"measured, {1e3 * row.forecast_s:.0f} ms forecast ({100 * row.error:+.0f}%)", fontsize=9)


def _errors(ax: Any, rows: list[CalibrationRow], target: float = 0.10) -> None:
    labels = [r.label.split("(")[0].strip() for r in rows]
    x = np.arange(len(rows))
    err = np.array([100 * r.error if r.runnable else np.nan for r in rows])
    rep = np.array([100 * r.replay_error if r.runnable else np.nan for r in rows])
    ax.axhspan(-100 * target, 100 * target, color="0.9", zorder=0)
    ax.bar(x - 0.2, np.nan_to_num(err), 0.4, color="#4C72B0", label="forecast from the profile")
    ax.bar(x + 0.2, np.nan_to_num(rep), 0.4, color="#C7C7C7", label="replay of measured job times")
    for i, r in enumerate(rows):
        if not r.runnable:
            ax.text(i, -1, "not runnable yet", rotation=90, ha="center", va="top", fontsize=7, color="0.4")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("forecast / measured − 1 (%)")
    ax.set_title(f"makespan forecast error, {rows[0].ranks} ranks (±{100 * target:.0f}% shaded)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")


@register("runtime_timeline", "Measured per-rank timelines of the multi-process runtime over the simulated ones, "
          "and the simulator's makespan forecast error per schedule (profiled costs)",
          budget={"tiny": 30, "quick": 40}, measured=True)
def runtime_timeline(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_CONFIGS, preset)
    results: dict[int, list[CalibrationRow]] = {}
    for ranks in cfg.ranks:
        if progress:
            print(f"runtime_timeline: calibrating {len(cfg.kinds)} schedules on {ranks} ranks")
        results[ranks] = calibrate(cfg.calibration(ranks))
    n = len(cfg.ranks)
    fig, axes = plt.subplots(2, n, figsize=(6.5 * n, 7.5), squeeze=False, gridspec_kw={"height_ratios": [1, 1.1]})
    for c, ranks in enumerate(cfg.ranks):
        rows = results[ranks]
        shown = next((r for r in rows if r.kind == cfg.gantt and r.runnable), next(r for r in rows if r.runnable))
        draw_timelines(axes[0, c], shown)
        _errors(axes[1, c], rows)
    handles = [Patch(facecolor=col, label=op) for op, col in OP_COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8)
    fig.suptitle("pipelab runtime (gloo, 1 thread per rank) measured against the simulator's forecast", fontsize=11)
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    every = [r for ranks in cfg.ranks for r in results[ranks]]
    csv = rows_csv(every)
    runnable = [r for r in every if r.runnable]
    notes = {
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "forecast_error": {f"{r.label} [{r.ranks} ranks]": round(r.error, 4) for r in runnable},
        "replay_error": {f"{r.label} [{r.ranks} ranks]": round(r.replay_error, 4) for r in runnable},
        "within_10_percent": sum(abs(r.error) <= 0.10 for r in runnable),
        "runnable": len(runnable),
        "not_runnable": [f"{r.label} [{r.ranks} ranks]" for r in every if not r.runnable],
        "statistic": f"median makespan over {cfg.run.repeats} repeats; profile medians over {cfg.run.profile_reps} "
                     "repeats",
    }
    return FigureOutput(fig, cfg, seed=cfg.run.seed, tables={"csv": csv}, notes=notes, data=results)


# ---------------------------------------------------------------------------------- Rahimi's Table 1, measured

_RAHIMI_MEASURED = {
    "tiny": RahimiRunConfig(S=2, B=2, G=2, R=1, width=64, micro=16, repeats=1),
    "quick": RahimiRunConfig(),
    "paper": RahimiRunConfig(repeats=5),
    "study": RahimiRunConfig(repeats=5),
}
_HEAD = {"W": "W", "latency": "latency (F+B units)", "activation_xmit": "act. xmit", "weight_xmit": "weight xmit",
         "activation_storage": "act. storage", "weight_storage": "weight storage"}


def _simulated(r: dict[str, Any], col: str) -> float:
    """The simulator's figure the runtime is compared with: its runtime-style fetch count for weight transfers."""
    return float(r["simulated_fetches"]) if col == "weight_xmit" else float(r["simulated"][col])


def rahimi_measured_csv(rows: list[dict[str, Any]]) -> str:
    """One line per (scheme, column): note, simulated (Rahimi's count for weight transfers), simulated_fetches
    (the runtime's count; weight transfers only), runtime, and ``counted_equal`` (runtime == simulator, for
    every column but latency)."""
    out = ["scheme,schedule,column,note,simulated,simulated_fetches,runtime,counted_equal"]
    for r in rows:
        for c in RAHIMI_COLUMNS:
            fetch = f"{r['simulated_fetches']:g}" if c == "weight_xmit" else ""
            eq = "" if c == "latency" else str(r["runtime"][c] == _simulated(r, c))
            out.append(f'{r["scheme"]},"{r["schedule"]}",{c},{r["note"][c]:g},{r["simulated"][c]:g},{fetch},'
                       f'{r["runtime"][c]:.4g},{eq}')
    return "\n".join(out) + "\n"


def rahimi_measured_markdown(rows: list[dict[str, Any]], preset: str) -> str:
    """Markdown for notebook 01: per scheme, the latency three ways and the counted columns that match, and the
    two weight-transfer counts — every number from ``rows`` (:func:`pipelab.studies.calibration.rahimi_measured`)."""
    p = rows[0]["params"]
    lines = [f"Measured on {int(rows[0]['runtime']['W'])} gloo ranks (S = {p['S']}, B = {p['B']}, `{preset}` "
             "preset; latency the median of the repeats):", ""]
    for r in rows:
        counted = [c for c in RAHIMI_COLUMNS if c != "latency"]
        same = [_HEAD[c] for c in counted if r["runtime"][c] == _simulated(r, c)]
        diff = [f"{_HEAD[c]} {r['runtime'][c]:g} vs {_simulated(r, c):g}" for c in counted
                if r["runtime"][c] != _simulated(r, c)]
        lat = r["runtime"]["latency"]
        w = (f"; weight transfers per worker: note {r['note']['weight_xmit']:g}, Rahimi's per-F-job count "
             f"{r['simulated']['weight_xmit']:g}, fetched versions {r['runtime']['weight_xmit']:g}"
             if r["note"]["weight_xmit"] or r["simulated"]["weight_xmit"] else "")
        lines.append(f"- **{r['scheme']}** ({r['schedule']}): latency note {r['note']['latency']:g}, simulated "
                     f"{r['simulated']['latency']:g}, measured {lat:.1f} ({lat / r['simulated']['latency']:.2f}× "
                     f"the simulated); runtime = simulator on {', '.join(same) or 'nothing'}"
                     + (f"; differs on {'; '.join(diff)}" if diff else "") + w + ".")
    return "\n".join(lines)


@register("schedules_rahimi_measured", "Rahimi's Table 1 on real processes (gloo ranks, traced runtime) beside the "
          "note's formulas and the simulator: latency, activation and weight transfers, storage per worker",
          budget={"tiny": 30, "quick": 30}, measured=True)
def schedules_rahimi_measured(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_RAHIMI_MEASURED, preset)
    if progress:
        print(f"schedules_rahimi_measured: running {len(cfg.schemes)} schemes, {cfg.repeats} repeats each")
    rows = rahimi_measured(cfg)
    cell_text, colours = [], []
    for r in rows:
        line, cl = [], []
        for c in RAHIMI_COLUMNS:
            sim = f"{r['simulated'][c]:g}" + (f" ({r['simulated_fetches']:g})" if c == "weight_xmit" else "")
            run = r["runtime"][c]
            line.append(f"{r['note'][c]:g} | {sim} | {run:.1f}" if c == "latency" else
                        f"{r['note'][c]:g} | {sim} | {run:g}")
            if c == "latency":
                cl.append("#fff2cc")
            else:
                cl.append("#d9ead3" if run == _simulated(r, c) else "#f4c7c3")
        cell_text.append(line)
        colours.append(cl)
    fig, ax = plt.subplots(figsize=(13, 0.3 * len(rows) + 0.9))
    ax.axis("off")
    tab = ax.table(cellText=cell_text, cellColours=colours, rowLabels=[r["schedule"] for r in rows],
                   colLabels=[_HEAD[c] for c in RAHIMI_COLUMNS], loc="upper center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(8.5)
    tab.scale(1, 1.35)
    ax.set_title(f"Rahimi's Table 1: note | simulated | measured on real processes (gloo), S={cfg.S}, B={cfg.B}; "
                 f"max over workers ({preset} preset)\ngreen: measured count = simulated; weight xmit: Rahimi's "
                 "per-F-job count (the runtime's per-version fetches); latency (yellow): wall clock in units of the "
                 "measured F+B, median of " + f"{cfg.repeats}", fontsize=9)
    fig.tight_layout()
    notes = {"cpu_count": os.cpu_count(),
             "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
             "latency_measured_over_simulated": {r["scheme"]: round(r["runtime"]["latency"] /
                                                                    r["simulated"]["latency"], 3) for r in rows},
             "counted_columns_equal": all(r["runtime"][c] == _simulated(r, c) for r in rows for c in RAHIMI_COLUMNS
                                          if c != "latency"),
             "rows": rows}
    return FigureOutput(fig, cfg, seed=cfg.seed, tables={"csv": rahimi_measured_csv(rows)}, notes=notes, data=rows)
