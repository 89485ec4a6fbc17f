"""The exact pipeline emulator: any schedule × staleness policy × ``torch.optim`` optimizer, one device.

:class:`Emulator` replays the simulator's execution order of F, B (I, W) and U events in one process, on the
pipeline core the multi-process :class:`~pipelab.runtime.PipelineRuntime` shares (the loop
:func:`~pipelab.pipeline.driver.run_jobs`, the :class:`~pipelab.pipeline.stage.StageExecutor` s built by
:func:`~pipelab.pipeline.plan.build_pipeline`), handing tensors over in memory. The rules:

- **Weights.** Stage k's versions ``W_k^(v)`` are tensors in a :class:`~pipelab.pipeline.rings.VersionRing`,
  never written to, dropped after their last use (capacity: the peak held at once, i.e. a real stage's copies).
  The stage's ``torch.optim`` optimizer owns the live parameters (the user's model is trained in place); each
  update's result is cloned into the ring.
- **Forward.** ``F(k, t, j)`` runs the stage (:func:`torch.func.functional_call`) at the weights its policy
  asks for (a stored version, or a predictor's output); the last stage adds the loss ℓ/M, so the M micro-batch
  gradients sum to the gradient of the mini-batch mean loss.
- **Backward.** ``B(k, t, j)`` is the vector–Jacobian product (∂out/∂W)ᵀg, (∂out/∂x)ᵀg of the stage alone, from
  its saved input and the gradient received from stage k+1. When forward and backward weights are the same stored
  version the forward's graph is reused; otherwise (vanilla, PipeOptim, SpecTrain, PipeMare) the stage forward is
  recomputed at the backward weights, replaying the forward's random state on copies of the buffers (PipeOptim's
  recompute semantics, Guan et al., arXiv:2312.00839, §V-A). ``I``/``W`` split it: I returns (∂out/∂x)ᵀg and
  keeps the graph, the later W adds (∂out/∂W)ᵀg: together exactly B.
- **Update.** ``U(k, t)`` steps the optimizer with step t's accumulated gradient (PipeMare's learning-rate factor;
  a ``corrects_gradient`` policy's correction first), then the scheduler and the predictor's history.
- **Versions** come from the simulator's version table, never from rank arithmetic; ``EmulatorResult.current``
  records the version each job actually ran at.
- **Placements** (DDP, FSDP, LPP, FSLPP, DualPipe, PP × DP: :mod:`pipelab.pipeline.placement`): each holder keeps
  its own copy and optimizer (the first holder's is the user's module), a computing non-holder only the versions
  it fetched; the collectives (all-reduce, broadcast, reduce) run in memory where the runtime's global sequence
  has them, and ``EmulatorResult.extra["collectives"]`` counts the bytes each rank would move.
- **Precision** (:class:`~pipelab.precision.Precision`): bf16/fp16 autocast with fp32 masters; fp16 adds one loss
  scale and one skip decision per step for every stage (flushed schedules only).
- **Buffers** (BatchNorm statistics) are not versioned: every non-recomputed forward updates them in order.
  Frozen parameters and stages without parameters: :mod:`pipelab.pipeline.stage`; hand-over structures:
  :mod:`pipelab.pipeline.transport`.
- **Mini-batch shapes** may change between mini-batches where the model accepts them (each split into M equal
  micro-batches); a stage that rejects one is named with both shapes.

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

from ..pipeline.driver import Batches, DriverState, MiniBatches, run_jobs
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
        losses: mean training loss of every mini-batch, NaN where not reached.
        diverged_at: first step whose loss was NaN/inf (the run stops there), else ``None``.
        current: cur(job), the version of its stage current when each F/B (or I/W) job ran.
        used: the version each F/B job's weights stand for: v stored, base+s predicted.
        waited: whether the execution order differs from the schedule's (oracle-type waiting).
        ring_capacity: versions stage k holds at its peak (weight stashing: D−k).
        weight_copies: weight-sized tensors a real stage holds: ring + predicted copy + extra buffers.
        extra: ``ring_peak``, ``activation_peak`` (bytes of saved stage inputs, all stages; held until W when
            split), ``stage_activation_peak``; placed: ``copies`` (``(worker, stage) -> final weights``) and
            ``collectives`` (per rank and kind: ``bytes_sent``, ``bytes_received``, ``calls``); ``arm_losses``
            (per step, stacked arms' losses, :mod:`pipelab.studies.stacking`; else ``None`` entries).
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
        spec: the run (:class:`~pipelab.pipeline.spec.PipelineSpec`), or its fields as keywords, which replace a
            given spec's.

    Raises:
        ValueError: D larger than the number of blocks, schedule and model disagreeing on D, a synchronous
            policy on an asynchronous schedule, a predictor that cannot follow the optimizer, a parameter
            shared by two stages.
        TypeError: a schedule given by name (``"gpipe"``) or of another type, an optimizer that is not a
            factory, a loss function or scheduler factory that is not callable, an unknown keyword.
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
        batches: Batches,
        *,
        snapshot_every: int | None = None,
        on_snapshot: Callable[[int, list[tuple[Tensor, ...]]], None] | None = None,
    ) -> EmulatorResult:
        """Run the whole schedule on ``batches``: mini-batch t is ``batches[t]``, ``batches(t)`` or the t-th item of an
        iterable (a ``DataLoader``, a generator: read once, in order, each held only while the schedule needs it).

        Args:
            snapshot_every: call ``on_snapshot(v, weights)`` whenever every stage has reached version v,
                for v = 0, n, 2n, ... and the final version (weights: one tuple of tensors per stage,
                in ``named_parameters`` order, frozen parameters included; they must not be modified).

        Raises:
            RuntimeError: on a second call (the version table, specs and rings are one pass's; build a new
                Emulator on the same model to continue).
            TypeError: a mini-batch that is not a tuple ``(x, y)`` of tensors, or an input whose floating
                dtype differs from the model's.
            ValueError: too few mini-batches, input and target of different lengths, a mini-batch not
                divisible into M micro-batches, data and model on different devices.
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
