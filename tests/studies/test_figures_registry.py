"""The figure registry, its files and sidecars, and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelab.studies import figures
from pipelab.studies.cli import main


def test_registry_lists_discovered_modules() -> None:
    names = {s.name for s in figures.available()}
    assert {"data_samples", "model_stages"} <= names
    with pytest.raises(ValueError, match="unknown figure"):
        figures.get("no_such_figure")


def test_render_writes_png_pdf_and_sidecar(tmp_path: Path) -> None:
    written = figures.render(["model_stages"], "tiny", tmp_path)
    assert sorted(p.name for p in written["model_stages"]) == ["model_stages.json", "model_stages.pdf",
                                                                 "model_stages.png"]
    assert (tmp_path / "model_stages.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "model_stages.pdf").read_bytes()[:5] == b"%PDF-"
    meta = json.loads((tmp_path / "model_stages.json").read_text())
    assert meta["preset"] == "tiny" and meta["seed"] == 0 and meta["config"]["D"] == 4
    assert meta["pipelab_version"] and meta["torch_version"].startswith("2.13")
    assert {"commit", "code_clean", "code_diff_sha256", "allow_dirty"} <= set(meta) and "git_commit" not in meta
    assert meta["notes"]["deep_mlp/layers"]["blocks"] == [4, 4, 4, 4]


def test_a_figure_redrawn_at_another_commit_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registered figure drawn twice, the second time at another (fake) commit: the same files, byte for byte,
    naming the first commit; the PNG and PDF carry no dates."""
    files = []
    for commit in ("a" * 40, "b" * 40):
        monkeypatch.setattr(figures, "code_state", lambda *a, commit=commit, **kw: figures.CodeState(commit, True))
        figures.render(["model_stages"], "tiny", tmp_path)
        files.append({p.name: p.read_bytes() for p in tmp_path.iterdir()})
    assert set(files[0]) == {"model_stages.json", "model_stages.pdf", "model_stages.png"}
    assert files[1] == files[0] and json.loads(files[1]["model_stages.json"])["commit"] == "a" * 40


def test_duplicate_registration_from_another_module_is_an_error() -> None:
    def fn(preset: str, *, progress: bool = False) -> figures.FigureOutput:
        raise AssertionError

    fn.__module__ = "somewhere.else"
    with pytest.raises(ValueError, match="registered twice"):
        figures.register("model_stages", "dup")(fn)
    with pytest.raises(ValueError, match="letters"):
        figures.register("bad name!", "x")


def test_cli_list_and_unknown_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["figures", "--list"]) == 0
    assert "model_stages" in capsys.readouterr().out
    assert main(["figures", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown figure" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_renders_one_figure(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipelab", "figures", "model_stages", "--preset", "tiny",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "model_stages.pdf").exists()
