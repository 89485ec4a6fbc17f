"""Every study setting in one place: tasks, optimizer overrides, learning-rate and tuning grids, policy ↔ schedule arms.

The learning-curve runner, the prediction-error and calibration studies and every figure module read their
settings here and keep no copy; a figure's preset (its sizes, epochs, seeds) stays with the figure.

- **Tasks** (:data:`TASKS`): dataset and reference model of every learning-curve task.
- **Optimizer overrides**: where a study departs from the registry's defaults (:data:`pipelab.optim.OPTIMIZERS`):
  :data:`ARM_OPTIMIZER_SETTINGS` (the learning curves), :data:`PREDICTION_OPTIMIZER_SETTINGS` (prediction error
  along plain training), :data:`IN_PIPELINE_LRS` (prediction error inside the pipeline), :data:`MODERN_LRS` (the
  modern-optimizer claims).
- **Tuning** (:class:`Tuning`): the learning-rate grids of successive halving, :data:`TINY_TUNING`,
  :data:`STUDY_TUNING`, :data:`MODERN_TUNING`.
- **Arms**: every registered policy a real pipeline runs, with its schedule family (:data:`ARM_POLICIES`, read
  from the policy registry), the schedules an arm may run instead (:data:`ARM_SCHEDULES`), the schedule of an arm
  (:func:`arm_schedule`: a builder of :data:`~pipelab.schedules.builders.BUILDERS`), the policies of each
  comparison, and the calibration's schedules (:data:`CALIBRATION_KINDS`, :data:`RAHIMI_RUNS`).

Example:
    >>> ARM_POLICIES["vanilla"], arm_schedule("2bw", D=4, M=2, steps=3).name
    ('pipedream', '2BW(D=4, M=4, T=3)')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..policies import available_policies, make_policy
from ..schedules.actions import Schedule
from ..schedules.builders import BUILDERS

__all__ = ["TASKS", "ARM_OPTIMIZER_SETTINGS", "PREDICTION_OPTIMIZER_SETTINGS", "IN_PIPELINE_LRS", "MODERN_LRS",
           "Tuning", "TINY_TUNING", "STUDY_TUNING", "MODERN_TUNING", "Convergence", "STUDY_CONVERGENCE",
           "ARM_POLICIES", "PIPELINE_POLICIES", "ARM_SCHEDULES", "arm_schedule",
           "POLICY_ORDER", "QUICK_POLICIES", "MODERN_POLICIES", "MODERN_OPTIMIZERS", "MODERN_ONLY", "MUON_POLICIES",
           "IN_PIPELINE_ARMS", "CORRECTION_ARMS", "CALIBRATION_KINDS", "RAHIMI_RUNS"]

# ---------------------------------------------------------------------------------------------------- tasks

#: task name -> (dataset, dataset kwargs, model, model kwargs). ``*_mlp_nobias``: the MLP without biases
#: (:func:`pipelab.studies.models.deep_mlp` ``bias=False``): every parameter a matrix, so Muon (2-D parameters only)
#: trains all of it; pipelab has no Muon + AdamW hybrid as arXiv:2606.30634 uses for non-matrix parameters.
TASKS: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "fashion_mnist_mlp": ("fashion_mnist", {"flatten": True}, "deep_mlp",
                          {"in_features": 784, "width": 128, "depth": 8}),
    "fashion_mnist_mlp_nobias": ("fashion_mnist", {"flatten": True}, "deep_mlp",
                                 {"in_features": 784, "width": 128, "depth": 8, "bias": False}),
    "fashion_mnist_cnn": ("fashion_mnist", {}, "small_cnn", {"width": 16}),
    "fashion_mnist_resnet": ("fashion_mnist", {}, "small_resnet", {"width": 8, "blocks_per_stage": 2}),
    # ResNet-20 (He et al., CVPR 2016, §4.2: 6n + 2 layers, n = 3, widths 16/32/64), the paper-regime task of the
    # ``paper`` preset: GroupNorm in place of BatchNorm (no running statistics, so every stale weight version and
    # every stacked seed is a function of its weights alone) and Fashion-MNIST in place of CIFAR-10 (a Debian
    # package; nothing is downloaded from a hub)
    "fashion_mnist_resnet20": ("fashion_mnist", {}, "small_resnet", {"width": 16, "blocks_per_stage": 3}),
    "mnist1d_mlp": ("mnist1d", {}, "deep_mlp", {"in_features": 40, "width": 128, "depth": 8}),
    "digits_mlp": ("digits", {"flatten": True}, "deep_mlp", {"in_features": 64, "width": 64, "depth": 8}),
    "digits_mlp_nobias": ("digits", {"flatten": True}, "deep_mlp",
                          {"in_features": 64, "width": 64, "depth": 8, "bias": False}),
    "wordlang_transformer": ("wordlang", {}, "transformer", {"in_features": 16 * 49, "seq_len": 8, "num_classes": 5,
                             "d_model": 16, "nhead": 1, "num_layers": 6, "dim_feedforward": 32}),
}

# ------------------------------------------------------------------------------------- optimizer overrides

#: The learning curves' optimizer settings where they differ from the registry's defaults: PipeOptim §V-A, SGDM with
#: lr 0.01, momentum 0.9 and weight decay 5e-4; Adam/AdamW with betas (0.9, 0.999) and lr 1e-3 (the defaults; AdamW's
#: decay 1e-2 too).
ARM_OPTIMIZER_SETTINGS: dict[str, dict[str, Any]] = {
    "sgdm": {"lr": 0.01, "weight_decay": 5e-4},
}

#: Prediction error along plain training: the learning rates its figures were made with (SGD 0.05, RMSprop 3e-4 /
#: 1e-4, Adagrad 0.02, NAdam 1e-3, Muon 0.02 as in Jordan et al.'s post and the learning curves) and AdamW's decay
#: 0.05; adam, radam and adamax use the defaults.
PREDICTION_OPTIMIZER_SETTINGS: dict[str, dict[str, Any]] = {
    "sgd": {"lr": 0.05},
    "sgdm": {"lr": 0.05},
    "nesterov": {"lr": 0.05},
    "adamw": {"weight_decay": 0.05},
    "rmsprop": {"lr": 3e-4},
    "rmsprop_momentum": {"lr": 1e-4},
    "adagrad": {"lr": 0.02},
    "nadam": {"lr": 1e-3},
    "muon": {"lr": 0.02},
}

#: Prediction error inside the pipeline: the learning rate per optimizer over :data:`PREDICTION_OPTIMIZER_SETTINGS`'
#: (SGDM 0.01: at 0.05, the plain-training rate, PipeOptim and SpecTrain diverge at D = 4).
IN_PIPELINE_LRS: tuple[tuple[str, float], ...] = (("sgdm", 0.01),)

#: The modern-optimizer claims' common rate per optimizer, the same for every policy (Muon's 0.02: Jordan et al.'s).
MODERN_LRS: tuple[tuple[str, float], ...] = (("sgdm", 0.01), ("adamw", 1e-3), ("nadam", 2e-3), ("nadam_async", 2e-3),
                                             ("muon", 0.02))

# --------------------------------------------------------------------------------------------------- tuning


@dataclass(frozen=True)
class Tuning:
    """Per-arm learning-rate selection of a preset (:mod:`pipelab.studies.tuning`): successive halving on the
    validation split.

    Attributes:
        grids: ``(optimizer, low, high, n)``: each optimizer's log-spaced grid of n >= 5 rates (:func:`lr_grid`).
        seeds: the tuning seeds; eta, min_epochs, max_epochs: the halving's rounds (``max_epochs=None``: up to the
            arm's full budget).
        last_full: the last round runs the largest budget; extend: rates added past an end of the grid where the
            selection lands on it, at most this many per end (:func:`~pipelab.studies.tuning.successive_halving`).
    """

    grids: tuple[tuple[str, float, float, int], ...]
    seeds: tuple[int, ...] = (0,)
    eta: int = 3
    min_epochs: int = 1
    max_epochs: int | None = 3
    last_full: bool = False
    extend: int = 0

    def lrs(self, optimizer: str) -> list[float]:
        from .tuning import lr_grid

        for name, low, high, n in self.grids:
            if name == optimizer:
                return lr_grid(low, high, n)
        raise ValueError(f"no learning-rate grid for optimizer {optimizer!r}; the grids cover "
                         f"{', '.join(g[0] for g in self.grids)}")


#: The ``tiny`` presets' tuning: SGDM over two decades, one round.
TINY_TUNING = Tuning(grids=(("sgdm", 1e-3, 1e-1, 5),), seeds=(100,), max_epochs=1)

#: The study's learning-rate grids. SGDM: 6 rates from 1e-4 to 1e-1, which straddle the heavy-ball thresholds
#: z*(β = 0.9, τ)/λ_max of the Fashion-MNIST MLP (λ_max ≈ 90 at initialisation): ≈ 4e-2 without delay, ≈ 4e-4 for
#: τ = 3 and ≈ 2e-4 for τ = 7 (figure ``study_lr_map`` draws them; notebook 03 derives z*). Adam: 5 rates over two
#: decades around its usual 1e-3 (its threshold is in preconditioned units, which the study does not measure).
#: Three tuning seeds (one cannot tell a decision from seed noise: 20 of 38 one-seed decisions were won by less than
#: the 0.8-pp seed spread), the last round at the arm's full budget, and up to two rates added past an end of the grid
#: where the selection lands on it.
STUDY_TUNING = Tuning(grids=(("sgdm", 1e-4, 1e-1, 6), ("adam", 1e-4, 1e-2, 5)), seeds=(100, 101, 102), eta=3,
                      min_epochs=1, max_epochs=None, last_full=True, extend=2)



@dataclass(frozen=True)
class Convergence:
    """When a study row counts as converged: its sequential baseline, at its tuned (constant) rate within the stated
    budget of epochs, gains less than ``tol`` validation accuracy (mean over the seeds) over its last ``window``
    epochs: ``mean_val[E] − mean_val[E − window] < tol``. Only the validation split decides it."""

    tol: float = 0.003
    window: int = 2


#: The study's criterion: under 0.3 pp of validation accuracy gained over the last two epochs.
STUDY_CONVERGENCE = Convergence(tol=0.003, window=2)

#: The modern-optimizer claims' study: each optimizer's rate selected on the sequential arm, over two decades.
MODERN_TUNING = Tuning(grids=(("sgdm", 1e-3, 1e-1, 5), ("adamw", 1e-4, 1e-2, 5), ("nadam", 1e-4, 1e-2, 5),
                              ("nadam_async", 1e-4, 1e-2, 5), ("muon", 2e-3, 2e-1, 5)), seeds=(100,))

# ----------------------------------------------------------------------------------------------------- arms

#: policy -> schedule family of its arm (:attr:`pipelab.policies.Policy.schedule`), read from the policy registry:
#: every registered policy that a real pipeline can run (all but the emulation-only oracle).
ARM_POLICIES: dict[str, str] = {name: info.schedule for name, info in
                                ((n, make_policy(n)) for n in available_policies()) if not info.emulation_only}
#: the arms that run a pipeline (all but the sequential arm): the multi-process runner's ``--policy`` choices
PIPELINE_POLICIES = tuple(p for p, family in ARM_POLICIES.items() if family != "sequential")

#: schedule -> the policy families it serves: schedules an arm may run instead of its policy's own family
#: (``RunConfig.schedule``). ``zb_h1``: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), flushed, M
#: micro-batches; ``zb_async``: its no-flush variant with PipeDream's one update per mini-batch (M = 1).
ARM_SCHEDULES: dict[str, tuple[str, ...]] = {"zb_h1": ("gpipe", "1f1b"), "zb_async": ("pipedream",)}

#: the learning-curve arms in registry order
POLICY_ORDER = tuple(ARM_POLICIES)
#: the learning curves' arms below the paper preset
QUICK_POLICIES = ("sequential", "vanilla", "stashing", "2bw", "spectrain", "pipeoptim", "pipemare")


def arm_schedule(policy: str, D: int, M: int, steps: int, schedule: str | None = None) -> Schedule:
    """The schedule an arm of ``policy`` runs: ``schedule`` (one of :data:`ARM_SCHEDULES`) or its policy's family,
    built by :data:`~pipelab.schedules.builders.BUILDERS`. Flushed families take the arm's M micro-batches;
    PipeDream-2BW M = D; the asynchronous ones (PipeDream, ``zb_async``) one update per mini-batch, M = 1.

    Raises:
        ValueError: the sequential arm, which runs no pipeline.
    """
    name = schedule or ARM_POLICIES[policy]
    if name == "sequential":
        raise ValueError(f"policy {policy!r}: the sequential arm runs no pipeline schedule")
    micro = {"pipedream": 1, "zb_async": 1, "2bw": D}.get(name, M)
    return BUILDERS[name](D, micro, steps)


#: the modern-optimizer claims: the policies, in drawing order; the optimizers; NAdam with the paper's β1 = 0.99
#: (2505.01099's run script) runs the arms of its claim and vanilla for scale; Muon runs the arms claim (i) needs
MODERN_POLICIES = ("sequential", "2bw", "error_feedback", "vanilla", "stashing", "dc_asgd", "nesterov_async")
MODERN_OPTIMIZERS = ("sgdm", "adamw", "nadam", "nadam_async", "muon")
MODERN_ONLY: tuple[tuple[str, tuple[str, ...]], ...] = (("nadam_async", ("sequential", "vanilla", "nesterov_async")),)
MUON_POLICIES = ("sequential", "2bw", "error_feedback")

#: prediction error inside the pipeline: the (policy, optimizer) panels of the predicting policies, and of the
#: gradient-correcting ones (each on its own schedule family: error feedback on PipeDream-2BW with M = D, DC-ASGD on
#: weight stashing's asynchronous 1F1B)
IN_PIPELINE_ARMS: tuple[tuple[str, str], ...] = (("pipeoptim", "sgdm"), ("spectrain", "sgdm"), ("pipemare", "sgdm"),
                                                 ("pipeoptim", "adam"), ("pipemare", "adam"), ("pipeoptim", "nadam"),
                                                 ("pipeoptim", "muon"))
CORRECTION_ARMS: tuple[tuple[str, str], ...] = (("error_feedback", "sgdm"), ("error_feedback", "adamw"),
                                                ("error_feedback", "muon"), ("dc_asgd", "sgdm"), ("dc_asgd", "adamw"))

#: the schedules the calibration knows, by kind: (builder name in BUILDERS, its arguments for W ranks, M
#: micro-batches and ``s`` steps, stages per rank, policy); LPP and FSLPP use G = 2 groups of R = W / 2 workers (on 2
#: ranks R = 1: each group one worker holding every stage, replicated (LPP) or fetched from the owner (FSLPP));
#: hybrid: D = W / 2 stages × R = 2 replicas (on 2 ranks one stage, data parallel); ``ddp_whole``: DDP of the
#: whole model (one stage: the cut torch's DDP runs)
CALIBRATION_KINDS: dict[str, tuple[str, Any, int, str]] = {
    "gpipe": ("gpipe", lambda W, M, s: (W, M, s), 1, "gpipe"),
    "1f1b": ("1f1b", lambda W, M, s: (W, M, s), 1, "1f1b"),
    "pipedream": ("pipedream", lambda W, M, s: (W, M, s), 1, "stashing"),
    "2bw": ("2bw", lambda W, M, s: (W, M, s), 1, "2bw"),
    "interleaved": ("interleaved", lambda W, M, s: (W, 2, M, s), 2, "1f1b"),
    "zb_h1": ("zb_h1", lambda W, M, s: (W, M, s), 1, "1f1b"),
    "ddp": ("ddp", lambda W, M, s: (2 * W, M, W, s), 2, "1f1b"),
    "ddp_whole": ("ddp", lambda W, M, s: (1, M, W, s), 1, "1f1b"),
    "fsdp": ("fsdp", lambda W, M, s: (2 * W, M, W, s), 2, "1f1b"),
    "lpp": ("lpp", lambda W, M, s: (2 * W, M, 2, max(W // 2, 1), s), 2, "1f1b"),
    "fslpp": ("fslpp", lambda W, M, s: (2 * W, M, 2, max(W // 2, 1), s), 2, "1f1b"),
    "hybrid": ("hybrid", lambda W, M, s: (max(W // 2, 1), M, 2, s), 1, "1f1b"),
}

#: Rahimi's schemes on real processes: scheme -> (builder name in BUILDERS, its arguments for (S, B, G, R, steps),
#: its keyword arguments, policy). DDP and FSDP on W = B workers (one micro-batch each, the note's setting), PP as
#: 1F1B (the order whose activation storage is the note's min(S, B)), LPP and FSLPP under the forward-first priority
#: the note's latency assumes.
RAHIMI_RUNS: dict[str, tuple[str, Any, dict[str, Any], str]] = {
    "DDP": ("ddp", lambda S, B, G, R, t: (S, B, B, t), {}, "gpipe"),
    "FSDP": ("fsdp", lambda S, B, G, R, t: (S, B, B, t), {}, "gpipe"),
    "PP": ("1f1b", lambda S, B, G, R, t: (S, B, t), {}, "1f1b"),
    "LPP": ("lpp", lambda S, B, G, R, t: (S, B, G, R, t), {"priority": "forward_first"}, "gpipe"),
    "FSLPP": ("fslpp", lambda S, B, G, R, t: (S, B, G, R, t), {"priority": "forward_first"}, "gpipe"),
}
