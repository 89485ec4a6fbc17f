"""Shared test set-up: isolated result cache, headless matplotlib, devices to test on."""

from __future__ import annotations

import os
from collections.abc import Iterator

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest
import torch

from pipelab.threads import torch_threads


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test session gets its own result cache, so tests never read a user's stale results."""
    os.environ["PIPELAB_CACHE"] = str(tmp_path_factory.mktemp("pipelab-cache"))


@pytest.fixture(autouse=True, scope="session")
def _threads() -> Iterator[None]:
    # Under pytest-xdist each worker is a process; one intra-op thread each avoids oversubscribing CI's cores.
    with torch_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else None):
        yield


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """CPU always; CUDA as well when a GPU is present (CI has none, so those cases are not collected there)."""
    return torch.device(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cases of the ``device`` fixture on CUDA are marked ``gpu``; ``gpu`` tests are skipped without a GPU."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and str(callspec.params.get("device")) == "cuda":
            item.add_marker(pytest.mark.gpu)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
