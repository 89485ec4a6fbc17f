"""The papers' closed forms and published numbers, in one place: what pipelab's simulations are compared against.

Each as the paper states it, with its reference; tests, figures and notebooks keep no copy of their own.

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

Some cells do not hold for the schedules they describe (PP's activation storage is B under GPipe's order; LPP's
latency is at least (S/R)·(B/G) when 1 < R < S); the notebook shows both side by side.

References: PipeOptim (Guan et al., arXiv:2312.00839, Eq. 4); SpecTrain (Chen et al., arXiv:1809.02839, Eqs. 5–6);
P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241, Table 1, §2,
§6); P. Qi, X. Wan, N. Amar, M. Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS 2024 (arXiv
2405.15362; summary table on huggingface.co/spaces/sail/pipeline-parallelism-with-controllable-memory);
DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437, §3.2.1, Table 2); A. Rahimi, "Unifying
Parallelization Schemes to Train Deep Nets" (2025), Table 1 and the theorem "ρ ≤ M/S".
"""

from __future__ import annotations

import numpy as np

from .schedules.actions import check_int
from .schedules.compiled import check_cost

__all__ = ["pipeoptim_staleness", "spectrain_version_difference", "async_1f1b_staleness", "ZB_SCHEDULES",
           "zero_bubble_closed_form", "V_SHAPE_FORMULAS", "v_shape_bubble", "v_shape_memory", "RAHIMI_SCHEMES",
           "RAHIMI_COLUMNS", "rahimi_row"]


# ------------------------------------------------------------------------------------ staleness presets
def pipeoptim_staleness(D: int, k: int | np.ndarray) -> int | np.ndarray:
    """PipeOptim's version difference s = D − k − 1 at stage k (Eq. 4): asynchronous 1F1B's, M = 1, steady state."""
    _check_stage(D, k)
    return D - np.asarray(k) - 1 if isinstance(k, np.ndarray) else D - k - 1


def spectrain_version_difference(D: int, k: int | np.ndarray, op: str = "F") -> int | np.ndarray:
    """SpecTrain's version difference: ⌊k/2⌋ + D − k − 1 for a forward, ⌊k/2⌋ for a backward (Eqs. 5–6).

    Stage-k updates from the job to the end of the round trip at unit-time slots
    (:meth:`~pipelab.schedules.versions.VersionTable.round_trip_difference` derives it).
    """
    _check_stage(D, k)
    if op not in ("F", "B"):
        raise ValueError(f"op must be 'F' or 'B', got {op!r}")
    kk = np.asarray(k)
    out = kk // 2 + (D - kk - 1 if op == "F" else 0)
    return out if isinstance(k, np.ndarray) else int(out)


def async_1f1b_staleness(D: int, M: int, k: int, t: int, j: int) -> int:
    """Forward staleness in asynchronous 1F1B: t − max(0, ⌊(g − D + k + 1)/M⌋), g = t·M + j (F after B(k, g−D+k))."""
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

    Bubble (p = D, T_B = T_I): 1F1B (p−1)(T_F+T_B+T_W); ZB-H1 (p−1)(T_F+T_B−T_W); ZB-H2 (p−1)(T_F+T_B−2T_W).
    Peak memory in micro-batches' stage activations M_B: p, p, 2p−1 (Qi et al., ICLR 2024, Table 1).
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

    1 − busy / (busy + idle), busy = 3·M·(chunks per worker); idle: 1F1B (W−1)·3, ZB-V 0, V-Half ≈ 3W, V-Min ≈ 4W,
    interleaved ZB W − 1, DualPipeV 2(W − 1) (F&B taken as F + B), DualPipe 2(W/2 − 1) with busy 3M.
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

    1F1B, ZB-V: W; V-Half: (W+2)//2; V-Min: (W+4)//3; DualPipeV: W + 1/2; DualPipe: W + 1; interleaved ZB: W for
    V = 1, ``None`` for V > 1 (no published number).
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
    """The note's Table 1 row for ``scheme`` (floats; W from the scheme); G, R only for LPP / FSLPP."""
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
