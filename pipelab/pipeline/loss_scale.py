"""The run's fp16 loss scale (:class:`~pipelab.precision.LossScaling`) applied across the stage executors.

The rule, and why asynchronous schedules are refused, is in :mod:`pipelab.precision`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..precision import LossScaling
from ..schedules.dependencies import Job

if TYPE_CHECKING:
    from .stage import StageExecutor

__all__ = ["LossScaler", "defer_updates"]

def defer_updates(order: Sequence[Job]) -> list[Job]:
    """The execution order with every ``U(k, t)`` moved to step t's flush (after its last B/I/W).

    Versions are unchanged when no job of stage k lies between ``U(k, t)`` and the flush; otherwise (an
    asynchronous schedule) ValueError names the first such job.
    """
    flush: dict[int, int] = {}
    for i, (op, _, t, _) in enumerate(order):
        if op in ("B", "I", "W"):
            flush[t] = i
    out: list[Job] = []
    held: dict[int, list[Job]] = {}
    waiting: dict[int, Job] = {}  # stage -> its update still waiting for the flush
    for i, job in enumerate(order):
        op, k, t, _ = job
        if op == "U" and flush.get(t, -1) > i:
            held.setdefault(t, []).append(job)
            waiting[k] = job
            continue
        if k in waiting and op != "U":
            raise ValueError(f"fp16 loss scaling needs a flushed schedule: {job} of stage {k} runs after "
                             f"{waiting[k]} and before the last backward of step {waiting[k][2]}, so no skip "
                             "decision taken by every stage can precede it; use precision='bf16' (no loss scaling) "
                             "for asynchronous schedules")
        out.append(job)
        for u in held.pop(t, []) if flush.get(t) == i else []:
            out.append(u)
            waiting.pop(u[1], None)
    return out


class LossScaler:
    """The run's dynamic loss scale and its per-step skip decisions, shared by the stage executors of a process.

    Args:
        D: the stage count; when :attr:`members` cover fewer, the decision is ``all_reduce(MAX)`` over ranks.

    Attributes:
        scale: the current S (a float32 value); history: ``(t, S used, skipped)`` per decided step;
        local: ``t -> this process found a non-finite gradient`` (before the ranks agree).
    """

    def __init__(self, scaling: LossScaling, D: int) -> None:
        self.scaling, self.D = scaling, D
        self.scale = _f32(scaling.init_scale)
        self.growth_tracker = 0
        self.members: list[StageExecutor] = []
        self.decisions: dict[int, tuple[bool, float]] = {}
        self.seeded: dict[int, float] = {}
        self.history: list[tuple[int, float, bool]] = []
        self.local: dict[int, bool] = {}
        #: combines this process's overflow flag with the other ranks' (default: all_reduce MAX when needed)
        self.agree: Callable[[bool], bool] = self._all_reduce

    def seed(self, t: int) -> float:
        """S for a backward of step t (the last stage's seed); the same for all of step t's micro-batches."""
        s = self.seeded.setdefault(t, self.scale)
        if s != self.scale:
            raise RuntimeError(f"loss scale changed within step {t} ({s} -> {self.scale}): the schedule is not flushed")
        return s

    def decide(self, t: int) -> tuple[bool, float]:
        """``(skipped, S)`` of step t: taken at the first update of step t, then read by the others."""
        if t not in self.decisions:
            for ex in self.members:
                left = []
                for i in range(ex.position, len(ex.events)):  # a flushed stage's step t comes before t + 1
                    e = ex.events[i]
                    if e[1] > t:
                        break
                    if e[0] != "U" and e[1] == t:
                        left.append(e)
                if left:
                    raise RuntimeError(f"fp16 loss scaling: stage {ex.k} updates step {t} before its jobs {left[:3]} "
                                       "ran; the skip decision needs every backward of the step (a flushed schedule "
                                       "whose updates follow the flush on every worker)")
            local = any(not bool(torch.isfinite(g).all()) for ex in self.members for g in ex.acc.get(t, ())
                        if g is not None)
            self.local[t] = local
            skipped = self.agree(local)
            used = self.seeded.pop(t, self.scale)
            self.decisions[t] = (skipped, used)
            self.history.append((t, used, skipped))
            self._update(skipped)
        return self.decisions[t]

    def unscale(self, t: int, grads: Sequence[Tensor | None]) -> list[Tensor | None]:
        """``g · (1/S)`` with GradScaler's reciprocal (float64 1/S rounded to float32), in each gradient's dtype
        (None, a weight no gradient reached, stays None)."""
        inv = torch.tensor(self.decisions[t][1], dtype=torch.float64).reciprocal().float()
        return [None if g is None else g * inv.to(g.device) for g in grads]

    def _update(self, skipped: bool) -> None:
        """GradScaler's update: back off on overflow, grow after ``growth_interval`` clean steps."""
        sc = self.scaling
        if skipped:
            self.scale, self.growth_tracker = _f32(self.scale * sc.backoff_factor), 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == sc.growth_interval:
            self.scale, self.growth_tracker = _f32(self.scale * sc.growth_factor), 0

    def _all_reduce(self, local: bool) -> bool:
        covered = {ex.k for ex in self.members}
        if len(covered) >= self.D:
            return local
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(f"fp16 loss scaling over stages {sorted(covered)} of {self.D} needs the other stages' "
                               "overflow flags: initialise torch.distributed (the runtime) or build every stage")
        device = next((p.device for ex in self.members for p in ex.params), torch.device("cpu"))
        flag = torch.tensor([1.0 if local else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker, "decisions": dict(self.decisions),
                "history": list(self.history), "local": dict(self.local), "seeded": dict(self.seeded)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.growth_tracker = state["scale"], state["growth_tracker"]
        self.decisions, self.history = dict(state["decisions"]), list(state["history"])
        self.local, self.seeded = dict(state.get("local", {})), dict(state.get("seeded", {}))


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))
