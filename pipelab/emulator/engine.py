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

from ..policies import Policy, Predicted, Stored, WeightSpec, make_policy
from .stage import StageExecutor
from .versions import JobKey, VersionTable, resolve_order, ring_capacities

__all__ = ["Emulator", "EmulatorResult", "OptimizerFactory", "version_table", "as_stages", "split_micro"]

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
Batch = tuple[Tensor, Tensor]


def as_stages(model: nn.Module | Sequence[nn.Module], D: int | None, balance: Any = "layers") -> list[nn.Module]:
    """Stage modules from an ``nn.Sequential`` (split into D stages) or a list of stage modules."""
    if isinstance(model, nn.Sequential) and D is not None:
        from ..partition import split

        return list(split(model, D, balance))
    if isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model) and model:
        if D is not None and D != len(model):
            raise ValueError(f"D={D} but {len(model)} stage modules were given")
        return list(model)
    raise TypeError("model must be an nn.Sequential with D given, or a non-empty list of stage modules; "
                    f"got {type(model).__name__} with D={D!r}")


def version_table(schedule: Any) -> VersionTable:
    """The version table of a schedule: a :class:`VersionTable`, a simulation result, or a schedule.

    A ``pipelab.schedules.Schedule`` is simulated with unit costs (``pipelab.simulator.simulate``); a
    simulation result provides its ordered execution sequence of events.
    """
    if isinstance(schedule, VersionTable):
        return schedule
    from . import adapters

    return adapters.table_from(schedule)


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
    observed: dict[JobKey, int]
    used: dict[JobKey, int]
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
        schedule: a ``Schedule``, a simulation result, or a :class:`VersionTable` (D, M, steps).
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
            policy on an asynchronous schedule, a predictor that cannot follow the optimizer.
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
        if D is None and isinstance(model, nn.Sequential):
            D = getattr(schedule, "D", None)
        stages = as_stages(model, D, balance)
        self.D = len(stages)
        self.table = version_table(schedule)
        if self.table.D != self.D:
            raise ValueError(f"the schedule has D={self.table.D} stages but the model was cut into {self.D}")
        self.M, self.steps = self.table.M, self.table.steps
        self.policy = make_policy(policy)
        self.policy.check(self.table)
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        self.recompute = bool(recompute)
        if not callable(optimizer):
            raise TypeError("optimizer must be a factory: params -> torch.optim.Optimizer")

        # weight specs of every job, with the oracle predictor resolved to true future versions
        self.oracle_predictor = isinstance(predictor, str) and predictor == "oracle"
        self.specs: dict[JobKey, tuple[WeightSpec, WeightSpec]] = {}
        uses: dict[JobKey, list[tuple[int, int]]] = {}
        self.predicted_stages: set[int] = set()
        for key in self.table.current:
            if key[0] != "F":
                continue
            bkey = ("B",) + key[1:]
            f, b = self.policy.forward(self.table, key), self.policy.backward(self.table, bkey)
            if self.oracle_predictor:
                f, b = (Stored(w.base + w.s) if isinstance(w, Predicted) else w for w in (f, b))
            self.specs[key[1:]] = (f, b)  # type: ignore[index]  # (k, t, j) -> (forward, backward)
            uses[key] = [(key[1], _needed(f))]
            uses[bkey] = [(key[1], _needed(b))]
            if isinstance(f, Predicted) or isinstance(b, Predicted):
                self.predicted_stages.add(key[1])
        self.order = resolve_order(self.table, uses)
        self.waited = self.order != self.table.order
        caps, last_use = ring_capacities(self.order, uses, self.D)
        self.capacity = caps
        plans = stage_plans(self.order, last_use, self.D)

        self.stages: list[StageExecutor] = []
        for k, module in enumerate(stages):
            params = list(module.parameters())
            if not params:
                raise ValueError(f"stage {k} has no parameters; choose D so that every stage holds weights")
            opt = optimizer(params)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
            events, local_last_use = plans[k]
            st = StageExecutor(k, self.D, self.M, module, opt, caps[k],
                               {kk[1:]: v for kk, v in self.specs.items() if kk[0] == k}, events, local_last_use,
                               self.policy, self.table, self.loss_fn, self.recompute)
            if lr_scheduler is not None:
                st.scheduler = lr_scheduler(opt)
            self.stages.append(st)
        self._setup_predictors(predictor)

    # ------------------------------------------------------------------------------------- set-up

    def _setup_predictors(self, predictor: Any) -> None:
        if not self.predicted_stages:
            return
        if predictor is None:
            predictor = self.policy.default_predictor
        if predictor is None:
            raise ValueError(f"policy {self.policy.name!r} predicts weights; pass predictor=")
        from ..predictors import Predictor, make_predictor

        for st in self.stages:
            if isinstance(predictor, str):
                pred = make_predictor(predictor)
            elif isinstance(predictor, Predictor) or hasattr(predictor, "predict"):
                pred = predictor
            elif callable(predictor):
                pred = predictor(st.k)
            else:
                raise TypeError(f"predictor must be a name, a Predictor or a factory stage -> Predictor, "
                                f"got {type(predictor).__name__}")
            check = getattr(pred, "check", None)
            if check is not None and st.k in self.predicted_stages:
                try:
                    check(st.optimizer)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"predictor {getattr(pred, 'name', pred)!r} cannot follow stage {st.k}'s "
                                     f"optimizer {type(st.optimizer).__name__}: {exc}") from exc
            st.predictor = pred
            observe = getattr(pred, "observe", None)
            if observe is not None and getattr(pred, "needs_history", False):
                observe(st.optimizer)

    @property
    def weight_copies(self) -> list[int]:
        """Weight-sized tensors stage k holds at its peak: stored versions + a prediction + extra buffers."""
        return [self.capacity[k] + ((1 + self.policy.extra_buffers(k, self.D)) if k in self.predicted_stages else 0)
                for k in range(self.D)]

    # ------------------------------------------------------------------------------------- weights

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
        """
        get = batches if callable(batches) else batches.__getitem__
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


def _needed(spec: WeightSpec) -> int:
    return spec.version if isinstance(spec, Stored) else spec.base


def _target(spec: WeightSpec) -> int:
    return spec.version if isinstance(spec, Stored) else spec.base + spec.s


def stage_plans(order: Sequence[JobKey], last_use: dict[tuple[int, int], int], D: int
                ) -> list[tuple[list[tuple[str, int, int]], dict[int, int]]]:
    """Per stage: its events in ``order`` and each version's last use as a position among them.

    A stage's events come in the same relative order in the global sequence and in the program of the
    worker that runs the stage, so these stage-local positions serve the emulator and the runtime alike.
    """
    events: list[list[tuple[str, int, int]]] = [[] for _ in range(D)]
    local: dict[int, int] = {}
    for i, (op, k, t, j) in enumerate(order):
        local[i] = len(events[k])
        events[k].append((op, t, j))
    uses: list[dict[int, int]] = [{} for _ in range(D)]
    for (k, v), i in last_use.items():
        uses[k][v] = local[i]
    return [(events[k], uses[k]) for k in range(D)]
