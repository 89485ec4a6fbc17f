"""Mixed precision (pipelab.precision) on CPU: bf16/fp16 autocast with fp32 masters in the emulator and the runtime.

References: plain micro-batched training under ``torch.autocast`` with ``torch.amp.GradScaler``
(:func:`pipelab.emulator.train_plain`), the fp32 run, and the emulator itself (for the runtime).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch

from pipelab import LossScaling, PipelineSpec, Precision
from pipelab.distributed import spawn
from pipelab.emulator import Emulator, train_plain
from pipelab.pipeline import build_pipeline
from pipelab.pipeline.loss_scale import LossScaler, defer_updates
from pipelab.policies import POLICIES, make_policy
from pipelab.precision import as_precision, check_precision, weight_memory
from pipelab.runtime import PipelineRuntime, load_checkpoint, save_checkpoint
from pipelab.schedules import gpipe, interleaved_1f1b, one_f_one_b, pipedream, pipedream_2bw, zb_h1
from pipelab.simulator import simulate
from pipelab.studies.models import deep_mlp

D, M, BATCH = 3, 2, 12
SGDM: Callable[[Any], torch.optim.Optimizer] = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)  # noqa: E731
ADAM: Callable[[Any], torch.optim.Optimizer] = lambda ps: torch.optim.Adam(ps, lr=0.01)  # noqa: E731
NADAM: Callable[[Any], torch.optim.Optimizer] = lambda ps: torch.optim.NAdam(ps, lr=0.005, betas=(0.99, 0.999))  # noqa: E731


def model(seed: int = 0, width: int = 16, first: float = 1.0, depth: int = D) -> torch.nn.Sequential:
    """The test MLP; ``first`` scales stage 0's input-layer weights (a small one lets large inputs overflow only
    that layer's fp16 weight gradient)."""
    torch.manual_seed(seed)
    m = deep_mlp(in_features=6, width=width, depth=depth, num_classes=4)
    with torch.no_grad():
        m[0][1].weight.mul_(first)
    return m


def data(steps: int, seed: int = 1, scale: dict[int, float] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = [(torch.randn(BATCH, 6, generator=g), torch.randint(0, 4, (BATCH,), generator=g)) for _ in range(steps)]
    return [(x * (scale or {}).get(t, 1.0), y) for t, (x, y) in enumerate(out)]


def flat(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def emulate(prec: Any, schedule: Any, policy: str = "gpipe", opt: Any = SGDM, steps: int = 6,
            batches: Any = None, seed: int = 0) -> tuple[torch.nn.Sequential, Any, Emulator]:
    m = model(seed)
    emu = Emulator(m, D=D, schedule=schedule, policy=policy, optimizer=opt, precision=prec)
    res = emu.run(batches if batches is not None else data(steps))
    return m, res, emu


# ----------------------------------------------------------------------------------- (a) flushed == plain autocast

#: builder and micro-batches (ZB-H1 needs M >= D)
FLUSHED: dict[str, tuple[Callable[..., Any], int]] = {"gpipe": (gpipe, M), "1f1b": (one_f_one_b, M),
                                                      "zb_h1": (zb_h1, D)}


@pytest.mark.parametrize("prec", ["bf16", "fp16"])
@pytest.mark.parametrize("opt", [SGDM, ADAM], ids=["sgdm", "adam"])
@pytest.mark.parametrize("kind", list(FLUSHED))
def test_flushed_schedule_equals_plain_autocast_training_exactly(kind: str, opt: Any, prec: str) -> None:
    """GPipe, 1F1B and ZB-H1 (split backward) in bf16/fp16 = micro-batched plain training under torch.autocast with
    fp32 masters (fp16: torch.amp.GradScaler), bit for bit: weights and every loss."""
    steps, (builder, micro) = 6, FLUSHED[kind]
    m, res, _ = emulate(prec, builder(D, micro, steps), "gpipe" if kind != "1f1b" else "1f1b", opt, steps)
    ref = model()
    losses = train_plain(ref, D=D, optimizer=opt, batches=data(steps), micro_batches=micro, precision=prec)
    assert torch.equal(flat(m), flat(ref))
    assert res.losses == losses
    # and it is not fp32 training: autocast changed the arithmetic
    ref32 = model()
    train_plain(ref32, D=D, optimizer=opt, batches=data(steps), micro_batches=micro)
    assert not torch.equal(flat(m), flat(ref32))


@pytest.mark.parametrize("prec", ["bf16", "fp16"])
def test_interleaved_equals_plain(prec: str) -> None:
    """Interleaved 1F1B (all stages on one worker) in bf16/fp16: still plain autocast training exactly."""
    m, _, _ = emulate(prec, interleaved_1f1b(1, D, M, 4), "1f1b", SGDM, 4)
    ref = model()
    train_plain(ref, D=D, optimizer=SGDM, batches=data(4), micro_batches=M, precision=prec)
    assert torch.equal(flat(m), flat(ref))


def test_activations_cross_in_the_compute_dtype() -> None:
    """A stage whose output autocast leaves in fp32 (a LayerNorm of the fp32 input) still hands it on in bf16, and
    the next stage's input gradient comes back in bf16."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.LayerNorm(6), torch.nn.Linear(6, 4))
    seen: list[torch.dtype] = []
    plan = build_pipeline(net, schedule=gpipe(2, 1, 1), policy="gpipe", optimizer=SGDM, precision="bf16")
    st0 = plan.stages[0]
    st0.module.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    x = torch.randn(4, 6)
    out = st0.forward(0, 0, x)
    assert out.dtype == torch.bfloat16 and seen == [torch.float32]  # LayerNorm ran in fp32, the hand-over is bf16
    st1 = plan.stages[1]
    st1.forward(0, 0, out, torch.randint(0, 4, (4,)))
    g = st1.backward(0, 0, None)
    assert g is not None and g.dtype == torch.bfloat16
    st0.backward(0, 0, g)
    assert all(a.dtype == torch.float32 for a in st0.acc[0])  # weight gradients of the fp32 masters


# ----------------------------------------------------------------------------------- (b) bf16 tracks fp32

def _arm(name: str, steps: int) -> tuple[Any, Any]:
    """The policy's own schedule family and an optimizer it serves (SGD momentum, else NAdam)."""
    family = make_policy(name).schedule
    sched = {"gpipe": gpipe(D, M, steps), "1f1b": one_f_one_b(D, M, steps), "2bw": pipedream_2bw(D, D, steps),
             "pipedream": pipedream(D, 1, steps), "sequential": gpipe(D, M, steps)}[family]
    for opt in (SGDM, NADAM):
        try:
            build_pipeline(model(), schedule=sched, policy=name, optimizer=opt)
        except ValueError:
            continue
        return sched, opt
    raise AssertionError(f"no optimizer for {name}")


#: measured over 30 steps on this 3-stage MLP (width 16): the bf16 trajectory's deviation from fp32 relative to
#: the distance the fp32 weights moved is at most 0.088 (PipeOptim, SGD momentum lr 0.05), the largest loss
#: difference 1.4e-3 (vanilla); the bounds leave about 2x margin; the loss bound is bf16's unit 2^-8.
REL_TRAJECTORY, LOSS_TOL, STEPS_B = 0.2, 2.0 ** -8, 30


@pytest.mark.parametrize("name", list(POLICIES))
def test_bf16_tracks_fp32_for_every_policy(name: str) -> None:
    sched, opt = _arm(name, STEPS_B)
    w0 = flat(model())
    batches = data(STEPS_B)
    m32, r32, _ = emulate("fp32", sched, name, opt, batches=batches)
    m16, r16, _ = emulate("bf16", sched, name, opt, batches=batches)
    moved = (flat(m32) - w0).norm()
    dev = (flat(m16) - flat(m32)).norm()
    assert 1e-5 < float(dev / moved) <= REL_TRAJECTORY, float(dev / moved)  # bf16 was on, and it stays close
    assert max(abs(a - b) for a, b in zip(r16.losses, r32.losses)) <= LOSS_TOL


@pytest.mark.parametrize("name,sched", [("stashing", pipedream(D, 1, 12)), ("2bw", pipedream_2bw(D, D, 12)),
                                        ("spectrain", pipedream(D, 1, 12)), ("vanilla", pipedream(D, 1, 12))])
def test_half_precision_versions_change_nothing_for_linear_layers(name: str, sched: Any) -> None:
    """Stored/predicted copies in bf16 (2BW's working copy): autocast rounds a Linear's fp32 weight to the same bf16
    values, so an MLP's run is bit for bit the "master" one, with half the bytes per copy."""
    a, ra, ea = emulate("bf16", sched, name, SGDM, 12)
    b, rb, eb = emulate(Precision("bf16", versions="compute"), sched, name, SGDM, 12)
    assert torch.equal(flat(a), flat(b)) and ra.losses == rb.losses
    for k in range(D):
        for key in ("versions", "predicted"):
            half, full = eb.plan.weight_bytes[k][key], ea.plan.weight_bytes[k][key]
            cap = ea.capacity[k]
            if key == "versions" and cap > 1:
                assert (full, half) == ((cap - 1) * ea.plan.weight_bytes[k]["masters"],
                                        cap * ea.plan.weight_bytes[k]["masters"] // 2)
            elif key == "predicted":
                assert half * 2 == full
    stored = [w for v in eb.stages[0].ring.versions() for w in eb.stages[0].ring.get(v)]
    if eb.capacity[0] > 1:
        assert stored and all(w.dtype == torch.bfloat16 for w in stored)


def test_weight_memory_closed_form() -> None:
    """weight_memory against its formula: P = 4·n master bytes, c = 2·n for bf16 copies."""
    ps = [torch.zeros(10, 3), torch.zeros(10)]
    n = 40
    opt = torch.optim.Adam([torch.nn.Parameter(p.clone()) for p in ps])
    assert weight_memory(Precision("bf16"), ps, 3, 1) == {"masters": 4 * n, "versions": 2 * 4 * n,
                                                         "predicted": 4 * n, "optimizer_state": 0,
                                                         "total": 4 * 4 * n}
    half = weight_memory(Precision("bf16", versions="compute"), ps, 3, 2, opt)
    adam = 2 * 4 * n + 2 * 4  # exp_avg and exp_avg_sq in fp32, once stepped, and each tensor's fp32 step counter
    assert half == {"masters": 4 * n, "versions": 3 * 2 * n, "predicted": 2 * 2 * n, "optimizer_state": adam,
                    "total": 4 * n + 6 * n + 4 * n + adam}
    assert weight_memory(Precision("bf16", versions="compute"), ps, 1, 0)["versions"] == 0  # flushed: no copy


# ----------------------------------------------------------------------------------- (c) fp16 loss scaling

def test_scaler_follows_torch_gradscaler() -> None:
    """The scale sequence and skip decisions equal torch.amp.GradScaler's on the same overflow pattern."""
    scaling = LossScaling(init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.25, growth_interval=3)
    ours = LossScaler(scaling, D=1)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.25, growth_interval=3)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.0)
    pattern = [False, True, False, False, False, False, True, True, False, False, False, False]
    for t, inf in enumerate(pattern):
        ex = mock.Mock(k=0, events=[("U", t, -1)], position=0, params=[p],
                       acc={t: [torch.tensor([float("inf") if inf else 1.0, 0.0])]})
        ours.members = [ex]
        skipped, used = ours.decide(t)
        assert used == ref.get_scale() and skipped == inf
        ref.scale(torch.ones(()))  # GradScaler creates its scale lazily
        p.grad = (ref.get_scale() * torch.tensor([float("inf") if inf else 1.0, 0.0]))
        ref.step(opt)
        ref.update()
    assert ours.scale == ref.get_scale()


def test_overflow_skips_the_step_on_every_stage_and_backs_off() -> None:
    """Step 2 gets inputs 100 times larger (stage 0's input weights 100 times smaller, so activations stay normal):
    with S = 2^16 only stage 0's fp16 weight gradient overflows; step 2 is skipped on every stage (version 3 =
    version 2 everywhere), S halves, and the whole run equals plain training with torch.amp.GradScaler and one
    skip decision for all optimizers."""
    steps, big = 5, {2: 1e2}
    batches = data(steps, scale=big)
    snaps: dict[int, list[tuple[torch.Tensor, ...]]] = {}
    m = model(first=1e-2)
    emu = Emulator(m, D=D, schedule=gpipe(D, M, steps), policy="gpipe", optimizer=SGDM, precision="fp16")
    flags: dict[int, list[bool]] = {}
    original = emu.plan.scaler.decide  # type: ignore[union-attr]

    def spy(t: int) -> tuple[bool, float]:
        if t not in flags:
            flags[t] = [not all(bool(torch.isfinite(g).all()) for g in st.acc[t]) for st in emu.stages]
        return original(t)

    emu.plan.scaler.decide = spy  # type: ignore[union-attr,method-assign]
    emu.run(batches, snapshot_every=1, on_snapshot=lambda v, W: snaps.__setitem__(v, [tuple(w.clone() for w in s)
                                                                                     for s in W]))
    history = emu.plan.scaler.history  # type: ignore[union-attr]
    assert [h[2] for h in history] == [False, False, True, False, False]
    assert [h[1] for h in history] == [2.0 ** 16] * 3 + [2.0 ** 15] * 2
    assert flags[2] == [True, False, False]  # stage-local decisions would have stepped stages 1 and 2
    for k in range(D):
        assert all(torch.equal(a, b) for a, b in zip(snaps[3][k], snaps[2][k]))
        assert not all(torch.equal(a, b) for a, b in zip(snaps[4][k], snaps[3][k]))
    ref = model(first=1e-2)
    train_plain(ref, D=D, optimizer=SGDM, batches=batches, micro_batches=M, precision="fp16")
    assert torch.equal(flat(m), flat(ref))


#: measured over 20 steps: a power-of-two scale changes fp16 products only where the unscaled run's gradients
#: are subnormal (max weight difference 3.9e-7, losses equal); S = 1000 or 3 rounds every scaled product once
#: more (1.1e-4 and 5.3e-5).
POW2_TOL, ROUNDING_TOL = 2e-6, 1e-3


@pytest.mark.parametrize("scale", [2.0 ** 10, 2.0 ** 16, 1000.0, 3.0])
def test_scaled_run_without_overflow_equals_the_unscaled_one(scale: float) -> None:
    steps = 20
    unscaled = Precision("fp16", loss_scaling=LossScaling(init_scale=1.0, growth_factor=1.0))
    scaled = Precision("fp16", loss_scaling=LossScaling(init_scale=scale, growth_interval=10 ** 6))
    a, ra, _ = emulate(unscaled, gpipe(D, M, steps), steps=steps)
    b, rb, eb = emulate(scaled, gpipe(D, M, steps), steps=steps)
    assert not any(h[2] for h in eb.plan.scaler.history)  # type: ignore[union-attr]
    tol = POW2_TOL if scale in (2.0 ** 10, 2.0 ** 16) else ROUNDING_TOL
    assert (flat(a) - flat(b)).abs().max().item() <= tol
    assert max(abs(x - y) for x, y in zip(ra.losses, rb.losses)) <= tol


def test_fp16_updates_wait_for_the_flush() -> None:
    """defer_updates moves every U(k, t) after step t's last backward and keeps each stage's own event order."""
    order = list(simulate(one_f_one_b(D, M, 3)).version_table.order)
    out = defer_updates(order)
    assert sorted(out) == sorted(order)
    for k in range(D):
        assert [j for j in out if j[1] == k] == [j for j in order if j[1] == k]
    for t in range(3):
        flush = max(i for i, j in enumerate(out) if j[2] == t and j[0] in "BIW")
        assert all(i > flush for i, j in enumerate(out) if j[0] == "U" and j[2] == t)


def test_fp16_refused_on_an_asynchronous_schedule() -> None:
    with pytest.raises(ValueError, match="flushed schedule"):
        Emulator(model(), D=D, schedule=pipedream(D, 1, 4), policy="stashing", optimizer=SGDM, precision="fp16")


# ----------------------------------------------------------------------------------- (d) runtime == emulator

RT_CASES = [
    {"schedule": "gpipe", "policy": "gpipe", "precision": "bf16"},
    {"schedule": "pipedream", "policy": "stashing", "precision": "bf16"},
    {"schedule": "2bw", "policy": "spectrain", "precision": "bf16"},
    {"schedule": "gpipe", "policy": "gpipe", "precision": "fp16"},  # with an overflow at step 2: all-reduced skip
]
RT_STEPS = 5


def _rt_schedule(name: str) -> Any:
    return {"gpipe": gpipe(2, M, RT_STEPS), "pipedream": pipedream(2, 1, RT_STEPS),
            "2bw": pipedream_2bw(2, 2, RT_STEPS)}[name]


def _rt_model() -> torch.nn.Sequential:
    return model(first=1e-2, depth=2)


def _rt_run(rank: int, world: int, cases: list[dict]) -> list:
    out = []
    for case in cases:
        rt = PipelineRuntime(_rt_model(), schedule=_rt_schedule(case["schedule"]), policy=case["policy"],
                             optimizer=SGDM, precision=case["precision"])
        res = rt.run(data(RT_STEPS, scale={2: 1e2}))
        scaler = rt.plan.scaler
        out.append((res.weights, res.losses, None if scaler is None else (scaler.history, scaler.local)))
    return out


@pytest.mark.slow
def test_runtime_two_ranks_equal_the_emulator_in_half_precision() -> None:
    per_rank = spawn(_rt_run, 2, (RT_CASES,))
    for i, case in enumerate(RT_CASES):
        m = _rt_model()
        emu = Emulator(m, schedule=_rt_schedule(case["schedule"]), policy=case["policy"], optimizer=SGDM,
                       precision=case["precision"])
        res = emu.run(data(RT_STEPS, scale={2: 1e2}))
        for r in range(2):
            weights, losses, scaling = per_rank[r][i]
            assert all(torch.equal(a, b) for a, b in zip(weights[r], emu.weights()[r])), case
            assert losses == res.losses
            if case["precision"] == "fp16":
                history, local = scaling
                assert history == emu.plan.scaler.history  # type: ignore[union-attr]
                assert [h[2] for h in history] == [False, False, True, False, False]
                assert local[2] == (r == 0)  # only rank 0 overflowed; the all-reduce made rank 1 skip too


def _ckpt_phase(rank: int, world: int, path: str, mode: str) -> tuple:
    rt = PipelineRuntime(_rt_model(), schedule=gpipe(2, M, 6), policy="gpipe", optimizer=SGDM, precision="fp16")
    if mode == "resume":
        load_checkpoint(rt, path)
    res = rt.run(data(6, scale={2: 1e2}), stop_at_step=4 if mode == "stop" else None)
    if mode == "stop":
        save_checkpoint(rt, path)
    assert rt.plan.scaler is not None
    return res.weights, rt.plan.scaler.scale, rt.plan.scaler.history


@pytest.mark.slow
def test_runtime_checkpoint_keeps_the_loss_scale(tmp_path: Any) -> None:
    """Stop after step 4 (the scale backed off at step 2), save, resume in fresh processes: the same weights, scale
    and decisions as the uninterrupted fp16 run."""
    path = str(tmp_path / "ckpt")
    full = spawn(_ckpt_phase, 2, (path, "full"))
    spawn(_ckpt_phase, 2, (path, "stop"))
    again = spawn(_ckpt_phase, 2, (path, "resume"))
    for r in range(2):
        assert all(torch.equal(a, b) for a, b in zip(full[r][0][r], again[r][0][r]))
        assert full[r][1] == again[r][1] == 2.0 ** 15 and full[r][2] == again[r][2]


# ----------------------------------------------------------------------------------- (e) fp32 default unchanged

def test_fp32_default_is_the_spec_default_and_bitwise_unchanged() -> None:
    spec = PipelineSpec(schedule=gpipe(D, M, 3), policy="gpipe", optimizer=SGDM)
    assert spec.precision == Precision() and not spec.precision.enabled
    a, ra, _ = emulate(None, pipedream(D, 1, 6), "stashing")
    b, rb, _ = emulate("fp32", pipedream(D, 1, 6), "stashing")
    assert torch.equal(flat(a), flat(b)) and ra.losses == rb.losses
    ref = model().double()
    m = model().double()
    d64 = [(x.double(), y) for x, y in data(4)]
    Emulator(m, D=D, schedule=gpipe(D, M, 4), policy="gpipe", optimizer=SGDM, precision="fp32").run(d64)
    train_plain(ref, D=D, optimizer=SGDM, batches=d64)
    assert (flat(m) - flat(ref)).abs().max().item() <= 1e-12


# ----------------------------------------------------------------------------------- (f) errors

def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp8'.*fp32, bf16, fp16"):
        Precision("fp8")
    with pytest.raises(ValueError, match="unknown precision"):
        PipelineSpec(schedule=gpipe(D, M, 3), policy="gpipe", optimizer=SGDM, precision="int8")
    with pytest.raises(TypeError, match="precision must be"):
        as_precision(16)
    with pytest.raises(ValueError, match="unknown precision"):
        as_precision(torch.float64)
    assert Precision(torch.bfloat16) == Precision("bf16") and Precision(torch.float32) == Precision()
    with pytest.raises(ValueError, match="versions must be one of"):
        Precision("bf16", versions="fp8")
    with pytest.raises(ValueError, match="loss scaling is for fp16"):
        Precision("bf16", loss_scaling=LossScaling())
    with pytest.raises(TypeError, match="LossScaling"):
        Precision("fp16", loss_scaling=2.0 ** 16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="growth_factor"):
        LossScaling(growth_factor=0.5)
    with pytest.raises(ValueError, match="fp32 master weights.*float64"):
        Emulator(model().double(), D=D, schedule=gpipe(D, M, 3), policy="gpipe", optimizer=SGDM, precision="bf16")
    with mock.patch("torch.cuda.is_bf16_supported", return_value=False):
        with pytest.raises(ValueError, match="bfloat16 support"):
            check_precision("bf16", "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="autocast cannot run"):
            check_precision("fp16", "cuda")
    assert check_precision("bf16", "cpu").dtype == torch.bfloat16
    assert check_precision("fp16", "cpu").dtype == torch.float16  # CPU autocast runs fp16 in this torch


def test_partial_plan_needs_torch_distributed_for_the_skip_decision() -> None:
    plan = build_pipeline(model(), schedule=gpipe(D, 1, 1), policy="gpipe", optimizer=SGDM, precision="fp16",
                          only=[0])
    assert plan.scaler is not None
    x = torch.randn(4, 6)
    st = plan.stages[0]
    st.forward(0, 0, x)
    st.backward(0, 0, torch.ones(4, 16, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="initialise torch.distributed"):
        st.update(0)


def test_spec_round_trip_keeps_the_precision() -> None:
    spec = PipelineSpec(schedule=gpipe(D, M, 3), policy="gpipe", optimizer=SGDM, precision=torch.bfloat16)
    assert PipelineSpec(**spec.fields()) == spec and spec.precision == Precision("bf16")
    assert copy.deepcopy(spec.precision) == Precision("bf16")
