"""Figures of the schedules notebook: Gantt charts of every builder, bubbles, memory, version tables, and
Rahimi's Table 1 and throughput bound checked by simulation.

:func:`draw_gantt` is public so notebooks can draw any schedule the same way.
"""

from __future__ import annotations

import csv as csv_module
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ...papers import (
    RAHIMI_COLUMNS,
    pipeoptim_staleness,
    rahimi_row,
    spectrain_version_difference,
)
from ...schedules import (
    Schedule,
    ddp,
    folded,
    fsdp,
    fslpp,
    gpipe,
    interleaved_1f1b,
    lpp,
    naive,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
)
from ...simulator import SimResult, simulate
from ..calibration import rahimi_measured_row, rahimi_throughput
from ..config import from_preset
from . import FigureOutput, register

__all__ = ["draw_gantt", "GanttConfig", "SweepConfig", "StalenessConfig", "RahimiConfig", "lpp_bubble",
           "lpp_latency", "LPP_PRIORITIES", "RAHIMI_PRIORITIES", "rahimi_rows", "rahimi_table_markdown",
           "throughput_bound_markdown"]


def draw_gantt(ax: Axes, r: SimResult, *, versions: bool = False, title: str | None = None,
               label_stage: bool | None = None, max_colors: int = 12, rule: str | None = None) -> None:
    """Draw ``r`` as a worker × time Gantt chart on ``ax``.

    Cells are coloured by micro-batch (g = t·M + j, cycling through ``max_colors`` colours); forwards are
    light, backwards (B, or the input-gradient pass I of a split backward) dark and hatched ``//``, weight-
    gradient passes W mid-tone and dotted; the text is the op and the micro-batch (plus the stage when a worker
    holds several); a black tick with a triangle marks an update U; with ``versions`` every cell also shows
    the weight version it uses (``v2`` = W^(2); a W uses its I's weights) under ``rule``, one of
    :data:`pipelab.schedules.versions.USED_RULES` (default: the schedule's weight rule; ``"stash"``: weight
    stashing, a backward uses its forward's version, as PipeDream does).
    """
    s, c = r.schedule, r.compiled
    pal = sns.color_palette("husl", min(max_colors, max(s.M * s.steps, 1)))
    multi = label_stage if label_stage is not None else any(
        len(set(c.stage[(c.worker == w) & (c.op != 2)].tolist())) > 1 for w in range(s.W))
    vt = r.version_table if versions else None
    used = {op: vt.used(op, rule) for op in ("F", "B")} if vt is not None else None
    if used is not None:
        used["I"] = used["W"] = used["B"]
    n_cells = int(np.sum(c.op != 2))
    fs = float(np.clip(260 / max(r.makespan, 1), 4.0, 8.0))
    show_text = n_cells <= 1200
    for i in range(c.n):
        w, op, k, t, j = int(c.worker[i]), int(c.op[i]), int(c.stage[i]), int(c.step[i]), int(c.micro[i])
        x0, x1 = float(r.start[i]), float(r.end[i])
        if op == 2:  # update
            ax.plot([x1, x1], [w - 0.45, w + 0.45], color="black", lw=1.2, zorder=4)
            ax.plot([x1], [w - 0.5], marker="v", color="black", ms=3.5, zorder=4)
            continue
        g = t * s.M + j
        col = np.asarray(pal[g % len(pal)])
        name = "FBUIW"[op]
        dark = name in ("B", "I")
        face = tuple(0.55 * col) if dark else tuple(0.8 * col) if name == "W" else tuple(0.35 + 0.65 * col)
        ax.add_patch(Rectangle((x0, w - 0.42), x1 - x0, 0.84, facecolor=face, edgecolor="white", lw=0.5,
                               hatch="//" if dark else ".." if name == "W" else None, zorder=2))
        if show_text:
            txt = f"{name}{g}" + (f"\ns{k}" if multi else "")
            if used is not None:
                txt += f"\nv{used[name][k, t, j]}"
            ax.text((x0 + x1) / 2, w, txt, ha="center", va="center", fontsize=fs,
                    color="white" if dark else "black", zorder=3, linespacing=0.9)
    ax.set_xlim(0, r.makespan)
    ax.set_ylim(s.W - 0.5, -0.6)
    ax.set_yticks(range(s.W))
    ax.set_yticklabels([f"w{w}" for w in range(s.W)], fontsize=7 if s.W > 8 else 8)
    ax.grid(False)
    ax.set_title(title or f"{s.name}: makespan {r.makespan:g}, bubble {r.bubble:.0%}", fontsize=9, loc="left")


def _legend(fig: Figure, split: bool = False) -> None:
    """The op legend; with ``split`` the backward's two halves I and W instead of B."""
    backward = ([Patch(facecolor="0.35", hatch="//", edgecolor="white", label="I (input gradient)"),
                 Patch(facecolor="0.6", hatch="..", edgecolor="white", label="W (weight gradient)")] if split else
                [Patch(facecolor="0.35", hatch="//", edgecolor="white", label="B (backward)")])
    fig.legend(handles=[Patch(facecolor="0.85", edgecolor="0.5", label="F (forward)"), *backward,
                        plt.Line2D([], [], color="black", marker="v", lw=1.2, ms=4, label="U (update)")],
               loc="lower left", ncol=len(backward) + 2, fontsize=8)  # the footer sits at the lower right


# ----------------------------------------------------------------------------- Gantt charts
@dataclass(frozen=True)
class GanttConfig:
    D: int = 4          # stages
    M: int = 4          # micro-batches per step (synchronous schedules)
    steps: int = 2      # steps drawn for the flushed schedules
    async_steps: int = 8  # mini-batches of the asynchronous schedules
    b_over_f: float = 2.0  # backward / forward cost


_GANTT = {"tiny": GanttConfig(D=3, M=3, steps=1, async_steps=5), "quick": GanttConfig(),
          "paper": GanttConfig(D=4, M=8, steps=2, async_steps=10)}


def _gantt_figure(entries: Sequence[tuple[Any, ...]], cfg: GanttConfig, suptitle: str, versions: bool = False,
                  rules: Sequence[str | None] | None = None) -> FigureOutput:
    # An entry is (title, schedule) or (title, schedule, scale): scale multiplies the stage costs (a model
    # cut into twice as many chunks has chunks of half the cost). ``rules``: per entry, the weight rule the
    # version labels follow (None: the schedule's own; see draw_gantt).
    rules = list(rules) if rules is not None else [None] * len(entries)
    if len(rules) != len(entries):
        raise ValueError(f"rules has {len(rules)} entries, expected one per schedule ({len(entries)})")
    results = [(e[0], simulate(e[1], e[2] if len(e) > 2 else 1.0, cfg.b_over_f * (e[2] if len(e) > 2 else 1.0)))
               for e in entries]
    heights = [r.schedule.W + 1.2 for _, r in results]
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 0.42 * sum(heights) + 1.0),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    horizon = max(r.makespan for _, r in results)
    notes = {}
    for ax, (name, r), rule in zip(axes[:, 0], results, rules):
        fetch = int(r.weight_transfers.max())
        draw_gantt(ax, r, versions=versions, rule=rule,
                   title=f"{name} — {r.schedule.W} workers, makespan {r.makespan:g}, "
                   f"bubble {r.bubble:.0%}, peak activations {r.peak_activations.max()}"
                   + (f", weight fetches/worker ≤ {fetch}" if fetch else ""))
        ax.set_xlim(0, horizon)
        notes[name] = {"makespan": r.makespan, "bubble": r.bubble, "peak_activations": r.peak_activations.tolist(),
                       "update_rule": r.schedule.update_rule, "weight_rule": rule or r.schedule.weight_rule}
    axes[-1, 0].set_xlabel(f"time (forward = 1, backward = {cfg.b_over_f:g})")
    fig.suptitle(suptitle, x=0.01, ha="left", fontsize=11)
    _legend(fig, split=any(r.schedule.split_backward for _, r in results))
    fig.tight_layout(rect=(0, 0.03, 1, 0.98))
    return FigureOutput(fig, cfg, None, notes=notes, data=dict(results))


@register("schedules_pipeline", "Gantt charts of the flushed pipeline schedules: naive, GPipe, 1F1B, "
          "interleaved 1F1B, folded",
          budget={"tiny": 5, "quick": 6})
def schedules_pipeline(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_GANTT, preset)
    D, M, T = cfg.D, cfg.M, cfg.steps
    entries: list[tuple[Any, ...]] = [("naive model parallel (M=1 per step)", naive(D, 1, T)),
               ("GPipe", gpipe(D, M, T)), ("1F1B (PipeDream-Flush / DAPPLE)", one_f_one_b(D, M, T))]
    if M % D == 0:
        entries.append((f"interleaved 1F1B: the model in {2 * D} half-size chunks, V=2 per worker "
                         f"(stage s on worker s mod {D})", interleaved_1f1b(D, 2, M, T), 0.5))
    entries.append((f"folded: the model in {2 * D} half-size chunks, worker i holds chunks i and {2 * D - 1}−i",
                    folded(2 * D, M, T), 0.5))
    return _gantt_figure(entries, cfg, f"Flushed pipeline schedules on {D} workers, M={M} micro-batches per step, "
                         f"{T} step(s). Colour = micro-batch; label = op and micro-batch (and stage s)")


@register("schedules_async", "Gantt charts of asynchronous 1F1B (M=1) with vanilla versions, PipeDream (the same "
          "order with weight stashing) and PipeDream-2BW, with the weight version every job uses",
          budget={"tiny": 5, "quick": 8})
def schedules_async(preset: str, *, progress: bool = False) -> FigureOutput:
    """Three panels, each labelled with the rule its version labels follow (``VersionTable.used``):

    - asynchronous 1F1B, M=1, *vanilla* (rule ``current``): F and B use the version current when they run,
      so a backward uses newer weights than its forward (the gradient is then of no single model);
    - PipeDream: the same timeline with weight stashing (rule ``stash``): B uses its F's version, and stage
      k keeps D − k versions (PipeDream, Narayanan et al., SOSP 2019, §3.3);
    - PipeDream-2BW (rule ``double_buffer``): every job of step t uses version t − 1 (ICML 2021, §3.1).
    """
    cfg = from_preset(_GANTT, preset)
    D = cfg.D
    s1 = pipedream(D, 1, cfg.async_steps)
    entries = [("asynchronous 1F1B, M=1, vanilla versions (F and B use the version current when they run)", s1),
               (f"PipeDream: asynchronous 1F1B, M=1, weight stashing (B uses its F's version; stage k stashes "
                f"D−k versions, {D} on w0)", s1),
               (f"PipeDream-2BW, M={D} (double buffer: version t−1 at every stage)",
                pipedream_2bw(D, D, max(3, cfg.async_steps // D + 1)))]
    return _gantt_figure(entries, cfg, "Asynchronous 1F1B: no flush, U after each mini-batch; vN = the job uses weight "
                         f"version $W^{{(N)}}$ under the rule named in each panel ({preset} preset)", versions=True,
                         rules=["current", "stash", None])


@register("schedules_rahimi", "Gantt charts of Rahimi's DDP, FSDP, LPP and FSLPP placements",
          budget={"tiny": 5, "quick": 4})
def schedules_rahimi(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_GANTT, preset)
    D = cfg.D if cfg.D % 2 == 0 else cfg.D + 1
    M = 4
    entries = [("DDP: w(s,b,d) = (b, b)", ddp(D, M)), ("FSDP: w(s,b,d) = (s, b)", fsdp(D, M)),
               ("LPP G=2, R=2: w = (h(s,b), h(s,b))", lpp(D, M, 2, 2)),
               ("FSLPP G=2, R=2: w = (h(s,s), h(s,b))", fslpp(D, M, 2, 2))]
    return _gantt_figure(entries, cfg, f"Rahimi's placements, S={D} stages, B={M} micro-batches, "
                         "h(s,b) = (R·b mod W) + (s mod R)")


# ----------------------------------------------------------------------------- bubbles and memory
@dataclass(frozen=True)
class SweepConfig:
    D: int = 8
    Ms: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    b_over_f: float = 2.0
    M_memory: int = 16


_SWEEP = {"tiny": SweepConfig(D=4, Ms=(1, 2, 4, 8), M_memory=8), "quick": SweepConfig(),
          "paper": SweepConfig(D=16, Ms=(1, 2, 4, 8, 16, 32, 64, 128), M_memory=32)}


#: The LPP arms of the sweep: Rahimi's looped pipeline with G = 2 groups of R = W/2 workers.
LPP_LABEL = "LPP G=2, R=W/2"
#: Priority rule → its name in the legends: backward-first is the constructor's (and :func:`lpp`'s) default,
#: forward-first is GPipe's breadth-first order, the one Rahimi's latency S + B/G − 1 assumes.
LPP_PRIORITIES = {"backward_first": "backward-first (1F1B order)", "forward_first": "forward-first (GPipe order)"}


def lpp_bubble(S: int, B: int, G: int, R: int) -> float:
    """Bubble fraction of LPP under the forward-first priority, from its latency in F+B units of one stage.

    A worker runs V = S/R stages of m = B/G micro-batches, V·m jobs of F+B; the latency is

        L = max(S + m − 1, V·m + R − 1),

    Rahimi's Table 1 value S + B/G − 1 (a micro-batch's round trip through S stages plus the others behind
    it) unless the worker's own work plus the fill, V·m + R − 1, is longer (looping, R < S). The bubble is
    1 − V·m / L. It is exact for the constructor's forward-first order when m ≤ R or R divides m (the tests
    check it against the simulator); it decreases with B towards 0.

    Raises:
        ValueError: R does not divide S or G does not divide B.

    Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), Table 1.
    """
    if S % R or B % G:
        raise ValueError(f"lpp_bubble needs R | S and G | B, got S={S}, B={B}, G={G}, R={R}")
    return 1.0 - (S // R) * (B // G) / lpp_latency(S, B, G, R)


def lpp_latency(S: int, B: int, G: int, R: int) -> float:
    """LPP's latency under the forward-first priority, in F+B units of one stage:

        L = max(S + B/G − 1, (S/R)(B/G) + R − 1),

    Rahimi's Table 1 value unless a worker's own (S/R)(B/G) jobs plus the fill R − 1 take longer (no order can
    finish a worker's work in less than (S/R)(B/G)). :func:`lpp_bubble` is 1 − (S/R)(B/G)/L. Exact for the
    simulated forward-first order when B/G ≤ R or R divides B/G (tested); the backward-first order is slower
    when 1 < R < S.

    Example:
        >>> lpp_latency(S=4, B=8, G=2, R=4), lpp_latency(S=4, B=8, G=2, R=2)   # note: 7 in both cases
        (7.0, 9.0)

    Raises:
        ValueError: R does not divide S or G does not divide B.

    Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), Table 1.
    """
    if S % R or B % G:
        raise ValueError(f"lpp_latency needs R | S and G | B, got S={S}, B={B}, G={G}, R={R}")
    V, m = S // R, B // G
    return float(max(S + m - 1, V * m + R - 1))


def _sweep_schedules(W: int, M: int, b_over_f: float, lpp_priorities: Sequence[str] = ("backward_first",)
                     ) -> dict[str, tuple[Schedule, float]]:
    """Schedules of one model on W workers: name -> (schedule, stage-cost scale), simulated at F = scale and
    B = ``b_over_f``·scale. Interleaved and folded cut the model into V·W (2W) chunks of 1/V (1/2) the cost.
    LPP is built once per priority rule; the greedy orders (folded, LPP) are built at the costs they are
    simulated with."""
    out = {"GPipe": (gpipe(W, M), 1.0), "1F1B": (one_f_one_b(W, M), 1.0),
           "folded (2W chunks)": (folded(2 * W, M, b_over_f=b_over_f), 0.5)}
    for V in (2, 4):
        if M % W == 0:
            out[f"interleaved V={V}"] = (interleaved_1f1b(W, V, M), 1.0 / V)
    if M % 2 == 0 and W % 2 == 0:
        for prio in lpp_priorities:
            out[f"{LPP_LABEL}, {LPP_PRIORITIES[prio]}"] = (lpp(W, M, 2, W // 2, priority=prio, b_cost=b_over_f), 1.0)
    return out


@register("schedules_bubble", "Bubble fraction vs micro-batches per step: single pipelines with GPipe's closed "
          "form (D−1)/(M+D−1), and LPP under both priority rules with its closed form",
          budget={"tiny": 5, "quick": 4})
def schedules_bubble(preset: str, *, progress: bool = False) -> FigureOutput:
    """Left: GPipe, 1F1B, interleaved and folded against (D−1)/(M+D−1). Right: LPP (G = 2, R = W/2) built
    with the backward-first and the forward-first priority (each ordered at the simulated costs), against
    :func:`lpp_bubble`. Forward-first (Rahimi's) follows the closed form; backward-first keeps fewer
    micro-batches resident and falls more slowly with M. (Ordered at unit costs and simulated at B = 2F, the
    backward-first order left idle slots on the looped workers that made its bubble plateau: 21 % at M = 64
    on the quick preset instead of 6.8 %.)"""
    cfg = from_preset(_SWEEP, preset)
    D = cfg.D
    rows: dict[str, list[tuple[int, float]]] = {}
    peaks: dict[str, list[tuple[int, float]]] = {}
    for M in cfg.Ms:
        for name, (s, x) in _sweep_schedules(D, M, cfg.b_over_f, tuple(LPP_PRIORITIES)).items():
            r = simulate(s, x, x * cfg.b_over_f)
            rows.setdefault(name, []).append((M, r.bubble))
            peaks.setdefault(name, []).append((M, float(r.peak_activations.max())))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.2), sharey=True)
    Ms = np.array(cfg.Ms, float)
    ax.plot(Ms, (D - 1) / (Ms + D - 1), color="0.3", lw=4, alpha=0.35, label="(D−1)/(M+D−1)")
    single = {n: p for n, p in rows.items() if not n.startswith(LPP_LABEL)}
    if "GPipe" in single and "1F1B" in single and np.allclose([b for _, b in single["GPipe"]],
                                                               [b for _, b in single["1F1B"]], atol=1e-12):
        single = {"GPipe = 1F1B": single.pop("GPipe"), **{n: p for n, p in single.items() if n != "1F1B"}}
    markers = iter("osD^v<>")
    for name, pts in single.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker=next(markers), ms=4, label=name)
    ax.set_title(f"one pipeline on W={D} workers", fontsize=10)
    lpp_rows = {n: p for n, p in rows.items() if n.startswith(LPP_LABEL)}
    closed = {}
    if lpp_rows:
        M_lpp = [m for m, _ in next(iter(lpp_rows.values()))]
        closed = {m: lpp_bubble(D, m, 2, D // 2) for m in M_lpp}
        ax2.plot(M_lpp, list(closed.values()), color="0.3", lw=4, alpha=0.35,
                 label="1 − (S/R)(M/G) / max(S+M/G−1, (S/R)(M/G)+R−1)")
        for (name, pts), mk, col in zip(lpp_rows.items(), "^o", ("#D55E00", "#0072B2")):
            xs, ys = zip(*pts)
            peak = dict(peaks[name])[xs[-1]]
            ax2.plot(xs, ys, marker=mk, ms=4.5, color=col,
                     label=f"{name.removeprefix(LPP_LABEL + ', ')}: peak {peak:g} activations at M={xs[-1]}")
    ax2.set_title(f"LPP, S={D} stages, G=2 groups of R={D // 2}: the priority rule decides", fontsize=10)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("micro-batches per step M")
        a.legend(fontsize=7.5)
    ax.set_ylabel("bubble fraction (mean over workers)")
    fig.suptitle(f"Bubbles of flushed schedules, b = {cfg.b_over_f:g}·f ({preset} preset)", x=0.01, ha="left",
                 fontsize=11)
    fig.tight_layout()
    csv = "schedule,M,bubble\n" + "".join(f"{n},{m},{b:.6f}\n" for n, pts in rows.items() for m, b in pts)
    notes: dict[str, Any] = {n: dict(p) for n, p in rows.items()}
    notes["LPP closed form (forward-first)"] = closed
    notes["peak_activations"] = {n: dict(p) for n, p in peaks.items()}
    return FigureOutput(fig, cfg, None, tables={"csv": csv}, notes=notes, data=rows)


@register("schedules_memory", "Peak activation memory per worker (in stage activations) for each schedule",
          budget={"tiny": 5, "quick": 3})
def schedules_memory(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_SWEEP, preset)
    D, M = cfg.D, cfg.M_memory
    scheds = _sweep_schedules(D, M, cfg.b_over_f)
    scheds["PipeDream (async, M=1)"] = (pipedream(D, 1, 3 * D), 1.0)
    scheds[f"DDP (W=M={M})"] = (ddp(D, M), 1.0)
    # Activations in units of one full stage's activation (a chunk of 1/V of the model holds 1/V).
    data: dict[str, np.ndarray] = {}
    for name, (s, x) in scheds.items():
        peaks = simulate(s, x, x * cfg.b_over_f, activation_bytes=x).peak_activation_bytes
        assert peaks is not None  # activation_bytes given
        data[name] = peaks
    fig, ax = plt.subplots(figsize=(9.5, 4.0))
    for name, peaks in data.items():
        ax.plot(np.arange(len(peaks)), peaks, marker="o", ms=4, label=f"{name} ({len(peaks)} workers)")
    ax.set_xlabel("worker w")
    ax.set_ylabel("peak activations held (full-stage units)")
    ax.set_yscale("log", base=2)
    ax.set_title(f"Peak activation memory per worker: a model in {D} stages, M={M} ({preset} preset)")
    ax.legend(fontsize=7.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    csv = "schedule,worker,peak\n" + "".join(f"{n},{w},{v:g}\n" for n, p in data.items() for w, v in enumerate(p))
    return FigureOutput(fig, cfg, None, tables={"csv": csv}, notes={n: p.tolist() for n, p in data.items()},
                        data=data)


# ----------------------------------------------------------------------------- staleness
@dataclass(frozen=True)
class StalenessConfig:
    D: int = 8
    steps: int = 40
    M2: int = 8   # micro-batches per update for the 2BW / async M>1 panels


_STALE = {"tiny": StalenessConfig(D=4, steps=16, M2=4), "quick": StalenessConfig(),
          "paper": StalenessConfig(D=16, steps=80, M2=16)}


@register("schedules_staleness", "Version-table staleness per stage: async 1F1B vs PipeOptim's D−k−1, "
          "SpecTrain's round-trip differences, 2BW",
          budget={"tiny": 5, "quick": 3})
def schedules_staleness(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_STALE, preset)
    D, T = cfg.D, cfg.steps
    k = np.arange(D)
    vt1 = simulate(pipedream(D, 1, T)).version_table
    vtm = simulate(pipedream(D, cfg.M2, T)).version_table
    vt2 = simulate(pipedream_2bw(D, cfg.M2, T)).version_table
    steady = slice(D, T - D)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    im = ax.imshow(vt1.staleness("F")[:, :, 0], aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("mini-batch t")
    ax.set_ylabel("stage k")
    ax.set_title("async 1F1B (M=1): forward staleness", fontsize=10)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="updates missed")
    ax = axes[1]
    meas = vt1.staleness("F")[:, steady, 0].mean(axis=1)
    rt_f = vt1.round_trip_difference("F")[:, steady, 0].mean(axis=1)
    rt_b = vt1.round_trip_difference("B")[:, steady, 0].mean(axis=1)
    ax.plot(k, meas, "o", ms=8, mfc="none", label="simulated staleness (F)")
    ax.plot(k, pipeoptim_staleness(D, k), "-", label="PipeOptim s = D−k−1")
    ax.plot(k, rt_f, "s", ms=6, mfc="none", label="simulated round-trip diff. (F)")
    ax.plot(k, spectrain_version_difference(D, k, "F"), "--", label="SpecTrain ⌊k/2⌋+D−k−1")
    ax.plot(k, rt_b, "^", ms=6, mfc="none", label="simulated round-trip diff. (B)")
    ax.plot(k, spectrain_version_difference(D, k, "B"), ":", label="SpecTrain ⌊k/2⌋")
    ax.set_xlabel("stage k")
    ax.set_ylabel("versions (steady state)")
    ax.set_title("derived from the version table vs the papers' presets", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[2]
    sm = vtm.staleness("F")[:, steady, :]
    ax.plot(k, sm.mean(axis=(1, 2)), "o-", label=f"async 1F1B, M={cfg.M2}: mean")
    ax.fill_between(k, sm.min(axis=(1, 2)), sm.max(axis=(1, 2)), alpha=0.2, label="min–max over micro-batches")
    ax.plot(k, vt2.staleness("F")[:, steady, :].mean(axis=(1, 2)), "s-", label=f"2BW, M={cfg.M2} (double buffer)")
    ax.set_xlabel("stage k")
    ax.set_ylabel("forward staleness")
    ax.set_title("one update per M micro-batches", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    notes = {"async_M1_staleness": meas.tolist(), "spectrain_F": rt_f.tolist(), "spectrain_B": rt_b.tolist(),
             "stash_depth": [vt1.stash_depth(int(i)) for i in k],
             "async_M_mean": sm.mean(axis=(1, 2)).tolist(),
             "2bw": vt2.staleness("F")[:, steady, :].mean(axis=(1, 2)).tolist()}
    return FigureOutput(fig, cfg, None, notes=notes, data={"pipedream": vt1, "pipedream_M": vtm, "2bw": vt2})


# ----------------------------------------------------------------------------- Rahimi's Table 1 and bound
@dataclass(frozen=True)
class RahimiConfig:
    S: int = 4
    B: int = 8
    G: int = 2
    Ds: tuple[int, ...] = (2, 3, 4, 6, 8)
    Ms: tuple[int, ...] = (1, 2, 4, 8, 16)


_RAHIMI = {"tiny": RahimiConfig(Ds=(2, 4), Ms=(1, 2, 4)), "quick": RahimiConfig(),
           "paper": RahimiConfig(S=8, B=16, G=4, Ds=(2, 3, 4, 6, 8, 12, 16), Ms=(1, 2, 4, 8, 16, 32))}


#: The priority rules the Rahimi figures build LPP and FSLPP with, the note's first. The note's latency
#: S + B/G − 1 and its identity "LPP with G = 1, R = S is GPipe" hold under GPipe's forward-first order;
#: backward-first (1F1B order, the constructors' default) is drawn beside it because it holds fewer activations.
RAHIMI_PRIORITIES = ("forward_first", "backward_first")


def _short_rule(priority: str) -> str:
    """'forward_first' -> 'forward-first'."""
    return priority.replace("_", "-")


def rahimi_rows(cfg: RahimiConfig) -> list[dict]:
    """Note vs simulation for each Table 1 row (and the PP and LPP variants where the note differs).

    PP is shown in its two orders (1F1B, GPipe); LPP and FSLPP once per rule of :data:`RAHIMI_PRIORITIES`,
    forward-first (the note's) first. Each row: ``case`` (the label, naming the rule), ``scheme``,
    ``priority`` (the rule's name, None for DDP/FSDP/PP), ``params`` (S, B, G, R), ``note`` and ``simulated``
    (dicts over :data:`~pipelab.papers.RAHIMI_COLUMNS`).
    """
    S, B, G = cfg.S, cfg.B, cfg.G
    cases: list[tuple[str, str, Schedule, dict[str, int], str | None]] = [
        ("DDP", "DDP", ddp(S, B), {}, None), ("FSDP (W=B=S)", "FSDP", fsdp(S, S), {"B": S}, None),
        ("FSDP (W=B>S)", "FSDP", fsdp(S, B), {}, None),
        ("PP, 1F1B order", "PP", one_f_one_b(S, B), {}, None), ("PP, GPipe order", "PP", gpipe(S, B), {}, None)]
    looped = [("LPP", lpp, S, "S"), ("LPP", lpp, S // 2, "S/2"), ("FSLPP", fslpp, S // 2, "S/2")]
    for scheme, build, R, r_name in looped:
        for rule in RAHIMI_PRIORITIES:
            cases.append((f"{scheme} G={G}, R={r_name}, {_short_rule(rule)}", scheme,
                          build(S, B, G, R, priority=rule), {"G": G, "R": R}, rule))
    rows = []
    for label, scheme, s, kw, prio in cases:
        args = {"S": S, "B": B, "G": 1, "R": 1} | kw
        rows.append({"case": label, "scheme": scheme, "priority": prio, "params": args,
                     "note": rahimi_row(scheme, S, args["B"], args["G"], args["R"]),
                     "simulated": rahimi_measured_row(simulate(s))})
    return rows


_HEAD = {"W": "W", "latency": "latency", "activation_xmit": "act. xmit", "weight_xmit": "weight xmit",
         "activation_storage": "act. storage", "weight_storage": "weight storage"}


@register("schedules_rahimi_table", "Rahimi's Table 1 next to the simulated values (cells that differ in red); "
          "LPP and FSLPP under the forward-first priority the note assumes and the backward-first one",
          budget={"tiny": 5, "quick": 3})
def schedules_rahimi_table(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_RAHIMI, preset)
    rows = rahimi_rows(cfg)
    cell_text, colours = [], []
    for r in rows:
        line, cl = [], []
        for col in RAHIMI_COLUMNS:
            a, b = r["note"][col], r["simulated"][col]
            line.append(f"{a:g} | {b:g}")
            cl.append("#f4c7c3" if abs(a - b) > 1e-9 else "#d9ead3")
        cell_text.append(line)
        colours.append(cl)
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(rows) + 0.6))
    ax.axis("off")
    tab = ax.table(cellText=cell_text, cellColours=colours, rowLabels=[r["case"] for r in rows],
                   colLabels=[_HEAD[c] for c in RAHIMI_COLUMNS], loc="upper center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(8.5)
    tab.scale(1, 1.35)
    ax.set_title(f"Rahimi's Table 1 (note | simulated), S={cfg.S}, B={cfg.B}; max over workers; latency in F+B "
                 f"units. Green: agrees; red: differs ({preset} preset)\nLPP and FSLPP under two priority rules: "
                 f"{LPP_PRIORITIES['forward_first']} = the note's (LPP with G=1, R=S is GPipe), "
                 f"{LPP_PRIORITIES['backward_first']} = the constructors' default", fontsize=9.5)
    fig.tight_layout()
    buf = io.StringIO()  # case labels hold commas: the csv module quotes them
    writer = csv_module.writer(buf, lineterminator="\n")
    writer.writerow(["case", "priority", "column", "note", "simulated"])
    writer.writerows([r["case"], r["priority"] or "", c, f"{r['note'][c]:g}", f"{r['simulated'][c]:g}"]
                     for r in rows for c in RAHIMI_COLUMNS)
    csv = buf.getvalue()
    notes: dict[str, Any] = {r["case"]: r for r in rows}
    notes["priorities"] = {p: LPP_PRIORITIES[p] for p in RAHIMI_PRIORITIES}
    notes["note_priority"] = "forward_first"
    return FigureOutput(fig, cfg, None, tables={"csv": csv}, notes=notes, data=rows)


def rahimi_table_markdown(rows: Sequence[dict], preset: str) -> str:
    """Markdown bullets for the LPP and FSLPP rows of :func:`rahimi_rows`: under each priority rule, the
    cells that agree with the note and the ones that differ (note vs simulated), and the latency against
    :func:`lpp_latency` — so the notebook's numbers come from the figure's data."""
    lines = []
    for r in rows:
        if r["priority"] is None:
            continue
        p = r["params"]
        same = [_HEAD[c] for c in RAHIMI_COLUMNS if abs(r["note"][c] - r["simulated"][c]) <= 1e-9]
        diff = [f"{_HEAD[c]} {r['note'][c]:g} vs {r['simulated'][c]:g}" for c in RAHIMI_COLUMNS
                if abs(r["note"][c] - r["simulated"][c]) > 1e-9]
        work = (p["S"] // p["R"]) * (p["B"] // p["G"])
        lat = r["simulated"]["latency"]
        if r["priority"] == "forward_first":
            bound = lpp_latency(p["S"], p["B"], p["G"], p["R"])
            why = (f"latency {lat:g} {'=' if abs(lat - bound) < 1e-9 else '≠'} max(S+B/G−1, (S/R)(B/G)+R−1) = "
                   f"{bound:g}" + (f" (a worker's own {work} jobs plus the fill exceed the note's "
                                   f"{r['note']['latency']:g})" if bound > r["note"]["latency"] else ""))
        else:
            why = f"latency {lat:g} (forward-first: {lpp_latency(p['S'], p['B'], p['G'], p['R']):g})"
        lines.append(f"- **{r['case'].rsplit(', ', 1)[0]}**, {LPP_PRIORITIES[r['priority']]}: agrees with the note on "
                     f"{', '.join(same) or 'nothing'}; differs (note vs simulated) on {'; '.join(diff) or 'nothing'}; "
                     f"{why}.")
    p0 = rows[0]["params"]
    return (f"LPP and FSLPP rows (S = {p0['S']}, B = {p0['B']}, `{preset}` preset), generated from the figure's "
            "data:\n\n" + "\n".join(lines) + "\n")


@register("schedules_throughput_bound", "Rahimi's bound: throughput per worker ρ vs peak activations / S over "
          "a grid of schedules, LPP under both priority rules",
          budget={"tiny": 5, "quick": 3})
def schedules_throughput_bound(preset: str, *, progress: bool = False) -> FigureOutput:
    """ρ = S·B/(L·W) against M_peak/S for every schedule of a (D, M) grid; LPP (G ∈ {1, 2}, R ∈ {1, 2, D}) is
    built under each rule of :data:`RAHIMI_PRIORITIES` and drawn as its own series, so the legend names
    the rule. Notes: ``n`` points, ``max_violation`` = max(ρ − M/S), and per series the point count, the
    best and median ρ/(M/S) and how many points attain the bound."""
    cfg = from_preset(_RAHIMI, preset)
    pts: dict[str, list[tuple[float, float]]] = {}
    for D in cfg.Ds:
        for M in cfg.Ms:
            cands = {"GPipe": gpipe(D, M), "1F1B": one_f_one_b(D, M), "naive": naive(D, M), "DDP": ddp(D, M),
                     "FSDP": fsdp(D, M)}
            if D % 2 == 0:
                cands["folded"] = folded(D, M)
                if M % 2 == 0:
                    cands["interleaved"] = interleaved_1f1b(2, D // 2, M)
            for prio in RAHIMI_PRIORITIES:
                for G in (1, 2):
                    for R in sorted({1, 2, D}):
                        if D % R == 0 and M % G == 0:
                            rho, bound = rahimi_throughput(simulate(lpp(D, M, G, R, priority=prio)))
                            pts.setdefault(f"LPP, {LPP_PRIORITIES[prio]}", []).append((bound, rho))
            for name, s in cands.items():
                rho, bound = rahimi_throughput(simulate(s))
                pts.setdefault(name, []).append((bound, rho))
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    allb = np.array([b for p in pts.values() for b, _ in p])
    x = np.linspace(0, max(1.0, allb.max()), 50)
    ax.plot(x, np.minimum(x, 1.0), color="0.3", lw=3, alpha=0.4, label="ρ = min(M/S, 1)")
    markers = iter("osD^v<>ph*")
    worst = 0.0
    series: dict[str, dict[str, float]] = {}
    for name, p in pts.items():
        b, r = np.array(p).T
        worst = max(worst, float((r - b).max()))
        series[name] = {"n": len(p), "best_ratio": float((r / b).max()), "median_ratio": float(np.median(r / b)),
                        "attained": int(np.sum(np.abs(r - b) <= 1e-12))}
        ax.plot(b, r, linestyle="none", marker=next(markers), ms=5, mfc="none", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("peak activations per worker / S  (M/S)")
    ax.set_ylabel("throughput per worker ρ = S·B/(L·W)")
    n = sum(len(p) for p in pts.values())
    ax.set_title(f"ρ ≤ M/S holds in all {n} configurations (max ρ − M/S = {worst:.2g}); LPP under both priority "
                 f"rules ({preset} preset)", fontsize=9)
    ax.legend(fontsize=6.5, ncol=2)
    fig.tight_layout()
    return FigureOutput(fig, cfg, None, notes={"n": n, "max_violation": worst, "series": series,
                                               "priorities": {p: LPP_PRIORITIES[p] for p in RAHIMI_PRIORITIES}},
                        data=pts)


def throughput_bound_markdown(notes: dict[str, Any], preset: str) -> str:
    """One paragraph stating the bound check from :func:`schedules_throughput_bound`'s notes: how many
    configurations, the largest ρ − M/S, and for each LPP priority rule how many of its configurations
    attain ρ = M/S and its median ρ/(M/S)."""
    series = notes["series"]
    tight = [n for n, v in series.items() if v["attained"] and not n.startswith("LPP, ")]
    lpp_txt = "; ".join(f"{name.removeprefix('LPP, ')}, {v['attained']} of {v['n']} configurations (median "
                        f"ρ/(M/S) {v['median_ratio']:.2f})" for name, v in series.items() if name.startswith("LPP, "))
    return (f"Over the grid of schedules and sizes ({notes['n']} configurations under `{preset}`), no configuration "
            f"exceeds the bound (largest ρ − M/S = {notes['max_violation']:.2g}). Among the others, "
            f"{', '.join(tight) if tight else 'none'} attain it in some configurations. LPP attains it under "
            f"{lpp_txt}.\n")
