"""One schedule run for real without and with a metered link, each measured timeline over the simulated one.

Figure ``links_timeline``: :func:`pipelab.studies.calibration.calibrate` profiles every stage on the machine at
hand and runs one schedule (1F1B on 2 gloo ranks, one thread each) twice: unmetered (left: the forecast takes
the profiled local transfer time) and with every boundary metered as a slow link (right,
:mod:`pipelab.runtime.meter`: each message held until its arrival under the link model; the forecast takes the
network and the bytes of the real tensors). In each panel the measured jobs of every rank (solid, the median
repeat) lie under the simulated ones (outlined); the title gives forecast / measured − 1 and the *replay*
error (the simulation with the run's own mean job times: what remains is the model's error, the rest of the
forecast's is the profile's). The right panel marks each message's modelled arrival at its receiver (ticks).

Measurements are wall-clock times on whatever machine draws the figure; the sidecar records its core count and
load average, the late messages (stamps that came too late for the meter's wire order) and the meter's mean
overshoot (arrival to the job getting its tensor).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ...links import Link
from ..calibration import CalibrationCase, CalibrationConfig, CalibrationRow, calibrate, rows_csv
from ..config import from_preset
from . import FigureOutput, register
from .runtime import OP_COLORS, draw_timelines

__all__ = ["LinksFigureConfig"]


@dataclass(frozen=True)
class LinksFigureConfig:
    """kind: the schedule (:data:`~pipelab.studies.settings.CALIBRATION_KINDS`); mbps, latency_ms: the metered
    link on every boundary; run: model, ranks, micro-batches, steps, repeats and profiling
    (:class:`~pipelab.studies.calibration.CalibrationConfig`; its cases and link are set here)."""

    kind: str = "1f1b"
    mbps: float = 10.0
    latency_ms: float = 5.0
    run: CalibrationConfig = CalibrationConfig(width=128, depth=4, in_features=128, micro=256, steps=4, repeats=3)

    def calibration(self, metered: bool) -> CalibrationConfig:
        link = Link.mbps(self.mbps, latency_ms=self.latency_ms) if metered else None
        return replace(self.run, cases=(CalibrationCase(self.kind),), link=link)


_CONFIGS = {
    "tiny": LinksFigureConfig(mbps=50.0, run=CalibrationConfig(width=64, depth=4, in_features=64, micro=64, steps=2,
                                                                repeats=1, profile_reps=3)),
    "quick": LinksFigureConfig(),
}


@register("links_timeline", "One schedule on real processes without and with a metered slow link: measured "
          "per-rank timelines over the simulated ones, forecast and replay errors", presets=("tiny", "quick"),
          budget={"tiny": 20, "quick": 25}, measured=True)  # quick: 21 s measured
def links_timeline(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_CONFIGS, preset)
    rows: dict[str, CalibrationRow] = {}
    for name, metered in (("unmetered", False), ("metered", True)):
        if progress:
            print(f"links_timeline: {name} {cfg.kind} on {cfg.run.ranks} ranks")
        rows[name] = calibrate(cfg.calibration(metered))[0]
    fig, axes = plt.subplots(1, 2, figsize=(13, 3.6), squeeze=False)
    for ax, (name, row) in zip(axes[0], rows.items()):
        draw_timelines(ax, row)
        what = "no meter (local gloo transfers)" if name == "unmetered" else \
            f"metered: {cfg.mbps:g} Mb/s, {cfg.latency_ms:g} ms per boundary, {row.late} late"
        ax.set_title(f"{row.label}, {what}\nmeasured {1e3 * row.measured_s:.0f} ms, forecast "
                     f"{1e3 * row.forecast_s:.0f} ms ({100 * row.error:+.1f}%), replay {100 * row.replay_error:+.1f}%",
                     fontsize=9)
    handles = [Patch(facecolor=col, label=op) for op, col in OP_COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8)
    fig.suptitle("measured (solid) vs simulated (outlined) timelines, gloo ranks, 1 thread each", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    notes = {
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "forecast_error": {name: round(r.error, 4) for name, r in rows.items()},
        "replay_error": {name: round(r.replay_error, 4) for name, r in rows.items()},
        "busy_error": {name: round(r.busy_error, 4) for name, r in rows.items()},
        "late_messages": rows["metered"].late,
        "meter_overshoot_ms": round(1e3 * rows["metered"].overshoot, 3),
        "link_share": round(rows["metered"].link_time, 4),
        "statistic": f"median makespan over {cfg.run.repeats} repeats; profile means over {cfg.run.profile_reps}",
    }
    return FigureOutput(fig, cfg, seed=cfg.run.seed, tables={"csv": rows_csv(list(rows.values()))}, notes=notes,
                        data=rows)
