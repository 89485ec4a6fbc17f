"""Planning a pipeline run: version table, per-job weight specs, execution order, ring sizes, stages.

The set-up the emulator and the runtime share, linear in the jobs; every job's weights come from the policy and
the version table, never from rank arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..links import Codec, boundary_codecs
from ..policies import Policy, Predicted, Stored, WeightSpec, make_policy
from ..precision import FP32, Precision, check_precision, weight_memory
from ..schedules import VersionTable
from ..schedules.actions import gc_paused
from ..schedules.dependencies import Job
from .loss_scale import LossScaler, defer_updates
from .order import resolve_order
from .placement import (
    Collective,
    FetchedStage,
    PlacedJob,
    StagePlacement,
    copy_module,
    is_placed,
    placed_sequence,
    stage_placements,
)
from .rings import OPS, StageEvents, job_columns
from .spec import OptimizerFactory, PipelineSpec, make_spec
from .stage import StageExecutor, trainable_parameters

__all__ = ["PipelinePlan", "JobSpecs", "build_pipeline", "as_stages", "version_table", "stage_events",
           "OptimizerFactory"]


def as_stages(model: nn.Module | Sequence[nn.Module], D: int | None, balance: Any = "layers") -> list[nn.Module]:
    """Stage modules from an ``nn.Sequential`` (split into D) or a list; a parameter shared by two stages is refused."""
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
    """The version table of a VersionTable with its order, a simulation result, or a schedule (unit costs)."""
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


class JobSpecs(Mapping[tuple[int, int, int], tuple[WeightSpec, WeightSpec]]):
    """Every micro-batch job's forward and backward weights, held as arrays: ``(k, t, j) -> (forward, backward)``.

    ``base[op]``, ``target[op]`` ([D, T, M]) are the policy's rule on the whole table: ``Stored(v)`` where
    base = target = v, else ``Predicted(base, target − base)``; with the oracle predictor base = target.
    """

    def __init__(self, policy: Policy, table: VersionTable, oracle: bool = False) -> None:
        self.shape, self.kind = table.shape, policy.prediction
        grid = np.ogrid[:table.D, :table.steps, :table.M]
        self.base: dict[str, np.ndarray] = {}
        self.target: dict[str, np.ndarray] = {}
        for op in "FB":
            base, target = (np.broadcast_to(v, self.shape).astype(np.int32) for v in policy.versions(table, op, *grid))
            self.base[op], self.target[op] = (target if oracle else base), target

    def spec(self, op: str, k: int, t: int, j: int) -> WeightSpec:
        """The weights of the forward (``op="F"``) or the backward (``"B"``) of micro-batch (k, t, j)."""
        base, target = int(self.base[op][k, t, j]), int(self.target[op][k, t, j])
        return Stored(base) if base == target else Predicted(base, target - base, self.kind)

    def pair(self, k: int, t: int, j: int) -> tuple[WeightSpec, WeightSpec]:
        return self.spec("F", k, t, j), self.spec("B", k, t, j)

    def need(self, op: str, k: int, t: int, j: int) -> int:
        """The stored version job (op, k, t, j) reads (a prediction's base); I and W read the backward's."""
        return int(self.base["F" if op == "F" else "B"][k, t, j])

    def needs(self, k: int, op: np.ndarray, t: np.ndarray, j: np.ndarray) -> np.ndarray:
        """:meth:`need` of stage k's events (op codes of :data:`~pipelab.pipeline.rings.OPS`); −1 for U."""
        need = np.where(op == OPS.index("F"), self.base["F"][k, t, j], self.base["B"][k, t, j])
        return np.where(op == OPS.index("U"), -1, need)

    def predicts(self, k: int) -> bool:
        """Whether any job of stage k runs at predicted weights."""
        return any(bool((self.base[op][k] != self.target[op][k]).any()) for op in "FB")

    def used(self) -> dict[Job, int]:
        """The version every F/B job's weights stand for (a prediction's target), ``("F", k, t, j) -> v``."""
        keys = list(product(range(self.shape[0]), range(self.shape[1]), range(self.shape[2])))
        return {(op, *key): v for op in "FB" for key, v in zip(keys, self.target[op].ravel().tolist())}

    def __getitem__(self, key: tuple[int, int, int]) -> tuple[WeightSpec, WeightSpec]:
        if len(key) != 3 or not all(0 <= i < n for i, n in zip(key, self.shape)):
            raise KeyError(key)
        return self.pair(*key)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return product(range(self.shape[0]), range(self.shape[1]), range(self.shape[2]))

    def __len__(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class PipelinePlan:
    """Everything a driver needs to execute a schedule under a policy (see :func:`build_pipeline`).

    ``order``: the schedule's, or the oracle's waiting order (``waited``); ``capacity``: each stage's ring size;
    ``stages``: the built executors (placed: the owner's or the rank's copy); ``weightless``: stages without
    trainable parameters; ``placement``, ``sequence``, ``copies``: a placed schedule's, else empty; ``codecs``: each
    boundary's (:func:`pipelab.links.boundary_codecs`), empty when every hand-over crosses untouched.
    """

    D: int
    M: int
    steps: int
    table: VersionTable
    policy: Policy
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    specs: JobSpecs
    order: Sequence[Job]
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
        """Per built stage, :func:`pipelab.precision.weight_memory` of its trainable parameters (frozen ones: once)."""
        copies = self.weight_copies
        return {k: weight_memory(self.precision, st.params, 0 if k in self.weightless else self.capacity[k],
                                 copies[k] - self.capacity[k] if k not in self.weightless else 0, st.optimizer)
                for k, st in self.stages.items()}


@gc_paused  # ~10^6 small tuples, no cycles (schedules.actions.gc_paused)
def _codecs(codec: Any, D: int) -> tuple[Codec | None, ...]:
    """Each boundary's codec (:func:`pipelab.links.boundary_codecs`); empty when every hand-over crosses untouched."""
    codecs = boundary_codecs(codec, D)
    return codecs if any(c is not None for c in codecs) else ()


def build_pipeline(
    model: nn.Module | Sequence[nn.Module],
    spec: PipelineSpec | None = None,
    *,
    only: Iterable[int] | None = None,
    worker: int | None = None,
    **fields: Any,
) -> PipelinePlan:
    """Plan a run and build the executors of the stages in ``only`` (default: all).

    Steps, each linear in the jobs: the version table (a schedule is simulated) and the policy checked against it;
    every job's weights as arrays (:class:`JobSpecs`); the order (the oracle's waiting order where needed); each
    stage's events and ring size (:func:`stage_events`); the executors (or placed copies, :func:`_build_placed`),
    fp16's shared loss scale and the predictors. A stage without trainable parameters gets no optimizer, scheduler
    or predictor; frozen parameters are never versioned, predicted or stepped.

    Args:
        model: an ``nn.Sequential`` (cut into ``spec.D`` stages, default the schedule's) or stage modules.
        spec: a :class:`~pipelab.pipeline.spec.PipelineSpec`, or its fields as keywords (which replace a spec's).
        only: the stages a runtime rank builds (ignored for a placed schedule).
        worker: for a placed schedule, build only this worker's copies; ``None``: all (the emulator).
    """
    spec = make_spec(spec, fields, "build_pipeline")
    sim, table, stages, policy = _table_and_stages(model, spec)
    D = len(stages)
    weightless = frozenset(k for k, m in enumerate(stages) if not trainable_parameters(m))
    specs = JobSpecs(policy, table, oracle=isinstance(spec.predictor, str) and spec.predictor == "oracle")
    order, waited = _order(table, specs)
    predicted = {k for k in range(D) if k not in weightless and specs.predicts(k)}
    plan = PipelinePlan(D, table.M, table.steps, table, policy, spec.loss_fn or nn.functional.cross_entropy, specs,
                        order, waited, [1] * D, predicted, {}, weightless, spec.precision,
                        codecs=_codecs(spec.codec, D))
    if sim is not None:
        _build_placed(plan, sim, stages, spec, worker)
        return plan
    if plan.precision.loss_scaling is not None:  # fp16: every stage's update of step t waits for the step's flush
        plan.order = defer_updates(order)
    events = stage_events(plan.order, specs, D)
    plan.capacity = [ev.capacity for ev in events]
    wanted = range(D) if only is None else sorted(set(only))
    if any(k not in range(D) for k in wanted):
        raise ValueError(f"only={sorted(set(only or ()))} must name stages in 0..{D - 1}")
    plan.stages = {k: _executor(plan, spec, k, stages[k], events[k]) for k in wanted}
    if plan.precision.loss_scaling is not None:  # one loss scale for the stages built here (all ranks agree per step)
        plan.scaler = LossScaler(plan.precision.loss_scaling, D)
        plan.scaler.members = [plan.stages[k] for k in sorted(plan.stages)]
        for st in plan.stages.values():
            st.scaler = plan.scaler
    _attach_predictors(plan, plan.stages.values(), spec.predictor)
    return plan


def _table_and_stages(model: nn.Module | Sequence[nn.Module], spec: PipelineSpec
                      ) -> tuple[Any, VersionTable, list[nn.Module], Policy]:
    """Placed simulation (or None), table, stages, policy: checked schedule first, not to blame the model for it."""
    sim = _placed_simulation(spec.schedule)
    table = version_table(sim if sim is not None else spec.schedule)
    D = table.D if spec.D is None and isinstance(model, nn.Sequential) else spec.D
    stages = as_stages(model, D, spec.balance)
    if table.D != len(stages):
        raise ValueError(f"the schedule has D={table.D} stages but the model was cut into {len(stages)}")
    policy = make_policy(spec.policy)
    policy.check(table)
    return sim, table, stages, policy


def _order(table: VersionTable, specs: JobSpecs) -> tuple[Sequence[Job], bool]:
    """The schedule's order, unless a job needs a version not yet made (the oracle): :func:`resolve_order`'s."""
    if (specs.base["F"] <= table.forward).all() and (specs.base["B"] <= table.backward).all():
        return table.order, False
    order = resolve_order(table, lambda job: 0 if job[0] == "U" else specs.need(*job))
    return order, tuple(order) != table.order


def stage_events(order: Sequence[Job], specs: JobSpecs, D: int) -> list[StageEvents]:
    """Every stage's events in ``order``, the uses of each of its versions and its ring size.

    Stage-local positions serve emulator and runtime alike: a stage's events keep their relative order in the
    global sequence and in its worker's program.
    """
    op, k, t, j = job_columns(order)
    out = []
    for s in range(D):
        mine = np.flatnonzero(k == s)
        out.append(StageEvents(op[mine], t[mine], j[mine], specs.needs(s, op[mine], t[mine], j[mine])))
    return out


def _executor(plan: PipelinePlan, spec: PipelineSpec, k: int, module: nn.Module, events: StageEvents,
              fetched: bool = False) -> StageExecutor:
    """Stage k's executor with its optimizer (checked and set up by the policy) and scheduler; ``fetched``: none."""
    first = next((p for p in module.parameters() if p.is_floating_point()), None)
    check_precision(plan.precision, torch.device("cpu") if first is None else first.device,
                    None if first is None else first.dtype)
    common = (plan.policy, plan.table, plan.loss_fn, bool(spec.recompute))
    if fetched:
        return FetchedStage(k, plan.D, plan.M, module, events, plan.specs, *common, precision=plan.precision)
    params = trainable_parameters(module)
    opt = spec.optimizer(params) if params else None
    if params and not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
    if opt is not None:
        plan.policy.check_optimizer(opt, k)
        plan.policy.setup_optimizer(opt, k, plan.table)
    ex = StageExecutor(k, plan.D, plan.M, module, opt, events, plan.specs, *common, precision=plan.precision)
    if spec.lr_scheduler is not None and opt is not None:
        ex.scheduler = spec.lr_scheduler(opt)
    return ex


def _placed_simulation(schedule: Any) -> Any:
    """The simulation of a schedule whose stages are computed or held by several workers, else ``None``."""
    from ..schedules import Schedule
    from ..simulator import SimResult, simulate

    if isinstance(schedule, SimResult):
        return schedule if is_placed(schedule.schedule) else None
    if isinstance(schedule, Schedule) and is_placed(schedule):
        return simulate(schedule)
    return None


def _build_placed(plan: PipelinePlan, sim: Any, stages: Sequence[nn.Module], spec: PipelineSpec,
                  worker: int | None) -> None:
    """Fill ``plan`` for a placed schedule: the global sequence and a copy per (worker, stage) computing or holding it.

    After :func:`_refuse_placed`, one pass over the sequence gives each copy its jobs and received broadcasts; every
    holder gets its own optimizer (replicas stay equal: they apply the same reduced gradient).
    """
    places = _refuse_placed(plan, sim.schedule, worker)
    seq = placed_sequence(sim, lambda job: plan.specs.need(*job))
    plan.placement, plan.sequence = places, seq
    parts: dict[tuple[int, int], list[PlacedJob | Collective]] = defaultdict(list)
    for e in seq:
        if not isinstance(e, Collective):
            parts[(e.worker, e.stage)].append(e)
        elif e.kind == "broadcast":
            for w in e.holders:
                parts[(w, e.stage)].append(e)
    capacity = [1] * plan.D
    for w in range(sim.schedule.W) if worker is None else (worker,):
        for k, place in enumerate(places):
            if w not in place.holders and w not in place.compute:
                continue
            own = worker is not None or w == place.holders[0]
            events = _copy_events(parts[(w, k)], plan.specs, k)
            ex = _executor(plan, spec, k, stages[k] if own else copy_module(stages[k]), events,
                           fetched=w not in place.holders)
            capacity[k] = max(capacity[k], events.capacity)
            plan.copies[(w, k)] = ex
            if own:
                plan.stages[k] = ex
    plan.capacity = capacity
    holders = [ex for (w, k), ex in plan.copies.items() if w in places[k].holders]
    _attach_predictors(plan, holders, spec.predictor)


def _refuse_placed(plan: PipelinePlan, schedule: Any, worker: int | None) -> tuple[StagePlacement, ...]:
    """The placements, after refusing what copies cannot serve: fp16's shared skip, non-master versions,
    waiting, per-copy gradient state, predictions on a worker without optimizer state.
    """
    name, policy = schedule.name, plan.policy
    if plan.precision.loss_scaling is not None:
        raise ValueError("fp16 with loss scaling is not supported on placed schedules (replicated or sharded "
                         "stages: DDP, FSDP, LPP, FSLPP, DualPipe, hybrid) yet: their copies would need one "
                         "shared skip decision across the collectives; use bf16 there")
    if plan.precision.versions != "master":
        raise ValueError("placed schedules keep weight versions in the fp32 masters (they are what the "
                         "collectives send); use Precision(..., versions='master')")
    if plan.waited:
        raise ValueError(f"policy {policy.name!r} makes jobs wait for future weights, which placed schedules "
                         f"({name}: stages computed or held by several workers) do not support")
    if policy.corrects_gradient or policy.keeps_backward_weights:
        raise ValueError(f"policy {policy.name!r} corrects the step's gradient from per-copy state, which placed "
                         f"schedules ({name}) do not support; use a single-placement schedule")
    if worker is not None and not 0 <= worker < schedule.W:
        raise ValueError(f"worker={worker} must be in 0..{schedule.W - 1}")
    places = stage_placements(schedule)
    split = plan.table.split_set
    for op in "FB":  # only the predicted jobs can be refused
        for k, t, j in np.argwhere(plan.specs.base[op] != plan.specs.target[op]).tolist():
            w = schedule.worker_of("I" if op == "B" and (k, t, j) in split else op, k, t, j)
            if w not in places[k].holders:
                raise ValueError(f"policy {policy.name!r} predicts stage {k}'s weights on worker {w}, which does "
                                 f"not hold them in {name} (no optimizer state there); use a stored-version policy")
    return places


def _copy_events(part: Sequence[PlacedJob | Collective], specs: JobSpecs, k: int) -> StageEvents:
    """A stage copy's events: its jobs, with the versions a non-holder receives before the job they precede."""
    jobs = [e for e in part if not isinstance(e, Collective)]
    arrivals, n = [], 0
    for e in part:
        if isinstance(e, Collective):
            arrivals.append((n, e.version))
        else:
            n += 1
    op = np.array([OPS.index(e.op) for e in jobs], np.int8)
    t, j = (np.array([getattr(e, f) for e in jobs], np.int32) for f in ("step", "micro"))
    return StageEvents(op, t, j, specs.needs(k, op, t, j), arrivals)


def _attach_predictors(plan: PipelinePlan, stages: Iterable[StageExecutor], predictor: Any) -> None:
    """Give every stage that predicts its predictor (others none); warn when a given predictor goes unused."""
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

    for st in stages:
        if st.k not in plan.predicted_stages:
            continue
        if isinstance(predictor, str):
            pred = make_predictor(predictor)
        elif isinstance(predictor, Predictor) or hasattr(predictor, "predict"):
            pred = predictor
        else:  # a factory stage -> Predictor (PipelineSpec refused anything else)
            pred = predictor(st.k)
        check = getattr(pred, "check", None)
        if check is not None:
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
