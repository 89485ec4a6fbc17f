"""Reliability probes: bad input, faults, corruption and interruption, kept as regression tests.

A probe is one call that once misbehaved (a silent wrong result, a hang, a raw traceback) together with
what it must do now: raise a given exception whose message matches a pattern, or warn. Each area keeps
its probes in ``tests/core/test_reliability_<area>.py`` (``tests/studies/`` for a study's) as a list handed to
:func:`parametrize`, so the next probe is one more line there::

    PROBES = [
        Probe("gpipe-absurd-size", lambda: gpipe(10**9, 1), ValueError, "too large"),
    ]

    @probes.parametrize(PROBES)
    def test_probe(probe: Probe) -> None:
        probe.check()

Probes that need set-up beyond one call (a corrupted checkpoint on disk, a busy port) are ordinary test
functions in the same module, named ``test_<what>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Probe:
    """One call and the error (or warning) it must give.

    Attributes:
        id: short name shown by pytest.
        call: the call, without arguments.
        raises: the exception type it must raise (``None``: it must not raise).
        match: regular expression the message must contain (``re.search``).
        warns: a warning category it must emit instead of raising (with ``match`` on its message).
    """

    id: str
    call: Callable[[], Any]
    raises: type[BaseException] | None = ValueError
    match: str = ""
    warns: type[Warning] | None = None

    def check(self) -> Any:
        if self.warns is not None:
            with pytest.warns(self.warns, match=self.match or None):
                return self.call()
        if self.raises is None:
            return self.call()
        with pytest.raises(self.raises) as info:
            self.call()
        if self.match:
            assert re.search(self.match, str(info.value)), f"{self.id}: message {str(info.value)!r} !~ {self.match!r}"
        return info.value


def parametrize(probes: list[Probe]) -> Any:
    """``pytest.mark.parametrize`` over probes, with their ids."""
    ids = [p.id for p in probes]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate probe ids: {sorted(i for i in ids if ids.count(i) > 1)}")
    return pytest.mark.parametrize("probe", probes, ids=ids)


__all__ = ["Probe", "parametrize"]
