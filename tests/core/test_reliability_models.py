"""Reliability of real user models: frozen parameters, stages returning tuples or dicts, mini-batch shapes that
change mid-run.

- Frozen parameters (``requires_grad=False``, an integer tensor held as a parameter, a stage frozen whole) train
  exactly like plain PyTorch with an optimizer over all parameters or over the trainable ones (float64), under
  flushed and asynchronous policies (against the same pipeline with the frozen tensors held as buffers), on
  placed schedules, in the runtime (gloo, 2 ranks) and through a checkpoint; they never change, are never
  predicted and never stored as versions.
- Stages whose outputs are tuples and dicts (integer masks, ``None`` entries, floating entries that do not need a
  gradient) equal ``nn.Sequential`` plain training in the emulator and in the runtime.
- A mini-batch whose shape changes is run (a smaller last batch: emulator ≡ plain ≡ runtime) or named.

Probes (one line per refusal): ``PROBES`` run in this process, ``SLOW_PROBES`` spawn 2 ranks (gloo).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import probes
import pytest
import torch
from probes import Probe
from torch import Tensor, nn

from pipelab.distributed import RankFailure, differences, spawn
from pipelab.emulator import Emulator, evaluate, train_plain
from pipelab.precision import Precision
from pipelab.profiling import profile_stages
from pipelab.runtime import PipelineRuntime, load_checkpoint, save_checkpoint
from pipelab.schedules import (
    ddp,
    fsdp,
    gpipe,
    interleaved_1f1b,
    lpp,
    naive,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
    zb_h1,
)

TOL = 1e-10
BATCH = 8
F64 = torch.float64


# ----------------------------------------------------------------------------------------------- models and data


class Permute(nn.Module):
    """tanh(x[:, idx]·w): a trainable scale and an integer permutation held as a frozen parameter."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, n, dtype=F64))
        self.idx = nn.Parameter(torch.arange(n).flip(0), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x[:, self.idx] * self.w)


def frozen_stages(D: int = 4, seed: int = 0) -> list[nn.Module]:
    """Linear (bias frozen) | Permute (integer parameter) | Linear frozen whole | Linear head, as D = 4 or 2 stages."""
    torch.manual_seed(seed)
    first = nn.Sequential(nn.Linear(6, 8), nn.Tanh()).double()
    first[0].bias.requires_grad_(False)
    frozen = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).double().requires_grad_(False)
    stages: list[nn.Module] = [first, Permute(8), frozen, nn.Linear(8, 4).double()]
    return stages if D == 4 else [nn.Sequential(*stages[:2]), nn.Sequential(*stages[2:])]


class Split(nn.Module):
    """x -> (h, mask, x): an integer mask and the raw input (floating, needing no gradient on stage 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 8)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return torch.tanh(self.lin(x)), (x[:, 0] > 0).long(), x


class Gate(nn.Module):
    """(h, mask, x) -> {"h", "skip", "mask"}: a dict hand-over."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, inp: tuple[Tensor, Tensor, Tensor]) -> dict[str, Tensor]:
        h, mask, x = inp
        g = torch.tanh(self.lin(h)) * (1 + mask[:, None].to(h.dtype))
        return {"h": g, "skip": h + x.sum(1, keepdim=True), "mask": mask}


class Mix(nn.Module):
    """dict -> (h, None, mask, skip): a None entry, and a floating entry the next stage does not use."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, d: dict[str, Tensor]) -> tuple[Tensor, None, Tensor, Tensor]:
        return torch.tanh(self.lin(d["h"]) + d["skip"]), None, d["mask"], d["skip"]


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, inp: tuple[Tensor, None, Tensor, Tensor]) -> Tensor:
        h, _, mask, _ = inp
        return self.lin(h) + mask[:, None].to(h.dtype)


def tuple_stages(D: int = 4, seed: int = 0) -> list[nn.Module]:
    """Split | Gate | Mix | Head (tuple, dict, tuple-with-None hand-overs), as D = 4 or 2 stages."""
    torch.manual_seed(seed)
    stages: list[nn.Module] = [m.double() for m in (Split(), Gate(), Mix(), Head())]
    return stages if D == 4 else [stages[0], nn.Sequential(*stages[1:])]


def data(steps: int, seed: int = 1, last: int | None = None) -> list[tuple[Tensor, Tensor]]:
    """``steps`` mini-batches of BATCH examples (the last one of ``last`` examples when given)."""
    g = torch.Generator().manual_seed(seed)
    out = [(torch.randn(BATCH, 6, generator=g, dtype=F64), torch.randint(0, 4, (BATCH,), generator=g))
           for _ in range(steps)]
    if last is not None:
        out[-1] = (out[-1][0][:last], out[-1][1][:last])
    return out


OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
    "adam_trainable": lambda ps: torch.optim.Adam([p for p in ps if p.requires_grad], lr=0.01, weight_decay=0.1),
    "sgdm": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.1),
}


def as_buffers(stages: list[nn.Module]) -> list[nn.Module]:
    """A copy whose frozen parameters are buffers (constants the pipeline never versions): the reference for
    frozen parameters under asynchronous policies, whose runs are not plain training."""
    twin = copy.deepcopy(stages)
    for st in twin:
        for mod in st.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None and not p.requires_grad:
                    del mod._parameters[name]
                    mod.register_buffer(name, p.detach().clone())
    return twin


def trainable(stages: list[nn.Module]) -> list[Tensor]:
    return [p for s in stages for p in s.parameters() if p.requires_grad]


def frozen(stages: list[nn.Module]) -> list[Tensor]:
    return [p.detach().clone() for s in stages for p in s.parameters() if not p.requires_grad]


def max_diff(a: list[Tensor], b: list[Tensor]) -> float:
    assert len(a) == len(b) and a
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def plain_torch(stages: list[nn.Module], batches: list[tuple[Tensor, Tensor]], M: int) -> list[Tensor]:
    """Plain PyTorch, written out: one Adam over *all* parameters of the model (frozen and integer ones
    included: torch.optim skips a parameter without a gradient), M micro-batches of loss ℓ_j/M per step."""
    model = nn.Sequential(*stages)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        for xj, yj in zip(x.chunk(M), y.chunk(M)):
            (nn.functional.cross_entropy(model(xj), yj) / M).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


# ----------------------------------------------------------------------------------------------- frozen parameters


@pytest.mark.parametrize("opt", ["adam", "adam_trainable"])
@pytest.mark.parametrize("name,build", [("gpipe", lambda T: gpipe(4, 2, T)), ("1f1b", lambda T: one_f_one_b(4, 2, T)),
                                        ("zb_h1", lambda T: zb_h1(4, 4, T))])
def test_frozen_parameters_flushed_equal_plain_torch(name, build, opt) -> None:
    """A flushed pipeline with frozen parameters (part of a stage, an integer parameter, a whole stage) equals
    plain PyTorch with one Adam over all parameters, whether the factory keeps all or only trainable ones."""
    T, schedule = 4, build(4)
    want = plain_torch(frozen_stages(), data(T), M=schedule.M)
    stages = frozen_stages()
    before = frozen(stages)
    emu = Emulator(stages, schedule=schedule, policy="1f1b" if name != "gpipe" else "gpipe", optimizer=OPTIMIZERS[opt])
    emu.run(data(T))
    got = [w for W in emu.weights() for w in W]  # named_parameters order, frozen included
    assert max_diff(got, want) <= TOL
    assert max_diff(frozen(stages), before) == 0.0
    assert max_diff(trainable(stages), trainable(frozen_stages())) > 1e-3  # it trained
    # the all-frozen stage has no optimizer; the others' optimizers hold exactly the trainable parameters
    assert emu.stages[2].optimizer is None and emu.weight_copies[2] == 0
    for st in emu.stages:
        held = [] if st.optimizer is None else [p for g in st.optimizer.param_groups for p in g["params"]]
        assert {id(p) for p in held} == {id(p) for p in st.module.parameters() if p.requires_grad}
    # train_plain gives its factory the trainable parameters too, so it accepts both factories
    ref2 = frozen_stages()
    train_plain(ref2, optimizer=OPTIMIZERS[opt], batches=data(T), micro_batches=schedule.M)
    assert max_diff([p.detach() for s in ref2 for p in s.parameters()], want) <= TOL


ASYNC = [("stashing", lambda T: pipedream(4, 1, T), "adam"), ("vertical_sync", lambda T: pipedream(4, 1, T), "adam"),
         ("pipeoptim", lambda T: pipedream(4, 1, T), "adam"), ("spectrain", lambda T: pipedream(4, 1, T), "sgdm"),
         ("pipemare", lambda T: pipedream(4, 1, T), "sgdm"), ("2bw", lambda T: pipedream_2bw(4, 4, T), "adam")]


@pytest.mark.parametrize("policy,build,opt", ASYNC, ids=[p for p, _, _ in ASYNC])
def test_frozen_parameters_under_asynchronous_policies(policy, build, opt) -> None:
    """Under stashing, vertical sync, PipeOptim, SpecTrain, PipeMare and 2BW a frozen parameter behaves as a
    constant: the run equals the same pipeline with the frozen tensors held as buffers, bit for bit; frozen
    tensors never change, are never handed to the predictor and never stored as versions."""
    T = 8
    stages = frozen_stages()
    before = frozen(stages)
    twin = as_buffers(stages)
    emu = Emulator(stages, schedule=build(T), policy=policy, optimizer=OPTIMIZERS[opt])
    seen: list[int] = []
    for st in emu.stages:  # every weight tuple a job gets (stored or predicted) holds the trainable tensors only
        n = len(st.params)
        st.on_weights = lambda event, spec, W, n=n: seen.append(len(W) - n)
    res = emu.run(data(T))
    res_twin = Emulator(twin, schedule=build(T), policy=policy, optimizer=OPTIMIZERS[opt]).run(data(T))
    assert max_diff(trainable(stages), [p for s in twin for p in s.parameters()]) == 0.0
    assert res.losses == res_twin.losses and res.current == res_twin.current
    assert max_diff(frozen(stages), before) == 0.0
    assert seen and set(seen) == {0}
    assert res.weight_copies == res_twin.weight_copies and res.weight_copies[2] == 0
    for st in emu.stages:  # stored versions hold the trainable tensors only
        assert all(len(st.ring.get(v)) == len(st.params) for v in st.ring.versions())


PLACED = [("ddp", lambda T: ddp(D=4, M=4, W=2, steps=T)), ("fsdp", lambda T: fsdp(D=4, M=4, W=2, steps=T)),
          ("lpp", lambda T: lpp(D=4, M=4, G=2, R=2, steps=T))]


@pytest.mark.parametrize("name,build", PLACED, ids=[n for n, _ in PLACED])
def test_frozen_parameters_on_placed_schedules_equal_plain_torch(name, build) -> None:
    """DDP, FSDP and LPP leave frozen tensors out of every all-reduce, reduce and broadcast (each holder reads its
    own copy) and still equal plain PyTorch; the bytes they move are the trainable parameters' only."""
    T = 3
    want = plain_torch(frozen_stages(), data(T), M=4)
    stages = frozen_stages()
    emu = Emulator(stages, schedule=build(T), policy="gpipe", optimizer=OPTIMIZERS["adam_trainable"])
    res = emu.run(data(T))
    assert max_diff([w for W in emu.weights() for w in W], want) <= TOL
    for (_, k), W in res.extra["copies"].items():  # every holder's copy, frozen tensors included, agrees
        assert len(W) == len(emu.weights()[k]) and max_diff(list(W), list(emu.weights()[k])) == 0.0
    moved = sum(sum(c["bytes_sent"].values()) for c in res.extra["collectives"].values())
    res_twin = Emulator(as_buffers(frozen_stages()), schedule=build(T), policy="gpipe",
                        optimizer=OPTIMIZERS["adam_trainable"]).run(data(T))
    assert moved == sum(sum(c["bytes_sent"].values()) for c in res_twin.extra["collectives"].values()) > 0


def test_ranks_that_freeze_different_parameters_disagree() -> None:
    """The runtime's fingerprint marks frozen parameters, so ranks (or a resumed run) that freeze different ones,
    and would therefore version, predict and all-reduce different tensors, are refused at start-up."""
    def fingerprint(unfreeze: bool) -> dict[str, Any]:
        stages = frozen_stages(D=2)
        if unfreeze:
            stages[0][0][0].bias.requires_grad_(True)
        return PipelineRuntime(stages, schedule=pipedream(2, 1, 2), policy="stashing", optimizer=OPTIMIZERS["adam"],
                               rank=0, world_size=2).fingerprint()

    diffs = differences(fingerprint(False), fingerprint(True))
    assert [path for path, _, _ in diffs] == ["stages.0.1"], diffs


# ------------------------------------------------------------------------------ parameters no gradient reaches


class Branches(nn.Module):
    """tanh(lin(x)), plus ``sometimes(x)`` on every third call, and a parameter ``unused`` that nothing calls: in
    plain torch no gradient reaches ``unused`` and ``sometimes`` only in the steps that called it; the optimizer
    skips a parameter without a gradient (no weight decay, no moment update)."""

    def __init__(self, n: int, by_data: bool = False) -> None:
        super().__init__()
        self.lin, self.sometimes, self.unused = nn.Linear(n, n), nn.Linear(n, n), nn.Linear(n, n)
        self.calls, self.by_data = 0, by_data

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        h = self.lin(x)
        # by_data: the branch taken when the micro-batch's first value is positive (the same micro-batches take it
        # on every copy of the stage, where a call counter would count each copy's own calls)
        use = bool(x[0, 0] > 0) if self.by_data else self.calls % 3 == 0
        return torch.tanh(h + self.sometimes(x) if use else h)


def branch_stages(by_data: bool = False) -> list[nn.Module]:
    torch.manual_seed(3)
    stages: list[nn.Module] = [nn.Sequential(nn.Linear(6, 8), nn.Tanh()), Branches(8, by_data), nn.Linear(8, 8),
                               nn.Linear(8, 4)]
    return [s.double() for s in stages]


@pytest.mark.parametrize("name,build", [("gpipe", lambda T: gpipe(4, 2, T)), ("1f1b", lambda T: one_f_one_b(4, 2, T)),
                                        ("zb_h1", lambda T: zb_h1(4, 4, T))])
def test_parameters_no_gradient_reaches_are_skipped_as_plain_torch_does(name, build) -> None:
    """A parameter no gradient reaches in a step is left out of that step's update, as torch.optim does (Adam with
    L2 weight decay: a zero gradient instead would move it by the decay): the flushed pipelines equal plain PyTorch
    (float64, 1e-10); the never-used parameter ends bitwise as it began."""
    T, schedule = 4, build(4)
    want = plain_torch(branch_stages(), data(T), M=schedule.M)
    stages = branch_stages()
    before = [p.detach().clone() for p in stages[1].unused.parameters()]
    Emulator(stages, schedule=schedule, policy="gpipe" if name == "gpipe" else "1f1b",
             optimizer=OPTIMIZERS["adam"]).run(data(T))
    assert max_diff([p.detach() for s in stages for p in s.parameters()], want) <= TOL
    assert max_diff([p.detach() for p in stages[1].unused.parameters()], before) == 0.0
    start = [p.detach() for p in branch_stages()[1].sometimes.parameters()]
    assert max_diff([p.detach() for p in stages[1].sometimes.parameters()], start) > 1e-3  # it trained


@pytest.mark.parametrize("name,build", PLACED, ids=[n for n, _ in PLACED])
def test_parameters_no_gradient_reaches_on_placed_schedules_equal_plain_torch(name, build) -> None:
    """DDP, FSDP and LPP reduce, with the gradients, which weights a gradient reached on any copy: a weight no copy's
    gradient reached is left out of the update on every holder, and the run equals plain PyTorch."""
    T = 3
    want = plain_torch(branch_stages(by_data=True), data(T), M=4)
    stages = branch_stages(by_data=True)
    res = Emulator(stages, schedule=build(T), policy="gpipe", optimizer=OPTIMIZERS["adam"]).run(data(T))
    got = [p.detach() for s in stages for p in s.parameters()]
    assert max_diff(got, want) <= TOL
    for (_, k), W in res.extra["copies"].items():  # every holder's copy agrees
        assert max_diff(list(W), [p.detach() for p in stages[k].parameters()]) == 0.0


@pytest.mark.parametrize("policy,build,opt", ASYNC, ids=[p for p, _, _ in ASYNC])
def test_a_parameter_no_gradient_reaches_never_moves_under_asynchronous_policies(policy, build, opt) -> None:
    """Stashing, vertical sync, PipeOptim, SpecTrain, PipeMare and 2BW leave a never-used parameter as it began,
    under weight decay (the predictors read no optimizer state for it), in the fp32 masters and with half-precision
    versions alike."""
    for precision in (None, Precision("bf16", versions="compute")):  # bf16 keeps fp32 masters
        dtype = F64 if precision is None else torch.float32
        stages = [s.to(dtype) for s in branch_stages()]
        before = [p.detach().clone() for p in stages[1].unused.parameters()]
        res = Emulator(stages, schedule=build(8), policy=policy, optimizer=OPTIMIZERS[opt],
                       precision=precision).run([(x.to(dtype), y) for x, y in data(8)])
        assert all(map(math.isfinite, res.losses))
        assert max_diff([p.detach() for p in stages[1].unused.parameters()], before) == 0.0


# ----------------------------------------------------------------------------------------------- tuple and dict outputs


@pytest.mark.parametrize("name,build", [("naive", lambda T: naive(4, 2, T)), ("gpipe", lambda T: gpipe(4, 2, T)),
                                        ("1f1b", lambda T: one_f_one_b(4, 2, T)), ("zb_h1", lambda T: zb_h1(4, 4, T))])
@pytest.mark.parametrize("recompute", [False, True])
def test_tuple_and_dict_outputs_equal_sequential_plain_training(name, build, recompute) -> None:
    """Stages handing over (h, mask, x), a dict, and (h, None, mask, skip) equal the uncut nn.Sequential trained
    plainly: the next stage gets the structure as its one input, gradients flow back through its floating tensors
    (an unused one and one that needs none included), integer masks pass unchanged."""
    T, schedule = 4, build(4)
    ref = tuple_stages()
    losses = train_plain(nn.Sequential(*ref), optimizer=OPTIMIZERS["sgdm"], batches=data(T), micro_batches=schedule.M)
    stages = tuple_stages()
    policy = {"naive": "sequential", "gpipe": "gpipe"}.get(name, "1f1b")
    res = Emulator(stages, schedule=schedule, policy=policy, optimizer=OPTIMIZERS["sgdm"], recompute=recompute
                   ).run(data(T))
    assert max_diff(trainable(stages), trainable(ref)) <= TOL
    assert max(abs(a - b) for a, b in zip(res.losses, losses)) <= TOL
    assert max_diff(trainable(stages), trainable(tuple_stages())) > 1e-3


class Bad(nn.Module):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.lin, self.value = nn.Linear(6, 4).double(), value

    def forward(self, x: Tensor) -> Any:
        return (self.lin(x), self.value)


def bad_output(value: Any) -> None:
    torch.manual_seed(0)
    Emulator([Bad(value), nn.Linear(4, 4).double()], schedule=gpipe(2, 2, 1), policy="gpipe",
             optimizer=OPTIMIZERS["sgdm"]).run(data(1))


# ----------------------------------------------------------------------------------------------- changing shapes


def test_smaller_last_batch_equals_plain_training() -> None:
    """A last mini-batch of 4 examples instead of 8 runs in the emulator exactly as in plain training."""
    T = 3
    ref = frozen_stages()
    losses = train_plain(ref, optimizer=OPTIMIZERS["adam"], batches=data(T, last=4), micro_batches=2)
    stages = frozen_stages()
    res = Emulator(stages, schedule=one_f_one_b(4, 2, T), policy="1f1b", optimizer=OPTIMIZERS["adam"]
                   ).run(data(T, last=4))
    assert max_diff(trainable(stages), trainable(ref)) <= TOL
    assert max(abs(a - b) for a, b in zip(res.losses, losses)) <= TOL


class Embed(nn.Module):
    """{"tokens", "mask", "scale"} -> (masked mean of the token embeddings) · scale: a stage 0 whose input is a dict
    (token ids, an attention mask and a floating scale, each with the examples along dimension 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6, dtype=F64)

    def forward(self, d: dict[str, Tensor]) -> Tensor:
        m = d["mask"].to(F64)[:, :, None]
        return (self.emb(d["tokens"]) * m).sum(1) / m.sum(1).clamp(min=1) * d["scale"][:, None]


def dict_stages(D: int = 4) -> list[nn.Module]:
    torch.manual_seed(2)
    stages: list[nn.Module] = [Embed(), nn.Sequential(nn.Linear(6, 8), nn.Tanh()).double(),
                               nn.Sequential(nn.Linear(8, 8), nn.Tanh()).double(), nn.Linear(8, 4).double()]
    return stages if D == 4 else [nn.Sequential(*stages[:2]), nn.Sequential(*stages[2:])]


def dict_data(steps: int, seed: int = 1) -> list[tuple[dict[str, Tensor], Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [({"tokens": torch.randint(0, 10, (BATCH, 5), generator=g),
              "mask": (torch.rand(BATCH, 5, generator=g) > 0.3).long(),
              "scale": torch.rand(BATCH, generator=g, dtype=F64) + 0.5}, torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(steps)]


@pytest.mark.parametrize("name,build", [("gpipe", lambda T: gpipe(4, 2, T)), ("1f1b", lambda T: one_f_one_b(4, 2, T)),
                                        ("zb_h1", lambda T: zb_h1(4, 4, T))])
def test_a_dict_input_to_the_first_stage_equals_plain_training(name, build) -> None:
    """Probe: a mini-batch whose input is a dict of tensors (token ids, mask, scale) was refused ('must be a tuple
    (x, y) of two tensors') and stopped train_plain ('dict' object has no attribute 'dim'); now it is split into
    micro-batches tensor by tensor, and a flushed pipeline equals plain training (float64); evaluate() reads it."""
    T, schedule = 3, build(3)
    ref = dict_stages()
    losses = train_plain(ref, optimizer=OPTIMIZERS["adam"], batches=dict_data(T), micro_batches=schedule.M)
    stages = dict_stages()
    res = Emulator(stages, schedule=schedule, policy="gpipe" if name == "gpipe" else "1f1b",
                   optimizer=OPTIMIZERS["adam"]).run(dict_data(T))
    assert max_diff([p.detach() for s in stages for p in s.parameters()],
                    [p.detach() for s in ref for p in s.parameters()]) <= TOL
    assert max(abs(a - b) for a, b in zip(res.losses, losses)) <= TOL
    x, y = dict_data(1, seed=5)[0]
    assert evaluate(stages, x, y, batch_size=3) == pytest.approx(evaluate(ref, x, y), abs=TOL)


def test_a_dict_input_whose_tensors_disagree_on_the_examples_is_named() -> None:
    x, y = dict_data(1)[0]
    x["mask"] = x["mask"][:4]
    with pytest.raises(ValueError, match=r"'mask': tensor\[4, 5\].*same number of examples"):
        Emulator(dict_stages(), schedule=gpipe(4, 2, 1), policy="gpipe", optimizer=OPTIMIZERS["adam"]).run([(x, y)])


class CountThenRelu(nn.Module):
    """Counts its calls in a buffer, then applies ReLU to its input in place (or not: the twin)."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=F64))
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        self.calls.add_(1)
        return torch.relu_(x) if self.inplace else torch.relu(x)


class Double(nn.Module):
    """2x, in place or not: unlike ReLU, applying it twice changes the result (a kept input it changed shows)."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return x.mul_(2) if self.inplace else x * 2


def inplace_stages(inplace: bool = True) -> list[nn.Module]:
    """Stages 1, 2 and 3 start by modifying their input in place (a counting ReLU, ``nn.ReLU(inplace=True)`` as
    torchvision's blocks do, a doubling); ``inplace=False``: the same model without in-place operations."""
    torch.manual_seed(4)
    stages: list[nn.Module] = [nn.Linear(6, 8), nn.Sequential(CountThenRelu(inplace), nn.Linear(8, 8)),
                               nn.Sequential(nn.ReLU(inplace=inplace), nn.Linear(8, 8)),
                               nn.Sequential(Double(inplace), nn.Linear(8, 4))]
    return [s.double() for s in stages]


def test_stages_that_modify_their_input_in_place_equal_plain_torch() -> None:
    """Probe: a stage starting with an in-place operation on its input (nn.ReLU(inplace=True)) stopped every
    pipeline ('a leaf Variable that requires grad is being used in an in-place operation'), where plain torch
    modifies its intermediate result in place; now the stage gets a copy of its input, decided at its first call
    (repeated from the same buffers: the counter counts each forward once) and GPipe equals plain PyTorch."""
    T = 3
    want = plain_torch(inplace_stages(), data(T), M=2)
    stages = inplace_stages()
    Emulator(stages, schedule=gpipe(4, 2, T), policy="gpipe", optimizer=OPTIMIZERS["adam"]).run(data(T))
    assert max_diff([p.detach() for s in stages for p in s.parameters()], want) <= TOL
    assert float(stages[1][0].calls) == T * 2  # one call per micro-batch, the failed first try undone
    assert profile_stages(inplace_stages(), data(1)[0][0], data(1)[0][1], reps=1, warmup=0).f_cost[1] > 0


@pytest.mark.parametrize("policy,build,opt", [*ASYNC, ("zb", lambda T: zb_h1(4, 4, T), "adam")],
                         ids=[*(p for p, _, _ in ASYNC), "zb_h1"])
def test_stages_that_modify_their_input_in_place_equal_their_out_of_place_twin(policy, build, opt) -> None:
    """Under stashing, vertical sync, PipeOptim and SpecTrain (recomputed backwards: their forward runs without a
    graph and keeps its input for the recompute, which a doubling in place would change unseen), PipeMare, 2BW and a
    split backward (ZB-H1), the in-place model trains bit for bit as the same model without in-place operations."""
    T = 6
    runs = []
    for inplace in (True, False):
        stages = inplace_stages(inplace)
        res = Emulator(stages, schedule=build(T), policy="1f1b" if policy == "zb" else policy,
                       optimizer=OPTIMIZERS[opt]).run(data(T))
        runs.append((stages, res))
    (a, ra), (b, rb) = runs
    assert max_diff([p.detach() for s in a for p in s.parameters()], [p.detach() for s in b for p in s.parameters()]
                    ) == 0.0
    assert ra.losses == rb.losses and float(a[1][0].calls) == float(b[1][0].calls)


def feature_change(steps: int = 3) -> list[tuple[Tensor, Tensor]]:
    batches = data(steps)
    batches[2] = (torch.randn(BATCH, 5, dtype=F64), batches[2][1])
    return batches


def emulate_plain(batches: list[tuple[Tensor, Tensor]], M: int = 2) -> Any:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).double()
    return Emulator(model, D=2, schedule=gpipe(2, M, len(batches)), policy="gpipe",
                    optimizer=OPTIMIZERS["sgdm"]).run(batches)


PROBES = [
    Probe("emulator-frozen-param", lambda: Emulator(frozen_stages(), schedule=gpipe(4, 2, 2), policy="gpipe",
                                                    optimizer=OPTIMIZERS["adam"]).run(data(2)), None),
    Probe("emulator-frozen-trainable-optimizer",
          lambda: Emulator(frozen_stages(), schedule=pipedream(4, 1, 4), policy="pipeoptim",
                           optimizer=OPTIMIZERS["adam_trainable"]).run(data(4)), None),
    Probe("emulator-tuple-output", lambda: Emulator(tuple_stages(), schedule=one_f_one_b(4, 2, 2), policy="1f1b",
                                                    optimizer=OPTIMIZERS["sgdm"]).run(data(2)), None),
    Probe("stage-returns-int", lambda: bad_output(3), TypeError, r"stage 0 returned \(tensor\[4, 4\]:float64, int 3\)"),
    Probe("stage-returns-str", lambda: bad_output("mask"), TypeError, r"stage 0 .*entry of type str.*tuple/list/dict"),
    Probe("emulator-feature-change", lambda: emulate_plain(feature_change()), ValueError,
          r"micro-batch 0 of mini-batch 2, whose input is tensor\[4, 5\]:float64.*tensor\[4, 6\]:float64"),
    Probe("emulator-last-batch-not-divisible", lambda: emulate_plain(data(3, last=3)), ValueError,
          r"mini-batch 2: input batch size 3 is not divisible by the M=2"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


# ----------------------------------------------------------------------------------------------- runtime (gloo)

#: each case: model builder and D, schedule, policy, optimizer, data; ``stop``: checkpoint at that cut and resume
RUNTIME_CASES: dict[str, dict[str, Any]] = {
    "frozen-interleaved-1f1b": dict(model="frozen", D=4, schedule=lambda T: interleaved_1f1b(2, 2, 2, T),
                                    policy="1f1b", opt="adam", steps=3),
    "frozen-ddp": dict(model="frozen", D=4, schedule=lambda T: ddp(D=4, M=4, W=2, steps=T), policy="gpipe",
                       opt="adam_trainable", steps=2),
    "frozen-fsdp": dict(model="frozen", D=4, schedule=lambda T: fsdp(D=4, M=4, W=2, steps=T), policy="gpipe",
                        opt="adam", steps=2),
    "frozen-stashing": dict(model="frozen", D=2, schedule=lambda T: pipedream(2, 1, T), policy="stashing",
                            opt="adam", steps=6),
    "frozen-pipeoptim": dict(model="frozen", D=2, schedule=lambda T: pipedream(2, 1, T), policy="pipeoptim",
                             opt="adam_trainable", steps=6),
    "frozen-2bw-checkpoint": dict(model="frozen", D=2, schedule=lambda T: pipedream_2bw(2, 2, T), policy="2bw",
                                  opt="adam", steps=6, stop=3),
    "tuple-interleaved-1f1b": dict(model="tuple", D=4, schedule=lambda T: interleaved_1f1b(2, 2, 2, T),
                                   policy="1f1b", opt="sgdm", steps=3),
    "tuple-zb_h1": dict(model="tuple", D=2, schedule=lambda T: zb_h1(2, 2, T), policy="1f1b", opt="sgdm", steps=3),
    "tuple-spectrain-checkpoint": dict(model="tuple", D=2, schedule=lambda T: pipedream(2, 1, T), policy="spectrain",
                                       opt="sgdm", steps=6, stop=2),
    "small-last-batch": dict(model="frozen", D=2, schedule=lambda T: one_f_one_b(2, 2, T), policy="1f1b", opt="adam",
                             steps=3, last=4),
    "branches-interleaved-1f1b": dict(model="branches", D=4, schedule=lambda T: interleaved_1f1b(2, 2, 2, T),
                                      policy="1f1b", opt="adam", steps=3),
    "dict-input-1f1b": dict(model="dict", D=2, schedule=lambda T: one_f_one_b(2, 2, T), policy="1f1b", opt="adam",
                            steps=3),
    "dict-input-stashing-checkpoint": dict(model="dict", D=2, schedule=lambda T: pipedream(2, 1, T),
                                           policy="stashing", opt="adam", steps=6, stop=3),
    "inplace-interleaved-1f1b": dict(model="inplace", D=4, schedule=lambda T: interleaved_1f1b(2, 2, 2, T),
                                     policy="1f1b", opt="adam", steps=3),
    "branches-ddp": dict(model="branches-by-data", D=4, schedule=lambda T: ddp(D=4, M=4, W=2, steps=T),
                         policy="gpipe", opt="adam", steps=3),
    "branches-fsdp": dict(model="branches-by-data", D=4, schedule=lambda T: fsdp(D=4, M=4, W=2, steps=T),
                          policy="gpipe", opt="adam", steps=3),
}
MODELS = {"frozen": frozen_stages, "tuple": tuple_stages, "branches": lambda D: branch_stages(), "dict": dict_stages,
          "inplace": lambda D: inplace_stages(), "branches-by-data": lambda D: branch_stages(by_data=True)}


def case_parts(name: str) -> tuple[list[nn.Module], Any, str, Any, list[tuple[Tensor, Tensor]]]:
    c = RUNTIME_CASES[name]
    stages = MODELS[c["model"]](c["D"])
    batches = dict_data(c["steps"]) if c["model"] == "dict" else data(c["steps"], last=c.get("last"))
    return stages, c["schedule"](c["steps"]), c["policy"], OPTIMIZERS[c["opt"]], batches


def _run_runtime_cases(rank: int, world: int, ckpt: str) -> dict[str, Any]:
    out = {}
    for name, c in RUNTIME_CASES.items():
        stages, schedule, policy, opt, batches = case_parts(name)
        rt = PipelineRuntime(stages, schedule=schedule, policy=policy, optimizer=opt)
        if "stop" in c:  # stop at a cut, save, resume in a fresh runtime on a fresh model
            rt.run(batches, stop_at_step=c["stop"])
            save_checkpoint(rt, f"{ckpt}/{name}")
            stages, schedule, policy, opt, batches = case_parts(name)
            rt = PipelineRuntime(stages, schedule=schedule, policy=policy, optimizer=opt)
            load_checkpoint(rt, f"{ckpt}/{name}")
        res = rt.run(batches)
        out[name] = (res.weights, res.losses, frozen(stages))
    return out


@pytest.fixture(scope="module")
def runtime_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn(_run_runtime_cases, 2, (str(tmp_path_factory.mktemp("ckpt")),), timeout_s=120)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNTIME_CASES))
def test_runtime_equals_emulator(runtime_results, name) -> None:
    """Runtime (gloo, 2 ranks) ≡ emulator ≡ (flushed) plain training, in float64: frozen parameters on
    single-placement, replicated (DDP) and sharded (FSDP) stages and through a checkpoint; tuple and dict
    hand-overs packed into one message each, also under split backward and through a checkpoint; a smaller
    last mini-batch; parameters no gradient reaches, skipped by the update as plain torch skips them; dict inputs;
    stages that modify their input in place."""
    stages, schedule, policy, opt, batches = case_parts(name)
    before = frozen(stages)
    emu = Emulator(stages, schedule=schedule, policy=policy, optimizer=opt)
    res = emu.run(batches)
    want = emu.weights()
    got: dict[int, tuple[Tensor, ...]] = {}
    for per_rank in runtime_results:
        weights, losses, frozen_after = per_rank[name]
        got.update(weights)
        assert losses == pytest.approx(res.losses, abs=TOL)
        assert max_diff(frozen_after, before) == 0.0 if before else True
    assert sorted(got) == list(range(len(want)))
    for k, W in got.items():
        assert len(W) == len(want[k]) and (not W or max_diff(list(W), list(want[k])) <= TOL)
    if RUNTIME_CASES[name]["policy"] in ("gpipe", "1f1b"):
        ref = MODELS[RUNTIME_CASES[name]["model"]](RUNTIME_CASES[name]["D"])
        train_plain(ref, optimizer=opt, batches=batches, micro_batches=schedule.M)
        assert max_diff([w for k in sorted(got) for w in got[k]], [p.detach() for s in ref for p in s.parameters()]
                        ) <= TOL


def _runtime_shapes(rank: int, world: int, case: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).double()
    rt = PipelineRuntime(model, schedule=gpipe(2, 2, 3), policy="gpipe", optimizer=OPTIMIZERS["sgdm"])
    batches = feature_change() if case == "feature" else data(3)
    if case == "rank-data" and rank == 1:  # a rank given another last mini-batch than the others
        batches[2] = (batches[2][0][:4], batches[2][1][:4])
    rt.run(batches)


SLOW_PROBES = [
    Probe("runtime-feature-change", lambda: spawn(_runtime_shapes, 2, ("feature",), timeout_s=60), RankFailure,
          r"mini-batch 2.*tensor\[4, 5\]:float64.*tensor\[4, 6\]:float64"),
    Probe("runtime-ranks-given-other-shapes", lambda: spawn(_runtime_shapes, 2, ("rank-data",), timeout_s=60),
          RankFailure, r"rank 1 is given a mini-batch 2 whose input is tensor\[4, 6\]:float64, rank 0 one of "
                       r"tensor\[8, 6\]:float64"),
]


@pytest.mark.slow
@probes.parametrize(SLOW_PROBES)
def test_slow_probe(probe: Probe) -> None:
    probe.check()
