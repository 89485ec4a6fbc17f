"""The calibration study: profile, forecast and measure schedules on spawned ranks; Rahimi's Table 1 measured.

:func:`calibrate` runs every case of a :class:`CalibrationConfig` on real processes: each rank profiles its stages
(:func:`calibrate_rank`), the simulator forecasts the makespan from those costs (:func:`forecast_costs`), the
traced runtime measures it, and :func:`measured_costs` replays the run's own costs (replaying both separates the
model from the profile); one :class:`CalibrationRow` per case
(:func:`format_rows`, :func:`rows_csv`). :func:`rahimi_measured` reads Rahimi's Table 1 off real processes
beside the note's formulas and the simulator. The comparisons themselves are :mod:`pipelab.calibration`'s.

References: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), Table 1; PipeDream
(Narayanan et al., SOSP 2019, §3.1: profile, then plan).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..links import Link, MessageBytes, Network, message_bytes
from ..pipeline.placement import COLLECTIVE_KINDS, Collective
from ..schedules.actions import Schedule, check_int
from ..schedules.builders import BUILDERS
from ..schedules.compiled import OP_CODE, compile_schedule, job_costs
from ..schedules.dependencies import received_from
from ..simulator import SimResult, simulate
from .settings import CALIBRATION_KINDS, RAHIMI_RUNS

if TYPE_CHECKING:
    from .time_to_target import NanoGPTSetting

__all__ = ["schedule_for", "CalibrationCase", "CalibrationConfig", "CalibrationRow", "calibrate",
           "format_rows", "rows_csv", "sampled_forecast", "forecast_costs", "measured_costs", "step_ends",
           "steady_step", "calibrate_rank", "calibration_rows", "receive_overhead",
           "probe_summary",
           "RahimiRunConfig",
           "runtime_table_row", "rahimi_measured", "rahimi_measured_row", "rahimi_throughput"]

# ---------------------------------------------------------------------------------------------------- makespan

def forecast_costs(profile: dict[str, list[float]], transfer: float, capacity: Sequence[int],
                   split_backward: bool, collective: Sequence[float] | None = None, *,
                   network: Network | None = None, message_bytes: MessageBytes | None = None,
                   receive_overhead: float = 0.0) -> dict[str, Any]:
    """The simulator's costs from a profile: F, B (I, W when split) per stage; U plus a weight copy where a stage
    keeps more than one version, plus a placed schedule's ``collective`` time per step (they sit next to the
    update); and the one-way ``transfer`` time, or for a metered run the ``network`` and ``message_bytes``.

    ``receive_overhead`` o (profiled: the meter's wake-up) is LogP's receiver overhead, the network's
    :attr:`~pipelab.links.Network.receive_overhead`: a consumer starts o after its message's arrival at the
    earliest, off the wire."""
    extra = list(collective) if collective is not None else [0.0] * len(profile["u_cost"])
    u = [u + (c if cap > 1 else 0.0) + e
         for u, c, cap, e in zip(profile["u_cost"], profile["copy_cost"], capacity, extra)]
    costs: dict[str, Any] = {"f_cost": profile["f_cost"], "b_cost": profile["b_cost"], "u_cost": u}
    if network is not None and receive_overhead:
        network = dataclasses.replace(network, receive_overhead=receive_overhead)
    costs.update(_links(transfer, network, message_bytes))
    if split_backward:
        costs.update(i_cost=profile["i_cost"], w_cost=profile["w_cost"])
    return costs


def _links(transfer: float, network: Network | None, message_bytes: MessageBytes | None) -> dict[str, Any]:
    """The simulator's link arguments: a scalar transfer time, or a metered run's network and message bytes."""
    if network is None:
        return {"transfer_cost": transfer}
    if message_bytes is None:
        raise ValueError("a metered forecast needs message_bytes (pipelab.links.message_bytes) with its network")
    return {"network": network, "message_bytes": message_bytes}


def measured_costs(timelines: Sequence[Any], D: int, transfer: float, *, network: Network | None = None,
                   message_bytes: MessageBytes | None = None, receive_overhead: float = 0.0) -> dict[str, Any]:
    """Per-stage costs read off every rank's :class:`~pipelab.runtime.trace.Timeline`: the mean duration of each
    stage's F, B, I, W and U jobs (means, not medians: the makespan is a sum, so a heavy tail counts), U plus the
    mean over steps of the longest time a rank spent in the stage's collectives of a step, the ranks' own time
    between jobs (``dispatch_cost``, :func:`_dispatch`) and the transfer latency (:func:`_transfer_latency`).
    A metered run passes its ``network`` and its own mean overshoot
    (:attr:`pipelab.runtime.meter.MeterStats.overshoot`) as ``receive_overhead``, as in :func:`forecast_costs`."""
    durations: dict[tuple[str, int], list[float]] = {}
    for tl in timelines:
        for r in tl.jobs:
            durations.setdefault((r.op, r.stage), []).append(r.duration)

    def med(op: str) -> list[float] | None:
        if not any((op, k) in durations for k in range(D)):
            return None
        return [max(float(statistics.fmean(durations.get((op, k), [0.0]))), 1e-9) for k in range(D)]

    f, b, u, i, w = (med(op) for op in ("F", "B", "U", "I", "W"))
    coll = _collective_costs(timelines, D)
    if coll is not None:
        u = [(u[k] if u is not None else 0.0) + coll[k] for k in range(D)]
    transfer = _transfer_latency(timelines, D, transfer)
    if f is None:
        raise ValueError("the timelines hold no forward job")
    if b is None:  # every backward split: B is only used for the default I/W split, which is given
        b = [x + y for x, y in zip(i or [0.0] * D, w or [0.0] * D)]
    costs: dict[str, Any] = {"f_cost": f, "b_cost": b, "u_cost": u or 0.0}
    dispatch = _dispatch(timelines, D)
    if dispatch is not None and any(any(v) for v in dispatch.values()):
        costs["dispatch_cost"] = dispatch
    if network is not None and receive_overhead:
        network = dataclasses.replace(network, receive_overhead=receive_overhead)
    costs.update(_links(transfer, network, message_bytes))
    if i is not None:
        costs.update(i_cost=i, w_cost=w if w is not None else [1e-9] * D)
    return costs


def step_ends(run: Any) -> dict[int, float]:
    """Each step's end, its last job's over the ranks: of a :class:`~pipelab.simulator.SimResult`, or of a run's
    :class:`~pipelab.runtime.trace.Timeline` s (one per rank, on a shared clock)."""
    if isinstance(run, SimResult):
        steps, ends = run.compiled.step, run.end
        return {int(t): float(ends[steps == t].max()) for t in np.unique(steps[steps >= 0])}
    out: dict[int, float] = {}
    for tl in run:
        for r in tl.jobs:
            if r.step >= 0:
                out[r.step] = max(out.get(r.step, -math.inf), r.end)
    return out


def steady_step(ends: dict[int, float]) -> float:
    """The steady step time: the median spacing of consecutive step ends (:func:`step_ends`) after the first step,
    whose set-up (connections made, buffers first touched, a pipeline's fill) a steady forecast does not model,
    as benchmarks that score a pipeline by its steady step time leave it out; NaN with fewer than two steps."""
    t = [ends[k] for k in sorted(ends)]
    return float(statistics.median(b - a for a, b in zip(t, t[1:]))) if len(t) > 1 else math.nan


def _dispatch(timelines: Sequence[Any], D: int) -> dict[str, list[float]] | None:
    """Per op and stage, a rank's mean own time before a job (the simulator's ``dispatch_cost``): from its previous
    job's end (the first send) to the job's start, or to when it asked for its input from another rank (a job
    that received; the wait for the input is the links'). Per op, as it differs (an update's copies, a backward's
    sends). Each rank's first job is left out (no previous end); ``None`` when there is no sample (timelines
    recorded before ``asked`` was)."""
    gaps: dict[tuple[str, int], list[float]] = {}
    for tl in timelines:
        for prev, r in zip(tl.jobs, tl.jobs[1:]):
            if r.op in OP_CODE and 0 <= r.stage < D and not (r.received and math.isnan(r.asked)):  # no collective
                gap = (r.asked if r.received else r.start) - prev.end
                gaps.setdefault((r.op, r.stage), []).append(max(gap, 0.0))
    if not gaps:
        return None
    return {op: [float(statistics.fmean(gaps.get((op, k), [0.0]))) for k in range(D)]
            for op in dict.fromkeys(op for op, _ in gaps)}


def _transfer_latency(timelines: Sequence[Any], D: int, default: float) -> float:
    """Mean (consumer start − producer end) over received tensors whose consumer was idle when the producer
    ended; ``default`` when there is none."""
    ends = {r.job: r.end for tl in timelines for r in tl.jobs}
    waits = []
    for tl in timelines:
        prev_end = 0.0
        for r in tl.jobs:
            if r.received:  # its producer: the previous stage's F, or the next stage's gradient job (B or I)
                job = (r.op, r.stage, r.step, r.micro)
                producers = received_from(job, D, split=False) + received_from(job, D, split=True)
                end = next((ends[p] for p in producers if p in ends), None)
                if end is not None and prev_end <= end <= r.start:
                    waits.append(r.start - end)
            prev_end = r.end
    return float(statistics.fmean(waits)) if waits else default


def _collective_costs(timelines: Sequence[Any], D: int) -> list[float] | None:
    """Per stage, the mean over steps of the longest time any rank spent in the stage's collectives of a step
    (``None``: no collective ran)."""
    coll: dict[tuple[int, int, int], float] = {}
    for tl in timelines:
        for r in tl.jobs:
            if r.op in COLLECTIVE_KINDS and r.step >= 0:
                key = (r.stage, r.step, tl.rank)
                coll[key] = coll.get(key, 0.0) + r.duration
    if not coll:
        return None
    longest: dict[tuple[int, int], float] = {}
    for (k, t, _), d in coll.items():
        longest[(k, t)] = max(longest.get((k, t), 0.0), d)
    per_stage = [[d for (k, _), d in longest.items() if k == kk] for kk in range(D)]
    return [float(statistics.fmean(per_stage[k])) if per_stage[k] else 0.0 for k in range(D)]



#: seconds a metered calibration pauses before each profiled job (:func:`_profile_split`)
PROFILE_PAUSE_S = 0.01

def schedule_for(kind: str, ranks: int, M: int, steps: int) -> Schedule:
    """The schedule of ``kind`` (a key of :data:`~pipelab.studies.settings.CALIBRATION_KINDS`: gpipe, 1f1b, pipedream,
    2bw, interleaved, zb_h1, ddp,
    ddp_whole, fsdp, lpp, fslpp, hybrid) on ``ranks`` workers, M micro-batches per step, over ``steps`` steps; the
    model is cut into ``ranks`` stages, 2·``ranks`` for interleaved and the data-parallel and looped placements,
    ranks/2 for hybrid (2 replicas), and not at all for ``ddp_whole`` (one stage: the cut torch's DDP runs).

    Raises:
        ValueError: an unknown kind (the message lists the known ones).
    """
    if kind not in CALIBRATION_KINDS:
        raise ValueError(f"kind must be one of {', '.join(CALIBRATION_KINDS)}; got {kind!r}")
    name, args, _, _ = CALIBRATION_KINDS[kind]
    return BUILDERS[name](*args(ranks, M, steps))


@dataclass(frozen=True)
class CalibrationCase:
    """One schedule to calibrate: ``kind`` (see :func:`schedule_for`), its ``policy`` (default: the kind's),
    a row ``label`` (default: the schedule's name)."""

    kind: str
    policy: str | None = None
    label: str | None = None

    def resolved_policy(self) -> str:
        return self.policy if self.policy is not None else CALIBRATION_KINDS[self.kind][3]


@dataclass(frozen=True)
class CalibrationConfig:
    """What one calibration depends on.

    Attributes:
        ranks: processes (workers W); cases: the schedules; width, depth, in_features: the ``deep_mlp``
        (float32; depth ≥ the most stages a case cuts it into); micro: samples per micro-batch; M: micro-batches
        per step (default 2·ranks); steps: steps per run; repeats: timed runs per case (median); profile_reps:
        repeats of each profiled job (median, after 2 discarded); optimizer: a :mod:`pipelab.optim` name;
        seed: model and data seed; timeout_s: bound on the spawn; link, duplex: meter every run with this link
        on every boundary (:mod:`pipelab.runtime.meter`, :meth:`network`) and forecast with it (``None``: unmetered
        runs, forecast with the profiled transfer time); model: instead of the ``deep_mlp`` (width, depth and
        in_features then unused), the transformer of a :class:`~pipelab.studies.time_to_target.NanoGPTSetting`
        (:func:`~pipelab.studies.time_to_target.nanogpt_model`: one block per stage), fed micro-batches of shape
        (micro, seq, d_model) with a mean-squared-error loss against a random target of that shape.
        pilot_steps: steps of each metered pilot run (:func:`_receive_probe`; its first is set-up, not sampled).
    """

    ranks: int = 2
    cases: tuple[CalibrationCase, ...] = tuple(CalibrationCase(k) for k in ("gpipe", "1f1b", "pipedream", "2bw",
                                                                           "interleaved", "zb_h1"))
    width: int = 512
    depth: int = 8
    in_features: int = 64
    micro: int = 32
    microbatches: int | None = None
    steps: int = 4
    repeats: int = 3
    profile_reps: int = 10
    optimizer: str = "sgdm"
    seed: int = 0
    timeout_s: float = 600.0
    link: Link | None = None
    duplex: bool = False
    model: NanoGPTSetting | None = None
    pilot_steps: int = 4

    @property
    def M(self) -> int:
        return 2 * self.ranks if self.microbatches is None else self.microbatches

    def network(self, D: int) -> Network | None:
        """The metered network of a D-stage cut: :attr:`link` on every boundary (``None`` when not metered)."""
        return None if self.link is None else Network.uniform(D, self.link, duplex=self.duplex)

    def check(self) -> None:
        """Raise ``ValueError`` naming the first bad field, before any process is spawned.

        Counts must be ints (``ranks=2.0`` is refused, not truncated); a case's policy and the optimizer must be
        registered names (an unknown policy would otherwise only turn its row into "not runnable").
        """
        from ..optim import OPTIMIZERS
        from ..policies import POLICIES

        for name in ("ranks", "width", "depth", "in_features", "micro", "steps", "repeats", "profile_reps"):
            check_int(name, getattr(self, name))
        if self.microbatches is not None:
            check_int("microbatches", self.microbatches)
        check_int("seed", self.seed, 0)
        check_int("pilot_steps", self.pilot_steps, 2)  # its first step is not sampled
        for c in self.cases:
            if c.kind not in CALIBRATION_KINDS:
                raise ValueError(f"case kind must be one of {', '.join(CALIBRATION_KINDS)}; got {c.kind!r}")
            if c.policy is not None and c.policy not in POLICIES:
                raise ValueError(f"case {c.kind!r}: policy must be one of {', '.join(POLICIES)}; got {c.policy!r}")
        if self.link is not None and not isinstance(self.link, Link):
            raise TypeError(f"link must be a pipelab.links.Link or None, got {type(self.link).__name__}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {self.optimizer!r}")
        if self.model is None and self.depth < 2 * self.ranks:
            raise ValueError(f"depth ({self.depth}) must be >= 2 × ranks ({2 * self.ranks}): a block per stage")
        if self.model is not None and self.model.D < self.ranks:
            raise ValueError(f"model has {self.model.D} blocks, fewer than ranks ({self.ranks}): a block per stage")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {self.timeout_s!r}")


@dataclass
class CalibrationRow:
    """One schedule's forecast against its measurement.

    Attributes:
        label, kind, policy, ranks, schedule (its name); runnable: whether the runtime ran it (``note`` says why
        not); measured_s: median over repeats of the measured makespan (t0 after a barrier to the last job's
        end on any rank), measured_all: every repeat's; forecast_s: the simulator's makespan with the profiled
        costs; error: forecast / measured − 1; busy_error: the same for the busiest rank's compute time (sum of
        job durations), which separates profiling error from waiting and transfer; samples: per run;
        timelines: every rank's :class:`~pipelab.runtime.trace.Timeline` of the median repeat; costs: the
        keyword arguments given to :func:`~pipelab.simulator.simulate`.
        measured_costs, replay_s, replay_error: the same forecast with each stage's F/B/I/W/U cost taken as
        the mean duration of its jobs in the median run's timeline, its ranks' mean time between jobs
        (dispatch) and the run's own mean transfer latency (:func:`measured_costs`): what is left of the error
        is the simulator's model (dependencies, one fixed latency per transfer, mean durations), not the profile.
        collective_s: the most time any rank of the median run spent in collectives (placed schedules).
        late: in a metered run (``CalibrationConfig.link``), the median run's late messages over all ranks
        (:class:`~pipelab.runtime.meter.MeterStats`); link_time: the forecast's share of the makespan its critical
        path spends on links (:attr:`~pipelab.simulator.SimResult.link_time`); overshoot: the median run's mean
        time from a waited-for message's modelled arrival to its job getting it, over the ranks
        (:attr:`~pipelab.runtime.meter.MeterStats.overshoot`), which the replay takes as its receive overhead;
        receive_overhead: the profiled one the forecast takes (:func:`receive_overhead`,
        :func:`pipelab.studies.calibration.forecast_costs`); probe: what the probes measured of the metered transport
        (:func:`probe_summary`, the same for every row of a calibration; empty when not metered).
        A metered forecast takes its compute costs from the case's pilot runs (:func:`_receive_probe`, one right
        before each measured run: the mean duration of each stage's F, B, I, W, U jobs over them, as
        :func:`measured_costs` reads them, after each one's first step; its forecast_s and forecast_steady_s are
        means over simulations with durations drawn job by job from the pilots',
        :func:`sampled_forecast`: spread durations lengthen a makespan),
        not from the stages profiled one by one: under load those missed the run's job times by −20 % to +250 %
        (a job timed alone after a pause is not a job in a stream); profile_s, profile_error: the forecast with
        the stage profile, kept beside it (NaN when not metered).
        collective_cost: per stage, the profiled collective time per step the forecast adds to the stage's
        update (placed schedules; empty otherwise); the replay charges the measured ones likewise.
        steady_s, forecast_steady_s, steady_error: the steady step time (:func:`steady_step`:
        the median spacing of step ends after the first step, whose set-up no steady forecast models) measured
        (median over repeats) and forecast, and forecast / measured − 1 (NaN with fewer than two steps).
    """

    label: str
    kind: str
    policy: str
    ranks: int
    schedule: str = ""
    runnable: bool = True
    note: str = ""
    measured_s: float = math.nan
    measured_all: list[float] = field(default_factory=list)
    forecast_s: float = math.nan
    error: float = math.nan
    busy_error: float = math.nan
    samples: int = 0
    timelines: list[Any] = field(default_factory=list)
    costs: dict[str, Any] = field(default_factory=dict)
    measured_costs: dict[str, Any] = field(default_factory=dict)
    replay_s: float = math.nan
    replay_error: float = math.nan
    collective_s: float = 0.0
    collective_cost: list[float] = field(default_factory=list)
    late: int = 0
    overshoot: float = 0.0
    receive_overhead: float = 0.0
    probe: dict[str, float] = field(default_factory=dict)
    profile_s: float = math.nan
    profile_error: float = math.nan
    link_time: float = math.nan
    steady_s: float = math.nan
    forecast_steady_s: float = math.nan
    steady_error: float = math.nan

    @property
    def throughput(self) -> float:
        """Samples per second of the median run (NaN when not runnable)."""
        return self.samples / self.measured_s if self.runnable else math.nan

    sim_schedule: Any = field(default=None, repr=False)

    def simulate(self) -> SimResult:
        """The forecast's simulation at its mean costs (for the timeline figure)."""
        if self.sim_schedule is None or not self.runnable:
            raise ValueError(f"row {self.label!r} has no forecast (not runnable: {self.note})")
        return simulate(self.sim_schedule, **self.costs)


def sampled_forecast(schedule: Schedule, costs: dict[str, Any], timelines: Sequence[Any], *, draws: int = 32,
                     seed: int = 0) -> tuple[float, float]:
    """The forecast's mean makespan and mean steady step time (:func:`steady_step`) over ``draws`` simulations
    whose job durations are drawn job by job from the ``timelines``' own durations of the same op and stage (a
    pilot run's: :func:`measured_costs` takes their means), the rest of ``costs`` (links, dispatch) kept.

    A makespan is a max-plus expression of the durations, convex in them, so its mean over spread durations is
    at least its value at their means (Jensen): where job times spread (ranks sharing cores), mean costs forecast
    short. Ops and stages without a sample keep their cost from ``costs``."""
    c = compile_schedule(schedule)
    base = job_costs(c, costs["f_cost"], costs["b_cost"], costs.get("u_cost", 0.0), costs.get("i_cost"),
                     costs.get("w_cost"))
    pools: dict[tuple[int, int], list[float]] = {}
    for tl in timelines:
        for r in tl.jobs:
            if r.op in OP_CODE:
                pools.setdefault((OP_CODE[r.op], r.stage), []).append(r.duration)
    groups = [(np.flatnonzero((c.op == op) & (c.stage == k)), np.asarray(pool)) for (op, k), pool in pools.items()]
    rng = np.random.default_rng(seed)
    spans, steps = [], []
    for _ in range(draws):
        cost = base.copy()
        for idx, pool in groups:
            cost[idx] = rng.choice(pool, size=len(idx))
        sim = simulate(schedule, **costs, job_cost=cost)
        spans.append(sim.makespan)
        steps.append(steady_step(step_ends(sim)))
    return float(np.mean(spans)), float(np.mean(steps))


def _base(cfg: CalibrationConfig) -> nn.Sequential:
    """The calibration's model (seeded by the caller): the ``deep_mlp``, or ``cfg.model``'s transformer."""
    if cfg.model is not None:
        from .time_to_target import nanogpt_model

        return nanogpt_model(cfg.model)
    from .models import deep_mlp

    return deep_mlp(in_features=cfg.in_features, width=cfg.width, depth=cfg.depth)


def _loss(cfg: CalibrationConfig) -> Callable[[Tensor, Tensor], Tensor]:
    return nn.functional.mse_loss if cfg.model is not None else nn.functional.cross_entropy


def _sample(cfg: CalibrationConfig, n: int) -> tuple[int, ...]:
    """The shape of ``n`` samples of the model's input (and of a transformer's target)."""
    return (n, cfg.model.seq, cfg.model.d_model) if cfg.model is not None else (n, cfg.in_features)


def _micro_data(cfg: CalibrationConfig, device: torch.device) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(cfg.seed + 1)
    n = cfg.M * cfg.micro
    return [(torch.randn(_sample(cfg, n), generator=g).to(device),
             (torch.randn(_sample(cfg, n), generator=g) if cfg.model is not None else
              torch.randint(0, 10, (n,), generator=g)).to(device)) for _ in range(2)]


def _profile_split(base: nn.Sequential, D: int, rank: int, world: int, cfg: CalibrationConfig, x: Tensor,
                   y: Tensor) -> dict[str, list[float]]:
    """Every stage's F, B, I, W, U and weight-copy times when ``base`` is cut into D stages; stage k is profiled
    by rank k mod world, all ranks at once (sharing the cores as in the run), then gathered. Each time is the
    *mean* of ``profile_reps`` single measurements (:func:`~pipelab.profiling.profile_stage` with one
    repetition, after a warm-up call), as the makespan sums job times (see :func:`measured_costs`).

    A metered run (``cfg.link``) computes in bursts: a rank waits for its message, then runs a job. Each
    measurement then follows a pause of :data:`PROFILE_PAUSE_S`, as in the run: on a loaded machine a process that
    computes without pause exhausts its time slice and is preempted (a mean of 9–13 ms against a median of 1 ms
    for a 1 ms F+B on this project's 2-core machine at load 23), while one that wakes from a sleep runs its short
    job at once (1.3 ms mean). Such a burst is rarely preempted in the run, so a metered profile takes the
    *median* of the measurements: the mean of ten would be dominated by one preempted measurement (it
    overestimated the run's job times 3–4× at load 10–13)."""
    from ..optim import optimizer_factory
    from ..partition import split
    from ..profiling import profile_stage

    stages = split(copy.deepcopy(base), D)
    keys = {"f_cost": "f", "b_cost": "b", "i_cost": "i", "w_cost": "w", "u_cost": "u", "copy_cost": "copy"}
    mine: dict[int, dict[str, float]] = {}
    h = x
    for k, s in enumerate(stages):
        if k % world == rank:
            def once(warmup: int, s: nn.Module = s, h: Tensor = h, k: int = k) -> Any:
                return profile_stage(s, h, y if k == D - 1 else None, loss_fn=_loss(cfg),
                                     optimizer=optimizer_factory(cfg.optimizer),
                                     reps=1, warmup=warmup, input_grad=k > 0)

            once(2)
            samples = []
            for _ in range(cfg.profile_reps):
                if cfg.link is not None:  # a metered rank computes in bursts after waiting: profile it so
                    time.sleep(PROFILE_PAUSE_S)
                samples.append(once(0))
            stat = statistics.fmean if cfg.link is None else statistics.median
            mine[k] = {name: float(stat(getattr(c, a) for c in samples)) for name, a in keys.items()}
        with torch.no_grad():
            h = s(h)
    parts: list[Any] = [mine]
    if dist.is_initialized():
        parts = [None] * world
        dist.all_gather_object(parts, mine)
    every = {k: c for p in parts for k, c in p.items()}
    return {name: [every[k][name] for k in range(D)] for name in keys}


def _receive_probe(base: nn.Sequential, case: CalibrationCase, cfg: CalibrationConfig,
                   data: Sequence[tuple[Tensor, Tensor]]) -> dict[str, Any]:
    """What a pilot run tells of this machine: a metered run of ``cfg.pilot_steps`` steps of the case right before
    a measured run (traced, not timed), its first step left out (connections set up, buffers touched).
    ``"pilot"``: its :class:`~pipelab.runtime.trace.Timeline`, the jobs of the later steps (their durations are
    the metered forecast's costs, :func:`calibration_rows`). Per received message
    (:class:`~pipelab.runtime.meter.MeteredMessage`):

    - ``"overhead"``: for a message its job waited for and that was not late, the time from its modelled arrival
      to the job getting it (:attr:`~pipelab.runtime.meter.MeteredMessage.overshoot`): the receive overhead o,
      the wake-up from the meter's hold and the hand-over (a late message's wait is the stamp's, not o);
    - ``"busy"``: the same for a message its job asked for after the arrival (the hand-over alone);
    - ``"late"``: 1.0 per late message, 0.0 per other.

    :func:`calibration_rows` pools them (:func:`receive_overhead`, :func:`probe_summary`). Collective: every rank
    calls it."""
    from ..optim import optimizer_factory
    from ..runtime import PipelineRuntime

    sched = schedule_for(case.kind, dist.get_world_size() if dist.is_initialized() else 1, cfg.M, cfg.pilot_steps)
    probe = PipelineRuntime(copy.deepcopy(base), schedule=sched, policy=case.resolved_policy(),
                            optimizer=optimizer_factory(cfg.optimizer), loss_fn=_loss(cfg),
                            network=cfg.network(sched.D), record=True)
    res = probe.run(lambda t: data[t % len(data)])
    meter, tl = res.meter, res.timeline
    assert tl is not None  # record=True
    out: dict[str, Any] = {"overhead": [], "busy": [], "late": [],
                           "pilot": dataclasses.replace(tl, jobs=[r for r in tl.jobs if r.step])}
    for m in (meter.messages if meter is not None else []):
        if m.step == 0:
            continue
        out["late"].append(float(m.late))
        if not m.late:
            out["overhead" if m.asked < m.arrival else "busy"].append(m.overshoot)
    return out


def _pooled(per_rank: Sequence[dict[str, Any]], what: str) -> list[float]:
    return [x for p in per_rank for c in p["cases"] for probe in c.get("probes", []) for x in probe.get(what, [])]


def receive_overhead(per_rank: Sequence[dict[str, Any]]) -> float:
    """The profiled receive overhead of a metered calibration: the median of every rank's waited-for, not late
    probe messages over every case (:func:`_receive_probe`; 0 without any). LogP's receiver overhead *o*
    (Culler et al., PPoPP 1993), which the forecast charges after every arrival
    (:attr:`pipelab.links.Network.receive_overhead`), apart from the links' α. A property of the machine (a
    process's wake-up after a sleep, the hand-over), not of the schedule, so all cases' samples are pooled; the
    median, as a descheduled wake-up now and then is a heavy tail the makespan does not sum over every message."""
    every = _pooled(per_rank, "overhead")
    return float(statistics.median(every)) if every else 0.0


def probe_summary(per_rank: Sequence[dict[str, Any]]) -> dict[str, float]:
    """What the probes measured of the metered transport (:func:`_receive_probe`), pooled over ranks and cases:
    o (``overhead``, its quartiles ``overhead_q1``/``overhead_q3`` and ``samples``), the hand-over of a message
    already there (``busy``, median) and the ``late`` share of the messages; NaN where there were none."""
    def q(xs: list[float], p: float) -> float:
        return float(statistics.quantiles(xs, n=100, method="inclusive")[round(p) - 1]) if len(xs) > 1 else \
            (xs[0] if xs else math.nan)

    o, busy, late = (_pooled(per_rank, w) for w in ("overhead", "busy", "late"))
    return {"overhead": receive_overhead(per_rank) if o else math.nan, "overhead_q1": q(o, 25),
            "overhead_q3": q(o, 75), "samples": float(len(o)),
            "busy": float(statistics.median(busy)) if busy else math.nan,
            "late": float(statistics.fmean(late)) if late else math.nan}


def _transfer(cfg: CalibrationConfig, rank: int, world: int) -> float:
    """One-way time of a boundary tensor (the first boundary's, float32) between neighbouring ranks: the *mean*
    of single ping-pongs / 2 over boundaries and repeats (a makespan sums latencies along its critical path, so
    their mean, heavy tail of descheduled wake-ups included, is what it sees, not their median)."""
    from ..profiling import transfer_times

    if world < 2:
        return 0.0
    act = torch.zeros((cfg.micro, cfg.width) if cfg.model is None else _sample(cfg, cfg.micro))
    out, inp = (act if rank < world - 1 else None), (act if rank > 0 else None)
    transfer_times(out, inp, reps=2, warmup=1)  # connections set up, buffers touched
    samples = [t for _ in range(cfg.profile_reps) for t in transfer_times(out, inp, reps=1, warmup=0)]
    return float(statistics.fmean(samples))


def _profile_collectives(rt: Any, sched: Schedule, cfg: CalibrationConfig) -> list[float]:
    """Per stage k, the time the collectives of one step of k take, profiled on this machine: every distinct
    collective of the placed schedule's sequence (kind, members, stage) is run ``profile_reps`` times (after one
    warm-up) on its process group with a payload of the stage's bytes, every rank taking part in the same
    order; its time is the slowest member's mean. Stage k's cost is the sum over its collectives in the
    sequence divided by the steps (what :func:`forecast_costs` charges to U(k, t), as :func:`measured_costs`
    does with the measured ones). Collective: every rank calls it with the same arguments."""
    import time

    coll = rt.collectives
    seq = [e for e in rt.plan.sequence if isinstance(e, Collective)]
    numel = _stage_numels(sched.D, cfg)
    distinct = list(dict.fromkeys((c.kind, c.members, c.root, c.stage) for c in seq))
    times: dict[tuple[str, tuple[int, ...], int, int], float] = {}
    for kind, members, root, k in distinct:
        mine = coll.rank in members
        buf = torch.zeros(numel[k])
        samples = []
        for rep in range(cfg.profile_reps + 1):
            t0 = time.perf_counter()
            if mine:
                group = coll.groups[members]
                if kind == "all_reduce":
                    dist.all_reduce(buf, group=group)
                elif kind == "reduce":
                    dist.reduce(buf, dst=root, group=group)
                else:
                    dist.broadcast(buf, src=root, group=group)
            if rep:
                samples.append(time.perf_counter() - t0)
        times[(kind, members, root, k)] = float(statistics.fmean(samples)) if mine else 0.0
    parts: list[Any] = [times]
    if dist.is_initialized():
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, times)
    slowest = {key: max(p[key] for p in parts) for key in times}
    out = [0.0] * sched.D
    for c in seq:
        out[c.stage] += slowest[(c.kind, c.members, c.root, c.stage)] / sched.steps
    return out


def _message_bytes(D: int, cfg: CalibrationConfig) -> Any:
    """The bytes of each boundary's messages when the calibration's model is cut into D stages (a shape pass over
    one micro-batch, :func:`pipelab.links.message_bytes`): what the metered forecast bills."""
    from ..partition import split

    return message_bytes(split(_base(cfg), D), torch.zeros(_sample(cfg, cfg.micro)))


def _stage_numels(D: int, cfg: CalibrationConfig) -> list[int]:
    """Parameters of each of the D stages the calibration's model is cut into (float32 payloads)."""
    from ..partition import split

    return [sum(p.numel() for p in s.parameters()) for s in split(_base(cfg), D)]


def calibrate_rank(rank: int, world: int, cfg: CalibrationConfig,
                   extra: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """What each rank of :func:`calibrate` does: profile, then run every case ``repeats`` times with the trace.

    Cases are interleaved within a repeat, so that load from other processes hits them alike; a metered run
    follows its case's pilot run (:func:`_receive_probe`), which sees the same load; ``extra(rep)``
    (e.g. a benchmark's reference runs) is called at the end of every repeat, its results returned under
    ``"extra"``. Collective: every rank of the default process group calls it with the same arguments.
    Combine the ranks' returns with :func:`calibration_rows`.
    """
    from ..optim import optimizer_factory
    from ..runtime import PipelineRuntime
    device = torch.device("cpu")
    torch.manual_seed(cfg.seed)
    base = _base(cfg)
    data = _micro_data(cfg, device)
    x0, y0 = data[0][0][:cfg.micro], data[0][1][:cfg.micro]
    transfer = _transfer(cfg, rank, world)
    profiles: dict[int, dict[str, list[float]]] = {}
    cases: list[dict[str, Any]] = []
    runtimes: list[Any] = []
    for case in cfg.cases:
        sched = schedule_for(case.kind, world, cfg.M, cfg.steps)
        info: dict[str, Any] = {"schedule": sched.name, "runnable": True, "note": "", "timelines": [], "late": [],
                                "overshoot": [], "probes": []}
        try:
            rt = PipelineRuntime(copy.deepcopy(base), schedule=sched, policy=case.resolved_policy(),
                                 optimizer=optimizer_factory(cfg.optimizer), loss_fn=_loss(cfg), record=True,
                                 network=cfg.network(sched.D))
        except ValueError as exc:  # e.g. a placement the runtime does not execute yet
            info.update(runnable=False, note=str(exc).splitlines()[0])
            rt = None
        if rt is not None:
            info["capacity"] = list(rt.plan.capacity)
            if sched.D not in profiles:
                profiles[sched.D] = _profile_split(base, sched.D, rank, world, cfg, x0, y0)
            if rt.collectives is not None:
                info["collective_cost"] = _profile_collectives(rt, sched, cfg)
        cases.append(info)
        runtimes.append(rt)
    extras: list[Any] = []
    for rep in range(cfg.repeats):
        for case, info, rt in zip(cfg.cases, cases, runtimes):
            if rt is None:
                continue
            if rep > 0:  # a fresh run from the same weights
                rt = PipelineRuntime(copy.deepcopy(base), schedule=rt.schedule, policy=case.resolved_policy(),
                                     optimizer=optimizer_factory(cfg.optimizer), loss_fn=_loss(cfg), record=True,
                                     network=cfg.network(rt.schedule.D))
            if cfg.link is not None:  # its pilot right before it: the same load on the machine
                info["probes"].append(_receive_probe(base, case, cfg, data))
            res = rt.run(lambda t: data[t % len(data)])
            info["timelines"].append(res.timeline)
            info["late"].append(0 if res.meter is None else res.meter.late)
            info["overshoot"].append(0.0 if res.meter is None else res.meter.overshoot)
        if extra is not None:
            extras.append(extra(rep))
    return {"rank": rank, "profiles": profiles, "transfer": transfer, "cases": cases, "extra": extras}


def calibrate(cfg: CalibrationConfig | None = None, *, backend: str = "gloo") -> list[CalibrationRow]:
    """Profile, forecast and measure every case of ``cfg`` on ``cfg.ranks`` spawned processes (see the module
    docstring); one :class:`CalibrationRow` per case, in order, the not-runnable ones included.

    Raises:
        ValueError: a bad configuration (:meth:`CalibrationConfig.check`).
    """
    from ..distributed import spawn

    cfg = cfg or CalibrationConfig()
    cfg.check()
    per_rank = spawn(calibrate_rank, cfg.ranks, (cfg,), backend=backend, timeout_s=cfg.timeout_s,
                     comm_timeout_s=120.0)
    return calibration_rows(per_rank, cfg)


def calibration_rows(per_rank: Sequence[dict[str, Any]], cfg: CalibrationConfig) -> list[CalibrationRow]:
    """The rows of a calibration from every rank's :func:`calibrate_rank` result (index = rank)."""
    rows = []
    transfer = float(statistics.fmean(p["transfer"] for p in per_rank))
    overhead = receive_overhead(per_rank)
    probe = probe_summary(per_rank) if cfg.link is not None else {}
    for i, case in enumerate(cfg.cases):
        info = per_rank[0]["cases"][i]
        sched = schedule_for(case.kind, cfg.ranks, cfg.M, cfg.steps)
        row = CalibrationRow(case.label or sched.name, case.kind, case.resolved_policy(), cfg.ranks, sched.name,
                             info["runnable"], info["note"], samples=cfg.steps * cfg.M * cfg.micro)
        row.sim_schedule = sched
        rows.append(row)
        if not info["runnable"]:
            continue
        reps = [[p["cases"][i]["timelines"][r] for p in per_rank] for r in range(cfg.repeats)]
        spans = [max(tl.makespan for tl in tls) for tls in reps]
        order = sorted(range(len(spans)), key=spans.__getitem__)
        mid = order[len(order) // 2]
        row.measured_all, row.measured_s, row.timelines = spans, float(statistics.median(spans)), reps[mid]
        network = cfg.network(sched.D)
        mb = None if network is None else _message_bytes(sched.D, cfg)
        profiled = forecast_costs(per_rank[0]["profiles"][sched.D], transfer, info["capacity"],
                                  bool(sched.split_set), info.get("collective_cost"), network=network,
                                  message_bytes=mb, receive_overhead=overhead)
        row.costs = profiled
        if network is not None:  # the pilot run's job durations: jobs as they run metered on this machine
            row.profile_s = simulate(sched, **profiled).makespan
            pilots = [probe["pilot"] for p in per_rank for probe in p["cases"][i]["probes"]]
            row.costs = measured_costs(pilots, sched.D, transfer,
                                       network=network, message_bytes=mb, receive_overhead=overhead)
        row.late = sum(p["cases"][i]["late"][mid] for p in per_rank)
        row.receive_overhead, row.probe = overhead, probe
        row.overshoot = float(statistics.fmean(p["cases"][i]["overshoot"][mid] for p in per_rank))
        row.collective_cost = list(info.get("collective_cost", []))
        sim = simulate(sched, **row.costs)
        row.forecast_s, row.forecast_steady_s = sim.makespan, steady_step(step_ends(sim))
        if network is not None:  # durations drawn from the pilots' own: their spread lengthens the makespan
            row.forecast_s, row.forecast_steady_s = sampled_forecast(sched, row.costs, pilots)
        row.steady_s = float(statistics.median(steady_step(step_ends(tls)) for tls in reps))
        row.steady_error = row.forecast_steady_s / row.steady_s - 1.0
        row.link_time = sim.link_time
        row.error = row.forecast_s / row.measured_s - 1.0
        row.profile_error = row.profile_s / row.measured_s - 1.0
        busy = max(tl.busy for tl in row.timelines)
        row.busy_error = float(sim.busy.max()) / busy - 1.0
        row.collective_s = max(sum(j.duration for j in tl.jobs if j.op in COLLECTIVE_KINDS) for tl in row.timelines)
        row.measured_costs = measured_costs(row.timelines, sched.D, transfer, network=network, message_bytes=mb,
                                            receive_overhead=row.overshoot)
        row.replay_s = simulate(sched, **row.measured_costs).makespan
        row.replay_error = row.replay_s / row.measured_s - 1.0
    return rows


def format_rows(rows: Sequence[CalibrationRow], target: float = 0.10) -> str:
    """A table of the forecast against the measurement, one line per schedule (misses and not-runnable rows
    included)."""
    lines = [f"{'schedule':<34} {'policy':<9} {'ranks':>5} {'measured ms':>11} {'forecast ms':>11} {'error':>7} "
             f"{'busy err':>8} {'replay':>7}  within ±{100 * target:.0f}%"]
    for r in rows:
        if not r.runnable:
            lines.append(f"{r.label:<34} {r.policy:<9} {r.ranks:>5} not runnable: {r.note}")
            continue
        ok = "yes" if abs(r.error) <= target else "MISSED"
        lines.append(f"{r.label:<34} {r.policy:<9} {r.ranks:>5} {1e3 * r.measured_s:>11.1f} "
                     f"{1e3 * r.forecast_s:>11.1f} {100 * r.error:>+6.1f}% {100 * r.busy_error:>+7.1f}% "
                     f"{100 * r.replay_error:>+6.1f}%  {ok}")
    return "\n".join(lines)


def rows_csv(rows: Sequence[CalibrationRow]) -> str:
    """The rows as CSV: label, kind, policy, ranks, runnable, measured_s (median), measured_min, measured_max,
    forecast_s, error, busy_error, replay_s, replay_error, samples_per_s, collective_s, note."""
    head = ("label,kind,policy,ranks,runnable,measured_s,measured_min_s,measured_max_s,forecast_s,error,busy_error,"
            "replay_s,replay_error,samples_per_s,collective_s,note")
    out = [head]
    for r in rows:
        lo = min(r.measured_all) if r.measured_all else math.nan
        hi = max(r.measured_all) if r.measured_all else math.nan
        note = r.note.replace('"', "'")
        out.append(f'"{r.label}",{r.kind},{r.policy},{r.ranks},{r.runnable},{r.measured_s:.6g},{lo:.6g},{hi:.6g},'
                   f'{r.forecast_s:.6g},{r.error:.4f},{r.busy_error:.4f},{r.replay_s:.6g},{r.replay_error:.4f},'
                   f'{r.throughput:.6g},{r.collective_s:.6g},"{note}"')
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------- Rahimi's Table 1, measured

@dataclass(frozen=True)
class RahimiRunConfig:
    """Rahimi's Table 1 on real processes (:func:`rahimi_measured`).

    Attributes:
        S: stages; B: micro-batches per step; G, R: groups and workers per group (LPP, FSLPP); schemes: which of
        :data:`~pipelab.studies.settings.RAHIMI_RUNS`; width: the ``deep_mlp``'s width, also its input and class
        count, so that every stage holds the same weights (width² + width) and every boundary tensor is micro ×
        width (the note's unit weights and unit activations); micro: samples per micro-batch; repeats: runs per
        scheme (the latency is their median); seed; timeout_s: bound on each spawn.
    """

    S: int = 4
    B: int = 4
    G: int = 2
    R: int = 2
    schemes: tuple[str, ...] = ("DDP", "FSDP", "PP", "LPP", "FSLPP")
    width: int = 512
    micro: int = 256
    repeats: int = 3
    seed: int = 0
    timeout_s: float = 600.0

    def schedule(self, scheme: str) -> Schedule:
        """The scheme's one-step schedule (raises ``ValueError`` naming the known schemes)."""
        if scheme not in RAHIMI_RUNS:
            raise ValueError(f"scheme must be one of {', '.join(RAHIMI_RUNS)}; got {scheme!r}")
        name, args, kwargs, _ = RAHIMI_RUNS[scheme]
        return BUILDERS[name](*args(self.S, self.B, self.G, self.R, 1), **kwargs)


def _rahimi_rank(rank: int, world: int, cfg: RahimiRunConfig, schemes: Sequence[str]) -> list[list[dict[str, Any]]]:
    """Each scheme of ``schemes`` (all on ``world`` workers) ``cfg.repeats`` times with the trace; per run this
    rank's timeline, memory report and collective counters."""
    from ..runtime import PipelineRuntime
    from .models import deep_mlp

    torch.manual_seed(cfg.seed)
    base = deep_mlp(in_features=cfg.width, width=cfg.width, depth=cfg.S, num_classes=cfg.width)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    n = cfg.B * cfg.micro
    batch = (torch.randn(n, cfg.width, generator=g), torch.randint(0, cfg.width, (n,), generator=g))
    out = []
    for scheme in schemes:
        runs = []
        for _ in range(cfg.repeats):
            rt = PipelineRuntime(copy.deepcopy(base), schedule=cfg.schedule(scheme), policy=RAHIMI_RUNS[scheme][3],
                                 optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01), record=True)
            res = rt.run([batch])
            runs.append({"timeline": res.timeline, "memory": res.memory, "collectives": res.collectives})
        out.append(runs)
    return out


def runtime_table_row(parts: Sequence[dict[str, Any]], activation_unit: int, weight_unit: int) -> dict[str, float]:
    """Rahimi's Table 1 columns read off one measured run (max over ranks, as
    :func:`rahimi_measured_row` reads a simulation).

    Args:
        parts: every rank's ``{"timeline", "memory", "collectives"}`` of the run (index = rank).
        activation_unit: bytes of one stage-boundary tensor; weight_unit: bytes of one stage's weights.

    Returns:
        ``W``; ``latency``: the run's makespan (first start to last end over ranks, one host clock) over the
        mean F job duration plus the mean B job duration of all ranks (one stage's F+B, measured);
        ``activation_xmit``: activation bytes received / ``activation_unit``; ``weight_xmit``: weight bytes
        received by broadcast / ``weight_unit`` (one per fetched (stage, version): the runtime's count,
        :attr:`~pipelab.simulator.SimResult.weight_fetches`); ``activation_storage``: peak saved stage inputs
        / ``activation_unit``; ``weight_storage``: peak bytes of own weight versions / ``weight_unit``.
    """
    if activation_unit <= 0 or weight_unit <= 0:
        raise ValueError(f"activation_unit and weight_unit must be positive, got {activation_unit}, {weight_unit}")
    tls = [p["timeline"] for p in parts]
    if any(tl is None for tl in tls):
        raise ValueError("parts have no timeline: run the PipelineRuntime with record=True")
    f = [r.duration for tl in tls for r in tl.jobs if r.op == "F"]
    b = [r.duration for tl in tls for r in tl.jobs if r.op in ("B",)]
    if not f or not b:
        raise ValueError("the run has no F or no fused B job: latency in F+B units is undefined")
    unit = statistics.fmean(f) + statistics.fmean(b)
    return {
        "W": float(len(parts)),
        "latency": max(tl.makespan for tl in tls) / unit,
        "activation_xmit": max(tl.received["activation"] for tl in tls) / activation_unit,
        "weight_xmit": max((p["collectives"] or {}).get("bytes_received", {}).get("broadcast", 0)
                           for p in parts) / weight_unit,
        "activation_storage": max(p["memory"]["activations"] for p in parts) / activation_unit,
        "weight_storage": max(p["memory"]["weight_versions"] for p in parts) / weight_unit,
    }


def rahimi_measured(cfg: RahimiRunConfig | None = None, *, backend: str = "gloo") -> list[dict[str, Any]]:
    """Rahimi's Table 1 rows three ways: the note's formulas, the simulator, and real processes.

    Every scheme of ``cfg`` runs one step through :class:`~pipelab.runtime.PipelineRuntime` with ``record=True``
    on W spawned ranks (one spawn per distinct W), ``cfg.repeats`` times; its columns are read off the
    measurement (:func:`runtime_table_row`).

    Returns:
        one row per scheme: ``scheme``, ``schedule`` (its name), ``params`` (S, B, G, R), ``policy``,
        ``note`` (:func:`~pipelab.papers.rahimi_row`), ``simulated``
        (:func:`rahimi_measured_row`: weight transfers by Rahimi's per-F-job count),
        ``simulated_fetches`` (the simulator's max :attr:`~pipelab.simulator.SimResult.weight_fetches`, the
        runtime's count), ``runtime`` (the measured columns; latency the median over repeats),
        ``latency_all`` (every repeat's), ``units`` (activation and weight bytes of one unit).

    Raises:
        ValueError: an unknown scheme, or a configuration a builder refuses.
    """
    from ..distributed import spawn
    from ..papers import rahimi_row

    cfg = cfg or RahimiRunConfig()
    scheds = {s: cfg.schedule(s) for s in cfg.schemes}
    act_unit = cfg.micro * cfg.width * 4
    weight_unit = (cfg.width * cfg.width + cfg.width) * 4
    by_world: dict[int, list[str]] = {}
    for s, sched in scheds.items():
        by_world.setdefault(sched.W, []).append(s)
    measured: dict[str, list[list[dict[str, Any]]]] = {}
    for world, names in by_world.items():
        per_rank = spawn(_rahimi_rank, world, (cfg, names), backend=backend, timeout_s=cfg.timeout_s,
                         comm_timeout_s=120.0)
        for i, name in enumerate(names):
            measured[name] = [[per_rank[w][i][rep] for w in range(world)] for rep in range(cfg.repeats)]
    rows = []
    for s, sched in scheds.items():
        runs = [runtime_table_row(parts, act_unit, weight_unit) for parts in measured[s]]
        row = dict(runs[0])
        row["latency"] = float(statistics.median(r["latency"] for r in runs))
        sim = simulate(sched)
        G, R = (cfg.G, cfg.R) if s in ("LPP", "FSLPP") else (1, 1)
        rows.append({"scheme": s, "schedule": sched.name, "params": {"S": cfg.S, "B": cfg.B, "G": G, "R": R},
                     "policy": RAHIMI_RUNS[s][3], "note": rahimi_row(s, cfg.S, cfg.B, G, R),
                     "simulated": rahimi_measured_row(sim), "simulated_fetches": float(sim.weight_fetches.max()),
                     "runtime": row, "latency_all": [r["latency"] for r in runs],
                     "counted": [{k: v for k, v in r.items() if k != "latency"} for r in runs],
                     "units": {"activation_bytes": act_unit, "weight_bytes": weight_unit}})
    return rows


def rahimi_measured_row(result: Any) -> dict[str, float]:
    """The Table 1 quantities of a :class:`~pipelab.simulator.SimResult` (max over workers)."""
    return {
        "W": float(result.schedule.W),
        "latency": float(result.latency_units),
        "activation_xmit": float(result.activation_transfers.max()),
        "weight_xmit": float(result.weight_transfers.max()),
        "activation_storage": float(result.peak_activations.max()),
        "weight_storage": float(result.weight_storage.max()),
    }


def rahimi_throughput(result: Any) -> tuple[float, float]:
    """(ρ, M/S): Rahimi's throughput per worker ρ = S·B / (L·W), and the bound M_peak / S."""
    s = result.schedule
    B = s.M * s.steps
    rho = s.D * B / (result.latency_units * s.W)
    return rho, float(result.peak_activations.max()) / s.D
