"""Scoped intra-op thread counts: ``with torch_threads(n):`` instead of a global ``torch.set_num_threads``.

A library call that needs its own count sets it for its body only and restores the caller's, also when the
body raises. Only a freshly spawned worker (:func:`pipelab.distributed.spawn`) sets its count once: it has no
caller's count to restore.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["torch_threads"]


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``n`` intra-op threads (an int >= 1), then restore the previous count; ``None``: a no-op."""
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
