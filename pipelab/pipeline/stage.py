"""One pipeline stage's work — forward, backward (whole or split), update — shared by the emulator and the runtime.

A :class:`StageExecutor` owns stage k's module, its ``torch.optim`` optimizer, its ring of weight versions and its
jobs' weight specs. It knows nothing about transport (the emulator hands tensors over in memory, the runtime
between ranks), so both drivers execute exactly the same arithmetic; the F/B/I/W/U rules are stated in
:mod:`pipelab.emulator.emulator`. Versions are dropped after their last use, counted in the stage's own event
sequence (the same in the global order and in a rank's program).

The weights W are the *trainable* parameters (:func:`trainable_parameters`), read once at construction: a frozen
one (``requires_grad=False``) is read from the module by every job and never versioned, predicted or stepped, as
``torch.optim`` skips a parameter without a gradient; :meth:`StageExecutor.full_weights` puts it back for users.
A stage without any still runs its jobs and passes gradients on; its U only advances the version counter (its
ring holds empty tuples).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from ..policies import GradientContext, Policy, Stored, WeightSpec
from ..precision import FP32, Precision
from ..schedules.dependencies import Job
from .loss_scale import LossScaler
from .rings import StageEvents, VersionRing
from .transport import check_handover, describe_handover, grad_leaves, map_tensors, modifies_leaf_in_place, tensors_of

if TYPE_CHECKING:
    from .plan import JobSpecs

__all__ = ["StageExecutor", "trainable_parameters"]


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``module`` a pipeline trains (``requires_grad``): what every optimizer factory is given."""
    return [p for p in module.parameters() if p.requires_grad]


class StageExecutor:
    """Stage k of a pipeline: weights, optimizer, version ring, and its F/B/U (and I/W) jobs.

    Args:
        optimizer: over exactly ``module``'s trainable parameters; ``None`` for a stage without any (and only then).
        events: this stage's events in execution order, each version's uses, the ring's capacity.
        policy, table: for the learning-rate factor (PipeMare) of ``U(k, t)``.
        precision: autocast, hand-over and stored-version dtypes; ``scaler`` (set by the plan for fp16): the run's
            shared loss scale.
    """

    def __init__(self, k: int, D: int, M: int, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                 events: StageEvents, specs: JobSpecs, policy: Policy, table: Any,
                 loss_fn: Callable[[Tensor, Tensor], Tensor], recompute: bool = False,
                 precision: Precision = FP32) -> None:
        self.k, self.D, self.M = k, D, M
        self.module = module
        named = list(module.named_parameters())
        # the weights W: the trainable parameters; frozen ones stay in the module (module docstring)
        self.names = [n for n, p in named if p.requires_grad]
        self.params = [p for _, p in named if p.requires_grad]
        trainable = {id(p): i for i, p in enumerate(self.params)}
        #: per named parameter: its index in W, or the frozen parameter itself (for :meth:`full_weights`)
        self._slots: list[int | Tensor] = [trainable.get(id(p), p) for _, p in named]
        self._weight_slots, self._buffer_slots = _call_slots(module, self.params)
        self.optimizer = optimizer
        self.opt_order = _optimizer_order(k, optimizer, self.params, len(named) - len(self.params))
        self.inv_order = _inverse(self.opt_order)
        self.specs, self.events = specs, events
        self.uses = events.uses.tolist()  # uses of each version left: at 0 it goes, unless it is the newest
        self.policy, self.table, self.loss_fn, self.recompute = policy, table, loss_fn, recompute
        self.ring = VersionRing(events.capacity, k, recycle=events.capacity > 1)  # copies reuse tensors (rings.py)
        self.precision = precision
        self.scaler: LossScaler | None = None
        self.store_dtype = precision.version_dtype()  # None: stored/predicted copies in the master dtype
        # A stage that never holds two versions at once (flushed schedules) stores its one version as views
        # of the live parameters: the optimizer step that overwrites them comes after the version's last use.
        self.share_live = events.capacity == 1
        self.version = 0
        self.position = 0  # index of the next event in ``events``
        self.scheduler: Any = None
        self.predictor: Any = None
        #: optional observer ``on_weights(event, spec, W)``: called with the weights :meth:`weights` hands to each
        #: job (``event``: the running ``(op, t, j)``); it must not modify ``W`` (pipelab.prediction_error reads it)
        self.on_weights: Callable[[tuple[str, int, int], WeightSpec, tuple[Tensor, ...]], None] | None = None
        self.saved: dict[tuple[int, int], tuple] = {}
        self.pending: dict[tuple[int, int], tuple] = {}  # split backward: I's graph waiting for its W
        self.acc: dict[int, list[Tensor | None]] = {}  # step t's gradient sum (None: none reached it)
        self.used_sum: dict[int, list[Tensor]] = {}  # Σ_j backward weights of step t (keeps_backward_weights)
        self.policy_state: dict[str, Any] = {}  # the policy's per-stage state (correct_gradient)
        self.current: dict[Job, int] = {}  # cur(job): the version current when each F/B job ran
        # (t, j, shapes and dtypes, description) of the first forward's input
        self.first_input: tuple[int, int, list[tuple[torch.Size, torch.dtype]], str] | None = None
        # whether the stage's first call ran, and whether the module needs a copy of its input (it modifies its
        # input in place: :meth:`_call_input`)
        self.input_checked, self.clone_input = False, False
        for p in self.params:  # before the first update the "last gradient" some predictors read is zero
            p.grad = torch.zeros_like(p)
        self.ring.put(0, self.snapshot())

    # ------------------------------------------------------------------------------------- weights

    def snapshot(self) -> tuple[Tensor, ...]:
        """The current weights as a stored version: a copy, or views of the live weights (``share_live``)."""
        if self.share_live:
            return tuple(p.detach().requires_grad_(p.requires_grad) for p in self.params)
        W = self.ring.reusable()
        if W is not None:  # the same values, dtype cast included, as the fresh copies below
            with torch.no_grad():
                for w, p in zip(W, self.params):  # a stored version keeps no .grad (_weight_grads)
                    w.copy_(p)
            return W
        if self.store_dtype is not None:  # a half-precision working copy (Precision.versions="compute")
            return tuple(p.detach().to(self.store_dtype, copy=True).requires_grad_(p.requires_grad)
                         for p in self.params)
        return tuple(p.detach().clone().requires_grad_(p.requires_grad) for p in self.params)

    def full_weights(self, W: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """Weights ``W`` (trainable, in :attr:`names` order) with the frozen parameters, in ``named_parameters``
        order: what users read (snapshots, final weights, :func:`pipelab.evaluate`)."""
        return tuple(W[s] if isinstance(s, int) else s.detach() for s in self._slots)

    def call(self, weights: Sequence[Tensor], x: Any, fresh_buffers: bool = False) -> Any:
        """The stage at weights W (frozen parameters and buffers from the module) on input ``x``.

        As :func:`torch.func.functional_call`, but with the slots (every alias of a tied weight) found once.
        """
        swaps = [(slot, w) for slots, w in zip(self._weight_slots, weights) for slot in slots]
        if fresh_buffers:
            copies: dict[int, Tensor] = {}
            for d, n in self._buffer_slots:
                if id(d[n]) not in copies:
                    copies[id(d[n])] = d[n].clone()
                swaps.append(((d, n), copies[id(d[n])]))
        held = [(d, n, d[n]) for (d, n), _ in swaps]
        try:
            for (d, n), w in swaps:
                d[n] = w
            out = self.module(x)
        finally:
            for d, n, w in held:
                d[n] = w
        if self.k == self.D - 1:
            return out
        check_handover(out, self.k)
        return map_tensors(self.precision.handover, out)  # activations in the compute dtype

    def weights(self, spec: WeightSpec, grad: bool) -> tuple[Tensor, ...]:
        """The weights a job's spec names: a stored version, or a prediction from one (none without parameters)."""
        if not self.params:
            return ()
        if isinstance(spec, Stored):
            W = self.ring.get(spec.version)
            if self.on_weights is not None:
                self.on_weights(self.events[self.position], spec, W)
            return W
        base = self.ring.get(spec.base)
        opt_base = [base[i] for i in self.inv_order]
        if self.store_dtype is not None:  # predictors run on the masters' dtype
            opt_base = [w.to(self.params[self.inv_order[i]].dtype) for i, w in enumerate(opt_base)]
        if spec.kind == "correction":
            # PipeMare: W^(base) + s·δ, with δ read from the predictor as Ŵ_{+1} − W (s < 0)
            ahead = self.predictor.predict(self.optimizer, 1, params=opt_base)
            # in place on one temporary: the same roundings as w + s·(a − w), two weight-sized allocations fewer
            out = [torch.sub(a, w.detach()).mul_(spec.s).add_(w.detach()) for w, a in zip(opt_base, ahead)]
        else:
            out = self.predictor.predict(self.optimizer, spec.s, params=opt_base)
        W = tuple(out[i] for i in self.opt_order)
        if self.store_dtype is not None:
            W = tuple(w.detach().to(self.store_dtype) for w in W)
        if self.on_weights is not None:
            self.on_weights(self.events[self.position], spec, W)
        return tuple(w.detach().requires_grad_(True) for w in W) if grad else W

    # ------------------------------------------------------------------------------------- jobs

    def _begin(self, op: str, t: int, j: int) -> None:
        """Check that ``(op, t, j)`` is the stage's next event; record the version current at an F/B/I/W job."""
        expected = self.events[self.position] if self.position < len(self.events) else None
        if expected != (op, t, j):
            raise RuntimeError(f"stage {self.k}: expected event {expected}, got {(op, t, j)}: the execution order "
                               "does not match the version table")
        if op != "U":
            self.current[(op, self.k, t, j)] = self.version

    def _advance(self, used: int | None = None) -> None:
        """The event ran: one use fewer of the version it used (gone at the last one, unless it is the newest)."""
        if used is not None:
            self.uses[used] -= 1
            if not self.uses[used] and used != self.version:
                self.ring.drop(used)
        self.position += 1

    def forward(self, t: int, j: int, x_in: Tensor, target: Tensor | None = None) -> Tensor:
        """F(k, t, j): the stage output (detached), or on the last stage the micro-batch loss ℓ/M."""
        self._begin("F", t, j)
        last = self.k == self.D - 1
        if last and target is None:
            raise ValueError(f"the last stage's forward of micro-batch ({t}, {j}) needs its target")
        spec_f, spec_b = self.specs.pair(self.k, t, j)
        # the graph is kept for the backward when it runs at the same stored weights; else it is recomputed then
        keep = spec_f == spec_b and isinstance(spec_f, Stored) and not self.recompute
        W = self.weights(spec_f, grad=False)
        device = tensors_of(x_in)[0].device
        rng = _rng_state(device)
        if keep and self.k > 0:
            for x in grad_leaves(x_in):
                x.requires_grad_(True)
        with torch.set_grad_enabled(keep), self.precision.autocast(device):
            out = self._first_call(t, j, W, x_in)
            if last:
                out = self.loss_fn(out, cast(Tensor, target)) / self.M
        self.saved[(t, j)] = ("graph", x_in, rng, target, out, W) if keep else ("recompute", x_in, rng, target)
        self._advance(self.specs.need("F", self.k, t, j))
        return map_tensors(Tensor.detach, out)

    def _first_call(self, t: int, j: int, W: Sequence[Tensor], x_in: Any) -> Any:
        """The forward's stage call; an input whose form differs from the stage's first one (a mini-batch whose
        shape changed mid-run) that the stage rejects is named (ValueError, the stage's error chained)."""
        form = [(x.shape, x.dtype) for x in tensors_of(x_in)]
        if self.first_input is None:
            self.first_input = (t, j, form, describe_handover(x_in))
        try:
            return self._call_input(W, x_in)
        except Exception as exc:
            t0, j0, first_form, first = self.first_input
            if form == first_form:
                raise
            here = describe_handover(x_in)
            raise ValueError(f"stage {self.k} failed on micro-batch {j} of mini-batch {t}, whose input is {here}; its "
                             f"first input (mini-batch {t0}, micro-batch {j0}) was {first}: the model does not accept "
                             f"the changed shape ({type(exc).__name__}: {exc})") from exc

    def _call_input(self, W: Sequence[Tensor], x_in: Any, fresh_buffers: bool = False) -> Any:
        """:meth:`call` on the stage input ``x_in``: the leaf the input gradient is taken against, or the input
        kept for a recompute. A module that modifies its input in place (``nn.ReLU(inplace=True)`` or ``x.mul_``
        first: fine on plain torch's intermediate result) would raise on such a leaf, or change the kept input under
        the recompute; it gets a copy of the input instead. The stage's first call tries the input itself and, on
        that error or when the input's version counter moved, is repeated from the same buffers, random state and
        input on a copy, as every later call then is (one activation per micro-batch, for such stages only)."""
        if self.input_checked:
            return self.call(W, self._module_input(x_in), fresh_buffers)
        xs = tensors_of(x_in)
        held = [] if fresh_buffers else [d[n].clone() for d, n in self._buffer_slots]
        rng, kept = _rng_state(xs[0].device), [x.detach().clone() for x in xs]
        versions = [x._version for x in xs]
        try:
            out = self.call(W, x_in, fresh_buffers)
            modified = any(x._version != v for x, v in zip(xs, versions))
        except RuntimeError as exc:
            if not modifies_leaf_in_place(exc):
                raise
            modified = True
        if modified:  # undo what the call changed (the input, BatchNorm's statistics, the random state), then copy
            with torch.no_grad():
                for x, k in zip(xs, kept):
                    x.copy_(k)
                for (d, n), b in zip(self._buffer_slots, held):
                    d[n].copy_(b)
            torch.set_rng_state(rng[0])
            if rng[1] is not None:
                torch.cuda.set_rng_state(rng[1], xs[0].device)
            self.clone_input = True
            out = self.call(W, self._module_input(x_in), fresh_buffers)
        self.input_checked = True
        return out

    def _module_input(self, x_in: Any) -> Any:
        """What the module is called on: ``x_in``, or a copy of its tensors (:meth:`_call_input`)."""
        if not self.clone_input:
            return x_in
        return map_tensors(Tensor.clone, x_in)

    def _graph(self, t: int, j: int) -> tuple[Any, Any, tuple[Tensor, ...]]:
        """``(x_in, out, W)`` for micro-batch (t, j)'s backward: the forward's graph when it ran at the backward's
        weights, else the stage forward recomputed at them (same random state, fresh buffers)."""
        entry = self.saved.pop((t, j))
        if entry[0] == "graph":
            _, x_in, _, _, out, W = entry
            return x_in, out, W
        _, x0, rng, target = entry
        W = self.weights(self.specs.spec("B", self.k, t, j), grad=True)
        x_in, out = self._replay_forward(W, x0, rng, target)
        return x_in, out, W

    def _replay_forward(self, W: Sequence[Tensor], x0: Any, rng: tuple[Tensor, Tensor | None],
                        target: Tensor | None) -> tuple[Any, Any]:
        """The stage forward at weights ``W`` from the saved input ``x0`` and random state ``rng``, with a graph
        (fresh buffers; the loss ℓ/M on the last stage): a recompute, or a graph rebuilt after a checkpoint."""
        x_in = map_tensors(lambda x: x.detach().requires_grad_(self.k > 0 and x.is_floating_point()), x0)
        device = tensors_of(x0)[0].device
        with torch.enable_grad(), _replay_rng(device, rng), self.precision.autocast(device):
            out = self._call_input(W, x_in, fresh_buffers=True)
            if self.k == self.D - 1:
                out = self.loss_fn(out, cast(Tensor, target)) / self.M
        return x_in, out

    def _weight_grads(self, t: int, out: Any, g_out: Any, W: Sequence[Tensor], xs: Sequence[Tensor] = ()
                      ) -> list[Tensor | None]:
        """The vector–Jacobian product of B (or W) at weights ``W``: the weight gradient is added into step t's sum,
        and the input gradients of ``xs`` are returned (``None`` where unreached).

        As ``loss.backward()`` accumulates into ``.grad``, autograd adds each weight's gradient into the step's sum
        (set as ``W``'s ``.grad`` for the call) as soon as it is computed and frees it, so a micro-batch's gradients
        are never all held at once: returning them all and summing afterwards held a stage's worth of extra
        gradient memory and freed it in one block, which the C allocator returned to the system and faulted in
        again at the next backward. The first micro-batch's gradient becomes the sum; bitwise the same sums.
        Half-precision copies (``store_dtype``) accumulate in the master dtype instead (:meth:`_accumulate`).
        """
        if self.store_dtype is not None:
            grads = self._vjp(out, g_out, [*W, *xs])
            self._accumulate(t, W, grads[:len(W)])
            return grads[len(W):]
        self._sum_backward_weights(t, W)
        for w, g in zip(W, self.acc.get(t, ())):
            w.grad = g
        try:
            pairs = _pairs(out, g_out)
            if pairs and (W or xs):
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs], inputs=[*W, *xs])
            # None where no gradient reached the weight this step (yet): as in plain torch, such a weight is then
            # left out of the optimizer step (no weight decay, no moment update), not stepped with a zero gradient
            self.acc[t] = [w.grad for w in W]
            return [x.grad for x in xs]
        finally:  # W is a stored version (or a prediction) other jobs read: it keeps no gradient
            for x in (*W, *xs):
                x.grad = None

    def _sum_backward_weights(self, t: int, W: Sequence[Tensor]) -> None:
        """``keeps_backward_weights``: add the weights of step t's backward into their sum (:meth:`_corrected`)."""
        if not (self.policy.keeps_backward_weights and W):
            return
        if self.store_dtype is not None:
            W = [w.to(p.dtype) for w, p in zip(W, self.params)]
        if t in self.used_sum:
            torch._foreach_add_(self.used_sum[t], [w.detach() for w in W])
        else:
            self.used_sum[t] = [w.detach().clone() for w in W]

    def _accumulate(self, t: int, W: Sequence[Tensor], grads: Sequence[Tensor | None]) -> None:
        """Add step t's weight gradient ``grads`` of half-precision copies ``W`` into its sum, in the master dtype."""
        pgrads = [None if g is None else g.to(p.dtype) for g, p in zip(grads, self.params)]
        self._sum_backward_weights(t, W)
        if t not in self.acc:
            self.acc[t] = pgrads
            return
        acc = self.acc[t]
        for i, g in enumerate(pgrads):  # None: no gradient reached the weight (see _weight_grads)
            a = acc[i]
            if g is not None:
                acc[i] = g if a is None else a.add_(g)

    def backward(self, t: int, j: int, g_out: Any) -> Any:
        """B(k, t, j): accumulate the weight gradient; return the input gradient (``None`` on stage 0)."""
        self._begin("B", t, j)
        x_in, out, W = self._graph(t, j)
        xs = grad_leaves(x_in) if self.k > 0 else []
        x_grads = self._weight_grads(t, out, self._seed(t, out, g_out), W, xs)
        self._advance(self.specs.need("B", self.k, t, j))
        return _input_grad(x_in, x_grads) if self.k > 0 else None

    def _vjp(self, out: Any, g_out: Any, inputs: list[Tensor], retain: bool = False) -> list[Tensor | None]:
        """(∂out/∂inputs)ᵀ g_out over the outputs that require grad (``None`` for an input it does not reach)."""
        pairs = _pairs(out, g_out)
        if not inputs or not pairs:
            return [None] * len(inputs)
        return list(torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True,
                                        retain_graph=retain))

    def input_grad(self, t: int, j: int, g_out: Any) -> Any:
        """I(k, t, j) of a split backward: the input gradient (∂out/∂x)ᵀg alone (``None`` on stage 0).

        The graph (at the backward's weights) and g are kept for W(k, t, j) (Qi et al., "Zero Bubble Pipeline
        Parallelism", ICLR 2024, §2).
        """
        self._begin("I", t, j)
        entry = self.saved[(t, j)][:4]
        x_in, out, W = self._graph(t, j)
        g_out = self._seed(t, out, g_out)
        g_in = None
        if self.k > 0:
            xs = grad_leaves(x_in)
            g_in = _input_grad(x_in, self._vjp(out, g_out, xs, retain=True))
        self.pending[(t, j)] = (entry, out, W, g_out)
        self._advance(self.specs.need("B", self.k, t, j))
        return g_in

    def weight_grad(self, t: int, j: int) -> None:
        """W(k, t, j) of a split backward: (∂out/∂W)ᵀg from I's graph (with I, exactly B's result)."""
        self._begin("W", t, j)
        _, out, W, g_out = self.pending.pop((t, j))
        self._weight_grads(t, out, g_out, W)
        self._advance(self.specs.need("B", self.k, t, j))

    def update(self, t: int) -> tuple[Tensor, ...]:
        """U(k, t): step the optimizer with step t's accumulated gradient; store and return the new version."""
        self._begin("U", t, -1)
        # fp16: an overflow in any stage's gradient of step t skips step t on every stage (read before the pop)
        skipped = self.scaler.decide(t)[0] if self.scaler is not None and t in self.acc else False
        grads = self.acc.pop(t, None)
        if grads is None:
            raise RuntimeError(f"update of stage {self.k} for step {t} has no gradient")
        if self.scaler is not None:
            grads = self.scaler.unscale(t, grads)
        if self.optimizer is not None and not skipped:  # a stage without parameters only counts the version
            self._step(t, grads)
        # p.grad keeps the last gradient (as after a plain optimizer.step()); some predictors read it
        if self.scheduler is not None:
            self.scheduler.step()
        if self.predictor is not None and getattr(self.predictor, "needs_history", False):
            self.predictor.observe(self.optimizer)
        old = self.version
        self.version += 1
        if not self.uses[old]:  # no job left uses it: updated in place, no stored copy is needed
            self.ring.drop(old)
        W = self.snapshot()
        self.ring.put(self.version, W)
        self._advance()
        return W


    def _seed(self, t: int, out: Any, g_out: Any) -> Any:
        """The backward's seed: :func:`_seed`'s, or on the last stage under fp16 loss scaling, S instead of 1."""
        if self.scaler is not None and g_out is None:
            return torch.full_like(out, self.scaler.seed(t))
        return _seed(out, g_out)

    def _step(self, t: int, grads: list[Tensor | None]) -> None:
        """The optimizer step of U(k, t) with the accumulated gradient, PipeMare's learning-rate factor applied."""
        assert self.optimizer is not None
        if self.policy.corrects_gradient:  # the corrections keep per-weight state: every weight takes part
            grads = list(self._corrected(t, [torch.zeros_like(p) if g is None else g
                                             for g, p in zip(grads, self.params)]))
        for p, g in zip(self.params, grads):
            p.grad = g
        factor = self.policy.lr_factor(self.table, self.k, t)
        groups = self.optimizer.param_groups
        saved_lr = [group["lr"] for group in groups]
        if factor != 1.0:
            for group in groups:
                group["lr"] = group["lr"] * factor
        self.optimizer.step()
        if factor != 1.0:
            for group, lr in zip(groups, saved_lr):
                group["lr"] = lr

    def _corrected(self, t: int, grads: list[Tensor]) -> list[Tensor]:
        """The policy's correction of step t's gradient (error feedback, DC-ASGD), told the versions its backwards
        used and, with ``keeps_backward_weights``, their mean weights (summed per micro-batch by :meth:`_accumulate`:
        one buffer per step in flight, as the versions may be dropped by then)."""
        used = tuple(self.specs.target["B"][self.k, t].tolist())
        total = self.used_sum.pop(t, None)
        mean = None if total is None else tuple(w / self.M for w in total)
        ctx = GradientContext(self.k, t, self.version, used, tuple(p.detach() for p in self.params), mean,
                              self.policy_state)
        return list(self.policy.correct_gradient(ctx, list(grads)))

    # ------------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this stage mid-run: weights, stored versions, saved inputs,
        accumulated gradients, optimizer, scheduler and predictor state, and the event position."""
        predictor_state = None
        if self.predictor is not None and hasattr(self.predictor, "state_dict"):
            predictor_state = self.predictor.state_dict(self.optimizer)
        return {
            "k": self.k, "version": self.version, "position": self.position, "uses": list(self.uses),
            "module": {n: t.detach().clone() for n, t in self.module.state_dict().items()},
            "ring": {v: self.ring.get(v) for v in self.ring.versions()}, "ring_peak": self.ring.peak,
            "saved": {key: entry[:4] for key, entry in self.saved.items()},  # graphs are rebuilt on load
            # I ran, W not yet: I's weights and g are kept so that the graph is rebuilt at exactly those weights
            "pending": {key: (entry, tuple(w.detach() for w in W), g)
                        for key, (entry, _, W, g) in self.pending.items()},
            "acc": self.acc, "current": self.current, "used_sum": self.used_sum, "policy_state": self.policy_state,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "predictor": predictor_state,
            "grads": [p.grad for p in self.params],
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,  # fp16's loss scale
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a freshly built executor of the same stage and plan."""
        if state["k"] != self.k:
            raise ValueError(f"checkpoint of stage {state['k']} loaded into stage {self.k}")
        self.module.load_state_dict(state["module"])
        self.version, self.position = state["version"], state["position"]
        self.uses = list(state["uses"])
        for v in self.ring.versions():
            self.ring.drop(v)
        for v, W in sorted(state["ring"].items()):
            self.ring.put(v, W)
        self.ring.peak = max(self.ring.peak, state["ring_peak"])
        self.acc, self.current = state["acc"], state["current"]
        self.used_sum, self.policy_state = state.get("used_sum", {}), state.get("policy_state", {})
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.predictor is not None and state["predictor"] is not None:
            self.predictor.load_state_dict(self.optimizer, state["predictor"])
        for p, g in zip(self.params, state["grads"]):
            p.grad = g
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.saved = {}
        for (t, j), (kind, x_in, rng, target) in state["saved"].items():
            if kind == "recompute":
                self.saved[(t, j)] = (kind, x_in, rng, target)
                continue
            # rebuild the forward's graph at the same stored weights and random state: bitwise the same
            W = self.weights(self.specs.spec("F", self.k, t, j), grad=False)
            x_graph, out = self._replay_forward(W, x_in, rng, target)
            self.saved[(t, j)] = (kind, x_graph, rng, target, out, W)
        self.pending = {}
        for (t, j), (entry, weights, g) in state.get("pending", {}).items():
            # I ran before the checkpoint: its graph is rebuilt at exactly I's weights
            W = tuple(w.detach().requires_grad_(True) for w in weights)
            _, out = self._replay_forward(W, entry[1], entry[2], entry[3])
            self.pending[(t, j)] = (entry, out, W, g)


def _slot(module: nn.Module, name: str, kind: str) -> tuple[dict, str]:
    """Where tensor ``name`` of ``module`` lives: its submodule's ``_parameters`` or ``_buffers`` (``kind``), key."""
    prefix, _, attr = name.rpartition(".")
    return getattr(module.get_submodule(prefix), kind), attr


def _call_slots(module: nn.Module, params: Sequence[Tensor]
                ) -> tuple[list[list[tuple[dict, str]]], list[tuple[dict, str]]]:
    """Where :meth:`StageExecutor.call` puts each trainable weight (every alias of a tied one), and each buffer."""
    where: dict[int, list[tuple[dict, str]]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        where.setdefault(id(p), []).append(_slot(module, n, "_parameters"))
    return [where[id(p)] for p in params], [_slot(module, n, "_buffers")
                                            for n, _ in module.named_buffers(remove_duplicate=False)]


def _optimizer_order(k: int, optimizer: torch.optim.Optimizer | None, params: Sequence[Tensor], frozen: int
                     ) -> list[int]:
    """The position of each of stage k's trainable ``params`` in the optimizer's param_groups (the order the
    predictors use), after checking that the optimizer holds exactly them (``None`` only for a stage without)."""
    if optimizer is None and params:
        raise ValueError(f"stage {k} has trainable parameters, so it needs an optimizer (None is for stages "
                         "without)")
    opt_params = [] if optimizer is None else [p for g in optimizer.param_groups for p in g["params"]]
    if {id(p) for p in opt_params} != {id(p) for p in params} or len(opt_params) != len(params):
        raise ValueError(f"the optimizer of stage {k} holds {len(opt_params)} parameters, not exactly the stage's "
                         f"{len(params)} trainable ones ({frozen} frozen, requires_grad=False, are not "
                         "trained): build it over the parameters the factory is given")
    pos = {id(p): i for i, p in enumerate(opt_params)}
    return [pos[id(p)] for p in params]


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


class _replay_rng:
    """Context manager: run with a recorded RNG state, then restore the current one."""

    def __init__(self, device: torch.device, state: tuple[Tensor, Tensor | None]) -> None:
        self.device, self.state = device, state

    def __enter__(self) -> None:
        self.saved = _rng_state(self.device)
        torch.set_rng_state(self.state[0])
        if self.state[1] is not None:
            torch.cuda.set_rng_state(self.state[1], self.device)

    def __exit__(self, *exc: object) -> None:
        torch.set_rng_state(self.saved[0])
        if self.saved[1] is not None:
            torch.cuda.set_rng_state(self.saved[1], self.device)


def _pairs(out: Any, g_out: Any) -> list[tuple[Tensor, Any]]:
    """``(output, its gradient)`` for the outputs of a stage call that require grad (what a backward starts from)."""
    seeds = [g_out] if isinstance(out, Tensor) else list(g_out)
    return [(o, g) for o, g in zip(grad_leaves(out), seeds) if o.requires_grad]


def _input_grad(x_in: Any, grads: Sequence[Tensor | None]) -> Any:
    """The gradient handed back for hand-over ``x_in`` (:mod:`~pipelab.pipeline.transport`), zeros where unreached."""
    full = [torch.zeros_like(x) if g is None else g for x, g in zip(grad_leaves(x_in), grads)]
    return full[0] if isinstance(x_in, Tensor) and x_in.is_floating_point() else tuple(full)


def _seed(out: Any, g_out: Any) -> Any:
    """The gradient the backward starts from: the received one, or on the last stage (``None``) the implicit 1 of a
    scalar loss; a vector of independent arms' losses (:mod:`pipelab.studies.stacking`) is seeded with ones, i.e. the
    backward of their sum, whose gradient with respect to each arm's weights is that arm's own."""
    if g_out is None and isinstance(out, Tensor) and out.ndim:
        return torch.ones_like(out)
    return g_out
