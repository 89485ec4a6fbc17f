"""Cost of one weight prediction vs one ``optimizer.step()`` on a ~10M-parameter model.

For each optimizer and predictor: best-of-``reps`` wall time of ``predictor.predict(optimizer, s)`` over all
parameters, of ``optimizer.step()`` (torch's default implementation for the device), and their ratio.
Target: a prediction costs no more than one optimizer step (ratio ≤ 1). Runs on CPU, and on CUDA when
available.

Usage:
    .venv/bin/python benchmarks/predictors.py [--reps 10] [--s 3] [--device cpu|cuda|all] [--threads N]
        [--system-malloc]

On Linux the script re-executes itself with glibc malloc set to keep freed memory (see
``_reexec_with_caching_malloc``); ``--system-malloc`` measures with the defaults instead.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch

from pipelab.models import deep_mlp
from pipelab.predictors import make_predictor

OPTIMIZERS = {
    "SGDM": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
}
PREDICTORS = ["stale", "spectrain", "pipeoptim", "pipeoptim_code", "repeat", "zero_grad_rollout", "linear", "pipemare"]


def _time(fn, reps: int, device: torch.device) -> float:
    """Fastest of ``reps`` timed runs of ``fn()`` after three warm-up runs, in seconds.

    The minimum, not the median: on a shared machine (CPU quota throttling, other jobs) the slow runs
    measure the neighbours, not the code. The warm-up lets the allocator reuse freed blocks: a prediction
    returns new tensors while ``optimizer.step()`` works in place, and on CPU a cold allocation of fresh
    pages costs more than the arithmetic.
    """
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - t0)
    return min(out)


def bench(device: torch.device, reps: int, s: int) -> list[tuple[str, str, float, float]]:
    torch.manual_seed(0)
    model = deep_mlp(in_features=1024, width=1024, depth=10).to(device)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    print(f"\n== device {device} — deep_mlp(1024×1024, depth 10): {n / 1e6:.2f}M parameters, s = {s}, "
          f"best of {reps}")
    rows = []
    for oname, make in OPTIMIZERS.items():
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt = make(params)
        opt.step()
        t_step = _time(opt.step, reps, device)
        print(f"{oname:8s} optimizer.step(): {t_step * 1e3:8.2f} ms")
        step_rows = []
        for pname in PREDICTORS:
            pred = make_predictor(pname)
            try:
                pred.check(opt)
            except (TypeError, ValueError):
                continue
            pred.observe(opt)
            opt.step()
            pred.observe(opt)
            t_pred = _time(functools.partial(pred.predict, opt, s), reps, device)
            step_rows.append((oname, pname, t_pred))
        # time the step again after the predictions (same allocator state) and keep the faster of the two
        t_step = min(t_step, _time(opt.step, reps, device))
        for oname_, pname, t_pred in step_rows:
            rows.append((oname_, pname, t_pred, t_pred / t_step))
            print(f"{'':8s} {pname:18s} {t_pred * 1e3:8.2f} ms   ratio to step {t_pred / t_step:5.2f}")
        print(f"{'':8s} (optimizer.step() best after predictions: {t_step * 1e3:.2f} ms)")
        del opt
    return rows


_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def _reexec_with_caching_malloc() -> None:
    """Re-run this script with glibc malloc keeping freed memory (like torch's CUDA caching allocator).

    By default glibc hands freed multi-megabyte blocks back to the OS, so every fresh tensor page-faults
    its memory again; that cost then depends on what else happens to be allocated (it made the same
    ``clone`` 8x slower in one part of a run than in another) and hides the arithmetic being compared.
    """
    if os.name != "posix" or all(k in os.environ for k in _MALLOC_ENV):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC_ENV})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--system-malloc", action="store_true",
                    help="keep glibc's default malloc settings (freed memory returned to the OS)")
    ap.add_argument("--s", type=int, default=3)
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the CPU run")
    args = ap.parse_args()
    if not args.system_malloc:
        _reexec_with_caching_malloc()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = []
    if args.device in ("cpu", "all"):
        devices.append(torch.device("cpu"))
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    malloc = ", ".join(f"{k}={os.environ[k]}" for k in _MALLOC_ENV if k in os.environ) or "system default"
    print(f"malloc: {malloc}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          + (f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"))
    for device in devices:
        rows = bench(device, args.reps, args.s)
        one_pass = [r for r in rows if r[1] in ("spectrain", "pipeoptim", "pipeoptim_code", "linear", "pipemare")]
        worst = max(one_pass, key=lambda r: r[3])
        print(f"summary {device}: one-pass predictors cost ≤ {worst[3]:.2f}× a step "
              f"(worst: {worst[1]} with {worst[0]}); "
              f"rollouts ('repeat', 'zero_grad_rollout') cost about s = {args.s} steps by construction")


if __name__ == "__main__":
    main()
