"""Which schedule × policy × codec reaches a target soonest on given links (issue 27): the study's arms, their step
times from the link-model simulator, their steps to target from the learning-curve runs, and the preset modelled on
Protocol NanoGPT's setting.

The analysis (:func:`steps_to_target`, :func:`time_to_target`, :func:`crossover`):

**Steps to target** of one run, from its learning curve: values y_0, y_1, … evaluated after s_0 < s_1 < … optimizer
steps, a target y* (a loss: met when y ≤ y*; an accuracy, ``higher=True``: met when y ≥ y*). With i the first
evaluation that meets it,

    steps = s_0 if i = 0,   else s_{i−1} + (s_i − s_{i−1}) · (y* − y_{i−1}) / (y_i − y_{i−1})

(linear between the two evaluations around the crossing). A run that never meets it, or that diverges first (a
non-finite value ends the curve), has steps = ∞: *not reached*. It is counted, never dropped.

**Time to target** of an arm (one schedule × policy × codec on one link setting): T · steps per seed, T the steady
step time — the period of one optimizer step after the fill (:mod:`pipelab.planner`'s T: the spacing of step ends
past the warm-up, measured by the link-model simulator, :func:`pipelab.simulator.simulate` with ``network=``). Across
the n seeds: the mean with its Student-t interval (:func:`pipelab.statistics.t_interval`) when every seed reached the
target; when k < n did, the arm is "not reached (k of n)" and its mean is ∞ (a mean of the reached seeds alone would
favour the arm that failed most).

**Crossover.** Arm a (say asynchronous) beats arm b (synchronous) at a link setting x when
T_a(x)·S_a < T_b(x)·S_b, i.e. log(T_b(x)/T_a(x)) > log ρ, ρ = S_a/S_b. The seeds are paired (same initial weights
and data order), so log ρ is the mean of the per-seed log(a_i/b_i) (ρ: their geometric mean) with its t interval
[L_lo, L_hi]. The crossover is the x where h(x) = log(T_b(x)/T_a(x)) − log ρ changes sign on a grid of settings,
linear in x between the two grid points around it; its interval is the crossings of the interval's ends (±∞: beyond
the grid's lowest or highest setting; NaN with one seed). When h changes sign more than once the crossings are all
reported and none is chosen.

Example:
    >>> steps_to_target([0, 100, 200], [[0.2, 0.6, 0.9], [0.2, 0.3, 0.4]], 0.8, higher=True).tolist()
    [166.66666666666669, inf]
    >>> time_to_target([100.0, 120.0, float("inf")], 0.5).label()
    'not reached (2 of 3)'

**Step time.** Per stage the compute costs come from a FLOP model: torch's :class:`~torch.utils.flop_counter.
FlopCounterMode` counts a forward and a backward of the stage on the ``meta`` device (shapes only, nothing is
computed) for one sample, divided by a stated throughput ``flops_per_second``; a stage's cost scales linearly with
its micro-batch. The bytes crossing each boundary come from :func:`pipelab.links.message_bytes` (the hand-over
dtype; a codec bills its encoded bytes, in both directions). The steady step time is the planner's period T
(:mod:`pipelab.planner`: the spacing of step ends after the fill, one partition, no search), simulated with every
boundary on the same :class:`~pipelab.links.Link` both ways, receiver-side wires (one inbound wire per worker, shared
by activations and gradients). A policy's own extra work (predictions, recomputed forwards) is not billed: on the
slow links this study is about it is small beside the messages.

**The study's steps to target.** From the learning-curve records of each arm's policy
(:func:`pipelab.studies.learning_curves.sweep`, cached: the same configs as the figures that already run them),
evaluated once per epoch; the synchronous 1F1B arm reads the ``sequential`` arm's runs (a flushed schedule trains
exactly as plain training, up to rounding). A codec arm's accuracy cost needs the emulator to apply the codec: until
then its steps are *pending* (``None``), and its time to target is drawn as the bound it would have without an
accuracy cost, labelled so.

**The benchmark-like preset** (:data:`NANOGPT`, :func:`benchmark_forecast`): Protocol NanoGPT (2026) scores a run as
steps-to-target × steady step time with every stage boundary metered as 200 Mb/s and 50 ms, billed on the receiver's
one inbound wire shared by forward activations and backward gradients. Its meter code was not found (searched
2026-11); the semantics implemented are the issue's words, which are the link model's. Eight stages of one
GPT-2-small transformer block each (d_model 768, 12 heads, feed-forward 3072, sequence 1024, bf16 hand-over), torch's
1F1B as the baseline (``from_torch`` of ``Schedule1F1B``'s action lists, which equal pipelab's ``1f1b``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..links import CODECS, Link, MessageBytes, Network, message_bytes
from ..planner import Blocks, Plan, plan
from ..statistics import t_interval

__all__ = ["steps_to_target", "TimeToTarget", "time_to_target", "Crossover", "crossover", "Arm", "ARMS", "stage_flops",
           "flop_blocks", "codec_ratios", "steady_plan", "arm_steps", "NanoGPTSetting", "NANOGPT", "nanogpt_model",
           "nanogpt_stages", "benchmark_forecast"]


def steps_to_target(steps: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, target: float, *,
                    higher: bool = False) -> np.ndarray:
    """Steps each run needs to reach ``target`` (module docstring): ``values`` of shape (points,) or (runs, points)
    at the increasing ``steps``; ``higher``: an accuracy (met at ≥), else a loss (met at ≤). ∞: not reached.

    Raises:
        ValueError: ``steps`` not strictly increasing or not matching ``values``' last axis; ``target`` not finite.
    """
    s = np.asarray(steps, dtype=np.float64)
    y = np.atleast_2d(np.asarray(values, dtype=np.float64))
    if s.ndim != 1 or s.size < 1 or y.ndim != 2 or y.shape[1] != s.size:
        raise ValueError(f"values must have shape (points,) or (runs, points) with points = len(steps) = {s.size}, "
                         f"got {np.shape(values)}")
    if np.any(np.diff(s) <= 0) or not np.all(np.isfinite(s)):
        raise ValueError(f"steps must be finite and strictly increasing, got {s.tolist()}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise ValueError(f"target must be a finite number, got {target!r}")
    out = np.full(y.shape[0], math.inf)
    for r, row in enumerate(y):
        bad = np.flatnonzero(~np.isfinite(row))
        row = row[: bad[0]] if bad.size else row  # a diverged run's curve ends at its first non-finite value
        met = np.flatnonzero(row >= target if higher else row <= target)
        if met.size:
            i = int(met[0])
            out[r] = s[0] if i == 0 else s[i - 1] + (s[i] - s[i - 1]) * (target - row[i - 1]) / (row[i] - row[i - 1])
    return out


@dataclass(frozen=True)
class TimeToTarget:
    """An arm's time to target: per-seed ``steps`` (∞: not reached), the steady ``step_time`` (s), ``seconds`` =
    mean of step_time·steps over the seeds (∞ unless all reached) and its t ``half_width`` (NaN with one seed)."""

    steps: tuple[float, ...]
    step_time: float
    seconds: float
    half_width: float
    confidence: float

    @property
    def reached(self) -> int:
        return sum(math.isfinite(x) for x in self.steps)

    @property
    def low(self) -> float:
        return self.seconds - self.half_width

    @property
    def high(self) -> float:
        return self.seconds + self.half_width

    def label(self) -> str:
        """``"12.3 ± 1.2 s"`` (``"12.3 s"`` with one seed), or ``"not reached (k of n)"``."""
        if self.reached < len(self.steps):
            return f"not reached ({self.reached} of {len(self.steps)})"
        return f"{self.seconds:.4g}" + ("" if math.isnan(self.half_width) else f" ± {self.half_width:.2g}") + " s"


def time_to_target(steps: Sequence[float] | np.ndarray, step_time: float, confidence: float = 0.95) -> TimeToTarget:
    """Time to target of one arm from its per-seed steps to target and its steady step time (module docstring).

    Raises:
        ValueError: ``step_time`` not a finite number > 0; ``steps`` empty, negative or NaN.
    """
    if isinstance(step_time, bool) or not isinstance(step_time, (int, float)) or not (
            math.isfinite(step_time) and step_time > 0):
        raise ValueError(f"step_time must be a finite number of seconds > 0, got {step_time!r}")
    s = np.asarray(steps, dtype=np.float64).reshape(-1)
    if s.size == 0 or np.any(np.isnan(s)) or np.any(s < 0):
        raise ValueError(f"steps must be one value >= 0 per seed (inf: not reached), got {s.tolist()}")
    if np.isinf(s).any():
        return TimeToTarget(tuple(s.tolist()), float(step_time), math.inf, math.nan, confidence)
    iv = t_interval(s * step_time, confidence)
    return TimeToTarget(tuple(s.tolist()), float(step_time), iv.mean, iv.half_width, confidence)


@dataclass(frozen=True)
class Crossover:
    """Where arm a starts to beat arm b along a grid of link settings (module docstring).

    ``value``: the one crossing (NaN: none, several, or a seed not reached); ``low``/``high``: the crossings of the
    interval's ends of log ρ (±∞: beyond the grid; NaN: one seed or no single crossing); ``crossings``: every
    crossing of the mean; ``a_wins``: per grid point, whether a's mean time to target is below b's; ``ratio``:
    ρ = S_a/S_b (geometric mean over seeds) and its interval ``ratio_low``/``ratio_high``; ``reached``: every seed of
    both arms reached."""

    value: float
    low: float
    high: float
    crossings: tuple[float, ...]
    a_wins: tuple[bool, ...]
    ratio: float
    ratio_low: float
    ratio_high: float
    reached: bool


def _crossings(x: np.ndarray, h: np.ndarray) -> list[float]:
    out = []
    for i in range(x.size - 1):
        if h[i] == 0:
            out.append(float(x[i]))
        elif h[i] * h[i + 1] < 0:
            out.append(float(x[i] + (x[i + 1] - x[i]) * h[i] / (h[i] - h[i + 1])))
    if h.size and h[-1] == 0:
        out.append(float(x[-1]))
    return out


def crossover(x: Sequence[float] | np.ndarray, step_time_a: Sequence[float] | np.ndarray,
              step_time_b: Sequence[float] | np.ndarray, steps_a: Sequence[float] | np.ndarray,
              steps_b: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Crossover:
    """The setting ``x`` (an increasing grid: bandwidths, latencies) where arm a's time to target crosses arm b's,
    from each arm's step time on the grid and its per-seed steps to target, paired by seed (module docstring).

    Raises:
        ValueError: grids of different lengths or a non-increasing ``x``; step times not > 0; per-seed steps of
            different lengths.
    """
    xs, ta, tb = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (x, step_time_a, step_time_b))
    if not (xs.size == ta.size == tb.size >= 2) or np.any(np.diff(xs) <= 0):
        raise ValueError(f"x must be an increasing grid of >= 2 settings with one step time of each arm per setting, "
                         f"got {xs.size} settings, {ta.size} and {tb.size} step times")
    if not (np.all(ta > 0) and np.all(tb > 0) and np.all(np.isfinite(ta)) and np.all(np.isfinite(tb))):
        raise ValueError("step times must be finite and > 0")
    sa, sb = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (steps_a, steps_b))
    if sa.size != sb.size or sa.size == 0:
        raise ValueError(f"steps_a and steps_b must give one value per seed, paired, got {sa.size} and {sb.size}")
    nan = math.nan
    if not (np.all(np.isfinite(sa)) and np.all(np.isfinite(sb))):
        wins = bool(np.isfinite(sa).all() and not np.isfinite(sb).all())  # a reached on every seed, b did not
        return Crossover(nan, nan, nan, (), (wins,) * xs.size, nan, nan, nan, False)
    iv = t_interval(np.log(sa) - np.log(sb), confidence)
    gain = np.log(tb) - np.log(ta)

    def one(level: float) -> float:
        c = _crossings(xs, gain - level) if math.isfinite(level) else []
        return c[0] if len(c) == 1 else nan

    mean = _crossings(xs, gain - iv.mean)
    value = mean[0] if len(mean) == 1 else nan
    ends = [one(iv.low), one(iv.high)]
    if math.isfinite(value) and not math.isnan(iv.half_width):  # an end beyond the grid: on the side away from value
        known = [e for e in ends if not math.isnan(e)]
        side = math.inf if known and known[0] < value else -math.inf
        ends = known if len(known) == 2 else known + [side] if known else [-math.inf, math.inf]
    low, high = sorted(ends) if not any(math.isnan(e) for e in ends) else (nan, nan)
    return Crossover(value, low, high, tuple(mean),
                     tuple(bool(v) for v in gain > iv.mean), math.exp(iv.mean), math.exp(iv.low),
                     math.exp(iv.high), True)


@dataclass(frozen=True)
class Arm:
    """One arm: its ``label``, the planner's ``schedule`` (:data:`pipelab.planner.SCHEDULES`), the learning-curve
    policy whose runs give its steps (``None``: pending), the ``codec`` on every boundary
    (:data:`pipelab.links.CODECS`) and the ``optimizer`` of those runs (``None``: the study's)."""

    label: str
    schedule: str
    steps_from: str | None
    codec: str = "identity"
    optimizer: str | None = None


#: the study's arms: synchronous 1F1B, asynchronous 1F1B (PipeDream) under three policies, PipeDream-2BW, and
#: synchronous 1F1B with int8 activations and gradients (its steps from GPipe-policy runs through the int8 codec: a
#: flushed pipeline trains as plain training but for the codec). The Nesterov policy runs its paper's NAdam with
#: β1 = 0.99 (``nadam_async``): under the study's NAdam its weights are weight stashing's.
ARMS: tuple[Arm, ...] = (Arm("sync 1F1B", "1f1b", "sequential"), Arm("async 1F1B, stashing", "pipedream", "stashing"),
                         Arm("async 1F1B, PipeOptim", "pipedream", "pipeoptim"),
                         Arm("async 1F1B, Nesterov", "pipedream", "nesterov_async", optimizer="nadam_async"),
                         Arm("2BW", "2bw", "2bw"), Arm("sync 1F1B, int8", "1f1b", "gpipe", "int8"))


def stage_flops(stages: Sequence[nn.Module], sample: torch.Tensor) -> list[tuple[float, float]]:
    """(forward, backward) FLOPs of each stage for ``sample`` (one micro-batch), counted on the ``meta`` device (a
    copy of the stages unless they are there already); the first stage's backward computes no input gradient."""
    out = []
    x = sample.to("meta")
    for k, stage in enumerate(stages):
        s = stage if next(stage.parameters(), torch.empty(0)).is_meta else copy.deepcopy(stage).to("meta")
        x = x.detach().requires_grad_(k > 0 and x.is_floating_point())  # the model input needs no gradient
        with FlopCounterMode(display=False) as fwd:
            y = s(x)
        with FlopCounterMode(display=False) as bwd:
            y.float().sum().backward()
        out.append((float(fwd.get_total_flops()), float(bwd.get_total_flops())))
        x = y
    return out


def flop_blocks(stages: Sequence[nn.Module], sample: torch.Tensor, flops_per_second: float, *,
                dtype: torch.dtype | None = None) -> Blocks:
    """The planner's :class:`~pipelab.planner.Blocks` of ``stages`` (one block per stage) for ``sample`` (one
    micro-batch of ``sample.shape[0]`` samples): FLOPs / ``flops_per_second`` seconds, the hand-over bytes in
    ``dtype`` (``None``: the stages' own) as each block's output bytes."""
    if not (isinstance(flops_per_second, (int, float)) and math.isfinite(flops_per_second) and flops_per_second > 0):
        raise ValueError(f"flops_per_second must be a finite number > 0, got {flops_per_second!r}")
    flops = stage_flops(stages, sample)
    out = list(message_bytes(stages, sample.to("meta"), dtype=dtype).activation) + [0]
    return Blocks([f / flops_per_second for f, _ in flops], [b / flops_per_second for _, b in flops],
                  output_bytes=out, batch=int(sample.shape[0]))


def codec_ratios(stages: Sequence[nn.Module], sample: torch.Tensor, codec: str,
                  dtype: torch.dtype | None) -> tuple[np.ndarray, np.ndarray]:
    """Per boundary, encoded / plain bytes of the activation and of its gradient (every codec's bill is linear in
    the rows, so the ratio holds for any micro-batch)."""
    if codec not in CODECS:
        raise ValueError(f"codec={codec!r}; choose one of {', '.join(CODECS)}")
    x = sample.to("meta")
    plain = message_bytes(stages, x, dtype=dtype)
    coded = message_bytes(stages, x, dtype=dtype, codec=CODECS[codec])
    return (np.asarray(coded.activation) / np.maximum(plain.activation, 1),
            np.asarray(coded.gradient) / np.maximum(plain.gradient, 1))


def steady_plan(blocks: Blocks, schedule: str, M: int, batch: int, link: Link,
                ratios: tuple[np.ndarray, np.ndarray] | None = None) -> Plan:
    """The planner's plan of ``schedule`` with ``M`` micro-batches of ``batch / M`` samples, one stage per block and
    device, every boundary on ``link`` both ways: its ``step_time`` is the steady step time (s), its ``critical``
    path the steady step's. ``ratios``: a codec's encoded/plain bytes per boundary (:func:`codec_ratios`)."""
    D = len(blocks.f)

    def comm(out_bytes: Sequence[float]) -> dict:
        b = np.asarray(out_bytes, dtype=np.float64)
        ra, rg = ratios if ratios is not None else (np.ones(D - 1), np.ones(D - 1))
        return {"network": Network.uniform(D, link), "message_bytes": MessageBytes(tuple(b * ra), tuple(b * rg))}

    return plan(blocks, D, global_batch=batch, link=comm, schedules=(schedule,), micro_batches=(M,),
                partition=[1] * D, top=1)[0]


def arm_steps(records: Sequence[dict], metric: str, target: float) -> np.ndarray:
    """Steps to ``target`` of each record (one per seed) on its per-epoch ``metric`` (``test_acc``/``val_acc``:
    an accuracy, a fraction, met from below; a ``*_loss``: met from above), evaluated after e · steps_per_epoch
    steps."""
    if not records:
        raise ValueError("no learning-curve records for this arm")
    higher = metric.endswith("_acc")
    return np.concatenate([steps_to_target(np.asarray(r["epoch"]) * r["steps_per_epoch"], r[metric], target,
                                           higher=higher) for r in records])


@dataclass(frozen=True)
class NanoGPTSetting:
    """The benchmark-like setting: ``D`` stages of one transformer block each (``d_model``, ``heads``, feed-forward
    ``ffn``, sequence ``seq``), ``micro`` samples per micro-batch, ``M`` micro-batches per step, the hand-over
    ``dtype``, links of ``mbps`` Mb/s and ``latency_ms``, compute at ``flops_per_second``."""

    D: int = 8
    d_model: int = 768
    heads: int = 12
    ffn: int = 3072
    seq: int = 1024
    micro: int = 1
    M: int = 16
    dtype: str = "bfloat16"
    mbps: float = 200.0
    latency_ms: float = 50.0
    flops_per_second: float = 100e12


#: full size (GPT-2 small's block; 100 TFLOP/s: bf16 on one H100 at ~10 % of its dense peak, a stated assumption)
#: and the CPU scale (d_model 64, 4 heads, sequence 64, float32 hand-over, 10 GFLOP/s: one CPU core)
NANOGPT: dict[str, NanoGPTSetting] = {
    "full": NanoGPTSetting(),
    "cpu": NanoGPTSetting(d_model=64, heads=4, ffn=256, seq=64, micro=4, M=8, dtype="float32",
                          flops_per_second=10e9),
}


def nanogpt_model(s: NanoGPTSetting, device: torch.device | str | None = None) -> nn.Sequential:
    """The setting's model: ``s.D`` pre-norm encoder blocks (causal attention not needed for the cost) in a row,
    one per stage, float32 on ``device``."""
    return nn.Sequential(*(nn.TransformerEncoderLayer(s.d_model, s.heads, s.ffn, dropout=0.0, batch_first=True,
                                                      norm_first=True, device=device) for _ in range(s.D)))


def nanogpt_stages(s: NanoGPTSetting) -> tuple[list[nn.Module], torch.Tensor]:
    """The setting's stages (:func:`nanogpt_model`) on ``meta``, and a micro-batch of shape (micro, seq,
    d_model)."""
    return list(nanogpt_model(s, "meta")), torch.zeros(s.micro, s.seq, s.d_model, device="meta")


def benchmark_forecast(s: NanoGPTSetting, schedule: str = "1f1b") -> dict[str, float]:
    """Forecast of ``schedule`` (default torch's 1F1B: ``from_torch`` of ``Schedule1F1B``'s order is pipelab's
    ``1f1b``, tested in ``tests/core/test_torch_interop.py``) in setting ``s``: the steady ``step_time`` (s), the
    ``link_share`` of it (the steady step's critical path: seconds in messages, latency and transmission, over the
    step time), the bottleneck stage's ``compute`` per step, the bytes per message and the samples per step."""
    stages, x = nanogpt_stages(s)
    blocks = flop_blocks(stages, x, s.flops_per_second, dtype=getattr(torch, s.dtype))
    M = 1 if schedule == "pipedream" else s.M
    p = steady_plan(blocks, schedule, M, s.micro * M, Link.mbps(s.mbps, latency_ms=s.latency_ms))
    link = sum(p.critical.time_by("transfer").values())
    return {"step_time": p.step_time, "link_share": link / p.step_time, "link_seconds": link,
            "compute": max(f + b for f, b in zip(blocks.f, blocks.b)) * M,
            "message_bytes": float(message_bytes(stages, x, dtype=getattr(torch, s.dtype)).activation[0]),
            "samples_per_step": s.micro * M, "M": M}
