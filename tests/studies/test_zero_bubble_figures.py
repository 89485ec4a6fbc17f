"""The zero-bubble figures render under `tiny`, and the numbers they plot are the ones the papers and the
version tables give."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from pipelab.studies import figures  # noqa: E402
from pipelab.studies.figures.zero_bubble import async_split_rows, family  # noqa: E402
from pipelab.studies.zero_bubble_tables import steady_state  # noqa: E402

NAMES = ["schedules_zero_bubble", "schedules_zero_bubble_bubble", "schedules_zero_bubble_frontier",
         "schedules_async_split", "schedules_async_split_gantt"]


@pytest.mark.parametrize("name", NAMES)
def test_renders_under_tiny(name: str) -> None:
    out = figures.make(name, "tiny")
    assert out.figure.axes
    for text in out.tables.values():
        assert text.count("\n") > 1


def test_steady_state_bubble_and_memory_are_the_papers() -> None:
    fam = family()
    # 1F1B: (W-1)(F+B) idle per step over 3M of work; ZB-H2 and ZB-V: zero bubble (Qi et al. 2024, Table 1
    # and the V-shape paper); memory: ZB-H2 2W-1 = 7 stage activations, ZB-V W = 4 (in full-stage units)
    M = 16

    def measured(name: str) -> tuple[float, float, float]:
        build, scale = fam[name]
        out = steady_state(build, 4, M, scale=scale)
        assert out is not None
        return out

    b, mem, period = measured("1F1B")
    assert period == 3 * M + 3 * 3 and mem == 4 and b == pytest.approx(9 / (3 * M + 9))
    for name, peak in (("ZB-H2", 7.0), ("ZB-V", 4.0)):
        b, mem, period = measured(name)
        assert b == 0.0 and period == 3 * M and mem == peak, name
    assert steady_state(fam["ZB-H2"][0], 4, 4) is None  # ZB-H2 needs M >= 2W - 1


def test_async_split_rows_tell_the_trade_off() -> None:
    D = 4
    rows = async_split_rows(D, 24, (0.0, 0.5))
    fused, now, later = (rows[n] for n in ("async 1F1B (B fused)", "split, W right after I",
                                            "split, W deferred k slots"))
    # W right after I: PipeDream's staleness D-1-k and memory D-k; deferred by k: D-1 everywhere, stale backward
    assert now["forward_staleness"] == fused["forward_staleness"] == [3.0, 2.0, 1.0, 0.0]
    assert now["peak_activations"] == fused["peak_activations"] == [4.0, 3.0, 2.0, 1.0]
    assert later["forward_staleness"] == [3.0] * D and later["peak_activations"] == [4.0] * D
    assert later["backward_staleness"] == [0.0, 1.0, 2.0, 3.0] and fused["backward_staleness"] == [0.0] * D
    # balanced stages, no latency: no bubble to fill; with latency the shorter I on the critical path helps
    assert fused["time_per_minibatch"][0] == now["time_per_minibatch"][0] == 3.0
    assert now["time_per_minibatch"][1] < fused["time_per_minibatch"][1]

