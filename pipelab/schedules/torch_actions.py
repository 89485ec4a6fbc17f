"""pipelab ↔ ``torch.distributed.pipelining``: a schedule's per-rank action lists and CSV format.

torch writes a pipeline schedule as one list of ``_Action`` per rank (``schedule.pipeline_order``, compute
only, ``None`` for an idle slot; ``pipeline_order_with_comms``, with the communication it lowers to) and
dumps either as CSV, one row per rank, one cell ``str(action)`` per entry (``"2F0"``, ``"1SEND_B3"``,
``"(0F1;3B0)OVERLAP_F_B"``, ``""`` for ``None``). This module converts both ways; it is pure data (it never
touches a process group): :func:`from_torch` / :func:`from_torch_csv` import, :func:`to_torch` /
:func:`to_torch_csv` export. Running an exported schedule on torch's own runtime is
:mod:`pipelab.runtime.torch_pipelining`.

Vocabulary (pipelab ↔ torch):

=======================================  ==================================================================
pipelab                                  torch.distributed.pipelining
=======================================  ==================================================================
worker w; stage k; micro-batch j         rank; ``stage_index`` (on one rank); ``microbatch_index``
chunk (stage k's index on its worker)    the stage's position in the rank's ``stages`` list
step t, one update per stage             one ``schedule.step()`` call (the lists cover one step)
F / B / I / W                            FORWARD / FULL_BACKWARD / BACKWARD_INPUT / BACKWARD_WEIGHT
F then B, both sent after B              ``OVERLAP_F_B`` with its ``sub_actions`` (``send_after[F] = B``)
U(k, t)                                  ``optimizer.step()`` after ``schedule.step()``; ``REDUCE_GRAD``
                                         (the 1/M scaling) stands where U would
message into stage k, channel 2k / 2k+1  ``SEND_F`` from stage k−1 and ``RECV_F`` / ``SEND_B`` from stage
                                         k+1 and ``RECV_B``
weight placement                         FSDP ``UNSHARD`` / ``RESHARD`` (no pipelab op yet)
sync_lag = 0, steps = 1                  every torch schedule
=======================================  ==================================================================

Import (:func:`from_torch`): F/B/I/W become actions of step t (the lists repeat for ``steps`` steps), U(k, t)
follows the rank's last action of stage k in step t (where torch puts ``REDUCE_GRAD``). Timing is torch's
runtime's (``_PipelineScheduleRuntime._step_microbatches``): SEND and RECV post without blocking, a job waits
for the SEND of every tensor it consumes from another rank, so a tensor leaves where its SEND stands (after an
``OVERLAP_F_B``'s last sub-action in a compute-only list, torch's ``_add_send_recv``); where that is later than
its producer the schedule records it in :attr:`Schedule.send_after <pipelab.schedules.Schedule>`. SEND/RECV
actions must be pipelab's messages, each SEND after its producer, each RECV before its consumer, and per rank
pair the RECVs in the order of the SENDs (torch's point-to-point operations carry no tag).
``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` are kept in ``params["torch_extra"]`` as ``(rank, compute jobs before
it, text)``. The result is validated (:class:`~pipelab.schedules.ScheduleError` with the marked grid).

Export (:func:`to_torch`): one step of a synchronous schedule with one rank per stage. Compute-only lists are
what torch's ``_load_csv(format="compute_only")`` lowers itself (a run of jobs whose tensors leave after its last
job is one ``OVERLAP_F_B``); with ``comms=True`` each SEND follows the job whose end sends it, each RECV stands
where its SEND is issued in a dependency order of the whole schedule, and U(k) becomes ``REDUCE_GRAD``.

Example:
    >>> from pipelab.schedules import one_f_one_b
    >>> order = to_torch(one_f_one_b(D=2, M=2))
    >>> [str(a) for a in order[1]]
    ['1F0', '1B0', '1F1', '1B1']
    >>> from_torch(order, n_stages=2, n_microbatches=2).programs == one_f_one_b(D=2, M=2).programs
    True

Reference: the schedule IR of ``torch.distributed.pipelining.schedules`` (``_Action``, ``_dump_csv``,
``_load_csv``, ``_PipelineScheduleRuntime``; PyTorch ≥ 2.5); the split backward of Qi et al., "Zero
Bubble Pipeline Parallelism" (ICLR 2024).
"""

from __future__ import annotations

import csv
import operator
import os
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .actions import Action, Schedule, check_int, check_jobs
from .dependencies import Job
from .transfers import ACT, Message, messages
from .validate import unit_timeline, validate

__all__ = ["TorchAction", "COMPUTE_KINDS", "COMM_KINDS", "EXTRA_KINDS", "parse_action", "format_action",
           "from_torch", "from_torch_csv", "to_torch", "to_torch_csv"]

#: torch computation types that are pipelab compute ops (same letters).
COMPUTE_KINDS: tuple[str, ...] = ("F", "B", "I", "W")
#: torch's point-to-point actions: ``stage_index`` is the sender's stage for SEND, the receiver's for RECV.
COMM_KINDS: tuple[str, ...] = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
#: torch actions with no pipelab op (kept as metadata on import).
EXTRA_KINDS: tuple[str, ...] = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
_OVERLAP = "OVERLAP_F_B"
_KINDS = COMPUTE_KINDS + COMM_KINDS + EXTRA_KINDS
# Longest names first so that e.g. "RESHARD" is not read as "R..." of another kind.
_ACTION_RE = re.compile(r"(\d+)(" + "|".join(sorted(_KINDS, key=len, reverse=True)) + r")(\d*)")


class TorchAction(NamedTuple):
    """torch's ``_Action`` as plain data: ``stage`` (``stage_index``), ``kind`` (the computation type's
    string: "F", "SEND_B", "OVERLAP_F_B", ...), ``micro`` (``microbatch_index``, None for UNSHARD/RESHARD/
    REDUCE_GRAD), ``subs`` (the sub-actions of an ``OVERLAP_F_B``)."""

    stage: int
    kind: str
    micro: int | None = None
    subs: tuple[TorchAction, ...] | None = None

    def __str__(self) -> str:
        return format_action(self)


def format_action(a: TorchAction) -> str:
    """torch's text for an action (the CSV cell): ``f"{stage}{kind}{micro}"``, ``"(a;b)OVERLAP_F_B"``."""
    if a.subs is not None:
        return "(" + ";".join(format_action(s) for s in a.subs) + f"){a.kind}"
    return f"{a.stage}{a.kind}" + ("" if a.micro is None else str(a.micro))


def parse_action(text: str) -> TorchAction | None:
    """Read one CSV cell of torch's format (``""`` is an idle slot: None).

    Raises:
        ValueError: a cell that is not ``[stage][kind][microbatch]`` or ``(sub;sub)OVERLAP_F_B``.
    """
    text = text.strip()
    if not text:
        return None
    if text.startswith("("):
        close = text.find(")")
        kind = text[close + 1:]
        if close < 0 or kind != _OVERLAP:
            raise ValueError(f"torch action {text!r}: a parenthesised action must be '(a;b;...){_OVERLAP}'")
        subs = tuple(s for s in (parse_action(p) for p in text[1:close].split(";")) if s is not None)
        return TorchAction(-1, _OVERLAP, None, subs)
    m = _ACTION_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"torch action {text!r} is not [stage][kind][microbatch] with kind one of "
                         f"{', '.join(_KINDS)} (e.g. '2F0', '1SEND_B3', '0REDUCE_GRAD')")
    return TorchAction(int(m[1]), m[2], int(m[3]) if m[3] else None)


def _normalise(a: Any) -> TorchAction | None:
    """A torch ``_Action`` (duck-typed), a :class:`TorchAction`, a CSV string or None, as a checked TorchAction.

    Raises:
        TypeError: anything else.
        ValueError: an unknown computation type; a stage or micro-batch index that is not an integer >= 0
            (e.g. ``stage_index=1.5``: torch's ``_Action`` does not check its fields).
    """
    if a is None:
        return None
    if isinstance(a, str):
        return parse_action(a)
    if isinstance(a, TorchAction):
        kind, stage, micro, subs = a.kind, a.stage, a.micro, a.subs
    else:
        try:
            kind = a.computation_type
            stage, micro, subs = a.stage_index, a.microbatch_index, getattr(a, "sub_actions", None)
        except AttributeError:
            raise TypeError(f"pipeline_order entries must be torch _Action objects, strings such as '2F0', or None; "
                            f"got {type(a).__name__}: {a!r}") from None
        kind = str(getattr(kind, "value", kind))
    if kind not in _KINDS + (_OVERLAP,):
        raise ValueError(f"torch action {a!r}: unknown computation type {kind!r} (allowed: "
                         f"{', '.join(_KINDS + (_OVERLAP,))})")
    if kind == _OVERLAP:  # torch writes stage -1 and no micro-batch: the sub-actions carry them
        norm_subs = None if subs is None else tuple(x for x in (_normalise(y) for y in subs) if x is not None)
        return TorchAction(-1, kind, None, norm_subs)
    return TorchAction(_index(a, "stage_index", stage), kind, None if micro is None else _index(a, "microbatch_index",
                                                                                                  micro), None)


def _index(a: Any, field: str, value: Any) -> int:
    """``value`` as an int >= 0, or a ValueError naming the action and its field (floats and bools refused)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"torch action {a!r}: {field} must be an int >= 0, got {value!r} "
                         f"({type(value).__name__})") from None
    if out < 0:
        raise ValueError(f"torch action {a!r}: {field} must be an int >= 0, got {value!r}")
    return out


def _flatten(a: TorchAction) -> list[TorchAction]:
    """An action, or the sub-actions of an ``OVERLAP_F_B`` in order."""
    if a.kind == _OVERLAP:
        if not a.subs:
            raise ValueError(f"torch action {a}: {_OVERLAP} without sub_actions")
        return [x for s in a.subs for x in _flatten(s)]
    return [a]


# message key: (kind, stage_index as torch writes it, t, j), on a given rank
_Key = tuple[str, int, int, int]


def _message_keys(m: Message) -> tuple[_Key, _Key]:
    """The SEND (on ``m.src``) and RECV (on ``m.dst``) torch would write for pipelab message ``m``."""
    k, kind = divmod(m.channel, 2)  # into stage k
    if kind == ACT:  # activation out of stage k-1 into stage k
        return ("SEND_F", k - 1, m.t, m.j), ("RECV_F", k, m.t, m.j)
    return ("SEND_B", k + 1, m.t, m.j), ("RECV_B", k, m.t, m.j)  # gradient out of stage k+1 into stage k


def from_torch(pipeline_order: Mapping[int, Sequence[Any]], *, n_stages: int, n_microbatches: int,
               steps: int = 1, name: str = "torch schedule", check: bool = True) -> Schedule:
    """Import torch's per-rank action lists as a pipelab :class:`Schedule` (rules: module docstring).

    Args:
        pipeline_order: ``{rank: [action or None, ...]}`` for ranks 0..R−1 (a torch schedule's
            ``pipeline_order`` or ``pipeline_order_with_comms``); an action is a torch ``_Action``, a
            :class:`TorchAction` or its CSV text.
        n_stages, n_microbatches, steps: D, M, and T (the one-step lists run T times).
        check: validate the result and its SEND/RECV actions (off only to inspect a broken list).

    Raises:
        ScheduleError: missing or duplicated jobs, out-of-range indices, an order that deadlocks (marked grid).
        ValueError: ranks not 0..R−1, a stage on two ranks, an action without a micro-batch, SEND/RECV actions
            that do not match pipelab's transfers (missing, extra, misplaced, out of order).
        TypeError: an entry that is not an action, a string or None.

    Example:
        >>> s = from_torch({0: ["0F0", "0B0", "0REDUCE_GRAD"]}, n_stages=1, n_microbatches=1)
        >>> [str(a) for a in s.programs[0]], s.params["torch_extra"]
        (['F0.0', 'B0.0', 'U0'], ((0, 2, '0REDUCE_GRAD'),))
    """
    # Import in four named steps:
    #   _normalise       every entry as a checked TorchAction (idle slots dropped)
    #   _chunks          each stage's one rank, and its chunk there
    #   _rank_program    a rank's lists over T steps: jobs, U where REDUCE_GRAD stands, SEND/RECV, late sends
    #   validate         the schedule, then _check_comms: the SEND/RECV against pipelab's messages
    D, M, T = _sizes(n_stages, n_microbatches, steps)
    if not isinstance(pipeline_order, Mapping) or not pipeline_order:
        raise TypeError("pipeline_order must be a non-empty dict {rank: list of actions}, got "
                        f"{type(pipeline_order).__name__}")
    ranks = sorted(pipeline_order)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"pipeline_order must have ranks 0..{len(ranks) - 1}, got {ranks}")
    lists = [[n for a in pipeline_order[r] if (n := _normalise(a)) is not None] for r in ranks]
    per_step = sum(x.kind in COMPUTE_KINDS for acts in lists for a in acts for x in _flatten(a))
    check_jobs(f"from_torch of {per_step} compute actions per step, steps={T}", per_step * T)
    chunk_of = _chunks(lists)
    send_after: dict[Job, Job] = {}
    programs, comms, extra = zip(*(_rank_program(r, acts, T, chunk_of, send_after) for r, acts in enumerate(lists)))
    extra_text = tuple((r, before, str(a)) for r, rank_extra in enumerate(extra) for before, a in rank_extra)
    n_comm = sum(len(c) for c in comms)
    params = {"source": "torch.distributed.pipelining", "n_stages": D, "n_microbatches": M, "ranks": len(ranks),
              "torch_comms": n_comm, "torch_extra": extra_text}
    sched = Schedule(name=name, programs=tuple(tuple(p) for p in programs), D=D, M=M, steps=T, sync_lag=0,
                     update_rule=_import_rule(extra), params=params, send_after=send_after)
    if check:
        validate(sched)
        if n_comm:
            _check_comms(sched, list(comms))
    return sched


def _import_rule(extra: Sequence[list[tuple[int, TorchAction]]]) -> str:
    """The imported schedule's update rule, counting the torch actions it keeps only as metadata."""
    counts = Counter(a.kind for rank_extra in extra for _, a in rank_extra)
    ignored = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    return ("U(k,t) right after the rank's last action of stage k in step t (torch steps the optimizer outside "
            "the schedule); flushed" + (f"; torch actions with no pipelab op, kept in params['torch_extra']: "
                                        f"{ignored}" if ignored else ""))


def _chunks(lists: list[list[TorchAction]]) -> dict[int, int]:
    """Each stage's chunk: its index among its rank's stages (ValueError: a stage on two ranks, or an F/B/I/W
    without a micro-batch)."""
    rank_of: dict[int, int] = {}
    for r, acts in enumerate(lists):
        for a in (x for y in acts for x in _flatten(y) if x.kind in COMPUTE_KINDS):
            if a.micro is None:
                raise ValueError(f"rank {r}: compute action {a} has no microbatch index")
            other = rank_of.setdefault(a.stage, r)
            if other != r:
                raise ValueError(f"stage {a.stage} is computed on ranks {other} and {r} ({a}); torch places "
                                 "each stage on one rank")
    return {k: sorted(s for s, rr in rank_of.items() if rr == r).index(k) for k, r in rank_of.items()}


def _rank_program(r: int, acts: list[TorchAction], T: int, chunk_of: dict[int, int], send_after: dict[Job, Job]
                  ) -> tuple[list[Action], list[tuple[int, _Key, TorchAction]], list[tuple[int, TorchAction]]]:
    """Rank r's program over T steps, its SEND/RECV ``(compute jobs before it, key, action)`` and its actions with
    no pipelab op ``(compute jobs before it, action)``; the late sends are added to ``send_after``."""
    prog: list[Action] = []
    jobs: list[Job] = []  # the rank's compute jobs in order
    comms: list[tuple[int, _Key, TorchAction]] = []
    extra: list[tuple[int, TorchAction]] = []
    for t in range(T):
        first = len(prog)
        for action in acts:
            for a in _flatten(action):
                if a.kind in COMPUTE_KINDS:
                    prog.append(Action(a.kind, a.stage, t, int(a.micro or 0), chunk_of[a.stage]))
                    jobs.append((a.kind, a.stage, t, int(a.micro or 0)))
                elif a.kind in COMM_KINDS:
                    if a.micro is None:
                        raise ValueError(f"rank {r}: communication action {a} has no microbatch index")
                    comms.append((len(jobs), (a.kind, a.stage, t, a.micro), a))
                else:
                    extra.append((len(jobs), a))
            if action.kind == _OVERLAP:  # torch's lowering sends every sub-action's output after the last
                for job in jobs[len(jobs) - len(_flatten(action)):-1]:
                    send_after[job] = jobs[-1]
        # U(k, t) right after the rank's last action of stage k in step t (torch's REDUCE_GRAD slot).
        last = {prog[i].stage: i for i in range(first, len(prog))}
        for k, i in sorted(last.items(), key=lambda kv: -kv[1]):
            prog.insert(i + 1, Action("U", k, t, -1, chunk_of[k]))
    _explicit_sends(jobs, comms, send_after)
    return prog, comms, extra


def _explicit_sends(jobs: list[Job], comms: list[tuple[int, _Key, TorchAction]], send_after: dict[Job, Job]) -> None:
    """An explicit SEND leaves where the list puts it: after the last compute job before it."""
    position = {job: n for n, job in enumerate(jobs)}
    for before, (kind, k, t, j), _ in comms:
        if not kind.startswith("SEND"):
            continue
        producer = next((job for job in ((kind[-1], k, t, j), ("I", k, t, j)) if job in position), None)
        if producer is not None and before - 1 > position[producer]:
            send_after[producer] = jobs[before - 1]
        elif producer is not None:
            send_after.pop(producer, None)


def _sizes(n_stages: Any, n_microbatches: Any, steps: Any) -> tuple[int, int, int]:
    """D, M, T as ints >= 1, refused when a schedule of those sizes (F and B per stage and micro-batch) would
    pass the builders' job limit (:func:`~pipelab.schedules.actions.check_jobs`)."""
    D, M, T = check_int("n_stages", n_stages), check_int("n_microbatches", n_microbatches), check_int("steps", steps)
    check_jobs(f"from_torch(n_stages={D}, n_microbatches={M}, steps={T})", 2 * D * M * T)
    return D, M, T


def _check_comms(s: Schedule, comms: list[list[tuple[int, _Key, TorchAction]]]) -> None:
    """SEND/RECV actions equal pipelab's messages, each placed after its producer / before its consumer, and
    every rank pair's RECVs in the order of its SENDs (see the module docstring)."""
    cindex: dict[Job, int] = {}  # each job's position among its rank's compute jobs
    for prog in s.programs:
        for n, a in enumerate(a for a in prog if a.op != "U"):
            cindex[(a.op, a.stage, a.step, a.micro)] = n
    expected: dict[tuple[int, _Key], tuple[Message, str]] = {}
    for m in messages(s):
        send, recv = _message_keys(m)
        expected[(m.src, send)] = (m, "send")
        expected[(m.dst, recv)] = (m, "recv")
    seen: set[tuple[int, _Key]] = set()
    for r, rank_comms in enumerate(comms):
        for before, key, act in rank_comms:
            what = f"rank {r}'s action {act} (step {key[2]})"
            if (r, key) in seen:
                raise ValueError(f"{what} appears more than once")
            seen.add((r, key))
            if (r, key) not in expected:
                raise ValueError(f"{what} matches no transfer of pipelab's schedule (a transfer crosses ranks "
                                 f"between adjacent stages: activations k→k+1, gradients k+1→k)")
            m, side = expected[(r, key)]
            job = s.programs[m.src][m.send_pos] if side == "send" else s.programs[m.dst][m.recv_pos]
            n = cindex[(job.op, job.stage, job.step, job.micro)]
            if side == "send" and n >= before:
                raise ValueError(f"{what} comes before the job that produces its tensor, {job}")
            if side == "recv" and n < before:
                raise ValueError(f"{what} comes after the job that consumes its tensor, {job}")
    missing = [(r, key) for r, key in expected if (r, key) not in seen]
    if missing:
        r, (kind, stage, t, j) = missing[0]
        raise ValueError(f"rank {r} lacks {stage}{kind}{j} (step {t}), a transfer of pipelab's schedule "
                         f"({len(missing)} missing in all)")
    _check_fifo(s.M, comms, expected)


def _check_fifo(M: int, comms: list[list[tuple[int, _Key, TorchAction]]],
                expected: dict[tuple[int, _Key], tuple[Message, str]]) -> None:
    """Per ordered rank pair, the RECVs in the order of the SENDs: torch's p2p ops carry no tag."""
    sends: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[str, int, int, str]]] = defaultdict(list)
    for r, rank_comms in enumerate(comms):
        for _, key, act in rank_comms:
            m, side = expected[(r, key)]
            ident = (key[0][-1], m.channel, m.t * M + m.j)
            if side == "send":
                sends[(m.src, m.dst)].append(ident)
            else:
                recvs[(m.src, m.dst)].append(ident + (str(act),))
    for pair, order in sends.items():
        for i, (sent, rec) in enumerate(zip(order, recvs[pair])):
            if sent != rec[:3]:
                raise ValueError(f"rank {pair[1]}'s action {rec[3]} is its receive #{i} from rank {pair[0]}, but "
                                 f"rank {pair[0]}'s send #{i} to it is another tensor: torch matches a rank pair's "
                                 "sends and receives in order")


def from_torch_csv(path: str | os.PathLike[str], *, n_stages: int, n_microbatches: int, steps: int = 1,
                   name: str | None = None, check: bool = True) -> Schedule:
    """Import a CSV written by torch's ``_dump_csv`` (compute only or with comms) or by :func:`to_torch_csv`.

    One row per rank (row r = rank r), one cell per action, ``""`` for an idle slot. Arguments and errors
    as :func:`from_torch` (sizes are checked before the file is read); a malformed cell raises ValueError
    naming its row and column.
    """
    _sizes(n_stages, n_microbatches, steps)
    order: dict[int, list[TorchAction | None]] = {}
    with open(path, newline="") as f:
        for r, row in enumerate(csv.reader(f)):
            acts: list[TorchAction | None] = []
            for c, cell in enumerate(row):
                try:
                    acts.append(parse_action(cell))
                except ValueError as e:
                    raise ValueError(f"{os.fspath(path)}, row {r} (rank {r}), column {c}: {e}") from None
            order[r] = acts
    if not order:
        raise ValueError(f"{os.fspath(path)} has no rows (one row per rank expected)")
    return from_torch(order, n_stages=n_stages, n_microbatches=n_microbatches, steps=steps,
                      name=name or f"torch CSV {os.path.basename(os.fspath(path))}", check=check)


def _export_lists(schedule: Schedule, comms: bool) -> list[list[TorchAction]]:
    s = schedule
    if not isinstance(s, Schedule):
        raise TypeError(f"schedule must be a pipelab Schedule, got {type(s).__name__}")
    if s.sync_lag is None:
        raise ValueError(f"schedule {s.name!r} is asynchronous (sync_lag=None); torch's schedules are synchronous "
                         "(flushed), export a flushed schedule (sync_lag=0)")
    if s.steps != 1:
        raise ValueError(f"schedule {s.name!r} has steps={s.steps}; a torch schedule is one step (the optimizer "
                         "steps between schedule.step() calls): build it with steps=1")
    for k, hs in enumerate(s.weight_holders):
        if len(hs) != 1 or s.stage_workers(k) not in ((), hs):
            raise ValueError(f"schedule {s.name!r}: stage {k} has weight holders {hs} and runs on workers "
                             f"{s.stage_workers(k)}; torch places each stage on exactly one rank")
    validate(s)
    if not comms:
        return [_overlapped(s, [a for a in prog if a.op != "U"]) for prog in s.programs]
    c, timing = unit_timeline(s)
    seq = timing.seq
    position = {(a.op, a.stage, a.step, a.micro): pos for prog in s.programs for pos, a in enumerate(prog)}
    by_send: dict[tuple[int, int], list[Message]] = defaultdict(list)
    for m in messages(s):  # each SEND after the job whose end sends the tensor (Schedule.send_after)
        a = s.programs[m.src][m.send_pos]
        later = s.send_after.get((a.op, a.stage, a.step, a.micro))
        by_send[(m.src, m.send_pos if later is None else position[later])].append(m)
    out: list[list[TorchAction]] = [[] for _ in range(s.W)]
    for i in sorted(range(c.n), key=lambda i: int(seq[i])):
        w, pos = c.position(i)
        a = s.programs[w][pos]
        out[w].append(TorchAction(a.stage, "REDUCE_GRAD") if a.op == "U" else TorchAction(a.stage, a.op, a.micro))
        for m in by_send.get((w, pos), ()):
            (skind, sstage, _, j), (rkind, rstage, _, _) = _message_keys(m)
            out[m.src].append(TorchAction(sstage, skind, j))
            out[m.dst].append(TorchAction(rstage, rkind, j))
    return out


def _overlapped(s: Schedule, jobs: list[Action]) -> list[TorchAction]:
    """A worker's compute jobs as torch actions, each run of jobs that send their tensors after the run's last
    job (``Schedule.send_after``) as one ``OVERLAP_F_B`` (torch's lowering sends its outputs after it).

    Raises:
        ValueError: a job sends after a later job with a job between that sends at once (a compute-only
            list cannot say so: export with ``comms=True``).
    """
    keys = [(a.op, a.stage, a.step, a.micro) for a in jobs]
    index = {key: i for i, key in enumerate(keys)}
    last = [index.get(s.send_after.get(key, key), i) for i, key in enumerate(keys)]
    out: list[TorchAction] = []
    i = 0
    while i < len(jobs):
        e = last[i]
        bad = [m for m in range(i + 1, e + 1) if last[m] != e]
        if bad:
            raise ValueError(f"schedule {s.name!r}: {jobs[i]} (step {jobs[i].step}) sends its tensor after "
                             f"{jobs[e]}, but {jobs[bad[0]]} between them sends at another time: a compute-only "
                             "torch list sends right after each action or OVERLAP_F_B; export with comms=True")
        run = [TorchAction(a.stage, a.op, a.micro) for a in jobs[i:e + 1]]
        out.append(run[0] if e == i else TorchAction(-1, _OVERLAP, None, tuple(run)))
        i = e + 1
    return out


def _torch_action(a: TorchAction) -> Any:
    """torch's ``_Action`` for ``a`` (sub-actions included)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    subs = None if a.subs is None else tuple(_torch_action(x) for x in a.subs)
    return _Action(a.stage, _ComputationType(a.kind), a.micro, subs)


def to_torch(schedule: Schedule, *, comms: bool = False) -> dict[int, list[Any]]:
    """Export one step of a synchronous schedule as torch's per-rank ``_Action`` lists.

    Args:
        schedule: a validated, flushed (``sync_lag`` not None) schedule with ``steps = 1`` and each stage on
            one worker (its only weight holder).
        comms: False: compute actions only (what ``_load_csv(format="compute_only")`` and torch's
            ``pipeline_order`` hold; torch adds communication and ``REDUCE_GRAD`` itself). True: with
            SEND/RECV from pipelab's messages and ``REDUCE_GRAD`` in U's place (``format="compute_comms"``).

    Returns:
        ``{rank: [torch _Action, ...]}`` (rank = worker).

    Raises:
        ValueError: an asynchronous schedule, ``steps != 1``, a stage on several workers or replicated;
            ScheduleError for an invalid schedule.
    """
    lists = _export_lists(schedule, comms)
    return {w: [_torch_action(a) for a in acts] for w, acts in enumerate(lists)}


def to_torch_csv(schedule: Schedule, path: str | os.PathLike[str], *, comms: bool = False) -> None:
    """Write one step of ``schedule`` as torch's CSV (one row per rank; rules and errors of :func:`to_torch`),
    readable by ``_PipelineScheduleRuntime._load_csv(path, format="compute_comms" if comms else
    "compute_only")`` and by :func:`from_torch_csv`."""
    lists = _export_lists(schedule, comms)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for acts in lists:
            writer.writerow([format_action(a) for a in acts])
