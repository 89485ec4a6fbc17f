"""Every notebook runs top to bottom under the `tiny` preset, and is committed without outputs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from pipelab.studies.notebook_tools import notebooks_with_outputs

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert any(p.name.startswith("00_") for p in NOTEBOOKS), NOTEBOOKS


def test_committed_notebooks_have_no_outputs() -> None:
    bad = notebooks_with_outputs(NOTEBOOKS)
    assert not bad, f"strip them with `python -m pipelab strip-notebooks notebooks`: {bad}"


def test_each_notebook_says_first_how_long_it_takes_with_and_without_the_cache() -> None:
    """Notebooks 02 and 04 train for many minutes with an empty result cache: the first cell says so, measured."""
    for path in NOTEBOOKS:
        first = json.loads(path.read_text())["cells"][0]
        text = "".join(first["source"])
        assert first["cell_type"] == "markdown", path.name
        assert re.search(r"\*\*How long\*\* \(preset `quick`, measured on [^:]+\): .*\d.* with an empty result cache"
                         r".* with a full one", text), path.name


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_under_tiny(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PIPELAB_PRESET", "tiny")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # the kernel imports this checkout's pipelab, not whichever one the environment has installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert os.environ["PIPELAB_PRESET"] == "tiny"
