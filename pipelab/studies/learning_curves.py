"""Learning-curve experiments: train reference models under every schedule × staleness policy × optimizer.

One run (:class:`RunConfig`) trains one task (dataset + model) with one policy, optimizer, pipeline depth
D and seed in the exact emulator (:class:`pipelab.emulator.Emulator`), and records per epoch the training
loss (of the epoch-end weights on a fixed training subset, and the running mean of the pipeline's own
mini-batch losses), the test loss and the test accuracy, and, with a validation split (``RunConfig.n_val``),
the validation loss and accuracy (the metrics for model selection: the test set is never used to select).
Divergence (a NaN/inf loss) ends the run and is recorded, not raised. Every arm with the same seed starts
from the same initial weights and sees the same mini-batches in the same order.

Arms:
- ``sequential`` is plain PyTorch training of the whole model (:func:`~pipelab.emulator.train_plain`; the
  emulator reproduces it exactly under any flushed schedule, see the tests);
- ``gpipe``/``1f1b`` run the flushed schedules with M micro-batches (equal to sequential up to rounding);
- ``vanilla``, ``stashing``, ``vertical_sync``, ``spectrain``, ``pipeoptim``, ``pipemare`` run asynchronous
  1F1B (PipeDream, one update per mini-batch, M = 1);
- ``2bw`` runs PipeDream-2BW with M = D micro-batches per update.

``RunConfig.schedule`` runs an arm on another schedule of its policy's kind
(:data:`~pipelab.studies.settings.ARM_SCHEDULES`): the zero-bubble ZB-H1 (flushed, split backward) for the flushed
policies, or the no-flush split-backward ``zb_async`` for the asynchronous ones, whose deferred W passes change every
job's version. Tasks, optimizer settings and arms are :mod:`pipelab.studies.settings`'.

The validation split: ``n_val`` examples of the training subset, drawn by a permutation seeded with the run's
seed (the same for every arm of that seed), are held out; the remaining training examples keep their order
and are the only ones trained on (and the ones the epoch-end training loss is measured on). With
``n_val = 0`` nothing is drawn and every metric is exactly what it was before the split existed.

An epoch ends when every stage has applied that epoch's last update (version e·N, N steps per epoch);
the evaluation uses exactly those weights.

:func:`sweep` runs a grid through :func:`pipelab.studies.cache.run_sweep` (cached per run under the hash of its
config; an interrupted sweep resumes).

Example:
    >>> cfg = RunConfig(task="digits_mlp", policy="pipeoptim", optimizer="adam", D=4, seed=0, epochs=1)
    >>> rec = run(cfg)                                   # doctest: +SKIP
    >>> rec["test_acc"][-1]                              # doctest: +SKIP

References: PipeOptim (Guan et al., arXiv:2312.00839, §V-B, Table IV); SpecTrain (Chen et al.,
arXiv:1809.02839, §4.4).
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import torch

from ..distributed import resolve_device
from ..links import as_codec
from ..optim import OPTIMIZERS, optimizer_factory
from ..schedules.actions import check_int
from ..threads import torch_threads
from . import environment
from .cache import run_sweep
from .data import Dataset, load_dataset
from .models import build_model, he_init
from .settings import ARM_OPTIMIZER_SETTINGS, ARM_POLICIES, ARM_SCHEDULES, TASKS, arm_schedule

__all__ = ["RunConfig", "Prepared", "prepare", "run", "run_stacked", "sweep", "stack_cap", "STACK", "serves",
           "arm_optimizer", "grid", "with_"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RunConfig:
    """One training run.

    Attributes:
        task: one of :data:`~pipelab.studies.settings.TASKS`; policy: one of
            :data:`~pipelab.studies.settings.ARM_POLICIES`; optimizer: one of :data:`pipelab.optim.OPTIMIZERS`.
        D: pipeline stages; seed: initial weights and data order; epochs: passes over the training subset.
        batch_size: mini-batch size (one optimizer step); M: micro-batches for gpipe/1f1b (2BW uses M = D).
        n_train, n_test: training/test subset sizes (``None``: all); n_eval_train: training examples on which
            the epoch-end training loss is measured.
        n_val: validation examples carved out of the ``n_train`` training subset (0: no validation split); the
            run trains on the other ``n_train − n_val``.
        lr: learning rate (``None``: :data:`~pipelab.studies.settings.ARM_OPTIMIZER_SETTINGS`', else the registry's
            default).
        dtype, device: computation precision and device (``cpu``, ``cuda``, ``cuda:N`` or ``auto``, checked by
            :func:`pipelab.distributed.resolve_device` when the run is prepared).
        schedule: ``None`` (the policy's family) or one of :data:`~pipelab.studies.settings.ARM_SCHEDULES`
            serving that family.
        codec: how activations and their gradients cross the stage boundaries (``PipelineSpec(codec=...)``,
            :mod:`pipelab.links`): ``"identity"`` (untouched), ``"bf16"``, ``"int8"`` or ``"lowrank(r)"``; its
            accuracy cost shows in the curves.

    Raises:
        ValueError: an unknown task/policy/optimizer/dtype; a count (``D``, ``epochs``, ``batch_size``,
            ``M``, ``n_eval_train``, ``n_train``/``n_test`` unless ``None``) that is not an int >= 1; an
            ``n_val`` that is not an int >= 0; a non-integer seed; an ``lr`` that is not a finite number > 0; an
            unknown codec, or a codec for the sequential arm (it has no stage boundary).
    """

    task: str
    policy: str
    optimizer: str
    D: int
    seed: int
    epochs: int = 5
    batch_size: int = 64
    M: int = 4
    n_train: int | None = 10_000
    n_test: int | None = 2_000
    n_eval_train: int = 2_000
    lr: float | None = None
    dtype: str = "float32"
    device: str = "cpu"
    schedule: str | None = None
    n_val: int = 0
    codec: str = "identity"

    def __post_init__(self) -> None:
        for name, table in (("task", TASKS), ("policy", ARM_POLICIES), ("optimizer", OPTIMIZERS)):
            if getattr(self, name) not in table:
                raise ValueError(f"{name}={getattr(self, name)!r}; choose one of {', '.join(table)}")
        if self.schedule is not None:
            if self.schedule not in ARM_SCHEDULES:
                raise ValueError(f"schedule={self.schedule!r}; choose None or one of {', '.join(ARM_SCHEDULES)}")
            family = ARM_POLICIES[self.policy]
            if family not in ARM_SCHEDULES[self.schedule]:
                fits = [p for p, f in ARM_POLICIES.items() if f in ARM_SCHEDULES[self.schedule]]
                raise ValueError(f"schedule {self.schedule!r} cannot run policy {self.policy!r} (a {family} policy); "
                                 f"it runs {', '.join(fits)}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        for name in ("D", "epochs", "batch_size", "M", "n_eval_train"):  # counts: a 0 would fail (or mislead) later
            check_int(name, getattr(self, name))
        for name in ("n_train", "n_test"):
            value = getattr(self, name)
            if value is not None:
                try:
                    check_int(name, value)
                except ValueError:
                    raise ValueError(f"{name} must be an int >= 1 or None (all examples), got {value!r}") from None
        if isinstance(self.n_val, bool) or not isinstance(self.n_val, numbers.Integral) or self.n_val < 0:
            raise ValueError(f"n_val must be an int >= 0 (0: no validation split), got {self.n_val!r}")
        if self.n_train is not None and self.n_val >= self.n_train:
            raise ValueError(f"n_val={self.n_val} must be smaller than n_train={self.n_train} (it is carved out of it)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if self.lr is not None and (isinstance(self.lr, bool) or not isinstance(self.lr, numbers.Real)
                                    or not math.isfinite(self.lr) or self.lr <= 0):
            raise ValueError(f"lr must be a finite number > 0 or None (the optimizer's default), got {self.lr!r}")
        if not isinstance(self.codec, str):
            raise ValueError(f"codec must be a codec's name ('identity', 'bf16', 'int8', 'lowrank(r)'), "
                             f"got {self.codec!r}")
        as_codec(self.codec)
        if self.policy == "sequential" and self.codec != "identity":
            raise ValueError(f"codec={self.codec!r} encodes the hand-over between stages, but the sequential arm "
                             "has none; use codec='identity' for it")


def arm_optimizer(name: str, lr: float | None = None) -> Callable[[Any], torch.optim.Optimizer]:
    """Factory ``params -> optimizer``: the registry's ``name`` with
    :data:`~pipelab.studies.settings.ARM_OPTIMIZER_SETTINGS`, ``lr`` if given."""
    return optimizer_factory(name, **{**ARM_OPTIMIZER_SETTINGS.get(name, {}), **({"lr": lr} if lr is not None else {})})


def run(cfg: RunConfig) -> dict[str, Any]:
    """Train one arm and return its record (JSON-able lists; NaN after divergence).

    Returns:
        dict with the config fields plus ``epoch`` (0..epochs), ``train_loss``, ``running_loss``,
        ``test_loss``, ``test_acc``, ``val_loss``, ``val_acc`` (per epoch, index 0 = initial weights; the
        validation metrics are NaN when ``n_val = 0``), ``diverged`` (bool: a training loss, or a loss, output
        or weight of an epoch-end evaluation, is NaN or ±inf), ``diverged_step`` (the first mini-batch whose loss
        is non-finite, or whose update produced weights that evaluate non-finite, whichever is earlier),
        ``weight_copies`` (per stage), ``steps_per_epoch``, ``seconds``, ``device_name`` (the GPU's name, or
        ``"cpu"``) and ``torch`` (the version that computed the run). ``n_test`` is the size of the test
        set actually evaluated (the config's ``n_test`` capped by the dataset; an int even when the config
        says ``None``), so every accuracy can be quoted with its sample size.
    """
    # these models are small: on CPU one intra-op thread is fastest, and immune to oversubscribed cores
    with torch_threads(1 if cfg.device == "cpu" else None):
        return _run([cfg])


@dataclass
class Prepared:
    """A run's ingredients, built identically for the emulator and the multi-process runtime.

    Attributes:
        data: the dataset on ``cfg.device``; batch: mini-batch t (a fixed permutation per epoch).
        stages: the He-initialised model cut into D stages; optimizer: factory params -> optimizer.
        steps, per_epoch: optimizer steps in all and per epoch; schedule, policy: the arm's (``None`` for
        the sequential arm); val: the held-out validation examples ``(x, y)`` (``None`` when ``n_val = 0``),
        already removed from ``data``'s training set.
    """

    data: Any
    batch: Any
    stages: Sequence[torch.nn.Module]
    optimizer: Any
    steps: int
    per_epoch: int
    schedule: Any
    policy: Any
    val: tuple[torch.Tensor, torch.Tensor] | None = None


def prepare(cfg: RunConfig) -> Prepared:
    """Data, batches, initial stages, optimizer factory, schedule and policy of one arm."""
    from ..partition import split
    from ..policies import make_policy

    dtype = getattr(torch, cfg.dtype)
    device = resolve_device(cfg.device, argument="RunConfig.device")  # CUDA without CUDA: says what to pass
    dataset, dkw, model_name, mkw = TASKS[cfg.task]
    ds = load_dataset(dataset, dtype=dtype, **dkw).subset(cfg.n_train, cfg.n_test).to(device)
    ds, val = _carve_validation(ds, cfg.n_val, cfg.seed)
    n = ds.x_train.shape[0]
    per_epoch = n // cfg.batch_size
    if per_epoch < 1:
        raise ValueError(f"n_train={n} is smaller than batch_size={cfg.batch_size}")
    steps = per_epoch * cfg.epochs
    gen = torch.Generator().manual_seed(10_000 + cfg.seed)
    perms = [torch.randperm(n, generator=gen) for _ in range(cfg.epochs)]

    def batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
        e, i = divmod(t, per_epoch)
        idx = perms[e][i * cfg.batch_size:(i + 1) * cfg.batch_size].to(device)
        return ds.x_train[idx], ds.y_train[idx]

    model = build_model(model_name, seed=cfg.seed, dtype=dtype, device=device, **mkw)
    he_init(model, cfg.seed)
    if len(model) < cfg.D:
        raise ValueError(f"task {cfg.task!r} has {len(model)} blocks; D={cfg.D} is too deep")
    stages = split(model, cfg.D)
    opt = arm_optimizer(cfg.optimizer, cfg.lr)
    if cfg.policy == "sequential":
        return Prepared(ds, batch, stages, opt, steps, per_epoch, None, None, val)
    policy = make_policy(cfg.policy, **({"anneal_steps": per_epoch} if cfg.policy == "pipemare" else {}))
    schedule = arm_schedule(cfg.policy, cfg.D, cfg.M, steps, cfg.schedule)
    return Prepared(ds, batch, stages, opt, steps, per_epoch, schedule, policy, val)


def _carve_validation(ds: Any, n_val: int, seed: int) -> tuple[Any, tuple[torch.Tensor, torch.Tensor] | None]:
    """Hold out ``n_val`` training examples: a permutation seeded with ``30_000 + seed`` picks them.

    Returns the dataset with the remaining training examples (in their original order) and the held-out
    ``(x_val, y_val)`` (in index order); ``(ds, None)`` unchanged when ``n_val = 0``.
    """
    if n_val == 0:
        return ds, None
    n = ds.x_train.shape[0]
    if n_val >= n:
        raise ValueError(f"n_val={n_val} must be smaller than the training set ({n} examples)")
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(30_000 + seed))[:n_val]
    held = torch.zeros(n, dtype=torch.bool)
    held[pick] = True
    val_idx = torch.nonzero(held).squeeze(1).to(ds.x_train.device)
    keep = torch.nonzero(~held).squeeze(1).to(ds.x_train.device)
    out = Dataset(ds.name, ds.x_train[keep], ds.y_train[keep], ds.x_test, ds.y_test, ds.num_classes)
    return out, (ds.x_train[val_idx], ds.y_train[val_idx])


def run_stacked(configs: Sequence[RunConfig]) -> list[dict[str, Any]]:
    """Train several seeds of one arm as one stacked model (:mod:`pipelab.studies.stacking`); one record per config.

    The configs must be equal except for ``seed``. Each record is what :func:`run` returns for that config, up to
    floating-point rounding (the tests check 1e-10 in float64 for every policy), plus ``stacked_arms`` = K; its
    ``seconds`` is the group's wall time divided by K. An arm that diverges stops alone (its later epochs are NaN);
    the others go on.

    Raises:
        ValueError: configs that differ in more than the seed, or an arm that cannot be stacked
            (:func:`pipelab.studies.stacking.check_stackable`: Muon under a predicting policy, buffers, dropout).
    """
    configs = list(configs)
    if not configs:
        return []
    keys = {replace(c, seed=0) for c in configs}
    if len(keys) > 1:
        raise ValueError("run_stacked() stacks seeds of one arm: the configs must differ only in their seed")
    with torch_threads(1 if configs[0].device == "cpu" else None):
        return _run(configs)


def _run(cfgs: Sequence[RunConfig]) -> Any:
    """The K arms ``cfgs`` (K = 1: one plain run; K > 1: seeds of one arm, stacked). Returns one record, or a list."""
    from ..emulator import Emulator, evaluate, train_plain
    from .stacking import check_stackable, evaluate_arms, stack_models, stacked_batch, stacked_loss, stacked_optimizer

    t0 = time.perf_counter()
    preps = [prepare(c) for c in cfgs]
    K, cfg, p0 = len(cfgs), cfgs[0], preps[0]
    steps, per_epoch, opt = p0.steps, p0.per_epoch, p0.optimizer
    E = cfg.epochs + 1
    recs: list[dict[str, Any]] = []
    for c, p in zip(cfgs, preps):
        rec = {f: getattr(c, f) for f in c.__dataclass_fields__}
        rec.update(epoch=list(range(E)), train_loss=[math.nan] * E, running_loss=[math.nan] * E,
                   test_loss=[math.nan] * E, test_acc=[math.nan] * E, diverged=False, diverged_step=None,
                   weight_copies=[1] * cfg.D, steps_per_epoch=per_epoch, val_loss=[math.nan] * E,
                   val_acc=[math.nan] * E, n_test=int(p.data.x_test.shape[0]))
        recs.append(rec)
    n_eval = cfg.n_eval_train
    stages: Sequence[torch.nn.Module]
    if K == 1:
        stages, batch, loss_fn = p0.stages, p0.batch, None
        sets = {"train": (p0.data.x_train[:n_eval], p0.data.y_train[:n_eval]), "test": (p0.data.x_test, p0.data.y_test)}
        if p0.val is not None:
            sets["val"] = p0.val

        def measure(x: torch.Tensor, y: torch.Tensor, W: Any) -> tuple[list[float], list[float]]:
            loss, acc = evaluate(stages, x, y, W, codec=cfg.codec)
            return [loss], [acc]
    else:
        check_stackable(torch.nn.Sequential(*p0.stages), cfg.optimizer, predicts=_predicts(cfg.policy))
        stages = [stack_models([cast(torch.nn.Sequential, p.stages[k]) for p in preps]) for k in range(cfg.D)]
        loss_fn = stacked_loss()
        opt = stacked_optimizer(opt)

        def batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
            return stacked_batch([p.batch(t) for p in preps])

        sets = {"train": (torch.stack([p.data.x_train[:n_eval] for p in preps], 1),
                          torch.stack([p.data.y_train[:n_eval] for p in preps], 1)),
                "test": (p0.data.x_test, p0.data.y_test)}
        if p0.val is not None:
            sets["val"] = (torch.stack([p.val[0] for p in preps if p.val is not None], 1),
                           torch.stack([p.val[1] for p in preps if p.val is not None], 1))

        def measure(x: torch.Tensor, y: torch.Tensor, W: Any) -> tuple[list[float], list[float]]:
            return evaluate_arms(stages, x, y, K, W, codec=cfg.codec)

    # per arm: the first epoch whose evaluation was non-finite (evaluate()'s rule: a weight, output or loss)
    bad_epoch: list[int | None] = [None] * K

    def record(e: int, weights: Sequence[Sequence[torch.Tensor]] | None = None) -> None:
        for name, (x, y) in sets.items():
            losses_e, accs = measure(x, y, weights)
            for a, (rec, loss_e, acc) in enumerate(zip(recs, losses_e, accs)):
                if not math.isfinite(loss_e) and bad_epoch[a] is None:
                    bad_epoch[a] = e
                if name == "train":
                    rec["train_loss"][e] = loss_e
                else:
                    rec[f"{name}_loss"][e], rec[f"{name}_acc"][e] = loss_e, acc

    arm_losses: list[Any] = []
    if cfg.policy == "sequential":
        record(0)
        losses = train_plain(stages, optimizer=opt, batches=batch, steps=steps, loss_fn=loss_fn,
                             callback=lambda v: record(v // per_epoch) if v % per_epoch == 0 else None,
                             arm_losses=arm_losses)
    else:
        extra: dict[str, Any] = {} if loss_fn is None else {"loss_fn": loss_fn}
        emu = Emulator(stages, schedule=p0.schedule, policy=p0.policy, optimizer=opt, codec=cfg.codec, **extra)
        for rec in recs:
            rec["weight_copies"] = emu.weight_copies
        res = emu.run(batch, snapshot_every=per_epoch, on_snapshot=lambda v, W: record(v // per_epoch, W))
        losses, arm_losses = res.losses, [a for a in res.extra["arm_losses"] if a is not None]
    seconds = (time.perf_counter() - t0) / K
    device = resolve_device(cfg.device)
    # what computed the run: results cached on a GPU machine are drawn elsewhere, and say where they came from
    made_on = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for a, rec in enumerate(recs):
        mine = losses if K == 1 else [row[a] for row in arm_losses]
        _finish(rec, mine, steps, per_epoch, cfg.epochs, bad_epoch[a])
        rec["seconds"] = seconds
        rec["device_name"], rec["torch"] = made_on, torch.__version__
        if K > 1:
            rec["stacked_arms"] = K
    return recs[0] if K == 1 else recs


def _finish(rec: dict[str, Any], losses: Sequence[float], steps: int, per_epoch: int, epochs: int,
            bad_epoch: int | None = None) -> None:
    """Divergence and running losses of one arm from its mini-batch losses (NaN past the last one computed).

    An arm diverges at its first non-finite loss, step t, or at the update that produced the first epoch-end
    weights whose evaluation is non-finite (epoch e: step e·N − 1; step 0 for the initial weights), whichever
    is earlier; its epoch-end metrics are kept only for the epochs whose weights (version e·N) it reached
    before, e·N ≤ t: later ones are NaN, as when a run stops there.
    """
    arr = np.full(steps, math.nan)
    arr[: len(losses)] = np.asarray(losses, dtype=float)
    bad = [int(t) for t in np.flatnonzero(~np.isfinite(arr[: len(losses)]))[:1]]
    if bad_epoch is not None:  # finite losses up to here, but the update of step e·N − 1 gave non-finite weights
        bad.append(max(bad_epoch * per_epoch - 1, 0))
    if bad:
        rec["diverged"], rec["diverged_step"] = True, min(bad)
        for e in range(len(rec["epoch"])):
            if e * per_epoch > min(bad):
                for key in ("train_loss", "test_loss", "test_acc", "val_loss", "val_acc"):
                    rec[key][e] = math.nan
    for e in range(epochs):
        chunk = arr[e * per_epoch:(e + 1) * per_epoch]
        rec["running_loss"][e + 1] = float(chunk.mean()) if np.isfinite(chunk).all() else math.nan


def grid(tasks: Iterable[str], policies: Iterable[str], optimizers: Iterable[str], Ds: Iterable[int],
         seeds: Iterable[int], **common: Any) -> list[RunConfig]:
    """Every combination as :class:`RunConfig` s, skipping arms that cannot run.

    Skipped: a policy with an optimizer it cannot serve (:func:`serves`), and D deeper than the task's model.
    """
    out = []
    tasks, policies, optimizers = list(tasks), list(policies), list(optimizers)
    Ds, seeds = list(Ds), list(seeds)
    for task in tasks:
        n_blocks = _blocks(task)
        for opt in optimizers:
            for D in Ds:
                if D > n_blocks:
                    continue
                for pol in policies:
                    if not serves(pol, opt):
                        continue
                    out += [RunConfig(task=task, policy=pol, optimizer=opt, D=D, seed=s, **common) for s in seeds]
    return out


@functools.cache
def serves(policy: str, optimizer: str) -> bool:
    """Whether ``policy`` can run with the registry's ``optimizer``, asked of the one place that refuses a pair
    (:func:`pipelab.pipeline.build_pipeline`: the policy's :meth:`~pipelab.policies.Policy.check_optimizer`, e.g. the
    Nesterov policy's NAdam, and its predictor's, e.g. SpecTrain's SGD momentum, which PipeOptim §II-C2 calls "no
    longer applicable" otherwise), on a two-stage bias-free linear model and the policy's own schedule."""
    from ..pipeline import build_pipeline

    if ARM_POLICIES[policy] == "sequential":  # plain training: no pipeline, any optimizer
        return True
    probe = RunConfig(task="digits_mlp", policy=policy, optimizer=optimizer, D=2, seed=0, M=1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False))
    try:
        build_pipeline(model, schedule=arm_schedule(policy, probe.D, probe.M, 2), policy=policy,
                       optimizer=arm_optimizer(optimizer))
    except ValueError:
        return False
    return True


def _blocks(task: str) -> int:
    _, _, model_name, mkw = TASKS[task]
    return len(build_model(model_name, **mkw))


#: the most seeds of one arm a sweep stacks into one run, unless a task's plan or ``$PIPELAB_STACK`` says otherwise
STACK = 8


def stack_cap(planned: int | None = None) -> int:
    """The most seeds of one arm stacked into one run: ``$PIPELAB_STACK`` when set (the same for every task: an
    operator's override, e.g. to keep each stacked run within a time limit), else ``planned`` (a task's cap in its
    preset), else :data:`STACK`.

    A stacked run of K seeds takes about K times one seed's time and is lost whole when killed, so a preset caps K
    per task where one seed is slow; the records do not depend on K (:func:`run_stacked`).

    Raises:
        ValueError: ``$PIPELAB_STACK`` or ``planned`` is not an integer >= 1.
    """
    override = environment.stack()
    if override is not None:
        return override
    if planned is None:
        return STACK
    return check_int("planned", planned, 1)


def sweep(configs: Iterable[RunConfig], *, progress: bool = False, desc: str = "learning curves",
          run_fn: Callable[[RunConfig], dict[str, Any]] | None = None,
          stack: int | Callable[[RunConfig], int] | None = None, workers: int | None = None) -> list[dict]:
    """Run every config through the result cache (one entry per run; an interrupted sweep resumes).

    Args:
        run_fn: replaces :func:`run` (a stub or a wrapper, e.g. in tests; it then runs every config alone, in this
            process); the cache keys its entries on the code of whichever function runs.
        stack: seeds of one arm trained together as one stacked model (:func:`run_stacked`), at most this many
            (1: every run alone), or a function of an arm's config giving its cap (e.g. its task's); default
            :func:`stack_cap` (``$PIPELAB_STACK``, else :data:`STACK`). Arms that cannot be stacked (Muon under a
            predicting policy) run alone.
        workers: processes running arms in parallel (default ``$PIPELAB_WORKERS``, else 1).
    """
    configs = list(configs)
    if workers is None:
        workers = environment.workers()
    if stack is None:
        stack = stack_cap()
    log.info("learning-curve sweep: %d runs (stacking up to %s seeds, %d worker(s))", len(configs),
             "a cap per task" if callable(stack) else stack, workers)
    if run_fn is not None:
        return run_sweep("learning_curves", configs, run_fn, progress=progress, desc=desc)
    return run_sweep("learning_curves", configs, run, progress=progress, desc=desc, batch_fn=run_stacked,
                     group=_stack_group, max_batch=stack, workers=workers)


def _stack_group(cfg: RunConfig) -> RunConfig:
    """Configs that may share a stacked run: equal up to the seed (an arm that cannot be stacked is its own group:
    Muon under a predicting policy, :func:`pipelab.studies.stacking.check_stackable`)."""
    from .stacking import ARMWISE_OPTIMIZERS

    return cfg if cfg.optimizer in ARMWISE_OPTIMIZERS and _predicts(cfg.policy) else replace(cfg, seed=0)


def _predicts(policy: str) -> bool:
    """Whether ``policy`` predicts weights (its predictor reads the optimizer's update rule)."""
    from ..policies import make_policy

    return policy != "sequential" and make_policy(policy).uses_predictor


def with_(cfg: RunConfig, **changes: Any) -> RunConfig:
    """A copy of ``cfg`` with fields changed."""
    return replace(cfg, **changes)
