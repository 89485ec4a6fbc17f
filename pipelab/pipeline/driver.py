"""The one driver loop: execute a program of F/B/I/W/U jobs on stage executors, handing tensors over a transport.

The emulator runs :func:`run_jobs` on the whole execution order with an in-memory transport, every runtime rank on
its own program with a ``torch.distributed`` one. Which job receives whose tensor is the dependency rule's
(:func:`~pipelab.schedules.dependencies.received_from`, :func:`~pipelab.schedules.dependencies.handed_to`): F
takes micro-batch (t, j) on stage 0, else F(k−1)'s output, and on the last stage adds ℓ_j/M to mini-batch t's loss
(complete after M: the mean loss Σ_j ℓ_j/M); B (or I) takes B(k+1)'s (I(k+1)'s) input gradient, none on the last
stage, and sends its own to stage k−1; W and U receive and send nothing.

A placed schedule (:mod:`~pipelab.pipeline.placement`) runs its global sequence: jobs ``(op, k, t, j, w)`` on
executors keyed by ``(w, k)``, and :class:`~pipelab.pipeline.placement.Collective` entries handed to the
``collective`` callback, each all-reduce also earlier as a :class:`~pipelab.pipeline.placement.Launch` (once the
program's gradients for it are complete, :func:`~pipelab.pipeline.placement.launch_positions`) so the runtime can
overlap it with the jobs until its entry. :class:`MiniBatches` checks and splits the data, held only while needed.

Reference: the F/B/U semantics of GPipe (Huang et al., NeurIPS 2019) and PipeDream (Narayanan et al.,
SOSP 2019).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..links import Codec
from ..schedules.dependencies import Split, handed_to, received_from
from .placement import Collective, Launch, launch_positions
from .stage import StageExecutor
from .transport import CodedTransport, Transport, describe_handover, handover_bytes, map_tensors, tensors_of

__all__ = ["Batch", "Batches", "IterableBatches", "batch_source", "examples", "split_micro", "take_examples",
           "MiniBatches", "DriverState", "run_jobs", "all_finite", "check_batch", "check_examples"]

#: a mini-batch ``(x, y)``: the input a tensor, or a tuple or dict of tensors (token ids and an attention mask, ...)
#: that stage 0 takes as one argument, every tensor with the examples along dimension 0; the target a tensor
Batch = tuple[Any, Tensor]
#: a run's mini-batches: mini-batch t is ``batches[t]`` (a sequence), ``batches(t)`` (a callable) or the t-th item of
#: an iterable read once, in order (a ``DataLoader``, a generator: :class:`IterableBatches`)
Batches = Sequence[Batch] | Callable[[int], Batch] | Iterable[Batch]


class IterableBatches:
    """Mini-batch t of an iterable (a ``DataLoader``, a generator): its t-th item, read once and in order, and handed
    out once (:class:`MiniBatches` holds it until its last job); items read on the way to a later one wait their
    turn."""

    def __init__(self, iterable: Iterable[Batch]) -> None:
        self._items, self._read, self._ahead = iter(iterable), 0, dict[int, Batch]()

    def __call__(self, t: int) -> Batch:
        while self._read <= t:
            try:
                self._ahead[self._read] = next(self._items)
            except StopIteration:
                raise ValueError(f"the run needs mini-batch {t} but the iterable of mini-batches ended after "
                                 f"{self._read}: give it at least as many as the schedule's steps") from None
            self._read += 1
        if t not in self._ahead:
            raise RuntimeError(f"mini-batch {t} was read from the iterable and handed out already: an iterable is read "
                               "once, in order; pass a sequence (list(loader)) or a callable t -> (x, y) to read a "
                               "mini-batch again")
        return self._ahead.pop(t)


def batch_source(batches: Batches) -> tuple[Callable[[int], Batch], int | None]:
    """``(t -> mini-batch t, how many there are)`` of ``batches`` (:data:`Batches`); the count is ``None`` for a
    callable, a generator or a ``DataLoader`` over an ``IterableDataset`` (whose ``len()`` raises ``TypeError``).

    Raises:
        TypeError: neither a sequence, a callable nor an iterable, naming what was given.
    """
    if callable(batches):
        return batches, None
    n = None
    with contextlib.suppress(TypeError):
        n = len(batches)  # type: ignore[arg-type]
    if hasattr(batches, "__getitem__") and n is not None:
        return batches.__getitem__, n
    if isinstance(batches, Iterable) and not isinstance(batches, (str, bytes)):
        return IterableBatches(batches), n
    raise TypeError("batches must be a sequence of (x, y) mini-batches, a callable t -> (x, y) or an iterable of "
                    f"them (a DataLoader), got {type(batches).__name__}")


def all_finite(tensors: Iterable[Tensor], arm_dim: int | None = None) -> Tensor:
    """The divergence test: whether no tensor holds a NaN or ±inf, as a CPU bool tensor.

    A run has diverged once a loss, an output it evaluated or a weight it holds is non-finite; ``arm_dim``: one
    bool per stacked arm (:mod:`pipelab.studies.stacking`) along that axis, instead of one 0-d bool.

    Example:
        >>> all_finite([torch.tensor([[1.0, float("inf")], [2.0, 3.0]])], arm_dim=0)
        tensor([False,  True])
    """
    out = torch.tensor(True)
    for t in tensors:
        if arm_dim is None:
            ok = torch.isfinite(t).all()
        else:
            per_arm = t.movedim(arm_dim, 0)
            ok = torch.isfinite(per_arm).reshape(per_arm.shape[0], -1).all(1)
        out = out & ok.cpu()
    return out


def examples(x: Any) -> int:
    """The number of examples of input ``x`` (a tensor, or a tuple or dict of tensors): dimension 0 of its first
    tensor with one (a 0-dim tensor: 1)."""
    sizes = [t.shape[0] for t in tensors_of(x) if t.dim()]
    return sizes[0] if sizes else 1


def check_examples(t: int, x: Any) -> None:
    """Refuse an empty mini-batch t: its mean loss 0/0 = NaN would read as divergence (ValueError)."""
    if examples(x) == 0:
        raise ValueError(f"mini-batch {t} is empty ({_input_form(x)}): a mean loss over 0 examples is NaN, not a "
                         "divergence; check the batch size and the data split the batches are cut from")


def check_batch(t: int, batch: Any) -> Batch:
    """Mini-batch t's form, checked: a tuple ``(x, y)``, the input a tensor (or a tuple or dict of tensors), the target
    a tensor, both with the same number (>= 1) of examples along dimension 0 (TypeError, ValueError otherwise)."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[1], Tensor)
            and (isinstance(batch[0], Tensor) or (isinstance(batch[0], (tuple, list, dict)) and tensors_of(batch[0])))):
        raise TypeError(f"mini-batch {t} must be a tuple (x, y): the input a tensor (or a tuple or dict of "
                        f"tensors), the target a tensor; got {_describe(batch)}")
    x, y = batch
    if y.dim() == 0 or any(v.dim() == 0 or v.shape[0] != y.shape[0] for v in tensors_of(x)):
        hint = ("; a scalar target is one example: a Dataset gives one per index, so pass a DataLoader over it"
                if y.dim() == 0 else "")
        raise ValueError(f"mini-batch {t}: {_input_form(x)} and target shape {tuple(y.shape)} must have the same "
                         f"number of examples along dimension 0{hint}")
    check_examples(t, x)
    return x, y


def _input_form(x: Any) -> str:
    """An input for error messages: a tensor's shape, a structure's parts."""
    return f"input shape {tuple(x.shape)}" if isinstance(x, Tensor) else f"input {describe_handover(x)}"


def split_micro(x: Any, M: int, name: str = "batch") -> tuple[Any, ...]:
    """Split a mini-batch into M equal micro-batches along dimension 0 (ValueError unless M divides its size); a
    tuple or dict of tensors is split tensor by tensor into M structures of the same form."""
    n = examples(x)
    if n % M:
        raise ValueError(f"{name} size {n} is not divisible by the M={M} micro-batches of the schedule; "
                         f"use a mini-batch size that is a multiple of {M}")
    if isinstance(x, Tensor):
        return torch.split(x, n // M)
    return tuple(take_examples(x, a, a + n // M) for a in range(0, n, n // M))


def take_examples(x: Any, start: int, stop: int) -> Any:
    """Examples ``start:stop`` of input ``x`` (a tensor, or every tensor of a tuple or dict along dimension 0)."""
    return map_tensors(lambda v: v[start:stop], x)


class MiniBatches:
    """The run's mini-batches, checked, split into M micro-batches, and cached while in use.

    Args:
        batches: mini-batch t is ``batches[t]``, ``batches(t)`` or an iterable's t-th item (:data:`Batches`), a
            tuple ``(x, y)`` (:data:`Batch`).
        reference: a floating-point weight of stage 0 whose dtype (and, without ``device``, device) the input
            must have (``None``: no check).
        device: move every mini-batch there before splitting (the runtime's rank device).

    Raises:
        TypeError: ``batches`` neither a sequence, a callable nor an iterable; from :meth:`micro`, a mini-batch not
            a tuple ``(x, y)`` of tensors or of another dtype than the model.
        ValueError: fewer than ``steps`` mini-batches (an iterable without a length: once it ends); from
            :meth:`micro`, input and target of different lengths, a size not divisible by M, data on another
            device than the model.
    """

    def __init__(self, batches: Batches, M: int, steps: int, *, reference: Tensor | None,
                 device: torch.device | None = None) -> None:
        self._get, n = batch_source(batches)
        #: a sequence: mini-batches may be read ahead and again (a callable may not repeat, an iterable cannot)
        self.sequence = not callable(batches) and not isinstance(self._get, IterableBatches)
        if n is not None and n < steps:
            raise ValueError(f"the schedule runs {steps} steps but only {n} mini-batches were given")
        self.M, self.reference, self.device = M, reference, device
        self._cache: dict[int, tuple[tuple[Any, ...], tuple[Tensor, ...]]] = {}

    def checked(self, t: int) -> Batch:
        """Mini-batch t, after checking its form, its sizes, and its input against stage 0's weights."""
        x, y = check_batch(t, self._get(t))
        xs = tensors_of(x)
        weight = self.reference
        wrong = [v.dtype for v in xs if v.is_floating_point() and v.dtype != getattr(weight, "dtype", v.dtype)]
        if weight is not None and wrong:
            raise TypeError(f"mini-batch {t}: input dtype {wrong[0]} differs from the model's {weight.dtype}; "
                            f"convert the data (x.to({weight.dtype})) or the model (model.to(dtype))")
        if weight is not None and self.device is None and xs[0].device != weight.device:
            raise ValueError(f"mini-batch {t}: input on {xs[0].device} but the model's first stage on "
                             f"{weight.device}; move the data or the model to one device")
        return x, y

    def micro(self, t: int) -> tuple[tuple[Any, ...], tuple[Tensor, ...]]:
        """``(inputs, targets)`` of mini-batch t, each split into M micro-batches (read once while cached)."""
        if t not in self._cache:
            x, y = self.checked(t)
            if self.device is not None:
                x, y = map_tensors(lambda v: v.to(self.device), x), y.to(self.device)
            self._cache[t] = (split_micro(x, self.M, f"mini-batch {t}: input batch"),
                              split_micro(y, self.M, f"mini-batch {t}: target batch"))
        return self._cache[t]

    def release(self, t: int) -> None:
        """Forget mini-batch t (no job left needs it)."""
        self._cache.pop(t, None)

    def __len__(self) -> int:
        """Mini-batches held now."""
        return len(self._cache)


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value[:3])}...)"
    return type(value).__name__


@dataclass
class DriverState:
    """Where a driver stands: what a resumed run needs besides the executors and the transport.

    Attributes:
        partial: ``t -> [ℓ_j/M, ...]`` losses of mini-batch t's micro-batches computed so far.
        losses: ``t -> Σ_j ℓ_j/M`` of every completed mini-batch (summed over stacked arms).
        arm_losses: ``t -> [Σ_j ℓ_{j,a}/M for each arm a]`` when the loss is a vector of arms' losses.
        act_bytes, act_peak: bytes of stage inputs saved for a backward, now and at the peak (``stage_``: per k).
    """

    position: int = 0
    partial: dict[int, list[Tensor]] = field(default_factory=lambda: defaultdict(list))
    losses: dict[int, float] = field(default_factory=dict)
    act_bytes: int = 0
    act_peak: int = 0
    stage_act_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    stage_act_peak: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    arm_losses: dict[int, list[float]] = field(default_factory=dict)

    def hold(self, k: int, nbytes: int) -> None:
        """Stage k saves (``nbytes`` > 0) or releases (< 0) a stage input for its backward."""
        self.act_bytes += nbytes
        self.act_peak = max(self.act_peak, self.act_bytes)
        self.stage_act_bytes[k] += nbytes
        self.stage_act_peak[k] = max(self.stage_act_peak[k], self.stage_act_bytes[k])


def run_jobs(program: Sequence[Any], executors: Mapping[Any, StageExecutor], transport: Transport,
             data: MiniBatches, state: DriverState, *, D: int, M: int, end: int | None = None,
             stop_on_divergence: bool = False, split: Split = False,
             on_update: Callable[[StageExecutor, int, tuple[Tensor, ...]], None] | None = None,
             after_job: Callable[[int], None] | None = None, placed: bool = False,
             collective: Callable[[Collective], None] | None = None,
             loss_parts: Callable[[int], int] | None = None, codecs: Sequence[Codec | None] = ()) -> int | None:
    """Execute ``program[state.position:end]``; jobs are ``(op, k, t, j, ...)`` (tuples or ``Action`` s).

    Args:
        state: position, losses and activation counters; advanced in place.
        stop_on_divergence: return as soon as a mini-batch's loss is NaN or ±inf (for stacked arms: every arm's).
        split: which backwards are split into I and W (a rank needs the whole schedule's: its neighbours' jobs
            decide what it receives).
        on_update: called after each ``U(k, t)`` with the executor, t and the new weights.
        after_job: called with the new position after each job.
        loss_parts: how many of step t's micro-batch losses the program computes (default M; a data-parallel
            runtime rank computes only its own, summed across ranks afterwards).

    Returns:
        The first mini-batch whose loss diverged, when ``stop_on_divergence``; else ``None``.

    Raises:
        ValueError: a job whose op is not F, B, I, W or U.
    """
    # step        what it does
    # plan        each mini-batch's last job (its data is released after it); placed: where each all-reduce launches
    # launch      before a job, the all-reduces whose gradients this program has completed
    # collective  a placed sequence's broadcast / reduce / all-reduce entry, run by ``collective``
    # F           input from the data or the previous stage, forward, output on or the loss recorded (_forward)
    # B, I, W     gradient received, backward or its halves, input gradient sent back (_backward)
    # U           the optimizer step (StageExecutor.update), then ``on_update``
    if codecs:
        transport = CodedTransport(transport, codecs)
    last_job = _last_jobs(program)
    end = len(program) if end is None else end
    launches = _launches(program, state.position, end) if placed and collective is not None else {}
    parts = loss_parts or (lambda t: M)
    for pos in range(state.position, end):
        item = program[pos]
        for at in launches.pop(pos, ()):
            assert collective is not None
            collective(Launch(*program[at]))
        if isinstance(item, Collective):
            if collective is None:
                raise ValueError(f"the program holds a collective ({item.kind} of stage {item.stage}) but no "
                                 "collective runner was given")
            collective(item)
        else:
            op, k, t, j = job = tuple(item[:4])
            ex = executors[(item[4], k)] if placed else executors[k]
            if op == "F":
                done = _forward(job, ex, transport, data, state, D, split, parts)
                # stacked arms (a loss vector) diverge one by one; the run stops once all of them have
                if stop_on_divergence and done is not None and not bool(torch.isfinite(done).any()):
                    state.position = pos + 1
                    return t
            elif op in ("B", "I", "W"):
                _backward(job, ex, transport, state, D, split)
            elif op == "U":
                W = ex.update(t)
                if on_update is not None:
                    on_update(ex, t, W)
            else:
                raise ValueError(f"the pipeline drivers execute F, B, I, W and U jobs, not {op!r}")
            if last_job.get(t) == pos:
                data.release(t)
        state.position = pos + 1
        if after_job is not None:
            after_job(state.position)
    return None


def _last_jobs(program: Sequence[Any]) -> dict[int, int]:
    """``t -> position`` of mini-batch t's last F/B/I job in ``program``."""
    return {job[2]: pos for pos, job in enumerate(program)
            if not isinstance(job, Collective) and job[0] in ("F", "B", "I")}


def _launches(program: Sequence[Any], start: int, end: int) -> dict[int, list[int]]:
    """Placed: each all-reduce in ``program[start:end]`` is launched (a Launch handed to the collective runner) as
    soon as this program's gradients for it are complete, and waited for at its own entry
    (:func:`~pipelab.pipeline.placement.launch_positions`): ``position -> [all-reduce positions]``."""
    launches: dict[int, list[int]] = defaultdict(list)
    for at, L in launch_positions(program).items():
        if start <= at < end:
            launches[max(L, start)].append(at)
    return launches


def _forward(job: tuple[Any, ...], ex: StageExecutor, transport: Transport, data: MiniBatches, state: DriverState,
             D: int, split: Split, parts: Callable[[int], int]) -> Tensor | None:
    """F(k, t, j): the input (the data on stage 0, else received), the stage forward, its output handed to the next
    stage, or on the last stage its loss recorded; returns step t's loss per arm once all ``parts(t)`` are in."""
    _, k, t, j = job
    src = received_from(job, D, split)
    x_in = data.micro(t)[0][j] if not src else transport.receive(src[0], job)
    out = ex.forward(t, j, x_in, data.micro(t)[1][j] if k == D - 1 else None)
    state.hold(k, handover_bytes(x_in))
    if k < D - 1:
        for dst in handed_to(job, D, split):
            transport.send(job, dst, out)
        return None
    state.partial[t].append(out)
    if len(state.partial[t]) < parts(t):
        return None
    per_arm = torch.stack(state.partial.pop(t)).sum(0)
    state.losses[t] = float(per_arm.sum())
    if per_arm.ndim:
        state.arm_losses[t] = per_arm.tolist()
    return per_arm


def _backward(job: tuple[Any, ...], ex: StageExecutor, transport: Transport, state: DriverState, D: int,
              split: Split) -> None:
    """B or I(k, t, j): the output gradient (received, or the loss's seed on the last stage), the backward (or its
    input half), the input gradient handed to the previous stage; W(k, t, j): the weight half alone. The stage
    input saved for the backward is released at B, or at W when split (the weight gradient is computed from it)."""
    op, k, t, j = job
    if op == "W":
        state.hold(k, -handover_bytes(ex.pending[(t, j)][0][1]))
        ex.weight_grad(t, j)
        return
    src = received_from(job, D, split)
    g_out = transport.receive(src[0], job) if src else None
    if op == "B":
        state.hold(k, -handover_bytes(ex.saved[(t, j)][1]))
        g_in = ex.backward(t, j, g_out)
    else:
        g_in = ex.input_grad(t, j, g_out)
    for dst in handed_to(job, D, split):
        assert g_in is not None  # only stage 0's backward has no input gradient, and no consumer
        transport.send(job, dst, g_in)
