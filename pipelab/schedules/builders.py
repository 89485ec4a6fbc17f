"""Named schedule builders: every schedule of the seed papers as a :class:`Schedule` value.

``naive``, ``gpipe``, ``one_f_one_b``, ``pipedream`` and ``hybrid`` write their order in closed form (fast for long
runs; tests check they equal the general constructor with the matching placement, priority and admission); the
others are presets over :func:`~pipelab.schedules.constructor.construct`. The split-backward builders live in
:mod:`~pipelab.schedules.zero_bubble` and :mod:`~pipelab.schedules.v_shape`; :data:`BUILDERS` registers every one.

Example:
    >>> from pipelab.schedules import pipedream
    >>> [str(a) for a in pipedream(D=3, M=1, steps=3).programs[1]]
    ['F1.0', 'F1.0', 'B1.0', 'U1', 'F1.0', 'B1.0', 'U1', 'B1.0', 'U1']

References: GPipe (Huang et al. 2019); PipeDream (Narayanan et al., SOSP 2019; PipeOptim, arXiv:2312.00839,
Fig. 1); PipeDream-2BW and PipeDream-Flush (Narayanan et al., ICML 2021); DAPPLE (Fan et al. 2021); Megatron-LM
interleaved 1F1B (Narayanan et al., SC 2021); A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets"
(2025) for DDP, FSDP, LPP, FSLPP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .actions import Action, Schedule, check_flag, check_int, check_jobs, flushed_program, gc_paused, unflushed_program
from .compiled import Cost
from .constructor import construct
from .v_shape import dualpipe, dualpipe_v, interleaved_zero_bubble, v_half, v_min, zb_v
from .zero_bubble import zb_async, zb_h1, zb_h2

__all__ = ["naive", "gpipe", "one_f_one_b", "pipedream", "pipedream_2bw", "interleaved_1f1b", "folded",
           "ddp", "fsdp", "lpp", "fslpp", "lpp_hash", "hybrid", "BUILDERS"]

_FLUSH = "U(k,t) right after worker k's last backward of step t; step t+1 starts after it (flush)"


def _one_stage_holders(D: int) -> tuple[tuple[int, ...], ...]:
    return tuple((k,) for k in range(D))


def _flushed(name: str, D: int, M: int, steps: int, one_step: Callable[[int], list[tuple[str, int]]]) -> Schedule:
    """A flushed schedule of D workers, worker k running ``one_step(k)``'s ``(op, j)`` order every step, then U."""
    progs = tuple(flushed_program(k, one_step(k), steps) for k in range(D))
    return Schedule(f"{name}(D={D}, M={M})", progs, D, M, steps, _one_stage_holders(D), 0, "current", _FLUSH,
                    {"D": D, "M": M})


@gc_paused
def naive(D: int, M: int = 1, steps: int = 1) -> Schedule:
    """Naive model parallelism: one micro-batch in the whole pipeline at a time (PipeOptim Fig. 1(c)).

    Order on worker k: F(k,j), B(k,j) for j = 0..M−1, then U(k,t). Latency per step M·2D in unit costs.

    Example:
        >>> [str(a) for a in naive(2, 1).programs[1]]
        ['F1.0', 'B1.0', 'U1']
    """
    D, M, steps = check_int("D", D), check_int("M", M), check_int("steps", steps)
    check_jobs(f"naive(D={D}, M={M}, steps={steps})", 2 * D * M * steps)
    return _flushed("naive", D, M, steps, lambda k: [(op, j) for j in range(M) for op in ("F", "B")])


@gc_paused
def gpipe(D: int, M: int, steps: int = 1) -> Schedule:
    """GPipe: all M forwards of the step, then all M backwards, then the update (flushed).

    Makespan (f = b = 1): 2(M + D − 1) per step; Rahimi's latency (F+B of a stage = 1 unit): M + D − 1.

    Example:
        >>> [str(a) for a in gpipe(2, 2).programs[1]]
        ['F1.0', 'F1.1', 'B1.0', 'B1.1', 'U1']
    """
    D, M, steps = check_int("D", D), check_int("M", M), check_int("steps", steps)
    check_jobs(f"gpipe(D={D}, M={M}, steps={steps})", 2 * D * M * steps)
    return _flushed("GPipe", D, M, steps, lambda k: [(op, j) for op in ("F", "B") for j in range(M)])


def _one_f_one_b_order(warm: int, n: int) -> list[tuple[str, int]]:
    """The 1F1B order over n micro-batches: min(warm, n) warm-up F, then F/B pairs, then the cool-down B."""
    warm = min(warm, n)
    order = [("F", j) for j in range(warm)]
    for j in range(n - warm):
        order += [("F", warm + j), ("B", j)]
    order += [("B", j) for j in range(n - warm, n)]
    return order


@gc_paused
def one_f_one_b(D: int, M: int, steps: int = 1) -> Schedule:
    """Synchronous 1F1B (PipeDream-Flush / DAPPLE): D−k micro-batches in flight at stage k, flush per step.

    Order on worker k per step: min(D−k−1, M) warm-up forwards, then (F, B) pairs, then the remaining
    backwards, then U(k, t). Same makespan as GPipe, peak activations min(D−k, M) instead of M.

    Example:
        >>> [str(a) for a in one_f_one_b(2, 3).programs[0]]
        ['F0.0', 'F0.1', 'B0.0', 'F0.2', 'B0.1', 'B0.2', 'U0']
    """
    D, M, steps = check_int("D", D), check_int("M", M), check_int("steps", steps)
    check_jobs(f"one_f_one_b(D={D}, M={M}, steps={steps})", 2 * D * M * steps)
    return _flushed("1F1B", D, M, steps, lambda k: _one_f_one_b_order(D - k - 1, M))


@gc_paused
def pipedream(D: int, M: int = 1, steps: int = 8, *, name: str = "PipeDream",
              weight_rule: str = "current") -> Schedule:
    """Asynchronous 1F1B (PipeDream): never flushed, one update per mini-batch of M micro-batches.

    Worker k runs the 1F1B order over all T·M micro-batches (D−k in flight) and applies U(k, t) right after
    B(k, t, M−1). With M = 1 this is classic PipeDream: in steady state the forward of a mini-batch at stage
    k sees D−1−k fewer updates than its own update is applied to (PipeOptim's s = D−k−1) and weight
    stashing keeps D−k versions.

    Example:
        >>> [str(a) for a in pipedream(2, 1, steps=2).programs[0]]
        ['F0.0', 'F0.0', 'B0.0', 'U0', 'B0.0', 'U0']
    """
    D, M, steps = check_int("D", D), check_int("M", M), check_int("steps", steps)
    check_jobs(f"{name}(D={D}, M={M}, steps={steps})", 2 * D * M * steps)
    progs = tuple(unflushed_program(k, _one_f_one_b_order(D - k - 1, steps * M), M, "B") for k in range(D))
    rule = "U(k,t) right after B(k,t,M−1) on worker k; no flush, later micro-batches keep flowing"
    return Schedule(f"{name}(D={D}, M={M}, T={steps})", progs, D, M, steps, _one_stage_holders(D),
                    None, weight_rule, rule, {"D": D, "M": M})


def pipedream_2bw(D: int, M: int, steps: int = 8) -> Schedule:
    """PipeDream-2BW: asynchronous 1F1B with M ≥ D micro-batches per update and double-buffered weights.

    Same order as :func:`pipedream`. The 2BW rule (Narayanan et al., ICML 2021, §3.1),
    W^(t+1) = W^(t) − ν·∇f(W^(t−1)) at every stage, is ``weight_rule="double_buffer"``: the version table
    gives step t the version the input stage had when step t entered the pipeline, t − 1 whenever M ≥ D
    (tested), read off the simulated timeline.

    Raises:
        ValueError: if M < D (two buffers are then not enough).

    Example:
        >>> from pipelab.simulator import simulate
        >>> vt = simulate(pipedream_2bw(D=2, M=2, steps=3)).version_table
        >>> vt.used("F")[:, :, 0].tolist()        # stages × steps: version t−1 at every stage
        [[0, 0, 1], [0, 0, 1]]
    """
    D, M = check_int("D", D), check_int("M", M)
    if M < D:
        raise ValueError(f"pipedream_2bw needs M >= D micro-batches per update (M={M}, D={D}); with fewer, "
                         "more than two weight versions are in flight")
    s = pipedream(D, M, steps, name="2BW", weight_rule="double_buffer")
    rule = ("U(k,t) right after B(k,t,M−1); all micro-batches of step t use version t−1 at every stage "
            "(double buffer)")
    return Schedule(s.name, s.programs, D, M, s.steps, s.weight_holders, None, "double_buffer", rule, s.params)


@gc_paused
def interleaved_1f1b(W: int, V: int, M: int, steps: int = 1) -> Schedule:
    """Interleaved 1F1B (Megatron-LM): V chunks per worker, stage s = c·W + w on worker w = s mod W.

    Worker w runs min(2(W−w−1) + (V−1)W, M·V) warm-up forwards, then (F, B) pairs, then the remaining
    backwards; the i-th forward is chunk (i // W) mod V, the i-th backward chunk V−1−((i // W) mod V), both of
    micro-batch (i // (W·V))·W + i mod W. Flushed per step.

    Raises:
        ValueError: if M is not a multiple of W (Megatron's requirement) or V < 1.

    Example:
        >>> s = interleaved_1f1b(W=2, V=2, M=2)
        >>> s.D, [str(a) for a in s.programs[1]][:4]
        (4, ['F1.0', 'F1.1', 'F3.0', 'B3.0'])
    """
    W, V, M, steps = (check_int(n, v) for n, v in (("W", W), ("V", V), ("M", M), ("steps", steps)))
    check_jobs(f"interleaved_1f1b(W={W}, V={V}, M={M}, steps={steps})", 2 * V * W * M * steps)
    if M % W:
        raise ValueError(f"interleaved_1f1b needs M divisible by W (M={M}, W={W})")
    D = V * W
    progs = []
    for w in range(W):
        order = _one_f_one_b_order(2 * (W - w - 1) + (V - 1) * W, M * V)
        chunks = [(i // W) % V if op == "F" else V - 1 - (i // W) % V for op, i in order]
        p = []
        for t in range(steps):
            p += [Action(op, c * W + w, t, (i // (W * V)) * W + i % W, c) for (op, i), c in zip(order, chunks)]
            p += [Action("U", c * W + w, t, -1, c) for c in range(V)]
        progs.append(tuple(p))
    return Schedule(f"interleaved 1F1B(W={W}, V={V}, M={M})", tuple(progs), D, M, steps,
                    tuple((s % W,) for s in range(D)), 0, "current", _FLUSH, {"W": W, "V": V, "M": M})


def folded(D: int, M: int, steps: int = 1, *, max_in_flight: int | None = None, b_over_f: float = 2.0) -> Schedule:
    """Folded pipeline: W = D/2 workers, worker i holds stages i and D−1−i (a V-shaped placement).

    Greedy backward-first order (the constructor orders jobs assuming b = ``b_over_f``·f), flushed per
    step; ``max_in_flight`` bounds micro-batches resident per worker (None: unbounded — the backward-first
    priority alone keeps the peak bounded independently of M).

    Raises:
        ValueError: if D is odd.
    """
    D, M = check_int("D", D, 2), check_int("M", M)
    if D % 2:
        raise ValueError(f"folded needs an even number of stages D, got {D}")
    W = D // 2
    return construct(D, M, W, compute=lambda s, b, d: min(s, D - 1 - s), priority="backward_first",
                     max_in_flight=max_in_flight, steps=steps, chunk=lambda s, w: int(s >= W), b_cost=b_over_f,
                     name=f"folded(D={D}, M={M})", update_rule=_FLUSH, params={"D": D, "M": M})


def _dp_workers(M: int, W: int | None, name: str) -> int:
    W = M if W is None else check_int("W", W)
    if M % W:
        raise ValueError(f"{name} needs M divisible by W so every worker gets M/W micro-batches (M={M}, W={W})")
    return W


def ddp(D: int, M: int, W: int | None = None, steps: int = 1) -> Schedule:
    """Distributed data parallel, Rahimi's w(s,b,d) = (b, b): micro-batch b runs all stages on worker b mod W.

    Every worker holds all weights and runs every U(k, t) after the all-reduce (all B(k,·) of the step).
    Makespan (f = b = 1, W = M): 2D; Rahimi's latency D.
    """
    D, M = check_int("D", D), check_int("M", M)
    W = _dp_workers(M, W, "ddp")
    return construct(D, M, W, compute=lambda s, b, d: b % W, weights=lambda s: tuple(range(W)),
                     priority="backward_first", steps=steps, name=f"DDP(D={D}, M={M}, W={W})",
                     update_rule="every worker applies U(k,t) after the all-reduce of step t's B(k,·) (flush)",
                     params={"D": D, "M": M, "W": W})


def fsdp(D: int, M: int, W: int | None = None, steps: int = 1) -> Schedule:
    """Fully sharded data parallel, w(s,b,d) = (s, b): compute as DDP, stage s's weights live on worker s mod W.

    The owner applies U(s, t); the other workers fetch stage s's weights before computing it.
    """
    D, M = check_int("D", D), check_int("M", M)
    W = _dp_workers(M, W, "fsdp")
    return construct(D, M, W, compute=lambda s, b, d: b % W, weights=lambda s: s % W,
                     priority="backward_first", steps=steps, name=f"FSDP(D={D}, M={M}, W={W})",
                     update_rule="the owner s mod W applies U(s,t) after the reduce-scatter of step t (flush)",
                     params={"D": D, "M": M, "W": W})


def lpp_hash(s: int, b: int, G: int, R: int) -> int:
    """Rahimi's LPP hash h(s, b) = (R·b mod W) + (s mod R) with W = G·R.

    Example:
        >>> [lpp_hash(s, 0, G=1, R=4) for s in range(4)], [lpp_hash(0, b, G=4, R=1) for b in range(4)]
        ([0, 1, 2, 3], [0, 1, 2, 3])
    """
    return (R * b) % (G * R) + s % R


def _looped(name: str, D: int, M: int, G: int, R: int, steps: int, weights: Callable[[int, int, int], Any],
            priority: str, costs: tuple[Cost, Cost, Cost], rule: str) -> Schedule:
    """LPP's compute placement h(s, b) with the weight placement ``weights(s, G, R)`` (``lpp``, ``fslpp``)."""
    D, M, G, R = (check_int(n, v) for n, v in (("D", D), ("M", M), ("G", G), ("R", R)))
    if D % R:
        raise ValueError(f"{name.lower()} needs D divisible by R so each worker holds D/R stages (D={D}, R={R})")
    if M % G:
        raise ValueError(f"{name.lower()} needs M divisible by G so groups get equal micro-batches (M={M}, G={G})")
    order = "" if priority == "backward_first" else f", {priority}"
    return construct(D, M, G * R, compute=lambda s, b, d: lpp_hash(s, b, G, R), weights=lambda s: weights(s, G, R),
                     priority=priority, steps=steps, chunk=lambda s, w: s // R,
                     name=f"{name}(D={D}, M={M}, G={G}, R={R}){order}", f_cost=costs[0], b_cost=costs[1],
                     u_cost=costs[2], update_rule=rule, params={"D": D, "M": M, "G": G, "R": R})


def lpp(D: int, M: int, G: int, R: int, steps: int = 1, *, priority: str = "backward_first", f_cost: Cost = 1.0,
        b_cost: Cost = 1.0, u_cost: Cost = 0.0) -> Schedule:
    """Looped pipeline parallelism: W = G·R workers in G groups of R, w(s,b,d) = (h(s,b), h(s,b)).

    Micro-batch b goes to group b mod G; within it stage s runs on worker s mod R (D/R stages each, looped).
    Each group keeps its own copy of the weights; all copies apply U(s, t) after the step (flush).
    G = 1, R = D is GPipe's placement; G = M, R = 1 is DDP's.

    ``priority`` (:data:`~pipelab.schedules.constructor.PRIORITIES`): ``"backward_first"`` (1F1B's order) or
    ``"forward_first"`` (GPipe's; G = 1, R = D is then GPipe). Under ``"forward_first"`` the latency in F+B units
    of one stage is max(S + B/G − 1, (S/R)(B/G) + R − 1), Rahimi's Table 1 value or a worker's own jobs plus the
    fill when longer (exact when B/G ≤ R or R divides B/G; tested). ``f_cost``, ``b_cost``, ``u_cost``: the
    costs the constructor orders at (:func:`~pipelab.schedules.constructor.construct`); pass those the schedule
    will run with.
    """
    return _looped("LPP", D, M, G, R, steps, lambda s, G, R: tuple(g * R + s % R for g in range(G)), priority,
                   (f_cost, b_cost, u_cost), "every group's copy applies U(s,t) after the all-reduce of step t (flush)")


def fslpp(D: int, M: int, G: int, R: int, steps: int = 1, *, priority: str = "backward_first", f_cost: Cost = 1.0,
          b_cost: Cost = 1.0, u_cost: Cost = 0.0) -> Schedule:
    """Fully sharded LPP: compute as :func:`lpp`, stage s's weights only on worker h(s, s).

    w(s,b,d) = (h(s,s), h(s,b)); the owner applies U(s, t), the others fetch stage s's weights. ``priority``
    and the ordering costs as in :func:`lpp` (same compute placement, so the same timeline).
    """
    return _looped("FSLPP", D, M, G, R, steps, lambda s, G, R: lpp_hash(s, s, G, R), priority, (f_cost, b_cost, u_cost),
                   "the owner h(s,s) applies U(s,t) after the reduce of step t (flush)")


@gc_paused
def hybrid(D: int, M: int, R: int, steps: int = 1, *, asynchronous: bool = False) -> Schedule:
    """Hybrid pipeline × data parallelism: R replicas of a D-stage pipeline, W = D·R workers.

    Stage k of replica r on worker r·D + k; micro-batch j of a step goes to replica j mod R. Every holder of
    stage k applies U(k, t) after the all-reduce of all M gradients of the step, so the replicas share versions.
    Synchronous (default): :func:`one_f_one_b`'s order per replica, flushed, plain mini-batch training's update
    (Narayanan et al., SC 2021); ``asynchronous=True``: :func:`pipedream`'s order, never flushed (PipeDream's
    replicated stages, Narayanan et al., SOSP 2019, §3.1).

    Raises:
        ValueError: if M is not a multiple of R. TypeError: ``asynchronous`` not a bool.

    Example:
        >>> s = hybrid(D=2, M=4, R=2)
        >>> s.W, s.weight_holders, [str(a) for a in s.programs[2]]
        (4, ((0, 2), (1, 3)), ['F0.1', 'F0.3', 'B0.1', 'B0.3', 'U0'])
    """
    D, M, R, steps = (check_int(n, v) for n, v in (("D", D), ("M", M), ("R", R), ("steps", steps)))
    asynchronous = check_flag("asynchronous", asynchronous)
    if M % R:
        raise ValueError(f"hybrid needs M divisible by R so every replica gets M/R micro-batches (M={M}, R={R})")
    check_jobs(f"hybrid(D={D}, M={M}, R={R}, steps={steps})", 2 * D * M * steps)
    Mr = M // R
    progs: list[tuple[Action, ...]] = []
    for r in range(R):  # replica r's micro-batch i of a step is the step's micro-batch i·R + r
        for k in range(D):
            if asynchronous:
                order = _one_f_one_b_order(D - k - 1, steps * Mr)
                progs.append(unflushed_program(k, order, Mr, "B", R, r))
            else:
                order = _one_f_one_b_order(D - k - 1, Mr)
                progs.append(flushed_program(k, [(op, i * R + r) for op, i in order], steps))
    holders = tuple(tuple(r * D + k for r in range(R)) for k in range(D))
    kind = "async " if asynchronous else ""
    rule = ("every replica applies U(k,t) after the all-reduce of step t's B(k,·) "
            + ("and right after its own last B(k,t,·); no flush" if asynchronous else "(flush)"))
    return Schedule(f"hybrid {kind}PP×DP(D={D}, M={M}, R={R})", tuple(progs), D, M, steps, holders,
                    None if asynchronous else 0, "current", rule,
                    {"D": D, "M": M, "R": R, "asynchronous": asynchronous})


#: Builder name → callable, for figures and sweeps.
BUILDERS: dict[str, Callable[..., Schedule]] = {
    "naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "pipedream": pipedream, "2bw": pipedream_2bw,
    "interleaved": interleaved_1f1b, "folded": folded, "ddp": ddp, "fsdp": fsdp, "lpp": lpp, "fslpp": fslpp,
    "hybrid": hybrid,
    # the zero-bubble family with a split backward (schedules/zero_bubble.py and schedules/v_shape.py)
    "zb_h1": zb_h1, "zb_h2": zb_h2, "zb_async": zb_async, "zb_v": zb_v, "v_half": v_half, "v_min": v_min,
    "interleaved_zb": interleaved_zero_bubble, "dualpipe_v": dualpipe_v, "dualpipe": dualpipe,
}
