"""Weight-staleness policies: which weights each forward and backward job of a pipeline uses.

A policy maps every job (stage k, step t, micro-batch j) to a :class:`Stored` version or a :class:`Predicted`
one. The version difference ``s`` always comes from the version table (``cur``: version current when the job
runs; ``upd``: the version its update applies its gradient to), never from rank arithmetic; the papers'
formulas are what the table gives for asynchronous 1F1B (compared in the tests).

| policy          | forward of (k, t, j)          | backward of (k, t, j)             | copies (async 1F1B, M=1)  |
|-----------------|-------------------------------|-----------------------------------|---------------------------|
| sequential      | cur(F)                        | cur(B) (= cur(F): no pipeline)    | 1                         |
| gpipe, 1f1b     | cur(F)                        | cur(B) (= cur(F): flushed)        | 1                         |
| vanilla         | cur(F)                        | cur(B) (VJP at newer weights)     | 1                         |
| stashing        | cur(F)                        | cur(F) (stashed)                  | D−k                       |
| vertical_sync   | cur(F(0, t, j)) (input stage) | same                              | D−k+1 (k>0), D (k=0)      |
| 2bw             | cur(F(0, t, 0)) (= t−1, M ≥ D)| same                              | 2 (on the 2BW schedule)   |
| spectrain       | Ŵ(cur(F) → R)                 | Ŵ(cur(B) → R)                     | 1 + 1 predicted           |
| pipeoptim       | Ŵ(cur(F) → upd)               | cur(B)                            | 1 + 1 predicted (k<D−1)   |
| pipemare        | cur(F)                        | cur(B) − (cur(B)−cur(F))·δ        | 1 + δ + 1 corrected (k<D−1)|
| oracle          | W^(upd) (true future; waits)  | W^(upd)                           | (sequential training)     |
| nesterov_async  | cur(F)                        | cur(F) (stashed; or cur(B))       | D−k (1 with cur(B))       |
| error_feedback  | as its base (default 2bw)     | as its base; gradient corrected   | base's                    |
| dc_asgd         | as its base (default stashing)| as its base; gradient corrected   | base's + 1                |

R(k, t, j): stage k's version when the micro-batch's round trip ends (its backward at stage 0 starts).

References: PipeDream (Narayanan et al., SOSP 2019: weight stashing, vertical sync); PipeDream-2BW
(Narayanan et al., ICML 2021); SpecTrain (Chen et al., arXiv:1809.02839, eqs. 4–6); PipeOptim (Guan et
al., arXiv:2312.00839, eqs. 4–5, Alg. 1); PipeMare (Yang et al., MLSys 2021, learning-rate rescheduling
and discrepancy correction); Nesterov for asynchronous PP (Ajanthan et al., ICML 2025, arXiv:2505.01099);
error feedback for delayed gradients (Zmushko et al., arXiv:2606.30634; see :class:`ErrorFeedbackPolicy` for the
rule implemented); DC-ASGD (Zheng et al., ICML 2017).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from .papers import pipeoptim_staleness, spectrain_version_difference

if TYPE_CHECKING:
    from .schedules.dependencies import Job
    from .schedules.versions import VersionTable

__all__ = [
    "Stored", "Predicted", "WeightSpec", "Policy", "POLICIES", "make_policy", "available_policies",
    "Sync", "Vanilla", "Stashing", "VerticalSync", "TwoBW", "SpecTrainPolicy", "PipeOptimPolicy",
    "PipeMarePolicy", "Oracle", "SCHEDULE_FAMILIES",
    "GradientContext", "NesterovAsyncPolicy", "ErrorFeedbackPolicy", "DelayCompensationPolicy",
]


@dataclass(frozen=True)
class Stored:
    """Stage weights ``W_k^(version)`` (an existing version; a future one makes the job wait)."""

    version: int

    @property
    def target(self) -> int:
        """The version these weights are: ``version``."""
        return self.version


@dataclass(frozen=True)
class Predicted:
    """A prediction of ``W_k^(base+s)`` from version ``base`` (``kind="correction"``: PipeMare, s ≤ 0)."""

    base: int
    s: int
    kind: str = "predictor"

    @property
    def target(self) -> int:
        """The version these weights stand for: ``base + s``."""
        return self.base + self.s


WeightSpec = Stored | Predicted


@dataclass
class GradientContext:
    """What :meth:`Policy.correct_gradient` knows about the update U(k, t): ``weights_now`` is ``W_k^(version)``.

    ``used_versions``: per micro-batch, the version its backward's weights stood for; ``weights_used``: their mean
    (``keeps_backward_weights`` only); ``state``: the policy's per-stage state, kept across steps and checkpoints.
    """

    stage: int
    step: int
    version: int
    used_versions: tuple[int, ...]
    weights_now: tuple[Tensor, ...]
    weights_used: tuple[Tensor, ...] | None = None
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def staleness(self) -> float:
        """Mean staleness of the step's gradient: ``version − mean_j used_versions[j]`` (0 when not delayed)."""
        return self.version - sum(self.used_versions) / max(1, len(self.used_versions))

#: Schedule families a policy can be meant for (:attr:`Policy.schedule`), in the order of the arms: builder names of
#: :data:`~pipelab.schedules.builders.BUILDERS`, and ``"sequential"`` (no pipeline).
SCHEDULE_FAMILIES = ("sequential", "gpipe", "1f1b", "pipedream", "2bw")


class Policy:
    """Base class: the class attributes are the one source of a policy's label, schedule family and needs.

    ``schedule`` is one of :data:`SCHEDULE_FAMILIES`; ``synchronous`` policies need a schedule without staleness;
    ``emulation_only`` ones (the oracle) need weights no real pipeline has yet; ``optimizers`` lists the
    ``torch.optim`` classes served (``None``: any); ``corrects_gradient`` makes the executor call
    :meth:`correct_gradient`, and ``keeps_backward_weights`` keep :attr:`GradientContext.weights_used`.
    """

    name: str = ""  # not ClassVar: Sync sets these three per instance (one class, three names)
    title: str = ""
    schedule: str = "pipedream"
    synchronous: ClassVar[bool] = False
    uses_predictor: ClassVar[bool] = False
    default_predictor: ClassVar[str | None] = None
    emulation_only: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    optimizers: ClassVar[tuple[str, ...] | None] = None
    corrects_gradient: ClassVar[bool] = False
    keeps_backward_weights: ClassVar[bool] = False
    prediction: ClassVar[str] = "predictor"

    def check(self, table: VersionTable) -> None:
        """Raise ValueError when the schedule does not suit the policy."""
        if self.synchronous:
            worst = table.max_staleness()
            if any(worst):
                k = max(range(table.D), key=lambda i: worst[i])
                raise ValueError(f"policy {self.name!r} needs a flushed schedule (staleness 0), but the schedule "
                                 f"has staleness {worst[k]} at stage {k}; use 'vanilla', 'stashing' or a "
                                 "prediction policy for asynchronous schedules")

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        """The rule: ``(base, target)`` of the weights the forward (``"F"``) or backward of job (k, t, j) uses.

        ``target`` is the version the weights stand for, ``base`` the stored one they are made from (equal: a
        :class:`Stored`). k, t, j may be integer arrays that broadcast (the set-up asks for all jobs at once).
        """
        raise NotImplementedError

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        """The weights of forward job ``("F", k, t, j)`` (:meth:`versions` for one job)."""
        return self._spec(table, "F", key)

    def backward(self, table: VersionTable, key: Job) -> WeightSpec:
        """The weights of the backward ``("B", k, t, j)`` of a micro-batch (its I when split)."""
        return self._spec(table, "B", key)

    def _spec(self, table: VersionTable, op: str, key: Job) -> WeightSpec:
        base, target = (int(v) for v in self.versions(table, op, *key[1:]))
        return Stored(base) if base == target else Predicted(base, target - base, self.prediction)

    def lr_factor(self, table: VersionTable, stage: int, step: int) -> float:
        """Multiplier of stage k's learning rate for the update of step t (1 unless PipeMare)."""
        return 1.0

    def check_optimizer(self, optimizer: torch.optim.Optimizer, stage: int) -> None:
        """Refuse an optimizer the policy cannot serve (ValueError listing :attr:`optimizers`)."""
        if self.optimizers is not None and type(optimizer).__name__ not in self.optimizers:
            raise ValueError(f"policy {self.name!r} cannot serve stage {stage}'s optimizer "
                             f"{type(optimizer).__name__}; supported optimizers: {', '.join(self.optimizers)}")

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, stage: int, table: VersionTable) -> None:
        """Adjust stage k's freshly built optimizer before training (nothing unless the policy says so)."""

    def correct_gradient(self, ctx: GradientContext, grads: list[Tensor]) -> list[Tensor]:
        """The gradient handed to the optimizer for U(k, t) (identity); ``grads`` may be modified in place."""
        return grads

    def extra_buffers(self, stage: int, D: int) -> int:
        """Weight-sized buffers besides weight versions a real stage keeps where it predicts (PipeMare's δ)."""
        return 0

    def correction_buffers(self, stage: int, D: int) -> int:
        """Weight-sized buffers a gradient correction keeps on every stage across steps (counted by the emulator)."""
        return 0

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """Weight copies the policy's paper says stage k holds (PipeOptim's Table II); ``None``: not stated."""
        return None

    def describe(self) -> str:
        return f"{self.name}: {self.summary}"

    def options(self) -> dict:
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


def _cur(table: VersionTable, op: str, k: Any, t: Any, j: Any) -> Any:
    """cur(op): stage k's version when the job started (a split backward's at its I)."""
    return (table.forward if op == "F" else table.backward)[k, t, j]


class Sync(Policy):
    """Current weights in forward and backward on a flushed schedule (GPipe, 1F1B-flush, sequential)."""

    synchronous = True
    summary = "forward and backward at the current version (a flushed schedule: no staleness)"

    def __init__(self, name: str = "gpipe") -> None:
        titles = {"sequential": "sequential", "gpipe": "GPipe", "1f1b": "1F1B (flushed)"}
        schedules = {"sequential": "sequential", "gpipe": "gpipe", "1f1b": "1f1b"}
        if name not in titles:
            raise ValueError(f"Sync policy name must be one of {sorted(titles)}, got {name!r}")
        self.name, self.title, self.schedule = name, titles[name], schedules[name]

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = _cur(table, op, k, t, j)
        return v, v

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """One: the live weights (no version is kept besides them)."""
        return 1

    def options(self) -> dict:
        return {"name": self.name}


class Vanilla(Sync):
    """No mitigation: each job uses whatever version is current when it runs (VJP at newer weights)."""

    name, title, schedule = "vanilla", "vanilla async", "pipedream"
    synchronous = False
    summary = "forward at cur(F), backward at cur(B) (no mitigation; backward recomputed at cur(B))"

    def __init__(self) -> None:
        pass

    def options(self) -> dict:
        return {}


class Stashing(Policy):
    """PipeDream weight stashing: the backward uses the version its own forward used."""

    name, title = "stashing", "PipeDream (stashing)"
    summary = "forward at cur(F), backward at the same stashed version (PipeDream weight stashing)"

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = table.forward[k, t, j]
        return v, v

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """D − k: the versions of the micro-batches in flight (PipeOptim Table II: M_θ to D·M_θ)."""
        return D - stage


class VerticalSync(Policy):
    """PipeDream vertical sync: every stage uses the version the input stage used for this micro-batch."""

    name, title = "vertical_sync", "vertical sync"
    summary = "forward and backward at cur(F at stage 0) of the same micro-batch, at every stage"

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = np.minimum(table.forward[0, t, j], table.forward[k, t, j])
        return v, v


class TwoBW(Policy):
    """PipeDream-2BW: every job of step t, at every stage, uses ``cur(F(0, t, 0))``, the version stage 0 had then.

    ``W^(t+1) = W^(t) − ν·∇f(W^(t−1))`` (Narayanan et al., ICML 2021, §3.1). ``rule="stage_first"`` (each stage's
    own first forward of step t) is **not 2BW**, kept only to measure the difference.
    """

    name, title, schedule = "2bw", "PipeDream-2BW", "2bw"
    summary = "forward and backward at cur(F(0, t, 0)): version t−1 at every stage (double buffer)"
    RULES: ClassVar[tuple[str, ...]] = ("paper", "stage_first")

    def __init__(self, rule: str = "paper") -> None:
        if rule not in self.RULES:
            raise ValueError(f"rule must be one of {self.RULES}, got {rule!r}")
        self.rule = rule

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = table.forward[0 if self.rule == "paper" else k, t, 0]
        return v, v

    def check(self, table: VersionTable) -> None:
        """Refuse a schedule on which a job would need a version its stage does not have yet."""
        k, t, j = np.ogrid[:table.D, :table.steps, :table.M]
        v = np.broadcast_to(self.versions(table, "F", k, t, j)[0], table.shape)
        for op, cur in (("F", table.forward), ("B", table.backward)):
            ahead = np.argwhere(v > cur)
            if len(ahead):
                k0, t0, j0 = (int(i) for i in ahead[0])
                raise ValueError(f"policy '2bw' on this schedule makes job {(op, k0, t0, j0)} use version "
                                 f"{v[k0, t0, j0]} of stage {k0} before it exists (current {cur[k0, t0, j0]}); use "
                                 "pipedream_2bw(D, M) with M >= D")

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """Two: the double buffer (PipeOptim Table II: 2·M_θ for PipeDream-2BW)."""
        return 2

    def options(self) -> dict:
        return {"rule": self.rule}


class _PredictingPolicy(Policy):
    """A policy whose version differences come from the table (``"table"``) or the paper's formula (``"paper"``)."""

    def __init__(self, staleness: str = "table") -> None:
        if staleness not in ("table", "paper"):
            raise ValueError(f"staleness must be 'table' or 'paper', got {staleness!r}")
        self.staleness = staleness

    def options(self) -> dict:
        return {"staleness": self.staleness}


class SpecTrainPolicy(_PredictingPolicy):
    """SpecTrain: both passes predicted for the round trip's end (``"paper"``: s = ⌊k/2⌋ + D − k − 1, ⌊k/2⌋)."""

    name, title = "spectrain", "SpecTrain"
    uses_predictor = True
    default_predictor = "spectrain"
    summary = "forward and backward at weights predicted for the end of the round trip (prediction twice)"

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        base = _cur(table, op, k, t, j)
        if self.staleness == "paper":
            return base, base + spectrain_version_difference(table.D, k, op)
        return base, table.round_trip_targets[op][k, t, j]

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """Two: the weights and their prediction (PipeOptim Table II: 2·M_θ for SpecTrain)."""
        return 2


class PipeOptimPolicy(_PredictingPolicy):
    """PipeOptim: forward predicted s = upd(k, t) − cur(F) ahead (``"paper"``: D − k − 1, eq. 4); backward at cur(B)."""

    name, title = "pipeoptim", "PipeOptim"
    uses_predictor = True
    default_predictor = "pipeoptim"
    summary = "forward at weights predicted s = upd − cur(F) updates ahead, backward at cur(B)"

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        base = _cur(table, op, k, t, j)
        if op == "B":
            return base, base
        if self.staleness == "paper":
            return base, base + pipeoptim_staleness(table.D, k)
        return base, table.update_version[k, t]

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """2 below the last stage (cached and predicted weights), 1 on it (Table II; Algorithm 1, line 4)."""
        return 2 if stage < D - 1 else 1


class PipeMarePolicy(Policy):
    """PipeMare: learning-rate rescheduling plus discrepancy correction of the backward weights.

    Backward at ``W^(cur(B)) − (cur(B) − cur(F))·δ_k``, ``δ ← γδ + (1−γ)(W_{v+1} − W_v)`` (``correction=False``:
    at cur(B)); stage k's lr at step t is ``α_t · τ_k^(−(1 − min(t/K, 1)))``, τ_k = max(1, its largest forward
    staleness), K = ``anneal_steps`` (0: no rescaling).
    """

    name, title = "pipemare", "PipeMare"
    uses_predictor = True
    default_predictor = "pipemare"
    prediction = "correction"
    summary = "forward at cur(F), backward at cur(B) corrected back by (cur(B)−cur(F))·δ; LR τ^-(1-t/K)"

    def __init__(self, anneal_steps: int = 500, correction: bool = True) -> None:
        if not isinstance(anneal_steps, int) or anneal_steps < 0:
            raise ValueError(f"anneal_steps must be a non-negative int, got {anneal_steps!r}")
        self.anneal_steps = anneal_steps
        self.correction = correction
        self._tau: dict[int, list[int]] = {}

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        cur = _cur(table, op, k, t, j)
        return cur, table.forward[k, t, j] if op == "B" and self.correction else cur

    def taus(self, table: VersionTable) -> list[int]:
        tau = self._tau.get(id(table))
        if tau is None:
            tau = [int(s) for s in table.staleness("F", "current").max(axis=(1, 2))]
            self._tau = {id(table): tau}
        return tau

    def lr_factor(self, table: VersionTable, stage: int, step: int) -> float:
        tau = max(1, self.taus(table)[stage])
        if self.anneal_steps == 0 or tau == 1:
            return 1.0
        return float(tau) ** (-(1.0 - min(step / self.anneal_steps, 1.0)))

    def extra_buffers(self, stage: int, D: int) -> int:
        return 1 if self.correction else 0

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """Weights plus δ with the correction (2), else or on the last stage 1 (Yang et al. 2021)."""
        return 2 if self.correction and stage < D - 1 else 1

    def options(self) -> dict:
        return {"anneal_steps": self.anneal_steps, "correction": self.correction}


class Oracle(Policy):
    """The true future weights W^(upd(k, t)), waited for (emulation only): sequential training on any schedule."""

    name, title = "oracle", "oracle (true future weights)"
    emulation_only = True
    summary = "forward and backward at W^(upd), the true weights of the job's own update (waits for them)"

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = table.update_version[k, t]
        return v, v


class NesterovAsyncPolicy(Policy):
    """Nesterov method for asynchronous pipelines (Ajanthan et al., ICML 2025): NAdam with a large β1, no flush.

    The look-ahead is in NAdam's update (Dozat 2016), not a weight extrapolation, so nothing is predicted:

        m_t = β1·m_{t−1} + (1 − β1)·g̃_t,
        W^(t+1) = W^(t) − lr·[μ_{t+1}·m_t/(1−Πμ_{≤t+1}) + (1−μ_t)·g̃_t/(1−Πμ_{≤t})]/(√v̂_t + ε)

    As the public code (github.com/PluralisResearch/AsyncPP) runs it: ``backward="stashed"`` recomputes at the
    forward's version (``"current"``: the issue's vanilla backward); ``adaptive_momentum``:
    ``β1_k = β1 + τ_k·(β_max − β1)/D``, τ_k the stage's largest forward staleness.
    """

    name, title = "nesterov_async", "Nesterov (async PP)"
    summary = "NAdam (Nesterov look-ahead in the update) at cur(F); backward at the stashed cur(F) or at cur(B)"
    optimizers = ("NAdam", "SGD")
    BACKWARDS: ClassVar[tuple[str, ...]] = ("stashed", "current")

    def __init__(self, backward: str = "stashed", adaptive_momentum: bool = False, beta_max: float = 0.99) -> None:
        if backward not in self.BACKWARDS:
            raise ValueError(f"backward must be one of {self.BACKWARDS}, got {backward!r}")
        if not isinstance(beta_max, (int, float)) or not 0.0 <= beta_max < 1.0:
            raise ValueError(f"beta_max must be a float in [0, 1), got {beta_max!r}")
        self.backward_rule, self.adaptive_momentum, self.beta_max = backward, bool(adaptive_momentum), float(beta_max)

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = _cur(table, "F" if self.backward_rule == "stashed" else op, k, t, j)
        return v, v

    def check_optimizer(self, optimizer: torch.optim.Optimizer, stage: int) -> None:
        """NAdam, or SGD with Nesterov momentum (``nesterov=True``); the message lists them."""
        super().check_optimizer(optimizer, stage)
        if isinstance(optimizer, torch.optim.SGD) and not all(g.get("nesterov") for g in optimizer.param_groups):
            raise ValueError(f"policy {self.name!r} needs Nesterov momentum: stage {stage}'s SGD has nesterov=False; "
                             "supported optimizers: NAdam, SGD with nesterov=True and momentum > 0")

    def momentum_for(self, beta: float, stage: int, table: VersionTable) -> float:
        """The adaptive rule: ``β + τ_k·(β_max − β)/D`` (β unchanged without ``adaptive_momentum``)."""
        if not self.adaptive_momentum:
            return beta
        tau = int(table.staleness("F", "current")[stage].max())
        return beta + tau * (self.beta_max - beta) / table.D

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, stage: int, table: VersionTable) -> None:
        if not self.adaptive_momentum:
            return
        for group in optimizer.param_groups:
            if "betas" in group:
                b1, b2 = group["betas"]
                group["betas"] = (self.momentum_for(float(b1), stage, table), b2)
            else:
                group["momentum"] = self.momentum_for(float(group["momentum"]), stage, table)

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """D − k with the stashed backward (the code's ring), one with ``"current"``."""
        return D - stage if self.backward_rule == "stashed" else 1

    def options(self) -> dict:
        return {"backward": self.backward_rule, "adaptive_momentum": self.adaptive_momentum,
                "beta_max": self.beta_max}


_BASES = ("2bw", "stashing", "vanilla")


class _CorrectingPolicy(Policy):
    """A gradient correction on top of a base policy, which chooses every job's weights and the schedule."""

    corrects_gradient = True
    default_base: ClassVar[str] = "stashing"

    def __init__(self, base: str) -> None:
        if base not in _BASES:
            raise ValueError(f"base must be one of {_BASES}, got {base!r}")
        self.base_name = base
        self.base = make_policy(base)
        self.schedule = self.base.schedule

    def check(self, table: VersionTable) -> None:
        self.base.check(table)

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        return self.base.versions(table, op, k, t, j)

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """The base policy's copies plus :meth:`correction_buffers`."""
        base = self.base.stated_weight_copies(stage, D)
        return None if base is None else base + self.correction_buffers(stage, D)


class ErrorFeedbackPolicy(_CorrectingPolicy):
    """Feedback of the delayed gradient's drift: ``g̃_t = g_t + γ·s_t·(g_t − g_{t−1})`` (a substitute, see below).

    **Not the rule of arXiv:2606.30634** (Zmushko et al., ICML 2026), whose formula could not be found. With
    ``s_t`` the gradient's staleness, ``g_t − g_{t−1} ≈ H·(W^(t−s) − W^(t−s−1))``, so this extrapolates the gradient
    to the current weights; ``s = γ = 1`` is the optimistic gradient ``2g_t − g_{t−1}`` (Rakhlin & Sridharan, COLT
    2013; Daskalakis et al., ICLR 2018; Stich & Karimireddy, JMLR 2020). ``g_{t−1}`` is uncorrected.
    """

    name, title = "error_feedback", "error feedback (gradient extrapolation)"
    summary = "base policy's weights; gradient g + γ·s·(g − g_prev) fed to the optimizer (s: its staleness)"

    def __init__(self, base: str = "2bw", gamma: float = 1.0) -> None:
        super().__init__(base)
        if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or gamma < 0:
            raise ValueError(f"gamma must be a non-negative float, got {gamma!r}")
        self.gamma = float(gamma)

    def correct_gradient(self, ctx: GradientContext, grads: list[Tensor]) -> list[Tensor]:
        prev = ctx.state.get("previous")
        ctx.state["previous"] = [g.detach().clone() for g in grads]
        scale = self.gamma * ctx.staleness
        if prev is None or scale == 0.0:
            return grads
        return [g + scale * (g - p) for g, p in zip(grads, prev)]

    def correction_buffers(self, stage: int, D: int) -> int:
        """One: the previous step's gradient ``g_{t−1}``."""
        return 1

    def options(self) -> dict:
        return {"base": self.base_name, "gamma": self.gamma}


class DelayCompensationPolicy(_CorrectingPolicy):
    """DC-ASGD: ``g̃ = g + λ·g⊙g⊙(W_now − W_used)`` (Zheng et al., ICML 2017, Eq. 10 and Algorithm 1).

    A Taylor step with the Hessian approximated by ``λ·g⊙g``; ``W_used = (1/M)·Σ_j W^(used_j)`` (exact when the
    micro-batches share one version). ``lam``: DC-ASGD-c's λ (0.04, the paper's and MXNet's); ``adaptive``:
    DC-ASGD-a, ``λ_t = λ0/√(MS_t + ε)``, ``MS_t = m·MS_{t−1} + (1−m)·g⊙g`` (λ0 = ``lam0``, m = ``ms_decay``).
    """

    name, title = "dc_asgd", "DC-ASGD (delay compensation)"
    summary = "base policy's weights; gradient g + λ·g⊙g⊙(W_now − W_used) fed to the optimizer"
    keeps_backward_weights = True
    EPS: ClassVar[float] = 1e-7

    def __init__(self, base: str = "stashing", lam: float = 0.04, adaptive: bool = False, lam0: float = 2.0,
                 ms_decay: float = 0.95) -> None:
        super().__init__(base)
        for arg, value in (("lam", lam), ("lam0", lam0)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{arg} must be a non-negative float, got {value!r}")
        if not isinstance(ms_decay, (int, float)) or not 0.0 <= ms_decay < 1.0:
            raise ValueError(f"ms_decay must be a float in [0, 1), got {ms_decay!r}")
        self.lam, self.adaptive, self.lam0, self.ms_decay = float(lam), bool(adaptive), float(lam0), float(ms_decay)

    def correct_gradient(self, ctx: GradientContext, grads: list[Tensor]) -> list[Tensor]:
        assert ctx.weights_used is not None
        if self.adaptive:
            ms = ctx.state.get("mean_square") or [torch.zeros_like(g) for g in grads]
            ms = [self.ms_decay * m + (1.0 - self.ms_decay) * g * g for m, g in zip(ms, grads)]
            ctx.state["mean_square"] = ms
            lams: list[Tensor | float] = [self.lam0 / torch.sqrt(m + self.EPS) for m in ms]
        else:
            lams = [self.lam] * len(grads)
        return [g + lam * g * g * (now.detach() - used)
                for g, lam, now, used in zip(grads, lams, ctx.weights_now, ctx.weights_used)]

    def correction_buffers(self, stage: int, D: int) -> int:
        """``W_used`` (the paper's server keeps the pulled weights), plus ``MS`` of DC-ASGD-a."""
        return 1 + int(self.adaptive)

    def options(self) -> dict:
        return {"base": self.base_name, "lam": self.lam, "adaptive": self.adaptive, "lam0": self.lam0,
                "ms_decay": self.ms_decay}


POLICIES: dict[str, type[Policy] | tuple[type[Policy], dict]] = {
    "sequential": (Sync, {"name": "sequential"}),
    "gpipe": (Sync, {"name": "gpipe"}),
    "1f1b": (Sync, {"name": "1f1b"}),
    "vanilla": Vanilla,
    "stashing": Stashing,
    "vertical_sync": VerticalSync,
    "2bw": TwoBW,
    "spectrain": SpecTrainPolicy,
    "pipeoptim": PipeOptimPolicy,
    "pipemare": PipeMarePolicy,
    "oracle": Oracle,
    "nesterov_async": NesterovAsyncPolicy,
    "error_feedback": ErrorFeedbackPolicy,
    "dc_asgd": DelayCompensationPolicy,
}


def available_policies() -> list[str]:
    """Names accepted by :func:`make_policy`."""
    return list(POLICIES)


def make_policy(name: str | Policy, **options: object) -> Policy:
    """Build a policy by name (one of :data:`POLICIES`) with its options; a Policy is returned as is."""
    if isinstance(name, Policy):
        if options:
            raise ValueError("options are only accepted with a policy name")
        return name
    try:
        entry = POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    cls, fixed = entry if isinstance(entry, tuple) else (entry, {})
    try:
        return cls(**fixed, **options)
    except TypeError as exc:
        raise TypeError(f"policy {name!r}: {exc}") from None
