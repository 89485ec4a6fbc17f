"""How a tensor made by one job reaches the job that consumes it: the only thing the two drivers do differently.

Two hand-overs exist between neighbouring stages of one micro-batch ``(t, j)``:

- ``F(k, t, j) → F(k+1, t, j)``: stage k's output is stage k+1's input (an activation);
- ``B(k, t, j) → B(k−1, t, j)``: ∂ℓ/∂(stage k's input) is ∂ℓ/∂(stage k−1's output) (a gradient).

A :class:`Transport` carries them: :meth:`~Transport.send` is called by the producing job, right after it
ran; :meth:`~Transport.receive` by the consuming job, right before it runs. :class:`InMemoryTransport` is the
single-process emulator's (a dictionary); the runtime's ``torch.distributed`` point-to-point transport
(:class:`pipelab.runtime.p2p.P2PTransport`) implements the same interface across processes.

Example:
    >>> import torch
    >>> tr = InMemoryTransport()
    >>> tr.send(("F", 0, 0, 0), ("F", 1, 0, 0), torch.ones(2))
    >>> tr.receive(("F", 0, 0, 0), ("F", 1, 0, 0))
    tensor([1., 1.])
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from ..schedules.dependencies import Job

__all__ = ["Transport", "InMemoryTransport"]


class Transport(Protocol):
    """Carries a tensor from job ``src`` to job ``dst`` (both ``(op, stage, step, micro)``)."""

    def send(self, src: Job, dst: Job, tensor: Tensor) -> None:
        """Hand ``tensor``, just produced by ``src``, on to ``dst``."""

    def receive(self, src: Job, dst: Job) -> Tensor:
        """The tensor ``src`` produced for ``dst`` (called by ``dst``, before it runs)."""

    def flush(self) -> None:
        """Complete every outstanding send (at the end of a run)."""

    def held(self) -> int:
        """Sends not yet completed (for the runtime's memory trace)."""


class InMemoryTransport:
    """The single-process transport: a tensor waits in a dictionary, keyed by its consumer, until received.

    A received tensor is forgotten, so the dictionary holds exactly the hand-overs in flight.
    """

    def __init__(self) -> None:
        self.waiting: dict[Job, Tensor] = {}

    def send(self, src: Job, dst: Job, tensor: Tensor) -> None:
        self.waiting[dst] = tensor

    def receive(self, src: Job, dst: Job) -> Tensor:
        try:
            return self.waiting.pop(dst)
        except KeyError:
            raise RuntimeError(f"job {dst} needs the output of {src}, which has not run") from None

    def flush(self) -> None:
        return None

    def held(self) -> int:
        return 0
