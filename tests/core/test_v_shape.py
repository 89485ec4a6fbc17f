"""The V-shape and interleaved zero-bubble family (pipelab.schedules.v_shape).

References checked against: torch.distributed.pipelining's own schedule classes (per-rank compute order),
the papers' bubble and memory formulas (ZB paper §2.1/§6, NeurIPS 2024 summary table, DeepSeek-V3 Table 2),
and the rule "an activation is held from the start of F(k, g) to the end of W(k, g)" computed here from
the simulated timeline, independently of the simulator's memory model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from pipelab.papers import v_shape_bubble, v_shape_memory
from pipelab.schedules import BUILDERS, Schedule, one_f_one_b, validate, zb_h1
from pipelab.schedules.compiled import OP_CODE
from pipelab.schedules.torch_actions import from_torch
from pipelab.schedules.v_shape import dualpipe, dualpipe_v, interleaved_zero_bubble, v_half, v_min, v_stage, zb_v
from pipelab.simulator import SimResult, simulate

pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")

V_SHAPED = {"zb_v": zb_v, "v_half": v_half, "v_min": v_min, "dualpipe_v": dualpipe_v}
UNIT = {"f_cost": 1.0, "b_cost": 2.0, "i_cost": 1.0, "w_cost": 1.0}  # T_F = T_I = T_W = 1, B = I + W


def build(name: str, W: int, M: int, steps: int = 1, V: int = 2) -> Schedule:
    if name == "interleaved_zb":
        return interleaved_zero_bubble(W, V, M, steps)
    return V_SHAPED[name](W, M, steps)


def peak_f_to_w(r: SimResult, chunk_size: float) -> np.ndarray:
    """Peak activation memory per worker when (k, g)'s activation is held from the start of F(k, g) to the
    end of W(k, g) (of B(k, g) where the backward is fused), in units of ``1/chunk_size`` chunks."""
    c = r.compiled
    t = c.table
    f = t[OP_CODE["F"]].reshape(-1)
    release = np.where(t[OP_CODE["W"]] >= 0, t[OP_CODE["W"]], t[OP_CODE["B"]]).reshape(-1)
    assert (f >= 0).all() and (release >= 0).all()
    out = np.zeros(r.schedule.W)
    for w in range(r.schedule.W):
        mine = c.worker[f] == w
        times = np.concatenate([r.start[f[mine]], r.end[release[mine]]])
        delta = np.concatenate([np.ones(mine.sum()), -np.ones(mine.sum())])
        order = np.lexsort((delta, times))  # releases before acquisitions at equal times
        out[w] = np.cumsum(delta[order]).max() * chunk_size
    return out


def longest_span_idle(r: SimResult) -> float:
    c = r.compiled
    spans = [r.end[(c.worker == w) & (c.op != OP_CODE["U"])].max()
             - r.start[(c.worker == w) & (c.op != OP_CODE["U"])].min() for w in range(r.schedule.W)]
    return float(max(spans) - r.busy.max())


# ------------------------------------------------------------------------------ 1. validity, placement
@pytest.mark.parametrize("name", [*V_SHAPED, "interleaved_zb"])
@pytest.mark.parametrize("W", [1, 2, 3, 4])
def test_every_builder_validates_flushed_with_updates_after_the_last_weight_gradient(name, W):
    for M in (1, 2, 3, 2 * W, 2 * W + 1, 4 * W):
        for steps in (1, 2, 3):
            try:
                s = build(name, W, M, steps)
            except ValueError:
                assert (name == "dualpipe_v" and M < 2 * W) or name == "interleaved_zb"
                continue
            validate(s)
            validate(simulate(s, **UNIT))
            assert s.sync_lag == 0 and s.steps == steps and s.split_backward
            ops = [a.op for p in s.programs for a in p]
            assert ops.count("F") == s.D * M * steps == ops.count("I") + ops.count("B")
            assert ops.count("W") == ops.count("I") and (name == "dualpipe_v" or "B" not in ops)
            for w, prog in enumerate(s.programs):
                for i, a in enumerate(prog):
                    if a.op != "U":
                        continue
                    # U(k, t) follows the worker's last weight-gradient job of stage k in step t ...
                    grads = [j for j, b in enumerate(prog) if b.op in "WB" and b.stage == a.stage and b.step == a.step]
                    assert grads and grads[-1] < i
                    assert all(b.op == "U" for b in prog[grads[-1] + 1:i]), (w, str(a))
                    # ... and the step's first job of stage k after it
                    later = [j for j, b in enumerate(prog) if b.op != "U" and b.stage == a.stage and b.step > a.step]
                    assert not later or later[0] > i
            # one step's program repeats with the step index
            one = build(name, W, M, 1)
            for p1, pt in zip(one.programs, s.programs):
                assert [a._replace(step=0) for a in pt if a.step == steps - 1] == list(p1)


@pytest.mark.parametrize("name", [*V_SHAPED, "interleaved_zb", "dualpipe"])
def test_synchronous_every_f_i_w_job_of_step_t_sees_exactly_t_updates(name):
    """Flushed: in the simulated timeline every F, I, W (and B) job of stage k in step t starts after
    exactly t updates of stage k on its worker have ended (no staleness), also at unequal costs."""
    W, M, steps = 4, 8, 3
    s = dualpipe(W, M, steps) if name == "dualpipe" else build(name, W, M, steps)
    for costs in (UNIT, {"f_cost": 1.0, "b_cost": 3.0, "i_cost": 2.0, "w_cost": 0.5, "u_cost": 0.7}):
        r = simulate(s, **costs)
        c = r.compiled
        is_u = c.op == OP_CODE["U"]
        for i in np.flatnonzero(~is_u):
            seen = is_u & (c.stage == c.stage[i]) & (c.worker == c.worker[i]) & (r.end <= r.start[i] + 1e-12)
            assert seen.sum() == c.step[i], (name, s.programs[c.worker[i]][c.position(int(i))[1]])
        vt = r.version_table
        assert (vt.used("F") == np.arange(steps)[None, :, None]).all() and vt.max_staleness() == [0] * s.D


@pytest.mark.parametrize("W", [1, 2, 3, 5])
def test_v_placement_puts_stage_s_on_worker_s_then_back_up(W):
    for name in V_SHAPED:
        s = build(name, W, 2 * W)
        assert s.D == 2 * W
        assert s.weight_holders == tuple((k if k < W else 2 * W - 1 - k,) for k in range(2 * W)), name
        for w, prog in enumerate(s.programs):
            assert {(a.stage, a.chunk) for a in prog} == {(v_stage(w, 0, W), 0), (v_stage(w, 1, W), 1)}
    s = interleaved_zero_bubble(W, 3, W)
    assert s.weight_holders == tuple((k % W,) for k in range(3 * W))
    assert all(a.chunk == a.stage // W for p in s.programs for a in p)


# ------------------------------------------------------------------------------- 2. torch's own order
class _StageStandIn:
    """What torch's schedule constructors read from a PipelineStage to plan the order (no process group)."""

    def __init__(self, index: int, num_stages: int, W: int, rank: int) -> None:
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, num_stages, W, rank
        self.submod = torch.nn.Identity()


def torch_compute_order(cls: Any, W: int, stages_of_rank: Callable[[int], list[int]], D: int, M: int
                        ) -> list[list[tuple[str, int, int]]]:
    """torch's per-rank compute actions as pipelab (op, stage, micro); OVERLAP_F_B expands to its sub-actions
    in the order torch's runtime runs them."""
    out = []
    for r in range(W):
        sched = cls([_StageStandIn(k, D, W, r) for k in stages_of_rank(r)], M)
        ops = []
        for a in sched.pipeline_order[r]:
            if a is None:
                continue
            for b in a.sub_actions or (a,):
                ops.append((b.computation_type.value, b.stage_index, b.microbatch_index))
        out.append(ops)
    return out


def pipelab_order(s: Schedule) -> list[list[tuple[str, int, int]]]:
    return [[(a.op, a.stage, a.micro) for a in p if a.op != "U" and a.step == 0] for p in s.programs]


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 6, 8, 9, 12, 16])
def test_zb_v_equals_torch_schedule_zbv_zero_bubble(W, M):
    ref = torch_compute_order(pipelining.ScheduleZBVZeroBubble, W, lambda r: [r, 2 * W - 1 - r], 2 * W, M)
    assert pipelab_order(zb_v(W, M)) == ref
    assert pipelab_order(zb_v(W, M, steps=2)) == ref


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("M", [4, 5, 6, 8, 9, 12, 16])
def test_dualpipe_v_equals_torch_schedule_dualpipe_v(W, M):
    if M < 2 * W:
        with pytest.raises(ValueError, match="microbatches"):
            torch_compute_order(pipelining.ScheduleDualPipeV, W, lambda r: [r, 2 * W - 1 - r], 2 * W, M)
        with pytest.raises(ValueError, match="M >= D"):
            dualpipe_v(W, M)
        return
    ref = torch_compute_order(pipelining.ScheduleDualPipeV, W, lambda r: [r, 2 * W - 1 - r], 2 * W, M)
    assert pipelab_order(dualpipe_v(W, M)) == ref
    # torch mixes fused B and split I/W across micro-batches; pipelab keeps the mix per (stage, micro-batch)
    ops = {op for p in ref for op, _, _ in p}
    assert ops == {"F", "B", "I", "W"}
    # overlap="torch": the same order, and every OVERLAP_F_B's F sends its activation after its B, as imported
    theirs = from_torch(pipelining.ScheduleDualPipeV([_StageStandIn(k, 2 * W, W, 0) for k in (0, 2 * W - 1)],
                                                     M).pipeline_order, n_stages=2 * W, n_microbatches=M)
    ours = dualpipe_v(W, M, overlap="torch")
    assert ours.programs == theirs.programs and ours.send_after == theirs.send_after
    assert dualpipe_v(W, M).send_after == {} and ours.params["overlap"] == "torch"


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("V", [1, 2, 3])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 6, 8, 12, 16])
def test_interleaved_zero_bubble_equals_torch_schedule_interleaved_zero_bubble(W, V, M):
    def stages_of(r):
        return [r + c * W for c in range(V)]

    rounds = max(1, M // W)
    if M % rounds:
        with pytest.raises(ValueError, match="multiple of the number of rounds"):
            torch_compute_order(pipelining.ScheduleInterleavedZeroBubble, W, stages_of, V * W, M)
        with pytest.raises(ValueError, match="divisible by the number of rounds"):
            interleaved_zero_bubble(W, V, M)
        return
    ref = torch_compute_order(pipelining.ScheduleInterleavedZeroBubble, W, stages_of, V * W, M)
    assert pipelab_order(interleaved_zero_bubble(W, V, M)) == ref


@pytest.mark.parametrize("W", [2, 4, 6])
def test_dualpipe_is_two_mirrored_dualpipe_v_with_two_holders_per_stage(W):
    """DualPipe (DeepSeek-V3 §3.2.1): forward-direction micro-batches (j < M/2) run stage k on worker k,
    reverse-direction ones on worker W−1−k; worker r runs DualPipeV's (torch-pinned) program of worker
    min(r, W−1−r) on W/2 workers and M/2 micro-batches; both holders of a stage update after all M
    weight gradients of the step."""
    for M in (2 * W, 2 * W + 2, 4 * W):
        half = M // 2
        for steps in (1, 2, 3):
            s = dualpipe(W, M, steps)
            validate(s)
            r = simulate(s, **UNIT)
            validate(r)  # includes: every U starts after all its gradient jobs, both workers' (all-reduce)
        assert s.D == W and s.weight_holders == tuple((k, W - 1 - k) for k in range(W))
        for w, prog in enumerate(s.programs):
            for a in prog:
                if a.op != "U":
                    assert w == (a.stage if a.micro < half else W - 1 - a.stage), (w, str(a))
            assert sorted((a.stage, a.step) for a in prog if a.op == "U") == sorted(
                (k, t) for k in {w, W - 1 - w} for t in range(steps))
        v = dualpipe_v(W // 2, half)
        for w, prog in enumerate(s.programs):
            mine = [(a.op, a.stage, a.micro % half) for a in prog if a.op != "U" and a.step == 0]
            assert mine == pipelab_order(v)[min(w, W - 1 - w)]


# --------------------------------------------------------------------- 3. bubble and memory vs papers
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 6, 7, 8])
def test_peak_memory_held_from_f_to_w_equals_the_papers(W):
    """NeurIPS 2024 (authors' summary table): V-ZB W, V-Half (W+2)//2, V-Min (W+4)//3 micro-batches of a full worker
    (2 chunks); DeepSeek-V3 Table 2: DualPipe PP+1 chunk activations (D = PP = 2W). Exact, every worker's
    peak at most that and the worst worker exactly that."""
    for M in (2 * W, 4 * W + 1):
        for name in V_SHAPED:
            r = simulate(build(name, W, M), **UNIT)
            peak = peak_f_to_w(r, 0.5)
            assert peak.max() == v_shape_memory(name, W), (name, W, M, peak.tolist())
    # DualPipe: PP + 1 stage activations on every worker (PP = W ranks = D stages), for even W
    if W % 2 == 0:
        r = simulate(dualpipe(W, 2 * W), **UNIT)
        assert peak_f_to_w(r, 1.0).tolist() == [v_shape_memory("dualpipe", W)] * W == [W + 1] * W
    # ZB-H1 (interleaved ZB with one chunk) keeps 1F1B's memory, W micro-batches on worker 0.
    r = simulate(interleaved_zero_bubble(W, 1, 2 * W), **UNIT)
    assert peak_f_to_w(r, 1.0).max() == v_shape_memory("interleaved_zb", W, 1) == W
    # the ordering of the family's memory: V-Min <= V-Half <= ZB-V = 1F1B
    mem = [float(v_shape_memory(name, W) or 0) for name in ("v_min", "v_half", "zb_v")]
    assert mem == sorted(mem) and mem[-1] == W


@pytest.mark.parametrize("W", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("mult", [1, 2, 8])
def test_bubble_against_the_papers_formulas(W, mult):
    """Bubble rate as the papers define it: 1 − busy / longest worker span, at T_F = T_I = T_W."""
    M = 2 * W * mult
    busy = 6 * M  # two chunks × (F + I + W) per micro-batch per worker

    def idle(name: str) -> float:
        r = simulate(build(name, W, M), **UNIT)
        assert r.busy.max() == busy
        return longest_span_idle(r)

    # exact: ZB-V has no bubble (ZB paper §6); 1F1B (W−1)/(M+W−1); ZB-H1 idle (W−1)(T_F+T_I−T_W) = W−1
    assert idle("zb_v") == 0.0 == v_shape_bubble("zb_v", W, M)
    r = simulate(one_f_one_b(W, M), **UNIT)
    assert 1 - r.busy.max() / (r.busy.max() + longest_span_idle(r)) == pytest.approx(
        v_shape_bubble("1f1b", W, M), abs=1e-12)
    for V in (1, 2, 3):
        r = simulate(interleaved_zero_bubble(W, V, M), **UNIT)
        assert longest_span_idle(r) == W - 1
        assert 1 - r.busy.max() / (r.busy.max() + W - 1) == pytest.approx(
            v_shape_bubble("interleaved_zb", W, M, V), abs=1e-12)
    # approximate ("~" in the paper: the leading term of the ramps' idle, 4W for V-Min, 3W for V-Half):
    # measured 4W − 5 (4W − 3 when 3 | W) and 3W − 3 (3W − 4 for odd W), the O(1) terms of the ramps.
    vmin, vhalf = idle("v_min"), idle("v_half")
    assert vmin == (4 * W - 3 if W % 3 == 0 else 4 * W - 5)
    assert vhalf == (3 * W - 3 if W % 2 == 0 else 3 * W - 4)
    assert 4 * W - 5 <= vmin <= 4 * W and 3 * W - 4 <= vhalf <= 3 * W
    assert 1 - busy / (busy + 4 * W) == pytest.approx(1 - 1 / (1 + v_shape_bubble("v_min", W, M)), abs=1e-12)
    # DualPipeV: DeepSeek's bubble (D/2 − 1)(F&B + B − 3W) with F&B = F + B is a bound; measured: one T_F
    # per hop, W − 1 in all
    dpv = idle("dualpipe_v")
    assert dpv == W - 1
    assert dpv <= (W - 1) * ((1 + 2) + 2 - 3 * 1)
    # DualPipe, the same bound with PP = W: measured one T_F per half-rank hop, W/2 − 1
    if W % 2 == 0:
        r = simulate(dualpipe(W, M), **UNIT)
        assert r.busy.max() == 3 * M and longest_span_idle(r) == W // 2 - 1 <= (W // 2 - 1) * 2
        assert v_shape_bubble("dualpipe", W, M) == pytest.approx((W - 2) / (3 * M + W - 2))
    # the trade-off: less memory costs bubble, and all of them beat 1F1B's 3(W − 1)
    assert 0 == idle("zb_v") < dpv < vhalf <= vmin


README = [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (3.0, 3.0, 2.0), (1.5, 1.5, 0.5)]


@pytest.mark.parametrize("F,Ti,Wt", README, ids=[f"F{f}-I{i}-W{w}" for f, i, w in README])
def test_idle_equals_the_dualpipe_readmes_table(F, Ti, Wt):
    """DualPipe's README (github.com/deepseek-ai/DualPipe, "Pipeline Bubbles and Memory Usage Comparison", PP
    stages, F / B / W the times of a forward, full backward and weight-gradient chunk, F&B an overlapped pair):
    1F1B (PP−1)(F+B), ZB1P (PP−1)(F+B−2W), DualPipe and DualPipeV (PP/2−1)(F&B+B−3W). Every worker's idle
    time (makespan − busy) is exactly that, with F&B = F + B, under torch's overlap (both tensors of a pair
    sent after its B), at T_F = T_I ≥ T_W; the table's costs (searched on a grid of 0.5..3: other ratios miss
    it). pipelab's own overlap sends the F's activation before the B and idles less."""
    B = Ti + Wt
    costs = {"f_cost": F, "b_cost": B, "i_cost": Ti, "w_cost": Wt}
    fb = F + B  # F&B: torch runs the overlapped pair one after the other

    def idle(s: Schedule) -> np.ndarray:
        r = simulate(s, **costs)
        return r.makespan - r.busy

    for W in (2, 3, 4, 5, 6):
        for M in (2 * W, 2 * W + 3, 4 * W):
            assert idle(one_f_one_b(W, M)).tolist() == [(W - 1) * (F + B)] * W
            assert idle(zb_h1(W, M)).max() == (W - 1) * (F + B - 2 * Wt)
            PP = 2 * W  # DualPipeV: PP stages on PP/2 workers
            assert idle(dualpipe_v(W, M, overlap="torch")).tolist() == [(PP // 2 - 1) * (fb + B - 3 * Wt)] * W
            assert idle(dualpipe_v(W, M)).max() < (PP // 2 - 1) * (fb + B - 3 * Wt)
            if W % 2 == 0 and M % 2 == 0:  # DualPipe: PP stages on PP workers
                assert idle(dualpipe(W, M, overlap="torch")).tolist() == [(W // 2 - 1) * (fb + B - 3 * Wt)] * W


def test_overlap_model_is_named():
    with pytest.raises(ValueError, match=r"overlap must be one of \['pipelab', 'torch'\], got 'deepseek'"):
        dualpipe_v(2, 4, overlap="deepseek")
    with pytest.raises(ValueError, match="overlap must be one of"):
        dualpipe(2, 4, overlap="overlapped")



# ------------------------------------------------------------------------------------ 4. bad input
def test_clear_errors_for_sizes_the_builders_cannot_handle():
    with pytest.raises(ValueError, match=r"dualpipe_v needs M >= D = 2W"):
        dualpipe_v(W=3, M=5)
    for W, M in ((3, 6), (4, 9), (4, 6)):
        with pytest.raises(ValueError, match=r"dualpipe needs an even number of workers W, an even M"):
            dualpipe(W, M)
    with pytest.raises(ValueError, match=r"M divisible by the number of rounds"):
        interleaved_zero_bubble(W=2, V=2, M=5)
    for b in (zb_v, v_half, v_min, dualpipe_v, dualpipe):
        with pytest.raises(ValueError, match=r"W must be an int >= 1"):
            b(0, 4)
        with pytest.raises(ValueError, match=r"M must be an int >= 1"):
            b(2, True)
        with pytest.raises(ValueError, match=r"steps must be an int >= 1"):
            b(2, 4, 0)
    with pytest.raises(ValueError, match=r"V must be an int >= 1"):
        interleaved_zero_bubble(2, 0, 4)
    with pytest.raises(ValueError, match=r"chunk must be 0 or 1"):
        v_stage(0, 2, 4)
    with pytest.raises(ValueError, match=r"name must be one of"):
        v_shape_bubble("gpipe", 2, 4)
    with pytest.raises(ValueError, match=r"name must be one of"):
        v_shape_memory("gpipe", 2)
    with pytest.raises(ValueError, match=r"compute jobs, too large"):
        zb_v(10**4, 10**4)


def test_registry_names_the_family():
    for name, fn in {"zb_v": zb_v, "v_half": v_half, "v_min": v_min, "interleaved_zb": interleaved_zero_bubble,
                     "dualpipe_v": dualpipe_v, "dualpipe": dualpipe}.items():
        assert BUILDERS[name] is fn
