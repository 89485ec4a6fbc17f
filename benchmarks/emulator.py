"""Time per training step of the pipeline emulator vs plain PyTorch training of the same model and batch.

For each device (CPU, and CUDA when available), D in {4, 8} and policy in {stashing, pipeoptim} (plus
GPipe as a flushed reference), the script trains a deep MLP for ``--steps`` mini-batches in the emulator
and with a plain PyTorch loop (forward of the whole model, loss, backward, optimizer step), and prints
the median time per step over ``--repeats`` runs and the ratio emulator / plain, all from this one run.

Expectations: policies whose forward and backward weights agree (stashing, GPipe) keep the forward's
autograd graph and pay only the per-stage bookkeeping and one weight copy per update (target ≤ 1.2×);
PipeOptim recomputes the stage forward at the backward weights and predicts weights before each forward,
so it pays about one extra forward per job.

Usage:
    .venv/bin/python benchmarks/emulator.py [--steps 30] [--repeats 3] [--width 512] [--depth 16] [--batch 128]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from pipelab.emulator import Emulator, train_plain
from pipelab.models import deep_mlp
from pipelab.schedules import Schedule, gpipe, pipedream


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--optimizer", choices=["sgdm", "adam"], default="adam")
    args = ap.parse_args()

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    opt = ((lambda ps: torch.optim.Adam(ps, lr=1e-4)) if args.optimizer == "adam"
           else (lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9)))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; deep_mlp width {args.width} depth "
          f"{args.depth}, batch {args.batch}, {args.optimizer}, {args.steps} steps, median of {args.repeats}")
    for device in devices:
        torch.manual_seed(0)
        base = deep_mlp(in_features=784, width=args.width, depth=args.depth).to(device)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(args.batch, 784, generator=g).to(device), torch.randint(0, 10, (args.batch,),
                 generator=g).to(device)) for _ in range(args.steps)]

        def plain(base: torch.nn.Module, device: torch.device | str, data: list) -> float:
            m = copy.deepcopy(base)
            sync(device)
            t0 = time.perf_counter()
            train_plain(m, optimizer=opt, batches=data)
            sync(device)
            return (time.perf_counter() - t0) / args.steps

        plain(base, device, data)  # warm-up
        t_plain = statistics.median(plain(base, device, data) for _ in range(args.repeats))
        print(f"\n[{device}] plain PyTorch: {1e3 * t_plain:.2f} ms/step")
        print(f"  {'policy':<10} {'D':>2} {'ms/step':>9} {'ratio':>7} {'setup ms':>9}  weight copies per stage")
        for D in (4, 8):
            for policy, schedule in (("gpipe", gpipe(D, 1, args.steps)), ("stashing", pipedream(D, 1, args.steps)),
                                     ("pipeoptim", pipedream(D, 1, args.steps))):
                def emulated(base: torch.nn.Module, device: torch.device | str, data: list, D: int, schedule: Schedule,
                             policy: str) -> tuple[float, float, list[int]]:
                    m = copy.deepcopy(base)
                    t0 = time.perf_counter()
                    emu = Emulator(m, D=D, schedule=schedule, policy=policy, optimizer=opt)
                    t1 = time.perf_counter()
                    sync(device)
                    t2 = time.perf_counter()
                    emu.run(data)
                    sync(device)
                    return (time.perf_counter() - t2) / args.steps, t1 - t0, emu.weight_copies

                case = (base, device, data, D, schedule, policy)
                emulated(*case)  # warm-up
                runs = [emulated(*case) for _ in range(args.repeats)]
                t = statistics.median(r[0] for r in runs)
                setup = statistics.median(r[1] for r in runs)
                print(f"  {policy:<10} {D:>2} {1e3 * t:>9.2f} {t / t_plain:>6.2f}x {1e3 * setup:>9.1f}  {runs[0][2]}")


if __name__ == "__main__":
    main()
