"""Process groups for the multi-process runtime: launch under ``torchrun`` or spawn ranks locally.

Ranks come from ``torchrun ... -m pipelab.studies.run`` (each process calls :func:`init_from_env`; one machine or
several) or from :func:`spawn` (local processes: tests, notebooks, benchmarks).

Failures are bounded in time, never a hang: every process group has the run's timeout (:func:`comm_timeout`), and
a rank that raises tears its group down so blocked peers fail at once. Under :func:`spawn` the parent names the
cause (:class:`RankFailure`); under torchrun the ranks do, from the progress each publishes to the group's store
(:func:`heartbeat`, :func:`waiting`, :class:`StalledRank`). :func:`resolve_device` is the one place a device name
becomes a ``torch.device``.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import io
import json
import math
import os
import queue as queue_mod
import shutil
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankFailure", "default_backend", "free_port", "init_from_env", "spawn", "check_consistent", "differences",
           "describe_differences", "heartbeat", "resolve_device", "check_nccl_devices", "DEVICE_NAMES", "comm_timeout",
           "waiting", "StalledRank"]

#: the device names :func:`resolve_device` accepts (``cuda:N``: the N-th visible GPU)
DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N")


class RankFailure(RuntimeError):
    """A rank raised or died; ``rank`` is the first to fail and ``details`` its traceback or exit code."""

    def __init__(self, rank: int, details: str, others: dict[int, str] | None = None) -> None:
        self.rank, self.details, self.others = rank, details, others or {}
        extra = "".join(f"\n  rank {r}: {d.strip().splitlines()[-1] if d.strip() else d}"
                        for r, d in sorted(self.others.items()))
        super().__init__(f"rank {rank} failed:\n{details}" + (f"\nthen, as a consequence:{extra}" if extra else ""))


def _no_cuda_reason() -> str:
    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "no GPU is visible" + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")


def _instead(argument: str, value: str) -> str:
    return f"{argument} {value}" if argument.startswith("--") else f"{argument}={value!r}"


def resolve_device(device: str | torch.device | None = "auto", *, argument: str = "device") -> torch.device:
    """The ``torch.device`` named by ``device``, checked against this machine.

    ``"auto"`` (or ``None``): CUDA when a GPU is visible, else CPU. ``argument`` names the setting in errors
    (``"--device"``, ``"RunConfig.device"``, ...).

    Raises:
        TypeError: ``device`` is not a string, a ``torch.device`` or ``None``.
        ValueError: a name other than :data:`DEVICE_NAMES`; CUDA asked for without CUDA (saying why and
            what to pass instead); a GPU index beyond the visible GPUs.
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{argument} must be a str or torch.device (one of {', '.join(DEVICE_NAMES)}), "
                        f"got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{_instead(argument, str(device))} is not a device pipelab runs on; choose one of "
                         f"{', '.join(DEVICE_NAMES)}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{_instead(argument, str(device))} asks for CUDA, but {_no_cuda_reason()}; pass "
                             f"{_instead(argument, 'cpu')} (or {_instead(argument, 'auto')}: CUDA when present)")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{_instead(argument, str(device))}: only {count} GPU(s) are visible "
                             f"(cuda:0..cuda:{count - 1})")
    return dev


def check_nccl_devices(ranks: int, local_rank: int | None = None) -> None:
    """Refuse NCCL (ValueError) unless this machine has a GPU for each of its ``ranks`` and for ``local_rank``.

    NCCL runs one rank per GPU, and itself refuses two ranks on one GPU only after a hang or opaquely.
    """
    if not torch.cuda.is_available():
        raise ValueError(f"the NCCL backend needs CUDA GPUs, but {_no_cuda_reason()}; use the gloo backend "
                         "on CPU (--device cpu)")
    count = torch.cuda.device_count()
    needed = max(ranks, (local_rank + 1) if local_rank is not None else 0)
    if count < needed:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        raise ValueError(f"NCCL runs one rank per GPU: {needed} rank(s) on this machine need {needed} GPUs, but "
                         f"{count} are visible (torch.cuda.device_count(){where}); launch at most "
                         f"--nproc-per-node {count}, or run on CPU with gloo (--device cpu)")


def default_backend(device: torch.device | str | None = None) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise (``None`` or ``"auto"``: CUDA when available)."""
    return "nccl" if resolve_device(device).type == "cuda" else "gloo"


def free_port() -> int:
    """A TCP port on localhost that is free right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_from_env(backend: str | None = None, *, timeout_s: float = 120.0) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment; return ``(rank, world_size)``.

    On CUDA, each process uses the GPU ``LOCAL_RANK``. Once joined, a thread publishes this rank's progress to
    the group's store. The join runs in a helper thread bounded by ``timeout_s`` + 1 s: torch's store client waits
    without limit when ``MASTER_PORT`` is held by a program that is not a torch.distributed store.

    Raises:
        RuntimeError: the environment variables are missing, or ``MASTER_PORT`` is in use on this rank 0.
        ValueError: NCCL with fewer visible GPUs than this machine's ranks (``LOCAL_WORLD_SIZE``), or none.
        TimeoutError: the process group was not joined in time (port held by another program, or no peer).
    """
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"environment variables {missing} are not set: launch with "
                           "`torchrun --nproc-per-node N -m pipelab.studies.run ...` or use pipelab.distributed.spawn")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = backend or default_backend()
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        check_nccl_devices(int(os.environ.get("LOCAL_WORLD_SIZE", world)), local_rank)
        torch.cuda.set_device(local_rank)
    if dist.is_initialized():
        _publish_progress(rank, comm_timeout().total_seconds())
        return rank, world
    where = f"MASTER_ADDR:MASTER_PORT = {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    outcome: dict[str, BaseException] = {}

    def join() -> None:
        try:
            if backend == "nccl":  # the current CUDA device is per thread
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=join, name="pipelab-init-process-group", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if thread.is_alive():  # left behind as a daemon: the store client cannot be interrupted
        raise TimeoutError(f"rank {rank} could not join the process group at {where} within {timeout_s:g} s: "
                           "the port is held by another program (not a torch.distributed store) or no peer "
                           "joined; choose a free MASTER_PORT")
    if "error" in outcome:
        exc = outcome["error"]
        if "EADDRINUSE" in str(exc) or "address already in use" in str(exc).lower():
            raise RuntimeError(f"rank {rank} cannot host the process group's store at {where}: the port is busy "
                               "(held by another program); choose a free MASTER_PORT") from exc
        raise exc
    _publish_progress(rank, timeout_s)
    return rank, world


def comm_timeout() -> datetime.timedelta:
    """The default process group's timeout: how long one collective or point-to-point operation may wait.

    Every group pipelab creates gets it (``dist.new_group`` alone would give torch's 30 minutes). torch has no
    public getter: it is read from the default group's backend options.
    """
    device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
    timeout: datetime.timedelta = dist.group.WORLD._get_backend(device).options._timeout  # type: ignore[union-attr]
    return timeout


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """``(field, a, b)`` where two nested configurations differ: ``field`` dotted (``optimizer.0.lr``), a key on
    one side only ``<absent>`` on the other, NaN equal to NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in list(a) + [k for k in b if k not in a] for d in _key_differences(a, b, key, path)]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}.{i}" if path else str(i))]
    return [] if _same(a, b) else [(path or "<value>", a, b)]


def _key_differences(a: dict, b: dict, key: Any, path: str) -> list[tuple[str, Any, Any]]:
    sub = f"{path}.{key}" if path else str(key)
    if key not in a or key not in b:
        return [(sub, a.get(key, "<absent>"), b.get(key, "<absent>"))]
    return differences(a[key], b[key], sub)


def _same(a: Any, b: Any) -> bool:
    """``a == b`` for two leaves, with NaN equal to NaN and an ambiguous comparison (tensors) unequal."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # e.g. tensors of several elements
        return False


def describe_differences(diffs: list[tuple[str, Any, Any]], left: str, right: str, limit: int = 8) -> str:
    """``field: A (left) vs B (right)`` for the first ``limit`` differences, one per line."""
    def short(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 120 else text[:117] + "..."

    lines = [f"  {f}: {short(x)} ({left}) vs {short(y)} ({right})" for f, x, y in diffs[:limit]]
    if len(diffs) > limit:
        lines.append(f"  ... and {len(diffs) - limit} more")
    return "\n".join(lines)


def check_consistent(obj: Any, what: str = "config") -> None:
    """Raise ``ValueError`` on every rank, naming each differing field, unless all ranks pass an equal (small)
    ``obj``."""
    objs: list[Any] = [None] * dist.get_world_size()
    with waiting(range(len(objs)), f"the exchange of the {what}"):
        dist.all_gather_object(objs, obj)
    groups: list[tuple[Any, list[int]]] = []  # distinct configurations and the ranks that hold each
    for r, o in enumerate(objs):
        for ref, ranks in groups:
            if not differences(ref, o):
                ranks.append(r)
                break
        else:
            groups.append((o, [r]))
    if len(groups) > 1:
        ref, ref_ranks = groups[0]
        parts = [f"ranks {ranks} vs ranks {ref_ranks}:\n" + describe_differences(
            differences(o, ref), f"ranks {ranks}", f"ranks {ref_ranks}") for o, ranks in groups[1:]]
        raise ValueError(f"ranks disagree on the {what}; " + "\n".join(parts))


_BEAT: Any = None  # this spawned rank's shared [progress, time of the last progress]; None outside spawn


class _State(NamedTuple):
    """What this rank publishes about itself (:func:`heartbeat`, :func:`waiting`); times are ``time.monotonic``."""

    position: int = -1  # last position reported by heartbeat (-1: none yet)
    progress_at: float = 0.0  # when it was reported (or when the process group was joined)
    peers: tuple[int, ...] | None = None  # the ranks it is blocked on in a communication call, else None
    what: str = ""  # that call, in words
    since: float = 0.0  # when the call started


_STATE = _State(progress_at=time.monotonic())  # replaced whole, so the publisher always reads a consistent one
_PREFIX = "pipelab/progress/"  # store key of rank r: _PREFIX + str(r)


def heartbeat(progress: int) -> None:
    """Record that this rank made progress (e.g. reached position ``progress`` of its program).

    Read by :func:`spawn`'s parent, and published to the group's store by a thread, to name a hung rank and where
    it stopped. Cheap: no communication.
    """
    global _STATE
    if _BEAT is not None:
        _BEAT[0] = float(progress)
        _BEAT[1] = time.monotonic()
    _STATE = _STATE._replace(position=int(progress), progress_at=time.monotonic())


class StalledRank(RuntimeError):
    """A communication call failed (timed out, or a peer left); ``ranks``: the peers :func:`waiting` found stalled."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


@contextlib.contextmanager
def waiting(peers: Iterable[int], what: str) -> Iterator[None]:
    """Mark this rank as blocked on ``peers`` (itself left out) in a communication call (``what``) while inside.

    If the call raises, :class:`StalledRank` is raised from the error, naming the stalled peers: those that no
    longer publish (stopped, killed, exited) or are outside any communication call without progress for half the
    communication timeout. Wrap only the call that communicates.
    """
    global _STATE
    members = tuple(sorted(set(peers) - {dist.get_rank() if dist.is_initialized() else -1}))
    _STATE = _STATE._replace(peers=members, what=what, since=time.monotonic())
    try:
        yield
    except Exception as exc:
        if not dist.is_initialized():
            raise
        raise _stalled(exc, members, what, time.monotonic() - _STATE.since) from exc
    finally:
        _STATE = _STATE._replace(peers=None, what="")


def _interval(timeout_s: float) -> float:
    """Seconds between two publications of a rank's progress: a twentieth of the timeout, 0.05 to 1 s."""
    return min(1.0, max(0.05, timeout_s / 20))


def _store(timeout_s: float) -> Any:
    """A client of the process group's TCP store at ``MASTER_ADDR:MASTER_PORT``."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


class _Publisher(threading.Thread):
    """Publishes this rank's :class:`_State` every ``interval`` seconds until the first store error or exit.

    The sequence number shows that the process still runs; ages are durations, so no clocks are compared.
    """

    def __init__(self, rank: int, interval: float, timeout_s: float) -> None:
        super().__init__(name="pipelab-progress", daemon=True)
        self.rank, self.interval, self.timeout_s = rank, interval, timeout_s
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            store = _store(self.timeout_s)
            seq = 0
            while not self.stop.is_set():
                seq += 1
                st, now = _STATE, time.monotonic()
                record = {"seq": seq, "interval_s": self.interval, "position": st.position,
                          "idle_s": now - st.progress_at, "peers": st.peers, "what": st.what,
                          "waited_s": now - st.since if st.peers is not None else 0.0}
                store.set(_PREFIX + str(self.rank), json.dumps(record))
                self.stop.wait(self.interval)
        except Exception:  # no store, nothing to publish; the run itself reports its errors
            return


_PUBLISHER: _Publisher | None = None


def _publish_progress(rank: int, timeout_s: float) -> None:
    """Start publishing this rank's progress (once per process); ``timeout_s``: the group's timeout."""
    global _PUBLISHER, _STATE
    if _PUBLISHER is not None:
        return
    _STATE = _STATE._replace(progress_at=time.monotonic())  # silence counts from joining the group
    _PUBLISHER = publisher = _Publisher(rank, _interval(timeout_s), timeout_s)
    publisher.start()

    def stop() -> None:  # before the interpreter finalises, not inside a store call
        publisher.stop.set()
        publisher.join(timeout=publisher.interval + 1.0)

    atexit.register(stop)


def _read_progress(world: int, me: int) -> tuple[dict[int, dict[str, Any]], set[int], str]:
    """Every other rank's published record, the ranks that stopped publishing, and a problem ('' if none).

    Read twice, 2.5 publication intervals apart: a rank whose sequence number did not move no longer runs.
    """
    try:
        store = _store(2.0)
        keys = {r: _PREFIX + str(r) for r in range(world) if r != me}

        def read() -> dict[int, dict[str, Any]]:
            return {r: json.loads(store.get(k)) for r, k in keys.items() if store.check([k])}

        first = read()
        time.sleep(2.5 * max((rec["interval_s"] for rec in first.values()), default=0.0) + 0.05)
        second = read()
    except Exception as exc:  # the diagnosis must not hide the error it explains
        return {}, set(), f"the other ranks' progress could not be read from the store ({type(exc).__name__}: {exc})"
    silent = {r for r in keys if r not in second or first.get(r, {}).get("seq") == second[r]["seq"]}
    return second, silent, ""


def _stalled(exc: Exception, peers: tuple[int, ...], what: str, waited_s: float) -> StalledRank:
    """The :class:`StalledRank` explaining why ``what`` with ``peers`` failed after ``waited_s`` seconds."""
    me, world = dist.get_rank(), dist.get_world_size()
    cause = (str(exc).strip().splitlines() or [""])[-1]
    head = (f"rank {me}: {what} with rank(s) {list(peers)} failed after {waited_s:.1f} s "
            f"({type(exc).__name__}: {cause})")
    records, silent, problem = _read_progress(world, me)
    if problem:
        return StalledRank(f"{head}\n{problem}", [])
    half = comm_timeout().total_seconds() / 2
    stalled = sorted(r for r in range(world) if r != me and (
        r in silent or (records[r]["peers"] is None and records[r]["idle_s"] >= half)))

    def describe(r: int) -> str:
        if r not in records:
            return f"rank {r}: published no progress (stopped, killed or exited before it could)"
        rec = records[r]
        at_least = "at least " if r in silent else ""
        where = (f"no progress reported in the {at_least}{rec['idle_s']:.1f} s since it joined" if rec["position"] < 0
                 else f"last progress: position {rec['position']} of its program, {at_least}{rec['idle_s']:.1f} s ago")
        state = (f"waiting in {rec['what']} with rank(s) {rec['peers']} for {at_least}{rec['waited_s']:.1f} s"
                 if rec["peers"] is not None else "not in a communication call")
        alive = "; NOT RESPONDING (stopped, killed or exited)" if r in silent else ""
        return f"rank {r}: {where}; {state}{alive}"

    if stalled:
        verdict = "stalled: " + "; ".join(describe(r) for r in stalled)
    else:
        verdict = ("no other rank is stalled: each responds and is either communicating or made progress in "
                   "the last half of the communication timeout (a deadlock, or the network failed)")
    others = [describe(r) for r in range(world) if r != me and r not in stalled]
    listing = "\n  ".join(others[:16] + ([f"... and {len(others) - 16} more"] if len(others) > 16 else []))
    return StalledRank(f"{head}\n" + (f"the other ranks:\n  {listing}\n" if others else "") + verdict, stalled)


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _report(results: Any, outdir: str, rank: int, status: str, data: bytes) -> None:
    """Send a rank's report: its bytes to a file in ``outdir``, only ``(status, rank, path)`` on the queue, flushed
    before returning. A message of a few dozen bytes reaches the pipe in one write (at most PIPE_BUF), so a rank
    killed at any moment never leaves half a message on which the parent's read would block past every timeout
    (a result of any size sent through the queue could: a rank whose process died after reporting got its peers,
    still writing their results, terminated mid-message)."""
    path = os.path.join(outdir, f"{status}-{rank}")
    with open(path + ".part", "wb") as fh:
        fh.write(data)
    os.replace(path + ".part", path)
    results.put((status, rank, path))
    results.close()
    results.join_thread()


def _worker(fn: Callable[..., Any], rank: int, world: int, port: int, backend: str, timeout_s: float,
            args: tuple, results: Any, outdir: str, beat: Any = None) -> None:
    global _BEAT
    _BEAT = beat
    if beat is not None:
        beat[1] = time.monotonic()  # silence is measured from the start until the first heartbeat
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), TORCHELASTIC_USE_AGENT_STORE="True")  # the store is spawn's
    # ranks share the machine's cores; a spawned process sets its own count once at start (not scoped with
    # pipelab.threads.torch_threads: the process exists for this one job, there is no caller's count to restore)
    torch.set_num_threads(1)
    try:
        init_from_env(backend, timeout_s=timeout_s)
        out = fn(rank, world, *args)
        _report(results, outdir, rank, "ok", _to_bytes(out))
    except BaseException:  # report everything, including KeyboardInterrupt, then unblock peers
        with contextlib.suppress(Exception):  # flushed before os._exit, which would kill the queue's feeder thread
            _report(results, outdir, rank, "error", traceback.format_exc().encode())
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        os._exit(1)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _end(procs: list[Any], grace_s: float) -> None:
    """Terminate the processes still running, and kill those still alive ``grace_s`` later.

    A stopped process holds SIGTERM until continued, and the caller's interpreter would hang at exit joining it.
    """
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join()


class _Ranks:
    """The spawned processes, their heartbeats (:func:`heartbeat`) and what they reported, by rank: ``done``
    (results) and ``errors`` (tracebacks, in the order they were reported)."""

    def __init__(self, procs: list[Any], beats: list[Any], results: Any) -> None:
        self.procs, self.beats, self.results = procs, beats, results
        self.done: dict[int, bytes] = {}
        self.errors: dict[int, str] = {}

    def wait(self, timeout_s: float, grace_s: float) -> None:
        """Collect reports until every rank has reported, or until ``grace_s`` after the first failure
        (TimeoutError past ``timeout_s``)."""
        world_size = len(self.procs)
        deadline = time.monotonic() + timeout_s
        error_deadline = float("inf")
        while len(self.done) + len(self.errors) < world_size and time.monotonic() < error_deadline:
            if time.monotonic() > deadline:
                running = sorted(set(range(world_size)) - set(self.done) - set(self.errors))
                raise TimeoutError(f"ranks still running after {timeout_s:.0f} s: {running}" + "".join(
                    f"\n  rank {r}: {self.progress(r)}" for r in running))
            self.drain()
            if (self.errors or self.unreported_deaths()) and error_deadline == float("inf"):
                error_deadline = time.monotonic() + grace_s
        self.drain()

    def stop(self, grace_s: float, comm_timeout_s: float) -> tuple[dict[int, str], dict[int, str]]:
        """End every process (:func:`_end`); the ranks that died without reporting and, after a failure, those
        unresponsive (still running, silent and without progress), each with its description."""
        dead = self.unreported_deaths()  # before terminating the stragglers, which would then look dead too
        hung = self.unresponsive(dead, grace_s, comm_timeout_s) if self.errors or dead else {}
        for p in self.procs:  # a rank that reported exits by itself
            p.join(timeout=0.5 if self.errors else 10)
        _end(self.procs, grace_s)
        self.drain()
        return dead, hung

    def raise_failure(self, dead: dict[int, str], hung: dict[int, str]) -> None:
        """RankFailure naming the cause: a rank that died silently or hangs causes its peers' communication
        errors; else the first report."""
        dead = {r: d for r, d in dead.items() if r not in self.errors and r not in self.done}
        hung = {r: d for r, d in hung.items() if r not in self.errors and r not in self.done}
        if dead or self.errors:
            first = min(dead) if dead else min(hung) if hung else next(iter(self.errors))
            failures = {**self.errors, **hung, **dead}
            raise RankFailure(first, failures[first], {r: d for r, d in failures.items() if r != first})

    def drain(self) -> None:
        while True:
            try:
                status, rank, payload = self.results.get(timeout=0.05)
            except queue_mod.Empty:
                return
            with open(payload, "rb") as fh:  # _report's file
                data = fh.read()
            if status == "ok":
                self.done[rank] = data
            else:
                self.errors[rank] = data.decode(errors="replace")

    def unreported_deaths(self) -> dict[int, str]:
        return {r: f"process exited with code {p.exitcode} without reporting" for r, p in enumerate(self.procs)
                if p.exitcode not in (None, 0) and r not in self.done and r not in self.errors}

    def unresponsive(self, dead: dict[int, str], grace_s: float, comm_timeout_s: float) -> dict[int, str]:
        """The ranks still running without a report and without progress for ``comm_timeout_s``."""
        return {r: f"unresponsive: still running without a report {grace_s:g} s after the first failure "
                   f"({self.progress(r)})"
                for r, p in enumerate(self.procs) if p.is_alive() and r not in self.done and r not in self.errors
                and r not in dead and time.monotonic() - self.beats[r][1] >= comm_timeout_s}

    def progress(self, r: int) -> str:
        pos, when = self.beats[r][0], self.beats[r][1]
        where = "no progress reported" if pos < 0 else f"last progress: position {int(pos)} of its program"
        return f"{where}, {time.monotonic() - when:.1f} s ago"


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: str = "gloo",
          timeout_s: float = 300.0, comm_timeout_s: float = 60.0, grace_s: float = 5.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; return results by rank.

    Args:
        fn: a picklable (module-level) function; its return value is sent back with ``torch.save``.
        timeout_s: bound on the whole run.
        comm_timeout_s: the process group's timeout for a single collective/point-to-point operation.
        grace_s: after the first failure, how long the other ranks get to report before SIGTERM, and a
            terminated rank to exit before SIGKILL.

    Raises:
        ValueError: ``nccl`` with fewer visible GPUs than ``world_size`` (before any process starts).
        RankFailure: a rank raised or died, with its traceback. Its ``rank`` is the cause: a rank that died
            without reporting, else one *unresponsive* (running, silent ``grace_s`` after the first failure,
            without :func:`heartbeat` progress for ``comm_timeout_s``), else the first that reported an error.
        TimeoutError: the run exceeded ``timeout_s`` (the message gives each running rank's last progress).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend == "nccl":  # every spawned rank is on this machine
        check_nccl_devices(world_size)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # The process group's store lives here, as torchrun's agent hosts it: it outlives every rank (one that is
    # stopped or gone included), so the ranks can always read each other's progress (waiting()).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=comm_timeout_s))
    port = store.port
    beats = [ctx.RawArray("d", [-1.0, time.monotonic()]) for _ in range(world_size)]  # see heartbeat()
    outdir = tempfile.mkdtemp(prefix="pipelab-spawn-")  # the ranks' reports (_report)
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, backend, comm_timeout_s, args, results,
                                               outdir, beats[r]), daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    ranks = _Ranks(procs, beats, results)
    try:
        ranks.wait(timeout_s, grace_s)
    finally:
        try:
            dead, hung = ranks.stop(grace_s, comm_timeout_s)
        finally:
            shutil.rmtree(outdir, ignore_errors=True)
    ranks.raise_failure(dead, hung)
    return [torch.load(io.BytesIO(ranks.done[r]), weights_only=False) for r in range(world_size)]
