"""Exact single-process emulation of pipeline schedules under weight-staleness policies (see :mod:`pipelab`).

:class:`Emulator` (:mod:`.emulator`); :func:`train_plain`, :func:`evaluate` (:mod:`.reference`): the plain PyTorch
reference.
"""

from __future__ import annotations

from ..pipeline import DeadlockError, build_pipeline  # re-exported: part of pipelab's public API
from .emulator import Emulator, EmulatorResult
from .reference import evaluate, train_plain

__all__ = [
    "Emulator", "EmulatorResult", "build_pipeline", "DeadlockError",
    "train_plain", "evaluate",
]
