"""NCCL-safe point-to-point order (pipelab.runtime.nccl_order): the checker (nccl_model.py), the rule on every
builder, and the transport that follows it (gloo, CPU): same weights as the emulator, and exactly the operations
the checker plays."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from pipelab.distributed import spawn
from pipelab.runtime import PipelineRuntime, load_checkpoint, save_checkpoint
from pipelab.runtime.nccl_order import Issue, MessageOrder, Op, RankOrder, Wait
from pipelab.runtime.p2p import P2PTransport
from pipelab.schedules import messages, one_f_one_b, pipedream
from pipelab.schedules.builders import BUILDERS

sys.path.insert(0, str(Path(__file__).parent))
from nccl_model import NCCLOrderError, check_order, issue_sequences  # noqa: E402
from test_runtime import batches, build, emulate  # noqa: E402

#: builder -> argument tuples (D or W first), chosen to satisfy each builder's own constraints
GRID: dict[str, list[tuple]] = {
    "naive": [(2, 2, 2), (4, 3, 2)],
    "gpipe": [(2, 4, 2), (4, 4, 2), (4, 8, 1)],
    "1f1b": [(2, 2, 2), (4, 4, 2), (4, 8, 2), (3, 5, 2)],
    "pipedream": [(2, 1, 6), (4, 1, 8), (4, 2, 4)],
    "2bw": [(2, 2, 4), (4, 4, 3), (4, 8, 2)],
    "interleaved": [(2, 2, 4, 2), (4, 2, 8, 1), (2, 3, 4, 2)],
    "folded": [(4, 4, 2), (8, 8, 1)],
    "ddp": [(2, 2)], "fsdp": [(2, 2)], "lpp": [(4, 4, 2, 2)], "fslpp": [(4, 4, 2, 2)],
    "zb_h1": [(2, 2, 2), (4, 4, 2), (4, 8, 1)],
    "zb_h2": [(2, 3, 2), (4, 8, 1)],
    "zb_async": [(2, 1, 6), (4, 1, 8)],
    "zb_v": [(2, 4, 2), (4, 8, 1)],
    "v_half": [(2, 4, 2), (4, 8, 1)],
    "v_min": [(2, 4, 2), (4, 8, 1)],
    "interleaved_zb": [(2, 2, 4, 2), (4, 2, 8, 1)],
    "dualpipe_v": [(2, 4, 2), (4, 8, 1)],
    "dualpipe": [(2, 4, 1), (4, 8, 1)],
    "hybrid": [(2, 4, 2)],
}
#: placed builders (several workers compute or hold a stage): the runtime runs them with collectives between
#: the point-to-point transfers, which this checker does not model (point-to-point only)
NOT_RUNTIME = {"ddp", "fsdp", "lpp", "fslpp", "dualpipe", "hybrid"}


def runtime_supports(sched: Any) -> bool:
    """One worker computes and holds each stage: the schedules whose whole traffic is point-to-point."""
    return all(len(sched.stage_workers(k)) == 1 and tuple(sched.weight_holders[k]) == sched.stage_workers(k)
               for k in range(sched.D))


def test_grid_covers_every_builder_and_the_supported_set_is_known() -> None:
    assert set(GRID) == set(BUILDERS)
    unsupported = {name for name, grid in GRID.items() if not runtime_supports(BUILDERS[name](*grid[0]))}
    assert unsupported == NOT_RUNTIME


SUPPORTED = [(name, args) for name, grid in GRID.items() if name not in NOT_RUNTIME for args in grid]


@pytest.mark.parametrize("name,args", SUPPORTED, ids=[f"{n}{a}" for n, a in SUPPORTED])
def test_rendezvous_order_is_deadlock_free_under_nccl(name: str, args: tuple) -> None:
    sched = BUILDERS[name](*args)
    assert runtime_supports(sched)
    total = 2 * len(messages(sched))
    for prefetch in (False, True):
        for batch in (False, True):
            seqs = issue_sequences(sched, "rendezvous", prefetch=prefetch, batch=batch)
            for streams in ("rank", "pair"):
                report = check_order(seqs, streams=streams)
                assert report.ok, (name, args, prefetch, batch, streams, report.describe())
                assert report.completed == report.total == total


@pytest.mark.parametrize("name,args", SUPPORTED, ids=[f"{n}{a}" for n, a in SUPPORTED])
def test_message_order_respects_every_program(name: str, args: tuple) -> None:
    """Brute force over pairs: a rank that receives b no later than it sends a ranks b before a."""
    sched = BUILDERS[name](*args)
    mo = MessageOrder(sched)
    msgs = mo.messages
    assert sorted(msgs) == sorted(messages(sched))
    g = {m: i for i, m in enumerate(msgs)}
    for a in msgs:
        for b in msgs:
            if b.dst == a.src and b.recv_pos <= a.send_pos:
                assert g[b] < g[a], (a, b)
    # per pair of ranks, both ends list their messages in the same order (NCCL matches without tags)
    for r in range(sched.W):
        for peer in range(sched.W):
            sent = [op.key for op in mo.for_rank(r) if op.kind == "send" and op.peer == peer]
            got = [op.key for op in mo.for_rank(peer) if op.kind == "recv" and op.peer == r]
            assert sent == got


def test_eager_order_deadlocks_1f1b_with_the_cycle_named() -> None:
    """Send-when-produced (gloo's buffered transport) deadlocks under rendezvous semantics: the classic 1F1B case."""
    report = check_order(issue_sequences(one_f_one_b(2, 2), "eager"))
    assert not report.ok and report.completed == 2 and report.total == 8
    assert len(report.cycle) == 2
    assert "rank 0's stream: send to rank 1 (activation into stage 1, t=0, j=1)" in report.cycle[0]
    assert "rank 1's stream: send to rank 0 (gradient into stage 0, t=0, j=0)" in report.cycle[1]
    with pytest.raises(NCCLOrderError, match="blocking cycle"):
        report.raise_if_failed()
    # and for every asynchronous or interleaved builder the runtime supports
    for name in ("pipedream", "2bw", "zb_h1", "zb_v", "interleaved"):
        assert not check_order(issue_sequences(BUILDERS[name](*GRID[name][0]), "eager")).ok, name


def _exchange(batch: bool) -> list[list]:
    """Two ranks each send to the other, then receive: a textbook rendezvous deadlock unless fused."""
    a0, a1 = Op("send", 0, 1, 2, 0, 0), Op("recv", 0, 1, 1, 0, 0)
    b0, b1 = Op("send", 1, 0, 1, 0, 0), Op("recv", 1, 0, 2, 0, 0)
    if batch:
        return [[Issue((a0, a1)), Wait(a1), Wait(a0)], [Issue((b0, b1)), Wait(b1), Wait(b0)]]
    return [[Issue((a0,)), Issue((a1,)), Wait(a1), Wait(a0)], [Issue((b0,)), Issue((b1,)), Wait(b1), Wait(b0)]]


def test_constructed_exchange_deadlocks_unless_grouped() -> None:
    bad = check_order(_exchange(batch=False))
    assert not bad.ok and bad.completed == 0
    assert [line.split(":")[0] for line in bad.cycle] == ["rank 0's stream", "rank 1's stream"]
    assert check_order(_exchange(batch=True)).ok  # batch_isend_irecv: the group progresses concurrently


def test_one_stream_per_rank_is_stricter_than_one_per_pair() -> None:
    """Three ranks: rank 0's send to 1 holds back its receive from 2 on a shared stream, not on a per-pair one."""
    a, b, c = Op("send", 0, 1, 2, 0, 0), Op("send", 2, 0, 1, 0, 0), Op("send", 2, 1, 3, 0, 0)
    ra, rb, rc = Op("recv", 1, 0, 2, 0, 0), Op("recv", 0, 2, 1, 0, 0), Op("recv", 1, 2, 3, 0, 0)
    seqs = [[Issue((a,)), Issue((rb,)), Wait(rb), Wait(a)],
            [Issue((rc,)), Wait(rc), Issue((ra,)), Wait(ra)],
            [Issue((b,)), Issue((c,)), Wait(b), Wait(c)]]
    strict = check_order(seqs, streams="rank")
    assert not strict.ok
    assert {line.split(":")[0] for line in strict.cycle} == {"rank 0's stream", "rank 1's stream", "rank 2's stream"}
    assert check_order(seqs, streams="pair").ok


def test_tagless_matching_reports_crossed_channels() -> None:
    """Two messages from rank 0 to rank 1 on different channels, received in the other order: gloo's tags pair
    them right, NCCL pairs the first send with the first receive."""
    s1, s2 = Op("send", 0, 1, 2, 0, 0), Op("send", 0, 1, 5, 0, 0)
    r1, r2 = Op("recv", 1, 0, 2, 0, 0), Op("recv", 1, 0, 5, 0, 0)
    report = check_order([[Issue((s1,)), Issue((s2,)), Wait(s1), Wait(s2)],
                          [Issue((r2,)), Issue((r1,)), Wait(r2), Wait(r1)]])
    assert not report.ok and not report.cycle and len(report.mismatches) == 2
    assert "received by rank 1's recv from rank 0 (gradient into stage 2" in report.mismatches[0]


def test_unmatched_and_bad_input() -> None:
    s = Op("send", 0, 1, 2, 0, 0)
    report = check_order([[Issue((s,)), Wait(s)], []])
    assert not report.ok and report.unmatched and "no counterpart" in report.cycle[0]
    with pytest.raises(ValueError, match="waits on .* before issuing it"):
        check_order([[Wait(s)], []])
    with pytest.raises(ValueError, match="streams must be one of rank, pair"):
        check_order([], streams="device")
    with pytest.raises(ValueError, match="order must be one of eager, rendezvous"):
        issue_sequences(one_f_one_b(2, 2), "nccl")


def test_rank_order_refuses_a_receive_behind_an_unproduced_send() -> None:
    send, recv = Op("send", 0, 1, 2, 0, 0), Op("recv", 0, 1, 1, 0, 0)
    cursor = RankOrder([send, recv])
    with pytest.raises(RuntimeError, match="not produced yet"):
        cursor.needed(recv.key)
    cursor = RankOrder([send, recv], prefetch=True)
    assert cursor.produced(send.key) == [[send, recv]]  # prefetch posts the receive at once
    assert cursor.needed(recv.key) == []


def test_transport_refuses_what_nccl_cannot_do() -> None:
    sched = one_f_one_b(2, 2)
    with pytest.raises(ValueError, match="order='eager' relies on gloo"):
        P2PTransport(sched, 0, torch.device("cuda", 0), order="eager", backend="nccl")
    with pytest.raises(ValueError, match="NCCL backend moves CUDA tensors only.*device is cpu"):
        P2PTransport(sched, 0, torch.device("cpu"), backend="nccl")
    with pytest.raises(ValueError, match="order must be None or one of eager, rendezvous"):
        P2PTransport(sched, 0, torch.device("cpu"), order="fifo")
    assert P2PTransport(sched, 0, torch.device("cpu")).order == "eager"  # gloo keeps its eager order
    assert P2PTransport(sched, 0, torch.device("cuda", 0), backend="nccl").order == "rendezvous"


# ------------------------------------------------------------------------- the transport on gloo, for real

CASES = [dict(schedule="1f1b", policy="1f1b", D=2, M=4, steps=3, W=2, optimizer="adam"),
         dict(schedule="pipedream", policy="stashing", D=2, M=1, steps=6, W=2),
         dict(schedule="interleaved", policy="1f1b", D=4, M=4, steps=2, W=2)]
OPTIONS = [dict(order="rendezvous"), dict(order="rendezvous", prefetch=True, batch=True), dict(order="eager")]


def _run_logged(rank: int, world: int, cases: list[dict], options: list[dict]) -> list:
    out = []
    for case in cases:
        for opts in options:
            model, sched, opt = build(case)
            rt = PipelineRuntime(model, schedule=sched, policy=case["policy"], optimizer=opt)
            rt.transport = P2PTransport(sched, rank, rt.device, record=True, **opts)
            res = rt.run(batches(case["steps"]))
            out.append((res.weights, res.losses, rt.transport.log))
    return out


@pytest.fixture(scope="module")
def logged() -> list:
    return spawn(_run_logged, 2, (CASES, OPTIONS))


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)), ids=[c["schedule"] for c in CASES])
def test_transport_issues_what_the_checker_plays_and_trains_like_the_emulator(logged: list, i: int) -> None:
    case = CASES[i]
    weights, emu = emulate(case)
    _, sched, _ = build(case)
    for o, opts in enumerate(OPTIONS):
        per_rank = [logged[r][i * len(OPTIONS) + o] for r in range(2)]
        for W, losses, _ in per_rank:
            for k, Wk in W.items():
                assert max((a - b).abs().max().item() for a, b in zip(Wk, weights[k])) <= 1e-12, (case, opts, k)
            assert losses == pytest.approx(emu.losses, abs=1e-12)
        logs = [log for _, _, log in per_rank]
        expected = issue_sequences(sched, opts["order"], prefetch=opts.get("prefetch", False),
                                   batch=opts.get("batch", False))
        assert logs == expected, (case, opts)
        assert check_order(logs).ok == (opts["order"] == "rendezvous"), (case, opts)


def _checkpointed(rank: int, world: int, ckpt: str, stop: int) -> list:
    case = dict(schedule="pipedream", policy="stashing", D=2, M=1, steps=8, W=2)
    out = []
    for mode in ("stop", "resume"):
        model, sched, opt = build(case)
        rt = PipelineRuntime(model, schedule=sched, policy=case["policy"], optimizer=opt)
        rt.transport = P2PTransport(sched, rank, rt.device, order="rendezvous", record=True)
        if mode == "resume":
            load_checkpoint(rt, ckpt)
        res = rt.run(batches(case["steps"]), stop_at_step=stop if mode == "stop" else None)
        if mode == "stop":
            save_checkpoint(rt, ckpt)
        out.append((res.weights, rt.transport.log))
    return out


@pytest.mark.slow
def test_rendezvous_order_resumes_a_checkpoint_identically(tmp_path: Path) -> None:
    case = dict(schedule="pipedream", policy="stashing", D=2, M=1, steps=8, W=2)
    weights, _ = emulate(case)
    out = spawn(_checkpointed, 2, (str(tmp_path / "ckpt"), 3))
    for _, (resumed, _) in out:
        for k, W in resumed.items():
            assert max((a - b).abs().max().item() for a, b in zip(W, weights[k])) <= 1e-12
    # what each run issued (up to the cut; from it, the kept messages included) cannot deadlock under NCCL
    for run in range(2):
        logs = [out[r][run][1] for r in range(2)]
        assert all(logs) and check_order(logs).ok, run
    from pipelab.schedules import consistent_cut

    assert consistent_cut(pipedream(2, 1, 8), 3)[1]  # messages did cross the cut (kept, then sent on resume)
