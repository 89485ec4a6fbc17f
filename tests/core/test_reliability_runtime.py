"""Reliability probes of the multi-process runtime: corrupt or mixed checkpoints, configurations that differ
between ranks or between a checkpoint and its resumption, divergence, a hung rank, a busy MASTER_PORT.

Spawned process groups are slow on a small machine, so the checkpoints are written by one spawn (a
module fixture) and every check on them runs in this process (a runtime built with ``rank=`` and
``world_size=`` needs no process group; loading refuses before any communication, on every rank).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import probes
import pytest
import torch
import torch.distributed as dist
from probes import Probe

from pipelab.distributed import RankFailure, describe_differences, differences, spawn
from pipelab.runtime import PipelineRuntime, load_checkpoint, save_checkpoint
from pipelab.schedules import ddp, dualpipe, fsdp, hybrid, lpp, pipedream
from pipelab.studies.learning_curves import RunConfig
from pipelab.studies.models import deep_mlp

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
BATCH = 8


def runtime(rank: int | None = None, *, lr: float = 0.05, policy: str = "stashing", predictor: str | None = None,
            config: dict | None = None) -> PipelineRuntime:
    """A 2-rank PipeDream runtime of a tiny float64 MLP (in this process when ``rank`` is given)."""
    torch.manual_seed(0)
    model = deep_mlp(in_features=6, width=8, depth=2, num_classes=4).double()
    kw = {} if rank is None else {"rank": rank, "world_size": 2}
    return PipelineRuntime(model, schedule=pipedream(2, 1, STEPS), policy=policy, predictor=predictor,
                           optimizer=lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9), config=config, **kw)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(STEPS)]


def _two_cuts(rank: int, world: int, root: str) -> None:
    """Stop at the cut of step 2 (save to ``cut2``), continue to the cut of step 4 (save to ``cut4``)."""
    rt = runtime()
    rt.run(batches(), stop_at_step=2)
    save_checkpoint(rt, Path(root) / "cut2")
    rt.run(batches(), stop_at_step=4)
    save_checkpoint(rt, Path(root) / "cut4")


@pytest.fixture(scope="module")
def cuts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cuts")
    spawn(_two_cuts, 2, (str(root),), timeout_s=120)
    return root


def copy_ranks(tmp: Path, **sources: Path) -> Path:
    """A checkpoint directory made of ``rank<r>.pt`` files taken from the given directories."""
    out = tmp / "mixed"
    out.mkdir()
    for name, src in sources.items():
        shutil.copy(src / f"{name}.pt", out / f"{name}.pt")
    return out


# ----------------------------------------------------------------------------------------- 1: checksums

@pytest.mark.slow
def test_a_flipped_byte_in_a_tensor_is_refused(cuts: Path, tmp_path: Path) -> None:
    ckpt = copy_ranks(tmp_path, rank0=cuts / "cut2", rank1=cuts / "cut2")
    path = ckpt / "rank1.pt"
    data = bytearray(path.read_bytes())
    weight = runtime(1).executors[1].params[0].detach()
    start = data.find(weight.numpy().tobytes()[:16])  # the initial weights, kept as stashed version 0
    if start < 0:  # fall back to any stored float64 tensor: the bytes of the live weights
        start = len(data) // 2
    data[start + 7] ^= 0x40  # the exponent byte of one float64: a huge (or non-finite) weight
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"rank1\.pt is corrupt: its SHA-256 digest"):
        load_checkpoint(runtime(1), ckpt)
    load_checkpoint(runtime(0), ckpt)  # the intact file of the other rank still loads


@pytest.mark.slow
def test_a_truncated_or_garbled_file_is_refused(cuts: Path, tmp_path: Path) -> None:
    ckpt = copy_ranks(tmp_path, rank0=cuts / "cut2", rank1=cuts / "cut2")
    path = ckpt / "rank0.pt"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"rank0\.pt is corrupt"):
        load_checkpoint(runtime(0), ckpt)
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"rank0\.pt is not a pipelab runtime checkpoint"):
        load_checkpoint(runtime(1), ckpt)  # every rank refuses a directory with a bad file


# ----------------------------------------------------------------------------------------- 2: fingerprint

@pytest.mark.slow
def test_resume_with_another_learning_rate_is_refused(cuts: Path) -> None:
    with pytest.raises(ValueError, match=r"optimizer\.lr: 0\.05 \(checkpoint\) vs 0\.1 \(now\)"):
        load_checkpoint(runtime(0, lr=0.1), cuts / "cut2")


def test_resume_with_another_data_seed_or_predictor_is_refused(tmp_path: Path) -> None:
    cfg = {"seed": 0, "batch_size": 8}
    for r in range(2):
        save_checkpoint(runtime(r, policy="pipeoptim", config=cfg), tmp_path)
    with pytest.raises(ValueError, match=r"config\.seed: 0 \(checkpoint\) vs 1 \(now\)"):
        load_checkpoint(runtime(0, policy="pipeoptim", config={**cfg, "seed": 1}), tmp_path)
    with pytest.raises(ValueError, match=r"predictor: 'pipeoptim' \(checkpoint\) vs 'linear' \(now\)"):
        load_checkpoint(runtime(1, policy="pipeoptim", predictor="linear", config=cfg), tmp_path)
    load_checkpoint(runtime(1, policy="pipeoptim", config=cfg), tmp_path)


def test_fingerprints_name_what_differs() -> None:
    """The rank-vs-rank comparison (what check_consistent gathers) names predictor, lr and batch size."""
    a = runtime(1, policy="pipeoptim", config={"batch_size": 32}).fingerprint()  # stage 1 predicts nothing
    b = runtime(1, policy="pipeoptim", predictor="spectrain", lr=0.1, config={"batch_size": 16}).fingerprint()
    assert a != b
    text = describe_differences(differences(a, b), "rank 0", "rank 1")
    assert "predictor: 'pipeoptim' (rank 0) vs 'spectrain' (rank 1)" in text
    assert "optimizer.lr: 0.05 (rank 0) vs 0.1 (rank 1)" in text
    assert "config.batch_size: 32 (rank 0) vs 16 (rank 1)" in text
    assert differences(a, runtime(0, policy="pipeoptim", config={"batch_size": 32}).fingerprint()) == []


def _disagreeing_ranks(rank: int, world: int) -> dict[str, str]:
    """In one process group: ranks with different predictors, then ranks launched with different batch sizes."""
    from pipelab.studies.run import train

    out = {}
    try:
        runtime(policy="pipeoptim", predictor="pipeoptim" if rank == 0 else "linear")
    except ValueError as exc:
        out["predictor"] = str(exc)
    cfg = RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=0, epochs=1, n_train=64,
                    n_test=32, batch_size=16 if rank == 0 else 8, dtype="float64")
    try:
        train(cfg)
    except ValueError as exc:
        out["batch_size"] = str(exc)
    dist.barrier()  # both refused before any pipeline traffic: the group is still usable
    return out


@pytest.mark.slow
def test_ranks_with_different_predictors_or_batch_sizes_are_refused() -> None:
    msgs = spawn(_disagreeing_ranks, 2, timeout_s=120, comm_timeout_s=30)
    for m in msgs:  # every rank refuses, with the field and both values
        assert m.keys() == {"predictor", "batch_size"}, m
        assert "predictor: 'linear' (ranks [1]) vs 'pipeoptim' (ranks [0])" in m["predictor"], m["predictor"]
        assert "config.batch_size: 8 (ranks [1]) vs 16 (ranks [0])" in m["batch_size"], m["batch_size"]


# ----------------------------------------------------------------------------------------- 3: cuts

@pytest.mark.slow
def test_rank_files_from_different_cuts_are_refused_on_every_rank(cuts: Path, tmp_path: Path) -> None:
    ckpt = copy_ranks(tmp_path, rank0=cuts / "cut2", rank1=cuts / "cut4")
    for r in range(2):
        with pytest.raises(ValueError, match=r"disagree on the cut step \(rank0\.pt: 2, rank1\.pt: 4\)"):
            load_checkpoint(runtime(r), ckpt)


@pytest.mark.slow
def test_a_missing_rank_file_is_refused_on_every_rank(cuts: Path, tmp_path: Path) -> None:
    ckpt = copy_ranks(tmp_path, rank0=cuts / "cut4")
    for r in range(2):
        with pytest.raises(FileNotFoundError, match=r"rank 1|ranks \[1\]"):
            load_checkpoint(runtime(r), ckpt)


@pytest.mark.slow
def test_a_stop_step_before_the_resume_point_is_refused(cuts: Path) -> None:
    for r in range(2):
        rt = runtime(r)
        load_checkpoint(rt, cuts / "cut4")
        with pytest.raises(ValueError, match=r"stop_at_step must be an int in 4\.\.6 .* got 2"):
            rt.run(batches(), stop_at_step=2)  # refused before any communication (no process group here)
        assert rt.cut_step == 4 and rt.position > 0


# ----------------------------------------------------------------------------------------- 4: divergence

@pytest.mark.slow
def test_divergence_is_reported() -> None:
    from pipelab.studies.run import train_distributed

    cfg = RunConfig(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=0, epochs=1, n_train=64,
                    n_test=32, batch_size=16, lr=1e8, dtype="float64")
    out = train_distributed(cfg, timeout_s=120)
    assert out["steps_done"] == 4  # every step ran, finite or not
    assert out["diverged"] is True and isinstance(out["diverged_step"], int) and 0 <= out["diverged_step"] < 4
    assert not math.isfinite(out["losses"][out["diverged_step"]])
    assert all(math.isfinite(v) for v in out["losses"][:out["diverged_step"]])
    assert math.isnan(out["test_acc"]) and math.isnan(out["test_loss"]) and math.isnan(out["samples_per_s"])


# ----------------------------------------------------------------------------------------- 5: a hung rank

def _hang_on_rank_1(rank: int, world: int) -> None:
    rt = runtime()
    if rank == 1:
        time.sleep(3600)  # hangs inside the training function
    rt.run(batches())


@pytest.mark.slow
def test_a_hung_rank_is_named() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure) as err:
        spawn(_hang_on_rank_1, 2, timeout_s=90, comm_timeout_s=3, grace_s=2)
    assert err.value.rank == 1, str(err.value)
    assert "rank 1 failed:\nunresponsive" in str(err.value) and "rank 0:" in str(err.value)
    assert time.monotonic() - start < 60


# ------------------------------------------------------------------ 5b: a rank stalled in a collective or transfer

#: where a rank stalls: point-to-point (PipeDream, 2 ranks) or a placed schedule's collectives
STALLS = {"p2p": (2, None),
          "ddp": (2, lambda: ddp(D=2, M=4, W=2, steps=3)),
          "fsdp": (2, lambda: fsdp(D=2, M=4, W=2, steps=3)),
          "lpp": (2, lambda: lpp(D=2, M=4, G=2, R=1, steps=3)),
          "dualpipe": (2, lambda: dualpipe(W=2, M=4, steps=2)),
          "hybrid": (4, lambda: hybrid(D=2, M=4, R=2, steps=3))}


class _Stalling:
    """``torch.distributed`` whose ``n``-th call of one of ``names`` stalls this process: SIGSTOP (``stop``)
    or a sleep of an hour (``sleep``), after writing the wall time to ``stamp``."""

    def __init__(self, names: tuple[str, ...], n: int, how: str, stamp: str) -> None:
        self.names, self.n, self.how, self.stamp, self.calls = names, n, how, stamp, 0

    def tick(self) -> None:
        """Count a call; the ``n``-th stalls."""
        self.calls += 1
        if self.calls == self.n:
            Path(self.stamp).write_text(repr(time.time()))
            if self.how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(3600)

    def __getattr__(self, name: str) -> object:
        fn = getattr(dist, name)
        if name not in self.names:
            return fn

        def call(*args: object, **kwargs: object) -> object:
            self.tick()
            return fn(*args, **kwargs)

        return call


def _stall(rank: int, world: int, kind: str, stalled: int, how: str, stamp: str) -> None:
    """Rank ``stalled`` stalls at its fourth transfer (``p2p``) or its second collective (placed kinds): stopped
    inside the call, or sleeping before it."""
    import pipelab.runtime.collectives as collectives
    import pipelab.runtime.p2p as p2p
    from pipelab.pipeline.placement import Launch

    make = STALLS[kind][1]
    if make is None:
        rt = runtime()
    else:
        schedule = make()
        torch.manual_seed(0)
        model = deep_mlp(in_features=6, width=8, depth=schedule.D + 1, num_classes=4).double()
        rt = PipelineRuntime(model, schedule=schedule, policy="gpipe", D=schedule.D,
                             optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    if rank == stalled and make is None:
        p2p.dist = _Stalling(("isend", "irecv"), 4, how, stamp)  # type: ignore[assignment]
    elif rank == stalled and how == "stop":
        collectives.dist = _Stalling(("all_reduce", "broadcast", "reduce"), 2, how, stamp)  # type: ignore[assignment]
    elif rank == stalled:
        stall = _Stalling((), 2, how, stamp)
        run = collectives.DistributedCollectives.__call__

        def before(self: object, c: object, executors: object) -> None:
            if not isinstance(c, Launch):
                stall.tick()
            run(self, c, executors)  # type: ignore[arg-type]

        collectives.DistributedCollectives.__call__ = before  # type: ignore[method-assign]
    rt.run(batches())


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind, how", [("p2p", "stop"), ("ddp", "stop"), ("fsdp", "sleep"), ("lpp", "stop"),
                                       ("dualpipe", "sleep"), ("hybrid", "stop")])
def test_a_rank_stalled_in_a_collective_or_transfer_is_named(kind: str, how: str, tmp_path: Path) -> None:
    """Every process group has the run's communication timeout (torch's default for a sub-group is 30 minutes):
    the stalled rank is named by spawn, and by its peers from the progress the ranks publish, within the
    timeout plus the grace periods; a stopped rank is killed, so no process outlives the call."""
    world, comm, grace = STALLS[kind][0], 3.0, 2.0
    stalled, stamp = world - 1, tmp_path / "stalled_at"
    with pytest.raises(RankFailure) as err:
        spawn(_stall, world, (kind, stalled, how, str(stamp)), timeout_s=45, comm_timeout_s=comm, grace_s=grace)
    detected = time.time() - float(stamp.read_text())
    assert err.value.rank == stalled and "unresponsive" in err.value.details, str(err.value)
    named = [r for r, d in err.value.others.items() if f"stalled: rank {stalled}:" in d]
    assert named, str(err.value)  # a peer's own error names it, from the published progress
    if how == "stop":
        assert "NOT RESPONDING" in err.value.others[named[0]]
    assert detected < comm + 3 * grace + 10, detected
    assert not multiprocessing.active_children()


def _stop_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    raise RuntimeError(f"rank {rank} fails")


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_stopped_rank_does_not_hang_the_caller_at_exit() -> None:
    """A SIGSTOPped rank ignores SIGTERM until continued; multiprocessing joins its children without a timeout at
    interpreter exit, so the caller (a test session, a notebook kernel) hung there unless spawn kills the rank."""
    code = ("from test_reliability_runtime import _stop_rank_1\n"
            "from pipelab.distributed import RankFailure, spawn\n"
            "try:\n    spawn(_stop_rank_1, 2, timeout_s=60, comm_timeout_s=3, grace_s=1)\n"
            "except RankFailure as exc:\n    print('named rank', exc.rank)\n")
    here = Path(__file__).resolve().parent  # the helper, and probes.py one folder up
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(here), str(here.parent)])}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, errors = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the caller and the stopped rank
        proc.communicate()
        pytest.fail("the calling process hung at exit: the stopped rank was not killed")
    assert proc.returncode == 0 and "named rank 0" in out, errors[-2000:]
    for _ in range(50):  # no rank outlives the caller (multiprocessing's resource tracker leaves soon after it)
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("a process of the caller's session outlived it")


def _torchrun_stalling(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess, float]:
    """``torchrun -m pipelab.studies.run`` on 2 ranks whose rank 1 stalls in its forward of step 2; the seconds from
    the stall to the end of torchrun."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not found")
    stamp = tmp_path / "stalled_at"
    code = ("import os, signal, sys, time\n"
            "from pipelab.pipeline import stage\n"
            "forward = stage.StageExecutor.forward\n"
            "def stalling(self, t, j, *args, **kwargs):\n"
            "    if t == 2 and os.environ['RANK'] == '1':\n"
            f"        open({str(stamp)!r}, 'w').write(repr(time.time()))\n"
            f"        os.kill(os.getpid(), signal.SIGSTOP) if {how == 'stop'} else time.sleep(3600)\n"
            "    return forward(self, t, j, *args, **kwargs)\n"
            "stage.StageExecutor.forward = stalling\n"
            "import runpy\n"
            "runpy.run_module('pipelab.studies.run', run_name='__main__', alter_sys=True)\n")  # as `-m ...run`
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", sys.executable, "-c", code,
           "--task", "digits_mlp", "--policy", "stashing", "--optimizer", "sgdm", "--n-train", "256", "--n-test",
           "128", "--batch-size", "32", "--comm-timeout", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=env, cwd=ROOT)
    return proc, time.time() - float(stamp.read_text())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torchrun_names_the_stalled_rank_not_its_peer(tmp_path: Path) -> None:
    """Under torchrun (no spawn parent to watch the ranks) rank 0's receive times out after --comm-timeout and
    its error, torchrun's root cause, names rank 1 from the progress published to torchrun's store."""
    proc, seconds = _torchrun_stalling(tmp_path, "sleep")
    assert proc.returncode != 0
    cause = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "rank      : 0" in cause and "StalledRank: rank 0: the receive" in cause, proc.stderr[-3000:]
    assert "stalled: rank 1: last progress: position" in cause and "not in a communication call" in cause, cause
    assert seconds < 3 + 30, seconds  # the timeout, the diagnosis, torchrun's own teardown


# ----------------------------------------------------------------------------------------- 6: busy port

def _init_with_busy_port(rank: int, port: int) -> subprocess.CompletedProcess:
    code = "from pipelab.distributed import init_from_env; init_from_env('gloo', timeout_s=3)"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)


@pytest.mark.slow
def test_a_busy_master_port_fails_in_bounded_time() -> None:
    with socket.socket() as held:  # another program listens on MASTER_PORT and never speaks the store protocol
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        start = time.monotonic()
        client = _init_with_busy_port(1, port)
        elapsed = time.monotonic() - start
        host = _init_with_busy_port(0, port)
    assert client.returncode != 0 and elapsed < 30, (elapsed, client.stderr[-2000:])
    assert f"MASTER_ADDR:MASTER_PORT = 127.0.0.1:{port}" in client.stderr and "TimeoutError" in client.stderr
    assert host.returncode != 0 and f"127.0.0.1:{port}: the port is busy" in host.stderr, host.stderr[-2000:]


# ----------------------------------------------------------------------------------------- 8: entry point

@pytest.mark.slow
def test_the_entry_module_is_not_imported_by_the_package() -> None:
    proc = subprocess.run([sys.executable, "-W", "error", "-m", "pipelab.studies.run", "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "RuntimeWarning" not in proc.stderr, proc.stderr[-2000:]


ARGS = ["--task", "digits_mlp", "--policy", "stashing", "--optimizer", "sgdm", "--n-train", "64", "--n-test", "32",
        "--batch-size", "16", "--dtype", "float64"]


@pytest.mark.parametrize("flag, kind", [("--out", "dir"), ("--checkpoint", "file"), ("--out", "under-a-file")])
def test_unwritable_outputs_are_refused_before_training(flag: str, kind: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """They were found only once the run was over (a directory given as --out: IsADirectoryError after
    training); now before the ranks join (no process group here: the check comes first)."""
    from pipelab.studies.run import main

    monkeypatch.delenv("RANK", raising=False)
    (tmp_path / "a-file").write_text("")
    path = {"dir": tmp_path, "file": tmp_path / "a-file", "under-a-file": tmp_path / "a-file" / "out.json"}[kind]
    assert main([*ARGS, flag, str(path)]) == 2
    err = capsys.readouterr().err
    expected = {"dir": "is a directory; a file is expected there", "file": "is a file; a directory is expected",
                "under-a-file": "is a file, so the file cannot be created"}[kind]
    assert f"error: {flag} {path}" in err and expected in err, err


def _summary_without_out_dir(rank: int, world: int, out: str, tmp: str) -> tuple[object, str, str]:
    """pipelab.studies.run's main on a spawned rank; once training is over, rank 0 finds --out's folder gone."""
    import contextlib
    import io
    import tempfile

    import pipelab.studies.run as run

    tempfile.tempdir = tmp
    train = run.train

    def training_then_losing_the_folder(*args: object, **kwargs: object) -> object:
        summary = train(*args, **kwargs)
        if rank == 0:
            shutil.rmtree(Path(out).parent)
            Path(out).parent.write_text("a file where the folder was")
        return summary

    run.train = training_then_losing_the_folder  # type: ignore[assignment]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code: object = run.main([*ARGS, "--out", out])
        except Exception as exc:
            code = repr(exc)
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_summary_that_cannot_be_written_is_saved_elsewhere(tmp_path: Path) -> None:
    out = tmp_path / "results" / "summary.json"
    out.parent.mkdir()
    code, printed, err = spawn(_summary_without_out_dir, 2, (str(out), str(tmp_path)), timeout_s=100)[0]
    assert code == 1 and f"error: cannot write --out {out}" in err, (code, err)
    saved = Path(err.split("saved to ")[1].split()[0])
    assert saved.parent == tmp_path and json.loads(saved.read_text()) == json.loads(printed)
    assert json.loads(printed)["steps_done"] == 4


# ----------------------------------------------------------------------------------------- 9: RunConfig

CFG = dict(task="digits_mlp", policy="stashing", optimizer="sgdm", D=2, seed=0)

PROBES = [
    Probe("runconfig-batch-size-0", lambda: RunConfig(**CFG, batch_size=0), ValueError, r"batch_size must be an int"),
    Probe("runconfig-n-test-0", lambda: RunConfig(**CFG, n_test=0), ValueError, r"n_test must be an int >= 1 or None"),
    Probe("runconfig-n-train-0", lambda: RunConfig(**CFG, n_train=0), ValueError, r"n_train must be"),
    Probe("runconfig-epochs-0", lambda: RunConfig(**CFG, epochs=0), ValueError, r"epochs must be an int >= 1"),
    Probe("runconfig-D-0", lambda: RunConfig(**{**CFG, "D": 0}), ValueError, r"D must be an int >= 1"),
    Probe("runconfig-M-float", lambda: RunConfig(**CFG, M=2.5), ValueError, r"M must be an int >= 1, got 2\.5"),
    Probe("runconfig-lr-0", lambda: RunConfig(**CFG, lr=0.0), ValueError, r"lr must be a finite number > 0"),
    Probe("runconfig-lr-nan", lambda: RunConfig(**CFG, lr=float("nan")), ValueError, r"lr must be a finite"),
    Probe("runconfig-n-eval-train-0", lambda: RunConfig(**CFG, n_eval_train=0), ValueError, r"n_eval_train must"),
    Probe("stop-before-start", lambda: runtime(0).run(batches(), stop_at_step=-1), ValueError,
          r"stop_at_step must be an int in 0\.\.6"),
    # the runtime checks mini-batches as the emulator does, before any communication (was: a raw error mid-run)
    Probe("runtime-batch-as-dict", lambda: runtime(0).run([{"x": x, "y": y} for x, y in batches()]), TypeError,
          r"mini-batch 0 must be a tuple \(x, y\): the input a tensor \(or a tuple or dict of tensors\).*got dict"),
    Probe("runtime-batch-wrong-dtype", lambda: runtime(0).run([(x.float(), y) for x, y in batches()]), TypeError,
          "input dtype torch.float32 differs from the model's torch.float64"),
    Probe("runtime-batch-target-length", lambda: runtime(0).run([(x, y[:2]) for x, y in batches()]), ValueError,
          "same number of examples"),
    Probe("runtime-too-few-batches", lambda: runtime(0).run(batches()[:2]), ValueError, "only 2 mini-batches"),
    Probe("runtime-batches-none", lambda: runtime(0).run(None), TypeError, "batches must be a sequence"),
    Probe("runtime-unknown-keyword", lambda: PipelineRuntime(deep_mlp(in_features=6, width=8, depth=2),
                                                             schedule=pipedream(2, 1, STEPS), policy="stashing",
                                                             optimizer=torch.optim.SGD, rank=0, world_size=2,
                                                             momentum=0.9),
          TypeError, r"unexpected keyword argument\(s\) 'momentum'.*schedule, policy, optimizer"),
]


@probes.parametrize(PROBES)
def test_probe(probe: Probe) -> None:
    probe.check()


# ----------------------------------------------------------------------------------------- 10: state_dict

def _single_worker(lr: float = 0.05) -> PipelineRuntime:
    """A folded two-stage pipeline on one worker: it runs in this process, without a process group."""
    from pipelab.schedules import folded

    torch.manual_seed(0)
    model = deep_mlp(in_features=6, width=8, depth=2, num_classes=4).double()
    return PipelineRuntime(model, schedule=folded(2, 2, STEPS), policy="gpipe", rank=0, world_size=1,
                           optimizer=lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9))


def test_state_dict_round_trip_resumes_identically(tmp_path: Path) -> None:
    """state_dict() at a cut, loaded into a fresh runtime, continues to the same losses and weights, also
    through a checkpoint file; a state of another rank or with keys missing is refused."""
    whole = _single_worker().run(batches())
    first = _single_worker()
    first.run(batches(), stop_at_step=3)
    save_checkpoint(first, tmp_path / "cut3")
    state = first.state_dict()
    assert state["cut_step"] == 3 and state["position"] == first.position > 0
    resumed = _single_worker()
    resumed.load_state_dict(state)
    assert resumed.position == first.position and resumed.cut_step == 3
    again = resumed.state_dict()
    assert again["losses"] == state["losses"] and again["trace"] == state["trace"]
    assert again["activations"] == state["activations"]
    res = resumed.run(batches())
    assert res.losses == whole.losses and res.steps_done == STEPS
    for k in whole.weights:
        assert all(torch.equal(a, b) for a, b in zip(res.weights[k], whole.weights[k]))
    from_file = _single_worker()
    load_checkpoint(from_file, tmp_path / "cut3")
    assert from_file.run(batches()).losses == whole.losses
    with pytest.raises(ValueError, match="state lacks trace"):
        _single_worker().load_state_dict({k: v for k, v in state.items() if k != "trace"})
    with pytest.raises(ValueError, match="state of rank 1 cannot be loaded into rank 0"):
        _single_worker().load_state_dict({**state, "rank": 1})


def test_a_channel_received_in_another_order_than_sent_is_refused() -> None:
    """Point-to-point matching is FIFO per channel: a receiver whose program takes F1.1 before F1.0 while the
    sender sends F0.0 first would pair the wrong activations, so the transport refuses the schedule."""
    import dataclasses

    from pipelab.runtime.p2p import P2PTransport
    from pipelab.schedules import gpipe

    s = gpipe(2, 2, 1)
    P2PTransport(s, 1, torch.device("cpu"))  # the builder's schedule is fine
    swapped = list(s.programs[1])
    swapped[0], swapped[1] = swapped[1], swapped[0]
    bad = dataclasses.replace(s, programs=(s.programs[0], tuple(swapped)))
    with pytest.raises(ValueError, match=r"channel \(0, 1, 2\).*sender's order \[\(0, 0\), \(0, 1\)\].*"
                                         r"receiver's \[\(0, 1\), \(0, 0\)\]"):
        P2PTransport(bad, 1, torch.device("cpu"))
