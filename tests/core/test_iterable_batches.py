"""Mini-batches from an iterable: a researcher's own ``DataLoader`` or generator, read once, in order.

``train_plain(batches=DataLoader(...))`` used to fail with ``AttributeError: 'DataLoader' object has no attribute
'__getitem__'`` (it took the loader's length, then indexed it), and ``Emulator.run`` refused any iterable. Both now
read the t-th item as mini-batch t, and train exactly as on ``list(loader)`` (float64, equal to the last bit).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pipelab.distributed import spawn
from pipelab.emulator import Emulator, train_plain
from pipelab.pipeline.driver import IterableBatches, MiniBatches
from pipelab.schedules import gpipe, one_f_one_b, pipedream, pipedream_2bw
from pipelab.studies.models import deep_mlp

BATCH, STEPS = 8, 6


def _model(D: int = 4) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return deep_mlp(in_features=6, width=8, depth=D, num_classes=4).double()


def _loader(steps: int = STEPS) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(steps * BATCH, 6, generator=g, dtype=torch.float64),
                         torch.randint(0, 4, (steps * BATCH,), generator=g))
    return DataLoader(data, batch_size=BATCH)  # no shuffle: list(loader) is the same mini-batches


def _sgdm(ps):
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert torch.equal(u, v)


def test_train_plain_takes_a_dataloader_and_trains_as_on_its_list() -> None:
    ref, got = _model(), _model()
    want = train_plain(ref, optimizer=_sgdm, batches=list(_loader()), D=2)
    losses = train_plain(got, optimizer=_sgdm, batches=_loader(), D=2)
    assert losses == want
    _same(list(got.parameters()), list(ref.parameters()))


def test_train_plain_takes_a_generator_given_its_steps() -> None:
    ref, got = _model(), _model()
    want = train_plain(ref, optimizer=_sgdm, batches=list(_loader()))
    assert train_plain(got, optimizer=_sgdm, batches=(b for b in _loader()), steps=STEPS) == want
    with pytest.raises(ValueError, match="steps is required .* iterable without a length"):
        train_plain(_model(), optimizer=_sgdm, batches=(b for b in _loader()))
    with pytest.raises(ValueError, match="needs mini-batch 6 but the iterable .* ended after 6"):
        train_plain(_model(), optimizer=_sgdm, batches=(b for b in _loader()), steps=STEPS + 1)


SCHEDULES = {
    "gpipe": (lambda: gpipe(4, 2, STEPS), "gpipe"),
    "1f1b": (lambda: one_f_one_b(4, 2, STEPS), "gpipe"),
    "stashing": (lambda: pipedream(4, 1, STEPS), "stashing"),
    "pipeoptim": (lambda: pipedream(4, 1, STEPS), "pipeoptim"),
    "2bw": (lambda: pipedream_2bw(4, 4, STEPS), "2bw"),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("form", ["dataloader", "generator"])
def test_the_emulator_trains_on_an_iterable_as_on_its_list(name: str, form: str) -> None:
    build, policy = SCHEDULES[name]

    def emulator() -> Emulator:
        return Emulator(_model(), schedule=build(), policy=policy, optimizer=_sgdm)

    ref, got = emulator(), emulator()
    want = ref.run(list(_loader()))
    res = got.run(_loader() if form == "dataloader" else (b for b in _loader()))
    assert res.losses == want.losses
    for a, b in zip(got.weights(), ref.weights()):
        _same(list(a), list(b))


class _Stream(torch.utils.data.IterableDataset):
    """A dataset without a length: its DataLoader's ``len()`` raises TypeError."""

    def __iter__(self):
        return iter(list(_loader().dataset))


def test_a_loader_without_a_length_is_read_until_the_schedule_ends() -> None:
    loader = DataLoader(_Stream(), batch_size=BATCH)
    with pytest.raises(TypeError):
        len(loader)
    ref, got = _model(), _model()
    want = train_plain(ref, optimizer=_sgdm, batches=list(_loader()))
    assert train_plain(got, optimizer=_sgdm, batches=loader, steps=STEPS) == want
    with pytest.raises(ValueError, match="steps is required .* iterable without a length, got DataLoader"):
        train_plain(_model(), optimizer=_sgdm, batches=loader)
    emu = Emulator(_model(), schedule=pipedream(4, 1, STEPS), policy="stashing", optimizer=_sgdm)
    res = emu.run(loader)
    ref_emu = Emulator(_model(), schedule=pipedream(4, 1, STEPS), policy="stashing", optimizer=_sgdm)
    assert res.losses == ref_emu.run(list(_loader())).losses


def test_too_short_an_iterable_is_refused() -> None:
    emu = Emulator(_model(), schedule=gpipe(4, 2, STEPS), policy="gpipe", optimizer=_sgdm)
    with pytest.raises(ValueError, match=f"runs {STEPS} steps but only {STEPS - 1} mini-batches"):
        emu.run(_loader(STEPS - 1))  # a length: refused before any training
    emu = Emulator(_model(), schedule=gpipe(4, 2, STEPS), policy="gpipe", optimizer=_sgdm)
    with pytest.raises(ValueError, match=f"needs mini-batch {STEPS - 1} but the iterable .* ended after {STEPS - 1}"):
        emu.run(b for b in _loader(STEPS - 1))


def test_an_iterable_is_read_in_order_and_held_only_while_in_flight() -> None:
    """PipeDream with D = 4 has at most 4 mini-batches in flight: a generator's items must be let go after their
    last job, as a sequence's are (the run does not hold the whole loader in memory)."""
    steps, alive, refs = 16, [], []

    def items() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in _loader(steps):
            gc.collect()
            alive.append(sum(r() is not None for r in refs))
            refs.append(weakref.ref(x))
            yield x, y

    emu = Emulator(_model(), schedule=pipedream(4, 1, steps), policy="stashing", optimizer=_sgdm)
    emu.run(items())
    assert len(refs) == steps  # read exactly the schedule's mini-batches
    assert max(alive) <= 4, alive


def test_iterable_batches_refuses_a_second_read() -> None:
    src = IterableBatches(iter(range(5)))  # type: ignore[arg-type]
    assert src(2) == 2  # 0 and 1 were read on the way, held for their turn
    assert src(1) == 1 and src(0) == 0
    with pytest.raises(RuntimeError, match="mini-batch 0 was read from the iterable and handed out already"):
        src(0)
    data = MiniBatches(_loader(), 2, STEPS, reference=None)
    assert not data.sequence and MiniBatches(list(_loader()), 2, STEPS, reference=None).sequence


def test_a_dataset_given_for_its_loader_is_refused_with_the_fix() -> None:
    """A ``Dataset`` indexes single examples: the first "mini-batch" has a scalar target, and the error says to wrap
    the dataset in a DataLoader."""
    emu = Emulator(_model(), schedule=gpipe(4, 2, STEPS), policy="gpipe", optimizer=_sgdm)
    with pytest.raises(ValueError, match="a Dataset gives one per index, so pass a DataLoader over it"):
        emu.run(_loader().dataset)


def test_train_plain_refuses_a_dataset_as_the_emulator_does() -> None:
    """train_plain is the reference the emulator is checked against, yet it trained on a Dataset's single unbatched
    examples without a word (cross-entropy takes a (C,) input with a scalar target), where the emulator refuses the
    same data: it now checks every mini-batch's form the emulator's way."""
    with pytest.raises(ValueError, match="a Dataset gives one per index, so pass a DataLoader over it"):
        train_plain(_model(), optimizer=_sgdm, batches=_loader().dataset)
    with pytest.raises(TypeError, match="mini-batch 0 must be a tuple"):
        train_plain(_model(), optimizer=_sgdm, batches=[torch.zeros(BATCH, 6, dtype=torch.float64)])


def test_neither_sequence_callable_nor_iterable_is_refused_by_name() -> None:
    emu = Emulator(_model(), schedule=gpipe(4, 2, STEPS), policy="gpipe", optimizer=_sgdm)
    with pytest.raises(TypeError, match="or an iterable of them .* got int"):
        emu.run(3)  # type: ignore[arg-type]


def _two_ranks(rank: int, world: int) -> list:
    from pipelab import PipelineRuntime

    rt = PipelineRuntime(_model(), schedule=pipedream(2, 1, STEPS), policy="stashing", optimizer=_sgdm)
    res = rt.run(_loader())
    return [res.losses, {k: [w.clone() for w in W] for k, W in res.weights.items()}]


@pytest.mark.slow
def test_the_runtime_trains_on_a_dataloader_as_the_emulator() -> None:
    """Two gloo ranks, each given its own DataLoader (not read ahead for the same-data check, which a sequence gets)."""
    per_rank = spawn(_two_ranks, 2)
    emu = Emulator(_model(), schedule=pipedream(2, 1, STEPS), policy="stashing", optimizer=_sgdm)
    want = emu.run(list(_loader()))
    got = {k: W for _, weights in per_rank for k, W in weights.items()}
    assert per_rank[-1][0] == want.losses
    for k, W in enumerate(emu.weights()):
        _same(list(got[k]), list(W))

