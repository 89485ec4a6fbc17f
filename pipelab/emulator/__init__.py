"""Exact single-process emulation of pipeline schedules under weight-staleness policies (DESIGN §5).

- :class:`Emulator` (:mod:`.emulator`): replay a simulated schedule's F/B/U events with explicit weight
  versions, per-stage autograd and the user's ``torch.optim`` optimizers, on the pipeline core
  (:mod:`pipelab.pipeline`) with an in-memory transport;
- :class:`VersionTable` (:mod:`.versions`), :func:`table_from`, :func:`simulate_schedule` (:mod:`.adapters`);
- :func:`train_plain`, :func:`evaluate` (:mod:`.reference`): plain PyTorch mini-batch training, the reference.

Example:
    >>> from pipelab.emulator import Emulator, train_plain   # doctest: +SKIP
"""

from __future__ import annotations

from ..pipeline import DeadlockError, build_pipeline  # re-exported: part of pipelab's public API
from .adapters import simulate_schedule, table_from
from .emulator import Emulator, EmulatorResult
from .reference import evaluate, train_plain
from .versions import VersionTable

__all__ = [
    "Emulator", "EmulatorResult", "build_pipeline", "DeadlockError",
    "table_from", "simulate_schedule", "VersionTable",
    "train_plain", "evaluate",
]
