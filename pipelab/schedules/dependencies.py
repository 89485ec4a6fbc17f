"""The dependency rule of a pipeline schedule, written once: every reader of job order derives it from here.

A job is ``(op, k, t, j)`` (``j = -1`` for U). The *gradient job* of stage k produces its input gradient (B, or
I when split), the *weight-gradient job* finishes its weight gradient (B, or W); splitting is per stage and
micro-batch (:data:`Split`). For one micro-batch (t, j):

    F(k)    <- F(k-1)                           carries the activation into stage k
    B(k)    <- F(k),  gradient job(k+1)         the latter carries the gradient of stage k's output
    I(k)    <- F(k),  gradient job(k+1)
    W(k)    <- I(k)
    U(k, t) <- weight-gradient job(k, t, j) for every j = 0..M-1

With ``sync_lag = L`` every compute job of stage k in step t also waits for U(k, t-1-L) at its weight source.
:data:`EDGES` is the first block as data (in dependency-slot order); a new kind of job is added there.

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), pred(s, b, d); the
split backward of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np

__all__ = ["Job", "Edge", "EDGES", "ACTIVATION", "GRADIENT", "edges_into", "dependencies", "update_dependency",
           "barrier_step", "gradient_job", "weight_gradient_job", "received_from", "handed_to", "Split", "is_split"]

#: A job ``(op, k, t, j)``: op in "F", "B", "U", "I", "W"; ``j = -1`` for "U".
Job = tuple[str, int, int, int]

StepT = TypeVar("StepT", int, np.ndarray)

#: Which backwards are split into I and W: all (``True``), none (``False``), or those of the ``(k, t, j)`` listed.
Split = bool | AbstractSet[tuple[int, int, int]]

#: What a cross-stage edge carries between workers.
ACTIVATION: Literal["activation"] = "activation"
GRADIENT: Literal["gradient"] = "gradient"


@dataclass(frozen=True)
class Edge:
    """``job(k) <- on(k + stage)`` for the same micro-batch.

    ``on``: "F", "I", or "grad" (that stage's gradient job); ``carries``: the tensor crossing to another worker
    (``None``: both jobs belong to one stage).
    """

    job: str
    on: str
    stage: int
    carries: str | None


EDGES: tuple[Edge, ...] = (
    Edge("F", "F", -1, ACTIVATION),
    Edge("B", "F", 0, None),
    Edge("B", "grad", +1, GRADIENT),
    Edge("I", "F", 0, None),
    Edge("I", "grad", +1, GRADIENT),
    Edge("W", "I", 0, None),
)


def edges_into(op: str) -> tuple[Edge, ...]:
    """The edges of a job of ``op``, in dependency-slot order (none for "U": see :func:`dependencies`)."""
    return tuple(e for e in EDGES if e.job == op)


def is_split(split: Split, k: int, t: int, j: int) -> bool:
    """Whether stage k's backward of micro-batch (t, j) is split into I and W under ``split``."""
    return split if isinstance(split, bool) else (k, t, j) in split


def gradient_job(split: bool) -> str:
    """The op that produces a stage's input gradient: "I" when the backward is split, else "B"."""
    return "I" if split else "B"


def weight_gradient_job(split: bool) -> str:
    """The op that finishes a stage's weight gradient: "W" when the backward is split, else "B"."""
    return "W" if split else "B"


def dependencies(job: Job, D: int, M: int, split: Split = False) -> list[Job]:
    """The jobs ``job`` waits for (data dependencies; the weight barrier is :func:`update_dependency`)."""
    op, k, t, j = job
    if op == "U":
        return [(weight_gradient_job(is_split(split, k, t, jj)), k, t, jj) for jj in range(M)]
    out: list[Job] = []
    for e in edges_into(op):
        kk = k + e.stage
        if 0 <= kk < D:
            out.append((gradient_job(is_split(split, kk, t, j)) if e.on == "grad" else e.on, kk, t, j))
    return out


def barrier_step(t: StepT, sync_lag: int) -> StepT:
    """``t - 1 - L``: the step whose update a job of step t waits for under ``sync_lag = L`` (negative: none)."""
    return t - 1 - sync_lag


def received_from(job: Job, D: int, split: Split = False) -> list[Job]:
    """The jobs whose tensor ``job`` consumes: F(k-1) for F(k), the next stage's gradient job for B(k) or I(k)."""
    op, k, t, j = job
    return [(gradient_job(is_split(split, k + e.stage, t, j)) if e.on == "grad" else e.on, k + e.stage, t, j)
            for e in edges_into(op) if e.carries is not None and 0 <= k + e.stage < D]


def handed_to(job: Job, D: int, split: Split = False) -> list[Job]:
    """The jobs that consume the tensor ``job`` produces: the inverse of :func:`received_from`."""
    op, k, t, j = job
    out: list[Job] = []
    for e in EDGES:
        kk = k - e.stage
        if e.carries is None or not 0 <= kk < D:
            continue
        producer = gradient_job(is_split(split, k, t, j)) if e.on == "grad" else e.on
        consumer_ok = e.job == "F" or e.job == gradient_job(is_split(split, kk, t, j))
        if producer == op and consumer_ok:
            out.append((e.job, kk, t, j))
    return out


def update_dependency(job: Job, sync_lag: int | None) -> tuple[int, int] | None:
    """``(k, t-1-L)``: the update a compute job waits for under ``sync_lag = L``; ``None`` if there is none."""
    op, k, t, _ = job
    if op == "U" or sync_lag is None or barrier_step(t, sync_lag) < 0:
        return None
    return k, barrier_step(t, sync_lag)
