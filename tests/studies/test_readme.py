"""Every command of the README pastes and runs on a fresh clone as written, and writes only under ``runs/``.

The README's fenced blocks are read from the file itself. Python blocks run in order in one namespace (as pasted
into one session), in a scratch directory. Each shell command is matched to how it is exercised (:data:`HOW`):
``make -n`` for make targets (make must not install into a shared environment here), a parse of its arguments by
the very parsers the command would use for the GPU, multi-node and benchmark commands (nothing can run them here, or
they take minutes), and a real run for the rest (``slow`` when it trains). A command no rule matches fails the test,
so a new README command comes with its check.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
VENV_BIN = Path(sys.executable).parent  # the environment these tests run in stands for the clone's .venv

#: how each shell command of the README is exercised, by the first pattern that matches it
HOW: list[tuple[str, str]] = [
    (r"^nohup bash -c ", "chunks"),  # the study's background loop: hours of training, checked by its parts
    (r"^make ", "make-n"),
    (r"^\.venv/bin/torchrun .*--device cuda", "parse"),  # a GPU (and a second machine) are not here
    (r"^\.venv/bin/torchrun ", "run-slow"),
    (r"^\.venv/bin/python benchmarks/", "parse"),  # minutes of measurement
    (r"^\.venv/bin/python -m pipelab figures --list$", "run"),
    (r"^\.venv/bin/python -m pipelab figures ", "run-slow"),
]


def fenced() -> list[tuple[str, str]]:
    """Every fenced block of the README: (its language, its text)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", README, re.S | re.M)


def blocks(language: str) -> list[str]:
    return [text for lang, text in fenced() if lang == language]


def commands(block: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


SHELL = [c for b in blocks("bash") for c in commands(b)]


def how(command: str) -> str | None:
    return next((mode for pattern, mode in HOW if re.search(pattern, command)), None)


def test_every_readme_command_is_exercised_and_uses_the_environment_or_make() -> None:
    assert {lang for lang, _ in fenced()} == {"bash", "python"}, "every block is bash or python, and says which"
    assert len(SHELL) >= 10
    for command in SHELL:
        match = CHUNKS.match(command)
        run = match[3] if match else command  # a loop of chunks: the command it retries
        assert re.match(r"(make|\.venv/bin/)", run), f"{command!r}: run it from the environment (.venv/bin/...)"
        assert how(command) is not None, f"{command!r}: add to HOW how the README test exercises it"
        assert "[" not in command, f"{command!r}: optional arguments in brackets do not paste"


def test_outputs_of_readme_commands_go_under_runs_which_git_ignores() -> None:
    for command in SHELL:
        for flag in ("--out", "--checkpoint", "--resume", "--json"):
            if f"{flag} " in command:
                value = command.split(f"{flag} ")[1].split()[0]
                assert value.startswith("runs/"), f"{command!r}: {flag} {value} outside runs/"
    proc = subprocess.run(["git", "check-ignore", "-q", "runs/run.json"], cwd=ROOT, capture_output=True, check=False)
    assert proc.returncode == 0, "runs/ must be in .gitignore"


def test_readme_make_targets_exist() -> None:
    inline = re.findall(r"`(make [^`]+)`", README)
    for command in {*[c for c in SHELL if how(c) == "make-n"], *inline}:
        argv = shlex.split(command)
        proc = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{command}: {proc.stderr}"


_PARSE_ONLY = """
import argparse, runpy, sys
parse = argparse.ArgumentParser.parse_args
def parse_only(self, args=None, namespace=None):
    parse(self, args, namespace)  # a wrong option or value exits 2 with argparse's message
    print("PARSED")
    sys.exit(0)
argparse.ArgumentParser.parse_args = parse_only
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("command", [c for c in SHELL if how(c) == "parse"])
def test_readme_commands_that_cannot_run_here_parse(command: str) -> None:
    argv = shlex.split(command)
    if argv[0].endswith("torchrun"):  # torchrun's own arguments, then the module's
        from torch.distributed.run import get_args_parser

        from pipelab.studies import run

        launch = get_args_parser().parse_args(argv[1:])
        assert launch.module and launch.training_script == "pipelab.studies.run", command
        run._parse(launch.training_script_args)
        return
    assert argv[0] == ".venv/bin/python" and argv[1].endswith(".py"), command
    proc = subprocess.run([sys.executable, "-c", _PARSE_ONLY, *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0 and "PARSED" in proc.stdout, proc.stderr[-2000:]


#: ``nohup bash -c 'for i in $(seq N); do timeout SECONDS COMMAND && break; done' &``: COMMAND run in chunks of at
#: most SECONDS until one finishes, in the background (the result cache carries each chunk's runs to the next)
CHUNKS = re.compile(r"^nohup bash -c '(for i in \$\(seq \d+\); do timeout (\d+) (\.venv/bin/python -m pipelab [^']*?) "
                    r"&& break; done)' &$")


@pytest.mark.parametrize("command", [c for c in SHELL if how(c) == "chunks"])
def test_readme_background_chunks_retry_a_pipelab_command_that_parses(command: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from pipelab.studies import cli

    match = CHUNKS.match(command)
    assert match, f"{command!r}: write a background loop as CHUNKS says"
    loop, seconds, run = match.groups()
    assert 0 < int(seconds) <= 600, command
    assert subprocess.run(["bash", "-n", "-c", loop], check=False).returncode == 0, loop

    class Parsed(Exception):
        pass

    parse = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        parse(self, args, namespace)  # a wrong option or value exits 2 with argparse's message
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    with pytest.raises(Parsed):
        cli.main(shlex.split(run)[3:])


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A scratch directory standing for a fresh clone: this checkout's code and benchmarks, the test environment as
    its .venv, and nothing else, so that every file a command writes can be found."""
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    return tmp_path


def _run_shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's pipelab, whatever the environment installed
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600, env=env,
                          check=False)


def _written(clone: Path) -> list[str]:
    return sorted(str(p.relative_to(clone)) for p in clone.rglob("*")
                  if p.is_file() and p.parts[len(clone.parts)] not in (".venv", "benchmarks"))


@pytest.mark.parametrize("command", [c for c in SHELL if how(c) == "run"])
def test_quick_readme_commands_run(command: str, clone: Path) -> None:
    proc = _run_shell(command, clone)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(p.startswith("runs/") for p in _written(clone)), _written(clone)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_readme_commands_that_train_run_in_order(clone: Path) -> None:
    """The torchrun examples on CPU (the checkpoint, then the resume) and the figure example, as written."""
    for command in [c for c in SHELL if how(c) == "run-slow"]:
        proc = _run_shell(command, clone)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"
    written = _written(clone)
    assert all(p.startswith("runs/") for p in written), written
    assert {"runs/run.json", "runs/resumed.json", "runs/figures/model_stages.png"} <= set(written), written
    assert any(p.startswith("runs/ckpt/") for p in written), written


def _using_pipelab(ns: dict[str, Any]) -> None:
    assert ns["sim"].version_table.staleness("F")[:, 8, 0].tolist() == [3, 2, 1, 0]
    assert ns["emu"].weight_copies == [2, 2, 2, 1]
    assert math.isclose(ns["pipelab"].max_stable_step(ns["delayed_gd"](4)), 2 * math.sin(math.pi / 18), rel_tol=1e-9)


def _link_model(ns: dict[str, Any]) -> None:
    sim = ns["sim"]
    assert sim.link_utilisation.shape == (3, 2) and ((0 <= sim.link_utilisation) & (sim.link_utilisation <= 1)).all()
    assert 0 < sim.link_time < 1
    assert math.isclose(sum(d for _, _, d in sim.critical_path()), sim.makespan, rel_tol=1e-9)


def _mixed_precision(ns: dict[str, Any]) -> None:
    """Adam's fp32 state before any step: 2 x 4n bytes plus a 4-byte step counter per parameter tensor."""
    for k, row in ns["emu"].plan.weight_bytes.items():
        params = ns["emu"].stages[k].params
        assert row["optimizer_state"] == 8 * sum(p.numel() for p in params) + 4 * len(params) > 0


def _planner(ns: dict[str, Any]) -> None:
    best = ns["plans"][0]
    assert sum(best.sizes) == 8 and max(best.peak_memory) <= 16 * 2**30 and best.schedule in best.explain()


def _time_to_target(ns: dict[str, Any]) -> None:
    assert (ns["reach"] > 0).all() and ns["np"].isfinite(ns["reach"]).all()
    assert ns["time_to_target"](ns["reach"], step_time=0.05).label().endswith(" s")
    assert 10 < ns["cross"].value < 100 and ns["cross"].low <= ns["cross"].value <= ns["cross"].high


def _torch_interop(ns: dict[str, Any]) -> None:
    assert ns["s"].W == 4 and ns["s"].D == 8
    assert Path("runs/1f1b.csv").is_file()


#: the README's Python blocks in order, and what each one's comments state
PYTHON_CHECKS = [_using_pipelab, _link_model, _mixed_precision, _planner, _time_to_target, _torch_interop]


def test_readme_python_blocks_run_in_one_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python examples, pasted in order into one session in an empty directory, and the values they state."""
    monkeypatch.chdir(tmp_path)
    python = blocks("python")
    assert len(python) == len(PYTHON_CHECKS), "a new Python block in the README needs its check here"
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    for block, check in zip(python, PYTHON_CHECKS):
        exec(compile(block, "README.md", "exec"), namespace)
        check(namespace)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == ["runs/1f1b.csv"]


def test_make_lab_listens_on_localhost_without_a_browser_and_as_root() -> None:
    """`make lab` (from the README): JupyterLab on the notebooks, reachable from this machine only, with no browser
    to open on a server, and with --allow-root exactly when run as root (Jupyter refuses root without it)."""
    proc = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True)
    line = next(ln for ln in re.sub(r"\\\n\s*", " ", proc.stdout).splitlines() if "jupyter lab" in ln)
    argv = shlex.split(line)
    assert argv[0] == ".venv/bin/jupyter" and argv[1] == "lab", line
    assert {"--no-browser", "--ip=127.0.0.1", "--port=8888", "--notebook-dir=notebooks"} <= set(argv), line
    assert ("--allow-root" in argv) == (os.getuid() == 0), line


#: paths the README names that are places on the user's machine, not files of the repository
ELSEWHERE = ("/", "~", "runs/", "FashionMNIST/raw/")


def test_every_file_the_readme_points_to_is_in_the_repository() -> None:
    """A `path` is found from the root, pipelab/, pipelab/studies/ or tests/ (a module may go without .py, a bare
    file name is a module of the table row's package); nothing points outside the repository."""
    named = {m for m in re.findall(r"`([^`\s]+)`", README)
             if re.search(r"/|\.(py|md|toml|ya?ml|csv|json|ipynb|mplstyle)$", m) and not m.startswith(ELSEWHERE)}
    assert len(named) > 50
    bases = [ROOT, ROOT / "pipelab", ROOT / "pipelab" / "studies", ROOT / "tests"]
    for name in named:
        if "/" in name:
            found = any(list(b.glob(name)) or (b / f"{name}.py").is_file() for b in bases)
        else:
            found = (ROOT / name).is_file() or any(any(b.rglob(name)) for b in (ROOT / "pipelab", ROOT / "tests"))
        assert found, f"the README points to {name}, which the repository does not hold"
    assert "design document" not in README.lower()
