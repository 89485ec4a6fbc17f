"""Schedules as data: the :class:`Action` record and the :class:`Schedule` value.

A schedule is, for every worker w = 0..W−1, the ordered list of actions the worker executes: ``F`` (forward
of stage k on micro-batch j of step t), ``B`` (its full backward) or ``I`` and ``W`` (the backward split into
input gradient and weight gradient, the zero-bubble family), and ``U`` (the update of stage k's weights with
step t's gradients, on every worker that holds a copy). The global micro-batch index is g = t·M + j; in
interleaved and folded schedules several stages ("chunks") live on one worker and ``chunk`` says which.

Placement follows Rahimi's w(s, b, d) = (w_weights, w_compute): compute is where the action is listed,
weights are ``Schedule.weight_holders[k]``; a job reads stage k's weights from its own worker when it holds
them, else from the first holder (:meth:`Schedule.weight_source`). Which job waits for which is
:mod:`pipelab.schedules.dependencies`; ``sync_lag = L`` adds the weight barrier (L = 0: flushed; ``None``:
asynchronous).

Example:
    >>> from pipelab.schedules import gpipe
    >>> s = gpipe(D=2, M=2)
    >>> [str(a) for a in s.programs[0]]
    ['F0.0', 'F0.1', 'B0.0', 'B0.1', 'U0']

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), the placement
functions w(s,b,d) and priority n(s,b,d).
"""

from __future__ import annotations

import functools
import gc
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

__all__ = ["Action", "Schedule", "OPS", "COMPUTE_OPS", "WEIGHT_RULES", "MAX_JOBS", "check_int", "check_flag",
           "check_jobs", "flushed_program", "unflushed_program"]

#: Every op an action may carry. F/B/U are produced by the builders; I/W are the split backward.
OPS: tuple[str, ...] = ("F", "B", "U", "I", "W")
#: Ops that occupy a worker with model compute on a micro-batch.
COMPUTE_OPS: frozenset[str] = frozenset({"F", "B", "I", "W"})
#: Which weight version a schedule's design makes a job use (see ``Schedule.weight_rule``).
WEIGHT_RULES: tuple[str, ...] = ("current", "double_buffer", "stage_step_first")
#: Largest number of compute jobs (F/B/I/W actions) a builder produces: 50 million actions take minutes
#: and several GB to build; beyond it builders raise ValueError (see :func:`check_jobs`).
MAX_JOBS: int = 50_000_000


class Action(NamedTuple):
    """One entry of a worker's program (immutable, hashable, cheap to create).

    ``micro`` is −1 for "U"; ``chunk`` is which of the worker's chunks stage k is (0 unless interleaved or folded).

    Example:
        >>> Action("F", 2, 0, 3), str(Action("U", 1, 4, -1))
        (Action(op='F', stage=2, step=0, micro=3, chunk=0), 'U1')
    """

    op: str
    stage: int
    step: int
    micro: int
    chunk: int = 0

    def __str__(self) -> str:
        if self.op == "U":
            return f"U{self.stage}"
        return f"{self.op}{self.stage}.{self.micro}"

    def g(self, M: int) -> int:
        """Global micro-batch index g = t·M + j (−1 for updates)."""
        return -1 if self.micro < 0 else self.step * M + self.micro


@dataclass(frozen=True, eq=False)
class Schedule:
    """A pipeline schedule as data: per-worker ordered programs plus placement and update semantics.

    Attributes:
        programs: ``programs[w]`` is worker w's ordered tuple of :class:`Action`.
        D: stages (with V chunks per worker, D = V·W); M: micro-batches per step; steps: optimizer steps T.
        weight_holders: ``weight_holders[k]`` = workers holding a copy of stage k's weights, each running
            U(k, t) (default: the workers that compute stage k).
        sync_lag: ``None`` (asynchronous) or L ≥ 0: jobs of stage k in step t wait for U(k, t−1−L).
        weight_rule: the version the design gives a job: ``"current"`` (current when it runs),
            ``"double_buffer"`` (PipeDream-2BW: step t uses the version the input stage had when step t
            entered the pipeline) or ``"stage_step_first"`` (not 2BW: stage k's version at its own first
            forward of step t).
        update_rule: the written rule of when U happens; params: the builder's parameters.
        send_after: ``{job: later}`` with jobs ``(op, k, t, j)``: the tensor ``job`` hands to another worker
            leaves when ``later``, a job after it on the same worker, ends (torch sends an ``OVERLAP_F_B``'s
            outputs after its last sub-action). The simulator and the validator time the consumer after
            ``later``; the messages (:func:`~pipelab.schedules.transfers.messages`) still name the producer.

    Example:
        >>> from pipelab.schedules import one_f_one_b
        >>> s = one_f_one_b(D=4, M=8)
        >>> s.W, s.n_jobs, s.worker_of("F", 2, 0, 5)
        (4, 64, 2)
    """

    name: str
    programs: tuple[tuple[Action, ...], ...]
    D: int
    M: int
    steps: int = 1
    weight_holders: tuple[tuple[int, ...], ...] = ()
    sync_lag: int | None = 0
    weight_rule: str = "current"
    update_rule: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    send_after: Mapping[tuple[str, int, int, int], tuple[str, int, int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # frozen: normalised fields are set with object.__setattr__
        for name in ("D", "M", "steps"):
            object.__setattr__(self, name, check_int(f"Schedule.{name}", getattr(self, name)))
        if not self.programs:
            raise ValueError("Schedule.programs must list at least one worker")
        object.__setattr__(self, "programs", tuple(tuple(p) for p in self.programs))
        object.__setattr__(self, "weight_holders", _holders(self.programs, self.D, self.weight_holders))
        if self.sync_lag is not None and (not isinstance(self.sync_lag, int) or self.sync_lag < 0):
            raise ValueError(f"sync_lag must be None or an int >= 0, got {self.sync_lag!r}")
        if self.weight_rule not in WEIGHT_RULES:
            raise ValueError(f"weight_rule must be one of {WEIGHT_RULES}, got {self.weight_rule!r}")
        if not isinstance(self.send_after, Mapping):
            raise TypeError(f"send_after must be a mapping {{job: later job}}, got {type(self.send_after).__name__}")
        # where each job is and whether ``later`` follows it on its worker is checked by compile_schedule
        object.__setattr__(self, "send_after", {_job("send_after key", a): _job(f"send_after[{a!r}]", b)
                                                for a, b in self.send_after.items()})

    # ------------------------------------------------------------------ derived views
    @property
    def W(self) -> int:
        """Number of workers."""
        return len(self.programs)

    @property
    def n_jobs(self) -> int:
        """Number of compute jobs (F, B, I, W actions), excluding updates."""
        return sum(1 for p in self.programs for a in p if a.op != "U")

    @property
    def n_actions(self) -> int:
        """Number of actions of all kinds, updates included."""
        return sum(len(p) for p in self.programs)

    @property
    def split_backward(self) -> bool:
        """True when some backward is split into I and W actions."""
        return bool(self.split_set)

    @cached_property
    def split_set(self) -> frozenset[tuple[int, int, int]]:
        """The ``(k, t, j)`` whose backward is split into I and W (a schedule may split some and fuse others)."""
        return frozenset((a.stage, a.step, a.micro) for p in self.programs for a in p if a.op == "I")

    @cached_property
    def _where(self) -> dict[tuple[str, int, int, int], int]:
        return {(a.op, a.stage, a.step, a.micro): w for w, p in enumerate(self.programs)
                for a in p if a.op != "U"}

    def worker_of(self, op: str, stage: int, step: int, micro: int) -> int:
        """The compute worker w_compute of job (op, stage, step, micro)."""
        try:
            return self._where[(op, stage, step, micro)]
        except KeyError:
            raise ValueError(f"job {op}{stage}.{micro} of step {step} is not in schedule {self.name!r}") from None

    def weight_source(self, stage: int, worker: int) -> int:
        """w_weights: the worker whose copy of stage k's weights a job on ``worker`` reads."""
        hs = self.weight_holders[stage]
        return worker if worker in hs else hs[0]

    def stage_workers(self, stage: int) -> tuple[int, ...]:
        """Workers that compute stage k (for any micro-batch)."""
        return tuple(sorted({w for w, p in enumerate(self.programs) for a in p
                             if a.stage == stage and a.op != "U"}))

    def describe(self) -> str:
        """One paragraph: name, sizes, placement and the update rule."""
        lag = "none (asynchronous)" if self.sync_lag is None else f"{self.sync_lag}"
        return (f"{self.name}: W={self.W} workers, D={self.D} stages, M={self.M} micro-batches/step, "
                f"{self.steps} step(s), {self.n_jobs} jobs; weight barrier lag {lag}; weight rule "
                f"{self.weight_rule!r}. Updates: {self.update_rule}")

    def __repr__(self) -> str:
        return f"Schedule({self.name!r}, W={self.W}, D={self.D}, M={self.M}, steps={self.steps})"


def _holders(programs: tuple[tuple[Action, ...], ...], D: int, given: Any) -> tuple[tuple[int, ...], ...]:
    """``given`` weight holders as int tuples, checked (default: the workers computing each stage, else 0)."""
    W = len(programs)
    if not given:
        given = tuple(tuple(sorted({w for w, p in enumerate(programs) for a in p
                                    if a.stage == k and a.op != "U"})) or (0,) for k in range(D))
    holders = tuple(tuple(int(h) for h in hs) for hs in given)
    if len(holders) != D:
        raise ValueError(f"weight_holders must have one entry per stage (D={D}), got {len(holders)}")
    for k, hs in enumerate(holders):
        if not hs or any(not 0 <= h < W for h in hs):
            raise ValueError(f"weight_holders[{k}]={hs} must be non-empty workers in 0..{W - 1}")
    return holders


def _job(what: str, job: Any) -> tuple[str, int, int, int]:
    """``job`` as a tuple ``(op, stage, step, micro)`` of a compute op and three ints, or a clear error."""
    try:
        op, k, t, j = job
        out = (op, operator.index(k), operator.index(t), operator.index(j))
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a job (op, stage, step, micro) with integer indices, got {job!r}") from None
    if op not in COMPUTE_OPS or isinstance(k, bool) or isinstance(t, bool) or isinstance(j, bool):
        raise ValueError(f"{what} must be a job (op, stage, step, micro) with op one of {sorted(COMPUTE_OPS)}, "
                         f"got {job!r}")
    return out


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def gc_paused(fn: _Fn) -> _Fn:
    """Decorator: run ``fn`` with the cyclic garbage collector paused (building or timing a schedule allocates
    ~10^5–10^6 small tuples and no cycles; the collector's passes would make the cost grow faster than linearly)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return wrapper  # type: ignore[return-value]


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as a Python int; ValueError naming ``name`` unless ``operator.index`` accepts it (bools and floats
    refused: ``gpipe(D=True, M=2.0)`` is an error) and it is >= minimum.

    Example:
        >>> import numpy as np
        >>> check_int("M", np.int64(4))
        4
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return number


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool; TypeError unless it is one (a string such as ``"false"`` would otherwise read as True)."""
    if isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_jobs(name: str, jobs: int, limit: int | None = None) -> None:
    """Refuse to build a schedule of more than ``limit`` (default :data:`MAX_JOBS`) compute jobs, before anything is
    allocated (raise the module constant to build larger schedules on purpose)."""
    limit = MAX_JOBS if limit is None else limit
    if jobs > limit:
        raise ValueError(f"{name} would have {jobs:,} compute jobs, too large: the limit is MAX_JOBS={limit:,} "
                         "(pipelab.schedules.actions.MAX_JOBS); use fewer stages, micro-batches or steps")


def flushed_program(k: int, one_step: Sequence[tuple[str, int]], steps: int) -> tuple[Action, ...]:
    """Worker k's program of a flushed one-stage-per-worker schedule: one step's ``(op, j)`` order, then U(k, t),
    for every step t."""
    p: list[Action] = []
    for t in range(steps):
        p += [Action(op, k, t, j) for op, j in one_step]
        p.append(Action("U", k, t, -1))
    return tuple(p)


def unflushed_program(k: int, order: Sequence[tuple[str, int]], per_step: int, last: str, stride: int = 1,
                      offset: int = 0) -> tuple[Action, ...]:
    """Worker k's program of a never-flushed schedule: ``order`` runs over the micro-batches g = t·per_step + i of
    the whole run (micro-batch i·stride + offset of step t) and U(k, t) follows the ``last`` op of i = per_step−1."""
    p: list[Action] = []
    for op, g in order:
        t, i = divmod(g, per_step)
        p.append(Action(op, k, t, i * stride + offset))
        if op == last and i == per_step - 1:
            p.append(Action("U", k, t, -1))
    return tuple(p)
