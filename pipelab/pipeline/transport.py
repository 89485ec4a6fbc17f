"""How a tensor made by one job reaches the job that consumes it: the only thing the two drivers do differently.

Two hand-overs exist between neighbouring stages of one micro-batch ``(t, j)``:

- ``F(k, t, j) → F(k+1, t, j)``: stage k's output is stage k+1's input (an activation);
- ``B(k, t, j) → B(k−1, t, j)``: ∂ℓ/∂(stage k's input) is ∂ℓ/∂(stage k−1's output) (a gradient).

A :class:`Transport` carries them: the producing job sends right after it ran, the consuming job receives right
before it runs; :class:`InMemoryTransport` is the emulator's, :class:`pipelab.runtime.p2p.P2PTransport` the
runtime's, and a :class:`CodedTransport` around either is the one place a codec encodes and decodes.

**A hand-over** is a tensor or a structure of tensors (tuple, list, dict, named tuple, nested, ``None`` entries
allowed: a block returning ``(hidden, mask)``); stage k+1 is called with it as its one input, as
``nn.Sequential`` does. Any other entry is refused at the stage's first forward (:func:`check_handover`). The
gradient handed back is, for a floating tensor, a tensor of its shape; else the tuple of its floating-point
leaves' gradients in flattening order (zeros where the loss does not depend on one; integer entries get none).
The runtime sends a structure as one message, its bytes packed into one buffer (:func:`pack`, :class:`Layout`).

Example:
    >>> import torch
    >>> tr = InMemoryTransport()
    >>> tr.send(("F", 0, 0, 0), ("F", 1, 0, 0), torch.ones(2))
    >>> tr.receive(("F", 0, 0, 0), ("F", 1, 0, 0))
    tensor([1., 1.])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from ..links import Codec, Encoded
from ..precision import tensor_bytes
from ..schedules.dependencies import Job

__all__ = ["Transport", "InMemoryTransport", "CodedTransport", "encode_handover", "decode_handover", "Layout",
           "check_handover", "tensors_of", "grad_leaves", "map_tensors",
           "handover_bytes", "pack", "describe_handover"]


class Transport(Protocol):
    """Carries a tensor from job ``src`` to job ``dst`` (both ``(op, stage, step, micro)``)."""

    def send(self, src: Job, dst: Job, tensor: Any) -> None:
        """Hand ``tensor`` (a tensor or a structure of tensors), just produced by ``src``, on to ``dst``."""

    def receive(self, src: Job, dst: Job) -> Any:
        """The hand-over ``src`` produced for ``dst`` (called by ``dst``, before it runs)."""

    def flush(self) -> None:
        """Complete every outstanding send (at the end of a run)."""

    def held(self) -> int:
        """Sends not yet completed (for the runtime's memory trace)."""


class InMemoryTransport:
    """The single-process transport: a dictionary, keyed by consumer, of exactly the hand-overs in flight."""

    def __init__(self) -> None:
        self.waiting: dict[Job, Any] = {}

    def send(self, src: Job, dst: Job, tensor: Any) -> None:
        self.waiting[dst] = tensor

    def receive(self, src: Job, dst: Job) -> Any:
        try:
            return self.waiting.pop(dst)
        except KeyError:
            raise RuntimeError(f"job {dst} needs the output of {src}, which has not run") from None

    def flush(self) -> None:
        return None

    def held(self) -> int:
        return 0


class CodedTransport:
    """A transport whose hand-overs cross boundary k encoded by ``codecs[k]`` (``None``: untouched).

    The wrapped transport carries the :class:`~pipelab.links.Encoded` parts; a message between stages k and k+1
    crosses boundary min(k, k+1) both ways. Straight-through: the producer's backward starts from the decoded
    gradient as if it were the gradient of its own output.
    """

    def __init__(self, transport: Transport, codecs: Sequence[Codec | None]) -> None:
        self.transport, self.codecs = transport, tuple(codecs)

    def send(self, src: Job, dst: Job, tensor: Any) -> None:
        self.transport.send(src, dst, encode_handover(self.codecs[min(src[1], dst[1])], tensor))

    def receive(self, src: Job, dst: Job) -> Any:
        return decode_handover(self.codecs[min(src[1], dst[1])], self.transport.receive(src, dst))

    def flush(self) -> None:
        self.transport.flush()

    def held(self) -> int:
        return self.transport.held()


def encode_handover(codec: Codec | None, value: Any) -> Any:
    """``value`` with each floating tensor replaced by its :class:`~pipelab.links.Encoded` form (integer tensors,
    which travel forward only, and ``None`` entries kept); ``codec=None``: ``value`` itself."""
    if codec is None:
        return value
    return map_tensors(lambda x: codec.encode(x.detach()) if x.is_floating_point() else x, value)


def decode_handover(codec: Codec | None, value: Any) -> Any:
    """The inverse of :func:`encode_handover`: each :class:`~pipelab.links.Encoded` decoded."""
    if codec is None:
        return value
    if isinstance(value, Encoded):
        return codec.decode(value)
    return pytree.tree_map(lambda x: codec.decode(x) if isinstance(x, Encoded) else x, value,
                           is_leaf=lambda x: isinstance(x, Encoded))


# ----------------------------------------------------------------------------------------- hand-over structures


def tensors_of(value: Any) -> list[Tensor]:
    """The tensors of a hand-over in flattening order (``None`` entries left out)."""
    if isinstance(value, Tensor):
        return [value]
    return [x for x in pytree.tree_leaves(value) if isinstance(x, Tensor)]


def grad_leaves(value: Any) -> list[Tensor]:
    """The floating-point tensors of a hand-over: the ones that carry a gradient (module docstring)."""
    return [x for x in tensors_of(value) if x.is_floating_point()]


def map_tensors(fn: Callable[[Tensor], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to each of its tensors (the structure kept)."""
    if isinstance(value, Tensor):
        return fn(value)
    return pytree.tree_map(lambda x: fn(x) if isinstance(x, Tensor) else x, value)


def handover_bytes(value: Any) -> int:
    """Bytes of a hand-over's tensors."""
    return tensor_bytes(tensors_of(value))


def modifies_leaf_in_place(exc: BaseException) -> bool:
    """Whether ``exc`` is autograd's refusal of an in-place operation on a leaf that requires grad: a stage that
    modifies its input in place, which is a leaf in a pipeline (plain torch modifies an intermediate result)."""
    return isinstance(exc, RuntimeError) and "leaf Variable that requires grad is being used in an in-place" in str(exc)


def describe_handover(value: Any) -> str:
    """A short description of a value for error messages: a tensor's shape and dtype, a structure's parts."""
    if isinstance(value, Tensor):
        return f"tensor{list(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {describe_handover(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe_handover(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})" if isinstance(value, tuple) else f"[{inner}]"
    return f"{type(value).__name__} {value!r}"[:60]


def check_handover(value: Any, stage: int) -> None:
    """Refuse a stage output that cannot be handed over (module docstring): TypeError naming the stage and value."""
    if isinstance(value, Tensor):
        return
    bad = [x for x in pytree.tree_leaves(value) if x is not None and not isinstance(x, Tensor)]
    if bad or not tensors_of(value):
        what = f"an entry of type {type(bad[0]).__name__}" if bad else "no tensor"
        raise TypeError(f"stage {stage} returned {describe_handover(value)}, with {what}: a stage's output is handed "
                        "to the next stage, so it must be a tensor or a tuple/list/dict of tensors (None entries "
                        "allowed); return numbers as tensors (torch.tensor(...)) or drop them")


@dataclass(frozen=True)
class Layout:
    """The form of a hand-over: each tensor's shape and dtype (``None`` for a ``None`` entry) and the structure.

    ``spec`` is ``None`` for a plain tensor, else the structure's ``torch.utils._pytree`` spec; the runtime sizes
    its receive buffers from it.
    """

    leaves: tuple[tuple[torch.Size, torch.dtype] | None, ...]
    spec: Any = None
    #: the layout of the gradient handed back, when it is not derived from this one (an encoded hand-over's)
    back: Layout | None = None

    @staticmethod
    def of(value: Any, dtype: Callable[[torch.dtype], torch.dtype] = lambda d: d, back: Layout | None = None) -> Layout:
        """The layout of ``value`` (a checked hand-over), with each tensor's dtype mapped by ``dtype``."""
        if isinstance(value, Tensor):
            return Layout(((value.shape, dtype(value.dtype)),), back=back)
        flat, spec = pytree.tree_flatten(value)
        return Layout(tuple(None if x is None else (x.shape, dtype(x.dtype)) for x in flat), spec, back)

    def gradient(self) -> Layout:
        """The layout of the gradient handed back for this hand-over (module docstring)."""
        if self.back is not None:
            return self.back
        if self.spec is None and self.leaves[0] is not None and self.leaves[0][1].is_floating_point:
            return self
        floating = tuple(x for x in self.leaves if x is not None and x[1].is_floating_point)
        return Layout(floating, pytree.tree_flatten(tuple(range(len(floating))))[1])

    @property
    def nbytes(self) -> int:
        return sum(_numel(x[0]) * _itemsize(x[1]) for x in self.leaves if x is not None)

    def meta(self) -> Any:
        """A hand-over of this layout on the ``meta`` device (for shape passes)."""
        ts = [None if x is None else torch.empty(x[0], dtype=x[1], device="meta") for x in self.leaves]
        return ts[0] if self.spec is None else pytree.tree_unflatten(ts, self.spec)

    def encoded(self, codec: Codec | None) -> Layout:
        """The layout of this hand-over as ``codec`` sends it (:class:`CodedTransport`), with its gradient's."""
        if codec is None:
            return self
        grad = self.gradient().meta()
        return Layout.of(encode_handover(codec, self.meta()), back=Layout.of(encode_handover(codec, grad)))

    def empty(self, device: torch.device) -> Tensor:
        """A receive buffer: the tensor itself, or for a structure its packed bytes (:func:`pack`)."""
        if self.spec is None:
            shape, dtype = self.leaves[0]  # type: ignore[misc]
            return torch.empty(shape, dtype=dtype, device=device)
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def unpack(self, buf: Tensor) -> Any:
        """The hand-over from a received buffer (the inverse of :func:`pack`)."""
        if self.spec is None:
            return buf
        out: list[Tensor | None] = []
        at = 0
        for leaf in self.leaves:
            if leaf is None:
                out.append(None)
                continue
            shape, dtype = leaf
            n = _numel(shape) * _itemsize(dtype)
            # a copy per tensor: its own storage, aligned for its dtype and free to require grad
            out.append(buf[at:at + n].clone().view(dtype).view(shape))
            at += n
        return pytree.tree_unflatten(out, self.spec)


def pack(value: Any) -> Tensor:
    """One contiguous buffer for a hand-over: a tensor itself, or a structure's tensors' bytes in flattening order."""
    if isinstance(value, Tensor):
        return value.contiguous()
    parts = [x.detach().contiguous().reshape(-1).view(torch.uint8) for x in tensors_of(value)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def _numel(shape: torch.Size) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
