"""Project plumbing stays consistent: environment.yml vs pyproject.toml, README commands, CI script."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_installs_this_package_from_pyproject() -> None:
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*python\s*=\s*3\.11\s*$", text, re.M), "conda env must pin python 3.11"
    assert re.search(r"^\s*-\s*pip\s*$", text, re.M)
    pip_lines = re.findall(r"^\s{4,}-\s*(.+?)\s*$", text, re.M)
    assert any(line in {"-e .", "-e .[dev]", "."} or line.startswith("-e .") for line in pip_lines), pip_lines
    # pyproject.toml is the single source of dependencies: the conda file may only repeat its pins.
    deps = {re.split(r"[=<>!~\[ ]", d)[0].lower(): d for d in pyproject()["project"]["dependencies"]}
    for line in pip_lines:
        if line.startswith("-e") or line == ".":
            continue
        name = re.split(r"[=<>!~\[ ]", line)[0].lower()
        assert name in deps and deps[name].replace(" ", "") == line.replace(" ", ""), f"{line} vs pyproject"


def test_pyproject_pins_torch_and_lists_required_packages() -> None:
    proj = pyproject()["project"]
    assert "torch==2.13.0" in proj["dependencies"]
    names = {re.split(r"[=<>!~\[ ]", d)[0].lower() for d in proj["dependencies"]}
    assert names == {"torch", "numpy", "scipy"}  # the core's only runtime dependencies
    extras = {k: {re.split(r"[=<>!~\[ ]", d)[0].lower() for d in v} for k, v in proj["optional-dependencies"].items()}
    assert {"matplotlib", "seaborn", "jupyterlab", "ipywidgets", "tqdm", "scikit-learn", "mnist1d"} <= extras["studies"]
    assert {"pytest", "nbclient", "import-linter", "radon", "nbstripout"} <= extras["dev"]


def test_readme_has_exactly_the_two_setup_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert block is not None
    assert [ln.strip() for ln in block.group(1).splitlines() if ln.strip()] == ["make figures", "make test"]


def test_ci_installs_data_and_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get update" in ci and "dataset-fashion-mnist" in ci and "make test" in ci
    assert "no tests ran" in ci  # pytest's "no tests" must fail CI


def test_public_api_resolves() -> None:
    import pipelab

    missing = [n for n in pipelab.__all__ if not hasattr(pipelab, n)]
    assert not missing and len(set(pipelab.__all__)) == len(pipelab.__all__), missing
    for name in ("split", "simulate", "make_predictor", "Emulator", "PipelineRuntime", "max_stable_step"):
        assert name in pipelab.__all__
