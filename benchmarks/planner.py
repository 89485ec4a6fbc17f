"""The planner's speed (plans per second, growth with blocks and devices) and its measured gain over an even split.

**Speed.** :func:`pipelab.planner.plan` on synthetic models of n blocks (forward 0.5–2 units, backward twice, seeded)
on W devices, every schedule it searches, M ∈ {W, 2W, 4W, 8W}, one thread: the wall and CPU time of the call, the
simulations it ran and simulations per second ("plans/s": each simulation scores one partition × schedule × M for
every policy), whether the search proved its best plan optimal, and the best plan. The 64-block, 8-device row is the
issue's target (≤ 10 s on a 2-core CPU; the CPU time shows what the load took from the wall time).

**Measured.** A deliberately uneven ``nn.Sequential`` (``--blocks`` blocks of Linear(width, width) + ReLU; block 0 is
a heavy one, Linear(width, k·width) + ReLU + Linear(k·width, width), about 2k light blocks of work) is profiled
block by block in this process (one thread, :meth:`pipelab.planner.Blocks.measure`), planned for W ranks over the
flushed schedules ``--schedules``, and then, in one :func:`pipelab.distributed.spawn` of W gloo ranks (one thread
each), the best plan and the even split (``balance="layers"``) with the same schedule and M are run by
:class:`pipelab.runtime.PipelineRuntime`, alternately, ``--repeats`` times. Time per mini-batch as
``benchmarks/runtime.py`` measures it: (entry(w + n) − entry(w)) / n from stage 0's intake. Printed: the forecast
ratio (the planner's step time of the even split over the best plan's) and the measured ratio (median of the
per-repeat ratios, IQR, load average).

Usage:
    .venv/bin/python benchmarks/planner.py [--growth] [--measure] [--ranks 2 4] [--width 512] [--blocks 12]
        [--heavy 3] [--batch 64] [--schedules 1f1b gpipe zb_h1] [--steps 12] [--warmup 3] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/planner.py` finds the harness

from benchmarks._harness import add_thread_argument, header, load_average, paired_ratio  # noqa: E402
from pipelab.distributed import spawn  # noqa: E402
from pipelab.planner import Blocks, plan  # noqa: E402
from pipelab.runtime import PipelineRuntime  # noqa: E402
from pipelab.schedules import BUILDERS  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402

__all__ = ["growth", "uneven_model", "MeasureConfig", "measure", "format_growth", "format_measure", "main"]


def growth(sizes: list[tuple[int, int]], seed: int = 0) -> list[dict[str, Any]]:
    """Plan synthetic models of n blocks on W devices (all schedules, M ∈ {W, 2W, 4W, 8W}); one row per (n, W)."""
    rows = []
    for n, W in sizes:
        rng = np.random.default_rng(seed)
        f = rng.uniform(0.5, 2.0, n)
        blocks = Blocks(f, 2 * f, activation_bytes=[1000] * n, output_bytes=[100] * n, weight_bytes=[4000] * n)
        t0, c0 = time.perf_counter(), time.process_time()
        plans = plan(blocks, W, global_batch=8 * W, micro_batches=[W * 2**e for e in range(4)])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"blocks": n, "devices": W, "seconds": wall, "cpu_seconds": cpu, "simulations": plans.simulations,
                     "plans_per_s": plans.simulations / wall, "exact": plans.exact, "best": plans[0].explain(),
                     "load": load_average()})
    return rows


def uneven_model(width: int, blocks: int, heavy: int, seed: int = 0) -> nn.Sequential:
    """``blocks`` blocks of Linear + ReLU, block 0 a heavy Linear(width, heavy·width) + ReLU + Linear back."""
    torch.manual_seed(seed)
    first = nn.Sequential(nn.Linear(width, heavy * width), nn.ReLU(), nn.Linear(heavy * width, width), nn.ReLU())
    return nn.Sequential(first, *[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks - 1)])


@dataclass(frozen=True)
class MeasureConfig:
    """One measured comparison on ``ranks`` gloo ranks (see the module docstring)."""

    ranks: int = 2
    width: int = 512
    blocks: int = 12
    heavy: int = 3
    batch: int = 64
    schedules: tuple[str, ...] = ("1f1b", "gpipe", "zb_h1")
    steps: int = 12
    warmup: int = 3
    repeats: int = 5
    profile_reps: int = 10
    seed: int = 0


def _run(rank: int, world: int, model: nn.Sequential, schedule: Any, sizes: list[int], data: list[Any],
         steps: int) -> list[float]:
    """One timed run of ``schedule`` over the partition ``sizes``: when each mini-batch entered stage 0."""
    rt = PipelineRuntime(copy.deepcopy(model), schedule=schedule, policy="sequential", balance=sizes,
                         optimizer=lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9), device="cpu")
    entries: dict[int, float] = {}

    def get(t: int) -> tuple[Tensor, Tensor]:
        entries.setdefault(t, time.perf_counter())
        return data[t % len(data)]

    torch.distributed.barrier()
    rt.run(get)
    torch.distributed.barrier()
    return [entries.get(t, float("nan")) for t in range(steps)]


def _rank_main(rank: int, world: int, cfg: MeasureConfig, model: nn.Sequential, arms: dict[str, Any]
               ) -> dict[str, Any]:
    g = torch.Generator().manual_seed(cfg.seed + 1)
    data = [(torch.randn(cfg.batch, cfg.width, generator=g), torch.randint(0, cfg.width, (cfg.batch,), generator=g))
            for _ in range(4)]
    total = cfg.warmup + cfg.steps + 1
    times: dict[str, list[float]] = {name: [] for name in arms}
    loads = []
    for _ in range(cfg.repeats):
        for name, (builder, args, sizes) in arms.items():
            entries = _run(rank, world, model, BUILDERS[builder](*args, total), sizes, data, total)
            times[name].append((entries[cfg.warmup + cfg.steps] - entries[cfg.warmup]) / cfg.steps)
        loads.append(load_average())
    return {"times": times, "loads": loads}


def measure(cfg: MeasureConfig) -> dict[str, Any]:
    """Profile, plan, and time the best plan against the even split with the same schedule and M."""
    model = uneven_model(cfg.width, cfg.blocks, cfg.heavy, cfg.seed)
    W = cfg.ranks
    Ms = [M for M in (W, 2 * W, 4 * W) if cfg.batch % M == 0]
    with torch_threads(1):  # as each rank runs; profiled at the largest micro-batch, scaled to the others
        x, y = torch.randn(cfg.batch // Ms[0], cfg.width), torch.randint(0, cfg.width, (cfg.batch // Ms[0],))
        blocks = Blocks.measure(model, x, y, reps=cfg.profile_reps, warmup=3)
    best = plan(blocks, W, global_batch=cfg.batch, schedules=cfg.schedules, micro_batches=Ms)[0]
    even = [cfg.blocks // W + (1 if k >= W - cfg.blocks % W else 0) for k in range(W)]  # split()'s "layers"
    baseline = plan(blocks, W, global_batch=cfg.batch, schedules=(best.schedule,), micro_batches=(best.M,),
                    partition=even)[0]
    arms = {"best": (best.schedule, (W, best.M), list(best.sizes)), "even": (best.schedule, (W, best.M), even)}
    t0 = time.perf_counter()
    per_rank = spawn(_rank_main, W, (cfg, model, arms), timeout_s=1800.0, comm_timeout_s=300.0)
    wall = time.perf_counter() - t0
    times, loads = per_rank[0]["times"], per_rank[0]["loads"]
    ratio = paired_ratio(times["even"], times["best"], loads)
    return {"config": asdict(cfg), "best": best.explain(), "even": baseline.explain(),
            "forecast_best_s": best.step_time, "forecast_even_s": baseline.step_time,
            "forecast_ratio": baseline.step_time / best.step_time, "measured_best_s": float(np.median(times["best"])),
            "measured_even_s": float(np.median(times["even"])), "measured_ratio": ratio.median,
            "measured_iqr": [ratio.q1, ratio.q3], "load": ratio.load, "wall_s": wall,
            "profile": {"f": list(blocks.f), "b": list(blocks.b)}}


def format_growth(rows: list[dict[str, Any]]) -> str:
    out = [f"{'blocks':>6} {'devices':>7} {'seconds':>8} {'cpu s':>6} {'sims':>5} {'plans/s':>8} exact  load  "
           "best plan"]
    for r in rows:
        out.append(f"{r['blocks']:>6} {r['devices']:>7} {r['seconds']:>8.2f} {r['cpu_seconds']:>6.2f} "
                   f"{r['simulations']:>5} {r['plans_per_s']:>8.1f} {str(r['exact']):>5} {r['load']:>5.2f}  "
                   f"{r['best']}")
    return "\n".join(out)


def format_measure(r: dict[str, Any]) -> str:
    c = r["config"]
    return (f"{c['ranks']} gloo ranks, {c['blocks']} blocks of width {c['width']} (block 0 heavy, ×{c['heavy']}), "
            f"batch {c['batch']}, {c['repeats']} repeats\n"
            f"  best: {r['best']}\n  even: {r['even']}\n"
            f"  forecast even/best = {r['forecast_ratio']:.3f} ({r['forecast_even_s'] * 1e3:.2f} / "
            f"{r['forecast_best_s'] * 1e3:.2f} ms)\n"
            f"  measured even/best = {r['measured_ratio']:.3f} [IQR {r['measured_iqr'][0]:.3f}–"
            f"{r['measured_iqr'][1]:.3f}]"
            f" ({r['measured_even_s'] * 1e3:.2f} / {r['measured_best_s'] * 1e3:.2f} ms per mini-batch), "
            f"load average {r['load']:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--growth", action="store_true", help="time plan() over blocks × devices")
    ap.add_argument("--measure", action="store_true", help="run the best plan and the even split on gloo ranks")
    ap.add_argument("--sizes", nargs="+", default=["16x2", "16x4", "32x4", "32x8", "64x4", "64x8"],
                    help="blocks x devices of the growth table")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    for name, default in (("width", 512), ("blocks", 12), ("heavy", 3), ("batch", 64), ("steps", 12), ("warmup", 3),
                          ("repeats", 5), ("profile-reps", 10)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--schedules", nargs="+", default=list(MeasureConfig.schedules),
                    help="flushed schedules the measured comparison plans over")
    ap.add_argument("--json", type=Path)
    add_thread_argument(ap)
    args = ap.parse_args(argv)
    if not (args.growth or args.measure):
        args.growth = args.measure = True
    report: dict[str, Any] = {}
    print(header("planner", f"{args.threads} intra-op thread(s); ranks 1 each"))
    if args.growth:
        with torch_threads(args.threads):
            sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes]
            report["growth"] = growth([(n, W) for n, W in sizes])
        print(format_growth(report["growth"]))
    if args.measure:
        report["measure"] = []
        for W in args.ranks:
            cfg = MeasureConfig(ranks=W, width=args.width, blocks=args.blocks, heavy=args.heavy, batch=args.batch,
                                steps=args.steps, warmup=args.warmup, repeats=args.repeats,
                                profile_reps=args.profile_reps, schedules=tuple(args.schedules))
            report["measure"].append(measure(cfg))
            print(format_measure(report["measure"][-1]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
