"""Process groups for the multi-process runtime: launch under ``torchrun`` or spawn ranks locally.

Two ways to get ranks:

- ``torchrun --nproc-per-node N [--nnodes ... --rdzv-endpoint ...] -m pipelab.run ...``: each process calls
  :func:`init_from_env`, which reads ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (set by
  torchrun, so the same code runs on one machine or across machines);
- :func:`spawn` (tests, notebooks, benchmarks): starts ``world_size`` local processes on a free port,
  runs ``fn(rank, world_size, *args)`` in each and returns the per-rank results.

Failures are bounded in time, never a hang: every process group is created with a timeout; a rank that
raises tears its process group down (so peers blocked in a receive fail at once instead of waiting for
the timeout) and reports its traceback; :func:`spawn` then terminates the remaining ranks and raises
:class:`RankFailure` naming the rank that failed first. A rank that dies without reporting (killed,
``os._exit``) is detected by its exit code.

Backends: ``gloo`` on CPU, ``nccl`` on CUDA (:func:`default_backend`).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import os
import pickle
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankFailure", "default_backend", "free_port", "init_from_env", "spawn", "check_consistent"]


class RankFailure(RuntimeError):
    """A rank raised or died; ``rank`` is the first to fail and ``details`` its traceback or exit code."""

    def __init__(self, rank: int, details: str, others: dict[int, str] | None = None) -> None:
        self.rank, self.details, self.others = rank, details, others or {}
        extra = "".join(f"\n  rank {r}: {d.strip().splitlines()[-1] if d.strip() else d}"
                        for r, d in sorted(self.others.items()))
        super().__init__(f"rank {rank} failed:\n{details}" + (f"\nthen, as a consequence:{extra}" if extra else ""))


def default_backend(device: torch.device | str | None = None) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def free_port() -> int:
    """A TCP port on localhost that is free right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_from_env(backend: str | None = None, *, timeout_s: float = 120.0) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment; return ``(rank, world_size)``.

    On CUDA, each process uses the GPU ``LOCAL_RANK``.
    """
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"environment variables {missing} are not set: launch with "
                           "`torchrun --nproc-per-node N -m pipelab.run ...` or use pipelab.distributed.spawn")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return rank, world


def check_consistent(obj: Any, what: str = "config") -> None:
    """Raise ``ValueError`` on every rank unless all ranks pass an equal ``obj`` (compared by pickle hash)."""
    digest = hashlib.sha256(pickle.dumps(obj)).hexdigest()
    digests: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    if len(set(digests)) > 1:
        groups: dict[str, list[int]] = {}
        for r, d in enumerate(digests):
            groups.setdefault(str(d), []).append(r)
        raise ValueError(f"ranks disagree on the {what}: " + "; ".join(f"ranks {v} have {k[:12]}"
                                                                     for k, v in groups.items()))


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _worker(fn: Callable[..., Any], rank: int, world: int, port: int, backend: str, timeout_s: float,
            args: tuple, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)  # ranks share the machine's cores
    try:
        init_from_env(backend, timeout_s=timeout_s)
        out = fn(rank, world, *args)
        results.put(("ok", rank, _to_bytes(out)))
    except BaseException:  # report everything, including KeyboardInterrupt, then unblock peers
        results.put(("error", rank, traceback.format_exc()))
        results.close()
        results.join_thread()  # flush the report before os._exit, which would kill the queue's feeder thread
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        os._exit(1)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: str = "gloo",
          timeout_s: float = 300.0, comm_timeout_s: float = 60.0, grace_s: float = 5.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; return results by rank.

    Args:
        fn: a picklable (module-level) function; its return value is sent back with ``torch.save``.
        backend: ``gloo`` (CPU) or ``nccl`` (one GPU per rank).
        timeout_s: bound on the whole run; past it every rank is terminated and ``TimeoutError`` raised.
        comm_timeout_s: the process group's timeout for a single collective/point-to-point operation.
        grace_s: after the first failure, how long the other ranks get to report before being terminated.

    Raises:
        RankFailure: a rank raised or died; the message has its traceback (and what followed on the others).
        TimeoutError: the run exceeded ``timeout_s``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, backend, comm_timeout_s, args, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    done: dict[int, bytes] = {}
    errors: dict[int, str] = {}  # in the order they were reported
    deadline = time.monotonic() + timeout_s
    error_deadline = float("inf")

    def unreported_deaths() -> dict[int, str]:
        return {r: f"process exited with code {p.exitcode} without reporting"
                for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in done and r not in errors}

    def drain() -> None:
        while True:
            try:
                status, rank, payload = results.get(timeout=0.05)
            except queue_mod.Empty:
                return
            (done if status == "ok" else errors)[rank] = payload

    try:
        while len(done) + len(errors) < world_size and time.monotonic() < error_deadline:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks still running after {timeout_s:.0f} s: "
                                   f"{sorted(set(range(world_size)) - set(done) - set(errors))}")
            drain()
            if (errors or unreported_deaths()) and error_deadline == float("inf"):
                error_deadline = time.monotonic() + grace_s
        drain()
    finally:
        dead = unreported_deaths()  # before terminating the stragglers, which would then look dead too
        for p in procs:
            p.join(timeout=0.5 if errors else 10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    drain()
    dead = {r: d for r, d in dead.items() if r not in errors and r not in done}
    if dead or errors:
        # A rank that died silently is the cause of its peers' communication errors; else the first report.
        first = min(dead) if dead else next(iter(errors))
        failures = {**errors, **dead}
        raise RankFailure(first, failures[first], {r: d for r, d in failures.items() if r != first})
    return [torch.load(io.BytesIO(done[r]), weights_only=False) for r in range(world_size)]
