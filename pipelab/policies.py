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
and discrepancy correction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .schedules.versions import pipeoptim_staleness, spectrain_version_difference

if TYPE_CHECKING:
    from .schedules.dependencies import Job
    from .schedules.versions import VersionTable

__all__ = [
    "Stored", "Predicted", "WeightSpec", "Policy", "POLICIES", "make_policy", "available_policies",
    "Sync", "Vanilla", "Stashing", "VerticalSync", "TwoBW", "SpecTrainPolicy", "PipeOptimPolicy",
    "PipeMarePolicy", "Oracle", "PolicyInfo", "policy_info", "SCHEDULE_FAMILIES",
]


@dataclass(frozen=True)
class Stored:
    """Stage weights ``W_k^(version)`` (an existing version; a future one makes the job wait)."""

    version: int


@dataclass(frozen=True)
class Predicted:
    """A prediction of ``W_k^(base+s)`` from version ``base`` (``kind="correction"``: PipeMare, s ≤ 0)."""

    base: int
    s: int
    kind: str = "predictor"


WeightSpec = Stored | Predicted

#: Schedule families a policy can be meant for (:attr:`Policy.schedule`), in the order of the arms.
SCHEDULE_FAMILIES = ("sequential", "gpipe", "1f1b", "async_1f1b", "2bw")


class Policy:
    """Base class. Subclasses set the class attributes and :meth:`forward`/:meth:`backward`.

    Class attributes:
        name, title: registry name and legend label (figures and tables print ``title``).
        schedule: the schedule family the policy is meant for, one of :data:`SCHEDULE_FAMILIES`
            (``"sequential"``: no pipeline; ``"gpipe"``, ``"1f1b"``: flushed; ``"async_1f1b"``: PipeDream's
            asynchronous 1F1B, one update per mini-batch; ``"2bw"``: PipeDream-2BW).
        synchronous: the policy requires a schedule without staleness (checked against the table).
        uses_predictor: the policy's specs include :class:`Predicted` (a predictor must be given).
        default_predictor: predictor name used when none is given.
        emulation_only: the policy needs weights no real pipeline has yet (the oracle): it runs in the
            emulator only and is no learning-curve arm.
        summary: one line for :meth:`describe`.
    """

    name: str = ""  # not ClassVar: Sync sets these three per instance (one class, three names)
    title: str = ""
    schedule: str = "async_1f1b"
    synchronous: ClassVar[bool] = False
    uses_predictor: ClassVar[bool] = False
    default_predictor: ClassVar[str | None] = None
    emulation_only: ClassVar[bool] = False
    summary: ClassVar[str] = ""

    def check(self, table: VersionTable) -> None:
        """Raise ValueError when the schedule does not suit the policy."""
        if self.synchronous:
            worst = table.max_staleness()
            if any(worst):
                k = max(range(table.D), key=lambda i: worst[i])
                raise ValueError(f"policy {self.name!r} needs a flushed schedule (staleness 0), but the schedule "
                                 f"has staleness {worst[k]} at stage {k}; use 'vanilla', 'stashing' or a "
                                 "prediction policy for asynchronous schedules")

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        raise NotImplementedError

    def backward(self, table: VersionTable, key: Job) -> WeightSpec:
        raise NotImplementedError

    def lr_factor(self, table: VersionTable, stage: int, step: int) -> float:
        """Multiplier of stage k's learning rate for the update of step t (1 unless PipeMare)."""
        return 1.0

    def extra_buffers(self, stage: int, D: int) -> int:
        """Weight-sized buffers besides weight versions a real stage keeps (PipeMare's δ)."""
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


def _cur(table: VersionTable, key: Job, op: str | None = None) -> int:
    return table.version((op or key[0], key[1], key[2], key[3]))


def _predict(base: int, target: int) -> WeightSpec:
    return Stored(base) if target == base else Predicted(base, target - base)


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

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        return Stored(_cur(table, key))

    def backward(self, table: VersionTable, key: Job) -> WeightSpec:
        return Stored(_cur(table, key))

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """One: the live weights (no version is kept besides them)."""
        return 1

    def options(self) -> dict:
        return {"name": self.name}


class Vanilla(Sync):
    """No mitigation: each job uses whatever version is current when it runs (VJP at newer weights)."""

    name, title, schedule = "vanilla", "vanilla async", "async_1f1b"
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

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        return Stored(_cur(table, key, "F"))

    backward = forward

    def stated_weight_copies(self, stage: int, D: int) -> int | None:
        """D − k: stage k stashes the versions of its D − k micro-batches in flight (PipeOptim Table II:
        PipeDream's weights memory ranges from M_θ to D·M_θ)."""
        return D - stage


class VerticalSync(Policy):
    """PipeDream vertical sync: every stage uses the version the input stage used for this micro-batch."""

    name, title = "vertical_sync", "vertical sync"
    summary = "forward and backward at cur(F at stage 0) of the same micro-batch, at every stage"

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        _, k, t, j = key
        return Stored(min(table.version(("F", 0, t, j)), table.version(("F", k, t, j))))

    backward = forward


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

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        _, k, t, _ = key
        return Stored(table.version(("F", 0 if self.rule == "paper" else k, t, 0)))

    backward = forward

    def check(self, table: VersionTable) -> None:
        """Refuse a schedule on which a job would need a version its stage does not have yet."""
        for key in table.jobs("F") + table.jobs("B"):
            cur = table.version(key)
            v = self.forward(table, key).version  # type: ignore[union-attr]
            if v > cur:
                raise ValueError(f"policy '2bw' on this schedule makes job {key} use version {v} of stage {key[1]} "
                                 f"before it exists (current {cur}); use pipedream_2bw(D, M) with M >= D")

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


    def target(self, table: VersionTable, key: Job) -> int:
        return table.round_trip_target(key)

    def _spec(self, table: VersionTable, key: Job) -> WeightSpec:
        base = _cur(table, key)
        if self.staleness == "paper":

            s = int(spectrain_version_difference(table.D, key[1], key[0]))
            return Predicted(base, s) if s else Stored(base)
        return _predict(base, self.target(table, key))

    forward = backward = _spec

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


    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        base = _cur(table, key)
        if self.staleness == "paper":

            s = int(pipeoptim_staleness(table.D, key[1]))
            return Predicted(base, s) if s else Stored(base)
        return _predict(base, int(table.update_version[key[1], key[2]]))

    def backward(self, table: VersionTable, key: Job) -> WeightSpec:
        return Stored(_cur(table, key))

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
    summary = "forward at cur(F), backward at cur(B) corrected back by (cur(B)−cur(F))·δ; LR τ^-(1-t/K)"

    def __init__(self, anneal_steps: int = 500, correction: bool = True) -> None:
        if not isinstance(anneal_steps, int) or anneal_steps < 0:
            raise ValueError(f"anneal_steps must be a non-negative int, got {anneal_steps!r}")
        self.anneal_steps = anneal_steps
        self.correction = correction
        self._tau: dict[int, list[int]] = {}

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        return Stored(_cur(table, key))

    def backward(self, table: VersionTable, key: Job) -> WeightSpec:
        cur_b, cur_f = _cur(table, key), _cur(table, key, "F")
        if not self.correction or cur_b == cur_f:
            return Stored(cur_b)
        return Predicted(cur_b, cur_f - cur_b, kind="correction")

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

    def forward(self, table: VersionTable, key: Job) -> WeightSpec:
        return Stored(int(table.update_version[key[1], key[2]]))

    backward = forward


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


@dataclass(frozen=True)
class PolicyInfo:
    """What the registry says about a policy: the one source of its label, schedule family and needs.

    Attributes:
        name: registry name; title: legend label; schedule: schedule family (:data:`SCHEDULE_FAMILIES`);
        synchronous: needs a flushed schedule; uses_predictor: its specs include :class:`Predicted`;
        default_predictor: the predictor used when none is given; emulation_only: not runnable in a real
        pipeline (no learning-curve arm, no ``pipelab.run`` choice); summary: one line on what it does.
    """

    name: str
    title: str
    schedule: str
    synchronous: bool
    uses_predictor: bool
    default_predictor: str | None
    emulation_only: bool
    summary: str


def policy_info(name: str) -> PolicyInfo:
    """The metadata of the registered policy ``name`` (read from the policy built with default options).

    Figures, the learning-curve arms and the ``pipelab.run`` choices read labels and schedule families here
    instead of retyping them.

    Example:
        >>> info = policy_info("2bw")
        >>> info.title, info.schedule, info.uses_predictor
        ('PipeDream-2BW', '2bw', False)
    """
    p = make_policy(name)
    return PolicyInfo(name=p.name, title=p.title, schedule=p.schedule, synchronous=p.synchronous,
                      uses_predictor=p.uses_predictor, default_predictor=p.default_predictor,
                      emulation_only=p.emulation_only, summary=p.summary)
