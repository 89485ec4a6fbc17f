"""Weight predictors derived from ``torch.optim``: predict the weights a stage will have ``s`` updates ahead.

The optimizer-specific part ("what update would this optimizer apply?") lives in one
:class:`~pipelab.predictors.rules.UpdateRule` per family (SGD, Adam/AdamW, RMSprop, Adagrad, NAdam, RAdam,
Adamax, Muon), shared by ``pipeoptim``, ``repeat`` and ``zero_grad_rollout``.
"""

from __future__ import annotations

from . import rules_adam as _rules_adam  # noqa: F401  (registers the Adam-family rules)
from . import rules_muon as _rules_muon  # noqa: F401  (registers Muon)
from .base import LRSchedule, Predictor, check_steps
from .history import HistoryPredictor, LinearExtrapolation, PipeMare
from .optimizer_based import PipeOptim, Repeat, Rollout, SpecTrain, Stale, ZeroGradRollout
from .presets import PREDICTORS, PredictorPreset, available_predictors, describe_predictors, make_predictor
from .rules import LastUpdateOptions, UpdateRule, rule_for, supported_optimizers

__all__ = [
    "Predictor", "LRSchedule", "check_steps",
    "Stale", "SpecTrain", "PipeOptim", "Rollout", "Repeat", "ZeroGradRollout",
    "HistoryPredictor", "LinearExtrapolation", "PipeMare",
    "PREDICTORS", "PredictorPreset", "available_predictors", "make_predictor", "describe_predictors",
    "UpdateRule", "LastUpdateOptions", "rule_for", "supported_optimizers",
]
