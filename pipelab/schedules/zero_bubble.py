"""Zero-bubble schedules with a split backward: ZB-H1, ZB-H2 and a no-flush (asynchronous) variant.

The backward of stage k on micro-batch g is split into I(k, g) (gradient of the stage input: on the
critical path, it is what stage k−1 waits for) and W(k, g) (gradient of the stage weights: nobody waits for
it but the update, so it may be deferred to fill idle slots). All three builders share one order rule,
written once in :func:`split_order`. Worker k, over n micro-batches, with ``warm`` warm-up forwards and a
W lag ``defer``:

    F_0 … F_{warm−1};   then for j = 0..n−1:  I_j,  W_{j−defer} (if j ≥ defer),  F_{j+warm} (if < n);
    then the remaining W passes in order.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), §2.1–2.2 and Figure 3, with p = D workers:

=============  ======================  =======================  ==============================================
schedule       warm-up forwards (k)    W lag (k)                bubble per step; peak activations
=============  ======================  =======================  ==============================================
1F1B           min(D − k, M)           (fused B)                (p−1)(T_F+T_B+T_W); p
``zb_h1``      D − k                   k                        (p−1)(T_F+T_B−T_W); p
``zb_h2``      2(D − k) − 1            2k                       (p−1)(T_F+T_B−2T_W), 0 when equal; 2p−1
``zb_async``   D − k (never flushed)   k (``defer``)            no flush; see :func:`zb_async`
=============  ======================  =======================  ==============================================

(the paper's B is pipelab's I). ZB-H1 keeps 1F1B's peak of p micro-batches (each worker's deferred W
passes use the memory 1F1B leaves free on later workers; every worker now peaks at p) and its bubble is a
third of 1F1B's when T_F = T_I = T_W. ZB-H2 starts 2p−1 forwards on worker 0 to fill the bubble before the
first I and defers the tail's W passes, turning the trapezoid into a parallelogram: every worker's span is
exactly M(T_F+T_I+T_W) and, with the per-stage flush of pipelab's ``sync_lag=0`` (the paper's
post-validation: no global synchronisation before the optimizer step, §4), consecutive steps tile with
no bubble at all.

The paper's bubble is per worker, from its first to its last pass of a step (the period of back-to-back
steps, :func:`pipelab.simulator.steady_state`); measured on the simulated timeline it equals the closed form
(:func:`pipelab.papers.zero_bubble_closed_form`, to 1e-9) for ZB-H1 when T_W ≤ T_F and for ZB-H2 as
max(0, formula), which covers T_F = T_I = T_W.

Example:
    >>> [str(a) for a in zb_h1(D=2, M=2).programs[1]]
    ['F1.0', 'I1.0', 'F1.1', 'I1.1', 'W1.0', 'W1.1', 'U1']

Reference: P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024
(arXiv:2401.10241): §2 (split backward), §2.1 ZB-H1, §2.2 ZB-H2, Figure 3, Table 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .actions import Action, Schedule, check_int, check_jobs, gc_paused

__all__ = ["split_order", "zb_h1", "zb_h2", "zb_async"]


def split_order(n: int, warm: int, defer: int) -> list[tuple[str, int]]:
    """One worker's order over micro-batches 0..n−1 with a split backward (the rule of the module docstring).

    Args:
        n: micro-batches on this worker (M for one flushed step, T·M for a run that is never flushed).
        warm: forwards before the first I, 1 ≤ warm ≤ n.
        defer: how many I passes run before the first W (W_j runs in the iteration of I_{j+defer}); ≥ 0.

    Returns:
        ``[(op, j), ...]`` with op in "F", "I", "W": each micro-batch's F, I and W exactly once, F_j before I_j
        before W_j, forwards and W passes in micro-batch order.

    Example:
        >>> split_order(3, warm=2, defer=1)
        [('F', 0), ('F', 1), ('I', 0), ('F', 2), ('I', 1), ('W', 0), ('I', 2), ('W', 1), ('W', 2)]
    """
    n = check_int("n", n)
    warm = check_int("warm", warm)
    defer = check_int("defer", defer, 0)
    if warm > n:
        raise ValueError(f"warm must be <= n (warm={warm}, n={n})")
    order = [("F", j) for j in range(warm)]
    next_f, next_w = warm, 0
    for j in range(n):
        order.append(("I", j))
        if j >= defer:
            order.append(("W", next_w))
            next_w += 1
        if next_f < n:
            order.append(("F", next_f))
            next_f += 1
    order += [("W", j) for j in range(next_w, n)]
    return order


def _flushed(name: str, D: int, M: int, steps: int, warm: Sequence[int], defer: Sequence[int],
             params: dict[str, Any]) -> Schedule:
    """Repeat one step's :func:`split_order` per worker, U(k, t) after worker k's last W of step t."""
    check_jobs(f"{name}(D={D}, M={M}, steps={steps})", 3 * D * M * steps)
    progs = []
    for k in range(D):
        one = split_order(M, warm[k], defer[k])
        p: list[Action] = []
        for t in range(steps):
            p += [Action(op, k, t, j) for op, j in one]
            p.append(Action("U", k, t, -1))
        progs.append(tuple(p))
    rule = ("U(k,t) right after worker k's last W of step t; step t+1 at stage k waits for it (per-stage flush, "
            "no global synchronisation)")
    return Schedule(f"{name}(D={D}, M={M})", tuple(progs), D, M, steps, tuple((k,) for k in range(D)), 0,
                    "current", rule, params)


@gc_paused
def zb_h1(D: int, M: int, steps: int = 1) -> Schedule:
    """ZB-H1: 1F1B's peak memory, a third of its bubble (Qi et al., ICLR 2024, §2.1 and Figure 3 top).

    Worker k runs D − k warm-up forwards (1F1B's D − k − 1 plus the first forward of its steady state), then
    I, W, F per micro-batch, where its first k W passes are deferred: W_j runs after I_{j+k}, and the k
    W passes left over run at the end of the step (:func:`split_order` with warm = D − k, defer = k). Then
    U(k, t); steps repeat the same program (flushed per stage, ``sync_lag=0``).

    Under T_F, T_I, T_W with T_W ≤ T_F, every worker's span per step is M(T_F+T_I+T_W) + (D−1)(T_F+T_I−T_W)
    (the paper's bubble, D−1 when all are 1, against 1F1B's 3(D−1)) and every worker peaks at D resident
    micro-batches, 1F1B's peak. This is the order torch's ``ScheduleInterleavedZeroBubble`` builds with one
    stage per rank (its "ZB1P"; tested).

    Raises:
        ValueError: if M < D (worker 0's D warm-up forwards need D micro-batches).

    Example:
        >>> [" ".join(str(a) for a in p) for p in zb_h1(D=2, M=3).programs]
        ['F0.0 F0.1 I0.0 W0.0 F0.2 I0.1 W0.1 I0.2 W0.2 U0', 'F1.0 I1.0 F1.1 I1.1 W1.0 F1.2 I1.2 W1.1 W1.2 U1']
    """
    D, M, steps = check_int("D", D), check_int("M", M), check_int("steps", steps)
    if M < D:
        raise ValueError(f"zb_h1 needs M >= D micro-batches per step (M={M}, D={D}): worker 0 starts D forwards "
                         "before its first I")
    return _flushed("ZB-H1", D, M, steps, [D - k for k in range(D)], list(range(D)), {"D": D, "M": M})


@gc_paused
def zb_h2(D: int, M: int, steps: int = 1) -> Schedule:
    """ZB-H2: zero bubble for 2D−1 resident micro-batches (Qi et al., ICLR 2024, §2.2 and Figure 3 bottom).

    Worker k runs 2(D − k) − 1 warm-up forwards (filling the time until its first I can arrive, 2D−1−k
    after it starts), then I, W, F per micro-batch with its first 2k W passes deferred (W_j after I_{j+2k});
    the deferred W passes run at the end of the step (:func:`split_order` with warm = 2(D−k)−1,
    defer = 2k). Then U(k, t); steps repeat the same program (flushed per stage, ``sync_lag=0``).

    With T_F = T_I = T_W every worker is busy without a gap from its first F to its last W (a
    parallelogram, span exactly M(T_F+T_I+T_W)), so back-to-back steps have no bubble; in general the span
    exceeds M(T_F+T_I+T_W) by max(0, (D−1)(T_F+T_I−2T_W)). Every worker peaks at 2D−1 resident
    micro-batches.

    Raises:
        ValueError: if M < 2D − 1: worker 0's first I cannot start before 2D − 1 forward/input-gradient
            passes have crossed the pipeline, and it has only M forwards to fill that time.

    Example:
        >>> [" ".join(str(a) for a in p) for p in zb_h2(D=2, M=3).programs]
        ['F0.0 F0.1 F0.2 I0.0 W0.0 I0.1 W0.1 I0.2 W0.2 U0', 'F1.0 I1.0 F1.1 I1.1 F1.2 I1.2 W1.0 W1.1 W1.2 U1']
    """
    D, M, steps = check_int("D", D), check_int("M", M), check_int("steps", steps)
    if M < 2 * D - 1:
        raise ValueError(f"zb_h2 needs M >= 2D-1 micro-batches per step (M={M}, D={D}, 2D-1={2 * D - 1}): worker 0 "
                         "runs 2D-1 forwards before its first I; use zb_h1 for fewer")
    return _flushed("ZB-H2", D, M, steps, [2 * (D - k) - 1 for k in range(D)], [2 * k for k in range(D)],
                    {"D": D, "M": M})


@gc_paused
def zb_async(D: int, M: int = 1, steps: int = 8, defer: int | Sequence[int] | None = None) -> Schedule:
    """Asynchronous 1F1B with a split backward: I on the critical path, W deferred, never flushed.

    PipeDream's order (:func:`~pipelab.schedules.builders.pipedream`: D − k micro-batches in flight at
    stage k, over all n = T·M micro-batches of the run) with each B split into I and W by
    :func:`split_order` with warm = min(D − k, n) and defer = ``defer[k]``: worker k runs

        F_0 … F_{D−k−1};  then for g = 0..n−1:  I_g,  W_{g−d_k} (if g ≥ d_k),  F_{g+D−k};  then the rest of W,

    and applies U(k, t) right after W(k, t, M−1) (no weight barrier, ``sync_lag=None``), so W passes and
    updates interleave with the forwards of later mini-batches. Which version each F, I and W uses is read
    off the simulated timeline by the version table, not computed here.

    ``defer`` (d_k ≥ 0; an int for every worker or one per worker; default d_k = k, ZB-H1's lag):

    - d_k = 0 is PipeDream with B split in place (F, I, W): the same steady state, the same staleness
      (D−1−k at stage k's forwards for M = 1) and peak memory (D − k), and only the fill/drain gets shorter:
      the run takes 3n + 2(D−1) with unit costs instead of PipeDream's 3n + 3(D−1);
    - d_k = k (default) fills the slots d_k = 0 leaves idle at the start and the end: the later stages run
      F, I pairs while the first input gradients travel back, and their W passes run in the drain. The run
      then takes 3n + (D−1) with unit costs, the lower bound (stage D−1 cannot start before D−1 forwards
      and has 3n of work). It is the default because it is the split's whole gain in the makespan; the
      price is memory and staleness: every worker holds D micro-batches (W keeps the activations, see
      :mod:`pipelab.simulator`), and as W and the update lag k more micro-batches, forwards at every stage
      are D − 1 versions stale (M = 1) instead of D − 1 − k. The steady-state throughput is the same for
      every d_k (one micro-batch per T_F + T_I + T_W per worker).

    With T = 1 and M ≥ D it is :func:`zb_h1`'s order (same rule and lag), without the barrier.

    Raises:
        ValueError: bad sizes, or a ``defer`` entry that is negative or not one per worker.

    Example:
        >>> [" ".join(str(a) for a in p) for p in zb_async(D=2, M=1, steps=2).programs]
        ['F0.0 F0.0 I0.0 W0.0 U0 I0.0 W0.0 U0', 'F1.0 I1.0 F1.0 I1.0 W1.0 U1 W1.0 U1']
    """
    D, M, steps = check_int("D", D), check_int("M", M), check_int("steps", steps)
    if defer is None:
        lags = list(range(D))
    elif isinstance(defer, Sequence):
        if len(defer) != D:
            raise ValueError(f"defer must be an int or one int per worker (D={D}), got {len(defer)} values")
        lags = [check_int(f"defer[{k}]", d, 0) for k, d in enumerate(defer)]
    else:
        lags = [check_int("defer", defer, 0)] * D
    n = steps * M
    check_jobs(f"zb_async(D={D}, M={M}, steps={steps})", 3 * D * n)
    progs = []
    for k in range(D):
        p: list[Action] = []
        for op, g in split_order(n, min(D - k, n), lags[k]):
            t, j = divmod(g, M)
            p.append(Action(op, k, t, j))
            if op == "W" and j == M - 1:
                p.append(Action("U", k, t, -1))
        progs.append(tuple(p))
    rule = ("U(k,t) right after W(k,t,M−1) on worker k; no flush: W passes deferred by d_k = "
            f"{lags} micro-batches and updates interleave with later forwards")
    return Schedule(f"ZB-async(D={D}, M={M}, T={steps})", tuple(progs), D, M, steps,
                    tuple((k,) for k in range(D)), None, "current", rule, {"D": D, "M": M, "defer": tuple(lags)})
