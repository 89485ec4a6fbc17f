"""Reliability probes for the result cache, config keys and figure provenance."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import probes
import pytest
import torch
from probes import Probe

from pipelab.studies import cache as cache_module
from pipelab.studies import figures
from pipelab.studies.cache import CacheWarning, ResultCache, SweepError, cached, run_sweep
from pipelab.studies.cli import main
from pipelab.studies.config import config_hash, config_to_dict


@dataclass(frozen=True)
class ArrayCfg:
    weights: Any = None
    extra: dict = field(default_factory=dict)


class Opaque:
    """An object whose default repr holds a memory address."""


PROBES = [
    Probe("config-object-field", lambda: config_hash(ArrayCfg(weights=Opaque())), TypeError, r"config\.weights"),
    Probe("config-callable-nested", lambda: config_hash(ArrayCfg(extra={"fn": lambda x: x})), TypeError,
          r"config\.extra\['fn'\]"),
    Probe("config-object-array", lambda: config_hash(ArrayCfg(weights=np.array([object()]))), TypeError,
          r"config\.weights.*object array"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


def _big(kind: str, tail: float) -> Any:
    a = np.arange(5000, dtype=np.float64)
    a[2500] = tail  # in the middle: hidden by the "..." of an abbreviated repr
    return torch.from_numpy(a) if kind == "torch" else a


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_large_arrays_do_not_collide(kind: str) -> None:
    a, b = ArrayCfg(weights=_big(kind, 1.0)), ArrayCfg(weights=_big(kind, 2.0))
    assert config_hash(a) != config_hash(b)
    assert config_hash(a) == config_hash(ArrayCfg(weights=_big(kind, 1.0)))
    nested_a, nested_b = ArrayCfg(extra={"w": [_big(kind, 1.0)]}), ArrayCfg(extra={"w": [_big(kind, 2.0)]})
    assert config_hash(nested_a) != config_hash(nested_b)


def test_array_dtype_and_shape_are_part_of_the_key() -> None:
    base = np.zeros(8, dtype=np.float64)
    keys = {config_hash(ArrayCfg(weights=w)) for w in (base, base.astype(np.float32), base.reshape(2, 4),
                                                      torch.zeros(8, dtype=torch.float64), torch.zeros(2, 4))}
    assert len(keys) == 5
    form = config_to_dict(ArrayCfg(weights=torch.ones(3, dtype=torch.bfloat16)))["weights"]
    assert form["dtype"] == "torch.bfloat16" and form["shape"] == [3] and len(form["sha256"]) == 64


def test_set_fields_are_order_independent() -> None:
    assert config_hash(ArrayCfg(extra={"s": frozenset({"b", "a", "c"})})) == \
        config_hash(ArrayCfg(extra={"s": frozenset({"c", "a", "b"})}))


# ------------------------------------------------------------------------------------ cache store


@dataclass(frozen=True)
class Small:
    n: int = 1


def _square(cfg: Small) -> int:
    return cfg.n**2


def _cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


def test_unwritable_store_keeps_results_and_warns_once(tmp_path: Path) -> None:
    (tmp_path / "sweep").write_text("a file where the experiment's folder should be")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = run_sweep("sweep", [Small(n) for n in range(4)], _square, cache=ResultCache(tmp_path, version="1"))
    assert out == [0, 1, 4, 9]
    msgs = _cache_warnings(record)
    assert len(msgs) == 1 and "cannot store" in msgs[0] and str(tmp_path) in msgs[0]


def test_failing_rename_keeps_the_result_and_leaves_no_temporary(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied", dst)

    monkeypatch.setattr(cache_module.os, "replace", denied)
    cache = ResultCache(tmp_path, version="1")
    with pytest.warns(CacheWarning, match="Permission denied"):
        assert cached("exp", Small(3), _square, cache=cache) == 9
    assert not list(tmp_path.rglob(".tmp-*"))
    assert cache.load("exp", Small(3), _square) == (False, None)


@dataclass(frozen=True)
class Marked:
    n: int
    marks: str  # a directory where each run that returns leaves a file


def _fail_on_1(cfg: Marked) -> int:
    if cfg.n == 1:
        raise ValueError("config 1 is broken")
    time.sleep(0.5)  # config 1 fails while the others run
    Path(cfg.marks, str(cfg.n)).touch()
    return cfg.n**2


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_config_keeps_every_finished_result(tmp_path: Path, workers: int) -> None:
    """In parallel, the first failure raised at once and the pool then finished the running jobs without storing
    them: their results were lost. Now every result that finished is cached, and the error names the config."""
    marks = tmp_path / "marks"
    marks.mkdir()
    configs = [Marked(n, str(marks)) for n in range(6)]
    cache = ResultCache(tmp_path / "cache", version="1")
    with pytest.raises(SweepError, match=r"sweep 'sq': config 1 of 6 failed \(ValueError: config 1 is broken\)"
                                         r"\n  config 1: Marked\(n=1") as err:
        run_sweep("sq", configs, _fail_on_1, cache=cache, workers=workers)
    assert isinstance(err.value.__cause__, ValueError) and err.value.indices == [1]
    ran = sorted(int(p.name) for p in marks.iterdir())
    assert ran and all(cache.load("sq", configs[n], _fail_on_1) == (True, n**2) for n in ran), ran
    assert f"{len(ran)} of the 6 results are cached" in str(err.value)
    assert 1 not in ran and cache.load("sq", configs[1], _fail_on_1) == (False, None)


def test_directory_in_place_of_an_entry_is_a_miss(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path, version="1")
    cache.path("exp", Small(2), _square).mkdir(parents=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cached("exp", Small(2), _square, cache=cache) == 4
    msgs = _cache_warnings(record)
    assert any("cannot be read" in m for m in msgs) and any("cannot store" in m for m in msgs)


def test_unreadable_entry_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ResultCache(tmp_path, version="1")
    assert cached("exp", Small(5), _square, cache=cache) == 25
    entry = cache.path("exp", Small(5), _square)
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self == entry:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.warns(CacheWarning, match="cannot be read.*Permission denied"):
        assert cache.load("exp", Small(5), _square) == (False, None)


def test_corrupt_entry_in_a_read_only_directory_is_recomputed(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ResultCache(tmp_path, version="1")
    cached("exp", Small(6), _square, cache=cache)
    cache.path("exp", Small(6), _square).write_bytes(b"garbage")

    def denied(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", denied)
    assert cache.load("exp", Small(6), _square) == (False, None)


def test_entries_are_shared_readable_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = ResultCache(tmp_path / "root", version="1").store("exp", Small(7), 49, _square)
    finally:
        os.umask(old)
    assert path is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "root").stat().st_mode) == 0o755


# ------------------------------------------------------------------------------- figure provenance


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh clone-like checkout (code + committed figures/) that pipelab takes for its own repository."""
    root = tmp_path / "repo"
    (root / "figures").mkdir(parents=True)
    (root / "code.py").write_text("x = 1\n")
    (root / "figures" / "old.png").write_bytes(b"committed figure")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "init")
    monkeypatch.setattr(figures, "_repo_root", lambda: root)
    return root


def _output() -> figures.FigureOutput:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    return figures.FigureOutput(fig, config={"n": 1}, seed=0)


@pytest.mark.slow
def test_sidecars_stay_clean_while_figures_dir_changes(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "figures" / "old.png").write_bytes(b"regenerated")  # what writing the first figure does
    for _ in range(2):  # the second figure is written after the first changed figures/
        figures.save("model_stages", _output(), repo / "figures", "tiny")
        meta = json.loads((repo / "figures" / "model_stages.json").read_text())
        assert meta["commit"] == head and meta["code_clean"] is True and meta["code_diff_sha256"] is None
        assert meta["allow_dirty"] is False and "-dirty" not in json.dumps(meta)


@pytest.mark.parametrize("change", ["modified", "untracked", "staged"])
def test_unclean_code_is_refused_in_figures_dir(repo: Path, tmp_path: Path, change: str) -> None:
    if change == "untracked":
        (repo / "new_module.py").write_text("y = 2\n")
    else:
        (repo / "code.py").write_text("x = 2\n")
        if change == "staged":
            _git(repo, "add", "code.py")
    state = figures.code_state()
    assert state.clean is False and state.diff_sha256 and len(state.diff_sha256) == 64
    with pytest.raises(figures.ProvenanceError, match=r"uncommitted changes.*--allow-dirty"):
        figures.save("model_stages", _output(), repo / "figures" / "sub", "tiny")
    assert not (repo / "figures" / "sub").exists()
    # Another directory is fine, and says the code was unclean.
    figures.save("model_stages", _output(), tmp_path / "elsewhere", "tiny")
    meta = json.loads((tmp_path / "elsewhere" / "model_stages.json").read_text())
    assert meta["code_clean"] is False and meta["code_diff_sha256"] == state.diff_sha256
    # Explicitly allowed: a loud warning, and the sidecar says so.
    with pytest.warns(UserWarning, match="UNCOMMITTED CODE"):
        figures.save("model_stages", _output(), repo / "figures", "tiny", allow_dirty=True)
    meta = json.loads((repo / "figures" / "model_stages.json").read_text())
    assert meta["allow_dirty"] is True and meta["code_clean"] is False


def test_diff_hash_identifies_the_change(repo: Path) -> None:
    hashes = set()
    for text in ("x = 2\n", "x = 3\n"):
        (repo / "code.py").write_text(text)
        hashes.add(figures.code_state().diff_sha256)
    assert len(hashes) == 2


def test_cli_refuses_unclean_code_before_running(repo: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (repo / "code.py").write_text("x = 2\n")

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no experiment may run")

    monkeypatch.setattr(figures, "make", never)
    assert main(["figures", "model_stages", "--preset", "tiny", "--out", str(repo / "figures")]) == 2
    assert "--allow-dirty" in capsys.readouterr().err


def test_footer_names_preset_and_commit(repo: Path) -> None:
    out = _output()
    figures.save("model_stages", out, repo / "figures", "tiny")
    short = _git(repo, "rev-parse", "HEAD")[:7]
    texts = [t.get_text() for t in out.figure.texts]
    assert texts == [f"pipelab tiny preset · {short}"]
    figures.save("model_stages", out, repo / "figures", "tiny")  # saved again: still one footer
    assert len(out.figure.texts) == 1
    (repo / "code.py").write_text("x = 2\n")
    figures.save("model_stages", out, repo.parent / "elsewhere", "quick")
    assert [t.get_text() for t in out.figure.texts] == [f"pipelab quick preset · {short} + uncommitted changes"]


def test_unchanged_figures_redrawn_at_a_later_commit_are_byte_identical(repo: Path) -> None:
    """Every sidecar and footer carried the commit, so ``make figures`` on unchanged data rewrote every file
    (128 modified after one commit). The provenance now changes with the content only."""
    first = figures.save("model_stages", _output(), repo / "figures", "tiny")
    before = {p.name: p.read_bytes() for p in first}
    made_at = _git(repo, "rev-parse", "HEAD")
    _git(repo, "add", "figures")
    _git(repo, "commit", "-qm", "the figures")
    (repo / "code.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "a later commit")
    assert _git(repo, "rev-parse", "HEAD") != made_at
    again = figures.save("model_stages", _output(), repo / "figures", "tiny")
    assert {p.name: p.read_bytes() for p in again} == before
    assert json.loads(before["model_stages.json"])["commit"] == made_at
    assert _git(repo, "status", "--porcelain") == ""


def test_changed_content_records_the_commit_that_made_it(repo: Path) -> None:
    figures.save("model_stages", _output(), repo / "figures", "tiny")
    (repo / "code.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "a later commit")
    head = _git(repo, "rev-parse", "HEAD")
    out = _output()
    out.figure.axes[0].set_title("changed")  # the pixels differ
    figures.save("model_stages", out, repo / "figures", "tiny")
    meta = json.loads((repo / "figures" / "model_stages.json").read_text())
    assert meta["commit"] == head and [t.get_text() for t in out.figure.texts] == [f"pipelab tiny preset · {head[:7]}"]
    figures.save("model_stages", _output(), repo / "figures", "quick")  # another preset: other content
    assert json.loads((repo / "figures" / "model_stages.json").read_text())["preset"] == "quick"


def test_a_clean_redraw_replaces_the_provenance_of_unclean_code(repo: Path, tmp_path: Path) -> None:
    (repo / "code.py").write_text("x = 2\n")
    figures.save("model_stages", _output(), tmp_path / "out", "tiny")
    assert json.loads((tmp_path / "out" / "model_stages.json").read_text())["code_clean"] is False
    _git(repo, "commit", "-qam", "the change")
    figures.save("model_stages", _output(), tmp_path / "out", "tiny")  # same content, now from a commit
    meta = json.loads((tmp_path / "out" / "model_stages.json").read_text())
    assert meta["code_clean"] is True and meta["commit"] == _git(repo, "rev-parse", "HEAD")


def test_unpicklable_result_is_returned_not_lost(tmp_path: Path) -> None:
    with pytest.warns(CacheWarning, match="cannot be pickled"):
        out = cached("exp", Small(1), lambda c: {"fn": lambda: 1}, cache=ResultCache(tmp_path, version="1"))
    assert out["fn"]() == 1


def test_output_directory_inside_the_checkout_does_not_make_later_figures_unclean(repo: Path) -> None:
    for _ in range(2):  # the second figure sees the first one's untracked files under out/
        figures.save("model_stages", _output(), repo / "out", "tiny")
        assert json.loads((repo / "out" / "model_stages.json").read_text())["code_clean"] is True


def test_output_directory_holding_code_is_not_excluded(repo: Path) -> None:
    (repo / "src").mkdir()
    (repo / "src" / "m.py").write_text("x = 1\n")
    _git(repo, "add", "src")
    _git(repo, "commit", "-qm", "src")
    (repo / "src" / "m.py").write_text("x = 2\n")
    figures.save("model_stages", _output(), repo / "src", "tiny")  # --out src: its code is still looked at
    assert json.loads((repo / "src" / "model_stages.json").read_text())["code_clean"] is False


# ------------------------------------------------------------------------------- figure files


def _figure(values: list[float]) -> figures.FigureOutput:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot(values)
    return figures.FigureOutput(fig, config={"values": values}, tables={"csv": "x\n" + "\n".join(map(str, values))})


def test_a_failed_redraw_keeps_the_previous_figure_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """savefig wrote straight into NAME.png and NAME.pdf: a redraw failing in the PDF left a new PNG beside a
    truncated PDF and the old sidecar. Every file now goes through a temporary, all renamed once all are
    written, the sidecar last."""
    spec = figures.FigureSpec("atomic_probe", lambda preset, progress=False: _figure([]), "probe", __name__)
    monkeypatch.setitem(figures._REGISTRY, "atomic_probe", spec)
    first = figures.save("atomic_probe", _figure([1.0, 2.0]), tmp_path, "tiny")
    before = {p.name: p.read_bytes() for p in first}
    assert sorted(before) == ["atomic_probe.csv", "atomic_probe.json", "atomic_probe.pdf", "atomic_probe.png"]

    redraw = _figure([3.0, 1.0, 2.0])
    savefig = redraw.figure.savefig

    def failing(target: Any, **kw: Any) -> None:
        if kw.get("format") == "pdf" or str(target).endswith(".pdf"):
            if hasattr(target, "write"):
                target.write(b"%PDF-1.4 partial")
            else:
                Path(target).write_bytes(b"%PDF-1.4 partial")
            raise OSError(28, "No space left on device")
        savefig(target, **kw)

    monkeypatch.setattr(redraw.figure, "savefig", failing)
    with pytest.raises(OSError, match="No space left"):
        figures.save("atomic_probe", redraw, tmp_path, "tiny")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing replaced, no temporary left
    assert figures.save("atomic_probe", _figure([3.0, 1.0, 2.0]), tmp_path, "tiny") == first
    assert (tmp_path / "atomic_probe.png").read_bytes() != before["atomic_probe.png"]


# ------------------------------------------------------------------------ concurrent processes

_SHARED_SWEEP = """
import os, sys, time
from pipelab.studies.cache import ResultCache, run_sweep, cached
log = sys.argv[1]

def work(c):
    n = c["n"]
    with open(os.path.join(log, f"{n}-{os.getpid()}"), "w"):
        pass
    time.sleep(0.4)
    return n * n

cache = ResultCache(sys.argv[2], version="1")
open(os.path.join(sys.argv[2] + "-ready", str(os.getpid())), "w").close()
while len(os.listdir(sys.argv[2] + "-ready")) < 2:  # both processes start the sweep together
    time.sleep(0.05)
assert run_sweep("shared", [{"n": n} for n in range(6)], work, cache=cache) == [n * n for n in range(6)]
assert cached("single", {"n": 7}, work, cache=cache) == 49
"""


@pytest.mark.slow
def test_two_processes_sharing_a_sweep_compute_each_run_once(tmp_path: Path) -> None:
    """Two figures drawn side by side that need the same runs both computed every one of them (twice the work on a
    2-core CPU, for the figures of one sweep). Each run is now claimed first: the other process leaves it, computes
    the rest, and loads it once stored."""
    log = tmp_path / "calls"
    log.mkdir()
    (tmp_path / "cache-ready").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _SHARED_SWEEP, str(log), str(tmp_path / "cache")],
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    calls = sorted(p.name for p in log.iterdir())
    by_config = {n: [c for c in calls if c.split("-")[0] == str(n)] for n in (*range(6), 7)}
    assert all(len(c) == 1 for c in by_config.values()), by_config
    assert len({c.split("-")[1] for c in calls}) == 2, "one process computed everything: the work was not shared"
    assert not list((tmp_path / "cache").rglob("*.lock"))
