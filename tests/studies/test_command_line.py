"""The command lines answer ``--help`` at once (torch is not imported) and show every option's default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelab.studies import run

ROOT = Path(__file__).resolve().parents[2]

#: run a module as ``python -m MODULE ARGS`` would, then say whether torch was imported
_PROBE = """
import runpy, sys
module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
print("torch imported:", "torch" in sys.modules, "exit:", code)
"""

HELPS = {
    "pipelab": ["--help"],
    "pipelab figures": ["figures", "--help"],
    "pipelab data": ["data", "--help"],
    "pipelab strip-notebooks": ["strip-notebooks", "--help"],
    "pipelab.studies.run": ["--help"],
}


@pytest.mark.parametrize("name", HELPS)
def test_help_answers_without_importing_torch(name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE, name.split()[0], *HELPS[name]], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "torch imported: False exit: 0", proc.stdout[-2000:]
    assert "usage:" in proc.stdout


def test_the_torchrun_command_line_shows_its_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: fashion_mnist_mlp)", "(default: pipeoptim)", "(default: adam)", "(default: 64)",
                    "(default: cpu)", "(default: 120.0)", "stages (default: the world size)"):
        assert default in text, default


def test_the_torchrun_command_line_lists_and_checks_its_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run.main(["--list"])
    assert info.value.code == 0 and "--optimizer: sgd sgdm" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        run.main(["--policy", "sequential"])  # the sequential arm has no pipeline
    assert info.value.code == 2
    assert "argument --policy: invalid choice: 'sequential' (choose from gpipe, 1f1b" in capsys.readouterr().err
