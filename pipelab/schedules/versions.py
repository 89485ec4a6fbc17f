"""Version tables: which weight version every job of a simulated schedule ran with, and its staleness.

Let W_k^(v) be stage k's weights after v updates. Stage k's version at time τ (at a holder h) is the number
of updates U(k,·) at h that *ended* at or before τ. For each job (op, k, t, j) of a simulated schedule:

    forward[k, t, j]     = version at the start of F(k, t, j)          (at the job's weight source)
    backward[k, t, j]    = version at the start of B(k, t, j)          (of I(k, t, j) when B is split)
    weight_pass[k, t, j] = version at the start of W(k, t, j)          (= backward when B is not split)
    update_version[k, t] = version at the start of U(k, t)             (= t when updates run in order)
    staleness            = update_version[k, t] − version used by the job

so a gradient computed with the weights it is applied to has staleness 0.

With a split backward (Qi et al., ICLR 2024) W finishes the weight gradient from what I saved, so a
micro-batch's weights are decided at I: ``("B", k, t, j)`` names its backward whether it is one B or an I–W
pair, and ``weight_pass − backward`` counts the updates that ran between its I and its W (only without a flush).
Which version a job *uses* is its weight rule (:data:`USED_RULES`: the schedule's ``weight_rule``, or
``"stash"``: the backward uses its forward's version). The papers' staleness formulas are
:mod:`pipelab.papers`' presets, which the tests compare with the table.

Example:
    >>> from pipelab.schedules import pipedream
    >>> from pipelab.simulator import simulate
    >>> vt = simulate(pipedream(D=4, M=1, steps=12)).version_table
    >>> vt.staleness("F")[:, 8, 0].tolist()        # a steady-state mini-batch, stages 0..3
    [3, 2, 1, 0]

References: PipeOptim (Guan et al., arXiv:2312.00839, Eq. 4); SpecTrain (Chen et al., arXiv:1809.02839,
Eqs. 5–6); PipeDream-2BW (Narayanan et al., ICML 2021).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .dependencies import Job

__all__ = ["VersionTable", "USED_RULES"]

#: Rules for the version a job uses (see :meth:`VersionTable.used`).
USED_RULES = ("current", "double_buffer", "stage_step_first", "stash")


@dataclass
class VersionTable:
    """Weight versions of every job of a simulated schedule (see the module docstring for the rules).

    The simulator builds it; the policies, the pipeline core and the analyses read it: arrays for all jobs at
    once, keyed accessors (:meth:`version`, :meth:`staleness_of`, :meth:`jobs`) for one job ``(op, k, t, j)``.

    Attributes:
        forward, backward: int arrays [D, T, M], version at the start of F / B (of I when split).
        forward_start, backward_start: float arrays [D, T, M], start times of those jobs.
        update_version: int array [D, T], version at the start of U(k, t) at stage k's first holder (the
            version the update's gradient is applied to).
        update_end: float array [D, T], when U(k, t) ended at stage k's first holder.
        weight_rule: the schedule's weight rule, the default for :meth:`used` / :meth:`staleness`.
        order: the execution sequence, every job once (``U(k, t)`` once, however many holders run it), in an
            order where each job sees exactly the updates counted for it: compute jobs at their start,
            updates at their end (see :meth:`pipelab.simulator.SimResult.order`). Computed on first use.
        weight_pass, weight_pass_start: int / float arrays [D, T, M], version at and start of W(k, t, j) when
            the backward is split; ``None`` (the default) for a fused backward, then they are ``backward`` and
            ``backward_start``.
        split: whether the schedule splits its backward into I and W jobs (set when ``weight_pass`` is given).

    Example:
        >>> from pipelab.schedules import gpipe
        >>> from pipelab.simulator import simulate
        >>> vt = simulate(gpipe(D=3, M=2, steps=2)).version_table
        >>> int(vt.staleness("F").max()), vt.forward[:, 1, :].tolist()
        (0, [[1, 1], [1, 1], [1, 1]])
    """

    forward: np.ndarray
    backward: np.ndarray
    forward_start: np.ndarray
    backward_start: np.ndarray
    update_version: np.ndarray
    update_end: np.ndarray
    weight_rule: str = "current"
    execution: Sequence[Job] | Callable[[], Sequence[Job]] = field(default=(), repr=False, compare=False)
    weight_pass: np.ndarray = field(default=None, repr=False)  # type: ignore[arg-type]
    weight_pass_start: np.ndarray = field(default=None, repr=False)  # type: ignore[arg-type]
    split: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.split = self.weight_pass is not None
        if self.weight_pass is None:
            self.weight_pass, self.weight_pass_start = self.backward, self.backward_start
        elif self.weight_pass_start is None:
            raise ValueError("weight_pass needs weight_pass_start (the start times of the W jobs)")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(D, T, M)."""
        D, T, M = self.forward.shape
        return int(D), int(T), int(M)

    @property
    def D(self) -> int:
        """Stages."""
        return self.shape[0]

    @property
    def steps(self) -> int:
        """Steps (mini-batches) T."""
        return self.shape[1]

    @property
    def M(self) -> int:
        """Micro-batches per step."""
        return self.shape[2]

    # ------------------------------------------------------------ one job at a time
    @cached_property
    def order(self) -> tuple[Job, ...]:
        """The execution sequence (see the class docstring); empty for a table built without one."""
        ex = self.execution
        return tuple(ex() if callable(ex) else ex)

    @cached_property
    def split_set(self) -> frozenset[tuple[int, int, int]]:
        """The ``(k, t, j)`` whose backward is split into I and W (from :attr:`order`; none unless :attr:`split`)."""
        if not self.split:
            return frozenset()
        return frozenset(job[1:] for job in self.order if job[0] == "I")

    @cached_property
    def index(self) -> dict[Job, int]:
        """Position of every job in :attr:`order`."""
        return {job: i for i, job in enumerate(self.order)}

    def jobs(self, op: str = "F") -> list[Job]:
        """The jobs of ``op`` in execution order (in (k, t, j) order for a table without one).

        ``op`` is "F", "B", "I" or "W". "B" lists the backward of every micro-batch as the key
        ``("B", k, t, j)`` in the order of its gradient job, B or (when split) I: the key policies decide the
        backward's weights by.
        """
        if op not in ("F", "B", "I", "W"):
            raise ValueError(f"op must be 'F', 'B', 'I' or 'W', got {op!r}")
        if op in ("I", "W") and not self.split:
            return []
        ops = ("B", "I") if op == "B" else (op,)
        if self.order:
            return [(op,) + job[1:] for job in self.order if job[0] in ops]
        D, T, M = self.shape
        return [(op, k, t, j) for k in range(D) for t in range(T) for j in range(M)]

    def version(self, job: Job) -> int:
        """cur(job): the version of stage k current when job ``(op, k, t, j)`` started (op F, B, I or W;
        on a split table B and I both read the version at I)."""
        op, k, t, j = job
        if op == "F":
            return int(self.forward[k, t, j])
        if op == "B" or (op == "I" and self.split):
            return int(self.backward[k, t, j])
        if op == "W" and self.split:
            return int(self.weight_pass[k, t, j])
        raise ValueError(f"version() takes an F or B job (or I/W of a split table), got op {op!r} in {job}")

    def staleness_of(self, job: Job) -> int:
        """``update_version[k, t] − cur(job)`` (at the version current at the job)."""
        return int(self.update_version[job[1], job[2]]) - self.version(job)

    def max_staleness(self) -> list[int]:
        """Largest staleness of any F or B job at the version current at it, per stage."""
        uv = self.update_version[:, :, None]
        worst = np.maximum((uv - self.forward).max(axis=(1, 2)), (uv - self.backward).max(axis=(1, 2)))
        return [int(w) for w in worst]

    def round_trip_target(self, job: Job) -> int:
        """R(job): stage k's version when micro-batch (t, j)'s backward at stage 0 starts (updates ending
        strictly before it) - SpecTrain's prediction target; see :meth:`round_trip_difference`."""
        op, k, t, j = job
        if op not in ("F", "B"):
            raise ValueError(f"round_trip_target() takes an F or B job, got op {op!r} in {job}")
        return int(self.round_trip_targets[op][k, t, j])

    @cached_property
    def round_trip_targets(self) -> dict[str, np.ndarray]:
        """R of every job: ``{"F": [D, T, M], "B": [D, T, M]}`` (:meth:`round_trip_target`)."""
        return {"F": self.forward + self.round_trip_difference("F"),
                "B": self.backward + self.round_trip_difference("B")}

    def used(self, op: str = "F", rule: str | None = None) -> np.ndarray:
        """Version each job uses under ``rule`` (default: the schedule's weight rule), shape [D, T, M].

        ``current``: the version at the job; ``double_buffer`` (PipeDream-2BW): forward[0, t, 0], the input
        stage's version at step t's first forward, for every job of step t at every stage;
        ``stage_step_first``: forward[k, t, 0] for every job of step t at stage k (not 2BW);
        ``stash``: a backward uses the version of its own forward.
        """
        rule = self.weight_rule if rule is None else rule
        if rule not in USED_RULES:
            raise ValueError(f"rule must be one of {USED_RULES}, got {rule!r}")
        if op not in ("F", "B"):
            raise ValueError(f"op must be 'F' or 'B', got {op!r}")
        if rule == "double_buffer":
            return np.broadcast_to(self.forward[:1, :, :1], self.forward.shape).copy()
        if rule == "stage_step_first":
            return np.broadcast_to(self.forward[:, :, :1], self.forward.shape).copy()
        if op == "F" or rule == "stash":
            return self.forward.copy()
        return self.backward.copy()

    def staleness(self, op: str = "F", rule: str | None = None) -> np.ndarray:
        """update_version[k, t] − used version, shape [D, T, M] (0 = the gradient is fresh)."""
        return self.update_version[:, :, None] - self.used(op, rule)

    def version_at(self, k: int, time: float | np.ndarray, *, strict: bool = False) -> np.ndarray:
        """Stage k's version at ``time``: the number of U(k, ·) that ended at or before it (``strict``:
        strictly before it)."""
        return np.searchsorted(self.update_end[k], np.asarray(time), side="left" if strict else "right")

    def round_trip_difference(self, op: str = "F", *, inclusive: bool = False) -> np.ndarray:
        """Stage-k updates between each job and the end of its micro-batch's round trip, [D, T, M].

        The round trip ends when the backward of stage 0 starts. The value counts the updates U(k, ·) that
        end after the job started and before that moment: version_at(k, B(0,t,j) start, strict=True) −
        version at the job. SpecTrain's Eqs. 5–6 (⌊k/2⌋ + D−k−1 forward, ⌊k/2⌋ backward) equal it in
        steady state with unit costs. ``inclusive=True`` also counts an update ending exactly when the
        round trip ends (SpecTrain's time-slot picture does not); it gives ⌈k/2⌉ in place of ⌊k/2⌋.
        """
        if op not in ("F", "B"):
            raise ValueError(f"op must be 'F' or 'B', got {op!r}")
        end = self.backward_start[0]
        D = self.forward.shape[0]
        at_end = np.stack([self.version_at(k, end, strict=not inclusive) for k in range(D)])
        return at_end - (self.forward if op == "F" else self.backward)

    def stash_depth(self, k: int, rule: str | None = None) -> int:
        """Most weight versions stage k must keep at once: the distinct versions used by the forwards of
        micro-batches in flight (F started, B not started) together with the current version."""
        used = self.used("F", rule)[k].reshape(-1)
        fs = self.forward_start[k].reshape(-1)
        bs = self.backward_start[k].reshape(-1)
        ue = self.update_end[k]
        # Events at equal times: updates first, then backwards (release), then forwards (acquire).
        ev = ([(float(t), 0, 0) for t in ue] + [(float(t), 1, int(v)) for t, v in zip(bs, used)]
              + [(float(t), 2, int(v)) for t, v in zip(fs, used)])
        ev.sort(key=lambda e: (e[0], e[1]))
        live: Counter[int] = Counter()
        current, best = 0, 1
        for _, kind, v in ev:
            if kind == 0:
                current += 1
            elif kind == 1:
                live[v] -= 1
                if live[v] == 0:
                    del live[v]
            else:
                live[v] += 1
            best = max(best, len(live) + (current not in live))
        return best
