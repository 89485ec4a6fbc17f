"""Nesterov for asynchronous PP, error feedback and DC-ASGD: their arithmetic on small cases computed by hand,
their reduction to plain training without delay, and the refusal of optimizers a policy cannot serve.

The hand computations use a two-stage network, stage 0 ``tanh(x·Aᵀ)`` and stage 1 ``h·Bᵀ`` with the loss
``mean_i ½‖o_i − y_i‖²``, whose gradients are written out below; the optimizers' updates (SGD, heavy ball, NAdam)
are written out too, so that the emulator's torch.optim arithmetic is checked against independent formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from pipelab.emulator import Emulator, train_plain
from pipelab.policies import (
    DelayCompensationPolicy,
    ErrorFeedbackPolicy,
    GradientContext,
    NesterovAsyncPolicy,
    available_policies,
    make_policy,
)
from pipelab.schedules import gpipe, pipedream, pipedream_2bw

TOL = 1e-12
N_IN, N_HID, N_OUT, BATCH = 3, 4, 2, 4


def stages(seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(N_IN, N_HID, bias=False), nn.Tanh()).double(),
            nn.Linear(N_HID, N_OUT, bias=False).double()]


def loss_fn(out: Tensor, y: Tensor) -> Tensor:
    return 0.5 * ((out - y) ** 2).sum(dim=1).mean()


def data(T: int, seed: int = 1) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, N_IN, generator=g, dtype=torch.float64),
             torch.randn(BATCH, N_OUT, generator=g, dtype=torch.float64)) for _ in range(T)]


def initial(seed: int = 0) -> tuple[Tensor, Tensor]:
    s = stages(seed)
    return s[0][0].weight.detach().clone(), s[1].weight.detach().clone()


def emulate(policy, schedule, optimizer, T: int, seed: int = 0):
    model = stages(seed)
    emu = Emulator(model, schedule=schedule, policy=policy, optimizer=optimizer, loss_fn=loss_fn)
    res = emu.run(data(T))
    return [w[0] for w in emu.weights()], res


Versions = Callable[[int, int, int], int]


def reference(T: int, M: int, fver: Versions, bver: Versions,
              step: Callable[[int, int, list[Tensor], Tensor, list[int]], Tensor], seed: int = 0) -> list[Tensor]:
    """Hand-written pipelined training of the two-stage net: micro-batch j of step t runs stage k's forward at
    version ``fver(k, t, j)`` and its backward (recomputed) at ``bver(k, t, j)``; ``step(k, t, versions, g, used)``
    returns stage k's version t + 1 from the step's summed gradient g and the backward versions used."""
    A0, B0 = initial(seed)
    W: list[list[Tensor]] = [[A0], [B0]]
    for t, (x, y) in enumerate(data(T)):
        g = [torch.zeros_like(A0), torch.zeros_like(B0)]
        for j, (xj, yj) in enumerate(zip(x.chunk(M), y.chunk(M))):
            Af, Ab = W[0][fver(0, t, j)], W[0][bver(0, t, j)]
            Bb = W[1][bver(1, t, j)]
            h = torch.tanh(xj @ Af.T)                    # stage 0's output, sent on (forward weights)
            r = (h @ Bb.T - yj) / (len(xj) * M)          # ∂(ℓ_j/M)/∂o at stage 1's backward weights
            g[1] += r.T @ h                              # ∂/∂B
            gh = r @ Bb                                  # input gradient sent back to stage 0
            z = xj @ Ab.T                                # stage 0 recomputed at its backward weights
            g[0] += (gh * (1 - torch.tanh(z) ** 2)).T @ xj
        for k in (0, 1):
            used = [bver(k, t, j) for j in range(M)]
            W[k].append(step(k, t, W[k], g[k], used))
    return [W[0][-1], W[1][-1]]


def async_f(k: int, t: int, j: int) -> int:
    """Asynchronous 1F1B, D = 2, M = 1: stage 0's forward of step t sees t − 1 updates, stage 1's t."""
    return max(0, t - 1) if k == 0 else t


def async_b(k: int, t: int, j: int) -> int:
    """... and every backward of step t runs after U(k, t − 1): version t (vanilla's backward)."""
    return t


def close(a: list[Tensor], b: list[Tensor]) -> None:
    for x, y in zip(a, b):
        assert (x - y).abs().max().item() <= TOL


def check_versions(res, fver: Versions, bver: Versions, T: int, M: int) -> None:
    """The closed-form versions above are those the emulator ran with (its table and the policy's specs)."""
    for t in range(T):
        for j in range(M):
            for k in (0, 1):
                assert res.used[("F", k, t, j)] == fver(k, t, j)
                assert res.used[("B", k, t, j)] == bver(k, t, j)


# ----------------------------------------------------------------------------------------------- Nesterov


def nadam_step(beta1: float, lr: float = 0.01, beta2: float = 0.999, eps: float = 1e-8, psi: float = 0.004):
    """torch.optim.NAdam's update written out (Dozat 2016 with torch's μ schedule), per stage."""
    state: dict[int, dict] = {}

    def step(k: int, t: int, Wk: list[Tensor], g: Tensor, used: list[int]) -> Tensor:
        st = state.setdefault(k, {"m": torch.zeros_like(g), "v": torch.zeros_like(g), "prod": 1.0, "n": 0})
        st["n"] += 1
        n = st["n"]
        mu = beta1 * (1 - 0.5 * 0.96 ** (n * psi))
        mu_next = beta1 * (1 - 0.5 * 0.96 ** ((n + 1) * psi))
        st["prod"] *= mu
        st["m"] = beta1 * st["m"] + (1 - beta1) * g
        st["v"] = beta2 * st["v"] + (1 - beta2) * g * g
        denom = torch.sqrt(st["v"] / (1 - beta2 ** n)) + eps
        return (Wk[t] - lr * (1 - mu) / (1 - st["prod"]) * g / denom
                - lr * mu_next / (1 - st["prod"] * mu_next) * st["m"] / denom)

    return step


@pytest.fixture
def float64_scalars():
    """torch keeps NAdam's running product of μ as a float32 scalar unless the default dtype is float64 (then
    float64): with it the written-out NAdam matches to 1e-12 (else to ~1e-10, the float32 product's rounding)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(saved)


@pytest.mark.parametrize("backward", ["stashed", "current"])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.usefixtures("float64_scalars")
def test_nesterov_async_is_nadam_on_the_pipelined_gradient(backward: str, adaptive: bool) -> None:
    T, beta1 = 6, 0.9
    policy = NesterovAsyncPolicy(backward=backward, adaptive_momentum=adaptive)
    got, res = emulate(policy, pipedream(2, 1, T), lambda ps: torch.optim.NAdam(ps, lr=0.01, betas=(beta1, 0.999)), T)
    bver = async_f if backward == "stashed" else async_b
    check_versions(res, async_f, bver, T, 1)
    # the code's adaptive rule β1_k = β1 + τ_k·(0.99 − β1)/D with τ_0 = 1 (stage 0's delay), τ_1 = 0
    betas = [beta1 + (0.99 - beta1) / 2, beta1] if adaptive else [beta1, beta1]
    steps = [nadam_step(betas[0]), nadam_step(betas[1])]
    want = reference(T, 1, async_f, bver, lambda k, t, Wk, g, used: steps[k](k, t, Wk, g, used))
    close(got, want)
    # the stashed and the current backward differ on this case (the test can tell them apart)
    other = reference(T, 1, async_f, async_b if backward == "stashed" else async_f,
                      lambda k, t, Wk, g, used: steps[k](k, t, Wk, g, used))
    assert (other[0] - want[0]).abs().max().item() > 1e-6


def test_nesterov_async_with_sgd_nesterov_and_its_memory() -> None:
    T, lr, mu = 5, 0.1, 0.9
    policy = NesterovAsyncPolicy()
    got, _ = emulate(policy, pipedream(2, 1, T), lambda ps: torch.optim.SGD(ps, lr=lr, momentum=mu, nesterov=True), T)
    bufs: dict[int, Tensor] = {}

    def step(k: int, t: int, Wk: list[Tensor], g: Tensor, used: list[int]) -> Tensor:
        bufs[k] = g.clone() if k not in bufs else mu * bufs[k] + g
        return Wk[t] - lr * (g + mu * bufs[k])

    close(got, reference(T, 1, async_f, async_f, step))
    assert [policy.stated_weight_copies(k, 4) for k in range(4)] == [4, 3, 2, 1]
    assert [NesterovAsyncPolicy(backward="current").stated_weight_copies(k, 4) for k in range(4)] == [1, 1, 1, 1]


# ----------------------------------------------------------------------------------------------- error feedback


def heavy_ball(lr: float, mu: float):
    bufs: dict[int, Tensor] = {}

    def step(k: int, t: int, Wk: list[Tensor], g: Tensor) -> Tensor:
        bufs[k] = g.clone() if k not in bufs else mu * bufs[k] + g
        return Wk[t] - lr * bufs[k]

    return step


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_error_feedback_on_2bw_by_hand(gamma: float) -> None:
    T, M, lr, mu = 6, 2, 0.1, 0.9
    got, res = emulate(ErrorFeedbackPolicy(gamma=gamma), pipedream_2bw(2, M, T),
                       lambda ps: torch.optim.SGD(ps, lr=lr, momentum=mu), T)

    def v2bw(k: int, t: int, j: int) -> int:  # PipeDream-2BW: every job of step t at version t − 1
        return max(0, t - 1)

    check_versions(res, v2bw, v2bw, T, M)
    hb, prev = heavy_ball(lr, mu), {}

    def step(k: int, t: int, Wk: list[Tensor], g: Tensor, used: list[int]) -> Tensor:
        s = t - sum(used) / len(used)  # 0 at t = 0, then 1
        corrected = g if k not in prev else g + gamma * s * (g - prev[k])
        prev[k] = g
        return hb(k, t, Wk, corrected)

    want = reference(T, M, v2bw, v2bw, step)
    close(got, want)
    plain = reference(T, M, v2bw, v2bw, lambda k, t, Wk, g, used: heavy_ball(lr, mu)(k, t, Wk, g))
    assert (plain[0] - want[0]).abs().max().item() > 1e-6


def test_error_feedback_scales_with_the_staleness_of_the_table() -> None:
    """On asynchronous 1F1B (base "vanilla") stage 0's gradient is one version old, stage 1's fresh: only stage 0
    is corrected, by s = 1 (both micro-batches' backward at cur(B) = t, forward older: s counts the backward)."""
    T, lr = 5, 0.1
    got, res = emulate(ErrorFeedbackPolicy(base="stashing"), pipedream(2, 1, T),
                       lambda ps: torch.optim.SGD(ps, lr=lr), T)
    check_versions(res, async_f, async_f, T, 1)
    prev: dict[int, Tensor] = {}

    def step(k: int, t: int, Wk: list[Tensor], g: Tensor, used: list[int]) -> Tensor:
        s = t - used[0]
        corrected = g if k not in prev else g + s * (g - prev[k])
        prev[k] = g
        return Wk[t] - lr * corrected

    close(got, reference(T, 1, async_f, async_f, step))


# ----------------------------------------------------------------------------------------------- DC-ASGD


@pytest.mark.parametrize("adaptive", [False, True])
def test_dc_asgd_on_stashed_async_1f1b_by_hand(adaptive: bool) -> None:
    T, lr, lam, lam0, m = 6, 0.2, 0.5, 2.0, 0.95
    policy = DelayCompensationPolicy(lam=lam, adaptive=adaptive, lam0=lam0, ms_decay=m)
    got, res = emulate(policy, pipedream(2, 1, T), lambda ps: torch.optim.SGD(ps, lr=lr), T)
    check_versions(res, async_f, async_f, T, 1)
    ms: dict[int, Tensor] = {}

    def step(k: int, t: int, Wk: list[Tensor], g: Tensor, used: list[int]) -> Tensor:
        if adaptive:
            ms[k] = m * ms.get(k, torch.zeros_like(g)) + (1 - m) * g * g
            lam_k = lam0 / torch.sqrt(ms[k] + 1e-7)
        else:
            lam_k = torch.full_like(g, lam)
        corrected = g + lam_k * g * g * (Wk[t] - Wk[used[0]])
        return Wk[t] - lr * corrected

    want = reference(T, 1, async_f, async_f, step)
    close(got, want)
    plain = reference(T, 1, async_f, async_f, lambda k, t, Wk, g, used: Wk[t] - lr * g)
    assert (plain[0] - want[0]).abs().max().item() > 1e-9


def test_dc_asgd_with_micro_batches_of_different_versions_uses_their_mean() -> None:
    """Stashed asynchronous 1F1B with M = 2: a step's micro-batches ran their forwards, hence their stashed
    backwards, at different versions; W_used is their mean (the rule documented in DelayCompensationPolicy).
    Versions from the simulator's table."""
    T, M, lr, lam = 6, 2, 0.2, 0.5
    got, res = emulate(DelayCompensationPolicy(base="stashing", lam=lam), pipedream(2, M, T),
                       lambda ps: torch.optim.SGD(ps, lr=lr), T)

    def fver(k: int, t: int, j: int) -> int:
        return res.current[("F", k, t, j)]

    bver = fver  # stashed
    assert any(bver(k, t, 0) != bver(k, t, 1) for k in (0, 1) for t in range(T))  # the case the rule is for

    def step(k: int, t: int, Wk: list[Tensor], g: Tensor, used: list[int]) -> Tensor:
        mean_used = sum(Wk[v] for v in used) / len(used)
        return Wk[t] - lr * (g + lam * g * g * (Wk[t] - mean_used))

    close(got, reference(T, M, fver, bver, step))


# ----------------------------------------------------------------------------------------------- no delay


@pytest.mark.usefixtures("float64_scalars")
@pytest.mark.parametrize("policy,optimizer", [
    (NesterovAsyncPolicy(), lambda ps: torch.optim.NAdam(ps, lr=0.01, betas=(0.99, 0.999))),
    (NesterovAsyncPolicy(backward="current", adaptive_momentum=True), lambda ps: torch.optim.NAdam(ps, lr=0.01)),
    (ErrorFeedbackPolicy(), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    (ErrorFeedbackPolicy(base="vanilla", gamma=2.0), lambda ps: torch.optim.Adam(ps, lr=0.01)),
    (DelayCompensationPolicy(lam=1.0), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    (DelayCompensationPolicy(adaptive=True), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
], ids=["nesterov", "nesterov-current-adaptive", "ef-2bw", "ef-vanilla-adam", "dc", "dc-adaptive"])
def test_without_delay_each_policy_is_plain_training(policy, optimizer) -> None:
    """On a flushed schedule (GPipe, M = 2) no gradient is stale: every correction vanishes and the adaptive β1
    stays β1 (τ = 0), so the run equals plain training to float64 precision."""
    T = 5
    got, res = emulate(policy, gpipe(2, 2, T), optimizer, T)
    model = stages()
    losses = train_plain(model, optimizer=optimizer, batches=data(T), loss_fn=loss_fn)
    close(got, [model[0][0].weight.detach(), model[1].weight.detach()])
    assert res.losses == pytest.approx(losses, abs=TOL)


def test_the_correction_hook_is_called_with_the_table_versions() -> None:
    """Policy.correct_gradient sees the version at the update, the backward versions and (when asked) W_used."""
    seen: list[tuple[int, int, int, tuple[int, ...], bool]] = []

    class Probe(DelayCompensationPolicy):
        def correct_gradient(self, ctx: GradientContext, grads: list[Tensor]) -> list[Tensor]:
            assert ctx.weights_used is not None
            seen.append((ctx.stage, ctx.step, ctx.version, ctx.used_versions, len(ctx.weights_now) == len(grads)))
            return grads

    T = 4
    emulate(Probe(), pipedream(2, 1, T), lambda ps: torch.optim.SGD(ps, lr=0.1), T)
    assert sorted(seen) == sorted([(k, t, t, (async_f(k, t, 0),), True) for k in (0, 1) for t in range(T)])


# ----------------------------------------------------------------------------------------------- registry, refusal


def test_registered_with_metadata_and_options() -> None:
    for name, cls in (("nesterov_async", NesterovAsyncPolicy), ("error_feedback", ErrorFeedbackPolicy),
                      ("dc_asgd", DelayCompensationPolicy)):
        assert name in available_policies() and isinstance(make_policy(name), cls)
        info = make_policy(name)
        assert info.title and info.summary and not info.emulation_only and not info.uses_predictor
    assert make_policy("error_feedback").schedule == "2bw"  # the paper's schedule
    assert make_policy("dc_asgd").schedule == make_policy("nesterov_async").schedule == "pipedream"
    assert make_policy("dc_asgd", base="2bw", adaptive=True).schedule == "2bw"
    assert make_policy("error_feedback").stated_weight_copies(0, 4) == 3  # 2BW's two versions + g_{t−1}
    assert make_policy("dc_asgd").stated_weight_copies(0, 4) == 5  # stashing's D − k + W_used
    for name, bad, match in (("nesterov_async", {"backward": "future"}, "backward must be one of"),
                             ("nesterov_async", {"beta_max": 1.5}, "beta_max"),
                             ("error_feedback", {"base": "spectrain"}, "base must be one of"),
                             ("error_feedback", {"gamma": -1.0}, "gamma"),
                             ("dc_asgd", {"lam": -0.1}, "lam"),
                             ("dc_asgd", {"ms_decay": 1.0}, "ms_decay")):
        with pytest.raises(ValueError, match=match):
            make_policy(name, **bad)


def _refusal(policy, optimizer, schedule=None) -> str:
    with pytest.raises(ValueError) as exc:
        Emulator(stages(), schedule=schedule or pipedream(2, 1, 3), policy=policy, optimizer=optimizer,
                 loss_fn=loss_fn)
    return str(exc.value)


def test_a_policy_refuses_an_optimizer_it_cannot_serve_and_lists_the_supported_ones() -> None:
    msg = _refusal("nesterov_async", lambda ps: torch.optim.Adam(ps, lr=0.01))
    assert "policy 'nesterov_async' cannot serve stage 0's optimizer Adam" in msg
    assert msg.endswith("supported optimizers: NAdam, SGD")
    msg = _refusal("nesterov_async", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    assert "nesterov=False" in msg and "supported optimizers: NAdam, SGD with nesterov=True" in msg
    # SpecTrain extrapolates SGD's momentum buffer: Adam, and Muon, are refused with what it supports
    msg = _refusal("spectrain", lambda ps: torch.optim.Adam(ps, lr=0.01))
    assert "policy 'spectrain' with predictor 'spectrain' cannot follow stage 0's optimizer Adam" in msg
    assert msg.endswith("supported optimizers: SGD with momentum > 0")
    msg = _refusal("spectrain", lambda ps: torch.optim.Muon(ps, lr=0.01))
    assert "optimizer Muon" in msg and msg.endswith("supported optimizers: SGD with momentum > 0")
    # PipeOptim follows every optimizer with an update rule, and lists them when it meets another one
    msg = _refusal("pipeoptim", lambda ps: torch.optim.LBFGS(ps, lr=0.01))
    assert "optimizer LBFGS" in msg
    listed = msg.rsplit("supported optimizers: ", 1)[1].split(", ")
    assert {"SGD", "Adam", "AdamW", "NAdam", "Muon"} <= set(listed) and "LBFGS" not in listed


def test_policies_without_an_optimizer_list_serve_any_optimizer() -> None:
    for name in ("error_feedback", "dc_asgd", "stashing", "vanilla"):
        assert make_policy(name).optimizers is None
    assert NesterovAsyncPolicy.optimizers == ("NAdam", "SGD")
    assert math.isfinite(emulate("dc_asgd", pipedream(2, 1, 3), lambda ps: torch.optim.Muon(ps, lr=0.01), 3)[1]
                         .losses[-1])


def test_the_corrections_buffers_are_counted_in_the_measured_and_stated_memory() -> None:
    """Error feedback keeps g_{t−1} and DC-ASGD the step's backward weights on every stage: one weight-sized buffer
    each, on top of their base policy's versions, in the emulator's count (policy_memory) and the stated one."""
    from pipelab.studies.figures.learning_curves import memory_rows

    rows = memory_rows("digits_mlp", "sgdm", 4, ["2bw", "error_feedback", "stashing", "dc_asgd"], batch_size=16)
    by = {(r["policy"], r["stage"]): r for r in rows}
    for pol, base in (("error_feedback", "2bw"), ("dc_asgd", "stashing")):
        copies = [by[(pol, k)]["weight_copies"] for k in range(4)]
        assert copies == [by[(base, k)]["weight_copies"] + 1 for k in range(4)]
        assert copies == [by[(pol, k)]["stated_copies"] for k in range(4)]
        assert [by[(pol, k)]["extra_copies"] for k in range(4)] == [1, 1, 1, 1]
    assert [by[("dc_asgd", k)]["weight_copies"] for k in range(4)] == [5, 4, 3, 2]
    assert make_policy("dc_asgd", adaptive=True).correction_buffers(0, 4) == 2  # W_used and the mean square
    assert make_policy("stashing").correction_buffers(0, 4) == 0
    # the buffers are real: after a run each stage of error feedback holds one previous gradient per parameter
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    emu = Emulator(model, schedule=pipedream_2bw(2, 2, 3), policy="error_feedback",
                   optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    emu.run([(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)])
    assert emu.weight_copies == [3, 3]
    for st in emu.stages:
        assert [g.shape for g in st.policy_state["previous"]] == [p.shape for p in st.params]
