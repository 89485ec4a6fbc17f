"""The exact pipeline emulator: any schedule × staleness policy × ``torch.optim`` optimizer, one device.

:class:`Emulator` replays the simulator's execution sequence of F, B and U events, stage by stage, as a
real pipeline would, but in one process:

The loop itself (:func:`pipelab.pipeline.driver.run_jobs`), the stage arithmetic
(:class:`~pipelab.pipeline.stage.StageExecutor`) and the set-up (:func:`~pipelab.pipeline.plan.build_pipeline`)
are the pipeline core the multi-process :class:`~pipelab.runtime.PipelineRuntime` shares; the emulator runs
the whole execution order in one process and hands tensors over in memory.

- **Weights.** Stage k's versions ``W_k^(v)`` are explicit tensors in a
  :class:`~pipelab.pipeline.rings.VersionRing` keyed by version number. The stage's own ``torch.optim``
  optimizer owns the live parameters (the stage module's ``nn.Parameter`` s, i.e. the user's model is
  trained in place); after each update the new version is cloned into the ring; stored versions are never
  written to and are dropped after their last use. The ring's capacity is the peak
  number of versions alive at once, i.e. the copies a real stage holds.
- **Forward.** ``F(k, t, j)`` runs the stage through :func:`torch.func.functional_call` with the weights
  its policy asks for (a stored version, or a predictor's output) on micro-batch j of mini-batch t. The
  last stage also computes the loss, scaled by 1/M so that the M micro-batch gradients sum to the gradient
  of the mini-batch mean loss.
- **Backward.** ``B(k, t, j)`` differentiates the stage alone, from its saved input, with the gradient of
  its output received from stage k+1 (per-stage autograd, as a real pipeline does). When the forward and
  backward weights are the same stored version the forward's autograd graph is kept and used (no
  recompute: stashing and flushed schedules pay nothing extra). When they differ (vanilla, PipeOptim,
  SpecTrain, PipeMare) the backward is the vector–Jacobian product of the stage *at the backward weights*,
  evaluated by recomputing the stage forward from the saved input — the recompute semantics of PipeOptim's
  experiments, where every scheme used recomputation (Guan et al., arXiv:2312.00839, §V-A). The recompute
  replays the forward's random-number state (dropout) and runs on copies of the buffers.
- **Update.** ``U(k, t)`` hands the accumulated gradient of step t to stage k's optimizer (with PipeMare's
  learning-rate factor if any), steps the optional learning-rate scheduler and the predictor's history.
- **Versions** come from the version table of the simulator's sequence, never from rank arithmetic; the
  emulator records the version each job actually ran at (``EmulatorResult.current``) for comparison.
- **Placements** (DDP, FSDP, LPP, FSLPP, DualPipe, hybrid PP × DP: a stage computed or held by several
  workers, :mod:`pipelab.pipeline.placement`): every holder has its own copy of the stage's weights and its
  own optimizer (the first holder's is the user's module, trained in place; the others are copies), a
  computing non-holder holds only the versions it fetched, and every job computes with its own worker's copy.
  The collectives run in memory at the places of the global sequence the runtime follows: a replicated
  stage's gradients are summed over its holders before each U (all-reduce), a sharded stage's weights are
  handed from the owner to the non-holders before they use them (broadcast) and their gradients summed onto
  the owner (reduce). ``EmulatorResult.extra["collectives"]`` counts the bytes each rank would move.
- **Precision** (:class:`~pipelab.precision.Precision`, spec field ``precision``): bf16/fp16 autocast compute
  with fp32 master weights and optimizer state; fp16 adds one loss scale and one skip decision per step for
  every stage (flushed schedules only). The default fp32 runs exactly as without it.
- **Buffers** (e.g. BatchNorm running statistics) are not versioned: they live in the stage modules and
  are updated in place by every (non-recomputed) forward in execution order, whatever weights it used.
- **Frozen parameters** (``requires_grad=False``) are not weights either: every job reads them from the stage
  module; they are never versioned, predicted or stepped, and the optimizer factory is given only the
  trainable ones (:mod:`pipelab.pipeline.stage`), as :func:`~pipelab.emulator.reference.train_plain` does.
- **Hand-overs** may be structures (a block returning ``(hidden, mask)``): the next stage is called with the
  structure as its one input, as ``nn.Sequential`` does; gradients flow back through its floating-point tensors
  (:mod:`pipelab.pipeline.transport`).
- **Mini-batch shapes** may change from one mini-batch to the next (a smaller last batch, another sequence
  length) wherever the model accepts them; each is still split into M equal micro-batches. Where a stage
  rejects a changed shape, the error names the stage, the mini-batch and micro-batch, and both shapes.

Example:
    >>> import torch
    >>> from pipelab.schedules import gpipe
    >>> model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)], torch.nn.Linear(8, 10)).double()
    >>> emu = Emulator(model, D=2, schedule=gpipe(D=2, M=2, steps=3), policy="gpipe",
    ...                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))        # doctest: +SKIP
    >>> data = [(torch.randn(4, 8, dtype=torch.float64), torch.randint(0, 10, (4,))) for _ in range(3)]
    >>> emu.run(data).losses                                                    # doctest: +SKIP

References: PipeDream (Narayanan et al., SOSP 2019); PipeOptim (Guan et al., arXiv:2312.00839).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ..pipeline.driver import Batch, DriverState, MiniBatches, run_jobs
from ..pipeline.placement import CollectiveCounter, emulate_collective
from ..pipeline.plan import build_pipeline
from ..pipeline.spec import PipelineSpec, make_spec
from ..pipeline.stage import StageExecutor
from ..pipeline.transport import InMemoryTransport
from ..schedules.dependencies import Job

__all__ = ["Emulator", "EmulatorResult"]

log = logging.getLogger(__name__)


@dataclass
class EmulatorResult:
    """What :meth:`Emulator.run` returns.

    Attributes:
        losses: mean training loss of every mini-batch (the last stage's forward), NaN where not reached.
        diverged_at: first step whose loss was NaN/inf (the run stops there), else ``None``.
        current: cur(job), the version of its stage current when each F/B (or I/W) job ran (as executed).
        used: the version each F/B job's weights stand for: v for a stored version, base+s for a
            prediction of it (``("F", k, t, j) -> int``).
        waited: whether the execution order differs from the schedule's (oracle-type waiting).
        ring_capacity: versions stage k holds at its peak (weight stashing: D−k).
        weight_copies: weight-sized tensors a real stage holds: ring + predicted copy + extra buffers.
        steps_done: number of mini-batches whose loss was computed.
        extra: ``ring_peak`` (versions each stage held at its peak), ``activation_peak`` (bytes of stage
            inputs saved for a backward at the peak, all stages together; held until W when split) and
            ``stage_activation_peak`` (the same per stage); for a placed schedule ``copies`` (``(worker,
            stage) -> final weights`` of every holder's copy) and ``collectives`` (per rank: ``bytes_sent``,
            ``bytes_received`` and ``calls`` per collective kind); ``arm_losses`` (per step, the per-arm losses when the
            loss is a vector of stacked arms' losses, :mod:`pipelab.studies.stacking`; ``None`` entries otherwise).
    """

    losses: list[float]
    diverged_at: int | None
    current: dict[Job, int]
    used: dict[Job, int]
    waited: bool
    ring_capacity: list[int]
    weight_copies: list[int]
    steps_done: int
    extra: dict[str, Any] = field(default_factory=dict)


class Emulator:
    """Exact single-process execution of a pipeline schedule under a staleness policy.

    Args:
        model: an ``nn.Sequential`` (split into D stages by :func:`pipelab.partition.split`) or a list of
            stage modules. It is trained in place.
        spec: the run (:class:`~pipelab.pipeline.spec.PipelineSpec`: schedule, policy, optimizer, D, loss_fn,
            predictor, lr_scheduler, balance, recompute, precision, documented there), or the same fields as keywords,
            e.g. ``Emulator(model, schedule=gpipe(2, 2, 3), policy="gpipe", optimizer=factory)``; keywords
            given with a spec replace its fields.

    Raises:
        ValueError: D larger than the number of blocks, schedule and model disagreeing on D, a synchronous
            policy on an asynchronous schedule, a predictor that cannot follow the optimizer, a parameter
            shared by two stages.
        TypeError: a schedule given by name (``"gpipe"``) or of another type, an optimizer that is not a
            factory, a loss function or scheduler factory that is not callable, an unknown keyword.

    A stage without parameters (e.g. a lone ``nn.Tanh`` stage) is allowed: it runs its forwards and
    backwards but has no optimizer, no predictor and no weight copies.
    """

    def __init__(self, model: nn.Module | Sequence[nn.Module], spec: PipelineSpec | None = None,
                 **fields: Any) -> None:
        plan = build_pipeline(model, make_spec(spec, fields, "Emulator"))
        self.plan = plan
        self.D, self.M, self.steps, self.table, self.policy = plan.D, plan.M, plan.steps, plan.table, plan.policy
        self.specs, self.order, self.waited, self.capacity = plan.specs, plan.order, plan.waited, plan.capacity
        self.predicted_stages = plan.predicted_stages
        self.stages: list[StageExecutor] = [plan.stages[k] for k in range(self.D)]

    @property
    def weight_copies(self) -> list[int]:
        """Weight-sized tensors stage k holds at its peak: stored versions + a prediction + extra buffers."""
        return self.plan.weight_copies

    # ------------------------------------------------------------------------------------- running

    def run(
        self,
        batches: Sequence[Batch] | Callable[[int], Batch],
        *,
        snapshot_every: int | None = None,
        on_snapshot: Callable[[int, list[tuple[Tensor, ...]]], None] | None = None,
    ) -> EmulatorResult:
        """Run the whole schedule on ``batches`` (mini-batch t is ``batches[t]`` or ``batches(t)``).

        Args:
            snapshot_every: call ``on_snapshot(v, weights)`` whenever every stage has reached version v,
                for v = 0, n, 2n, ... and the final version (weights: one tuple of tensors per stage,
                in ``named_parameters`` order, frozen parameters included; they must not be modified).

        Returns:
            An :class:`EmulatorResult`.

        Raises:
            RuntimeError: on a second call. An Emulator runs its schedule once: the version table, the
                weight specs and the rings are those of one pass (versions 0..steps); a second pass would
                need every version renumbered. Build a new Emulator on the same model to continue.
            TypeError: a mini-batch that is not a tuple ``(x, y)`` of tensors, or an input whose floating
                dtype differs from the model's.
            ValueError: too few mini-batches, input and target of different lengths, a mini-batch not
                divisible into M micro-batches, data and model on different devices.

        ========  ============================================================================================
        step      what it does
        ========  ============================================================================================
        check     an Emulator runs its schedule once: a second call is refused
        data      the mini-batches, checked and cut into micro-batches as the jobs ask (:class:`MiniBatches`)
        snapshot  every stage's version 0, then each update's, handed on once all stages reached v
                  (:func:`_snapshotter`)
        drive     :func:`run_jobs` over the order, or a placed schedule's global sequence with its
                  collectives emulated
        result    losses, the versions jobs ran at and used, ring and activation peaks, placed copies
                  (:meth:`_result`)
        ========  ============================================================================================
        """
        copies = self.plan.copies
        if any(st.position for st in (*self.stages, *copies.values())):
            raise RuntimeError("an Emulator runs its schedule once and this one has run (its stages' weight versions "
                               "and event positions are spent); to continue training, build a new Emulator on the "
                               "same model, which holds the trained weights (optimizer state starts afresh)")
        first = next((p for p in self.stages[0].module.parameters() if p.is_floating_point()), None)
        data = MiniBatches(batches, self.M, self.steps, reference=first)
        snapshot = _snapshotter(self.stages, self.steps, snapshot_every, on_snapshot)
        for st in self.stages:
            st.module.train()
            snapshot(st.k, 0, st.ring.get(0))
        state, counter = DriverState(), CollectiveCounter()
        common: dict[str, Any] = {"D": self.D, "M": self.M, "stop_on_divergence": True, "split": self.table.split_set,
                                  "codecs": self.plan.codecs}
        if copies:  # the stage's own copy (its first holder) stands for it in the snapshots
            diverged = run_jobs(self.plan.sequence, copies, InMemoryTransport(), data, state, placed=True,
                                collective=lambda c: emulate_collective(c, copies, counter),
                                on_update=lambda st, t, W: snapshot(st.k, st.version, W)
                                if st is self.stages[st.k] else None, **common)
        else:
            diverged = run_jobs(self.order, dict(enumerate(self.stages)), InMemoryTransport(), data, state,
                                on_update=lambda st, t, W: snapshot(st.k, st.version, W), **common)
        return self._result(state, diverged, counter)

    def _result(self, state: DriverState, diverged: int | None, counter: CollectiveCounter) -> EmulatorResult:
        """The run's :class:`EmulatorResult` from the driver's state and the executors (or placed copies)."""
        copies = self.plan.copies
        losses = [math.nan] * self.steps
        for t, total in state.losses.items():
            losses[t] = total
        everyone = list(copies.values()) if copies else self.stages
        current = {key: v for st in everyone for key, v in st.current.items()}
        placed: dict[str, Any] = {}
        if copies:
            holders = {(w, k): st.full_weights([p.detach() for p in st.params]) for (w, k), st in copies.items()
                       if w in self.plan.placement[k].holders}
            placed = {"copies": holders, "collectives": {w: counter.of(w) for w in sorted(counter.calls)}}
        D = self.D
        return EmulatorResult(losses, diverged, current, self.specs.used(), self.waited, list(self.capacity),
                              self.weight_copies, len(state.losses),
                              extra={**placed, "ring_peak": [max(st.ring.peak for st in everyone if st.k == k)
                                                             for k in range(D)],
                                     "activation_peak": state.act_peak,
                                     "stage_activation_peak": [state.stage_act_peak[k] for k in range(D)],
                                     "arm_losses": [state.arm_losses.get(t) for t in range(self.steps)]})

    def weights(self) -> list[tuple[Tensor, ...]]:
        """The live (newest) weights of every stage, in ``named_parameters`` order (frozen parameters included)."""
        return [st.full_weights([p.detach() for p in st.params]) for st in self.stages]


def _snapshotter(stages: Sequence[StageExecutor], steps: int, every: int | None,
                 on_snapshot: Callable[[int, list[tuple[Tensor, ...]]], None] | None
                 ) -> Callable[[int, int, tuple[Tensor, ...]], None]:
    """``snapshot(k, v, W)``: collects stage k's version v and calls ``on_snapshot(v, weights)`` once every stage
    reached v, for v = 0, ``every``, 2·``every``, ... and the final version ``steps``."""
    snaps: dict[int, dict[int, tuple[Tensor, ...]]] = defaultdict(dict)

    def snapshot(k: int, v: int, W: tuple[Tensor, ...]) -> None:
        if on_snapshot is None or not every or (v % every and v != steps):
            return
        # a stage whose ring holds one version hands out views of its live weights, which a later update of
        # this stage changes before the other stages reach v: keep a copy until the snapshot is complete
        st = stages[k]
        snaps[v][k] = st.full_weights(tuple(w.detach().clone() for w in W) if st.share_live else W)
        if len(snaps[v]) == len(stages):
            on_snapshot(v, [snaps[v][kk] for kk in range(len(stages))])
            del snaps[v]

    return snapshot
