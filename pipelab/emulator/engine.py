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
from torch.func import functional_call

from ..policies import Policy, Predicted, Stored, WeightSpec, make_policy
from .versions import JobKey, VersionRing, VersionTable, resolve_order, ring_capacities

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


class _Stage:
    def __init__(self, k: int, module: nn.Module, optimizer: torch.optim.Optimizer, capacity: int) -> None:
        self.k = k
        self.module = module
        named = list(module.named_parameters())
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.buffer_names = [n for n, _ in module.named_buffers()]
        self.optimizer = optimizer
        opt_params = [p for g in optimizer.param_groups for p in g["params"]]
        if {id(p) for p in opt_params} != {id(p) for p in self.params}:
            raise ValueError(f"the optimizer of stage {k} must hold exactly that stage's parameters")
        # predictors return tensors in param_groups order; map them to named order
        pos = {id(p): i for i, p in enumerate(opt_params)}
        self.opt_order = [pos[id(p)] for p in self.params]
        self.ring = VersionRing(capacity, k)
        self.version = 0
        self.scheduler: Any = None
        self.predictor: Any = None

    def snapshot(self) -> tuple[Tensor, ...]:
        return tuple(p.detach().clone().requires_grad_(p.requires_grad) for p in self.params)

    def call(self, weights: Sequence[Tensor], x: Tensor, fresh_buffers: bool = False) -> Tensor:
        mapping: dict[str, Tensor] = dict(zip(self.names, weights))
        if fresh_buffers and self.buffer_names:
            bufs = dict(self.module.named_buffers())
            mapping.update({n: b.clone() for n, b in bufs.items()})
        return functional_call(self.module, mapping, (x,))


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
            self.specs[key[1:]] = (f, b)  # type: ignore[index]
            uses[key] = [(key[1], _needed(f))]
            uses[bkey] = [(key[1], _needed(b))]
            if isinstance(f, Predicted) or isinstance(b, Predicted):
                self.predicted_stages.add(key[1])
        self.order = resolve_order(self.table, uses)
        self.waited = self.order != self.table.order
        caps, last_use = ring_capacities(self.order, uses, self.D)
        self.capacity = caps
        self._expiring: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for kv, i in last_use.items():
            self._expiring[i].append(kv)
        self._last_use = last_use

        self.stages = []
        for k, module in enumerate(stages):
            params = list(module.parameters())
            if not params:
                raise ValueError(f"stage {k} has no parameters; choose D so that every stage holds weights")
            opt = optimizer(params)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer")
            st = _Stage(k, module, opt, caps[k])
            for p in st.params:  # before the first update the "last gradient" predictors may read is zero
                p.grad = torch.zeros_like(p)
            st.ring.put(0, st.snapshot())
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

    def _weights(self, st: _Stage, spec: WeightSpec, grad: bool) -> tuple[Tensor, ...]:
        if isinstance(spec, Stored):
            return st.ring.get(spec.version)
        base = st.ring.get(spec.base)
        opt_base = [base[i] for i in _inverse(st.opt_order)]
        if spec.kind == "correction":
            # PipeMare: W^(base) + s·δ, with δ read from the predictor as Ŵ_{+1} − W (s < 0)
            ahead = st.predictor.predict(st.optimizer, 1, params=opt_base)
            out = [w.detach() + spec.s * (a - w.detach()) for w, a in zip(opt_base, ahead)]
        else:
            out = st.predictor.predict(st.optimizer, spec.s, params=opt_base)
        W = tuple(out[i] for i in st.opt_order)
        return tuple(w.detach().requires_grad_(True) for w in W) if grad else W

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
        saved: dict[tuple[int, int, int], tuple] = {}
        acts: dict[tuple[int, int, int], Tensor] = {}
        gouts: dict[tuple[int, int, int], Tensor] = {}
        acc: dict[tuple[int, int], list[Tensor]] = {}
        step_loss: dict[int, list[Tensor]] = defaultdict(list)
        losses = [math.nan] * self.steps
        observed: dict[JobKey, int] = {}
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

        for i, key in enumerate(self.order):
            op, k, t, j = key
            st = self.stages[k]
            if op == "F":
                observed[key] = st.version
                if k == 0:
                    if t not in micro:
                        x, y = get(t)
                        micro[t] = (split_micro(x, M, "input batch"), split_micro(y, M, "target batch"))
                    x_in = micro[t][0][j]
                else:
                    x_in = acts.pop((k - 1, t, j))
                spec_f, spec_b = self.specs[(k, t, j)]
                keep = spec_f == spec_b and isinstance(spec_f, Stored) and not self.recompute
                W = self._weights(st, spec_f, grad=False)
                target = micro[t][1][j] if k == last else None
                if keep:
                    if k > 0:
                        x_in.requires_grad_(True)
                    with torch.enable_grad():
                        out = st.call(W, x_in)
                        if k == last:
                            out = self.loss_fn(out, target) / M
                    saved[(k, t, j)] = ("graph", x_in, out, W)
                else:
                    rng = _rng_state(x_in.device)
                    with torch.no_grad():
                        out = st.call(W, x_in)
                        if k == last:
                            out = self.loss_fn(out, target) / M
                    saved[(k, t, j)] = ("recompute", x_in, rng)
                if k == last:
                    step_loss[t].append(out.detach())
                    if len(step_loss[t]) == M:
                        total = float(torch.stack(step_loss.pop(t)).sum())
                        losses[t] = total
                        done += 1
                        if not math.isfinite(total):
                            diverged = t
                            break
                else:
                    acts[(k, t, j)] = out.detach()
            elif op == "B":
                observed[key] = st.version
                entry = saved.pop((k, t, j))
                g_out = gouts.pop((k, t, j), None)
                if entry[0] == "graph":
                    _, x_in, out, W = entry
                else:
                    _, x0, rng = entry
                    W = self._weights(st, self.specs[(k, t, j)][1], grad=True)
                    x_in = x0.detach().requires_grad_(k > 0)
                    with torch.enable_grad(), _replay_rng(x0.device, rng):
                        out = st.call(W, x_in, fresh_buffers=True)
                        if k == last:
                            out = self.loss_fn(out, micro[t][1][j]) / M
                inputs = list(W) + ([x_in] if k > 0 else [])
                grads = torch.autograd.grad(out, inputs, g_out, allow_unused=True)
                pgrads = [torch.zeros_like(w) if g is None else g for w, g in zip(W, grads)]
                if k > 0:
                    gouts[(k - 1, t, j)] = grads[-1]
                if (k, t) in acc:
                    torch._foreach_add_(acc[(k, t)], pgrads)
                else:
                    acc[(k, t)] = pgrads
                if k == 0:
                    back0[t] += 1
                    if back0[t] == M:  # the mini-batch has left the pipeline
                        micro.pop(t, None)
                        del back0[t]
            else:  # U
                grads = acc.pop((k, t), None)
                if grads is None:
                    raise RuntimeError(f"update of stage {k} for step {t} has no gradient")
                self._update(st, t, grads)
                old = st.version
                st.version += 1
                if self._last_use.get((k, old), -1) <= i:
                    st.ring.drop(old)
                W = st.snapshot()
                st.ring.put(st.version, W)
                snapshot(k, st.version, W)
            for kk, v in self._expiring.pop(i, ()):
                if v != self.stages[kk].version:
                    self.stages[kk].ring.drop(v)
        used = {(op,) + kk: _target(spec) for kk, pair in self.specs.items() for op, spec in zip("FB", pair)}
        return EmulatorResult(losses, diverged, observed, used, self.waited, list(self.capacity), self.weight_copies, done,
                              extra={"ring_peak": [st.ring.peak for st in self.stages]})

    def _update(self, st: _Stage, t: int, grads: list[Tensor]) -> None:
        for p, g in zip(st.params, grads):
            p.grad = g
        factor = self.policy.lr_factor(self.table, st.k, t)
        groups = st.optimizer.param_groups
        saved_lr = [g["lr"] for g in groups]
        if factor != 1.0:
            for g in groups:
                g["lr"] = g["lr"] * factor
        st.optimizer.step()
        if factor != 1.0:
            for g, lr in zip(groups, saved_lr):
                g["lr"] = lr
        # p.grad keeps the last gradient (as after a plain optimizer.step()); some predictors read it
        if st.scheduler is not None:
            st.scheduler.step()
        if st.predictor is not None and getattr(st.predictor, "needs_history", False):
            st.predictor.observe(st.optimizer)

    def weights(self) -> list[tuple[Tensor, ...]]:
        """The live (newest) weights of every stage."""
        return [tuple(p.detach() for p in st.params) for st in self.stages]


def _needed(spec: WeightSpec) -> int:
    return spec.version if isinstance(spec, Stored) else spec.base


def _target(spec: WeightSpec) -> int:
    return spec.version if isinstance(spec, Stored) else spec.base + spec.s


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


class _replay_rng:
    """Context manager: run with a recorded RNG state, then restore the current one."""

    def __init__(self, device: torch.device, state: tuple[Tensor, Tensor | None]) -> None:
        self.device, self.state = device, state

    def __enter__(self) -> None:
        self.saved = _rng_state(self.device)
        torch.set_rng_state(self.state[0])
        if self.state[1] is not None:
            torch.cuda.set_rng_state(self.state[1], self.device)

    def __exit__(self, *exc: object) -> None:
        torch.set_rng_state(self.saved[0])
        if self.saved[1] is not None:
            torch.cuda.set_rng_state(self.saved[1], self.device)
