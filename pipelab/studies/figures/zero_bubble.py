"""Figures of the zero-bubble family: Gantt charts with the split backward, bubbles vs M, the memory–bubble
frontier, and what a split backward does to staleness when the pipeline does not flush; and the papers' numbers
beside the simulation (:func:`zero_bubble_table`, :func:`v_shape_table`).

Costs: forward 1, backward 2 split into I = W = 1 (the papers' T_F = T_B = T_W), per *stage*; schedules
that cut the model into 2W chunks on W workers (V-shape, interleaved) run chunks of half the cost and half
the activation, so every schedule trains the same model on W workers.

References: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024); Qi et al., "Pipeline Parallelism with
Controllable Memory" (NeurIPS 2024); DeepSeek-V3 technical report (DualPipe) and torch's ScheduleDualPipeV.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from ...papers import V_SHAPE_FORMULAS, ZB_SCHEDULES, v_shape_bubble, v_shape_memory, zero_bubble_closed_form
from ...schedules import Schedule, pipedream, zb_async
from ...schedules.actions import check_int
from ...schedules.builders import BUILDERS
from ...schedules.compiled import OP_CODE, check_cost
from ...simulator import SimResult, simulate, steady_state
from ..config import from_preset
from . import FigureOutput, register
from .schedules import GanttConfig, _gantt_figure

__all__ = ["FamilyConfig", "family", "ZERO_BUBBLE", "AsyncSplitConfig", "async_variants", "async_split_rows",
           "zero_bubble_table", "v_shape_table"]

#: a builder of (W workers, M micro-batches, steps)
Builder = Callable[[int, int, int], Schedule]

#: Names of the zero-bubble family's synchronous schedules in :func:`family` (the rest are baselines).
ZERO_BUBBLE = ("ZB-H1", "ZB-H2", "ZB-V", "V-Half", "V-Min", "interleaved ZB (V=2)", "DualPipeV",
               "DualPipe (2 weight copies)")


#: label -> (builder name in :data:`~pipelab.schedules.builders.BUILDERS`, chunks V of an interleaved builder or
#: None, stage-cost scale): 1F1B-style baselines and the zero-bubble family; a schedule of 2W half-size chunks on W
#: workers has scale 1/2, so all train the same model
_SCHEDULES: dict[str, tuple[str, int | None, float]] = {
    "GPipe": ("gpipe", None, 1.0), "1F1B": ("1f1b", None, 1.0), "interleaved 1F1B (V=2)": ("interleaved", 2, 0.5),
    "ZB-H1": ("zb_h1", None, 1.0), "ZB-H2": ("zb_h2", None, 1.0), "ZB-V": ("zb_v", None, 0.5),
    "V-Half": ("v_half", None, 0.5), "V-Min": ("v_min", None, 0.5), "interleaved ZB (V=2)": ("interleaved_zb", 2, 0.5),
    "DualPipeV": ("dualpipe_v", None, 0.5), "DualPipe (2 weight copies)": ("dualpipe", None, 1.0),
}


def family() -> dict[str, tuple[Builder, float]]:
    """The schedules compared, label -> (builder of (W, M, steps), stage-cost scale) (:data:`_SCHEDULES`)."""
    def builder(name: str, V: int | None) -> Builder:
        if V is None:
            return lambda w, m, t: BUILDERS[name](w, m, t)
        return lambda w, m, t: BUILDERS[name](w, V, m, t)

    return {label: (builder(name, V), scale) for label, (name, V, scale) in _SCHEDULES.items()}


def _sim(s: Schedule, scale: float) -> SimResult:
    """Unit costs per stage (F 1, B 2 = I 1 + W 1), scaled for chunks; activation bytes in full-stage units."""
    return simulate(s, scale, 2 * scale, i_cost=scale, w_cost=scale, activation_bytes=scale)


# ----------------------------------------------------------------------------- Gantt charts
_GANTT = {"tiny": GanttConfig(D=3, M=6, steps=1), "quick": GanttConfig(D=4, M=8, steps=1),
          "paper": GanttConfig(D=4, M=12, steps=2)}


@register("schedules_zero_bubble", "Gantt charts of the zero-bubble family with the split backward: ZB-H1, "
          "ZB-H2, ZB-V, V-Half, V-Min, interleaved zero bubble, DualPipeV, against 1F1B",
          budget={"tiny": 10, "quick": 10})
def schedules_zero_bubble(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_GANTT, preset)
    W, M, T = cfg.D, cfg.M, cfg.steps
    names = ["1F1B", "ZB-H1", "ZB-H2", "ZB-V", "V-Half", "V-Min", "interleaved ZB (V=2)", "DualPipeV"]
    fam = family()
    entries = [(n, fam[n][0](W, M, T), fam[n][1]) for n in names]
    return _gantt_figure(entries, GanttConfig(W, M, T, b_over_f=2.0), f"Zero-bubble schedules on {W} workers, "
                         f"M={M}: B split into I and W, F = I = W = 1 per stage (2 chunks per worker: half-size)")


# ----------------------------------------------------------------------------- bubbles and the frontier
@dataclass(frozen=True)
class FamilyConfig:
    W: int = 4                         # workers
    Ms: tuple[int, ...] = (4, 8, 12, 16, 24, 32, 48, 64)
    M_frontier: int = 16               # micro-batches per step of the memory–bubble frontier


_FAMILY = {"tiny": FamilyConfig(W=2, Ms=(4, 8, 16), M_frontier=8), "quick": FamilyConfig(),
           "paper": FamilyConfig(W=8, Ms=(8, 16, 24, 32, 48, 64, 96, 128), M_frontier=32)}


@register("schedules_zero_bubble_bubble", "Bubble fraction vs micro-batches per step for the zero-bubble family "
          "and the 1F1B baselines, F = I = W",
          budget={"tiny": 5, "quick": 4})
def schedules_zero_bubble_bubble(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_FAMILY, preset)
    rows: dict[str, list[tuple[int, float]]] = {}
    skipped: dict[str, list[int]] = {}
    for name, (build, scale) in family().items():
        for M in cfg.Ms:
            st = steady_state(build, cfg.W, M, scale=scale)
            if st is None:
                skipped.setdefault(name, []).append(M)
                continue
            rows.setdefault(name, []).append((M, st.bubble))
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.0), sharey=True)
    groups = (("1F1B family and ZB-H1/H2 (one stage per worker)", ("GPipe", "1F1B", "ZB-H1", "ZB-H2")),
              ("two chunks or two weight copies per worker", ("interleaved 1F1B (V=2)", "ZB-V", "V-Half", "V-Min",
                                                              "interleaved ZB (V=2)", "DualPipeV",
                                                              "DualPipe (2 weight copies)")))
    markers = dict(zip(rows, "osD^v<>pPhX"))
    for ax, (title, names) in zip(axes, groups):
        for name in names:
            if name in rows:
                xs, ys = zip(*rows[name])
                ax.plot(xs, ys, marker=markers[name], ms=4, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batches per step M")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("steady-state bubble per step")
    fig.suptitle(f"Bubbles on W={cfg.W} workers, F = I = W = 1 per stage (B = 2), step after step (period = "
                 "makespan(3 steps) − makespan(2))", x=0.01, ha="left", fontsize=10)
    fig.tight_layout()
    csv = "schedule,M,bubble\n" + "".join(f"{n},{m},{b:.6f}\n" for n, pts in rows.items() for m, b in pts)
    return FigureOutput(fig, cfg, None, tables={"csv": csv},
                        notes={"bubble": {n: dict(p) for n, p in rows.items()}, "refused_M": skipped}, data=rows)


@register("schedules_zero_bubble_frontier", "Peak activation memory vs bubble for every synchronous schedule at "
          "one M: the V-schedules' controllable-memory trade-off",
          budget={"tiny": 5, "quick": 3})
def schedules_zero_bubble_frontier(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_FAMILY, preset)
    W, M = cfg.W, cfg.M_frontier
    pts: dict[str, tuple[float, float, float]] = {}
    for name, (build, scale) in family().items():
        st = steady_state(build, W, M, scale=scale)
        if st is not None:
            pts[name] = (st.peak, st.bubble, st.period)
    base = pts["1F1B"][0]
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    for name, (mem, bubble, _) in pts.items():
        ax.scatter(mem / base, bubble, s=40, zorder=3)
        ax.annotate(name, (mem / base, bubble), textcoords="offset points", xytext=(5, 4), fontsize=8)
    # the frontier: schedules no other beats on both axes
    front = sorted((m / base, b) for n, (m, b, _) in pts.items()
                   if not any(m2 <= m and b2 <= b and (m2, b2) != (m, b) for m2, b2, _ in pts.values()))
    ax.step(*zip(*front), where="post", color="0.4", lw=1, ls="--", zorder=1, label="frontier (no schedule is "
            "better on both axes)")
    ax.set_xlabel("peak activation memory of the busiest worker (× 1F1B's)")
    ax.set_ylabel("steady-state bubble per step")
    ax.set_title(f"Memory vs bubble on W={W} workers, M={M}, F = I = W = 1 per stage", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    csv = "schedule,peak_activation_vs_1f1b,bubble,period\n" + "".join(
        f"{n},{m / base:.6f},{b:.6f},{t:g}\n" for n, (m, b, t) in pts.items())
    return FigureOutput(fig, cfg, None, tables={"csv": csv},
                        notes={n: {"peak_activation_vs_1f1b": m / base, "bubble": b} for n, (m, b, _) in pts.items()},
                        data=pts)


# ----------------------------------------------------------------------------- asynchronous split backward
@dataclass(frozen=True)
class AsyncSplitConfig:
    D: int = 8
    steps: int = 48
    latencies: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)  # transfer time per boundary (F = 1)
    gantt_D: int = 4
    gantt_steps: int = 8


_ASYNC = {"tiny": AsyncSplitConfig(D=4, steps=16, latencies=(0.0, 0.5, 1.0), gantt_D=3, gantt_steps=5),
          "quick": AsyncSplitConfig(),
          "paper": AsyncSplitConfig(D=16, steps=96, gantt_D=4, gantt_steps=10)}


def async_variants(D: int, steps: int) -> dict[str, Schedule]:
    """Asynchronous 1F1B (fused B) and its split-backward variant with W right after I (``defer=0``) and
    with ZB-H1's lag (``defer`` = k at stage k, :func:`~pipelab.schedules.zb_async`'s default)."""
    return {"async 1F1B (B fused)": pipedream(D, 1, steps),
            "split, W right after I": zb_async(D, 1, steps, defer=0),
            "split, W deferred k slots": zb_async(D, 1, steps)}


def async_split_rows(D: int, steps: int, latencies: tuple[float, ...] = (0.0,)) -> dict[str, dict[str, list[float]]]:
    """Per variant of :func:`async_variants`, from the version tables in the steady state (mini-batches D to
    steps − D): mean forward and backward staleness per stage, updates between I and W, peak activations per
    stage (no latency), and the time per mini-batch (spacing of stage 0's forwards) at each transfer latency."""
    out: dict[str, dict[str, list[float]]] = {}
    steady = slice(D, steps - D)
    for name, s in async_variants(D, steps).items():
        r = _sim(s, 1.0)
        vt = r.version_table
        assert r.peak_activation_bytes is not None
        times = []
        for lat in latencies:
            f0 = simulate(s, 1.0, 2.0, i_cost=1.0, w_cost=1.0, transfer_cost=lat).version_table.forward_start[0, :, 0]
            times.append(float(np.diff(f0[steady]).mean()))
        out[name] = {
            "forward_staleness": vt.staleness("F")[:, steady, 0].mean(axis=1).tolist(),
            "backward_staleness": vt.staleness("B")[:, steady, 0].mean(axis=1).tolist(),
            "i_to_w_updates": (vt.weight_pass - vt.backward)[:, steady, 0].mean(axis=1).tolist(),
            "peak_activations": r.peak_activation_bytes.tolist(),
            "time_per_minibatch": times,
        }
    return out


@register("schedules_async_split", "What a split backward does to asynchronous 1F1B: staleness and memory per "
          "stage from the version tables, and time per mini-batch against transfer latency",
          budget={"tiny": 5, "quick": 3})
def schedules_async_split(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_ASYNC, preset)
    D = cfg.D
    rows = async_split_rows(D, cfg.steps, cfg.latencies)
    k = np.arange(D)
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.0))
    styles = dict(zip(rows, (("o", "C0"), ("s", "C1"), ("^", "C2"))))
    for name, r in rows.items():
        marker, color = styles[name]
        axes[0].plot(k, r["forward_staleness"], marker=marker, color=color, ms=5, mfc="none", label=f"{name}: F")
        axes[0].plot(k, r["backward_staleness"], marker=marker, color=color, ms=4, ls=":", label=f"{name}: B / I")
        axes[1].plot(k, r["peak_activations"], marker=marker, color=color, ms=5, label=name)
        axes[2].plot(cfg.latencies, r["time_per_minibatch"], marker=marker, color=color, ms=5, label=name)
    axes[0].set_title("staleness (updates missed), steady state", fontsize=10)
    axes[0].set_xlabel("stage k")
    axes[0].legend(fontsize=6.5)
    axes[1].set_title("peak activations held per stage", fontsize=10)
    axes[1].set_xlabel("stage k")
    axes[1].legend(fontsize=7)
    axes[2].set_title("time per mini-batch, steady state", fontsize=10)
    axes[2].set_xlabel("transfer time per stage boundary (F = 1)")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"Asynchronous 1F1B vs its split-backward variants, D={D}, M=1, {cfg.steps} mini-batches, "
                 "F = I = W = 1 (vanilla versions: current at F and at I; W reuses I's)", x=0.01, ha="left",
                 fontsize=10)
    fig.tight_layout()
    csv = "schedule,stage,forward_staleness,backward_staleness,i_to_w_updates,peak_activations\n" + "".join(
        f"{n},{kk},{r['forward_staleness'][kk]:.4f},{r['backward_staleness'][kk]:.4f},{r['i_to_w_updates'][kk]:.4f},"
        f"{r['peak_activations'][kk]:g}\n" for n, r in rows.items() for kk in range(D))
    times = "schedule,transfer_time,time_per_minibatch\n" + "".join(
        f"{n},{lat:g},{t:.4f}\n" for n, r in rows.items() for lat, t in zip(cfg.latencies, r["time_per_minibatch"]))
    return FigureOutput(fig, cfg, None, tables={"csv": csv, "times.csv": times}, notes=rows, data=rows)


@register("schedules_async_split_gantt", "Gantt charts of asynchronous 1F1B and its split-backward variant with "
          "the weight version every job uses",
          budget={"tiny": 5, "quick": 5})
def schedules_async_split_gantt(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset(_ASYNC, preset)
    D, T = cfg.gantt_D, cfg.gantt_steps
    entries = [(f"{name}, M=1 (versions current at F and at I)", s) for name, s in async_variants(D, T).items()]
    return _gantt_figure(entries, GanttConfig(D, 1, T, T, b_over_f=2.0), "No flush, one update per mini-batch; "
                         "vN = the job uses weight version $W^{(N)}$ (vanilla: current at F and at I; W reuses I's)",
                         versions=True)


# ------------------------------------------------------------------------------ the papers beside the simulation
def zero_bubble_table(D_values: Sequence[int], M_values: Sequence[int] | None = None, *, t_f: float = 1.0,
                      t_i: float = 1.0, t_w: float = 1.0) -> list[dict[str, Any]]:
    """Table 1 of the zero-bubble paper, pipelab's simulation beside the paper's closed form.

    For every D, M (M ≥ D) and schedule of :data:`~pipelab.papers.ZB_SCHEDULES`, the schedule is simulated with
    f_cost = T_F, b_cost = T_I + T_W (1F1B's fused B), i_cost = T_I, w_cost = T_W (default all 1):

    - ``bubble``: the paper's bubble per step, measured: the period of back-to-back steps minus one step's
      work, P − M(T_F+T_I+T_W), with P = makespan(3 steps) − makespan(2 steps) (equal, for these schedules,
      to the longest span of one worker within a step minus its work);
    - ``bubble_fraction``: bubble / P (the paper's "bubble rate"); ``paper_bubble_fraction`` likewise from
      the closed form (``paper_bubble`` / (``paper_bubble`` + M(T_F+T_I+T_W)));
    - ``one_step_bubble_fraction``: :attr:`SimResult.bubble` of a single flushed step (includes the fill
      skew of the parallelogram, D−1, that back-to-back steps overlap);
    - ``peak_activations`` / ``paper_peak``: the most micro-batches resident on any worker.

    A schedule that cannot be built for (D, M) (ZB-H2 with M < 2D − 1) gets ``None`` numbers and a ``note``.

    Args:
        D_values: pipeline depths; M_values: micro-batches per step (default: D, 2D, 3D for each D).
        t_f, t_i, t_w: per-stage costs of F, I and W (finite, > 0).

    Returns:
        One dict per (schedule, D, M) with keys schedule, D, M, bubble, paper_bubble, bubble_fraction,
        paper_bubble_fraction, one_step_bubble_fraction, peak_activations, paper_peak, note.

    Example:
        >>> [(r["schedule"], r["bubble"], r["paper_bubble"]) for r in zero_bubble_table([4], [8])]
        [('1F1B', 9.0, 9.0), ('ZB-H1', 3.0, 3.0), ('ZB-H2', 0.0, 0.0)]

    Reference: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Table 1 and §2.
    """
    builders = {"1F1B": BUILDERS["1f1b"], "ZB-H1": BUILDERS["zb_h1"], "ZB-H2": BUILDERS["zb_h2"]}
    t_f, t_i, t_w = (check_cost(n, v, positive=True) for n, v in (("t_f", t_f), ("t_i", t_i), ("t_w", t_w)))
    work = t_f + t_i + t_w
    rows = []
    for D in D_values:
        D = check_int("D", D)
        for M in (M_values if M_values is not None else (D, 2 * D, 3 * D)):
            M = check_int("M", M)
            if M < D:
                continue
            for name in ZB_SCHEDULES:
                paper_bubble, paper_peak = zero_bubble_closed_form(name, D, t_f, t_i, t_w)
                row: dict[str, Any] = {"schedule": name, "D": D, "M": M, "paper_bubble": paper_bubble,
                                       "paper_bubble_fraction": paper_bubble / (paper_bubble + M * work),
                                       "paper_peak": paper_peak, "note": ""}
                try:
                    builders[name](D, M)
                except ValueError as e:
                    row.update(bubble=None, bubble_fraction=None, one_step_bubble_fraction=None,
                               peak_activations=None, note=str(e).split(":")[0])
                    rows.append(row)
                    continue
                st = steady_state(builders[name], D, M, t_f=t_f, t_i=t_i, t_w=t_w)
                assert st is not None  # built above
                one = simulate(builders[name](D, M, 1), t_f, t_i + t_w, i_cost=t_i, w_cost=t_w)
                row.update(bubble=st.period - M * work, bubble_fraction=st.bubble,
                           one_step_bubble_fraction=one.bubble, peak_activations=int(one.peak_activations.max()))
                rows.append(row)
    return rows


def v_shape_table(W_values: Iterable[int], M_values: Iterable[int], V: int = 2) -> list[dict[str, Any]]:
    """Simulated bubble and peak activation memory of the V-shape family beside the papers' numbers.

    For every W in ``W_values`` and M in ``M_values`` (sizes a builder refuses are skipped) simulates
    1F1B (W stages, fused B of cost 2), ZB-V, V-Half, V-Min, DualPipeV, interleaved ZB with ``V`` chunks
    and DualPipe (W stages, each on two workers)
    at f_cost = 1, b_cost = 2, i_cost = w_cost = 1 (T_F = T_I = T_W) and reports

    - ``bubble``: the papers' rate 1 − busy/span of the longest worker span (first start to last end);
    - ``bubble_makespan``: :attr:`SimResult.bubble` (idle share of the common makespan, mean over workers);
    - ``idle``: longest worker span − busiest worker's compute, in units of T_F;
    - ``peak_memory``: the simulator's peak activation memory of the worst worker, in micro-batches of a
      full worker's layers (``activation_bytes`` = 1/chunks per worker), under the simulator's memory
      model (the papers hold an activation from F to its W);
    - ``paper_bubble``, ``paper_memory``, ``exact``, ``source``: :func:`~pipelab.papers.v_shape_bubble`,
      :func:`~pipelab.papers.v_shape_memory` and :data:`~pipelab.papers.V_SHAPE_FORMULAS`.

    Example:
        >>> rows = v_shape_table([2], [8])
        >>> [(r["schedule"], round(r["bubble"], 3), r["paper_bubble"]) for r in rows][:2]
        [('1f1b', 0.111, 0.1111111111111111), ('zb_v', 0.0, 0.0)]
    """
    V = check_int("V", V)
    rows: list[dict[str, Any]] = []
    for W in W_values:
        for M in M_values:
            W, M = check_int("W", W), check_int("M", M)
            cases: list[tuple[str, Any, float, int]] = [("1f1b", lambda W=W, M=M: BUILDERS["1f1b"](W, M), 1.0, 1)]
            cases += [(n, lambda b=BUILDERS[n], W=W, M=M: b(W, M), 0.5, 2)
                      for n in ("zb_v", "v_half", "v_min", "dualpipe_v")]
            cases.append(("interleaved_zb", lambda W=W, M=M: BUILDERS["interleaved_zb"](W, V, M), 1 / V, V))
            cases.append(("dualpipe", lambda W=W, M=M: BUILDERS["dualpipe"](W, M), 1.0, 2))
            for name, build, act, chunks in cases:
                try:
                    s = build()
                except ValueError:
                    continue
                r = simulate(s, 1.0, 2.0, i_cost=1.0, w_cost=1.0, activation_bytes=act)
                span, busy = _longest_span(r), float(r.busy.max())
                peak = r.peak_activation_bytes
                rows.append({
                    "schedule": name, "W": W, "D": s.D, "M": M, "bubble": 1.0 - busy / span,
                    "bubble_makespan": r.bubble, "idle": span - busy,
                    "peak_memory": None if peak is None else float(peak.max()),
                    "paper_bubble": v_shape_bubble(name, W, M, chunks),
                    "paper_memory": v_shape_memory(name, W, chunks),
                    "exact": V_SHAPE_FORMULAS[name][2], "source": V_SHAPE_FORMULAS[name][3],
                })
    return rows


def _longest_span(r: Any) -> float:
    """Longest worker span of a simulated schedule: a worker's last compute end − its first compute start."""
    c = r.compiled
    spans = []
    for w in range(r.schedule.W):
        m = (c.worker == w) & (c.op != OP_CODE["U"])
        if m.any():
            spans.append(float(r.end[m].max() - r.start[m].min()))
    return max(spans)
