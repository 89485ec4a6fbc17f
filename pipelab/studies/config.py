"""Experiment configurations: frozen dataclasses with named presets.

Every experiment in pipelab is described by one frozen dataclass. Three named presets size it:

- ``tiny``: seconds on a 2-core CPU; used by the tests and when notebooks run in CI;
- ``quick``: the default for regenerating figures on a CPU (minutes);
- ``study``: the learning-curve study (issue "a comparison researchers can trust"): full datasets, learning rates
  tuned per arm on 3 tuning seeds, 10 seeds; ≈ 13.5 h of CPU (an estimate from the earlier study's timings), run
  in background chunks that the result cache stitches together, and committed under
  ``figures/study/``; only the learning-curve figures define it (``pipelab figures --preset study`` runs those);
- ``paper``: GPU scale, closer to the published experiments.

The active preset comes from an explicit argument, else the ``PIPELAB_PRESET`` environment variable,
else ``quick``. ``PIPELAB_DEVICE`` (set by ``python -m pipelab figures --device``), when set, replaces the
``device`` of every config :func:`from_preset` returns (nested configs included), so that the cache key and
the figure sidecars name the device the results were computed on. Both variables are read and checked by
:mod:`pipelab.studies.environment`.
A config is turned into a canonical JSON form (:func:`config_to_dict`) that the result
cache hashes and the figure sidecars record.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Cfg:
    ...     steps: int = 10
    >>> PRESETS = {"tiny": Cfg(2), "quick": Cfg(10), "paper": Cfg(1000)}
    >>> from_preset(PRESETS, "tiny").steps
    2
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import sys
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, TypeVar

import numpy as np

from . import environment

__all__ = ["PRESETS", "resolve_preset", "from_preset", "config_to_dict", "config_hash"]

PRESETS: tuple[str, ...] = ("tiny", "quick", "study", "paper")

T = TypeVar("T")


def resolve_preset(preset: str | None = None) -> str:
    """Return the preset to use: ``preset`` if given, else ``$PIPELAB_PRESET``, else ``"quick"``.

    Raises:
        ValueError: if the name is not one of :data:`PRESETS`.
    """
    if preset is None:
        return environment.preset()
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not a preset; choose one of {', '.join(PRESETS)}")
    return preset


def from_preset(table: Mapping[str, T], preset: str | None = None) -> T:
    """Look up the config for ``preset`` (resolved by :func:`resolve_preset`) in ``table``."""
    name = resolve_preset(preset)
    try:
        config = table[name]
    except KeyError:
        raise ValueError(f"no config for preset {name!r}; this experiment defines {sorted(table)}") from None
    device = environment.device()
    return _with_device(config, device) if device else config


def _with_device(value: Any, device: str) -> Any:
    """``value`` with every dataclass field named ``device`` (at any depth: fields, tuples, lists) set to ``device``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: device if f.name == "device" else _with_device(getattr(value, f.name), device)
                   for f in dataclasses.fields(value) if f.init}
        changes = {k: v for k, v in changes.items() if v is not getattr(value, k)}
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, (tuple, list)):
        items = [_with_device(v, device) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    return value


def _array_digest(kind: str, dtype: str, shape: tuple[int, ...], data: bytes) -> dict[str, Any]:
    return {"__array__": kind, "dtype": dtype, "shape": list(shape), "sha256": hashlib.sha256(data).hexdigest()}


def _tensor_form(value: Any, where: str) -> dict[str, Any]:
    """Content form of a dense torch tensor: dtype, shape and the SHA-256 of its bytes (device-independent)."""
    import torch

    if value.layout != torch.strided or value.is_quantized:
        raise TypeError(f"{where}: cannot hash a {value.layout} tensor faithfully; use a dense tensor")
    flat = value.detach().to("cpu").contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return _array_digest("torch", str(value.dtype), tuple(value.shape), data)


def _jsonable(value: Any, where: str = "config") -> Any:
    """Canonical JSON form of ``value``; ``where`` names the field for error messages."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _jsonable(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
        out["__type__"] = f"{type(value).__module__}.{type(value).__qualname__}"
        return out
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return {str(k): _jsonable(v, f"{where}[{k!r}]") for k, v in items}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        # Iteration order of a set depends on the hash seed: sort the canonical forms.
        forms = [_jsonable(v, f"{where}{{}}") for v in value]
        return {"__set__": sorted(forms, key=lambda f: json.dumps(f, sort_keys=True))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"{where}: cannot hash an object array faithfully; use a numeric dtype")
        return _array_digest("numpy", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, np.generic):
        return _jsonable(value.item(), where)
    if isinstance(value, (complex, bytes)):
        return repr(value)
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return _tensor_form(value, where)
        if isinstance(value, (torch.dtype, torch.device)):
            return repr(value)  # short, stable and unambiguous
    if isinstance(value, np.dtype):
        return repr(value)
    # Anything else (arbitrary objects, callables) has a repr that may be abbreviated or hold a memory
    # address: two different configs could collide, or one config never hit. Refuse instead.
    raise TypeError(f"{where}: cannot hash a value of type {type(value).__qualname__} faithfully; allowed are "
                    "dataclasses, mappings, lists/tuples/sets, enums, paths, None, bool, int, float, complex, str, "
                    "bytes, numpy arrays/scalars/dtypes and torch tensors/dtypes/devices")


def config_to_dict(config: Any) -> dict[str, Any]:
    """Canonical JSON-able form of a (possibly nested) dataclass config, with its type name.

    Values are written by content: nested dataclasses (with their type name), mappings (sorted keys),
    lists/tuples, sets (sorted), scalars; numpy arrays and torch tensors as ``{"__array__", "dtype",
    "shape", "sha256"}`` of their bytes, so two configs that differ anywhere in an array never share a
    key (a ``repr`` would abbreviate large arrays with "...").

    Raises:
        TypeError: for a value that cannot be written faithfully (an arbitrary object, a callable, an object
            array, a sparse tensor), naming the field, e.g. ``config.inner.fn``.
    """
    if not (dataclasses.is_dataclass(config) and not isinstance(config, type)) and not isinstance(config, Mapping):
        raise TypeError(f"config must be a dataclass instance or a mapping, got {type(config).__name__}")
    return _jsonable(config)


def config_hash(config: Any, *, salt: str = "") -> str:
    """SHA-256 of the canonical JSON of ``config`` plus ``salt`` (e.g. the package version)."""
    text = json.dumps({"config": config_to_dict(config), "salt": salt}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
