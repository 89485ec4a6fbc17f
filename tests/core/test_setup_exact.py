"""The set-up and the emulator produce exactly what they produced before issue 29's rewrite (frozen reference).

``setup_reference.json`` was written by this file's :func:`record` on main before the plan, the version rings and
the per-job specs became arrays: for each case (a schedule from :data:`~pipelab.schedules.builders.BUILDERS` with
drawn sizes, a policy that can run on it, an optimizer, sometimes a predictor, a precision, recompute, a stage
without weights or a frozen parameter) it holds digests of every job's forward and backward spec, the execution
order, the ring capacities and weight copies, which versions each stage's ring held after every job it ran, and,
after an emulator run in float64 (float32 masters under bf16/fp16), the losses, the final weights bit for bit,
the versions every job ran at and used, the ring and activation peaks; for a placed schedule also its global
sequence, every copy's ring capacity and final weights, and the collectives' bytes. A case the old code refused
keeps its error. Regenerate (only on the old code) with ``python tests/core/test_setup_exact.py --write``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from pipelab.emulator import Emulator
from pipelab.optim import optimizer_factory
from pipelab.pipeline.placement import Collective, FetchedStage
from pipelab.schedules.builders import BUILDERS

FIXTURE = Path(__file__).with_name("setup_reference.json")

#: (builder, argument draws) per schedule family; a draw is a list of choices for each positional argument
SCHEDULES: dict[str, list[list[Any]]] = {
    "naive": [[2, 3], [1, 2], [2, 3]],
    "gpipe": [[2, 3, 4], [1, 2, 4], [2, 3]],
    "1f1b": [[2, 3, 4], [2, 3, 4], [2, 3]],
    "pipedream": [[2, 3, 4], [1, 2], [5, 7]],
    "2bw": [[2, 3], [3, 4], [5, 6]],
    "interleaved": [[2], [2], [2, 4], [2]],
    "folded": [[2, 4], [2, 4], [2]],
    "ddp": [[2, 3], [2, 4], [2], [2]],
    "fsdp": [[2, 3], [2, 4], [2], [2]],
    "lpp": [[2, 4], [4], [2], [1, 2], [2]],
    "fslpp": [[2, 4], [4], [2], [1, 2], [2]],
    "hybrid": [[2, 3], [2, 4], [2], [2, 3]],
    "zb_h1": [[2, 3], [2, 4], [2]],
    "zb_h2": [[2, 3], [3, 4], [2]],
    "zb_async": [[2, 3], [1, 2], [5, 6]],
    "zb_v": [[2], [2, 4], [2]],
    "v_half": [[2], [4], [2]],
    "v_min": [[2], [4], [2]],
    "interleaved_zb": [[2], [2], [2, 4], [2]],
    "dualpipe_v": [[2], [4], [2]],
    "dualpipe": [[2], [4], [2]],
}
ASYNC = {"pipedream", "2bw", "zb_async"}
PLACED = {"ddp", "fsdp", "lpp", "fslpp", "hybrid", "dualpipe"}
SYNC_POLICIES = ["gpipe", "vanilla", "stashing", "vertical_sync", "spectrain", "pipeoptim", "pipemare", "oracle",
                 "error_feedback", "dc_asgd"]
ASYNC_POLICIES = ["gpipe", "vanilla", "stashing", "vertical_sync", "spectrain", "pipeoptim", "pipemare", "oracle",
                  "nesterov_async", "error_feedback", "dc_asgd", "2bw"]
PLACED_POLICIES = ["gpipe", "stashing", "vanilla", "pipeoptim", "oracle", "dc_asgd"]


def draw_cases(n_per_builder: int = 6, seed: int = 29) -> list[dict[str, Any]]:
    """Cases drawn from a seeded generator: per builder, sizes and a policy, with options drawn alongside (three
    times as many on the asynchronous schedules, where the policies differ)."""
    rng = np.random.default_rng(seed)
    cases = []
    for name, draws in SCHEDULES.items():
        for _ in range(n_per_builder * (3 if name in ASYNC else 1)):
            args = [int(rng.choice(d)) for d in draws]
            try:
                BUILDERS[name](*args)
            except ValueError:  # sizes the builder refuses
                continue
            policies = PLACED_POLICIES if name in PLACED else ASYNC_POLICIES if name in ASYNC else SYNC_POLICIES
            policy = str(rng.choice(policies))
            kw: dict[str, Any] = {}
            if name == "hybrid" and rng.random() < 0.5:
                kw["asynchronous"] = True
            case: dict[str, Any] = {"schedule": name, "args": args, "kw": kw, "policy": policy, "options": {},
                                    "optimizer": str(rng.choice(["sgdm", "adam"])), "precision": None,
                                    "recompute": bool(rng.random() < 0.2), "model": str(rng.choice(
                                        ["mlp", "mlp", "weightless", "frozen", "dropout"])), "predictor": None}
            if policy in ("spectrain",):
                case["optimizer"] = "sgdm"
            if policy == "nesterov_async":
                case["optimizer"] = "nadam"
                case["options"] = {"backward": str(rng.choice(["stashed", "current"]))}
            if policy in ("error_feedback", "dc_asgd"):
                case["options"] = {"base": str(rng.choice(["stashing", "vanilla"]))}
            if policy == "pipeoptim" and rng.random() < 0.3:
                case["predictor"] = "oracle"
            if policy == "2bw" and name != "2bw":
                case["policy"] = "stashing"
            if name not in ASYNC and name not in PLACED and rng.random() < 0.15:
                case["precision"] = str(rng.choice(["bf16", "fp16"]))
            cases.append(case)
    return cases


def _model(kind: str, D: int, dtype: torch.dtype) -> list[nn.Module] | nn.Sequential:
    torch.manual_seed(3)
    width = 4
    blocks: list[nn.Module] = []
    for i in range(2 * D):
        blocks.append(nn.Sequential(nn.Linear(width if i else 5, width), nn.Tanh()))
    blocks.append(nn.Linear(width, 3))
    if kind == "dropout":
        blocks.insert(1, nn.Dropout(0.3))
    model = nn.Sequential(*blocks).to(dtype)
    if kind == "frozen":
        model[1][0].bias.requires_grad_(False)
    if kind == "weightless" and D >= 3:
        stages = [nn.Sequential(*blocks[:2]).to(dtype), nn.Tanh(), *[nn.Sequential(b).to(dtype) for b in blocks[2:D]]]
        return stages[:D - 1] + [nn.Sequential(*blocks[D:]).to(dtype)]
    return model


def _optimizer(name: str) -> Any:
    if name == "nadam":
        return optimizer_factory("nadam", lr=0.01)
    return optimizer_factory(name, **({"lr": 0.01} if name == "adam" else {"lr": 0.05}))


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=_plain, sort_keys=False).encode()).hexdigest()[:20]


def _plain(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    if isinstance(x, torch.Tensor):
        return hashlib.sha256(x.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:20]
    return repr(x)


def _tensors(ws: Any) -> str:
    h = hashlib.sha256()
    for w in ws:
        h.update(w.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def _watch_rings(emu: Emulator) -> dict[Any, list[list[int]]]:
    """Per executor, the sorted versions its ring holds after each of its jobs (instance-level wrappers)."""
    seen: dict[Any, list[list[int]]] = {}
    owners = dict(emu.plan.copies) if emu.plan.copies else {k: st for k, st in enumerate(emu.stages)}
    for key, ex in owners.items():
        log: list[list[int]] = []
        seen[key] = log
        for name in ("forward", "backward", "input_grad", "weight_grad", "update"):
            inner = getattr(ex, name)

            def wrapped(*a: Any, inner: Any = inner, ex: Any = ex, log: list = log) -> Any:
                out = inner(*a)
                log.append(sorted(int(v) for v in ex.ring.versions()))
                return out

            setattr(ex, name, wrapped)
    return seen


def record(case: dict[str, Any]) -> dict[str, Any]:
    """Digests of what the set-up and an emulator run of ``case`` produce (module docstring)."""
    sched = BUILDERS[case["schedule"]](*case["args"], **case["kw"])
    from pipelab.policies import make_policy

    policy = make_policy(case["policy"], **case["options"])
    D = sched.D
    dtype = torch.float64 if case["precision"] is None else torch.float32  # autocast keeps fp32 masters
    model = _model(case["model"], D, dtype)
    kw: dict[str, Any] = {"D": D} if isinstance(model, nn.Sequential) else {}
    try:
        emu = Emulator(model, schedule=sched, policy=policy, optimizer=_optimizer(case["optimizer"]),
                       predictor=case["predictor"], precision=case["precision"], recompute=case["recompute"],
                       **kw)
    except (ValueError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    plan = emu.plan
    out: dict[str, Any] = {
        "specs": _digest(sorted(((k, t, j), repr(f), repr(b)) for (k, t, j), (f, b) in plan.specs.items())),
        "order": _digest([list(e) for e in plan.order]), "waited": plan.waited,
        "capacity": [int(c) for c in plan.capacity], "weight_copies": [int(c) for c in plan.weight_copies],
        "predicted": sorted(plan.predicted_stages),
    }
    if plan.copies:
        out["sequence"] = _digest([repr(tuple(e)) for e in plan.sequence])
        out["copy_capacity"] = sorted([list(key), ex.ring.capacity] for key, ex in plan.copies.items())
    rings = _watch_rings(emu)
    g = torch.Generator().manual_seed(5)
    n = 2 * sched.M
    data = [(torch.randn(n, 5, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g))
            for _ in range(sched.steps)]
    torch.manual_seed(11)
    try:
        res = emu.run(data)
    except (ValueError, RuntimeError) as exc:
        out["run_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out.update({
        "rings": _digest(sorted([list(key) if isinstance(key, tuple) else [key], log] for key, log in rings.items())),
        "losses": [float(x).hex() for x in res.losses], "diverged": res.diverged_at,
        "weights": _tensors(w for ws in emu.weights() for w in ws),
        "current": _digest(sorted((list(k), v) for k, v in res.current.items())),
        "used": _digest(sorted((list(k), v) for k, v in res.used.items())),
        "ring_peak": [int(x) for x in res.extra["ring_peak"]], "activation_peak": res.extra["activation_peak"],
        "stage_activation_peak": res.extra["stage_activation_peak"],
    })
    if plan.copies:
        out["copies"] = _digest(sorted([list(key), _tensors(ws)] for key, ws in res.extra["copies"].items()))
        out["collectives"] = _digest(sorted((w, json.dumps(c, sort_keys=True))
                                            for w, c in res.extra["collectives"].items()))
    return out


def _cases() -> list[dict[str, Any]]:
    return json.loads(FIXTURE.read_text()) if FIXTURE.exists() else []


def _marked(entries: list[dict[str, Any]]) -> list[Any]:
    """Every fourth case in the fast suite, all of them in the full one (``slow``)."""
    return [pytest.param(e, id=f"{e['case']['schedule']}-{e['case']['policy']}-{i}",
                         marks=() if i % 4 == 0 else pytest.mark.slow) for i, e in enumerate(entries)]


@pytest.mark.parametrize("entry", _marked(_cases()))
def test_setup_and_run_are_as_before(entry: dict[str, Any]) -> None:
    got = record(entry["case"])
    want = entry["expect"]
    assert got.keys() == want.keys(), (entry["case"], got.get("error"), want.get("error"))
    for field in want:
        assert got[field] == want[field], (field, entry["case"])


def test_the_reference_covers_the_machinery() -> None:
    """The frozen cases run every kind of plan: waiting, predicting, placed, split, fp16, and refused ones."""
    entries = _cases()
    expects = [e["expect"] for e in entries]
    assert len(entries) >= 100
    assert any(e.get("waited") for e in expects) and any(e.get("predicted") for e in expects)
    assert any("sequence" in e for e in expects) and any("error" in e for e in expects)
    assert any(max(e.get("capacity", [1])) > 2 for e in expects)
    assert sum("weights" in e for e in expects) >= 80
    assert any(e["case"]["precision"] == "fp16" and "weights" in e["expect"] for e in entries)
    assert any(e["case"]["schedule"].startswith(("zb", "v_")) and "weights" in e["expect"] for e in entries)


if __name__ == "__main__" and "--write" in sys.argv:  # PYTHONPATH=. to record this worktree's pipelab
    FIXTURE.write_text(json.dumps([{"case": c, "expect": record(c)} for c in draw_cases()], indent=0) + "\n")


# ------------------------------------------------------------------ the arrays against straightforward references


def _reference_capacity(jobs: list, need: Any, k: int) -> int:
    """Peak versions of stage k alive along ``jobs`` (its events, U included), simulated one event at a time."""
    last = {need(job): i for i, job in enumerate(jobs) if job[0] != "U"}
    version, alive, peak = 0, {0}, 1
    for i, job in enumerate(jobs):
        if job[0] == "U":
            if last.get(version, -1) <= i:
                alive.discard(version)
            version += 1
            alive.add(version)
            peak = max(peak, len(alive))
        elif last[need(job)] == i and need(job) != version:
            alive.discard(need(job))
    return peak


def _reference_fetched_capacity(part: list, need: Any) -> int:
    """Peak versions a non-holder copy holds along its part (jobs, and broadcasts that bring a version): one goes
    after its last use, or when the next arrives if it was the newest and its last use passed."""
    jobs = [e for e in part if not isinstance(e, Collective)]
    last = {need(job): i for i, job in enumerate(jobs)}
    alive: set[int] = set()
    current, pos, peak = -1, 0, 1
    for e in part:
        if isinstance(e, Collective):
            if current >= 0 and last.get(current, -1) < pos:
                alive.discard(current)
            alive.add(e.version)
            current = max(current, e.version)
            peak = max(peak, len(alive))
            continue
        if last[need(e)] == pos and need(e) != current:
            alive.discard(need(e))
        pos += 1
    return peak


@pytest.mark.parametrize("entry", [e for e in _cases() if "weights" in e["expect"]][::3],
                         ids=lambda e: f"{e['case']['schedule']}-{e['case']['policy']}")
def test_specs_events_and_order_match_straightforward_references(entry: dict[str, Any]) -> None:
    """Per job, :class:`JobSpecs` is the policy's per-job rule; the fast order is :func:`resolve_order`'s; every
    stage's ring size is the event-by-event simulation of its versions' lives; its use counts are its jobs'."""
    from pipelab.pipeline import JobSpecs, build_pipeline, resolve_order
    from pipelab.policies import make_policy
    from pipelab.simulator import simulate

    case = entry["case"]
    sched = BUILDERS[case["schedule"]](*case["args"], **case["kw"])
    table = simulate(sched).version_table
    policy = make_policy(case["policy"], **case["options"])
    specs = JobSpecs(policy, table)
    for (k, t, j), (f, b) in specs.items():
        assert f == policy.forward(table, ("F", k, t, j)) and b == policy.backward(table, ("B", k, t, j))
    model = _model(case["model"], sched.D, torch.float64)
    plan = build_pipeline(model, schedule=sched, policy=policy, optimizer=_optimizer(case["optimizer"]),
                          **({"D": sched.D} if isinstance(model, nn.Sequential) else {}))
    assert list(plan.order) == resolve_order(table, lambda job: 0 if job[0] == "U" else specs.need(*job))
    executors = plan.copies or {(0, k): st for k, st in plan.stages.items()}
    for (w, k), ex in executors.items():
        jobs = [ex.events[i] for i in range(len(ex.events))]
        need = lambda e, k=k: specs.need(e[0], k, e[1], e[2])  # noqa: E731
        counted = Counter(need(e) for e in jobs if e[0] != "U")
        assert [ex.uses[v] for v in sorted(counted)] == [counted[v] for v in sorted(counted)]
        if isinstance(ex, FetchedStage):
            part = [e if isinstance(e, Collective) else (e.op, e.step, e.micro) for e in plan.sequence
                    if (e.worker == w if not isinstance(e, Collective) else e.kind == "broadcast" and w in e.holders)
                    and e.stage == k]
            assert ex.ring.capacity == _reference_fetched_capacity(part, need)
        else:
            assert ex.ring.capacity == _reference_capacity(jobs, need, k)
