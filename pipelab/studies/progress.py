"""Progress bars of the studies: the per-run bars of sweeps, nested below the figure runner's overall bar.

Library code shows no bars unless asked (``progress=True``: the CLI and notebooks ask). :func:`bar` makes every
per-run bar (a sweep's runs, a figure's runs): on its own (a notebook, a script) an ordinary ``tqdm.auto`` bar; inside
the figure runner (:mod:`pipelab.studies.runner`) it is drawn on the line below the overall bar that belongs to its
worker (:func:`nest`), is removed when done, and stays quiet when standard error is not a terminal (a log file gets
the runner's one line per figure, not a stream of bar redraws).

Example:
    >>> for _ in bar(range(3), desc="runs", disable=True):
    ...     pass
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["bar", "nest"]

#: the line of this process's nested bars below the runner's overall bar (``None``: not inside the runner)
_line: int | None = None


def nest(line: int | None) -> None:
    """Draw this process's bars on ``line`` (>= 1) below the runner's overall bar (line 0); ``None``: on their own."""
    global _line
    _line = line


def bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> Any:
    """A ``tqdm`` bar (``kwargs`` as tqdm's: ``total``, ``desc``, ``unit``, ...), nested inside the runner."""
    from tqdm.auto import tqdm

    if _line is not None:
        kwargs = {"position": _line, "leave": False, "dynamic_ncols": True, **kwargs}
        if not sys.stderr.isatty():
            kwargs["disable"] = True
    return tqdm(iterable, **kwargs)
