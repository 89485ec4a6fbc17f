"""Cutting an ``nn.Sequential`` into D contiguous pipeline stages.

:func:`split` assigns the model's top-level blocks to stages k = 0..D−1 in order. The balance is by block
count (``"layers"``), by parameter count (``"params"``), by per-block costs (a sequence of floats, e.g.
profiled times), or explicit (a sequence of D block counts). Cost balancing solves the *linear
partition* problem exactly — choose D−1 cut points minimising the largest stage cost — by dynamic
programming (:func:`balanced_partition`), the same criterion PipeDream's partitioner optimises
(Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

from torch import nn

__all__ = ["split", "balanced_partition", "stage_sizes", "check_unshared"]


def balanced_partition(costs: Sequence[float], D: int) -> list[int]:
    """Sizes of D contiguous, non-empty groups of ``costs`` that minimise the maximum group sum.

    Dynamic program: best[j][i] = min over c < i of max(best[j−1][c], sum(costs[c:i])), O(D·n²).
    Ties go to the later cut, so among optimal cuts the earlier stages get more blocks.
    The sizes always sum to n = ``len(costs)``: costs are checked to be finite and ≥ 0 first, and when their
    total overflows a float they are divided by the largest one (the optimal cuts do not change with the unit).

    Raises:
        ValueError: D not an int in 1..n; a cost that is NaN, ±inf or negative (naming the block).
        TypeError: a cost that is not a number (a bool or a string included).

    Example:
        >>> balanced_partition([1, 1, 1, 1, 4], 2)
        [4, 1]
    """
    values = _block_costs(costs)
    n = len(values)
    count = _as_int(D)
    if count is None or not 1 <= count <= n:
        raise ValueError(f"cannot cut {n} blocks into D={D!r} non-empty stages (need an int 1 <= D <= {n})")
    D = count
    if math.isinf(sum(values)):  # prefix sums would overflow, and inf − inf is NaN
        top = max(values)
        values = [c / top for c in values]
    prefix = [0.0]
    for c in values:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(D + 1)]
    cut = [[0] * (n + 1) for _ in range(D + 1)]
    best[0][0] = 0.0
    for j in range(1, D + 1):
        for i in range(j, n - (D - j) + 1):
            for c in range(j - 1, i):
                v = max(best[j - 1][c], prefix[i] - prefix[c])
                if v <= best[j][i]:
                    best[j][i], cut[j][i] = v, c
    sizes, i = [], n
    for j in range(D, 0, -1):
        sizes.append(i - cut[j][i])
        i = cut[j][i]
    return sizes[::-1]


def _block_costs(costs: Sequence[float]) -> list[float]:
    """``costs`` as floats, each a finite number ≥ 0; a clear error naming the first block that is not.

    A NaN or infinite cost makes every comparison of the dynamic program false or tied, so no cut is ever
    recorded and the stages would silently cover fewer blocks than the model has.
    """
    out = []
    for i, c in enumerate(costs):
        if isinstance(c, (bool, str, bytes)):
            raise TypeError(f"the cost of block {i} is {c!r}; block costs (balance=) must be numbers")
        try:
            value = float(c)
        except (TypeError, ValueError):
            raise TypeError(f"the cost of block {i} is {c!r}; block costs (balance=) must be numbers") from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"the cost of block {i} is {c!r}; block costs (balance=) must be finite and >= 0 "
                             "(e.g. profiled times or parameter counts)")
        out.append(value)
    return out


def stage_sizes(model: nn.Sequential, D: int, balance: str | Sequence[int] | Sequence[float] = "layers") -> list[int]:
    """Number of blocks per stage that :func:`split` would use (see there for ``balance``)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential of blocks, got {type(model).__name__}")
    n = len(model)
    count = _as_int(D)
    if count is None or count < 1:
        raise ValueError(f"D must be a positive integer, got {D!r}")
    D = count
    if D > n:
        raise ValueError(f"D={D} stages but the model has only {n} blocks; use D <= {n} or a deeper model")
    if isinstance(balance, str):
        return _named_balance(model, D, balance)
    values = list(balance)
    counts = [_as_int(v) for v in values]
    blocks = [c for c in counts if c is not None]
    if len(values) == D and len(blocks) == D:  # explicit block counts
        if any(c < 1 for c in blocks) or sum(blocks) != n:
            raise ValueError(f"balance={values} must be D={D} positive block counts summing to {n}")
        return blocks
    if len(values) == n:  # one cost per block
        return balanced_partition(values, D)
    raise ValueError(f"balance has {len(values)} entries; give D={D} block counts or one cost per block ({n})")


def _named_balance(model: nn.Sequential, D: int, balance: str) -> list[int]:
    """``"layers"``: equal block counts, the extra ones to the later stages; ``"params"``: balanced parameters."""
    if balance == "layers":
        base, extra = divmod(len(model), D)
        return [base + (1 if k >= D - extra else 0) for k in range(D)]
    if balance == "params":
        return balanced_partition([sum(p.numel() for p in b.parameters()) for b in model], D)
    raise ValueError(f"balance={balance!r}; use 'layers', 'params', D block counts, or one cost per block")


def split(model: nn.Sequential, D: int,
          balance: str | Sequence[int] | Sequence[float] = "layers") -> list[nn.Sequential]:
    """Cut ``model`` into D contiguous stages; the stages share (do not copy) the model's modules.

    Args:
        model: an ``nn.Sequential`` whose top-level positions are the blocks (a module placed at several
            positions is a block at each of them).
        D: number of stages, 1 <= D <= len(model).
        balance: ``"layers"`` (equal block counts, extra blocks to the later stages), ``"params"`` (minimise
            the largest stage's parameter count), D integers (explicit block counts), or one float cost per
            block (minimise the largest stage cost, e.g. profiled time).

    Returns:
        D ``nn.Sequential`` stages whose composition equals ``model``.

    Raises:
        ValueError: bad D or balance, or a parameter shared by blocks of two stages (:func:`check_unshared`).

    Example:
        >>> model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(10)])
        >>> [len(s) for s in split(model, 4)]
        [2, 2, 3, 3]
    """
    sizes = stage_sizes(model, D, balance)
    # every position of the Sequential: children() would list a module used at several positions only once
    blocks = list(model)
    stage_of = [k for k, size in enumerate(sizes) for _ in range(size)]
    check_unshared(blocks, stage_of, "block")
    stages, start = [], 0
    for size in sizes:
        stages.append(nn.Sequential(*blocks[start : start + size]))
        start += size
    return stages


def check_unshared(blocks: Sequence[nn.Module], stage_of: Sequence[int], what: str = "block") -> None:
    """Refuse a parameter that blocks of two different stages share (one module at two positions, tied weights).

    A pipeline gives stage k its own copy of its weights, its own optimizer and its own weight versions
    W_k^(v); a parameter in two stages would be updated twice per step and read at two different versions,
    so no pipeline reproduces training of the shared model. Sharing within one stage (and sharing a
    parameter-free module such as one ``nn.ReLU()`` anywhere) is fine.

    Args:
        blocks: the modules in model order; ``stage_of[i]``: the stage of ``blocks[i]``.
        what: how to name a position in the error ("block" of the model, or "stage" module).

    Raises:
        ValueError: naming the two positions and their stages.
    """
    owner: dict[int, tuple[int, int]] = {}
    for i, (block, k) in enumerate(zip(blocks, stage_of)):
        for p in block.parameters():
            first = owner.setdefault(id(p), (i, k))
            if first[1] != k:
                raise ValueError(
                    f"{what} {first[0]} (stage {first[1]}) and {what} {i} (stage {k}) share parameters (the same "
                    "module at two positions, or tied weights); a pipeline keeps a separate copy of each stage's "
                    "weights, so shared parameters must lie in one stage: choose D or balance= to put both "
                    "positions in the same stage, or use separate modules")


def _as_int(value: object) -> int | None:
    """``value`` as an int if it is an integer (``int``, ``numpy.int64``, ...; not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
