"""The papers' closed forms and published numbers, in one place: what pipelab's simulations are compared against.

Each is written as the paper states it, with its reference; the tests, the figures and the notebooks compare
the simulator, the version table and real runs with these and keep no copy of their own.

The staleness presets of PipeOptim and SpecTrain (what the version table gives on asynchronous 1F1B), Zero
Bubble's Table 1, the V-shape family's formulas (:data:`V_SHAPE_FORMULAS`) and Rahimi's Table 1 with its
throughput bound ρ ≤ M/S.

Rahimi's Table 1, with S stages, B micro-batches, W workers (G groups of R for the looped schemes), unit-time F+B
per stage, unit weights and unit activations per stage:

========  ======  =============  ==============  ===============  =====================  ==============
scheme    W       latency        act. xmit/wkr   weight xmit/wkr  act. storage/wkr       weight storage
========  ======  =============  ==============  ===============  =====================  ==============
DDP       B       S              0               0                S                      S
FSDP      B       S              0               S − 1            S                      1
PP        S       B + S − 1      B               0                min(S, B)              1
LPP       G·R     S + B/G − 1    B               0                (S/R)·min(S, B/G)      S/R
FSLPP     G·R     S + B/G − 1    B               S − 1            (S/R)·min(S, B/G)      1
========  ======  =============  ==============  ===============  =====================  ==============

:func:`rahimi_measured_row` reads the same quantities off a simulation (maximum over workers; latency in units of
one stage's F+B, i.e. f = b = ½). Some cells do not hold for the schedules they describe — e.g. PP's activation
storage is B under GPipe's forward-first order (min(S, B) only under 1F1B), and LPP's latency is at least
(S/R)·(B/G) when 1 < R < S — the notebook shows both side by side.

Example:
    >>> rahimi_row("PP", S=4, B=8)["latency"], zero_bubble_closed_form("ZB-H1", 4), pipeoptim_staleness(4, 0)
    (11.0, (3.0, 4), 3)

References: PipeOptim (Guan et al., arXiv:2312.00839, Eq. 4); SpecTrain (Chen et al., arXiv:1809.02839, Eqs. 5–6);
P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241, Table 1, §2,
§6); P. Qi, X. Wan, N. Amar, M. Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS 2024 (arXiv
2405.15362; summary table on huggingface.co/spaces/sail/pipeline-parallelism-with-controllable-memory);
DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437, §3.2.1, Table 2); A. Rahimi, "Unifying
Parallelization Schemes to Train Deep Nets" (2025), Table 1 and the theorem "ρ ≤ M/S".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .schedules.actions import check_int
from .schedules.compiled import check_cost

__all__ = ["pipeoptim_staleness", "spectrain_version_difference", "async_1f1b_staleness", "ZB_SCHEDULES",
           "zero_bubble_closed_form", "V_SHAPE_FORMULAS", "v_shape_bubble", "v_shape_memory", "RAHIMI_SCHEMES",
           "RAHIMI_COLUMNS", "rahimi_row", "rahimi_measured_row", "rahimi_throughput"]


# ------------------------------------------------------------------------------------ staleness presets
def pipeoptim_staleness(D: int, k: int | np.ndarray) -> int | np.ndarray:
    """PipeOptim's weight version difference s = D − k − 1 at stage (rank) k (PipeOptim Eq. 4).

    Equals the forward staleness of asynchronous 1F1B with one micro-batch per update in steady state.

    Example:
        >>> [pipeoptim_staleness(4, k) for k in range(4)]
        [3, 2, 1, 0]
    """
    _check_stage(D, k)
    return D - np.asarray(k) - 1 if isinstance(k, np.ndarray) else D - k - 1


def spectrain_version_difference(D: int, k: int | np.ndarray, op: str = "F") -> int | np.ndarray:
    """SpecTrain's version difference: ⌊k/2⌋ + D − k − 1 for a forward, ⌊k/2⌋ for a backward (Eqs. 5–6).

    It counts stage-k updates from the job to the end of the micro-batch's round trip (its backward at
    stage 0), assuming unit-time F and B slots;
    :meth:`~pipelab.schedules.versions.VersionTable.round_trip_difference` derives it.

    Example:
        >>> [spectrain_version_difference(4, k) for k in range(4)], spectrain_version_difference(4, 3, "B")
        ([3, 2, 2, 1], 1)
    """
    _check_stage(D, k)
    if op not in ("F", "B"):
        raise ValueError(f"op must be 'F' or 'B', got {op!r}")
    kk = np.asarray(k)
    out = kk // 2 + (D - kk - 1 if op == "F" else 0)
    return out if isinstance(k, np.ndarray) else int(out)


def async_1f1b_staleness(D: int, M: int, k: int, t: int, j: int) -> int:
    """Forward staleness of micro-batch (t, j) at stage k in asynchronous 1F1B with M micro-batches/update.

    Worker k keeps D−k micro-batches in flight, so F(k, g) runs right after B(k, g−D+k) and sees the
    updates of the steps completed by then:  staleness = t − max(0, ⌊(g − D + k + 1)/M⌋), g = t·M + j.
    M = 1 gives PipeOptim's D − k − 1 once g ≥ D − k − 1.

    Example:
        >>> async_1f1b_staleness(4, 1, 0, 10, 0), async_1f1b_staleness(4, 2, 0, 10, 0)
        (3, 2)
    """
    g = t * M + j
    return t - max(0, (g - D + k + 1) // M)


def _check_stage(D: int, k: int | np.ndarray) -> None:
    kk = np.asarray(k)
    if D < 1 or np.any(kk < 0) or np.any(kk >= D):
        raise ValueError(f"stage k must lie in 0..D-1 (D={D}), got {k}")


# ------------------------------------------------------------------------------------ Zero Bubble, Table 1
#: The schedules of the paper's Table 1, in its order.
ZB_SCHEDULES: tuple[str, ...] = ("1F1B", "ZB-H1", "ZB-H2")


def zero_bubble_closed_form(schedule: str, D: int, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 1.0
                            ) -> tuple[float, int]:
    """The paper's Table 1: (bubble per step, peak resident micro-batches) of 1F1B, ZB-H1 and ZB-H2.

    Bubble (p = D, T_B = T_I the input-gradient pass): 1F1B (p−1)(T_F+T_B+T_W); ZB-H1 (p−1)(T_F+T_B−T_W);
    ZB-H2 (p−1)(T_F+T_B−2T_W). Peak memory in units of one micro-batch's stage activations M_B: p, p, 2p−1.

    Example:
        >>> zero_bubble_closed_form("ZB-H1", 4), zero_bubble_closed_form("ZB-H2", 4)
        ((3.0, 4), (0.0, 7))

    Raises:
        ValueError: an unknown schedule, D not an int >= 1, a cost that is NaN, ±inf or negative.
        TypeError: a cost that is not a number.

    Reference: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Table 1.
    """
    D = check_int("D", D)
    t_f, t_i, t_w = (check_cost(n, v) for n, v in (("t_f", t_f), ("t_i", t_i), ("t_w", t_w)))
    if schedule == "1F1B":
        return (D - 1) * (t_f + t_i + t_w), D
    if schedule == "ZB-H1":
        return (D - 1) * (t_f + t_i - t_w), D
    if schedule == "ZB-H2":
        return (D - 1) * (t_f + t_i - 2 * t_w), 2 * D - 1
    raise ValueError(f"schedule must be one of {ZB_SCHEDULES}, got {schedule!r}")


# -------------------------------------------------------------------------------- the V-shape family
#: Builder name (:data:`~pipelab.schedules.builders.BUILDERS`) → (bubble formula, activation-memory formula,
#: whether the bubble formula is exact, source).
#: Bubble rate as the papers define it: 1 − (compute of the busiest worker) / (longest worker span), at
#: T_F = T_I = T_W = 1 per stage (chunk), B = I + W; memory in micro-batches of a full worker's layers
#: (2 chunk activations in a V, V in the interleaved order), an activation held from F to its W.
V_SHAPE_FORMULAS: dict[str, tuple[str, str, bool, str]] = {
    "1f1b": ("(W−1)/(M+W−1)", "W", True, "ZB paper Table/README (1F1B baseline)"),
    "zb_v": ("0", "W", True, "ZB paper §6 (ZB-V); NeurIPS 2024 summary (V-ZB)"),
    "v_half": ("≈ W/(2M)", "(W+2)//2", False, "NeurIPS 2024 summary table (V-Half)"),
    "v_min": ("≈ 2W/(3M)", "(W+4)//3", False, "NeurIPS 2024 summary table (V-Min)"),
    "interleaved_zb": ("idle (W−1)(T_F+T_I−T_W)", "W (V=1 only)", True,
                       "ZB paper §2.1 (ZB-H1), per chunk for V>1"),
    "dualpipe_v": ("idle ≤ (D/2−1)(F&B+B−3W)", "(D+1)/2", False, "DeepSeek-V3 Table 2 (DualPipe), D = 2W"),
    "dualpipe": ("idle ≤ (W/2−1)(F&B+B−3W)", "W+1", False, "DeepSeek-V3 Table 2 (DualPipe), PP = D = W"),
}


def v_shape_bubble(name: str, W: int, M: int, V: int = 2) -> float:
    """The paper's bubble rate for builder ``name`` at T_F = T_I = T_W = 1 (see :data:`V_SHAPE_FORMULAS`).

    Rates are 1 − busy / (busy + idle) with busy = 3·M·(chunks per worker) unit jobs per worker and the
    paper's idle: 1F1B (W−1)·3 (F + B = 3 units per stage), ZB-V 0, V-Half ≈ 3W (rate W/(2M)), V-Min ≈ 4W
    (rate 2W/(3M)), interleaved ZB (ZB-H1) (W−1)(T_F + T_I − T_W) = W − 1, DualPipeV (D/2 − 1)(F&B + B
    − 3W) = 2(W − 1) with the overlapped F&B taken as F + B (pipelab runs them one after the other);
    DualPipe (W/2 − 1)(F&B + B − 3W) = 2(W/2 − 1) with busy 3M (M/2 micro-batches per direction, two
    stages per worker).

    Example:
        >>> v_shape_bubble("1f1b", W=4, M=8), v_shape_bubble("zb_v", 4, 8), v_shape_bubble("v_half", 4, 8)
        (0.2727272727272727, 0.0, 0.25)
    """
    W, M, V = check_int("W", W), check_int("M", M), check_int("V", V)
    if name == "1f1b":
        return (W - 1) / (M + W - 1)
    if name == "zb_v":
        return 0.0
    if name == "v_half":
        return W / (2 * M)
    if name == "v_min":
        return 2 * W / (3 * M)
    if name == "interleaved_zb":
        return (W - 1) / (3 * V * M + W - 1)
    if name == "dualpipe_v":
        return 2 * (W - 1) / (6 * M + 2 * (W - 1))
    if name == "dualpipe":
        idle = 2 * (W // 2 - 1)
        return idle / (3 * M + idle)
    raise ValueError(f"name must be one of {sorted(V_SHAPE_FORMULAS)}, got {name!r}")


def v_shape_memory(name: str, W: int, V: int = 2) -> float | None:
    """The paper's peak activation memory of builder ``name``, in micro-batches of a full worker's layers.

    1F1B, ZB-V: W; V-Half: (W+2)//2; V-Min: (W+4)//3; DualPipeV: D + 1 chunk activations = W + 1/2;
    DualPipe: PP + 1 = W + 1 stage activations (a stage being a 1F1B worker's share);
    interleaved ZB: W for V = 1 (ZB-H1 keeps 1F1B's memory), ``None`` for V > 1 (no published number).

    Example:
        >>> [v_shape_memory(n, 8) for n in ("zb_v", "v_half", "v_min", "dualpipe_v")]
        [8, 5, 4, 8.5]
    """
    W, V = check_int("W", W), check_int("V", V)
    table: dict[str, float | None] = {"1f1b": W, "zb_v": W, "v_half": (W + 2) // 2, "v_min": (W + 4) // 3,
                                      "dualpipe_v": W + 0.5, "dualpipe": W + 1,
                                      "interleaved_zb": W if V == 1 else None}
    if name not in table:
        raise ValueError(f"name must be one of {sorted(V_SHAPE_FORMULAS)}, got {name!r}")
    return table[name]


# ------------------------------------------------------------------------------------ Rahimi's Table 1
RAHIMI_SCHEMES = ("DDP", "FSDP", "PP", "LPP", "FSLPP")
RAHIMI_COLUMNS = ("W", "latency", "activation_xmit", "weight_xmit", "activation_storage", "weight_storage")


def rahimi_row(scheme: str, S: int, B: int, G: int = 1, R: int = 1) -> dict[str, float]:
    """The note's Table 1 row for ``scheme`` (values as floats; W from the scheme's constraint).

    Args:
        scheme: one of :data:`RAHIMI_SCHEMES`.
        S: stages; B: micro-batches; G, R: groups and workers per group (LPP / FSLPP only).
    """
    if scheme not in RAHIMI_SCHEMES:
        raise ValueError(f"scheme must be one of {RAHIMI_SCHEMES}, got {scheme!r}")
    S, B, G, R = (check_int(n, v) for n, v in (("S", S), ("B", B), ("G", G), ("R", R)))
    row: tuple[float, ...]
    if scheme in ("DDP", "FSDP"):
        row = (B, S, 0, 0 if scheme == "DDP" else S - 1, S, S if scheme == "DDP" else 1)
    elif scheme == "PP":
        row = (S, B + S - 1, B, 0, min(S, B), 1)
    else:
        row = (G * R, S + B / G - 1, B, 0 if scheme == "LPP" else S - 1, S / R * min(S, B / G),
               S / R if scheme == "LPP" else 1)
    return {k: float(v) for k, v in zip(RAHIMI_COLUMNS, row)}


def rahimi_measured_row(result: Any) -> dict[str, float]:
    """The Table 1 quantities of a :class:`~pipelab.simulator.SimResult` (max over workers)."""
    return {
        "W": float(result.schedule.W),
        "latency": float(result.latency_units),
        "activation_xmit": float(result.activation_transfers.max()),
        "weight_xmit": float(result.weight_transfers.max()),
        "activation_storage": float(result.peak_activations.max()),
        "weight_storage": float(result.weight_storage.max()),
    }


def rahimi_throughput(result: Any) -> tuple[float, float]:
    """(ρ, M/S): Rahimi's throughput per worker ρ = S·B / (L·W) (jobs per worker per F+B unit of time,
    over one step) and the bound M_peak / S with M_peak the largest per-worker peak activation count."""
    s = result.schedule
    B = s.M * s.steps
    rho = s.D * B / (result.latency_units * s.W)
    return rho, float(result.peak_activations.max()) / s.D
