"""``benchmarks/_harness.py``: alternated rounds and the median of per-round ratios, on a fake clock."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._harness import (  # noqa: E402
    CACHING_MALLOC,
    CLOCKS,
    Side,
    add_clock_argument,
    add_malloc_argument,
    add_thread_argument,
    alternate,
    caching_malloc_env,
    clock_for,
    header,
    host_speed,
    paired_ratio,
)


class FakeClock:
    """A clock that only the sides move: each call of a side advances it by that side's next duration."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []
        self.syncs = 0

    def __call__(self) -> float:
        return self.now

    def side(self, name: str, durations: list[float]) -> object:
        it = iter(durations)

        def run(*args: object) -> None:
            self.log.append(name)
            self.now += next(it)

        return run


def test_sides_alternate_round_by_round_and_the_ratio_is_the_median_of_per_round_ratios() -> None:
    clock = FakeClock()
    # a warm-up round (9.0, 9.0: not timed), then 5 rounds; in rounds 3 and 4 the machine is slower for both sides
    a = [9.0, 2.0, 4.5, 6.0, 8.0, 2.125]  # binary fractions: the fake clock's sums are exact
    b = [9.0, 1.0, 1.0, 2.0, 2.0, 1.0]
    loads = iter([0.5, 1.5, 2.5, 3.5, 4.5])
    r = alternate({"a": clock.side("a", a), "b": clock.side("b", b)}, rounds=5, warmup=1, clock=clock,
                  load=lambda: next(loads))
    assert clock.log == ["a", "b", "b", "a"] * 3  # A B, B A, ...: warm-up round included
    assert r.seconds == {"a": a[1:], "b": b[1:]}
    assert r.loads == [0.5, 1.5, 2.5, 3.5, 4.5]
    ratio = r.ratio("a", "b")
    assert ratio.values == (2.0, 4.5, 3.0, 4.0, 2.125)
    assert ratio.median == 3.0  # the per-round median; the ratio of medians would be 4.5 / 1, of sums 22.625 / 7
    assert (ratio.q1, ratio.q3) == (2.125, 4.0)
    assert ratio.load == 2.5
    assert r.median("a") == 4.5 and r.median("b") == 1.0
    assert r.ratio("b", "a").median == pytest.approx(1 / 3.0)


def test_several_sides_summed_within_a_round_and_set_up_untimed() -> None:
    clock = FakeClock()
    made = []

    def setup() -> str:
        clock.now += 100.0  # set-up time must not count
        made.append(len(made))
        return "model"

    def syncing() -> None:
        clock.syncs += 1

    sides = {"emu": Side(clock.side("emu", [4.0, 6.0]), setup=setup), "plain": clock.side("plain", [2.0, 2.0]),
             "extra": clock.side("extra", [1.0, 1.0])}
    r = alternate(sides, rounds=2, warmup=0, clock=clock, sync=syncing, load=lambda: 0.0)
    assert clock.log == ["emu", "plain", "extra", "extra", "plain", "emu"] and made == [0, 1]
    assert clock.syncs == 2 * 3 * 2
    assert r.seconds["emu"] == [4.0, 6.0]
    assert r.ratio("emu", ["plain", "extra"]).values == (4.0 / 3.0, 2.0)
    with pytest.raises(ValueError, match="unknown side"):
        r.ratio("emu", "nope")


@pytest.mark.parametrize("kwargs, match", [(dict(rounds=0), "rounds"), (dict(rounds=2, warmup=-1), "warmup"),
                                           (dict(rounds=True), "rounds")])
def test_bad_rounds_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        alternate({"a": lambda: None}, **kwargs)
    with pytest.raises(ValueError, match="sides"):
        alternate({}, rounds=1)


def test_paired_ratio_of_one_round_and_mismatched_rounds() -> None:
    one = paired_ratio([3.0], [2.0], [1.0], scale=2.0)
    assert (one.median, one.q1, one.q3, one.load) == (3.0, 3.0, 3.0, 1.0)
    with pytest.raises(ValueError, match="same number"):
        paired_ratio([1.0, 2.0], [1.0])
    assert "IQR" in str(one)


def test_one_thread_by_default_and_the_header_names_what_the_numbers_depend_on() -> None:
    ap = argparse.ArgumentParser()
    add_thread_argument(ap)
    add_clock_argument(ap)
    assert ap.parse_args([]).threads == 1 and ap.parse_args(["--threads", "2"]).threads == 2
    assert CLOCKS[ap.parse_args([]).clock] is time.perf_counter
    assert CLOCKS[ap.parse_args(["--clock", "cpu"]).clock] is time.process_time
    assert clock_for("cpu", torch.device("cpu")) is time.process_time
    assert clock_for("cpu", torch.device("cuda")) is time.perf_counter  # CUDA work is not this process's CPU time
    text = header("bench")
    assert text.startswith("bench — torch " + torch.__version__)
    assert "intra-op thread" in text and "allocator: " in text and " cores, load average " in text
    assert "malloc" in text
    copy_gbs, mm_gflops = host_speed(reps=1)
    assert copy_gbs > 0 and mm_gflops > 0 and ", host speed: copy " in text and " GFLOP/s" in text


def test_each_timed_call_counts_its_minor_page_faults() -> None:
    """A side that touches fresh memory faults it in a page at a time; one that allocates nothing does not: the
    count the emulator benchmark prints beside a ratio (malloc's trimmed heap, faulted in again, was the rest of
    the emulator's gap)."""
    import mmap

    def touch() -> None:
        m = mmap.mmap(-1, 8 << 20)  # anonymous: every page faults on its first write
        for off in range(0, 8 << 20, mmap.PAGESIZE):
            m[off] = 1
        m.close()

    r = alternate({"touch": touch, "idle": lambda: None}, rounds=3, warmup=1)
    assert all(f >= (8 << 20) // mmap.PAGESIZE for f in r.faults["touch"]), r.faults
    assert r.median_faults("idle") < 64
    assert r.median_faults("touch") >= 2048


def test_benchmarks_rerun_under_the_caching_malloc_unless_told_or_already_there() -> None:
    env = {"PATH": "/bin", "MALLOC_ARENA_MAX": "2"}
    rerun = caching_malloc_env(["benchmarks/simulator.py", "--repeat", "3"], env, "glibc")
    assert rerun == {**env, **CACHING_MALLOC}  # the caller's environment kept, the settings added
    assert caching_malloc_env(["simulator.py", "--system-malloc"], env, "glibc") is None
    assert caching_malloc_env(["simulator.py"], rerun, "glibc") is None  # the re-run itself runs as it is
    assert caching_malloc_env(["simulator.py"], env, "") is None  # not glibc: nothing to set
    # a setting of the user's own that differs is overridden (the header then states the values used)
    assert caching_malloc_env(["simulator.py"], {**env, "MALLOC_TRIM_THRESHOLD_": "0"}, "glibc") == {**env,
                                                                                                 **CACHING_MALLOC}


def test_the_malloc_flag_parses() -> None:
    ap = argparse.ArgumentParser()
    add_malloc_argument(ap)
    assert ap.parse_args(["--system-malloc"]).system_malloc and not ap.parse_args([]).system_malloc
