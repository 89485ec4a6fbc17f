"""Spawned ranks: results come back; a rank that raises or dies makes the run fail fast and clearly."""

from __future__ import annotations

import os
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
