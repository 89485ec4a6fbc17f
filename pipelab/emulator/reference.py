"""Plain PyTorch training and evaluation: the reference the emulator is checked against.

:func:`train_plain` is ordinary mini-batch training — forward of the whole model, mean loss, one
``backward()``, one ``optimizer.step()`` — with one optimizer per stage built by the same factory as the
emulator's (optimizers act per parameter, so this is ordinary training of the whole model). A flushed
pipeline schedule must reproduce it exactly:

    W^(t+1) = opt_step(W^(t), ∇ (1/|B_t|) Σ_{i∈B_t} ℓ(f(x_i; W^(t)), y_i)).

With ``micro_batches=M`` (the pipeline's arithmetic) or a ``precision`` (bf16/fp16: the pipeline's casts and
GradScaler) a flushed schedule must reproduce it exactly as well. :func:`evaluate`: loss and accuracy.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 10))
    >>> data = [(torch.randn(8, 4), torch.randint(0, 10, (8,)))]
    >>> losses = train_plain(model, D=3, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batches=data)
    >>> len(losses)
    1
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from ..links import boundary_codecs
from ..pipeline.driver import Batches, all_finite, batch_source, check_batch, examples, split_micro, take_examples
from ..pipeline.plan import OptimizerFactory, as_stages
from ..pipeline.stage import trainable_parameters
from ..pipeline.transport import decode_handover, encode_handover, tensors_of
from ..precision import Precision, as_precision
from ..schedules.actions import check_int

__all__ = ["train_plain", "evaluate", "forward_batches"]


def train_plain(
    model: nn.Module | Sequence[nn.Module],
    *,
    optimizer: OptimizerFactory,
    batches: Batches,
    steps: int | None = None,
    D: int | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    lr_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    record: list[list[tuple[Tensor, ...]]] | None = None,
    stop_on_divergence: bool = True,
    callback: Callable[[int], object] | None = None,
    arm_losses: list[list[float]] | None = None,
    micro_batches: int | None = None,
    precision: Precision | str | torch.dtype | None = None,
) -> list[float]:
    """Train ``model`` in place for ``steps`` mini-batches; return the loss of every mini-batch.

    Args:
        model: an ``nn.Sequential`` (cut into D stages, D=1 if not given) or a list of stage modules.
        optimizer: factory ``params -> torch.optim.Optimizer``, called per stage with its trainable parameters.
        batches: mini-batch t is ``batches[t]``, ``batches(t)`` or the t-th item of an iterable (a ``DataLoader``,
            a generator: read once, in order).
        steps: mini-batches to train on (default: ``len(batches)``; required for a callable or an iterable
            without a length).
        record: if given a list, ``record[k][v]`` receives stage k's weights after v updates.
        stop_on_divergence: stop at the first non-finite loss (later losses are NaN).
        callback: called with v = t + 1 after the update of step t (e.g. to evaluate at epoch ends).
        arm_losses: if given a list and the loss is a vector of stacked arms' losses (:mod:`pipelab.studies.stacking`),
            receives each step's per-arm losses; the returned loss is then their sum.
        micro_batches: M: split each mini-batch into M equal micro-batches and accumulate the gradients of
            their losses ℓ_j/M (the returned loss is Σ_j ℓ_j/M); default: one backward of the whole mini-batch.
        precision: ``"bf16"``/``"fp16"`` (or a :class:`~pipelab.precision.Precision`): autocast with fp32 masters;
            fp16 scales the loss with ``torch.amp.GradScaler`` (set from the precision's
            :class:`~pipelab.precision.LossScaling`) and skips the step on every stage when any gradient is
            non-finite.
    """
    stages, get, steps, M = _arguments(model, D, batches, steps, micro_batches)
    loss_fn = loss_fn or nn.functional.cross_entropy
    prec = as_precision(precision)
    opts = [optimizer(ps) for ps in map(trainable_parameters, stages) if ps]
    scaler = _grad_scaler(stages, prec)
    scheds = [lr_scheduler(o) for o in opts] if lr_scheduler is not None else []
    if record is not None:
        record.clear()
        record.extend([[] for _ in stages])
        _record(record, stages)
    for s in stages:
        s.train()
    losses = [math.nan] * steps
    for t in range(steps):
        x, y = check_batch(t, get(t))  # the emulator's form: it is the reference the emulator is checked against
        for o in opts:
            o.zero_grad(set_to_none=True)
        if micro_batches is not None or prec.enabled:
            per_arm = _micro_steps(stages, x, y, M, loss_fn, prec, scaler)
            step: Callable[[], None] = lambda: _step_all(opts, scaler)  # noqa: E731
        else:
            per_arm, step = _whole_batch(stages, x, y, loss_fn, opts)
        losses[t] = float(per_arm.sum())
        if per_arm.ndim and arm_losses is not None:
            arm_losses.append(per_arm.tolist())
        # stacked arms (a loss vector, :mod:`pipelab.studies.stacking`) diverge one by one: stop once all of them have
        if stop_on_divergence and not bool(torch.isfinite(per_arm).any()):
            break
        step()
        for sc in scheds:
            sc.step()
        if record is not None:
            _record(record, stages)
        if callback is not None:
            callback(t + 1)
    return losses


def _arguments(model: nn.Module | Sequence[nn.Module], D: int | None, batches: Any, steps: int | None,
               micro_batches: int | None) -> tuple[list[nn.Module], Callable[[int], Any], int, int]:
    """:func:`train_plain`'s stages, mini-batch getter, steps and M, checked."""
    stages = as_stages(model, D if D is not None else (1 if isinstance(model, nn.Sequential) else None))
    get, n = batch_source(batches)
    if steps is None:
        steps = n
        if steps is None:
            raise ValueError("steps is required when batches is a callable or an iterable without a length, got "
                             f"{type(batches).__name__}")
    M = 1 if micro_batches is None else micro_batches
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ValueError(f"micro_batches must be a positive int or None, got {micro_batches!r}")
    return stages, get, steps, M


def _record(record: list[list[tuple[Tensor, ...]]], stages: Sequence[nn.Module]) -> None:
    """Append a copy of every stage's current weights to ``record[k]``."""
    for k, s in enumerate(stages):
        record[k].append(tuple(p.detach().clone() for p in s.parameters()))


def _grad_scaler(stages: Sequence[nn.Module], prec: Precision) -> torch.amp.GradScaler | None:
    """fp16's ``torch.amp.GradScaler`` on the stages' device, set from the precision's loss scaling (else None)."""
    ls = prec.loss_scaling
    if ls is None:
        return None
    device = next((p.device for s in stages for p in s.parameters()), torch.device("cpu"))
    return torch.amp.GradScaler(device.type, init_scale=ls.init_scale, growth_factor=ls.growth_factor,
                                backoff_factor=ls.backoff_factor, growth_interval=ls.growth_interval)


def _whole_batch(stages: Sequence[nn.Module], x: Tensor, y: Tensor, loss_fn: Callable[[Tensor, Tensor], Tensor],
                 opts: Sequence[torch.optim.Optimizer]) -> tuple[Tensor, Callable[[], None]]:
    """The loss of the whole mini-batch through every stage, and the step: its backward, then every optimizer's
    step (run only if the loss did not diverge)."""
    h = x
    for s in stages:
        h = s(h)
    loss = loss_fn(h, y)

    def step() -> None:
        loss.backward(torch.ones_like(loss) if loss.ndim else None)
        for o in opts:
            o.step()

    return loss.detach(), step


def _micro_steps(stages: Sequence[nn.Module], x: Tensor, y: Tensor, M: int, loss_fn: Callable[[Tensor, Tensor], Tensor],
                 prec: Precision, scaler: torch.amp.GradScaler | None) -> Tensor:
    """Accumulate the gradients of ℓ_j/M over M micro-batches (autocast, hand-over casts, scaled loss);
    return Σ_j ℓ_j/M (summed as the pipeline's driver sums it)."""
    if examples(x) % M:  # named after train_plain's argument (split_micro names the schedule's M)
        raise ValueError(f"batch size {examples(x)} is not divisible by micro_batches={M}")
    parts = []
    for xj, yj in zip(split_micro(x, M), torch.split(y, y.shape[0] // M)):
        h = xj
        with prec.autocast(tensors_of(xj)[0].device):
            for k, s in enumerate(stages):
                h = s(h)
                if k < len(stages) - 1:
                    h = prec.handover(h)
            loss = loss_fn(h, yj) / M
        parts.append(loss.detach())
        seeded = loss if scaler is None else scaler.scale(loss)
        seeded.backward(torch.ones_like(seeded) if seeded.ndim else None)
    return torch.stack(parts).sum(0)


def _step_all(opts: Sequence[torch.optim.Optimizer], scaler: torch.amp.GradScaler | None) -> None:
    """Step every stage's optimizer; with a GradScaler, unscale all, then step all or (any non-finite) none."""
    if scaler is None:
        for o in opts:
            o.step()
        return
    for o in opts:
        scaler.unscale_(o)
    finite = all(bool(torch.isfinite(p.grad).all()) for o in opts for g in o.param_groups for p in g["params"]
                 if p.grad is not None)
    if finite:
        for o in opts:
            scaler.step(o)
    scaler.update()


@torch.no_grad()
def evaluate(
    stages: Sequence[nn.Module],
    x: Tensor,
    y: Tensor,
    weights: Sequence[Sequence[Tensor]] | None = None,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    batch_size: int = 2048,
    codec: Any = None,
) -> tuple[float, float]:
    """Mean loss and accuracy of the stages (with ``weights[k]`` in ``named_parameters`` order, if given), each
    hand-over encoded and decoded by ``codec`` as in the pipeline (``PipelineSpec.codec``; :func:`forward_batches`).

    Both are NaN when a weight, an output or a loss is NaN or ±inf (:func:`~pipelab.pipeline.driver.all_finite`):
    the argmax of NaN logits is an arbitrary class, not an accuracy.

    Raises:
        ValueError: on an empty evaluation set (a mean over no examples is undefined).
    """
    n = examples(x)
    if n == 0 or y.shape[0] == 0:
        raise ValueError("evaluate() got an empty evaluation set (0 examples); a loss or accuracy over no "
                         "examples is undefined")
    if n != y.shape[0]:
        raise ValueError(f"evaluate(): x has {n} examples but y has {y.shape[0]}")
    loss_fn = loss_fn or nn.functional.cross_entropy
    used = [list(s.parameters()) for s in stages] if weights is None else weights
    finite = all_finite(w for W in used for w in W)
    total, correct = 0.0, 0
    for h, yy in forward_batches(stages, x, y, weights, batch_size, codec):
        loss = loss_fn(h, yy)
        finite &= all_finite((h, loss))
        total += float(loss) * yy.shape[0]
        if h.ndim == 2 and not yy.is_floating_point():
            correct += int((h.argmax(1) == yy).sum())
    if not (bool(finite) and math.isfinite(total)):
        return math.nan, math.nan
    return total / n, correct / n


def forward_batches(stages: Sequence[nn.Module], x: Tensor, y: Tensor,
                    weights: Sequence[Sequence[Tensor]] | None = None,
                    batch_size: int = 2048, codec: Any = None) -> Iterator[tuple[Tensor, Tensor]]:
    """``(output, target)`` of the stages on ``x`` in chunks of ``batch_size`` (with ``weights[k]`` in
    ``named_parameters`` order, if given), without gradients, in eval mode (restored when the iteration ends).

    ``codec``: each hand-over is encoded and decoded, so the function evaluated is the one the pipeline trains
    (codecs act row by row: chunking does not change the result).

    Raises:
        ValueError: ``batch_size`` not an int >= 1 (chunks of 0 examples never advance).
    """
    check_int("batch_size", batch_size)
    codecs = boundary_codecs(codec, len(stages))
    modes = [s.training for s in stages]
    for s in stages:
        s.eval()
    try:
        with torch.no_grad():
            for a in range(0, examples(x), batch_size):
                h, yy = take_examples(x, a, a + batch_size), y[a:a + batch_size]
                for k, s in enumerate(stages):
                    if weights is None:
                        h = s(h)
                    else:
                        names = [name for name, _ in s.named_parameters()]
                        h = functional_call(s, dict(zip(names, weights[k])), (h,))
                    if k < len(codecs):
                        h = decode_handover(codecs[k], encode_handover(codecs[k], h))
                yield h, yy
    finally:
        for s, m in zip(stages, modes):
            s.train(m)
