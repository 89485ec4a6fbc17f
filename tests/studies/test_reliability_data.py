"""Reliability probes for obtaining and verifying data: truncated files, dead networks, deadlines, leftovers."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import io
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import probes
import pytest
from probes import Probe

from pipelab.studies import data
from pipelab.studies.cli import main
from pipelab.studies.data import FASHION_MNIST_FILES, DataError

URLOPEN = urllib.request.urlopen  # the real one (the fixture below replaces it by an offline stub)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the files a test writes exist; no real network; no waiting between retries."""
    monkeypatch.delenv("PIPELAB_DATA", raising=False)
    monkeypatch.setattr(data, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.setattr(data, "DOWNLOAD_DIR", tmp_path / "no-download", raising=False)  # raising=False: the
    monkeypatch.setattr(data, "_RETRY_BACKOFF_S", 0.0, raising=False)  # probes also run against older code
    monkeypatch.setattr("shutil.which", lambda name: None)  # no apt-get for the CLI

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("network unreachable")

    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    data._parsed_fashion_mnist.cache_clear()


def write_fake(root: Path, n_train: int = 12, n_test: int = 5) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    arrays = {"train_images": rng.integers(0, 256, (n_train, 28, 28)), "train_labels": rng.integers(0, 10, n_train),
              "test_images": rng.integers(0, 256, (n_test, 28, 28)), "test_labels": rng.integers(0, 10, n_test)}
    for key, stem in FASHION_MNIST_FILES.items():
        a = arrays[key]
        blob = bytes([0, 0, 8, a.ndim]) + struct.pack(">" + "i" * a.ndim, *a.shape) + a.astype(np.uint8).tobytes()
        (root / f"{stem}.gz").write_bytes(gzip.compress(blob))


def truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    return path


PROBES = [
    Probe("fetch-timeout-zero", lambda: data.fetch_fashion_mnist("/nonexistent", timeout=0), ValueError, "timeout"),
    Probe("fetch-retries-negative", lambda: data.fetch_fashion_mnist("/nonexistent", retries=-1), ValueError,
          "retries"),
    # impossible sizes were accepted: empty or sliced-from-the-end splits, NaN labels, raw numpy/torch errors
    Probe("digits-test-fraction-0", lambda: data.load_digits(test_fraction=0), ValueError,
          r"test_fraction must be a finite number > 0 and < 1, got 0"),
    Probe("digits-test-fraction-1.5", lambda: data.load_digits(test_fraction=1.5), ValueError, r"got 1\.5"),
    Probe("digits-test-fraction-negative", lambda: data.load_digits(test_fraction=-0.1), ValueError, "> 0 and < 1"),
    Probe("digits-test-fraction-empty-split", lambda: data.load_digits(test_fraction=1e-4), ValueError,
          r"holds out 0 of the 1797 examples, leaving a split empty"),
    Probe("digits-split-seed-negative", lambda: data.load_digits(split_seed=-1), ValueError, r"split_seed .* got -1"),
    Probe("subset-negative", lambda: data.teacher_student_regression(n_train=8, n_test=4).subset(-5), ValueError,
          r"n_train must be None or an int >= 0, got -5"),
    Probe("subset-float", lambda: data.teacher_student_regression(n_train=8, n_test=4).subset(None, 2.5), ValueError,
          r"n_test must be None or an int >= 0, got 2\.5"),
    Probe("teacher-d-in-0", lambda: data.teacher_student_regression(d_in=0), ValueError, r"d_in must be an int >= 1"),
    Probe("teacher-n-train-0", lambda: data.teacher_student_regression(n_train=0), ValueError, r"n_train .* got 0"),
    Probe("teacher-n-test-negative", lambda: data.teacher_student_regression(n_test=-1), ValueError,
          r"n_test must be an int >= 0, got -1"),
    Probe("teacher-hidden-0", lambda: data.teacher_student_classification(hidden=0), ValueError, "hidden must be"),
    Probe("teacher-d-out-0", lambda: data.teacher_student_regression(d_out=0), ValueError, "d_out must be"),
    Probe("teacher-noise-negative", lambda: data.teacher_student_regression(noise=-1.0), ValueError,
          r"noise must be a finite number >= 0, got -1\.0"),
    Probe("teacher-one-class", lambda: data.teacher_student_classification(num_classes=1), ValueError,
          r"num_classes must be an int >= 2, got 1"),
    Probe("teacher-temperature-0", lambda: data.teacher_student_classification(temperature=0.0), ValueError,
          r"temperature must be a finite number > 0"),
    Probe("teacher-temperature-negative", lambda: data.teacher_student_classification(temperature=-1.0), ValueError,
          "temperature"),
    Probe("mnist1d-too-few", lambda: data.load_mnist1d(num_samples=5), ValueError,
          r"num_samples must be an int >= 10, got 5"),
    Probe("mnist1d-seed-negative", lambda: data.load_mnist1d(seed=-1), ValueError, r"seed must be an int >= 0"),
    Probe("wordlang-seed-negative", lambda: data.wordlang_words(seed=-1), ValueError, r"seed must be an int >= 0"),
    Probe("encode-words-max-len-0", lambda: data.encode_words([], max_len=0), ValueError,
          r"max_len must be an int >= 1, got 0"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


@pytest.mark.parametrize("fetch", [False, True])
def test_cli_reports_truncated_files_with_their_path(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     fetch: bool) -> None:
    write_fake(tmp_path / "fm")
    bad = truncate(tmp_path / "fm" / "train-labels-idx1-ubyte.gz")
    assert main(["data", "--root", str(tmp_path / "fm")] + (["--fetch"] if fetch else [])) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "truncated" in err


def test_cli_verifies_intact_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_fake(tmp_path / "fm")
    assert main(["data", "--root", str(tmp_path / "fm")]) == 0
    assert "verified" in capsys.readouterr().out


def _serve(src: Path, monkeypatch: pytest.MonkeyPatch, fail_first: int = 0) -> list[str]:
    """Serve ``src``'s files as the official URLs, with matching checksums; the first calls may fail."""
    calls: list[str] = []
    monkeypatch.setattr(data, "FASHION_MNIST_MD5", {p.name: hashlib.md5(p.read_bytes()).hexdigest()
                                                     for p in src.iterdir()})

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        calls.append(url)
        if len(calls) <= fail_first:
            raise OSError("connection reset by peer")
        return io.BytesIO((src / url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr(data.urllib.request, "urlopen", urlopen)
    return calls


def test_download_retries_after_a_network_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_fake(tmp_path / "src")
    calls = _serve(tmp_path / "src", monkeypatch, fail_first=2)
    assert data.fetch_fashion_mnist(tmp_path / "dest") == tmp_path / "dest"
    assert len(calls) == 4 + 2
    assert not list((tmp_path / "dest").glob(".part-*"))


class Stalling(io.RawIOBase):
    """A response that trickles bytes forever (or breaks after ``fail_after`` reads)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.reads, self.fail_after = 0, fail_after

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise ConnectionResetError("connection reset by peer")
        if self.reads > 60:  # a finite end, so that code without a deadline fails instead of hanging
            return b""
        time.sleep(0.05)
        return b"x" * 100


def test_download_has_an_overall_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: Stalling())
    start = time.monotonic()
    with pytest.raises(DataError, match="deadline"):
        data.fetch_fashion_mnist(tmp_path / "dest", timeout=0.5)
    assert time.monotonic() - start < 2.0
    assert not list((tmp_path / "dest").glob(".part-*"))


class Trickling(http.server.BaseHTTPRequestHandler):
    """Promises a megabyte and sends one byte every 50 ms (for a minute at most): no single read ever waits
    long enough for a socket timeout, so only an overall deadline ends the transfer."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        end = time.monotonic() + 60
        with contextlib.suppress(OSError):
            while time.monotonic() < end:
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.timeout(30)
def test_a_trickling_server_does_not_extend_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read got bytes before its socket timeout and waited for 64 KiB: a transfer of 1 byte / 50 ms ran
    for hours past the deadline."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickling)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(data.urllib.request, "urlopen", URLOPEN)  # the real one, on this local server
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setattr(data, "FASHION_MNIST_URL", f"http://127.0.0.1:{server.server_address[1]}/")
    try:
        start = time.monotonic()
        with pytest.raises(DataError, match="deadline"):
            data.fetch_fashion_mnist(tmp_path / "dest", timeout=1.0)
        elapsed = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    assert elapsed < 3.0, elapsed
    assert not list((tmp_path / "dest").glob(".part-*"))


def test_cli_timeout_bounds_the_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: Stalling())
    start = time.monotonic()
    assert main(["data", "--fetch", "--timeout", "0.5", "--root", str(tmp_path / "dest")]) == 1
    assert time.monotonic() - start < 2.0 and "deadline" in capsys.readouterr().err


def test_failed_download_leaves_no_part_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: Stalling(fail_after=3))
    with pytest.raises(DataError, match="connection reset"):
        data.fetch_fashion_mnist(tmp_path / "dest")
    assert list((tmp_path / "dest").iterdir()) == []


def test_truncated_download_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose checksum was published for truncated content still fails verification."""
    write_fake(tmp_path / "src")
    truncate(tmp_path / "src" / "t10k-images-idx3-ubyte.gz")
    _serve(tmp_path / "src", monkeypatch)
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz.*truncated"):
        data.fetch_fashion_mnist(tmp_path / "dest")


def test_library_never_runs_apt_get(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """apt-get is a set-up step of the command line, not something data.fetch_fashion_mnist does."""
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"library code ran a subprocess: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    with pytest.raises(DataError, match="network unreachable"):
        data.fetch_fashion_mnist(tmp_path / "dest")


def test_cli_installs_the_debian_package_as_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import os

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    commands: list[list[str]] = []

    def fake_apt(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        commands.append(cmd)
        assert kwargs["timeout"] <= 60
        if "install" in cmd:
            write_fake(data.DEBIAN_DIR)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_apt)
    assert main(["data", "--fetch", "--timeout", "60"]) == 0
    assert [c[1] for c in commands] == ["update", "install"]
    assert str(data.DEBIAN_DIR) in capsys.readouterr().out
