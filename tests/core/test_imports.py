"""The core's import surface: ``import pipelab`` needs torch, numpy and scipy only, and loads no study code."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the packages of the ``studies`` extra (and what they pull in): the core must run without any of them
STUDY_PACKAGES = ("matplotlib", "seaborn", "IPython", "ipykernel", "ipywidgets", "jupyter", "jupyterlab",
                  "jupyter_client", "jupyter_core", "sklearn", "mnist1d", "tqdm", "pandas")

_PROBE = """
import json, sys
BLOCKED = set(json.loads(sys.argv[1]))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the core must not need it")

if BLOCKED:
    sys.meta_path.insert(0, Blocker())
exec(sys.argv[2])
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(code: str, blocked: tuple[str, ...] = ()) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(blocked), code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def _study(modules: set[str]) -> set[str]:
    return {m for m in modules if m.partition(".")[0] in STUDY_PACKAGES or m.startswith("pipelab.studies")}


def test_import_pipelab_runs_without_the_study_packages_and_loads_none() -> None:
    loaded = _loaded("from pipelab import *; import pipelab.calibration, pipelab.prediction_error",
                     blocked=STUDY_PACKAGES)
    assert "pipelab.runtime" in loaded and not _study(loaded), sorted(_study(loaded))


def test_import_pipelab_alone_loads_no_torch() -> None:
    """Each name of the vocabulary loads its module on first use, so that the command lines' ``--help`` is quick."""
    loaded = _loaded("import pipelab; pipelab.__version__")
    assert "torch" not in loaded and "pipelab.schedules" not in loaded
    assert {"torch", "pipelab.emulator"} <= _loaded("import pipelab; pipelab.Emulator")


def test_the_vocabulary_and_its_type_checking_imports_agree() -> None:
    """``pipelab.__init__`` lists each name twice: in the table that loads it, and as an import for type checkers."""
    import pipelab

    tree = ast.parse((ROOT / "pipelab" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {alias.name: (node.module or alias.name) for node in block.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == pipelab._VOCABULARY
    assert all(getattr(pipelab, name) is not None for name in pipelab.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        pipelab.nothing  # noqa: B018


def test_import_pipelab_loads_only_what_its_dependencies_load_themselves() -> None:
    # torch.hub imports tqdm when it is installed: that is torch's, not pipelab's
    baseline = _study(_loaded("import numpy, scipy, torch, torch.distributed"))
    assert _study(_loaded("import pipelab")) <= baseline


def test_the_import_contracts_hold() -> None:
    """The core never imports pipelab.studies, and its layers import only the layers below (pyproject.toml)."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (the dev extra)")
    proc = subprocess.run([exe, "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
