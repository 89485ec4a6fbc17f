"""pipelab: pipeline-parallel training and the weight staleness it causes.

Schedules as data with a simulator and version tables, weight-staleness policies and predictors derived
from ``torch.optim``, an exact single-process emulator and a ``torch.distributed`` runtime, and the
analyses (prediction error, stability, learning curves) behind the notebooks and figures.
"""

from __future__ import annotations

__version__ = "0.1.0"

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
    teacher_student_classification,
    teacher_student_regression,
)
from .models import build_model, deep_mlp, small_cnn, small_resnet, transformer_classifier
from .partition import balanced_partition, split, stage_sizes
from . import schedules, stability
from .schedules import (
    Action,
    Schedule,
    ScheduleError,
    VersionTable,
    async_1f1b_staleness,
    construct,
    ddp,
    folded,
    format_grid,
    fsdp,
    gpipe,
    interleaved_1f1b,
    lpp,
    fslpp,
    naive,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
    pipeoptim_staleness,
    spectrain_version_difference,
    validate,
)
from .simulator import SimResult, costs_from_profile, simulate
from .stability import delayed_gd_threshold, max_stable_step, region_mask, spectral_radius, stable_mask
from .stability.practice import delayed_training, least_squares_problem, max_stable_lr

__all__ = [
    "__version__",
    # experiment plumbing
    "PRESETS", "resolve_preset", "from_preset", "config_to_dict", "config_hash",
    "ResultCache", "cached", "run_sweep",
    # data
    "Dataset", "DataError", "load_dataset", "load_fashion_mnist", "load_digits", "load_mnist1d",
    "teacher_student_regression", "teacher_student_classification", "find_fashion_mnist", "fetch_fashion_mnist",
    # models and stages
    "build_model", "deep_mlp", "small_cnn", "small_resnet", "transformer_classifier",
    "split", "stage_sizes", "balanced_partition",
    # schedules and the simulator
    "schedules", "Action", "Schedule", "ScheduleError", "construct", "validate", "format_grid",
    "naive", "gpipe", "one_f_one_b", "pipedream", "pipedream_2bw", "interleaved_1f1b", "folded", "ddp", "fsdp",
    "lpp", "fslpp", "simulate", "SimResult", "costs_from_profile", "VersionTable",
    "pipeoptim_staleness", "spectrain_version_difference", "async_1f1b_staleness",
    # stability of stale-gradient methods
    "stability", "max_stable_step", "stable_mask", "region_mask", "spectral_radius", "delayed_gd_threshold",
    "delayed_training", "max_stable_lr", "least_squares_problem",
]
