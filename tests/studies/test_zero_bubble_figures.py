"""The zero-bubble figures render under `tiny`, and the numbers they plot are the ones the papers and the
version tables give."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from pipelab.papers import V_SHAPE_FORMULAS  # noqa: E402
from pipelab.simulator import steady_state  # noqa: E402
from pipelab.studies import figures  # noqa: E402
from pipelab.studies.figures.zero_bubble import (  # noqa: E402
    async_split_rows,
    family,
    v_shape_table,
    zero_bubble_table,
)

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


def test_table_1_bubble_and_peak_memory_equal_the_closed_form() -> None:
    """T_F = T_I = T_W: the simulated bubble per step (period of back-to-back steps minus the work) and the peak
    resident micro-batches equal the paper's Table 1 exactly for 1F1B, ZB-H1 and ZB-H2, D in {2,3,4,8}, M in
    {D, 2D, 3D}; ZB-H2 with M < 2D-1 is refused (its zero bubble needs 2D-1 warm-up forwards on worker 0)."""
    rows = zero_bubble_table([2, 3, 4, 8])
    assert len(rows) == 4 * 3 * 3
    measured = 0
    for r in rows:
        D, M = r["D"], r["M"]
        if r["schedule"] == "ZB-H2" and M < 2 * D - 1:
            assert r["bubble"] is None and "2D-1" in r["note"]
            continue
        measured += 1
        assert r["bubble"] == r["paper_bubble"], r
        assert r["peak_activations"] == r["paper_peak"], r
        assert r["bubble_fraction"] == pytest.approx(r["paper_bubble_fraction"], abs=1e-12), r
        # One flushed step alone adds only the fill skew: D-1 idle slots per worker for the ZB schedules.
        one_step_idle = {"1F1B": 3 * (D - 1), "ZB-H1": D - 1, "ZB-H2": D - 1}[r["schedule"]]
        assert r["one_step_bubble_fraction"] == pytest.approx(one_step_idle / (3 * M + one_step_idle), abs=1e-12)
    assert measured == 4 * 3 * 3 - 4  # only ZB-H2 at M = D is left out
    # the three schedules differ, so the comparison discriminates
    d4 = {r["schedule"]: r["bubble"] for r in rows if (r["D"], r["M"]) == (4, 8)}
    assert d4 == {"1F1B": 9.0, "ZB-H1": 3.0, "ZB-H2": 0.0}


@pytest.mark.parametrize("costs", [(1.0, 1.0, 0.5), (1.0, 1.5, 0.5), (1.2, 1.0, 0.8), (2.0, 1.0, 1.0),
                                   (1.0, 2.0, 1.0), (1.0, 0.5, 1.0)])
def test_table_1_bubble_with_unequal_pass_times(costs: tuple[float, float, float]) -> None:
    """General T_F, T_I, T_W with T_W <= T_F: ZB-H1's bubble is exactly (D-1)(T_F+T_I-T_W) and ZB-H2's is
    max(0, (D-1)(T_F+T_I-2T_W)) (the closed form is negative when 2T_W > T_F+T_I; no bubble is then left);
    1F1B's is (D-1)(T_F+T_I+T_W). Tolerance 1e-9 (float sums)."""
    t_f, t_i, t_w = costs
    for r in zero_bubble_table([3, 4], [9, 12], t_f=t_f, t_i=t_i, t_w=t_w):
        expected = max(0.0, r["paper_bubble"]) if r["schedule"] == "ZB-H2" else r["paper_bubble"]
        assert r["bubble"] == pytest.approx(expected, abs=1e-9), r


def test_zb_h1_closed_form_assumes_weight_pass_not_longer_than_forward() -> None:
    """Outside the stated domain (T_W > T_F) ZB-H1's closed form undercounts: measured (D-1)(T_F+T_I-T_F) =
    (D-1)T_I against the formula's (D-1)(T_F+T_I-T_W); the check is real, not vacuous."""
    (row,) = [r for r in zero_bubble_table([4], [8], t_f=1.0, t_i=1.0, t_w=1.5) if r["schedule"] == "ZB-H1"]
    assert row["paper_bubble"] == pytest.approx(1.5)
    assert row["bubble"] == pytest.approx(3.0)


def test_v_shape_table_rows_and_columns():
    rows = v_shape_table([2, 4], [8, 16])
    assert {r["schedule"] for r in rows} == {*V_SHAPE_FORMULAS}
    assert len(rows) == 2 * 2 * 7
    for r in rows:
        busy = 3 * r["M"] * (1 if r["schedule"] in ("1f1b", "dualpipe") else 2)
        assert r["bubble"] == pytest.approx(r["idle"] / (r["idle"] + busy))
        if r["exact"] and r["schedule"] != "dualpipe_v":
            assert r["bubble"] == pytest.approx(r["paper_bubble"], abs=1e-12), r
    assert [r["W"] for r in rows if r["schedule"] == "zb_v"] == [2, 2, 4, 4]
    assert v_shape_table([2], [3]) and all(r["schedule"] != "dualpipe_v" for r in v_shape_table([2], [3]))


def test_v_shape_table_memory_column_equals_the_papers():
    rows = v_shape_table([2, 3, 4, 8], [16])
    for r in rows:
        if r["paper_memory"] is not None:
            assert r["peak_memory"] == pytest.approx(r["paper_memory"]), r
