"""The weight-predictor interface and the plumbing shared by all predictors.

``Ŵ_{t+s} = predictor.predict(optimizer, s)``: a pure function of the user's ``torch.optim`` optimizer (params,
groups, state) and s, which it never writes to. History predictors (linear, PipeMare) need
:meth:`Predictor.observe` after every ``optimizer.step()``. ``params=`` predicts from given weights (e.g. a
stashed version) with the optimizer's state and hyper-parameters. Predictors that use the last gradient read it
through :func:`last_gradients`: ``p.grad``, mapped back where torch's step overwrote it (foreach SGD-Nesterov).
"""

from __future__ import annotations

import inspect
import numbers
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor

from .rules import BucketState, UpdateRule, registered_class, rule_for

__all__ = ["Predictor", "LRSchedule", "check_steps", "check_optimizer", "flat_params", "resolve_weights", "Bucket",
           "buckets", "future_lrs", "last_gradients", "step_overwrites_grad"]

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


def last_gradients(optimizer: torch.optim.Optimizer, rule: UpdateRule, b: Bucket, *,
                   missing_as_zero: bool = False) -> list[Tensor] | None:
    """The gradients of the last step of bucket ``b``: ``p.grad``, mapped back where torch's step overwrote it.

    ``None`` if a parameter has no gradient, unless ``missing_as_zero`` fills those with zeros (torch skipped them,
    so their ``p.grad`` is not mapped). Where :func:`step_overwrites_grad`, the rule's
    :meth:`~pipelab.predictors.rules.UpdateRule.gradient_from_step` gives ``g_t`` back (SGD-Nesterov under
    ``foreach``: ``p.grad − μ·b_t``); else ``p.grad`` is ``g_t`` itself.
    """
    present = [p.grad is not None for p in b.params]
    if not all(present) and not missing_as_zero:
        return None
    held = [cast(Tensor, p.grad).detach() for p, has in zip(b.params, present) if has]
    if held and step_overwrites_grad(optimizer, rule, b.group_index):
        st = rule.read(b.hp, [s for s, has in zip(b.states, present) if has])
        mapped = rule.gradient_from_step(b.hp, st, held)
        assert mapped is not None  # step_overwrites_grad checked that the rule maps p.grad back
        held = mapped
    it = iter(held)
    return [next(it) if has else torch.zeros_like(p) for p, has in zip(b.params, present)]


#: (registered class, settings' signature, devices) -> whether its step overwrites p.grad (torch asked once)
_OVERWRITES: dict[Hashable, bool] = {}


def _signature(value: Any) -> Hashable:
    """What of a hyper-parameter can choose torch's code path: its kind and sign (zero or not), not its size."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Real):
        return type(value).__name__, (float(value) > 0) - (float(value) < 0)
    if isinstance(value, Tensor):
        return ("tensor", str(value.device), str(value.dtype), value.requires_grad,
                tuple(torch.sign(value.detach()).flatten().tolist()) if value.numel() == 1 else tuple(value.shape))
    if isinstance(value, (tuple, list)):
        return tuple(_signature(v) for v in value)
    return repr(value)


def step_overwrites_grad(optimizer: torch.optim.Optimizer, rule: UpdateRule, group_index: int) -> bool:
    """Whether ``optimizer.step()`` leaves in ``p.grad``, for this param group, something other than its gradient.

    torch's multi-tensor SGD (``foreach``, its default for CUDA tensors) forms Nesterov's ``d = g + μ·b`` in the
    gradient tensors themselves when nothing copied them first (weight_decay 0, maximize False); the for-loop
    (the CPU default) leaves ``g`` (torch 2.11-2.13). Rather than copy torch's private choice of implementation,
    pipelab asks torch: a throwaway optimizer of the registered class with the group's settings, over one float64
    2×2 tensor per device of the group, takes two steps, and the gradient is what, fed to the rule's
    :meth:`~pipelab.predictors.rules.UpdateRule.step`, gives torch's step (to 1e-6 of the update; the rules equal
    torch to rounding, a misread gradient misses by a fraction of the update): ``p.grad`` as torch left it (False;
    also where a subclass's step clips ``p.grad`` before using it), else the rule's
    :meth:`~pipelab.predictors.rules.UpdateRule.gradient_from_step` of it (True). Neither, or not the same at both
    steps: ValueError, the predictors refuse rather than read a wrong gradient. One probe per class, settings
    (their kinds and signs, which choose torch's code path, not their sizes) and devices, cached for the process:
    two steps over 2×2 tensors once per configuration, no memory kept.
    """
    group = optimizer.param_groups[group_index]
    cls = registered_class(optimizer)
    devices = sorted({p.device for p in group["params"]}, key=str)
    key = (cls, tuple((k, _signature(v)) for k, v in sorted(group.items()) if k != "params"), tuple(devices))
    known = _OVERWRITES.get(key)
    if known is None:
        accepted = inspect.signature(cls.__init__).parameters
        settings = {k: v for k, v in group.items() if k != "params" and k in accepted}
        known = _OVERWRITES[key] = _probe_step(cls, rule, settings, devices)
    return known


def _probe_step(cls: type[torch.optim.Optimizer], rule: UpdateRule, settings: dict[str, Any],
                devices: list[torch.device]) -> bool:
    """Two steps of ``cls(**settings)`` on fresh tensors: whether ``rule`` needs to map ``p.grad`` back (see above)."""
    gen = torch.Generator().manual_seed(0)

    def draw() -> list[Tensor]:  # float64 where the device has it: the check needs the digits
        return [torch.randn(2, 2, generator=gen, dtype=torch.float64).to(
            d, torch.float32 if d.type == "mps" else torch.float64) for d in devices]

    params = [torch.nn.Parameter(w) for w in draw()]
    probe = cls(params, **settings)
    hp = rule.hyper(probe.param_groups[0])
    verdicts = set()
    for _ in range(2):
        for p, g in zip(params, draw()):
            p.grad = g
        before = [p.detach().clone() for p in params]
        state = rule.read(hp, [{k: v.clone() if isinstance(v, Tensor) else v for k, v in probe.state[p].items()}
                               or rule.init_state(hp, p) for p in params])
        probe.step()
        held = [cast(Tensor, p.grad).detach() for p in params]
        mapped = rule.gradient_from_step(hp, rule.read(hp, [probe.state[p] for p in params]), held)
        verdicts.add(False if _reproduces(rule, hp, state, before, params, held)
                     else True if _reproduces(rule, hp, state, before, params, mapped) else None)
    if verdicts != {False} and verdicts != {True}:
        impl = ", ".join(f"{k}={settings[k]!r}" for k in ("foreach", "fused") if k in settings)
        raise ValueError(f"{cls.__name__}.step() ({impl}) leaves a value in p.grad from which the {rule.name} rule "
                         "cannot rebuild the step, so the weight predictors cannot read the last gradient; build the "
                         "optimizer with foreach=False (and fused=False)")
    return verdicts == {True}


def _reproduces(rule: UpdateRule, hp: dict[str, Any], state: BucketState, before: list[Tensor], after: Sequence[Tensor],
                g: list[Tensor] | None) -> bool:
    """Whether the rule's step from ``before`` and ``state`` with gradient ``g`` gives ``after`` (to 1e-6 of the
    update)."""
    if g is None:
        return False
    W, _ = rule.step(hp, hp["lr"], state, before, g)
    return all(bool((w - a).abs().max() <= 1e-6 * (w0 - a).abs().max()) for w, a, w0 in zip(W, after, before))


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
