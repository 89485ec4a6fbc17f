"""Result cache keyed by the hash of a full config plus the package version.

A sweep calls :func:`cached` (or :func:`run_sweep`) once per config; results are stored as
``<root>/<name>/<hash>.pkl``. Each file starts with the SHA-256 of its pickled payload, so a truncated or
otherwise corrupt entry is detected on load, logged, removed and recomputed — never silently used.
Writes are atomic (temporary file + ``os.replace``), so an interrupted sweep leaves only complete
entries and resumes where it stopped.

The cache root is ``$PIPELAB_CACHE`` if set, else ``$XDG_CACHE_HOME/pipelab`` (``~/.cache/pipelab``).
Set ``PIPELAB_CACHE=off`` to disable caching.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .config import config_hash

__all__ = ["ResultCache", "cached", "run_sweep", "default_cache_root"]

log = logging.getLogger(__name__)
R = TypeVar("R")
_MAGIC = b"pipelab-cache-v1\n"


def default_cache_root() -> Path | None:
    """The cache directory, or ``None`` when ``$PIPELAB_CACHE`` is ``off``."""
    env = os.environ.get("PIPELAB_CACHE")
    if env is not None:
        return None if env.lower() in {"off", "0", "none", ""} else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pipelab"


class ResultCache:
    """Pickle store of results keyed by ``config_hash(config, salt=version)``.

    Args:
        root: directory of the store; ``None`` uses :func:`default_cache_root`.
        version: salt of every key; defaults to ``pipelab.__version__`` so a new release recomputes.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, version: str | None = None) -> None:
        if version is None:
            from . import __version__ as version
        self.version = version
        self.root = Path(root) if root is not None else default_cache_root()

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def path(self, name: str, config: Any) -> Path:
        if self.root is None:
            raise RuntimeError("the result cache is disabled (PIPELAB_CACHE=off)")
        return self.root / name / f"{config_hash(config, salt=self.version)}.pkl"

    def load(self, name: str, config: Any) -> tuple[bool, Any]:
        """Return ``(True, result)`` for a valid entry, ``(False, None)`` when missing or corrupt."""
        if self.root is None:
            return False, None
        path = self.path(name, config)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return False, None
        header_len = len(_MAGIC) + 64 + 1
        digest = raw[len(_MAGIC) : len(_MAGIC) + 64].decode("ascii", "replace")
        payload = raw[header_len:]
        if not raw.startswith(_MAGIC) or hashlib.sha256(payload).hexdigest() != digest:
            log.warning("corrupt cache entry %s (checksum mismatch); recomputing", path)
            path.unlink(missing_ok=True)
            return False, None
        try:
            return True, pickle.loads(payload)
        except Exception as exc:  # unpicklable after a code change: treat as a miss
            log.warning("unreadable cache entry %s (%s); recomputing", path, exc)
            path.unlink(missing_ok=True)
            return False, None

    def store(self, name: str, config: Any, result: Any) -> Path | None:
        if self.root is None:
            return None
        path = self.path(name, config)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        blob = _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pkl")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def cached(name: str, config: Any, fn: Callable[[Any], R], *, cache: ResultCache | None = None) -> R:
    """Return ``fn(config)``, from the cache when a valid entry exists, else computed and stored.

    Args:
        name: namespace of the experiment (a folder of the store).
        config: a frozen dataclass (or mapping); its canonical JSON is the key.
        fn: computes the result from the config; must be deterministic given the config.
        cache: the store; defaults to ``ResultCache()``.
    """
    cache = cache if cache is not None else ResultCache()
    hit, result = cache.load(name, config)
    if hit:
        log.debug("cache hit %s %s", name, config)
        return result
    result = fn(config)
    cache.store(name, config, result)
    return result


def run_sweep(
    name: str,
    configs: Iterable[Any],
    fn: Callable[[Any], R],
    *,
    cache: ResultCache | None = None,
    progress: bool = False,
    desc: str | None = None,
) -> list[R]:
    """Run ``fn`` over ``configs`` through the cache, in order; an interrupted sweep resumes.

    Args:
        progress: show a tqdm progress bar (the CLI and notebooks turn it on; library code leaves it off).
    """
    configs = list(configs)
    cache = cache if cache is not None else ResultCache()
    items: Sequence[Any] = configs
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(configs, desc=desc or name, unit="run")
    return [cached(name, c, fn, cache=cache) for c in items]
