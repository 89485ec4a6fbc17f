"""Time to target on slow links: which schedule × policy × codec reaches a target accuracy soonest, against the
links' bandwidth and latency, and the setting where asynchrony starts to pay (:mod:`pipelab.studies.time_to_target`).

``time_to_target``: per arm (:data:`pipelab.studies.time_to_target.ARMS`) its steps to the target test accuracy
(per seed, from the learning-curve runs ``modern_optimizers`` already makes at the same configs, so they are cache
hits, plus PipeOptim's) times its steady step time from the link-model simulator (FLOP-model stage costs), against
bandwidth at a fixed latency and against latency at a fixed bandwidth; mean and 95 % t band over seeds, "not
reached" in the legend when a seed missed the target. The crossover of each asynchronous arm against synchronous
1F1B (:func:`pipelab.studies.time_to_target.crossover`) is marked with its interval. :func:`crossover_markdown` and
:func:`ranking_markdown` write notebook 05's statements from the same results.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch

from ...links import Link
from ...partition import split
from ...planner import Blocks
from ..config import from_preset
from ..learning_curves import sweep, with_
from ..models import build_model
from ..settings import TASKS
from ..time_to_target import (
    ARMS,
    NANOGPT,
    Arm,
    Crossover,
    TimeToTarget,
    arm_steps,
    benchmark_forecast,
    codec_ratios,
    crossover,
    flop_blocks,
    steady_plan,
    time_to_target,
)
from . import FigureOutput, register
from .modern_optimizers import PRESETS as MODERN_PRESETS
from .modern_optimizers import ModernOptimizersConfig, modern_configs

__all__ = ["TimeToTargetConfig", "TimeToTargetResult", "time_to_target_result", "crossover_markdown",
           "rank_arms", "rows_markdown", "ranking_markdown", "benchmark_markdown", "results_csv"]


@dataclass(frozen=True)
class TimeToTargetConfig:
    """``runs``: the modern-optimizer preset whose runs give the steps (``optimizer``'s, at its first depth);
    ``metric`` ≥ ``target`` (an accuracy, a fraction); compute at ``flops_per_second``; the bandwidth sweep
    ``bandwidths_mbps`` at ``latency_ms``, the latency sweep ``latencies_ms`` at ``bandwidth_mbps``; ``M`` micro-batches
    of synchronous 1F1B."""

    runs: ModernOptimizersConfig
    target: float
    optimizer: str = "nadam"
    metric: str = "test_acc"
    flops_per_second: float = 10e9
    bandwidths_mbps: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
                                          5000.0, 10000.0)
    latency_ms: float = 1.0
    latencies_ms: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
    bandwidth_mbps: float = 200.0
    M: int = 4


_PRESETS = {"tiny": TimeToTargetConfig(MODERN_PRESETS["tiny"], target=0.17, bandwidths_mbps=(1.0, 10.0, 100.0, 1000.0),
                                       latencies_ms=(0.0, 1.0, 10.0, 100.0)),
            "quick": TimeToTargetConfig(MODERN_PRESETS["quick"], target=0.7)}


@dataclass(frozen=True)
class TimeToTargetResult:
    """Per arm label: per-seed ``steps`` (``None``: pending), the step times over each sweep (``"bandwidth"``,
    ``"latency"``), the :class:`~pipelab.studies.time_to_target.TimeToTarget` per setting, and per asynchronous arm its
    :class:`~pipelab.studies.time_to_target.Crossover` against synchronous 1F1B on each sweep."""

    config: TimeToTargetConfig
    steps: dict[str, np.ndarray | None]
    step_times: dict[str, dict[str, np.ndarray]]
    times: dict[str, dict[str, list[TimeToTarget]]]
    crossovers: dict[str, dict[str, Crossover]]
    records: list[dict]

    def grid(self, sweep_name: str) -> np.ndarray:
        c = self.config
        return np.asarray(c.bandwidths_mbps if sweep_name == "bandwidth" else c.latencies_ms, dtype=np.float64)


def _records(cfg: TimeToTargetConfig, progress: bool) -> dict[tuple[str, str, str], list[dict]]:
    """The runs of every arm's (policy, optimizer, codec), through the learning-curve cache: ``modern_optimizers``'
    configs where it runs the pair uncoded, else its sequential config of that optimizer with the policy (and codec)
    changed (PipeOptim; the int8 arm)."""
    base = [c for c in modern_configs(cfg.runs) if c.D == cfg.runs.depths[0]]
    want = {(a.steps_from, a.optimizer or cfg.optimizer, a.codec) for a in ARMS if a.steps_from is not None}
    have = {(c.policy, c.optimizer, c.codec) for c in base}
    configs = [c for c in base if (c.policy, c.optimizer, c.codec) in want] + [
        with_(c, policy=p, codec=k) for p, o, k in sorted(want - have) for c in base
        if (c.policy, c.optimizer, c.codec) == ("sequential", o, "identity")]
    out: dict[tuple[str, str, str], list[dict]] = {key: [] for key in want}
    for cfg_, r in zip(configs, sweep(configs, progress=progress, desc="time to target")):
        out[(cfg_.policy, cfg_.optimizer, cfg_.codec)].append(r)
    return {key: sorted(rs, key=lambda r: r["seed"]) for key, rs in out.items()}


def _model(cfg: TimeToTargetConfig) -> tuple[list[torch.nn.Sequential], int]:
    _, _, name, mkw = TASKS[cfg.runs.task]
    if "in_features" not in mkw:
        raise ValueError(f"task {cfg.runs.task!r}: the FLOP model needs an MLP task's in_features")
    return split(build_model(name, **mkw), cfg.runs.depths[0]), int(mkw["in_features"])


def time_to_target_result(preset: str, *, progress: bool = False) -> TimeToTargetResult:
    """Steps, step times, times to target and crossovers of the preset's arms (module docstring)."""
    cfg: TimeToTargetConfig = from_preset(_PRESETS, preset)
    records = _records(cfg, progress)
    stages, n_in = _model(cfg)
    D, batch = len(stages), cfg.runs.batch_size
    links = {"bandwidth": [Link.mbps(b, latency_ms=cfg.latency_ms) for b in cfg.bandwidths_mbps],
             "latency": [Link.mbps(cfg.bandwidth_mbps, latency_ms=a) for a in cfg.latencies_ms]}
    memo: dict[tuple[str, str, int], dict[str, np.ndarray]] = {}
    steps: dict[str, np.ndarray | None] = {}
    measured: dict[str, np.ndarray] = {}  # the arms whose steps come from runs
    step_times, times = {}, {}
    for arm in ARMS:
        M = {"pipedream": 1, "2bw": D}.get(arm.schedule, cfg.M)
        key = (arm.schedule, arm.codec, M)
        if key not in memo:
            sample = torch.zeros(batch // M, n_in)
            blocks = flop_blocks(stages, sample, cfg.flops_per_second)
            ratios = codec_ratios(stages, sample, arm.codec, None)
            memo[key] = {s: np.array([steady_plan(blocks, arm.schedule, M, batch, x, ratios).step_time for x in ls])
                         for s, ls in links.items()}
        step_times[arm.label] = memo[key]
        if arm.steps_from is not None:
            measured[arm.label] = arm_steps(records[(arm.steps_from, arm.optimizer or cfg.optimizer, arm.codec)],
                                            cfg.metric, cfg.target)
        steps[arm.label] = measured.get(arm.label)
        shown = measured[arm.label if arm.steps_from is not None else _sync(arm).label]
        times[arm.label] = {s: [time_to_target(shown, float(t)) for t in ts] for s, ts in memo[key].items()}
    sync = ARMS[0].label
    crossovers = {a: {s: crossover(_x(cfg, s), step_times[a][s], step_times[sync][s], st, measured[sync])
                      for s in links} for a, st in measured.items() if a != sync and _arm(a).schedule != "1f1b"}
    return TimeToTargetResult(cfg, steps, step_times, times, crossovers, [r for rs in records.values() for r in rs])


def _arm(label: str) -> Arm:
    return next(a for a in ARMS if a.label == label)


def _sync(arm: Arm) -> Arm:
    """The arm whose steps stand in for a pending codec arm's (the same schedule without the codec)."""
    return next(a for a in ARMS if a.schedule == arm.schedule and a.steps_from is not None)


def _x(cfg: TimeToTargetConfig, sweep_name: str) -> np.ndarray:
    return np.asarray(cfg.bandwidths_mbps if sweep_name == "bandwidth" else cfg.latencies_ms, dtype=np.float64)


def _fmt_x(v: float, unit: str, grid: np.ndarray) -> str:
    if math.isinf(v):
        return f"beyond the grid's {'highest' if v > 0 else 'lowest'} setting ({grid[-1 if v > 0 else 0]:g} {unit})"
    return f"{v:.3g} {unit}"


def crossover_markdown(res: TimeToTargetResult) -> str:
    """One line per asynchronous arm: where it starts to beat synchronous 1F1B on bandwidth and on latency."""
    c, lines = res.config, []
    for label, cs in res.crossovers.items():
        parts = []
        for s, unit in (("bandwidth", "Mb/s"), ("latency", "ms")):
            x = cs[s]
            at = f"{c.latency_ms:g} ms" if s == "bandwidth" else f"{c.bandwidth_mbps:g} Mb/s"
            if not x.reached:
                parts.append(f"{s} (at {at}): not computed, a seed did not reach the target")
            elif math.isnan(x.value):
                who = "wins on the whole grid" if all(x.a_wins) else "never wins on the grid" if not any(x.a_wins) \
                    else f"crosses {len(x.crossings)} times"
                parts.append(f"{s} (at {at}): {who}")
            else:
                g = res.grid(s)
                iv = "" if math.isnan(x.low) else \
                    f" (95 % interval {_fmt_x(x.low, unit, g)} to {_fmt_x(x.high, unit, g)})"
                side = "above" if x.a_wins[-1] else "below"
                parts.append(f"{s} (at {at}): crossover {_fmt_x(x.value, unit, g)}{iv}, it wins {side}")
        ratio = next(iter(cs.values()))
        rho = "" if math.isnan(ratio.ratio) else f"; steps ratio to sync {ratio.ratio:.3g}"
        lines.append(f"- **{label}**{rho}: " + "; ".join(parts))
    return "\n".join(lines)


def rank_arms(blocks: Blocks, link: Link, steps: dict[str, np.ndarray | None], *, batch: int, M: int = 4,
              ratios: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> list[dict[str, Any]]:
    """Every arm of :data:`~pipelab.studies.time_to_target.ARMS` on your ``blocks`` (one stage each) and ``link``:
    its steady step time, its steps (``steps[label]`` per seed; a pending codec arm takes its schedule's synchronous
    arm's, as a bound) and time to target, best first (not reached and pending last). ``ratios``: codec name →
    encoded/plain bytes per boundary (:func:`~pipelab.studies.time_to_target.codec_ratios`); a codec arm without
    them is left out (its bill depends on the hand-over's shape)."""
    D, rows = len(blocks.f), []
    for arm in ARMS:
        if arm.codec != "identity" and (ratios is None or arm.codec not in ratios):
            continue
        m = {"pipedream": 1, "2bw": D}.get(arm.schedule, M)
        t = steady_plan(blocks, arm.schedule, m, batch, link, None if arm.codec == "identity" else
                        (ratios or {})[arm.codec]).step_time
        st = steps.get(arm.label)
        shown = st if st is not None else steps[_sync(arm).label]
        assert shown is not None  # the synchronous arm's steps come from runs
        rows.append({"arm": arm.label, "step_time": t, "steps": st, "time": time_to_target(shown, t)})
    return sorted(rows, key=lambda r: (r["steps"] is None, r["time"].seconds))


def rows_markdown(rows: list[dict[str, Any]]) -> str:
    """:func:`rank_arms`' rows as a markdown table."""
    out = ["| # | arm | step time | steps to target (mean) | time to target |", "| --- | --- | --- | --- | --- |"]
    for i, r in enumerate(rows):
        st, t = r["steps"], r["time"]
        n = "pending (codec not in the emulator yet)" if st is None else f"{np.mean(st):.4g}" \
            if np.isfinite(st).all() else f"not reached ({int(np.isfinite(st).sum())} of {st.size})"
        lab = t.label() + (" (bound: no accuracy cost)" if st is None else "")
        out.append(f"| {i + 1} | {r['arm']} | {1e3 * r['step_time']:.4g} ms | {n} | {lab} |")
    return "\n".join(out)


def ranking_markdown(res: TimeToTargetResult, sweep_name: str, index: int) -> str:
    """The arms ranked by time to target at one setting of a sweep (not reached last; pending codecs marked)."""
    x = res.grid(sweep_name)[index]
    at = {a: res.times[a][sweep_name][index] for a in res.times}
    rows: list[dict[str, Any]] = sorted(({"arm": a, "step_time": t.step_time, "steps": res.steps[a], "time": t}
                                         for a, t in at.items()), key=lambda r: (r["steps"] is None, r["time"].seconds))
    unit = "Mb/s" if sweep_name == "bandwidth" else "ms"
    return f"At {x:g} {unit}:\n\n" + rows_markdown(rows)


def benchmark_markdown() -> str:
    """The benchmark-like preset's forecast (:func:`~pipelab.studies.time_to_target.benchmark_forecast`) for each
    setting of :data:`~pipelab.studies.time_to_target.NANOGPT`, torch's 1F1B, as a markdown table."""
    out = ["| setting | d_model, heads, seq | micro-batch × M | hand-over | compute | link | bytes per message | "
           "steady step | link share |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in NANOGPT.items():
        r = benchmark_forecast(s)
        out.append(f"| {name} | {s.d_model}, {s.heads}, {s.seq} | {s.micro} × {s.M} | {s.dtype} | "
                   f"{s.flops_per_second:.3g} FLOP/s | {s.mbps:g} Mb/s, {s.latency_ms:g} ms | "
                   f"{r['message_bytes']:,.0f} | {r['step_time']:.4g} s | {r['link_share']:.1%} |")
    return "\n".join(out)


def results_csv(res: TimeToTargetResult) -> str:
    """One row per arm × sweep × setting, then one per crossover (arm, sweep, value and interval)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["kind", "arm", "sweep", "x", "step_time_s", "time_to_target_s", "half_width_s", "reached", "seeds",
                "steps_source", "low", "high"])
    for a, sw in res.times.items():
        src = "pending:lossless_bound" if res.steps[a] is None else "runs"
        for s, ts in sw.items():
            w.writerows(["time", a, s, f"{x:g}", f"{t.step_time:.6g}", f"{t.seconds:.6g}", f"{t.half_width:.6g}",
                         t.reached, len(t.steps), src, "", ""] for x, t in zip(res.grid(s), ts))
    for a, cs in res.crossovers.items():
        w.writerows(["crossover", a, s, f"{c.value:.6g}", "", "", "", int(c.reached), "", "runs", f"{c.low:.6g}",
                     f"{c.high:.6g}"] for s, c in cs.items())
    return buf.getvalue()


def _draw(ax: Any, res: TimeToTargetResult, sweep_name: str, colors: dict[str, Any]) -> None:
    x = res.grid(sweep_name)
    for a, sw in res.times.items():
        ts = sw[sweep_name]
        m = np.array([t.seconds for t in ts])
        pending, reached = res.steps[a] is None, np.isfinite(m).all()
        label = a + (" (steps pending: lossless bound)" if pending else "" if reached else f" — {ts[0].label()}")
        if not reached:
            ax.plot([], [], color=colors[a], label=label)
            continue
        ax.plot(x, m, marker="o", ms=3, color=colors[a], ls="--" if pending else "-", label=label)
        lo, hi = np.array([t.low for t in ts]), np.array([t.high for t in ts])
        if np.isfinite(lo).all():
            ax.fill_between(x, lo, hi, color=colors[a], alpha=0.15, lw=0)
    for a, cs in res.crossovers.items():
        c = cs[sweep_name]
        if math.isfinite(c.value):
            ax.axvline(c.value, color=colors[a], ls=":", lw=1.2)
            if not math.isnan(c.low):
                ax.axvspan(max(c.low, x[0]), min(c.high, x[-1]), color=colors[a], alpha=0.06, lw=0)
    ax.set_yscale("log")
    if sweep_name == "bandwidth":
        ax.set_xscale("log")
        ax.set_xlabel(f"bandwidth per link (Mb/s), latency {res.config.latency_ms:g} ms")
    else:
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(0, x[-1] * 1.1)
        ax.set_xlabel(f"latency per link (ms), bandwidth {res.config.bandwidth_mbps:g} Mb/s")


@register("time_to_target", "Time to a target accuracy (steps to target × simulated steady step time) of sync 1F1B, "
          "async 1F1B (stashing, PipeOptim, Nesterov), 2BW and int8 compression against link bandwidth and latency, "
          "with the crossover where asynchrony starts to pay", budget={"tiny": 20, "quick": 15})
def time_to_target_figure(preset: str, *, progress: bool = False) -> FigureOutput:
    res = time_to_target_result(preset, progress=progress)
    cfg = res.config
    import seaborn as sns

    colors = dict(zip(res.times, sns.color_palette("colorblind", len(res.times))))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, s in zip(axes, ("bandwidth", "latency")):
        _draw(ax, res, s, colors)
    axes[0].set_ylabel(f"time to {100 * cfg.target:g} % test accuracy (s)")
    axes[1].legend(fontsize=6.5, loc="best")
    fig.suptitle(f"Time to target: {cfg.runs.task}, {cfg.optimizer}, D={cfg.runs.depths[0]}, batch "
                 f"{cfg.runs.batch_size}, {len(cfg.runs.seeds)} seeds (mean, 95 % t band); compute "
                 f"{cfg.flops_per_second:.3g} FLOP/s; Nesterov on NAdam β1 = 0.99;\ndotted: crossover vs sync 1F1B "
                 f"(shaded: its 95 % interval); preset {preset}", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    notes = {"crossovers": {a: {s: {"value": c.value, "low": c.low, "high": c.high, "ratio": c.ratio,
                                    "reached": c.reached} for s, c in cs.items()} for a, cs in res.crossovers.items()},
             "steps": {a: None if v is None else v.tolist() for a, v in res.steps.items()}}
    return FigureOutput(fig, cfg, cfg.runs.seeds[0], tables={"csv": results_csv(res)}, notes=notes, data=res)
