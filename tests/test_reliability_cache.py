"""Reliability probes for the result cache, config keys and figure provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import probes
from pipelab.config import config_hash, config_to_dict
from probes import Probe


@dataclass(frozen=True)
class ArrayCfg:
    weights: Any = None
    extra: dict = field(default_factory=dict)


class Opaque:
    """An object whose default repr holds a memory address."""


PROBES = [
    Probe("config-object-field", lambda: config_hash(ArrayCfg(weights=Opaque())), TypeError, r"config\.weights"),
    Probe("config-callable-nested", lambda: config_hash(ArrayCfg(extra={"fn": lambda x: x})), TypeError,
          r"config\.extra\['fn'\]"),
    Probe("config-object-array", lambda: config_hash(ArrayCfg(weights=np.array([object()]))), TypeError,
          r"config\.weights.*object array"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


def _big(kind: str, tail: float) -> Any:
    a = np.arange(5000, dtype=np.float64)
    a[2500] = tail  # in the middle: hidden by the "..." of an abbreviated repr
    return torch.from_numpy(a) if kind == "torch" else a


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_large_arrays_do_not_collide(kind: str) -> None:
    a, b = ArrayCfg(weights=_big(kind, 1.0)), ArrayCfg(weights=_big(kind, 2.0))
    assert config_hash(a) != config_hash(b)
    assert config_hash(a) == config_hash(ArrayCfg(weights=_big(kind, 1.0)))
    nested_a, nested_b = ArrayCfg(extra={"w": [_big(kind, 1.0)]}), ArrayCfg(extra={"w": [_big(kind, 2.0)]})
    assert config_hash(nested_a) != config_hash(nested_b)


def test_array_dtype_and_shape_are_part_of_the_key() -> None:
    base = np.zeros(8, dtype=np.float64)
    keys = {config_hash(ArrayCfg(weights=w)) for w in (base, base.astype(np.float32), base.reshape(2, 4),
                                                      torch.zeros(8, dtype=torch.float64), torch.zeros(2, 4))}
    assert len(keys) == 5
    form = config_to_dict(ArrayCfg(weights=torch.ones(3, dtype=torch.bfloat16)))["weights"]
    assert form["dtype"] == "torch.bfloat16" and form["shape"] == [3] and len(form["sha256"]) == 64


def test_set_fields_are_order_independent() -> None:
    assert config_hash(ArrayCfg(extra={"s": frozenset({"b", "a", "c"})})) == \
        config_hash(ArrayCfg(extra={"s": frozenset({"c", "a", "b"})}))
