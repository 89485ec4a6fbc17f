"""pipelab.planner: the best plan equals brute force over every partition × schedule × M, the partition step is
the min-max DP where that is optimal, memory per device in bytes, the critical path, and clear errors."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch

from pipelab.calibration import boundary_bytes
from pipelab.emulator import Emulator
from pipelab.links import Link
from pipelab.partition import balanced_partition, split
from pipelab.planner import SCHEDULES, Blocks, critical_path, plan
from pipelab.profiling import profile_stages
from pipelab.schedules import BUILDERS, one_f_one_b, pipedream
from pipelab.simulator import simulate, steady_state

ALL = ("gpipe", "1f1b", "interleaved:2", "zb_h1", "zb_h2", "zb_v", "dualpipe_v", "pipedream", "2bw")


def _random_blocks(seed: int, n: int, sizes: bool = False) -> Blocks:
    rng = np.random.default_rng(seed)
    f, b = rng.uniform(0.1, 2.0, n), rng.uniform(0.2, 4.0, n)
    i = b * rng.uniform(0.3, 0.7, n)
    extra: dict[str, Any] = {}
    if sizes:
        extra = {"activation_bytes": rng.integers(100, 5000, n).tolist(),
                 "output_bytes": rng.integers(10, 500, n).tolist(),
                 "weight_bytes": rng.integers(100, 4000, n).tolist(), "input_bytes": 300}
    return Blocks(f, b, i, b - i, rng.uniform(0.0, 0.2, n), batch=2, **extra)


def _build(spec: str, W: int, M: int, steps: int) -> Any:
    name, _, v = spec.partition(":")
    return BUILDERS[name](W, int(v), M, steps) if v else BUILDERS[name](W, M, steps)


def _stage(bl: Blocks, sizes: tuple[int, ...], scale: float, recompute: bool = False) -> dict[str, np.ndarray]:
    """Per-stage costs, written out independently of the planner."""
    out: dict[str, list[float]] = {k: [] for k in ("f", "b", "i", "w", "u", "act", "out", "P")}
    start = 0
    for size in sizes:
        blk = range(start, start + size)
        f = sum(bl.f[j] for j in blk)
        rc = f if recompute else 0.0
        out["f"].append(f * scale)
        out["b"].append((sum(bl.b[j] for j in blk) + rc) * scale)
        out["i"].append((sum(bl.i[j] for j in blk) + rc) * scale)  # type: ignore[index]
        out["w"].append(sum(bl.w[j] for j in blk) * scale)  # type: ignore[index]
        out["u"].append(sum(bl.u[j] for j in blk))  # type: ignore[index]
        saved = (bl.output_bytes[start - 1] if start else bl.input_bytes) if recompute else \
            sum(bl.activation_bytes[j] for j in blk)  # type: ignore[index]
        out["act"].append(saved * scale)
        out["out"].append(bl.output_bytes[start + size - 1] * scale)  # type: ignore[index]
        out["P"].append(sum(bl.weight_bytes[j] for j in blk))  # type: ignore[index]
        start += size
    return {k: np.array(v) for k, v in out.items()}


def _brute_force(bl: Blocks, W: int, Ms: tuple[int, ...], batch: int, latency: float, cap: float = math.inf,
                 slots: int = 2) -> tuple[float, list[float]]:
    """min over every schedule × M × partition of the steady step time (flushed: makespan(3) − makespan(2);
    asynchronous: the mean over 2⌈W/M⌉ steps past the fill), under ``cap``; also every plan's largest device memory."""
    best, peaks = math.inf, []
    for spec, M in itertools.product(ALL, Ms):
        try:
            probe = _build(spec, W, M, 1)
        except ValueError:
            continue
        D, holder = probe.D, [h[0] for h in probe.weight_holders]
        if D > len(bl.f):
            continue
        asynchronous = spec in ("pipedream", "2bw")
        a = -(-W // M)
        T = 3 * a + 1 - (-(W - 1) // M)
        depth = [1] * D
        if asynchronous:
            table = simulate(_build(spec, W, M, T)).version_table
            depth = [table.stash_depth(k) for k in range(D)]
        for cuts in itertools.combinations(range(1, len(bl.f)), D - 1):
            sizes = tuple(np.diff((0, *cuts, len(bl.f))).tolist())
            c = _stage(bl, sizes, batch / M / bl.batch)
            kw = dict(f_cost=c["f"], b_cost=c["b"], i_cost=c["i"], w_cost=c["w"], u_cost=c["u"],
                      transfer_cost=latency, activation_bytes=c["act"])
            if asynchronous:
                sim = simulate(_build(spec, W, M, T), **kw)
                ends = [sim.end[sim.compiled.step == t].max() for t in range(T)]
                period = (ends[3 * a] - ends[a]) / (2 * a)
            else:
                sim = simulate(_build(spec, W, M, 3), **kw)
                period = sim.makespan - simulate(_build(spec, W, M, 2), **kw).makespan
            mem = np.array(sim.peak_activation_bytes, dtype=float)
            for k in range(D):
                mem[holder[k]] += (depth[k] + 1 + slots) * c["P"][k]  # versions, gradient, optimizer state
                if k and holder[k] != holder[k - 1]:  # activation in, gradient back: a buffer on each side
                    mem[holder[k]] += c["out"][k - 1]
                    mem[holder[k - 1]] += c["out"][k - 1]
            peaks.append(float(mem.max()))
            if mem.max() <= cap:
                best = min(best, period)
    return best, peaks


@pytest.mark.parametrize("seed, n, W, Ms", [(0, 6, 2, (2, 4)), (1, 8, 3, (3, 6)), (2, 10, 4, (4, 8))])
def test_best_plan_equals_brute_force(seed: int, n: int, W: int, Ms: tuple[int, ...]) -> None:
    bl = _random_blocks(seed, n)
    batch, latency = 8 * W, 0.05 * seed
    want, _ = _brute_force(bl, W, Ms, batch, latency)
    got = plan(bl, W, global_batch=batch, link=latency, schedules=ALL, micro_batches=Ms, max_simulations=10**6,
               nodes=10**7)
    assert got.exact
    assert got[0].step_time == pytest.approx(want, rel=1e-9)
    # the search simulated only part of what brute force does: the bound pruned the rest
    assert got.simulations < sum(math.comb(n - 1, _build(s, W, M, 1).D - 1) for s in ALL for M in Ms
                                 if _fits(s, W, M, n))


def _fits(spec: str, W: int, M: int, n: int) -> bool:
    try:
        return _build(spec, W, M, 1).D <= n
    except ValueError:
        return False


def test_best_plan_equals_brute_force_under_a_binding_memory_cap() -> None:
    bl = _random_blocks(3, 8, sizes=True)
    W, Ms, batch = 3, (3, 6), 12
    search = dict(global_batch=batch, link=0.1, schedules=ALL, micro_batches=Ms, max_simulations=10**6, nodes=10**7)
    free = plan(bl, W, **search)  # type: ignore[arg-type]
    cap = max(free[0].peak_memory) - 1.0  # the unconstrained best no longer fits
    want, peaks = _brute_force(bl, W, Ms, batch, 0.1, cap)
    assert free[0].step_time < want < math.inf and min(peaks) <= cap
    got = plan(bl, W, cap, **search)  # type: ignore[arg-type]
    assert got.exact
    assert got[0].step_time == pytest.approx(want, rel=1e-9)
    assert all(max(p.peak_memory) <= cap for p in got)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb_h1", "pipedream"])
def test_partition_is_the_min_max_dp_when_uniform(schedule: str) -> None:
    bl = Blocks([1.0] * 12, [2.0] * 12)
    got = plan(bl, 4, global_batch=8, schedules=(schedule,), micro_batches=(8,), max_simulations=10**5)
    assert list(got[0].sizes) == balanced_partition([3.0] * 12, 4) == [3, 3, 3, 3]
    assert got.exact


def test_step_time_is_steady_state_period() -> None:
    bl = Blocks([1.0] * 8, [2.0] * 8)
    got = plan(bl, 4, global_batch=8, schedules=("1f1b", "zb_h1"), micro_batches=(8,))
    for p in got:
        build = one_f_one_b if p.schedule == "1f1b" else BUILDERS["zb_h1"]
        ref = steady_state(build, 4, 8, t_f=2.0, t_i=2.0, t_w=2.0)
        assert ref is not None and p.step_time == pytest.approx(ref.period) and p.bubble == pytest.approx(ref.bubble)


def test_asynchronous_step_time_tracks_a_long_run() -> None:
    bl = _random_blocks(4, 5)
    for p in plan(bl, 5, global_batch=15, schedules=("pipedream",), micro_batches=(3,), link=0.2):
        c = _stage(bl, p.sizes, 15 / 3 / bl.batch)
        sim = simulate(pipedream(5, 3, 60), c["f"], c["b"], u_cost=c["u"], transfer_cost=0.2)
        ends = [sim.end[sim.compiled.step == t].max() for t in range(60)]
        assert p.step_time == pytest.approx((ends[50] - ends[10]) / 40, rel=0.01)


def test_memory_counts_versions_as_the_emulator_holds_them() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(4)]).double()
    x, y = torch.randn(2, 6, dtype=torch.float64), torch.randint(0, 6, (2,))
    bl = Blocks.measure(model, x, y, reps=1, warmup=0)
    assert list(bl.weight_bytes) == [42 * 8] * 4 and bl.input_bytes == boundary_bytes(list(model), x)[0]
    got = plan(bl, 4, global_batch=2, schedules=("pipedream",), micro_batches=(1,), optimizer=torch.optim.Adam)[0]
    emu = Emulator(split(model, 4, list(got.sizes)), schedule=pipedream(4, 1, 6), policy="stashing",
                   optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3))
    emu.run([(x, y)] * 6)
    for k, held in emu.plan.weight_bytes.items():
        assert got.memory[k]["weights"] == held["masters"] + held["versions"]
        assert got.memory[k]["optimizer_state"] == pytest.approx(held["optimizer_state"], abs=16)
    assert [m["weights"] // (42 * 8) for m in got.memory] == [4, 3, 2, 1]  # stage k stashes D − k versions


def test_memory_counts_frozen_parameters_once() -> None:
    """Probe: frozen parameters were profiled as trainable masters, so the planner gave a frozen block stashed
    copies, a gradient and optimizer state; now they are held once, and the plan's memory is the emulator's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(4)]).double()
    model[0].requires_grad_(False)  # a frozen block, and a frozen bias in the next
    model[1].bias.requires_grad_(False)
    x, y = torch.randn(2, 6, dtype=torch.float64), torch.randint(0, 6, (2,))
    bl = Blocks.measure(model, x, y, reps=1, warmup=0)
    assert list(bl.weight_bytes) == [0, 36 * 8, 42 * 8, 42 * 8] and list(bl.frozen_bytes) == [42 * 8, 6 * 8, 0, 0]
    got = plan(bl, 4, global_batch=2, schedules=("pipedream",), micro_batches=(1,), optimizer=torch.optim.Adam)[0]
    emu = Emulator(split(model, 4, list(got.sizes)), schedule=pipedream(4, 1, 6), policy="stashing",
                   optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3))
    emu.run([(x, y)] * 6)
    for k, held in emu.plan.weight_bytes.items():
        assert got.memory[k]["weights"] == held["masters"] + held["versions"] + bl.frozen_bytes[k]
        assert got.memory[k]["gradients"] == held["masters"]
        assert got.memory[k]["optimizer_state"] == pytest.approx(held["optimizer_state"], abs=16)


def _contiguous(cp: Any) -> bool:
    """Each job of the path starts as the previous one ends, or later only after a transfer between devices."""
    sim = cp.sim
    return all(sim.start[b] >= sim.end[a] - 1e-9 and (abs(sim.start[b] - sim.end[a]) < 1e-9
                                                      or sim.compiled.worker[a] != sim.compiled.worker[b])
               for a, b in zip(cp.jobs, cp.jobs[1:]))


def test_critical_path_covers_the_step_and_names_the_heavy_stage() -> None:
    bl = Blocks([1.0, 1.0, 4.0, 1.0], [2.0, 2.0, 8.0, 2.0])
    p = plan(bl, 4, global_batch=8, schedules=("1f1b",), micro_batches=(8,), link=0.01)[0]
    cp = p.critical
    covered = sum(cp.time_by("compute").values()) + sum(cp.time_by("transfer").values())
    assert covered == pytest.approx(cp.end - cp.start) and cp.end - cp.start == pytest.approx(p.step_time)
    assert _contiguous(cp)
    assert p.critical.relieve().startswith("stage 2") and "stage 2" in p.explain()
    assert max(cp.time_by("compute"), key=cp.time_by("compute").get) == 2


def test_critical_path_names_a_slow_link() -> None:
    sim = simulate(one_f_one_b(2, 2), 1.0, 2.0, transfer_cost=5.0)
    cp = critical_path(sim)
    assert cp.relieve().startswith("link 0→1") and _contiguous(cp)
    # every hop between devices on the path is one 5 s transfer
    assert cp.time_by("transfer")[0] == pytest.approx(5.0 * (len(cp.jobs) - 1 - sum(
        sim.compiled.worker[a] == sim.compiled.worker[b] for a, b in zip(cp.jobs, cp.jobs[1:]))))
    assert sum(cp.time_by("compute").values()) + cp.time_by("transfer")[0] == pytest.approx(sim.makespan)


def _alpha_beta(alpha: float, beta: float) -> Any:
    """A communication model of today's simulator: α + n/β seconds per message across each boundary."""
    return lambda nbytes: {"transfer_cost": [alpha + n / beta for n in nbytes]}


def test_link_bytes_move_the_cut() -> None:
    # every cut is expensive but one: with a byte-priced link the planner cuts there
    bl = Blocks([1.0] * 6, [2.0] * 6, output_bytes=[1e6, 1e6, 10.0, 1e6, 1e6, 0.0])
    got = plan(bl, 2, global_batch=4, schedules=("1f1b",), micro_batches=(4,), link=_alpha_beta(0.0, 1e5))
    assert list(got[0].sizes) == [3, 3]
    skewed = Blocks([1.0] * 6, [2.0] * 6, output_bytes=[1e6, 1e6, 1e6, 10.0, 1e6, 0.0])
    assert list(plan(skewed, 2, global_batch=4, schedules=("1f1b",), micro_batches=(4,),
                     link=_alpha_beta(0.0, 1e5))[0].sizes) == [4, 2]


def test_a_link_model_prices_bytes_and_reduces_to_transfer_cost() -> None:
    # the simulator's link model on every boundary: bytes move the cut as the α + n/β model does ...
    for bytes_, sizes in (([1e6, 1e6, 10.0, 1e6, 1e6, 0.0], [3, 3]), ([1e6, 1e6, 1e6, 10.0, 1e6, 0.0], [4, 2])):
        got = plan(Blocks([1.0] * 6, [2.0] * 6, output_bytes=bytes_), 2, global_batch=4, schedules=("1f1b",),
                   micro_batches=(4,), link=Link(0.0, 1e5))
        assert list(got[0].sizes) == sizes
    # ... and with β = ∞ it is transfer_cost = α: the same plans, step times equal
    bl = _random_blocks(3, 7)
    kw: dict[str, Any] = {"global_batch": 8, "schedules": ("gpipe", "1f1b", "zb_h1"), "micro_batches": (4, 8)}
    a, b = plan(bl, 3, link=Link(latency=0.3), **kw), plan(bl, 3, link=0.3, **kw)
    assert [(p.schedule, p.M, p.sizes) for p in a] == [(p.schedule, p.M, p.sizes) for p in b]
    assert [p.step_time for p in a] == [p.step_time for p in b]


def test_a_given_partition_is_scored_as_brute_force_scores_it() -> None:
    bl = _random_blocks(6, 7)
    got = plan(bl, 3, global_batch=12, link=0.1, schedules=("1f1b", "zb_v"), micro_batches=(6,), partition=(3, 2, 2))
    assert [p.schedule for p in got] == ["1f1b"] and got[0].sizes == (3, 2, 2) and got.exact
    assert "zb_v M=6" in got.skipped and "6 stages, the partition has 3" in got.skipped["zb_v M=6"]
    c = _stage(bl, (3, 2, 2), 12 / 6 / bl.batch)
    kw = dict(f_cost=c["f"], b_cost=c["b"], u_cost=c["u"], i_cost=c["i"], w_cost=c["w"], transfer_cost=0.1)
    want = simulate(one_f_one_b(3, 6, 3), **kw).makespan - simulate(one_f_one_b(3, 6, 2), **kw).makespan
    assert got[0].step_time == pytest.approx(want)
    with pytest.raises(ValueError, match=r"partition=\[3, 3\] must be positive block counts summing to 7"):
        plan(bl, 3, global_batch=12, partition=(3, 3))


def test_steps_to_target_ranks_time_to_target() -> None:
    bl = _random_blocks(5, 8)
    fast = plan(bl, 4, global_batch=16, schedules=("1f1b", "pipedream"), micro_batches=(4,))
    assert fast[0].schedule == "pipedream"  # no flush
    slow = plan(bl, 4, global_batch=16, schedules=("1f1b", "pipedream"), micro_batches=(4,),
                steps_to_target={("1f1b", "sequential"): 100, ("pipedream", "stashing"): 200})
    assert slow[0].schedule == "1f1b" and slow[0].objective == pytest.approx(100 * slow[0].step_time)
    with pytest.raises(ValueError, match=r"no entry for \('pipedream', 'stashing'\)"):
        plan(bl, 4, global_batch=16, schedules=("pipedream",), steps_to_target={})


def test_recompute_fits_a_cap_nothing_else_fits() -> None:
    bl = Blocks([1.0] * 4, [2.0] * 4, activation_bytes=[1000] * 4, output_bytes=[10] * 4)
    least = (r"no plan fits memory=1000 bytes per device: the least any plan searched needs is 6020 \(1f1b M=2 "
             r"sequential, stages \[1, 3\]; device 1: \{'activations': 6000, 'receive': 20")
    with pytest.raises(ValueError, match=least):
        plan(bl, 2, 1000, global_batch=4, schedules=("1f1b",), micro_batches=(2,))
    got = plan(bl, 2, 1000, global_batch=4, schedules=("1f1b",), micro_batches=(2,), recompute=(False, True))
    assert got[0].recompute and all(max(p.peak_memory) <= 1000 for p in got)


@pytest.mark.parametrize("kwargs, match", [
    ({"devices": 5}, r"devices=5: the model has 4 blocks and every device needs one; use an int from 1 to 4"),
    ({"global_batch": 0}, r"global_batch=0: samples per step; use an int from 1"),
    ({"schedules": ("bogus",)}, "unknown schedule 'bogus'"),
    ({"schedules": ("zb_h2",), "micro_batches": (2,)}, r"no schedule × M to plan: zb_h2 M=2: zb_h2 needs M >= 2D-1"),
    ({"micro_batches": (3,)}, "global_batch=4 is not a multiple of M=3"),
])
def test_errors_name_the_constraint(kwargs: dict[str, Any], match: str) -> None:
    args = {"devices": 2, "global_batch": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        plan(Blocks([1.0] * 4, [2.0] * 4), args.pop("devices"), **args)


def test_blocks_are_checked() -> None:
    with pytest.raises(ValueError, match=r"b must be 2 finite values > 0"):
        Blocks([1.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"activation_bytes must be 2 finite values >= 0"):
        Blocks([1.0, 1.0], [1.0, 1.0], activation_bytes=[1])
    assert Blocks([1.0], [2.0]).i == (1.0,) and set(SCHEDULES) >= {s.partition(":")[0] for s in ALL}


def test_profiled_blocks_plan_a_user_model() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x, y = torch.randn(4, 16), torch.randint(0, 10, (4,))
    bl = Blocks.measure(model, x, y, reps=2, warmup=1)
    prof = profile_stages(list(model), x, y, reps=1, warmup=0)
    assert len(bl.f) == 5 and list(bl.activation_bytes) == prof.activation_bytes and bl.batch == 4
    got = plan(bl, 2, global_batch=16, schedules=("1f1b", "gpipe"), micro_batches=(2, 4))
    assert got[0].objective == min(p.objective for p in got) and sum(got[0].sizes) == 5
