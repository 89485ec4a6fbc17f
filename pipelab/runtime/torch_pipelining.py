"""Run a pipelab schedule on ``torch.distributed.pipelining``'s own runtime (``_PipelineScheduleRuntime``).

The schedule is exported to torch's CSV format (:func:`pipelab.schedules.torch_actions.to_torch_csv`; with
pipelab's SEND/RECV actions when ``comms=True``, else compute only and torch lowers the communication
itself) and loaded by ``_PipelineScheduleRuntime._load_csv``, which then executes it: pipelab decides the
order, torch does everything else (stages, point-to-point transfers, autograd, gradient scaling). Each
rank builds torch ``PipelineStage`` s for the stages it computes (in increasing stage order, which is the
chunk order of both libraries), one ``torch.optim`` optimizer per stage from the user's factory, and for
every mini-batch calls ``schedule.step`` then ``optimizer.step()``: the update U(k, t) of pipelab's
flushed schedules, which torch runs outside its schedule.

Gradients: torch's last stage computes ``loss_fn`` per micro-batch (a mean over the micro-batch) and its
``REDUCE_GRAD`` scales the accumulated gradient by 1/M, so the update uses the gradient of the mini-batch
mean loss, as pipelab's emulator does (it scales each micro-batch loss by 1/M). With float64 the final
weights agree to rounding (tests: ≤ 1e-10 against :class:`pipelab.Emulator`).

Used by the tests as the torch-equivalence reference for exported schedules and by the benchmarks; it
runs only flushed (synchronous) one-step schedules with one rank per stage, the class torch can express.

Reference: ``torch.distributed.pipelining`` (PyTorch ≥ 2.5): ``PipelineStage``, ``_PipelineScheduleRuntime``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
        rank: this process's rank; stages: the stages it computes (increasing).
        weights: final weights of this rank's stages, ``k -> tuple`` in ``parameters()`` order.
        losses: mean loss of every mini-batch, on the rank that computes the last stage (empty elsewhere).
        actions: the action list torch executed on this rank (its ``pipeline_order_with_comms`` row, as text).
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
    :func:`pipelab.distributed.spawn`); rank w runs ``schedule.programs[w]``.

    Args:
        model: an ``nn.Sequential`` (cut into ``schedule.D`` stages by :func:`pipelab.partition.split` with
            ``balance``) or the D stage modules; the stages this rank computes are trained in place.
        schedule: a flushed schedule with ``steps = 1`` and one rank per stage (rules of
            :func:`~pipelab.schedules.torch_actions.to_torch`); it runs once per mini-batch.
        batches: mini-batches ``(x, y)``; each is cut into ``schedule.M`` micro-batches by torch.
        optimizer: factory ``params -> torch.optim.Optimizer``, called once per stage.
        loss_fn: ``loss_fn(output, target)``, a mean over the micro-batch.
        comms: export pipelab's SEND/RECV actions (``format="compute_comms"``) or only compute actions and
            let torch add the communication (``format="compute_only"``).
        device: where the stages run (``"cpu"`` with gloo; a CUDA device with NCCL).
        workdir: directory for the exported CSV (a temporary one by default).

    Returns:
        A :class:`TorchPipeliningResult`.

    Raises:
        RuntimeError: no process group, or its size is not ``schedule.W``.
        ValueError: a schedule torch cannot run (see :func:`~pipelab.schedules.torch_actions.to_torch`), a
            model that does not cut into ``schedule.D`` stages, no mini-batches.
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    if not dist.is_initialized():
        raise RuntimeError("run_torch_pipelining needs an initialised default process group (torchrun, or "
                           "pipelab.distributed.spawn)")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != schedule.W:
        raise RuntimeError(f"schedule {schedule.name!r} has {schedule.W} workers but the process group has {world} "
                           "ranks")
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
    first, last = 0 in mine, D - 1 in mine
    losses: list[float] = []
    for x, y in batches:
        for o in opts:
            o.zero_grad(set_to_none=True)
        micro: list[Tensor] = []
        args = (x.to(dev),) if first else ()
        runtime.step(*args, target=y.to(dev) if last else None, losses=micro if last else None)
        for o in opts:
            o.step()
        if last:
            losses.append(float(torch.stack([m.detach() for m in micro]).mean()))
    actions = [str(a) for a in runtime.pipeline_order_with_comms[rank]]
    weights = {k: tuple(p.detach().clone() for p in mods[k].parameters()) for k in mine}
    return TorchPipeliningResult(rank, mine, weights, losses, actions)
