"""Reference models are Sequentials of blocks; split() cuts them into stages that compose to the model."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from torch import nn

from pipelab.partition import balanced_partition, split, stage_sizes
from pipelab.studies.models import build_model, deep_mlp, small_cnn, small_resnet, transformer_classifier

CASES = [
    ("deep_mlp", dict(depth=8, width=32), (3, 1, 28, 28)),
    ("small_cnn", dict(width=8), (3, 1, 28, 28)),
    ("small_resnet", dict(width=8, blocks_per_stage=1), (3, 1, 28, 28)),
    ("transformer", dict(d_model=16, nhead=2, num_layers=2, dim_feedforward=32), (3, 1, 28, 28)),
]


@pytest.mark.parametrize("name,kwargs,shape", CASES, ids=[c[0] for c in CASES])
def test_models_forward_and_split_exactly(name: str, kwargs: dict, shape: tuple, device: torch.device) -> None:
    model = build_model(name, seed=0, dtype=torch.float64, device=device, **kwargs)
    assert isinstance(model, nn.Sequential) and len(model) >= 4
    x = torch.randn(*shape, dtype=torch.float64, device=device)
    y = model(x)
    assert y.shape == (shape[0], 10)
    for balance in ("layers", "params"):
        h = x
        for stage in split(model, 4, balance):
            h = stage(h)
        assert torch.equal(h, y), balance


def test_build_model_is_seeded() -> None:
    a, b = build_model("deep_mlp", seed=3, depth=4), build_model("deep_mlp", seed=3, depth=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = build_model("deep_mlp", seed=4, depth=4)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))
    with pytest.raises(ValueError, match="deep_mlp"):
        build_model("vgg")


def test_shapes_of_other_inputs() -> None:
    assert deep_mlp(in_features=40, depth=3)(torch.zeros(2, 40)).shape == (2, 10)
    assert transformer_classifier(in_features=40, seq_len=10, d_model=16, nhead=2)(torch.zeros(2, 40)).shape == (2, 10)
    assert small_cnn(image_size=8)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert len(small_resnet(blocks_per_stage=2)) == 8


def test_model_argument_errors() -> None:
    with pytest.raises(ValueError, match="depth"):
        deep_mlp(depth=1)
    with pytest.raises(ValueError, match="activation"):
        deep_mlp(activation="swishy")
    with pytest.raises(ValueError, match="divisible"):
        transformer_classifier(d_model=10, nhead=4)
    with pytest.raises(ValueError, match="norm"):
        small_resnet(norm="layer")


def test_split_shares_modules_and_sizes() -> None:
    model = deep_mlp(depth=10)
    stages = split(model, 4)
    assert [len(s) for s in stages] == [2, 2, 3, 3]
    assert stages[0][0] is model[0]
    assert [len(s) for s in split(model, 3, [2, 3, 5])] == [2, 3, 5]
    assert stage_sizes(model, 10) == [1] * 10


def test_split_by_params_minimises_the_largest_stage() -> None:
    model = deep_mlp(in_features=784, width=64, depth=6)  # the first block is ~12x the others
    counts = [sum(p.numel() for p in b.parameters()) for b in model]
    sizes = stage_sizes(model, 3, "params")
    bounds = list(itertools.accumulate([0] + sizes))
    worst = max(sum(counts[a:b]) for a, b in zip(bounds, bounds[1:]))
    assert sizes[0] == 1 and worst == counts[0]


@pytest.mark.parametrize("D,balance,match", [
    (0, "layers", "positive"), (11, "layers", "only 10 blocks"), (3, [2, 2, 2], "summing to 10"),
    (3, "flops", "balance="), (3, [1.0, 2.0], "one cost per block"),
])
def test_split_errors(D: int, balance: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        split(deep_mlp(depth=10), D, balance)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Sequential"):
        split(nn.ModuleList([nn.Linear(2, 2)]), 1)  # type: ignore[arg-type]


def test_balanced_partition_matches_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        D = rng.randint(1, n)
        costs = [rng.choice([0.0, 1.0, 2.0, 5.0, rng.random()]) for _ in range(n)]
        sizes = balanced_partition(costs, D)
        assert len(sizes) == D and sum(sizes) == n and min(sizes) >= 1

        def worst(cuts: tuple[int, ...], costs: list = costs, n: int = n) -> float:
            b = (0, *cuts, n)
            return max(sum(costs[x:y]) for x, y in zip(b, b[1:]))

        best = min(worst(c) for c in itertools.combinations(range(1, n), D - 1))
        got = worst(tuple(itertools.accumulate(sizes[:-1])))
        assert got == pytest.approx(best, abs=1e-12)


def test_split_keeps_every_position_of_a_reused_module() -> None:
    """One ``nn.ReLU()`` object at positions 1 and 3 is a block at both: ``children()`` lists it once."""
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(3, 4), relu, nn.Linear(4, 4), relu, nn.Linear(4, 2))
    stages = split(model, 2)
    assert [len(s) for s in stages] == [2, 3]
    assert [m for s in stages for m in s] == list(model)  # the same modules, position by position
    x = torch.randn(5, 3)
    h = x
    for s in stages:
        h = s(h)
    assert torch.equal(h, model(x))


def test_split_shares_a_parameterized_module_within_one_stage_only() -> None:
    lin = nn.Linear(4, 4)
    model = nn.Sequential(nn.Linear(3, 4), lin, nn.Tanh(), lin, nn.Linear(4, 2))
    assert [len(s) for s in split(model, 2, [1, 4])] == [1, 4]  # both uses of lin in stage 1: fine
    with pytest.raises(ValueError, match=r"block 1 \(stage 0\) and block 3 \(stage 1\) share parameters"):
        split(model, 2, [2, 3])


def test_split_accepts_numpy_integers() -> None:
    model = deep_mlp(depth=6)
    assert [len(s) for s in split(model, np.int64(3))] == [2, 2, 2]
    assert [len(s) for s in split(model, 2, [np.int64(2), np.int64(4)])] == [2, 4]


def test_bias_free_mlp_is_the_mlp_with_zero_biases_and_muon_trains_all_of_it() -> None:
    from pipelab.studies.models import he_init

    with_bias = build_model("deep_mlp", seed=1, dtype=torch.float64, in_features=12, width=8, depth=4)
    bare = build_model("deep_mlp", seed=1, dtype=torch.float64, in_features=12, width=8, depth=4, bias=False)
    he_init(with_bias, 1)  # zero biases, and the same He draws for the weights of both
    he_init(bare, 1)
    assert all(p.dim() == 2 for p in bare.parameters())
    assert sum(p.numel() for p in with_bias.parameters()) - sum(p.numel() for p in bare.parameters()) == 8 * 3 + 10
    x = torch.randn(5, 12, dtype=torch.float64)
    assert torch.equal(with_bias(x), bare(x))
    before = [p.detach().clone() for p in bare.parameters()]
    opt = torch.optim.Muon(bare.parameters(), lr=0.02)  # refuses the biased net's 1-D biases
    torch.nn.functional.cross_entropy(bare(x), torch.arange(5)).backward()
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, bare.parameters()))
    with pytest.raises(ValueError, match="2D"):
        torch.optim.Muon(with_bias.parameters())
    with pytest.raises(TypeError, match="bias"):
        deep_mlp(bias=0)  # type: ignore[arg-type]


def test_the_bias_free_learning_curve_task_runs_muon() -> None:
    from pipelab.studies.data import DataError
    from pipelab.studies.learning_curves import RunConfig, run

    try:
        rec = run(RunConfig(task="fashion_mnist_mlp_nobias", policy="2bw", optimizer="muon", D=4, seed=0, epochs=1,
                            batch_size=32, n_train=128, n_test=64, n_eval_train=64, lr=0.02))
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    assert not rec["diverged"] and rec["train_loss"][1] < rec["train_loss"][0]
