"""Plan a pipeline: where to cut the model, which schedule, how many micro-batches, and why that plan wins.

Inputs: per-block costs (:class:`Blocks`), W devices, a memory cap per device in bytes, the global batch B and the
communication model, passed to :func:`~pipelab.simulator.simulate` unchanged (``transfer_cost``, or a link model).

A plan: a schedule (V stages per device when interleaved or V-shaped), M micro-batches of B/M samples (block times
and bytes scale linearly), a policy, recompute or not, and the n blocks cut into D = V·W contiguous stages. Its step
time is the steady period T = (E[a + r] − E[a]) / r, E[t] the end of step t's last job: a = r = 1 of three steps if
flushed (:func:`~pipelab.simulator.steady_state`'s period); if asynchronous, a = ⌈W/M⌉ past the fill, r = 2a before
the drain (within 1 % of a long run's, measured). Objective: T, or T × ``steps_to_target(schedule, policy)``. A plan
fits when each device's peak bytes are under the cap: simulated peak activations (with recompute: stage inputs), a
receive buffer per inbound channel, the trainable weights with their stashed copies
(:func:`~pipelab.precision.weight_memory`; copies: the version table's stash depth), a gradient and the optimizer
state of them, and the frozen weights once.

Search per schedule × M × recompute: (1) the min-max partition of F + B (:func:`~pipelab.partition.balanced_partition`);
(2) move a block across a boundary of a stage the critical path computes longest (over the cap: of the device most
over it) while the plan improves; (3) branch and bound over all partitions, pruned by T ≥ max_w work_w (a device runs
a step's jobs per period): when it completes within the budgets, the best plan is optimal (``Plans.exact``). As
PipeDream profiles, then partitions (Narayanan et al., SOSP 2019, §3.1); refining the min-max partition on the critical
stage of a schedule-aware simulation follows an open torch.distributed.pipelining proposal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from . import links
from .calibration import EXACT_VERSION_POLICIES, boundary_bytes, optimizer_state_slots
from .partition import balanced_partition
from .policies import make_policy
from .precision import as_precision, weight_memory
from .profiling import profile_stages
from .schedules import BUILDERS
from .schedules.compiled import OP_CODE
from .simulator import BINDINGS, SimResult, simulate

__all__ = ["Blocks", "Plan", "Plans", "CriticalPath", "plan", "critical_path", "SCHEDULES"]

#: the schedules searched, each with its default policy; ``interleaved*:V`` loop V stages per device
SCHEDULES: dict[str, str] = dict.fromkeys(("gpipe", "1f1b", "interleaved", "interleaved_zb", "zb_h1", "zb_h2", "zb_v",
                                          "dualpipe_v"), "sequential") | {"pipedream": "stashing", "2bw": "2bw"}
_DEFAULT = ("gpipe", "1f1b", "interleaved:2", "zb_h1", "zb_h2", "zb_v", "dualpipe_v", "pipedream", "2bw")
_F, _U = OP_CODE["F"], OP_CODE["U"]
_WORKER = BINDINGS.index("worker")
Comm = float | links.Link | Callable[[Sequence[float]], Mapping[str, Any]]


def _floats(name: str, values: Any, n: int, positive: bool) -> tuple[float, ...]:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size != n or not np.all(np.isfinite(arr)) or np.any(arr <= 0 if positive else arr < 0):
        raise ValueError(f"{name} must be {n} finite values {'> 0' if positive else '>= 0'} (one per block), got "
                         f"{list(values)[:8]}")
    return tuple(arr.tolist())


def _count(name: str, value: Any, what: str, most: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(f"{name}={value!r}: {what}; use an int from 1" + (f" to {most}" if most < math.inf else ""))


@dataclass(frozen=True)
class Blocks:
    """Per-block costs for a micro-batch of ``batch`` samples: ``f``, ``b`` > 0 s; ``i``, ``w`` > 0 (split backward;
    default b/2 each); ``u`` ≥ 0 (update); bytes (default 0): ``activation_bytes`` saved for the backward,
    ``output_bytes`` (crossing a cut after the block), ``weight_bytes`` (the trainable masters: versioned, with a
    gradient and optimizer state), ``frozen_bytes`` (frozen parameters, held once), ``input_bytes`` (model input)."""

    f: Sequence[float]
    b: Sequence[float]
    i: Sequence[float] | None = None
    w: Sequence[float] | None = None
    u: Sequence[float] | None = None
    activation_bytes: Sequence[float] | None = None
    output_bytes: Sequence[float] | None = None
    weight_bytes: Sequence[float] | None = None
    input_bytes: int = 0
    batch: int = 1
    frozen_bytes: Sequence[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.f)
        for name, default in (("f", 1.0), ("b", 1.0), ("i", 0.5), ("w", 0.5), ("u", 0.0), ("activation_bytes", 0.0),
                              ("output_bytes", 0.0), ("weight_bytes", 0.0), ("frozen_bytes", 0.0)):
            v = getattr(self, name)
            object.__setattr__(self, name, _floats(name, [default * x for x in self.b] if v is None else v, n,
                                                   name in "fbiw"))
        _count("batch", self.batch, "samples per profiled micro-batch")

    @classmethod
    def measure(cls, model: nn.Sequential, x: Tensor, target: Tensor, **profile: Any) -> Blocks:
        """Profile each block of ``model`` on ``(x, target)`` (:func:`~pipelab.profiling.profile_stages`, with the
        keywords) and its output's bytes (:func:`~pipelab.calibration.boundary_bytes`)."""
        p = profile_stages(list(model), x, target, **profile)
        sizes = boundary_bytes(list(model), x)  # the inputs of blocks 0..n−1: block i's output is input i+1
        return cls(p.f_cost, p.b_cost, p.i_cost, p.w_cost, p.u_cost, p.activation_bytes, sizes[1:] + [0],
                   p.weight_bytes, sizes[0], int(x.shape[0]), p.frozen_bytes)


@dataclass(frozen=True)
class CriticalPath:
    """The jobs bounding the window ``[start, end]`` of ``sim`` (a steady step): action ids in time order, each starting
    as the previous ends or after its input's transfer (a gap); a job on another device than the next is a wait."""

    sim: SimResult = field(repr=False)
    jobs: tuple[int, ...]
    start: float
    end: float

    def time_by(self, kind: str) -> dict[int, float]:
        """Seconds in the window per stage (``"compute"``) or per boundary k → k+1 (``"transfer"``: the gap before a
        job, its message; into F(k) the activation crosses boundary k − 1, into B/I(k) the gradient boundary k; a
        job its worker bound has none, its gap is the worker's dispatch)."""
        c, prev, out = self.sim.compiled, self.start, dict[int, float]()
        for j in self.jobs:
            t0, t1 = max(float(self.sim.start[j]), self.start), float(self.sim.end[j])
            span, key = (t1 - t0, int(c.stage[j])) if kind == "compute" else (t0 - prev, c.stage[j] - (c.op[j] == _F))
            if kind == "transfer" and self.sim.binding.kind[j] == _WORKER:  # its worker's dispatch, not a link
                span = 0.0
            if span > 0:
                out[int(key)] = out.get(int(key), 0.0) + span
            prev = t1
        return out

    def relieve(self) -> str:
        """The stage or link holding the largest share of the window: what to relieve first."""
        stage = max(((t, f"stage {k}") for k, t in self.time_by("compute").items()), default=(0.0, "nothing"))
        link = max(((t, f"link {k}→{k + 1}") for k, t in self.time_by("transfer").items()), default=(0.0, ""))
        t, what = max(stage, link)
        return f"{what} ({t / max(self.end - self.start, 1e-300):.0%} of the step)"


def _comm(link: Comm, nbytes: list[float]) -> Mapping[str, Any]:
    """The simulator's keywords for ``link`` and the bytes crossing each stage boundary: a
    :class:`~pipelab.links.Link` on every boundary (gradients as large as activations), a function of the bytes, or
    seconds per message (``transfer_cost``)."""
    if isinstance(link, links.Link):
        return {"network": links.Network.uniform(len(nbytes) + 1, link), "message_bytes": nbytes}
    return link(nbytes) if callable(link) else {"transfer_cost": link}


def critical_path(sim: SimResult, start: float | None = None, end: float | None = None) -> CriticalPath:
    """The critical path of ``sim`` in ``[start, end]`` (default: the whole run), found post hoc: from the job that
    ends at ``end`` back, each job's binding predecessor (:attr:`~pipelab.simulator.SimResult.binding`)."""
    t0, t1 = float(sim.start.min()) if start is None else start, float(sim.end.max()) if end is None else end
    tol = 1e-9 * max(abs(t1), 1.0)
    j, jobs = int(np.flatnonzero(np.abs(sim.end - t1) <= tol)[-1]), []
    while j >= 0 and sim.end[j] > t0 + tol:
        jobs.append(j)
        j = int(sim.binding.job[j])
    return CriticalPath(sim, tuple(reversed(jobs)), t0, t1)


@dataclass(frozen=True)
class Plan:
    """A plan: schedule, M, policy, recompute, blocks per stage (``sizes``), the device of each stage; its steady
    ``step_time`` (s), ``bubble``, ``objective``, bytes per device (``memory[w]``: activations, receive, weights,
    gradients, optimizer_state, total), critical path and simulation."""

    schedule: str
    M: int
    policy: str
    recompute: bool
    sizes: tuple[int, ...]
    devices: tuple[int, ...]
    step_time: float
    bubble: float
    objective: float
    memory: tuple[dict[str, int], ...]
    critical: CriticalPath
    sim: SimResult = field(repr=False)

    @property
    def peak_memory(self) -> tuple[int, ...]:  # bytes per device
        return tuple(m["total"] for m in self.memory)

    def explain(self) -> str:
        """One line: the plan, its step time and memory, and what bounds it."""
        return (f"{self.schedule} M={self.M} {self.policy}{' recompute' if self.recompute else ''} stages "
                f"{list(self.sizes)}: step {self.step_time:.4g} s, bubble {self.bubble:.0%}, peak "
                f"{max(self.peak_memory) / 2**20:.1f} MiB; relieve {self.critical.relieve()}")


class Plans(tuple[Plan, ...]):
    """Ranked plans, best first (each schedule × M × policy × recompute with its best partition); ``exact``: every
    partition the bound could not rule out was simulated; ``simulations``; ``skipped``: schedule × M refused, why."""

    exact: bool
    simulations: int
    skipped: dict[str, str]


class _Search:
    """A :func:`plan` call's state; ``seen``: (arm, policy, sizes) → (objective, bytes over the cap, peak bytes)."""

    def __init__(self, blocks: Blocks, W: int, memory: Any, batch: int, link: Comm, optimizer: Any, precision: Any,
                 budget: int, partition: Sequence[int] | None) -> None:
        _count("devices", W, f"the model has {len(blocks.f)} blocks and every device needs one", len(blocks.f))
        _count("global_batch", batch, "samples per step")
        if partition is not None and (sum(partition) != len(blocks.f) or min(partition) < 1):
            raise ValueError(f"partition={list(partition)} must be positive block counts summing to {len(blocks.f)}")
        slots = optimizer if isinstance(optimizer, int) else optimizer_state_slots(
            optimizer([nn.Parameter(torch.empty(1, device="meta"))]))
        if slots is None:
            raise ValueError("the optimizer's state size is unknown; pass optimizer= its weight-sized state tensors "
                             "per parameter (SGD 0, momentum 1, Adam 2)")
        self.blocks, self.W, self.batch, self.link, self.slots, self.budget = blocks, W, batch, link, slots, budget
        self.cap = np.broadcast_to(np.asarray(memory, dtype=np.float64), (W,)).copy()
        self.precision, self.simulations, self.best = as_precision(precision), 0, math.inf
        self.seen: dict[tuple[_Arm, int, tuple[int, ...]], tuple[float, float, int]] = {}
        self.partition, self.skipped = partition, dict[str, str]()


class _Arm:
    """One schedule × V × M × recompute: its schedule, the device of each stage, memoised simulations."""

    def __init__(self, ctx: _Search, name: str, V: int, M: int, recompute: bool, policies: list[str],
                 factors: list[float]) -> None:
        self.ctx, self.name, self.M, self.recompute = ctx, name, M, recompute
        self.policies, self.factors = policies, factors
        self.scale = ctx.batch / (M * ctx.blocks.batch)  # samples per micro-batch / profiled samples
        T, self.a, self.r = 3, 1, 1
        if name in ("pipedream", "2bw"):  # past the fill, 2⌈W/M⌉ steps, then the drain
            self.a, self.r = -(-ctx.W // M), -(-ctx.W // M) * 2
            T = self.a + self.r + 1 - (-(ctx.W - 1) // M)
        self.schedule = BUILDERS[name](*((ctx.W, V, M, T) if "interleaved" in name else (ctx.W, M, T)))
        self.D = self.schedule.D
        if self.D > len(ctx.blocks.f) or (ctx.partition is not None and len(ctx.partition) != self.D):
            raise ValueError(f"{self.D} stages need {self.D} blocks, the model has {len(ctx.blocks.f)}" if
                             ctx.partition is None else f"{self.D} stages, the partition has {len(ctx.partition)}")
        self.holder = np.array([h[0] for h in self.schedule.weight_holders])
        # versions follow each device's program order, not the costs: one unit-cost table serves every partition
        table = simulate(self.schedule).version_table if self.schedule.sync_lag is None else None
        self.copies = [_copies(p, table, self.D) for p in policies]
        self.memo: dict[tuple[float, ...], tuple[SimResult, float, float, float]] = {}

    def stage_costs(self, sizes: Sequence[int]) -> dict[str, np.ndarray]:
        """Per-stage sums of the block arrays; times and activation bytes for B/M samples."""
        bl, cut = self.ctx.blocks, np.concatenate([[0], np.cumsum(sizes)])
        out = {}
        for key in ("f", "b", "i", "w", "u", "activation_bytes", "weight_bytes", "frozen_bytes"):
            p = np.concatenate([[0.0], np.cumsum(getattr(bl, key))])
            out[key] = p[cut[1:]] - p[cut[:-1]]
        out["output_bytes"] = np.asarray(bl.output_bytes)[cut[1:] - 1]
        if self.recompute:  # the backward re-runs the forward first; only the stage input stays saved
            out["b"], out["i"] = out["b"] + out["f"], out["i"] + out["f"]
            out["activation_bytes"] = np.concatenate([[bl.input_bytes], out["output_bytes"][:-1]])
        return out | {k: out[k] * self.scale for k in ("f", "b", "i", "w", "activation_bytes", "output_bytes")}

    def simulate(self, sizes: Sequence[int]) -> tuple[SimResult, float, float, float]:
        """(simulation, step time, bubble, end of step a + r) of ``sizes``, shared by partitions with the same
        per-stage costs."""
        c = self.stage_costs(sizes)
        key = tuple(np.concatenate([c[k] for k in ("f", "b", "i", "w", "u", "activation_bytes", "output_bytes")]))
        if key not in self.memo:
            link = self.ctx.link
            comm = _comm(link, c["output_bytes"][:-1].tolist())
            sim = simulate(self.schedule, c["f"], c["b"], u_cost=c["u"], i_cost=c["i"], w_cost=c["w"],
                           activation_bytes=c["activation_bytes"], **comm)
            self.ctx.simulations += 1
            cc, ends = sim.compiled, np.full(self.schedule.steps, -np.inf)
            np.maximum.at(ends, cc.step, sim.end)
            period = float(ends[self.a + self.r] - ends[self.a]) / self.r
            work = float(sim.cost[(cc.step == 0) & (cc.op != _U)].sum()) / self.ctx.W
            self.memo[key] = (sim, period, 1.0 - work / period, float(ends[self.a + self.r]))
        return self.memo[key]

    def memory(self, sizes: Sequence[int], sim: SimResult, p: int) -> list[dict[str, int]]:
        """Bytes per device of ``sizes`` under policy ``p`` (the module docstring's model)."""
        c, ctx, act = self.stage_costs(sizes), self.ctx, sim.peak_activation_bytes
        assert act is not None  # activation_bytes given
        out = [{"activations": int(a), "receive": 0, "weights": 0, "gradients": 0, "optimizer_state": 0} for a in act]
        for k, w in enumerate(self.holder.tolist()):
            if k and self.holder[k - 1] != w:  # the activation comes in, its gradient goes back: a buffer each
                out[w]["receive"] += int(c["output_bytes"][k - 1])
                out[int(self.holder[k - 1])]["receive"] += int(c["output_bytes"][k - 1])
            P = int(c["weight_bytes"][k])  # the stage's masters as one fp32 meta tensor, for the memory model
            meta = torch.empty(P // 4, device="meta")
            out[w]["weights"] += weight_memory(ctx.precision, [meta], self.copies[p][k], 0)["total"] + int(
                c["frozen_bytes"][k])  # frozen parameters: held once, no version, gradient or state
            out[w]["gradients"] += P
            out[w]["optimizer_state"] += ctx.slots * P
        for m in out:
            m["total"] = sum(m.values())
        return out

    def key(self, sizes: Sequence[int]) -> tuple[float, float]:
        """Score ``sizes`` for every policy (into ``seen``); its rank: (bytes over the cap, objective)."""
        sim, period, _, _ = self.simulate(sizes)
        best = (math.inf, math.inf)
        for p, factor in enumerate(self.factors):
            peaks = np.array([m["total"] for m in self.memory(sizes, sim, p)])
            excess, obj = float(np.max(peaks - self.ctx.cap)), period * factor
            self.ctx.seen[(self, p, tuple(sizes))] = (obj, excess, int(peaks.max()))
            if excess <= 0:
                self.ctx.best = min(self.ctx.best, obj)
            best = min(best, (max(excess, 0.0), obj))
        return best

    def refine(self, sizes: list[int]) -> None:
        """Move one block across a boundary of a stage to relieve while the plan improves (budget allowing): over the
        cap, the stages of the device most over it; else the three the critical path computes longest."""
        current = self.key(sizes)
        while self.ctx.simulations < self.ctx.budget:
            sim, period, _, end = self.simulate(sizes)
            if current[0] > 0:
                worst = int(np.argmax([m["total"] for m in self.memory(sizes, sim, 0)] - self.ctx.cap))
                focus = [k for k in range(self.D) if self.holder[k] == worst]
            else:
                path = critical_path(sim, end - period, end).time_by("compute")
                focus = sorted(path, key=path.__getitem__, reverse=True)[:3]
            for k in focus:  # one block from stage k to stage k + d
                moves = [[x - (j == k) + (j == k + d) for j, x in enumerate(sizes)] for d in (-1, 1)
                         if 0 <= k + d < self.D and sizes[k] > 1]
                if moves and (best := min((self.key(m), m) for m in moves))[0] < current:
                    current, sizes = best
                    break
            else:
                return

    def branch(self, nodes: int) -> bool:
        """Branch and bound over every partition; False when a budget ran out first."""
        bl, D, n, W = self.ctx.blocks, self.D, len(self.ctx.blocks.f), self.ctx.W
        f, b, i, w, u = (np.asarray(getattr(bl, key)) for key in "fbiwu")
        per = self.M * self.scale * (f * (2.0 if self.recompute else 1.0) + np.minimum(b, i + w)) + u
        pre = np.concatenate([[0.0], np.cumsum(per)]).tolist()
        holder, sizes, load, left = self.holder.tolist(), [], [0.0] * W, [nodes]

        def visit(k: int, i: int) -> bool:  # stage k starts at block i; False: out of budget
            left[0] -= 1
            # T ≥ max_w work_w: a partition where some device's work reaches the best found cannot beat it
            bound = self.ctx.best / min(self.factors) * (1 + 1e-9)
            if left[0] < 0 or self.ctx.simulations >= self.ctx.budget:
                return False
            if (sum(load) + pre[n] - pre[i]) / W >= bound:
                return True
            for e in range(i + 1, n - (D - 1 - k) + 1) if k < D - 1 else (n,):
                dev, add = holder[k], pre[e] - pre[i]
                if load[dev] + add >= bound:  # more blocks only add work
                    break
                sizes.append(e - i)
                load[dev] += add
                ok = self.key(sizes) is not None if k == D - 1 else visit(k + 1, e)
                load[dev] -= add
                sizes.pop()
                if not ok:
                    return False
            return True

        return visit(0, 0)


def _copies(policy: str, table: Any, D: int) -> list[int]:
    """Weight copies per stage: the stash depth for policies that keep exactly the versions their jobs use (one on a
    flushed schedule, ``table`` None), else the copies the policy's paper states."""
    if table is not None:
        make_policy(policy).check(table)  # e.g. a synchronous policy on an asynchronous schedule
    if policy in EXACT_VERSION_POLICIES:
        return [1] * D if table is None else [table.stash_depth(k) for k in range(D)]
    stated = [make_policy(policy).stated_weight_copies(k, D) or 0 for k in range(D)]
    if not all(stated):
        raise ValueError(f"policy {policy!r} states no weight copies; plan with one of {EXACT_VERSION_POLICIES} "
                         "or a policy whose paper states them")
    return stated


def _factor(steps_to_target: Any, name: str, policy: str) -> float:
    """Steps to the target (1 without a penalty), from a callable or a ``{(schedule, policy): steps}`` table."""
    try:
        v = 1.0 if steps_to_target is None else steps_to_target(name, policy) if callable(steps_to_target) else \
            steps_to_target[(name, policy)]
    except KeyError:
        raise ValueError(f"steps_to_target has no entry for ({name!r}, {policy!r})") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"steps_to_target({name!r}, {policy!r}) must be a finite number > 0, got {v!r}")
    return float(v)


def _arms(ctx: _Search, schedules: Sequence[str], Ms: Sequence[int], recompute: Sequence[bool],
          policies: Mapping[str, Sequence[str]], steps_to_target: Any) -> list[_Arm]:
    """Every schedule × M × recompute the builders accept; the others in ``ctx.skipped`` with the reason."""
    arms, skipped = [], ctx.skipped
    for spec in schedules:
        name, _, v = str(spec).partition(":")
        if name not in SCHEDULES:
            raise ValueError(f"unknown schedule {spec!r}; choose from {', '.join(SCHEDULES)} ('interleaved:V')")
        pols = list(policies.get(name, (SCHEDULES[name],)))
        factors = [_factor(steps_to_target, name, p) for p in pols]
        for M, rc in ((M, rc) for M in Ms for rc in recompute):
            label = f"{spec} M={M}" + (" recompute" if rc else "")
            if ctx.batch % M:
                skipped[label] = f"global_batch={ctx.batch} is not a multiple of M={M}"
                continue
            try:
                arms.append(_Arm(ctx, name, int(v or 2), M, bool(rc), pols, factors))
            except ValueError as e:
                skipped[label] = str(e)
    return arms


def plan(blocks: Blocks, devices: int, memory: float | Sequence[float] = math.inf, *, global_batch: int,
         link: Comm = 0.0, schedules: Sequence[str] = _DEFAULT, micro_batches: Sequence[int] | None = None,
         recompute: Sequence[bool] = (False,), policies: Mapping[str, Sequence[str]] | None = None,
         steps_to_target: Any = None, optimizer: int | Callable[[Any], torch.optim.Optimizer] = 2,
         precision: Any = "fp32", max_simulations: int = 300, nodes: int = 2000, top: int = 10,
         partition: Sequence[int] | None = None) -> Plans:
    """Rank plans for ``blocks`` on ``devices`` devices of ``memory`` bytes each (one cap, or one per device) for
    ``global_batch`` samples per step (the module docstring). ``link``: seconds per message between devices, a
    :class:`~pipelab.links.Link` on every boundary, or ``bytes per boundary -> simulate keywords``. Tried:
    ``schedules`` (:data:`SCHEDULES`; ``"interleaved:V"``: V stages per device), ``micro_batches`` (default W, 2W,
    4W, 8W), ``recompute``, ``policies`` (schedule → names). ``steps_to_target``: ``(schedule, policy) -> steps``,
    callable or mapping; ``optimizer``: state tensors per parameter (Adam 2) or a ``torch.optim`` factory;
    ``precision`` of the weight copies; budgets ``max_simulations`` (in all) and ``nodes`` (branch and bound, per
    schedule × M); ``top`` plans returned; ``partition``: score these block counts per stage only (no search). Raises
    ValueError naming the constraint: more devices than blocks, no schedule × M the builders accept (each with its
    reason), no plan under the cap (the least memory needed, where)."""
    ctx = _Search(blocks, devices, memory, global_batch, link, optimizer, precision, max_simulations, partition)
    arms = _arms(ctx, schedules, micro_batches or [devices * 2**e for e in range(4)], recompute, policies or {},
                 steps_to_target)
    if not arms:
        raise ValueError("no schedule × M to plan: " + "; ".join(f"{k}: {v}" for k, v in ctx.skipped.items()))
    cuts = {(D, rc): list(partition or balanced_partition([(1.0 + rc) * f + b for f, b in zip(blocks.f, blocks.b)], D))
            for D, rc in {(arm.D, arm.recompute) for arm in arms}}
    keys = {arm: arm.key(cuts[(arm.D, arm.recompute)]) for arm in arms}  # (1) the min-max partition
    arms.sort(key=keys.__getitem__)  # best arms first: (2) refined, then (3) branch and bound
    for arm in arms if partition is None else ():
        arm.refine(cuts[(arm.D, arm.recompute)])
    return _ranked(ctx, partition is not None or all([arm.branch(nodes) for arm in arms]), top)


def _ranked(ctx: _Search, exact: bool, top: int) -> Plans:
    """The best partition of each arm × policy that fits, best first, or the error naming the least memory needed."""
    fits = sorted((o, peak, arm.name, arm.M, p, s, arm) for (arm, p, s), (o, e, peak) in ctx.seen.items() if e <= 0)
    if not fits:
        (arm, p, s), (_, _, peak) = min(ctx.seen.items(), key=lambda kv: kv[1][1])
        mem = arm.memory(s, arm.simulate(s)[0], p)
        w = int(np.argmax([m["total"] for m in mem] - ctx.cap))
        raise ValueError(f"no plan fits memory={ctx.cap.max():.4g} bytes per device: the least any plan searched "
                         f"needs is {peak:.4g} ({arm.name} M={arm.M} {arm.policies[p]}, stages {list(s)}; device {w}: "
                         f"{mem[w]}); raise the cap, try recompute=(False, True), more micro-batches or more devices")
    out: list[Plan] = []
    kept: set[tuple[_Arm, int]] = set()
    for o, _, _, _, p, s, arm in fits:
        if (arm, p) not in kept and len(out) < top:
            kept.add((arm, p))
            sim, period, bubble, end = arm.simulate(s)
            out.append(Plan(arm.name, arm.M, arm.policies[p], arm.recompute, s, tuple(arm.holder.tolist()), period,
                            bubble, o, tuple(arm.memory(s, sim, p)), critical_path(sim, end - period, end), sim))
    plans = Plans(out)
    plans.exact, plans.simulations, plans.skipped = exact, ctx.simulations, ctx.skipped
    return plans
