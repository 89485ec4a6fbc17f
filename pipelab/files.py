"""Output files written whole or not at all: each goes to a temporary file beside it, then is renamed over it.

A reader sees the previous file or the complete new one, never a truncated one; a failure while writing leaves
the previous file and removes the temporary. ``os.replace`` is atomic on POSIX within one file system, which a
temporary in the target's directory ensures.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

__all__ = ["replace_files", "atomic_write", "Writer"]

#: writes a file's content to the open binary file it is given
Writer = Callable[[BinaryIO], object]


def replace_files(files: Sequence[tuple[str | os.PathLike[str], Writer]]) -> list[Path]:
    """Write every ``(path, writer)`` to a temporary beside ``path``, then rename each over its path, in order.

    All are written (and flushed to disk) before any rename, so a set (a figure's PNG, PDF, tables and sidecar) is
    replaced only when every member was written; a crash between renames leaves the last one (the sidecar) old.
    Temporaries are ``.NAME.<random>.tmp``, mode ``0o666`` less the umask. Raises what a writer raises, or
    ``OSError``: then no file is replaced and no temporary is left.
    """
    paths = [Path(p) for p, _ in files]
    temps: list[Path] = []
    try:
        for path, (_, write) in zip(paths, files):
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            temps.append(tmp)
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, path in zip(temps, paths):
            os.replace(tmp, path)
    finally:
        for tmp in temps:  # what was not renamed (after a failure)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return paths


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Replace ``path`` by ``data`` (``str``: UTF-8) through a temporary (:func:`replace_files`); return it."""
    blob = data.encode() if isinstance(data, str) else data
    return replace_files([(path, lambda fh: fh.write(blob))])[0]
