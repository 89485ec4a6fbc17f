"""Discrete-event simulation of a :class:`~pipelab.schedules.Schedule`: timeline, bubbles, memory, versions.

Timing is :func:`pipelab.schedules.compiled.run`'s. Memory: an activation of (k, g) is held by F(k, g)'s worker
from F's start to the end of B(k, g), or of W(k, g) when split (W needs the stage's inputs), one unit
(``activation_bytes[k]``) each, as Rahimi and Qi et al. count (ICLR 2024, Table 1: 1F1B and ZB-H1 peak at
p·M_B, ZB-H2 at (2p−1)·M_B); Qi et al.'s finer split (M_B until I, M_W until W) is not modelled.

Reference: A. Rahimi, "Unifying Parallelization Schemes to Train Deep Nets" (2025), Table 1 metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from .links import MessageBytes, Network, collective_time
from .schedules.actions import Action, Schedule, gc_paused
from .schedules.compiled import (
    OP_CODE,
    Compiled,
    Wires,
    _checked_costs,
    _per_stage,
    check_cost,
    compile_schedule,
    job_costs,
    run,
)
from .schedules.dependencies import Job
from .schedules.validate import ScheduleError, format_grid
from .schedules.versions import VersionTable

__all__ = ["simulate", "SimResult", "Messages", "Binding", "BINDINGS", "costs_from_profile", "steady_state",
           "SteadyState"]

_F, _B, _U, _I, _W = (OP_CODE[o] for o in ("F", "B", "U", "I", "W"))
Cost = float | Sequence[float] | np.ndarray


def costs_from_profile(profile: Any) -> dict[str, Any]:
    """Costs and sizes from a mapping or object: ``f_cost``/``forward``, ``b_cost``/``backward``, sizes."""
    get = profile.get if isinstance(profile, Mapping) else (lambda k, d=None: getattr(profile, k, d))
    out = {}
    for key, names in (("f_cost", ("f_cost", "forward")), ("b_cost", ("b_cost", "backward")),
                       ("activation_bytes", ("activation_bytes",)), ("weight_bytes", ("weight_bytes",))):
        for n in names:
            v = get(n)
            if v is not None:
                out[key] = v
                break
    if "f_cost" not in out or "b_cost" not in out:
        raise ValueError("profile must provide forward and backward costs ('forward'/'f_cost' and "
                         f"'backward'/'b_cost'); got {sorted(profile) if isinstance(profile, Mapping) else profile}")
    return out


class Messages(NamedTuple):
    """Per message m: its receiving job (``consumer``), the job whose end sends it (``sender``), its ``boundary``
    and ``kind`` (0: activation, forward; 1: gradient), the receiving ``wire`` (worker w; 2w + kind when duplex),
    ``nbytes``, and its times: ``send``, ``ready`` = send + α, ``begin`` (wire free), ``arrival`` = begin + n/β
    (the consumer may start o = ``Network.receive_overhead`` later).
    """

    consumer: np.ndarray
    sender: np.ndarray
    boundary: np.ndarray
    kind: np.ndarray
    wire: np.ndarray
    nbytes: np.ndarray
    send: np.ndarray
    ready: np.ndarray
    begin: np.ndarray
    arrival: np.ndarray


#: what can bind a job's start (:attr:`SimResult.binding`)
BINDINGS: tuple[str, ...] = ("start", "worker", "dependency", "latency", "queueing", "transmission", "overhead")


class Binding(NamedTuple):
    """Per job: ``kind`` (an index into :data:`BINDINGS`), the ``job`` whose end bound its start (a message's
    sender; −1 for "start") and the ``message`` (−1: none)."""

    kind: np.ndarray
    job: np.ndarray
    message: np.ndarray


@dataclass(eq=False)
class SimResult:
    """Timeline and metrics of one simulated schedule; per-action arrays are indexed like ``compiled``.

    Attributes:
        latency: (lat1, lat2, lat3) added to each dependency slot.
        seq: the order in which the simulator timed the actions (a valid topological order).
        wire_times: the :class:`~pipelab.schedules.compiled.Wires` and each message's begin and arrival, or None.
        dispatch: each job's dispatch time (``dispatch_cost`` of its stage), or None when there is none.
    """

    schedule: Schedule
    compiled: Compiled
    start: np.ndarray
    end: np.ndarray
    cost: np.ndarray
    latency: tuple[np.ndarray, np.ndarray, np.ndarray]
    seq: np.ndarray
    activation_bytes: np.ndarray | None = None
    weight_bytes: np.ndarray | None = None
    network: Network | None = None
    message_bytes: tuple[np.ndarray, np.ndarray] | None = None
    wire_times: tuple[Wires, np.ndarray, np.ndarray] | None = None
    dispatch: np.ndarray | None = None

    # ------------------------------------------------------------ time
    @property
    def makespan(self) -> float:
        """Time from the first start to the last end."""
        return float(self.end.max() - min(0.0, float(self.start.min())))

    @cached_property
    def busy(self) -> np.ndarray:
        """Compute time per worker (updates included), shape [W]."""
        return np.bincount(self.compiled.worker, weights=self.cost, minlength=self.schedule.W)

    @property
    def bubble_fraction(self) -> np.ndarray:
        """Idle share of the makespan per worker: 1 − busy / makespan, shape [W]."""
        return 1.0 - self.busy / self.makespan

    @property
    def bubble(self) -> float:
        """Mean bubble fraction over workers."""
        return float(self.bubble_fraction.mean())

    @property
    def latency_units(self) -> float:
        """Rahimi's latency: makespan in units of one stage's F + B (mean over stages; B = I + W when split)."""
        c = self.compiled
        n_f = int((c.op == _F).sum())
        compute = float(self.cost[(c.op == _F) | (c.op == _B) | (c.op == _I) | (c.op == _W)].sum())
        return self.makespan / (compute / n_f)

    # ------------------------------------------------------------ memory and traffic
    def _activation_events(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        c = self.compiled
        t = c.table
        # The activation is freed by the job that finishes the weight gradient: B, or W when split.
        grad = np.where(t[_B] >= 0, t[_B], t[_W])
        fid = t[_F].reshape(-1)
        gid = grad.reshape(-1)
        ok = (fid >= 0) & (gid >= 0)
        fid, gid = fid[ok], gid[ok]
        return fid, gid, c.worker[fid], c.stage[fid]

    def _peak(self, weights: np.ndarray | None) -> np.ndarray:
        fid, gid, w, k = self._activation_events()
        size = np.ones(len(fid)) if weights is None else weights[k]
        times = np.concatenate([self.start[fid], self.end[gid]])
        delta = np.concatenate([size, -size])
        ws = np.concatenate([w, w])
        # Sort by worker, then time, releases (negative) before acquisitions at equal times.
        o = np.lexsort((delta, times, ws))
        cum = np.cumsum(delta[o])
        wsorted = ws[o]
        out = np.zeros(self.schedule.W)
        # Running sum restarts per worker: subtract the total of earlier workers.
        bounds = np.searchsorted(wsorted, np.arange(self.schedule.W + 1))
        for wk in range(self.schedule.W):
            lo, hi = bounds[wk], bounds[wk + 1]
            if hi > lo:
                base = cum[lo - 1] if lo > 0 else 0.0
                out[wk] = (cum[lo:hi] - base).max()
        return out

    @cached_property
    def peak_activations(self) -> np.ndarray:
        """Peak number of activations held per worker, shape [W] (int)."""
        return np.rint(self._peak(None)).astype(np.int64)

    @cached_property
    def peak_activation_bytes(self) -> np.ndarray | None:
        """Peak activation bytes per worker (needs ``activation_bytes``), shape [W]."""
        return None if self.activation_bytes is None else self._peak(self.activation_bytes)

    @cached_property
    def activation_transfers(self) -> np.ndarray:
        """Activations each worker receives: F(k,g) jobs whose F(k−1,g) ran elsewhere, shape [W]."""
        c = self.compiled
        m = (c.op == _F) & (c.dep1 >= 0)
        m[m] &= c.worker[c.dep1[m]] != c.worker[m]
        return np.bincount(c.worker[m], minlength=self.schedule.W)

    @cached_property
    def gradient_transfers(self) -> np.ndarray:
        """Gradients each worker receives: B/I(k,g) jobs whose stage-(k+1) gradient job ran elsewhere."""
        c = self.compiled
        m = ((c.op == _B) | (c.op == _I)) & (c.dep2 >= 0)
        m[m] &= c.worker[c.dep2[m]] != c.worker[m]
        return np.bincount(c.worker[m], minlength=self.schedule.W)

    @cached_property
    def weight_transfers(self) -> np.ndarray:
        """Weight fetches per worker, Rahimi's count: F jobs whose weight source is another worker."""
        c = self.compiled
        m = (c.op == _F) & (c.src != c.worker)
        return np.bincount(c.worker[m], minlength=self.schedule.W)

    @cached_property
    def weight_fetch_table(self) -> np.ndarray:
        """``[w, k]``: distinct versions of stage k that w's jobs use without holding k (the runtime's fetches).

        On a flushed schedule it equals :attr:`weight_transfers` iff each worker runs at most one micro-batch of each
        fetched stage per step (FSDP with M = W, FSLPP with B = G), else it is smaller by that count.
        """
        out = np.zeros((self.schedule.W, self.schedule.D), np.int64)
        for w, k, _ in self.weight_fetch_versions:
            out[w, k] += 1
        return out

    @cached_property
    def weight_fetch_versions(self) -> list[tuple[int, int, int]]:
        """Sorted ``(worker, stage, version)`` fetches behind :attr:`weight_fetch_table`."""
        c, s = self.compiled, self.schedule
        vt = self.version_table
        T, M = s.steps, s.M
        seen: set[tuple[int, int, int]] = set()
        for op, versions in ((_F, vt.forward), (_B, vt.backward), (_I, vt.backward), (_W, vt.backward)):
            ids = c.table[op].reshape(-1)
            for pos in np.flatnonzero(ids >= 0).tolist():
                i = int(ids[pos])
                w, k = int(c.worker[i]), int(c.stage[i])
                if w in s.weight_holders[k]:
                    continue
                t, j = divmod(pos % (T * M), M)
                seen.add((w, k, int(versions[k, t, j])))
        return sorted(seen)

    @cached_property
    def weight_fetches(self) -> np.ndarray:
        """Weight versions fetched per worker: :attr:`weight_fetch_table` summed over stages."""
        return self.weight_fetch_table.sum(axis=1)

    @cached_property
    def weight_storage(self) -> np.ndarray:
        """Stages whose weights each worker holds (its own copies), shape [W]."""
        out = np.zeros(self.schedule.W, np.int64)
        for hs in self.schedule.weight_holders:
            out[list(hs)] += 1
        return out

    # ------------------------------------------------------------ jobs and order
    def jobs(self) -> dict[str, np.ndarray]:
        """All actions as columns: op (str), stage, step, micro, worker, start, end (program order)."""
        c = self.compiled
        ops = np.array(["F", "B", "U", "I", "W"])[c.op]
        return {"op": ops, "stage": c.stage, "step": c.step, "micro": c.micro, "worker": c.worker,
                "start": self.start, "end": self.end}

    def _id(self, op: str, stage: int, step: int, micro: int, holder: int | None = None) -> int:
        c, s = self.compiled, self.schedule
        if op == "U":
            h = s.weight_holders[stage][0] if holder is None else holder
            m = np.flatnonzero((c.op[c.u_ids] == _U) & (c.stage[c.u_ids] == stage) & (c.step[c.u_ids] == step)
                               & (c.worker[c.u_ids] == h))
            if not m.size:
                raise ValueError(f"no update U{stage} of step {step} on worker {h}")
            return int(c.u_ids[m[0]])
        i = int(c.table[OP_CODE[op], stage, step * s.M + micro])
        if i < 0:
            raise ValueError(f"no job {op}{stage}.{micro} in step {step}")
        return i

    def time_of(self, op: str, stage: int, step: int, micro: int = -1) -> tuple[float, float]:
        """(start, end) of one action (for U: at stage k's first holder)."""
        i = self._id(op, stage, step, micro)
        return float(self.start[i]), float(self.end[i])

    def order_ids(self) -> np.ndarray:
        """Action ids in a valid execution order (see :meth:`order`)."""
        c = self.compiled
        isu = c.op == _U
        key_time = np.where(isu, self.end, self.start)
        return np.lexsort((self.seq, ~isu, key_time))

    @gc_paused
    def order(self) -> list[Action]:
        """Every action (U included) in a valid execution order, for replaying the schedule.

        Sorted by effective time (a job at its start, an update at its end, when its version becomes visible), updates
        first at ties, then by timing sequence: a replay sees exactly the updates the version table counts.
        """
        flat = [a for p in self.schedule.programs for a in p]
        return [flat[i] for i in self.order_ids().tolist()]

    # ------------------------------------------------------------ versions
    @cached_property
    @gc_paused
    def version_table(self) -> VersionTable:
        """Weight versions and staleness of every F and B, and I/W when split (see :class:`VersionTable`)."""
        c, s = self.compiled, self.schedule
        D, T, M = s.D, s.steps, s.M
        uids = c.u_ids
        first = np.array([hs[0] for hs in s.weight_holders])
        # Update end times per (stage, holder), in step order.
        uend_by: dict[tuple[int, int], np.ndarray] = {}
        if uids.size:
            keyk, keyw, keyt = c.stage[uids], c.worker[uids], c.step[uids]
            o = np.lexsort((keyt, keyw, keyk))
            uo = uids[o]
            kk, ww = keyk[o], keyw[o]
            cut = np.flatnonzero((np.diff(kk) != 0) | (np.diff(ww) != 0)) + 1
            for seg in np.split(np.arange(len(uo)), cut):
                ends = np.sort(self.end[uo[seg]])
                uend_by[(int(kk[seg[0]]), int(ww[seg[0]]))] = ends

        def versions(ids: np.ndarray) -> np.ndarray:
            out = np.zeros(len(ids), np.int64)
            if not ids.size:
                return out
            k, src = c.stage[ids], c.src[ids]
            key = k * s.W + src
            for kv in np.unique(key):
                m = key == kv
                ends = uend_by.get((int(kv // s.W), int(kv % s.W)))
                if ends is not None:
                    out[m] = np.searchsorted(ends, self.start[ids[m]], side="right")
            return out

        t = c.table
        fid = t[_F].reshape(D, T, M)
        # the backward's weights are decided by its gradient job: B, or I when split (W reuses I's graph);
        # a schedule may split some backwards and fuse others
        bid = np.where(t[_I] >= 0, t[_I], t[_B]).reshape(D, T, M)
        fv = versions(fid.reshape(-1)).reshape(D, T, M)
        bv = versions(bid.reshape(-1)).reshape(D, T, M)
        wid = np.where(t[_W] >= 0, t[_W], t[_B]).reshape(D, T, M) if s.split_backward else None
        uv = np.zeros((D, T), np.int64)
        ue = np.full((D, T), np.inf)
        for k in range(D):
            first_ends = uend_by.get((k, int(first[k])))
            if first_ends is None:
                continue
            ue[k, : len(first_ends)] = first_ends
            m = (c.stage[uids] == k) & (c.worker[uids] == first[k])
            ids = uids[m]
            # Updates of one holder run one after another: U(k,t)'s version is its rank among them.
            rank = np.lexsort((c.step[ids], self.end[ids]))
            uv[k, c.step[ids[rank]]] = np.arange(len(ids))
        if wid is None:
            return VersionTable(fv, bv, self.start[fid], self.start[bid], uv, ue, s.weight_rule, self.jobs_in_order)
        wv = versions(wid.reshape(-1)).reshape(D, T, M)
        return VersionTable(fv, bv, self.start[fid], self.start[bid], uv, ue, s.weight_rule, self.jobs_in_order,
                            weight_pass=wv, weight_pass_start=self.start[wid])

    @gc_paused
    def jobs_in_order(self) -> list[Job]:
        """:meth:`order` as jobs ``(op, k, t, j)``, each ``U(k, t)`` once: the version table's sequence."""
        seen: set[tuple[int, int]] = set()
        out: list[Job] = []
        for a in self.order():
            if a.op == "U":
                if (a.stage, a.step) in seen:
                    continue
                seen.add((a.stage, a.step))
            out.append((a.op, a.stage, a.step, a.micro))
        return out

    # ------------------------------------------------------------ links
    @cached_property
    def messages(self) -> Messages:
        """Every message (a tensor crossing to another worker), in the order of :class:`Messages`."""
        c = self.compiled
        if self.wire_times is not None:
            wires, begin, arrival = self.wire_times
            consumer, slot, latency = wires.consumer, wires.slot, wires.latency
        else:
            consumer, slot, _ = _message_edges(c)
            latency = np.where(slot == 1, self.latency[0][consumer], self.latency[1][consumer])
        kind = slot - 1
        boundary = c.stage[consumer] - 1 + kind
        sender = np.where(slot == 1, c.dep1[consumer], c.dep2[consumer])
        send = self.end[sender]
        ready = send + latency
        if self.wire_times is None:
            begin = arrival = ready
        wire = c.worker[consumer] * 2 + kind if self.network is not None and self.network.duplex else c.worker[consumer]
        nbytes = np.zeros(len(consumer)) if self.message_bytes is None else np.stack(self.message_bytes)[kind, boundary]
        return Messages(consumer, sender, boundary, kind, wire, nbytes, send, ready, begin, arrival)

    @property
    def receive_overhead(self) -> float:
        """o: seconds from a message's arrival until its consumer may start (:class:`~pipelab.links.Network`)."""
        return 0.0 if self.network is None else float(self.network.receive_overhead)

    @cached_property
    def link_busy(self) -> np.ndarray:
        """Transmission time per boundary and direction (Σ n/β of its messages), shape [D−1, 2] (forward, backward)."""
        m = self.messages
        out = np.zeros((self.schedule.D - 1, 2))
        np.add.at(out, (m.boundary, m.kind), m.arrival - m.begin)
        return out

    @property
    def link_utilisation(self) -> np.ndarray:
        """:attr:`link_busy` / (makespan × the wires its messages reach, at least 1), in [0, 1], shape [D−1, 2]."""
        m = self.messages
        wires = np.zeros((self.schedule.D - 1, 2))
        for b, k in set(zip(m.boundary.tolist(), m.kind.tolist())):
            wires[b, k] = len(np.unique(m.wire[(m.boundary == b) & (m.kind == k)]))
        return self.link_busy / (self.makespan * np.maximum(wires, 1))

    @property
    def wire_utilisation(self) -> np.ndarray:
        """Busy share of each inbound wire (transmitting / makespan), shape [W] (duplex: [2W], 2w + kind)."""
        m, n = self.messages, self.schedule.W * (2 if self.network is not None and self.network.duplex else 1)
        return np.bincount(m.wire, weights=m.arrival - m.begin, minlength=n) / self.makespan

    @cached_property
    def binding(self) -> Binding:
        """What bound each job's start (:data:`BINDINGS`), by priority.

        A message (its largest part of send → arrival, or "dependency" if it took no time), a weight barrier or an
        update's gradient jobs, the worker's previous job, an earlier dependency; "start" when nothing delayed it.
        """
        c, m, n = self.compiled, self.messages, self.compiled.n
        kind, job, msg, free = np.zeros(n, np.int64), np.full(n, -1), np.full(n, -1), np.ones(n, bool)

        def bind(ok: np.ndarray, k: np.ndarray | int, by: np.ndarray, mid: np.ndarray | None = None) -> None:
            ok &= free
            kind[ok] = k[ok] if isinstance(k, np.ndarray) else k
            job[ok], free[ok] = by[ok], False
            if mid is not None:
                msg[ok] = mid[ok]

        o = self.receive_overhead
        parts = np.stack([m.ready - m.send, m.begin - m.ready, m.arrival - m.begin, np.full(len(m.send), o)])
        mkind = np.append(np.where(parts.max(axis=0) > 0, 3 + parts.argmax(axis=0), 2), 0)
        # when the consumer may start: the very sum the timing loop takes (arrival + o)
        usable, sender, none = np.append(m.arrival + o, np.nan), np.append(m.sender, -1), len(m.send)
        mid = np.full((2, n), none)  # index ``none``: not a message (NaN arrival)
        mid[m.kind, m.consumer] = np.arange(none)
        for i in mid:
            bind(self.start == usable[i], mkind[i], sender[i], np.where(i < none, i, -1))
        d3 = c.dep3
        bind((d3 >= 0) & (self.start == self.end[d3] + self.latency[2]), 2, d3)
        if c.u_ids.size:
            last = c.udeps[np.arange(len(c.u_ids)), self.end[c.udeps].argmax(axis=1)]
            by = np.full(n, -1)
            by[c.u_ids] = last
            bind((by >= 0) & (self.start == self.end[by]), 2, by)
        prev = np.arange(n) - 1
        prev[c.offsets[:-1]] = -1
        after = self.end[prev] if self.dispatch is None else self.end[prev] + self.dispatch
        bind((prev >= 0) & (self.start == after), 1, prev)
        for d in (c.dep1, c.dep2):
            bind((d >= 0) & (self.start == self.end[d]), 2, d)
        return Binding(kind, job, msg)

    def critical_path(self) -> list[tuple[str, int, float]]:
        """The chain that bounds the makespan, first to last; its durations sum to the makespan.

        ``("job", id, cost)``; a message that bound a start: ``("latency", m, α)``, ``("transmission", m, n/β)``,
        preceded by the message ahead on its wire if it queued, then ``("overhead", m, o)`` (the receiver's,
        :class:`~pipelab.links.Network`); ``("latency", -1, ℓ)`` for a weight fetch; ``("dispatch", id, d)``
        before a job its worker's own time bound (``dispatch_cost``).
        """
        b, m = self.binding, self.messages
        o = np.lexsort((m.begin, m.wire))
        ahead = np.full(len(o), -1)
        ahead[o[1:]] = np.where(m.wire[o[1:]] == m.wire[o[:-1]], o[:-1], -1)
        out: list[tuple[str, int, float]] = []
        i = int(np.argmax(self.end))
        while i >= 0:
            out.append(("job", i, float(self.cost[i])))
            j, mm = int(b.job[i]), int(b.message[i])
            own = self.dispatch is not None and b.kind[i] <= 1  # its worker's previous end (or t = 0) bound it
            if own and self.dispatch is not None:
                out.append(("dispatch", i, float(self.dispatch[i])))
            if mm >= 0:
                out.append(("overhead", mm, self.receive_overhead))
            while mm >= 0:
                out.append(("transmission", mm, float(m.arrival[mm] - m.begin[mm])))
                if m.begin[mm] > m.ready[mm]:
                    mm = int(ahead[mm])
                    continue
                out.append(("latency", mm, float(m.ready[mm] - m.send[mm])))
                j, mm = int(m.sender[mm]), -1
            if j >= 0 and b.message[i] < 0 and not own and self.start[i] > self.end[j]:
                out.append(("latency", -1, float(self.start[i] - self.end[j])))
            i = j
        return [x for x in out[::-1] if x[0] == "job" or x[2] > 0]

    @property
    def link_time(self) -> float:
        """Share of the makespan the critical path spends in messages (the receiver's overhead included) and
        fetches (not computing, not dispatching)."""
        return sum(d for what, _, d in self.critical_path() if what not in ("job", "dispatch")) / self.makespan

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a JSON-able dict."""
        return {"schedule": self.schedule.name, "W": self.schedule.W, "D": self.schedule.D,
                "M": self.schedule.M, "steps": self.schedule.steps, "makespan": self.makespan,
                "bubble": self.bubble, "peak_activations": self.peak_activations.tolist(),
                "activation_transfers": self.activation_transfers.tolist(),
                "weight_transfers": self.weight_transfers.tolist()}


@gc_paused
def simulate(schedule: Schedule, f_cost: Cost = 1.0, b_cost: Cost = 1.0, *, u_cost: Cost = 0.0,
             i_cost: Cost | None = None, w_cost: Cost | None = None, transfer_cost: Cost = 0.0,
             weight_transfer_cost: Cost = 0.0, activation_bytes: Cost | None = None,
             weight_bytes: Cost | None = None, profile: Any = None, network: Network | None = None,
             message_bytes: MessageBytes | Cost | None = None,
             dispatch_cost: Cost | Mapping[str, Cost] = 0.0, job_cost: np.ndarray | None = None) -> SimResult:
    """Simulate ``schedule`` under a per-stage cost model, and optionally a link model.

    Args:
        f_cost, b_cost: forward / backward time per stage: scalar or D values, all > 0.
        transfer_cost: time to send stage k's output to k+1 (and its gradient back) between workers.
        weight_transfer_cost: time to fetch stage k's updated weights from another worker.
        network: a :class:`~pipelab.links.Network` instead of ``transfer_cost``: messages take α + n/β and queue
            on the receiver's wire, their consumers start o (``receive_overhead``) after the arrival at the
            earliest; with ``weight_bytes`` a placed schedule's collectives are costed too.
        message_bytes: bytes of each boundary's messages; needed when a link's bandwidth is finite.
        dispatch_cost: a worker's own time before each of its jobs (a runtime's bookkeeping between jobs, posting
            and handing over tensors: measured by :func:`pipelab.studies.calibration.measured_costs`), per stage or
            per op (``{"F": ..., "B": ..., "U": ...}``, each per stage; a missing op: 0); it delays the job, not
            its inputs, and is not counted as busy.
        job_cost: each action's own cost instead of its stage's (shape [n], in the order of
            :func:`~pipelab.schedules.compiled.compile_schedule`, as :attr:`SimResult.compiled`): e.g. durations
            drawn job by job (:func:`pipelab.studies.calibration.sampled_forecast`).

    Raises:
        ScheduleError: the schedule is malformed or deadlocks (grid printed, cell marked).

    Example:
        >>> from pipelab.schedules import gpipe
        >>> r = simulate(gpipe(D=4, M=8))
        >>> r.makespan, round(r.bubble, 3), r.peak_activations.tolist()
        (22.0, 0.273, [8, 8, 8, 8])
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"simulate() needs a Schedule, got {type(schedule).__name__}")
    if profile is not None:
        p = costs_from_profile(profile)
        f_cost, b_cost = p["f_cost"], p["b_cost"]
        activation_bytes = p.get("activation_bytes", activation_bytes)
        weight_bytes = p.get("weight_bytes", weight_bytes)
    D = schedule.D
    c = compile_schedule(schedule)
    if c.problems:
        msg, where = c.problems[0]
        raise ScheduleError(f"cannot simulate {schedule.name!r}: {msg}\n" + format_grid(schedule, where))
    cost = job_costs(c, f_cost, b_cost, u_cost, i_cost, w_cost)
    if job_cost is not None:
        jc = np.asarray(job_cost, dtype=np.float64)
        if jc.shape != cost.shape:
            raise ValueError(f"job_cost must have one value per action ({cost.shape[0]}), got shape {jc.shape}")
        cost = _checked_costs("job_cost", jc.copy(), "a negative or non-finite value", positive=False)
    ab = None if activation_bytes is None else _per_stage("activation_bytes", activation_bytes, D, positive=False)
    wb = None if weight_bytes is None else _per_stage("weight_bytes", weight_bytes, D, positive=False)
    lat, wires, mb = _links(c, cost, transfer_cost, weight_transfer_cost, network, message_bytes, wb)
    per_op = dispatch_cost if isinstance(dispatch_cost, Mapping) else dict.fromkeys(OP_CODE, dispatch_cost)
    if set(per_op) - set(OP_CODE):
        raise ValueError(f"dispatch_cost's keys must be ops among {', '.join(OP_CODE)}, got {sorted(per_op)}")
    dc = np.stack([_per_stage(f"dispatch_cost[{op!r}]", per_op.get(op, 0.0), D, positive=False) for op in OP_CODE])
    disp = dc[np.clip(c.op, 0, 4), np.clip(c.stage, 0, D - 1)] if dc.any() else None
    t = run(c, cost, *lat, wires, disp)
    if t.blocked:
        w, pos = t.blocked[0]
        raise ScheduleError(f"cannot simulate {schedule.name!r}: worker {w}'s action {schedule.programs[w][pos]} "
                            f"(position {pos}) can never run (deadlock; run validate() for details)\n"
                            + format_grid(schedule, (w, pos)))
    wire_times = None if wires is None else (wires, t.begin, t.arrival)
    return SimResult(schedule, c, t.start, t.end, cost, lat, t.seq, ab, wb, network, mb, wire_times, disp)


def _message_edges(c: Compiled) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cross-worker data edge: consumer, slot (1: input across boundary k−1; 2: gradient across k), boundary."""
    fin = (c.op == _F) | (c.op == _B) | (c.op == _I)
    cross1 = (c.dep1 >= 0) & (c.worker[np.maximum(c.dep1, 0)] != c.worker) & fin & (c.stage > 0)
    cross2 = (c.dep2 >= 0) & (c.worker[np.maximum(c.dep2, 0)] != c.worker)
    one, two = np.flatnonzero(cross1), np.flatnonzero(cross2)
    return (np.concatenate([one, two]), np.repeat([1, 2], [len(one), len(two)]),
            np.concatenate([c.stage[one] - 1, c.stage[two]]))


def _links(c: Compiled, cost: np.ndarray, transfer_cost: Cost, weight_transfer_cost: Cost, network: Network | None,
           message_bytes: MessageBytes | Cost | None, wb: np.ndarray | None
           ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], Wires | None, tuple[np.ndarray, np.ndarray] | None]:
    """Latency per dependency slot, the wires (or None) and the bytes per boundary; charges collectives to ``cost``."""
    D, n = c.schedule.D, c.n
    lat = (np.zeros(n), np.zeros(n), np.zeros(n))
    wc = _per_stage("weight_transfer_cost", weight_transfer_cost, D, positive=False)
    if wc.any():
        cross3 = (c.dep3 >= 0) & (c.src != c.worker)
        lat[2][cross3] = wc[c.stage[cross3]]
    if network is None:
        tc = np.asarray(transfer_cost, dtype=np.float64).reshape(-1)
        tc = _per_stage("transfer_cost", np.full(D, tc[0]) if tc.size == 1 else np.append(tc, 0.0)
                        if tc.size == D - 1 else tc, D, positive=False)
        if tc.any():  # free links leave every latency 0
            consumer, slot, boundary = _message_edges(c)
            for s in (1, 2):
                lat[s - 1][consumer[slot == s]] = tc[boundary[slot == s]]
        return lat, None, None
    consumer, slot, boundary = _message_edges(c)
    if not isinstance(network, Network) or network.D != D:
        raise ValueError(f"network must be a pipelab.links.Network for D={D} stages, got {network!r}")
    if np.any(np.asarray(transfer_cost) != 0):
        raise ValueError(f"give the network or transfer_cost, not both (transfer_cost={transfer_cost!r})")
    links = np.array([[x.latency, x.bandwidth] for x in network.forward + network.backward]).reshape(2, D - 1, 2)
    if message_bytes is None and np.isfinite(links[:, :, 1]).any():
        raise ValueError("the network has a finite bandwidth: pass message_bytes (pipelab.links.message_bytes)")
    mb = _boundary_bytes(message_bytes, D)
    kind = slot - 1
    alpha, beta = links[kind, boundary, 0], links[kind, boundary, 1]
    tx = mb[kind, boundary] / beta
    if wb is not None:
        if wc.any():
            raise ValueError("with a network and weight_bytes the collectives are costed from the links: leave "
                             f"weight_transfer_cost at 0, got {weight_transfer_cost!r}")
        _collectives(c, network, wb, cost, lat[2])
    o = float(network.receive_overhead)
    if not tx.any() and not o:  # nothing occupies a wire, nothing after it: arrival = send + α
        for s in (1, 2):
            lat[s - 1][consumer[slot == s]] = alpha[slot == s]
        return lat, None, (mb[0], mb[1])
    wire = c.worker[consumer] * 2 + kind if network.duplex else c.worker[consumer]
    for s in (1, 2):  # a lower bound (α + n/β + o) for the validator; the loop reads the wires
        lat[s - 1][consumer[slot == s]] = (alpha + tx + o)[slot == s]
    return lat, Wires(consumer, slot, wire, alpha, tx, o), (mb[0], mb[1])


def _boundary_bytes(message_bytes: MessageBytes | Cost | None, D: int) -> np.ndarray:
    """[activation, gradient] bytes per boundary, shape [2, D−1]."""
    if message_bytes is None:
        return np.zeros((2, D - 1))
    pair = message_bytes if isinstance(message_bytes, MessageBytes) else (message_bytes, message_bytes)
    arrs = [np.broadcast_to(np.asarray(x, dtype=np.float64), (D - 1,)) if np.ndim(x) == 0 else
            np.asarray(x, dtype=np.float64) for x in pair]
    if any(a.shape != (D - 1,) or not np.all(np.isfinite(a) & (a >= 0)) for a in arrs):
        raise ValueError(f"message_bytes must be >= 0 and finite, one number or one per boundary (D-1={D - 1}), "
                         f"got {message_bytes!r}")
    return np.stack(arrs)


def _collectives(c: Compiled, network: Network, wb: np.ndarray, cost: np.ndarray, lat3: np.ndarray) -> None:
    """Charge a placed schedule's α–β collectives: reductions onto each U(k, t), broadcasts as dep3 latency.

    Reduce to one holder, else ring all-reduce, on the link of the boundaries next to the members' stages.
    """
    s = c.schedule
    comp = c.op != _U
    computes: list[set[int]] = [set() for _ in range(s.D)]
    for k, w in zip(c.stage[comp].tolist(), c.worker[comp].tolist()):
        computes[k].add(w)
    near: list[set[int]] = [set() for _ in range(s.W)]
    for k, ws in enumerate(computes):
        for w in ws:
            near[w].update(b for b in (k - 1, k) if 0 <= b < s.D - 1)

    def time(kind: str, members: frozenset[int], k: int) -> float:
        link = network.collective_link(set().union(*(near[w] for w in members)), float(wb[k]))
        return collective_time(kind, len(members), float(wb[k]), link)

    groups: dict[tuple[int, frozenset[int]], float] = {}
    placed = [computes[k] != set(hs) or len(hs) > 1 for k, hs in enumerate(s.weight_holders)]
    for u, row in zip(c.u_ids.tolist(), c.udeps.tolist()):
        k = int(c.stage[u])
        if placed[k]:
            hs = s.weight_holders[k]
            members = frozenset(hs) | frozenset(c.worker[row].tolist())
            if (k, members) not in groups:
                groups[(k, members)] = time("reduce" if len(hs) == 1 else "all_reduce", members, k)
            cost[u] += groups[(k, members)]
    fetch = (c.dep3 >= 0) & (c.src != c.worker)
    for k in np.unique(c.stage[fetch]).tolist():
        hs = s.weight_holders[k]
        lat3[fetch & (c.stage == k)] = time("broadcast", frozenset({hs[0]} | (computes[k] - set(hs))), k)


class SteadyState(NamedTuple):
    """A flushed schedule step after step: bubble per step, peak activations of the busiest worker, period."""

    bubble: float
    peak: float
    period: float


def steady_state(build: Callable[[int, int, int], Schedule], W: int, M: int, *, t_f: float = 1.0,
                 t_i: float = 1.0, t_w: float = 1.0, scale: float = 1.0, activation: float | None = None
                 ) -> SteadyState | None:
    """Measure ``build(W, M, steps)`` run step after step, or ``None`` where the builder refuses the size.

    Costs F = ``t_f``, I = ``t_i``, W = ``t_w`` (fused B: ``t_i + t_w``), times ``scale`` (2W half-size chunks: 0.5);
    activation size ``activation`` (default ``scale``). period = makespan(3 steps) − makespan(2 steps);
    bubble = 1 − (mean work per worker per step) / period.

    Example:
        >>> from pipelab.schedules import zb_h2
        >>> steady_state(zb_h2, 4, 8)
        SteadyState(bubble=0.0, peak=7.0, period=24.0)
    """
    t_f, t_i, t_w, scale = (check_cost(n, v, positive=True) for n, v in (("t_f", t_f), ("t_i", t_i), ("t_w", t_w),
                                                                           ("scale", scale)))
    if activation is not None:
        activation = check_cost("activation", activation)
    try:
        two, three = build(W, M, 2), build(W, M, 3)
    except ValueError:
        return None
    act = scale if activation is None else activation
    r2, r3 = (simulate(s, t_f * scale, (t_i + t_w) * scale, i_cost=t_i * scale, w_cost=t_w * scale,
                       activation_bytes=act) for s in (two, three))
    period = r3.makespan - r2.makespan
    c = r3.compiled
    work = float(r3.cost[(c.step == 0) & (c.op != OP_CODE["U"])].sum()) / W
    assert r3.peak_activation_bytes is not None  # activation_bytes given
    return SteadyState(1.0 - work / period, float(r3.peak_activation_bytes.max()), period)
