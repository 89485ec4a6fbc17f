"""The exact pipeline emulator: any schedule × staleness policy × ``torch.optim`` optimizer, one device.

:class:`Emulator` replays the simulator's execution sequence of F, B and U events, stage by stage, as a
real pipeline would, but in one process:

- **Weights.** Stage k's versions ``W_k^(v)`` are explicit tensors in a :class:`VersionRing` keyed by
  version number. The stage's own ``torch.optim`` optimizer owns the live parameters (the stage module's
  ``nn.Parameter`` s, i.e. the user's model is trained in place); after each update the new version is
  cloned into the ring; stored versions are never written to and are dropped after their last use. The
  ring's capacity is the peak number of versions alive at once, i.e. the copies a real stage holds.
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
  emulator records the version each job actually ran at (``EmulatorResult.observed``) for comparison.
- **Buffers** (e.g. BatchNorm running statistics) are not versioned: they live in the stage modules and
  are updated in place by every (non-recomputed) forward in execution order, whatever weights it used.

Example:
    >>> import torch
    >>> from pipelab.models import deep_mlp
    >>> from pipelab.schedules import gpipe
    >>> model = deep_mlp(in_features=8, width=16, depth=4).double()
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

import torch
from torch import Tensor, nn

from ..policies import Policy, Stored, WeightSpec
from ..schedules.dependencies import Job
from .plan import OptimizerFactory, build_pipeline
from .stage import StageExecutor

__all__ = ["Emulator", "EmulatorResult", "split_micro"]

log = logging.getLogger(__name__)

Batch = tuple[Tensor, Tensor]


def split_micro(x: Tensor, M: int, name: str = "batch") -> tuple[Tensor, ...]:
    """Split a mini-batch into M equal micro-batches along dimension 0."""
    n = x.shape[0]
    if n % M:
        raise ValueError(f"{name} size {n} is not divisible by the M={M} micro-batches of the schedule; "
                         f"use a mini-batch size that is a multiple of {M}")
    return torch.split(x, n // M)


@dataclass
class EmulatorResult:
    """What :meth:`Emulator.run` returns.

    Attributes:
        losses: mean training loss of every mini-batch (the last stage's forward), NaN where not reached.
        diverged_at: first step whose loss was NaN/inf (the run stops there), else ``None``.
        observed: the version of its stage each F/B job actually ran at (``cur`` as executed).
        used: the version each F/B job's weights stand for: v for a stored version, base+s for a
            prediction of it (``("F", k, t, j) -> int``).
        waited: whether the execution order differs from the schedule's (oracle-type waiting).
        ring_capacity: versions stage k holds at its peak (weight stashing: D−k).
        weight_copies: weight-sized tensors a real stage holds: ring + predicted copy + extra buffers.
        steps_done: number of mini-batches whose loss was computed.
    """

    losses: list[float]
    diverged_at: int | None
    observed: dict[Job, int]
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
        schedule: a ``Schedule`` (built by a builder such as ``pipelab.schedules.gpipe(D, M, steps)``, not its
            name), a simulation result, or a :class:`~pipelab.schedules.VersionTable` with its execution order.
        policy: a :class:`~pipelab.policies.Policy` or its name.
        optimizer: factory ``params -> torch.optim.Optimizer`` called once per stage.
        D: number of stages (required with an ``nn.Sequential``).
        loss_fn: ``(output, target) -> mean loss`` of a micro-batch (default cross-entropy).
        predictor: for prediction policies: a predictor name (``pipelab.predictors.make_predictor``), a
            ``Predictor``, a factory ``stage -> Predictor``, or ``"oracle"`` (the true future weights:
            jobs wait for them). Default: the policy's ``default_predictor``.
        lr_scheduler: factory ``optimizer -> LRScheduler``; each stage's scheduler steps after each update.
        balance: how :func:`~pipelab.partition.split` balances stages.
        recompute: always recompute the stage forward in the backward (activation recomputation, as in
            PipeOptim's experiments), even when forward and backward weights agree.

    Raises:
        ValueError: D larger than the number of blocks, schedule and model disagreeing on D, a synchronous
            policy on an asynchronous schedule, a predictor that cannot follow the optimizer, a parameter
            shared by two stages.
        TypeError: a schedule given by name (``"gpipe"``) or of another type, an optimizer that is not a
            factory, a loss function or scheduler factory that is not callable.

    A stage without parameters (e.g. a lone ``nn.Tanh`` stage) is allowed: it runs its forwards and
    backwards but has no optimizer, no predictor and no weight copies.
    """

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        *,
        schedule: Any,
        policy: str | Policy,
        optimizer: OptimizerFactory,
        D: int | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        predictor: Any = None,
        lr_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        balance: Any = "layers",
        recompute: bool = False,
    ) -> None:
        plan = build_pipeline(model, schedule=schedule, policy=policy, optimizer=optimizer, D=D, loss_fn=loss_fn,
                              predictor=predictor, lr_scheduler=lr_scheduler, balance=balance, recompute=recompute)
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
                in ``named_parameters`` order; they must not be modified).

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
        """
        if any(st.position for st in self.stages):
            raise RuntimeError("an Emulator runs its schedule once and this one has run (its stages' weight versions "
                               "and event positions are spent); to continue training, build a new Emulator on the "
                               "same model, which holds the trained weights (optimizer state starts afresh)")
        if not callable(batches) and not (hasattr(batches, "__getitem__") and hasattr(batches, "__len__")):
            raise TypeError("batches must be a sequence of (x, y) mini-batches or a callable t -> (x, y), "
                            f"got {type(batches).__name__}")
        get = _checked_batches(batches, self.stages[0])
        if not callable(batches) and len(batches) < self.steps:
            raise ValueError(f"the schedule runs {self.steps} steps but only {len(batches)} mini-batches were given")
        D, M = self.D, self.M
        last = D - 1
        micro: dict[int, tuple[tuple[Tensor, ...], tuple[Tensor, ...]]] = {}
        acts: dict[tuple[int, int, int], Tensor] = {}
        gouts: dict[tuple[int, int, int], Tensor] = {}
        step_loss: dict[int, list[Tensor]] = defaultdict(list)
        losses = [math.nan] * self.steps
        snaps: dict[int, dict[int, tuple[Tensor, ...]]] = defaultdict(dict)
        diverged: int | None = None
        done = 0
        back0: dict[int, int] = defaultdict(int)

        def snapshot(k: int, v: int, W: tuple[Tensor, ...]) -> None:
            if on_snapshot is None or not snapshot_every or (v % snapshot_every and v != self.steps):
                return
            snaps[v][k] = W
            if len(snaps[v]) == D:
                on_snapshot(v, [snaps[v][kk] for kk in range(D)])
                del snaps[v]

        for st in self.stages:
            st.module.train()
            snapshot(st.k, 0, st.ring.get(0))

        for op, k, t, j in self.order:
            st = self.stages[k]
            if op == "F":
                if t not in micro:
                    x, y = get(t)
                    micro[t] = (split_micro(x, M, "input batch"), split_micro(y, M, "target batch"))
                x_in = micro[t][0][j] if k == 0 else acts.pop((k - 1, t, j))
                out = st.forward(t, j, x_in, micro[t][1][j] if k == last else None)
                if k < last:
                    acts[(k, t, j)] = out
                    continue
                step_loss[t].append(out)
                if len(step_loss[t]) == M:
                    total = float(torch.stack(step_loss.pop(t)).sum())
                    losses[t] = total
                    done += 1
                    if not math.isfinite(total):
                        diverged = t
                        break
            elif op == "B":
                g_in = st.backward(t, j, gouts.pop((k, t, j), None))
                if k > 0:
                    gouts[(k - 1, t, j)] = g_in
                else:
                    back0[t] += 1
                    if back0[t] == M:  # the mini-batch has left the pipeline
                        micro.pop(t, None)
                        del back0[t]
            else:  # U
                snapshot(k, st.version + 1, st.update(t))
        observed = {key: v for st in self.stages for key, v in st.observed.items()}
        used = {(op,) + kk: _target(spec) for kk, pair in self.specs.items() for op, spec in zip("FB", pair)}
        return EmulatorResult(losses, diverged, observed, used, self.waited, list(self.capacity), self.weight_copies, done,
                              extra={"ring_peak": [st.ring.peak for st in self.stages]})

    def weights(self) -> list[tuple[Tensor, ...]]:
        """The live (newest) weights of every stage."""
        return [tuple(p.detach() for p in st.params) for st in self.stages]


def _checked_batches(batches: Sequence[Batch] | Callable[[int], Batch], first: StageExecutor
                     ) -> Callable[[int], Batch]:
    """``t -> (x, y)`` that checks each mini-batch's form, its sizes, and its input against stage 0's weights."""
    get = batches if callable(batches) else batches.__getitem__
    weight = next((p for p in first.params if p.is_floating_point()), None)

    def checked(t: int) -> Batch:
        batch = get(t)
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2
                and all(isinstance(v, Tensor) for v in batch)):
            raise TypeError(f"mini-batch {t} must be a tuple (x, y) of two tensors (input, target), "
                            f"got {_describe(batch)}")
        x, y = batch
        if x.dim() == 0 or y.dim() == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(f"mini-batch {t}: input shape {tuple(x.shape)} and target shape {tuple(y.shape)} must "
                             "have the same number of examples along dimension 0")
        if weight is not None and x.is_floating_point() and x.dtype != weight.dtype:
            raise TypeError(f"mini-batch {t}: input dtype {x.dtype} differs from the model's {weight.dtype}; "
                            f"convert the data (x.to({weight.dtype})) or the model (model.to(dtype))")
        if weight is not None and x.device != weight.device:
            raise ValueError(f"mini-batch {t}: input on {x.device} but the model's first stage on {weight.device}; "
                             "move the data or the model to one device")
        return x, y

    return checked


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value[:3])}...)"
    return type(value).__name__


def _target(spec: WeightSpec) -> int:
    return spec.version if isinstance(spec, Stored) else spec.base + spec.s
