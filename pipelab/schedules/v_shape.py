"""V-shape and interleaved zero-bubble schedules with a split backward (F, I, W, U actions).

V-shape placement (Qi et al., NeurIPS 2024): W workers hold D = 2W stages, stage s on worker ``w(s) = s`` for
s < W (chunk 0, down) and ``2W − 1 − s`` for s ≥ W (chunk 1, back up), so the loss is computed where the input
came in. Every builder is flushed: U(k, t) follows the worker's last W (or B) of stage k in step t.

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
    """The stage of ``chunk`` (0 or 1) on worker ``w`` in the V-shape placement: w, or 2W − 1 − w."""
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
    """Repeat each one-step program (and ``send_after``) ``steps`` times, U(k, t) after the worker's last W/B of k."""
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
    """ZB-V: the zero-bubble V schedule, in the order torch's ``ScheduleZBVZeroBubble`` runs it (Qi et al., §6).

    Worker w: 2(W−w)−1 F of chunk 0, w pairs (F1, F0), W − w triples (F1, I1, W1), the steady (F0, I0, W0, F1, I1,
    W1), then w pairs (I0, I1), W − w pairs (I0, W0) and the deferred W. At T_F = T_I = T_W: no bubble, peak memory
    W micro-batches. torch plans max(2W − 1, M) micro-batches and drops those ≥ M.
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

    Stage s = c·W + w on worker w. With P = M/max(1, ⌊M/W⌋) micro-batches per round, worker w runs
    (V−1)·P + W − 1 − w warm-up F; the i-th F is of chunk ⌊i/P⌋ mod V, the i-th I of chunk V − 1 − (⌊i/P⌋ mod V);
    each I follows the next F and, from the (w+1)-th on, precedes the oldest pending W (ZB-H1; Narayanan et al.,
    SC 2021, for the interleaved order).
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
    """Worker w's one-step DualPipeV program and its overlapped (F, B) position pairs, in eight phases:

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

    A pair (F & B of two chunks, overlapped by DeepSeek) runs as the F then the B, as torch's ``OVERLAP_F_B``;
    ``overlap="torch"`` sends both tensors after the B, torch's schedule job for job, idling DualPipe's README bubble
    (PP/2 − 1)(F&B + B − 3W) at T_F = T_I ≥ T_W; ``"pipelab"`` sends each at its job's end, idling T_F·(W − 1).
    M ≥ 2W = D (torch's requirement).
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
    """The V-shape building block (NeurIPS 2024): per worker, the slots of (F0, F1, I1, I0) of micro-batch 0.

    Micro-batch j adds 6j. V-Min: F0 at w, F1 at 2W−1−w, I1 at 2W+g+w, I0 at 4W+g−1−w (g = 2 when 3 | W):
    lifespan ≈ 4W slots ≈ W/3 micro-batches. V-Half: F0 at 2w, F1 at 3W−2−w, I1 at 3W+g−1+2w, I0 at 6W+g−2−w
    (g = 3 when W is even): ≈ W/2. The gaps g make each worker's slots distinct modulo 6, so blocks never collide.
    """
    if kind == "min":
        g = 2 if W % 3 == 0 else 0
        return [(w, 2 * W - 1 - w, 2 * W + g + w, 4 * W + g - 1 - w) for w in range(W)]
    g = 3 if W % 2 == 0 else 0
    return [(2 * w, 3 * W - 2 - w, 3 * W + g - 1 + 2 * w, 6 * W + g - 2 - w) for w in range(W)]


def _v_block_worker(w: int, W: int, M: int, slots: tuple[int, int, int, int]) -> list[_Job]:
    """The nominal program: every micro-batch's block at its slots, each W (FIFO) in the next free slot after its I."""
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
    """The paper's "squeeze" and "reorder" steps (NeurIPS 2024) as list scheduling.

    :func:`~pipelab.schedules.constructor.construct` keeping each worker's F/I order, admitting an F only below the
    nominal peak of activations, W passes after F and I, FIFO: the block in the steady phase, ramps filled.
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

    Repeated V-Half blocks, then squeeze and reorder. At T_F = T_I = T_W (tests): peak memory the paper's (W+2)//2
    micro-batches; the longest worker idles 3W − 3 (even W) or 3W − 4 (odd W) units, the paper's ≈ 3W.
    """
    return _v_block_schedule("half", "V-Half", W, M, steps)


@gc_paused
def v_min(W: int, M: int, steps: int = 1) -> Schedule:
    """V-Min: as :func:`v_half` with the V-Min block: peak (W+4)//3 micro-batches, idle 4W − 5 (4W − 3 when 3 | W)."""
    return _v_block_schedule("min", "V-Min", W, M, steps)


# ------------------------------------------------------------------------------------------ DualPipe
@gc_paused
def dualpipe(W: int, M: int, steps: int = 1, *, overlap: str = "pipelab") -> Schedule:
    """DualPipe (DeepSeek-V3 §3.2.1): bidirectional, every stage on two workers, micro-batches fed from both ends.

    Stage k on workers k and W − 1 − k; micro-batches j < M/2 run forward, the others reverse; each holder applies
    U(k, t) after all M weight gradients (all-reduce). Worker r runs DualPipeV's program of worker min(r, W−1−r)
    with W/2 workers and M/2 micro-batches (DeepSeek's "half ranks"). W and M even, M ≥ 2W.
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
