"""Update rules of the Adam family: Adam, AdamW, NAdam, RAdam, Adamax (read-only views of ``torch.optim``).

See :mod:`pipelab.predictors.rules` for the interface. Each ``step`` mirrors ``torch.optim``'s
single-tensor implementation operation by operation; each ``last_update`` reconstructs ``lr·ΔW_t`` from
the state after step ``t`` (PipeOptim's Table I for Adam/AdamW, generalised), exactly, weight decay
included (decoupled: ``(u + lr·wd·W_t)/(1 − lr·wd)`` with ``u`` the undecayed update; see
:mod:`pipelab.predictors.rules`).

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> from pipelab.predictors.rules import rule_for
    >>> rule_for(torch.optim.AdamW([w])).name
    'Adam'

References: Kingma & Ba, "Adam" (ICLR 2015); Loshchilov & Hutter, "Decoupled Weight Decay
Regularization" (ICLR 2019); Dozat, "Incorporating Nesterov Momentum into Adam" (2016); Liu et al.,
"On the Variance of the Adaptive Learning Rate and Beyond" (RAdam, ICLR 2020); PipeOptim Table I
(Guan et al., arXiv:2312.00839).
"""

from __future__ import annotations

from typing import Any

import torch

from .rules import (BucketState, LastUpdateOptions, UpdateRule, denominator, fadd, faddcdiv, flerp, fmaximum, fmul,
                    keep_fraction, register_rule, scalar)

__all__ = ["AdamRule", "NAdamRule", "RAdamRule", "AdamaxRule"]


def _zeros(W):
    return [torch.zeros_like(w) for w in W]


class _AdamLike(UpdateRule):
    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        b1, b2 = group["betas"]
        hp["beta1"], hp["beta2"] = scalar(b1), scalar(b2)
        hp["eps"] = scalar(group["eps"])
        hp["decoupled_weight_decay"] = bool(group.get("decoupled_weight_decay", False))
        return hp

    def _decay(self, hp, lr, W, g, own_weights):
        """Weight decay as torch.optim applies it: decoupled shrinks W, coupled adds wd·W to g.

        Returns ``(W, g, owned)``: ``owned`` tells whether ``W`` may now be updated in place.
        """
        if hp["weight_decay"] != 0 and hp["decoupled_weight_decay"]:
            W = fmul(W, 1 - lr * hp["weight_decay"], own_weights)
            return W, self.effective_grad(hp, W, g, coupled_decay=False), True
        return W, self.effective_grad(hp, W, g), own_weights

    @staticmethod
    def _decoupled(hp, opts: LastUpdateOptions) -> float:
        """The decoupled decay rate the last update is rebuilt with (0 for coupled decay or without it)."""
        return opts.decay(hp) if hp["decoupled_weight_decay"] else 0.0

    @classmethod
    def _add_decoupled(cls, hp, lr, d, W, opts: LastUpdateOptions):
        """``(d + c·W_t)/(1 − c)``, ``c = lr·wd``: the exact last update from the undecayed one ``d`` (in place).

        From ``W_t = (1 − c)·W_{t−1} − d``; ``W`` holds ``W_t``.
        """
        wd = cls._decoupled(hp, opts)
        if wd != 0:
            c = lr * wd
            keep = keep_fraction(c)
            torch._foreach_add_(d, W, alpha=c)
            torch._foreach_mul_(d, 1.0 / keep)
        return d


class AdamRule(_AdamLike):
    """Adam / AdamW (``decoupled_weight_decay``), with amsgrad.

    ``t ← t+1``; ``m ← lerp(m, g, 1−β1)``; ``v ← β2·v + (1−β2)·g²``;
    ``W ← W − lr/(1−β1^t) · m / (sqrt(v̂) + eps)`` with ``v̂ = v/(1−β2^t)`` (``max`` of v over time with
    amsgrad); AdamW first shrinks ``W ← (1 − lr·wd)·W``. Last update (Table I):
    ``u = lr·m̂_t/(sqrt(v̂_t) + eps)``; for AdamW (when ``weight_decay``) ``(u + lr·wd·W_t)/(1 − lr·wd)``,
    which is ``W_{t−1} − W_t`` exactly (``W_{t−1} = (W_t + u)/(1 − lr·wd)``).
    """

    name = "Adam"
    optimizer_types = (torch.optim.Adam, torch.optim.AdamW)
    options = ("amsgrad",)

    def hyper(self, group):
        hp = super().hyper(group)
        hp["amsgrad"] = bool(group.get("amsgrad", False))
        return hp

    def state_keys(self, hp):
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if hp["amsgrad"] else ("exp_avg", "exp_avg_sq")

    def init_state(self, hp, p):
        st = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        if hp["amsgrad"]:
            st["max_exp_avg_sq"] = torch.zeros_like(p)
        return st

    def step(self, hp, lr, st, W, g, *, own_state=False, own_weights=False):
        step = st.step + 1
        b1, b2 = hp["beta1"], hp["beta2"]
        W, g, own_weights = self._decay(hp, lr, W, g, own_weights)
        m = flerp(st.tensors["exp_avg"], g, 1 - b1, own_state)
        v = fmul(st.tensors["exp_avg_sq"], b2, own_state)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
        new = {"exp_avg": m, "exp_avg_sq": v}
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        if hp["amsgrad"]:
            vmax = fmaximum(st.tensors["max_exp_avg_sq"], v, own_state)
            new["max_exp_avg_sq"] = vmax
            den = torch._foreach_sqrt(vmax)
        else:
            den = torch._foreach_sqrt(v)
        torch._foreach_div_(den, bc2 ** 0.5)
        torch._foreach_add_(den, hp["eps"])
        return faddcdiv(W, m, den, -(lr / bc1), own_weights), BucketState(step, new)

    def apply_last(self, hp, lr, st, W, g, opts, scale, *, current=None):
        if st.step == 0:
            return [w.clone() for w in W]
        tau = opts.step_for_bias(st.step)
        b1, b2 = hp["beta1"], hp["beta2"]
        v = st.tensors["max_exp_avg_sq"] if hp["amsgrad"] else st.tensors["exp_avg_sq"]
        eps = hp["eps"] if opts.eps is None else opts.eps
        den = denominator(v, 1 - b2 ** tau, eps, opts.eps_placement)
        wd = self._decoupled(hp, opts)
        if wd != 0:  # W − scale·(u + c·W_t)/(1 − c), c = lr·wd
            c = lr * wd
            q = scale / keep_fraction(c)
            out = torch._foreach_mul(W, 1 - q * c) if current is None else torch._foreach_add(W, current, alpha=-q * c)
            torch._foreach_addcdiv_(out, st.tensors["exp_avg"], den, value=-q * lr / (1 - b1 ** tau))
            return out
        return torch._foreach_addcdiv(W, st.tensors["exp_avg"], den, value=-scale * lr / (1 - b1 ** tau))

    def last_update(self, hp, lr, st, W, g, opts):
        if st.step == 0:
            return _zeros(W)
        tau = opts.step_for_bias(st.step)
        b1, b2 = hp["beta1"], hp["beta2"]
        v = st.tensors["max_exp_avg_sq"] if hp["amsgrad"] else st.tensors["exp_avg_sq"]
        eps = hp["eps"] if opts.eps is None else opts.eps
        d = torch._foreach_div(st.tensors["exp_avg"], denominator(v, 1 - b2 ** tau, eps, opts.eps_placement))
        torch._foreach_mul_(d, lr / (1 - b1 ** tau))
        return self._add_decoupled(hp, lr, d, W, opts)


class NAdamRule(_AdamLike):
    """NAdam with momentum decay ψ (``torch.optim.NAdam``).

    ``μ_t = β1·(1 − ½·0.96^{tψ})``, ``Π_t = Π_{t−1}·μ_t`` (state ``mu_product``);
    ``W ← W − lr·(1−μ_t)/(1−Π_t)·g/den − lr·μ_{t+1}/(1−Π_t·μ_{t+1})·m/den``,
    ``den = sqrt(v/(1−β2^t)) + eps``. The last update needs the last gradient ``g_t``; with coupled decay
    (``g = ±g_t + wd·W_{t−1}``) it is ``(a·(±g_t + wd·W_t) + b·m)/(den − a·wd)`` with
    ``a = lr·(1−μ_t)/(1−Π_t)``, ``b = lr·μ_{t+1}/(1−Π_t·μ_{t+1})``: exactly ``W_{t−1} − W_t``.
    """

    name = "NAdam"
    optimizer_types = (torch.optim.NAdam,)

    def hyper(self, group):
        hp = super().hyper(group)
        hp["momentum_decay"] = scalar(group["momentum_decay"])
        return hp

    def bucket_key(self, state):
        if not state or "step" not in state:
            return (0.0, 1.0)
        return (scalar(state["step"]), scalar(state["mu_product"]))

    def state_keys(self, hp):
        return ("exp_avg", "exp_avg_sq")

    def read_scalars(self, states):
        return {"mu_product": states[0]["mu_product"]}

    def init_state(self, hp, p):
        return {"step": torch.tensor(0.0), "mu_product": torch.tensor(1.0),
                "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    @staticmethod
    def _mu(hp, step):
        return hp["beta1"] * (1.0 - 0.5 * (0.96 ** (step * hp["momentum_decay"])))

    def step(self, hp, lr, st, W, g, *, own_state=False, own_weights=False):
        step = st.step + 1
        b1, b2 = hp["beta1"], hp["beta2"]
        bc2 = 1 - b2 ** step
        W, g, own_weights = self._decay(hp, lr, W, g, own_weights)
        mu, mu_next = self._mu(hp, step), self._mu(hp, step + 1)
        mp_t = st.scalars["mu_product"] * mu  # a tensor, in the state's dtype, as torch.optim computes it
        mp = float(mp_t.item())
        m = flerp(st.tensors["exp_avg"], g, 1 - b1, own_state)
        v = fmul(st.tensors["exp_avg_sq"], b2, own_state)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
        den = torch._foreach_div(v, bc2)
        torch._foreach_sqrt_(den)
        torch._foreach_add_(den, hp["eps"])
        mp_next = mp * mu_next
        W = faddcdiv(W, g, den, (-lr * (1.0 - mu) / (1.0 - mp)), own_weights)
        torch._foreach_addcdiv_(W, m, den, value=(-lr * mu_next) / (1.0 - mp_next))
        return W, BucketState(step, {"exp_avg": m, "exp_avg_sq": v}, {"mu_product": mp_t})

    def last_update(self, hp, lr, st, W, g, opts):
        if st.step == 0:
            return _zeros(W)
        if g is None:
            raise ValueError("the last update of NAdam needs the last gradient (p.grad); "
                             "predict before optimizer.zero_grad()")
        tau = opts.step_for_bias(st.step)
        mp = scalar(st.scalars["mu_product"])
        mu = self._mu(hp, tau)
        if tau != st.step:
            mp *= mu
        mu_next = self._mu(hp, tau + 1)
        eps = hp["eps"] if opts.eps is None else opts.eps
        den = denominator(st.tensors["exp_avg_sq"], 1 - hp["beta2"] ** tau, eps, opts.eps_placement)
        a, b = lr * (1.0 - mu) / (1.0 - mp), lr * mu_next / (1.0 - mp * mu_next)
        coupled = not hp["decoupled_weight_decay"]
        wd = opts.decay(hp)
        if coupled and wd != 0:  # W_t = W_{t−1} − a·(g + wd·W_{t−1})/den − b·m/den, solved for W_{t−1}
            torch._foreach_sub_(den, a * wd)
        d = torch._foreach_mul(self.effective_grad(dict(hp, weight_decay=wd), W, g, coupled_decay=coupled), a)
        torch._foreach_add_(d, st.tensors["exp_avg"], alpha=b)
        torch._foreach_div_(d, den)
        return self._add_decoupled(hp, lr, d, W, opts)


class RAdamRule(_AdamLike):
    """RAdam with the variance rectification ``r_t`` (``torch.optim.RAdam``).

    ``ρ_∞ = 2/(1−β2) − 1``, ``ρ_t = ρ_∞ − 2tβ2^t/(1−β2^t)``; if ``ρ_t > 5``:
    ``W ← W − lr·m̂·r_t·sqrt(1−β2^t)/(sqrt(v) + eps)`` with
    ``r_t = sqrt((ρ_t−4)(ρ_t−2)ρ_∞ / ((ρ_∞−4)(ρ_∞−2)ρ_t))``, else ``W ← W − lr·m̂`` (SGD with momentum).
    Note RAdam adds eps to ``sqrt(v)``, not to ``sqrt(v̂)``; ``eps_placement="outside"`` keeps that.
    """

    name = "RAdam"
    optimizer_types = (torch.optim.RAdam,)

    def state_keys(self, hp):
        return ("exp_avg", "exp_avg_sq")

    def init_state(self, hp, p):
        return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    @staticmethod
    def _rho(b2, step, bc2):
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * step * (b2 ** step) / bc2
        rect = None
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        return rect

    def step(self, hp, lr, st, W, g, *, own_state=False, own_weights=False):
        step = st.step + 1
        b1, b2 = hp["beta1"], hp["beta2"]
        W, g, own_weights = self._decay(hp, lr, W, g, own_weights)
        m = flerp(st.tensors["exp_avg"], g, 1 - b1, own_state)
        v = fmul(st.tensors["exp_avg_sq"], b2, own_state)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        upd = torch._foreach_mul(torch._foreach_div(m, bc1), lr)
        rect = self._rho(b2, step, bc2)
        if rect is not None:
            sq = torch._foreach_sqrt(v)
            torch._foreach_add_(sq, hp["eps"])
            torch._foreach_mul_(upd, [(bc2 ** 0.5) / x for x in sq])
            torch._foreach_mul_(upd, rect)
        return fadd(W, upd, -1.0, own_weights), BucketState(step, {"exp_avg": m, "exp_avg_sq": v})

    def last_update(self, hp, lr, st, W, g, opts):
        if st.step == 0:
            return _zeros(W)
        tau = opts.step_for_bias(st.step)
        b1, b2 = hp["beta1"], hp["beta2"]
        bc1, bc2 = 1 - b1 ** tau, 1 - b2 ** tau
        d = torch._foreach_mul(st.tensors["exp_avg"], lr / bc1)
        rect = self._rho(b2, tau, bc2)
        if rect is not None:
            eps = hp["eps"] if opts.eps is None else opts.eps
            if opts.eps_placement == "outside":   # RAdam's own form: sqrt(1−β2^t)/(sqrt(v) + eps)
                den = denominator(st.tensors["exp_avg_sq"], 1.0, eps, "outside")
                torch._foreach_div_(den, bc2 ** 0.5)
            else:
                den = denominator(st.tensors["exp_avg_sq"], bc2, eps, "inside")
            d = torch._foreach_div(d, den)
            torch._foreach_mul_(d, rect)
        return self._add_decoupled(hp, lr, d, W, opts)


class AdamaxRule(_AdamLike):
    """Adamax (infinity norm) (``torch.optim.Adamax``).

    ``m ← lerp(m, g, 1−β1)``; ``u ← max(β2·u, |g| + eps)``; ``W ← W − lr/(1−β1^t)·m/u``.
    Last update: ``lr/(1−β1^t)·m_t/u_t`` (the eps options do not apply: eps sits inside the max).
    """

    name = "Adamax"
    optimizer_types = (torch.optim.Adamax,)

    def state_keys(self, hp):
        return ("exp_avg", "exp_inf")

    def init_state(self, hp, p):
        return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_inf": torch.zeros_like(p)}

    def step(self, hp, lr, st, W, g, *, own_state=False, own_weights=False):
        step = st.step + 1
        b1, b2 = hp["beta1"], hp["beta2"]
        g = self.effective_grad(hp, W, g)
        m = flerp(st.tensors["exp_avg"], g, 1 - b1, own_state)
        u = fmul(st.tensors["exp_inf"], b2, own_state)
        a = torch._foreach_abs(g)
        torch._foreach_add_(a, hp["eps"])
        torch._foreach_maximum_(u, a)
        clr = lr / (1 - b1 ** step)
        return faddcdiv(W, m, u, -clr, own_weights), BucketState(step, {"exp_avg": m, "exp_inf": u})

    def apply_last(self, hp, lr, st, W, g, opts, scale, *, current=None):
        if st.step == 0:
            return [w.clone() for w in W]
        clr = lr / (1 - hp["beta1"] ** opts.step_for_bias(st.step))
        return torch._foreach_addcdiv(W, st.tensors["exp_avg"], st.tensors["exp_inf"], value=-scale * clr)

    def last_update(self, hp, lr, st, W, g, opts):
        if st.step == 0:
            return _zeros(W)
        tau = opts.step_for_bias(st.step)
        d = torch._foreach_div(st.tensors["exp_avg"], st.tensors["exp_inf"])
        torch._foreach_mul_(d, lr / (1 - hp["beta1"] ** tau))
        return d


register_rule(AdamRule())
register_rule(NAdamRule())
register_rule(RAdamRule())
register_rule(AdamaxRule())
