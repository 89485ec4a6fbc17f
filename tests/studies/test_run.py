"""Training an arm with the runtime (spawned ranks, and torchrun) gives the emulator's weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipelab.emulator import Emulator
from pipelab.studies.learning_curves import RunConfig, prepare
from pipelab.studies.run import train_distributed

CFG = RunConfig(task="digits_mlp", policy="pipeoptim", optimizer="adam", D=2, seed=0, epochs=1, n_train=256,
                n_test=128, batch_size=32, dtype="float64")


@pytest.mark.slow
def test_train_distributed_equals_the_emulator_arm() -> None:
    out = train_distributed(CFG)
    prep = prepare(CFG)
    emu = Emulator(prep.stages, schedule=prep.schedule, policy=prep.policy, optimizer=prep.optimizer)
    res = emu.run(prep.batch)
    assert out["steps_done"] == prep.steps == 8 and out["diverged"] is False and out["diverged_step"] is None
    assert out["losses"] == pytest.approx(res.losses, abs=1e-12)
    for k, W in enumerate(emu.weights()):
        for a, b in zip(out["weights"][k], W):
            assert (a - b).abs().max().item() <= 1e-12
    assert 0.0 <= out["test_acc"] <= 1.0 and out["samples_per_s"] > 0
    assert set(out["memory"]) == {0, 1} and out["memory"][0]["weight_versions"] > 0


def _torchrun(tmp_path: Path, *args: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``torchrun`` on 2 ranks of the Digits MLP at the test's sizes with ``args``; the summary's path and the
    finished process (asserted successful)."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not found")
    out = tmp_path / "summary.json"
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "pipelab.studies.run", "--task", "digits_mlp",
           "--n-train", "256", "--n-test", "128", "--batch-size", "32", *args, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    # faulthandler's one-line list of extension modules after a crash would fill the message: the stacks show instead
    err = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("Extension modules:"))
    assert proc.returncode == 0, err[-4000:]
    return out, proc


@pytest.mark.slow
def test_torchrun_entry_point(tmp_path: Path) -> None:
    out, proc = _torchrun(tmp_path, "--policy", "stashing", "--optimizer", "sgdm")
    assert "RuntimeWarning" not in proc.stderr, proc.stderr[-3000:]  # pipelab does not import its entry module
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2 and summary["steps_done"] == 8
    assert summary["config"]["policy"] == "stashing" and 0.0 <= summary["test_acc"] <= 1.0
    assert all(v == v for v in summary["losses"])  # no NaN: every step ran


@pytest.mark.slow
def test_train_distributed_in_bf16_equals_the_emulator_in_bf16() -> None:
    from dataclasses import replace

    cfg = replace(CFG, dtype="float32")
    out = train_distributed(cfg, precision="bf16")
    prep = prepare(cfg)
    emu = Emulator(prep.stages, schedule=prep.schedule, policy=prep.policy, optimizer=prep.optimizer,
                   precision="bf16")
    res = emu.run(prep.batch)
    assert out["precision"] == "bf16" and out["losses"] == res.losses  # bit for bit: the same arithmetic
    for k, W in enumerate(emu.weights()):
        for a, b in zip(out["weights"][k], W):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_torchrun_metered_run_equals_the_emulator_arm(tmp_path: Path) -> None:
    """``--link-mbps/--link-latency-ms/--duplex`` meter the run (pipelab.runtime.meter); the losses stay the
    emulator's in float64."""
    out, _ = _torchrun(tmp_path, "--policy", "pipeoptim", "--optimizer", "adam", "--dtype", "float64",
                       "--link-mbps", "50", "--link-latency-ms", "10", "--duplex")
    summary = json.loads(out.read_text())
    assert "Link(latency=0.01, bandwidth=6250000.0)" in summary["network"] and "duplex=True" in summary["network"]
    assert isinstance(summary["late_messages"], int)
    prep = prepare(CFG)
    res = Emulator(prep.stages, schedule=prep.schedule, policy=prep.policy, optimizer=prep.optimizer).run(prep.batch)
    assert summary["losses"] == pytest.approx(res.losses, abs=1e-12)


@pytest.mark.parametrize("argv, needle", [(["--duplex"], "--duplex needs a metered link"),
                                          (["--link-mbps", "0"], "--link-mbps must be > 0"),
                                          (["--link-latency-ms", "-1"], "latency must be finite and >= 0")])
def test_metered_flags_are_checked_before_joining(argv: list[str], needle: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from pipelab.studies.run import main

    assert main(argv) == 2
    assert needle in capsys.readouterr().err
