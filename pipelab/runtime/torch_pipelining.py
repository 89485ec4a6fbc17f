"""Run a pipelab schedule on ``torch.distributed.pipelining``'s own runtime (``_PipelineScheduleRuntime``).

The schedule is exported to torch's CSV format (:func:`pipelab.schedules.torch_actions.to_torch_csv`) and loaded
by ``_PipelineScheduleRuntime._load_csv``: pipelab decides the order, torch does the rest. Per mini-batch each rank
calls ``schedule.step`` then each stage's ``optimizer.step()``; torch's ``REDUCE_GRAD`` scales the gradient by 1/M,
so the update is the emulator's (tests: ≤ 1e-10 in float64). Only flushed one-step schedules, one rank per stage.

Reference: ``torch.distributed.pipelining`` (PyTorch ≥ 2.5): ``PipelineStage``, ``_PipelineScheduleRuntime``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..partition import split
from ..schedules.actions import Schedule
from ..schedules.torch_actions import to_torch_csv

__all__ = ["TorchPipeliningResult", "run_torch_pipelining"]


@dataclass
class TorchPipeliningResult:
    """What one rank's :func:`run_torch_pipelining` returns.

    Attributes:
        weights: final weights of this rank's stages, ``k -> tuple`` in ``parameters()`` order.
        losses: mean loss of every mini-batch on the last stage's rank (empty elsewhere).
        actions: the action list torch executed on this rank, as text.
    """

    rank: int
    stages: list[int]
    weights: dict[int, tuple[Tensor, ...]]
    losses: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)


def run_torch_pipelining(model: nn.Sequential | Sequence[nn.Module], schedule: Schedule,
                         batches: Sequence[tuple[Tensor, Tensor]], *,
                         optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                         loss_fn: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy,
                         comms: bool = True, balance: str | Sequence[int] = "layers",
                         device: torch.device | str = "cpu", workdir: str | None = None) -> TorchPipeliningResult:
    """Train ``model`` for ``len(batches)`` steps of ``schedule`` on torch's pipelining runtime (this rank's part).

    Call on every rank of an initialised default process group of ``schedule.W`` ranks (e.g. under
    :func:`pipelab.distributed.spawn`).

    Args:
        model: an ``nn.Sequential`` (cut with ``balance``) or the D stage modules, trained in place.
        comms: export pipelab's SEND/RECV actions (``"compute_comms"``), else let torch add them.
        workdir: directory for the exported CSV (default: a temporary one).

    Raises:
        RuntimeError: no process group, or its size is not ``schedule.W``.
        ValueError: a schedule torch cannot run (see :func:`~pipelab.schedules.torch_actions.to_torch`), a
            model that does not cut into ``schedule.D`` stages, no mini-batches.
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    rank = _rank(schedule)
    if len(batches) == 0:
        raise ValueError("batches must hold at least one mini-batch (x, y)")
    D, M = schedule.D, schedule.M
    mods = split(model, D, balance) if isinstance(model, nn.Sequential) else list(model)
    if len(mods) != D:
        raise ValueError(f"model has {len(mods)} stage modules but schedule {schedule.name!r} has D={D} stages")
    dev = torch.device(device)
    mine = [k for k in range(D) if schedule.weight_holders[k] == (rank,)]
    stages = [PipelineStage(mods[k].to(dev), k, D, dev) for k in mine]
    runtime = _PipelineScheduleRuntime(stages, n_microbatches=M, loss_fn=loss_fn, scale_grads=True)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = os.path.join(tmp, f"schedule_rank{rank}.csv")
        to_torch_csv(schedule, path, comms=comms)  # validates and refuses what torch cannot run
        runtime._load_csv(path, format="compute_comms" if comms else "compute_only")
    opts = [optimizer(ps) for k in mine if (ps := list(mods[k].parameters()))]
    losses = _train(runtime, opts, batches, dev, first=0 in mine, last=D - 1 in mine)
    actions = [str(a) for a in runtime.pipeline_order_with_comms[rank]]
    weights = {k: tuple(p.detach().clone() for p in mods[k].parameters()) for k in mine}
    return TorchPipeliningResult(rank, mine, weights, losses, actions)


def _rank(schedule: Schedule) -> int:
    """This process's rank, in a default process group of ``schedule.W`` ranks (RuntimeError otherwise)."""
    if not dist.is_initialized():
        raise RuntimeError("run_torch_pipelining needs an initialised default process group (torchrun, or "
                           "pipelab.distributed.spawn)")
    if dist.get_world_size() != schedule.W:
        raise RuntimeError(f"schedule {schedule.name!r} has {schedule.W} workers but the process group has "
                           f"{dist.get_world_size()} ranks")
    return dist.get_rank()


def _train(runtime: Any, opts: list[torch.optim.Optimizer], batches: Sequence[tuple[Tensor, Tensor]],
           dev: torch.device, *, first: bool, last: bool) -> list[float]:
    """One ``schedule.step`` and one optimizer step per mini-batch; the mean losses where the last stage runs."""
    losses: list[float] = []
    for x, y in batches:
        for o in opts:
            o.zero_grad(set_to_none=True)
        micro: list[Tensor] = []
        runtime.step(*((x.to(dev),) if first else ()), target=y.to(dev) if last else None,
                     losses=micro if last else None)
        for o in opts:
            o.step()
        if last:
            losses.append(float(torch.stack([m.detach() for m in micro]).mean()))
    return losses
