"""Planning a pipeline run: version table, per-job weight specs, execution order, ring sizes, stages.

:func:`build_pipeline` does the set-up the single-process :class:`~pipelab.emulator.Emulator` and the
multi-process :class:`~pipelab.runtime.PipelineRuntime` share, from one
:class:`~pipelab.pipeline.spec.PipelineSpec`: it derives every job's forward/backward weights from the policy
and the version table (never from rank arithmetic), resolves the execution order (the oracle's waiting),
sizes each stage's ring of weight versions, and builds a :class:`~pipelab.pipeline.stage.StageExecutor` for
the requested stages (all of them in the emulator, a rank's own in the runtime) with their optimizers,
learning-rate schedulers and predictors. For a placed schedule (a stage computed or held by several workers:
DDP, FSDP, LPP, FSLPP, DualPipe, hybrid) it builds one copy per (worker, stage) — a holder's with its own
optimizer, a computing non-holder's (:class:`~pipelab.pipeline.placement.FetchedStage`) without — and the
global sequence of jobs and collectives (:func:`~pipelab.pipeline.placement.placed_sequence`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..links import Codec, boundary_codecs
from ..policies import Policy, Predicted, Stored, WeightSpec, make_policy
from ..precision import FP32, Precision, check_precision, weight_memory
from ..schedules import VersionTable
from ..schedules.dependencies import Job
from .loss_scale import LossScaler, defer_updates
from .order import resolve_order
from .placement import (
    Collective,
    FetchedStage,
    PlacedJob,
    StagePlacement,
    copy_module,
    fetched_ring,
    is_placed,
    placed_sequence,
    stage_placements,
)
from .rings import ring_capacities
from .spec import OptimizerFactory, PipelineSpec, make_spec
from .stage import StageExecutor, trainable_parameters

__all__ = ["PipelinePlan", "build_pipeline", "as_stages", "version_table", "stage_plans", "OptimizerFactory"]


def as_stages(model: nn.Module | Sequence[nn.Module], D: int | None, balance: Any = "layers") -> list[nn.Module]:
    """Stage modules from an ``nn.Sequential`` (split into D stages) or a list of stage modules.

    Every position of the ``nn.Sequential`` is kept, also a module placed at several positions; a parameter
    shared by two stages is refused (:func:`pipelab.partition.check_unshared`).
    """
    from ..partition import check_unshared, split

    if isinstance(model, nn.Sequential) and D is not None:
        return list(split(model, D, balance))
    if isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model) and model:
        if D is not None and D != len(model):
            raise ValueError(f"D={D} but {len(model)} stage modules were given")
        check_unshared(model, range(len(model)), "stage module")
        return list(model)
    raise TypeError("model must be an nn.Sequential with D given, or a non-empty list of stage modules; "
                    f"got {type(model).__name__} with D={D!r}")


def version_table(schedule: Any) -> VersionTable:
    """The version table of a schedule: a :class:`~pipelab.schedules.VersionTable` with its execution order,
    a simulation result, or a schedule (simulated with unit costs by :func:`pipelab.simulator.simulate`).

    Raises:
        TypeError: any other object.
        ValueError: a table without an execution order.
    """
    if isinstance(schedule, VersionTable):
        table = schedule
    else:
        from ..schedules import Schedule
        from ..simulator import SimResult, simulate

        if isinstance(schedule, SimResult):
            sim = schedule
        elif isinstance(schedule, Schedule):
            sim = simulate(schedule)
        else:
            raise TypeError("schedule must be a pipelab.schedules.Schedule, a simulation result or a VersionTable, "
                            f"got {type(schedule).__name__}")
        table = sim.version_table
    if not table.order:
        raise ValueError("the version table has no execution order; build it with pipelab.simulator.simulate")
    return table


@dataclass
class PipelinePlan:
    """Everything a driver needs to execute a schedule under a policy (see :func:`build_pipeline`).

    Attributes:
        specs: ``(k, t, j) -> (forward spec, backward spec)`` for every micro-batch job.
        order: execution order of all events (the schedule's, or the oracle's waiting order).
        waited: whether ``order`` differs from the schedule's order.
        capacity: ring size of every stage (peak versions alive at once).
        stages: the built executors, by stage index (for a placed schedule: the owner's copy in the emulator,
            the rank's own copy in the runtime).
        weightless: stages without trainable parameters (no optimizer, no predictor, no weight copies).
        precision: the run's :class:`~pipelab.precision.Precision`; scaler: fp16's shared loss scale (else None).
        placement: for a schedule whose stages are computed or held by several workers
            (:mod:`~pipelab.pipeline.placement`): every stage's C_k, H_k and kind; empty otherwise.
        sequence: the placed schedule's global sequence of jobs (with workers) and collectives.
        copies: the built stage copies, ``(worker, stage) -> executor`` (placed schedules only).
        codecs: the codec of each boundary (:func:`pipelab.links.boundary_codecs`); empty when every hand-over
            crosses untouched.
    """

    D: int
    M: int
    steps: int
    table: VersionTable
    policy: Policy
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    specs: dict[tuple[int, int, int], tuple[WeightSpec, WeightSpec]]
    order: list[Job]
    waited: bool
    capacity: list[int]
    predicted_stages: set[int]
    stages: dict[int, StageExecutor]
    weightless: frozenset[int] = frozenset()
    precision: Precision = FP32
    scaler: LossScaler | None = None
    placement: tuple[StagePlacement, ...] = ()
    sequence: list[PlacedJob | Collective] = field(default_factory=list)
    copies: dict[tuple[int, int], StageExecutor] = field(default_factory=dict)
    codecs: tuple[Codec | None, ...] = ()

    @property
    def weight_copies(self) -> list[int]:
        """Weight-sized tensors stage k holds at its peak: stored versions + a prediction + extra buffers + a gradient
        correction's buffers (0 for a stage without parameters)."""
        return [0 if k in self.weightless else
                self.capacity[k] + ((1 + self.policy.extra_buffers(k, self.D)) if k in self.predicted_stages else 0)
                + self.policy.correction_buffers(k, self.D) for k in range(self.D)]

    @property
    def weight_bytes(self) -> dict[int, dict[str, int]]:
        """Bytes each built stage holds for its weights in the run's precision: masters, stored versions,
        predicted copies, optimizer state (now), total (:func:`pipelab.precision.weight_memory`), all of its trainable
        parameters (frozen ones are held once, in the module, and are not counted)."""
        copies = self.weight_copies
        return {k: weight_memory(self.precision, st.params, 0 if k in self.weightless else self.capacity[k],
                                 copies[k] - self.capacity[k] if k not in self.weightless else 0, st.optimizer)
                for k, st in self.stages.items()}


def build_pipeline(
    model: nn.Module | Sequence[nn.Module],
    spec: PipelineSpec | None = None,
    *,
    only: Iterable[int] | None = None,
    worker: int | None = None,
    **fields: Any,
) -> PipelinePlan:
    """Plan a run and build the executors of the stages in ``only`` (default: all).

    Args:
        model: an ``nn.Sequential`` (cut into ``spec.D`` stages, default the schedule's) or a list of stage
            modules.
        spec: the run (:class:`~pipelab.pipeline.spec.PipelineSpec`), or its fields as keywords
            (``schedule=..., policy=..., optimizer=..., ...``; with a spec, keywords replace its fields).
        only: restricts which stages get executors (and optimizers), as a runtime rank needs only its own
            (ignored for a placed schedule: ``worker`` chooses the copies).
        worker: for a placed schedule (a stage computed or held by several workers), build only this
            worker's stage copies (a runtime rank); ``None``: every worker's (the emulator).

    The optimizer factory is called with each stage's trainable parameters (``requires_grad``; frozen ones are
    read from the module and never versioned, predicted or stepped: :mod:`~pipelab.pipeline.stage`). A stage
    without trainable parameters gets no optimizer, learning-rate scheduler or predictor (its policy has nothing
    to choose); it still runs its jobs.
    """
    spec = make_spec(spec, fields, "build_pipeline")
    schedule, optimizer, D, predictor = spec.schedule, spec.optimizer, spec.D, spec.predictor
    sim = _placed_simulation(schedule)
    # before the model, so that a bad schedule is not blamed on the model
    table = version_table(sim if sim is not None else schedule)
    if D is None and isinstance(model, nn.Sequential):
        D = table.D
    stages = as_stages(model, D, spec.balance)
    D = len(stages)
    if table.D != D:
        raise ValueError(f"the schedule has D={table.D} stages but the model was cut into {D}")
    policy = make_policy(spec.policy)
    policy.check(table)
    loss_fn = spec.loss_fn or nn.functional.cross_entropy
    recompute, lr_scheduler = spec.recompute, spec.lr_scheduler

    weightless = frozenset(k for k, m in enumerate(stages) if not trainable_parameters(m))
    # weight specs of every job, with the oracle predictor resolved to true future versions
    oracle = isinstance(predictor, str) and predictor == "oracle"
    specs: dict[tuple[int, int, int], tuple[WeightSpec, WeightSpec]] = {}
    stage_specs: list[dict[tuple[int, int], tuple[WeightSpec, WeightSpec]]] = [{} for _ in range(D)]
    uses: dict[Job, list[tuple[int, int]]] = {}
    predicted: set[int] = set()
    for key in table.jobs("F"):
        bkey = ("B",) + key[1:]
        f, b = policy.forward(table, key), policy.backward(table, bkey)
        if oracle:
            f, b = (Stored(w.target) if isinstance(w, Predicted) else w for w in (f, b))
        specs[(key[1], key[2], key[3])] = stage_specs[key[1]][(key[2], key[3])] = (f, b)
        uses[key] = [(key[1], _needed(f))]
        # a split backward's W finishes the weight gradient from I's graph: it holds I's weights until it ran
        for op in ("I", "W") if key[1:] in table.split_set else ("B",):
            uses[(op,) + key[1:]] = [(key[1], _needed(b))]
        if (isinstance(f, Predicted) or isinstance(b, Predicted)) and key[1] not in weightless:
            predicted.add(key[1])
    order = resolve_order(table, uses)
    waited = tuple(order) != table.order
    precision = spec.precision
    codecs = boundary_codecs(spec.codec, D)
    codecs = codecs if any(c is not None for c in codecs) else ()
    if sim is not None:
        if precision.loss_scaling is not None:
            raise ValueError("fp16 with loss scaling is not supported on placed schedules (replicated or sharded "
                             "stages: DDP, FSDP, LPP, FSLPP, DualPipe, hybrid) yet: their copies would need one "
                             "shared skip decision across the collectives; use bf16 there")
        if precision.versions != "master":
            raise ValueError("placed schedules keep weight versions in the fp32 masters (they are what the "
                             "collectives send); use Precision(..., versions='master')")
        plan = PipelinePlan(D, table.M, table.steps, table, policy, loss_fn, specs, order, waited,
                            [1] * D, predicted, {}, weightless, precision, codecs=codecs)
        _build_placed(plan, sim, stages, uses, spec, worker)
        return plan
    if precision.loss_scaling is not None:  # fp16: every stage's update of step t waits for the step's flush
        order = defer_updates(order)
    capacity, last_use = ring_capacities(order, uses, D)
    plans = stage_plans(order, last_use, D)

    built: dict[int, StageExecutor] = {}
    wanted = range(D) if only is None else sorted(set(only))
    if any(k not in range(D) for k in wanted):
        raise ValueError(f"only={sorted(set(only or ()))} must name stages in 0..{D - 1}")
    for k in wanted:
        module = stages[k]
        params = trainable_parameters(module)
        first = next((p for p in module.parameters() if p.is_floating_point()), None)
        check_precision(precision, torch.device("cpu") if first is None else first.device,
                        None if first is None else first.dtype)
        opt = optimizer(params) if params else None
        if params and not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
        if opt is not None:  # the one place a policy meets its optimizer: refused (listing the supported), or set up
            policy.check_optimizer(opt, k)
            policy.setup_optimizer(opt, k, table)
        events, local_last_use = plans[k]
        st = StageExecutor(k, D, table.M, module, opt, capacity[k], stage_specs[k], events, local_last_use,
                           policy, table, loss_fn, bool(recompute), precision=precision)
        if lr_scheduler is not None and opt is not None:
            st.scheduler = lr_scheduler(opt)
        built[k] = st
    plan = PipelinePlan(D, table.M, table.steps, table, policy, loss_fn, specs, order, waited,
                        capacity, predicted, built, weightless, precision, codecs=codecs)
    if precision.loss_scaling is not None:  # one loss scale for the stages built here (all ranks agree per step)
        plan.scaler = LossScaler(precision.loss_scaling, D)
        plan.scaler.members = [built[k] for k in sorted(built)]
        for st in built.values():
            st.scaler = plan.scaler
    # stages without parameters have no optimizer to follow and nothing to predict: no predictor for them
    _attach_predictors(replace(plan, stages={k: st for k, st in built.items() if k not in weightless}), predictor)
    return plan


def _placed_simulation(schedule: Any) -> Any:
    """The simulation of a schedule whose stages are computed or held by several workers, else ``None``."""
    from ..schedules import Schedule
    from ..simulator import SimResult, simulate

    if isinstance(schedule, SimResult):
        return schedule if is_placed(schedule.schedule) else None
    if isinstance(schedule, Schedule) and is_placed(schedule):
        return simulate(schedule)
    return None


def _build_placed(plan: PipelinePlan, sim: Any, stages: Sequence[nn.Module], uses: dict[Job, list[tuple[int, int]]],
                  spec: PipelineSpec, worker: int | None) -> None:
    """Fill ``plan`` for a placed schedule: the global sequence with its collectives and one stage copy per
    (worker, stage) computing or holding it (:mod:`~pipelab.pipeline.placement`); every holder gets its own
    optimizer (replicas stay equal: they apply the same reduced gradient)."""
    policy, D, schedule = plan.policy, plan.D, sim.schedule
    if plan.waited:
        raise ValueError(f"policy {policy.name!r} makes jobs wait for future weights, which placed schedules "
                         f"({schedule.name}: stages computed or held by several workers) do not support")
    if policy.corrects_gradient or policy.keeps_backward_weights:
        raise ValueError(f"policy {policy.name!r} corrects the step's gradient from per-copy state, which placed "
                         f"schedules ({schedule.name}) do not support; use a single-placement schedule")
    if worker is not None and not 0 <= worker < schedule.W:
        raise ValueError(f"worker={worker} must be in 0..{schedule.W - 1}")
    places = stage_placements(schedule)
    for (k, t, j), pair in plan.specs.items():
        for op, w_spec in zip("FB", pair):
            w = schedule.worker_of(op if op == "F" or (k, t, j) not in plan.table.split_set else "I", k, t, j)
            if isinstance(w_spec, Predicted) and w not in places[k].holders:
                raise ValueError(f"policy {policy.name!r} predicts stage {k}'s weights on worker {w}, which does not "
                                 f"hold them in {schedule.name} (no optimizer state there); use a stored-version "
                                 "policy")
    seq = placed_sequence(sim, uses)
    plan.placement, plan.sequence = places, seq
    workers = range(schedule.W) if worker is None else (worker,)
    capacity = [0] * D
    for w in workers:
        for k in range(D):
            place = places[k]
            if w not in place.holders and w not in place.compute:
                continue
            part: list[Job | Collective] = []
            for e in seq:
                if isinstance(e, Collective):
                    if e.kind == "broadcast" and e.stage == k and w in e.holders:
                        part.append(e)
                elif e.worker == w and e.stage == k:
                    part.append((e.op, k, e.step, e.micro))
            jobs = [e for e in part if not isinstance(e, Collective)]
            events = [(op, t, j) for op, _, t, j in jobs]
            own = worker is not None or w == place.holders[0]
            module = stages[k] if own else copy_module(stages[k])
            if w in place.holders:
                caps, last = ring_capacities(jobs, uses, D)
                cap, last_use = caps[k], {v: i for (_, v), i in last.items()}
                params = trainable_parameters(module)
                opt = spec.optimizer(params) if params else None
                if params and not isinstance(opt, torch.optim.Optimizer):
                    raise TypeError(f"optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
                if opt is not None:
                    policy.check_optimizer(opt, k)
                    policy.setup_optimizer(opt, k, plan.table)
                ex: StageExecutor = StageExecutor(k, D, plan.M, module, opt, cap, plan_specs(plan, k), events,
                                                  last_use, policy, plan.table, plan.loss_fn, bool(spec.recompute),
                                                  precision=plan.precision)
                if spec.lr_scheduler is not None and opt is not None:
                    ex.scheduler = spec.lr_scheduler(opt)
            else:
                cap, last_use = fetched_ring(part, uses, k)
                ex = FetchedStage(k, D, plan.M, module, cap, plan_specs(plan, k), events, last_use, policy,
                                  plan.table, plan.loss_fn, bool(spec.recompute), precision=plan.precision)
            capacity[k] = max(capacity[k], cap)
            plan.copies[(w, k)] = ex
            if own:
                plan.stages[k] = ex
    plan.capacity = [max(c, 1) for c in capacity]
    holders = {i: ex for i, ((w, k), ex) in enumerate(plan.copies.items())
               if w in places[k].holders and k not in plan.weightless}
    _attach_predictors(replace(plan, stages=holders), spec.predictor)


def plan_specs(plan: PipelinePlan, k: int) -> dict[tuple[int, int], tuple[WeightSpec, WeightSpec]]:
    """Stage k's ``(t, j) -> (forward spec, backward spec)``."""
    return {(t, j): pair for (kk, t, j), pair in plan.specs.items() if kk == k}


def _attach_predictors(plan: PipelinePlan, predictor: Any) -> None:
    """Give every stage its predictor (validated by :class:`~pipelab.pipeline.spec.PipelineSpec`).

    A predictor given to a plan in which no stage predicts is unused, and says so with a UserWarning.
    """
    import warnings

    from ..predictors import Predictor, make_predictor

    if not plan.predicted_stages:
        # "oracle" turns a predicting policy's predictions into stored versions: used, though none remain
        used = isinstance(predictor, str) and predictor == "oracle" and plan.policy.uses_predictor
        if predictor is not None and not used:
            name = predictor if isinstance(predictor, str) else getattr(predictor, "name", None) or predictor
            warnings.warn(f"predictor {name!r} is unused: policy {plan.policy.name!r} predicts no weights "
                          "on this schedule", UserWarning, stacklevel=4)
        return
    if predictor is None:
        predictor = plan.policy.default_predictor
    if predictor is None:
        raise ValueError(f"policy {plan.policy.name!r} predicts weights; pass predictor=")

    for st in plan.stages.values():
        if isinstance(predictor, str):
            pred = make_predictor(predictor)
        elif isinstance(predictor, Predictor) or hasattr(predictor, "predict"):
            pred = predictor
        else:  # a factory stage -> Predictor (PipelineSpec refused anything else)
            pred = predictor(st.k)
        check = getattr(pred, "check", None)
        if check is not None and st.k in plan.predicted_stages:
            try:
                check(st.optimizer)
            except (TypeError, ValueError) as exc:
                supported = getattr(pred, "supported_optimizers", None)
                listed = f"; supported optimizers: {', '.join(supported())}" if callable(supported) else ""
                raise ValueError(f"policy {plan.policy.name!r} with predictor {getattr(pred, 'name', pred)!r} cannot "
                                 f"follow stage {st.k}'s optimizer {type(st.optimizer).__name__}: {exc}{listed}"
                                 ) from exc
        st.predictor = pred
        observe = getattr(pred, "observe", None)
        if observe is not None and getattr(pred, "needs_history", False):
            observe(st.optimizer)


def _needed(spec: WeightSpec) -> int:
    return spec.version if isinstance(spec, Stored) else spec.base


def stage_plans(order: Sequence[Job], last_use: dict[tuple[int, int], int], D: int
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
