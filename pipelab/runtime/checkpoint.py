"""Checkpoint and resume a runtime run mid-flight, so the resumed run continues identically.

An asynchronous pipeline is never empty, so a checkpoint is taken at a *consistent cut* (Chandy & Lamport,
"Distributed Snapshots", ACM TOCS 1985; :func:`pipelab.schedules.transfers.consistent_cut`); the messages in
flight across it stay in the sender's outbox and go first on resume. Each rank writes ``<dir>/rank<r>.pt``::

    PIPELAB-RUNTIME-CHECKPOINT 1
    <header: one line of JSON>
    <payload: the state, serialised by torch.save>

The header records the rank, world size, cut (``step``), program position, the runtime's
:meth:`~pipelab.runtime.PipelineRuntime.fingerprint`, the payload's length and a SHA-256 digest over the rest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..distributed import describe_differences, differences
from ..files import atomic_write

if TYPE_CHECKING:  # the runtime is used through its public state_dict()/load_state_dict() only
    from .runtime import PipelineRuntime

__all__ = ["save_checkpoint", "load_checkpoint", "read_header", "CheckpointError"]

MAGIC = b"PIPELAB-RUNTIME-CHECKPOINT 1\n"
_MAX_HEADER = 1 << 24  # bytes: a header line longer than this is corrupt


class CheckpointError(ValueError):
    """A checkpoint directory or rank file that cannot be resumed from (corrupt, mixed, incomplete, other run)."""


def _digest(meta: dict[str, Any], payload: bytes) -> str:
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    h.update(payload)
    return h.hexdigest()


def save_checkpoint(runtime: PipelineRuntime, directory: str | os.PathLike[str]) -> Path:
    """Write this rank's state (after ``runtime.run(..., stop_at_step=c)``) atomically; return the file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = runtime.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    meta = {"rank": state["rank"], "world_size": runtime.world, "step": state["cut_step"],
            "position": state["position"], "fingerprint": runtime.fingerprint(), "payload_bytes": len(payload)}
    header = dict(meta, sha256=_digest(meta, payload))
    return atomic_write(directory / f"rank{runtime.rank}.pt",
                        MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload)


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of a rank file (rank, world size, cut step, position, fingerprint, digest), unverified.

    Raises:
        CheckpointError: not a pipelab runtime checkpoint, or its header is unreadable.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        if fh.read(len(MAGIC)) != MAGIC:
            raise CheckpointError(f"{path} is not a pipelab runtime checkpoint (or one written by an older "
                                  "version): it lacks the header line; take a new checkpoint")
        line = fh.readline(_MAX_HEADER)
    try:
        header = json.loads(line)
        for key in ("rank", "world_size", "step", "position", "fingerprint", "payload_bytes", "sha256"):
            header[key]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: corrupt checkpoint header ({exc})") from None
    return header


def _rank_files(directory: Path, world: int) -> dict[int, Path]:
    """The directory's ``rank<r>.pt`` files, exactly one per rank of the world."""
    files = {int(m.group(1)): f for f in directory.glob("rank*.pt") if (m := re.fullmatch(r"rank(\d+)\.pt", f.name))}
    missing = [r for r in range(world) if r not in files]
    if missing:
        raise FileNotFoundError(f"checkpoint {directory} lacks the rank files of ranks {missing} (world size "
                                f"{world}; found ranks {sorted(files)}): every rank must save at the same cut")
    extra = sorted(r for r in files if r >= world)
    if extra:
        raise CheckpointError(f"checkpoint {directory} has rank files {[files[r].name for r in extra]} beyond "
                              f"the world size {world}: it was written by (or mixes files of) a run with more ranks")
    return files


def _check_directory(runtime: PipelineRuntime, directory: Path) -> dict[int, dict[str, Any]]:
    """Headers of every rank file, after checking that they form one checkpoint this runtime can resume."""
    world = runtime.world
    files = _rank_files(directory, world)
    headers = {r: read_header(files[r]) for r in range(world)}
    for field_ in ("world_size", "step"):
        values = {r: h[field_] for r, h in headers.items()}
        if len(set(values.values())) > 1 or values[0] != (world if field_ == "world_size" else values[0]):
            listing = ", ".join(f"rank{r}.pt: {v}" for r, v in values.items())
            what = "cut step" if field_ == "step" else "world size"
            raise CheckpointError(f"checkpoint {directory}: the rank files disagree on the {what} ({listing}"
                                  + (f"; now {world}" if field_ == "world_size" else "")
                                  + "): they come from different checkpoints; resume from one directory "
                                  "written by a single stopped run")
    for r, h in headers.items():
        if h["rank"] != r:
            raise CheckpointError(f"{files[r]} holds rank {h['rank']}'s state, not rank {r}'s")
        diffs = differences(h["fingerprint"].get("schedule"), headers[0]["fingerprint"].get("schedule"))
        if diffs:
            raise CheckpointError(f"checkpoint {directory}: rank{r}.pt and rank0.pt come from different "
                                  f"schedules:\n" + describe_differences(diffs, f"rank{r}.pt", "rank0.pt"))
    return headers


def load_checkpoint(runtime: PipelineRuntime, directory: str | os.PathLike[str]) -> None:
    """Restore this rank's state into a runtime built with the same model, schedule, policy and optimizer.

    Every check runs before any communication, from the headers alone, so every rank refuses an inconsistent
    checkpoint at once rather than deadlocking later.

    Raises:
        FileNotFoundError: this rank's or another rank's file is missing.
        CheckpointError (a ``ValueError``): files from different cuts, world sizes or schedules; a corrupt
            file (digest mismatch, truncated, unreadable), named; a configuration that differs from the
            checkpoint's (each differing field with both values: checkpoint vs now).
    """
    directory = Path(directory)
    path = directory / f"rank{runtime.rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint for rank {runtime.rank} at {path}")
    header = _check_directory(runtime, directory)[runtime.rank]
    diffs = differences(header["fingerprint"], runtime.fingerprint())
    if diffs:
        raise CheckpointError(f"{path} was written by a run with a different configuration; a resumed run must "
                              "keep it:\n" + describe_differences(diffs, "checkpoint", "now"))
    with open(path, "rb") as fh:
        fh.read(len(MAGIC))
        fh.readline(_MAX_HEADER)
        payload = fh.read()
    meta = {k: v for k, v in header.items() if k != "sha256"}
    if len(payload) != header["payload_bytes"] or _digest(meta, payload) != header["sha256"]:
        raise CheckpointError(f"{path} is corrupt: its SHA-256 digest does not match its content "
                              f"({len(payload)} of {header['payload_bytes']} payload bytes); restore the file or "
                              "take a new checkpoint")
    try:
        state = torch.load(io.BytesIO(payload), weights_only=False)
    except Exception as exc:  # a digest match makes this unlikely; still name the file
        raise CheckpointError(f"{path}: cannot read the checkpoint's payload ({exc})") from exc
    if state.get("cut_step") != header["step"] or state.get("position") != header["position"]:
        raise CheckpointError(f"{path}: the payload's cut (step {state.get('cut_step')}, position "
                              f"{state.get('position')}) differs from its header's ({header['step']}, "
                              f"{header['position']}); take a new checkpoint")
    runtime.load_state_dict(state)
