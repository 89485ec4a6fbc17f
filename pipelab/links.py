"""Communication between workers: links, a pipeline's network, the bytes of its messages, codecs, collectives.

A :class:`Link` has a latency α (seconds) and a bandwidth β (bytes/second). A :class:`Network` gives every stage
boundary k (stage k → k+1, D−1 of them) one link per direction: ``forward[k]`` carries stage k's output
activation, ``backward[k]`` its gradient back. The simulator (:func:`pipelab.simulator.simulate`) times a message
of n bytes over L, sent at s (the end of its producer, or of ``Schedule.send_after``'s job) to worker r:

    ready = s + α_L,   arrival = max(ready, free_r) + n / β_L,   free_r ← arrival,

r's inbound *wire* (one per worker; with ``duplex`` two: activations and gradients apart) transmits ready
messages one at a time in order of ready time (ties: earlier send, then lower sender worker). Messages between
stages on one worker cost nothing. β = ∞ and α = ``transfer_cost[k]`` is the simulator's scalar model.

Bytes (:func:`message_bytes`): a shape pass on the ``meta`` device over the user's stages and a sample
micro-batch. A hand-over (a tensor, or a tuple/dict of tensors) bills its floating tensors in the hand-over dtype
(the compute dtype under mixed precision) through the boundary's codec, both ways, and its integer tensors as
they are, forward only. A codec's bill for a floating tensor of shape (…, d), R = numel/d rows: identity
numel·itemsize, bf16 2·numel, int8 numel + 4R (a per-row fp32 scale), lowrank(r) R·r·itemsize (r columns).

Collectives of p members, n bytes, one link (:func:`collective_time`; Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005): ring all-reduce
2(p−1)α + 2(p−1)/p · n/β; all-gather, reduce-scatter (p−1)α + (p−1)/p · n/β; binomial-tree broadcast, reduce
⌈log2 p⌉(α + n/β); tree all-reduce twice that.

Example:
    >>> link = Link.mbps(200, latency_ms=50)
    >>> link.bandwidth, link.time(25e6)
    (25000000.0, 1.05)
    >>> collective_time("all_reduce", 4, 4e6, Link(0.5, 1e6))          # 2·3·0.5 + 2·3/4·4
    9.0
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

__all__ = ["Link", "Network", "Codec", "Identity", "Bf16", "Int8", "LowRank", "CODECS", "MessageBytes",
           "message_bytes", "boundary_bytes", "COLLECTIVES", "collective_time"]


@dataclass(frozen=True)
class Link:
    """One direction of a connection: latency α ≥ 0 seconds, bandwidth β > 0 bytes/second (∞: no transmission)."""

    latency: float = 0.0
    bandwidth: float = math.inf

    def __post_init__(self) -> None:
        for name, v in (("latency", self.latency), ("bandwidth", self.bandwidth)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"Link {name} must be a number, got {type(v).__name__} {v!r}")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"Link latency must be finite and >= 0 seconds, got {self.latency!r}")
        if not self.bandwidth > 0:
            raise ValueError(f"Link bandwidth must be > 0 bytes/second (math.inf: free), got {self.bandwidth!r}")

    @classmethod
    def mbps(cls, rate: float, latency_ms: float = 0.0) -> Link:
        """A link of ``rate`` megabits/second (10^6 bits) and ``latency_ms`` milliseconds."""
        return cls(latency_ms / 1e3, rate * 1e6 / 8)

    def transmission(self, nbytes: float) -> float:
        """n/β: the time n bytes occupy the wire."""
        return nbytes / self.bandwidth

    def time(self, nbytes: float) -> float:
        """α + n/β: one message alone on the link."""
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Network:
    """Per boundary k = 0..D−2 the link of each direction, the wires (``duplex``) and the collectives' link
    (``None``: per collective, the slowest link, largest α + n/β, of the boundaries next to the stages its
    members compute; free when there are none)."""

    forward: tuple[Link, ...]
    backward: tuple[Link, ...]
    duplex: bool = False
    collective: Link | None = None

    def __post_init__(self) -> None:
        for name in ("forward", "backward"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not all(isinstance(x, Link) for x in getattr(self, name)):
                raise TypeError(f"Network {name} must be a sequence of Link, got {getattr(self, name)!r}")
        if len(self.forward) != len(self.backward):
            raise ValueError(f"Network needs one forward and one backward link per boundary, got "
                             f"{len(self.forward)} and {len(self.backward)}")
        if self.collective is not None and not isinstance(self.collective, Link):
            raise TypeError(f"Network collective must be a Link or None, got {self.collective!r}")

    @classmethod
    def uniform(cls, D: int, link: Link, *, duplex: bool = False, collective: Link | None = None) -> Network:
        """``link`` on every boundary of a D-stage pipeline, both directions."""
        if isinstance(D, bool) or not isinstance(D, int) or D < 1:
            raise ValueError(f"D must be an int >= 1, got {D!r}")
        return cls((link,) * (D - 1), (link,) * (D - 1), duplex, collective)

    @property
    def D(self) -> int:
        return len(self.forward) + 1

    def collective_link(self, boundaries: Iterable[int], nbytes: float) -> Link:
        """The link of a collective of ``nbytes`` among workers next to ``boundaries`` (class docstring)."""
        if self.collective is not None:
            return self.collective
        return max((x for k in boundaries for x in (self.forward[k], self.backward[k])),
                   key=lambda x: x.time(nbytes), default=Link())


class Codec(Protocol):
    """What the simulator and the meter need of a codec: a name and the bytes a floating tensor costs encoded."""

    @property
    def name(self) -> str: ...

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int: ...


def _rows(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1]) if shape else 1


@dataclass(frozen=True)
class Identity:
    name: str = "identity"

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return math.prod(shape) * dtype.itemsize


@dataclass(frozen=True)
class Bf16:
    name: str = "bf16"

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return 2 * math.prod(shape)


@dataclass(frozen=True)
class Int8:
    name: str = "int8"

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return math.prod(shape) + 4 * _rows(shape)


@dataclass(frozen=True)
class LowRank:
    rank: int

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LowRank rank must be an int >= 1, got {self.rank!r}")

    @property
    def name(self) -> str:
        return f"lowrank({self.rank})"

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return _rows(shape) * self.rank * dtype.itemsize


#: the codecs without a parameter, by name (``LowRank(r)`` takes its rank)
CODECS: dict[str, Codec] = {c.name: c for c in (Identity(), Bf16(), Int8())}


def _tensors(value: Any) -> list[Tensor]:
    return [value] if isinstance(value, Tensor) else [x for x in pytree.tree_leaves(value) if isinstance(x, Tensor)]


def _stage_inputs(stages: Sequence[nn.Module], x: Any) -> list[Any]:
    """Each stage's input for the micro-batch ``x`` (index 0: ``x``), as ``meta`` tensors (nothing is computed)."""
    if not _tensors(x):
        raise TypeError(f"x must be a micro-batch tensor (or a structure of tensors), got {type(x).__name__}")
    out = [pytree.tree_map(lambda t: t.to("meta") if isinstance(t, Tensor) else t, x)]
    with torch.no_grad():
        for stage in list(stages)[:-1]:
            out.append(copy.deepcopy(stage).to("meta")(out[-1]))
    return out


def boundary_bytes(stages: Sequence[nn.Module], x: Any) -> list[int]:
    """Bytes of each stage's input for the micro-batch ``x`` (index 0: ``x``) in a plain run's dtypes: what the
    runtime holds for a backward (:func:`pipelab.calibration.compare_memory`)."""
    return [sum(t.numel() * t.element_size() for t in _tensors(h)) for h in _stage_inputs(stages, x)]


class MessageBytes(NamedTuple):
    """Bytes crossing each boundary k = 0..D−2 per micro-batch: the activation forward, its gradient backward."""

    activation: tuple[int, ...]
    gradient: tuple[int, ...]


def message_bytes(stages: Sequence[nn.Module], x: Any, *, dtype: torch.dtype | None = None,
                  codec: Codec | Sequence[Codec | None] | None = None) -> MessageBytes:
    """The bytes each boundary's messages bill (module docstring), from a shape pass with the micro-batch ``x``.

    Args:
        dtype: the hand-over dtype of floating tensors (mixed precision: ``Precision.dtype``); ``None``: a plain
            run's. codec: one for every boundary, or one per boundary (``None``: identity).

    Example:
        >>> message_bytes([nn.Linear(4, 8), nn.Linear(8, 2)], torch.zeros(3, 4), dtype=torch.bfloat16)
        MessageBytes(activation=(48,), gradient=(48,))
    """
    codecs = list(codec) if isinstance(codec, Sequence) else [codec] * (len(stages) - 1)
    if len(codecs) != len(stages) - 1:
        raise ValueError(f"codec must be one Codec or one per boundary (D-1={len(stages) - 1}), got {len(codecs)}")
    act, grad = [], []
    for h, c in zip(_stage_inputs(stages, x)[1:], codecs):
        ts, bill_of = _tensors(h), (c or Identity()).encoded_bytes
        bill = sum(bill_of(tuple(t.shape), dtype or t.dtype) for t in ts if t.is_floating_point())
        act.append(bill + sum(t.numel() * t.element_size() for t in ts if not t.is_floating_point()))
        grad.append(bill)
    return MessageBytes(tuple(act), tuple(grad))


#: collectives :func:`collective_time` prices
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def collective_time(kind: str, members: int, nbytes: float, link: Link, algorithm: str = "ring") -> float:
    """Time of a collective of ``kind`` among ``members`` (>= 1) workers over ``nbytes`` (module docstring);
    ``algorithm`` ("ring" or "tree") chooses the all-reduce's."""
    if kind not in COLLECTIVES or algorithm not in ("ring", "tree") or isinstance(members, bool) or \
            not isinstance(members, int) or members < 1:
        raise ValueError(f"need kind in {COLLECTIVES}, algorithm 'ring' or 'tree' and members an int >= 1, got "
                         f"{kind!r}, {algorithm!r}, {members!r}")
    p, a, t = members, link.latency, link.transmission(nbytes)
    if kind in ("broadcast", "reduce") or (kind == "all_reduce" and algorithm == "tree"):
        return (2 if kind == "all_reduce" else 1) * math.ceil(math.log2(p)) * (a + t)
    ring = 2 if kind == "all_reduce" else 1
    return ring * (p - 1) * a + ring * (p - 1) / p * t
