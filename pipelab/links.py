"""Communication between workers: links, a pipeline's network, the bytes of its messages, codecs, collectives.

A :class:`Link` has a latency α (seconds) and a bandwidth β (bytes/second). A :class:`Network` gives every stage
boundary k (stage k → k+1, D−1 of them) one link per direction: ``forward[k]`` carries stage k's output
activation, ``backward[k]`` its gradient back. The simulator (:func:`pipelab.simulator.simulate`) times a message
of n bytes over L, sent at s (the end of its producer, or of ``Schedule.send_after``'s job) to worker r:

    ready = s + α_L,   arrival = max(ready, free_r) + n / β_L,   free_r ← arrival,

r's inbound *wire* (one per worker; with ``duplex`` two: activations and gradients apart) transmits ready
messages one at a time in order of ready time (ties: earlier send, then lower sender worker). Messages between
stages on one worker cost nothing. β = ∞ and α = ``transfer_cost[k]`` is the simulator's scalar model.

The network's ``receive_overhead`` o is the receiving side's cost per message, LogP's *o* (Culler, Karp,
Patterson, Sahay, Schauser, Santos, Subramonian and von Eicken, "LogP: Towards a Realistic Model of Parallel
Computation", PPoPP 1993): the consuming job starts at ``max(free_w, arrival + o)``. It is charged after the
arrival, on the receiving worker's timeline, and does not occupy the wire (the next message's transmission may
begin at ``arrival``); a worker still computing at ``arrival + o`` starts the job when free (the overhead overlaps
its compute: a waiting thread's wake-up, the hand-over's copy). Only the simulator's timing reads it; the meter
(:mod:`pipelab.runtime.meter`) models the wire alone, and o is what the machine adds to it.

Bytes (:func:`message_bytes`): a shape pass on the ``meta`` device over the user's stages and a sample
micro-batch. A hand-over (a tensor, or a tuple/dict of tensors) bills its floating tensors in the hand-over dtype
(the compute dtype under mixed precision) through the boundary's codec, both ways, and its integer tensors as
they are, forward only. A codec's bill for a floating tensor of shape (…, d), R = numel/d rows: identity
numel·itemsize, bf16 2·numel, int8 numel + 4R (a per-row fp32 scale), lowrank(r) R·r·itemsize (r columns).
A codec also encodes (an :class:`Encoded`: the parts that travel, ``nbytes`` = the bill) and decodes (each class
states its rule and error); ``PipelineSpec(codec=...)`` applies it to every hand-over and its gradient
(:class:`pipelab.pipeline.transport.CodedTransport`), one codec per boundary (:func:`boundary_codecs`).

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
import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

__all__ = ["Link", "Network", "Codec", "Encoded", "Identity", "Bf16", "Int8", "LowRank", "CODECS", "as_codec",
           "boundary_codecs", "MessageBytes",
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
    """Per boundary k = 0..D−2 the link of each direction, the wires (``duplex``), the collectives' link
    (``None``: per collective, the slowest link, largest α + n/β, of the boundaries next to the stages its
    members compute; free when there are none) and the ``receive_overhead`` o ≥ 0 seconds per received message
    (LogP's o, module docstring)."""

    forward: tuple[Link, ...]
    backward: tuple[Link, ...]
    duplex: bool = False
    collective: Link | None = None
    receive_overhead: float = 0.0

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
        o = self.receive_overhead
        if isinstance(o, bool) or not isinstance(o, (int, float)):
            raise TypeError(f"Network receive_overhead must be a number of seconds, got {type(o).__name__} {o!r}")
        if not (math.isfinite(o) and o >= 0):
            raise ValueError(f"Network receive_overhead must be finite and >= 0 seconds, got {o!r}")

    @classmethod
    def uniform(cls, D: int, link: Link, *, duplex: bool = False, collective: Link | None = None,
                receive_overhead: float = 0.0) -> Network:
        """``link`` on every boundary of a D-stage pipeline, both directions."""
        if isinstance(D, bool) or not isinstance(D, int) or D < 1:
            raise ValueError(f"D must be an int >= 1, got {D!r}")
        return cls((link,) * (D - 1), (link,) * (D - 1), duplex, collective, receive_overhead)

    @property
    def D(self) -> int:
        return len(self.forward) + 1

    def collective_link(self, boundaries: Iterable[int], nbytes: float) -> Link:
        """The link of a collective of ``nbytes`` among workers next to ``boundaries`` (class docstring)."""
        if self.collective is not None:
            return self.collective
        return max((x for k in boundaries for x in (self.forward[k], self.backward[k])),
                   key=lambda x: x.time(nbytes), default=Link())


@dataclass(frozen=True)
class Encoded:
    """A floating tensor as a codec sends it: the ``parts`` that cross the boundary, and the ``shape`` and ``dtype``
    it decodes to. A pytree node whose children are the parts (so a transport packs exactly them, and the shape and
    dtype travel in the structure the receiver already knows: no bytes)."""

    parts: tuple[Tensor, ...]
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parts)


pytree.register_pytree_node(Encoded, lambda e: (list(e.parts), (e.shape, e.dtype)),
                            lambda parts, ctx: Encoded(tuple(parts), *ctx))


class Codec(Protocol):
    """A per-boundary codec: a name, the bytes a floating tensor costs encoded (what the simulator and the meter
    bill), and the encoding itself, with ``encode(x).nbytes == encoded_bytes(x.shape, x.dtype)``."""

    @property
    def name(self) -> str: ...

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int: ...

    def encode(self, x: Tensor) -> Encoded: ...

    def decode(self, e: Encoded) -> Tensor: ...


def _rows(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1]) if shape else 1


@dataclass(frozen=True)
class Identity:
    """The tensor itself: ``decode(encode(x)) is x``."""

    name: str = "identity"

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return math.prod(shape) * dtype.itemsize

    def encode(self, x: Tensor) -> Encoded:
        return Encoded((x,), x.shape, x.dtype)

    def decode(self, e: Encoded) -> Tensor:
        return e.parts[0]


@dataclass(frozen=True)
class Bf16:
    """A cast to bfloat16 and back: ``decode(encode(x)) == x.to(torch.bfloat16).to(x.dtype)`` (round to nearest
    even; a no-op for a bf16 hand-over)."""

    name: str = "bf16"

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return 2 * math.prod(shape)

    def encode(self, x: Tensor) -> Encoded:
        return Encoded((x.to(torch.bfloat16),), x.shape, x.dtype)

    def decode(self, e: Encoded) -> Tensor:
        return e.parts[0].to(e.dtype)


@dataclass(frozen=True)
class Int8:
    """Per-row absmax quantisation to int8: for each row x (the last axis), s = fp32(max|x| / 127) and
    q = clamp(round(x / s), −127, 127); decoded q·s, |x − q·s| ≤ s/2 (a zero row stays zero). ``stochastic=True``
    rounds x/s up with probability its fractional part (E[q·s] = x, error < s), from this codec's generator
    seeded by ``seed`` (one stream per process: a runtime then differs from the emulator). Per-row scales as in
    LLM.int8() (Dettmers et al., NeurIPS 2022) without its outlier columns; stochastic rounding as in Gupta et al.,
    "Deep Learning with Limited Numerical Precision", ICML 2015."""

    stochastic: bool = False
    seed: int = 0
    name: str = "int8"
    _noise: torch.Generator | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.stochastic not in (True, False):
            raise TypeError(f"Int8 stochastic must be a bool, got {self.stochastic!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"Int8 seed must be an int, got {self.seed!r}")
        if self.stochastic:
            object.__setattr__(self, "_noise", torch.Generator().manual_seed(self.seed))

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return math.prod(shape) + 4 * _rows(shape)

    def encode(self, x: Tensor) -> Encoded:
        rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
        scale = (rows.abs().amax(1, keepdim=True) / 127).float()
        # x/s in at least fp32: a bf16 quotient would not resolve the integers up to 127 and their halves
        work = torch.promote_types(x.dtype, torch.float32)
        z = rows.to(work) / torch.where(scale > 0, scale, 1).to(work)
        if self._noise is not None and x.device.type != "meta":
            z = torch.floor(z + torch.rand(z.shape, generator=self._noise, dtype=z.dtype).to(z.device))
        else:
            z = torch.round(z)
        q = z.clamp(-127, 127).to(torch.int8)
        return Encoded((q.reshape(x.shape), scale.reshape(x.shape[:-1])), x.shape, x.dtype)

    def decode(self, e: Encoded) -> Tensor:
        q, scale = e.parts
        return q.to(e.dtype) * scale.to(e.dtype).unsqueeze(-1) if q.dim() else q.to(e.dtype) * scale.to(e.dtype)


@dataclass(frozen=True)
class LowRank:
    """A fixed subspace projection of the last axis: P ∈ R^{d×r} with orthonormal columns (QR of a Gaussian matrix
    from ``seed``, the same on every process); encode x ↦ xP, decode ↦ xPPᵀ. The gradient g gets gPPᵀ, exactly
    the gradient of the projected network x ↦ xPPᵀ (a projection is symmetric), so the pipeline trains that
    network. A random basis: the Gaussian range finder of Halko, Martinsson and Tropp, SIAM Review 2011 (learned
    compressors, Bian et al., MLSys 2024, and PowerSGD's basis, Vogels et al., NeurIPS 2019, are not implemented)."""

    rank: int
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LowRank rank must be an int >= 1, got {self.rank!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"LowRank seed must be an int, got {self.seed!r}")

    @property
    def name(self) -> str:
        return f"lowrank({self.rank})"

    def encoded_bytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return _rows(shape) * self.rank * dtype.itemsize

    def basis(self, d: int) -> Tensor:
        """P (d × r, float64, orthonormal columns) for a last axis of width d."""
        if self.rank > d:
            raise ValueError(f"LowRank rank={self.rank} exceeds the hand-over's last axis d={d}; choose rank <= {d}")
        return _basis(self.seed, d, self.rank)

    def encode(self, x: Tensor) -> Encoded:
        return Encoded((x @ self.basis(x.shape[-1]).to(x.dtype).to(x.device),), x.shape, x.dtype)

    def decode(self, e: Encoded) -> Tensor:
        P = self.basis(e.shape[-1]).to(e.dtype).to(e.parts[0].device)
        return e.parts[0].to(e.dtype) @ P.T


@functools.lru_cache(maxsize=64)
def _basis(seed: int, d: int, r: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, r, generator=g, dtype=torch.float64))
    return q


#: the codecs without a parameter, by name (``LowRank(r)`` takes its rank)
CODECS: dict[str, Codec] = {c.name: c for c in (Identity(), Bf16(), Int8())}


def as_codec(codec: Codec | str) -> Codec:
    """A codec from itself or its name: one of :data:`CODECS`, or ``"lowrank(r)"``.

    Raises:
        ValueError: an unknown name. TypeError: neither a name nor a codec.
    """
    if isinstance(codec, str):
        m = re.fullmatch(r"lowrank\((\d+)\)", codec)
        if m:
            return LowRank(int(m.group(1)))
        if codec not in CODECS:
            raise ValueError(f"codec={codec!r}; choose one of {', '.join(CODECS)} or 'lowrank(r)'")
        return CODECS[codec]
    if not all(hasattr(codec, a) for a in ("name", "encoded_bytes", "encode", "decode")):
        raise TypeError(f"codec must be a Codec (name, encoded_bytes, encode, decode) or its name, "
                        f"got {type(codec).__name__}")
    return codec


def boundary_codecs(codec: Codec | str | Sequence[Codec | str | None] | None, D: int) -> tuple[Codec | None, ...]:
    """The codec of each boundary k = 0..D−2 (``None``: identity) from one for all or one per boundary.

    A ``LowRank`` given once gets seed + k on boundary k: one projection per boundary.

    Raises:
        ValueError: a list of the wrong length, an unknown name. TypeError: an entry that is not a codec.
    """
    if codec is None or isinstance(codec, str) or not isinstance(codec, Sequence):
        one = None if codec is None else as_codec(codec)
        codecs = [replace(one, seed=one.seed + k) if isinstance(one, LowRank) else one for k in range(D - 1)]
    else:
        if len(codec) != D - 1:
            raise ValueError(f"codec must be one codec or one per boundary (D-1={D - 1}), got {len(codec)}")
        codecs = [None if c is None else as_codec(c) for c in codec]
    return tuple(None if isinstance(c, Identity) else c for c in codecs)


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
                  codec: Codec | str | Sequence[Codec | str | None] | None = None) -> MessageBytes:
    """The bytes each boundary's messages bill (module docstring), from a shape pass with the micro-batch ``x``.

    ``dtype``: the hand-over dtype of floating tensors (``None``: a plain run's); ``codec``: :func:`boundary_codecs`.

    Example:
        >>> message_bytes([nn.Linear(4, 8), nn.Linear(8, 2)], torch.zeros(3, 4), dtype=torch.bfloat16)
        MessageBytes(activation=(48,), gradient=(48,))
    """
    codecs = boundary_codecs(codec, len(stages))
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
