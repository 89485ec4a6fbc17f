"""Notebook hygiene: strip outputs before committing, check that committed notebooks carry none."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..files import atomic_write

__all__ = ["strip_notebook", "notebooks_with_outputs"]


def _cells(nb: dict) -> list[dict]:
    return [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]


def strip_notebook(path: str | Path) -> bool:
    """Remove outputs and execution counts in place; return whether the file changed."""
    path = Path(path)
    nb = json.loads(path.read_text())
    changed = False
    for cell in _cells(nb):
        if cell.get("outputs") or cell.get("execution_count") is not None:
            changed = True
        cell["outputs"], cell["execution_count"] = [], None
    if changed:  # through a temporary: an interrupted strip never truncates the notebook
        atomic_write(path, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def notebooks_with_outputs(paths: Iterable[str | Path]) -> list[Path]:
    """The notebooks among ``paths`` that still hold outputs or execution counts."""
    bad = []
    for path in map(Path, paths):
        nb = json.loads(path.read_text())
        if any(c.get("outputs") or c.get("execution_count") is not None for c in _cells(nb)):
            bad.append(path)
    return bad
