"""Time per training step of the pipeline emulator against the work its policy cannot avoid.

For each device (CPU, and CUDA when available), each D of ``--D`` and each policy — GPipe, 1F1B (flushed,
M = ``--microbatches`` micro-batches, default D), weight stashing, vertical sync, SpecTrain, PipeOptim,
PipeMare (asynchronous 1F1B, M = 1) and PipeDream-2BW (its schedule, M = D) — the script trains a deep MLP for
``--steps`` mini-batches and prints, per step:

- **plain**: plain PyTorch training of the same model and mini-batches (:func:`pipelab.train_plain`, the model
  cut into the same D stages, one optimizer each, M micro-batches when M > 1);
- **recompute**: the policy's recomputes — where a job's forward and backward weights differ, the emulator
  runs the stage forward once more (recompute semantics, :mod:`pipelab.emulator`); one more forward of that
  stage (without autograd, as the emulator's first one) is the work this adds to a plain step;
- **predictions**: every predictor call the policy makes — a prediction (``StageExecutor.weights`` of a
  ``Predicted`` spec) and, for a predictor that keeps a history (PipeMare's δ), its ``observe`` after each
  update of a stage that predicts — each timed alone on the same optimizer state (a stage that never predicts
  but observes anyway does so as emulator overhead);
- **copies**: the stored weight versions the policy keeps — after each update of a stage whose ring holds more
  than one version (stashing, 2BW, the predicting policies), the new weights are copied, since torch's optimizers
  update in place and the version the in-flight micro-batches use must survive the next step (PipeDream keeps
  them the same way); replayed as the same number of copies per stage, timed alone, each into the oldest of as
  many tensor sets as the stage's ring holds, as the emulator writes a new version into a retired one's tensors
  (a stage with one version shares its live weights and copies nothing);
- **inherent** = plain + recompute + predictions + copies, and **emulator**: the emulator's step;
- for 2BW also **by hand**: :func:`double_buffered`, 2BW written in plain torch (one graph, forward and backward at a
  stash overwritten each step), the same training in float64; emulator / by hand separates the emulator's own cost
  from what keeping and reading a second weight copy costs (plain, emulator and by hand alternated in rounds of
  their own after the others, not part of inherent);
- the ratios **emulator / inherent** (goal ≤ 1.10: the emulator's own bookkeeping costs at most 10 %) and
  emulator / plain, and beside them the minor page faults per step of plain and emulator (median over rounds):
  memory glibc's malloc gave back to the kernel and that the next allocation faults in again, a page at a time
  (:mod:`benchmarks._harness`); it depends on the order of allocations and frees and on malloc's settings, so the
  script re-runs itself with freed memory kept (``--system-malloc``: glibc's defaults; the header states which);
- **bookkeeping** (``--bookkeeping WIDTH``, default 16; 0 skips): every policy measured again on the same model
  at that width, where compute is negligible, so that emulator − inherent there is the emulator's own work per
  step (its Python, its per-stage autograd calls); printed per step and per job, as a share of each full-width
  step's inherent work, and beside it the rest of the gap, which grows with the model's width: read it beside
  the page faults.

- **where the time goes** (CPU rows; ``--no-attribute`` skips): plain training and the emulator run once more,
  alternated, with every module call, autograd call, optimizer step, prediction (and ``observe``) and version copy
  timed where it runs (:func:`attribute`; the timers' own cost, measured, is taken out of the rest). Read off it,
  as shares of the inherent work: the emulator's **own work** (its rest — jobs, rings, hand-overs — less plain
  training's), the **compute in place** (its module calls, autograd calls and optimizer steps beyond plain's and
  the recomputes timed alone: the same arithmetic run more slowly in the emulator's memory state and order, and its
  per-stage autograd calls), and the **predictions and copies in place** beyond their time alone. Their sum is set
  beside the measured emulator / inherent − 1; the two come from different runs (on one host they differed by 0.2
  to 3.8 points in two quiet runs and by up to 10.6 in a third, as its copy speed sagged), so read the split for
  where the gap lies, not to the point.

``--order stage-major`` (an experiment, not the library's behaviour) runs every emulator of the script in another
order (:func:`stage_major`): each stage's own jobs in the schedule's order — so every weight version and result is
the same, bit for bit, on a model that draws no random numbers, as this MLP — but a stage's ready jobs back to
back, so that its weights stay in cache. It measures what the order a one-process emulator picks costs; the random
numbers forwards draw (dropout) follow the execution order, which is why the library keeps the schedule's.

How the work is counted: one untimed run of the policy's emulator records every weight request of every stage
and every ``observe`` of its predictor (the instances' methods are wrapped, nothing in the library changes). A
weight request with ``grad=True`` is the backward's, made only when the forward's graph cannot be used, i.e. a
recompute; a request of a ``Predicted`` spec is one prediction. The recompute side replays as many stage
forwards, and the prediction side the same calls (same stage, ``s`` and kind, from the run's final version, and
the same number of ``observe`` calls), once per round.

Timing (:mod:`benchmarks._harness`): one intra-op thread unless ``--threads``; per policy the sides run
alternately, plain, emulator, recompute, predictions, copies, round after round (``--rounds``, after one warm-up
round); each ratio is the median of the per-round ratios with its interquartile range and the load average
of those rounds; building the model copy and the emulator (its plan) is not timed. ``--clock cpu`` times the CPU
rows by this process's CPU time, which a neighbour's work on a shared machine does not inflate. ``--profile worst``
(or a policy name) then runs cProfile over one emulator run of the row furthest from its goal and prints the
top functions by cumulative time.

Usage:
    .venv/bin/python benchmarks/emulator.py [--steps 30] [--rounds 5] [--width 512] [--depth 16] [--batch 128]
        [--D 4] [--microbatches D] [--optimizer sgdm|adam] [--policies ...] [--device cpu|cuda|all]
        [--threads 1] [--clock wall|cpu] [--bookkeeping 16] [--no-attribute] [--order schedule|stage-major]
        [--profile worst|POLICY] [--profile-top 25]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/emulator.py` finds the harness

from benchmarks._harness import (  # noqa: E402
    Ratio,
    Side,
    add_clock_argument,
    add_malloc_argument,
    add_thread_argument,
    alternate,
    clock_for,
    header,
    use_caching_malloc,
)
from pipelab.emulator import Emulator, train_plain  # noqa: E402
from pipelab.optim import optimizer_factory  # noqa: E402
from pipelab.partition import split  # noqa: E402
from pipelab.pipeline import split_micro  # noqa: E402
from pipelab.policies import Predicted, make_policy  # noqa: E402
from pipelab.schedules import Schedule  # noqa: E402
from pipelab.schedules.builders import BUILDERS  # noqa: E402
from pipelab.schedules.dependencies import received_from  # noqa: E402
from pipelab.studies.learning_curves import serves  # noqa: E402
from pipelab.studies.models import deep_mlp  # noqa: E402
from pipelab.threads import torch_threads  # noqa: E402

#: the policies compared, in the order of the table
POLICIES = ("gpipe", "1f1b", "stashing", "vertical_sync", "2bw", "spectrain", "pipeoptim", "pipemare")
#: the goal of emulator / inherent work
GOAL = 1.10


def schedule_of(policy: str, D: int, M: int, steps: int) -> Schedule:
    """The schedule of the policy's family (``make_policy(policy).schedule``): flushed GPipe / 1F1B and 2BW with M
    micro-batches, asynchronous 1F1B (PipeDream) with one."""
    family = make_policy(policy).schedule
    if family == "sequential":
        raise ValueError(f"policy {policy!r}: no schedule for its family {family!r} in this benchmark")
    return BUILDERS[family](D, 1 if family == "pipedream" else M, steps)


#: what ``--order`` may name: the schedule's order (the emulator's), or :func:`stage_major`
ORDERS = ("schedule", "stage-major")


def stage_major(order: Sequence[Any], D: int, split: Any = False) -> list[Any]:
    """The jobs of ``order`` merged again for one process: each stage's own jobs in their order, and between
    stages, the stage that ran last goes on while its next job's input has arrived (else the first such stage from
    0 up): a stage's consecutive jobs find its weights in cache. Every stage's event sequence, hence every version and
    result, is the schedule's, except the random numbers forwards draw, which follow the execution order (an
    experiment of this benchmark, ``--order stage-major``; the library runs the schedule's order)."""
    stages: list[list[Any]] = [[] for _ in range(D)]
    for job in order:
        stages[job[1]].append(job)
    pos: list[int] = [0] * D
    done: set[tuple[Any, ...]] = set()
    out: list[Any] = []
    while len(out) < len(order):
        for k in ([out[-1][1]] if out else []) + list(range(D)):
            if pos[k] < len(stages[k]):
                job = stages[k][pos[k]]
                if all(src in done for src in received_from(tuple(job[:4]), D, split)):
                    pos[k] += 1
                    out.append(job)
                    done.add(tuple(job[:4]))
                    break
        else:
            raise RuntimeError("no stage's next job has its input: the order is not a pipeline schedule's")
    return out


def build(base: nn.Module, D: int, schedule: Schedule, policy: str, optimizer: Callable[[Any], torch.optim.Optimizer],
          order: str = "schedule") -> Emulator:
    """The policy's emulator on a copy of ``base``, executing its jobs in ``order`` (:data:`ORDERS`)."""
    emu = Emulator(copy.deepcopy(base), D=D, schedule=schedule, policy=policy, optimizer=optimizer)
    if order == "stage-major":
        emu.order = stage_major(emu.order, D, emu.table.split_set)
    return emu


@dataclass
class Work:
    """What one emulator run of a policy did beyond a plain step, counted by :func:`count_work`: recomputes per
    stage, every prediction ``(stage, spec, grad)``, the predictor's ``observe`` calls per stage and the weight
    versions copied per stage."""

    recomputes: dict[int, int]
    predictions: list[tuple[int, Predicted, bool]]
    observes: dict[int, int]
    copies: dict[int, int]

    @property
    def predictor_calls(self) -> int:
        return len(self.predictions) + sum(self.observes.values())


def count_work(emu: Emulator, data: list[tuple[Tensor, Tensor]]) -> Work:
    """Run ``emu`` on ``data`` with every stage's weight requests and predictor ``observe`` calls recorded (see
    the module docstring)."""
    calls: list[tuple[int, Any, bool]] = []
    observed: Counter[int] = Counter()
    copied: Counter[int] = Counter()
    for st in emu.stages:
        def copying(st: Any = st, inner: Callable[..., Any] = st.snapshot) -> Any:
            copied[st.k] += not st.share_live  # views of the live weights copy nothing
            return inner()

        st.snapshot = copying  # type: ignore[method-assign]

        def recording(spec: Any, grad: bool, st: Any = st, inner: Callable[..., Any] = st.weights) -> Any:
            calls.append((st.k, spec, grad))
            return inner(spec, grad)

        st.weights = recording  # type: ignore[method-assign]
        if st.predictor is not None and st.k in emu.plan.predicted_stages:  # elsewhere the history is unused
            def observing(opt: Any, k: int = st.k, inner: Callable[..., Any] = st.predictor.observe) -> Any:
                observed[k] += 1
                return inner(opt)

            st.predictor.observe = observing
    try:
        emu.run(data)
    finally:
        for st in emu.stages:  # the classes' methods again
            del st.weights, st.snapshot
            if st.predictor is not None and "observe" in vars(st.predictor):
                del st.predictor.observe
    return Work(dict(Counter(k for k, _, grad in calls if grad)),
                [(k, spec, grad) for k, spec, grad in calls if isinstance(spec, Predicted)], dict(observed),
                {k: n for k, n in copied.items() if n})


def double_buffered(model: nn.Module, optimizer: Callable[[Any], torch.optim.Optimizer],
                    batches: list[tuple[Tensor, Tensor]], D: int, M: int) -> None:
    """PipeDream-2BW written by hand in plain torch (the reference of the 2BW row's second ratio): every micro-batch of
    step t runs forward and backward, all stages in one graph, at a stashed copy of W^(t−1); the summed gradient
    updates the live W^(t), which is first copied into the stash's tensors (one copy per stage and step, into the
    same buffers): W^(t+1) = W^(t) − ν·∇f(W^(t−1)) (Narayanan et al., ICML 2021, §3.1). It trains ``model`` in place,
    to the emulator's 2BW weights in float64 (tests/core/test_benchmark_emulator.py)."""
    stages = split(model, D)
    opts = [optimizer(list(s.parameters())) for s in stages]
    live = [dict(s.named_parameters()) for s in stages]
    stash = [{n: p.detach().clone().requires_grad_(True) for n, p in ps.items()} for ps in live]
    for x, y in batches:
        for xj, yj in zip(split_micro(x, M), split_micro(y, M)):
            h = xj
            for s, w in zip(stages, stash):
                h = functional_call(s, w, (h,))
            (nn.functional.cross_entropy(h, yj) / M).backward()
        with torch.no_grad():
            for ps, w, o in zip(live, stash, opts):
                for n, p in ps.items():
                    p.grad, w[n].grad = w[n].grad, None
                    w[n].copy_(p)  # W^(t), the next step's stash, before the update
                o.step()


def stage_inputs(emu: Emulator, x: Tensor) -> list[Tensor]:
    """Each stage's input for micro-batch ``x`` (stage 0: ``x``; stage k: stages 0..k−1 applied, no autograd)."""
    out = [x]
    with torch.no_grad():
        for st in emu.stages[:-1]:
            out.append(st.module(out[-1]))
    return out


@dataclass
class Row:
    """One policy's measurement: per-step medians in seconds, counts per step (recomputes; predictions and
    ``observe`` calls; weight copies) and the two ratios."""

    policy: str
    schedule: str
    M: int
    plain: float
    recompute: float
    predictions: float
    copies: float
    emulator: float
    recomputes_per_step: float
    predictions_per_step: float
    copies_per_step: float
    vs_inherent: Ratio
    vs_plain: Ratio
    jobs_per_step: float = 0.0
    faults_plain: float = 0.0  # minor page faults per step (benchmarks._harness.minor_faults)
    faults_emulator: float = 0.0
    #: 2BW: (emulator / :func:`double_buffered`, double_buffered / plain)
    vs_hand: tuple[Ratio, Ratio] | None = None

    @property
    def inherent(self) -> float:
        return self.plain + self.recompute + self.predictions + self.copies


def measure(policy: str, base: nn.Module, data: list[tuple[Tensor, Tensor]], D: int, M: int, rounds: int,
            optimizer: Callable[[Any], torch.optim.Optimizer], device: torch.device,
            clock: Callable[[], float] = time.perf_counter, order: str = "schedule") -> Row:
    """Count the policy's work in one run, then time plain, emulator, recompute, predictions and copies
    alternately."""
    steps = len(data)
    schedule = schedule_of(policy, D, M, steps)
    M = schedule.M
    probe = build(base, D, schedule, policy, optimizer, order)
    work = count_work(probe, data)
    x, y = data[0]
    inputs = stage_inputs(probe, x[:x.shape[0] // M])
    target = y[:y.shape[0] // M]

    def recompute() -> None:
        with torch.no_grad():
            for k, n in work.recomputes.items():
                module = probe.stages[k].module
                for _ in range(n):
                    out = module(inputs[k])
                    if k == D - 1:
                        probe.plan.loss_fn(out, target)

    def predict() -> None:
        for k, spec, grad in work.predictions:
            st = probe.stages[k]
            st.weights(Predicted(st.version, spec.s, spec.kind), grad)
        for k, n in work.observes.items():
            st = probe.stages[k]
            for _ in range(n):
                st.predictor.observe(st.optimizer)

    def version_buffers() -> dict[int, list[tuple[Tensor, ...]]]:
        # per copying stage, one tensor set per version its ring holds, allocated untimed: the ring keeps them
        return {k: [probe.stages[k].snapshot() for _ in range(probe.stages[k].ring.capacity)] for k in work.copies}

    def copy_versions(buffers: dict[int, list[tuple[Tensor, ...]]]) -> None:
        # each copy writes the live weights into the oldest of the stage's tensor sets, as the emulator writes a new
        # version into a retired one's tensors (pipelab.pipeline.rings)
        with torch.no_grad():
            for k, n in work.copies.items():
                params, sets = probe.stages[k].params, buffers[k]
                for i in range(n):
                    for w, p in zip(sets[i % len(sets)], params):
                        w.copy_(p)

    sides: dict[str, Side] = {
        "plain": Side(lambda m: train_plain(m, optimizer=optimizer, batches=data, D=D,
                                            micro_batches=M if M > 1 else None),
                      setup=lambda: copy.deepcopy(base)),
        "emulator": Side(lambda emu: emu.run(data),
                         setup=lambda: build(base, D, schedule, policy, optimizer, order)),
    }
    if work.recomputes:
        sides["recompute"] = Side(recompute)
    if work.predictor_calls:
        sides["predictions"] = Side(predict)
    if work.copies:
        sides["copies"] = Side(copy_versions, setup=version_buffers)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    r = alternate(sides, rounds, warmup=1, sync=sync, clock=clock)
    by_hand = None
    if policy == "2bw":  # against 2BW written by hand, in rounds of its own (a third side shifts malloc's state)
        h = alternate({"plain": sides["plain"], "emulator": sides["emulator"],
                       "by hand": Side(lambda m: double_buffered(m, optimizer, data, D, M),
                                       setup=lambda: copy.deepcopy(base))}, rounds, warmup=1, sync=sync, clock=clock)
        by_hand = (h.ratio("emulator", "by hand"), h.ratio("by hand", "plain"))

    def per_step(name: str) -> float:
        return r.median(name) / steps if name in sides else 0.0

    return Row(policy, schedule.name, M, per_step("plain"), per_step("recompute"), per_step("predictions"),
               per_step("copies"), per_step("emulator"), sum(work.recomputes.values()) / steps,
               work.predictor_calls / steps, sum(work.copies.values()) / steps,
               r.ratio("emulator", [n for n in sides if n != "emulator"]), r.ratio("emulator", "plain"),
               schedule.n_actions / steps, r.median_faults("plain") / steps, r.median_faults("emulator") / steps,
               by_hand)


def format_rows(rows: list[Row]) -> str:
    """The table: per-step milliseconds of every component, counts per step, and the ratios with their spread."""
    lines = [f"  {'policy':<13} {'schedule':<25} {'M':>2} {'plain':>7} {'recompute (n)':>15} "
             f"{'predictions (n)':>17} {'copies (n)':>12} {'inherent':>8} {'emulator':>8}  {'emulator / inherent':<34} "
             f"{'emulator / plain':<29} {'faults/step (plain, emulator)'}"]
    for r in rows:
        rec = f"{1e3 * r.recompute:.2f} ({r.recomputes_per_step:.2f})"
        pred = f"{1e3 * r.predictions:.2f} ({r.predictions_per_step:.2f})"
        cop = f"{1e3 * r.copies:.2f} ({r.copies_per_step:.2f})"
        lines.append(f"  {r.policy:<13} {r.schedule:<25} {r.M:>2} {1e3 * r.plain:>7.2f} {rec:>15} {pred:>17} {cop:>12} "
                     f"{1e3 * r.inherent:>8.2f} {1e3 * r.emulator:>8.2f}  {r.vs_inherent!s:<34} "
                     f"{r.vs_plain.median:.2f}× [IQR {r.vs_plain.q1:.2f}–{r.vs_plain.q3:.2f}]   "
                     f"{r.faults_plain:>7.1f} {r.faults_emulator:>7.1f}")
    for r in rows:
        if r.vs_hand is not None:
            lines.append(f"  {r.policy}: emulator / 2BW by hand (double_buffered: plain torch, one graph, the stash "
                         f"overwritten each step) {r.vs_hand[0]}; by hand / plain {r.vs_hand[1]}")
    missed = [r.policy for r in rows if r.vs_inherent.median > GOAL]
    lines.append(f"  emulator / inherent ≤ {GOAL:.2f}: " + (f"missed by {', '.join(missed)}" if missed
                                                            else "met by every policy"))
    return "\n".join(lines)


def format_bookkeeping(rows: list[Row], small: list[Row]) -> str:
    """What separates the emulator from its inherent work: its own bookkeeping, measured in ``small`` (the same
    policies on a model so narrow that compute is negligible: emulator − inherent there, per step and per job), as a
    share of each ``rows`` step's inherent work, and the rest of the gap (``rows``' emulator / inherent − 1 less
    that share)."""
    lines = [f"  {'policy':<13} {'jobs/step':>9} {'bookkeeping ms/step (µs/job)':>30} {'share':>7} {'rest':>7}"]
    for r, b in zip(rows, small):
        book = max(b.emulator - b.inherent, 0.0)
        share = book / r.inherent
        rest = r.vs_inherent.median - 1 - share
        per_job = 1e6 * book / r.jobs_per_step
        lines.append(f"  {r.policy:<13} {r.jobs_per_step:>9.1f} {1e3 * book:>18.2f} ({per_job:>5.0f})      "
                     f"{100 * share:>6.1f}% {100 * rest:>6.1f}%")
    return "\n".join(lines)


#: the work a step is made of, timed where it runs by :func:`attribute` (the columns of its table)
PARTS = ("module calls", "autograd", "optimizer", "predictions", "copies")


@dataclass
class Split:
    """One side's step split into :data:`PARTS` and the rest (seconds per step, medians over rounds), with the timed
    calls per step and the timers' own cost, already taken out of ``rest``."""

    parts: dict[str, float]
    rest: float
    total: float
    calls: float
    timers: float


class _Timers:
    """Seconds spent in each of :data:`PARTS` while it is installed (:meth:`installed`): module calls (the outermost
    ``nn.Module.__call__`` only: a stage's forward or recompute, plain training's forward), autograd calls
    (``torch.autograd.backward`` and ``grad``, which ``Tensor.backward`` calls), optimizer steps (:meth:`optimizer`
    wraps a factory), and on an emulator (:meth:`emulator`) its predictions (``weights`` of a ``Predicted`` spec and the
    predictor's ``observe``) and its version copies (``snapshot`` of a stage that copies)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls = 0
        self._depth = 0

    def wrap(self, part: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # a module call inside another is part of the outer one
                return inner(*args, **kwargs)
            self._depth += 1
            t0 = self.clock()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[part] += self.clock() - t0
                self.calls += 1
                self._depth -= 1
        return timed

    @contextmanager
    def installed(self) -> Iterator[None]:
        held = nn.Module.__call__, torch.autograd.backward, torch.autograd.grad
        nn.Module.__call__ = self.wrap("module calls", held[0])  # type: ignore[method-assign]
        torch.autograd.backward = self.wrap("autograd", held[1])
        torch.autograd.grad = self.wrap("autograd", held[2])
        try:
            yield
        finally:
            nn.Module.__call__, torch.autograd.backward, torch.autograd.grad = held  # type: ignore[method-assign]

    def optimizer(self, factory: Callable[[Any], torch.optim.Optimizer]) -> Callable[[Any], torch.optim.Optimizer]:
        def build(params: Any) -> torch.optim.Optimizer:
            opt = factory(params)
            opt.step = self.wrap("optimizer", opt.step)  # type: ignore[method-assign]
            return opt
        return build

    def emulator(self, emu: Emulator) -> Emulator:
        for st in emu.stages:
            timed = self.wrap("predictions", st.weights)

            def weights(spec: Any, grad: bool, inner: Callable[..., Any] = st.weights,
                        timed: Callable[..., Any] = timed) -> Any:
                return (timed if isinstance(spec, Predicted) else inner)(spec, grad)

            st.weights = weights  # type: ignore[method-assign]
            if not st.share_live:  # views of the live weights copy nothing
                st.snapshot = self.wrap("copies", st.snapshot)  # type: ignore[method-assign]
            if st.predictor is not None and st.k in emu.plan.predicted_stages:
                st.predictor.observe = self.wrap("predictions", st.predictor.observe)
        return emu

    def reset(self) -> None:
        self.seconds.clear()
        self.calls = 0


def timer_cost(clock: Callable[[], float], n: int = 20000) -> float:
    """Seconds one timed call adds (a wrapped no-op against the bare one, medians of 5 batches of ``n``)."""
    timers = _Timers(clock)
    wrapped, bare = timers.wrap("module calls", lambda: None), (lambda: None)
    costs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            wrapped()
        t1 = time.perf_counter()
        for _ in range(n):
            bare()
        costs.append((t1 - t0 - (time.perf_counter() - t1)) / n)
    return max(sorted(costs)[2], 0.0)


def attribute(policy: str, base: nn.Module, data: list[tuple[Tensor, Tensor]], D: int, M: int, rounds: int,
              optimizer: Callable[[Any], torch.optim.Optimizer], clock: Callable[[], float] = time.perf_counter,
              order: str = "schedule") -> tuple[Split, Split]:
    """Plain training and the policy's emulator, alternated for ``rounds`` rounds after one warm-up
    (:func:`benchmarks._harness.alternate`) with :class:`_Timers` installed: each side's step split into
    :data:`PARTS` and the rest, what runs outside them (the emulator's own Python: its jobs, rings and hand-overs;
    plain training's loop and loss). The wrappers cost each timed call :func:`timer_cost`, taken out of the rest.
    CPU only: on CUDA a call returns before its work is done."""
    steps = len(data)
    schedule = schedule_of(policy, D, M, steps)
    timers = _Timers(clock)
    opt = timers.optimizer(optimizer)
    cost = timer_cost(clock)
    parts: dict[str, list[tuple[dict[str, float], int]]] = {"plain": [], "emulator": []}  # per call, warm-up first

    def plain() -> nn.Module:
        return copy.deepcopy(base)

    def train(model: nn.Module) -> object:
        return train_plain(model, optimizer=opt, batches=data, D=D,
                           micro_batches=schedule.M if schedule.M > 1 else None)

    def emulator() -> Emulator:
        return timers.emulator(build(base, D, schedule, policy, opt, order))

    def side(name: str, step: Callable[[Any], object], setup: Callable[[], Any]) -> Side:
        def run(arg: Any) -> None:
            timers.reset()
            step(arg)
            parts[name].append((dict(timers.seconds), timers.calls))
        return Side(run, setup=setup)

    with timers.installed():
        r = alternate({"plain": side("plain", train, plain),
                       "emulator": side("emulator", lambda emu: emu.run(data), emulator)},
                      rounds, warmup=1, clock=clock)

    def split_of(name: str) -> Split:
        got = parts[name][1:]  # the warm-up call's parts are not timed rounds
        med = {part: float(statistics.median([s[0].get(part, 0.0) for s in got])) / steps for part in PARTS}
        total = r.median(name) / steps
        calls = float(statistics.median([s[1] for s in got])) / steps
        return Split(med, total - sum(med.values()) - calls * cost, total, calls, calls * cost)

    return split_of("plain"), split_of("emulator")


def format_attribution(rows: list[Row], splits: list[tuple[Split, Split]]) -> str:
    """Each policy's step as timed in place (:func:`attribute`), plain beside the emulator, and the emulator's gap to
    its inherent work read off them: its own work (the emulator's rest less plain's), the same arithmetic slower in
    place (module calls, autograd and optimizer steps beyond plain's and the recomputes timed alone; predictions and
    copies beyond their alone time), as shares of the inherent work."""
    lines = [f"  {'policy':<13} {'side':<9} " + " ".join(f"{p:>12}" for p in PARTS)
             + f" {'rest':>7} {'total':>7} {'timed calls (timers)':>22}"]
    summary = [f"  {'policy':<13} {'own work':>14} {'compute in place':>17} {'predictions+copies in place':>28}"
               f" {'sum':>6}   measured emulator / inherent − 1"]
    for r, (plain, emu) in zip(rows, splits):
        for name, sp in (("plain", plain), ("emulator", emu)):
            cells = " ".join(f"{1e3 * sp.parts[p]:>12.2f}" if sp.parts[p] else f"{'—':>12}" for p in PARTS)
            lines.append(f"  {r.policy if name == 'plain' else '':<13} {name:<9} {cells} {1e3 * sp.rest:>7.2f} "
                         f"{1e3 * sp.total:>7.2f} {sp.calls:>11.1f} ({1e3 * sp.timers:.2f} ms)")
        own = emu.rest - plain.rest
        compute = sum(emu.parts[p] - plain.parts[p] for p in PARTS[:3]) - r.recompute
        extra = emu.parts["predictions"] + emu.parts["copies"] - r.predictions - r.copies
        shares = [x / r.inherent for x in (own, compute, extra)]
        summary.append(f"  {r.policy:<13} " + f"{1e3 * own:>7.2f} ({100 * shares[0]:>4.1f}%)"
                       + f" {1e3 * compute:>9.2f} ({100 * shares[1]:>4.1f}%)"
                       + f" {1e3 * extra:>20.2f} ({100 * shares[2]:>4.1f}%)"
                       + f" {100 * sum(shares):>5.1f}%   {100 * (r.vs_inherent.median - 1):.1f}%")
    return "\n".join(lines + ["", *summary])


def profile_run(policy: str, base: nn.Module, data: list[tuple[Tensor, Tensor]], D: int, M: int,
                optimizer: Callable[[Any], torch.optim.Optimizer], top: int, order: str = "schedule") -> str:
    """cProfile of one emulator run of ``policy`` (the plan's set-up not included), the ``top`` functions by
    cumulative time."""
    schedule = schedule_of(policy, D, M, len(data))
    emu = build(base, D, schedule, policy, optimizer, order)
    prof = cProfile.Profile()
    prof.enable()
    emu.run(data)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--D", type=int, nargs="+", default=[4])
    ap.add_argument("--microbatches", type=int, default=None, help="M of GPipe, 1F1B and 2BW (default: D)")
    ap.add_argument("--optimizer", choices=["sgdm", "adam"], default="sgdm",
                    help="sgdm (default: every policy runs its own predictor) or adam (SpecTrain's predictor "
                         "follows SGD momentum only, so its row is left out)")
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    ap.add_argument("--bookkeeping", type=int, default=16, metavar="WIDTH",
                    help="also run every policy at this width, where compute is negligible, to separate the "
                         "emulator's own bookkeeping from the rest of its gap to the inherent work (0: skip)")
    ap.add_argument("--order", choices=ORDERS, default="schedule",
                    help="the emulator's execution order: the schedule's (default, the library's), or stage-major "
                         "(an experiment: each stage's ready jobs back to back, same results without random draws)")
    ap.add_argument("--no-attribute", dest="attribute", action="store_false",
                    help="skip the CPU rows' split of each step into module calls, autograd, optimizer steps, "
                         "predictions, copies and the rest, timed in place (attribute)")
    ap.add_argument("--profile", default=None, help="'worst' or a policy: cProfile one emulator run of it")
    ap.add_argument("--profile-top", type=int, default=25)
    add_thread_argument(ap)
    add_clock_argument(ap)
    add_malloc_argument(ap)
    args = ap.parse_args(argv)
    if args.profile not in (None, "worst", *args.policies):
        ap.error(f"--profile must be 'worst' or one of the policies run ({', '.join(args.policies)}), "
                 f"got {args.profile!r}")
    devices = [torch.device(d) for d in ("cpu", "cuda") if args.device in (d, "all")
               and (d == "cpu" or torch.cuda.is_available())]
    opt = optimizer_factory(args.optimizer, **({"lr": 1e-4} if args.optimizer == "adam" else {}))
    policies = [p for p in args.policies if serves(p, args.optimizer)]
    rows: list[Row] = []
    with torch_threads(args.threads):
        print(header("pipelab emulator benchmark") + f"\nclock: {args.clock} (CUDA rows: wall)")
        print(f"deep_mlp width {args.width} depth {args.depth} float32, batch {args.batch}, {args.optimizer}, "
              f"{args.steps} steps per run; per step: median of {args.rounds} alternated rounds; emulator order: "
              f"{args.order}")
        for p in sorted(set(args.policies) - set(policies), key=args.policies.index):
            print(f"{p}: not run, it cannot follow {args.optimizer} (pipelab.studies.learning_curves.serves)")
        for device in devices:
            torch.manual_seed(0)
            base = deep_mlp(in_features=784, width=args.width, depth=args.depth).to(device)
            g = torch.Generator().manual_seed(1)
            data = [(torch.randn(args.batch, 784, generator=g).to(device),
                     torch.randint(0, 10, (args.batch,), generator=g).to(device)) for _ in range(args.steps)]
            for D in args.D:
                M = args.microbatches or D
                print(f"\n[{device}] D = {D} (ms per step; n: recomputes or predictor calls per step)")
                clock = clock_for(args.clock, device)
                block = [measure(p, base, data, D, M, args.rounds, opt, device, clock, args.order) for p in policies]
                print(format_rows(block))
                rows += block
                if args.bookkeeping:
                    torch.manual_seed(0)
                    tiny = deep_mlp(in_features=784, width=args.bookkeeping, depth=args.depth).to(device)
                    small = [measure(p, tiny, data, D, M, args.rounds, opt, device, clock, args.order)
                             for p in policies]
                    print(f"\n[{device}] D = {D}: the emulator's bookkeeping (emulator − inherent at width "
                          f"{args.bookkeeping}), its share of each width-{args.width} step's inherent work, and the "
                          "rest of the gap")
                    print(format_bookkeeping(block, small))
                if args.attribute and device.type == "cpu":
                    splits = [attribute(r.policy, base, data, D, M, args.rounds, opt, clock, args.order) for r in block]
                    print(f"\n[{device}] D = {D}: where each step's time goes, timed in place (ms per step, median of "
                          f"{args.rounds} alternated rounds of plain and emulator; the timers' own cost taken out of "
                          "the rest), and the emulator's gap to its inherent work read off it (shares of the inherent "
                          "work)")
                    print(format_attribution(block, splits))
                if args.profile:
                    worst = (max(block, key=lambda r: r.vs_inherent.median).policy if args.profile == "worst"
                             else args.profile)
                    print(f"\n[{device}] D = {D}: cProfile of one emulator run of {worst}, by cumulative time")
                    print(profile_run(worst, base, data, D, M, opt, args.profile_top, args.order))
    return rows


if __name__ == "__main__":
    use_caching_malloc()
    main()
