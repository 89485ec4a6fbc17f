"""Checkpoint and resume a runtime run mid-flight, so the resumed run continues identically.

An asynchronous pipeline has no moment when nothing is in flight: stashed weight versions, stage inputs
awaiting their backward, partially accumulated gradients and messages between ranks all exist at once.
A checkpoint is therefore taken at a *consistent cut* (Chandy & Lamport, "Distributed Snapshots",
ACM TOCS 1985): every rank r stops before position p_r of its program, chosen so that no message is
received before its receiver's cut but sent after its sender's cut. Messages sent before the sender's
cut and received after the receiver's cut are *in flight*: the sender keeps them (unsent) in its
checkpoint and sends them first on resume, which preserves each channel's order.

The cut for "step c": p_r starts at the first action of rank r that belongs to a mini-batch t ≥ c;
then, while some message is an orphan (sent at or after p_src, received before p_dst), the receiver's
cut moves back to that receive. Positions only decrease, so this terminates.

Each rank writes ``<dir>/rank<r>.pt`` with its stages' :meth:`~pipelab.emulator.stage.StageExecutor.state_dict`,
its in-memory hand-overs, partial losses, the outbox and its program position.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from .engine import PipelineRuntime, messages

__all__ = ["consistent_cut", "save_checkpoint", "load_checkpoint"]


def consistent_cut(schedule: Any, step: int) -> tuple[list[int], set[tuple[int, int, int, int, int]]]:
    """Cut positions per rank for a checkpoint at mini-batch ``step``, and the messages in flight.

    Returns:
        ``(positions, in_flight)``: rank r runs ``programs[r][:positions[r]]``; ``in_flight`` holds
        ``(src, dst, tag, t, j)`` of the messages its sender must keep for the resumed run.
    """
    if not 0 <= step <= schedule.steps:
        raise ValueError(f"step must be in 0..{schedule.steps}, got {step}")
    cut = [next((i for i, a in enumerate(prog) if a.step >= step), len(prog)) for prog in schedule.programs]
    msgs = messages(schedule)
    changed = True
    while changed:
        changed = False
        for src, spos, dst, rpos, *_ in msgs:
            if spos >= cut[src] and rpos < cut[dst]:  # orphan: received before the cut, sent after it
                cut[dst] = rpos
                changed = True
    in_flight = {(src, dst, tag, t, j) for src, spos, dst, rpos, tag, t, j in msgs
                 if spos < cut[src] and rpos >= cut[dst]}
    return cut, in_flight


def save_checkpoint(runtime: PipelineRuntime, directory: str | os.PathLike[str]) -> Path:
    """Write this rank's state (call after ``runtime.run(..., stop_at_step=c)``) and return the file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "rank": runtime.rank,
        "fingerprint": runtime.fingerprint(),
        "position": runtime.position,
        "stages": {k: ex.state_dict() for k, ex in runtime.executors.items()},
        "local": runtime._local,
        "outbox": runtime._outbox,
        "step_loss": dict(runtime._step_loss),
        "losses": runtime._losses,
        "trace": runtime._trace,
        "activations": (runtime._act_bytes, runtime._act_peak),
    }
    path = directory / f"rank{runtime.rank}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(runtime: PipelineRuntime, directory: str | os.PathLike[str]) -> None:
    """Restore this rank's state into a runtime built with the same model, schedule, policy and optimizer."""
    path = Path(directory) / f"rank{runtime.rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint for rank {runtime.rank} at {path}")
    state = torch.load(path, weights_only=False)
    if state["fingerprint"] != runtime.fingerprint():
        raise ValueError(f"{path} was written by a run with a different configuration")
    for k, ex in runtime.executors.items():
        ex.load_state_dict(state["stages"][k])
    runtime.position = state["position"]
    runtime._local = state["local"]
    runtime._outbox = state["outbox"]
    runtime._step_loss = defaultdict(list, state["step_loss"])
    runtime._losses = state["losses"]
    runtime._trace = state["trace"]
    runtime._act_bytes, runtime._act_peak = state["activations"]
