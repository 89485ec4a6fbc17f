"""The multi-process pipeline runtime: a schedule × policy run for real, one process per worker.

Rank w executes ``schedule.programs[w]`` on the emulator's pipeline core (:func:`~pipelab.pipeline.driver.run_jobs`,
the executors of :func:`~pipelab.pipeline.plan.build_pipeline` for the stages w computes), so it computes exactly
the emulator's weights; only the transport differs (:mod:`pipelab.runtime.p2p`). Receive buffers are sized once
per input shape by running the model on the ``meta`` device, so a mini-batch shape may change mid-run provided
every rank is given the same shapes (checked before each run). Placed schedules also run collectives
(:mod:`pipelab.runtime.collectives`).

Why not ``torch.distributed.pipelining``: its stages run the live parameters, with no hook to choose a stashed or
predicted version per micro-batch; it is the reference the tests and ``benchmarks/runtime.py`` compare against.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..distributed import check_consistent, describe_differences, differences, heartbeat, resolve_device, waiting
from ..links import Network
from ..pipeline.driver import Batches, DriverState, MiniBatches, all_finite, run_jobs
from ..pipeline.placement import FetchedStage, is_placed, worker_sequence
from ..pipeline.plan import as_stages, build_pipeline
from ..pipeline.spec import PipelineSpec, make_spec
from ..pipeline.stage import StageExecutor
from ..pipeline.transport import Layout, check_handover, describe_handover, map_tensors
from ..precision import optimizer_state_bytes, tensor_bytes
from ..schedules.transfers import consistent_cut
from .collectives import DistributedCollectives
from .meter import MeteredTransport, MeterStats
from .p2p import P2PTransport
from .trace import JobClock, MeasuredTransport, Timeline

__all__ = ["PipelineRuntime", "RuntimeResult"]


@dataclass
class RuntimeResult:
    """What one rank's :meth:`PipelineRuntime.run` returns.

    Attributes:
        losses: mean training loss of every mini-batch (NaN where not reached), gathered from every rank.
        current: cur(job), the version of its stage current when each of this rank's F/B (or I/W) jobs ran.
        weights: final weights of the stages this rank holds, ``k -> tuple`` in ``named_parameters`` order.
        memory: peak bytes: ``weight_versions``, ``activations`` (saved stage inputs), ``optimizer_state`` (at the
            end), per stage ``versions_peak`` and ``stage_bytes``; placed ``fetched_weights``; CUDA
            ``cuda_max_allocated``.
        trace: per step, ``(versions held, saved inputs, pending gradients, unfinished sends)``, to check that
            nothing grows over a run.
        position: index in this rank's program where the run stopped (its end unless ``stop_at_step``).
        steps_done: mini-batches whose loss was computed (all runs since the start).
        diverged, diverged_step: some loss or final weight is NaN or ±inf, and the first such mini-batch (the
            last one done when only the weights are).
        collectives: placed: ``bytes_sent``, ``bytes_received`` and ``calls`` per collective kind.
        meter: with a ``network``, the :class:`~pipelab.runtime.meter.MeterStats` of this rank's receipts.
    """

    rank: int
    stages: list[int]
    losses: list[float]
    current: dict[tuple[str, int, int, int], int]
    weights: dict[int, tuple[Tensor, ...]]
    memory: dict[str, Any]
    trace: list[tuple[int, int, int, int]]
    position: int
    extra: dict[str, Any] = field(default_factory=dict)
    steps_done: int = 0
    diverged: bool = False
    diverged_step: int | None = None
    timeline: Timeline | None = None
    collectives: dict[str, dict[str, int]] = field(default_factory=dict)
    meter: MeterStats | None = None


class PipelineRuntime:
    """Run a schedule × policy on ``torch.distributed`` ranks, one worker per rank.

    Args:
        model: an ``nn.Sequential`` (cut into ``schedule.D`` stages) or all stage modules, built identically on
            every rank; each rank trains only its own stages.
        spec: the run (:class:`~pipelab.pipeline.spec.PipelineSpec`, a ``Schedule`` with ``W`` = world size), or
            its fields as keywords.
        device: default: CUDA device ``LOCAL_RANK`` under NCCL, else CPU.
        rank, world_size: default to the process group's (then every rank's :meth:`fingerprint` is compared).
        config: the caller's JSON-able settings every rank must share and a resumed run must keep.
        record: measure each run (:mod:`pipelab.runtime.trace`) into ``RuntimeResult.timeline``.
        network: meter the messages with this link model (:mod:`pipelab.runtime.meter`): a run on one host takes
            the time it would over these links, with unchanged weights.

    Raises:
        TypeError: a schedule that is not a ``Schedule``; an unknown keyword; a field of the wrong type.
        ValueError: world size ≠ workers; the oracle predictor (not realisable); a ``network`` for a placed
            schedule, for another number of stages, or with ranks on several hosts; a placed schedule with a
            policy it cannot serve (see :func:`~pipelab.pipeline.plan.build_pipeline`); channels whose send and
            receive orders differ; ranks whose configurations disagree (the message names each differing field
            and its values).
    """

    def __init__(self, model: nn.Module | Sequence[nn.Module], spec: PipelineSpec | None = None, *,
                 device: torch.device | str | None = None, rank: int | None = None,
                 world_size: int | None = None, config: Mapping[str, Any] | None = None, record: bool = False,
                 network: Network | None = None, **fields: Any) -> None:
        spec = make_spec(spec, fields, "PipelineRuntime")
        schedule, predictor = spec.schedule, spec.predictor
        if not hasattr(schedule, "programs"):
            raise TypeError(f"schedule must be a pipelab.schedules.Schedule, got {type(schedule).__name__}")
        self.rank = dist.get_rank() if rank is None else rank
        self.world = dist.get_world_size() if world_size is None else world_size
        if schedule.W != self.world:
            raise ValueError(f"schedule {schedule.name!r} has {schedule.W} workers but the world size is "
                             f"{self.world}; launch with --nproc-per-node {schedule.W}")
        if isinstance(predictor, str) and predictor == "oracle":
            raise ValueError("the oracle predictor uses future weights and exists only in the emulator")
        self.schedule = schedule
        self.program: list[Any] = list(schedule.programs[self.rank])
        self.my_stages = sorted({a.stage for a in self.program})
        self.device = resolve_device(_default_device() if device is None else device)
        stages = as_stages(model, schedule.D, spec.balance)
        for k in self.my_stages:
            stages[k].to(self.device)
        self.modules = stages
        self.spec = spec
        self.placed = is_placed(schedule)
        self.plan = build_pipeline(stages, spec, only=self.my_stages, worker=self.rank if self.placed else None)
        if self.plan.waited:
            raise ValueError("this policy needs jobs to wait for future weights; only the emulator can run it")
        self.D, self.M, self.steps = self.plan.D, self.plan.M, self.plan.steps
        self.executors: dict[int, StageExecutor] = self.plan.stages
        self.collectives: DistributedCollectives | None = None
        if self.placed:  # every rank creates every group, in the same order, before any traffic
            self.program = worker_sequence(self.plan.sequence, self.rank)
            self.collectives = DistributedCollectives(self.plan.sequence, self.rank)
        self._meta: dict[str, list[Layout]] = {}  # input form (describe_handover) -> each stage input's layout
        self.transport = P2PTransport(schedule, self.rank, self.device)
        self.meter: MeteredTransport | None = None
        if network is not None:
            self.meter = self._metered(network)
            self.transport = self.meter  # type: ignore[assignment]
        self.record = bool(record)
        if self.record:
            self.transport = MeasuredTransport(self.transport)  # type: ignore[assignment]
        self.state = DriverState()
        self.trace: list[tuple[int, int, int, int]] = []
        self.cut_step = 0  # the mini-batch whose consistent cut this rank stands at (steps: the end)
        self._fingerprint = self._describe(spec.policy, predictor, spec.lr_scheduler, spec.recompute, config)
        self._fingerprint["network"] = None if network is None else repr(network)
        if dist.is_initialized() and rank is None:
            _check_ranks_agree(self.fingerprint(), self.world)

    def _metered(self, network: Network) -> MeteredTransport:
        """The point-to-point transport under ``network``'s link model, its stamps on a board the ranks share."""
        if not isinstance(network, Network):
            raise TypeError(f"network must be a pipelab.links.Network or None, got {type(network).__name__}")
        if self.placed:
            raise ValueError(f"network: placed schedules ({self.schedule.name}) are not metered (their collectives "
                             "would run unmetered); simulate them with simulate(..., network=)")
        if dist.is_initialized() and self.world > 1:
            hosts: list[Any] = [None] * self.world
            dist.all_gather_object(hosts, socket.gethostname())
            if len(set(hosts)) > 1:
                raise ValueError(f"network: a metered run needs every rank on one host (one monotonic clock for "
                                 f"the stamps), got hosts {sorted(set(hosts))}")
        return MeteredTransport(self.transport, network)

    @property
    def position(self) -> int:
        """Index in this rank's program of the next job to run."""
        return self.state.position

    # ------------------------------------------------------------------------------------- resume state

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs besides the model and the configuration, as plain data.

        Call between runs (after ``run(..., stop_at_step=c)``); like ``nn.Module.state_dict`` it references the
        live tensors.
        """
        return {
            "rank": self.rank,
            "position": self.state.position,
            "cut_step": self.cut_step,
            "stages": {k: ex.state_dict() for k, ex in self.executors.items()},
            "local": self.transport.local,
            "outbox": self.transport.outbox,
            "step_loss": dict(self.state.partial),
            "losses": self.state.losses,
            "trace": self.trace,
            "activations": (self.state.act_bytes, self.state.act_peak),
            "stage_activations": (dict(self.state.stage_act_bytes), dict(self.state.stage_act_peak)),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, into a runtime built with the same configuration.

        Raises:
            ValueError: a state with missing keys, of another rank, or without some of this rank's stages.
        """
        keys = ("rank", "position", "cut_step", "stages", "local", "outbox", "step_loss", "losses", "trace",
                "activations")
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"state lacks {', '.join(missing)}: not a PipelineRuntime.state_dict()")
        if state["rank"] != self.rank:
            raise ValueError(f"state of rank {state['rank']} cannot be loaded into rank {self.rank}")
        if sorted(state["stages"]) != sorted(self.executors):
            raise ValueError(f"state holds stages {sorted(state['stages'])}, this rank computes "
                             f"{sorted(self.executors)}")
        for k, ex in self.executors.items():
            ex.load_state_dict(state["stages"][k])
        act_bytes, act_peak = state["activations"]
        stage_bytes, stage_peak = state.get("stage_activations", ({}, {}))
        self.state = DriverState(state["position"], defaultdict(list, state["step_loss"]), dict(state["losses"]),
                                 act_bytes, act_peak, defaultdict(int, stage_bytes), defaultdict(int, stage_peak))
        self.cut_step = state["cut_step"]
        self.transport.local = dict(state["local"])
        self.transport.outbox = list(state["outbox"])
        self.trace = list(state["trace"])

    # ------------------------------------------------------------------------------------- set-up

    def fingerprint(self) -> dict[str, Any]:
        """What every rank must agree on and a resumed run must keep, as JSON-able data (taken at construction;
        compare two with :func:`pipelab.distributed.differences`)."""
        return copy.deepcopy(self._fingerprint)

    def _describe(self, policy: Any, predictor: Any, lr_scheduler: Any, recompute: bool,
                  config: Mapping[str, Any] | None) -> dict[str, Any]:
        progs = hashlib.sha256(repr(self.schedule.programs).encode()).hexdigest()
        pol = self.plan.policy
        optimizers: list[dict[str, Any]] = []
        for k in self.my_stages:  # one entry unless this rank's stages were given different optimizers
            opt = self.executors[k].optimizer
            if opt is None:  # a stage without parameters has no optimizer
                continue
            groups = [{n: _plain(v) for n, v in g.items() if n != "params"} for g in opt.param_groups]
            desc = {"type": type(opt).__name__, **(groups[0] if len(groups) == 1 else {"groups": groups})}
            if desc not in optimizers:
                optimizers.append(desc)
        return _plain({
            "schedule": {"name": self.schedule.name, "D": self.D, "M": self.M, "steps": self.steps,
                         "programs_sha256": progs},
            "policy": {"name": pol.name, "type": type(pol).__name__, "options": pol.options()},
            "predictor": _describe_predictor(predictor if pol.uses_predictor else None, pol, self.D),
            "optimizer": optimizers[0] if len(optimizers) == 1 else (optimizers or None),
            "lr_scheduler": None if lr_scheduler is None else _name(lr_scheduler),
            "loss_fn": _name(self.plan.loss_fn),
            "recompute": bool(recompute),
            "precision": repr(self.plan.precision),
            "codec": [repr(c) for c in self.plan.codecs],
            # a frozen parameter (requires_grad=False) is marked: every rank must train the same ones
            "stages": [[(n, tuple(p.shape), str(p.dtype)) + (() if p.requires_grad else ("frozen",))
                        for n, p in m.named_parameters()] for m in self.modules],
            "config": dict(config) if config is not None else None,
        })

    def _boundaries(self, x: Any, t: int, j: int) -> list[Layout]:
        """The layout of every stage's input for micro-batch j of mini-batch t, ``x`` (index k = input of stage k),
        found by running the stages on the ``meta`` device once per input form (shapes and dtypes)."""
        key = describe_handover(x)
        if key not in self._meta:
            metas = [Layout.of(x)]
            h: Any = map_tensors(lambda v: torch.empty(v.shape, dtype=v.dtype, device="meta"), x)
            with torch.no_grad():
                for i, m in enumerate(self.modules[:-1]):
                    try:
                        h = copy.deepcopy(m).to("meta")(h)
                        check_handover(h, i)
                    except Exception as exc:
                        seen = f"; the first input was {next(iter(self._meta))}" if self._meta else ""
                        raise ValueError(
                            f"rank {self.rank} sizes its receive buffers for micro-batch {j} of mini-batch {t} (input "
                            f"{key}{seen}) by running stages 0..{i} on the meta device, and stage {i} failed "
                            f"({type(exc).__name__}: {exc}): either the model rejects this input's shape, or stage {i} "
                            "cannot run on the meta device (data-dependent shapes, .item())") from exc
                    # under bf16/fp16 activations (and their gradients) cross in the compute dtype, encoded by
                    # the boundary's codec (pipeline.transport.CodedTransport)
                    codec = self.plan.codecs[i] if self.plan.codecs else None
                    metas.append(Layout.of(h, self.plan.precision.boundary_dtype).encoded(codec))
            self._meta[key] = metas
        return self._meta[key]

    def _check_same_data(self, batches: Any, data: MiniBatches, start: int) -> None:
        """Refuse ranks given different input forms from step ``start`` (each sizes its receive buffers from its
        own copy); a callable or an iterable is not read ahead: it may not be repeatable, or holds the data once."""
        if not data.sequence or not dist.is_initialized() or self.world == 1:
            return
        runs: list[tuple[int, str]] = []  # (first step, form: shapes and dtypes) of each run of equal forms
        for t in range(start, self.steps):
            form = describe_handover(data.checked(t)[0])
            if not runs or runs[-1][1] != form:
                runs.append((t, form))
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, runs)
        for r, other in enumerate(every):
            if other != every[0]:
                t, mine, theirs = _first_difference(every[0], other, self.steps)
                raise ValueError(f"rank {r} is given a mini-batch {t} whose input is {theirs}, rank 0 one of "
                                 f"{mine}: every rank must be given the same mini-batches (each sizes its "
                                 "receive buffers from its own copy)")

    # ------------------------------------------------------------------------------------- running

    def run(self, batches: Batches, *, stop_at_step: int | None = None) -> RuntimeResult:
        """Execute this rank's program from where it stands (the start, or a loaded checkpoint).

        Args:
            batches: mini-batch t is ``batches[t]``, ``batches(t)`` or the t-th item of an iterable (a
                ``DataLoader``: read once, in order; every mini-batch from 0, so a resumed run reads past those
                before its cut), the same on every rank.
            stop_at_step: stop at the consistent cut of that mini-batch, for
                :func:`~pipelab.runtime.checkpoint.save_checkpoint`.
        """
        ref = next((p for p in self.modules[0].parameters() if p.is_floating_point()), None)
        data = MiniBatches(batches, self.M, self.steps, reference=ref, device=self.device)
        end = len(self.program)
        self.transport.retain = set()
        if stop_at_step is not None and self.meter is not None:
            raise ValueError("stop_at_step (checkpoints) is not supported for metered runs (network=)")
        if stop_at_step is not None and self.placed:
            raise ValueError(f"stop_at_step (checkpoints) is not supported for placed schedules ({self.schedule.name})")
        if stop_at_step is not None:
            if not isinstance(stop_at_step, int) or not self.cut_step <= stop_at_step <= self.steps:
                raise ValueError(f"stop_at_step must be an int in {self.cut_step}..{self.steps} (this rank stands "
                                 f"at the cut of mini-batch {self.cut_step}), got {stop_at_step!r}")
            cut, in_flight = consistent_cut(self.schedule, stop_at_step)
            end = max(cut[self.rank], self.position)
            self.transport.retain = {(dst, tag, t, j) for src, dst, tag, t, j in in_flight if src == self.rank}
        self._check_same_data(batches, data, self.cut_step)
        self.transport.shape_of = lambda t, j, boundary: self._boundaries(data.micro(t)[0][j], t, j)[boundary]
        self.transport.begin(self.position, end)  # sends kept at a checkpoint's cut go out in this run
        last_stage = self.my_stages[-1]
        meter = self.meter
        if meter is not None:
            program = self.program

            def metered_job(position: int) -> None:
                heartbeat(position)
                meter.job_done(tuple(program[position - 1][:4]))
        after_job: Callable[[int], None] = heartbeat if meter is None else metered_job
        clock = None
        if self.record:  # a fresh timeline per run, t0 after a barrier
            assert isinstance(self.transport, MeasuredTransport)
            self.transport.timeline = Timeline(self.rank)
            clock = JobClock(self.transport, self.program)
            clock.begin()

            def traced(position: int, first: Callable[[int], None] = after_job) -> None:
                first(position)
                clock.job_done(position)
            after_job = traced

        def on_update(ex: StageExecutor, t: int, W: tuple[Tensor, ...]) -> None:
            if ex.k == last_stage:
                self.trace.append(self._held())

        if self.collectives is not None:
            collectives, executors = self.collectives, self.executors
            last = self.D - 1
            parts = Counter(e[2] for e in self.program if e[:2] == ("F", last))  # one pass, not one per step
            run_jobs(self.program, {(self.rank, k): ex for k, ex in executors.items()}, self.transport, data,
                     self.state, D=self.D, M=self.M, end=end, on_update=on_update, after_job=after_job,
                     split=self.plan.table.split_set, placed=True, collective=lambda c: collectives(c, executors),
                     loss_parts=parts.__getitem__, codecs=self.plan.codecs)
        else:
            run_jobs(self.program, self.executors, self.transport, data, self.state, D=self.D, M=self.M, end=end,
                     on_update=on_update, after_job=after_job, split=self.plan.table.split_set,
                     codecs=self.plan.codecs)
        self.transport.flush()
        self.cut_step = self.steps if stop_at_step is None else stop_at_step
        result = self._result()
        if clock is not None:
            result.timeline = clock.finish()
        if meter is not None:
            result.meter = meter.stats
        return result

    def _held(self) -> tuple[int, int, int, int]:
        ex = self.executors.values()
        return (sum(len(e.ring) for e in ex), sum(len(e.saved) for e in ex), sum(len(e.acc) for e in ex),
                self.transport.held())

    def _result(self) -> RuntimeResult:
        losses, done, bad = self._gather_losses()
        fetched = {k for k, e in self.executors.items() if isinstance(e, FetchedStage)}
        current = {key: v for e in self.executors.values() for key, v in e.current.items()}
        weights = {k: tuple(p.detach().cpu().clone() for p in e.full_weights(e.params))
                   for k, e in self.executors.items() if k not in fetched}
        return RuntimeResult(self.rank, list(self.my_stages), losses, current, weights, self._memory(fetched),
                             list(self.trace), self.position, steps_done=len(done), diverged=bool(bad),
                             diverged_step=bad[0] if bad else None,
                             collectives=self.collectives.stats() if self.collectives is not None else {})

    def _gather_losses(self) -> tuple[list[float], set[int], list[int]]:
        """Every rank learns every rank's losses and whether the weights it holds are finite: the losses per
        step, the steps done, and the diverged ones."""
        losses = [math.nan] * self.steps
        held = (p for e in self.executors.values() if not isinstance(e, FetchedStage) for p in e.params)
        mine = (self.state.losses, bool(all_finite(held)))
        parts: list[tuple[dict[int, float], bool] | None] = [None] * self.world
        if dist.is_initialized():
            with waiting(range(self.world), "the gathering of the losses"):
                dist.all_gather_object(parts, mine)
        else:
            parts = [mine]
        done: set[int] = set()
        for part in parts:
            for t, v in (part[0] if part else {}).items():
                # a placed schedule's ranks each sum the losses of their own micro-batches of step t
                losses[t] = losses[t] + v if self.placed and t in done else v
                done.add(t)
        bad = [t for t in sorted(done) if not math.isfinite(losses[t])]
        if not bad and done and not all(part[1] for part in parts if part):
            bad = [max(done)]  # finite losses, but the last update done made some rank's weights non-finite
        return losses, done, bad

    def _memory(self, fetched: set[int]) -> dict[str, Any]:
        """This rank's bytes at their peak (:attr:`RuntimeResult.memory`)."""
        stage_bytes = {k: tensor_bytes(e.params) for k, e in self.executors.items()}
        versions_peak = {k: e.ring.peak for k, e in self.executors.items()}
        opt_bytes = sum(optimizer_state_bytes(e.optimizer) for e in self.executors.values() if e.optimizer is not None)
        memory: dict[str, Any] = {
            "weight_versions": sum(versions_peak[k] * stage_bytes[k] for k in self.executors if k not in fetched),
            "activations": self.state.act_peak,
            "optimizer_state": opt_bytes,
            "versions_peak": versions_peak,
            "stage_bytes": stage_bytes,
            "weight_copies": {k: self.plan.weight_copies[k] for k in self.executors},
        }
        if self.placed:
            memory["fetched_weights"] = sum(versions_peak[k] * stage_bytes[k] for k in fetched)
        if self.device.type == "cuda":  # measured beside the counts above: everything the allocator held
            memory["cuda_max_allocated"] = torch.cuda.max_memory_allocated(self.device)
        return memory


def _default_device() -> torch.device:
    """Under NCCL the rank's current CUDA device (``LOCAL_RANK``'s), else the CPU."""
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def _check_ranks_agree(fp: dict[str, Any], world: int) -> None:
    """Every rank's fingerprint equal (ValueError naming each differing field); the optimizers compared among the
    ranks that have one (a rank whose stages have no parameters has none)."""
    check_consistent({**fp, "optimizer": None}, "pipeline configuration")
    opts: list[Any] = [None] * world
    dist.all_gather_object(opts, fp["optimizer"])
    held = [(r, o) for r, o in enumerate(opts) if o is not None]
    for r, o in held[1:]:
        diffs = differences({"optimizer": held[0][1]}, {"optimizer": o})
        if diffs:
            raise ValueError("ranks disagree on the pipeline configuration:\n"
                             + describe_differences(diffs, f"rank {held[0][0]}", f"rank {r}"))


def _first_difference(a: list[tuple[int, str]], b: list[tuple[int, str]], steps: int) -> tuple[int, str, str]:
    """The first step where two run-length encodings of the input form per step differ, with both forms."""
    def at(runs: list[tuple[int, str]], t: int) -> str:
        return next(r for r in reversed(runs) if r[0] <= t)[1]
    t = next(t for t in range(a[0][0], steps) if at(a, t) != at(b, t))
    return t, at(a, t), at(b, t)


def _name(obj: Any) -> str:
    """A callable's or object's stable name (module and qualified name; no memory address)."""
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(obj).__name__)}"


def _plain(x: Any) -> Any:
    """JSON-able copy of a configuration value (tuples become lists; objects their address-free repr)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if torch.is_tensor(x):
        return x.tolist() if x.numel() <= 16 else f"tensor{list(x.shape)}:{x.dtype}"
    if isinstance(x, torch.dtype):
        return str(x)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(x))


def _describe_predictor(predictor: Any, policy: Any, D: int) -> Any:
    """The configured predictor: a preset name, or a predictor's type, name and options (per stage for a
    factory), so that a rank whose stages predict nothing still reports the run's predictor."""
    if predictor is None:
        predictor = policy.default_predictor if policy.uses_predictor else None
    if predictor is None or isinstance(predictor, str):
        return predictor
    if hasattr(predictor, "predict"):
        options = predictor.options() if hasattr(predictor, "options") else {}
        return {"type": type(predictor).__name__, "name": getattr(predictor, "preset", getattr(predictor, "name", "")),
                "options": options}
    if callable(predictor):
        return {"factory": _name(predictor), "stages": [_describe_predictor(predictor(k), policy, D) for k in range(D)]}
    return _plain(predictor)
