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

(the paper's B is pipelab's I). The bubble is per worker, from its first to its last pass of a step (the
period of back-to-back steps, :func:`pipelab.simulator.steady_state`); the simulated timeline equals the closed
form (:func:`pipelab.papers.zero_bubble_closed_form`, to 1e-9) for ZB-H1 when T_W ≤ T_F and for ZB-H2 as
max(0, formula). pipelab's per-stage flush (``sync_lag=0``) is the paper's post-validation (§4): no global
synchronisation before the optimizer step, so ZB-H2's steps tile with no bubble.

Example:
    >>> [str(a) for a in zb_h1(D=2, M=2).programs[1]]
    ['F1.0', 'I1.0', 'F1.1', 'I1.1', 'W1.0', 'W1.1', 'U1']

Reference: P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024
(arXiv:2401.10241): §2 (split backward), §2.1 ZB-H1, §2.2 ZB-H2, Figure 3, Table 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .actions import Schedule, check_int, check_jobs, flushed_program, gc_paused, unflushed_program

__all__ = ["split_order", "zb_h1", "zb_h2", "zb_async"]


def split_order(n: int, warm: int, defer: int) -> list[tuple[str, int]]:
    """One worker's ``[(op, j), ...]`` over micro-batches 0..n−1 with a split backward (the module's rule):
    ``warm`` (1..n) forwards before the first I, W_j in the iteration of I_{j+defer} (defer ≥ 0).

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
    progs = tuple(flushed_program(k, split_order(M, warm[k], defer[k]), steps) for k in range(D))
    rule = ("U(k,t) right after worker k's last W of step t; step t+1 at stage k waits for it (per-stage flush, "
            "no global synchronisation)")
    return Schedule(f"{name}(D={D}, M={M})", progs, D, M, steps, tuple((k,) for k in range(D)), 0,
                    "current", rule, params)


@gc_paused
def zb_h1(D: int, M: int, steps: int = 1) -> Schedule:
    """ZB-H1: 1F1B's peak memory, a third of its bubble (Qi et al., ICLR 2024, §2.1 and Figure 3 top).

    :func:`split_order` with warm = D − k, defer = k on worker k, then U(k, t) (flushed per stage). With
    T_W ≤ T_F a worker's span per step is M(T_F+T_I+T_W) + (D−1)(T_F+T_I−T_W) (D−1 at unit costs, 1F1B's
    3(D−1)) and every worker peaks at D resident micro-batches. torch's ``ScheduleInterleavedZeroBubble`` with
    one stage per rank ("ZB1P") builds this order (tested).

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

    :func:`split_order` with warm = 2(D−k)−1 (the forwards that fill the time until worker k's first I can
    arrive), defer = 2k, then U(k, t). A worker's span exceeds M(T_F+T_I+T_W) by max(0, (D−1)(T_F+T_I−2T_W)):
    at equal costs every worker is busy from its first F to its last W (a parallelogram).

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

    PipeDream's order over all n = T·M micro-batches, each B split by :func:`split_order` with warm =
    min(D − k, n) and defer = d_k; U(k, t) right after W(k, t, M−1), no weight barrier (``sync_lag=None``).
    ``defer`` (an int, or one per worker; default d_k = k, ZB-H1's lag, so T = 1 and M ≥ D is ZB-H1's order):

    - d_k = 0: PipeDream with B split in place: the same staleness (D−1−k at stage k's forwards, M = 1) and
      peak memory (D − k); the run takes 3n + 2(D−1) at unit costs instead of 3n + 3(D−1);
    - d_k = k: the later stages fill the ramps, and the run takes 3n + (D−1), the lower bound; the price is
      that every worker holds D micro-batches and every stage's forwards are D − 1 versions stale (M = 1).

    The steady-state throughput is the same for every d_k (one micro-batch per T_F + T_I + T_W per worker).

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
    progs = tuple(unflushed_program(k, split_order(n, min(D - k, n), lags[k]), M, "W") for k in range(D))
    rule = ("U(k,t) right after W(k,t,M−1) on worker k; no flush: W passes deferred by d_k = "
            f"{lags} micro-batches and updates interleave with later forwards")
    return Schedule(f"ZB-async(D={D}, M={M}, T={steps})", progs, D, M, steps,
                    tuple((k,) for k in range(D)), None, "current", rule, {"D": D, "M": M, "defer": tuple(lags)})
