"""Predictors that read the optimizer's state: stale, SpecTrain, PipeOptim, repeat, zero-gradient rollout.

With ``W`` the starting weights, ``lr`` the group's learning rate and ``s`` the staleness:

- ``stale``:  ``Ŵ = W`` (no prediction; the baseline).
- SpecTrain (Chen et al., arXiv:1809.02839, Eq. 4): ``Ŵ = W − s·lr·v`` with ``v`` SGD's momentum
  buffer (constant-velocity model). The published code uses ``v = μ·b + g`` instead (``formula="code"``).
- PipeOptim (Guan et al., arXiv:2312.00839, Eq. 5 and Table I): ``Ŵ = W − s·lr·ΔW_t`` with ``lr·ΔW_t``
  the update the optimizer's own rule applied last, ``W_{t−1} − W_t`` rebuilt exactly from its state
  (:meth:`UpdateRule.last_update`), for every supported optimizer. ``extra_steps=1`` reproduces the
  published code's ``s = D−k`` (the paper: ``D−k−1``).
- ``repeat``: ``s`` real steps of the optimizer's rule, each with the last gradient ``g_t`` (weight decay
  re-evaluated at the predicted weights): exact when the gradient is constant.
- ``zero_grad_rollout``: ``s`` steps with zero future gradient (momentum and moments decay).

With an ``lr_schedule`` the constant-velocity predictors use ``Σ_j lr_j`` in place of ``s·lr`` and the
rollouts use ``lr_j`` at step ``j``; without one the current ``lr`` is held (no look-ahead).

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.zeros(1)); opt = torch.optim.Adam([w], lr=0.1)
    >>> w.grad = torch.ones(1); opt.step()
    >>> Repeat().predict(opt, 3)[0]        # Adam moves by ≈ lr per step under a constant gradient
    tensor([-0.4000])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from ..schedules.actions import check_flag
from .base import LRSchedule, Predictor, buckets, check_optimizer, check_steps, future_lrs, resolve_weights
from .rules import LastUpdateOptions, SGDRule, rule_for

__all__ = ["Stale", "SpecTrain", "PipeOptim", "Rollout", "Repeat", "ZeroGradRollout"]


def _gather(seq: list[Tensor], positions: list[int]) -> list[Tensor]:
    return [seq[i] for i in positions]


def _fill(out: list[Tensor | None], W: list[Tensor]) -> list[Tensor]:
    return [w.clone() if o is None else o for o, w in zip(out, W)]


def _last_grads(params: list[Tensor], *, missing_as_zero: bool = False) -> list[Tensor] | None:
    """The last gradients; ``None`` if one is missing, unless ``missing_as_zero`` fills those with zeros."""
    grads = [p.grad for p in params]
    if any(g is None for g in grads):
        if not missing_as_zero:
            return None
        return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)]
    return [g.detach() for g in grads if g is not None]


class Stale(Predictor):
    """No prediction: ``Ŵ_{t+s} = W_t`` (what vanilla asynchronous pipelines and PipeDream compute with).

    Reference: Harlap et al., "PipeDream" (arXiv:1806.03377) — stale weights are the baseline every
    prediction scheme is measured against (SpecTrain Fig. 8).
    """

    name = "stale"
    reference = "baseline (PipeDream, arXiv:1806.03377; SpecTrain Fig. 8's 'stale weights')"

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        check_optimizer(optimizer)

    def _predict(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor]) -> list[Tensor]:
        return [w.clone() for w in W]


class SpecTrain(Predictor):
    """SpecTrain: ``Ŵ_{t+s} = W_t − s·lr·v`` with ``v`` the momentum buffer (constant velocity).

    Args:
        formula: ``"paper"`` (default): ``v = b`` (torch's momentum buffer, Eq. 4 of the paper);
            ``"code"``: ``v = μ·b + g_t`` as the published implementation computes it (the last gradient,
            already in ``b``, counted twice; dampening and Nesterov ignored; needs ``p.grad``).
        lr_schedule: future learning rates; ``None`` holds the current one.

    ``formula="paper"`` extrapolates ``b`` also for Nesterov (whose applied update is ``g + μ·b``). With
    dampening ``τ = μ``, ``b`` is exactly SpecTrain's smoothed gradient of Eq. 1 (``γ = μ``).

    Requires ``torch.optim.SGD`` with ``momentum > 0`` (raises ValueError otherwise; ``pipeoptim``
    generalises SpecTrain to other optimizers and equals it for SGD with momentum). Parameters without a
    momentum buffer yet (before the first step) are predicted stale.

    Reference: Chen et al., "Efficient and Robust Parallel DNN Training through Model Parallelism on
    Multi-GPU Platform", arXiv:1809.02839, Eq. (1)-(4).
    """

    name = "spectrain"
    reference = "Chen et al., arXiv:1809.02839, Eq. 4"

    def __init__(self, *, formula: Literal["paper", "code"] = "paper", lr_schedule: LRSchedule | None = None):
        super().__init__(lr_schedule=lr_schedule)
        if formula not in ("paper", "code"):
            raise ValueError(f"formula={formula!r}; choose 'paper' or 'code'")
        self.formula = formula

    def options(self) -> dict[str, Any]:
        return {"formula": self.formula, **super().options()}

    def supported_optimizers(self) -> list[str]:
        return ["SGD with momentum > 0"]

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        rule = rule_for(optimizer)
        if not isinstance(rule, SGDRule):
            raise ValueError(f"SpecTrain extrapolates SGD's momentum buffer and supports only torch.optim.SGD "
                             f"with momentum > 0, got {type(optimizer).__name__}; use 'pipeoptim' (the same "
                             "rule for SGD with momentum, generalised to Adam, RMSprop, ...)")
        for gi, group in enumerate(optimizer.param_groups):
            if rule.hyper(group)["momentum"] == 0:
                raise ValueError(f"SpecTrain needs SGD with momentum > 0 (param group {gi} has momentum=0); "
                                 "use 'pipeoptim' or 'repeat', which follow plain SGD")

    def _predict(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor]) -> list[Tensor]:
        self.check(optimizer)
        out: list[Tensor | None] = [None] * len(W)
        if s == 0:
            return _fill(out, W)
        rule = rule_for(optimizer)
        for b in buckets(optimizer, rule, fresh_state=False):
            bufs: list[Tensor] = [buf for st in b.states if (buf := st.get("momentum_buffer")) is not None]
            if len(bufs) != len(b.states):
                continue  # no step yet: zero velocity, stale
            total_lr = sum(future_lrs(self.lr_schedule, b.group_index, b.hp["lr"], s))
            if self.formula == "code":
                g = _last_grads(b.params)
                if g is None:
                    raise ValueError("spectrain_code uses the last gradient (p.grad); predict before "
                                     "optimizer.zero_grad()")
                v = list(torch._foreach_add(g, bufs, alpha=b.hp["momentum"]))
            else:
                v = bufs
            pred = torch._foreach_add(_gather(W, b.positions), v, alpha=-total_lr)
            for i, t in zip(b.positions, pred):
                out[i] = t
        return _fill(out, W)


class PipeOptim(Predictor):
    """PipeOptim: ``Ŵ_{t+s} = W_t − s·lr·ΔW_t`` with ``ΔW_t`` from the optimizer's update rule.

    ``lr·ΔW_t = W_{t−1} − W_t`` is the update the last ``optimizer.step()`` applied, rebuilt from the
    optimizer's state and its current weights ``W_t`` (Table I: ``v_t`` for SGDM, ``m̂_t/(sqrt(v̂_t)+eps)``
    for Adam/AdamW; see each rule for the others). With the default options the rebuild is exact to
    float64 rounding, weight decay included (while the learning rate is unchanged since that step). With
    ``params=`` the prediction starts from the given weights, and ΔW_t is still the optimizer's last update.

    Args:
        weight_decay: rebuild the decay part of ΔW_t exactly (AdamW: ``(u + lr·wd·W_t)/(1 − lr·wd)``
            with ``u = lr·m̂_t/(sqrt(v̂_t)+eps)``; coupled L2 decay likewise, see
            :mod:`pipelab.predictors.rules`). Default ``True``. ``False`` leaves the decay terms out, as
            Table I (no AdamW decay term) and the published code do.
        bias_step: bias-correction exponent ``"t"`` (default, Table I) or ``"t+1"``.
        eps: eps override (``None``: the optimizer's; the published code uses 1e-8).
        eps_placement: ``"outside"`` (default, ``sqrt(v̂)+eps``) or ``"inside"`` (``sqrt(v̂+eps)``).
        extra_steps: added to ``s`` (default 0; the published code predicts ``D−k`` = paper's ``s`` + 1, so
            it is not the identity at ``s = 0``).
        lr_schedule: future learning rates: ``Ŵ = W − (Σ_j lr_j / lr)·lr·ΔW_t``; ``None`` holds lr.

    Reference: Guan et al., "PipeOptim: Ensuring Effective 1F1B Schedule with Optimizer-Dependent Weight
    Prediction", arXiv:2312.00839, Eq. (5), Table I.
    """

    name = "pipeoptim"
    reference = "Guan et al., arXiv:2312.00839, Eq. 5 and Table I"

    def __init__(self, *, weight_decay: bool = True, bias_step: Literal["t", "t+1"] = "t",
                 eps: float | None = None, eps_placement: Literal["outside", "inside"] = "outside",
                 extra_steps: int = 0, lr_schedule: LRSchedule | None = None) -> None:
        super().__init__(lr_schedule=lr_schedule)
        self.last = LastUpdateOptions(weight_decay, bias_step, eps, eps_placement)
        if isinstance(extra_steps, bool) or not isinstance(extra_steps, int):
            raise TypeError(f"extra_steps must be a non-negative integer, got {type(extra_steps).__name__} "
                            f"{extra_steps!r}")
        if extra_steps < 0:
            raise ValueError(f"extra_steps must be a non-negative integer, got {extra_steps!r}")
        self.extra_steps = extra_steps

    def options(self) -> dict[str, Any]:
        return {"weight_decay": self.last.weight_decay, "bias_step": self.last.bias_step, "eps": self.last.eps,
                "eps_placement": self.last.eps_placement, "extra_steps": self.extra_steps, **super().options()}

    def _predict(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor]) -> list[Tensor]:
        s = s + self.extra_steps
        out: list[Tensor | None] = [None] * len(W)
        if s == 0:
            return _fill(out, W)
        rule = rule_for(optimizer)
        # Rules that rebuild the last update from p.grad raise when no parameter has one (zero_grad was
        # called); a parameter without a gradient while others have one is treated as a zero gradient.
        any_grad = any(p.grad is not None for g in optimizer.param_groups for p in g["params"])
        for b in buckets(optimizer, rule):  # no state yet: the rule's last update is zero (or lr·g for SGD)
            lr = b.hp["lr"]
            lrs = future_lrs(self.lr_schedule, b.group_index, lr, s)
            Wb = _gather(W, b.positions)
            # ΔW_t is the update the optimizer applied last: its decay terms are rebuilt from the optimizer's
            # own weights W_t, also when the prediction starts from other weights (params=)
            Wt = [p.detach() for p in b.params]
            current = None if all(w.is_set_to(p) for w, p in zip(Wb, Wt)) else Wt
            g = _last_grads(b.params, missing_as_zero=any_grad)
            scale = sum(lrs) / lr if lr != 0 else float(s)
            pred = rule.apply_last(b.hp, lr, rule.read(b.hp, b.states), Wb, g, self.last, scale, current=current)
            for i, t in zip(b.positions, pred):
                out[i] = t
        return _fill(out, W)


class Rollout(Predictor):
    """Roll the optimizer's own rule forward ``s`` steps under a model of the future gradients.

    Args:
        gradient: ``"last"`` (every future gradient equals the last one, ``p.grad``; parameters without a
            gradient stay fixed, as ``torch.optim`` skips them) or ``"zero"`` (no future gradient).
        weight_decay: apply the optimizer's weight decay in the rolled-out steps (default ``True``, which
            makes ``repeat`` exact for a constant loss gradient).
        lr_schedule: learning rate of each future step; ``None`` holds the current one.
    """

    name = "rollout"
    reference = "pipelab: the optimizer's rule rolled forward (generalises PipeOptim's Eq. 1)"

    def __init__(self, *, gradient: Literal["last", "zero"] = "last", weight_decay: bool = True,
                 lr_schedule: LRSchedule | None = None) -> None:
        super().__init__(lr_schedule=lr_schedule)
        if gradient not in ("last", "zero"):
            raise ValueError(f"gradient={gradient!r}; choose 'last' or 'zero'")
        self.gradient = gradient
        self.weight_decay = check_flag("weight_decay", weight_decay)

    def options(self) -> dict[str, Any]:
        return {"gradient": self.gradient, "weight_decay": self.weight_decay, **super().options()}

    def _predict(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor]) -> list[Tensor]:
        return self._rollout(optimizer, s, W, keep_all=False)[-1] if s > 0 else [w.clone() for w in W]

    def predict_all(self, optimizer: torch.optim.Optimizer, max_s: int, params: Sequence[Tensor] | None = None
                    ) -> list[list[Tensor]]:
        check_optimizer(optimizer)
        max_s = check_steps(max_s)
        if max_s == 0:
            return []
        W = resolve_weights(optimizer, params)
        with torch.no_grad():
            return self._rollout(optimizer, max_s, W, keep_all=True)

    def _rollout(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor], *, keep_all: bool
                 ) -> list[list[Tensor]]:
        """Predictions for steps 1..s (``keep_all``) or only for step s, in one pass.

        The first rolled-out step reads the optimizer's state and writes new tensors; later steps update
        those private copies in place (and the weights too when only the last step is kept).
        """
        n_out = s if keep_all else 1
        outs: list[list[Tensor | None]] = [[None] * len(W) for _ in range(n_out)]
        rule = rule_for(optimizer)
        last = self.gradient == "last"
        include = (lambda p: p.grad is not None) if last else (lambda p: True)
        bs = buckets(optimizer, rule, include=include)
        if last and not bs and any(True for g in optimizer.param_groups for _ in g["params"]):
            raise ValueError("'repeat' rolls the last gradient forward but no parameter has a gradient "
                             "(p.grad is None); predict before optimizer.zero_grad(set_to_none=True)")
        for b in bs:
            hp = b.hp if self.weight_decay else dict(b.hp, weight_decay=0.0)
            g = [p.grad.detach() for p in b.params if p.grad is not None] if last else \
                [torch.zeros_like(p) for p in b.params]
            self._roll_bucket(rule, b, hp, g, _gather(W, b.positions), s, outs, keep_all)
        # parameters outside every bucket (no gradient under "last") keep their starting weights
        return [_fill(out, W) for out in outs]

    def _roll_bucket(self, rule: Any, b: Any, hp: dict[str, Any], g: list[Tensor], Wb: list[Tensor], s: int,
                     outs: list[list[Tensor | None]], keep_all: bool) -> None:
        """``s`` steps of one bucket with gradient ``g``, each kept step's weights written into ``outs``."""
        st = rule.read(hp, b.states)
        for j, lr_j in enumerate(future_lrs(self.lr_schedule, b.group_index, hp["lr"], s)):
            Wb, st = rule.step(hp, lr_j, st, Wb, g, own_state=j > 0, own_weights=j > 0 and not keep_all)
            if keep_all or j == s - 1:
                for i, t in zip(b.positions, Wb):
                    outs[j if keep_all else 0][i] = t


class Repeat(Rollout):
    """``repeat``: ``s`` steps of ``torch.optim``'s own update with every future gradient equal to the last.

    ``(W, state) ← step(W, state, g_t)`` ``s`` times; with a constant gradient (linear loss) this equals
    ``s`` real ``optimizer.step()`` calls to float64 rounding. It generalises PipeOptim's Eq. (1) without
    the approximation ``ΔW_i ≈ ΔW_t``. Needs ``p.grad`` (predict before ``zero_grad``).

    Reference: Guan et al., arXiv:2312.00839, Eq. (1)-(3) (the sum this rollout evaluates).
    """

    name = "repeat"
    reference = "Guan et al., arXiv:2312.00839, Eq. 1 evaluated with g_i = g_t"

    def __init__(self, *, weight_decay: bool = True, lr_schedule: LRSchedule | None = None) -> None:
        super().__init__(gradient="last", weight_decay=weight_decay, lr_schedule=lr_schedule)

    def options(self) -> dict[str, Any]:
        opts = super().options()
        opts.pop("gradient")
        return opts


class ZeroGradRollout(Rollout):
    """``zero_grad_rollout``: ``s`` steps of the optimizer's rule with zero future gradient.

    SGD with momentum gives ``Ŵ = W − lr·b·Σ_{j=1..s} μ^j``; Adam's moments decay, its bias corrections
    advance. This is the "momentum coasts" model: only what the optimizer has accumulated moves ``W``.

    Reference: pipelab's "coasting" model; SpecTrain's constant velocity (arXiv:1809.02839, Eq. 4) is
    its undamped limit μ → 1.
    """

    name = "zero_grad_rollout"
    reference = "pipelab: momentum coasting; SpecTrain (arXiv:1809.02839) Eq. 4 is the μ → 1 limit"

    def __init__(self, *, weight_decay: bool = True, lr_schedule: LRSchedule | None = None) -> None:
        super().__init__(gradient="zero", weight_decay=weight_decay, lr_schedule=lr_schedule)

    def options(self) -> dict[str, Any]:
        opts = super().options()
        opts.pop("gradient")
        return opts

