"""Plain PyTorch training and evaluation: the reference the emulator is checked against.

:func:`train_plain` is ordinary mini-batch training — forward of the whole model, mean loss, one
``backward()``, one ``optimizer.step()`` — with one optimizer per stage built by the same factory as the
emulator's (optimizers act per parameter, so this is ordinary training of the whole model). A flushed
pipeline schedule must reproduce it exactly:

    W^(t+1) = opt_step(W^(t), ∇ (1/|B_t|) Σ_{i∈B_t} ℓ(f(x_i; W^(t)), y_i)).

:func:`evaluate` computes loss and accuracy of given stage weights (eval mode, no gradient).

Example:
    >>> import torch
    >>> from pipelab.models import deep_mlp
    >>> model = deep_mlp(in_features=4, width=8, depth=3)
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

from ..pipeline.plan import OptimizerFactory, as_stages

__all__ = ["train_plain", "evaluate", "forward_batches"]


def train_plain(
    model: nn.Module | Sequence[nn.Module],
    *,
    optimizer: OptimizerFactory,
    batches: Sequence[tuple[Tensor, Tensor]] | Callable[[int], tuple[Tensor, Tensor]],
    steps: int | None = None,
    D: int | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    lr_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    record: list[list[tuple[Tensor, ...]]] | None = None,
    stop_on_divergence: bool = True,
    callback: Callable[[int], object] | None = None,
    arm_losses: list[list[float]] | None = None,
) -> list[float]:
    """Train ``model`` in place for ``steps`` mini-batches; return the loss of every mini-batch.

    Args:
        model: an ``nn.Sequential`` (cut into D stages, D=1 if not given) or a list of stage modules.
        optimizer: factory ``params -> torch.optim.Optimizer``, called once per stage.
        batches: mini-batch t is ``batches[t]`` or ``batches(t)``.
        steps: number of steps (default ``len(batches)``).
        record: if given a list, ``record[k][v]`` receives stage k's weights after v updates.
        stop_on_divergence: stop at the first non-finite loss (later losses are NaN).
        callback: called with v = t + 1 after the update of step t (e.g. to evaluate at epoch ends).
        arm_losses: if given a list and the loss is a vector of stacked arms' losses (:mod:`pipelab.stacking`),
            receives each step's per-arm losses; the returned loss is then their sum.
    """
    stages = as_stages(model, D if D is not None else (1 if isinstance(model, nn.Sequential) else None))
    loss_fn = loss_fn or nn.functional.cross_entropy
    get = batches if callable(batches) else batches.__getitem__
    if steps is None:
        if callable(batches):
            raise ValueError("steps is required when batches is a callable")
        steps = len(batches)
    opts = [optimizer(list(s.parameters())) for s in stages]
    scheds = [lr_scheduler(o) for o in opts] if lr_scheduler is not None else []
    if record is not None:
        record.clear()
        record.extend([[tuple(p.detach().clone() for p in s.parameters())] for s in stages])
    for s in stages:
        s.train()
    losses = [math.nan] * steps
    for t in range(steps):
        x, y = get(t)
        for o in opts:
            o.zero_grad(set_to_none=True)
        h = x
        for s in stages:
            h = s(h)
        loss = loss_fn(h, y)
        per_arm = loss.detach()
        losses[t] = float(per_arm.sum())
        if per_arm.ndim and arm_losses is not None:
            arm_losses.append(per_arm.tolist())
        # stacked arms (a loss vector, :mod:`pipelab.stacking`) diverge one by one: stop once all of them have
        if stop_on_divergence and not bool(torch.isfinite(per_arm).any()):
            break
        loss.backward(torch.ones_like(loss) if loss.ndim else None)
        for o in opts:
            o.step()
        for sc in scheds:
            sc.step()
        if record is not None:
            for k, s in enumerate(stages):
                record[k].append(tuple(p.detach().clone() for p in s.parameters()))
        if callback is not None:
            callback(t + 1)
    return losses


@torch.no_grad()
def evaluate(
    stages: Sequence[nn.Module],
    x: Tensor,
    y: Tensor,
    weights: Sequence[Sequence[Tensor]] | None = None,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    batch_size: int = 2048,
) -> tuple[float, float]:
    """Mean loss and accuracy of the stages (with ``weights[k]`` in ``named_parameters`` order, if given).

    The stages are put in eval mode for the call and restored afterwards.

    Raises:
        ValueError: on an empty evaluation set (a mean over no examples is undefined).
    """
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError("evaluate() got an empty evaluation set (0 examples); a loss or accuracy over no "
                         "examples is undefined")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"evaluate(): x has {x.shape[0]} examples but y has {y.shape[0]}")
    loss_fn = loss_fn or nn.functional.cross_entropy
    total, correct, n = 0.0, 0, x.shape[0]
    for h, yy in forward_batches(stages, x, y, weights, batch_size):
        total += float(loss_fn(h, yy)) * yy.shape[0]
        if h.ndim == 2 and not yy.is_floating_point():
            correct += int((h.argmax(1) == yy).sum())
    return total / n, correct / n


def forward_batches(stages: Sequence[nn.Module], x: Tensor, y: Tensor,
                    weights: Sequence[Sequence[Tensor]] | None = None,
                    batch_size: int = 2048) -> Iterator[tuple[Tensor, Tensor]]:
    """``(output, target)`` of the stages on ``x`` in chunks of ``batch_size`` (with ``weights[k]`` in
    ``named_parameters`` order, if given), without gradients, in eval mode (restored when the iteration ends)."""
    modes = [s.training for s in stages]
    for s in stages:
        s.eval()
    try:
        with torch.no_grad():
            for a in range(0, x.shape[0], batch_size):
                h, yy = x[a:a + batch_size], y[a:a + batch_size]
                for k, s in enumerate(stages):
                    if weights is None:
                        h = s(h)
                    else:
                        names = [name for name, _ in s.named_parameters()]
                        h = functional_call(s, dict(zip(names, weights[k])), (h,))
                yield h, yy
    finally:
        for s, m in zip(stages, modes):
            s.train(m)
