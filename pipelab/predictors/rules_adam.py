"""Update rules of the Adam family: Adam, AdamW, NAdam, RAdam, Adamax (read-only views of ``torch.optim``).

Interface and the exact last update under weight decay: :mod:`pipelab.predictors.rules`.

References: Kingma & Ba, "Adam" (ICLR 2015); Loshchilov & Hutter, "Decoupled Weight Decay
Regularization" (ICLR 2019); Dozat, "Incorporating Nesterov Momentum into Adam" (2016); Liu et al.,
"On the Variance of the Adaptive Learning Rate and Beyond" (RAdam, ICLR 2020); PipeOptim Table I
(Guan et al., arXiv:2312.00839).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .rules import (
    BucketState,
    Direction,
    LastUpdateOptions,
    UpdateRule,
    denominator,
    flerp,
    fmaximum,
    fmul,
    register_rule,
    scalar,
)

__all__ = ["AdamRule", "NAdamRule", "RAdamRule", "AdamaxRule"]


class _AdamLike(UpdateRule):
    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        b1, b2 = group["betas"]
        hp["beta1"], hp["beta2"] = scalar(b1), scalar(b2)
        hp["eps"] = scalar(group["eps"])
        hp["decoupled_weight_decay"] = bool(group.get("decoupled_weight_decay", False))
        return hp

    def init_state(self, hp: dict[str, Any], p: Tensor) -> dict[str, Any]:
        return {"step": torch.tensor(0.0), **{k: torch.zeros_like(p) for k in self.state_keys(hp)}}

    @staticmethod
    def _moments(hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool, second: str = "exp_avg_sq"
                 ) -> tuple[list[Tensor], list[Tensor]]:
        """``m ← lerp(m, g, 1−β1)``, ``v ← β2·v + (1−β2)·g²``: the new (first, second) moments."""
        m = flerp(st.present("exp_avg"), g, 1 - hp["beta1"], own)
        v = fmul(st.present(second), hp["beta2"], own)
        torch._foreach_addcmul_(v, g, g, value=1 - hp["beta2"])
        return m, v

    @staticmethod
    def _eps(hp: dict[str, Any], opts: LastUpdateOptions | None) -> tuple[float, str]:
        """(eps, placement) of the step (``opts=None``) or of a rebuild with ``opts``."""
        if opts is None:
            return hp["eps"], "outside"
        return (hp["eps"] if opts.eps is None else opts.eps), opts.eps_placement


class AdamRule(_AdamLike):
    """Adam / AdamW (``decoupled_weight_decay``), with amsgrad.

    ``m ← lerp(m, g, 1−β1)``; ``v ← β2·v + (1−β2)·g²``; ``U = lr/(1−β1^t) · m / (sqrt(v̂) + eps)``,
    ``v̂ = v/(1−β2^t)`` (its running max with amsgrad). Last update (Table I): ``u = lr·m̂_t/(sqrt(v̂_t) + eps)``;
    AdamW ``(u + lr·wd·W_t)/(1 − lr·wd)``.
    """

    name = "Adam"
    optimizer_types = (torch.optim.Adam, torch.optim.AdamW)
    options = ("amsgrad",)

    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        hp["amsgrad"] = bool(group.get("amsgrad", False))
        return hp

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if hp["amsgrad"] else ("exp_avg", "exp_avg_sq")

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        m, v = self._moments(hp, st, g, own)
        new = BucketState(st.step + 1, {"exp_avg": m, "exp_avg_sq": v})
        if hp["amsgrad"]:
            new.tensors["max_exp_avg_sq"] = fmaximum(st.present("max_exp_avg_sq"), v, own)
        return new

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        if st.step == 0:
            return None
        tau = st.step if opts is None else opts.step_for_bias(st.step)
        v = st.present("max_exp_avg_sq" if hp["amsgrad"] else "exp_avg_sq")
        den = denominator(v, 1 - hp["beta2"] ** tau, *self._eps(hp, opts))
        return Direction(lr, [(1.0, st.present("exp_avg"))], den, k=1 - hp["beta1"] ** tau)


class NAdamRule(_AdamLike):
    """NAdam with momentum decay ψ (``torch.optim.NAdam``).

    ``μ_t = β1·(1 − ½·0.96^{tψ})``, ``Π_t = Π_{t−1}·μ_t``; ``U = a·g/den + b·m/den`` with ``a = lr·(1−μ_t)/(1−Π_t)``,
    ``b = lr·μ_{t+1}/(1−Π_t·μ_{t+1})``, ``den = sqrt(v/(1−β2^t)) + eps``. Last update (needs g_t):
    ``(a·(±g_t + wd·W_t) + b·m)/(den − a·wd)``.
    """

    name = "NAdam"
    optimizer_types = (torch.optim.NAdam,)

    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        hp["momentum_decay"] = scalar(group["momentum_decay"])
        return hp

    def bucket_key(self, state: dict[str, Any] | None) -> tuple:
        if not state or "step" not in state:
            return (0.0, 1.0)
        return (scalar(state["step"]), scalar(state["mu_product"]))

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def read_scalars(self, states: list[dict[str, Any]]) -> dict[str, Tensor]:
        return {"mu_product": states[0]["mu_product"]}

    def init_state(self, hp: dict[str, Any], p: Tensor) -> dict[str, Any]:
        return {**super().init_state(hp, p), "mu_product": torch.tensor(1.0)}

    @staticmethod
    def _mu(hp: dict[str, Any], step: float | Tensor) -> Any:
        return hp["beta1"] * (1.0 - 0.5 * (0.96 ** (step * hp["momentum_decay"])))

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        m, v = self._moments(hp, st, g, own)
        mp = st.scalars["mu_product"] * self._mu(hp, st.step + 1)  # a tensor in the state's dtype, as torch's
        return BucketState(st.step + 1, {"exp_avg": m, "exp_avg_sq": v}, {"mu_product": mp})

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        if st.step == 0:
            return None
        tau = st.step if opts is None else opts.step_for_bias(st.step)
        mp = scalar(st.scalars["mu_product"])
        mu = self._mu(hp, tau)
        if tau != st.step:
            mp *= mu
        mu_next = self._mu(hp, tau + 1)
        bc2 = 1 - hp["beta2"] ** tau
        if opts is None:  # torch.optim's order: sqrt(v/(1−β2^t)) + eps
            den = list(torch._foreach_div(st.present("exp_avg_sq"), bc2))
            torch._foreach_sqrt_(den)
            torch._foreach_add_(den, hp["eps"])
        else:
            den = denominator(st.present("exp_avg_sq"), bc2, *self._eps(hp, opts))
        a, b = lr * (1.0 - mu) / (1.0 - mp), lr * mu_next / (1.0 - mp * mu_next)
        return Direction(1.0, [(a, grad()), (b, st.present("exp_avg"))], den, fuse=False)


class RAdamRule(_AdamLike):
    """RAdam with the variance rectification ``r_t`` (``torch.optim.RAdam``).

    ``ρ_∞ = 2/(1−β2) − 1``, ``ρ_t = ρ_∞ − 2tβ2^t/(1−β2^t)``; if ``ρ_t > 5``:
    ``U = lr·m̂·r_t·sqrt(1−β2^t)/(sqrt(v) + eps)``, ``r_t = sqrt((ρ_t−4)(ρ_t−2)ρ_∞ / ((ρ_∞−4)(ρ_∞−2)ρ_t))``,
    else ``U = lr·m̂``. RAdam adds eps to ``sqrt(v)``, not ``sqrt(v̂)``.
    """

    name = "RAdam"
    optimizer_types = (torch.optim.RAdam,)

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    @staticmethod
    def _rho(b2: float, step: float, bc2: float) -> float | None:
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * step * (b2 ** step) / bc2
        rect = None
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        return rect

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        m, v = self._moments(hp, st, g, own)
        return BucketState(st.step + 1, {"exp_avg": m, "exp_avg_sq": v})

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        if st.step == 0:
            return None
        tau = st.step if opts is None else opts.step_for_bias(st.step)
        m, v = st.present("exp_avg"), st.present("exp_avg_sq")
        bc1, bc2 = 1 - hp["beta1"] ** tau, 1 - hp["beta2"] ** tau
        rect = self._rho(hp["beta2"], tau, bc2)
        eps, placement = self._eps(hp, opts)
        if opts is None:  # torch.optim's order: (m/(1−β1^t))·lr·(sqrt(1−β2^t)/(sqrt(v) + eps))·r_t
            upd = list(torch._foreach_mul(torch._foreach_div(m, bc1), lr))
            if rect is not None:
                sq = denominator(v, 1.0, eps, "outside")
                torch._foreach_mul_(upd, [(bc2 ** 0.5) / x for x in sq])
                torch._foreach_mul_(upd, rect)
            return Direction(1.0, [(1.0, upd)])
        if rect is None:
            return Direction(lr, [(1.0, m)], k=bc1, fuse=False)
        if placement == "outside":   # RAdam's own form: sqrt(1−β2^t)/(sqrt(v) + eps)
            den = denominator(v, 1.0, eps, "outside")
            torch._foreach_div_(den, bc2 ** 0.5)
        else:
            den = denominator(v, bc2, eps, "inside")
        return Direction(lr, [(1.0, m)], den, k=bc1, post=rect, fuse=False)


class AdamaxRule(_AdamLike):
    """Adamax (``torch.optim.Adamax``): ``u ← max(β2·u, |g| + eps)``, ``U = lr/(1−β1^t)·m/u`` (no eps options)."""

    name = "Adamax"
    optimizer_types = (torch.optim.Adamax,)

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_inf")

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        m = flerp(st.present("exp_avg"), g, 1 - hp["beta1"], own)
        u = fmul(st.present("exp_inf"), hp["beta2"], own)
        a = torch._foreach_abs(g)
        torch._foreach_add_(a, hp["eps"])
        torch._foreach_maximum_(u, a)
        return BucketState(st.step + 1, {"exp_avg": m, "exp_inf": u})

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        if st.step == 0:
            return None
        tau = st.step if opts is None else opts.step_for_bias(st.step)
        # u is the optimizer's own state tensor: no gradient term, so nothing ever writes to it
        return Direction(lr / (1 - hp["beta1"] ** tau), [(1.0, st.present("exp_avg"))], st.present("exp_inf"))


register_rule(AdamRule())
register_rule(NAdamRule())
register_rule(RAdamRule())
register_rule(AdamaxRule())
