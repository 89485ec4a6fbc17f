"""What every benchmark shares: one intra-op thread by default, a header naming what the numbers depend on, and
ratios from alternated rounds with the load average beside them.

**Threads.** torch's default intra-op pool has one thread per core, and its threads spin-wait for work. On a
small machine shared with other jobs that spinning is what gets measured: on a busy 2-core box one plain training
step of the emulator benchmark's MLP took 6,216 ms with two threads and 445 ms with one, so every ratio against it
measured the waiting (a prediction at "103.9×" a step). The benchmarks therefore run one thread unless
``--threads`` asks for more (:func:`add_thread_argument`, applied with :func:`pipelab.threads.torch_threads`);
the multi-process ones give each rank one thread (:func:`pipelab.distributed.spawn`).

**Header.** :func:`header` prints the torch version, the intra-op threads, the allocator setting (the
``MALLOC_*`` variables of glibc's malloc, stated as its defaults when none is set, and on CUDA
``PYTORCH_CUDA_ALLOC_CONF``), the machine's cores, its load average and its speed at that moment (a memory copy
and a matmul, :func:`host_speed`): the things that changed past measurements by more than the effect measured.

**Ratios.** Two figures timed in separate blocks drift apart with the machine (a neighbour starts, the CPU
clock changes). :func:`alternate` runs the sides of a comparison in turn, one call each per round, the order
reversed every other round — A B, B A, A B, ... after a warm-up — and a ratio is the **median of the per-round
ratios** (each round's sides ran seconds apart), with their interquartile range and the 1-minute load average
sampled at every round (:class:`Ratio`). :func:`paired_ratio` does the same for figures the multi-process
benchmarks collect per repeat themselves.

**Page faults.** Every timed call also counts the process's minor page faults (:func:`minor_faults`): memory that
glibc's malloc gave back to the kernel (trimming the heap's top, or unmapping a large block) is faulted in again,
a page at a time, by the next allocation that reuses it. Whether that happens depends on the order of allocations
and frees, on malloc's settings and on what the process did before: on the emulator benchmark's MLP, plain training
faulted ~0 times a step and the emulator 13 to 800 under malloc's defaults (and 5,000 to 20,000 with
``MALLOC_TOP_PAD_`` at 256 MiB), so a ratio is read beside its sides' faults.

**Allocator state.** The faults also break a ratio whose sides allocate different amounts: glibc trims the heap
once more than twice its dynamic mmap threshold lies free at its top, so a big instance's memory goes back to the
kernel after every call and is faulted in again at the next, while a small one's stays (the simulator's 262k-job
async 1F1B: 21,234 faults a call against 0, ×12.0 time for ×10 jobs; ×10.3 with freed memory kept). The CPU
benchmarks whose sides differ in size (simulator, emulator, predictors) therefore re-run themselves under
:data:`CACHING_MALLOC` (:func:`use_caching_malloc`), which keeps freed memory in the process for every side, as
torch's CUDA caching allocator keeps GPU memory; ``--system-malloc`` measures under glibc's defaults instead, and
the header says which.

Example:
    >>> ticks = iter(range(100))
    >>> rounds = alternate({"a": lambda: None, "b": lambda: None}, rounds=3, warmup=0,
    ...                    clock=lambda: float(next(ticks)), load=lambda: 0.5)
    >>> rounds.ratio("a", "b").median
    1.0
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["DEFAULT_THREADS", "CACHING_MALLOC", "add_malloc_argument", "caching_malloc_env", "use_caching_malloc",
           "CLOCKS", "add_clock_argument", "clock_for", "add_thread_argument", "cores",
           "load_average", "minor_faults", "allocator", "host_speed", "header", "Side", "Ratio", "Rounds", "alternate",
           "paired_ratio"]

#: intra-op threads of a benchmark unless ``--threads`` says otherwise (see the module docstring)
DEFAULT_THREADS = 1


def add_thread_argument(ap: argparse.ArgumentParser) -> None:
    """``--threads N`` (default :data:`DEFAULT_THREADS`): torch intra-op threads of the benchmark's process."""
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                    help=f"torch intra-op threads (default {DEFAULT_THREADS}: more threads spin-wait on a shared "
                         "machine, and that waiting is then what a ratio measures)")


#: glibc malloc settings that keep freed memory in the process: no heap trimming, and blocks below glibc's largest
#: mmap threshold (32 MiB) served from the heap rather than mapped and unmapped at each call
CACHING_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def add_malloc_argument(ap: argparse.ArgumentParser) -> None:
    """``--system-malloc``: measure under glibc's default malloc settings (read by :func:`use_caching_malloc`)."""
    ap.add_argument("--system-malloc", action="store_true",
                    help="keep glibc's default malloc settings (freed memory handed back to the kernel and faulted "
                         "in again; by default the script re-runs itself with freed memory kept, so that every side "
                         "of a ratio runs in the same allocator state)")


def caching_malloc_env(argv: Sequence[str], environ: Mapping[str, str], libc: str) -> dict[str, str] | None:
    """The environment to re-run a benchmark under, or None to run it as it is: with ``--system-malloc`` in
    ``argv``, with :data:`CACHING_MALLOC` already in ``environ``, or where the C library is not glibc."""
    if "--system-malloc" in argv or libc != "glibc" or all(environ.get(k) == v for k, v in CACHING_MALLOC.items()):
        return None
    return {**environ, **CACHING_MALLOC}


def use_caching_malloc() -> None:
    """Re-execute this script under :data:`CACHING_MALLOC` (module docstring, "Allocator state"), unless
    :func:`caching_malloc_env` says to run as it is. Call it first thing in the script's ``__main__`` block: glibc
    reads the settings when the process starts."""
    env = caching_malloc_env(sys.argv, os.environ, platform.libc_ver()[0])
    if env is not None:
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


#: what ``--clock`` may name: the wall clock, or this process's CPU time
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def add_clock_argument(ap: argparse.ArgumentParser) -> None:
    """``--clock wall|cpu`` (default wall): the clock of every timed side (:data:`CLOCKS`, passed to
    :func:`alternate`)."""
    ap.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                    help="wall: time.perf_counter; cpu: this process's CPU time (time.process_time), for a machine "
                         "shared with other jobs, where wall time also measures the waiting (CPU time of one thread; "
                         "not for CUDA, whose work runs outside the process's CPU time)")


def clock_for(name: str, device: torch.device) -> Callable[[], float]:
    """The clock ``--clock name`` gives a benchmark on ``device``: CUDA work runs outside the process's CPU time, so
    a CUDA side is always timed by the wall clock."""
    return CLOCKS[name] if device.type == "cpu" else time.perf_counter


def cores() -> int:
    """Cores this process may run on (its CPU affinity where the system tells it, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (NaN where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def minor_faults() -> float:
    """Minor page faults of this process so far (NaN where ``resource`` is missing: not on Windows)."""
    try:
        import resource
    except ImportError:
        return float("nan")
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def allocator() -> str:
    """The allocator setting the numbers depend on: glibc's ``MALLOC_*`` variables (or its defaults, stated) and,
    with CUDA, ``PYTORCH_CUDA_ALLOC_CONF`` (or the caching allocator's defaults)."""
    malloc = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")]
    libc, version = platform.libc_ver()
    name = f"{libc} {version} malloc" if libc else "system malloc"
    parts = [f"{name} with {', '.join(malloc)}" if malloc else f"{name} defaults (no MALLOC_* set)"]
    if torch.cuda.is_available():
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        parts.append(f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "CUDA caching allocator defaults "
                     "(PYTORCH_CUDA_ALLOC_CONF unset)")
    return "; ".join(parts)


def host_speed(reps: int = 5) -> tuple[float, float]:
    """(copy GB/s, float32 matmul GFLOP/s) of this process on the CPU, the median of ``reps`` timings: a copy of
    64 MiB (bytes read + written; past a shared L3 cache) and twenty 512 × 512 products, with torch's current
    threads. Printed in every header (module docstring): a host's speed changes from hour to hour with its
    neighbours, and the emulator's ratios move with it (GPipe 1.03 and 1.09 on one host an hour apart)."""
    a = torch.ones(16 * 2**20)
    b = torch.empty_like(a)
    m = torch.ones(512, 512)
    copy_s, mm_s = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        b.copy_(a)
        copy_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(20):
            torch.mm(m, m)
        mm_s.append(time.perf_counter() - t0)
    return 2 * a.nbytes / statistics.median(copy_s) / 1e9, 20 * 2 * 512**3 / statistics.median(mm_s) / 1e9


def header(title: str, threads: str | None = None) -> str:
    """One line: ``title``, torch version, intra-op threads (``threads``: a description instead of this process's
    count, e.g. for ranks), allocator, cores, load average (1, 5, 15 minutes) and the host's speed
    (:func:`host_speed`)."""
    loads = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    th = threads or f"{torch.get_num_threads()} intra-op thread{'s' if torch.get_num_threads() > 1 else ''}"
    copy_gbs, mm_gflops = host_speed()
    return (f"{title} — torch {torch.__version__}, {th}, allocator: {allocator()}, {cores()} cores, "
            f"load average {loads[0]:.2f} {loads[1]:.2f} {loads[2]:.2f}, host speed: copy {copy_gbs:.1f} GB/s, "
            f"matmul {mm_gflops:.0f} GFLOP/s")


@dataclass(frozen=True)
class Side:
    """One side of a comparison: ``run(setup())`` is timed, ``setup()`` (optional, e.g. a fresh copy of the model)
    is not; without ``setup``, ``run()`` takes no argument."""

    run: Callable[..., object]
    setup: Callable[[], Any] | None = None


@dataclass(frozen=True)
class Ratio:
    """The median of per-round ratios, their quartiles, every round's ratio, and the median load of the rounds."""

    median: float
    q1: float
    q3: float
    values: tuple[float, ...]
    load: float

    def __str__(self) -> str:
        return f"{self.median:.2f}× [IQR {self.q1:.2f}–{self.q3:.2f}] load {self.load:.1f}"


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def paired_ratio(num: Sequence[float], den: Sequence[float], loads: Sequence[float] = (),
                 scale: float = 1.0) -> Ratio:
    """:class:`Ratio` of ``scale · num[i] / den[i]`` over rounds i (figures of one round ran close in time).

    Args:
        num, den: one figure per round, the same number of rounds (at least one).
        loads: the load average at each round (NaN when none is given).

    Raises:
        ValueError: no rounds, or ``num`` and ``den`` of different lengths.
    """
    if not num or len(num) != len(den):
        raise ValueError(f"num and den need the same number (>= 1) of rounds, got {len(num)} and {len(den)}")
    values = [scale * a / b for a, b in zip(num, den)]
    q1, q3 = _quartiles(values)
    load = statistics.median(loads) if loads else float("nan")
    return Ratio(statistics.median(values), q1, q3, tuple(values), load)


@dataclass
class Rounds:
    """What :func:`alternate` measured: ``seconds[name][i]``, side ``name``'s time in round i, ``faults[name][i]``
    the minor page faults during it (:func:`minor_faults`), and ``loads[i]``, the 1-minute load average at the end
    of round i."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)
    faults: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        """Median over rounds of side ``name``'s seconds."""
        return statistics.median(self.seconds[name])

    def median_faults(self, name: str) -> float:
        """Median over rounds of side ``name``'s minor page faults."""
        return statistics.median(self.faults[name])

    def total(self, names: str | Sequence[str]) -> list[float]:
        """Per round, the seconds of side ``names`` (a name, or several summed round by round)."""
        names = [names] if isinstance(names, str) else list(names)
        missing = [n for n in names if n not in self.seconds]
        if missing or not names:
            raise ValueError(f"unknown side(s) {missing or names!r}; measured: {', '.join(self.seconds)}")
        return [sum(v) for v in zip(*(self.seconds[n] for n in names))]

    def ratio(self, num: str | Sequence[str], den: str | Sequence[str], scale: float = 1.0) -> Ratio:
        """Median over rounds of ``scale · num / den``, each a side or several sides summed within the round."""
        return paired_ratio(self.total(num), self.total(den), self.loads, scale)


def alternate(sides: Mapping[str, Side | Callable[[], object]], rounds: int, *, warmup: int = 1,
              sync: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter,
              load: Callable[[], float] = load_average) -> Rounds:
    """Time ``sides`` alternately: ``warmup`` untimed calls of each in turn, then ``rounds`` rounds, each calling
    every side once, in the mapping's order in even rounds and reversed in odd ones (A B, B A, A B, ...: a side
    that always ran right after another would inherit what it left behind, its freed memory or a warmer cache,
    in every round), and the load average after every round.

    Args:
        sides: name → :class:`Side`, or a callable (a side without set-up).
        rounds: timed rounds (>= 1); warmup: untimed rounds before them (>= 0).
        sync: called before the clock starts and before it stops (e.g. ``torch.cuda.synchronize``).
        clock: seconds (``time.perf_counter``); load: the load average (:func:`load_average`); both injectable.

    Raises:
        ValueError: no sides, ``rounds`` < 1 or ``warmup`` < 0.
    """
    if not sides:
        raise ValueError("sides must name at least one side to time")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    plan = {name: s if isinstance(s, Side) else Side(s) for name, s in sides.items()}
    out = Rounds({name: [] for name in plan}, faults={name: [] for name in plan})
    for i in range(warmup + rounds):
        for name, side in list(plan.items())[::-1 if i % 2 else 1]:
            args = () if side.setup is None else (side.setup(),)
            if sync is not None:
                sync()
            f0, t0 = minor_faults(), clock()
            side.run(*args)
            if sync is not None:
                sync()
            seconds, faults = clock() - t0, minor_faults() - f0
            if i >= warmup:
                out.seconds[name].append(seconds)
                out.faults[name].append(faults)
        if i >= warmup:
            out.loads.append(load())
    return out
