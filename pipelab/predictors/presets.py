"""Named predictors, including presets that reproduce what the published implementations compute.

=====================  ===================================================================================
name                   what it computes
=====================  ===================================================================================
``stale``              ``Ŵ = W`` (baseline)
``spectrain``          SpecTrain as in the paper (Eq. 4): ``Ŵ = W − s·lr·b`` (b: SGD momentum buffer)
``spectrain_code``     SpecTrain's published code: ``Ŵ = W − s·lr·(μ·b + g_t)`` — the last gradient is
                       already inside ``b`` and is counted twice; dampening and Nesterov are ignored
``pipeoptim``          PipeOptim (Eq. 5, Table I generalised): ``Ŵ = W − s·lr·ΔW_t``, ``lr·ΔW_t`` the
                       optimizer's last update ``W_{t−1} − W_t`` rebuilt exactly from its state (own eps,
                       decay terms included, bias correction at step t)
``pipeoptim_code``     PipeOptim's published code: predicts ``s + 1`` steps (``s = D−k`` where the paper
                       says ``D−k−1``), repeats the last Adam step with bias correction at the applied
                       step t, eps = 1e-8 outside the square root, no AdamW decay term
``repeat``             ``s`` steps of torch.optim's rule with the last gradient (exact for constant g)
``zero_grad_rollout``  ``s`` steps of torch.optim's rule with zero gradient (momentum decays)
``linear``             ``Ŵ = W + s·(W_t − W_{t−1})`` (needs ``observe``)
``pipemare``           ``Ŵ = W + s·δ``, δ an EMA (γ = 0.9) of weight differences (needs ``observe``)
=====================  ===================================================================================

References: SpecTrain, Chen et al., arXiv:1809.02839; PipeOptim, Guan et al., arXiv:2312.00839;
PipeMare, Yang et al., arXiv:1910.05124.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import Predictor
from .history import LinearExtrapolation, PipeMare
from .optimizer_based import PipeOptim, Repeat, SpecTrain, Stale, ZeroGradRollout

__all__ = ["PredictorPreset", "PREDICTORS", "available_predictors", "make_predictor", "describe_predictors"]


@dataclass(frozen=True)
class PredictorPreset:
    """A registry entry: predictor class, the options it is built with, and what it reproduces."""

    cls: type[Predictor]
    options: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    reference: str = ""


PREDICTORS: dict[str, PredictorPreset] = {
    "stale": PredictorPreset(Stale, {}, "no prediction (baseline)", Stale.reference),
    "spectrain": PredictorPreset(SpecTrain, {"formula": "paper"}, "W − s·lr·b (paper, Eq. 4)", SpecTrain.reference),
    "spectrain_code": PredictorPreset(
        SpecTrain, {"formula": "code"},
        "W − s·lr·(μ·b + g): the published code; last gradient counted twice, dampening/Nesterov ignored",
        "SpecTrain's published implementation (arXiv:1809.02839 describes v = b)"),
    "pipeoptim": PredictorPreset(PipeOptim, {}, "W − s·lr·ΔW_t with ΔW_t the optimizer's last update (Table I, "
                                 "generalised)", PipeOptim.reference),
    "pipeoptim_code": PredictorPreset(
        PipeOptim, {"extra_steps": 1, "eps": 1e-8, "eps_placement": "outside", "bias_step": "t",
                    "weight_decay": False},
        "the published code: s+1 steps (D−k), last Adam step at step t, eps=1e-8 outside the root, "
        "no AdamW decay", "PipeOptim's published implementation (arXiv:2312.00839 says s = D−k−1)"),
    "repeat": PredictorPreset(Repeat, {}, "s steps of torch.optim with the last gradient", Repeat.reference),
    "zero_grad_rollout": PredictorPreset(ZeroGradRollout, {}, "s steps of torch.optim with zero gradient",
                                         ZeroGradRollout.reference),
    "linear": PredictorPreset(LinearExtrapolation, {}, "W + s·(W_t − W_{t−1})", LinearExtrapolation.reference),
    "pipemare": PredictorPreset(PipeMare, {}, "W + s·δ, δ an EMA (γ=0.9) of weight differences", PipeMare.reference),
}


def available_predictors() -> list[str]:
    """Names accepted by :func:`make_predictor`."""
    return list(PREDICTORS)


def make_predictor(name: str, **options: Any) -> Predictor:
    """Build the predictor ``name`` with its preset options, overridden by ``options``.

    Raises:
        ValueError: unknown name (the message lists them). TypeError: ``name`` neither a str nor a Predictor;
            an option the predictor does not take, or of the wrong type.
    """
    if isinstance(name, Predictor):
        if options:
            raise TypeError("options cannot be given with a predictor instance")
        return name
    if not isinstance(name, str):
        raise TypeError(f"name must be a predictor name (str; one of {', '.join(PREDICTORS)}) or a Predictor, "
                        f"got {type(name).__name__}")
    try:
        preset = PREDICTORS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown predictor {name!r}; choose one of {', '.join(PREDICTORS)}") from None
    kwargs = {**preset.options, **options}
    try:
        pred = preset.cls(**kwargs)
    except TypeError as exc:
        raise TypeError(f"predictor {name!r} ({preset.cls.__name__}): {exc}") from None
    pred.preset = name  # type: ignore[attr-defined]
    return pred


def describe_predictors() -> str:
    """A plain-text table of the registry: name, description, reference."""
    width = max(map(len, PREDICTORS))
    return "\n".join(f"{n:<{width}}  {p.description}  [{p.reference}]" for n, p in PREDICTORS.items())
