"""The zero-bubble papers' numbers beside pipelab's simulation: bubble and peak activation memory.

:func:`steady_state` measures a flushed schedule run step after step (the next step's fill overlaps the
previous step's drain, as in training): the period of a step is makespan(3 steps) − makespan(2 steps) and
the bubble 1 − (work per worker per step) / period. :func:`zero_bubble_table` sets it beside Table 1 of Qi
et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024); :func:`v_shape_table` sets the V-shape family
(Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024), DualPipeV and DualPipe beside
their papers' formulas. The closed forms live with the builders (:func:`~pipelab.schedules.zero_bubble.
paper_closed_form`, :func:`~pipelab.schedules.v_shape.paper_bubble`, :func:`~pipelab.schedules.v_shape.
paper_memory`); this module, one layer up, measures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ..schedules.actions import Schedule, check_int
from ..schedules.builders import one_f_one_b
from ..schedules.compiled import OP_CODE, check_cost
from ..schedules.v_shape import (
    PAPER_FORMULAS,
    V_BUILDERS,
    dualpipe,
    interleaved_zero_bubble,
    paper_bubble,
    paper_memory,
)
from ..schedules.zero_bubble import ZB_SCHEDULES, paper_closed_form, zb_h1, zb_h2
from ..simulator import simulate

__all__ = ["SteadyState", "steady_state", "zero_bubble_table", "v_shape_table"]


class SteadyState(NamedTuple):
    """A flushed schedule step after step: bubble fraction per step, peak activations of the busiest worker
    (in units of ``activation``), and the period of one step."""

    bubble: float
    peak: float
    period: float


def steady_state(build: Callable[[int, int, int], Schedule], W: int, M: int, *, t_f: float = 1.0,
                 t_i: float = 1.0, t_w: float = 1.0, scale: float = 1.0, activation: float | None = None
                 ) -> SteadyState | None:
    """Measure ``build(W, M, steps)`` run step after step, or ``None`` where the builder refuses the size.

    Costs per stage: F = ``t_f``, I = ``t_i``, W = ``t_w`` (a fused B: ``t_i + t_w``), all times ``scale`` (a
    schedule of 2W half-size chunks on W workers: 0.5); activation size per stage ``activation`` (default
    ``scale``). period = makespan(3 steps) − makespan(2 steps); bubble = 1 − (work per worker per step) /
    period, the work averaged over the workers.

    Raises:
        ValueError: a cost or ``scale`` that is NaN, ±inf or not > 0 (the simulator's F, I and W costs), an
            ``activation`` that is NaN, ±inf or negative. TypeError: one of them not a number.

    Example:
        >>> from pipelab.schedules import zb_h2
        >>> steady_state(zb_h2, 4, 8)
        SteadyState(bubble=0.0, peak=7.0, period=24.0)
    """
    t_f, t_i, t_w, scale = (check_cost(n, v, positive=True) for n, v in (("t_f", t_f), ("t_i", t_i), ("t_w", t_w),
                                                                           ("scale", scale)))
    if activation is not None:
        activation = check_cost("activation", activation)
    try:
        two, three = build(W, M, 2), build(W, M, 3)
    except ValueError:
        return None
    act = scale if activation is None else activation
    r2, r3 = (simulate(s, t_f * scale, (t_i + t_w) * scale, i_cost=t_i * scale, w_cost=t_w * scale,
                       activation_bytes=act) for s in (two, three))
    period = r3.makespan - r2.makespan
    c = r3.compiled
    work = float(r3.cost[(c.step == 0) & (c.op != OP_CODE["U"])].sum()) / W
    assert r3.peak_activation_bytes is not None  # activation_bytes given
    return SteadyState(1.0 - work / period, float(r3.peak_activation_bytes.max()), period)


def zero_bubble_table(D_values: Sequence[int], M_values: Sequence[int] | None = None, *, t_f: float = 1.0,
                      t_i: float = 1.0, t_w: float = 1.0) -> list[dict[str, Any]]:
    """Table 1 of the zero-bubble paper, pipelab's simulation beside the paper's closed form.

    For every D, M (M ≥ D) and schedule of :data:`ZB_SCHEDULES`, the schedule is simulated with
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
    builders = {"1F1B": one_f_one_b, "ZB-H1": zb_h1, "ZB-H2": zb_h2}
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
                paper_bubble, paper_peak = paper_closed_form(name, D, t_f, t_i, t_w)
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
    - ``paper_bubble``, ``paper_memory``, ``exact``, ``source``: :func:`paper_bubble`,
      :func:`paper_memory` and :data:`PAPER_FORMULAS`.

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
            cases: list[tuple[str, Any, float, int]] = [("1f1b", lambda W=W, M=M: one_f_one_b(W, M), 1.0, 1)]
            cases += [(n, lambda b=V_BUILDERS[n], W=W, M=M: b(W, M), 0.5, 2)
                      for n in ("zb_v", "v_half", "v_min", "dualpipe_v")]
            cases.append(("interleaved_zero_bubble", lambda W=W, M=M: interleaved_zero_bubble(W, V, M), 1 / V, V))
            cases.append(("dualpipe", lambda W=W, M=M: dualpipe(W, M), 1.0, 2))
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
                    "paper_bubble": paper_bubble(name, W, M, chunks),
                    "paper_memory": paper_memory(name, W, chunks),
                    "exact": PAPER_FORMULAS[name][2], "source": PAPER_FORMULAS[name][3],
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
