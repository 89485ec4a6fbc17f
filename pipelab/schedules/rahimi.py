"""Rahimi's Table 1 (latency, traffic and memory per worker) as formulas and as simulated measurements.

Table 1 of the note, with S stages, B micro-batches, W workers (G groups of R for the looped schemes),
unit-time F+B per stage, unit weights and unit activations per stage:

========  ======  =============  ==============  ===============  =====================  ==============
scheme    W       latency        act. xmit/wkr   weight xmit/wkr  act. storage/wkr       weight storage
========  ======  =============  ==============  ===============  =====================  ==============
DDP       B       S              0               0                S                      S
FSDP      B       S              0               S − 1            S                      1
PP        S       B + S − 1      B               0                min(S, B)              1
LPP       G·R     S + B/G − 1    B               0                (S/R)·min(S, B/G)      S/R
FSLPP     G·R     S + B/G − 1    B               S − 1            (S/R)·min(S, B/G)      1
========  ======  =============  ==============  ===============  =====================  ==============

:func:`measured_row` reads the same quantities off a simulation (maximum over workers; latency in units
of one stage's F+B, i.e. f = b = ½). Some cells do not hold for the schedules they describe — e.g. PP's
activation storage is B under GPipe's forward-first order (min(S, B) only under 1F1B), and LPP's latency
is at least (S/R)·(B/G) when 1 < R < S — the notebook shows both side by side.

The note's throughput bound: ρ = S·B / (L·W) ≤ M_peak / S (:func:`throughput_per_worker`).

Example:
    >>> table_row("PP", S=4, B=8)["latency"]
    11.0

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), Table 1 and the
theorem "ρ ≤ M/S".
"""

from __future__ import annotations

from typing import Any

from .actions import check_int

__all__ = ["SCHEMES", "COLUMNS", "table_row", "measured_row", "throughput_per_worker"]

SCHEMES = ("DDP", "FSDP", "PP", "LPP", "FSLPP")
COLUMNS = ("W", "latency", "activation_xmit", "weight_xmit", "activation_storage", "weight_storage")


def table_row(scheme: str, S: int, B: int, G: int = 1, R: int = 1) -> dict[str, float]:
    """The note's Table 1 row for ``scheme`` (values as floats; W from the scheme's constraint).

    Args:
        scheme: one of :data:`SCHEMES`.
        S: stages; B: micro-batches; G, R: groups and workers per group (LPP / FSLPP only).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    S, B, G, R = (check_int(n, v) for n, v in (("S", S), ("B", B), ("G", G), ("R", R)))
    row: tuple[float, ...]
    if scheme in ("DDP", "FSDP"):
        row = (B, S, 0, 0 if scheme == "DDP" else S - 1, S, S if scheme == "DDP" else 1)
    elif scheme == "PP":
        row = (S, B + S - 1, B, 0, min(S, B), 1)
    else:
        row = (G * R, S + B / G - 1, B, 0 if scheme == "LPP" else S - 1, S / R * min(S, B / G),
               S / R if scheme == "LPP" else 1)
    return {k: float(v) for k, v in zip(COLUMNS, row)}


def measured_row(result: Any) -> dict[str, float]:
    """The Table 1 quantities of a :class:`~pipelab.simulator.SimResult` (max over workers)."""
    return {
        "W": float(result.schedule.W),
        "latency": float(result.latency_units),
        "activation_xmit": float(result.activation_transfers.max()),
        "weight_xmit": float(result.weight_transfers.max()),
        "activation_storage": float(result.peak_activations.max()),
        "weight_storage": float(result.weight_storage.max()),
    }


def throughput_per_worker(result: Any) -> tuple[float, float]:
    """(ρ, M/S): Rahimi's throughput per worker ρ = S·B / (L·W) (jobs per worker per F+B unit of time,
    over one step) and the bound M_peak / S with M_peak the largest per-worker peak activation count."""
    s = result.schedule
    B = s.M * s.steps
    rho = s.D * B / (result.latency_units * s.W)
    return rho, float(result.peak_activations.max()) / s.D
