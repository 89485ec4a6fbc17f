"""Progress bars of the studies: the per-run bars of sweeps, nested below the figure runner's overall bar.

Library code shows no bars unless asked (``progress=True``: the CLI and notebooks ask). :func:`bar` makes every
per-run bar (a sweep's runs, a figure's runs): on its own (a notebook, a script) an ordinary ``tqdm.auto`` bar; inside
the figure runner (:mod:`pipelab.studies.runner`) it is drawn on the line below the overall bar that belongs to its
worker (:func:`nest`), is removed when done, and when standard error is not a terminal (a log file) it writes a plain
line as runs finish, at most one a minute and always the last (:class:`LogLines`), not a stream of bar redraws: a
long figure in a log (a lent GPU's paper task, a study chunk) says how far it got when it is stopped.

Example:
    >>> for _ in bar(range(3), desc="runs", disable=True):
    ...     pass
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

__all__ = ["LogLines", "bar", "nest"]

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
            return LogLines(iterable, **kwargs)
    return tqdm(iterable, **kwargs)


class LogLines:
    """A progress bar for a log file: ``desc: n/total unit · m:ss elapsed`` on its own line as work finishes.

    A line is written at the start (what a resumed sweep found done), then when ``every`` seconds have passed since
    the last one and work finished, and always when the count reaches ``total``. Takes tqdm's arguments
    (``total``, ``initial``, ``desc``, ``unit``; the others, which only shape a terminal's bar, are ignored) and its
    ``update``/``close``/iteration.
    """

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: float | None = None, initial: float = 0,
                 desc: str | None = None, unit: str = "it", every: float = 60.0, file: TextIO | None = None,
                 **_terminal_only: Any) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.n, self.desc, self.unit, self.every = total, initial, desc or "", unit, every
        self.file = file
        self.start = self.last = time.monotonic()
        self._say(self.start)

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every or (self.total is not None and self.n >= self.total):
            self.last = now
            self._say(now)

    def _say(self, now: float) -> None:
        of = f"/{self.total:g}" if self.total is not None else ""
        elapsed = int(now - self.start)
        print(f"  {self.desc}: {self.n:g}{of} {self.unit}s · {elapsed // 60}:{elapsed % 60:02d} elapsed",
              file=self.file if self.file is not None else sys.stderr, flush=True)

    def close(self) -> None:
        pass
