"""Presets, config hashing and the result cache (hits, corruption, resume, version salt, code hash)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from pipelab.studies import cache as cache_module
from pipelab.studies import learning_curves
from pipelab.studies.cache import NotCachedError, ResultCache, cached, code_hash, run_sweep
from pipelab.studies.config import config_hash, config_to_dict, from_preset, resolve_preset


@dataclass(frozen=True)
class Inner:
    lr: float = 0.1
    dtype: torch.dtype = torch.float64


@dataclass(frozen=True)
class Cfg:
    steps: int = 3
    inner: Inner = field(default_factory=Inner)
    tags: tuple[str, ...] = ("a",)


def test_resolve_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELAB_PRESET", raising=False)
    assert resolve_preset() == "quick"
    monkeypatch.setenv("PIPELAB_PRESET", "tiny")
    assert resolve_preset() == "tiny" and resolve_preset("paper") == "paper"
    monkeypatch.setenv("PIPELAB_PRESET", "huge")
    with pytest.raises(ValueError, match=r"\$PIPELAB_PRESET='huge'.*tiny, quick, study, paper"):
        resolve_preset()
    with pytest.raises(ValueError, match="no config for preset 'paper'"):
        from_preset({"tiny": 1, "quick": 2}, "paper")


def test_config_hash_is_stable_and_sensitive() -> None:
    assert config_hash(Cfg()) == config_hash(Cfg())
    assert config_hash(Cfg()) != config_hash(Cfg(inner=Inner(lr=0.2)))
    assert config_hash(Cfg()) != config_hash(Cfg(inner=Inner(dtype=torch.float32)))
    assert config_hash(Cfg()) != config_hash(Cfg(), salt="0.2.0")
    d = config_to_dict(Cfg())
    assert d["inner"]["dtype"] == "torch.float64" and d["__type__"].endswith("Cfg")
    with pytest.raises(TypeError):
        config_to_dict(42)


def test_cache_hit_and_version_salt(tmp_path: Path) -> None:
    calls = []

    def fn(cfg: Cfg) -> dict:
        calls.append(cfg)
        return {"loss": torch.arange(cfg.steps, dtype=torch.float64)}

    cache = ResultCache(tmp_path, version="1")
    a = cached("exp", Cfg(), fn, cache=cache)
    b = cached("exp", Cfg(), fn, cache=cache)
    assert len(calls) == 1 and torch.equal(a["loss"], b["loss"])
    cached("exp", Cfg(), fn, cache=ResultCache(tmp_path, version="2"))
    assert len(calls) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_entry_is_recomputed(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    cache = ResultCache(tmp_path, version="1")

    def fn(c: Cfg) -> list[int]:
        return [1, 2, 3]

    cached("exp", Cfg(), fn, cache=cache)
    path = cache.path("exp", Cfg(), fn)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-3] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    assert cache.load("exp", Cfg(), fn) == (False, None)
    assert "corrupt cache entry" in caplog.text
    assert cached("exp", Cfg(), lambda c: [4], cache=cache) == [4]  # same module: same code hash, same entry
    assert cache.load("exp", Cfg(), fn) == (True, [4])


def test_interrupted_sweep_resumes(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path, version="1")
    configs = [Cfg(steps=s) for s in range(5)]
    calls: list[int] = []

    def fn(cfg: Cfg) -> int:
        if cfg.steps == 3 and not calls.count(-1):
            calls.append(-1)
            raise KeyboardInterrupt
        calls.append(cfg.steps)
        return cfg.steps**2

    with pytest.raises(KeyboardInterrupt):
        run_sweep("sweep", configs, fn, cache=cache)
    assert calls == [0, 1, 2, -1]
    assert run_sweep("sweep", configs, fn, cache=cache, progress=True) == [0, 1, 4, 9, 16]
    assert calls == [0, 1, 2, -1, 3, 4]  # finished runs were not redone
    assert not list(tmp_path.rglob(".tmp-*"))


def test_drawing_from_the_cache_only_loads_what_is_there_and_computes_nothing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ResultCache(tmp_path, version="1")
    calls: list[int] = []

    def fn(cfg: Cfg) -> int:
        calls.append(cfg.steps)
        return cfg.steps**2

    # results computed elsewhere (on a GPU, say): stored under fn's key, as a sweep there stores them
    for s in (0, 1):
        cache.store("sweep", Cfg(steps=s), s**2, fn)
    monkeypatch.setenv("PIPELAB_CACHED", "1")
    assert run_sweep("sweep", [Cfg(steps=0), Cfg(steps=1)], fn, cache=cache) == [0, 1]
    assert cached("sweep", Cfg(steps=1), fn, cache=cache) == 1
    with pytest.raises(NotCachedError, match=r"1 of 3 sweep result\(s\) are not in the result cache .* the first: "
                                             r"Cfg\(steps=2"):
        run_sweep("sweep", [Cfg(steps=s) for s in range(3)], fn, cache=cache)
    with pytest.raises(NotCachedError, match="steps=5"):
        cached("sweep", Cfg(steps=5), fn, cache=cache)
    assert calls == []  # nothing computed, not even the sweep's cached part again
    monkeypatch.setenv("PIPELAB_CACHED", "0")
    assert run_sweep("sweep", [Cfg(steps=s) for s in range(3)], fn, cache=cache) == [0, 1, 4]
    assert calls == [2]


def test_cache_can_be_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_CACHE", "off")
    cache = ResultCache()
    assert not cache.enabled
    calls = []
    for _ in range(2):
        cached("exp", Cfg(), lambda c: calls.append(1), cache=cache)
    assert len(calls) == 2


@pytest.fixture
def edits(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, bytes]]:
    """Simulated source edits: ``edits[module] = b"..."`` appends bytes to that module's hashed source."""
    added: dict[str, bytes] = {}
    real = cache_module._read_source
    monkeypatch.setattr(cache_module, "_read_source", lambda name: real(name) + added.get(name, b""))
    cache_module._clear_code_hashes()
    yield added
    cache_module._clear_code_hashes()


def _edit(edits: dict[str, bytes], module: str) -> None:
    edits[module] = b"\n# an edit\n"
    cache_module._clear_code_hashes()


@pytest.mark.parametrize("module, changes", [
    ("pipelab.studies.learning_curves", True),   # defines the experiment
    ("pipelab.studies.settings", True),  # the arms' tasks, optimizer settings and schedules
    ("pipelab.policies", True),          # imported by it through the emulator
    ("pipelab.schedules.builders", True),
    ("pipelab.studies.figures.learning_curves", False),  # the figure module: colours, labels
    ("pipelab.stability.methods", False),
    ("pipelab.studies.cache", False),        # imported by it, but computing no result (cache.PLUMBING)
    ("pipelab.studies.environment", False),
    ("pipelab.studies.progress", False),
])
def test_code_hash_follows_the_modules_an_experiment_imports(edits: dict[str, bytes], module: str,
                                                             changes: bool) -> None:
    before = code_hash(learning_curves.run)
    _edit(edits, module)
    assert (code_hash(learning_curves.run) != before) is changes


def _experiment(cfg: Cfg) -> int:
    return cfg.steps * 10


def test_editing_used_code_invalidates_the_cache_but_unrelated_code_does_not(tmp_path: Path,
                                                                             edits: dict[str, bytes]) -> None:
    cache = ResultCache(tmp_path, version="1")
    calls: list[int] = []

    def fn(cfg: Cfg) -> int:
        calls.append(cfg.steps)
        return _experiment(cfg)

    assert cached("exp", Cfg(), fn, cache=cache) == 30 and len(calls) == 1
    _edit(edits, "pipelab.studies.figures.stability")  # not imported by this module: entry still valid
    assert cached("exp", Cfg(), fn, cache=cache) == 30 and len(calls) == 1
    _edit(edits, "pipelab.studies.config")  # imported by this test module: recomputed
    assert cached("exp", Cfg(), fn, cache=cache) == 30 and len(calls) == 2
    _edit(edits, __name__)  # the module defining the experiment itself
    assert cached("exp", Cfg(), fn, cache=cache) == 30 and len(calls) == 3
    assert cached("exp", Cfg(), fn, cache=cache) == 30 and len(calls) == 3


def test_code_hash_unwraps_and_falls_back_without_a_source_file() -> None:
    import functools

    assert code_hash(functools.partial(learning_curves.run)) == code_hash(learning_curves.run)
    namespace: dict = {"__name__": "not_a_module_with_a_file"}
    exec("def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 2\n", namespace)  # noqa: S102 (no source file)
    assert len(code_hash(namespace["f"])) == 64 and code_hash(namespace["f"]) != code_hash(namespace["g"])
