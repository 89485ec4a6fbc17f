"""Mixed precision of a pipeline run: compute dtype, autocast, fp32 masters, stored-version precision, loss scaling.

A :class:`Precision` says how a pipeline computes (the one owner of the concept; :class:`~pipelab.pipeline.PipelineSpec`
carries it to the emulator and the runtime alike):

- **compute**: ``"fp32"`` (off: today's arithmetic, bit for bit), ``"bf16"`` or ``"fp16"``. With bf16/fp16 every
  stage forward (and recompute) runs under ``torch.autocast`` on the stage's device, the loss included, and a
  non-last stage's floating output is handed on in the compute dtype: activations and their gradients travel in
  half precision.
- **master weights and optimizer state** stay in the model's own dtype (fp32): gradients come back and accumulate
  there, the ``torch.optim`` optimizer steps the masters, and predictors run on them (a half-precision base
  version is upcast first).
- **versions** (stored and predicted copies): ``"master"`` (default) keeps them in the master dtype, so a policy's
  weights differ from its fp32 run only by the compute's rounding; ``"compute"`` keeps them in the compute dtype,
  PipeDream-2BW's half-precision working copy (Narayanan et al., ICML 2021, §3): half the bytes, a bit-identical
  forward for the ops autocast runs in half precision, rounded weights for those it keeps in fp32. A stage that
  holds one version at a time (flushed schedules) stores none.
- **loss scaling** (fp16 only): ``torch.amp.GradScaler``'s dynamic scale (:class:`LossScaling`). The last stage
  seeds each backward with S, so every gradient is S·∇; U(k, t) multiplies by 1/S (S read as float32, its
  reciprocal in float64, as GradScaler). If any stage's step-t gradient holds an inf/NaN, step t is skipped on
  *every* stage (weights, optimizer state and ``p.grad`` untouched; the version counter and a learning-rate
  scheduler still advance), S ← S·backoff; after ``growth_interval`` clean steps, S ← S·growth.

The skip decision of step t needs every stage's step-t gradient. On *flushed schedules* every job using version
t+1 runs after step t's last backward on all stages, so pipelab moves every U(·, t) to the flush
(:func:`~pipelab.pipeline.loss_scale.defer_updates`) where the first U reads all stages' flags (emulator) or one
``all_reduce(MAX)`` of them per step (runtime), as Megatron-LM and DeepSpeed all-reduce ``found_inf``. On
*asynchronous schedules* (PipeDream, 2BW, zb_async) a later stage's U(k, t) runs, and its version is used, before
stage 0 has finished step t; no decision there can know an earlier overflow without a flush, so fp16 loss scaling
is refused there (``defer_updates`` names the first job that would use a version early): run them in bf16. (A
per-stage scaler would let one stage skip a step the others took: a model no schedule describes.)

Example:
    >>> p = Precision("bf16")
    >>> p.dtype, p.enabled, p.loss_scaling is None
    (torch.bfloat16, True, True)
    >>> Precision("fp16").loss_scaling
    LossScaling(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)
    >>> as_precision("float32") == Precision()
    True

References: Micikevicius et al., "Mixed Precision Training", ICLR 2018 (fp32 masters, loss scaling);
``torch.amp.GradScaler`` (dynamic loss scale); Narayanan et al., ICML 2021 (PipeDream-2BW).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["Precision", "LossScaling", "as_precision", "check_precision", "weight_memory", "tensor_bytes",
           "optimizer_state_bytes", "PRECISIONS", "FP32"]

#: compute names and their dtypes (``None``: no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
_VERSIONS = ("master", "compute")


@dataclass(frozen=True)
class LossScaling:
    """A dynamic loss scale's settings, as ``torch.amp.GradScaler(init_scale, growth_factor, backoff_factor,
    growth_interval)``; ``growth_factor=1`` gives a static scale (GradScaler requires > 1).

    Rule, per step t with scaled gradients g_k of every stage k (S read as float32)::

        overflow_t = any_k any(!isfinite(g_k))
        overflow_t:  skip step t on every stage;  S <- S * backoff_factor;  n <- 0
        otherwise:   W_k <- opt_step(W_k, g_k / S);  n <- n + 1
                     if n == growth_interval: S <- S * growth_factor;  n <- 0

    Raises:
        TypeError: ``init_scale``, ``growth_factor`` or ``backoff_factor`` not a number (a string or a bool).
        ValueError: one of them NaN or ±inf, ``init_scale`` not > 0, ``growth_factor`` < 1, ``backoff_factor``
            not in (0, 1], ``growth_interval`` not a positive int.
    """

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        for name in ("init_scale", "growth_factor", "backoff_factor"):
            value = getattr(self, name)
            # an infinite scale makes every scaled gradient inf: each step would be skipped as an overflow
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if not float(self.init_scale) > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale!r}")
        if not float(self.growth_factor) >= 1:
            raise ValueError(f"growth_factor must be >= 1 (1: a static scale), got {self.growth_factor!r}")
        if not 0 < float(self.backoff_factor) <= 1:
            raise ValueError(f"backoff_factor must be in (0, 1], got {self.backoff_factor!r}")
        if isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, int) \
                or self.growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive int, got {self.growth_interval!r}")


@dataclass(frozen=True)
class Precision:
    """How a pipeline computes: compute dtype, the precision of stored/predicted versions, fp16 loss scaling.

    Args:
        compute: ``"fp32"`` (no autocast; the default, today's arithmetic bit for bit), ``"bf16"`` or ``"fp16"``
            (aliases: ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"half"``, or the dtype).
        versions: ``"master"`` (stored and predicted copies in the master dtype; default) or ``"compute"`` (in
            the compute dtype, PipeDream-2BW's half-precision working copy). See the module docstring.
        loss_scaling: fp16's dynamic loss scale (default ``LossScaling()`` for fp16, GradScaler's defaults);
            refused for fp32 and bf16.

    Raises:
        ValueError: an unknown compute or versions name; loss scaling with fp32/bf16.
        TypeError: ``loss_scaling`` not a :class:`LossScaling`.
    """

    compute: str = "fp32"
    versions: str = "master"
    loss_scaling: LossScaling | None = field(default=None)

    def __post_init__(self) -> None:
        name = self.compute
        if isinstance(name, torch.dtype):
            name = {v: k for k, v in PRECISIONS.items() if v is not None}.get(name, "fp32" if name == torch.float32
                                                                              else name)
        elif isinstance(name, str):
            name = _ALIASES.get(name, name)
        if name not in PRECISIONS:
            raise ValueError(f"unknown precision {self.compute!r}; choose one of {', '.join(PRECISIONS)} "
                             f"(or {', '.join(_ALIASES)})")
        object.__setattr__(self, "compute", name)
        if self.versions not in _VERSIONS:
            raise ValueError(f"versions must be one of {', '.join(map(repr, _VERSIONS))}, got {self.versions!r}")
        if self.loss_scaling is not None and not isinstance(self.loss_scaling, LossScaling):
            raise TypeError(f"loss_scaling must be a pipelab.precision.LossScaling, "
                            f"got {type(self.loss_scaling).__name__}")
        if name == "fp16" and self.loss_scaling is None:
            object.__setattr__(self, "loss_scaling", LossScaling())
        elif name != "fp16" and self.loss_scaling is not None:
            raise ValueError(f"loss scaling is for fp16 (its gradients underflow); {name} has fp32's exponent "
                             "range and needs none: pass loss_scaling=None")

    @property
    def dtype(self) -> torch.dtype | None:
        """The compute dtype, ``None`` for fp32 (no autocast)."""
        return PRECISIONS[self.compute]

    @property
    def enabled(self) -> bool:
        """Whether stages compute under autocast."""
        return self.dtype is not None

    def version_dtype(self) -> torch.dtype | None:
        """The dtype stored and predicted copies are kept in: ``None`` = the master dtype."""
        return self.dtype if self.versions == "compute" else None

    def autocast(self, device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast(device.type, dtype)`` for bf16/fp16; a no-op context for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.dtype)

    def handover(self, out: Tensor) -> Tensor:
        """A stage output as handed to the next stage: floating tensors in the compute dtype (fp32: unchanged)."""
        if self.dtype is None or not out.is_floating_point() or out.dtype == self.dtype:
            return out
        return out.to(self.dtype)

    def boundary_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype of a tensor crossing a stage boundary whose fp32 run would have ``dtype`` (receive buffers)."""
        return self.dtype if self.dtype is not None and dtype.is_floating_point else dtype


#: the default: no autocast, today's arithmetic
FP32 = Precision()


def as_precision(precision: Precision | str | torch.dtype | None) -> Precision:
    """A :class:`Precision` from itself, a name (``"bf16"``), a dtype (``torch.bfloat16``) or ``None`` (fp32).

    Raises:
        ValueError: an unknown name or dtype. TypeError: any other type.
    """
    if precision is None:
        return FP32
    if isinstance(precision, Precision):
        return precision
    if isinstance(precision, torch.dtype):
        names = {v: k for k, v in PRECISIONS.items() if v is not None} | {torch.float32: "fp32"}
        if precision not in names:
            raise ValueError(f"unknown precision {precision}; choose one of torch.float32, torch.bfloat16, "
                             "torch.float16")
        return Precision(names[precision])
    if isinstance(precision, str):
        return Precision(precision)
    raise TypeError(f"precision must be a pipelab.Precision, a name ({', '.join(PRECISIONS)}) or None, "
                    f"got {type(precision).__name__}")


def check_precision(precision: Precision | str | torch.dtype | None, device: torch.device | str,
                    master_dtype: torch.dtype | None = None) -> Precision:
    """``precision`` as a :class:`Precision`, checked to run on ``device`` with masters of ``master_dtype``.

    Raises:
        ValueError: an unknown precision name; bf16 on a CUDA device without bf16 support
            (``torch.cuda.is_bf16_supported()``); bf16/fp16 where autocast cannot run that dtype on the
            device's type (e.g. ``cuda`` without CUDA, or a CPU build whose autocast lacks fp16); bf16/fp16 with
            master weights that are not float32 (autocast leaves float64 alone: that run would not be mixed).
    """
    p = as_precision(precision)
    if p.dtype is None:
        return p
    if master_dtype is not None and master_dtype != torch.float32:
        raise ValueError(f"precision {p.compute!r} keeps fp32 master weights, but the model's are {master_dtype}; "
                         "convert the model with model.float() (or use precision='fp32')")
    dev = torch.device(device)
    if dev.type == "cuda" and p.dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision 'bf16' needs a GPU with bfloat16 support; {dev} has none "
                         "(torch.cuda.is_bf16_supported() is False): use 'fp16' (with loss scaling) or 'fp32'")
    if not _autocast_runs(dev.type, p.dtype):
        raise ValueError(f"precision {p.compute!r}: torch.autocast cannot run {p.dtype} on device type "
                         f"{dev.type!r} here; use another precision or device")
    return p


def _autocast_runs(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast(device_type, dtype)`` really enables that dtype (it warns and disables otherwise)."""
    if not torch.amp.is_autocast_available(device_type):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device_type, dtype=dtype):
                return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == dtype
    except (RuntimeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------- memory

def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Σ numel·element_size: the bytes ``tensors`` hold (a stage's weights, its gradients, a hand-over)."""
    return sum(x.numel() * x.element_size() for x in tensors)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the state tensors ``optimizer`` holds once every parameter has been stepped (scalar step counters
    included): what a parameter's state holds now, and for a parameter without state yet what the same optimizer's
    first step allocates for it.

    ``torch.optim`` allocates state lazily, at a parameter's first step, so before it an Adam stage would count 0
    bytes where it soon holds 2·4n. The first step's allocation is measured by stepping a twin optimizer (same class,
    same param-group hyper-parameters) over ``meta``-device copies of those parameters with zero gradients: no
    memory is allocated and neither the optimizer nor its parameters change.

    Warns (and counts 0 for them) when the twin cannot be built or stepped, e.g. an optimizer class whose constructor
    needs more than its param groups.
    """
    def state_of(states: Iterable[dict[Any, Any]]) -> int:
        return tensor_bytes(v for state in states for v in state.values() if torch.is_tensor(v))

    unstepped = {p for group in optimizer.param_groups for p in group["params"] if not optimizer.state.get(p)}
    held = state_of(optimizer.state.values())
    if not unstepped:
        return held
    twins = {p: torch.zeros_like(p, device="meta") for p in unstepped}
    groups = [{**{k: v for k, v in group.items() if k != "params"},
               "params": [twins[p] for p in group["params"] if p in twins]} for group in optimizer.param_groups]
    cls: Any = type(optimizer)  # a subclass's constructor: its param groups are all it is given
    try:
        twin = cls([g for g in groups if g["params"]])
        for t in twins.values():
            t.grad = torch.zeros_like(t)
        twin.step()
    except Exception as exc:  # any optimizer class may be passed: say what could not be measured, keep the rest
        warnings.warn(f"cannot measure the state {type(optimizer).__name__} allocates at its first step "
                      f"({type(exc).__name__}: {exc}); its {len(unstepped)} unstepped parameter(s) count 0 bytes",
                      stacklevel=2)
        return held
    return held + state_of(twin.state.values())


def weight_memory(precision: Precision, params: Sequence[Tensor], copies: int, predicted: int,
                  optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes stage k holds for its weights in ``precision`` (the model :attr:`PipelinePlan.weight_copies` counts).

    With P the stage's parameter bytes in the master dtype and c the same in the versions' dtype
    (``versions="compute"``: the compute dtype; else the master's), for ``copies`` = ring capacity V and
    ``predicted`` = prediction buffers p (a predicted copy plus the policy's extra buffers; 0 if none):

        masters = P;  versions = (V − 1)·P ("master": the newest version is the masters) or V·c ("compute": every
        version is a working copy), and 0 when V = 1 (a flushed stage computes from its masters);
        predicted = p·c;  optimizer_state = bytes of the optimizer's state tensors once stepped (fp32, as the
        masters; :func:`optimizer_state_bytes`, so before the first step too);
        total = their sum.

    Autocast's per-op casts of a weight are transient and not counted.
    """
    master = tensor_bytes(params)
    vdtype = precision.version_dtype()
    copy = master if vdtype is None else sum(w.numel() * _itemsize(vdtype) for w in params)
    if copies <= 1:
        versions = 0
    else:
        versions = (copies - 1) * master if vdtype is None else copies * copy
    opt = 0 if optimizer is None else optimizer_state_bytes(optimizer)
    out = {"masters": master, "versions": versions, "predicted": predicted * copy, "optimizer_state": opt}
    out["total"] = sum(out.values())
    return out


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

