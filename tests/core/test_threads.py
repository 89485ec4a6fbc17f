"""The scoped thread count: set for the body, restored after it, also when the body raises."""

from __future__ import annotations

import pytest
import torch

from pipelab.threads import torch_threads


def test_sets_the_count_for_the_body_and_restores_it() -> None:
    before = torch.get_num_threads()
    inner = 2 if before == 1 else 1
    with torch_threads(inner):
        assert torch.get_num_threads() == inner
        with torch_threads(before):  # nested scopes restore in order
            assert torch.get_num_threads() == before
        assert torch.get_num_threads() == inner
    assert torch.get_num_threads() == before


def test_restores_the_count_when_the_body_raises() -> None:
    before = torch.get_num_threads()
    inner = 2 if before == 1 else 1
    with pytest.raises(RuntimeError, match="boom"):
        with torch_threads(inner):
            assert torch.get_num_threads() == inner
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_none_leaves_the_count_alone() -> None:
    before = torch.get_num_threads()
    with torch_threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("n, exc", [(0, ValueError), (-3, ValueError), (1.5, TypeError), ("2", TypeError),
                                    (True, TypeError)])
def test_bad_counts_are_refused_before_anything_changes(n: object, exc: type[Exception]) -> None:
    before = torch.get_num_threads()
    with pytest.raises(exc, match="threads"):
        with torch_threads(n):  # type: ignore[arg-type]
            pass
    assert torch.get_num_threads() == before


def test_library_runs_leave_the_callers_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """learning_curves.run sets one thread for its CPU run only; the caller's count survives, even on error."""
    from pipelab.studies import learning_curves as lc

    before = torch.get_num_threads()
    inner = 2 if before == 1 else 1
    seen = []

    def fake_run(cfg: object) -> dict:
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop")

    monkeypatch.setattr(lc, "_run", fake_run)
    cfg = lc.RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=0)
    with torch_threads(inner):
        with pytest.raises(RuntimeError, match="stop"):
            lc.run(cfg)
        assert torch.get_num_threads() == inner
    assert seen == [1] and torch.get_num_threads() == before
