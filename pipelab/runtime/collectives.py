"""The runtime's collectives: a placed schedule's all-reduce, reduce and broadcast with ``torch.distributed``.

The collectives and their order are the placed sequence's (:mod:`pipelab.pipeline.placement`: one order for all
members of a group, so no deadlock). :class:`DistributedCollectives` creates one process group per member set
(every rank, in first-appearance order, each with :func:`pipelab.distributed.comm_timeout`) and runs each
collective on flat per-dtype buffers on the rank's device. All-reduces are bucketed and overlapped like torch's DDP
(:func:`~pipelab.pipeline.placement.bucket_parts`): a bucket's all-reduce starts asynchronously once each of its
parts' :class:`~pipelab.pipeline.placement.Launch` arrived, and is waited for at the bucket's first entry.
Bytes count per part (:func:`~pipelab.pipeline.placement.collective_bytes`), calls per bucket.

References: S. Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training" (VLDB
2020); Y. Zhao et al., "PyTorch FSDP" (VLDB 2023).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..distributed import comm_timeout, waiting
from ..pipeline.placement import (
    Collective,
    CollectiveCounter,
    FetchedStage,
    Launch,
    PlacedJob,
    bucket_parts,
    step_gradient,
)
from ..pipeline.stage import StageExecutor
from ..precision import tensor_bytes

__all__ = ["DistributedCollectives", "flatten", "unflatten"]


def flatten(tensors: Sequence[Tensor]) -> list[Tensor]:
    """One contiguous buffer per dtype (in the order dtypes first appear) holding ``tensors``' values."""
    buckets: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        buckets.setdefault(t.dtype, []).append(t.detach().reshape(-1))
    return [torch.cat(parts) for parts in buckets.values()]


def unflatten(flats: Sequence[Tensor], like: Sequence[Tensor]) -> list[Tensor]:
    """The inverse of :func:`flatten`: tensors shaped like ``like`` (views into ``flats``)."""
    dtypes: list[torch.dtype] = []
    for t in like:
        if t.dtype not in dtypes:
            dtypes.append(t.dtype)
    offsets = dict.fromkeys(dtypes, 0)
    out = []
    for t in like:
        buf = flats[dtypes.index(t.dtype)]
        a = offsets[t.dtype]
        out.append(buf[a:a + t.numel()].view(t.shape))
        offsets[t.dtype] = a + t.numel()
    return out


def _reached(grads: Sequence[Tensor], reached: Sequence[bool]) -> list[Tensor]:
    """Which weights a gradient reached on this rank, as one small tensor reduced with the gradients (in their first
    dtype, so it travels in their buffer): its sum says which weights a gradient reached on any rank."""
    return [torch.tensor(reached, dtype=grads[0].dtype, device=grads[0].device)] if grads else []


def _reached_sums(sums: Sequence[Tensor], reached: Sequence[Tensor]) -> list[Tensor | None]:
    """The reduced gradients, ``None`` for a weight no rank's gradient reached (left out of the update)."""
    if not reached:
        return list(sums)
    return [g if r else None for g, r in zip(sums, (reached[0] > 0).tolist())]


class DistributedCollectives:
    """Run a placed schedule's collectives for rank ``rank`` (see the module docstring).

    Args:
        sequence: the global sequence (:attr:`pipelab.pipeline.plan.PipelinePlan.sequence`).
        bucket_bytes: cap on a fused all-reduce's payload (default :data:`pipelab.pipeline.placement.BUCKET_BYTES`,
            read now; 0: one all-reduce per stage).
        overlap: start all-reduces asynchronously at their ``Launch``; ``False``: blocking at the first entry.
    """

    def __init__(self, sequence: Sequence[PlacedJob | Collective], rank: int, bucket_bytes: int | None = None,
                 overlap: bool = True) -> None:
        from ..pipeline import placement

        self.rank = rank
        self.bucket_bytes = placement.BUCKET_BYTES if bucket_bytes is None else bucket_bytes
        if not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 0:
            raise ValueError(f"bucket_bytes must be a non-negative int, got {bucket_bytes!r}")
        self.overlap = bool(overlap)
        self.groups: dict[tuple[int, ...], Any] = {}
        timeout = comm_timeout() if dist.is_initialized() else None
        for e in sequence:
            if isinstance(e, Collective) and e.members not in self.groups:
                self.groups[e.members] = (dist.new_group(list(e.members), timeout=timeout) if dist.is_initialized()
                                          else None)
        self.counter = CollectiveCounter()
        self._launched: dict[tuple[tuple[int, int], ...], set[tuple[int, int]]] = {}
        self._inflight: dict[tuple[tuple[int, int], ...], tuple[list[Any], list[Tensor], list[Tensor]]] = {}
        self._done: set[tuple[tuple[int, int], ...]] = set()

    def _waiting(self, c: Collective) -> Any:
        """This rank blocked on the other members of ``c`` (:func:`pipelab.distributed.waiting`)."""
        return waiting((m for m in c.members if m != self.rank), f"the {c.kind} of stage {c.stage}, step {c.step}")

    def _bucket(self, c: Collective, executors: Mapping[int, StageExecutor]) -> tuple[tuple[int, int], ...]:
        def size(k: int) -> int:
            return tensor_bytes(executors[k].params)
        return bucket_parts(c, size, self.bucket_bytes)

    def _start(self, c: Collective, parts: tuple[tuple[int, int], ...], executors: Mapping[int, StageExecutor],
               async_op: bool) -> None:
        """Issue the bucket's all-reduce over its parts' flat gradients; count bytes per part, one call."""
        grads: list[Tensor] = []
        for i, (k, t) in enumerate(parts):
            g, reached = step_gradient(executors[k], t)
            grads.extend(g + _reached(g, reached))
            self.counter.add(c._replace(stage=k, step=t), self.rank, tensor_bytes(g),
                             calls=int(i == 0))
        flats = flatten(grads)
        with self._waiting(c):
            works = [dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.groups[c.members], async_op=async_op)
                     for buf in flats]
        self._inflight[parts] = (works if async_op else [], flats, grads)

    def _finish(self, c: Collective, parts: tuple[tuple[int, int], ...],
                executors: Mapping[int, StageExecutor]) -> None:
        works, flats, grads = self._inflight.pop(parts)
        with self._waiting(c):
            for w in works:
                w.wait()
        self._done.add(parts)
        if self.rank in c.holders:
            sums = unflatten(flats, grads)
            for k, t in parts:
                n = len(executors[k].params)
                executors[k].acc[t] = _reached_sums(sums[:n], sums[n:n + 1] if n else [])
                sums = sums[n + bool(n):]

    def __call__(self, c: Collective, executors: Mapping[int, StageExecutor]) -> None:
        """Run collective ``c`` on this rank's copy of stage ``c.stage`` (a :class:`Launch`: start it)."""
        if c.kind == "all_reduce":
            self._all_reduce(c, executors)
        elif not isinstance(c, Launch):  # only all-reduces are launched early
            run = self._broadcast if c.kind == "broadcast" else self._reduce
            self.counter.add(c, self.rank, run(c, executors[c.stage]))

    def _all_reduce(self, c: Collective, executors: Mapping[int, StageExecutor]) -> None:
        """A launch starts its bucket once every part is launched; the bucket's first entry waits for it (or runs
        it blocking), the later entries find it done."""
        parts = self._bucket(c, executors)
        if isinstance(c, Launch):
            ready = self._launched.setdefault(parts, set())
            ready.add((c.stage, c.step))
            if self.overlap and len(ready) == len(parts) and parts not in self._inflight and parts not in self._done:
                self._start(c, parts, executors, async_op=True)
            return
        if parts in self._done:
            return  # fused into a bucket already reduced at its first entry
        if parts not in self._inflight:
            self._start(c, parts, executors, async_op=False)
        self._finish(c, parts, executors)
        self._launched.pop(parts, None)

    def _broadcast(self, c: Collective, ex: StageExecutor) -> int:
        """The owner's version ``c.version`` to the members; a receiver stores it as a fetched version. Returns the
        weights' bytes."""
        if self.rank == c.root:
            flats = flatten(list(ex.ring.get(c.version)))
        else:
            like = [torch.empty_like(p) for p in ex.params]
            flats = [torch.empty(sum(t.numel() for t in like if t.dtype == d), dtype=d, device=like[0].device)
                     for d in dict.fromkeys(t.dtype for t in like)]
        with self._waiting(c):
            for buf in flats:
                dist.broadcast(buf, src=c.root, group=self.groups[c.members])
        if self.rank != c.root:
            if not isinstance(ex, FetchedStage):
                raise RuntimeError(f"rank {self.rank} receives stage {c.stage}'s weights but holds them")
            ex.receive_version(c.version, unflatten(flats, like))
        return tensor_bytes(flats)

    def _reduce(self, c: Collective, ex: StageExecutor) -> int:
        """The computing workers' step gradients summed onto the owner. Returns the gradients' bytes (what reached
        which weights travels beside them, uncounted)."""
        g, reached = step_gradient(ex, c.step)
        grads = g + _reached(g, reached)
        flats = flatten(grads)
        with self._waiting(c):
            for buf in flats:
                dist.reduce(buf, dst=c.root, op=dist.ReduceOp.SUM, group=self.groups[c.members])
        if self.rank in c.holders:
            sums = unflatten(flats, grads)
            ex.acc[c.step] = _reached_sums(sums[:len(g)], sums[len(g):])
        return tensor_bytes(g)

    def stats(self) -> dict[str, dict[str, int]]:
        """This rank's ``{"bytes_sent": {kind: bytes}, "bytes_received": {...}, "calls": {...}}``."""
        return self.counter.of(self.rank)
