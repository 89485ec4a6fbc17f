"""Data loaders: IDX parsing, search order, corrupt files, fixed splits, devices and dtypes."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelab.studies import data
from pipelab.studies.data import (
    FASHION_MNIST_FILES,
    DataError,
    find_fashion_mnist,
    load_dataset,
    load_fashion_mnist,
    read_idx,
)


def write_idx(path: Path, array: np.ndarray, *, compress: bool = True, magic: bytes | None = None) -> Path:
    header = ((magic if magic is not None else bytes([0, 0, 8, array.ndim]))
              + struct.pack(">" + "i" * array.ndim, *array.shape))
    blob = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)
    return path


def fake_fashion_mnist(root: Path, n_train: int = 12, n_test: int = 5, *, compress: bool = True, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28)), "train_labels": rng.integers(0, 10, n_train),
        "test_images": rng.integers(0, 256, (n_test, 28, 28)), "test_labels": rng.integers(0, 10, n_test),
    }
    for key, stem in FASHION_MNIST_FILES.items():
        write_idx(root / stem, arrays[key], compress=compress)
    return arrays


@pytest.fixture(autouse=True)
def no_system_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Unit tests see only the files they write: no $PIPELAB_DATA, no Debian or download directory."""
    monkeypatch.delenv("PIPELAB_DATA", raising=False)
    monkeypatch.setattr(data, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.setattr(data, "DOWNLOAD_DIR", tmp_path / "no-download")
    monkeypatch.setattr(data, "_RETRY_BACKOFF_S", 0.0)
    data._parsed_fashion_mnist.cache_clear()


@pytest.mark.parametrize("compress", [True, False])
def test_idx_round_trip(tmp_path: Path, compress: bool) -> None:
    a = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    path = write_idx(tmp_path / "x-idx3-ubyte", a, compress=compress)
    np.testing.assert_array_equal(read_idx(path), a)


@pytest.mark.parametrize("compress", [True, False])
def test_loader_values_shapes_dtype(tmp_path: Path, compress: bool) -> None:
    arrays = fake_fashion_mnist(tmp_path / "fm", compress=compress)
    ds = load_fashion_mnist(tmp_path / "fm", dtype=torch.float64, normalize=False)
    assert ds.x_train.shape == (12, 1, 28, 28) and ds.x_test.shape == (5, 1, 28, 28)
    assert ds.x_train.dtype == torch.float64 and ds.y_train.dtype == torch.int64
    torch.testing.assert_close(ds.x_train[:, 0], torch.from_numpy(arrays["train_images"] / 255.0), rtol=0, atol=1e-15)
    assert torch.equal(ds.y_test, torch.from_numpy(arrays["test_labels"]).long())
    flat = load_fashion_mnist(tmp_path / "fm", flatten=True)
    assert flat.x_train.shape == (12, 784) and flat.x_train.dtype == torch.float32
    norm = load_fashion_mnist(tmp_path / "fm", dtype=torch.float64)
    torch.testing.assert_close(norm.x_train, (ds.x_train - 0.2860) / 0.3530)


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit, env, debian = tmp_path / "explicit", tmp_path / "env", tmp_path / "debian"
    fake_fashion_mnist(env / "FashionMNIST" / "raw", seed=1)  # torchvision layout under $PIPELAB_DATA
    fake_fashion_mnist(debian, seed=2)
    monkeypatch.setattr(data, "DEBIAN_DIR", debian)
    assert find_fashion_mnist()["train_images"].parent == debian
    monkeypatch.setenv("PIPELAB_DATA", str(env))
    assert find_fashion_mnist()["train_images"].parent == env / "FashionMNIST" / "raw"
    fake_fashion_mnist(explicit, seed=3)
    assert find_fashion_mnist(explicit)["train_images"].parent == explicit


def test_missing_data_names_every_path_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_DATA", str(tmp_path / "env"))
    with pytest.raises(DataError) as err:
        load_fashion_mnist(tmp_path / "explicit")
    msg = str(err.value)
    for p in (tmp_path / "explicit", tmp_path / "explicit" / "FashionMNIST" / "raw", tmp_path / "env", data.DEBIAN_DIR):
        assert str(p) in msg
    assert "dataset-fashion-mnist" in msg and "PIPELAB_DATA" in msg


def test_truncated_gzip(tmp_path: Path) -> None:
    fake_fashion_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DataError, match="truncated"):
        load_fashion_mnist(tmp_path)


def test_wrong_magic(tmp_path: Path) -> None:
    fake_fashion_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(5), magic=b"\x12\x34\x08\x01")
    with pytest.raises(DataError, match="magic"):
        load_fashion_mnist(tmp_path)


def test_mismatched_counts(tmp_path: Path) -> None:
    fake_fashion_mnist(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(11))  # 12 images, 11 labels
    with pytest.raises(DataError, match="12 images but 11 labels"):
        load_fashion_mnist(tmp_path)


def test_payload_shorter_than_header(tmp_path: Path) -> None:
    blob = bytes([0, 0, 8, 1]) + struct.pack(">i", 10) + bytes(7)
    (tmp_path / "labels").write_bytes(blob)
    with pytest.raises(DataError, match="10 bytes"):
        read_idx(tmp_path / "labels")


def test_replaced_file_is_reparsed(tmp_path: Path) -> None:
    fake_fashion_mnist(tmp_path, seed=0)
    first = load_fashion_mnist(tmp_path).y_train.clone()
    fake_fashion_mnist(tmp_path, n_train=9, seed=5)
    assert load_fashion_mnist(tmp_path).y_train.shape[0] == 9 != first.shape[0]


def test_fetch_reports_every_failed_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("network unreachable")

    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    with pytest.raises(DataError) as err:
        data.fetch_fashion_mnist(tmp_path / "dest")
    assert "apt-get" in str(err.value) and "network unreachable" in str(err.value)


def test_fetch_downloads_and_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The download path checks each file's MD5 against the table; a wrong checksum is rejected."""
    import hashlib
    import io

    src = tmp_path / "src"
    fake_fashion_mnist(src)
    monkeypatch.setattr(data, "FASHION_MNIST_MD5", {p.name: hashlib.md5(p.read_bytes()).hexdigest()
                                                     for p in src.iterdir()})
    monkeypatch.setattr(data.urllib.request, "urlopen",
                        lambda url, timeout: io.BytesIO((src / url.rsplit("/", 1)[1]).read_bytes()))
    assert data.fetch_fashion_mnist(tmp_path / "dest") == tmp_path / "dest"
    assert load_fashion_mnist(tmp_path / "dest").x_train.shape[0] == 12

    monkeypatch.setattr(data, "FASHION_MNIST_MD5", {k: "0" * 32 for k in data.FASHION_MNIST_MD5})
    with pytest.raises(DataError, match="does not match"):
        data.fetch_fashion_mnist(tmp_path / "dest2")


def test_real_fashion_mnist_if_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "DEBIAN_DIR", Path("/usr/share/datasets/fashion-mnist"))
    try:
        ds = load_fashion_mnist()
    except DataError:
        pytest.skip("Fashion-MNIST not installed (CI installs Debian's dataset-fashion-mnist)")
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(ds.y_train), torch.full((10,), 6000))
    assert abs(ds.x_train.mean().item()) < 0.01 and abs(ds.x_train.std().item() - 1) < 0.01


def test_digits_fixed_split_and_dtype() -> None:
    a, b = data.load_digits(dtype=torch.float64), data.load_digits(dtype=torch.float64)
    assert a.x_train.shape == (1438, 1, 8, 8) and a.x_test.shape == (359, 1, 8, 8)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert a.x_train.dtype == torch.float64
    assert abs(a.x_train.mean().item()) < 1e-12
    assert data.load_digits(flatten=True).x_train.shape == (1438, 64)


def test_mnist1d_is_generated_locally_without_side_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    import mnist1d.data

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("MNIST-1D must be generated locally, never downloaded")

    monkeypatch.setattr(mnist1d.data.requests, "get", no_network)
    data._mnist1d_arrays.cache_clear()
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    ds = data.load_mnist1d(num_samples=500, seed=7)
    assert np.random.rand() == expected  # numpy's global RNG untouched
    assert ds.x_train.shape == (400, 40) and ds.x_test.shape == (100, 40)
    again = data.load_mnist1d(num_samples=500, seed=7)
    assert torch.equal(ds.x_train, again.x_train)
    assert not torch.equal(ds.x_train, data.load_mnist1d(num_samples=500, seed=8).x_train)


def test_teacher_student_tasks() -> None:
    reg = data.teacher_student_regression(n_train=64, n_test=16, d_in=5, d_out=2, seed=3, dtype=torch.float64)
    assert reg.x_train.shape == (64, 5) and reg.y_train.shape == (64, 2) and reg.num_classes is None
    assert torch.equal(reg.y_train, data.teacher_student_regression(n_train=64, n_test=16, d_in=5, d_out=2, seed=3,
                                                                    dtype=torch.float64).y_train)
    noiseless = data.teacher_student_regression(n_train=64, n_test=16, d_in=5, d_out=2, seed=3, noise=0.0,
                                                dtype=torch.float64)
    assert 0 < (reg.y_train - noiseless.y_train).std() < 0.2  # the stated noise level, σ = 0.1
    cls = data.teacher_student_classification(n_train=256, n_test=64, num_classes=4, seed=1)
    assert cls.y_train.dtype == torch.int64 and set(cls.y_train.tolist()) <= {0, 1, 2, 3}
    assert len(set(cls.y_train.tolist())) > 1


def test_dataset_to_and_subset(device: torch.device) -> None:
    ds = data.teacher_student_classification(n_train=32, n_test=8).to(device, torch.float64)
    assert ds.x_train.device.type == device.type and ds.x_train.dtype == torch.float64
    assert ds.y_train.dtype == torch.int64
    sub = ds.subset(10, 3)
    assert sub.x_train.shape[0] == 10 and sub.y_test.shape[0] == 3


def test_load_dataset_by_name() -> None:
    assert load_dataset("digits").name == "digits"
    with pytest.raises(ValueError, match="fashion_mnist"):
        load_dataset("cifar10")
