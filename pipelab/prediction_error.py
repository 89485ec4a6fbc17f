"""Prediction error of weight predictors along a real training run (RMSE and cosine vs staleness).

Train a model normally with a ``torch.optim`` optimizer; every ``measure_every`` steps (the *origin* t)
ask each predictor for ``Ŵ_{t+s}``, s = 1..S, and when step ``t+s`` has been taken compare with the
true weights ``W_{t+s}``:

- ``rmse[p, s, t] = sqrt(mean((Ŵ_{t+s} − W_{t+s})²))`` per layer and overall;
- ``stale[s, t] = sqrt(mean((W_t − W_{t+s})²))`` (the stale weights a pipeline would use without
  prediction, SpecTrain Fig. 8's reference curve); ``ratio = rmse / stale`` (< 1: prediction helps);
- ``cosine[p, s, t] = cos(Ŵ_{t+s} − W_t, W_{t+s} − W_t)`` between predicted and true displacement.

*Inside the pipeline* (:func:`measure_in_pipeline`):
the same errors measured during real pipelined training in the exact emulator (asynchronous 1F1B), for the
weights a predicting policy (PipeOptim, SpecTrain, PipeMare) hands to each job of stage k, against the version
``base + s`` they stand for — s from the version table, i.e. each stage's real staleness — per layer, with the
stale version ``W^(base)`` as baseline (:class:`InPipelineResult`, its ``rows()``).

*Gradient corrections inside the pipeline* (the same :func:`measure_in_pipeline`, for a policy that corrects the
delayed gradient instead of predicting weights: error feedback, DC-ASGD): at each update U(k, t) the step's
accumulated gradient ``g`` (computed at the stale weights its backwards used, s versions old from the version
table) and the corrected ``g̃`` the optimizer receives are both compared with the gradient the same mini-batch
has at the weights the pipeline holds at that moment, ``∇f_t(W_now)`` (every stage at its live version), per
layer: ``pred = rmse(g̃ − ∇f_t(W_now))``, ``stale = rmse(g − ∇f_t(W_now))``, so ``ratio < 1``: the correction
moves the gradient toward the current weights' one.

Memory stays bounded: the last S+1 weight versions live in a ring buffer (:class:`WeightRing`), and the
pending predictions are at most ``P·S·⌈S/measure_every⌉`` weight copies (``P`` predictors).

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 10))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> data = [(torch.randn(16, 8), torch.randint(0, 10, (16,))) for _ in range(20)]
    >>> res = measure_prediction_error(model, opt, data, ["stale", "spectrain"], max_s=2)
    >>> res.rmse.shape   # predictors × s × origins × (layers + overall)
    (2, 2, 19, 4)

Reference: SpecTrain (Chen et al., arXiv:1809.02839) Fig. 8 measures the RMSE of predicted vs stale
weights for s = 1, 2, 3; PipeOptim (Guan et al., arXiv:2312.00839) motivates the per-optimizer rules.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .pipeline.driver import check_examples
from .policies import Predicted, Stored, WeightSpec
from .predictors import Predictor, make_predictor
from .predictors.base import flat_params

__all__ = ["WeightRing", "PredictionErrorResult", "measure_prediction_error", "layer_names",
           "IN_PIPELINE_POLICIES", "CORRECTING_POLICIES", "InPipelineResult", "measure_in_pipeline"]

log = logging.getLogger(__name__)


class WeightRing:
    """The last ``capacity`` weight versions, keyed by step, in preallocated buffers (no reallocation)."""

    def __init__(self, like: Sequence[Tensor], capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._slots = [[torch.empty_like(t) for t in like] for _ in range(capacity)]
        self._steps: list[int | None] = [None] * capacity

    def push(self, step: int, weights: Sequence[Tensor]) -> None:
        i = step % self.capacity
        torch._foreach_copy_(self._slots[i], [w.detach() for w in weights])
        self._steps[i] = step

    def get(self, step: int) -> list[Tensor]:
        i = step % self.capacity
        if self._steps[i] != step:
            held = sorted(s for s in self._steps if s is not None)
            raise KeyError(f"weight version {step} is not in the ring (holds {held})")
        return self._slots[i]


def layer_names(model: nn.Module, params: Sequence[Tensor]) -> list[str]:
    """For each parameter, its layer: the name of the model's top-level child holding it."""
    owner = {id(p): name.split(".")[0] for name, p in model.named_parameters()}
    return [owner.get(id(p), "?") for p in params]


@dataclass
class PredictionErrorResult:
    """Errors of each predictor, staleness and origin step, per layer and overall (last layer index).

    Attributes:
        predictors: predictor names (axis 0 of ``rmse``/``cosine``).
        layers: layer names; index ``len(layers)`` of the last axis is the whole model ("overall").
        origins: steps t at which predictions were made.
        rmse, cosine: ``[P, S, T, L+1]``; ``stale``: ``[S, T, L+1]`` (NaN where not measured).
        loss: training loss per step; ``diverged_at``: first step with a non-finite loss, or None.
    """

    predictors: list[str]
    layers: list[str]
    origins: np.ndarray
    rmse: np.ndarray
    stale: np.ndarray
    cosine: np.ndarray
    loss: np.ndarray
    diverged_at: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def max_s(self) -> int:
        return self.stale.shape[0]

    def ratio(self) -> np.ndarray:
        """``rmse / stale`` per predictor, s, origin, layer."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.rmse / self.stale[None]

    def summary_ratio(self, skip_fraction: float = 0.1, *, per_layer: bool = False) -> np.ndarray:
        """Time-averaged RMSE over time-averaged stale RMSE, the first ``skip_fraction`` of origins skipped.

        Returns ``[P, S]`` for the whole model, or ``[P, S, L+1]`` with ``per_layer`` (last index: overall).
        """
        start = int(len(self.origins) * skip_fraction)
        sel = slice(None) if per_layer else -1
        with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            num = np.nanmean(self.rmse[:, :, start:, sel], axis=2)
            den = np.nanmean(self.stale[:, start:, sel], axis=1)
            return num / den[None]

    def summary_cosine(self, skip_fraction: float = 0.1) -> np.ndarray:
        """``[P, S]``: mean overall cosine between predicted and true displacement."""
        start = int(len(self.origins) * skip_fraction)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the stale predictor's cosine is undefined (NaN)
            return np.nanmean(self.cosine[:, :, start:, -1], axis=2)


def _per_param_sq(xs: list[Tensor]) -> list[Tensor]:
    return [n.square() for n in torch._foreach_norm(xs)]


class _LayerSums:
    """Per-parameter values summed per layer (the model's top-level children), and over the model (last index)."""

    def __init__(self, model: nn.Module, params: Sequence[Tensor]) -> None:
        names = layer_names(model, params)
        self.layers = list(dict.fromkeys(names))
        self.idx = torch.tensor([self.layers.index(n) for n in names])
        self.numel = self([torch.tensor(float(p.numel())) for p in params])

    def __call__(self, per_param: list[Tensor]) -> Tensor:
        v = torch.stack([x.detach().to("cpu", torch.float64) for x in per_param])
        out = torch.zeros(len(self.layers) + 1, dtype=torch.float64)
        out.index_add_(0, self.idx, v)
        out[-1] = v.sum()
        return out

    def compare(self, base: list[Tensor], params: Sequence[Tensor], predicted: list[list[Tensor]],
                rmse: np.ndarray, stale: np.ndarray, cosine: np.ndarray) -> None:
        """Write the errors of each predictor's ``predicted`` weights against ``params``, predicted from ``base``,
        into the rows ``rmse`` and ``cosine`` (``[P, L+1]``) and ``stale`` (``[L+1]``)."""
        now = [q.detach() for q in params]
        true_disp = list(torch._foreach_sub(now, base))
        sq_true = self(_per_param_sq(true_disp))
        stale[:] = (sq_true / self.numel).sqrt().numpy()
        for pi, w_hat in enumerate(predicted):
            rmse[pi] = (self(_per_param_sq(list(torch._foreach_sub(w_hat, now)))) / self.numel).sqrt().numpy()
            disp = list(torch._foreach_sub(w_hat, base))
            dot = self([a.mul(b).sum() for a, b in zip(disp, true_disp)])
            with np.errstate(divide="ignore", invalid="ignore"):
                cosine[pi] = (dot / (self(_per_param_sq(disp)) * sq_true).sqrt()).numpy()


def measure_prediction_error(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[tuple[Tensor, Tensor]],
    predictors: Sequence[str | Predictor],
    *,
    max_s: int = 3,
    measure_every: int = 1,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy,
) -> PredictionErrorResult:
    """Train ``model`` on ``batches`` with ``optimizer`` and measure every predictor's error for s = 1..max_s.

    Args:
        model: the model (its parameters are the optimizer's).
        optimizer: a supported ``torch.optim`` optimizer (see :func:`pipelab.predictors.supported_optimizers`).
        batches: ``(x, y)`` mini-batches; one optimizer step each (a sized sequence fixes the origins).
        predictors: registry names or predictor objects.
        max_s: largest staleness S.
        measure_every: predict at every ``measure_every``-th step.
        loss_fn: ``loss_fn(model(x), y)``.

    Returns:
        A :class:`PredictionErrorResult`.
    """
    if not isinstance(max_s, int) or max_s < 1:
        raise ValueError(f"max_s must be a positive integer, got {max_s!r}")
    if not isinstance(measure_every, int) or measure_every < 1:
        raise ValueError(f"measure_every must be a positive integer, got {measure_every!r}")
    batches = list(batches)
    steps = len(batches)
    preds = [p if isinstance(p, Predictor) else make_predictor(p) for p in predictors]
    names = [getattr(p, "preset", p.name) for p in preds]
    for p in preds:
        p.check(optimizer)
    params = flat_params(optimizer)
    sums = _LayerSums(model, params)
    origins = np.arange(measure_every, steps, measure_every)
    T, P, L1 = len(origins), len(preds), len(sums.layers) + 1
    rmse = np.full((P, max_s, T, L1), np.nan)
    cosine = np.full((P, max_s, T, L1), np.nan)
    stale = np.full((max_s, T, L1), np.nan)
    losses = np.full(steps, np.nan)
    ring = WeightRing(params, max_s + 1)
    ring.push(0, params)
    # step t+s -> the predictions (origin t, s, one per predictor) to compare with its weights
    pending: dict[int, list[tuple[int, int, list[list[Tensor]]]]] = {}
    origin_index = {int(t): i for i, t in enumerate(origins)}
    diverged_at = None
    for p in preds:
        p.observe(optimizer)
    model.train()
    for t, (x, y) in enumerate(batches, start=1):
        check_examples(t - 1, x)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        losses[t - 1] = float(loss.detach())
        if not math.isfinite(losses[t - 1]):
            diverged_at = t
            log.warning("training diverged at step %d (loss %s)", t, losses[t - 1])
            break
        loss.backward()
        optimizer.step()
        for p in preds:
            p.observe(optimizer)
        ring.push(t, params)
        with torch.no_grad():
            for origin, s, predicted in pending.pop(t, []):
                ti = origin_index[origin]
                sums.compare(ring.get(origin), params, predicted, rmse[:, s - 1, ti], stale[s - 1, ti],
                             cosine[:, s - 1, ti])
            if t in origin_index:
                horizon = min(max_s, steps - t)
                per_pred = [p.predict_all(optimizer, horizon) for p in preds]
                for s in range(1, horizon + 1):
                    pending.setdefault(t + s, []).append((t, s, [pp[s - 1] for pp in per_pred]))
    meta = {"optimizer": type(optimizer).__name__, "steps": steps, "measure_every": measure_every,
            "options": {n: p.options() for n, p in zip(names, preds)}}
    return PredictionErrorResult(names, sums.layers, origins, rmse, stale, cosine, losses, diverged_at, meta)


# --------------------------------------------------------------------------------- inside the pipeline

#: Policies whose weights :func:`measure_in_pipeline` measures (those that predict weights).
IN_PIPELINE_POLICIES = ("pipeoptim", "spectrain", "pipemare")

#: Policies whose corrected gradients :func:`measure_in_pipeline` measures (those that correct the delayed gradient).
CORRECTING_POLICIES = ("error_feedback", "dc_asgd")


@dataclass
class InPipelineResult:
    """Errors of the weights a predicting policy used inside a pipelined run, per job and layer.

    One *event* per job whose weights were measured: every forward F(k, t, j), and every backward whose weights
    are a prediction (SpecTrain, PipeMare). Event i used ``Ŵ`` standing for version ``base + s`` of its stage
    (``s = 0``: a stored version, no prediction); its errors per layer l of the stage are

    - ``pred[i, l] = sqrt(mean((Ŵ − W^(base+s))²))`` over the layer's parameters (the policy's weights);
    - ``stale[i, l] = sqrt(mean((W^(base) − W^(base+s))²))`` (the version the prediction started from, which a
      non-predicting policy would use); NaN for layers outside the event's stage.

    For a gradient-correcting policy (:data:`CORRECTING_POLICIES`) each event is an update U(k, t), op ``"G"``,
    with s its gradient's staleness (rounded mean over the step's micro-batches), ``pred`` the error of the
    corrected gradient and ``stale`` that of the uncorrected one, both against ``∇f_t(W_now)`` (module docstring).

    Attributes:
        policy, optimizer: names; ``D``: stages; ``steps``: mini-batches of the run (asynchronous 1F1B, M = 1).
        layers: the model's top-level blocks with parameters (``nn.Sequential`` positions), in order;
        layer_stage: the stage of each layer.
        op, stage, step, s: per event: ``"F"``/``"B"``, stage k, step t of the job, version difference s.
        pred, stale: ``[events, layers]`` RMSEs (above).
        losses: training loss per step; ``diverged_at``: first non-finite step, or None.
    """

    policy: str
    optimizer: str
    D: int
    steps: int
    layers: list[str]
    layer_stage: list[int]
    op: np.ndarray
    stage: np.ndarray
    step: np.ndarray
    s: np.ndarray
    pred: np.ndarray
    stale: np.ndarray
    losses: np.ndarray
    diverged_at: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted_op(self) -> str:
        """The job type whose weights the policy predicts: ``"F"`` (PipeOptim, SpecTrain), ``"B"`` (PipeMare's
        corrected backward); ``"G"``: the update's gradient (a correcting policy); ``"F"`` when nothing is predicted
        (D = 1)."""
        if self.op.size and np.all(self.op == "G"):
            return "G"
        return "F" if np.any((self.op == "F") & (self.s != 0)) or not np.any(self.s != 0) else "B"

    def stage_s(self, op: str | None = None) -> list[int]:
        """Per stage, the most frequent version difference s of its ``op`` jobs (default :attr:`predicted_op`);
        0 when the stage predicts nothing (PipeOptim's last stage)."""
        op = op or self.predicted_op
        out = []
        for k in range(self.D):
            vals, counts = np.unique(self.s[(self.stage == k) & (self.op == op)], return_counts=True)
            out.append(int(vals[np.argmax(counts)]) if vals.size else 0)
        return out


def measure_in_pipeline(
    model: nn.Sequential,
    batches: Sequence[tuple[Tensor, Tensor]],
    *,
    policy: Any,
    optimizer: Callable[[Any], torch.optim.Optimizer],
    D: int,
    predictor: Any = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> InPipelineResult:
    """Train ``model`` pipelined (exact emulator, asynchronous 1F1B with M = 1) and measure the policy's weights.

    The run is :class:`pipelab.emulator.Emulator` with ``pipedream(D, 1, len(batches))``. Each job's weights are
    observed through the stage's ``on_weights`` hook (the spec says which version ``base + s`` they stand for,
    from the version table), and each stage's true versions ``W^(v)`` through a post-step hook on its
    optimizer (version v: the weights after its v-th step). When stage k reaches version base + s, the errors of
    the job's weights and of ``W^(base)`` against it are computed per layer (:class:`InPipelineResult`). Only
    the versions still needed are kept.

    A gradient-correcting policy (:data:`CORRECTING_POLICIES`, or a ``Policy`` with ``corrects_gradient``) runs on
    its own schedule family instead, and its corrected and uncorrected gradients are measured against the gradient at
    the current weights (op ``"G"``; module docstring).

    Args:
        model: an ``nn.Sequential`` (trained in place); its top-level positions are the layers.
        batches: one ``(x, y)`` mini-batch per step.
        policy: a predicting or correcting policy (a name in :data:`IN_PIPELINE_POLICIES` or
            :data:`CORRECTING_POLICIES`, or such a ``Policy``).
        optimizer: factory ``params -> torch.optim.Optimizer`` (one optimizer per stage).
        D: number of stages; ``predictor``: the policy's predictor (default: its own);
        loss_fn: ``(output, target) -> mean loss`` (default: the emulator's cross-entropy).

    Raises:
        TypeError: ``model`` is not an ``nn.Sequential``.
        ValueError: a policy that neither predicts weights nor corrects gradients, or fewer than one batch.
    """
    from .emulator import Emulator
    from .policies import make_policy
    from .schedules import pipedream, pipedream_2bw

    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential (its positions are the layers), got {type(model).__name__}")
    pol = make_policy(policy)
    if not (pol.uses_predictor or pol.corrects_gradient):
        raise ValueError(f"policy must predict weights (e.g. one of {IN_PIPELINE_POLICIES}) or correct the delayed "
                         f"gradient (one of {CORRECTING_POLICIES}), got {pol.name!r}")
    batches = list(batches)
    steps = len(batches)
    if steps < 1:
        raise ValueError("batches must hold at least one mini-batch")
    schedule = pipedream_2bw(D, D, steps) if pol.corrects_gradient and pol.schedule == "2bw" else pipedream(D, 1, steps)
    given = {"predictor": predictor, "loss_fn": loss_fn}
    emu = Emulator(model, D=D, schedule=schedule, policy=pol, optimizer=optimizer,
                   **{k: v for k, v in given.items() if v is not None})
    layers, layer_stage, index = _layer_index(model, emu)
    L = len(layers)
    observe = _observe_corrections if pol.corrects_gradient else _observe_weights
    events, res = observe(emu, batches, index, L)
    n = len(events)
    opt_name = getattr(optimizer, "name", None) or type(next(st.optimizer for st in emu.stages
                                                              if st.optimizer)).__name__
    meta = {"policy_options": pol.options(), "ring_capacity": res.ring_capacity}
    if pol.corrects_gradient:
        meta["schedule"] = pol.schedule
    return InPipelineResult(
        policy=pol.name, optimizer=opt_name, D=D, steps=steps, layers=layers, layer_stage=layer_stage,
        op=np.array([e[0] for e in events], dtype="<U1"), stage=np.array([e[1] for e in events], dtype=int),
        step=np.array([e[2] for e in events], dtype=int), s=np.array([e[3] for e in events], dtype=int),
        pred=np.array([e[4] for e in events]).reshape(n, L), stale=np.array([e[5] for e in events]).reshape(n, L),
        losses=np.asarray(res.losses, float), diverged_at=res.diverged_at, meta=meta)


#: one measured job: (op, stage k, step t, version difference s, RMSE per layer of its weights, of the stale ones)
_Event = tuple[str, int, int, int, np.ndarray, np.ndarray]


def _observe_weights(emu: Any, batches: Sequence[tuple[Tensor, Tensor]], index: dict[int, tuple[Tensor, Tensor]],
                     L: int) -> tuple[list[_Event], Any]:
    """Run ``emu``, observing every watched job's weights through the stages' ``on_weights`` hooks and each stage's
    true versions through post-step hooks on its optimizer (see :func:`measure_in_pipeline`)."""
    D = emu.D
    def watched(op: str, spec: WeightSpec) -> bool:
        return op == "F" or isinstance(spec, Predicted)

    def span(spec: WeightSpec) -> tuple[int, int]:
        return (spec.version, spec.target) if isinstance(spec, Stored) else (spec.base, spec.target)

    # versions of each stage still needed (as a base or a target), counted over the jobs that will be observed
    need: list[dict[int, int]] = [{} for _ in range(D)]
    for (k, _t, _j), pair in emu.specs.items():
        for op, spec in zip("FB", pair):
            if watched(op, spec) and emu.stages[k].params:
                for v in span(spec):
                    need[k][v] = need[k].get(v, 0) + 1
    truth: list[dict[int, list[Tensor]]] = [{} for _ in range(D)]
    version = [0] * D
    pending: list[dict[int, list[tuple]]] = [{} for _ in range(D)]
    events: list[_Event] = []

    def rmse(k: int, a: Sequence[Tensor], b: Sequence[Tensor]) -> np.ndarray:
        return _layer_rmse(index[k], L, a, b)

    def release(k: int, v: int) -> None:
        need[k][v] -= 1
        if need[k][v] <= 0:
            truth[k].pop(v, None)

    def settle(k: int, item: tuple) -> None:
        op, t, base, target, W_hat = item
        true = truth[k][target]
        events.append((op, k, t, target - base, rmse(k, W_hat, true), rmse(k, truth[k][base], true)))
        release(k, base)
        release(k, target)

    def keep(k: int, v: int, params: Sequence[Tensor]) -> None:
        if need[k].get(v, 0) > 0:
            truth[k][v] = [p.detach().clone() for p in params]

    def observer(k: int) -> Callable[[tuple[str, int, int], WeightSpec, tuple[Tensor, ...]], None]:
        def on_weights(event: tuple[str, int, int], spec: WeightSpec, W: tuple[Tensor, ...]) -> None:
            op, t, _ = event
            op = "B" if op == "I" else op
            if not watched(op, spec):
                return
            base, target = span(spec)
            item = (op, t, base, target, [w.detach().clone() for w in W])
            if target <= version[k]:
                settle(k, item)
            else:
                pending[k].setdefault(target, []).append(item)
        return on_weights

    def stepped(k: int) -> Callable[..., None]:
        def hook(opt: torch.optim.Optimizer, *args: Any) -> None:
            version[k] += 1
            keep(k, version[k], emu.stages[k].params)
            for item in pending[k].pop(version[k], []):
                settle(k, item)
        return hook

    handles = []
    for st in emu.stages:
        if not st.params:
            continue
        keep(st.k, 0, st.params)
        st.on_weights = observer(st.k)
        assert st.optimizer is not None
        handles.append(st.optimizer.register_step_post_hook(stepped(st.k)))
    try:
        res = emu.run(batches)
    finally:
        for h in handles:
            h.remove()
        for st in emu.stages:
            st.on_weights = None
    return events, res


def _layer_index(model: nn.Module, emu: Any) -> tuple[list[str], list[int], dict[int, tuple[Tensor, Tensor]]]:
    """The model's top-level blocks with parameters (the layers), each one's stage, and per stage with parameters
    ``(layer of each parameter, parameter count per layer)``."""
    owner = {id(p): name.split(".")[0] for name, p in model.named_parameters()}
    layers = list(dict.fromkeys(owner[id(p)] for st in emu.stages for p in st.params))
    layer_stage = [next(st.k for st in emu.stages if any(owner[id(p)] == n for p in st.params)) for n in layers]
    index = {}
    for st in emu.stages:
        if st.params:
            idx = torch.tensor([layers.index(owner[id(p)]) for p in st.params])
            numel = torch.zeros(len(layers), dtype=torch.float64)
            numel.index_add_(0, idx, torch.tensor([float(p.numel()) for p in st.params], dtype=torch.float64))
            index[st.k] = (idx, numel)
    return layers, layer_stage, index


def _layer_rmse(index: tuple[Tensor, Tensor], L: int, a: Sequence[Tensor], b: Sequence[Tensor]) -> np.ndarray:
    """``[L]``: sqrt(mean((a − b)²)) over each layer's parameters of one stage (NaN for the other layers)."""
    idx, numel = index
    sq = torch.stack([n.to(torch.float64).square() for n in torch._foreach_norm(torch._foreach_sub(list(a), list(b)))])
    out = torch.zeros(L, dtype=torch.float64).index_add_(0, idx, sq)
    return torch.where(numel > 0, (out / numel.clamp(min=1)).sqrt(), torch.full_like(out, math.nan)).cpu().numpy()


def _observe_corrections(emu: Any, batches: Sequence[tuple[Tensor, Tensor]],
                         index: dict[int, tuple[Tensor, Tensor]], L: int) -> tuple[list[_Event], Any]:
    """Run ``emu`` of a gradient-correcting policy (on its own schedule family: PipeDream-2BW with M = D, or
    asynchronous 1F1B with M = 1), observing its corrections.

    The policy's ``correct_gradient`` is observed for the run (an instance attribute over the method, removed
    afterwards): at U(k, t) it records the uncorrected ``g`` and the corrected ``g̃``, and the reference
    ``∇_{W_k} f_t`` of mini-batch t's mean loss through all stages at their live weights, i.e. the gradient
    sequential training would take at the weights the pipeline holds when stage k applies its update.
    """
    stages, pol = emu.stages, emu.policy
    events: list[_Event] = []
    original = pol.correct_gradient

    def reference(k: int, t: int) -> list[Tensor]:
        x, y = batches[t]
        with torch.enable_grad():
            h = x
            for st in stages:
                h = st.call(st.params, h)
            return list(torch.autograd.grad(stages[-1].loss_fn(h, y), stages[k].params))

    def observed(ctx: Any, grads: list[Tensor]) -> list[Tensor]:
        raw = [g.detach().clone() for g in grads]
        out = original(ctx, grads)
        ref = reference(ctx.stage, ctx.step)
        events.append(("G", ctx.stage, ctx.step, int(round(ctx.staleness)), _layer_rmse(index[ctx.stage], L, out, ref),
                       _layer_rmse(index[ctx.stage], L, raw, ref)))
        return out

    pol.correct_gradient = observed  # the instance attribute shadows the method until it is deleted
    try:
        res = emu.run(batches)
    finally:
        delattr(pol, "correct_gradient")
    return events, res
