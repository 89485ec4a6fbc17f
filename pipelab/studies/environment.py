"""The environment variables of the studies, read in one place: each one's meaning, default and check.

- ``PIPELAB_PRESET``: the experiment size, ``tiny``, ``quick``, ``study`` or ``paper``; unset: ``quick``.
- ``PIPELAB_WORKERS``: processes running learning-curve arms in parallel, an integer >= 1; unset: 1.
- ``PIPELAB_CACHE``: the result cache's directory, ``off`` (or ``0``, ``none``, empty) to disable it; unset:
  ``$XDG_CACHE_HOME/pipelab``, i.e. ``~/.cache/pipelab``.
- ``PIPELAB_DATA``: a directory searched for Fashion-MNIST before the system's, and downloaded to; unset: none.
- ``PIPELAB_DEVICE``: the device of every figure's config, ``cpu``, ``cuda``, ``cuda:N`` or ``auto``; unset: each
  preset's own.
- ``PIPELAB_CACHED``: ``1`` to draw from the result cache only: a run not in it is an error naming it, nothing is
  computed, and ``PIPELAB_DEVICE`` may name a device this machine lacks (the one the runs were computed on, e.g.
  ``cuda`` for a lent GPU's runs redrawn on a laptop); ``0`` or unset: compute what is missing.
- ``PIPELAB_STACK``: the most seeds of one arm a learning-curve sweep trains as one stacked run, an integer >= 1 for
  every task (1: each run alone); unset: each task's cap in its preset, else 8
  (:func:`pipelab.studies.learning_curves.stack_cap`).

Each function below reads one variable and returns it checked; an empty value counts as unset (but turns the
cache off, as ``off`` does). A value it cannot use raises ``ValueError`` naming the variable, the value and the
allowed values, never silently replaced by a default. The command line (``python -m pipelab``) runs :func:`check`
before any work, and its options default to these variables: ``--preset`` to ``PIPELAB_PRESET``, ``--workers`` to
``PIPELAB_WORKERS`` (an option given wins); ``--workers``, ``--device``, ``--cached`` and ``--stack`` set their
variables for the sweeps and configs they start. Paths may start with ``~`` (expanded here, as a shell does not
inside quotes).

Example:
    >>> import os
    >>> os.environ["PIPELAB_WORKERS"] = "two"
    >>> workers()
    Traceback (most recent call last):
    ...
    ValueError: $PIPELAB_WORKERS='two' is not a number of worker processes; use an integer >= 1, e.g. ...
    >>> del os.environ["PIPELAB_WORKERS"]
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PRESET", "WORKERS", "CACHE", "DATA", "DEVICE", "CACHED", "STACK", "VARIABLES", "preset", "workers",
           "cache_root", "data_dir", "cached", "device", "named_device", "stack", "check"]

PRESET, WORKERS, CACHE, DATA, DEVICE, CACHED, STACK = "PIPELAB_PRESET", "PIPELAB_WORKERS", "PIPELAB_CACHE", \
    "PIPELAB_DATA", "PIPELAB_DEVICE", "PIPELAB_CACHED", "PIPELAB_STACK"
#: every variable the studies read, in the order :func:`check` checks them
VARIABLES = (PRESET, WORKERS, CACHE, DATA, CACHED, DEVICE, STACK)
#: values of ``PIPELAB_CACHE`` that disable the cache (compared in lower case)
CACHE_OFF = ("off", "0", "none", "")


def _raw(name: str) -> str | None:
    """The variable's value stripped of surrounding blanks; ``None`` when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or None


def preset() -> str:
    """``$PIPELAB_PRESET``, else ``"quick"``.

    Raises:
        ValueError: not one of :data:`pipelab.studies.config.PRESETS`.
    """
    from .config import PRESETS  # config reads this module: imported here, not at the top

    value = _raw(PRESET)
    if value is None:
        return "quick"
    if value not in PRESETS:
        raise ValueError(f"${PRESET}={value!r} is not a preset; choose one of {', '.join(PRESETS)}")
    return value


def workers() -> int:
    """``$PIPELAB_WORKERS``, else 1.

    Raises:
        ValueError: not an integer >= 1.
    """
    value = _raw(WORKERS)
    return 1 if value is None else _count(WORKERS, value, "worker processes", "")


def stack() -> int | None:
    """``$PIPELAB_STACK``: the most seeds stacked into one learning-curve run, for every task; ``None`` when unset.

    Raises:
        ValueError: not an integer >= 1.
    """
    value = _raw(STACK)
    return None if value is None else _count(STACK, value, "stacked seeds", " (1: every run alone)")


def _count(name: str, value: str, what: str, note: str) -> int:
    """``value`` of variable ``name`` as an integer >= 1, else ``ValueError`` saying it is no number of ``what``."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"${name}={value!r} is not a number of {what}; use an integer >= 1{note}, e.g. {name}=2")
    return number


def _directory(name: str, value: str) -> Path:
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"${name}={value!r} is a file, not a directory; name a directory")
    return path


def cache_root() -> Path | None:
    """The result cache's directory: ``$PIPELAB_CACHE``, else ``$XDG_CACHE_HOME/pipelab`` (``~/.cache/pipelab``);
    ``None`` when ``$PIPELAB_CACHE`` is one of :data:`CACHE_OFF`.

    Raises:
        ValueError: ``$PIPELAB_CACHE`` names an existing file.
    """
    value = os.environ.get(CACHE)
    if value is not None and value.strip().lower() in CACHE_OFF:
        return None
    if value is not None:
        return _directory(CACHE, value.strip())
    base = _raw("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pipelab"


def data_dir() -> Path | None:
    """``$PIPELAB_DATA``: where Fashion-MNIST is searched first and downloaded to; ``None`` when unset.

    Raises:
        ValueError: it names an existing file.
    """
    value = _raw(DATA)
    return None if value is None else _directory(DATA, value)


def cached() -> bool:
    """``$PIPELAB_CACHED``: whether figures are drawn from the result cache only (``1``); unset: ``False``.

    Raises:
        ValueError: neither ``1`` nor ``0``.
    """
    value = _raw(CACHED)
    if value not in (None, "0", "1"):
        raise ValueError(f"${CACHED}={value!r}: use 1 (draw from the result cache only) or 0")
    return value == "1"


def named_device(value: str, argument: str) -> str:
    """``value`` as the device it names (``auto`` resolved), checked against this machine unless :func:`cached`:
    drawn from the cache, ``cuda`` names where the runs were computed, not where they would run.

    Raises:
        ValueError: not a device pipelab runs on (:func:`pipelab.distributed.resolve_device`), or CUDA asked for
            without CUDA when runs may be computed.
    """
    import torch  # only when a device is named

    from ..distributed import resolve_device

    if cached() and value != "auto":
        try:
            dev = torch.device(value)
        except RuntimeError:
            dev = None
        if dev is not None and dev.type == "cuda":
            return str(dev)
    return str(resolve_device(value, argument=argument))


def device() -> str | None:
    """``$PIPELAB_DEVICE`` as the device it names (:func:`named_device`); ``None`` when unset.

    Raises:
        ValueError: as :func:`named_device`.
    """
    value = _raw(DEVICE)
    return None if value is None else named_device(value, f"${DEVICE}")


def check() -> None:
    """Read every variable of :data:`VARIABLES`, so that a bad value is refused before any work.

    Raises:
        ValueError: the first variable whose value cannot be used (see each function).
    """
    preset()
    workers()
    cache_root()
    data_dir()
    cached()
    device()
    stack()
