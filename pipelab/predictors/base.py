"""The weight-predictor interface and the plumbing shared by all predictors.

``Ŵ_{t+s} = predictor.predict(optimizer, s)``: a pure function of the user's ``torch.optim`` optimizer (params,
groups, state) and s, which it never writes to. History predictors (linear, PipeMare) need
:meth:`Predictor.observe` after every ``optimizer.step()``. ``params=`` predicts from given weights (e.g. a
stashed version) with the optimizer's state and hyper-parameters.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from .rules import UpdateRule, rule_for

__all__ = ["Predictor", "LRSchedule", "check_steps", "check_optimizer", "flat_params", "resolve_weights", "Bucket",
           "buckets", "future_lrs"]

#: ``lr_schedule(group_index, j) -> lr`` of the ``j``-th future update (``j = 0`` is the next one).
LRSchedule = Callable[[int, int], float]


def check_steps(s: Any) -> int:
    """Validate the staleness ``s`` (a non-negative integer) and return it as ``int``."""
    if isinstance(s, bool):
        raise TypeError("s must be a non-negative integer, got a bool")
    try:
        s = operator.index(s)
    except TypeError:
        raise TypeError(f"s must be a non-negative integer, got {type(s).__name__} {s!r}") from None
    if s < 0:
        raise ValueError(f"s must be a non-negative integer, got {s}")
    return s


def check_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """Raise TypeError unless ``optimizer`` is a ``torch.optim.Optimizer`` (predictors read its state)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    hint = ""
    if isinstance(optimizer, torch.nn.Module):
        hint = "; pass the optimizer that updates it, e.g. torch.optim.SGD(model.parameters(), lr=0.1)"
    elif isinstance(optimizer, str):
        hint = "; pass the optimizer object, not its name"
    raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
                    f"{f' {optimizer!r}' if isinstance(optimizer, str) else ''}{hint}")


def flat_params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The optimizer's parameters in ``param_groups`` order."""
    return [p for g in optimizer.param_groups for p in g["params"]]


def resolve_weights(optimizer: torch.optim.Optimizer, params: Sequence[Tensor] | None) -> list[Tensor]:
    """Detached starting weights: ``params`` (validated against the optimizer's) or the current parameters."""
    own = flat_params(optimizer)
    if params is None:
        return [p.detach() for p in own]
    if isinstance(params, Tensor) or not isinstance(params, Iterable):
        raise TypeError(f"params must be a sequence of tensors, one per optimizer parameter, or None; "
                        f"got {type(params).__name__}")
    params = list(params)
    if len(params) != len(own):
        raise ValueError(f"params has {len(params)} tensors but the optimizer has {len(own)} parameters")
    for i, (w, p) in enumerate(zip(params, own)):
        if not isinstance(w, Tensor):
            raise TypeError(f"params[{i}] must be a Tensor, got {type(w).__name__}")
        if w.shape != p.shape:
            raise ValueError(f"params[{i}] has shape {tuple(w.shape)}, the optimizer's parameter {tuple(p.shape)}")
        if w.device != p.device or w.dtype != p.dtype:
            raise ValueError(f"params[{i}] is {w.dtype} on {w.device}, the optimizer's parameter {p.dtype} on "
                             f"{p.device}; predictions combine them with the optimizer's state")
    return [w.detach() for w in params]


def future_lrs(schedule: LRSchedule | None, group_index: int, lr: float, s: int) -> list[float]:
    """Learning rates of the next ``s`` updates: the schedule's, or the current ``lr`` held constant."""
    if schedule is None:
        return [lr] * s
    return [float(schedule(group_index, j)) for j in range(s)]


@dataclass
class Bucket:
    """Parameters of one param group that share a step count (so step-dependent scalars agree)."""

    group_index: int
    hp: dict[str, Any]
    positions: list[int]
    params: list[Tensor]
    states: list[dict[str, Any]]


def buckets(optimizer: torch.optim.Optimizer, rule: UpdateRule, *,
            include: Callable[[Tensor], bool] = lambda p: True, fresh_state: bool = True) -> list[Bucket]:
    """The optimizer's parameters in :class:`Bucket` s; ``fresh_state`` gives stateless ones their first-step state."""
    out: list[Bucket] = []
    pos = 0
    for gi, group in enumerate(optimizer.param_groups):
        hp = rule.hyper(group)
        by_key: dict[tuple, Bucket] = {}
        for p in group["params"]:
            i, pos = pos, pos + 1
            if not include(p):
                continue
            if p.is_complex():
                raise ValueError("complex parameters are not supported by the weight predictors")
            if p.grad is not None and p.grad.is_sparse:
                raise ValueError("sparse gradients are not supported by the weight predictors")
            state = optimizer.state.get(p)  # .get: never create an entry in the optimizer's defaultdict
            if not state:
                if not fresh_state:
                    continue
                state = rule.init_state(hp, p)
            key = rule.bucket_key(state)
            b = by_key.setdefault(key, Bucket(gi, hp, [], [], []))
            b.positions.append(i)
            b.params.append(p)
            b.states.append(state)
        out.extend(by_key.values())
    return out


class Predictor(ABC):
    """A weight predictor: ``predict(optimizer, s, params=None) -> list[Tensor]``, never mutating state."""

    name: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    needs_history: ClassVar[bool] = False

    def __init__(self, *, lr_schedule: LRSchedule | None = None) -> None:
        if lr_schedule is not None and not callable(lr_schedule):
            raise TypeError("lr_schedule must be a callable (group_index, j) -> lr, or None")
        self.lr_schedule = lr_schedule

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        """Raise TypeError/ValueError now if this predictor cannot follow ``optimizer``."""
        rule = rule_for(check_optimizer(optimizer))
        for group in optimizer.param_groups:
            rule.hyper(group)

    def supported_optimizers(self) -> list[str]:
        """The optimizers :meth:`check` accepts, as named in refusals (the update rules' ``torch.optim`` classes)."""
        from .rules import supported_optimizers

        return supported_optimizers()

    def predict(self, optimizer: torch.optim.Optimizer, s: int, params: Sequence[Tensor] | None = None
                ) -> list[Tensor]:
        """Predicted weights ``Ŵ_{t+s}``, one new tensor per parameter in ``param_groups`` order (s = 0: copies)."""
        check_optimizer(optimizer)
        s = check_steps(s)
        W = resolve_weights(optimizer, params)
        with torch.no_grad():
            return self._predict(optimizer, s, W)

    @abstractmethod
    def _predict(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor]) -> list[Tensor]: ...

    def predict_all(self, optimizer: torch.optim.Optimizer, max_s: int, params: Sequence[Tensor] | None = None
                    ) -> list[list[Tensor]]:
        """``[predict(optimizer, s, params) for s in 1..max_s]``; rollouts compute them in one pass."""
        check_optimizer(optimizer)
        max_s = check_steps(max_s)
        return [self.predict(optimizer, s, params) for s in range(1, max_s + 1)]

    def observe(self, optimizer: torch.optim.Optimizer) -> None:
        """Record the weights after an ``optimizer.step()`` (no-op unless the predictor uses history)."""
        check_optimizer(optimizer)

    def reset(self) -> None:
        """Forget any recorded history."""
        return None  # a predictor without history has none to forget

    def state_dict(self, optimizer: torch.optim.Optimizer) -> Any:
        """The history recorded for ``optimizer`` (``None`` for predictors without history), for checkpoints."""
        return None

    def load_state_dict(self, optimizer: torch.optim.Optimizer, state: Any) -> None:
        """Restore :meth:`state_dict` for ``optimizer`` (a new optimizer over the same parameters)."""
        return None  # a predictor without history has nothing to restore

    def options(self) -> dict[str, Any]:
        """The options this predictor was built with (for records and figure sidecars)."""
        return {"lr_schedule": None if self.lr_schedule is None else repr(self.lr_schedule)}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"
