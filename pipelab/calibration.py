"""Measured vs simulated: what a real run holds and sends, and how long it takes, against the simulator's forecast.

Two comparisons of the multi-process runtime (:class:`~pipelab.runtime.PipelineRuntime`, ``record=True``)
with :func:`pipelab.simulator.simulate` on the same schedule:

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

The simulator's activation *count* holds (k, g) from the start of F(k, g) to the end of its backward, and
the runtime holds the stage input from the end of F to the start of B; within one worker the program order
fixes which activations are resident at each job, so the peaks agree exactly. The simulator's
``activation_bytes`` must then be the stage *input* bytes (:func:`boundary_bytes`), what the runtime
counts, not :func:`pipelab.profiling.profile_stages`' saved-tensor bytes.

**Makespan** (:func:`calibrate`): profile every stage's F, B (I, W when the schedule splits the backward) and
U on the machine at hand, inside the ranks that will run the schedule (so that they share the cores as they
will during the run), and the one-way transfer of a boundary tensor between ranks; simulate the schedule
with those costs; run it with the trace; report ``forecast / measured − 1`` for the makespan, per schedule.

References: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), Table 1 (latency,
activation memory, weight transfers); PipeDream (Narayanan et al., SOSP 2019, §3.1: profile, then plan).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .schedules.actions import Schedule
from .schedules.compiled import OP_CODE
from .simulator import SimResult, simulate

__all__ = ["boundary_bytes", "simulated_traffic", "optimizer_state_slots", "compare_memory", "EXACT_VERSION_POLICIES"]

_F, _B, _I = OP_CODE["F"], OP_CODE["B"], OP_CODE["I"]

#: policies whose stages keep exactly the weight versions their jobs use, as the version table counts them
#: (flushed: one; weight stashing: the forward's version until its backward; 2BW: double buffering)
EXACT_VERSION_POLICIES = ("sequential", "gpipe", "1f1b", "stashing", "2bw")


def boundary_bytes(stages: Sequence[nn.Module], x: Tensor) -> list[int]:
    """Bytes of each stage's input for the micro-batch ``x`` (index k: input of stage k; index 0 is ``x``).

    The tensor crossing from stage k−1 to k (an activation forward, its gradient backward, same size).
    Shapes come from running copies of the stages on the ``meta`` device, so nothing is computed.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a micro-batch tensor, got {type(x).__name__}")
    h = torch.empty(x.shape, dtype=x.dtype, device="meta")
    out = [x.numel() * x.element_size()]
    with torch.no_grad():
        for stage in list(stages)[:-1]:
            h = copy.deepcopy(stage).to("meta")(h)
            out.append(h.numel() * h.element_size())
    return out


def simulated_traffic(sim: SimResult, sizes: Sequence[int]) -> list[dict[str, dict[str, int]]]:
    """Bytes each worker sends and receives over point-to-point, by kind, as the simulator counts transfers.

    An activation crosses into F(k, g) from F(k−1, g) when they run on different workers (``sizes[k]``
    bytes); a gradient into B(k, g) or I(k, g) from stage k+1's gradient job (``sizes[k+1]`` bytes). The
    counts are :attr:`SimResult.activation_transfers` and :attr:`SimResult.gradient_transfers`, here
    split by stage (for the sizes) and credited to the sender as well.

    Returns:
        per worker, ``{"sent": {"activation": n, "gradient": m}, "received": {...}}``.
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
        results: every rank's :class:`~pipelab.runtime.RuntimeResult` (index = rank), from a run with
            ``record=True`` (for the bytes sent and received).
        schedule: the schedule that ran; stages: the D stage modules (for their sizes); x: one micro-batch
            input of stage 0 (for the boundary sizes).
        policy: the policy's name (the weight-version row is exact for :data:`EXACT_VERSION_POLICIES`).
        optimizer: the optimizer factory of the run (for the optimizer-state estimate; ``None``: not compared).

    Returns:
        rows ``{"rank", "quantity", "measured", "simulated", "exact", "tolerance", "ok", "note"}`` — five per
        rank: weight versions, activations, optimizer state, sent, received (bytes; see the module docstring).
        ``exact`` rows require equality; the others ``|measured − simulated| ≤ tolerance`` (``None``: the
        simulator has no figure, reported only).

    Raises:
        ValueError: results for a different number of ranks than the schedule's workers, or without a timeline.
    """
    if len(results) != schedule.W:
        raise ValueError(f"results must hold one RuntimeResult per rank ({schedule.W}), got {len(results)}")
    if any(getattr(r, "timeline", None) is None for r in results):
        raise ValueError("results have no timeline: run the PipelineRuntime with record=True")
    sizes = boundary_bytes(stages, x)
    weight_bytes = [sum(p.numel() * p.element_size() for p in s.parameters()) for s in stages]
    n_tensors = [sum(1 for _ in s.parameters()) for s in stages]
    sim = simulate(schedule, activation_bytes=sizes, weight_bytes=weight_bytes)
    table = sim.version_table
    depth = [table.stash_depth(k) for k in range(schedule.D)]
    traffic = simulated_traffic(sim, sizes)
    act_peak = sim.peak_activation_bytes
    assert act_peak is not None  # activation_bytes were given
    slots: list[int | None] = []
    for s in stages:
        params = [p for p in s.parameters() if p.requires_grad]
        slots.append(optimizer_state_slots(optimizer(params)) if optimizer is not None and params else
                     (0 if optimizer is not None else None))
    rows: list[dict[str, Any]] = []

    def row(rank: int, quantity: str, measured: int, simulated: int | None, exact: bool, tol: float | None,
            note: str) -> None:
        if simulated is None:
            ok = True
        elif exact:
            ok = measured == simulated
        else:
            ok = tol is not None and abs(measured - simulated) <= tol
        rows.append({"rank": rank, "quantity": quantity, "measured": int(measured),
                     "simulated": None if simulated is None else int(simulated), "exact": exact,
                     "tolerance": tol, "ok": ok, "note": note})

    for w, res in enumerate(results):
        mine = sorted(res.stages)
        exact_versions = policy in EXACT_VERSION_POLICIES
        row(w, "weight versions", res.memory["weight_versions"], sum(depth[k] * weight_bytes[k] for k in mine),
            exact_versions, None if exact_versions else 0.0,
            "stash depth × stage weights" if exact_versions else
            f"policy {policy!r} keeps other versions than its jobs use (predictions, buffers): not counted")
        if not exact_versions:
            rows[-1]["simulated"] = None
            rows[-1]["ok"] = True
        row(w, "activations", res.memory["activations"], int(act_peak[w]), True, None,
            "peak saved stage inputs")
        if all(slots[k] is not None for k in mine):
            est = sum(int(slots[k] or 0) * weight_bytes[k] for k in mine)
            row(w, "optimizer state", res.memory["optimizer_state"], est, False, 8.0 * sum(n_tensors[k] for k in mine),
                "estimate: state slots × stage weights (± 8 bytes per parameter tensor: step counters)")
        else:
            row(w, "optimizer state", res.memory["optimizer_state"], None, False, None,
                "optimizer state of this type is not estimated")
        for q in ("sent", "received"):
            row(w, q, getattr(res.timeline, f"bytes_{q}"), sum(traffic[w][q].values()), True, None,
                "transfers × boundary bytes")
    return rows


# ---------------------------------------------------------------------------------------------------- makespan
