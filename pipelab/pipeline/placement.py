"""Placements executed: who computes and who holds each stage, and the collectives of a step.

A schedule fixes Rahimi's w(s, b, d): compute workers C_k (``programs``) and holders H_k (``weight_holders``).
A stage is ``single`` (C_k = H_k = {w}: no collective), ``replicated`` (C_k ⊆ H_k, |H_k| > 1: DDP, LPP,
DualPipe; ``g = Σ_{h ∈ H_k} g_h`` by all-reduce before U(k, t)) or ``sharded`` (C_k ⊄ H_k: FSDP, FSLPP,
ZeRO-3; a non-holder receives the version its job uses from the owner H_k[0] by broadcast, has no optimizer,
and its gradient is reduced onto the holders).

One global sequence (:func:`placed_sequence`) puts the reduction of (k, t) before the first holder's U(k, t)
and a broadcast after the update that made its version: a linearisation in which every send precedes its
receive, so a blocking runtime following its part cannot deadlock and every rank issues each group's
collectives in the same order. Buckets (torch DDP, Li et al. 2020, §3.2.3): replicated all-reduces are deferred
to their first use, and runs of them with nothing of their members in between are fused (moving a later one up
keeps the linearisation), cut at ``bucket_bytes``; a worker launches a bucket once its last B/W of every part is
done, never before an earlier collective, and waits at the bucket's first U.

References: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025): w(s, b, d) and the
note's remark that DDP, FSDP, PP, LPP and FSLPP are one master schedule with different placements;
S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC 2020),
stage 3; Y. Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023);
S. Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training" (VLDB 2020).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..precision import tensor_bytes
from ..schedules.actions import gc_paused
from ..schedules.dependencies import Job
from .stage import StageExecutor, trainable_parameters

__all__ = ["KINDS", "COLLECTIVE_KINDS", "StagePlacement", "Collective", "PlacedJob", "stage_placements",
           "is_placed", "placed_sequence", "worker_sequence", "collective_bytes", "FetchedStage",
           "emulate_collective", "CollectiveCounter", "step_gradient", "BUCKET_BYTES", "Launch",
           "bucket_parts", "launch_positions"]

#: Placement kinds of a stage.
KINDS: tuple[str, ...] = ("single", "replicated", "sharded")
#: Collectives a placed schedule issues.
COLLECTIVE_KINDS: tuple[str, ...] = ("all_reduce", "reduce", "broadcast")
#: Default cap on a fused all-reduce's payload in bytes (torch DDP's ``bucket_cap_mb=25``); read at call time,
#: so setting it (e.g. to 0: one all-reduce per stage) changes the executors' default.
BUCKET_BYTES: int = 25 * 2**20


@dataclass(frozen=True)
class StagePlacement:
    """Stage k's compute workers C_k, holders H_k (H_k[0] is the owner non-holders fetch from) and kind."""

    stage: int
    compute: tuple[int, ...]
    holders: tuple[int, ...]
    kind: str


class PlacedJob(NamedTuple):
    """A job of the global sequence with the worker that runs it (U: one entry per holder)."""

    op: str
    stage: int
    step: int
    micro: int
    worker: int


class Collective(NamedTuple):
    """One collective of the global sequence.

    Attributes:
        step: the gradient's step; for a broadcast, the step of the update that made ``version`` (−1: version 0).
        version: the version a broadcast carries (−1 for the reductions).
        root: the reduce's destination or the broadcast's source (−1 for an all-reduce).
        holders: the members that keep the result (a broadcast's receivers).
        bucket: the ``(stage, step)`` parts of a fusable all-reduce's run, itself included; ``()`` alone.
    """

    kind: str
    stage: int
    step: int
    version: int
    members: tuple[int, ...]
    root: int
    holders: tuple[int, ...]
    bucket: tuple[tuple[int, int], ...] = ()


class Launch(Collective):
    """The early start of an all-reduce (:func:`launch_positions`); the emulator ignores it."""


def stage_placements(schedule: Any) -> tuple[StagePlacement, ...]:
    """C_k, H_k and the kind (``single`` / ``replicated`` / ``sharded``) of every stage of ``schedule``."""
    computing: list[set[int]] = [set() for _ in range(schedule.D)]
    for w, prog in enumerate(schedule.programs):  # one pass over the jobs (Schedule.stage_workers for all k)
        for k in {a.stage for a in prog if a.op != "U"}:
            computing[k].add(w)
    out = []
    for k in range(schedule.D):
        compute, holders = tuple(sorted(computing[k])), tuple(schedule.weight_holders[k])
        kind = ("single" if len(holders) == 1 else "replicated") if set(compute) <= set(holders) else "sharded"
        out.append(StagePlacement(k, compute, holders, kind))
    return tuple(out)


def is_placed(schedule: Any) -> bool:
    """True when some stage is computed or held by more than one worker (a collective is needed)."""
    return hasattr(schedule, "programs") and any(p.kind != "single" for p in stage_placements(schedule))


def _grad_collective(p: StagePlacement, t: int, computed: set[int]) -> Collective | None:
    members = tuple(sorted(set(p.holders) | computed))
    if len(members) < 2:
        return None
    if len(p.holders) == 1:
        return Collective("reduce", p.stage, t, -1, members, p.holders[0], p.holders)
    return Collective("all_reduce", p.stage, t, -1, members, -1, tuple(sorted(p.holders)))


@gc_paused
def placed_sequence(sim: Any, needs: Callable[[Job], int] | None = None) -> list[PlacedJob | Collective]:
    """The global sequence of a placed schedule: every action with its worker, and the collectives.

    ``sim``: the schedule's simulation (its execution order places the events); ``needs``: ``job -> v``, the stored
    version each compute job reads, fetched by a non-holder (``None``: reductions only). ValueError when the timeline
    cannot host the collectives (a job before the weights it needs).
    """
    s = sim.schedule
    places = stage_placements(s)
    flat = [(w, a) for w, prog in enumerate(s.programs) for a in prog]
    receivers: dict[tuple[int, int], set[int]] = defaultdict(set)
    computed: dict[tuple[int, int], set[int]] = defaultdict(set)
    for w, a in flat:
        if a.op == "U":
            continue
        if needs is not None and w not in places[a.stage].holders:
            receivers[(a.stage, needs((a.op, a.stage, a.step, a.micro)))].add(w)
        if a.op in ("B", "W"):
            computed[(a.stage, a.step)].add(w)

    def broadcast(k: int, v: int, after: int) -> Collective:
        owner = places[k].holders[0]
        got = tuple(sorted(receivers[(k, v)]))
        return Collective("broadcast", k, after, v, tuple(sorted({owner, *got})), owner, got)

    out: list[PlacedJob | Collective] = [broadcast(k, 0, -1) for k in range(s.D) if receivers.get((k, 0))]
    reduced: set[tuple[int, int]] = set()
    made: dict[int, int] = defaultdict(int)  # updates the owner of stage k has run
    for i in sim.order_ids().tolist():
        w, a = flat[i]
        if a.op == "U":
            if (a.stage, a.step) not in reduced:
                reduced.add((a.stage, a.step))
                c = _grad_collective(places[a.stage], a.step, computed[(a.stage, a.step)])
                if c is not None:
                    out.append(c)
            out.append(PlacedJob("U", a.stage, a.step, -1, w))
            if w == places[a.stage].holders[0]:
                made[a.stage] += 1
                if receivers.get((a.stage, made[a.stage])):
                    out.append(broadcast(a.stage, made[a.stage], a.step))
        else:
            out.append(PlacedJob(a.op, a.stage, a.step, a.micro, w))
    out = _defer_updates(out, places)
    _check_sequence(out, places, needs)
    return _mark_runs(out)


def _defer_updates(seq: list[PlacedJob | Collective], places: Sequence[StagePlacement]
                   ) -> list[PlacedJob | Collective]:
    """Move each replicated all-reduce of (k, t) and its U(k, t), in order, down to the first entry that needs them."""
    out: list[PlacedJob | Collective] = []
    pending: dict[tuple[int, int], tuple[set[int], list[PlacedJob | Collective]]] = {}

    def flush(upto: tuple[int, int]) -> None:
        for key in list(pending):
            out.extend(pending.pop(key)[1])
            if key == upto:
                return

    for e in seq:
        if isinstance(e, Collective) and e.kind == "all_reduce" and places[e.stage].kind == "replicated" \
                and (e.stage, e.step) not in pending:
            pending[(e.stage, e.step)] = (set(e.members), [e])
            continue
        if not isinstance(e, Collective) and e.op == "U" and (e.stage, e.step) in pending:
            pending[(e.stage, e.step)][1].append(e)
            continue
        if isinstance(e, Collective) and e.kind == "broadcast":
            hit = []  # weights of another (sharded) stage: independent of the pending gradients and updates
        elif isinstance(e, Collective):
            hit = [key for key, (m, _) in pending.items() if m & set(e.members)]
        else:
            hit = [key for key, (m, _) in pending.items() if e.worker in m and key[0] == e.stage]
        if hit:
            flush(hit[-1])
        out.append(e)
    flush((-1, -1))
    return out


def _mark_runs(seq: list[PlacedJob | Collective]) -> list[PlacedJob | Collective]:
    """Set :attr:`Collective.bucket` on the all-reduces that form runs."""
    runs: list[list[int]] = []
    # open runs by (members, holders): the members as a set, made once per all-reduce, and the run's positions;
    # a job then tests its worker against each open run in O(1), not against a set of W members built per job
    open_runs: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[frozenset[int], list[int]]] = {}
    for i, e in enumerate(seq):
        if isinstance(e, Collective) and e.kind == "all_reduce":
            key, mine = (e.members, e.holders), frozenset(e.members)
            for other in [o for o, (m, _) in open_runs.items() if o != key and m & mine]:
                runs.append(open_runs.pop(other)[1])
            open_runs.setdefault(key, (mine, []))[1].append(i)
            continue
        if isinstance(e, Collective):
            if e.kind == "broadcast":
                continue
            touched = frozenset(e.members)
            hit = [o for o, (m, _) in open_runs.items() if m & touched]
        elif e.op == "U":
            continue
        else:
            hit = [o for o, (m, _) in open_runs.items() if e.worker in m]
        for key in hit:
            runs.append(open_runs.pop(key)[1])
    runs.extend(run for _, run in open_runs.values())
    out = list(seq)
    for run in runs:
        if len(run) > 1:
            parts = tuple((seq[i].stage, seq[i].step) for i in run)
            for i in run:
                c = seq[i]
                assert isinstance(c, Collective)
                out[i] = c._replace(bucket=parts)
    return out


def bucket_parts(c: Collective, nbytes: Callable[[int], int], bucket_bytes: int | None = None
                 ) -> tuple[tuple[int, int], ...]:
    """The ``(stage, step)`` parts of the bucket all-reduce ``c`` is fused into, under a ``bucket_bytes`` cap.

    The run is cut greedily in order; a part larger than the cap is a bucket alone; default :data:`BUCKET_BYTES`,
    0: one all-reduce per stage.
    """
    cap = BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    if not isinstance(cap, int) or cap < 0:
        raise ValueError(f"bucket_bytes must be a non-negative int, got {cap!r}")
    me = (c.stage, c.step)
    if c.kind != "all_reduce" or not c.bucket:
        return (me,)
    current: list[tuple[int, int]] = []
    size = 0
    for part in c.bucket:
        n = nbytes(part[0])
        if current and size + n > cap:
            if me in current:
                return tuple(current)
            current, size = [], 0
        current.append(part)
        size += n
    if me not in current:
        raise ValueError(f"all-reduce of stage {c.stage}, step {c.step} is not part of its own run {c.bucket}")
    return tuple(current)


def launch_positions(program: Sequence[Any]) -> dict[int, int]:
    """``position of an all-reduce -> position before which it is launched`` in one worker's program.

    ``L(c) = max(1 + last B/W position of c's (stage, step), L of the previous collective)``, a blocking
    collective's L being its own position.
    """
    last_grad: dict[tuple[int, int], int] = {}
    for pos, e in enumerate(program):
        if not isinstance(e, Collective) and e[0] in ("B", "W"):
            last_grad[(e[1], e[2])] = pos
    out: dict[int, int] = {}
    floor = 0
    for pos, e in enumerate(program):
        if not isinstance(e, Collective):
            continue
        if e.kind == "all_reduce":
            floor = min(max(floor, 1 + last_grad.get((e.stage, e.step), -1)), pos)
            out[pos] = floor
        else:
            floor = max(floor, pos)
    return out


def _check_sequence(seq: Sequence[PlacedJob | Collective], places: Sequence[StagePlacement],
                    needs: Callable[[Job], int] | None) -> None:
    """Every fetched version arrives before its use and every reduction follows the gradients it sums."""
    have: set[tuple[int, int, int]] = set()
    reduced: set[tuple[int, int]] = set()
    for e in seq:
        if isinstance(e, Collective):
            if e.kind == "broadcast":
                have.update((w, e.stage, e.version) for w in e.holders)
            else:
                reduced.add((e.stage, e.step))
            continue
        if e.op == "U":
            continue
        if (e.stage, e.step) in reduced and e.op in ("B", "W"):
            raise ValueError(f"{e.op}{e.stage}.{e.micro} of step {e.step} on worker {e.worker} runs after its "
                             "step's gradient reduction; the schedule's timeline cannot host the collectives")
        if needs is not None and e.worker not in places[e.stage].holders:
            v = needs((e.op, e.stage, e.step, e.micro))
            if (e.worker, e.stage, v) not in have:
                raise ValueError(f"{e.op}{e.stage}.{e.micro} of step {e.step} on worker {e.worker} uses "
                                 f"version {v} of stage {e.stage} before it is fetched")


def worker_sequence(seq: Sequence[PlacedJob | Collective], w: int) -> list[PlacedJob | Collective]:
    """Worker w's part of the global sequence: its jobs and the collectives it is a member of."""
    return [e for e in seq if (w in e.members if isinstance(e, Collective) else e.worker == w)]


def collective_bytes(kind: str, nbytes: int, members: int, rank_is_root: bool) -> tuple[int, int]:
    """``(sent, received)`` bytes of one rank in a collective over an n-byte payload among P members.

    Broadcast: root sends (P−1)n, others receive n; reduce: non-roots send n, root receives (P−1)n; all-reduce:
    2(P−1)n/P both ways (the ring's volume, rounded down).
    """
    P = members
    if kind == "all_reduce":
        vol = 2 * (P - 1) * nbytes // P
        return vol, vol
    if kind == "broadcast":
        return ((P - 1) * nbytes, 0) if rank_is_root else (0, nbytes)
    if kind == "reduce":
        return (0, (P - 1) * nbytes) if rank_is_root else (nbytes, 0)
    raise ValueError(f"kind must be one of {COLLECTIVE_KINDS}, got {kind!r}")


class CollectiveCounter:
    """Bytes sent and received, and calls, per rank and collective kind (``rank -> {kind -> n}``)."""

    def __init__(self) -> None:
        self.bytes_sent: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.bytes_received: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.calls: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, c: Collective, rank: int, nbytes: int, calls: int = 1) -> None:
        """Count ``c``'s payload for ``rank``; ``calls`` is 0 for a fused part (bytes count per part)."""
        sent, got = collective_bytes(c.kind, nbytes, len(c.members), rank == c.root)
        self.bytes_sent[rank][c.kind] += sent
        self.bytes_received[rank][c.kind] += got
        if calls:
            self.calls[rank][c.kind] += calls

    def of(self, rank: int) -> dict[str, dict[str, int]]:
        """Plain dicts for one rank: ``{"bytes_sent": {...}, "bytes_received": {...}, "calls": {...}}``."""
        return {"bytes_sent": dict(self.bytes_sent[rank]), "bytes_received": dict(self.bytes_received[rank]),
                "calls": dict(self.calls[rank])}


class FetchedStage(StageExecutor):
    """A computing non-holder's copy of stage k (sharded): weights arrive, gradients leave; no optimizer, no update."""

    def __init__(self, k: int, D: int, M: int, module: nn.Module, events: Any, specs: Any, policy: Any, table: Any,
                 loss_fn: Callable[[Tensor, Tensor], Tensor], recompute: bool = False, precision: Any = None) -> None:
        params = trainable_parameters(module)
        # the base class checks that an optimizer holds exactly the stage's parameters; this copy never steps,
        # so a throwaway optimizer satisfies the check and is then discarded
        stand_in = torch.optim.SGD(params, lr=0.0) if params else None
        super().__init__(k, D, M, module, stand_in, events, specs, policy, table, loss_fn, recompute,
                         **({} if precision is None else {"precision": precision}))
        self.optimizer = None
        self.share_live, self.ring.recycle = False, False  # it receives its versions: none to write into a retired one
        self.ring.drop(0)
        self.ring.peak = 0
        self.version = -1  # nothing received yet

    def receive_version(self, v: int, W: Sequence[Tensor]) -> None:
        """Store W_k^(v), received from the owner; it becomes this copy's newest version."""
        old = self.version
        if old >= 0 and not self.uses[old]:
            self.ring.drop(old)
        self.ring.put(v, tuple(w.detach().requires_grad_(p.requires_grad) for w, p in zip(W, self.params)))
        self.version = max(v, old)

    def update(self, t: int) -> tuple[Tensor, ...]:
        raise RuntimeError(f"stage {self.k}: a non-holder copy does not update (the owner does)")


def step_gradient(ex: StageExecutor, t: int) -> tuple[list[Tensor], list[bool]]:
    """The gradient stage copy ``ex`` accumulated in step t, taken out, and which weights a gradient reached: zeros
    where none did (every copy sends every weight, so the collectives match); a weight no copy's gradient reached
    is left out of the update, as plain torch leaves out a parameter whose ``.grad`` is ``None``."""
    g = ex.acc.pop(t, None) or [None] * len(ex.params)
    return [torch.zeros_like(p) if x is None else x for x, p in zip(g, ex.params)], [x is not None for x in g]


def emulate_collective(c: Collective, copies: Mapping[tuple[int, int], StageExecutor],
                       counter: CollectiveCounter | None = None, bucket_bytes: int | None = None) -> None:
    """Run collective ``c`` in memory on the stage copies ``(worker, stage) -> executor``.

    Reductions sum in rank order and give each holder its own copy; a fused all-reduce is summed part by part (the
    same sums as one flat buffer) and counted as one call per bucket.
    """
    if isinstance(c, Launch):
        return
    k = c.stage
    if c.kind == "broadcast":
        src = copies[(c.root, k)]
        W = src.ring.get(c.version)
        nbytes = tensor_bytes(W)
        for w in c.holders:
            cast_copy = copies[(w, k)]
            assert isinstance(cast_copy, FetchedStage)
            cast_copy.receive_version(c.version, [x.detach().clone() for x in W])
    else:
        parts = [step_gradient(copies[(w, k)], c.step) for w in c.members]
        total = [g.clone() for g in parts[0][0]]
        for g, _ in parts[1:]:
            if total:
                torch._foreach_add_(total, g)
        reached = [any(r) for r in zip(*(r for _, r in parts))]
        nbytes = tensor_bytes(total)
        for w in c.holders:
            copies[(w, k)].acc[c.step] = [g.clone() if r else None for g, r in zip(total, reached)]
    if counter is not None:
        calls = 1
        if c.bucket:
            def size(stage: int) -> int:
                return tensor_bytes(copies[(c.members[0], stage)].params)
            calls = int(bucket_parts(c, size, bucket_bytes)[0] == (c.stage, c.step))
        for w in c.members:
            counter.add(c, w, nbytes, calls)


def copy_module(module: nn.Module) -> nn.Module:
    """An independent copy of a stage module (a replica's or a non-holder's own weights in the emulator)."""
    return copy.deepcopy(module)
