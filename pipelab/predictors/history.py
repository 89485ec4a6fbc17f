"""Predictors that extrapolate the recorded weight history: linear extrapolation and PipeMare's δ.

These ignore the optimizer's state and use only the weights it produced, so they work with any
optimizer. Call :meth:`Predictor.observe` after every ``optimizer.step()`` (and once before training if
you like: the first observation only records the starting point). With fewer than two observations the
prediction is the stale weights.

- ``linear``: ``Ŵ_{t+s} = W + s·(W_t − W_{t−1})``.
- ``pipemare``: ``δ_t = γ·δ_{t−1} + (1−γ)·(W_t − W_{t−1})`` (``δ_0 = 0``), ``Ŵ_{t+s} = W + s·δ_t``.

``W`` is the starting point (the optimizer's current weights, or ``params=``); the history is kept per
optimizer, so one predictor object can serve several stages. Memory: two weight-sized buffers per
optimizer (the last weights and the difference or δ).

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.zeros(1)); opt = torch.optim.SGD([w], lr=1.0)
    >>> lin = LinearExtrapolation(); lin.observe(opt)
    >>> w.grad = -torch.ones(1); opt.step(); lin.observe(opt)
    >>> lin.predict(opt, 2)[0]
    tensor([3.])

References: PipeMare — Yang et al., "PipeMare: Asynchronous Pipeline Parallel DNN Training", MLSys 2021
(arXiv:1910.05124), discrepancy correction; linear extrapolation is its ``γ = 0`` case.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .base import Predictor, flat_params

__all__ = ["HistoryPredictor", "LinearExtrapolation", "PipeMare"]


@dataclass
class _History:
    last: list[Tensor]
    delta: list[Tensor] | None = None
    count: int = 1


class HistoryPredictor(Predictor):
    """Base class: ``Ŵ = W + s·δ`` with ``δ`` an exponential moving average (decay ``gamma``) of differences."""

    needs_history = True

    def __init__(self, *, gamma: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= gamma < 1.0:
            raise ValueError(f"gamma must be in [0, 1), got {gamma!r}")
        self.gamma = float(gamma)
        self._histories: weakref.WeakKeyDictionary[torch.optim.Optimizer, _History] = weakref.WeakKeyDictionary()

    def options(self) -> dict[str, Any]:
        return {"gamma": self.gamma}

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")

    def reset(self) -> None:
        self._histories = weakref.WeakKeyDictionary()

    def observe(self, optimizer: torch.optim.Optimizer) -> None:
        self.check(optimizer)
        with torch.no_grad():
            W = [p.detach() for p in flat_params(optimizer)]
            h = self._histories.get(optimizer)
            if h is None or len(h.last) != len(W):
                self._histories[optimizer] = _History([w.clone() for w in W])
                return
            diff = torch._foreach_sub(W, h.last)
            if h.delta is None or self.gamma == 0.0:
                h.delta = diff if self.gamma == 0.0 else torch._foreach_mul(diff, 1.0 - self.gamma)
            else:
                torch._foreach_mul_(h.delta, self.gamma)
                torch._foreach_add_(h.delta, diff, alpha=1.0 - self.gamma)
            torch._foreach_copy_(h.last, W)
            h.count += 1

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        h = self._histories.get(optimizer)
        if h is None:
            return None
        return {"last": [w.clone() for w in h.last], "count": h.count,
                "delta": None if h.delta is None else [d.clone() for d in h.delta]}

    def load_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any] | None) -> None:
        if state is None:
            self._histories.pop(optimizer, None)
            return
        self._histories[optimizer] = _History([w.clone() for w in state["last"]],
                                              None if state["delta"] is None else [d.clone() for d in state["delta"]],
                                              state["count"])

    def observations(self, optimizer: torch.optim.Optimizer) -> int:
        """How many weight versions of ``optimizer`` have been observed."""
        h = self._histories.get(optimizer)
        return 0 if h is None else h.count

    def _predict(self, optimizer, s, W):
        h = self._histories.get(optimizer)
        if s == 0 or h is None or h.delta is None:
            return [w.clone() for w in W]
        return torch._foreach_add(W, h.delta, alpha=float(s))


class LinearExtrapolation(HistoryPredictor):
    """Linear extrapolation of the last weight difference: ``Ŵ_{t+s} = W + s·(W_t − W_{t−1})``.

    Needs :meth:`observe` after each step. Equals SpecTrain for SGD with momentum, no dampening and a
    constant learning rate (then ``W_t − W_{t−1} = −lr·b_t``), whatever the optimizer otherwise.

    Reference: the ``γ = 0`` case of PipeMare's correction (arXiv:1910.05124).
    """

    name = "linear"
    reference = "W + s·(W_t − W_{t−1}); PipeMare (arXiv:1910.05124) with γ = 0"

    def __init__(self) -> None:
        super().__init__(gamma=0.0)

    def options(self) -> dict[str, Any]:
        return {}


class PipeMare(HistoryPredictor):
    """PipeMare's discrepancy correction: ``Ŵ_{t+s} = W + s·δ_t``, ``δ_t = γ·δ_{t−1} + (1−γ)·(W_t − W_{t−1})``.

    Args:
        gamma: decay of the moving average of weight differences (default 0.9, pipelab's choice; PipeMare
            tunes it per pipeline, so set it explicitly to study it). ``δ_0 = 0``, so δ is biased low
            for the first ~1/(1−γ) steps.

    Reference: Yang et al., "PipeMare: Asynchronous Pipeline Parallel DNN Training", MLSys 2021,
    arXiv:1910.05124 (discrepancy correction).
    """

    name = "pipemare"
    reference = "Yang et al., arXiv:1910.05124 (discrepancy correction)"

    def __init__(self, *, gamma: float = 0.9) -> None:
        super().__init__(gamma=gamma)
