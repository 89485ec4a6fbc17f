"""Scoped intra-op thread counts: ``with torch_threads(n):`` instead of a global ``torch.set_num_threads``.

``torch.set_num_threads`` changes a process-wide setting; a library call that needs another count (one
thread for the small models of the learning curves, a configured count for a prediction-error run) sets it
for its own body only and restores the caller's count on exit, also when the body raises. The only
exception is a freshly spawned worker process (:func:`pipelab.distributed.spawn`), which sets its own
count once at start: that process exists for that one job, so there is no caller's count to restore.

Example:
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> with torch_threads(1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["torch_threads"]


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``n`` intra-op threads (``torch.set_num_threads``), then restore the previous count.

    Args:
        n: threads for the body, an int >= 1; ``None`` leaves the count as it is (a no-op scope, so that
            callers with an optional setting need no branch).

    Raises:
        TypeError: ``n`` is not an int (or is a bool) and not None.
        ValueError: ``n`` < 1.
    """
    if n is None:
        yield
        return
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n (threads) must be an int >= 1 or None, got {n!r}")
    if n < 1:
        raise ValueError(f"n (threads) must be an int >= 1 or None, got {n}")
    saved = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(saved)
