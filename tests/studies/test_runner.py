"""The figure runner: the forecast behind its ETA, expected costs, timings.csv, budgets, interrupts and resuming."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelab.studies import figures, runner
from pipelab.studies.figures import FigureOutput, register
from pipelab.studies.runner import DEFAULT_COST, TIMINGS, TOTAL, expected_costs, forecast, read_timings, run_figures

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("queued", "running", "workers", "expected"), [
    ([], [], 2, 0.0),
    ([10.0], [], 2, 10.0),
    ([10.0, 10.0, 10.0], [], 2, 20.0),                  # two at once, then the third
    ([60.0, 30.0, 30.0], [10.0], 2, 70.0),              # 60 on the idle worker, 30 + 30 after the running 10
    ([5.0, 5.0], [100.0, 1.0], 2, 100.0),               # both queued go to the worker freeing after 1 s
    ([2.0, 3.0, 2.0, 3.0, 2.0], [], 2, 7.0),            # longest first: 3 | 3, 5 | 3, 5 | 5, 7 | 5
    ([4.0, 4.0], [], 1, 8.0),
])
def test_forecast_is_list_scheduling_longest_first(queued, running, workers, expected) -> None:
    assert forecast(queued, running, workers) == expected


def test_forecast_does_not_depend_on_the_pace_so_far() -> None:
    """Issue 30's ETA swung from 11 min to 6 h 38 min as quick figures were followed by a slow one: an average of the
    figures so far. The forecast reads only the expected costs of what is left."""
    costs = [2.0] * 20 + [300.0]
    assert forecast(costs, [], 2) == 300.0
    assert forecast([300.0], [], 2) == forecast(costs[10:], [], 2) == 300.0


def _spec(name: str, budget: float | None) -> figures.FigureSpec:
    return figures.FigureSpec(name, lambda preset, *, progress=False: FigureOutput(None), "", "m",
                              budgets=(("quick", budget),) if budget else ())


def test_expected_cost_is_the_last_measured_time_else_the_budget_else_a_default() -> None:
    specs = [_spec("a", 40.0), _spec("b", 50.0), _spec("c", None)]
    rows = [{"figure": "a", "seconds": "12.5", "preset": "quick"}, {"figure": "b", "seconds": "7", "preset": "tiny"},
            {"figure": TOTAL, "seconds": "99", "preset": "quick"},
            {"figure": "c", "seconds": "oops", "preset": "quick"}]
    assert expected_costs(specs, "quick", rows) == {"a": 12.5, "b": 50.0, "c": DEFAULT_COST}


def test_every_figure_declares_tiny_and_quick_budgets_and_quick_fits_ten_minutes_on_two_cores() -> None:
    specs = figures.available()
    missing = [s.name for s in specs
               if s.budget("tiny") is None or (s.runs_under("quick") and s.budget("quick") is None)]
    assert not missing, f"figures without a tiny or quick budget: {missing}"
    quick = [s.budget("quick") or 0.0 for s in specs if s.runs_under("quick")]
    assert forecast(quick, [], 2) <= 600.0


def test_register_refuses_a_bad_budget() -> None:
    with pytest.raises(ValueError, match="unknown preset 'fast'"):
        register("x_budget_test", "", budget={"fast": 1.0})
    with pytest.raises(ValueError, match=r"budget\['tiny'\].*> 0"):
        register("x_budget_test", "", budget={"tiny": 0})


def test_timings_csv_keeps_other_rows_warns_over_budget_and_records_the_total(tmp_path: Path, monkeypatch,
                                                                              capsys) -> None:
    calls: list[str] = []

    def slow(preset: str, *, progress: bool = False) -> FigureOutput:
        import matplotlib.pyplot as plt

        calls.append(preset)
        time.sleep(0.3)
        return FigureOutput(plt.figure())

    register("x_runner_slow", "a figure slower than its budget", budget={"tiny": 0.1, "quick": 0.1})(slow)
    try:
        with open(tmp_path / TIMINGS, "w") as fh:
            fh.write("figure,seconds,preset,cores,workers,load_1m,commit,finished\n"  # an older file: no cpu_seconds
                     "other,5.0,tiny,2,2,0.1,abc,x\nx_runner_slow,9.0,quick,2,2,0.1,abc,x\n")
        assert run_figures(["x_runner_slow"], "tiny", tmp_path, workers=1) == 0
    finally:
        figures._REGISTRY.pop("x_runner_slow")
    err = capsys.readouterr().err
    assert re.search(r"x_runner_slow took \d+ s, more than 1.5 times its tiny budget of 0.1 s", err)
    assert re.search(r"1 figure\(s\) in 0:\d\d .*-> .*timings.csv", err)
    rows = {(r["figure"], r["preset"]): r for r in read_timings(tmp_path / TIMINGS)}
    assert set(rows) == {("other", "tiny"), ("x_runner_slow", "quick"), ("x_runner_slow", "tiny"), (TOTAL, "tiny")}
    assert float(rows[("x_runner_slow", "tiny")]["seconds"]) >= 0.3
    assert rows[("x_runner_slow", "quick")]["seconds"] == "9.0"  # another preset's measurement is kept
    assert rows[("x_runner_slow", "tiny")]["cores"] == str(runner.default_workers())
    assert list(csv.reader(open(tmp_path / TIMINGS)))[0] == list(runner.FIELDS)


def test_a_failing_figure_is_reported_and_the_others_are_drawn(tmp_path: Path, capsys) -> None:
    def broken(preset: str, *, progress: bool = False) -> FigureOutput:
        raise RuntimeError("boom")

    register("x_runner_broken", "fails", budget={"tiny": 1.0, "quick": 1.0})(broken)
    try:
        assert run_figures(["x_runner_broken", "model_stages"], "tiny", tmp_path, workers=1) == 1
    finally:
        figures._REGISTRY.pop("x_runner_broken")
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and "1 figure(s) failed: x_runner_broken" in err
    assert (tmp_path / "model_stages.png").exists()


@pytest.mark.slow
def test_figures_that_spawn_ranks_are_drawn_by_the_workers(tmp_path: Path) -> None:
    """Probe: runtime_timeline runs gloo ranks, spawned processes; under the worker processes (once daemonic, which
    may not have children) it failed with "daemonic processes are not allowed to have children"."""
    assert run_figures(["runtime_timeline", "model_stages"], "tiny", tmp_path, workers=2) == 0
    assert (tmp_path / "runtime_timeline.png").exists() and (tmp_path / "model_stages.png").exists()


def _processes_with(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (the run's private cache directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists() or sys.platform == "win32",
                    reason="finds the workers through /proc")
def test_ctrl_c_stops_the_workers_promptly_and_a_rerun_resumes_from_the_cache(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    env = {**os.environ, "PIPELAB_CACHE": str(cache), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "pipelab", "figures", "--preset", "tiny", "--out", str(out), "--workers", "2",
           "learning_curves", "accuracy_gap_vs_depth", "prediction_ratio_summary"]
    # Ctrl-C's default action, restored: a suite started in the background by a non-interactive shell (`make test &`)
    # inherits SIGINT ignored, which Python then leaves ignored: the runner never saw the signal and drew every figure
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    runs = cache / "learning_curves"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(runs.glob("*.pkl"))) < 2 and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, f"finished before it could be interrupted:\n{proc.stdout.read() if proc.stdout else ''}"
    assert len(_processes_with(str(cache))) >= 3  # the runner and its two workers
    limit = 10 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))  # 10 s on an idle machine; a shared one is
    proc.send_signal(signal.SIGINT)                                      # slower by its load per core
    t0 = time.monotonic()
    # the wait is bounded more loosely than the limit, so that a slow stop fails the limit's assertion, with its
    # time, instead of a timeout (under `make test` beside other work a fixed 30 s wait fired first)
    output, _ = proc.communicate(timeout=max(30.0, 3 * limit))
    assert time.monotonic() - t0 < limit, f"Ctrl-C took {time.monotonic() - t0:.0f} s, more than {limit:.0f} s"
    assert proc.returncode == 130, output
    assert "interrupted" in output and "resumes" in output
    time.sleep(0.5)
    assert _processes_with(str(cache)) == [], "worker processes outlived the interrupted runner"
    kept = {p: p.stat().st_mtime_ns for p in cache.rglob("*.pkl")}
    assert len(kept) >= 2 and not list(cache.rglob("*.lock"))

    rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    after = {p: p.stat().st_mtime_ns for p in cache.rglob("*.pkl")}
    assert all(after[p] == t for p, t in kept.items()), "the rerun recomputed runs the interrupted one had finished"
    assert len(after) > len(kept)
    for name in ("learning_curves", "accuracy_gap_vs_depth", "prediction_ratio_summary"):
        assert (out / f"{name}.png").exists()
    assert {r["figure"] for r in read_timings(out / TIMINGS)} >= {"learning_curves", TOTAL}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc; PR_SET_PDEATHSIG")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_terminated_or_killed_runner_leaves_no_worker_running(tmp_path: Path, sig: int) -> None:
    """`timeout` (SIGTERM) killed the runner at once and its workers, each leading its own process group, ran on;
    after SIGKILL, which no handler sees, the workers end too (they get SIGTERM when their parent dies)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PIPELAB_CACHE": str(cache), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "pipelab", "figures", "--preset", "tiny", "--out", str(tmp_path / "out"),
           "--workers", "2", "learning_curves", "accuracy_gap_vs_depth"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(cache.rglob("*.lock")) and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, f"finished before it could be stopped:\n{proc.stdout.read() if proc.stdout else ''}"
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130 and "resumes" in output, output
    deadline = time.monotonic() + 30
    while _processes_with(str(cache)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(str(cache)) == [], "worker processes outlived the runner"


def _git_repo(tmp_path: Path) -> Path:
    for args in (["init", "-q"], ["config", "user.email", "t@example.org"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True)
    out = tmp_path / "figures"
    out.mkdir()
    (out / "a.png").write_bytes(b"png")
    (out / TIMINGS).write_text("figure,seconds\na,1.0\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-qm", "figures"], check=True)
    return out


def test_a_redraw_of_unchanged_figures_keeps_the_committed_timings(tmp_path: Path) -> None:
    """`make figures` twice leaves `git status` clean: when no other output changed, timings.csv is put back."""
    out = _git_repo(tmp_path)
    (out / TIMINGS).write_text("figure,seconds\na,2.0\n")
    assert runner._keep_committed_timings(out)
    assert (out / TIMINGS).read_text() == "figure,seconds\na,1.0\n"
    # a changed figure: the new timings are the record of the run that drew it
    (out / "a.png").write_bytes(b"new png")
    (out / TIMINGS).write_text("figure,seconds\na,3.0\n")
    assert not runner._keep_committed_timings(out)
    assert (out / TIMINGS).read_text() == "figure,seconds\na,3.0\n"
    # outside a checkout, or an untracked timings.csv: nothing to keep
    elsewhere = tmp_path.parent / f"{tmp_path.name}-plain"
    elsewhere.mkdir()
    (elsewhere / TIMINGS).write_text("x")
    assert not runner._keep_committed_timings(elsewhere)


def test_measured_figures_already_drawn_are_kept_by_a_whole_preset_run(tmp_path: Path) -> None:
    """Figures of measured wall-clock times differ on every run: redrawing the preset keeps the ones in --out, so a
    second `make figures` leaves `git status` clean (issue 30); the others, and those not drawn yet, are drawn."""
    from pipelab.studies.cli import measured_in

    measured = sorted(s.name for s in figures.available() if s.measured)
    assert {"runtime_timeline", "links_timeline", "schedules_rahimi_measured", "time_to_accuracy"} <= set(measured)
    names = [s.name for s in figures.available() if s.runs_under("quick")]
    assert measured_in(names, tmp_path) == []
    for n in (*measured[:2], "model_stages"):
        (tmp_path / f"{n}.json").write_text("{}")
    assert measured_in(names, tmp_path) == measured[:2]


def test_a_sweep_inside_the_runner_writes_log_lines_when_stderr_is_a_file(monkeypatch, tmp_path) -> None:
    """On a lent GPU the paper task's log said only "interrupted after 7:21" when its command was stopped: inside the
    runner a sweep's bar was disabled whenever standard error was not a terminal. It now writes plain lines: the
    runs a resumed sweep found, one line a minute while runs finish, and the last."""
    import io

    from pipelab.studies import progress
    from pipelab.studies.cache import ResultCache, run_sweep

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    cache = ResultCache(tmp_path)
    progress.nest(1)
    try:
        assert run_sweep("square", [{"x": 1}, {"x": 2}], _square, cache=cache, progress=True, desc="task") == [1, 4]
        clock = iter([0.0, 30.0, 61.0, 62.0])  # start, then three runs: a line at 61 s and at the last
        monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
        configs = [{"x": x} for x in range(1, 6)]
        assert run_sweep("square", configs, _square, cache=cache, progress=True, desc="task") == [1, 4, 9, 16, 25]
    finally:
        progress.nest(None)
    lines = log.getvalue().splitlines()
    assert lines == ["  task: 0/2 runs · 0:00 elapsed", "  task: 2/2 runs · 0:00 elapsed",
                     "  task: 2/5 runs · 0:00 elapsed", "  task: 4/5 runs · 1:01 elapsed",
                     "  task: 5/5 runs · 1:02 elapsed"]


def _square(config: dict) -> int:
    return config["x"] ** 2
