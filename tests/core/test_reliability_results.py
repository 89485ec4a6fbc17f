"""Reliability probes of results: calls that once returned a silently wrong result and must now refuse or flag it.

Each probe is one call and the clear error it must give now (see ``tests/probes.py``); the cases that need a run
(a divergence that only the evaluation sees, tuning where every rate diverges) are ordinary test functions.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from importlib import import_module

import probes
import pytest
import torch
from probes import Probe
from torch import nn

from pipelab.partition import balanced_partition, split

INF, NAN = math.inf, math.nan


def _blocks(n: int = 4) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(3, 3) for _ in range(n - 1)], nn.Linear(3, 2))


# ----------------------------------------------------------------------------------------------- partition

PARTITION_PROBES = [
    # split(balance=[inf, 1, 1, 1]) used to return 2 one-block stages: the classifier head was dropped
    Probe("split-inf-cost", lambda: split(_blocks(), 2, [INF, 1, 1, 1]), ValueError, r"block 0 is inf.*finite"),
    Probe("split-nan-cost", lambda: split(_blocks(), 2, [1, NAN, 1, 1]), ValueError, r"block 1 is nan.*finite"),
    Probe("split-negative-cost", lambda: split(_blocks(), 2, [1, 1, -2.0, 1]), ValueError, r"block 2 is -2.0.*>= 0"),
    Probe("split-string-cost", lambda: split(_blocks(), 2, [1, 1, "a", 1]), TypeError, r"block 2 is 'a'.*numbers"),
    Probe("partition-inf-cost", lambda: balanced_partition([INF, 1, 1, 1], 3), ValueError, "block 0 is inf"),
    Probe("partition-minus-inf", lambda: balanced_partition([1, -INF], 1), ValueError, "block 1 is -inf"),
    Probe("partition-bool-cost", lambda: balanced_partition([True, 1], 1), TypeError, "block 0 is True"),
    Probe("partition-float-D", lambda: balanced_partition([1, 1, 1], 2.0), ValueError, r"D=2\.0.*int"),
]


@probes.parametrize(PARTITION_PROBES)
def test_partition_probe(probe: Probe) -> None:
    probe.check()


def test_huge_costs_still_cut_every_block() -> None:
    """Costs whose total overflows a float (prefix sums inf − inf = NaN) used to lose blocks: main gave [1, 1]."""
    assert balanced_partition([1e308] * 5, 2) == balanced_partition([1] * 5, 2) == [3, 2]
    assert [len(s) for s in split(_blocks(5), 2, [1e308] * 5)] == [3, 2]


def _cost_vector(rng: random.Random, n: int) -> list[float]:
    """Costs of every scale: zeros, small integers, and floats from 1e-300 up to 1e308 (sums overflow)."""
    kinds = [lambda: 0.0, lambda: float(rng.randint(0, 9)), lambda: rng.random(),
             lambda: 10.0 ** rng.uniform(-300, 308), lambda: rng.uniform(1e307, 1.7e308)]
    return [rng.choice(kinds)() for _ in range(n)]


def test_balanced_partition_property_over_random_costs() -> None:
    """For random cost vectors: D sizes ≥ 1 summing to n, and the largest stage cost equals the brute-force
    min–max optimum (sums exact, as fractions; the program may pick an optimum only up to float rounding)."""
    rng = random.Random(23)
    for _ in range(400):
        n = rng.randint(1, 8)
        D = rng.randint(1, n)
        costs = _cost_vector(rng, n)
        sizes = balanced_partition(costs, D)
        assert len(sizes) == D and sum(sizes) == n and min(sizes) >= 1, (costs, D, sizes)
        exact = [Fraction(c) for c in costs]

        def worst(cuts: tuple[int, ...], exact: list[Fraction] = exact, n: int = n) -> Fraction:
            b = (0, *cuts, n)
            return max(sum(exact[x:y], Fraction(0)) for x, y in zip(b, b[1:]))

        best = min(worst(c) for c in itertools.combinations(range(1, n), D - 1))
        got = worst(tuple(itertools.accumulate(sizes[:-1])))
        assert best <= got <= best * (1 + Fraction(1, 10**12)), (costs, D, sizes)


# ----------------------------------------------------------------------------------------------- divergence
# One step of SGD at these rates leaves every training loss finite but the weights (1e6) or only the outputs
# (3e5: finite weights, overflowing logits) non-finite; main reported diverged=False and accuracies 0.08-0.16.

def _one_step(lr: float, **kw: object):
    from pipelab.studies.learning_curves import RunConfig

    args = {"task": "digits_mlp", "policy": "sequential", "optimizer": "sgd", "D": 1, "seed": 0, "epochs": 1,
            "n_train": 64, "batch_size": 64, "n_val": 0, "lr": lr} | kw
    return RunConfig(**args)


def _nan_stages() -> list[nn.Module]:
    torch.manual_seed(0)
    stages = [nn.Linear(3, 4).double(), nn.Linear(4, 2).double()]
    with torch.no_grad():
        stages[1].weight[0, 0] = NAN
    return stages


def _x() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,))


def _evaluate(stages, loss_fn=None, weights=None):
    from pipelab.emulator import evaluate

    x, y = _x()
    return evaluate(stages, x, y, weights, loss_fn=loss_fn)


def _both_nan(pair: tuple[float, float]) -> bool:
    if not all(math.isnan(v) for v in pair):
        raise AssertionError(f"expected (nan, nan), got {pair}")
    return True


class _MinusInf(nn.Module):
    """Appends a −inf logit: the cross-entropy stays finite, the outputs are not."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([h, torch.full_like(h[:, :1], -INF)], 1)


EVALUATION_PROBES = [
    Probe("evaluate-nan-weight", lambda: _both_nan(_evaluate(_nan_stages())), None),
    Probe("evaluate-nan-weights-given", lambda: _both_nan(_evaluate(
        [nn.Linear(3, 2).double()], weights=[(torch.full((2, 3), NAN).double(), torch.zeros(2).double())])), None),
    Probe("evaluate-minus-inf-logit", lambda: _both_nan(_evaluate(
        [nn.Sequential(nn.Linear(3, 2), nn.Identity()).double(), _MinusInf()])), None),
]


@probes.parametrize(EVALUATION_PROBES)
def test_evaluation_probe(probe: Probe) -> None:
    probe.check()


def test_evaluate_arms_flags_only_the_arm_with_non_finite_weights() -> None:
    from pipelab.studies.stacking import evaluate_arms, stack_models

    torch.manual_seed(0)
    arms = [nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double() for _ in range(3)]
    with torch.no_grad():
        arms[1][2].bias[1] = INF
    x, y = _x()
    losses, accs = evaluate_arms([stack_models(arms)], x, y, 3)
    assert math.isnan(losses[1]) and math.isnan(accs[1])
    from pipelab.emulator import evaluate

    for a in (0, 2):
        assert (losses[a], accs[a]) == pytest.approx(evaluate([arms[a]], x, y), rel=1e-12)


@pytest.mark.parametrize("lr", [1e6, 3e5])
@pytest.mark.parametrize("policy", ["sequential", "gpipe"])
def test_run_arm_flags_divergence_seen_only_by_the_evaluation(policy: str, lr: float) -> None:
    from pipelab.studies.learning_curves import run

    rec = run(_one_step(lr, policy=policy, D=2 if policy == "gpipe" else 1, M=1))
    assert math.isfinite(rec["train_loss"][0]) and math.isfinite(rec["running_loss"][1])  # training saw nothing
    assert rec["diverged"] is True and rec["diverged_step"] == 0
    assert math.isnan(rec["test_acc"][1]) and math.isnan(rec["test_loss"][1])
    assert rec["test_acc"][0] == pytest.approx(run(_one_step(1e-3))["test_acc"][0])  # epoch 0 kept


def test_stacked_arms_flag_evaluation_divergence_like_single_runs() -> None:
    from pipelab.studies.learning_curves import run, run_stacked

    cfgs = [_one_step(3e5, seed=s) for s in (0, 1)]
    for single, stacked in zip([run(c) for c in cfgs], run_stacked(cfgs)):
        assert stacked["diverged"] is single["diverged"] is True
        assert stacked["diverged_step"] == single["diverged_step"] == 0
        assert math.isnan(stacked["test_acc"][1])


class _PoisonLast(torch.optim.SGD):
    """SGD whose ``n``-th step leaves NaN weights (so every loss computed before stays finite)."""

    def __init__(self, params, n: int) -> None:
        super().__init__(params, lr=0.1)
        self.n, self.calls = n, 0

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        super().step(closure)
        self.calls += 1
        if self.calls == self.n:
            for g in self.param_groups:
                for p in g["params"]:
                    p.fill_(NAN)


def test_runtime_result_flags_non_finite_final_weights() -> None:
    """RuntimeResult.diverged said False when the last update made the weights NaN (all losses finite)."""
    from pipelab.runtime import PipelineRuntime
    from pipelab.schedules import folded

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    steps = 3
    rt = PipelineRuntime(model, schedule=folded(2, 2, steps), policy="gpipe", rank=0, world_size=1,
                         optimizer=lambda ps: _PoisonLast(ps, steps))
    g = torch.Generator().manual_seed(1)
    res = rt.run([(torch.randn(4, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (4,), generator=g))
                  for _ in range(steps)])
    assert all(math.isfinite(v) for v in res.losses)
    assert res.diverged is True and res.diverged_step == steps - 1


@pytest.mark.slow
def test_train_distributed_flags_outputs_that_overflow_at_finite_weights() -> None:
    from pipelab.studies.run import train_distributed

    out = train_distributed(_one_step(3e5, policy="stashing", optimizer="sgd", D=2), timeout_s=120)
    assert out["steps_done"] == 1 and math.isfinite(out["losses"][0])
    assert all(bool(torch.isfinite(w).all()) for W in out["weights"].values() for w in W)
    assert out["diverged"] is True and out["diverged_step"] == 0
    assert math.isnan(out["test_acc"]) and math.isnan(out["test_loss"])


# ------------------------------------------------------------------------------------- tuning and statistics

def _stub_run(diverges_from: dict[float, int]):
    """A run whose rate ``lr`` diverges once its budget reaches ``diverges_from[lr]`` epochs (else scores lr)."""

    def run(cfg):
        bad = cfg.epochs >= diverges_from.get(cfg.lr, 10**9)
        return {"n_val": cfg.n_val, "val_acc": [0.0, NAN if bad else 0.5 + cfg.lr], "diverged": bad}

    return run


def _halving(diverges_from: dict[float, int], monkeypatch: pytest.MonkeyPatch):
    from pipelab.studies.learning_curves import RunConfig
    from pipelab.studies.tuning import successive_halving

    monkeypatch.setenv("PIPELAB_CACHE", "off")
    cfgs = [RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=s, epochs=9, n_val=16,
                      lr=lr) for lr in (0.01, 0.03, 0.1, 0.3, 1.0) for s in (0, 1)]
    (h,) = successive_halving(cfgs, _stub_run(diverges_from), eta=2)
    return h


def test_tuning_where_every_rate_diverges_selects_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to select the smallest rate (the tie-break among −∞ scores) and run the later rounds anyway."""
    from pipelab.studies.tuning import selected_configs

    h = _halving(dict.fromkeys((0.01, 0.03, 0.1, 0.3, 1.0), 1), monkeypatch)
    assert h.lr is None and h.all_diverged
    assert len(h.rounds) == 1 and len(h.records) == 10  # round 0 only: longer runs repeat the diverged prefix
    assert "no learning rate selected: every rate of round 0 (0.01, 0.03, 0.1, 0.3, 1) diverged within 1 " \
           "epoch(s)" in h.message
    with pytest.raises(ValueError, match="digits_mlp/sgdm/stashing/D=2: no learning rate selected"):
        selected_configs([h], seeds=[0])


def test_tuning_whose_survivors_diverge_later_selects_none(monkeypatch: pytest.MonkeyPatch) -> None:
    h = _halving({0.3: 2, 1.0: 2, 0.1: 4}, monkeypatch)  # the round-0 leaders blow up with more epochs
    assert [(r.lrs, r.epochs) for r in h.rounds] == [((0.01, 0.03, 0.1, 0.3, 1.0), 1), ((0.1, 0.3, 1.0), 2),
                                                     ((0.1, 0.3), 4)]
    assert h.lr is None and "every rate of round 2 (0.1, 0.3) diverged within 4 epoch(s)" in h.message
    ok = _halving({1.0: 2}, monkeypatch)
    assert ok.lr == 0.3 and not ok.all_diverged and ok.message.endswith("selected lr=0.3")


def _winner(arms: dict) -> str | None:
    from pipelab.studies.claims import winner_test

    return winner_test(arms).winner


STATISTICS_PROBES = [
    # an arm that diverged on every seed blocked every winner (its paired difference has no seed: p = NaN)
    Probe("winner-beats-an-arm-diverged-everywhere", lambda: _winner(
        {"a": [0.90, 0.91, 0.92, 0.93], "b": [0.50, 0.52, 0.51, 0.50], "c": [NAN] * 4}) == "a" or 1 / 0, None),
    Probe("winner-over-only-diverged-arms", lambda: _winner({"a": [0.9, 0.8], "b": [INF, NAN]}) == "a" or 1 / 0,
          None),
]


@probes.parametrize(STATISTICS_PROBES)
def test_statistics_probe(probe: Probe) -> None:
    probe.check()


def test_winner_test_lists_the_arms_that_diverged_everywhere_and_keeps_the_rest_tested() -> None:
    from pipelab.studies.claims import winner_test

    arms = {"a": [0.90, 0.91, 0.92, 0.93], "b": [0.89, 0.92, 0.90, 0.94], "c": [NAN] * 4, "d": [0.1, NAN, 0.1, 0.1]}
    w = winner_test(arms)
    assert w.diverged == ("c",) and set(w.differences) == {"b", "d"} and w.differences["d"].n == 3
    assert w.candidate == "a" and w.winner is None  # a − b is not resolved: "c" never decides anything


# ------------------------------------------------------------------------------------------ empty batches

def _empty_batches(T: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(0, 4, dtype=torch.float64), torch.zeros(0, dtype=torch.long))] * T


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def _sgd(ps) -> torch.optim.Optimizer:
    return torch.optim.SGD(ps, lr=0.1)


def _emulate(M: int, batches) -> object:
    from pipelab.emulator import Emulator
    from pipelab.schedules import gpipe

    return Emulator(_mlp(), schedule=gpipe(2, M, 2), policy="gpipe", optimizer=_sgd).run(batches)


def _measure_empty() -> object:
    from pipelab.prediction_error import measure_prediction_error

    model = _mlp()
    return measure_prediction_error(model, _sgd(list(model.parameters())), _empty_batches(4), ["stale"], max_s=1,
                                    measure_every=1)


EMPTY = r"mini-batch 0 is empty \(input shape \(0, 4\)\).*not a divergence"
EMPTY_BATCH_PROBES = [
    # each used to report divergence at step 0 (loss 0/0 = NaN), or an IndexError with M = 2
    Probe("train-plain-empty-batch", lambda: __import__("pipelab").train_plain(
        _mlp(), optimizer=_sgd, batches=_empty_batches()), ValueError, EMPTY),
    Probe("emulator-empty-batch", lambda: _emulate(1, _empty_batches()), ValueError, EMPTY),
    Probe("emulator-empty-batch-M2", lambda: _emulate(2, _empty_batches()), ValueError, EMPTY),
    Probe("prediction-error-empty-batch", _measure_empty, ValueError, EMPTY),
    Probe("prediction-config-batch-0", lambda: import_module("pipelab.studies.prediction_error")
          .PredictionErrorConfig(batch_size=0), ValueError, "batch_size must be an int >= 1, got 0"),
    Probe("in-pipeline-config-batch-0", lambda: import_module("pipelab.studies.prediction_error")
          .InPipelineConfig(batch_size=0), ValueError, "batch_size must be an int >= 1, got 0"),
    Probe("prediction-config-empty-subset", lambda: import_module("pipelab.studies.prediction_error")
          .PredictionErrorConfig(train_subset=0), ValueError, "train_subset must be an int >= 1, got 0"),
    Probe("evaluate-batch-size-0", lambda: _evaluate_chunks(0), ValueError, "batch_size must be an int >= 1, got 0"),
]


def _evaluate_chunks(batch_size: int) -> object:
    from pipelab.emulator import evaluate

    x, y = _x()
    return evaluate([nn.Linear(3, 2).double()], x, y, batch_size=batch_size)


@probes.parametrize(EMPTY_BATCH_PROBES)
def test_empty_batch_probe(probe: Probe) -> None:
    probe.check()


# ------------------------------------------------------------------------------------------- optimizer state


@pytest.mark.parametrize("name", __import__("pipelab.optim", fromlist=["x"]).available_optimizers())
def test_optimizer_state_is_counted_before_the_first_step(name: str) -> None:
    """``plan.weight_bytes`` printed optimizer_state 0 before the first step (torch.optim allocates its state
    lazily): Adam's 2·4n appeared only after a step. The bytes are now those of the stepped optimizer, equal before
    and after a real step, and measuring them changes neither the optimizer nor its parameters."""
    from pipelab.optim import make_optimizer
    from pipelab.precision import optimizer_state_bytes

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4, bias=name != "muon"), nn.Linear(4, 3, bias=False))  # Muon: matrices only
    opt = make_optimizer(name, model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    state = {p: dict(st) for p, st in opt.state.items()}  # empty but for Adagrad, which allocates at construction
    counted = optimizer_state_bytes(opt)
    assert {p: dict(st) for p, st in opt.state.items()} == state
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert counted == optimizer_state_bytes(opt) == sum(v.numel() * v.element_size() for st in opt.state.values()
                                                         for v in st.values() if torch.is_tensor(v))
    assert (counted == 0) == (name == "sgd")  # plain SGD keeps no state


def test_the_emulator_plan_counts_adam_state_before_it_runs() -> None:
    import pipelab
    from pipelab.schedules import pipedream

    model = nn.Sequential(*[nn.Linear(6, 6) for _ in range(4)])
    emu = pipelab.Emulator(model, schedule=pipedream(D=2, M=1, steps=2), policy="stashing",
                           optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3))
    n = [sum(p.numel() for p in model[2 * k: 2 * k + 2].parameters()) for k in range(2)]
    step_counters = 4 * 4  # one fp32 scalar per parameter tensor (2 Linear layers x weight and bias)
    assert [emu.plan.weight_bytes[k]["optimizer_state"] for k in range(2)] == [8 * n[k] + step_counters
                                                                                for k in range(2)]


def test_an_optimizer_that_cannot_be_twinned_warns_and_counts_what_it_holds() -> None:
    from pipelab.precision import optimizer_state_bytes

    class Needy(torch.optim.SGD):
        def __init__(self, params: object, extra: int, **kw: object) -> None:
            super().__init__(params, **kw)  # type: ignore[arg-type]

    opt = Needy([nn.Parameter(torch.zeros(3))], 1, lr=0.1, momentum=0.9)
    with pytest.warns(UserWarning, match=r"cannot measure the state Needy allocates at its first step.*count 0"):
        assert optimizer_state_bytes(opt) == 0
