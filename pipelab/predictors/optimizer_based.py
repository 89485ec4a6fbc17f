"""Predictors that read the optimizer's state: stale, SpecTrain, PipeOptim, repeat, zero-gradient rollout.

With an ``lr_schedule`` the constant-velocity predictors use ``Σ_j lr_j`` in place of ``s·lr`` and the rollouts
use ``lr_j`` at step j; without one the current ``lr`` is held (no look-ahead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from ..schedules.actions import check_flag
from .base import (
    LRSchedule,
    Predictor,
    buckets,
    check_optimizer,
    check_steps,
    future_lrs,
    last_gradients,
    resolve_weights,
)
from .rules import LastUpdateOptions, SGDRule, rule_for

__all__ = ["Stale", "SpecTrain", "PipeOptim", "Rollout", "Repeat", "ZeroGradRollout"]


def _gather(seq: list[Tensor], positions: list[int]) -> list[Tensor]:
    return [seq[i] for i in positions]


def _fill(out: list[Tensor | None], W: list[Tensor]) -> list[Tensor]:
    return [w.clone() if o is None else o for o, w in zip(out, W)]


class Stale(Predictor):
    """No prediction: ``Ŵ_{t+s} = W_t``, the baseline (PipeDream, arXiv:1806.03377; SpecTrain Fig. 8)."""

    name = "stale"
    reference = "baseline (PipeDream, arXiv:1806.03377; SpecTrain Fig. 8's 'stale weights')"

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        check_optimizer(optimizer)

    def _predict(self, optimizer: torch.optim.Optimizer, s: int, W: list[Tensor]) -> list[Tensor]:
        return [w.clone() for w in W]


class SpecTrain(Predictor):
    """SpecTrain (arXiv:1809.02839, Eq. 1-4): ``Ŵ_{t+s} = W_t − s·lr·v``, v the momentum buffer (constant velocity).

    Needs ``torch.optim.SGD`` with momentum > 0 (``pipeoptim`` generalises it); parameters without a buffer yet are
    predicted stale. With dampening τ = μ the buffer is SpecTrain's smoothed gradient (Eq. 1, γ = μ).
    ``formula="code"``: ``v = μ·b + g_t`` as the published code (the last gradient counted twice; needs ``p.grad``).
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
                g = last_gradients(optimizer, rule, b)
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
    """PipeOptim (arXiv:2312.00839, Eq. 5, Table I): ``Ŵ_{t+s} = W_t − s·lr·ΔW_t``, ΔW_t by the optimizer's rule.

    ``lr·ΔW_t = W_{t−1} − W_t``, the last update rebuilt exactly from the state (:meth:`UpdateRule.last_update`;
    options: :class:`~pipelab.predictors.rules.LastUpdateOptions`), also when ``params=`` gives other weights.
    ``extra_steps`` is added to s (the published code predicts ``D−k``, the paper's s + 1).
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
            g = last_gradients(optimizer, rule, b, missing_as_zero=any_grad)
            scale = sum(lrs) / lr if lr != 0 else float(s)
            pred = rule.apply_last(b.hp, lr, rule.read(b.hp, b.states), Wb, g, self.last, scale, current=current)
            for i, t in zip(b.positions, pred):
                out[i] = t
        return _fill(out, W)


class Rollout(Predictor):
    """Roll the optimizer's own rule forward ``s`` steps under a model of the future gradients.

    Args:
        gradient: ``"last"`` (``p.grad`` every step; parameters without one stay fixed, as torch skips them) or
            ``"zero"``.
        weight_decay: apply the decay in the rolled-out steps (makes ``repeat`` exact for a constant gradient).
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
            g = last_gradients(optimizer, rule, b) if last else [torch.zeros_like(p) for p in b.params]
            assert g is not None  # every parameter of a bucket under "last" has a gradient
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
    """``repeat``: s steps of ``torch.optim``'s update with every future gradient equal to the last.

    Equals s real steps under a constant gradient, to float64 rounding: PipeOptim's Eq. (1)-(3) without the
    approximation ``ΔW_i ≈ ΔW_t``. Needs ``p.grad``.
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
    """s steps with zero future gradient (SGDM: ``Ŵ = W − lr·b·Σ_{j=1..s} μ^j``; SpecTrain is the limit μ → 1)."""

    name = "zero_grad_rollout"
    reference = "pipelab: momentum coasting; SpecTrain (arXiv:1809.02839) Eq. 4 is the μ → 1 limit"

    def __init__(self, *, weight_decay: bool = True, lr_schedule: LRSchedule | None = None) -> None:
        super().__init__(gradient="zero", weight_decay=weight_decay, lr_schedule=lr_schedule)

    def options(self) -> dict[str, Any]:
        opts = super().options()
        opts.pop("gradient")
        return opts

