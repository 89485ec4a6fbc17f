"""The split backward (I then W) in the pipeline core: version table, emulator, runtime, checkpoints.

The schedules here are made by splitting the B jobs of existing schedules (``split_of``), with W passes
deferred past later forwards, so that the core is tested apart from the zero-bubble builders; the builders'
own exactness tests use the same checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pipelab.distributed import spawn
from pipelab.emulator import Emulator, train_plain
from pipelab.runtime import PipelineRuntime, load_checkpoint, save_checkpoint
from pipelab.schedules import Action, Schedule, gpipe, interleaved_1f1b, one_f_one_b, pipedream
from pipelab.simulator import simulate

TOL = 1e-10


def split_of(s: Schedule, defer: int = 0) -> Schedule:
    """``s`` with every B(k, t, j) replaced by I(k, t, j), and W(k, t, j) placed after the worker's next
    ``defer`` forwards (before U(k, t) at the latest)."""
    progs = []
    for prog in s.programs:
        out: list[Action] = []
        pending: list[list[Any]] = []  # [W action, forwards still to pass]
        for a in prog:
            if a.op == "U":
                out += [w for w, _ in pending if w.stage == a.stage and w.step == a.step]
                pending = [p for p in pending if not (p[0].stage == a.stage and p[0].step == a.step)]
                out.append(a)
                continue
            out.append(a._replace(op="I") if a.op == "B" else a)
            if a.op == "F":
                for p in pending:
                    p[1] -= 1
                out += [w for w, n in pending if n < 0]
                pending = [p for p in pending if p[1] >= 0]
            if a.op == "B":
                if defer == 0:
                    out.append(a._replace(op="W"))
                else:
                    pending.append([a._replace(op="W"), defer - 1])
        out += [w for w, _ in pending]
        progs.append(out)
    return Schedule(f"{s.name} split(defer={defer})", progs, s.D, s.M, s.steps, s.weight_holders, s.sync_lag,
                    s.weight_rule)


def mlp(depth: int = 4, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(6 if i == 0 else 8, 8), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(8, 4)).double()


def batches(steps: int, n: int = 8, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (n,), generator=g))
            for _ in range(steps)]


def sgdm(ps: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def adam(ps: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(ps, lr=0.01)


# ------------------------------------------------------------------------------------ version table


def hand_schedule() -> Schedule:
    """Asynchronous, D=2, M=1, 3 steps; worker 0 defers W(0, t) past the forward of step t+2 (hand-written)."""
    F, I, W, U = (lambda k, t, op=op: Action(op, k, t, -1 if op == "U" else 0) for op in "FIWU")  # noqa: E741
    w0 = [F(0, 0), F(0, 1), I(0, 0), F(0, 2), W(0, 0), U(0, 0), I(0, 1), W(0, 1), U(0, 1), I(0, 2), W(0, 2), U(0, 2)]
    w1 = [F(1, 0), I(1, 0), W(1, 0), U(1, 0), F(1, 1), I(1, 1), W(1, 1), U(1, 1), F(1, 2), I(1, 2), W(1, 2), U(1, 2)]
    return Schedule("hand-split", (tuple(w0), tuple(w1)), D=2, M=1, steps=3, sync_lag=None)


def test_version_table_of_a_split_schedule_by_hand() -> None:
    # one stage per worker: a job's version is the number of its stage's updates earlier in its worker's program
    vt = simulate(hand_schedule()).version_table
    assert vt.split
    assert vt.forward[:, :, 0].tolist() == [[0, 0, 0], [0, 1, 2]]
    assert vt.backward[:, :, 0].tolist() == [[0, 1, 2], [0, 1, 2]]      # at I
    assert vt.weight_pass[:, :, 0].tolist() == [[0, 1, 2], [0, 1, 2]]   # at W
    assert vt.update_version.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert vt.staleness("F")[:, :, 0].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert [vt.version(("I", 0, 2, 0)), vt.version(("W", 0, 0, 0)), vt.version(("B", 0, 1, 0))] == [2, 0, 1]
    assert vt.jobs("B")[:2] == [("B", 1, 0, 0), ("B", 0, 0, 0)] and len(vt.jobs("W")) == 6
    # the fused asynchronous 1F1B runs F(0, 2) after U(0, 0): deferring W(0, 0) past it adds one to its staleness
    fused = simulate(pipedream(D=2, M=1, steps=3)).version_table
    assert fused.staleness("F")[0, :, 0].tolist() == [0, 1, 1]


# ------------------------------------------------------------------------------------ emulator


@pytest.mark.parametrize("base", ["gpipe", "1f1b", "interleaved"])
@pytest.mark.parametrize("defer", [0, 1, 3])
def test_flushed_split_schedules_equal_plain_training(base: str, defer: int) -> None:
    fused = {"gpipe": gpipe(4, 4, 3), "1f1b": one_f_one_b(4, 4, 3), "interleaved": interleaved_1f1b(2, 2, 4, 3)}[base]
    s = split_of(fused, defer)
    data = batches(3)
    for opt in (sgdm, adam):
        ref = mlp()
        plain = train_plain(ref, optimizer=opt, batches=data)
        model = mlp()
        res = Emulator(model, schedule=s, policy="1f1b", optimizer=opt).run(data)
        assert max(abs(a - b) for a, b in zip(res.losses, plain)) <= TOL
        for a, b in zip(model.parameters(), ref.parameters()):
            assert (a - b).abs().max().item() <= TOL
        # and bitwise what the fused B computes: I + W is the same graph and the same operations
        model_fused = mlp()
        Emulator(model_fused, schedule=fused, policy="1f1b", optimizer=opt).run(data)
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model_fused.parameters()))


def test_split_by_hand_with_an_update_between_i_and_w() -> None:
    """One stage, SGD: micro-batch (1, 0)'s I runs at version 0 and its W after U(0, 0); the gradient of that
    micro-batch must be taken at version 0 (I's graph), the other one at version 1 (the vanilla rule)."""
    F, I, W, U = (lambda t, j, op=op: Action(op, 0, t, j) for op in "FIWU")  # noqa: E741
    prog = [F(0, 0), I(0, 0), F(0, 1), I(0, 1), F(1, 0), I(1, 0), W(0, 0), W(0, 1), U(0, -1), W(1, 0), F(1, 1),
            I(1, 1), W(1, 1), U(1, -1)]
    s = Schedule("one-stage", (tuple(prog),), D=1, M=2, steps=2, sync_lag=None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2)).double()
    W0 = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (4,), generator=g))
            for _ in range(2)]
    lr = 0.3

    def grad(weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        w = [t.clone().requires_grad_(True) for t in weights]
        loss = nn.functional.cross_entropy(x @ w[0].T + w[1], y) / 2  # micro-batch loss / M
        return list(torch.autograd.grad(loss, w))

    (x0, y0), (x1, y1) = data
    g0 = [a + b for a, b in zip(grad(W0, x0[:2], y0[:2]), grad(W0, x0[2:], y0[2:]))]
    W1 = [w - lr * d for w, d in zip(W0, g0)]
    g1 = [a + b for a, b in zip(grad(W0, x1[:2], y1[:2]), grad(W1, x1[2:], y1[2:]))]
    W2 = [w - lr * d for w, d in zip(W1, g1)]

    emu = Emulator(model, schedule=s, policy="vanilla", optimizer=lambda ps: torch.optim.SGD(ps, lr=lr))
    res = emu.run(data)
    assert res.current[("I", 0, 1, 0)] == 0 and res.current[("W", 0, 1, 0)] == 1
    for a, b in zip(model.parameters(), W2):
        assert (a - b).abs().max().item() <= 1e-14
    assert emu.capacity == [2]  # version 0 is kept for W(0, 1, 0) after U(0, 0) made version 1


@pytest.mark.parametrize("policy", ["vanilla", "stashing", "pipeoptim", "spectrain", "pipemare"])
def test_policies_run_on_an_asynchronous_split_schedule(policy: str) -> None:
    s = split_of(pipedream(D=4, M=2, steps=6), defer=1)
    model = mlp()
    emu = Emulator(model, schedule=s, policy=policy, optimizer=sgdm if policy == "spectrain" else adam)
    res = emu.run(batches(6))
    vt = emu.table
    for (op, k, t, j), v in res.current.items():  # what ran is what the version table says
        assert v == vt.version((op, k, t, j))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    if policy == "stashing":  # every backward at its forward's version
        assert all(res.used[("B", k, t, j)] == res.used[("F", k, t, j)] for (_, k, t, j) in vt.jobs("F"))


def test_driver_memory_holds_the_input_until_w() -> None:
    # W deferred past later forwards keeps more stage inputs alive than W right after its I
    s1 = split_of(one_f_one_b(2, 4, 1), defer=0)
    s3 = split_of(one_f_one_b(2, 4, 1), defer=3)
    peaks = []
    for sch in (s1, s3):
        emu = Emulator(mlp(), schedule=sch, policy="1f1b", optimizer=sgdm)
        peaks.append(emu.run(batches(1)).extra["activation_peak"])
    assert peaks[1] > peaks[0]


# ------------------------------------------------------------------------------------ runtime


CASES = [dict(base="1f1b", D=2, M=4, steps=3, defer=2, policy="1f1b"),
         dict(base="interleaved", D=4, M=4, steps=2, defer=1, policy="1f1b"),
         dict(base="pipedream", D=2, M=2, steps=6, defer=1, policy="stashing"),
         dict(base="pipedream", D=2, M=2, steps=6, defer=1, policy="pipeoptim"),
         dict(base="hand", D=2, M=1, steps=3, defer=0, policy="vanilla")]


def case_schedule(case: dict, world: int) -> Schedule:
    b, D, M, steps = case["base"], case["D"], case["M"], case["steps"]
    if b == "hand":
        return hand_schedule()
    fused = {"1f1b": lambda: one_f_one_b(D, M, steps), "pipedream": lambda: pipedream(D, M, steps),
             "gpipe": lambda: gpipe(D, M, steps), "interleaved": lambda: interleaved_1f1b(world, D // world, M, steps)}
    return split_of(fused[b](), case["defer"])


def _run(rank: int, world: int, cases: list[dict], ckpt: str | None = None, mode: str = "full") -> list:
    out = []
    for case in cases:
        rt = PipelineRuntime(mlp(case["D"]), schedule=case_schedule(case, world), policy=case["policy"],
                             optimizer=adam)
        if mode == "resume":
            load_checkpoint(rt, ckpt)
        res = rt.run(batches(case["steps"]), stop_at_step=case.get("stop") if mode == "stop" else None)
        if mode == "stop":
            save_checkpoint(rt, ckpt)
        out.append(res)
    return out


def _check(case: dict, per_rank: list, world: int) -> None:
    model = mlp(case["D"])
    emu = Emulator(model, schedule=case_schedule(case, world), policy=case["policy"], optimizer=adam)
    res = emu.run(batches(case["steps"]))
    weights = emu.weights()
    current: dict = {}
    for r in per_rank:
        current.update(r.current)
        for k, W in r.weights.items():
            assert all(torch.equal(a, b) for a, b in zip(W, weights[k])), (case, k)
        assert r.losses == res.losses
    assert current == res.current


@pytest.mark.slow
def test_runtime_runs_split_schedules_like_the_emulator() -> None:
    out = spawn(_run, 2, (CASES,))
    for i, case in enumerate(CASES):
        _check(case, [out[r][i] for r in range(2)], 2)
    four = [dict(base="gpipe", D=4, M=4, steps=2, defer=2, policy="gpipe"),
            dict(base="pipedream", D=4, M=2, steps=6, defer=1, policy="vanilla")]
    out = spawn(_run, 4, (four,))
    for i, case in enumerate(four):
        _check(case, [out[r][i] for r in range(4)], 4)


@pytest.mark.slow
def test_checkpoint_with_w_passes_pending_resumes_identically(tmp_path: Path) -> None:
    case = dict(base="pipedream", D=2, M=2, steps=6, defer=1, policy="pipeoptim", stop=3)
    sched = case_schedule(case, 2)
    from pipelab.runtime import consistent_cut

    cut, _ = consistent_cut(sched, 3)
    done = [{(a.op, a.stage, a.step, a.micro) for a in p[:c]} for p, c in zip(sched.programs, cut)]
    assert any(("I",) + j[1:] in d and ("W",) + j[1:] not in d for d in done for j in d), "no W pending at the cut"
    ckpt = str(tmp_path / "ckpt")
    full = spawn(_run, 2, ([case],))
    spawn(_run, 2, ([case], ckpt, "stop"))
    again = spawn(_run, 2, ([case], ckpt, "resume"))
    for r in range(2):
        a, b = full[r][0], again[r][0]
        for k in a.weights:
            assert all(torch.equal(x, y) for x, y in zip(a.weights[k], b.weights[k]))
        assert a.losses == b.losses and a.current == b.current


def test_fused_and_split_schedule_share_the_policy_keys() -> None:
    # policies decide a backward by its key ("B", k, t, j) on both kinds of table
    s = split_of(pipedream(D=3, M=1, steps=5), defer=1)
    vt, fused = simulate(s).version_table, simulate(pipedream(D=3, M=1, steps=5)).version_table
    assert sorted(vt.jobs("B")) == sorted(fused.jobs("B"))
    assert (vt.backward == vt.weight_pass).all() == (not (vt.weight_pass > vt.backward).any())
