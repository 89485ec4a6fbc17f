"""Cost of one weight prediction vs one ``optimizer.step()`` on a ~10M-parameter model.

For each optimizer and predictor: ``predictor.predict(optimizer, s)`` over all parameters against
``optimizer.step()`` (torch's default implementation for the device), timed alternately, step then prediction,
round after round (``--reps`` rounds after three warm-up rounds, :mod:`benchmarks._harness`); the ratio is the
median of the per-round ratios with its interquartile range and the load average. Target: a prediction costs no
more than one optimizer step (ratio ≤ 1). Runs on CPU with one intra-op thread (``--threads`` for more), and
on CUDA when available.

Usage:
    .venv/bin/python benchmarks/predictors.py [--reps 10] [--s 3] [--device cpu|cuda|all] [--threads 1]
        [--system-malloc]

On Linux the script re-executes itself with glibc malloc set to keep freed memory
(:func:`benchmarks._harness.use_caching_malloc`): by default glibc hands freed multi-megabyte blocks back to the
kernel, so every fresh tensor page-faults its memory again, which made the same ``clone`` 8x slower in one part of
a run than in another. ``--system-malloc`` measures with the defaults instead. The header states which.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/predictors.py` finds the harness

from benchmarks._harness import (  # noqa: E402
    Ratio,
    add_clock_argument,
    add_malloc_argument,
    add_thread_argument,
    alternate,
    clock_for,
    header,
    use_caching_malloc,
)
from pipelab.optim import make_optimizer, optimizer_label  # noqa: E402
from pipelab.predictors import make_predictor  # noqa: E402
from pipelab.studies.models import deep_mlp  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402

#: registry name -> this benchmark's overrides of the registry's defaults (pipelab.optim.OPTIMIZERS)
OPTIMIZERS = {"sgdm": {"lr": 0.01}, "adam": {}, "adamw": {}, "rmsprop": {"lr": 1e-3}}
PREDICTORS = ["stale", "spectrain", "pipeoptim", "pipeoptim_code", "repeat", "zero_grad_rollout", "linear", "pipemare"]


def bench(device: torch.device, reps: int, s: int, clock: str = "wall") -> list[tuple[str, str, float, float, Ratio]]:
    """Rows ``(optimizer, predictor, predict seconds, step seconds, ratio)``, medians over ``reps`` alternated rounds.

    Three warm-up rounds let the allocator reuse freed blocks: a prediction returns new tensors while
    ``optimizer.step()`` works in place, and on CPU a cold allocation of fresh pages costs more than the arithmetic.
    """
    torch.manual_seed(0)
    model = deep_mlp(in_features=1024, width=1024, depth=10).to(device)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    print(f"\n== device {device} — deep_mlp(1024×1024, depth 10): {n / 1e6:.2f}M parameters, s = {s}, "
          f"medians of {reps} rounds (step, prediction, step, ...)")
    rows = []
    for name, overrides in OPTIMIZERS.items():
        oname = optimizer_label(name)
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt = make_optimizer(name, params, **overrides)
        opt.step()
        for pname in PREDICTORS:
            pred = make_predictor(pname)
            try:
                pred.check(opt)
            except (TypeError, ValueError):
                continue
            pred.observe(opt)
            opt.step()
            pred.observe(opt)
            r = alternate({"step": opt.step, "predict": functools.partial(pred.predict, opt, s)}, reps, warmup=3,
                          sync=sync, clock=clock_for(clock, device))
            ratio = r.ratio("predict", "step")
            rows.append((oname, pname, r.median("predict"), r.median("step"), ratio))
            print(f"{oname:8s} {pname:18s} {r.median('predict') * 1e3:8.2f} ms vs step {r.median('step') * 1e3:8.2f} ms"
                  f"   ratio {ratio}")
        del opt
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--s", type=int, default=3)
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    add_thread_argument(ap)
    add_clock_argument(ap)
    add_malloc_argument(ap)
    args = ap.parse_args()
    with torch_threads(args.threads):  # the run's thread count, restored afterwards
        devices = []
        if args.device in ("cpu", "all"):
            devices.append(torch.device("cpu"))
        if args.device in ("cuda", "all") and torch.cuda.is_available():
            devices.append(torch.device("cuda"))
        print(header("pipelab predictor benchmark")
              + (f"; GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "; no GPU"))
        for device in devices:
            rows = bench(device, args.reps, args.s, args.clock)
            one_pass = [r for r in rows
                        if r[1] in ("spectrain", "pipeoptim", "pipeoptim_code", "linear", "pipemare")]
            worst = max(one_pass, key=lambda r: r[4].median)
            print(f"summary {device}: one-pass predictors cost ≤ {worst[4].median:.2f}× a step "
                  f"(worst: {worst[1]} with {worst[0]}); "
                  f"rollouts ('repeat', 'zero_grad_rollout') cost about s = {args.s} steps by construction")


if __name__ == "__main__":
    use_caching_malloc()
    main()
