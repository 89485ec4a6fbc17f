"""Exact single-process emulation of pipeline schedules under weight-staleness policies (see :mod:`pipelab`).

- :class:`Emulator` (:mod:`.engine`): replay a simulated schedule's F/B/U events with explicit weight
  versions, per-stage autograd and the user's ``torch.optim`` optimizers;
- :class:`VersionRing`, :func:`resolve_order` (:mod:`.versions`);
- :func:`train_plain` (:mod:`.reference`): plain PyTorch mini-batch training, the reference.

Example:
    >>> from pipelab.emulator import Emulator, train_plain   # doctest: +SKIP
"""

from __future__ import annotations

from .engine import Emulator, EmulatorResult, split_micro
from .plan import PipelinePlan, as_stages, build_pipeline, version_table
from .reference import evaluate, train_plain
from .versions import DeadlockError, VersionRing, resolve_order, ring_capacities

__all__ = [
    "Emulator", "EmulatorResult", "PipelinePlan", "build_pipeline", "as_stages", "split_micro", "version_table",
    "VersionRing", "resolve_order", "ring_capacities", "DeadlockError",
    "train_plain", "evaluate",
]
