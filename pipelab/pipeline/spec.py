"""The one declaration, documentation and check of the arguments every driver takes (:class:`PipelineSpec`).

:func:`~pipelab.pipeline.plan.build_pipeline`, :class:`~pipelab.emulator.Emulator` and
:class:`~pipelab.runtime.PipelineRuntime` take a spec, or the same keywords (:func:`make_spec`).

Example:
    >>> import torch
    >>> from pipelab.schedules import gpipe
    >>> spec = PipelineSpec(schedule=gpipe(2, 2, 3), policy="gpipe",
    ...                     optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    >>> spec.D is None, spec.recompute
    (True, False)
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from ..optim import OptimizerFactory

__all__ = ["PipelineSpec", "make_spec", "OptimizerFactory", "SPEC_FIELDS"]


@dataclass(frozen=True)
class PipelineSpec:
    """A schedule × staleness policy × optimizer run of a model cut into stages.

    Args:
        schedule: a ``Schedule`` (built by a builder such as ``pipelab.schedules.gpipe(D, M, steps)``, not its
            name), a simulation result, or a :class:`~pipelab.schedules.VersionTable` with its execution order.
        policy: a :class:`~pipelab.policies.Policy` or its registered name.
        optimizer: factory ``params -> torch.optim.Optimizer``, called once per stage with its trainable
            parameters (none for a stage without any).
        D: number of stages (required to cut an ``nn.Sequential``; default: the schedule's).
        loss_fn: ``(output, target) -> mean loss`` of a micro-batch (default cross-entropy).
        predictor: for prediction policies: a predictor name (``pipelab.predictors.make_predictor``), a
            ``Predictor``, a factory ``stage -> Predictor``, or ``"oracle"`` (the true future weights: jobs
            wait for them; emulator only). Default: the policy's ``default_predictor``.
        lr_scheduler: factory ``optimizer -> LRScheduler``; each stage's scheduler steps after each update.
        balance: how :func:`~pipelab.partition.split` balances stages.
        recompute: always recompute the stage forward in the backward (activation recomputation, as in
            PipeOptim's experiments, Guan et al., arXiv:2312.00839, §V-A), even when the forward and backward
            weights agree.
        precision: a :class:`~pipelab.precision.Precision`, its name (``"fp32"``, ``"bf16"``, ``"fp16"``) or a
            dtype (default fp32: no autocast); bf16/fp16 autocast with fp32 masters, fp16 with a dynamic loss
            scale (flushed schedules only).
        codec: how hand-overs and their gradients cross boundaries (:mod:`pipelab.links`): ``None`` (identity), a
            codec or its name (``"bf16"``, ``"int8"``, ``"lowrank(8)"``) for every boundary, or one per boundary.

    Raises:
        TypeError: a schedule given by name, a policy that is neither a name nor a ``Policy``, an optimizer
            that is not a factory, a loss function, scheduler factory or predictor of the wrong type, a D
            that is not an int, a recompute that is not a bool, a precision of another type.
        ValueError: an unknown policy, predictor, precision or codec name.
    """

    schedule: Any
    policy: Any
    optimizer: OptimizerFactory
    D: int | None = None
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None
    predictor: Any = None
    lr_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    balance: Any = "layers"
    recompute: bool = False
    precision: Any = None
    codec: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.schedule, str):
            raise TypeError(f"schedule={self.schedule!r} is a name; pass a Schedule built by a builder, e.g. "
                            "schedule=pipelab.schedules.gpipe(D, M, steps) (builders by name: "
                            "pipelab.schedules.BUILDERS)")
        from ..policies import Policy, make_policy

        if not isinstance(self.policy, (str, Policy)):
            raise TypeError(f"policy must be a Policy or its name (pipelab.policies.POLICIES), "
                            f"got {type(self.policy).__name__}")
        if isinstance(self.policy, str):
            make_policy(self.policy)  # an unknown name raises ValueError naming the registered ones
        if self.D is not None and (isinstance(self.D, bool) or not isinstance(self.D, numbers.Integral)):
            raise TypeError(f"D must be an int (the number of stages) or None, got {type(self.D).__name__}")
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise TypeError(f"loss_fn must be a callable (output, target) -> loss, got {type(self.loss_fn).__name__}")
        if not callable(self.optimizer):
            raise TypeError("optimizer must be a factory: params -> torch.optim.Optimizer, "
                            f"e.g. lambda ps: torch.optim.SGD(ps, lr=0.1); got {type(self.optimizer).__name__}")
        if self.lr_scheduler is not None and not callable(self.lr_scheduler):
            raise TypeError("lr_scheduler must be a factory: optimizer -> LRScheduler, "
                            f"got {type(self.lr_scheduler).__name__}")
        _check_predictor(self.predictor)
        if self.recompute not in (True, False):
            raise TypeError(f"recompute must be a bool, got {self.recompute!r}")
        from ..precision import as_precision

        object.__setattr__(self, "precision", as_precision(self.precision))
        if self.codec is not None:  # names and types checked now; the per-boundary list once D is known
            from ..links import as_codec

            for c in (self.codec if isinstance(self.codec, (list, tuple)) else [self.codec]):
                if c is not None:
                    as_codec(c)

    def fields(self) -> dict[str, Any]:
        """The spec as keywords (``PipelineSpec(**spec.fields()) == spec``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: the keywords a spec (and every driver) accepts, in declaration order
SPEC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(PipelineSpec))
_REQUIRED = ("schedule", "policy", "optimizer")


def _check_predictor(predictor: Any) -> None:
    """A predictor name must be registered (or ``"oracle"``); anything else must be a predictor or a factory."""
    if isinstance(predictor, str):
        from ..predictors import PREDICTORS

        if predictor != "oracle" and predictor not in PREDICTORS:
            raise ValueError(f"unknown predictor {predictor!r}; choose one of {', '.join(PREDICTORS)}, or 'oracle' "
                             "(the true future weights)")
    elif not (predictor is None or hasattr(predictor, "predict") or callable(predictor)):
        raise TypeError(f"predictor must be a name, a Predictor or a factory stage -> Predictor, "
                        f"got {type(predictor).__name__}")


def make_spec(spec: PipelineSpec | None, fields_: Mapping[str, Any], owner: str) -> PipelineSpec:
    """The spec a driver runs: ``spec``, with the keywords ``fields_`` replacing its fields (or making one);
    ``owner`` (``"Emulator"``, ...) names the caller in errors.

    Raises:
        TypeError: ``spec`` of another type, an unknown keyword (the message lists the allowed ones), or a
            required field (schedule, policy, optimizer) missing.
    """
    if spec is not None and not isinstance(spec, PipelineSpec):
        raise TypeError(f"{owner}: spec must be a pipelab.pipeline.PipelineSpec, got {type(spec).__name__}; "
                        "pass the pipeline's arguments as keywords instead (schedule=..., policy=..., ...)")
    unknown = sorted(set(fields_) - set(SPEC_FIELDS))
    if unknown:
        raise TypeError(f"{owner} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                        f"the pipeline's arguments are {', '.join(SPEC_FIELDS)}")
    if spec is not None:
        return replace(spec, **fields_) if fields_ else spec
    missing = [name for name in _REQUIRED if name not in fields_]
    if missing:
        raise TypeError(f"{owner} needs {', '.join(missing)} (or spec=PipelineSpec(...)); "
                        f"the pipeline's arguments are {', '.join(SPEC_FIELDS)}")
    return PipelineSpec(**fields_)
