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
  a worker's program. A split backward's I returns the input gradient and keeps the stage's graph; its
  W adds the weight gradient from that graph later, so the backward's weights are decided at I.
  Split-backward builders: :func:`zb_h1`, :func:`zb_h2`, :func:`zb_async` (no flush), :func:`zb_v`,
  :func:`v_half`, :func:`v_min` (V-shape placement, stage s on worker min(s, 2W−1−s)),
  :func:`interleaved_zero_bubble`, :func:`dualpipe_v`, :func:`dualpipe`; their papers' numbers:
  :mod:`pipelab.zero_bubble_tables`.
- **version** W_k^(v): stage k's weights after v updates. A job *uses* one version; its **update
  version** is the version U(k, t) applies its gradient to (t when updates run in order).
- **staleness** of a job = update version − version used (0: the gradient is applied to the weights it
  was computed with).
- **version table** (:class:`VersionTable`): for every job, the version current when it ran and the
  update version, derived from a (simulated) schedule, never from rank arithmetic.
- **schedule** (:class:`Schedule`): for every **worker** w (a process / device), its **program**, the
  ordered list of actions it executes, plus which workers hold each stage's weights.
- **placement** (:mod:`pipelab.pipeline.placement`): per stage, its compute workers C_k, holders H_k and
  kind (single, replicated: DDP/LPP/DualPipe/:func:`hybrid`, sharded: FSDP/FSLPP) and the collectives of a
  step (all-reduce, broadcast, reduce), executed by the emulator and the runtime.
- **policy** (:mod:`pipelab.policies`): which version (stored or predicted) each F and B job uses, given
  the version table: stashing, vertical sync, 2BW, SpecTrain, PipeOptim, PipeMare, Nesterov for asynchronous
  PP, error feedback and DC-ASGD (the last two correct the gradient before the optimizer step), ...
- **predictor** (:mod:`pipelab.predictors`): a pure function of (weights, optimizer state, learning rate,
  s) estimating W^(v+s) from W^(v) with the user's ``torch.optim`` rule, never mutating the optimizer.

Conventions: seeds and devices are explicit arguments; divergence (a NaN/inf loss, evaluated output or weight)
is a result, recorded and plotted, not an exception; bad input raises ``ValueError``/``TypeError`` naming the
argument.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from . import predictors, schedules, stability
from .cache import ResultCache, cached, run_sweep
from .config import PRESETS, config_hash, config_to_dict, from_preset, resolve_preset
from .data import (
    DataError,
    Dataset,
    fetch_fashion_mnist,
    find_fashion_mnist,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_mnist1d,
    load_wordlang,
    teacher_student_classification,
    teacher_student_regression,
)
from .distributed import RankFailure, spawn
from .emulator import DeadlockError, Emulator, EmulatorResult, build_pipeline, evaluate, train_plain
from .learning_curves import RunConfig, prepare
from .learning_curves import run as run_arm
from .learning_curves import sweep as sweep_arms
from .models import build_model, deep_mlp, small_cnn, small_resnet, transformer_classifier
from .optim import OPTIMIZERS, OptimizerSpec, available_optimizers, make_optimizer, optimizer_factory, optimizer_label
from .partition import balanced_partition, split, stage_sizes
from .pipeline import PipelineSpec
from .policies import POLICIES, GradientContext, Policy, PolicyInfo, available_policies, make_policy, policy_info
from .precision import LossScaling, Precision, check_precision
from .prediction_error import (
    InPipelineConfig,
    InPipelineResult,
    PredictionErrorConfig,
    PredictionErrorResult,
    measure_in_pipeline,
    measure_prediction_error,
    run_in_pipeline,
    run_prediction_error,
)
from .predictors import (
    PREDICTORS,
    Predictor,
    available_predictors,
    describe_predictors,
    make_predictor,
    supported_optimizers,
)
from .profiling import StageProfile, profile_stages
from .runtime import PipelineRuntime, RuntimeResult, consistent_cut, load_checkpoint, save_checkpoint
from .schedules import (
    Action,
    Schedule,
    ScheduleError,
    VersionTable,
    async_1f1b_staleness,
    construct,
    ddp,
    dualpipe,
    dualpipe_v,
    folded,
    format_grid,
    from_torch,
    from_torch_csv,
    fsdp,
    fslpp,
    gpipe,
    hybrid,
    interleaved_1f1b,
    interleaved_zero_bubble,
    lpp,
    naive,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
    pipeoptim_staleness,
    spectrain_version_difference,
    to_torch,
    to_torch_csv,
    v_half,
    v_min,
    validate,
    zb_async,
    zb_h1,
    zb_h2,
    zb_v,
)
from .simulator import SimResult, costs_from_profile, simulate
from .stability import (
    delayed_gd_threshold,
    lr_threshold,
    max_stable_step,
    region_area,
    region_mask,
    spectral_radius,
    stable_mask,
    top_eigenvalue,
)
from .stability.practice import delayed_training, least_squares_problem, max_stable_lr, pipeline_training
from .statistics import paired_difference, resolved_winner, t_interval, winner_test
from .threads import torch_threads
from .tuning import Halving, halving_schedule, lr_grid, selected_configs, successive_halving
from .zero_bubble_tables import steady_state, v_shape_table, zero_bubble_table


def __getattr__(name: str) -> Any:
    """``pipelab.train_distributed``, imported on first use: :mod:`pipelab.run` is the module that
    ``torchrun -m pipelab.run`` executes, and importing it with the package would make Python warn
    that it was found in ``sys.modules`` before execution."""
    if name == "train_distributed":
        from .run import train_distributed

        return train_distributed
    raise AttributeError(f"module 'pipelab' has no attribute {name!r}")


__all__ = [
    "__version__",
    # experiment plumbing
    "PRESETS", "resolve_preset", "from_preset", "config_to_dict", "config_hash",
    "ResultCache", "cached", "run_sweep",
    # data
    "Dataset", "DataError", "load_dataset", "load_fashion_mnist", "load_digits", "load_mnist1d",
    "teacher_student_regression", "teacher_student_classification", "find_fashion_mnist", "fetch_fashion_mnist",
    "load_wordlang",
    # models and stages
    "build_model", "deep_mlp", "small_cnn", "small_resnet", "transformer_classifier",
    "split", "stage_sizes", "balanced_partition",
    # schedules and the simulator
    "schedules", "Action", "Schedule", "ScheduleError", "construct", "validate", "format_grid",
    "naive", "gpipe", "one_f_one_b", "pipedream", "pipedream_2bw", "interleaved_1f1b", "folded", "ddp", "fsdp",
    "lpp", "fslpp", "hybrid", "zb_h1", "zb_h2", "zb_async", "zero_bubble_table", "steady_state",
    "simulate", "SimResult", "costs_from_profile", "VersionTable",
    "zb_v", "v_half", "v_min", "interleaved_zero_bubble", "dualpipe_v", "dualpipe", "v_shape_table",
    "profile_stages", "StageProfile", "torch_threads",
    "pipeoptim_staleness", "spectrain_version_difference", "async_1f1b_staleness",
    "from_torch", "from_torch_csv", "to_torch", "to_torch_csv",
    # the optimizer registry
    "OPTIMIZERS", "OptimizerSpec", "available_optimizers", "make_optimizer", "optimizer_factory", "optimizer_label",
    # predictors and prediction error
    "predictors", "Predictor", "make_predictor", "available_predictors", "describe_predictors", "PREDICTORS",
    "supported_optimizers", "measure_prediction_error", "run_prediction_error", "PredictionErrorConfig",
    "PredictionErrorResult", "measure_in_pipeline", "run_in_pipeline", "InPipelineConfig", "InPipelineResult",
    # policies, the emulator and learning curves
    "Policy", "POLICIES", "make_policy", "available_policies", "policy_info", "PolicyInfo", "GradientContext",
    "Precision", "LossScaling", "check_precision",
    "PipelineSpec", "Emulator", "EmulatorResult", "DeadlockError", "build_pipeline", "train_plain", "evaluate",
    "RunConfig", "prepare", "run_arm", "sweep_arms",
    "lr_grid", "halving_schedule", "successive_halving", "selected_configs", "Halving",
    # the multi-process runtime
    "PipelineRuntime", "RuntimeResult", "consistent_cut", "save_checkpoint", "load_checkpoint", "train_distributed",
    "spawn", "RankFailure",
    # stability of stale-gradient methods
    "stability", "max_stable_step", "stable_mask", "region_mask", "spectral_radius", "delayed_gd_threshold",
    "delayed_training", "pipeline_training", "max_stable_lr", "least_squares_problem",
    "region_area", "top_eigenvalue", "lr_threshold",
    # statistics across seeds
    "t_interval", "paired_difference", "winner_test", "resolved_winner",
]
