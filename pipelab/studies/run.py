"""Train one learning-curve arm for real with the multi-process runtime: ``torchrun -m pipelab.studies.run``.

One process per pipeline worker (``--nproc-per-node`` = D for the GPipe, 1F1B, PipeDream and 2BW arms):

    torchrun --standalone --nproc-per-node 4 -m pipelab.studies.run --task fashion_mnist_mlp \\
        --policy pipeoptim --optimizer adam --D 4 --epochs 1

On GPUs pass ``--device cuda`` (NCCL; rank r uses GPU ``LOCAL_RANK``). Across machines use torchrun's
rendezvous, e.g. on each of two nodes with two GPUs each::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m pipelab.studies.run --task fashion_mnist_mlp --policy stashing --optimizer sgdm --D 4 --device cuda

``--stop-at-step N --checkpoint DIR`` stops at the consistent cut of mini-batch N and saves every rank's
state; ``--resume DIR`` continues such a run identically (a different configuration — learning rate,
seed, batch size, ... — is refused, naming what differs; so are ranks launched with different arguments).
Rank 0 prints a JSON summary (final losses, test accuracy, throughput, per-rank memory, divergence) and
writes it to ``--out`` if given. ``--out`` and ``--checkpoint`` are checked before the ranks join (a
directory where the summary file should go, no permission, ...); if ``--out`` still cannot be written at
the end, the summary is saved in the temporary directory and the error says where.

``--link-mbps R --link-latency-ms A [--duplex]`` meters every point-to-point message with the link model of
:mod:`pipelab.links` (:mod:`pipelab.runtime.meter`): each boundary a link of R Mb/s and A ms, so the run on one
machine takes the time it would over such links; the weights are those of an unmetered run. The summary then
gives the network and ``late_messages`` (messages whose stamp came too late for the model's wire order).

Each communication call waits at most ``--comm-timeout`` seconds; a rank whose call fails raises
:class:`pipelab.distributed.StalledRank` naming the stalled peer (one that stopped, or makes no progress
outside communication), which torchrun reports as the root cause.

From Python (tests, notebooks), :func:`train_distributed` spawns the ranks locally and returns the summary.
The arm is described by :class:`pipelab.studies.learning_curves.RunConfig` and built by
:func:`pipelab.studies.learning_curves.prepare`, exactly as the emulator's learning curves build it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import atomic_write

if TYPE_CHECKING:
    from ..links import Network
    from .learning_curves import RunConfig

# torch and the modules reading it are imported inside the functions, so that --help answers at once.

__all__ = ["train", "train_distributed", "main", "choices"]


def train(cfg: RunConfig, *, checkpoint: str | None = None, stop_at_step: int | None = None,
          resume: str | None = None, precision: str = "fp32", network: Network | None = None
          ) -> dict[str, Any] | None:
    """Run ``cfg`` on this rank of an initialised process group; rank 0 returns the summary.

    ``precision`` (``"fp32"``, ``"bf16"``, ``"fp16"``: :class:`~pipelab.precision.Precision`) is the compute
    precision, with fp32 master weights and optimizer state; it is not a field of :class:`RunConfig`, whose
    fields key the learning curves' result cache. ``network`` meters the run's messages
    (:class:`~pipelab.runtime.PipelineRuntime`'s ``network``).

    Returns:
        On rank 0: the config, ``losses`` per step (NaN where not reached or diverged), ``steps_done``
        (mini-batches whose loss was computed, finite or not), ``diverged`` (a loss, a final weight or an
        output of the test evaluation is NaN/inf) and ``diverged_step`` (first non-finite loss; the last step
        done when only the final weights or outputs are non-finite; ``None``), ``test_loss``/``test_acc`` of
        the final weights and
        ``samples_per_s`` (NaN when diverged: neither means anything for NaN weights), ``seconds``,
        ``memory`` per rank and ``position`` per rank; with a ``network`` also ``network`` (its repr) and
        ``late_messages`` (summed over ranks, :class:`~pipelab.runtime.meter.MeterStats`); ``None`` elsewhere.

    Raises:
        ValueError: the sequential arm; a ``checkpoint`` directory that could not be written (checked before
            the run, :func:`check_writable`).
    """
    import torch.distributed as dist

    from ..distributed import waiting
    from ..emulator import evaluate
    from ..runtime import PipelineRuntime, load_checkpoint, save_checkpoint
    from .learning_curves import prepare

    if cfg.policy == "sequential":
        raise ValueError("the sequential arm has no pipeline; run it with pipelab.studies.learning_curves.run")
    if checkpoint is not None:  # before the run, not after it
        check_writable(checkpoint, "checkpoint", directory=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    prep = prepare(cfg)
    shared = {k: v for k, v in asdict(cfg).items() if k != "device"}  # each rank has its own device
    # "cuda"/"auto" under NCCL: this rank's GPU (LOCAL_RANK); an explicit "cuda:N" or "cpu" as given
    rt = PipelineRuntime(prep.stages, schedule=prep.schedule, policy=prep.policy, optimizer=prep.optimizer,
                         device=cfg.device if cfg.device not in ("cuda", "auto") else None, config=shared,
                         precision=precision, codec=cfg.codec, network=network)
    if resume is not None:
        load_checkpoint(rt, resume)
    everyone = range(world)
    with waiting(everyone, "the barrier before the run"):
        dist.barrier()
    start = time.perf_counter()
    res = rt.run(prep.batch, stop_at_step=stop_at_step)
    with waiting(everyone, "the barrier after the run"):
        dist.barrier()
    seconds = time.perf_counter() - start
    if checkpoint is not None:
        save_checkpoint(rt, checkpoint)
    gathered: list[Any] = [None] * world
    with waiting(everyone, "the gathering of the results"):
        dist.all_gather_object(gathered, (res.weights, res.memory, res.position,
                                          None if res.meter is None else res.meter.late))
    if rank != 0:
        return None
    weights = {k: W for part in gathered for k, W in part[0].items()}
    stages = [copy.deepcopy(m).cpu() for m in rt.modules]
    ds = prep.data
    done = res.steps_done
    diverged, diverged_step = res.diverged, res.diverged_step  # a loss or a final weight non-finite
    nan = float("nan")
    if diverged or ds.x_test.shape[0] == 0:
        test_loss, test_acc = nan, nan
    else:
        test_loss, test_acc = evaluate(stages, ds.x_test.cpu(), ds.y_test.cpu(),
                                       [weights[k] for k in range(len(stages))])
        if not math.isfinite(test_loss):  # finite weights, non-finite outputs: evaluate()'s rule
            diverged, diverged_step = True, done - 1
    metered = {} if network is None else {"network": repr(network),
                                          "late_messages": sum(part[3] for part in gathered)}
    return {
        **metered, "config": asdict(cfg), "precision": precision, "world_size": world, "schedule": prep.schedule.name,
        "losses": res.losses, "steps_done": done, "diverged": diverged, "diverged_step": diverged_step,
        "test_loss": test_loss, "test_acc": test_acc, "seconds": seconds,
        "samples_per_s": done * cfg.batch_size / seconds if seconds > 0 and not diverged else nan,
        "memory": {r: part[1] for r, part in enumerate(gathered)},
        "position": {r: part[2] for r, part in enumerate(gathered)},
        "weights": weights,
    }


def _spawned(rank: int, world: int, cfg: RunConfig, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    return train(cfg, **kwargs)


def train_distributed(cfg: RunConfig, world_size: int | None = None, *, backend: str | None = None,
                      timeout_s: float = 3600.0, **kwargs: Any) -> dict[str, Any]:
    """Spawn the ranks of ``cfg`` locally (``world_size`` defaults to the schedule's workers, D) and train.

    Raises:
        ValueError: a CUDA device without CUDA, or NCCL with fewer visible GPUs than ranks (before spawning).

    Example:
        >>> from pipelab.studies.learning_curves import RunConfig
        >>> cfg = RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=0, epochs=1)
        >>> out = train_distributed(cfg)          # doctest: +SKIP
        >>> out["test_acc"], out["samples_per_s"]  # doctest: +SKIP
    """
    from ..distributed import default_backend, resolve_device, spawn

    world = world_size or cfg.D
    device = resolve_device(cfg.device, argument="RunConfig.device")  # before any process starts
    backend = backend or default_backend(device)
    return spawn(_spawned, world, (cfg, kwargs), backend=backend, timeout_s=timeout_s)[0]


def choices() -> dict[str, list[str]]:
    """The names ``--task``, ``--policy``, ``--optimizer`` and ``--schedule`` accept, from their registries."""
    from ..optim import available_optimizers
    from .settings import ARM_SCHEDULES, PIPELINE_POLICIES, TASKS

    return {"task": sorted(TASKS), "policy": list(PIPELINE_POLICIES), "optimizer": available_optimizers(),
            "schedule": sorted(ARM_SCHEDULES)}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and every option's default (unless its help says it, or it has none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if any(action.default is none for none in (None, False, argparse.SUPPRESS)) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _parser() -> argparse.ArgumentParser:
    # --task, --policy, --optimizer and --schedule are checked after parsing (_parse): their names come from
    # registries that import torch, which --help does not need
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node D -m pipelab.studies.run", description=__doc__,
                                formatter_class=_HelpFormatter)
    p.add_argument("--list", action="store_true", help="print the names --task, --policy, --optimizer and "
                                                       "--schedule accept, and exit")
    p.add_argument("--task", default="fashion_mnist_mlp", help="learning-curve task (--list shows them)")
    p.add_argument("--policy", default="pipeoptim", help="weight-staleness policy of a pipelined arm (--list)")
    p.add_argument("--optimizer", default="adam", help="optimizer of pipelab's registry (--list)")
    p.add_argument("--D", type=int, default=None, help="stages (default: the world size)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the data order and the split")
    p.add_argument("--epochs", type=int, default=1, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=64, help="examples per mini-batch")
    p.add_argument("--M", type=int, default=4, help="micro-batches per step (GPipe/1F1B)")
    p.add_argument("--n-train", type=int, default=10_000, help="training examples")
    p.add_argument("--n-test", type=int, default=2_000, help="test examples")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the arm's setting)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="parameter dtype")
    p.add_argument("--schedule", default=None,
                   help="run the policy on this schedule instead of its family's (--list; zb_async: split backward)")
    p.add_argument("--device", default="cpu",
                   help="cpu (gloo), cuda (NCCL, rank r on GPU LOCAL_RANK; one GPU per rank) or auto")
    p.add_argument("--checkpoint", default=None, help="directory to save every rank's state at the end")
    p.add_argument("--stop-at-step", type=int, default=None, help="stop at the consistent cut of this step")
    p.add_argument("--resume", default=None, help="directory of a checkpoint to continue from")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="compute precision (autocast) with fp32 master weights; fp16 adds a loss scaler and "
                        "needs a flushed schedule")
    p.add_argument("--link-mbps", type=float, default=None, metavar="R",
                   help="meter every stage boundary as a link of R megabits/s (pipelab.runtime.meter)")
    p.add_argument("--link-latency-ms", type=float, default=None, metavar="A",
                   help="the metered links' latency in milliseconds (default 0)")
    p.add_argument("--duplex", action="store_true",
                   help="metered: each rank's activations and gradients arrive on separate wires")
    p.add_argument("--out", default=None, help="write rank 0's JSON summary here")
    p.add_argument("--comm-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="bound on one communication call; a rank whose call times out names the stalled peer")
    return p


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, their names checked against :func:`choices`; ``--help``, ``--list`` and errors exit here."""
    parser = _parser()
    args = parser.parse_args(argv)
    names = choices()
    if args.list:
        for option, allowed in names.items():
            print(f"--{option}: {' '.join(allowed)}")
        parser.exit()
    for option, allowed in names.items():
        value = getattr(args, option)
        if value is not None and value not in allowed:
            parser.error(f"argument --{option}: invalid choice: {value!r} (choose from {', '.join(allowed)})")
    return args


def main(argv: list[str] | None = None) -> int:
    return _run(_parse(argv))


def _run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from ..distributed import default_backend, init_from_env, resolve_device
    from .learning_curves import RunConfig

    try:  # before joining: CUDA without CUDA, fewer GPUs than this machine's ranks, or outputs that could not
        # be written at the end of the run, are said plainly
        backend = default_backend(resolve_device(args.device, argument="--device"))
        if args.out and os.environ.get("RANK", "0") == "0":  # only rank 0 writes the summary
            check_writable(args.out, "--out")
        if args.checkpoint is not None:
            check_writable(args.checkpoint, "--checkpoint", directory=True)
        network = _network(args, args.D)
        rank, world = init_from_env(backend, timeout_s=args.comm_timeout)
        network = _network(args, args.D or world)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.device in ("cuda", "auto") and backend == "nccl":
        args.device = f"cuda:{torch.cuda.current_device()}"
    cfg = RunConfig(task=args.task, policy=args.policy, optimizer=args.optimizer, D=args.D or world, seed=args.seed,
                    epochs=args.epochs, batch_size=args.batch_size, M=args.M, n_train=args.n_train,
                    n_test=args.n_test, lr=args.lr, dtype=args.dtype, device=args.device, schedule=args.schedule)
    out = train(cfg, checkpoint=args.checkpoint, stop_at_step=args.stop_at_step, resume=args.resume,
                precision=args.precision, network=network)
    code = 0
    if out is not None:
        out.pop("weights")
        text = json.dumps(out, indent=2, default=str)
        print(text)
        if args.out:
            try:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                atomic_write(args.out, text + "\n")
            except OSError as exc:  # the run is done: keep its summary somewhere, and say where
                print(f"error: cannot write --out {args.out} ({type(exc).__name__}: {exc}); the summary is printed "
                      f"above and {_save_elsewhere(text)}", file=sys.stderr)
                code = 1
    dist.destroy_process_group()
    return code


def _network(args: argparse.Namespace, D: int | None) -> Network | None:
    """The metered network the flags describe (``None`` without ``--link-mbps``/``--link-latency-ms``); checked
    before the ranks join (``D`` unknown yet: the world size), built once D is known."""
    from ..links import Link, Network

    if args.link_mbps is None and args.link_latency_ms is None:
        if args.duplex:
            raise ValueError("--duplex needs a metered link: give --link-mbps and/or --link-latency-ms")
        return None
    if args.link_mbps is not None and not args.link_mbps > 0:
        raise ValueError(f"--link-mbps must be > 0 megabits/s, got {args.link_mbps}")
    link = Link.mbps(args.link_mbps if args.link_mbps is not None else math.inf, args.link_latency_ms or 0.0)
    return Network.uniform(D if D is not None else 2, link, duplex=args.duplex)


def _save_elsewhere(text: str) -> str:
    """Save a summary that could not go to ``--out`` in the temporary directory; say where (or that it failed)."""
    try:
        fd, path = tempfile.mkstemp(prefix="pipelab-run-summary-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        return f"could not be saved elsewhere either ({type(exc).__name__}: {exc})"
    return f"saved to {path}"


def check_writable(path: str | os.PathLike[str], argument: str, *, directory: bool = False) -> Path:
    """Refuse, before any work, a ``path`` where a file (``directory``: a directory) could not be written.

    It must not be the other kind; it must be writable, or its nearest existing ancestor a writable directory.
    ValueError names ``argument`` (``--out``, ``checkpoint``, ...), the path and what is wrong.
    """
    path = Path(path)
    kind = "directory" if directory else "file"
    if path.exists():
        if path.is_dir() != directory:
            other = "a directory" if path.is_dir() else "a file"
            raise ValueError(f"{argument} {path} is {other}; a {kind} is expected there")
        target = path if directory else path.parent
        if not os.access(path, os.W_OK) or not os.access(target, os.W_OK | os.X_OK):
            raise ValueError(f"{argument} {path}: no permission to write it")
        return path
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{argument} {path}: {ancestor} is a file, so the {kind} cannot be created")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{argument} {path}: cannot create it, {ancestor} is not writable")
    return path


if __name__ == "__main__":
    arguments = _parse(sys.argv[1:])  # --help, --list and a wrong name answer before torch is imported
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: under torchrun, the failing rank's error (a StalledRank naming the stalled peer) becomes the cause
    # in torchrun's summary; applied here only, as it installs a fault handler on the process's stderr
    sys.exit(record(_run)(arguments))
