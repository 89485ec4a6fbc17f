"""The update rule of Muon (``torch.optim.Muon``): momentum orthogonalised by a Newton–Schulz iteration.

For a 2-D ``W`` (``A×B``): ``B ← lerp(B, g, 1 − μ)``; ``O = NS(lerp(g, B, μ))`` (Nesterov) or ``NS(B)``;
``W ← (1 − lr·λ)·W − lr·r(A, B)·O``. One tensor per parameter, so it fits
:class:`~pipelab.predictors.rules.Direction` as ``Direction(lr, [(1, r·O)])``; torch forms ``(lr·r)·O`` and the
rule ``lr·(r·O)`` (at most one rounding apart, never for r = 1). The last update
``(lr·r·O_t + lr·λ·W_t)/(1 − lr·λ)`` is exact.

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

    ``X ← bf16(m)`` (transposed when tall: the smaller Gram matrix), ``X ← X / max(‖X‖_F, eps)``, then ``steps``
    times ``G = X·Xᵀ``, ``X ← a·X + (b·G + c·G²)·X``: ≈ ``U·Vᵀ`` of ``m = U·S·Vᵀ``. Jordan et al. (2024),
    coefficients ``(3.4445, −4.7750, 2.0315)``.
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
    """Muon's factor r: ``sqrt(max(1, A/B))`` ("original") or ``0.2·sqrt(max(A, B))`` ("match_rms_adamw")."""
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r}; choose one of {', '.join(map(repr, ADJUST_LR_FNS))}")


class MuonRule(UpdateRule):
    """Muon (``torch.optim.Muon``), as in the module docstring; only 2-D parameters (ValueError otherwise)."""

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
