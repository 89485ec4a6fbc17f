"""Result cache keyed by the full config, the code that computes the result, and the package version.

A sweep calls :func:`cached` (or :func:`run_sweep`) once per config; results are stored as
``<root>/<name>/<key>.pkl`` with

    key = SHA-256( canonical JSON of the config  ‖  version  ‖  code_hash(fn) ).

The code hash (:func:`code_hash`) covers the source of the module that defines the experiment function
``fn`` plus every pipelab module it imports, transitively: the import statements are read from the source
files (imports inside functions included), so a change to any code that computes a result recomputes it,
while a change elsewhere (say the colours of a figure module the experiment does not import) keeps the
entries. It is computed once per module per process. A function without a source file (a notebook cell)
is keyed on its own source plus every pipelab module. Modules outside pipelab that the defining module
imports (torch, numpy, your own helpers) are not hashed: clear the cache after changing those.

Each file starts with the SHA-256 of its pickled payload, so a truncated or otherwise corrupt entry is
detected on load, logged, removed and recomputed, never silently used. Writes are atomic (temporary file
+ ``os.replace``), so an interrupted sweep leaves only complete entries and resumes where it stopped;
entries are created with mode 0o644 (directories 0o755) whatever the umask, so a cache can be shared.
The cache never aborts a computation: an unreadable entry (no permission, a directory in its place) is a
miss with a :class:`CacheWarning`, and a store that fails (read-only or full disk) keeps the computed
result and warns once per cache directory.

The cache root is ``$PIPELAB_CACHE`` if set, else ``$XDG_CACHE_HOME/pipelab`` (``~/.cache/pipelab``).
Set ``PIPELAB_CACHE=off`` to disable caching (:func:`pipelab.studies.environment.cache_root`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import logging
import marshal
import os
import pickle
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from . import environment
from .config import config_hash

try:  # POSIX: entries computed by one process at a time (ResultCache.claim)
    import fcntl
except ImportError:  # pragma: no cover - Windows: no claims, concurrent processes may compute an entry twice
    fcntl = None  # type: ignore[assignment]

__all__ = ["ResultCache", "Claim", "CacheWarning", "cached", "run_sweep", "SweepError", "NotCachedError",
           "code_hash", "PLUMBING"]

log = logging.getLogger(__name__)
R = TypeVar("R")
_MAGIC = b"pipelab-cache-v1\n"
_FILE_MODE, _DIR_MODE = 0o644, 0o755
_PKG = __name__.partition(".")[0]
_PKG_DIR = Path(__file__).resolve().parents[__name__.count(".") - 1]  # the top package's directory: pipelab/
_store_warned: set[str] = set()


class CacheWarning(UserWarning):
    """The cache could not read or write an entry; the computation went on without it."""


class NotCachedError(LookupError):
    """A result asked for while drawing from the cache only (``$PIPELAB_CACHED=1``, ``figures --cached``) is not
    in it: the first missing config is named, and nothing is computed."""

    def __init__(self, name: str, config: Any, missing: int, total: int, root: Path | None) -> None:
        self.name, self.config = name, config
        super().__init__(f"{missing} of {total} {name} result(s) are not in the result cache "
                         f"({root or 'off'}) and --cached computes none; the first: {config!r}")


class SweepError(RuntimeError):
    """A config of :func:`run_sweep` failed; the error is the ``__cause__`` (with the worker's traceback).

    Attributes:
        name: the sweep; configs: the failed job's configs (a batch holds several); indices: their positions
        in the sweep; cached: how many of the sweep's results are in the cache now (every one that finished).
    """

    def __init__(self, name: str, configs: list[Any], indices: list[int], cached: int, total: int,
                 error: BaseException) -> None:
        self.name, self.configs, self.indices, self.cached = name, configs, indices, cached
        which = (f"config {indices[0]} of {total}" if len(indices) == 1
                 else f"the batch of configs {indices} of {total}")
        died = isinstance(error, BrokenProcessPool)  # the job's worker died: no traceback to report
        super().__init__(
            f"sweep {name!r}: {which} failed ({type(error).__name__}: {error})"
            + (" - a worker process died (killed, out of memory?) while it ran" if died else "") + "\n"
            + "\n".join(f"  config {i}: {c!r}" for i, c in zip(indices, configs))
            + f"\n{cached} of the {total} results are cached (every one that finished); running the sweep "
            "again computes only the others")


# ------------------------------------------------------------------------------------------ code hash


def _module_file(name: str) -> Path | None:
    """Source file of module ``name``: pipelab modules from this package's directory, others from sys.modules."""
    if _is_pipelab(name):
        rel = name.split(".")[1:]
        base = _PKG_DIR.joinpath(*rel)
        for cand in ((base / "__init__.py",) if not rel else (base / "__init__.py", base.with_suffix(".py"))):
            if cand.is_file():
                return cand
        return None
    file = getattr(sys.modules.get(name), "__file__", None)
    return Path(file) if file and str(file).endswith(".py") and Path(file).is_file() else None


def _read_source(name: str) -> bytes:
    """The bytes that a module's code hash covers (the seam tests patch to simulate an edit)."""
    path = _module_file(name)
    if path is None:
        raise FileNotFoundError(f"no source file for module {name!r}")
    return path.read_bytes()


def _is_pipelab(name: str) -> bool:
    return name == _PKG or name.startswith(_PKG + ".")


@functools.cache
def _module_digest(name: str) -> str:
    return hashlib.sha256(_read_source(name)).hexdigest()


@functools.cache
def _direct_imports(name: str) -> frozenset[str]:
    """pipelab modules named by the import statements of module ``name`` (at any depth of its source)."""
    path = _module_file(name)
    package = name if path is not None and path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(_read_source(name))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                module = f"{base}.{node.module}" if node.module and base else (node.module or base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # kept only when a submodule
    return frozenset(m for m in found if _is_pipelab(m) and _module_file(m) is not None)


#: modules whose code computes no result, left out of every code hash so that editing them keeps the cached results:
#: this cache (its format has its own version), the reading of the environment variables, the progress display
PLUMBING = frozenset({"pipelab.studies.cache", "pipelab.studies.environment", "pipelab.studies.progress"})


@functools.cache
def _module_code_hash(name: str) -> str:
    """Hash of module ``name`` and the pipelab modules it imports, transitively (:data:`PLUMBING` left out)."""
    seen, todo = {name}, [name]
    while todo:
        for dep in _direct_imports(todo.pop()):
            if dep not in seen and dep not in PLUMBING:
                seen.add(dep)
                todo.append(dep)
    lines = "\n".join(f"{m} {_module_digest(m)}" for m in sorted(seen))
    return hashlib.sha256(lines.encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _package_code_hash() -> str:
    """Hash of every module of the pipelab package (the fallback when the imports are unknown)."""
    names = sorted(".".join((_PKG, *p.relative_to(_PKG_DIR).with_suffix("").parts)).removesuffix(".__init__")
                   for p in _PKG_DIR.rglob("*.py"))
    return hashlib.sha256("\n".join(f"{m} {_module_digest(m)}" for m in names).encode()).hexdigest()


def _unwrap(fn: Any) -> Any:
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return fn


def code_hash(fn: Callable[..., Any]) -> str:
    """SHA-256 identifying the code behind ``fn``: its module and the pipelab modules that module imports.

    The rule: ``code_hash(fn) = SHA-256(sorted (module, SHA-256(source)) over the closure of pipelab imports of
    fn's module)``, the :data:`PLUMBING` modules (and what only they import) left out. Partials, bound methods and
    ``functools.wraps`` wrappers are unwrapped; a callable object is hashed by its class. A function without a source
    file (defined in a notebook or the REPL) is hashed by its own source (or bytecode) together with every pipelab
    module. Computed once per module per process.
    """
    fn = _unwrap(fn)
    if not (inspect.isfunction(fn) or inspect.isclass(fn) or inspect.isbuiltin(fn)):
        fn = type(fn)
    module = getattr(fn, "__module__", None)
    if module and _module_file(module) is not None:
        return _module_code_hash(module)
    try:
        own = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        own = marshal.dumps(code) if code is not None else repr(fn).encode()
    return hashlib.sha256(own + _package_code_hash().encode()).hexdigest()


def _clear_code_hashes() -> None:
    """Forget the per-process code hashes (after editing source in a running session, and in tests)."""
    for f in (_module_digest, _direct_imports, _module_code_hash, _package_code_hash):
        f.cache_clear()


# ------------------------------------------------------------------------------------------- store


def _makedirs(directory: Path) -> None:
    """``mkdir -p`` giving the directories it creates mode 0o755 whatever the umask."""
    missing = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if d.is_dir():
                continue
            raise
        os.chmod(d, _DIR_MODE)


class ResultCache:
    """Pickle store of results keyed by ``config_hash(config, salt=version + code_hash(fn))``.

    Args:
        root: directory of the store; ``None`` uses :func:`pipelab.studies.environment.cache_root` (``None`` there:
            the cache is off).
        version: extra salt of every key; defaults to ``pipelab.__version__``. The code behind a result is
            keyed separately (see :func:`code_hash`), so edits recompute without a version bump.

    ``path``, ``load`` and ``store`` take the experiment function ``fn`` whose code keys the entry; without it
    (``fn=None``) an entry is keyed on the config and version only.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, version: str | None = None) -> None:
        # The package's version, read without an import statement: importing the package facade would make
        # every module look like a dependency of code that imports the cache (see code_hash).
        self.version = version if version is not None else str(sys.modules[_PKG].__version__)
        self.root = Path(root) if root is not None else environment.cache_root()

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def path(self, name: str, config: Any, fn: Callable[..., Any] | None = None) -> Path:
        if self.root is None:
            raise RuntimeError("the result cache is disabled (PIPELAB_CACHE=off)")
        salt = self.version if fn is None else f"{self.version}/code:{code_hash(fn)}"
        return self.root / name / f"{config_hash(config, salt=salt)}.pkl"

    def load(self, name: str, config: Any, fn: Callable[..., Any] | None = None) -> tuple[bool, Any]:
        """Return ``(True, result)`` for a valid entry, ``(False, None)`` when missing, corrupt or unreadable."""
        if self.root is None:
            return False, None
        path = self.path(name, config, fn)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # no entry (a file in a folder's place: store reports it)
            return False, None
        except OSError as exc:  # no permission, a directory in the entry's place, an I/O error
            warnings.warn(f"cache entry {path} cannot be read ({type(exc).__name__}: {exc}); recomputing",
                          CacheWarning, stacklevel=3)
            return False, None
        header_len = len(_MAGIC) + 64 + 1
        digest = raw[len(_MAGIC) : len(_MAGIC) + 64].decode("ascii", "replace")
        payload = raw[header_len:]
        if not raw.startswith(_MAGIC) or hashlib.sha256(payload).hexdigest() != digest:
            log.warning("corrupt cache entry %s (checksum mismatch); recomputing", path)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return False, None
        try:
            return True, pickle.loads(payload)
        except Exception as exc:  # unpicklable after a code change: treat as a miss
            log.warning("unreadable cache entry %s (%s); recomputing", path, exc)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return False, None

    def store(self, name: str, config: Any, result: Any, fn: Callable[..., Any] | None = None) -> Path | None:
        """Write ``result`` atomically (mode 0o644); return its path, or ``None`` when disabled or it failed.

        A failing write (read-only or unwritable directory, full disk, a directory in the entry's place) or an
        unpicklable result does not raise: the caller keeps its result and a :class:`CacheWarning` says so
        (for write failures, once per cache directory).
        """
        if self.root is None:
            return None
        path = self.path(name, config, fn)
        try:
            payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # e.g. a lambda inside the result
            warnings.warn(f"result for {name}/{path.name} cannot be pickled ({exc}); not cached", CacheWarning,
                          stacklevel=3)
            return None
        blob = _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        tmp: str | None = None
        try:
            _makedirs(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pkl")
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0o600; a shared cache must be readable
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            if str(self.root) not in _store_warned:
                _store_warned.add(str(self.root))
                warnings.warn(f"result cache {self.root} cannot store {path.name} ({type(exc).__name__}: {exc}); "
                              "results are kept in memory but not cached (further failures here are not reported)",
                              CacheWarning, stacklevel=3)
            return None
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return path

    def claim(self, name: str, config: Any, fn: Callable[..., Any] | None = None, *, wait: bool = True
              ) -> Claim | None:
        """Claim the right to compute an entry: an exclusive lock beside it, held until :meth:`Claim.release`.

        Two processes that need the same result (two figures of ``python -m pipelab figures`` run side by side)
        compute it once: the one holding the claim computes and stores it, the other, finding it claimed, computes
        something else (``wait=False`` returns ``None``) or waits for the claim (``wait=True``) and then loads the
        entry. The lock is the operating system's (``flock`` on ``<key>.lock``), so a process that dies releases it;
        after a claim is granted, load the entry again before computing (the holder may have just stored it).
        A disabled cache, or a system without ``flock``, grants every claim at once.
        """
        if self.root is None or fcntl is None:
            return Claim(None, None)
        path = self.path(name, config, fn).with_suffix(".lock")
        try:
            _makedirs(path.parent)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        except OSError:  # an unwritable cache: nothing to coordinate through, compute as without one
            return Claim(None, None)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return Claim(path, fd)


class Claim:
    """A granted :meth:`ResultCache.claim`; :meth:`release` (or leaving its ``with`` block) lets waiters go on."""

    def __init__(self, path: Path | None, fd: int | None) -> None:
        self._path, self._fd = path, fd

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent). A process already waiting on the removed file
        gets the lock next and finds the entry stored; one arriving later finds it in the cache first."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            if self._path is not None:
                self._path.unlink(missing_ok=True)
        os.close(fd)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def cached(name: str, config: Any, fn: Callable[[Any], R], *, cache: ResultCache | None = None) -> R:
    """Return ``fn(config)``, from the cache when a valid entry exists, else computed and stored.

    The entry is keyed on the config and on the code of ``fn`` (:func:`code_hash`), so editing the code
    that computes a result recomputes it. While another process computes the same entry (it holds its
    :meth:`~ResultCache.claim`), this one waits for it and loads the result instead of computing it again.

    Args:
        name: namespace of the experiment (a folder of the store).
        config: a frozen dataclass (or mapping); its canonical JSON is the key.
        fn: computes the result from the config; must be deterministic given the config and its code.
        cache: the store; defaults to ``ResultCache()``.
    """
    cache = cache if cache is not None else ResultCache()
    hit, result = cache.load(name, config, fn)
    if hit:
        log.debug("cache hit %s %s", name, config)
        return result
    if environment.cached():
        raise NotCachedError(name, config, 1, 1, cache.root)
    with cache.claim(name, config, fn, wait=True) or Claim(None, None):
        hit, result = cache.load(name, config, fn)  # stored by the process that held the claim
        if hit:
            return result
        result = fn(config)
        cache.store(name, config, result, fn)
    return result


def run_sweep(
    name: str,
    configs: Iterable[Any],
    fn: Callable[[Any], R],
    *,
    cache: ResultCache | None = None,
    progress: bool = False,
    desc: str | None = None,
    batch_fn: Callable[[list[Any]], list[R]] | None = None,
    group: Callable[[Any], Any] | None = None,
    max_batch: int | Callable[[Any], int] = 8,
    workers: int = 1,
) -> list[R]:
    """Run ``fn`` over ``configs`` through the cache, in order; an interrupted sweep resumes.

    Args:
        progress: show a progress bar (:func:`pipelab.studies.progress.bar`: the CLI and notebooks turn it on;
            library code leaves it off).
        batch_fn: computes several configs' results at once, ``batch_fn(cs)[i] == fn(cs[i])`` (up to floating-point
            rounding); the missing configs with equal ``group(config)`` are handed to it together, at most
            ``max_batch`` at a time, or ``max_batch(group(config))`` for a cap per group (a group of one goes to
            ``fn``). Every result is stored under ``fn``'s key, so a result computed in a batch and one computed
            alone are the same entry.
        workers: processes that compute the missing results in parallel (``1``: in this process). Workers are
            spawned, so ``fn`` and ``batch_fn`` must be module-level functions; each result is stored as soon as
            its batch ends, so an interrupted parallel sweep resumes too.

    Sweeps in several processes share their work: each job claims its entries first
    (:meth:`ResultCache.claim`); entries another process is computing are left to it and loaded once it has
    stored them (computed here only if it stopped without storing them), so two figures that need the same runs,
    drawn side by side, compute each run once and both use both processes.

    Raises:
        SweepError: a config failed (raised an ``Exception``; in parallel also a worker that died), naming the
            config and chained to its error. Jobs not started yet are cancelled, the jobs running finish, and
            every result that finished is stored first, so running the sweep again resumes after them.
    """
    configs = list(configs)
    cache = cache if cache is not None else ResultCache()
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")

    def cap_of(key: Any) -> int:
        cap = max_batch(key) if callable(max_batch) else max_batch
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {cap!r}"
                             + (f" for the group {key!r}" if callable(max_batch) else ""))
        return cap

    if not callable(max_batch):
        cap_of(None)  # refused before any work
    results: list[Any] = [None] * len(configs)
    missing: list[int] = []
    finished: list[int] = []  # results in the cache (found there, or computed and stored)
    for i, c in enumerate(configs):
        hit, result = cache.load(name, c, fn)
        if hit:
            results[i] = result
            finished.append(i)
        else:
            missing.append(i)
    if missing and environment.cached():
        raise NotCachedError(name, configs[missing[0]], len(missing), len(configs), cache.root)
    jobs: list[list[int]] = []
    if batch_fn is not None and group is not None:
        groups: dict[Any, list[int]] = {}
        for i in missing:
            groups.setdefault(group(configs[i]), []).append(i)
        for key, members in groups.items():
            cap = cap_of(key)
            jobs += [members[a:a + cap] for a in range(0, len(members), cap)]
    else:
        jobs = [[i] for i in missing]
    bar = None
    if progress:
        from .progress import bar as progress_bar

        bar = progress_bar(total=len(configs), initial=len(configs) - len(missing), desc=desc or name, unit="run")
    claims: dict[int, Claim] = {}
    done_set = set(finished)

    def take(job: list[int], wait: bool) -> list[int]:
        """The configs of ``job`` to compute here: claimed, and still missing once claimed."""
        mine = []
        for i in job:
            if i in done_set:
                continue
            claim = cache.claim(name, configs[i], fn, wait=wait)
            if claim is None:
                continue  # another process computes it: loaded in the second pass
            hit, result = cache.load(name, configs[i], fn)
            if hit:  # stored by another process meanwhile
                claim.release()
                results[i] = result
                finished.append(i)
                done_set.add(i)
                if bar is not None:
                    bar.update(1)
                continue
            claims[i] = claim
            mine.append(i)
        return mine

    def done(job: list[int], out: list[Any]) -> None:
        finished.extend(job)
        done_set.update(job)
        for i, result in zip(job, out):
            cache.store(name, configs[i], result, fn)
            results[i] = result
            claims.pop(i).release()
        if bar is not None:
            bar.update(len(job))

    def release(job: list[int]) -> None:
        for i in job:
            if i in claims:
                claims.pop(i).release()

    failed: tuple[list[int], BaseException] | None = None
    try:
        # first pass: the jobs no other process is computing; second pass: wait for the others' claims, then
        # compute whatever they left (a process that stopped without storing)
        for wait in (False, True):
            pending = [j for j in jobs if any(i not in done_set for i in j)]
            if not pending or failed is not None:
                break
            if workers == 1 or len(pending) <= 1:
                for job in pending:
                    mine = take(job, wait)
                    if not mine:
                        continue
                    try:
                        out = _run_job(fn, batch_fn, [configs[i] for i in mine])
                    except Exception as exc:
                        release(mine)
                        failed = (mine, exc)
                        break
                    done(mine, out)
            else:
                failed = _run_parallel(fn, batch_fn, configs, pending, workers, take, done, release)
    finally:
        release(list(claims))
        if bar is not None:
            bar.close()
    if failed is not None:
        job, error = failed
        raise SweepError(name, [configs[i] for i in job], job, len(finished) if cache.root is not None else 0,
                         len(configs), error) from error
    return results


def _run_parallel(fn: Callable[[Any], R], batch_fn: Callable[[list[Any]], list[R]] | None, configs: list[Any],
                  jobs: list[list[int]], workers: int, take: Callable[[list[int], bool], list[int]],
                  done: Callable[[list[int], list[Any]], None], release: Callable[[list[int]], None],
                  ) -> tuple[list[int], BaseException] | None:
    """:func:`run_sweep`'s jobs on ``workers`` spawned processes; each job claimed (without waiting) as it is handed
    out. Returns the first failure, after the jobs still running have finished and been stored."""
    import concurrent.futures
    import multiprocessing

    failed: tuple[list[int], BaseException] | None = None
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {}
        for job in jobs:
            mine = take(job, False)
            if mine:
                futures[pool.submit(_run_job, fn, batch_fn, [configs[i] for i in mine])] = mine
        for future in concurrent.futures.as_completed(futures):
            job = futures[future]
            if future.cancelled():
                release(job)
                continue
            try:
                out = future.result()
            except Exception as exc:  # the jobs still running finish and are stored as they end
                release(job)
                if failed is None:
                    failed = (job, exc)
                    for other in futures:
                        other.cancel()  # those not started yet
                continue
            done(job, out)
    return failed


def _run_job(fn: Callable[[Any], R], batch_fn: Callable[[list[Any]], list[R]] | None, configs: list[Any]) -> list[R]:
    """One job of :func:`run_sweep`: a batch through ``batch_fn``, a single config through ``fn``."""
    if batch_fn is not None and len(configs) > 1:
        out = batch_fn(configs)
        if len(out) != len(configs):
            raise RuntimeError(f"batch_fn returned {len(out)} results for {len(configs)} configs")
        return out
    return [fn(c) for c in configs]
