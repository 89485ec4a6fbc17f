"""Spawned ranks: results come back; a rank that raises or dies makes the run fail fast and clearly."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from pipelab.distributed import RankFailure, check_consistent, differences, spawn


def _ring(rank: int, world: int, n: int) -> torch.Tensor:
    """Each rank sends a tensor to the next and receives from the previous (p2p over gloo)."""
    out = torch.full((n,), float(rank), dtype=torch.float64)
    got = torch.empty(n, dtype=torch.float64)
    req = dist.isend(out, (rank + 1) % world)
    dist.recv(got, (rank - 1) % world)
    req.wait()
    return got


@pytest.mark.slow
def test_spawn_returns_results_by_rank() -> None:
    results = spawn(_ring, 3, (4,))
    for rank, got in enumerate(results):
        assert torch.equal(got, torch.full((4,), float((rank - 1) % 3), dtype=torch.float64))


def _raise_on_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.recv(torch.empty(1), 1)  # would wait forever for rank 1


def _die_on_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        os._exit(7)
    dist.recv(torch.empty(1), 1)


@pytest.mark.parametrize("fn,needle", [(_raise_on_rank_1, "ValueError: boom on purpose"),
                                       (_die_on_rank_1, "exited with code 7")])
@pytest.mark.slow
def test_a_failing_rank_fails_the_run_quickly(fn, needle: str) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure) as err:
        spawn(fn, 2, comm_timeout_s=30, grace_s=2)
    assert err.value.rank == 1 and needle in str(err.value)
    # Bounded: far below the 30 s communication timeout, i.e. the peer was unblocked, not timed out.
    assert time.monotonic() - start < 25


def _big_result_then_die_at_exit(rank: int, world: int) -> bytes:
    """A result far larger than a pipe holds, from a process that dies (code 3) as it exits, before
    multiprocessing's exit handlers would have flushed a queue (a crash at interpreter shutdown)."""
    from multiprocessing import util

    util.Finalize(None, os._exit, args=(3,), exitpriority=100)
    return bytes(8 << 20)


@pytest.mark.slow
def test_a_rank_dying_after_its_report_neither_hangs_the_run_nor_loses_the_result() -> None:
    """Probe: results sent through the queue itself left half a message in the pipe when the rank died while its
    feeder thread wrote it; the parent's read of it blocked forever, past every timeout."""
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.update(out=spawn(_big_result_then_die_at_exit, 2, timeout_s=60,
                                                             grace_s=2)), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "spawn hung reading a rank's half-written report"
    assert [len(x) for x in box["out"]] == [8 << 20] * 2  # type: ignore[attr-defined]


def _config_check(rank: int, world: int) -> None:
    check_consistent({"D": 2, "lr": 0.1 if rank == 0 else 0.2})


@pytest.mark.slow
def test_mismatched_configs_are_detected() -> None:
    with pytest.raises(RankFailure, match="ranks disagree on the config") as err:
        spawn(_config_check, 2)
    assert "lr: 0.2 (ranks [1]) vs 0.1 (ranks [0])" in str(err.value)  # the field and both values


def test_differences_name_fields() -> None:
    a = {"optimizer": {"lr": 0.1, "betas": [0.9, 0.999]}, "predictor": "pipeoptim", "loss": float("nan")}
    b = {"optimizer": {"lr": 0.1, "betas": (0.9, 0.99)}, "predictor": "linear", "loss": float("nan"), "seed": 1}
    assert differences(a, b) == [("optimizer.betas.1", 0.999, 0.99), ("predictor", "pipeoptim", "linear"),
                                 ("seed", "<absent>", 1)]
    assert differences(a, dict(a)) == []
