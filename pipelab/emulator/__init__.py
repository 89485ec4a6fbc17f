"""Exact single-process emulation of pipeline schedules under weight-staleness policies (see :mod:`pipelab`).

- :class:`Emulator` (:mod:`.emulator`): replay a simulated schedule's F/B/U events with explicit weight
  versions, per-stage autograd and the user's ``torch.optim`` optimizers, on the pipeline core
  (:mod:`pipelab.pipeline`) with an in-memory transport;
- :func:`train_plain`, :func:`evaluate` (:mod:`.reference`): plain PyTorch mini-batch training, the reference.

Example:
    >>> from pipelab.emulator import Emulator, train_plain   # doctest: +SKIP
"""

from __future__ import annotations

from ..pipeline import DeadlockError, build_pipeline  # re-exported: part of pipelab's public API
from .emulator import Emulator, EmulatorResult
from .reference import evaluate, train_plain

__all__ = [
    "Emulator", "EmulatorResult", "build_pipeline", "DeadlockError",
    "train_plain", "evaluate",
]
