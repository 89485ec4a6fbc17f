"""Codecs on the hand-over (pipelab.links, pipeline.transport.CodedTransport): each codec's round trip and bill;
in the emulator, identity ≡ no codec bit for bit, bf16 ≡ casting by hand at the stage ends, lowrank ≡ the network
with the projection x ↦ xPPᵀ at the stage ends (float64, 1e-12); the runtime ≡ the emulator under every codec,
and the bytes it counts equal the codec's bill."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from pipelab import Emulator, PipelineSpec
from pipelab.distributed import spawn
from pipelab.emulator import evaluate
from pipelab.links import Bf16, Encoded, Identity, Int8, LowRank, as_codec, boundary_codecs, message_bytes
from pipelab.pipeline.transport import Layout, decode_handover, encode_handover, pack
from pipelab.runtime import PipelineRuntime
from pipelab.schedules import gpipe, hybrid, one_f_one_b, pipedream

D, IN, WIDTH, CLASSES, BATCH, STEPS = 3, 6, 12, 4, 8, 5


def SGDM(ps: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9)


def stages(extra: Any = None) -> list[nn.Module]:
    """D stages of an MLP (float64, fixed seed); ``extra(k)`` appended to stage k < D−1 (a hand-made codec)."""
    torch.manual_seed(0)
    out: list[nn.Module] = []
    for k in range(D):
        layers: list[nn.Module] = [nn.Linear(IN if k == 0 else WIDTH, WIDTH if k < D - 1 else CLASSES)]
        if k < D - 1:
            layers.append(nn.Tanh())
        out.append(nn.Sequential(*layers).double())
    if extra is not None:
        out = [nn.Sequential(m, extra(k)) if k < D - 1 else m for k, m in enumerate(out)]
    return out


def data(steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, IN, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (BATCH,), generator=g))
            for _ in range(steps)]


def emulate(model: list[nn.Module], codec: Any, schedule: Any = None) -> tuple[list[float], list]:
    emu = Emulator(model, schedule=schedule or pipedream(D, 1, STEPS), policy="stashing", optimizer=SGDM,
                   codec=codec)
    res = emu.run(data())
    return res.losses, emu.weights()


class Cast(nn.Module):
    """x ↦ x.to(bf16).to(x.dtype); autograd casts the gradient the same way (to bf16, back to float64)."""

    def __init__(self, k: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(x.dtype)


class Project(nn.Module):
    """x ↦ xPPᵀ with boundary k's basis of ``LowRank(r)`` given for every boundary (seed + k)."""

    def __init__(self, k: int, r: int = 5) -> None:
        super().__init__()
        self.P = LowRank(r, seed=k).basis(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.P @ self.P.T


# ------------------------------------------------------------------------------------------------ the codecs

CODECS = [Identity(), Bf16(), Int8(), Int8(stochastic=True), LowRank(3), LowRank(7, seed=4)]


@pytest.mark.parametrize("codec", CODECS, ids=repr)
@pytest.mark.parametrize("shape", [(4, 7), (2, 3, 7), (7,)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_round_trip_keeps_shape_and_dtype_and_bills_its_parts(codec: Any, shape: tuple, dtype: torch.dtype) -> None:
    x = torch.randn(shape, dtype=dtype)
    e = codec.encode(x)
    assert e.nbytes == pack(e).numel() == codec.encoded_bytes(shape, dtype)
    y = codec.decode(e)
    assert y.shape == x.shape and y.dtype == x.dtype
    meta = codec.encode(torch.empty(shape, dtype=dtype, device="meta"))  # the runtime sizes buffers this way
    assert [(p.shape, p.dtype) for p in meta.parts] == [(p.shape, p.dtype) for p in e.parts]


def test_identity_and_bf16_are_the_tensor_and_the_cast() -> None:
    x = torch.randn(5, 9, dtype=torch.float64)
    assert Identity().decode(Identity().encode(x)) is x
    assert torch.equal(Bf16().decode(Bf16().encode(x)), x.to(torch.bfloat16).to(torch.float64))


def test_int8_error_is_at_most_half_a_step_per_row() -> None:
    x = torch.randn(64, 33, dtype=torch.float64) * torch.logspace(-3, 3, 64, dtype=torch.float64)[:, None]
    x[5] = 0
    step = x.abs().amax(1, keepdim=True) / 127
    err = (Int8().decode(Int8().encode(x)) - x).abs()
    assert torch.all(err <= step / 2 * (1 + 1e-6)) and err[5].max() == 0
    assert torch.equal(Int8().decode(Int8().encode(x)), Int8().decode(Int8().encode(x)))  # deterministic
    # the row's absmax is represented exactly (q = ±127), up to the scale's fp32 rounding
    top = x.abs().argmax(1)
    assert torch.allclose(Int8().decode(Int8().encode(x)).gather(1, top[:, None]), x.gather(1, top[:, None]),
                          rtol=1e-6, atol=0)


def test_int8_stochastic_rounding_is_unbiased_within_a_step() -> None:
    x = torch.randn(4, 16, dtype=torch.float64)
    codec = Int8(stochastic=True, seed=3)
    step = x.abs().amax(1, keepdim=True) / 127
    draws = torch.stack([codec.decode(codec.encode(x)) for _ in range(4000)])
    assert torch.all((draws - x).abs() < step * (1 + 1e-6))
    # the mean of 4000 draws: error std <= step / (2 sqrt(4000)); 5 such std
    assert torch.all((draws.mean(0) - x).abs() < 5 * step / (2 * 4000 ** 0.5))
    again = [Int8(stochastic=True, seed=3).encode(x).parts[0] for _ in range(2)]
    assert torch.equal(*again)  # the stream is the seed's


def test_lowrank_basis_is_orthonormal_and_full_rank_is_the_identity() -> None:
    P = LowRank(5, seed=2).basis(11)
    assert P.shape == (11, 5) and torch.allclose(P.T @ P, torch.eye(5, dtype=torch.float64), atol=1e-14, rtol=0)
    assert torch.equal(P, LowRank(5, seed=2).basis(11)) and not torch.equal(P, LowRank(5, seed=3).basis(11))
    x = torch.randn(6, 11, dtype=torch.float64)
    assert torch.allclose(LowRank(11).decode(LowRank(11).encode(x)), x, atol=1e-12, rtol=0)
    y = LowRank(5).decode(LowRank(5).encode(x))
    assert torch.allclose(LowRank(5).decode(LowRank(5).encode(y)), y, atol=1e-12, rtol=0)  # a projection
    with pytest.raises(ValueError, match="rank=12 exceeds"):
        LowRank(12).encode(x)


def test_names_and_per_boundary_lists() -> None:
    assert as_codec("int8") == Int8() and as_codec("lowrank(8)") == LowRank(8) and as_codec(Bf16()) == Bf16()
    with pytest.raises(ValueError, match="codec='fp8'; choose one of identity, bf16, int8 or 'lowrank"):
        as_codec("fp8")
    with pytest.raises(TypeError, match="codec must be a Codec"):
        as_codec(3)  # type: ignore[arg-type]
    assert boundary_codecs(LowRank(2), 3) == (LowRank(2, 0), LowRank(2, 1))  # one projection per boundary
    assert boundary_codecs(["identity", "bf16"], 3) == (None, Bf16()) and boundary_codecs(None, 3) == (None, None)
    with pytest.raises(ValueError, match=r"one per boundary \(D-1=2\), got 3"):
        boundary_codecs(["int8"] * 3, 3)
    with pytest.raises(ValueError, match="codec='int4'"):
        PipelineSpec(schedule=gpipe(2, 1, 1), policy="gpipe", optimizer=SGDM, codec="int4")


def test_structured_handovers_encode_floating_tensors_only() -> None:
    h = {"hidden": torch.randn(4, 6, dtype=torch.float64), "mask": torch.arange(4), "none": None}
    e = encode_handover(Int8(), h)
    assert isinstance(e["hidden"], Encoded) and e["mask"] is h["mask"] and e["none"] is None
    back = Layout.of(e).unpack(pack(e))  # what the runtime receives, from the bytes sent
    d = decode_handover(Int8(), back)
    assert torch.equal(d["hidden"], Int8().decode(Int8().encode(h["hidden"]))) and torch.equal(d["mask"], h["mask"])
    # the bytes sent are the codec's bill for the floating tensors plus the integer ones as they are
    ms = message_bytes([nn.Identity(), nn.Identity()], h, codec=Int8())
    assert pack(e).numel() == ms.activation[0] == 24 + 16 + 8 * 4
    # its layout, and its gradient's (a tuple of the floating tensors' gradients), encoded
    lay = Layout.of(h).encoded(Int8())
    assert lay.nbytes == pack(e).numel() and lay.gradient().nbytes == ms.gradient[0] == 24 + 16


# ---------------------------------------------------------------------------------------- in the emulator


def test_identity_codec_is_todays_handover_bit_for_bit() -> None:
    losses, weights = emulate(stages(), None)
    for codec in ("identity", Identity(), [Identity(), None]):
        l2, w2 = emulate(stages(), codec)
        assert l2 == losses and all(torch.equal(a, b) for wa, wb in zip(weights, w2) for a, b in zip(wa, wb))


@pytest.mark.parametrize("schedule", [pipedream(D, 1, STEPS), one_f_one_b(D, 2, STEPS)], ids=["pipedream", "1f1b"])
def test_bf16_codec_equals_casting_by_hand(schedule: Any) -> None:
    policy = "gpipe" if schedule.M > 1 else "stashing"
    res = Emulator(stages(), schedule=schedule, policy=policy, optimizer=SGDM, codec="bf16").run(data())
    ref = Emulator(stages(Cast), schedule=schedule, policy=policy, optimizer=SGDM).run(data())
    assert res.losses == ref.losses
    plain = Emulator(stages(), schedule=schedule, policy=policy, optimizer=SGDM).run(data())
    assert res.losses != plain.losses  # the cast is felt


def test_lowrank_codec_trains_the_projected_network() -> None:
    """The gradient projected with the same P is the exact gradient of x ↦ xPPᵀ: the pipeline trains that
    network (float64, 1e-12); r = d is the identity to 1e-12."""
    losses, weights = emulate(stages(), LowRank(5))
    ref_losses, ref_weights = emulate(stages(Project), None)
    assert losses == pytest.approx(ref_losses, abs=1e-12, rel=0)
    for wa, wb in zip(weights, ref_weights):
        assert all(torch.allclose(a, b, atol=1e-12, rtol=0) for a, b in zip(wa, wb))
    full_losses, full_weights = emulate(stages(), "lowrank(12)")
    plain_losses, plain_weights = emulate(stages(), None)
    assert full_losses == pytest.approx(plain_losses, abs=1e-12, rel=0)
    assert all(torch.allclose(a, b, atol=1e-12, rtol=0) for wa, wb in zip(full_weights, plain_weights)
               for a, b in zip(wa, wb))


def test_evaluation_applies_the_codec_as_the_pipeline_does() -> None:
    x, y = data(1)[0]
    assert evaluate(stages(), x, y, codec=LowRank(5)) == pytest.approx(evaluate(stages(Project), x, y), abs=1e-12)
    assert evaluate(stages(), x, y, codec="bf16") == evaluate(stages(Cast), x, y)
    assert evaluate(stages(), x, y, codec="identity") == evaluate(stages(), x, y)


def test_int8_codec_moves_the_run_by_about_its_rounding() -> None:
    losses, _ = emulate(stages(), "int8")
    plain, _ = emulate(stages(), None)
    assert losses != plain and losses == pytest.approx(plain, abs=1e-2)


# ---------------------------------------------------------------------------------------- in the runtime

#: (codec, precision): float64 runs, and a float32 model under bf16 autocast (hand-overs in bf16, then encoded)
RT_CASES: list[tuple[Any, str]] = [(None, "fp32"), ("identity", "fp32"), ("bf16", "fp32"), ("int8", "fp32"),
                                   (LowRank(5), "fp32"), ([Int8(), LowRank(12)], "fp32"), ("int8", "bf16"),
                                   ("lowrank(4)", "bf16")]


def _case(precision: str) -> tuple[list[nn.Module], list]:
    if precision == "fp32":
        return stages(), data()
    return [m.float() for m in stages()], [(x.float(), y) for x, y in data()]


def _rt_run(rank: int, world: int) -> list:
    out = []
    for codec, precision in RT_CASES:
        model, batches = _case(precision)
        rt = PipelineRuntime(model, schedule=pipedream(D, 1, STEPS), policy="stashing", optimizer=SGDM, codec=codec,
                             precision=precision, record=True)
        res = rt.run(batches)
        out.append((res.weights, res.losses, res.timeline.sent, res.timeline.received))
    return out


@pytest.mark.slow
def test_runtime_equals_the_emulator_and_counts_the_codecs_bytes() -> None:
    per_rank = spawn(_rt_run, D)
    for i, (codec, precision) in enumerate(RT_CASES):
        model, batches = _case(precision)
        emu = Emulator(model, schedule=pipedream(D, 1, STEPS), policy="stashing", optimizer=SGDM, codec=codec,
                       precision=precision)
        losses, weights = emu.run(batches).losses, emu.weights()
        bill = message_bytes(_case(precision)[0], batches[0][0], codec=codec,
                             dtype=None if precision == "fp32" else torch.bfloat16)
        for r in range(D):
            got_w, got_losses, sent, received = per_rank[r][i]
            assert got_losses == losses, codec
            assert all(torch.equal(a, b) for a, b in zip(got_w[r], weights[r])), codec
            # pipedream M=1: each boundary carries one activation and one gradient per step
            assert received.get("activation", 0) == (STEPS * bill.activation[r - 1] if r else 0), codec
            assert received.get("gradient", 0) == (STEPS * bill.gradient[r] if r < D - 1 else 0), codec
            assert sent.get("activation", 0) == (STEPS * bill.activation[r] if r < D - 1 else 0), codec


def test_placed_schedules_apply_the_codec_too() -> None:
    """A stage replicated on R workers (hybrid pipeline × data parallel): every copy's hand-overs are encoded."""
    sched = hybrid(D, 2, 2, STEPS)
    res = Emulator(stages(), schedule=sched, policy="gpipe", optimizer=SGDM, codec="bf16").run(data())
    ref = Emulator(stages(Cast), schedule=sched, policy="gpipe", optimizer=SGDM).run(data())
    plain = Emulator(stages(), schedule=sched, policy="gpipe", optimizer=SGDM).run(data())
    assert res.losses == ref.losses != plain.losses
