"""GPU benchmark (runs on CPU too): prediction vs step, emulator vs plain step, stacked sweeps, the runtime on NCCL.

All ratios come from this one run, on one device (``--device cuda``, or ``--device cpu`` for a machine without a GPU):

(a) **prediction vs step**: ``predictor.predict(optimizer, s)`` over a ~10M-parameter MLP (``--quick``: ~0.3M)
    against one ``optimizer.step()`` (torch's default implementation for the device); target ≤ 1.
(b) **emulator vs plain PyTorch**, per training step, for the policies whose forward and backward use the same weights
    (GPipe, flushed; weight stashing), D = 4; target ≤ 1.10. The GPipe run's weights are checked against plain
    training (float64, same device): they agree to rounding.
(c) **sweep throughput**: the seeds of one arm trained as one stacked model (:mod:`pipelab.studies.stacking`) vs one
    seed at a time, through :func:`pipelab.studies.learning_curves.sweep` with the cache off; arm·steps per second and
    their ratio.
(d) **runtime**: :class:`pipelab.runtime.PipelineRuntime` on as many ranks as GPUs (NCCL; on CPU: 2 gloo ranks), 1F1B
    with D = ranks, in the NCCL-safe order (:mod:`pipelab.runtime.nccl_order`) plain, with ``prefetch`` and with
    ``prefetch + batch`` (communication overlap, measured, not assumed), per-rank peak memory
    (``torch.cuda.max_memory_allocated``) beside the simulator's estimate. With one GPU only a single-rank schedule
    runs: it measures the runtime's own overhead over the emulator, not transfers, overlap or pipeline speed-up.

Timing (:mod:`benchmarks._harness`): one intra-op thread unless ``--threads``; the two sides of every ratio
(step and prediction; plain and emulator; one seed at a time and stacked) run alternately, round after round
(``--reps`` rounds for (a) and (b), ``min(3, --reps)`` for (c)), and each ratio is the median of the per-round
ratios, printed with its interquartile range and the load average of its rounds.

Usage:
    .venv/bin/python benchmarks/gpu.py [--device cuda|cpu] [--quick] [--reps 10] [--steps 20] [--threads 1]
        [--json FILE]

``--device cuda`` on a machine without CUDA prints "CUDA not available" and exits 0.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/gpu.py` finds the harness

from benchmarks._harness import Ratio, Side, add_thread_argument, alternate, header, load_average  # noqa: E402
from pipelab.distributed import spawn  # noqa: E402
from pipelab.emulator import Emulator, train_plain  # noqa: E402
from pipelab.optim import make_optimizer  # noqa: E402
from pipelab.predictors import make_predictor  # noqa: E402
from pipelab.schedules import gpipe, one_f_one_b, pipedream  # noqa: E402
from pipelab.studies.learning_curves import RunConfig, sweep  # noqa: E402
from pipelab.studies.models import deep_mlp  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402

#: (optimizer, predictor) pairs of (a): each predictor with an optimizer it serves
PREDICTIONS = [("sgdm", "spectrain"), ("sgdm", "repeat"), ("adam", "repeat"), ("adam", "pipeoptim"),
               ("adam", "zero_grad_rollout"), ("adamw", "linear")]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _syncer(device: torch.device) -> Callable[[], None] | None:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def _ratio_fields(r: Ratio) -> dict[str, Any]:
    """A ratio's figures for the JSON: ``ratio`` (the median of the per-round ratios), its IQR and load average."""
    return {"ratio": r.median, "ratio_iqr": [r.q1, r.q3], "load": r.load}


def prediction_vs_step(device: torch.device, quick: bool, reps: int) -> dict[str, Any]:
    """(a): rows ``(optimizer, predictor, predict s, step s, ratio ...)``, step and prediction alternated over
    ``reps`` rounds after 3 warm-up rounds (medians); ``ratio``: the largest."""
    width, depth = (256, 4) if quick else (1024, 10)
    torch.manual_seed(0)
    model = deep_mlp(in_features=width, width=width, depth=depth).to(device)
    params = list(model.parameters())
    rows = []
    for opt_name, pred_name in PREDICTIONS:
        opt = make_optimizer(opt_name, params)
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt.step()  # state exists
        pred = make_predictor(pred_name)
        pred.observe(opt)
        opt.step()
        pred.observe(opt)
        r = alternate({"step": opt.step, "predict": lambda pred=pred, opt=opt: pred.predict(opt, 3)}, reps,
                      warmup=3, sync=_syncer(device))
        rows.append({"optimizer": opt_name, "predictor": pred_name, "predict_s": r.median("predict"),
                     "step_s": r.median("step"), **_ratio_fields(r.ratio("predict", "step"))})
    return {"params": sum(p.numel() for p in params), "rows": rows, "ratio": max(r["ratio"] for r in rows)}


def emulator_vs_plain(device: torch.device, quick: bool, steps: int, reps: int) -> dict[str, Any]:
    """(b): ms per step of plain training and of the emulator (GPipe, stashing; D = 4), alternated over ``reps``
    rounds after one warm-up round (copying the model and building the emulator not timed), their ratios; the GPipe
    run's weights against plain training's in float64 (``max_weight_diff``)."""
    width, depth, batch = (128, 8, 32) if quick else (512, 16, 128)
    D = 4
    opt = lambda ps: torch.optim.Adam(ps, lr=1e-4)  # noqa: E731
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(batch, 784, generator=g).to(device), torch.randint(0, 10, (batch,), generator=g).to(device))
            for _ in range(steps)]
    torch.manual_seed(0)
    base = deep_mlp(in_features=784, width=width, depth=depth).to(device)

    cases = (("gpipe", gpipe(D, 1, steps)), ("stashing", pipedream(D, 1, steps)))
    sides = {"plain": Side(lambda m: train_plain(m, optimizer=opt, batches=data, D=D),
                           setup=lambda: copy.deepcopy(base))}
    for policy, schedule in cases:
        sides[policy] = Side(lambda emu: emu.run(data), setup=lambda schedule=schedule, policy=policy: Emulator(
            copy.deepcopy(base), D=D, schedule=schedule, policy=policy, optimizer=opt))
    r = alternate(sides, reps, warmup=1, sync=_syncer(device))
    t_plain = r.median("plain") / steps
    rows = [{"policy": policy, "ms_per_step": 1e3 * r.median(policy) / steps, **_ratio_fields(r.ratio(policy, "plain"))}
            for policy, _ in cases]
    # agreeing weights: the flushed pipeline is plain mini-batch training (float64, 3 steps, same device)
    base64 = copy.deepcopy(base).double()
    data64 = [(x.double(), y) for x, y in data[:3]]
    ref = copy.deepcopy(base64)
    train_plain(ref, optimizer=opt, batches=data64, D=D)
    emu = Emulator(copy.deepcopy(base64), D=D, schedule=gpipe(D, 1, 3), policy="gpipe", optimizer=opt)
    emu.run(data64)
    got = [w for W in emu.weights() for w in W]
    diff = max((a - b).abs().max().item() for a, b in zip(got, ref.parameters()))
    return {"plain_ms_per_step": 1e3 * t_plain, "rows": rows, "ratio": max(r["ratio"] for r in rows),
            "max_weight_diff": diff}


def stacked_sweep(device: torch.device, quick: bool, rounds: int) -> dict[str, Any]:
    """(c): arm·steps per second, one seed at a time vs the seeds stacked (alternated over ``rounds`` rounds, no
    warm-up: every run builds its model afresh), and the ratio of throughputs."""
    seeds, n_train = (4, 512) if quick else (8, 4096)
    cfgs = [RunConfig(task="digits_mlp" if quick else "fashion_mnist_mlp", policy="stashing", optimizer="adam", D=4,
                      seed=s, epochs=1, batch_size=64, n_train=n_train, n_test=256, n_eval_train=256,
                      device=str(device)) for s in range(seeds)]
    steps = (n_train // 64) * len(cfgs)
    saved = os.environ.get("PIPELAB_CACHE")
    os.environ["PIPELAB_CACHE"] = "off"
    losses: dict[str, list[float]] = {}

    def way(name: str, stack: int) -> Callable[[], None]:
        def run() -> None:
            losses[name] = [rec["test_loss"][-1] for rec in sweep(cfgs, stack=stack, workers=1)]
        return run

    try:
        r = alternate({"one_at_a_time": way("one_at_a_time", 1), "stacked": way("stacked", seeds)}, rounds, warmup=0,
                      sync=_syncer(device))
    finally:
        if saved is None:
            os.environ.pop("PIPELAB_CACHE", None)
        else:
            os.environ["PIPELAB_CACHE"] = saved
    out: dict[str, Any] = {name: {"seconds": r.median(name), "arm_steps_per_s": steps / r.median(name),
                                  "final_test_loss": losses[name]} for name in ("one_at_a_time", "stacked")}
    out.update(_ratio_fields(r.ratio("one_at_a_time", "stacked")))  # throughput ratio = time ratio inverted
    out["max_test_loss_diff"] = max(abs(a - b) for a, b in zip(out["stacked"]["final_test_loss"],
                                                                out["one_at_a_time"]["final_test_loss"]))
    return out


def _runtime_rank(rank: int, world: int, quick: bool, steps: int, modes: list[dict[str, bool]]) -> list[dict]:
    from pipelab.runtime import PipelineRuntime
    from pipelab.runtime.p2p import P2PTransport

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and \
        torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    width, depth, batch = (128, 8, 64) if quick else (1024, 16, 256)
    D, M = world, 2 * world
    schedule = gpipe(1, M, steps) if world == 1 else one_f_one_b(D, M, steps)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(2)]
    torch.manual_seed(0)
    base = deep_mlp(in_features=784, width=width, depth=max(depth, D))
    out = []
    for i, mode in enumerate([modes[0], *modes]):  # the first run warms up (allocator, NCCL communicators)
        rt = PipelineRuntime(copy.deepcopy(base), schedule=schedule, policy="1f1b" if world > 1 else "gpipe",
                             optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4), device=device)
        if world > 1:
            rt.transport = P2PTransport(schedule, rank, rt.device, order="rendezvous", **mode)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        torch.distributed.barrier()
        _sync(device)
        t0 = time.perf_counter()
        res = rt.run(lambda t: data[t % 2])
        _sync(device)
        torch.distributed.barrier()
        seconds = time.perf_counter() - t0
        if i == 0:
            continue
        out.append({"mode": mode, "seconds": seconds, "samples_per_s": steps * batch / seconds,
                    "memory": {**{k: v for k, v in res.memory.items() if isinstance(v, int)},
                               "stage_bytes_total": sum(res.memory["stage_bytes"].values())}})
    return out


def runtime(device: torch.device, quick: bool, steps: int) -> dict[str, Any]:
    """(d): per mode of the NCCL-safe order, seconds and samples/s (rank 0's), per-rank peak memory beside the
    simulator's estimate of weights, optimizer state and activations."""
    from pipelab.simulator import simulate

    world = torch.cuda.device_count() if device.type == "cuda" else 2
    backend = "nccl" if device.type == "cuda" else "gloo"
    modes = [{}, {"prefetch": True}, {"prefetch": True, "batch": True}] if world > 1 else [{}]
    per_rank = spawn(_runtime_rank, world, (quick, steps, modes), backend=backend, timeout_s=1800)
    width, depth, batch = (128, 8, 64) if quick else (1024, 16, 256)
    D, M = world, 2 * world
    schedule = gpipe(1, M, steps) if world == 1 else one_f_one_b(D, M, steps)
    mem = [r[0]["memory"] for r in per_rank]
    # the simulator's estimate per worker: its weight versions, one gradient and Adam's two moments per stage, and
    # its peak activations, one unit = what a stage's micro-batch saves for its backward (about two float32
    # tensors of the micro-batch's width per layer)
    layers = max(depth, D) // D
    act = [2 * layers * (batch // M) * width * 4] * D
    peak_act = simulate(schedule, activation_bytes=act).peak_activation_bytes
    estimate = [m["weight_versions"] + 3 * m["stage_bytes_total"] + (int(peak_act[w]) if peak_act is not None else 0)
                for w, m in enumerate(mem)]
    note = ("one GPU: a single-rank schedule, so this measures the runtime's overhead only; transfers, NCCL "
            "ordering, prefetch/batch overlap and pipeline speed-up need >= 2 GPUs") if world == 1 else ""
    return {"ranks": world, "backend": backend, "schedule": schedule.name,
            "modes": [{"mode": m["mode"], "seconds": m["seconds"], "samples_per_s": m["samples_per_s"]}
                      for m in per_rank[0]],
            "memory": mem, "simulated_estimate_bytes": estimate, "note": note}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--quick", action="store_true", help="small sizes (a check that everything runs)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c", "d"], help="parts to leave out")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    add_thread_argument(ap)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA not available: nothing to measure on a GPU here (run with --device cpu to check the benchmark)")
        return 0
    device = torch.device(args.device)
    if args.quick:
        args.reps, args.steps = min(args.reps, 3), min(args.steps, 4)
    with torch_threads(args.threads):
        return _run(args, device)


def _run(args: argparse.Namespace, device: torch.device) -> int:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(header(f"pipelab GPU benchmark on {name}{', quick sizes' if args.quick else ''}"))
    res: dict[str, Any] = {"device": name, "quick": args.quick, "threads": torch.get_num_threads()}
    if "a" not in args.skip:
        a = res["prediction_vs_step"] = prediction_vs_step(device, args.quick, args.reps)
        print(f"\n(a) one prediction (s=3) vs one optimizer.step(), {a['params'] / 1e6:.1f}M parameters (target <= 1)")
        for r in a["rows"]:
            print(f"  {r['optimizer']:<6} {r['predictor']:<18} {1e3 * r['predict_s']:8.2f} ms vs "
                  f"{1e3 * r['step_s']:8.2f} ms  ratio {_shown(r)}")
    if "b" not in args.skip:
        b = res["emulator_vs_plain"] = emulator_vs_plain(device, args.quick, args.steps, args.reps)
        print(f"\n(b) emulator vs plain PyTorch per step (D=4, target <= 1.10); plain {b['plain_ms_per_step']:.2f} ms")
        for r in b["rows"]:
            print(f"  {r['policy']:<9} {r['ms_per_step']:8.2f} ms  ratio {_shown(r)}")
        print(f"  GPipe weights vs plain training (float64): max |difference| {b['max_weight_diff']:.1e}")
    if "c" not in args.skip:
        c = res["stacked_sweep"] = stacked_sweep(device, args.quick, min(3, args.reps))
        res["stacked_speedup"] = {"ratio": c["ratio"]}
        print(f"\n(c) sweep throughput: stacked {c['stacked']['arm_steps_per_s']:.1f} vs one at a time "
              f"{c['one_at_a_time']['arm_steps_per_s']:.1f} arm·steps/s, ratio {_shown(c)} "
              f"(final test loss differs by <= {c['max_test_loss_diff']:.1e})")
    if "d" not in args.skip:
        d = res["runtime"] = runtime(device, args.quick, args.steps)
        print(f"\n(d) runtime: {d['schedule']} on {d['ranks']} rank(s) × 1 intra-op thread, {d['backend']}; "
              f"load average {load_average():.1f}")
        for m in d["modes"]:
            label = "+".join(k for k, v in m["mode"].items() if v) or "rendezvous order"
            print(f"  {label:<18} {m['seconds']:8.2f} s  {m['samples_per_s']:10.1f} samples/s")
        for r, (m, e) in enumerate(zip(d["memory"], d["simulated_estimate_bytes"])):
            measured = m.get("cuda_max_allocated")
            shown = f"{measured / 2**20:.1f} MiB" if measured is not None else "n/a (CPU)"
            print(f"  rank {r}: peak allocated {shown}; simulator's weights+Adam+activations {e / 2**20:.1f} MiB")
        if d["note"]:
            print(f"  note: {d['note']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2, default=str)
    return 0


def _shown(r: dict[str, Any]) -> str:
    q1, q3 = r["ratio_iqr"]
    return f"{r['ratio']:.2f} [IQR {q1:.2f}–{q3:.2f}] load {r['load']:.1f}"


if __name__ == "__main__":
    sys.exit(main())
