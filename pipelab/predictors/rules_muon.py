"""The update rule of Muon (``torch.optim.Muon``): momentum orthogonalised by a Newton–Schulz iteration.

See :mod:`pipelab.predictors.rules` for the interface. For each 2-D parameter ``W`` (shape ``A×B``) with
gradient ``g``, momentum ``μ``, learning rate ``lr`` and decoupled weight decay ``λ``, one step is

    ``B ← lerp(B, g, 1 − μ)``  (``= μ·B + (1 − μ)·g``)
    ``M = lerp(g, B, μ)`` (Nesterov) or ``M = B``
    ``O = NS_k^{(a,b,c)}(M; eps)``
    ``W ← (1 − lr·λ)·W − lr·r(A, B)·O``

with ``NS`` the quintic Newton–Schulz iteration (:func:`newton_schulz`, computed in bfloat16 as torch
does) and ``r`` the learning-rate adjustment (:func:`lr_ratio`): ``sqrt(max(1, A/B))`` ("original", the
default) or ``0.2·sqrt(max(A, B))`` ("match_rms_adamw").

Fit to :class:`~pipelab.predictors.rules.Direction`: the direction is not element-wise, but it is one
tensor per parameter, ``n = r(A, B)·O``, times the shared scalar ``lr``, so ``direction`` returns
``Direction(lr, [(1, n)])`` and the base class derives ``step``, ``last_update`` and ``apply_last``
unchanged (no extension of the base class was needed). The only difference from torch's arithmetic is
where the factor ``r`` is rounded: torch forms ``(lr·r)·O``, the rule ``lr·(r·O)`` (at most one float
rounding per step and never for ``r = 1``); the momentum buffer and the bfloat16 iteration are bit-identical,
so a rolled-out step agrees with a real one to float64 rounding. The last update
``W_{t−1} − W_t = (lr·r·O_t + lr·λ·W_t)/(1 − lr·λ)`` is exact; with Nesterov it needs the last gradient.
``LastUpdateOptions``' ``eps``/``eps_placement``/``bias_step`` do not apply (no denominator, no bias
correction); its ``weight_decay`` does.

Example:
    >>> import torch
    >>> from pipelab.predictors.rules import rule_for
    >>> w = torch.nn.Parameter(torch.ones(2, 3))
    >>> rule_for(torch.optim.Muon([w])).name
    'Muon'

References: Jordan et al., "Muon: An optimizer for hidden layers in neural networks" (2024,
https://kellerjordan.github.io/posts/muon/); Liu et al., "Muon is Scalable for LLM Training"
(arXiv:2502.16982, the "match_rms_adamw" adjustment); PyTorch ``torch.optim.Muon`` (2.9+).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .rules import BucketState, Direction, LastUpdateOptions, UpdateRule, register_rule, scalar

__all__ = ["MuonRule", "newton_schulz", "lr_ratio", "ADJUST_LR_FNS"]

#: the values of ``adjust_lr_fn`` ``torch.optim.Muon`` accepts (``None`` means ``"original"``).
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def newton_schulz(m: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """The quintic Newton–Schulz orthogonalisation of a 2-D ``m``, in bfloat16, as ``torch.optim.Muon`` forms it.

    ``X ← bf16(m)`` (transposed when ``m`` is tall, so that ``X·Xᵀ`` is the smaller Gram matrix),
    ``X ← X / max(‖X‖_F, eps)``, then ``steps`` times ``G = X·Xᵀ``, ``X ← a·X + (b·G + c·G²)·X``; the result
    (bfloat16, transposed back) approximates ``U·Vᵀ`` of the SVD ``m = U·S·Vᵀ`` (singular values roughly in
    ``[0.5, 1.5]``). Reference: Jordan et al. (2024), coefficients ``(3.4445, −4.7750, 2.0315)``.
    """
    a, b, c = coefficients
    tall = m.size(0) > m.size(1)
    x = m.to(torch.bfloat16, copy=True)  # a copy also for bfloat16 ``m``: the optimizer's buffer stays untouched
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def lr_ratio(adjust_lr_fn: str | None, shape: Sequence[int]) -> float:
    """Muon's learning-rate factor ``r`` for an ``A×B`` parameter.

    ``sqrt(max(1, A/B))`` for ``"original"`` / ``None`` (Jordan et al.), ``0.2·sqrt(max(A, B))`` for
    ``"match_rms_adamw"`` (Liu et al., arXiv:2502.16982, matching AdamW's update RMS).
    """
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r}; choose one of {', '.join(map(repr, ADJUST_LR_FNS))}")


class MuonRule(UpdateRule):
    """Muon (``torch.optim.Muon``): Nesterov or heavy-ball momentum, orthogonalised, decoupled weight decay.

    ``B ← lerp(B, g, 1−μ)``; ``U = lr·r(A, B)·NS(lerp(g, B, μ))`` (Nesterov) or ``lr·r(A, B)·NS(B)``;
    ``W ← (1 − lr·λ)·W − U``. The last update is ``(U_t + lr·λ·W_t)/(1 − lr·λ)`` (exact); with Nesterov it
    needs the last gradient. Only 2-D parameters (as torch): others raise ValueError. See the module
    docstring for the formulas and references.
    """

    name = "Muon"
    optimizer_types = (torch.optim.Muon,)
    options = ("momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn")

    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError(f"Muon updates only 2-D parameters (as torch.optim.Muon), got a parameter of "
                                 f"shape {tuple(p.shape)}; optimize it with another optimizer (e.g. AdamW)")
        hp["momentum"] = scalar(hp["momentum"])
        hp["nesterov"] = bool(hp["nesterov"])
        hp["eps"] = scalar(hp["eps"])
        coeffs = tuple(hp["ns_coefficients"])
        if len(coeffs) != 3 or not all(isinstance(x, numbers.Real) for x in coeffs):
            raise ValueError(f"ns_coefficients must be three numbers (a, b, c), got {hp['ns_coefficients']!r}")
        hp["ns_coefficients"] = tuple(float(x) for x in coeffs)
        steps = hp["ns_steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps < 100:
            raise ValueError(f"ns_steps must be an integer in [0, 100), got {steps!r}")
        if hp["adjust_lr_fn"] not in ADJUST_LR_FNS:
            raise ValueError(f"adjust_lr_fn={hp['adjust_lr_fn']!r}; choose one of "
                             f"{', '.join(map(repr, ADJUST_LR_FNS))}")
        hp["decoupled_weight_decay"] = True  # torch: W ← (1 − lr·λ)·W before the update
        return hp

    def bucket_key(self, state: dict[str, Any] | None) -> tuple:
        return (state is not None and state.get("momentum_buffer") is not None,)

    def init_state(self, hp: dict[str, Any], p: Tensor) -> dict[str, Any]:
        return {"momentum_buffer": None}  # torch creates zeros at the first step: advance() does

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",)

    def needs_grad_for(self, hp: dict[str, Any]) -> str:
        return "Muon with nesterov=True"

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        keep = 1 - hp["momentum"]
        bufs: list[Tensor] = []
        for b, x in zip(st.present("momentum_buffer"), g):
            b = torch.zeros_like(x) if b is None else (b if own else b.clone())
            bufs.append(b.lerp_(x, keep))
        return BucketState(st.step + 1, {"momentum_buffer": bufs})

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        bufs = st.present("momentum_buffer")
        if any(b is None for b in bufs):
            return None  # no step yet: no update
        have: list[Tensor] = [b for b in bufs if b is not None]
        mu = hp["momentum"]
        ms = [x.lerp(b, mu) for x, b in zip(grad(), have)] if hp["nesterov"] else have
        n = []
        for m in ms:
            o = newton_schulz(m, hp["ns_coefficients"], hp["ns_steps"], hp["eps"]).to(m.dtype)
            r = lr_ratio(hp["adjust_lr_fn"], m.shape)
            n.append(o if r == 1.0 else o.mul_(r))
        return Direction(lr, [(1.0, n)])


register_rule(MuonRule())
