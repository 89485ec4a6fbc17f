"""V-shape and interleaved zero-bubble schedules with a split backward (F, I, W, U actions).

V-shape placement (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024, V-Shape blocks):
W workers hold D = 2W stages; stage s runs on worker

    w(s) = s            for s < W      (chunk 0, the way down),
    w(s) = 2W − 1 − s   for s ≥ W      (chunk 1, the way back up),

so worker 0 holds the first and the last stage and the loss is computed where the input came in. The
builders: ``zb_v`` (torch's ``ScheduleZBVZeroBubble``), ``v_half`` / ``v_min`` (the NeurIPS paper's building
blocks, repeated, squeezed and reordered), ``interleaved_zero_bubble`` (torch's ZB1P over V looped chunks),
``dualpipe_v`` (torch's ``ScheduleDualPipeV``) and ``dualpipe`` (bidirectional, two mirrored DualPipeV).
Every one is flushed (``sync_lag=0``): U(k, t) follows the worker's last weight-gradient job (W, or B where the
backward is not split) of stage k in step t, and ``steps`` repeats the one-step program.

Example:
    >>> from pipelab.schedules import validate
    >>> s = zb_v(W=2, M=4)
    >>> validate(s)
    >>> s.D, [str(a) for a in s.programs[1]][:6]
    (4, ['F1.0', 'F2.0', 'F1.1', 'F2.1', 'I2.0', 'W2.0'])

References: P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv
2401.10241, §2 ZB-H1/ZB-H2, §6 ZB-V); P. Qi, X. Wan, N. Amar, M. Lin, "Pipeline Parallelism with
Controllable Memory", NeurIPS 2024 (arXiv 2405.15362: building blocks, lifespan and memory; the V-Shape
blocks V-Min, V-Half, V-ZB; bubble/memory summary on the authors' page
huggingface.co/spaces/sail/pipeline-parallelism-with-controllable-memory); DeepSeek-AI, "DeepSeek-V3
Technical Report" (arXiv 2412.19437, §3.2.1 DualPipe, Table 2) and github.com/deepseek-ai/DualPipe;
torch.distributed.pipelining.schedules (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble,
ScheduleDualPipeV).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .actions import Action, Schedule, check_int, check_jobs, gc_paused
from .constructor import construct

__all__ = ["v_stage", "zb_v", "v_half", "v_min", "interleaved_zero_bubble", "dualpipe_v", "dualpipe", "OVERLAP_MODELS"]

_FLUSH = ("U(k,t) right after worker w's last weight-gradient job (W, or B) of stage k in step t; step t+1 "
          "starts after it (flush)")

#: One worker's one-step program before numbering: (op, stage, micro-batch).
_Job = tuple[str, int, int]


def v_stage(w: int, chunk: int, W: int) -> int:
    """The stage of ``chunk`` (0 or 1) on worker ``w`` in the V-shape placement: w, or 2W − 1 − w.

    Example:
        >>> [v_stage(w, c, 3) for c in (0, 1) for w in range(3)]
        [0, 1, 2, 5, 4, 3]
    """
    if chunk not in (0, 1):
        raise ValueError(f"chunk must be 0 or 1 in a V-shape placement, got {chunk!r}")
    return w if chunk == 0 else 2 * W - 1 - w


def _numbered(ops: Iterable[tuple[str, int]]) -> list[_Job]:
    """Number a sequence of (op, stage): the n-th (op, stage) gets micro-batch n (torch's per-stage counters)."""
    seen: Counter[tuple[str, int]] = Counter()
    out = []
    for op, k in ops:
        out.append((op, k, seen[(op, k)]))
        seen[(op, k)] += 1
    return out


def _assemble(name: str, programs: Sequence[Sequence[_Job]], D: int, M: int, steps: int,
              holders: Sequence[tuple[int, ...]], chunk_of: Sequence[int], params: dict[str, Any],
              send_after: Mapping[_Job, _Job] | None = None) -> Schedule:
    """Repeat each worker's one-step program for ``steps`` steps and add U(k, t) after the worker's last
    weight-gradient job of stage k in step t (a flushed schedule); ``send_after`` (one step's, see
    :attr:`Schedule.send_after <pipelab.schedules.Schedule>`) holds in every step."""
    progs = []
    for prog in programs:
        last: dict[int, int] = {}
        for i, (op, k, _) in enumerate(prog):
            if op in ("W", "B"):
                last[k] = i
        after: dict[int, list[int]] = {}
        for k, i in last.items():
            after.setdefault(i, []).append(k)
        p: list[Action] = []
        for t in range(steps):
            for i, (op, k, j) in enumerate(prog):
                p.append(Action(op, k, t, j, chunk_of[k]))
                p += [Action("U", kk, t, -1, chunk_of[kk]) for kk in after.get(i, ())]
        progs.append(tuple(p))
    late = {(op, k, t, j): (op2, k2, t, j2) for t in range(steps)
            for (op, k, j), (op2, k2, j2) in (send_after or {}).items()}
    return Schedule(name, tuple(progs), D, M, steps, tuple(holders), 0, "current", _FLUSH, params, late)


def _v_sizes(name: str, W: int, M: int, steps: int) -> tuple[int, int, int]:
    W, M, steps = check_int("W", W), check_int("M", M), check_int("steps", steps)
    check_jobs(f"{name}(W={W}, M={M}, steps={steps})", 3 * 2 * W * M * steps)
    return W, M, steps


def _v_schedule(name: str, label: str, programs: Sequence[Sequence[_Job]], W: int, M: int, steps: int,
                params: dict[str, Any] | None = None, send_after: Mapping[_Job, _Job] | None = None) -> Schedule:
    D = 2 * W
    holders = [(s if s < W else D - 1 - s,) for s in range(D)]
    return _assemble(f"{label}(W={W}, M={M})", programs, D, M, steps, holders,
                     [int(s >= W) for s in range(D)], {"W": W, "M": M, "builder": name, **(params or {})}, send_after)


# ---------------------------------------------------------------------------------------------- ZB-V
def _zb_v_worker(w: int, W: int, M: int) -> list[_Job]:
    s0, s1 = v_stage(w, 0, W), v_stage(w, 1, W)
    n = max(2 * W - 1, M)  # torch plans at least 2W − 1 micro-batches and drops the surplus afterwards
    seq: list[tuple[str, int]] = [("F", s0)] * (2 * W - 2 * w - 1)
    seq += [("F", s1), ("F", s0)] * w
    seq += [("F", s1), ("I", s1), ("W", s1)] * (W - w)
    f0 = 2 * W - w - 1  # forwards of chunk 0 so far
    f1 = W  # forwards of chunk 1 so far
    while f1 < f0 or f0 < n:
        if f0 < n:
            seq.append(("F", s0))
            f0 += 1
        seq += [("I", s0), ("W", s0), ("F", s1), ("I", s1), ("W", s1)]
        f1 += 1
    # Cool-down: w pairs of input gradients, then W − w (I, W) of chunk 0; the rest of the W last.
    seq += [("I", s0), ("I", s1)] * w
    seq += [("I", s0), ("W", s0)] * (W - w)
    done_w1 = sum(1 for op, k in seq if (op, k) == ("W", s1))
    done_w0 = sum(1 for op, k in seq if (op, k) == ("W", s0))
    seq += [("W", s1)] * (n - done_w1) + [("W", s0)] * (n - done_w0)
    return [job for job in _numbered(seq) if job[2] < M]


@gc_paused
def zb_v(W: int, M: int, steps: int = 1) -> Schedule:
    """ZB-V: the zero-bubble V schedule, in the order torch's ``ScheduleZBVZeroBubble`` runs it.

    Worker w runs 2(W−w)−1 forwards of chunk 0, w pairs (F1, F0), W − w triples (F1, I1, W1), the steady
    phase (F0, I0, W0, F1, I1, W1), then w pairs (I0, I1), W − w pairs (I0, W0) and the deferred W passes.
    At T_F = T_I = T_W every worker is busy 6M units from its first job to its last, and the peak activation
    memory is W micro-batches, 1F1B's. torch plans max(2W − 1, M) micro-batches and drops those ≥ M, so any
    M ≥ 1 is accepted. (The paper's greedy scheduler, sail-sg's zbv.py, places the last deferred W passes
    differently; both have zero bubble and peak memory W.)

    Example:
        >>> [str(a) for a in zb_v(W=1, M=2).programs[0]]
        ['F0.0', 'F1.0', 'I1.0', 'W1.0', 'F0.1', 'I0.0', 'W0.0', 'F1.1', 'I1.1', 'W1.1', 'U1', 'I0.1', 'W0.1', 'U0']

    Reference: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241 v2 §6, ZB-V);
    torch.distributed.pipelining.ScheduleZBVZeroBubble.
    """
    W, M, steps = _v_sizes("zb_v", W, M, steps)
    return _v_schedule("zb_v", "ZB-V", [_zb_v_worker(w, W, M) for w in range(W)], W, M, steps)


# ------------------------------------------------------------------------------ interleaved zero bubble
def _interleaved_zb_worker(w: int, W: int, V: int, M: int, per_round: int) -> list[_Job]:
    total = V * M  # forwards (and input gradients) on worker w
    warm = min((V - 1) * per_round + (W - 1 - w), total)

    def f_stage(i: int) -> int:
        return ((i // per_round) % V) * W + w

    def b_stage(i: int) -> int:  # the i-th input gradient of the worker
        return (V - 1 - (i // per_round) % V) * W + w

    seq: list[tuple[str, int]] = [("F", f_stage(i)) for i in range(warm)]
    pending: deque[int] = deque()  # stages of input gradients whose W is still to come, oldest first
    for i in range(total):  # the i-th input gradient, preceded by a forward while forwards remain
        if warm + i < total:
            seq.append(("F", f_stage(warm + i)))
        seq.append(("I", b_stage(i)))
        pending.append(b_stage(i))
        if i >= w:  # worker w defers its first w weight gradients (ZB-H1's w extra W slots)
            seq.append(("W", pending.popleft()))
    seq += [("W", k) for k in pending]
    return _numbered(seq)


@gc_paused
def interleaved_zero_bubble(W: int, V: int, M: int, steps: int = 1) -> Schedule:
    """Interleaved zero bubble (ZB1P over V looped chunks), in the order of torch's ``ScheduleInterleavedZeroBubble``.

    Stage s = c·W + w on worker w (chunk c), as in interleaved 1F1B. With R = max(1, ⌊M/W⌋) rounds of
    P = M/R micro-batches, worker w runs (V−1)·P + W − 1 − w warm-up forwards (at most V·M); the i-th forward is
    of chunk ⌊i/P⌋ mod V, the i-th input gradient of chunk V − 1 − (⌊i/P⌋ mod V); each I follows the next
    forward and, from the (w+1)-th on, precedes the oldest pending W (ZB-H1's w deferred W passes).

    Raises:
        ValueError: if M is not a multiple of the number of rounds max(1, ⌊M/W⌋) (torch's requirement).

    Example:
        >>> [str(a) for a in interleaved_zero_bubble(W=2, V=2, M=2).programs[1]][:6]
        ['F1.0', 'F1.1', 'F3.0', 'I3.0', 'F3.1', 'I3.1']

    Reference: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024, §2.1 ZB-H1); Narayanan et al.
    (SC 2021) for the interleaved order; torch.distributed.pipelining.ScheduleInterleavedZeroBubble.
    """
    W, V, M, steps = (check_int(n, v) for n, v in (("W", W), ("V", V), ("M", M), ("steps", steps)))
    check_jobs(f"interleaved_zero_bubble(W={W}, V={V}, M={M}, steps={steps})", 3 * V * W * M * steps)
    rounds = max(1, M // W)
    if M % rounds:
        raise ValueError(f"interleaved_zero_bubble needs M divisible by the number of rounds max(1, M // W) = "
                         f"{rounds} (M={M}, W={W}); use M <= W or a multiple of {rounds}")
    D = V * W
    programs = [_interleaved_zb_worker(w, W, V, M, M // rounds) for w in range(W)]
    return _assemble(f"interleaved ZB(W={W}, V={V}, M={M})", programs, D, M, steps, [(s % W,) for s in range(D)],
                     [s // W for s in range(D)], {"W": W, "V": V, "M": M, "builder": "interleaved_zero_bubble"})


# ----------------------------------------------------------------------------------------- DualPipeV
def _dualpipe_v_worker(w: int, W: int, M: int) -> tuple[list[_Job], list[tuple[int, int]]]:
    """Worker w's one-step DualPipeV program and its overlapped pairs (positions of the F and the B of
    every ``OVERLAP_F_B`` of torch's order), in eight phases:

    ====  ==========================  ====  ===============================================================
    1     2(W−w−1) F of chunk 0       5     W−w−1 of (B1, F1 & B0)
    2     w+1 pairs (F0, F1)          6     w+1 pairs (B1, B0), the backward split (I) from half-way on
    3     W−w−1 of (I1, W, F1)        7     W−w−1 of (W, B0 or I0)
    4     M−2W+w+1 of (F0 & B1),      8     the pending W passes, oldest first
          (F1 & B0)
    ====  ==========================  ====  ===============================================================
    """
    s0, s1 = v_stage(w, 0, W), v_stage(w, 1, W)
    out: list[_Job] = []
    pairs: list[tuple[int, int]] = []
    nf: Counter[int] = Counter()  # forwards per stage
    nb: Counter[int] = Counter()  # backwards (B or I) per stage
    pending: deque[tuple[int, int]] = deque()  # (stage, micro) of input gradients awaiting their W

    def fwd(k: int) -> None:
        out.append(("F", k, nf[k]))
        nf[k] += 1

    def bwd(k: int, split: bool) -> None:
        out.append(("I" if split else "B", k, nb[k]))
        if split:
            pending.append((k, nb[k]))
        nb[k] += 1

    def overlapped(kf: int, kb: int) -> None:  # torch's OVERLAP_F_B: the F, then the full B
        fwd(kf)
        bwd(kb, False)
        pairs.append((len(out) - 2, len(out) - 1))

    def weight() -> None:
        if pending:
            out.append(("W", *pending.popleft()))

    for _ in range(2 * (W - w - 1)):  # 1: chunk-0 forwards
        fwd(s0)
    for _ in range(w + 1):  # 2: F0 F1
        fwd(s0)
        fwd(s1)
    for _ in range(W - w - 1):  # 3: I1 W F1 (zero bubble)
        bwd(s1, True)
        weight()
        fwd(s1)
    for i in range(M - 2 * W + w + 1):  # 4: (F0 & B1) (F1 & B0); the last worker's first F0, B1 not overlapped
        if i == 0 and w == W - 1:
            fwd(s0)
            bwd(s1, False)
        else:
            overlapped(s0, s1)
        overlapped(s1, s0)
    for _ in range(W - w - 1):  # 5: B1 (F1 & B0)
        bwd(s1, False)
        overlapped(s1, s0)
    split = False
    for i in range(w + 1):  # 6: B1 B0; the second half splits (I now, W later)
        if i == (w + 1) // 2 and w % 2 == 1:
            split = True
        bwd(s1, split)
        if i == (w + 1) // 2 and w % 2 == 0:
            split = True
        bwd(s0, split)
    for _ in range(W - w - 1):  # 7: W B0
        weight()
        bwd(s0, split)
    while pending:  # 8: the deferred W passes
        weight()
    return out, pairs


#: How an overlapped F&B pair of :func:`dualpipe_v` / :func:`dualpipe` is run and when its tensors leave.
OVERLAP_MODELS: dict[str, str] = {
    "pipelab": "the F, then the B; each sends its tensor when it ends (the F's activation leaves before the B runs)",
    "torch": "torch's OVERLAP_F_B: the F, then the B; both tensors leave after the B (Schedule.send_after)",
}


def _overlap_sends(overlap: str, programs: Sequence[Sequence[_Job]], pairs: Sequence[Sequence[tuple[int, int]]]
                   ) -> dict[_Job, _Job]:
    """One step's ``send_after`` of the pairs: none under ``"pipelab"``, F → its B under ``"torch"``."""
    if overlap not in OVERLAP_MODELS:
        raise ValueError(f"overlap must be one of {sorted(OVERLAP_MODELS)}, got {overlap!r}")
    if overlap == "pipelab":
        return {}
    return {prog[f]: prog[b] for prog, ps in zip(programs, pairs) for f, b in ps}


@gc_paused
def dualpipe_v(W: int, M: int, steps: int = 1, *, overlap: str = "pipelab") -> Schedule:
    """DualPipeV (DeepSeek's "cut-in-half" DualPipe), in the order of torch's ``ScheduleDualPipeV``.

    Worker w runs the eight phases of ``_dualpipe_v_worker`` (torch's order); micro-batches mix a fused B (most)
    and a split I + W (warm-up and cool-down). DeepSeek overlaps the F and the B of a pair (two chunks) in a
    time F&B ≤ T_F + T_B (§3.2.1); pipelab runs a pair as the F then the B, as torch's runtime runs its
    ``OVERLAP_F_B``, and ``overlap`` (:data:`OVERLAP_MODELS`) says when the pair's tensors leave:
    ``"pipelab"`` (default) each when its job ends; ``"torch"`` both after the B (``send_after[F] = B``), torch's
    ``ScheduleDualPipeV`` job for job, idling DualPipe's README bubble (PP/2 − 1)(F&B + B − 3W) at
    T_F = T_I ≥ T_W (tests); ``"pipelab"`` idles less (T_F·(W − 1) at equal costs).

    Raises:
        ValueError: if M < 2W = D (torch's requirement: at least as many micro-batches as stages), or an
            unknown ``overlap``.

    Example:
        >>> [str(a) for a in dualpipe_v(W=1, M=2).programs[0]]
        ['F0.0', 'F1.0', 'F0.1', 'B1.0', 'F1.1', 'B0.0', 'B1.1', 'U1', 'I0.1', 'W0.1', 'U0']

    Reference: DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437, §3.2.1, Table 2);
    github.com/deepseek-ai/DualPipe (DualPipeV; README: "Pipeline Bubbles and Memory Usage Comparison");
    torch.distributed.pipelining.ScheduleDualPipeV (``OVERLAP_F_B``, ``_add_send_recv``).
    """
    W, M, steps = _v_sizes("dualpipe_v", W, M, steps)
    if M < 2 * W:
        raise ValueError(f"dualpipe_v needs M >= D = 2W micro-batches (M={M}, W={W}, D={2 * W})")
    programs, pairs = zip(*(_dualpipe_v_worker(w, W, M) for w in range(W)))
    late = _overlap_sends(overlap, programs, pairs)
    return _v_schedule("dualpipe_v", "DualPipeV", programs, W, M, steps, {"overlap": overlap}, late)


# ------------------------------------------------------------------------------------- V-Half, V-Min
#: Slots of one building block per worker and micro-batch: F, I and W of two chunks at T_F = T_I = T_W.
_PERIOD = 6


def _v_block(kind: str, W: int) -> list[tuple[int, int, int, int]]:
    """The V-shape building block (NeurIPS 2024, V-Min / V-Half blocks): per worker w, the unit slots of
    (F chunk 0, F chunk 1, I chunk 1, I chunk 0) of micro-batch 0; micro-batch j adds 6j.

    V-Min: F0 at w, F1 at 2W−1−w, I1 at 2W+g+w, I0 at 4W+g−1−w (g = 2 when 3 | W, else 0): every hop
    waits one slot, so chunk 0 lives about 4W slots and chunk 1 only g+1, a lifespan of ≈ 4W slots, i.e.
    ≈ 4W/6 chunk activations ≈ W/3 full micro-batches.
    V-Half: F0 at 2w, F1 at 3W−2−w, I1 at 3W+g−1+2w, I0 at 6W+g−2−w (g = 3 when W is even, else 0):
    the way down (F0) and back up (I1) take two slots per hop, the lifespan ≈ 6W slots ≈ W/2 micro-batches.
    The gaps g make the four slots of every worker distinct modulo 6, so the repeated blocks never collide.
    """
    if kind == "min":
        g = 2 if W % 3 == 0 else 0
        return [(w, 2 * W - 1 - w, 2 * W + g + w, 4 * W + g - 1 - w) for w in range(W)]
    g = 3 if W % 2 == 0 else 0
    return [(2 * w, 3 * W - 2 - w, 3 * W + g - 1 + 2 * w, 6 * W + g - 2 - w) for w in range(W)]


def _v_block_worker(w: int, W: int, M: int, slots: tuple[int, int, int, int]) -> list[_Job]:
    """The nominal program: lay the block of every micro-batch at its slots, put each W (FIFO of the input
    gradients) into the next free slot after its I, and read the program off the slots in time order."""
    s0, s1 = v_stage(w, 0, W), v_stage(w, 1, W)
    at: dict[int, tuple[str, int, int]] = {}
    for j in range(M):
        for slot, (op, k) in zip(slots, (("F", s0), ("F", s1), ("I", s1), ("I", s0))):
            t = slot + _PERIOD * j
            if t in at:  # cannot happen for the blocks of _v_block (distinct modulo 6); kept as a guard
                raise AssertionError(f"V-shape block collision on worker {w} at slot {t}")
            at[t] = (op, k, j)
    out: list[_Job] = []
    pending: deque[tuple[int, int]] = deque()
    for t in range(max(at) + 1):
        if t in at:
            op, k, j = at[t]
            out.append((op, k, j))
            if op == "I":
                pending.append((k, j))
        elif pending:
            out.append(("W", *pending.popleft()))
    out += [("W", k, j) for k, j in pending]
    return out


def _peak_in_flight(program: Sequence[_Job]) -> int:
    """Most activations a worker holds along its program: max over prefixes of #F − #W (held F to W)."""
    held = peak = 0
    for op, _, _ in program:
        held += 1 if op == "F" else -1 if op == "W" else 0
        peak = max(peak, held)
    return peak


def _squeeze_and_reorder(W: int, M: int, nominal: Sequence[Sequence[_Job]]) -> list[list[_Job]]:
    """The paper's "squeeze" and "reorder" steps (NeurIPS 2024, building a pipeline) as list scheduling.

    Keeps every worker's order of F and I jobs from the repeated blocks (``nominal``) and, one unit of time after
    another, runs on each worker its next F or I job as soon as its dependencies have ended (an F only while the
    worker holds fewer activations than the nominal program's peak, so the peak memory is never raised), otherwise
    its oldest pending W, otherwise nothing: :func:`~pipelab.schedules.constructor.construct` with that order,
    admission by activations and W passes ranked after F and I, first in, first out. In the steady phase this is
    the block itself; in the warm-up and cool-down it moves jobs into the ramps' idle slots.
    """
    order = [[("F" if op == "F" else "I", k, 0, j) for op, k, j in prog if op != "W"] for prog in nominal]
    position = {job: i for jobs in order for i, job in enumerate(jobs)}

    def priority(a: Action, M: int) -> tuple:
        return (1, position[("I", a.stage, 0, a.micro)]) if a.op == "W" else (0,)

    s = construct(2 * W, M, W, compute=lambda k, b, d: min(k, 2 * W - 1 - k), priority=priority,
                  max_in_flight=[_peak_in_flight(p) for p in nominal], admission="activations", split=True,
                  order=order, b_cost=2.0, name="V-shape squeeze")
    return [[(a.op, a.stage, a.micro) for a in prog if a.op != "U"] for prog in s.programs]


def _v_block_schedule(kind: str, label: str, W: int, M: int, steps: int) -> Schedule:
    W, M, steps = _v_sizes(f"v_{kind}", W, M, steps)
    blocks = _v_block(kind, W)
    nominal = [_v_block_worker(w, W, M, blocks[w]) for w in range(W)]
    return _v_schedule(f"v_{kind}", label, _squeeze_and_reorder(W, M, nominal), W, M, steps)


@gc_paused
def v_half(W: int, M: int, steps: int = 1) -> Schedule:
    """V-Half: the V-shape schedule with about half of 1F1B's activation memory (NeurIPS 2024).

    As in the paper: repeat the V-Half building block (:func:`_v_block`) per micro-batch, 6 unit slots apart,
    W passes in the free slots; then squeeze and reorder (:func:`_squeeze_and_reorder`). Measured at
    T_F = T_I = T_W (tests): peak activation memory the paper's (W+2)//2 micro-batches (1F1B holds W); the
    longest worker idles 3W − 3 (even W) or 3W − 4 (odd W) unit jobs, the paper's ≈ 3W.

    Example:
        >>> from pipelab.schedules import validate
        >>> s = v_half(W=2, M=4)
        >>> validate(s)
        >>> s.D, s.split_backward
        (4, True)

    Reference: Qi, Wan, Amar, Lin, "Pipeline Parallelism with Controllable Memory" (NeurIPS 2024, arXiv
    2405.15362: building blocks and lifespan, the V-Half block; summary table on the authors' page).
    """
    return _v_block_schedule("half", "V-Half", W, M, steps)


@gc_paused
def v_min(W: int, M: int, steps: int = 1) -> Schedule:
    """V-Min: the V-shape schedule with about a third of 1F1B's activation memory (NeurIPS 2024).

    As :func:`v_half` with the V-Min block (one-slot hops). Measured at T_F = T_I = T_W (tests): peak activation
    memory the paper's (W+4)//3 micro-batches; the longest worker idles 4W − 5 (4W − 3 when 3 | W) unit jobs.

    Example:
        >>> from pipelab.schedules import validate
        >>> validate(v_min(W=3, M=6))

    Reference: Qi, Wan, Amar, Lin, "Pipeline Parallelism with Controllable Memory" (NeurIPS 2024, arXiv
    2405.15362: the V-Min block; summary table on the authors' page).
    """
    return _v_block_schedule("min", "V-Min", W, M, steps)


# ------------------------------------------------------------------------------------------ DualPipe
@gc_paused
def dualpipe(W: int, M: int, steps: int = 1, *, overlap: str = "pipelab") -> Schedule:
    """DualPipe (DeepSeek-V3 §3.2.1): bidirectional, every stage on two workers, micro-batches fed from both ends.

    D = W stages (W even); stage k on workers k and W − 1 − k (two holders, twice 1F1B's parameters).
    Micro-batches j < M/2 run the forward direction (stage k on worker k), the others the reverse one (stage k
    on worker W − 1 − k). Each holder applies U(k, t) after all M weight-gradient jobs of stage k (the
    all-reduce of both copies): plain mini-batch training's update. Worker r and its mirror run DualPipeV's
    program of worker min(r, W−1−r) with W/2 workers and M/2 micro-batches (DeepSeek's reference has the same
    eight phases on "half ranks"); ``overlap`` as in :func:`dualpipe_v`.

    Raises:
        ValueError: W odd, M odd, or M < 2W (DeepSeek's requirement: at least W micro-batches per direction);
            an unknown ``overlap``.

    Example:
        >>> s = dualpipe(W=2, M=4)
        >>> s.weight_holders, [str(a) for a in s.programs[1]][:4]
        (((0, 1), (1, 0)), ['F0.2', 'F1.0', 'F0.3', 'B1.0'])

    Reference: DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437, §3.2.1, Table 2);
    github.com/deepseek-ai/DualPipe (dualpipe.py: phases 0/1 per half of the ranks).
    """
    W, M, steps = _v_sizes("dualpipe", W, M, steps)
    if W % 2 or M % 2 or M < 2 * W:
        raise ValueError(f"dualpipe needs an even number of workers W, an even M (half per direction) and "
                         f"M >= 2W (got W={W}, M={M})")
    half, per_direction = W // 2, M // 2
    programs, pairs = [], []
    for r in range(W):
        h = min(r, W - 1 - r)
        forward_chunk = 0 if r < half else 1  # the chunk that carries forward-direction micro-batches
        prog = []
        jobs, overlapped = _dualpipe_v_worker(h, half, per_direction)
        for op, k, j in jobs:
            chunk = int(k >= half)
            prog.append((op, k, j if chunk == forward_chunk else per_direction + j))
        programs.append(prog)
        pairs.append(overlapped)
    late = _overlap_sends(overlap, programs, pairs)
    return _assemble(f"DualPipe(W={W}, M={M}" + ("" if overlap == "pipelab" else f", {overlap} overlap") + ")",
                     programs, W, M, steps, [(k, W - 1 - k) for k in range(W)], [int(k >= half) for k in range(W)],
                     {"W": W, "M": M, "builder": "dualpipe", "overlap": overlap}, late)
