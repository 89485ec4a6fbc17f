"""pipelab: pipeline-parallel training and the weight staleness it causes.

Schedules as data with a simulator and version tables, weight-staleness policies and predictors derived
from ``torch.optim``, an exact single-process emulator and a ``torch.distributed`` runtime, and the
analyses (prediction error, stability, learning curves) behind the notebooks and figures.

Vocabulary (one name per concept, used in code, docstrings and figures):

- **D** stages, **stage k** = 0..D−1 in model order (a model cut by :func:`split`); **M** micro-batches
  per optimizer step; **step t** = 0..T−1, one mini-batch and one update per stage; **micro-batch j**
  = 0..M−1 of step t (global index g = t·M + j).
- **job** ``(op, k, t, j)``: op ``F`` (forward), ``B`` (backward; split into ``I`` input gradient and ``W``
  weight gradient in zero-bubble schedules) of stage k on micro-batch (t, j); ``(U, k, t, −1)`` is stage
  k's optimizer update with step t's gradients. :class:`Action` ``(op, stage, step, micro)`` is a job in
  a worker's program. A split backward's weights are decided at I (W reuses I's graph).
- **version** W_k^(v): stage k's weights after v updates. A job *uses* one version; its **update
  version** is the version U(k, t) applies its gradient to (t when updates run in order).
- **staleness** of a job = update version − version used (0: the gradient is applied to the weights it
  was computed with).
- **version table** (:class:`VersionTable`): for every job, the version current when it ran and the
  update version, derived from a (simulated) schedule, never from rank arithmetic.
- **schedule** (:class:`Schedule`): for every **worker** w (a process / device), its **program**, the
  ordered list of actions it executes, plus which workers hold each stage's weights.
- **placement** (:mod:`pipelab.pipeline.placement`): per stage, its compute workers C_k, holders H_k and
  kind (single, replicated, sharded) and the collectives of a step.
- **policy** (:mod:`pipelab.policies`): which version (stored or predicted) each F and B job uses, given
  the version table; some also correct the gradient before the optimizer step.
- **predictor** (:mod:`pipelab.predictors`): a pure function of (weights, optimizer state, learning rate,
  s) estimating W^(v+s) from W^(v) with the user's ``torch.optim`` rule, never mutating the optimizer.

Conventions: seeds and devices are explicit arguments; divergence (a NaN/inf loss, evaluated output or weight)
is a result, recorded and plotted, not an exception; bad input raises ``ValueError``/``TypeError`` naming the
argument.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: The vocabulary, each name with the module defining it (a subpackage for itself); everything else is imported
#: from its module (``pipelab.schedules.gpipe``, ``pipelab.stability.delayed_gd``, ...). The studies (presets,
#: data, models, figures, the CLI) live in :mod:`pipelab.studies`, which the core never imports. A name's module is
#: imported when the name is first used (PEP 562), so that ``import pipelab`` alone costs nothing and ``python -m
#: pipelab --help`` answers without loading torch.
_VOCABULARY: dict[str, str] = {
    "schedules": "schedules", "predictors": "predictors", "stability": "stability",
    # schedules as data and the simulator
    **dict.fromkeys(("Action", "Schedule", "ScheduleError", "VersionTable", "construct", "validate"), "schedules"),
    "simulate": "simulator", "SimResult": "simulator",
    # policies, predictors and the optimizer registry
    "Policy": "policies", "make_policy": "policies", "available_policies": "policies",
    "Predictor": "predictors", "make_predictor": "predictors", "available_predictors": "predictors",
    "optimizer_factory": "optim",
    # running a pipeline: one process (emulator) or many (runtime)
    "PipelineSpec": "pipeline", "Emulator": "emulator", "EmulatorResult": "emulator", "train_plain": "emulator",
    **dict.fromkeys(("PipelineRuntime", "RuntimeResult", "save_checkpoint", "load_checkpoint"), "runtime"),
    "spawn": "distributed", "RankFailure": "distributed", "Precision": "precision", "LossScaling": "precision",
    # stages and their costs
    "split": "partition", "balanced_partition": "partition", "profile_stages": "profiling",
    # analyses
    "measure_prediction_error": "prediction_error", "measure_in_pipeline": "prediction_error",
    "max_stable_step": "stability", "t_interval": "statistics", "paired_difference": "statistics",
}
__all__ = ["__version__", *_VOCABULARY]

# The same names for type checkers (tests/core/test_imports.py keeps the two lists equal); ruff cannot read the
# __all__ built from the table above, hence the file's F401 exemption.
# ruff: noqa: F401
if TYPE_CHECKING:
    from . import predictors, schedules, stability
    from .distributed import RankFailure, spawn
    from .emulator import Emulator, EmulatorResult, train_plain
    from .optim import optimizer_factory
    from .partition import balanced_partition, split
    from .pipeline import PipelineSpec
    from .policies import Policy, available_policies, make_policy
    from .precision import LossScaling, Precision
    from .prediction_error import measure_in_pipeline, measure_prediction_error
    from .predictors import Predictor, available_predictors, make_predictor
    from .profiling import profile_stages
    from .runtime import PipelineRuntime, RuntimeResult, load_checkpoint, save_checkpoint
    from .schedules import Action, Schedule, ScheduleError, VersionTable, construct, validate
    from .simulator import SimResult, simulate
    from .stability import max_stable_step
    from .statistics import paired_difference, t_interval


def __getattr__(name: str) -> Any:
    """Import the module of a vocabulary name on first use, and keep the name."""
    module_name = _VOCABULARY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{module_name}", __name__)
    value = module if name == module_name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
