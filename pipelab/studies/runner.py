"""The figure runner behind ``python -m pipelab figures`` (``make figures``): every core busy, the longest figure first,
an honest ETA, the time recorded.

- **Workers.** Figures are drawn by ``workers`` processes (default: one per CPU core), each with one intra-op thread,
  so two figures run side by side on a 2-core CPU; their sweeps run inside the worker. Figures that need the same
  runs share them through the result cache: a run one worker computes, another waits for or skips
  (:meth:`pipelab.studies.cache.ResultCache.claim`), so it is computed once. ``workers=1`` draws in this process.
- **Order.** Longest first by *expected cost*: the figure's last measured time under the preset (``timings.csv`` in
  the output directory), else its declared budget (:func:`pipelab.studies.figures.register`), else
  :data:`DEFAULT_COST`. Handing the longest out first keeps one long figure from running alone at the end.
- **Progress.** One overall bar whose ETA is the forecast makespan (:func:`forecast`) of the expected costs still to
  run on the workers, not an extrapolation of the average so far; each worker's per-run bars are nested below it
  (:mod:`pipelab.studies.progress`), quiet when standard error is not a terminal (a log gets one line per figure).
- **Interrupts.** Ctrl-C (or SIGTERM) stops the workers at once (their process groups, so the ranks a runtime
  figure spawned too) and exits with 130; a worker whose runner died (even by SIGKILL) ends too. Finished runs are in
  the cache, written whole, so the same command resumes where it stopped.
- **Time.** Every figure's seconds go to ``timings.csv`` beside the figures (:data:`FIELDS`; one row per figure and
  preset, the latest run's, plus a :data:`TOTAL` row with the run's wall time), and the total is printed. A figure
  that takes more than :data:`OVER_BUDGET` times its budget is warned about.

Example:
    >>> forecast(queued=[60.0, 30.0, 30.0], running=[10.0], workers=2)   # 60 on the idle worker, 30 + 30 after 10
    70.0
"""

from __future__ import annotations

import contextlib
import csv
import heapq
import io
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import environment

__all__ = ["run_figures", "forecast", "expected_costs", "read_timings", "default_workers", "TIMINGS", "FIELDS",
           "TOTAL", "DEFAULT_COST", "OVER_BUDGET"]

log = logging.getLogger(__name__)

#: the timings file, beside the figures
TIMINGS = "timings.csv"
#: its columns: seconds: wall time of the figure's drawing in its worker; cpu_seconds: the CPU time it used (its
#: worker's and the processes it waited for, e.g. a runtime figure's ranks), which other programs on a shared
#: machine do not inflate; cores: CPU cores this process may use; workers: figure workers of the run; load_1m: the
#: 1-minute load average when the figure ended (the run's own workers count in it); commit: the code's commit,
#: ``+dirty`` when the tree outside ``figures/`` had changes
FIELDS = ("figure", "seconds", "cpu_seconds", "preset", "cores", "workers", "load_1m", "commit", "finished")
#: the ``figure`` of the row holding a run's wall time
TOTAL = "(total)"
#: expected seconds of a figure without a budget or a measurement
DEFAULT_COST = 30.0
#: a figure taking more than this times its budget is warned about
OVER_BUDGET = 1.5
#: seconds a stopped worker gets to exit before it is killed
_GRACE_S = 3.0


def default_workers() -> int:
    """The CPU cores this process may run on (its affinity where the system says, else the CPU count)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def read_timings(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """The rows of a ``timings.csv`` (``[]`` when there is none or it cannot be read)."""
    try:
        with open(path, newline="") as fh:
            return [row for row in csv.DictReader(fh) if row.get("figure")]
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def expected_costs(specs: Sequence[Any], preset: str, timings: Iterable[Mapping[str, str]] = ()) -> dict[str, float]:
    """Each figure's expected seconds: its last measured time under ``preset`` in ``timings``, else its budget for
    the preset, else :data:`DEFAULT_COST`."""
    measured: dict[str, float] = {}
    for row in timings:
        with contextlib.suppress(KeyError, ValueError):
            seconds = float(row["seconds"])
            if row["preset"] == preset and row["figure"] != TOTAL and math.isfinite(seconds) and seconds >= 0:
                measured[row["figure"]] = seconds
    return {s.name: measured.get(s.name, s.budget(preset) or DEFAULT_COST) for s in specs}


def forecast(queued: Iterable[float], running: Iterable[float], workers: int) -> float:
    """Seconds until the last figure is drawn: the figures still ``queued`` handed out longest first (as the runner
    does) to whichever of the ``workers`` frees first, the busy ones free after the remaining seconds of the figure
    they are ``running``.

    List scheduling: worker w frees at f_w (0 when idle); each queued cost c, largest first, goes to the
    w with the smallest f_w, f_w ← f_w + c; the forecast is max_w f_w.
    """
    free = sorted(max(r, 0.0) for r in running)
    free += [0.0] * max(workers - len(free), 0)
    heapq.heapify(free)
    for cost in sorted(queued, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free, default=0.0)


def _clock(seconds: float) -> str:
    seconds = max(int(round(seconds)), 0)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


@dataclass
class _Progress:
    """The overall bar: figures done, elapsed time and the ETA forecast from the expected costs."""

    expected: dict[str, float]
    workers: int
    preset: str
    stream: Any = field(default_factory=lambda: sys.stderr)
    done: list[str] = field(default_factory=list)
    running: dict[str, float] = field(default_factory=dict)  # name -> start time
    start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar: Any = None
        self.lock = threading.Lock()
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=round(sum(self.expected.values()), 1), position=0, file=self.stream,
                            desc=f"figures ({self.preset})", dynamic_ncols=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")
            self.refresh()

    def eta(self) -> float:
        """The forecast (:func:`forecast`) of the figures not done: queued ones at their expected cost, running ones
        at what is left of it (a figure past its expected cost: a tenth of that cost more, not zero)."""
        now = time.monotonic()
        queued = [c for n, c in self.expected.items() if n not in self.done and n not in self.running]
        running = [max(self.expected[n] - (now - t), 0.1 * self.expected[n]) for n, t in self.running.items()]
        return forecast(queued, running, self.workers)

    def status(self) -> str:
        return (f"{len(self.done)}/{len(self.expected)} figures · {_clock(time.monotonic() - self.start)} elapsed · "
                f"ETA {_clock(self.eta())}")

    def refresh(self) -> None:
        with self.lock:
            if self.bar is None:
                return
            now = time.monotonic()
            worked = sum(self.expected[n] for n in self.done)
            worked += sum(min(now - t, 0.9 * self.expected[n]) for n, t in self.running.items())
            self.bar.n = round(min(worked, self.bar.total), 1)
            names = ", ".join(self.running)
            self.bar.set_postfix_str(self.status() + (f" · {names}" if names else ""), refresh=False)
            self.bar.refresh()

    def started(self, name: str) -> None:
        with self.lock:
            self.running[name] = time.monotonic()
        self.refresh()

    def stopped(self, name: str, line: str, *, ok: bool = True) -> None:
        """``name`` ended: drawn (``ok``) or failed; print ``line`` with the run's status."""
        with self.lock:
            self.running.pop(name, None)
            if ok:
                self.done.append(name)
            else:
                self.expected.pop(name, None)  # no longer forecast, not counted as drawn
            status = self.status()
        self.say(f"{line} [{status}]")
        self.refresh()

    def say(self, text: str) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass
class _Record:
    """What the run measured: per figure its seconds, the failures, and the timings rows."""

    preset: str
    workers: int
    outdir: Path
    commit: str
    budgets: dict[str, float | None]
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def add(self, name: str, seconds: float, cpu: float) -> str:
        """Record ``name`` drawn in ``seconds`` (``cpu`` CPU seconds); the line to print (with a warning when over
        budget)."""
        self.rows[name] = self._row(name, seconds, cpu)
        self.write()
        budget = self.budgets.get(name)
        line = f"  {name}: {seconds:.1f} s ({cpu:.1f} s CPU) -> {self.outdir / name}.png"
        if budget is not None and seconds > OVER_BUDGET * budget:
            warning = (f"figure {name} took {seconds:.0f} s, more than {OVER_BUDGET:g} times its {self.preset} budget "
                       f"of {budget:g} s (load average {self.rows[name]['load_1m']})")
            log.warning(warning)
            line += f"\n  warning: {warning}"
        return line

    def _row(self, name: str, seconds: float, cpu: float | None) -> dict[str, Any]:
        return {"figure": name, "seconds": f"{seconds:.1f}", "cpu_seconds": "" if cpu is None else f"{cpu:.1f}",
                "preset": self.preset, "cores": default_workers(),
                "workers": self.workers, "load_1m": f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "",
                "commit": self.commit, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def write(self, total: float | None = None) -> None:
        """Rewrite ``timings.csv``: the other presets' and figures' rows kept, this run's replacing theirs."""
        from ..files import atomic_write

        path = self.outdir / TIMINGS
        mine = dict(self.rows)
        if total is not None:
            mine[TOTAL] = self._row(TOTAL, total, sum(float(r["cpu_seconds"]) for r in self.rows.values()))
        kept = [r for r in read_timings(path) if (r["figure"], r.get("preset")) not in
                {(n, self.preset) for n in mine}]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=FIELDS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in sorted(kept + list(mine.values()), key=lambda r: (r.get("preset", ""), r["figure"] == TOTAL,
                                                                     r["figure"])):
            writer.writerow(row)
        try:
            self.outdir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, out.getvalue())
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)


def run_figures(names: Sequence[str], preset: str, outdir: str | os.PathLike[str], *, workers: int | None = None,
                allow_dirty: bool = False, stream: Any = None) -> int:
    """Draw the figures ``names`` under ``preset`` into ``outdir`` (see the module docstring); the exit status.

    Returns 0 when every figure was drawn, 1 when some failed (each one's traceback is printed and the others are
    drawn), 130 when interrupted (Ctrl-C).

    Raises:
        ValueError: an unknown figure name, or ``workers`` not an int >= 1.
    """
    from . import figures

    specs = [figures.get(n) for n in names]
    if workers is None:
        workers = default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    out = Path(outdir)
    state = figures.code_state(outdir=out)
    commit = (state.commit or "unknown") + ("+dirty" if state.clean is False else "")
    expected = expected_costs(specs, preset, read_timings(out / TIMINGS))
    order = sorted((s.name for s in specs), key=lambda n: -expected[n])  # longest first
    workers = min(workers, max(len(order), 1))
    record = _Record(preset, workers, out, commit, {s.name: s.budget(preset) for s in specs})
    progress = _Progress(expected, workers, preset, stream if stream is not None else sys.stderr)
    start = time.monotonic()
    drive = _in_process if workers == 1 else _in_workers
    try:
        with _term_as_interrupt():
            status = drive(order, preset, out, workers, allow_dirty, progress, record)
    finally:
        progress.close()
    total = time.monotonic() - start
    record.write(total if status != 130 else None)
    stream = progress.stream
    drawn = len(record.rows)
    load = "/".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    if status == 130:
        print(f"interrupted after {_clock(total)}: {drawn} of {len(order)} figures drawn; every finished run is in the "
              "result cache, so the same command resumes where it stopped", file=stream)
        return status
    where = out / TIMINGS
    if status == 0 and _keep_committed_timings(out):
        where = Path(f"{where} unchanged: these figures are byte for byte the committed ones, so it keeps the run that "
                     "drew them")
    print(f"{drawn} figure(s) in {_clock(total)} ({total:.0f} s; {preset} preset, {workers} worker(s), load average "
          f"{load}) -> {where}", file=stream)
    if record.failed:
        print(f"error: {len(record.failed)} figure(s) failed: {', '.join(record.failed)}", file=stream)
        return 1
    return 0


def _in_process(order: list[str], preset: str, out: Path, workers: int, allow_dirty: bool, progress: _Progress,
                record: _Record) -> int:
    """One worker: draw in this process, the overall bar refreshed by a thread meanwhile."""
    from . import figures
    from .progress import nest

    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(1.0):
            progress.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    nest(1)
    try:
        for name in order:
            progress.started(name)
            clock = _Clock()
            try:
                figures.render([name], preset, out, progress=True, allow_dirty=allow_dirty)
            except Exception:
                record.failed.append(name)
                progress.stopped(name, f"  {name}: failed after {clock.wall():.1f} s\n{traceback.format_exc()}",
                                 ok=False)
                continue
            progress.stopped(name, record.add(name, clock.wall(), clock.cpu()))
    except KeyboardInterrupt:
        return 130
    finally:
        stop.set()
        ticker.join()
        nest(None)
    return 0


def _in_workers(order: list[str], preset: str, out: Path, workers: int, allow_dirty: bool, progress: _Progress,
                record: _Record) -> int:
    """``workers`` spawned processes take the figures in ``order`` from a queue as they free up."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    tasks: Any = ctx.Queue()
    results: Any = ctx.Queue()
    for name in order:
        tasks.put(name)
    for _ in range(workers):
        tasks.put(None)
    procs: dict[int, Any] = {}
    current: dict[int, str] = {}  # worker line -> the figure it draws
    remaining = set(order)

    def start(line: int) -> None:
        # not daemonic: figures that run gloo ranks spawn processes of their own, which a daemon may not; a
        # worker still ends with the runner (PR_SET_PDEATHSIG in _worker, _stop on Ctrl-C)
        p = ctx.Process(target=_worker, args=(line, preset, str(out), allow_dirty, tasks, results, os.getpid()),
                        daemon=False, name=f"pipelab-figures-{line}")
        with _one_thread_env():
            p.start()
        procs[line] = p

    try:
        for line in range(1, workers + 1):
            start(line)
        while remaining:
            try:
                kind, line, name, seconds, cpu, text = results.get(timeout=0.5)
            except queue.Empty:
                progress.refresh()
                for line, p in list(procs.items()):
                    if p.is_alive():
                        continue
                    lost = current.pop(line, None)
                    if lost is not None:  # died while drawing (killed, out of memory): the others go on
                        remaining.discard(lost)
                        record.failed.append(lost)
                        progress.stopped(lost, f"  {lost}: failed, its worker exited with code {p.exitcode}", ok=False)
                    del procs[line]
                    if remaining:
                        start(line)
                if not procs:
                    record.failed += sorted(remaining)
                    break
                continue
            if kind == "start":
                current[line] = name
                progress.started(name)
                continue
            current.pop(line, None)
            remaining.discard(name)
            if kind == "done":
                progress.stopped(name, record.add(name, seconds, cpu))
            else:
                record.failed.append(name)
                progress.stopped(name, f"  {name}: failed after {seconds:.1f} s\n{text}", ok=False)
    except KeyboardInterrupt:
        _stop(procs.values())
        return 130
    for p in procs.values():
        p.join(timeout=_GRACE_S)
    _stop(p for p in procs.values() if p.is_alive())
    return 0


def _keep_committed_timings(out: Path) -> bool:
    """Put back the committed ``timings.csv`` of ``out`` when the run changed no other file there (a redraw of
    unchanged figures leaves ``git status`` clean; the committed file stays the record of the run that drew them);
    whether it did. Outside a git checkout, or with ``timings.csv`` untracked: False, the new file stays."""
    from .figures import _git

    try:
        root = Path(_git(out, "rev-parse", "--show-toplevel").decode().strip())
        rel = (out / TIMINGS).resolve().relative_to(root.resolve()).as_posix()
        _git(root, "ls-files", "--error-unmatch", rel)
        changed = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", str(out.resolve()))
    except (OSError, ValueError, subprocess.SubprocessError):
        return False
    paths = {entry[3:] for entry in changed.decode().split("\0") if entry}
    if paths - {rel}:
        return False
    _git(root, "checkout", "--", rel)
    return True


@contextlib.contextmanager
def _term_as_interrupt() -> Iterator[None]:
    """SIGTERM (``timeout``, ``kill``) stops the run as Ctrl-C does: without it the runner died at once and left its
    workers, each in its own process group, running on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _die_with_parent(parent: int) -> None:
    """Linux: this worker gets SIGTERM when the runner dies, even by SIGKILL, which no handler of the runner sees."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the runner died before the line above
        raise SystemExit(128 + signal.SIGTERM)


@contextlib.contextmanager
def _one_thread_env() -> Any:
    """Spawned workers start with one OpenMP/BLAS thread (read when torch and numpy load) and in-process sweeps."""
    keys = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", environment.WORKERS: "1"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stop(procs: Iterable[Any]) -> None:
    """Terminate each worker's process group (the worker and what it spawned), then kill what is left."""
    procs = list(procs)
    for sig in (signal.SIGTERM, getattr(signal, "SIGKILL", signal.SIGTERM)):
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            try:
                os.killpg(p.pid, sig)  # the worker leads its own group (see _worker)
            except (AttributeError, OSError):
                with contextlib.suppress(OSError):
                    p.terminate() if sig == signal.SIGTERM else p.kill()
        deadline = time.monotonic() + _GRACE_S
        for p in alive:
            p.join(timeout=max(deadline - time.monotonic(), 0.0))


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _worker(line: int, preset: str, out: str, allow_dirty: bool, tasks: Any, results: Any, parent: int) -> None:
    """A figure worker: draws the figures it takes from ``tasks`` until it takes ``None``; reports to ``results``."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpgid(0, 0)  # its own process group: Ctrl-C reaches the runner, which stops this group as a whole
    signal.signal(signal.SIGTERM, _exit_on_term)  # unwind: claims released, temporaries removed
    _die_with_parent(parent)
    import torch

    torch.set_num_threads(1)
    from . import figures
    from .progress import nest

    nest(line)
    while (name := tasks.get()) is not None:
        results.put(("start", line, name, 0.0, 0.0, ""))
        clock = _Clock()
        try:
            figures.render([name], preset, out, progress=True, allow_dirty=allow_dirty)
        except Exception:
            results.put(("failed", line, name, clock.wall(), clock.cpu(), traceback.format_exc()))
        else:
            results.put(("done", line, name, clock.wall(), clock.cpu(), ""))


class _Clock:
    """Wall and CPU seconds since creation; CPU: this process's and that of the child processes it waited for."""

    def __init__(self) -> None:
        self.t0, self.c0 = time.perf_counter(), self._cpu()

    @staticmethod
    def _cpu() -> float:
        own = time.process_time()
        try:
            import resource
        except ImportError:  # pragma: no cover - Windows
            return own
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own + kids.ru_utime + kids.ru_stime

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def cpu(self) -> float:
        return self._cpu() - self.c0
