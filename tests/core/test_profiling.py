"""The stage profiler: one value per stage, positive costs, exact repeatable sizes, and the simulate round trip.

No timing is asserted (costs are wall-clock seconds): only shapes, signs, the sizes and that the simulator
takes the profile as it is.
"""

from __future__ import annotations

import math

import pytest
import torch

from pipelab.partition import split
from pipelab.profiling import StageProfile, profile_stage, profile_stages
from pipelab.schedules import Schedule, gpipe, one_f_one_b
from pipelab.simulator import costs_from_profile, simulate
from pipelab.studies.models import deep_mlp

D = 3


def _stages() -> list[torch.nn.Sequential]:
    torch.manual_seed(0)
    return split(deep_mlp(in_features=6, width=12, depth=5), D)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g), torch.randint(0, 10, (8,), generator=g)


@pytest.fixture(scope="module")
def profile() -> StageProfile:
    return profile_stages(_stages(), *_batch(), reps=2, warmup=1, threads=1)


def test_one_positive_cost_per_stage(profile: StageProfile) -> None:
    assert profile.D == D
    for name in ("f_cost", "b_cost", "u_cost", "copy_cost", "i_cost", "w_cost"):
        values = getattr(profile, name)
        assert len(values) == D and all(math.isfinite(v) and v > 0 for v in values), name
    assert len(profile.activation_bytes) == len(profile.weight_bytes) == D


def test_sizes_are_exact_and_repeat(profile: StageProfile) -> None:
    stages = _stages()
    assert profile.weight_bytes == [sum(p.numel() * p.element_size() for p in s.parameters()) for s in stages]
    assert all(b > 0 for b in profile.activation_bytes)
    again = profile_stages(stages, *_batch(), reps=1, warmup=0)
    assert again.activation_bytes == profile.activation_bytes and again.weight_bytes == profile.weight_bytes


def test_stages_and_thread_count_are_left_as_they_were() -> None:
    stages = _stages()
    before = [[p.detach().clone() for p in s.parameters()] for s in stages]
    threads = torch.get_num_threads()
    profile_stages(stages, *_batch(), reps=1, warmup=0, threads=1)
    assert torch.get_num_threads() == threads
    for s, ps in zip(stages, before):
        assert all(torch.equal(a, b) and a.grad is None for a, b in zip(s.parameters(), ps))


def test_the_simulator_takes_the_profile(profile: StageProfile) -> None:
    for schedule in (gpipe(D, 4), one_f_one_b(D, 4, 2)):
        direct = simulate(schedule, f_cost=profile.f_cost, b_cost=profile.b_cost,
                          activation_bytes=profile.activation_bytes, weight_bytes=profile.weight_bytes)
        via = simulate(schedule, profile=profile)  # costs_from_profile reads the attributes
        assert via.makespan == direct.makespan > 0
        assert via.peak_activation_bytes is not None and direct.peak_activation_bytes is not None
        assert via.peak_activation_bytes.tolist() == direct.peak_activation_bytes.tolist()
        full = simulate(schedule, **profile.costs())
        assert full.makespan >= direct.makespan  # the updates' time is added
    assert set(costs_from_profile(profile)) == {"f_cost", "b_cost", "activation_bytes", "weight_bytes"}
    # a split backward is timed with the measured I and W passes, not with halves of B
    fused, split = one_f_one_b(D, 4), _split(one_f_one_b(D, 4))
    costs = profile.costs()
    r = simulate(split, **costs)
    assert r.makespan > 0 and r.makespan != simulate(split, **{k: v for k, v in costs.items()
                                                              if k not in ("i_cost", "w_cost")}).makespan
    assert simulate(fused, **costs).makespan == simulate(fused, **{k: v for k, v in costs.items()
                                                                   if k not in ("i_cost", "w_cost")}).makespan


def _split(s: Schedule) -> Schedule:
    """Every B of ``s`` as I immediately followed by W."""
    progs = [[b for a in p for b in ((a._replace(op="I"), a._replace(op="W")) if a.op == "B" else (a,))]
             for p in s.programs]
    return Schedule(s.name + " split", progs, s.D, s.M, s.steps)


def test_one_stage_profile_matches_its_pipeline_entry(profile: StageProfile) -> None:
    x, y = _batch()
    c = profile_stage(_stages()[0], x, reps=1, warmup=0, input_grad=False)
    assert c.activation_bytes == profile.activation_bytes[0] and c.weight_bytes == profile.weight_bytes[0]
    assert c.f > 0 and c.b > 0 and c.u > 0 and c.copy > 0


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(reps=0), ValueError, "reps"), (dict(warmup=-1), ValueError, "warmup"),
    (dict(reps=1.5), ValueError, "reps"), (dict(threads=0), ValueError, "threads"),
])
def test_bad_arguments_are_refused(kwargs: dict, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        profile_stages(_stages(), *_batch(), **kwargs)


def test_a_whole_model_is_not_a_list_of_stages() -> None:
    with pytest.raises(TypeError, match="stages"):
        profile_stages(deep_mlp(in_features=6, width=12, depth=5), *_batch())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stages"):
        profile_stages([], *_batch())
