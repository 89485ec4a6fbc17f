"""pipelab ↔ torch.distributed.pipelining: action lists and CSV both ways, checked against torch's own
schedules and runtime.

torch's schedules are built without a process group: the schedule classes only read ``num_stages``,
``group_size``, ``group_rank``, ``stage_index`` and ``submod`` from their stages while computing
``pipeline_order`` (every rank's list is computed on each rank), so light stand-ins
(:func:`stand_in_stages`) take the place of ``PipelineStage`` s, as torch's own schedule tests do with mock stages.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.pipelining import schedules as ts

from pipelab.distributed import spawn
from pipelab.emulator import Emulator, train_plain
from pipelab.partition import split
from pipelab.runtime.torch_pipelining import run_torch_pipelining
from pipelab.schedules import Schedule, ScheduleError, gpipe, interleaved_1f1b, one_f_one_b, pipedream, validate
from pipelab.schedules.torch_actions import (
    TorchAction,
    format_action,
    from_torch,
    from_torch_csv,
    parse_action,
    to_torch,
    to_torch_csv,
)
from pipelab.schedules.transfers import messages
from pipelab.simulator import simulate
from pipelab.studies.models import deep_mlp

V_SHAPED = (ts.ScheduleZBVZeroBubble, ts.ScheduleDualPipeV)


def stand_in_stages(cls: type, R: int, V: int) -> Any:
    """Rank 0's stages for a torch schedule class over R ranks and V stages per rank (looped: r + i·R; V-shaped:
    r and D−1−r), as stand-ins with the attributes the schedule constructors read."""
    D = R * V

    def stage(k: int) -> SimpleNamespace:
        return SimpleNamespace(num_stages=D, group_size=R, group_rank=0, stage_index=k, submod=None)

    if V == 1:
        return stage(0)
    return [stage(k) for k in ((0, D - 1) if cls in V_SHAPED else tuple(i * R for i in range(V)))]


def torch_schedule(cls: type, R: int, V: int, M: int) -> Any:
    return cls(stand_in_stages(cls, R, V), M)


def compute_only(order: dict) -> dict:
    return {r: [a for a in acts if a is not None and a.is_compute_op] for r, acts in order.items()}


# ------------------------------------------------------------------------ torch's schedules imported

MULTI = [(ts.ScheduleInterleaved1F1B, 2, 2, 4), (ts.ScheduleInterleaved1F1B, 4, 2, 8),
         (ts.ScheduleInterleavedZeroBubble, 4, 2, 8), (ts.ScheduleInterleavedZeroBubble, 4, 2, 16),
         (ts.ScheduleZBVZeroBubble, 2, 2, 4), (ts.ScheduleZBVZeroBubble, 4, 2, 8),
         (ts.ScheduleZBVZeroBubble, 4, 2, 16), (ts.ScheduleDualPipeV, 4, 2, 8), (ts.ScheduleDualPipeV, 4, 2, 16)]


@pytest.mark.parametrize("cls,R,V,M", MULTI, ids=[f"{c.__name__}-R{r}-M{m}" for c, r, _, m in MULTI])
def test_torch_multi_stage_schedules_import_validate_and_simulate(cls: type, R: int, V: int, M: int) -> None:
    t = torch_schedule(cls, R, V, M)
    D = R * V
    plain = from_torch(t.pipeline_order, n_stages=D, n_microbatches=M, name=cls.__name__)
    comm = from_torch(t.pipeline_order_with_comms, n_stages=D, n_microbatches=M, name=cls.__name__)
    # the compute programs are the same with or without torch's lowering (comms, UNSHARD, REDUCE_GRAD)
    assert comm.programs == plain.programs
    assert plain.W == R and plain.D == D and plain.sync_lag == 0
    split = cls is not ts.ScheduleInterleaved1F1B
    assert plain.split_backward == split
    # every job of the step, placed as torch places stages (chunk = position among the rank's stages)
    jobs = {(a.op, a.stage, a.micro) for p in plain.programs for a in p if a.op != "U"}
    assert len(jobs) == plain.n_jobs
    for w, prog in enumerate(plain.programs):
        mine = sorted({a.stage for a in prog})
        assert all(a.chunk == mine.index(a.stage) for a in prog)
        assert mine == sorted(k for k, r in t.stage_index_to_group_rank.items() if r == w)
    # torch's lowering: one SEND and one RECV per cross-rank transfer; UNSHARD/RESHARD/REDUCE_GRAD kept aside
    assert comm.params["torch_comms"] == 2 * len(messages(plain))
    kinds = {text.lstrip("0123456789") for _, _, text in comm.params["torch_extra"]}
    assert kinds == {"UNSHARD", "RESHARD", "REDUCE_GRAD"} and "REDUCE_GRAD" in comm.update_rule
    # U(k) right after the rank's last compute action of stage k, i.e. where torch puts REDUCE_GRAD
    for prog in plain.programs:
        for i, a in enumerate(prog):
            if a.op == "U":
                assert prog[i - 1].stage == a.stage or prog[i - 1].op == "U"
                assert all(b.stage != a.stage for b in prog[i + 1:])
    res = simulate(plain, 1.0, 2.0, i_cost=1.0, w_cost=1.0)  # F = I = W = one unit per chunk
    validate(res)
    # Megatron's interleaved 1F1B: bubble time (p−1)(t_f + t_b) per worker (Narayanan et al., SC 2021, §2.2);
    # the zero-bubble family with T_F = T_I = T_W: a (p−1)-unit warm-up bubble that does not grow with M
    # (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6 and its repository's comparison table);
    # DualPipeV: (PP/2 − 1)(F&B + B − 3W) with PP = 2R stages (DualPipe's README), F&B = F + B as torch runs
    # the pair one after the other: (R − 1)(3 + 2 − 3).
    ideal = V * M * (1 + 2)
    idle = {ts.ScheduleInterleaved1F1B: 2 + 1, ts.ScheduleDualPipeV: 3 + 2 - 3}.get(cls, 1)
    assert res.makespan == pytest.approx(ideal + (R - 1) * idle)
    assert res.bubble == pytest.approx(1 - ideal / res.makespan)
    if cls is ts.ScheduleZBVZeroBubble:  # activation memory 1x of 1F1B: 2p chunk activations on every rank
        assert res.peak_activations.tolist() == [2 * R] * R


def test_torch_gpipe_imports_with_the_closed_form_bubble() -> None:
    D, M = 4, 8
    s = from_torch(torch_schedule(ts.ScheduleGPipe, D, 1, M).pipeline_order, n_stages=D, n_microbatches=M)
    assert s.programs == gpipe(D, M).programs  # torch's REDUCE_GRAD stands where pipelab's U is
    assert s.params["torch_extra"] == tuple((r, 2 * M, f"{r}REDUCE_GRAD") for r in range(D))
    assert simulate(s).bubble == pytest.approx((D - 1) / (M + D - 1))  # GPipe: (D−1)/(M+D−1) with F = B


def test_torch_1f1b_pipeline_order_is_inconsistent_on_the_last_rank() -> None:
    """torch 2.x's ``Schedule1F1B._get_pipeline_order`` (an IR for display: its runtime does not use it) starts
    the last rank at forward 1 and ends it at forward M: the import reports it instead of simulating nonsense."""
    D, M = 4, 8
    order = torch_schedule(ts.Schedule1F1B, D, 1, M).pipeline_order
    if [str(a) for a in order[D - 1][:2]] != [f"{D - 1}F1", f"{D - 1}B0"]:
        pytest.skip("this torch version fixed Schedule1F1B's pipeline_order")
    with pytest.raises(ScheduleError, match=rf"F{D - 1}\.8 is out of range") as e:
        from_torch(order, n_stages=D, n_microbatches=M)
    assert ">>F3.8<<" in str(e.value)  # the marked grid
    fixed = {r: list(acts) for r, acts in order.items()}
    # forward j of the last rank's list stands for micro-batch j−1: renumbered, torch's 1F1B IR is pipelab's 1F1B
    fixed[D - 1] = [ts._Action(D - 1, ts.F, a.microbatch_index - 1) if a.computation_type == ts.F else a
                    for a in fixed[D - 1]]
    assert from_torch(fixed, n_stages=D, n_microbatches=M).programs == one_f_one_b(D, M).programs


def test_steps_repeat_the_one_step_lists_with_an_update_each() -> None:
    t = torch_schedule(ts.ScheduleZBVZeroBubble, 2, 2, 4)
    s = from_torch(t.pipeline_order, n_stages=4, n_microbatches=4, steps=3)
    assert s.steps == 3 and s.n_jobs == 3 * 4 * 4 * 3
    assert [a.step for a in s.programs[0] if a.op == "U"] == [0, 0, 1, 1, 2, 2]
    validate(simulate(s, 1.0, 2.0))


# ------------------------------------------------------------------------ torch's timing, simulated apart

#: Unit costs of the timing comparison: F = I = W = 1, B = I + W = 2 (an OVERLAP_F_B costs its sub-actions).
COST = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}


def torch_timeline(order: dict, D: int) -> dict[tuple[str, int, int], tuple[float, float]]:
    """Start and end of every compute action when torch's ``_PipelineScheduleRuntime`` runs ``order`` (per-rank
    lists with SEND/RECV) at :data:`COST`, with free communication; written apart from pipelab's simulator.

    A rank runs its list in order (an ``OVERLAP_F_B``: its sub-actions in order). SEND and RECV post without
    blocking (``_batch_p2p`` issues ``batch_isend_irecv``); a SEND happens when the rank reaches it, and a compute
    action that consumes a tensor from another rank needs that tensor's RECV posted earlier on its rank and waits
    for the matching SEND (``_wait_batch_p2p`` before the compute); a tensor between two stages of one rank is
    handed over at once (``set_local_fwd_input`` / ``set_local_bwd_input``). RECV itself does not wait: torch's
    lowering posts RECVs early (when the sender's action is lowered), and a waiting RECV would stall the ranks.
    """
    lists = {r: [x for a in acts if a is not None for x in (a.sub_actions or (a,))] for r, acts in order.items()}
    rank_of = {a.stage_index: r for r, acts in lists.items() for a in acts if a.computation_type.value in COST}
    clock = dict.fromkeys(lists, 0.0)
    ptr = dict.fromkeys(lists, 0)
    ended: dict[tuple[str, int, int], float] = {}
    sent: dict[tuple[str, int, int], float] = {}
    posted: set[tuple[int, str, int, int]] = set()
    times: dict[tuple[str, int, int], tuple[float, float]] = {}

    def ready(r: int, kind: str, k: int, j: int) -> float | None:
        """When the input of compute action (kind, k, j) on rank r is there (None: not yet)."""
        if kind == "F" and k > 0:
            src, local, recv = ("SEND_F", k - 1, j), [("F", k - 1, j)], ("RECV_F", k)
        elif kind in ("B", "I") and k < D - 1:
            src, local, recv = ("SEND_B", k + 1, j), [("B", k + 1, j), ("I", k + 1, j)], ("RECV_B", k)
        else:
            return 0.0
        if rank_of[src[1]] == r:
            return next((ended[x] for x in local if x in ended), None)
        assert (r, *recv, j) in posted, f"rank {r} computes {k}{kind}{j} before receiving its input"
        return sent.get(src)

    progress = True
    while progress:
        progress = False
        for r, acts in lists.items():
            while ptr[r] < len(acts):
                a = acts[ptr[r]]
                kind, k, j = a.computation_type.value, a.stage_index, a.microbatch_index
                if kind in COST:
                    t = ready(r, kind, k, j)
                    if t is None:
                        break
                    start = max(clock[r], t)
                    clock[r] = ended[(kind, k, j)] = start + COST[kind]
                    times[(kind, k, j)] = (start, clock[r])
                elif kind.startswith("SEND"):
                    sent[(kind, k, j)] = clock[r]
                elif kind.startswith("RECV"):
                    posted.add((r, kind, k, j))
                ptr[r] += 1
                progress = True
    assert all(ptr[r] == len(acts) for r, acts in lists.items()), "torch's runtime would hang on these lists"
    return times


def pipelab_timeline(s: Schedule) -> tuple[dict[tuple[str, int, int], tuple[float, float]], float]:
    """Start and end of every compute job of ``pipelab.simulate`` at :data:`COST`, and the makespan."""
    r = simulate(s, COST["F"], COST["B"], i_cost=COST["I"], w_cost=COST["W"])
    cols = r.jobs()
    return ({(str(op), int(k), int(j)): (float(a), float(b)) for op, k, j, a, b in
             zip(cols["op"], cols["stage"], cols["micro"], cols["start"], cols["end"]) if op != "U"}, r.makespan)


def torch_lists(cls: type, R: int, V: int, M: int, **kw: Any) -> tuple[dict, dict]:
    """(compute-only lists, the lists torch's runtime executes) of a torch schedule class.

    Multi-stage classes run their ``pipeline_order_with_comms``. ``ScheduleGPipe`` and ``Schedule1F1B`` run their
    own ``_step_microbatches`` (each SEND right after its compute action), which is their ``pipeline_order``
    lowered by ``_add_send_recv``; ``Schedule1F1B``'s ``pipeline_order`` numbers the last rank's forwards from 1
    (see the test below), renumbered here to the order its runtime runs."""
    t = cls(stand_in_stages(cls, R, V), M, **kw)
    order = {r: [a for a in acts if a is not None] for r, acts in t.pipeline_order.items()}
    if cls is ts.Schedule1F1B and str(order[R - 1][0]) == f"{R - 1}F1":
        order[R - 1] = [ts._Action(R - 1, ts.F, a.microbatch_index - 1) if a.computation_type == ts.F else a
                        for a in order[R - 1]]
    if V == 1:
        return order, ts._add_send_recv({r: list(acts) for r, acts in order.items()}, stage_to_rank=lambda k: k,
                                        num_stages=R)
    return order, t.pipeline_order_with_comms


TIMED = [(ts.ScheduleGPipe, 4, 1, 8, {}), (ts.ScheduleGPipe, 3, 1, 2, {}), (ts.Schedule1F1B, 4, 1, 8, {}),
         (ts.Schedule1F1B, 3, 1, 3, {}), (ts.ScheduleInterleaved1F1B, 2, 2, 4, {}),
         (ts.ScheduleInterleaved1F1B, 4, 2, 8, {}), (ts.ScheduleInterleaved1F1B, 3, 3, 6, {}),
         (ts.ScheduleLoopedBFS, 2, 2, 4, {}), (ts.ScheduleLoopedBFS, 4, 3, 8, {}),
         (ts.ScheduleInterleavedZeroBubble, 4, 2, 8, {}), (ts.ScheduleInterleavedZeroBubble, 2, 3, 6, {}),
         (ts.ScheduleZBVZeroBubble, 2, 2, 4, {}), (ts.ScheduleZBVZeroBubble, 4, 2, 8, {}),
         (ts.ScheduleZBVZeroBubble, 3, 2, 5, {}), (ts.ScheduleDualPipeV, 2, 2, 4, {}),
         (ts.ScheduleDualPipeV, 4, 2, 8, {}), (ts.ScheduleDualPipeV, 4, 2, 11, {}), (ts.ScheduleDualPipeV, 3, 2, 9, {}),
         (ts.ScheduleInterleavedZeroBubble, 4, 2, 8, {"defer_pp_recv": True})]


@pytest.mark.parametrize("cls,R,V,M,kw", TIMED, ids=[f"{c.__name__}-R{r}-V{v}-M{m}" + ("-defer" if kw else "")
                                                     for c, r, v, m, kw in TIMED])
def test_imported_torch_lists_keep_torchs_timing(cls: type, R: int, V: int, M: int, kw: dict) -> None:
    """Every job starts and ends when torch's runtime would run it (an independent simulation of its lists),
    imported from the compute-only lists or from those with SEND/RECV, and exported back to torch."""
    D = R * V
    compute, with_comms = torch_lists(cls, R, V, M, **kw)
    expected = torch_timeline(with_comms, D)
    assert len(expected) == sum(y.computation_type.value in COST for acts in compute.values() for x in acts
                                for y in x.sub_actions or (x,))
    makespan = max(end for _, end in expected.values())
    for order in (compute, with_comms):
        s = from_torch(order, n_stages=D, n_microbatches=M)
        got, span = pipelab_timeline(s)
        assert got == expected and span == makespan
    # pipelab -> torch: torch's lowering of the compute-only export, and our SEND/RECV, keep the timing
    stage_to_rank = {k: w for w, p in enumerate(s.programs) for k in {a.stage for a in p}}
    for exported in (ts._add_send_recv(to_torch(s), stage_to_rank=stage_to_rank.__getitem__, num_stages=D),
                     to_torch(s, comms=True)):
        assert torch_timeline(exported, D) == expected


def test_dualpipev_with_deferred_receives_is_refused() -> None:
    """torch's ``defer_pp_recv`` moves each RECV to just before its consumer; in DualPipeV a rank pair carries
    activations one way and gradients the other way, and the moved RECVs no longer come in the order of the
    peer's SENDs, which torch's untagged point-to-point operations match in order. The import refuses the lists
    (torch 2.13's runtime on them, 4 gloo ranks, M = 8: weight gradients off by 0.89 against autograd, 2e-15
    without ``defer_pp_recv``); the compute-only lists are those of the plain schedule and keep its timing."""
    compute, with_comms = torch_lists(ts.ScheduleDualPipeV, 4, 2, 8, defer_pp_recv=True)
    with pytest.raises(ValueError, match=r"rank 1's action 6RECV_B0 is its receive #6 from rank 0, but rank 0's "
                                         r"send #6 to it is another tensor"):
        from_torch(with_comms, n_stages=8, n_microbatches=8)
    expected = torch_timeline(torch_lists(ts.ScheduleDualPipeV, 4, 2, 8)[1], 8)
    assert pipelab_timeline(from_torch(compute, n_stages=8, n_microbatches=8))[0] == expected


def test_export_of_a_late_send_is_an_overlap_or_a_placed_send() -> None:
    """A tensor sent after the next job exports as OVERLAP_F_B (compute only) or as a SEND after that job; one
    sent after a later job, with a job between that sends at once, only with comms=True. Either way torch's
    runtime (the timeline above) times the export as pipelab simulates the schedule."""
    import dataclasses

    base = one_f_one_b(2, 3)  # worker 0: F0.0 F0.1 B0.0 F0.2 B0.1 B0.2
    pair = dataclasses.replace(base, send_after={("F", 0, 0, 1): ("B", 0, 0, 0)})
    assert [str(a) for a in to_torch(pair)[0]] == ["0F0", "(0F1;0B0)OVERLAP_F_B", "0F2", "0B1", "0B2"]
    late = dataclasses.replace(base, send_after={("B", 1, 0, 0): ("B", 1, 0, 1)})  # worker 1: F1.0 B1.0 F1.1 B1.1
    with pytest.raises(ValueError, match=r"B1\.0 \(step 0\) sends its tensor after B1\.1, but F1\.1 between them "
                                         r"sends at another time.*export with comms=True"):
        to_torch(late)
    for s in (pair, late):
        expected = pipelab_timeline(s)[0]
        assert torch_timeline(to_torch(s, comms=True), 2) == expected != pipelab_timeline(base)[0]
    lowered = ts._add_send_recv(to_torch(pair), stage_to_rank=lambda k: k, num_stages=2)
    assert torch_timeline(lowered, 2) == pipelab_timeline(pair)[0]


# ------------------------------------------------------------------------ pipelab -> torch -> pipelab

@pytest.mark.parametrize("make", [lambda: gpipe(4, 6), lambda: one_f_one_b(4, 6), lambda: one_f_one_b(2, 5)],
                         ids=["gpipe", "1f1b-4", "1f1b-2"])
@pytest.mark.parametrize("comms", [False, True])
def test_round_trip_equals_the_original_programs(make: Any, comms: bool, tmp_path: Path) -> None:
    s = make()
    order = to_torch(s, comms=comms)
    assert all(isinstance(a, ts._Action) for acts in order.values() for a in acts)
    assert from_torch(order, n_stages=s.D, n_microbatches=s.M).programs == s.programs
    path = tmp_path / "s.csv"
    to_torch_csv(s, path, comms=comms)
    assert from_torch_csv(path, n_stages=s.D, n_microbatches=s.M).programs == s.programs
    # the CSV is torch's: its own parser reads our cells back into the same _Action lists
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert {r: [ts._Action.from_str(c) for c in row] for r, row in enumerate(rows)} == order


def test_interleaved_round_trip_keeps_the_compute_order() -> None:
    s = interleaved_1f1b(2, 2, 4)
    back = from_torch(to_torch(s, comms=True), n_stages=4, n_microbatches=4)
    for a, b in zip(back.programs, s.programs):
        assert [x for x in a if x.op != "U"] == [x for x in b if x.op != "U"]
        assert sorted(x for x in a if x.op == "U") == sorted(x for x in b if x.op == "U")
    # pipelab's interleaved 1F1B and torch's (flex) interleaved 1F1B are not the same order, both valid:
    theirs = from_torch(torch_schedule(ts.ScheduleInterleaved1F1B, 2, 2, 4).pipeline_order, n_stages=4,
                        n_microbatches=4)
    assert simulate(theirs).makespan == simulate(s).makespan


def test_export_with_comms_matches_torchs_own_lowering() -> None:
    """Our SEND/RECV sit where torch's lowering (``_add_send_recv``) puts them, up to the order of receives
    posted at the same time; both import to the same pipelab schedule."""
    s = one_f_one_b(4, 6)
    ours = to_torch(s, comms=True)
    theirs = ts._add_send_recv({r: [a for a in acts] for r, acts in to_torch(s).items()},
                               stage_to_rank=lambda k: k, num_stages=4)
    for r in range(4):
        assert sorted(map(str, ours[r])) == sorted([str(a) for a in theirs[r]] + [f"{r}REDUCE_GRAD"])
    assert from_torch(theirs, n_stages=4, n_microbatches=6).programs == s.programs


def test_messages_of_a_schedule_mixing_fused_and_split_backwards() -> None:
    # as torch's DualPipeV: stage 1 splits micro-batch 0's backward and fuses micro-batch 1's
    base = one_f_one_b(2, 2)
    w1 = []
    for a in base.programs[1]:
        w1 += [a._replace(op="I"), a._replace(op="W")] if a.op == "B" and a.micro == 0 else [a]
    s = Schedule("mixed", (base.programs[0], tuple(w1)), 2, 2)
    grads = [m for m in messages(s) if m.src == 1]
    sent = [s.programs[1][m.send_pos] for m in grads]
    assert [(a.op, a.micro) for a in sent] == [("I", 0), ("B", 1)]
    assert s.split_set == {(1, 0, 0)}


def test_export_refuses_what_torch_cannot_run() -> None:
    with pytest.raises(ValueError, match="steps=2; a torch schedule is one step"):
        to_torch(gpipe(2, 2, steps=2))
    with pytest.raises(ValueError, match="asynchronous"):
        to_torch(pipedream(2, 1, steps=1))
    from pipelab.schedules import ddp
    with pytest.raises(ValueError, match="exactly one rank"):
        to_torch(ddp(2, 2))


def test_action_text_round_trips_torchs_format() -> None:
    for text in ["2F0", "1SEND_B3", "0RECV_F12", "3UNSHARD", "0RESHARD", "7REDUCE_GRAD", "(0F1;3B0)OVERLAP_F_B"]:
        a = parse_action(text)
        assert a is not None and format_action(a) == text == str(ts._Action.from_str(text))
    assert parse_action("") is None
    assert parse_action("(0F1;3B0)OVERLAP_F_B") == TorchAction(-1, "OVERLAP_F_B", None,
                                                               (TorchAction(0, "F", 1), TorchAction(3, "B", 0)))
    with pytest.raises(ValueError, match="not \\[stage\\]\\[kind\\]\\[microbatch\\]"):
        parse_action("2X0")


# ------------------------------------------------------------------------ bad input

def _zbv() -> tuple[dict, int, int]:
    t = torch_schedule(ts.ScheduleZBVZeroBubble, 2, 2, 4)
    return {r: list(acts) for r, acts in t.pipeline_order.items()}, 4, 4


def test_a_missing_w_is_reported_with_the_grid() -> None:
    order, D, M = _zbv()
    order[1] = [a for a in order[1] if str(a) != "2W3"]
    with pytest.raises(ScheduleError, match=r"1 B \(or I and W\) job\(s\) missing, e.g. stage 2 of step 0 "
                                            r"micro-batch 3") as e:
        from_torch(order, n_stages=D, n_microbatches=M)
    assert "worker × time grid" in str(e.value)


def test_a_duplicated_f_is_reported_and_marked() -> None:
    order, D, M = _zbv()
    i = next(i for i, a in enumerate(order[0]) if str(a) == "0F1")
    order[0].insert(i + 1, ts._Action(0, ts.F, 1))
    with pytest.raises(ScheduleError, match=r"job F0\.1 of step 0 appears more than once") as e:
        from_torch(order, n_stages=D, n_microbatches=M)
    assert ">>F0.1<<" in str(e.value)


def test_an_order_that_deadlocks_is_reported() -> None:
    order, D, M = _zbv()
    # rank 1 runs stage 2's first backward before the forward that feeds it reaches stage 3 on rank 1
    acts = order[1]
    i, j = (next(i for i, a in enumerate(acts) if str(a) == x) for x in ("1F0", "2I0"))
    acts.insert(i, acts.pop(j))
    with pytest.raises(ScheduleError, match=r"can never run.*deadlock") as e:
        from_torch(order, n_stages=D, n_microbatches=M)
    assert ">>" in str(e.value)


def test_a_w_before_its_i_is_reported() -> None:
    order, D, M = _zbv()
    acts = order[0]
    i, j = (next(i for i, a in enumerate(acts) if str(a) == x) for x in ("3I0", "3W0"))
    acts[i], acts[j] = acts[j], acts[i]
    with pytest.raises(ScheduleError, match=r"W3\.0 .* can never run; it waits for I3\.0 \(step 0\), which is later "
                                            r"on the same worker") as e:
        from_torch(order, n_stages=D, n_microbatches=M)
    assert ">>W3.0<<" in str(e.value)


def test_communication_that_disagrees_with_the_transfers_is_refused() -> None:
    t = torch_schedule(ts.ScheduleZBVZeroBubble, 2, 2, 4)
    base = {r: [a for a in acts] for r, acts in t.pipeline_order_with_comms.items()}

    def edited(rank: int, fn: Any) -> dict:
        out = {r: list(acts) for r, acts in base.items()}
        out[rank] = fn(out[rank])
        return out

    def drop(text: str) -> Any:
        return lambda acts: [a for a in acts if str(a) != text]

    with pytest.raises(ValueError, match=r"rank 0 lacks 0SEND_F2"):
        from_torch(edited(0, drop("0SEND_F2")), n_stages=4, n_microbatches=4)

    def early_send(acts: list) -> list:
        a = next(a for a in acts if str(a) == "0SEND_F2")
        acts.remove(a)
        return [a] + acts

    with pytest.raises(ValueError, match=r"rank 0's action 0SEND_F2 \(step 0\) comes before the job that produces"):
        from_torch(edited(0, early_send), n_stages=4, n_microbatches=4)

    def late_recv(acts: list) -> list:
        a = next(a for a in acts if str(a) == "1RECV_F1")
        acts.remove(a)
        return acts + [a]

    with pytest.raises(ValueError, match=r"rank 1's action 1RECV_F1 \(step 0\) comes after the job that consumes"):
        from_torch(edited(1, late_recv), n_stages=4, n_microbatches=4)

    def swap_recvs(acts: list) -> list:  # both still before their forwards, but in the other order
        a = next(a for a in acts if str(a) == "1RECV_F1")
        acts.remove(a)
        acts.insert(next(i for i, b in enumerate(acts) if str(b) == "1RECV_F0"), a)
        return acts

    with pytest.raises(ValueError, match=r"torch matches a rank pair's sends and receives in order"):
        from_torch(edited(1, swap_recvs), n_stages=4, n_microbatches=4)
    def late_sends(acts: list) -> list:  # rank 0's first sends, in order, after F3.0, which needs their tensors back
        i = next(i for i, b in enumerate(acts) if str(b) == "3F0")
        sends = [a for a in acts[:i] if "SEND" in str(a)]
        rest = [a for a in acts if a not in sends]
        i = rest.index(acts[i])
        return rest[:i + 1] + sends + rest[i + 1:]

    # the SENDs stand where torch's runtime runs them (Schedule.send_after), so the grid shows the cycle
    with pytest.raises(ScheduleError, match=r"worker 0's action F3\.0 \(step 0, position 3\) can never run; it waits "
                                            r"for F2\.0 .* worker 1's F1\.0 waits for F3\.0, after which F0\.0 sends "
                                            r"its tensor \(send_after\)"):
        from_torch(edited(0, late_sends), n_stages=4, n_microbatches=4)
    with pytest.raises(ValueError, match="matches no transfer"):  # stages 1 and 2 share rank 1 in the V
        from_torch(edited(1, lambda acts: acts + [ts._Action(1, ts.SEND_F, 0)]), n_stages=4, n_microbatches=4)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="ranks 0..1"):
        from_torch({0: ["0F0"], 2: ["1F0"]}, n_stages=2, n_microbatches=1)
    with pytest.raises(ValueError, match="n_microbatches"):
        from_torch({0: ["0F0"]}, n_stages=1, n_microbatches=0)
    with pytest.raises(TypeError, match="torch _Action objects, strings"):
        from_torch({0: [3]}, n_stages=1, n_microbatches=1)
    with pytest.raises(ValueError, match="stage 0 is computed on ranks 0 and 1"):
        from_torch({0: ["0F0", "0B0"], 1: ["0F1", "0B1"]}, n_stages=1, n_microbatches=2)
    with pytest.raises(ValueError, match="no microbatch index"):
        from_torch({0: ["0F"]}, n_stages=1, n_microbatches=1)


def test_csv_errors_name_the_cell(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0B0\n1F0,1Q0\n")
    with pytest.raises(ValueError, match=r"row 1 \(rank 1\), column 1"):
        from_torch_csv(path, n_stages=2, n_microbatches=1)


# ------------------------------------------------------------------------ torch's runtime vs the emulator

TOL = 1e-10
BATCH, STEPS = 8, 2


def _model(case: dict) -> torch.nn.Sequential:
    torch.manual_seed(case.get("seed", 0))
    return deep_mlp(in_features=6, width=8, depth=case["D"], num_classes=4).double()


def _schedule(case: dict, steps: int = 1) -> Any:
    name, D, M = case["schedule"], case["D"], case["M"]
    if name.startswith("torch:"):  # a torch schedule's own list, imported (one step)
        cls = getattr(ts, name[len("torch:"):])
        return from_torch(torch_schedule(cls, case["W"], D // case["W"], M).pipeline_order, n_stages=D,
                          n_microbatches=M, name=name)
    if name == "gpipe":
        return gpipe(D, M, steps)
    if name == "1f1b":
        return one_f_one_b(D, M, steps)
    return interleaved_1f1b(case["W"], D // case["W"], M, steps)


def _optimizer(case: dict) -> Any:
    if case.get("optimizer") == "adam":
        return lambda ps: torch.optim.Adam(ps, lr=0.01)
    return lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(STEPS)]


def _run_on_torch(rank: int, world: int, cases: list[dict]) -> list:
    return [run_torch_pipelining(_model(c), _schedule(c), _batches(), optimizer=_optimizer(c), comms=c["comms"])
            for c in cases]


CASES: dict[int, list[dict[str, Any]]] = {2: [dict(schedule="gpipe", D=2, M=4, comms=True),
             dict(schedule="1f1b", D=2, M=4, comms=False, optimizer="adam"),
             dict(schedule="interleaved", D=4, M=4, comms=True)]
        + [dict(schedule=f"torch:{name}", D=4, M=4, comms=comms, optimizer="adam") for name, comms in
           [("ScheduleZBVZeroBubble", True), ("ScheduleDualPipeV", True), ("ScheduleDualPipeV", False),
            ("ScheduleInterleavedZeroBubble", False)]],
         4: [dict(schedule="gpipe", D=4, M=4, comms=False),
             dict(schedule="1f1b", D=4, M=4, comms=True, optimizer="adam"),
             dict(schedule="interleaved", D=8, M=4, comms=True)]}
for _w, _cs in CASES.items():
    for _c in _cs:
        _c["W"] = _w


@pytest.fixture(scope="module")
def torch_runs() -> dict[int, list]:
    return {w: spawn(_run_on_torch, w, (cases,)) for w, cases in CASES.items()}


@pytest.mark.slow
@pytest.mark.parametrize("world,i", [(w, i) for w, cs in CASES.items() for i in range(len(cs))],
                         ids=[f"{w}ranks-{c['schedule']}-{'comms' if c['comms'] else 'compute_only'}"
                              for w, cs in CASES.items() for c in cs])
def test_torch_runtime_on_exported_schedules_equals_the_emulator(torch_runs: dict, world: int, i: int) -> None:
    """pipelab's flushed schedules exported to torch's runtime reach the emulator's weights; torch's own
    zero-bubble lists (split backward, V-shape, DualPipeV's fused/split mix), imported and exported back, reach
    those of plain mini-batch training (the emulator's split-backward support is another piece of issue 12)."""
    case = CASES[world][i]
    D = int(case["D"])
    if case["schedule"].startswith("torch:"):
        model = _model(case)
        losses = train_plain(model, optimizer=_optimizer(case), batches=_batches(), D=D)
        expected = [tuple(p.detach() for p in stage.parameters()) for stage in split(model, D)]
    else:
        emu = Emulator(_model(case), schedule=_schedule(case, STEPS), policy="gpipe" if case["schedule"] == "gpipe"
                       else "1f1b", optimizer=_optimizer(case))
        losses = emu.run(_batches()).losses
        expected = emu.weights()
    per_rank = [ranks[i] for ranks in torch_runs[world]]
    seen = set()
    for r in per_rank:
        for k, W in r.weights.items():
            seen.add(k)
            assert max((a - b).abs().max().item() for a, b in zip(W, expected[k])) <= TOL, (case, k)
    assert seen == set(range(D))
    last = next(r for r in per_rank if D - 1 in r.stages)
    assert last.losses == pytest.approx(losses, abs=TOL)
    # torch ran exactly the exported compute order
    sched = _schedule(case)
    for r in per_rank:
        # compute actions as torch ran them, an OVERLAP_F_B (exported for a tensor sent late) as its sub-actions
        ran = [str(x) for a in r.actions for y in [parse_action(a)] if y is not None
               for x in (y.subs or (y,)) if x.kind in ("F", "B", "I", "W")]
        assert ran == [f"{a.stage}{a.op}{a.micro}" for a in sched.programs[r.rank] if a.op != "U"]
