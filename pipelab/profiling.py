"""Stage profiler: measured per-stage costs of a model cut into pipeline stages, in the simulator's terms.

Per stage and micro-batch, medians over ``reps`` after ``warmup`` runs: ``f_cost`` (F from the stage input,
earlier stages untimed), ``b_cost`` (B from the loss at the last stage, ones elsewhere), ``i_cost``/``w_cost``
(the split backward, Qi et al., ICLR 2024; stage 0's I costs ~0), ``u_cost`` (one ``optimizer.step()``),
``copy_cost`` (cloning the weights); and the exact ``activation_bytes`` (saved tensors, parameters excluded,
each storage once), ``weight_bytes`` of the trainable parameters (what is versioned, stepped and sent) and
``frozen_bytes`` of the frozen ones (held once). Copies of the stages are profiled.

References: PipeDream (Narayanan et al., SOSP 2019, §3.1: profile each layer's compute time, activation
and weight sizes, then plan the pipeline from them).
"""

from __future__ import annotations

import copy
import numbers
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .optim import OptimizerFactory
from .pipeline.transport import grad_leaves, map_tensors, modifies_leaf_in_place, tensors_of
from .precision import tensor_bytes
from .threads import torch_threads

__all__ = ["StageCosts", "StageProfile", "profile_stage", "profile_stages", "transfer_times"]



@dataclass(frozen=True)
class StageCosts:
    """Measured costs of one stage for one micro-batch: seconds (``f``, ``b``, ``u``, ``copy``, ``i``, ``w``)
    and bytes: ``weight_bytes`` of the trainable parameters (versioned, stepped and sent), ``frozen_bytes`` of the
    frozen ones (held once)."""

    f: float
    b: float
    u: float
    copy: float
    activation_bytes: int
    weight_bytes: int
    i: float
    w: float
    frozen_bytes: int = 0


@dataclass(frozen=True)
class StageProfile:
    """Per-stage costs (lists of D values), named as :func:`pipelab.simulator.costs_from_profile` reads."""

    f_cost: list[float]
    b_cost: list[float]
    u_cost: list[float]
    copy_cost: list[float]
    activation_bytes: list[int]
    weight_bytes: list[int]
    i_cost: list[float]
    w_cost: list[float]
    frozen_bytes: list[int] | None = None  # per stage, the frozen parameters' bytes (None: none measured)

    @property
    def D(self) -> int:
        """Number of stages."""
        return len(self.f_cost)

    def costs(self) -> dict[str, list[float] | list[int]]:
        """Keyword arguments of :func:`pipelab.simulator.simulate`: F, B, U, I and W costs and the byte sizes."""
        return {"f_cost": list(self.f_cost), "b_cost": list(self.b_cost), "u_cost": list(self.u_cost),
                "i_cost": list(self.i_cost), "w_cost": list(self.w_cost),
                "activation_bytes": list(self.activation_bytes), "weight_bytes": list(self.weight_bytes)}


def _check_counts(reps: object, warmup: object) -> None:
    if isinstance(reps, bool) or not isinstance(reps, numbers.Integral) or reps < 1:
        raise ValueError(f"reps must be an int >= 1, got {reps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, numbers.Integral) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _median_time(fn: Callable[[], object], device: torch.device, reps: int, warmup: int) -> float:
    times = [_timed(fn, device) for _ in range(warmup + reps)]
    return statistics.median(times[warmup:])


def _saved_bytes(run: Callable[[], object], params: Sequence[Tensor]) -> int:
    """Bytes of the tensors autograd saves while ``run`` executes, parameters excluded, each storage once."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def profile_stage(stage: nn.Module, x: Any, target: Tensor | None = None, *,
                  loss_fn: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy,
                  optimizer: OptimizerFactory | None = None, reps: int = 20, warmup: int = 3,
                  input_grad: bool = True) -> StageCosts:
    """Measure one stage for the micro-batch input ``x``, on ``x``'s device (a copy of ``stage`` is profiled).

    ``x`` and the stage's output may be a tensor, a tuple or a dict of tensors (a pipeline's hand-over: only the
    floating-point tensors carry gradients). ``target``: labels at the last stage (else the backward starts from
    ones on every output that needs a gradient); ``optimizer``: the factory whose ``step`` is timed (default SGD);
    ``input_grad``: the input needs a gradient (every stage but the first).
    """
    if not isinstance(stage, nn.Module):
        raise TypeError(f"stage must be a torch.nn.Module, got {type(stage).__name__}")
    if not tensors_of(x):
        raise TypeError(f"x must be a torch.Tensor, or a tuple or dict of them (the stage's input), got "
                        f"{type(x).__name__}")
    _check_counts(reps, warmup)
    device = tensors_of(x)[0].device
    mod = copy.deepcopy(stage)
    params = [p for p in mod.parameters() if p.requires_grad]
    make = optimizer if optimizer is not None else (lambda ps: torch.optim.SGD(ps, lr=1e-3))
    opt = make(params) if params else None  # a block without parameters (an activation) has no update
    state: dict[str, Any] = {}

    def fwd() -> None:
        inp = map_tensors(lambda t: t.detach().requires_grad_(input_grad and t.is_floating_point()), x)
        state["inputs"] = [t for t in grad_leaves(inp) if t.requires_grad]
        with torch.enable_grad():
            try:  # a stage that modifies its input in place gets a copy, as the pipeline's stages do
                out = mod(map_tensors(Tensor.clone, inp) if state.get("copy") else inp)
            except RuntimeError as exc:
                if state.get("copy") or not modifies_leaf_in_place(exc):
                    raise
                state["copy"] = True
                out = mod(map_tensors(Tensor.clone, inp))
            if target is not None:
                out = loss_fn(out, target)
        # the outputs a backward starts from (the loss; else every floating output needing a gradient, seeded 1)
        outs = [out] if target is not None else [o for o in grad_leaves(out) if o.requires_grad]
        state["outs"], state["seeds"] = outs, None if target is not None else [torch.ones_like(o) for o in outs]

    def bwd() -> None:
        outs, seeds = state.pop("outs"), state.pop("seeds")
        if outs:
            torch.autograd.backward(outs, seeds)

    def i_pass() -> None:  # the input gradient alone, keeping the graph for W (as StageExecutor.input_grad)
        if state["outs"] and state["inputs"]:
            torch.autograd.grad(state["outs"], state["inputs"], state["seeds"], retain_graph=True, allow_unused=True)

    def w_pass() -> None:
        outs, seeds = state.pop("outs"), state.pop("seeds")
        if params and outs:
            torch.autograd.grad(outs, params, seeds, allow_unused=True)

    activation_bytes = _saved_bytes(fwd, params)
    copies = state.get("copy", False)
    state.clear()
    state["copy"] = copies
    f_times, b_times, i_times, w_times = [], [], [], []
    for _ in range(warmup + reps):  # F and B alternate, as in a pipeline; then F, I, W of a split backward
        f_times.append(_timed(fwd, device))
        b_times.append(_timed(bwd, device))
        fwd()
        i_times.append(_timed(i_pass, device))
        w_times.append(_timed(w_pass, device))
    u = _median_time(opt.step, device, reps, warmup) if opt is not None else 0.0
    copy_t = _median_time(lambda: [p.detach().clone() for p in params], device, reps, warmup)
    return StageCosts(f=statistics.median(f_times[warmup:]), b=statistics.median(b_times[warmup:]), u=u,
                      copy=copy_t, activation_bytes=activation_bytes,
                      weight_bytes=tensor_bytes(params),
                      frozen_bytes=tensor_bytes(p for p in mod.parameters() if not p.requires_grad),
                      i=statistics.median(i_times[warmup:]), w=statistics.median(w_times[warmup:]))


def profile_stages(stages: Sequence[nn.Module], x: Any, target: Tensor, *,
                   loss_fn: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy,
                   optimizer: OptimizerFactory | None = None, reps: int = 20, warmup: int = 3,
                   threads: int | None = None) -> StageProfile:
    """Profile every stage of a pipeline in this process for one micro-batch ``(x, target)``.

    Stage k's input is stages 0..k−1 on ``x`` (untimed); each stage is measured by :func:`profile_stage`.
    ``threads``: intra-op threads while profiling (a pipeline worker usually runs with one).
    """
    if isinstance(stages, nn.Module) and not isinstance(stages, nn.ModuleList):
        raise TypeError("stages must be a sequence of stage modules, e.g. pipelab.split(model, D), not one module")
    stages = list(stages)
    if not stages or not all(isinstance(s, nn.Module) for s in stages):
        raise TypeError("stages must be a non-empty sequence of torch.nn.Module stages")
    _check_counts(reps, warmup)
    last = len(stages) - 1
    rows = []
    with torch_threads(threads):
        h = x
        for k, stage in enumerate(stages):
            rows.append(profile_stage(stage, h, target if k == last else None, loss_fn=loss_fn,
                                      optimizer=optimizer, reps=reps, warmup=warmup, input_grad=k > 0))
            if k < last:
                with torch.no_grad():
                    h = stage(h)
    return StageProfile(f_cost=[r.f for r in rows], b_cost=[r.b for r in rows], u_cost=[r.u for r in rows],
                        copy_cost=[r.copy for r in rows], activation_bytes=[r.activation_bytes for r in rows],
                        weight_bytes=[r.weight_bytes for r in rows], i_cost=[r.i for r in rows],
                        w_cost=[r.w for r in rows], frozen_bytes=[r.frozen_bytes for r in rows])


def transfer_times(output: Tensor | None, inp: Tensor | None, *, reps: int = 20, warmup: int = 3) -> list[float]:
    """One-way time of an activation across every stage boundary, by ping-pong between neighbouring ranks.

    Collective over the default group, rank k holding stage k (``output`` None on the last rank, ``inp`` None on
    rank 0): half the median round trip per boundary, the same on every rank (the simulator's ``transfer_cost``).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("transfer_times needs an initialised torch.distributed process group")
    _check_counts(reps, warmup)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank < world - 1 and output is None:
        raise ValueError(f"rank {rank} sends to rank {rank + 1}: output must be its stage's output, got None")
    if rank > 0 and inp is None:
        raise ValueError(f"rank {rank} receives from rank {rank - 1}: inp must be its stage's input, got None")
    ref = output if output is not None else inp
    device = ref.device if ref is not None else torch.device("cpu")
    times = torch.zeros(max(world - 1, 0), dtype=torch.float64, device=device)
    for k in range(world - 1):
        dist.barrier()
        if rank in (k, k + 1):
            peer = k + 1 if rank == k else k
            like = output if rank == k else inp
            assert like is not None  # checked above
            act = torch.zeros_like(like)  # stage k's output = stage k+1's input
            buf = torch.empty_like(act)
            rts = []
            for _ in range(warmup + reps):
                _sync(device)
                t0 = time.perf_counter()
                if rank == k:
                    dist.send(act, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(act, peer)
                _sync(device)
                rts.append(time.perf_counter() - t0)
            if rank == k:
                times[k] = statistics.median(rts[warmup:]) / 2
    dist.barrier()
    if world > 1:
        dist.all_reduce(times)  # each boundary was measured by its sender only
    return [float(t) for t in times.cpu()]
