"""Measured vs simulated: what a real run holds and sends, and how long it takes, against the simulator's forecast.

The multi-process runtime (:class:`~pipelab.runtime.PipelineRuntime`, ``record=True``) against
:func:`pipelab.simulator.simulate` on the same schedule.

**Memory and transfers** (:func:`compare_memory`), per rank w, in bytes:

==================  ===================================================  =====================================
quantity            measured (``RuntimeResult``)                         simulated
==================  ===================================================  =====================================
weight versions     ``memory["weight_versions"]``: peak versions held     Σ_k stash_depth(k) · weight_bytes[k]
                    × one copy of the stage's weights                    (:meth:`VersionTable.stash_depth`),
                                                                         exact for the policies that keep
                                                                         exactly the versions their jobs use
activations         ``memory["activations"]``: peak bytes of stage        ``peak_activation_bytes[w]`` with
                    inputs saved for a backward                          ``activation_bytes`` = stage inputs
optimizer state     ``memory["optimizer_state"]`` at the end             slots · weight_bytes (SGD momentum 1,
                                                                         Adam family 2, ...): an estimate,
                                                                         within 8 bytes per parameter tensor
                                                                         (scalar step counters)
sent / received     ``timeline.sent`` / ``timeline.received`` by kind     transfers (:func:`simulated_traffic`)
                                                                         × the boundary tensor's bytes, exact
==================  ===================================================  =====================================

``weight_bytes[k]``: stage k's trainable parameters (frozen ones are held once, never versioned, stepped or sent).

A *placed* schedule (DDP, FSDP, LPP, FSLPP, DualPipe, hybrid PP × DP: :mod:`pipelab.pipeline.placement`) gets
five more rows per rank, all exact (weight versions and optimizer state then count the stages the rank
*holds*):

============================  ==========================================  ==========================================
quantity                      measured                                    simulated
============================  ==========================================  ==========================================
fetched weights               ``memory["fetched_weights"]``               Σ stash_depth(k) · weight_bytes[k] over
                                                                          the stages it computes without holding
weights received (broadcast)  ``collectives["bytes_received"]``           Σ_k weight_fetch_table[w, k] ·
                                                                          weight_bytes[k]
weights sent (broadcast)      ``collectives["bytes_sent"]``               the owner: every other worker's fetches
                                                                          of its stages × their bytes
gradients sent / received     reduce + all-reduce bytes                   :func:`simulated_collectives`
============================  ==========================================  ==========================================

Rahimi's Table 1 (:attr:`SimResult.weight_transfers`) charges one weight fetch per F job of a stage the worker
does not hold, the runtime one per (stage, version, worker) (:attr:`SimResult.weight_fetches`, compared here); they
agree when a worker runs at most one micro-batch of the stage per step. Activations agree exactly (a worker's
program order fixes which are resident at each job) when ``activation_bytes`` are the stage *input* bytes
(:func:`pipelab.links.boundary_bytes`).

References: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), Table 1 (latency,
activation memory, weight transfers); PipeDream (Narayanan et al., SOSP 2019, §3.1: profile, then plan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .links import boundary_bytes
from .pipeline.placement import Collective, is_placed
from .precision import tensor_bytes
from .schedules.actions import Schedule
from .schedules.compiled import OP_CODE
from .simulator import SimResult, simulate

__all__ = ["simulated_traffic", "simulated_collectives", "optimizer_state_slots", "compare_memory",
           "EXACT_VERSION_POLICIES"]

_F, _B, _I = OP_CODE["F"], OP_CODE["B"], OP_CODE["I"]

#: policies whose stages keep exactly the weight versions their jobs use, as the version table counts them
#: (flushed: one; weight stashing: the forward's version until its backward; 2BW: double buffering)
EXACT_VERSION_POLICIES = ("sequential", "gpipe", "1f1b", "stashing", "2bw")


def simulated_traffic(sim: SimResult, sizes: Sequence[int]) -> list[dict[str, dict[str, int]]]:
    """Bytes each worker sends and receives over point-to-point, by kind, as the simulator counts transfers.

    An activation into F(k, g) from another worker costs ``sizes[k]``, a gradient into B(k, g) or I(k, g)
    ``sizes[k+1]`` (:attr:`SimResult.activation_transfers`, ``gradient_transfers``, split by stage). Returns per
    worker ``{"sent": {"activation": n, "gradient": m}, "received": {...}}``.
    """
    c, W, D = sim.compiled, sim.schedule.W, sim.schedule.D
    if len(sizes) != D:
        raise ValueError(f"sizes must have one entry per stage (D={D}), got {len(sizes)}")
    out = [{"sent": {"activation": 0, "gradient": 0}, "received": {"activation": 0, "gradient": 0}}
           for _ in range(W)]
    dep = {"activation": (c.op == _F, c.dep1, 0), "gradient": ((c.op == _B) | (c.op == _I), c.dep2, 1)}
    for kind, (is_op, src, shift) in dep.items():
        m = is_op & (src >= 0)
        ids = np.flatnonzero(m)
        ids = ids[c.worker[src[ids]] != c.worker[ids]]
        for i in ids.tolist():
            n = int(sizes[int(c.stage[i]) + shift])
            out[int(c.worker[i])]["received"][kind] += n
            out[int(c.worker[src[i]])]["sent"][kind] += n
    return out


def optimizer_state_slots(optimizer: torch.optim.Optimizer) -> int | None:
    """Weight-sized state tensors ``optimizer`` keeps per parameter once it has stepped (``None``: unknown).

    SGD: 1 with momentum, else 0; Adam, AdamW, NAdam, RAdam, Adamax: 2 (3 with AMSGrad); RMSprop: 1, +1
    with momentum, +1 centered; Adagrad, Muon: 1. Scalar step counters are not counted.
    """
    name = type(optimizer).__name__
    g = optimizer.param_groups[0] if optimizer.param_groups else {}
    if name == "SGD":
        return 1 if g.get("momentum", 0) else 0
    if name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
        return 3 if g.get("amsgrad", False) else 2
    if name == "RMSprop":
        return 1 + bool(g.get("momentum", 0)) + bool(g.get("centered", False))
    if name in ("Adagrad", "Muon"):
        return 1
    return None


def compare_memory(results: Sequence[Any], schedule: Schedule, stages: Sequence[nn.Module], x: Tensor, *,
                   policy: str, optimizer: Callable[[Any], torch.optim.Optimizer] | None = None
                   ) -> list[dict[str, Any]]:
    """Each rank's measured bytes against the simulator's figures for the same schedule and sizes.

    Args:
        results: every rank's :class:`~pipelab.runtime.RuntimeResult` from a run with ``record=True``.
        x: one micro-batch input of stage 0 (for the boundary sizes).
        policy: its name (the weight-version row is exact for :data:`EXACT_VERSION_POLICIES`).
        optimizer: the run's factory, for the optimizer-state estimate (``None``: not compared).

    Returns:
        the module docstring's rows per rank, ``{"rank", "quantity", "measured", "simulated", "exact",
        "tolerance", "ok", "note"}``: ``exact`` rows require equality, others ``|measured − simulated| ≤
        tolerance`` (``simulated`` ``None``: reported only).

    Raises:
        ValueError: results for a different number of ranks than the schedule's workers, or without a timeline.
    """
    if len(results) != schedule.W:
        raise ValueError(f"results must hold one RuntimeResult per rank ({schedule.W}), got {len(results)}")
    if any(getattr(r, "timeline", None) is None for r in results):
        raise ValueError("results have no timeline: run the PipelineRuntime with record=True")
    sizes = boundary_bytes(stages, x)
    # only trainable parameters are versioned, stepped and sent (frozen ones are held once, in the module)
    trainable = [[p for p in s.parameters() if p.requires_grad] for s in stages]
    weight_bytes = [tensor_bytes(ps) for ps in trainable]
    sim = simulate(schedule, activation_bytes=sizes, weight_bytes=weight_bytes)
    depth = [sim.version_table.stash_depth(k) for k in range(schedule.D)]
    traffic = simulated_traffic(sim, sizes)
    act_peak = sim.peak_activation_bytes
    assert act_peak is not None  # activation_bytes were given
    slots = [_stage_slots(s, optimizer) for s in stages]
    n_tensors = [len(ps) for ps in trainable]
    placed = is_placed(schedule)
    collectives = simulated_collectives(sim, weight_bytes) if placed else []
    exact = policy in EXACT_VERSION_POLICIES  # otherwise the versions held are not those the jobs use
    rows: list[dict[str, Any]] = []
    for w, res in enumerate(results):
        # a placed schedule's rank keeps versions and optimizer state only for the stages it holds
        mine = [k for k, h in enumerate(schedule.weight_holders) if w in h] if placed else sorted(res.stages)
        rows.append(_versions_row(w, res, [depth[k] * weight_bytes[k] for k in mine], policy, exact))
        rows.append(_row(w, "activations", res.memory["activations"], int(act_peak[w]), True, None,
                         "peak saved stage inputs"))
        rows.append(_optimizer_row(w, res, mine, slots, weight_bytes, n_tensors))
        rows += [_row(w, q, getattr(res.timeline, f"bytes_{q}"), sum(traffic[w][q].values()), True, None,
                      "transfers × boundary bytes") for q in ("sent", "received")]
        if placed:
            rows += _placed_rows(w, res, sim, depth, weight_bytes, collectives[w], exact)
    return rows


def _stage_slots(stage: nn.Module, optimizer: Callable[[Any], torch.optim.Optimizer] | None) -> int | None:
    """The weight-sized slots the run's optimizer keeps for ``stage`` (``None``: unknown, or no optimizer)."""
    if optimizer is None:
        return None
    params = [p for p in stage.parameters() if p.requires_grad]
    return optimizer_state_slots(optimizer(params)) if params else 0


def _versions_row(w: int, res: Any, versions: list[int], policy: str, exact: bool) -> dict[str, Any]:
    """Rank ``w``'s weight-version row (``versions``: the simulated bytes per stage, counted when ``exact``)."""
    return _row(w, "weight versions", res.memory["weight_versions"], sum(versions) if exact else None, exact,
                None if exact else 0.0,
                "stash depth × stage weights" if exact else
                f"policy {policy!r} keeps other versions than its jobs use (predictions, buffers): not counted")


def _optimizer_row(w: int, res: Any, mine: list[int], slots: list[int | None], weight_bytes: list[int],
                   n_tensors: list[int]) -> dict[str, Any]:
    """Rank ``w``'s optimizer state against slots × the weights of its stages ``mine`` (± 8 bytes per tensor)."""
    if any(slots[k] is None for k in mine):
        return _row(w, "optimizer state", res.memory["optimizer_state"], None, False, None,
                    "optimizer state of this type is not estimated")
    return _row(w, "optimizer state", res.memory["optimizer_state"],
                sum(int(slots[k] or 0) * weight_bytes[k] for k in mine), False, 8.0 * sum(n_tensors[k] for k in mine),
                "estimate: state slots × stage weights (± 8 bytes per parameter tensor: step counters)")


def _row(rank: int, quantity: str, measured: int, simulated: int | None, exact: bool, tol: float | None,
         note: str) -> dict[str, Any]:
    """One row of :func:`compare_memory`; ``ok`` is equality when exact, else within ``tol``."""
    if simulated is None:
        ok = True
    elif exact:
        ok = measured == simulated
    else:
        ok = tol is not None and abs(measured - simulated) <= tol
    return {"rank": rank, "quantity": quantity, "measured": int(measured),
            "simulated": None if simulated is None else int(simulated), "exact": exact, "tolerance": tol,
            "ok": ok, "note": note}


def _placed_rows(w: int, res: Any, sim: SimResult, depth: list[int], weight_bytes: list[int],
                 collectives: dict[str, dict[str, int]], exact: bool) -> list[dict[str, Any]]:
    """A placed schedule's rows of rank ``w``: fetched weights, broadcasts and reductions."""
    D, holders, fetch = sim.schedule.D, sim.schedule.weight_holders, sim.weight_fetch_table
    fetched = [k for k in sorted(res.stages) if w not in holders[k]]
    got = res.collectives or {"bytes_sent": {}, "bytes_received": {}}
    rows = [_row(w, "fetched weights", res.memory.get("fetched_weights", 0),
                 sum(depth[k] * weight_bytes[k] for k in fetched) if exact else None, exact, None if exact else 0.0,
                 "stash depth × weights of the stages computed without holding them"),
            _row(w, "weights received (broadcast)", got["bytes_received"].get("broadcast", 0),
                 sum(int(fetch[w, k]) * weight_bytes[k] for k in range(D)), True, None,
                 f"{int(fetch[w].sum())} fetches, one per (stage, version) (weight_fetches; Rahimi's per-F-job "
                 f"weight_transfers: {int(sim.weight_transfers[w])}) × stage weights"),
            _row(w, "weights sent (broadcast)", got["bytes_sent"].get("broadcast", 0),
                 sum(int(fetch[:, k].sum()) * weight_bytes[k] for k in range(D) if holders[k][0] == w), True,
                 None, "the owner sends each fetched version once per receiver (weight_fetches of the others)")]
    for q in ("sent", "received"):
        rows.append(_row(w, f"gradients {q} (reduce, all-reduce)",
                         sum(v for kind, v in got[f"bytes_{q}"].items() if kind != "broadcast"),
                         sum(v for kind, v in collectives[f"bytes_{q}"].items() if kind != "broadcast"), True, None,
                         "per step and stage: holders ∪ computing workers reduce the stage's gradient"))
    return rows


def simulated_collectives(sim: SimResult, weight_bytes: Sequence[int], bucket_bytes: int | None = None
                          ) -> list[dict[str, dict[str, int]]]:
    """Bytes and calls each worker's collectives move in a placed schedule, by kind, counted from the simulation.

    Per step t and stage k, among k's holders H_k and the workers that ran a B (or W) of (k, t): a ``reduce``
    onto a single holder, else an ``all_reduce`` of the stage's weight bytes; each version a non-holder uses
    (:attr:`SimResult.weight_fetch_table`) is a ``broadcast`` from H_k[0]. Bytes follow
    :func:`pipelab.pipeline.placement.collective_bytes`; all-reduces fused into one bucket
    (:func:`~pipelab.pipeline.placement.bucket_parts` under ``bucket_bytes``) count one call. Returns the
    runtime's :attr:`~pipelab.runtime.RuntimeResult.collectives` format, per worker.
    """
    from .pipeline.placement import collective_bytes

    s, c = sim.schedule, sim.compiled
    if len(weight_bytes) != s.D:
        raise ValueError(f"weight_bytes must have one entry per stage (D={s.D}), got {len(weight_bytes)}")
    out: list[dict[str, dict[str, int]]] = [{"bytes_sent": {}, "bytes_received": {}, "calls": {}}
                                            for _ in range(s.W)]

    def add(w: int, kind: str, sent: int, got: int) -> None:
        for key, n in (("bytes_sent", sent), ("bytes_received", got), ("calls", 1)):
            out[w][key][kind] = out[w][key].get(kind, 0) + n

    computed: dict[tuple[int, int], set[int]] = {}
    for i in np.flatnonzero((c.op == _B) | (c.op == OP_CODE["W"])).tolist():
        computed.setdefault((int(c.stage[i]), int(c.step[i])), set()).add(int(c.worker[i]))
    for k in range(s.D):
        hs = tuple(s.weight_holders[k])
        for t in range(s.steps):
            members = sorted(set(hs) | computed.get((k, t), set()))
            if len(members) < 2:
                continue
            kind = "reduce" if len(hs) == 1 else "all_reduce"
            for w in members:
                add(w, kind, *collective_bytes(kind, int(weight_bytes[k]), len(members), w == hs[0]))
    if any("all_reduce" in o["calls"] for o in out):
        from .pipeline.placement import bucket_parts, placed_sequence

        for e in placed_sequence(sim):  # the runs of fusable all-reduces do not depend on the fetches
            if isinstance(e, Collective) and e.bucket and \
                    bucket_parts(e, lambda k: int(weight_bytes[k]), bucket_bytes)[0] != (e.stage, e.step):
                for w in e.members:
                    out[w]["calls"]["all_reduce"] -= 1
    receivers: dict[tuple[int, int], set[int]] = {}
    for w, k, v in sim.weight_fetch_versions:
        receivers.setdefault((k, v), set()).add(w)
    for (k, _), got in receivers.items():
        owner, n = s.weight_holders[k][0], int(weight_bytes[k])
        add(owner, "broadcast", *collective_bytes("broadcast", n, len(got) + 1, True))
        for w in got:
            add(w, "broadcast", *collective_bytes("broadcast", n, len(got) + 1, False))
    return out
