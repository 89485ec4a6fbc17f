"""Exactness of the pipeline emulator (float64): flushed schedules, D=1, stashing recurrence, oracle."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from pipelab.emulator import Emulator, train_plain
from pipelab.optim import optimizer_factory
from pipelab.partition import split
from pipelab.policies import PipeMarePolicy, available_policies, make_policy
from pipelab.schedules import gpipe, naive, one_f_one_b, pipedream, pipedream_2bw
from pipelab.studies.models import deep_mlp, small_cnn

TOL = 1e-10

OPTIMIZERS = {
    "nesterov": optimizer_factory("nesterov", lr=0.05, weight_decay=1e-3),
    "adam": optimizer_factory("adam", lr=1e-2),
    "adamw": optimizer_factory("adamw", lr=1e-2, weight_decay=0.05),
}


def make_model(seed: int = 0, depth: int = 6, device: str | torch.device = "cpu") -> nn.Sequential:
    torch.manual_seed(seed)
    return deep_mlp(in_features=6, width=8, depth=depth, activation="tanh").to(device=device, dtype=torch.float64)


def make_data(T: int, n: int = 8, seed: int = 1, device: str | torch.device = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 6, generator=g, dtype=torch.float64).to(device),
             torch.randint(0, 10, (n,), generator=g).to(device)) for _ in range(T)]


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def plain(model: nn.Module, opt, data, **kw) -> tuple[nn.Module, list[float]]:
    m = copy.deepcopy(model)
    return m, train_plain(m, optimizer=opt, batches=data, **kw)


def make_bias_free_model(seed: int = 0, device: str | torch.device = "cpu") -> nn.Sequential:
    """``make_model`` without biases: only 2-D parameters, as Muon requires."""
    model = make_model(seed, device=device)
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            mod.register_parameter("bias", None)
    return model


MUON = optimizer_factory("muon", lr=0.02)  # torch's defaults: Nesterov momentum 0.95, decoupled decay 0.1


@pytest.mark.parametrize("opt_name", [*sorted(OPTIMIZERS), "muon"])
@pytest.mark.parametrize("builder,policy", [(gpipe, "gpipe"), (one_f_one_b, "1f1b"), (naive, "sequential")])
def test_flushed_schedules_reproduce_plain_training(builder, policy, opt_name, device) -> None:
    """Flushed schedules are plain training (float64, 1e-10) for every optimizer; Muon (bfloat16 Newton-Schulz on
    each 2-D weight) on the bias-free model, since it takes 2-D parameters only."""
    D, M, T = 3, 4, 5
    muon = opt_name == "muon"
    model = make_bias_free_model(device=device) if muon else make_model(device=device)
    data = make_data(T, device=device)
    opt = MUON if muon else OPTIMIZERS[opt_name]
    sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)  # noqa: E731
    ref, ref_losses = plain(model, opt, data, lr_scheduler=sched)
    m = copy.deepcopy(model)
    res = Emulator(m, D=D, schedule=builder(D, M, T), policy=policy, optimizer=opt, lr_scheduler=sched).run(data)
    assert max_diff(ref, m) <= TOL
    assert max(abs(a - b) for a, b in zip(ref_losses, res.losses)) <= TOL
    assert max_diff(ref, model) > 1e-3  # training moved the weights: the comparison is not vacuous


def test_flushed_cnn_with_groupnorm_and_recompute() -> None:
    torch.manual_seed(0)
    model = small_cnn(width=4, image_size=8).double()
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(4, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (4,), generator=g))
            for _ in range(3)]
    opt = OPTIMIZERS["adam"]
    ref, _ = plain(model, opt, data)
    for recompute in (False, True):
        m = copy.deepcopy(model)
        Emulator(m, D=4, schedule=one_f_one_b(4, 2, 3), policy="1f1b", optimizer=opt, recompute=recompute).run(data)
        assert max_diff(ref, m) <= TOL


@pytest.mark.parametrize("policy", [p for p in available_policies()])
def test_D1_reduces_every_policy_to_plain_training_with_muon(policy: str) -> None:
    """With one stage there is no staleness: every policy (predictors following Muon included) is plain training."""
    T = 4
    model, data = make_bias_free_model(), make_data(T)
    ref, _ = plain(model, MUON, data)
    builder = {"sequential": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "2bw": pipedream_2bw}.get(policy, pipedream)
    m = copy.deepcopy(model)
    serves = make_policy(policy).optimizers
    if serves is not None and "Muon" not in serves:  # a policy defined for other optimizers refuses Muon
        with pytest.raises(ValueError, match="supported optimizers"):
            Emulator([m], schedule=builder(1, 1, T), policy=policy, optimizer=MUON)
        return
    Emulator([m], schedule=builder(1, 1, T), policy=policy, optimizer=MUON).run(data)
    assert max_diff(ref, m) <= TOL


@pytest.mark.parametrize("predictor", ["pipeoptim", "repeat", "zero_grad_rollout"])
def test_asynchronous_pipeline_predicts_with_muon(predictor: str) -> None:
    """PipeDream with weight prediction following Muon runs and predicts (differs from stale weights)."""
    D, T = 3, 6
    model, data = make_bias_free_model(), make_data(T)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    res = Emulator(a, D=D, schedule=pipedream(D, 1, T), policy="pipeoptim", optimizer=MUON,
                   predictor=predictor).run(data)
    Emulator(b, D=D, schedule=pipedream(D, 1, T), policy="vanilla", optimizer=MUON).run(data)
    assert all(math.isfinite(x) for x in res.losses)
    assert max_diff(a, b) > 1e-6


@pytest.mark.parametrize("policy", [p for p in available_policies()])
def test_D1_reduces_every_policy_to_plain_training(policy) -> None:
    T = 4
    model, data = make_model(depth=3), make_data(T)
    opt = OPTIMIZERS["nesterov"]
    ref, _ = plain(model, opt, data)
    builder = {"sequential": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "2bw": pipedream_2bw}.get(policy, pipedream)
    m = copy.deepcopy(model)
    Emulator([m], schedule=builder(1, 1, T), policy=policy, optimizer=opt).run(data)
    assert max_diff(ref, m) <= TOL


def delayed_recurrence(model: nn.Module, D: int, opt, data, version=None) -> nn.Module:
    """A delayed-gradient recurrence written by hand: mini-batch t uses stage k's version ``version(k, t)``
    (default: weight stashing on async 1F1B, max(0, t − (D−1−k))) in forward and backward; stage k's
    update t applies that gradient to its newest weights."""
    if version is None:
        version = lambda k, t: max(0, t - (D - 1 - k))  # noqa: E731
    model = copy.deepcopy(model)
    stages = split(model, D)
    opts = [opt(list(s.parameters())) for s in stages]
    history = [[tuple(p.detach().clone() for p in s.parameters())] for s in stages]
    names = [[n for n, _ in s.named_parameters()] for s in stages]
    for t, (x, y) in enumerate(data):
        ws = [tuple(w.clone().requires_grad_(True) for w in history[k][version(k, t)]) for k in range(D)]
        h = x
        for k, s in enumerate(stages):
            h = functional_call(s, dict(zip(names[k], ws[k])), (h,))
        loss = nn.functional.cross_entropy(h, y)
        grads = torch.autograd.grad(loss, [w for wk in ws for w in wk])
        it = iter(grads)
        for k, s in enumerate(stages):
            for p in s.parameters():
                p.grad = next(it)
            opts[k].step()
            history[k].append(tuple(p.detach().clone() for p in s.parameters()))
    return model


@pytest.mark.parametrize("opt_name", ["nesterov", "adam"])
def test_weight_stashing_equals_delayed_recurrence(opt_name) -> None:
    D, T = 4, 9
    model, data = make_model(), make_data(T)
    opt = OPTIMIZERS[opt_name]
    ref = delayed_recurrence(model, D, opt, data)
    m = copy.deepcopy(model)
    res = Emulator(m, D=D, schedule=pipedream(D, 1, T), policy="stashing", optimizer=opt).run(data)
    assert max_diff(ref, m) <= TOL
    assert res.ring_capacity == [D - k for k in range(D)]
    seq, _ = plain(model, opt, data)
    assert max_diff(seq, m) > 1e-4  # stashing is not sequential training


@pytest.mark.parametrize("opt_name", ["nesterov", "adam"])
def test_2bw_equals_the_delay_one_recurrence_at_every_stage(opt_name) -> None:
    """PipeDream-2BW (ICML 2021, §3.1): W(t+1) = W(t) − ν∇f(W(t−1)) at every stage, two copies per stage."""
    D, M, T = 4, 4, 5  # 20 micro-batches
    model, data = make_model(), make_data(T, n=2 * M)
    opt = OPTIMIZERS[opt_name]
    ref = delayed_recurrence(model, D, opt, data, version=lambda k, t: max(t - 1, 0))
    m = copy.deepcopy(model)
    emu = Emulator(m, D=D, schedule=pipedream_2bw(D, M, T), policy="2bw", optimizer=opt)
    res = emu.run(data)
    assert max_diff(ref, m) <= TOL
    for op in "FB":
        assert all(res.used[(op, k, t, j)] == max((t * M + j) // M - 1, 0)
                   for k in range(D) for t in range(T) for j in range(M))
    assert res.ring_capacity == [2] * D and emu.weight_copies == [2] * D
    seq, _ = plain(model, opt, data)
    assert max_diff(seq, m) > 1e-4  # 2BW is not sequential training


@pytest.mark.parametrize("M", [1, 2])
def test_oracle_coincides_with_sequential_training(M) -> None:
    D, T = 4, 6
    model, data = make_model(), make_data(T)
    opt = OPTIMIZERS["adamw"]
    ref, ref_losses = plain(model, opt, data)
    m = copy.deepcopy(model)
    res = Emulator(m, D=D, schedule=pipedream(D, M, T), policy="oracle", optimizer=opt).run(data)
    assert res.waited  # the oracle had to wait: the order is not the schedule's
    assert max_diff(ref, m) <= TOL
    assert max(abs(a - b) for a, b in zip(ref_losses, res.losses)) <= TOL


def test_pipeoptim_with_perfect_predictor_is_sequential() -> None:
    D, T = 4, 7
    model, data = make_model(), make_data(T)
    opt = OPTIMIZERS["nesterov"]
    record: list = []
    ref, _ = plain(model, opt, data, D=D, record=record)

    class Recorded:
        """Returns the recorded sequential weights s versions ahead of the given ones (exact match)."""

        def __init__(self, k: int) -> None:
            self.k, self.calls = k, 0

        def predict(self, optimizer, s, params=None):
            versions = record[self.k]
            v = next(i for i, W in enumerate(versions) if all(torch.equal(a, b) for a, b in zip(W, params)))
            self.calls += 1
            return [w.clone() for w in versions[v + s]]

    preds = {}
    m = copy.deepcopy(model)
    res = Emulator(m, D=D, schedule=pipedream(D, 1, T), policy="pipeoptim", optimizer=opt,
                   predictor=lambda k: preds.setdefault(k, Recorded(k))).run(data)
    assert not res.waited and sum(p.calls for p in preds.values()) > 0
    assert max_diff(ref, m) <= TOL
    # and the oracle mechanism (true future weights by waiting) gives the same
    m2 = copy.deepcopy(model)
    Emulator(m2, D=D, schedule=pipedream(D, 1, T), policy="pipeoptim", optimizer=opt, predictor="oracle").run(data)
    assert max_diff(ref, m2) <= TOL


def test_pipemare_with_perfect_correction_is_stashing() -> None:
    D, T = 3, 6
    model, data = make_model(), make_data(T)
    opt = OPTIMIZERS["nesterov"]
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    Emulator(a, D=D, schedule=pipedream(D, 1, T), policy="stashing", optimizer=opt).run(data)
    # a perfect discrepancy correction recovers the forward's weights; anneal_steps=0 switches off the LR factor
    Emulator(b, D=D, schedule=pipedream(D, 1, T), policy=PipeMarePolicy(anneal_steps=0), optimizer=opt,
             predictor="oracle").run(data)
    assert max_diff(a, b) <= TOL


def test_dropout_recompute_replays_the_random_state() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Dropout(0.3), nn.Linear(8, 8), nn.Tanh()),
                          nn.Linear(8, 10)).double()
    data = make_data(3)
    opt = OPTIMIZERS["nesterov"]
    outs = []
    for recompute in (False, True):
        m = copy.deepcopy(model)
        torch.manual_seed(5)
        Emulator(m, D=3, schedule=gpipe(3, 2, 3), policy="gpipe", optimizer=opt, recompute=recompute).run(data)
        outs.append(m)
    assert max_diff(*outs) <= TOL


def test_batchnorm_buffers_update_once_per_forward() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.BatchNorm1d(8), nn.Tanh()), nn.Linear(8, 10)).double()
    T, M = 5, 2
    m = copy.deepcopy(model)
    Emulator(m, D=3, schedule=pipedream(3, M, T), policy="vanilla", optimizer=OPTIMIZERS["nesterov"]).run(make_data(T))
    assert int(m[1][0].num_batches_tracked) == T * M  # the vanilla backward recomputes, without touching buffers


@pytest.mark.parametrize("D", [2, 3])
def test_reused_parameter_free_module_trains_like_plain_training(D: int) -> None:
    """A shared ``nn.ReLU()`` at positions 1 and 3 is pipelined at both positions (not silently dropped)."""
    torch.manual_seed(0)
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(6, 8), relu, nn.Linear(8, 8), relu, nn.Linear(8, 10)).double()
    data, opt, T = make_data(4), OPTIMIZERS["nesterov"], 4
    ref = copy.deepcopy(model)
    ref_losses = train_plain([ref], optimizer=opt, batches=data)  # the whole model as one stage, unsplit
    m = copy.deepcopy(model)
    res = Emulator(m, D=D, schedule=naive(D, 2, T), policy="sequential", optimizer=opt).run(data)
    assert max_diff(ref, m) <= TOL
    assert max(abs(a - b) for a, b in zip(ref_losses, res.losses)) <= TOL
    assert max_diff(ref, model) > 1e-3


def _weightless_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 10)).double()


@pytest.mark.parametrize("builder,policy", [(gpipe, "gpipe"), (naive, "sequential"), (one_f_one_b, "1f1b")])
def test_stage_without_parameters_flushed_equals_plain_training(builder, policy) -> None:
    """Linear | Tanh | Linear on D=3: the middle stage holds no weights, has no optimizer, and the pipeline
    still reproduces plain training."""
    model, data, opt, T = _weightless_model(), make_data(4), OPTIMIZERS["adam"], 4
    sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)  # noqa: E731
    ref = copy.deepcopy(model)
    ref_losses = train_plain([ref], optimizer=opt, batches=data, lr_scheduler=sched)
    m = copy.deepcopy(model)
    emu = Emulator(m, D=3, schedule=builder(3, 2, T), policy=policy, optimizer=opt, lr_scheduler=sched)
    res = emu.run(data)
    assert max_diff(ref, m) <= TOL
    assert max(abs(a - b) for a, b in zip(ref_losses, res.losses)) <= TOL
    assert max_diff(ref, model) > 1e-3
    assert emu.stages[1].optimizer is None and emu.stages[1].scheduler is None and emu.weights()[1] == ()
    assert res.weight_copies[1] == 0 and res.weight_copies[0] == res.weight_copies[2] == 1


class _FrozenScale(nn.Module):
    """tanh(x)·c with a parameter c = 1 that an lr=0 optimizer never moves: a weighted twin of ``nn.Tanh``."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * self.c


@pytest.mark.parametrize("policy", ["stashing", "vanilla", "vertical_sync", "pipeoptim", "spectrain", "pipemare",
                                    "2bw"])
def test_stage_without_parameters_under_asynchronous_policies(policy) -> None:
    """Under async schedules the weightless stage changes nothing: the run equals the same pipeline whose
    middle stage has a weight frozen at 1 (same version table, same weights of the other stages), losses
    are finite, and every job ran at the version the table gives."""
    T, M = 6, (3 if policy == "2bw" else 1)
    build = (lambda: pipedream_2bw(3, M, T)) if policy == "2bw" else (lambda: pipedream(3, M, T))
    data = make_data(T, n=6)
    base = _weightless_model()
    twin = nn.Sequential(copy.deepcopy(base[0]), _FrozenScale(), copy.deepcopy(base[2]))
    frozen = twin[1].c

    def opt(ps):
        lr = 0.0 if any(p is frozen for p in ps) else 0.05
        return torch.optim.SGD(ps, lr=lr, momentum=0.9)

    emu = Emulator(base, schedule=build(), policy=policy, optimizer=opt)
    res = emu.run(data)
    res_twin = Emulator(twin, schedule=build(), policy=policy, optimizer=opt).run(data)
    assert all(math.isfinite(v) for v in res.losses)
    assert max(abs(a - b) for a, b in zip(res.losses, res_twin.losses)) <= TOL
    for k in (0, 2):
        assert max((p - q).abs().max().item() for p, q in zip(base[k].parameters(), twin[k].parameters())) <= TOL
    assert res.current == res_twin.current == {key: emu.table.version(key) for key in res.current}
    assert res.weight_copies[1] == 0 and emu.stages[1].predictor is None and 1 not in emu.predicted_stages


def test_snapshots_hold_each_stages_version_v_even_when_it_keeps_one_copy() -> None:
    """A stage whose ring holds one version shares its live weights; a later update of that stage must not leak into
    the snapshot of version v taken once every stage has reached v (asynchronous 1F1B, PipeOptim: capacity 1)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 4), nn.Linear(4, 3)).double()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (8,), generator=gen))
               for _ in range(8)]
    trajectory: dict[int, list[list[torch.Tensor]]] = {}

    def factory(params):
        params = list(params)
        opt = torch.optim.SGD(params, lr=0.2)
        k = len(trajectory)
        trajectory[k] = [[p.detach().clone() for p in params]]
        opt.register_step_post_hook(lambda o, a, kw: trajectory[k].append([p.detach().clone() for p in params]))
        return opt

    snaps: dict[int, list[list[torch.Tensor]]] = {}
    emu = Emulator(model, D=3, schedule=pipedream(3, 1, 8), policy="pipeoptim", optimizer=factory)
    assert emu.capacity == [1, 1, 1]
    emu.run(batches, snapshot_every=1, on_snapshot=lambda v, W: snaps.__setitem__(v, [[w.clone() for w in Wk]
                                                                                      for Wk in W]))
    assert sorted(snaps) == list(range(9))
    for v, W in snaps.items():
        for k in range(3):
            assert all(torch.equal(a, b) for a, b in zip(W[k], trajectory[k][v])), (v, k)


@pytest.mark.parametrize("policy,builder", [("1f1b", one_f_one_b), ("2bw", pipedream_2bw)])
def test_stored_weights_keep_no_gradient(policy: str, builder) -> None:
    """The backward adds a micro-batch's weight gradient into its step's sum through the weights' ``.grad`` during
    the call only: a stored version read by a later job (a forward after a backward at the same version) carries
    none."""
    M = 3
    emu = Emulator(make_model(), D=3, schedule=builder(3, M, 6), policy=policy, optimizer=OPTIMIZERS["adam"])
    seen: list[bool] = []
    for st in emu.stages:
        st.on_weights = lambda event, spec, W: seen.append(all(w.grad is None for w in W))
    emu.run(make_data(6, n=12))
    assert len(seen) >= 3 * 6 * M and all(seen)  # at least every forward's request


def _recycling_run(policy: str, builder, recycle: bool, keep: bool = False
                   ) -> tuple[Emulator, list[float], int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A float64 run whose stages write new versions into retired ones' tensors (``recycle``) or into fresh ones;
    the count of reused tensor sets; with ``keep``, every (tensor handed to a job, its value then) — a caller's
    hook that keeps what it is handed."""
    D, M, T = 3, (1 if builder is pipedream else 3), 8
    emu = Emulator(make_model(), D=D, schedule=builder(D, M, T), policy=policy, optimizer=OPTIMIZERS["adam"])
    reused, kept = [0], []
    for st in emu.stages:
        st.ring.recycle = recycle

        def counting(inner=st.ring.reusable):
            W = inner()
            reused[0] += W is not None
            return W

        st.ring.reusable = counting
        if keep:
            st.on_weights = lambda event, spec, W: kept.extend((w, w.detach().clone()) for w in W)
    losses = emu.run(make_data(T, n=6)).losses
    return emu, losses, reused[0], kept


@pytest.mark.parametrize("policy,builder", [("stashing", pipedream), ("2bw", pipedream_2bw),
                                            ("vertical_sync", pipedream)])
def test_recycled_version_storage_changes_no_result(policy: str, builder) -> None:
    """A stage holding several versions writes each new one into a retired version's tensors (rings.py): the run is
    bit for bit the run with a fresh copy per version, and the tensors are in fact reused."""
    fresh, fresh_losses, none, _ = _recycling_run(policy, builder, recycle=False)
    emu, losses, reused, _ = _recycling_run(policy, builder, recycle=True)
    assert none == 0 and reused >= 3 * 4  # at least 4 of the 8 updates on every stage
    assert losses == fresh_losses
    for a, b in zip(emu.weights(), fresh.weights()):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_recycling_never_overwrites_weights_someone_holds(monkeypatch) -> None:
    """A hook that keeps every version it is handed, a snapshot callback that keeps its tensors: the ring lets those
    go rather than reuse them, so every kept tensor still holds its value at the end (the probe: the same run with
    the reference check bypassed overwrites them, so this test can fail). A version no job was handed may still be
    reused."""
    _, _, _, kept = _recycling_run("2bw", pipedream_2bw, recycle=True, keep=True)
    assert len(kept) > 100
    assert all(torch.equal(w, value) for w, value in zip(*zip(*kept)))
    snaps: dict[int, list] = {}
    emu = Emulator(make_model(), D=3, schedule=pipedream(3, 1, 8), policy="stashing", optimizer=OPTIMIZERS["adam"])
    emu.run(make_data(8, n=6), snapshot_every=1,
            on_snapshot=lambda v, W: snaps.__setitem__(v, [(w, w.clone()) for Wk in W for w in Wk]))
    assert len(snaps) == 9 and all(torch.equal(w, c) for pairs in snaps.values() for w, c in pairs)
    import pipelab.pipeline.rings as rings

    monkeypatch.setattr(rings, "unshared", lambda W: True)
    _, _, reused, kept = _recycling_run("2bw", pipedream_2bw, recycle=True, keep=True)
    assert reused > 0 and not all(torch.equal(w, value) for w, value in zip(*zip(*kept)))


def test_unshared_sees_python_references_graphs_and_views() -> None:
    """The reference check behind the reuse: a tuple of fresh tensors is unshared; another Python reference, an
    autograd graph holding the tensor, or a view of its memory each make it shared."""
    from pipelab.pipeline.rings import unshared

    W = (torch.randn(3, requires_grad=True), torch.randn(2, 2))
    assert unshared(W)
    other = W[0]
    assert not unshared(W)
    del other
    y = (W[0] * W[0]).sum()  # mul saves W[0] for its backward
    assert not unshared(W)
    y.backward()
    del y
    assert unshared(W)
    view = W[1].detach()[0]
    assert not unshared(W)
    del view
    assert unshared(W)
