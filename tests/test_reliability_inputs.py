"""Reliability probes of the library's entry points: schedule builders, ``split``, the emulator's set-up and run.

Each probe is a call that once gave a silent wrong result, ran unbounded or raised a raw error, and the clear
error it must give now (see ``tests/probes.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import probes
from probes import Probe
from pipelab.schedules import (construct, ddp, folded, fsdp, fslpp, gpipe, interleaved_1f1b, lpp, naive,
                               one_f_one_b, pipedream, pipedream_2bw)
from pipelab.schedules import actions
from pipelab.schedules.rahimi import table_row

BIG = 10**9
SCHEDULE_PROBES = [
    Probe("naive-absurd-size", lambda: naive(BIG, 1), ValueError, "too large.*MAX_JOBS"),
    Probe("gpipe-absurd-size", lambda: gpipe(BIG, 1), ValueError, "too large.*MAX_JOBS"),
    Probe("1f1b-absurd-size", lambda: one_f_one_b(4, BIG), ValueError, "too large"),
    Probe("pipedream-absurd-steps", lambda: pipedream(4, 1, steps=BIG), ValueError, "too large"),
    Probe("2bw-absurd-size", lambda: pipedream_2bw(4, 4, steps=BIG), ValueError, "too large"),
    Probe("interleaved-absurd-size", lambda: interleaved_1f1b(2, BIG, 2), ValueError, "too large"),
    Probe("folded-absurd-size", lambda: folded(2, BIG), ValueError, "too large"),
    Probe("ddp-absurd-size", lambda: ddp(BIG, 2), ValueError, "too large"),
    Probe("fsdp-absurd-size", lambda: fsdp(BIG, 2), ValueError, "too large"),
    Probe("lpp-absurd-size", lambda: lpp(2, 2, 1, 2, steps=BIG), ValueError, "too large"),
    Probe("fslpp-absurd-size", lambda: fslpp(2, 2, 1, 2, steps=BIG), ValueError, "too large"),
    Probe("construct-absurd-size", lambda: construct(BIG, 1, 1, compute=lambda s, b, d: 0), ValueError, "too large"),
    Probe("gpipe-bool-D", lambda: gpipe(True, 2), ValueError, "D must be an int"),
    Probe("gpipe-float-M", lambda: gpipe(2, 2.0), ValueError, "M must be an int"),
    Probe("gpipe-numpy-bool", lambda: gpipe(np.bool_(True), 2), ValueError, "D must be an int"),
    Probe("table-row-zero-stages", lambda: table_row("PP", 0, 4), ValueError, "S must be an int"),
]


@probes.parametrize(SCHEDULE_PROBES)
def test_schedule_probe(probe: Probe) -> None:
    probe.check()


@pytest.mark.parametrize("build", [
    lambda i: naive(i(2), i(2), i(2)), lambda i: gpipe(i(2), i(2), i(2)), lambda i: one_f_one_b(i(2), i(2), i(2)),
    lambda i: pipedream(i(2), i(1), i(3)), lambda i: pipedream_2bw(i(2), i(2), i(3)),
    lambda i: interleaved_1f1b(i(2), i(2), i(2), i(2)), lambda i: folded(i(4), i(2), i(2)),
    lambda i: ddp(i(2), i(2), i(2), i(2)), lambda i: fsdp(i(2), i(2)), lambda i: lpp(i(2), i(2), i(1), i(2)),
    lambda i: fslpp(i(2), i(2), i(1), i(2)),
    lambda i: construct(i(2), i(2), i(2), compute=lambda s, b, d: s, max_in_flight=i(2), steps=i(2)),
], ids=["naive", "gpipe", "1f1b", "pipedream", "2bw", "interleaved", "folded", "ddp", "fsdp", "lpp", "fslpp",
        "construct"])
def test_builders_accept_numpy_integers(build) -> None:
    """``np.int64(4)`` (e.g. from a numpy sweep grid) builds the same schedule as ``4``, with int sizes."""
    ours, theirs = build(int), build(np.int64)
    assert ours.programs == theirs.programs and ours.weight_holders == theirs.weight_holders
    assert all(type(v) is int for v in (theirs.D, theirs.M, theirs.steps))


def test_job_cap_is_a_module_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is ``actions.MAX_JOBS``; lowering it refuses a schedule just above it and builds one at it."""
    monkeypatch.setattr(actions, "MAX_JOBS", 2 * 2 * 3 * 4)
    assert gpipe(2, 3, 4).n_jobs == actions.MAX_JOBS
    with pytest.raises(ValueError, match="too large"):
        gpipe(2, 3, 5)
