"""Experiment configurations: frozen dataclasses with named presets.

Every experiment in pipelab is described by one frozen dataclass. Three named presets size it:

- ``tiny``: seconds on a 2-core CPU; used by the tests and when notebooks run in CI;
- ``quick``: the default for regenerating figures on a CPU (minutes);
- ``paper``: GPU scale, closer to the published experiments.

The active preset comes from an explicit argument, else the ``PIPELAB_PRESET`` environment variable,
else ``quick``. A config is turned into a canonical JSON form (:func:`config_to_dict`) that the result
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
import os
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, TypeVar

__all__ = ["PRESETS", "resolve_preset", "from_preset", "config_to_dict", "config_hash"]

PRESETS: tuple[str, ...] = ("tiny", "quick", "paper")
ENV_PRESET = "PIPELAB_PRESET"

T = TypeVar("T")


def resolve_preset(preset: str | None = None) -> str:
    """Return the preset to use: ``preset`` if given, else ``$PIPELAB_PRESET``, else ``"quick"``.

    Raises:
        ValueError: if the name is not one of :data:`PRESETS`.
    """
    name = preset if preset is not None else os.environ.get(ENV_PRESET, "quick")
    if name not in PRESETS:
        source = "preset" if preset is not None else f"${ENV_PRESET}"
        raise ValueError(f"{source}={name!r} is not a preset; choose one of {', '.join(PRESETS)}")
    return name


def from_preset(table: Mapping[str, T], preset: str | None = None) -> T:
    """Look up the config for ``preset`` (resolved by :func:`resolve_preset`) in ``table``."""
    name = resolve_preset(preset)
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"no config for preset {name!r}; this experiment defines {sorted(table)}") from None


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        out["__type__"] = f"{type(value).__module__}.{type(value).__qualname__}"
        return out
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    # torch.dtype, torch.device and similar: their repr is stable and unambiguous.
    return repr(value)


def config_to_dict(config: Any) -> dict[str, Any]:
    """Canonical JSON-able form of a (possibly nested) dataclass config, with its type name."""
    if not (dataclasses.is_dataclass(config) and not isinstance(config, type)) and not isinstance(config, Mapping):
        raise TypeError(f"config must be a dataclass instance or a mapping, got {type(config).__name__}")
    return _jsonable(config)


def config_hash(config: Any, *, salt: str = "") -> str:
    """SHA-256 of the canonical JSON of ``config`` plus ``salt`` (e.g. the package version)."""
    text = json.dumps({"config": config_to_dict(config), "salt": salt}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
