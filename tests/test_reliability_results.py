"""Reliability probes of results: calls that once returned a silently wrong result and must now refuse or flag it.

Each probe is one call and the clear error it must give now (see ``tests/probes.py``); the cases that need a run
(a divergence that only the evaluation sees, tuning where every rate diverges) are ordinary test functions.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import probes
import pytest
import torch
from probes import Probe
from torch import nn

from pipelab.partition import balanced_partition, split

INF, NAN = math.inf, math.nan


def _blocks(n: int = 4) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(3, 3) for _ in range(n - 1)], nn.Linear(3, 2))


# ----------------------------------------------------------------------------------------------- partition

PARTITION_PROBES = [
    # split(balance=[inf, 1, 1, 1]) used to return 2 one-block stages: the classifier head was dropped
    Probe("split-inf-cost", lambda: split(_blocks(), 2, [INF, 1, 1, 1]), ValueError, r"block 0 is inf.*finite"),
    Probe("split-nan-cost", lambda: split(_blocks(), 2, [1, NAN, 1, 1]), ValueError, r"block 1 is nan.*finite"),
    Probe("split-negative-cost", lambda: split(_blocks(), 2, [1, 1, -2.0, 1]), ValueError, r"block 2 is -2.0.*>= 0"),
    Probe("split-string-cost", lambda: split(_blocks(), 2, [1, 1, "a", 1]), TypeError, r"block 2 is 'a'.*numbers"),
    Probe("partition-inf-cost", lambda: balanced_partition([INF, 1, 1, 1], 3), ValueError, "block 0 is inf"),
    Probe("partition-minus-inf", lambda: balanced_partition([1, -INF], 1), ValueError, "block 1 is -inf"),
    Probe("partition-bool-cost", lambda: balanced_partition([True, 1], 1), TypeError, "block 0 is True"),
    Probe("partition-float-D", lambda: balanced_partition([1, 1, 1], 2.0), ValueError, r"D=2\.0.*int"),
]


@probes.parametrize(PARTITION_PROBES)
def test_partition_probe(probe: Probe) -> None:
    probe.check()


def test_huge_costs_still_cut_every_block() -> None:
    """Costs whose total overflows a float (prefix sums inf − inf = NaN) used to lose blocks: main gave [1, 1]."""
    assert balanced_partition([1e308] * 5, 2) == balanced_partition([1] * 5, 2) == [3, 2]
    assert [len(s) for s in split(_blocks(5), 2, [1e308] * 5)] == [3, 2]


def _cost_vector(rng: random.Random, n: int) -> list[float]:
    """Costs of every scale: zeros, small integers, and floats from 1e-300 up to 1e308 (sums overflow)."""
    kinds = [lambda: 0.0, lambda: float(rng.randint(0, 9)), lambda: rng.random(),
             lambda: 10.0 ** rng.uniform(-300, 308), lambda: rng.uniform(1e307, 1.7e308)]
    return [rng.choice(kinds)() for _ in range(n)]


def test_balanced_partition_property_over_random_costs() -> None:
    """For random cost vectors: D sizes ≥ 1 summing to n, and the largest stage cost equals the brute-force
    min–max optimum (sums exact, as fractions; the program may pick an optimum only up to float rounding)."""
    rng = random.Random(23)
    for _ in range(400):
        n = rng.randint(1, 8)
        D = rng.randint(1, n)
        costs = _cost_vector(rng, n)
        sizes = balanced_partition(costs, D)
        assert len(sizes) == D and sum(sizes) == n and min(sizes) >= 1, (costs, D, sizes)
        exact = [Fraction(c) for c in costs]

        def worst(cuts: tuple[int, ...], exact: list[Fraction] = exact, n: int = n) -> Fraction:
            b = (0, *cuts, n)
            return max(sum(exact[x:y], Fraction(0)) for x, y in zip(b, b[1:]))

        best = min(worst(c) for c in itertools.combinations(range(1, n), D - 1))
        got = worst(tuple(itertools.accumulate(sizes[:-1])))
        assert best <= got <= best * (1 + Fraction(1, 10**12)), (costs, D, sizes)
