"""Placements executed: who computes and who holds each stage, and the collectives of a step.

A :class:`~pipelab.schedules.Schedule` fixes Rahimi's two placement functions w(s, b, d) =
(w_weights(s), w_compute(s, b, d)): ``programs[w]`` says where each job runs, ``weight_holders[k]`` who
holds stage k's weights. For every stage k this module derives its compute workers C_k, its holders H_k
and its *kind*:

- ``single``: C_k = H_k = {w} (GPipe, 1F1B, PipeDream, interleaved, folded): no collective;
- ``replicated``: every computing worker holds a copy, C_k ⊆ H_k, |H_k| > 1 (DDP, LPP, DualPipe, hybrid
  PP × DP): each holder h accumulates its own micro-batches' gradient g_h, and before U(k, t)

      g = Σ_{h ∈ H_k} g_h            (all-reduce, sum, among H_k)

  so that every holder applies the same update W_k^(v+1) = U(W_k^(v), g) and the copies stay equal;
- ``sharded``: some worker computes stage k without holding it, C_k ⊄ H_k (FSDP, FSLPP: the holders own the
  weights and the optimizer state, ZeRO-3's "parameter + gradient + optimizer-state partitioning"). Before a
  non-holder w first runs a job of stage k that uses version v it receives W_k^(v) from the owner H_k[0]
  (a broadcast among the owner and every non-holder that uses v; with the whole stage as the shard this is
  FSDP's all-gather), and before U(k, t) the computing workers' gradients are reduced onto the holder:

      g = Σ_{w ∈ C_k(t) ∪ H_k} g_w   at H_k[0] (reduce; with several holders an all-reduce among
                                      C_k(t) ∪ H_k, the holders keeping the sum: reduce-scatter + copy).

  The version a non-holder fetches is the one its job uses (the policy's stored version, read from the
  version table); a non-holder holds no optimizer, so it cannot predict weights.

Where the collectives go (:func:`placed_sequence`): the simulator's execution order lists every action
(each holder's U included) at its effective time; the gradient collective of (k, t) is put right before the
first holder's U(k, t) (after every B/W of (k, t): U waits for them), the broadcast of W_k^(v) right after
the owner's update that made v (version 0: at the start). That one global sequence, restricted to worker w
(its jobs and the collectives it is a member of), is w's program in the runtime; the emulator executes the
whole sequence. A blocking runtime following it cannot deadlock: the sequence is a linearisation in which
every point-to-point send precedes its receive and every collective follows what it needs, so the earliest
unfinished event of any rank can always complete. Every rank derives the same sequence, hence issues the
collectives of each group in the same order.

Buckets and overlap (torch DDP's gradient bucketing, Li et al. 2020, §3.2.3): a replicated stage's all-reduce
of (k, t) and the U(k, t) after it are deferred to the first entry that needs them (a non-U job of stage k on a
member, or a reduction with a member; :func:`_defer_updates`), so DDP's all-reduces of a step meet after its
last backward as in torch (the workers' job order then differs from the builder's program only in where these
U's sit). :func:`placed_sequence` then marks
*runs* of all-reduces that may be fused: all-reduces of one member set and one holder set such that, between
one and the next, no member runs an F/B/I/W job and no reduction with a member is issued (U jobs and
broadcasts may sit between). A later all-reduce of a run needs only gradients finished before the run's first
one, so moving it up to the first one keeps the sequence a valid linearisation. Each entry of a run carries
the run's ``(stage, step)`` parts (:attr:`Collective.bucket`); the executors split a run, in order, into
buckets of at most ``bucket_bytes`` (:data:`BUCKET_BYTES`, torch's 25 MiB; a stage larger than the cap is a
bucket alone; 0 = one all-reduce per stage) with :func:`bucket_parts`, and issue one all-reduce per bucket
over a flat buffer of its parts' gradients. Bytes are counted per part as before; calls drop to one per
bucket.

Overlap rule (the runtime; :func:`launch_positions`): worker w *launches* the all-reduce of a bucket
(``async_op=True``) as soon as w's last B/W of every part is done, but never before w has issued every
collective that precedes it in w's sequence (launch positions are non-decreasing along the sequence), and
waits for it at the bucket's first entry (the first U of its parts). Every member therefore issues the
collectives of each group in the sequence's order, and each is issued no later than its place in the
sequence, so the blocking argument above still rules out deadlocks.

Bytes moved (:func:`collective_bytes`), per rank, for a payload of n bytes among P members: broadcast: the
root sends (P−1)·n, each other member receives n; reduce: each non-root sends n, the root receives (P−1)·n;
all-reduce: each member sends and receives 2(P−1)·n/P (the ring algorithm's volume).

Example:
    >>> from pipelab.schedules import ddp, fsdp, gpipe
    >>> [p.kind for p in stage_placements(ddp(D=2, M=2))], [p.kind for p in stage_placements(gpipe(2, 2))]
    (['replicated', 'replicated'], ['single', 'single'])
    >>> p = stage_placements(fsdp(D=2, M=2))[1]
    >>> p.compute, p.holders, p.kind
    ((0, 1), (1,), 'sharded')

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
        kind: ``"all_reduce"``, ``"reduce"`` (gradients of step ``step``) or ``"broadcast"`` (weights).
        stage: the stage k whose gradient or weights it carries.
        step: the step t of the gradient; for a broadcast, the step of the owner's update that made the
            version (−1 for version 0).
        version: the weight version a broadcast carries (−1 for the reductions).
        members: the ranks taking part, sorted.
        root: the reduce's destination or the broadcast's source (−1 for an all-reduce).
        holders: the members that keep the result (the reductions; the receivers of a broadcast).
        bucket: for an all-reduce that may be fused with others (module docstring), the ``(stage, step)``
            parts of its whole run, in sequence order (itself included); ``()`` when it runs alone.
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
    """The early start of an all-reduce (:func:`launch_positions`): its gradients are ready on this worker.

    The driver hands it to the collective runner; the runtime issues the bucket's all-reduce asynchronously
    once all its parts are launched, the emulator ignores it (values do not depend on when a sum starts).
    """


def stage_placements(schedule: Any) -> tuple[StagePlacement, ...]:
    """C_k, H_k and the kind (``single`` / ``replicated`` / ``sharded``) of every stage of ``schedule``.

    Example:
        >>> from pipelab.schedules import lpp
        >>> [(p.compute, p.holders, p.kind) for p in stage_placements(lpp(D=2, M=2, G=2, R=1))]
        [((0, 1), (0, 1), 'replicated'), ((0, 1), (0, 1), 'replicated')]
    """
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

    Args:
        sim: the schedule's :class:`~pipelab.simulator.SimResult` (its execution order places the events).
        needs: ``job -> v``, the stored version of its stage each compute job uses (a predicted spec names its
            base version); a non-holder's job makes its worker fetch it. ``None``: no fetches (the reductions
            alone).

    Returns:
        :class:`PlacedJob` and :class:`Collective` entries in one order valid for every worker (see the
        module docstring).

    Raises:
        ValueError: when the timeline cannot host the collectives (a job before the weights it needs).
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
    """Move each replicated stage's all-reduce of (k, t), with the U(k, t) that follow it, down to just before
    the first entry that needs them: a non-U job of stage k on a member, or a reduction with a member.

    Deferred blocks keep their relative order (a flush takes every earlier pending block along), so each
    group's collectives keep theirs; only independent jobs move ahead of them, which leaves a linearisation
    (module docstring). This is what lets DDP's all-reduces of one step meet after its last backward, where
    they can be fused, and gives the launched all-reduces the rest of the backward to overlap with.
    """
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
    """Set :attr:`Collective.bucket` on the all-reduces that form runs (module docstring)."""
    runs: list[list[int]] = []
    open_runs: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for i, e in enumerate(seq):
        if isinstance(e, Collective) and e.kind == "all_reduce":
            key = (e.members, e.holders)
            for other in [o for o in open_runs if o != key and set(o[0]) & set(e.members)]:
                runs.append(open_runs.pop(other))
            open_runs.setdefault(key, []).append(i)
            continue
        if isinstance(e, Collective):
            if e.kind == "broadcast":
                continue
            touched = set(e.members)
        elif e.op == "U":
            continue
        else:
            touched = {e.worker}
        for key in [o for o in open_runs if touched & set(o[0])]:
            runs.append(open_runs.pop(key))
    runs.extend(open_runs.values())
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
    """The bucket (``(stage, step)`` parts) all-reduce ``c`` is fused into, under a ``bucket_bytes`` cap.

    The run :attr:`Collective.bucket` is cut greedily, in order: a part joins the current bucket while the
    bucket's payload (``nbytes(stage)`` per part) stays within the cap; a part larger than the cap is a bucket
    alone. ``bucket_bytes`` defaults to :data:`BUCKET_BYTES`; 0 gives one all-reduce per stage.

    Example:
        >>> c = Collective("all_reduce", 1, 0, -1, (0, 1), -1, (0, 1), ((1, 0), (0, 0), (2, 0)))
        >>> bucket_parts(c, lambda k: 10, 25), bucket_parts(c._replace(stage=2), lambda k: 10, 25)
        (((1, 0), (0, 0)), ((2, 0),))
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

    L(c) = max(1 + the last B/W position of c's (stage, step), L of the previous collective), where
    a blocking collective's L is its own position (module docstring: the overlap rule); a bucket is issued
    when its last part is launched, at the latest at its first entry. Applied to the
    emulator's whole sequence it is harmless (the emulator ignores launches).
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
    """``(sent, received)`` bytes of one rank in a collective of ``kind`` over an n-byte payload.

    Conventions (module docstring): broadcast root (P−1)n sent, others n received; reduce non-roots n sent,
    root (P−1)n received; all-reduce 2(P−1)n/P both ways (rounded down).

    Example:
        >>> collective_bytes("all_reduce", 800, 4, False), collective_bytes("broadcast", 800, 4, True)
        ((1200, 1200), (2400, 0))
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
    """Bytes sent and received and calls, per collective kind, per rank (see :func:`collective_bytes`).

    Attributes:
        bytes_sent, bytes_received: ``rank -> {kind -> bytes}``; calls: ``rank -> {kind -> count}``.
    """

    def __init__(self) -> None:
        self.bytes_sent: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.bytes_received: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.calls: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, c: Collective, rank: int, nbytes: int, calls: int = 1) -> None:
        """Count ``c``'s ``nbytes`` payload for ``rank``; ``calls`` is 0 for a part fused into a bucket whose
        call was counted with its first part (bytes are counted per part, so bucketing leaves them unchanged)."""
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
    """A computing non-holder's copy of stage k (sharded placements): weights arrive, gradients leave.

    It runs its F/B (I/W) jobs like any stage, at the versions its policy names, from the versions it
    received (:meth:`receive_version`); it has no optimizer, no update and no optimizer state; its gradient
    of step t is taken by the reduction (:meth:`take_gradient`). A received version is dropped after its last
    use here, or when the next one arrives if it was the newest.
    """

    def __init__(self, k: int, D: int, M: int, module: nn.Module, events: Any, specs: Any, policy: Any, table: Any,
                 loss_fn: Callable[[Tensor, Tensor], Tensor], recompute: bool = False, precision: Any = None) -> None:
        params = trainable_parameters(module)
        # the base class checks that an optimizer holds exactly the stage's parameters; this copy never steps,
        # so a throwaway optimizer satisfies the check and is then discarded
        stand_in = torch.optim.SGD(params, lr=0.0) if params else None
        super().__init__(k, D, M, module, stand_in, events, specs, policy, table, loss_fn, recompute,
                         **({} if precision is None else {"precision": precision}))
        self.optimizer = None
        self.share_live = False
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


def step_gradient(ex: StageExecutor, t: int) -> list[Tensor]:
    """The gradient stage copy ``ex`` accumulated in step t (zeros when it computed none), taken out."""
    g = ex.acc.pop(t, None)
    return [torch.zeros_like(p) for p in ex.params] if g is None else list(g)


def emulate_collective(c: Collective, copies: Mapping[tuple[int, int], StageExecutor],
                       counter: CollectiveCounter | None = None, bucket_bytes: int | None = None) -> None:
    """Run collective ``c`` in memory on the stage copies ``(worker, stage) -> executor``.

    Reductions sum the members' gradients in rank order and hand every holder its own copy of the sum;
    a broadcast hands each receiver a copy of the owner's version. A :class:`Launch` does nothing. A fused
    all-reduce is summed part by part (the same element-wise sums as one flat buffer) and counted as one
    call per bucket (:func:`bucket_parts` under ``bucket_bytes``, default :data:`BUCKET_BYTES`).
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
        grads = [step_gradient(copies[(w, k)], c.step) for w in c.members]
        total = [g.clone() for g in grads[0]]
        for g in grads[1:]:
            if total:
                torch._foreach_add_(total, g)
        nbytes = tensor_bytes(total)
        for w in c.holders:
            copies[(w, k)].acc[c.step] = [g.clone() for g in total]
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
