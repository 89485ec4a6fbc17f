"""The pipeline core both drivers share: spec, plan, stage executors, version rings, order, driver loop.

- :class:`PipelineSpec` (:mod:`.spec`): schedule, policy, optimizer, D, loss, predictor, scheduler,
  balance, recompute — the one declaration of a run's arguments;
- :func:`build_pipeline`, :class:`PipelinePlan`, :class:`JobSpecs` (:mod:`.plan`): per-job weight specs from
  the policy and the version table, the execution order, each stage's events and ring size, the executors;
- :class:`StageExecutor` (:mod:`.stage`): one stage's forward, backward and update;
- :class:`VersionRing`, :class:`StageEvents` (:mod:`.rings`): a stage's stored weight versions, its events;
- :func:`resolve_order`, :class:`DeadlockError` (:mod:`.order`): jobs waiting for the versions they need;
- :func:`run_jobs`, :class:`MiniBatches`, :func:`split_micro` (:mod:`.driver`): the one driver loop;
- :class:`Transport`, :class:`InMemoryTransport` (:mod:`.transport`): how tensors travel between jobs.

The drivers: :class:`pipelab.emulator.Emulator` (one process, in-memory transport) and
:class:`pipelab.runtime.PipelineRuntime` (one process per worker, ``torch.distributed`` transport).
"""

from __future__ import annotations

from .driver import DriverState, MiniBatches, run_jobs, split_micro
from .order import DeadlockError, resolve_order
from .plan import JobSpecs, PipelinePlan, as_stages, build_pipeline, stage_events, version_table
from .rings import StageEvents, VersionRing
from .spec import SPEC_FIELDS, OptimizerFactory, PipelineSpec, make_spec
from .stage import StageExecutor
from .transport import InMemoryTransport, Transport

__all__ = [
    "PipelineSpec", "make_spec", "SPEC_FIELDS", "OptimizerFactory",
    "PipelinePlan", "JobSpecs", "build_pipeline", "as_stages", "stage_events", "version_table",
    "StageExecutor", "VersionRing", "StageEvents", "resolve_order", "DeadlockError",
    "run_jobs", "MiniBatches", "DriverState", "split_micro", "Transport", "InMemoryTransport",
]
