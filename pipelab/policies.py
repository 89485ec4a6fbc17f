"""Weight-staleness policies: which weights each forward and backward job of a pipeline uses.

A policy maps every job of the version table (stage k, step t, micro-batch j) to a *weight spec* for its
forward (F) and its backward (B):

- :class:`Stored` ``(v)``: the stored version ``W_k^(v)``; when ``v`` is beyond the version current at
  the job's turn (only the oracle asks for that) the job waits until the version exists;
- :class:`Predicted` ``(base, s)``: a predictor's estimate of ``W_k^(base+s)`` made from version
  ``base`` with the stage optimizer's state; ``kind="correction"`` is PipeMare's discrepancy correction
  ``W_k^(base) + s·δ_k`` with ``s < 0`` (δ the EMA of recent weight differences).

The version difference ``s`` always comes from the version table (``cur``: version current when the job
runs, ``upd``: the update version, the one its update applies its gradient to), never from rank arithmetic;
the papers' formulas (PipeOptim ``s = D−k−1``; SpecTrain ``⌊k/2⌋+D−k−1`` forward, ``⌊k/2⌋`` backward) are
what the table gives for asynchronous 1F1B and are compared in the tests.

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

R(k, t, j) is the version of stage k current when the micro-batch's round trip ends (its backward at
stage 0 starts): SpecTrain predicts "the weights at the end of the round trip" at every stage. PipeMare
also rescales the learning rate of stage k at step t by ``τ_k^(−(1−min(t/K, 1)))`` with ``τ_k`` the
stage's largest forward staleness (from the table) and K the annealing steps.

Example:
    >>> make_policy("stashing").describe()
    'stashing: forward at cur(F), backward at the same stashed version (PipeDream weight stashing)'

References: PipeDream (Narayanan et al., SOSP 2019: weight stashing, vertical sync); PipeDream-2BW
(Narayanan et al., ICML 2021); SpecTrain (Chen et al., arXiv:1809.02839, eqs. 4–6); PipeOptim (Guan et
al., arXiv:2312.00839, eqs. 4–5, Alg. 1); PipeMare (Yang et al., MLSys 2021, learning-rate rescheduling
and discrepancy correction); Nesterov for asynchronous PP (Ajanthan et al., ICML 2025, arXiv:2505.01099);
error feedback for delayed gradients (Zmushko et al., arXiv:2606.30634; see :class:`ErrorFeedbackPolicy` for the
rule implemented); DC-ASGD (Zheng et al., ICML 2017).

Gradient corrections (error feedback, DC-ASGD) act through :meth:`Policy.correct_gradient`, which the stage
executor calls with the step's accumulated gradient just before ``optimizer.step()``; optimizers a policy
cannot serve are refused by :meth:`Policy.check_optimizer` (called by :func:`pipelab.pipeline.build_pipeline`).
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
    """What :meth:`Policy.correct_gradient` knows about the update U(k, t) it corrects the gradient of.

    Attributes:
        stage, step: k and t.
        version: the version current at the update, so ``weights_now`` is ``W_k^(version)``.
        used_versions: per micro-batch j, the version its backward's weights stood for (a stored version, or the
            target ``base + s`` of a prediction); ``version − used_versions[j]`` is the job's gradient staleness.
        weights_now: the stage's weights at the update (before the step), in ``named_parameters`` order.
        weights_used: the mean over the step's micro-batches of the weights their backwards used (only for a
            policy with ``keeps_backward_weights``; ``None`` otherwise).
        state: the policy's per-stage state, kept by the executor across steps (and in its checkpoints).
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
    """Base class. Subclasses set the class attributes and the rule, :meth:`versions`.

    The class attributes are the one source of a policy's label, schedule family and needs: figures, the
    learning-curve arms and the ``pipelab.studies.run`` choices read them from ``make_policy(name)``.

    Class attributes:
        name, title: registry name and legend label (figures and tables print ``title``).
        schedule: the schedule family the policy is meant for, one of :data:`SCHEDULE_FAMILIES`
            (``"sequential"``: no pipeline; ``"gpipe"``, ``"1f1b"``: flushed; ``"pipedream"``: PipeDream's
            asynchronous 1F1B, one update per mini-batch; ``"2bw"``: PipeDream-2BW).
        synchronous: the policy requires a schedule without staleness (checked against the table).
        uses_predictor: the policy's specs include :class:`Predicted` (a predictor must be given).
        default_predictor: predictor name used when none is given.
        emulation_only: the policy needs weights no real pipeline has yet (the oracle): it runs in the
            emulator only and is no learning-curve arm.
        summary: one line for :meth:`describe`.
        optimizers: names of the ``torch.optim`` classes the policy serves (``None``: any); others are refused
            by :meth:`check_optimizer` with this list.
        corrects_gradient: the executor calls :meth:`correct_gradient` before each optimizer step.
        keeps_backward_weights: the executor keeps the mean backward weights of each step in flight (one
            weight-sized buffer per step) for :attr:`GradientContext.weights_used`.
        prediction: the :attr:`Predicted.kind` of the policy's predictions (PipeMare: ``"correction"``).
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
        """The rule: ``(base, target)`` of the weights the forward (``op="F"``) or backward (``"B"``) of micro-batch
        (k, t, j) uses, read from the version table's arrays.

        ``target`` is the version the weights stand for, ``base`` the stored version they are made from: equal for
        a stored version (:class:`Stored`), else a prediction of ``W^(target)`` from ``W^(base)`` (:class:`Predicted`
        of kind :attr:`prediction`). k, t and j are ints, or integer arrays that broadcast together: the pipeline's
        set-up asks for every job at once (``numpy.ogrid`` over [D, T, M]).
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
        """The gradient handed to the optimizer for U(k, t), from the step's accumulated gradient (identity).

        Called by the stage executor only for a policy with ``corrects_gradient``; ``grads`` is in
        ``named_parameters`` order and may be modified in place.
        """
        return grads

    def extra_buffers(self, stage: int, D: int) -> int:
        """Weight-sized buffers besides weight versions a real stage keeps where it predicts (PipeMare's δ)."""
        return 0

    def correction_buffers(self, stage: int, D: int) -> int:
        """Weight-sized buffers a gradient correction keeps on every stage with parameters, across steps (error
        feedback's previous gradient, DC-ASGD's backward weights W_used); 0 for a policy that corrects nothing.
        The emulator's :attr:`~pipelab.emulator.Emulator.weight_copies` counts them."""
        return 0

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """Weight-sized copies the policy's paper says stage k holds (PipeOptim's Table II "weights memory" in
        units of one stage's weights), to set beside the copies the emulator measures; ``None``: not stated."""
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
        """D − k: stage k stashes the versions of its D − k micro-batches in flight (PipeOptim Table II:
        PipeDream's weights memory ranges from M_θ to D·M_θ)."""
        return D - stage


class VerticalSync(Policy):
    """PipeDream vertical sync: every stage uses the version the input stage used for this micro-batch."""

    name, title = "vertical_sync", "vertical sync"
    summary = "forward and backward at cur(F at stage 0) of the same micro-batch, at every stage"

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = np.minimum(table.forward[0, t, j], table.forward[k, t, j])
        return v, v


class TwoBW(Policy):
    """PipeDream-2BW: every job of step t, at every stage, uses the version stage 0 had when step t began.

    The 2BW rule (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021, §3.1) is
    ``W^(t+1) = W^(t) − ν·∇f(W^(t−1))`` at every stage: a new version is made every M micro-batches and is
    used by the micro-batches that enter the pipeline after it exists, at every stage, so each stage keeps
    two versions. The version comes from the table: ``cur(F(0, t, 0))``, the input stage's version at step
    t's first forward, which is t − 1 (t ≥ 1) on :func:`~pipelab.schedules.pipedream_2bw` with M ≥ D.

    Args:
        rule: ``"paper"`` (default, the 2BW rule above) or ``"stage_first"``: each stage uses the version
            current at its *own* first forward of step t. That variant is **not 2BW** (the last stage is
            then never stale, the others have staleness 1); it is kept only to measure the difference.
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
    """SpecTrain: forward and backward at weights predicted for the end of the micro-batch's round trip.

    Args:
        staleness: ``"table"`` (default): the target R(k, t, j) is the version of stage k when the
            micro-batch's backward at stage 0 starts, read from the version table; ``"paper"``: the
            paper's formulas s = ⌊k/2⌋ + D − k − 1 (forward) and ⌊k/2⌋ (backward).
    """

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
    """PipeOptim: forward at weights predicted for the job's own update; backward at the current version.

    Args:
        staleness: ``"table"`` (default: s = upd(k, t) − cur(F)) or ``"paper"`` (s = D − k − 1, eq. 4).
    """

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
        """Two below the last stage (the cached weights and the predicted ones), one on the last stage, which
        predicts nothing (PipeOptim Table II: [M_θ, 2·M_θ]; Algorithm 1, line 4)."""
        return 2 if stage < D - 1 else 1


class PipeMarePolicy(Policy):
    """PipeMare: learning-rate rescheduling plus discrepancy correction of the backward weights.

    Forward at cur(F) (no stash). Backward at ``W^(cur(B)) − (cur(B) − cur(F))·δ_k`` where δ_k is the
    EMA of stage k's weight differences, ``δ ← γδ + (1−γ)(W_{v+1} − W_v)`` (the ``pipemare`` predictor):
    an estimate of the forward weights without storing them. Stage k's learning rate at step t is
    ``α_t · τ_k^(−(1 − min(t/K, 1)))``, τ_k = max(1, largest forward staleness of stage k in the table).

    Args:
        anneal_steps: K, the number of steps over which the rescaling fades out (K = 0: no rescaling).
        correction: apply the discrepancy correction (``False``: backward at cur(B), i.e. vanilla + LR).
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
        """The weights plus the velocity δ with the correction (two), the weights alone without or on the last
        stage, which has no delay to correct (PipeMare, Yang et al. 2021: the correction needs one extra
        weight-sized buffer and no stashed versions). The corrected backward weights themselves are a further
        temporary copy the paper does not count, and the emulator does."""
        return 2 if self.correction and stage < D - 1 else 1

    def options(self) -> dict:
        return {"anneal_steps": self.anneal_steps, "correction": self.correction}


class Oracle(Policy):
    """The true future weights: every job uses W^(upd(k, t)), the update version; jobs wait for them (emulation only).

    On any schedule this is sequential training, which checks the emulator's machinery.
    """

    name, title = "oracle", "oracle (true future weights)"
    emulation_only = True
    summary = "forward and backward at W^(upd), the true weights of the job's own update (waits for them)"

    def versions(self, table: VersionTable, op: str, k: Any, t: Any, j: Any) -> tuple[Any, Any]:
        v = table.update_version[k, t]
        return v, v


class NesterovAsyncPolicy(Policy):
    """Nesterov method for asynchronous pipelines (Ajanthan et al., ICML 2025): NAdam with a large β1, no flush.

    The paper replaces the gradient at Nesterov's look-ahead point by the delayed gradient of the asynchronous
    pipeline and runs the stage optimizer ``torch.optim.NAdam`` (Dozat 2016), whose update already contains the
    look-ahead: with ``μ_t`` NAdam's momentum schedule,

        m_t = β1·m_{t−1} + (1 − β1)·g̃_t,
        W^(t+1) = W^(t) − lr·[μ_{t+1}·m_t/(1−Πμ_{≤t+1}) + (1−μ_t)·g̃_t/(1−Πμ_{≤t})]/(√v̂_t + ε)

    with ``g̃_t`` the step's delayed gradient. The look-ahead is therefore no weight extrapolation: the
    forward runs at the current weights ``cur(F)`` and nothing is predicted (``Predicted`` specs are unused).

    Where the sources differ (read for this policy: the public code, github.com/PluralisResearch/AsyncPP,
    mirrored as sukrucildirr/AsyncPP; the paper's full text could not be read here, only its abstract):

    - backward weights: the code keeps PipeDream's ring of ``warmup + 1`` versions and calls
      ``load_old_params()`` before every backward, which is recomputed (``--recompute``) at the version the
      micro-batch's forward used: **weight stashing**, ``backward="stashed"`` (default). The issue describes
      "no weight stashing, backward recomputed at the current weights": ``backward="current"`` (vanilla's
      backward at ``cur(B)``, one weight copy).
    - β1: the code's run script uses NAdam with ``betas=(0.99, 0.999)`` (pass that optimizer); its
      ``--adaptive_momentum`` option raises β1 with the stage's delay, ``β1_k = β1 + τ_k·(β_max − β1)/D`` with
      ``τ_k`` the stage's number of versions minus one (D − k − 1 on asynchronous 1F1B), here read from the
      version table as the stage's largest forward staleness: ``adaptive_momentum=True``.

    Optimizers: ``NAdam`` (the paper's), or ``SGD`` with ``nesterov=True`` (Nesterov's accelerated gradient
    itself, the method the paper adapts); anything else is refused.

    Args:
        backward: ``"stashed"`` (default, the public code) or ``"current"`` (the issue's description).
        adaptive_momentum: raise β1 (NAdam) or the momentum (SGD) of stage k with its delay as above.
        beta_max: β_max of the adaptive rule (the code's 0.99).
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
        """D − k with the stashed backward (the code's PipeDream ring), one with ``backward="current"``."""
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
        return self.base.stated_weight_copies(stage, D)


class ErrorFeedbackPolicy(_CorrectingPolicy):
    """Feedback of the delayed gradient's drift: ``g̃_t = g_t + γ·s_t·(g_t − g_{t−1})`` (a substitute, see below).

    **Not the rule of arXiv:2606.30634.** That paper (Zmushko et al., "One-Step Gradient Delay is Not a Barrier
    for Large-Scale Asynchronous Pipeline Parallel LLM Pretraining", ICML 2026) introduces an "Error
    Feedback-inspired", optimizer-agnostic correction for PipeDream-2BW's one-step delay; only its abstract and
    summaries could be found here (they say it "mixes recent delayed updates"), not its formula or code. This
    policy implements a standard, citable correction of that kind instead, to be replaced by the paper's once
    its text is at hand:

    g_t, the step's accumulated gradient, was computed at weights ``s_t`` versions old
    (``s_t = version − mean_j used_j``, from the version table through the backward specs), so to first order
    ``∇f(W^(t)) ≈ g_t + H·(W^(t) − W^(t−s))`` and ``g_t − g_{t−1} ≈ H·(W^(t−s) − W^(t−s−1))``; feeding the last
    change of the delivered gradient back ``s_t`` times extrapolates the gradient sequence to the current
    weights. With ``s = 1, γ = 1`` this is the optimistic gradient ``2g_t − g_{t−1}`` of optimistic mirror
    descent with the last gradient as the hint (Rakhlin & Sridharan, COLT 2013; Daskalakis et al., "Training
    GANs with Optimism", ICLR 2018); that a delayed gradient is an error-feedback residual is Stich &
    Karimireddy, "The Error-Feedback Framework: Better Rates for SGD with Delayed Gradients and Compressed
    Updates", JMLR 2020. The corrected gradient goes to the user's optimizer unchanged (any ``torch.optim``
    optimizer: the correction is optimizer-agnostic). ``g_{t−1}`` is the previous step's *uncorrected*
    gradient (one weight-sized buffer); the first step and steps with ``s_t = 0`` are not corrected, so a
    run without delay is plain training.

    Args:
        base: the weight rule corrected: ``"2bw"`` (default, the paper's PipeDream-2BW), ``"stashing"``,
            ``"vanilla"``.
        gamma: γ, the feedback strength (1: the full first-order extrapolation).
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
        """One: the previous step's gradient ``g_{t−1}``, kept from one update to the next."""
        return 1

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """The base policy's copies plus the previous gradient (:meth:`correction_buffers`)."""
        base = self.base.stated_weight_copies(stage, D)
        return None if base is None else base + self.correction_buffers(stage, D)

    def options(self) -> dict:
        return {"base": self.base_name, "gamma": self.gamma}


class DelayCompensationPolicy(_CorrectingPolicy):
    """DC-ASGD: ``g̃ = g + λ·g⊙g⊙(W_now − W_used)`` (Zheng et al., ICML 2017, Eq. 10 and Algorithm 1).

    The delayed gradient g computed at ``W_used`` is moved to the weights ``W_now`` it is applied to by a
    first-order Taylor step whose Hessian is approximated by the outer product's diagonal ``λ·g⊙g``.
    ``W_now`` is the stage's version current at its update U(k, t) and ``W_used`` the weights the backward of
    the step's micro-batches used (the base policy's backward specs, from the version table). With M
    micro-batches per step, ``g = Σ_j g_j`` is the mini-batch gradient and ``W_used`` the mean of the
    micro-batches' backward weights, ``(1/M)·Σ_j W^(used_j)`` (each micro-batch carries 1/M of the loss); when
    they all used one version (every flushed or stashed step with M = 1, and PipeDream-2BW) this is the
    paper's rule exactly, and without delay the correction vanishes.

    Args:
        base: the weight rule corrected: ``"stashing"`` (default: every gradient is exact at one version, as a
            parameter-server worker's), ``"vanilla"``, ``"2bw"``.
        lam: λ of DC-ASGD-c (the paper's constant variant; 0.04 as in its experiments and MXNet's ``DCASGD``).
        adaptive: DC-ASGD-a: ``λ_t = λ0/√(MS_t + ε)`` elementwise with ``MS_t = m·MS_{t−1} + (1−m)·g⊙g``
            (``MS_0 = 0``), ``λ0 = lam0``, ``m = ms_decay``, ε = 1e-7.
        lam0: λ0 of DC-ASGD-a (the paper's 2). ms_decay: m (the paper's 0.95).
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
        """``W_used`` (the sum of the step's backward weights, one weight-sized buffer: the paper's server keeps a
        backup of the weights each worker pulled), plus the mean square ``MS`` of DC-ASGD-a."""
        return 1 + int(self.adaptive)

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """The base policy's copies plus :meth:`correction_buffers`."""
        base = self.base.stated_weight_copies(stage, D)
        return None if base is None else base + self.correction_buffers(stage, D)

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
    """Build a policy by name (one of :data:`POLICIES`) with its options; a Policy is returned as is.

    Example:
        >>> make_policy("pipemare", anneal_steps=100)
        PipeMarePolicy(anneal_steps=100, correction=True)
    """
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
