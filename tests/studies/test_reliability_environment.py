"""Reliability probes for the environment variables (``PIPELAB_PRESET``, ``_WORKERS``, ``_CACHE``, ``_DATA``,
``_DEVICE``, ``_CACHED``, ``_STACK``): the command line honours them, and refuses a value it cannot use before any
work."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import probes
import pytest
import torch
from probes import Probe

from pipelab.studies import cli, environment, figures
from pipelab.studies.cache import ResultCache

ROOT = Path(__file__).resolve().parents[2]
A_FILE = Path(__file__)  # an existing file where a directory belongs
NO_NOTEBOOKS = ROOT / "tests"  # strip-notebooks over a folder without notebooks: a command that does nothing


class CliError(Exception):
    """``python -m pipelab`` returned a non-zero status; the message is its stderr."""


def run_cli(argv: list[str], **env: str) -> str:
    """Run the command line with ``env`` set; its stdout, or :class:`CliError` with its stderr."""
    out, err = io.StringIO(), io.StringIO()
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if code != 0:
        raise CliError(err.getvalue())
    return out.getvalue()


STRIP = ["strip-notebooks", str(NO_NOTEBOOKS)]

PROBES = [
    Probe("preset-unknown", lambda: run_cli(STRIP, PIPELAB_PRESET="huge"), CliError,
          r"\$PIPELAB_PRESET='huge' is not a preset; choose one of tiny, quick, study, paper"),
    Probe("workers-zero", lambda: run_cli(STRIP, PIPELAB_WORKERS="0"), CliError,
          r"\$PIPELAB_WORKERS='0' is not a number of worker processes; use an integer >= 1"),
    Probe("workers-word", lambda: run_cli(STRIP, PIPELAB_WORKERS="two"), CliError, r"\$PIPELAB_WORKERS='two'"),
    Probe("cache-a-file", lambda: run_cli(STRIP, PIPELAB_CACHE=str(A_FILE)), CliError,
          r"\$PIPELAB_CACHE='.*' is a file, not a directory"),
    Probe("data-a-file", lambda: run_cli(["data"], PIPELAB_DATA=str(A_FILE)), CliError,
          r"\$PIPELAB_DATA='.*' is a file, not a directory"),
    Probe("device-unknown", lambda: run_cli(STRIP, PIPELAB_DEVICE="gpu"), CliError,
          r"\$PIPELAB_DEVICE='gpu' is not a device pipelab runs on; choose one of auto, cpu, cuda, cuda:N"),
    Probe("cached-word", lambda: run_cli(STRIP, PIPELAB_CACHED="yes"), CliError,
          r"\$PIPELAB_CACHED='yes': use 1 \(draw from the result cache only\) or 0"),
    Probe("stack-zero", lambda: run_cli(STRIP, PIPELAB_STACK="0"), CliError,
          r"\$PIPELAB_STACK='0' is not a number of stacked seeds; use an integer >= 1 \(1: every run alone\)"),
    Probe("stack-word", lambda: run_cli(STRIP, PIPELAB_STACK="eight"), CliError, r"\$PIPELAB_STACK='eight'"),
    Probe("stack-option-zero", lambda: run_cli(["figures", "model_stages", "--stack", "0"]), CliError,
          r"--stack must be an integer >= 1 \(1: every run alone\), got 0"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The presets the figure command renders with (nothing is computed)."""
    presets: list[str] = []
    monkeypatch.setattr(figures, "render", lambda names, preset, out, **kw: presets.append(preset))
    monkeypatch.setattr(figures, "check_outdir", lambda out, **kw: None)
    return presets


def test_the_figure_command_runs_the_preset_of_the_environment(drawn: list[str], tmp_path: Path) -> None:
    run_cli(["figures", "model_stages", "--out", str(tmp_path)], PIPELAB_PRESET="tiny")
    run_cli(["figures", "model_stages", "--out", str(tmp_path), "--preset", "quick"], PIPELAB_PRESET="tiny")
    assert drawn == ["tiny", "quick"]  # the variable, unless --preset says otherwise


def test_the_cache_directory_may_start_with_a_tilde(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", "~/pipelab-cache")  # as written inside quotes, the shell leaves ~ alone
    assert ResultCache().root == Path.home() / "pipelab-cache"


def test_the_stack_option_sets_the_cap_of_the_sweeps_it_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pipelab.studies import runner

    seen: list[str | None] = []
    monkeypatch.setattr(runner, "run_figures", lambda *a, **kw: seen.append(os.environ.get("PIPELAB_STACK")) or 0)
    monkeypatch.setenv("PIPELAB_STACK", "4")  # restored after the test: the option sets it for the figures' workers
    run_cli(["figures", "model_stages", "--out", str(tmp_path)])
    run_cli(["figures", "model_stages", "--out", str(tmp_path), "--stack", "2"])
    assert seen == ["4", "2"]  # the variable, unless --stack says otherwise


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of CUDA on a machine without it")
def test_cached_figures_may_name_the_device_the_runs_were_computed_on(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    from pipelab.studies import runner

    seen: list[tuple[str | None, str | None]] = []
    monkeypatch.setattr(runner, "run_figures", lambda *a, **kw: seen.append(
        (os.environ.get("PIPELAB_DEVICE"), os.environ.get("PIPELAB_CACHED"))) or 0)
    monkeypatch.setenv("PIPELAB_DEVICE", "cpu")  # restored after the test: the options set both for the figures
    monkeypatch.setenv("PIPELAB_CACHED", "0")
    with pytest.raises(CliError, match="--device cuda asks for CUDA"):  # computing runs there needs CUDA
        run_cli(["figures", "model_stages", "--out", str(tmp_path), "--device", "cuda"])
    run_cli(["figures", "model_stages", "--out", str(tmp_path), "--device", "cuda", "--cached"])
    assert seen == [("cuda", "1")]  # every config keyed on cuda, every sweep drawing from the cache only
    assert environment.device() == "cuda"  # and the variable, read back (by config.from_preset), is accepted
    with pytest.raises(CliError, match="--device gpu is not a device pipelab runs on"):  # a name is still checked
        run_cli(["figures", "model_stages", "--out", str(tmp_path), "--device", "gpu", "--cached"])
