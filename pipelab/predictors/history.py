"""Predictors that extrapolate the recorded weight history: linear extrapolation and PipeMare's δ.

They use only the weights (any optimizer); call :meth:`Predictor.observe` after every step. s ≠ 0 for an
optimizer never observed raises ValueError (a missing ``observe`` must not pass as stale weights). History is
kept per optimizer: two weight-sized buffers each.

References: PipeMare — Yang et al., "PipeMare: Asynchronous Pipeline Parallel DNN Training", MLSys 2021
(arXiv:1910.05124), discrepancy correction; linear extrapolation is its ``γ = 0`` case.
"""

from __future__ import annotations

import numbers
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .base import Predictor, check_optimizer, flat_params

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
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real):
            raise TypeError(f"gamma must be a number in [0, 1), got {type(gamma).__name__} {gamma!r}")
        if not 0.0 <= gamma < 1.0:
            raise ValueError(f"gamma must be in [0, 1), got {gamma!r}")
        self.gamma: float = float(gamma)
        self._histories: weakref.WeakKeyDictionary[torch.optim.Optimizer, _History] = weakref.WeakKeyDictionary()

    def options(self) -> dict[str, Any]:
        return {"gamma": self.gamma}

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        check_optimizer(optimizer)

    def supported_optimizers(self) -> list[str]:
        return ["any torch.optim optimizer"]

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
                h.delta = list(diff if self.gamma == 0.0 else torch._foreach_mul(diff, 1.0 - self.gamma))
            else:
                torch._foreach_mul_(h.delta, self.gamma)
                torch._foreach_add_(h.delta, diff, alpha=1.0 - self.gamma)
            torch._foreach_copy_(h.last, W)
            h.count += 1

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        h = self._histories.get(check_optimizer(optimizer))
        if h is None:
            return None
        return {"last": [w.clone() for w in h.last], "count": h.count,
                "delta": None if h.delta is None else [d.clone() for d in h.delta]}

    def load_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any] | None) -> None:
        check_optimizer(optimizer)
        if state is None:
            self._histories.pop(optimizer, None)
            return
        if not isinstance(state, dict) or not {"last", "delta", "count"} <= state.keys():
            raise ValueError(f"state must be None or a dict with keys 'last', 'delta', 'count' (from state_dict), "
                             f"got {type(state).__name__}")
        n = len(flat_params(optimizer))
        for key in ("last", "delta"):
            if key == "delta" and state[key] is None:
                continue
            if not isinstance(state[key], (list, tuple)) or len(state[key]) != n:
                raise ValueError(f"state must hold {key!r} as a list of {n} tensors (one per optimizer parameter)")
        self._histories[optimizer] = _History([w.clone() for w in state["last"]],
                                              None if state["delta"] is None else [d.clone() for d in state["delta"]],
                                              state["count"])

    def observations(self, optimizer: torch.optim.Optimizer) -> int:
        """How many weight versions of ``optimizer`` have been observed."""
        h = self._histories.get(check_optimizer(optimizer))
        return 0 if h is None else h.count

    def _predict(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor]) -> list[Tensor]:
        if s == 0:
            return [w.clone() for w in W]
        h = self._histories.get(optimizer)
        if h is None:
            raise ValueError(f"{self.name!r} extrapolates the weight history but has observed none for this "
                             f"{type(optimizer).__name__}: call predictor.observe(optimizer) once before training "
                             "and after every optimizer.step()")
        if len(h.last) != len(W):
            raise ValueError(f"{self.name!r} observed {len(h.last)} parameters but the optimizer now has {len(W)} "
                             "(param groups changed?): observe(optimizer) again after the change")
        if h.delta is None:  # one observation: no weight change seen yet, zero velocity
            return [w.clone() for w in W]
        return list(torch._foreach_add(W, h.delta, alpha=float(s)))


class LinearExtrapolation(HistoryPredictor):
    """``Ŵ_{t+s} = W + s·(W_t − W_{t−1})``; SpecTrain for SGD with momentum, no dampening and a constant lr."""

    name = "linear"
    reference = "W + s·(W_t − W_{t−1}); PipeMare (arXiv:1910.05124) with γ = 0"

    def __init__(self) -> None:
        super().__init__(gamma=0.0)

    def options(self) -> dict[str, Any]:
        return {}


class PipeMare(HistoryPredictor):
    """PipeMare's correction ``Ŵ_{t+s} = W + s·δ_t``, ``δ_t = γ·δ_{t−1} + (1−γ)·(W_t − W_{t−1})``, ``δ_0 = 0``."""

    name = "pipemare"
    reference = "Yang et al., arXiv:1910.05124 (discrepancy correction)"

    def __init__(self, *, gamma: float = 0.9) -> None:
        super().__init__(gamma=gamma)
