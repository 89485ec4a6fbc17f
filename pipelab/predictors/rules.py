"""Update rules of ``torch.optim`` optimizers as pure functions of (state, hyper-parameters, weights, gradient).

Every predictor that follows the optimizer goes through one :class:`UpdateRule` per family, which reads the
optimizer's state without writing to it. Adam, AdamW, NAdam, RAdam and Adamax: :mod:`.rules_adam`.

Weight decay in the last update: a step with decay that multiplies ``W_{t−1}`` writes
``W_t = (1 − c)·W_{t−1} − R`` (decoupled: ``c = lr·λ``; coupled L2 on a gradient divided by ``den`` with step
``a``: ``c = a·λ/den``), so the last update is exactly

    W_{t−1} − W_t = (c·W_t + R) / (1 − c),

impossible only at ``c = 1``. Coupled decay folded into a momentum or moment is already exact in the state. The
rebuild uses the group's current ``lr`` (exact unless a scheduler changed it since the last step).

Reference: the update rules are those of ``torch.optim`` (PyTorch 2.x); PipeOptim's Table I
(Guan et al., arXiv:2312.00839) names ΔW_t for SGDM, Adam and AdamW.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor

from ..schedules.actions import check_flag

__all__ = [
    "UpdateRule", "Direction", "BucketState", "LastUpdateOptions", "register_rule", "rule_for", "registered_class",
    "supported_optimizers",
    "SGDRule", "RMSpropRule", "AdagradRule", "scalar", "denominator", "keep_fraction",
    "fmul", "flerp", "fadd", "faddcmul", "faddcdiv", "fmaximum",
]

_RULES: dict[type, UpdateRule] = {}


def scalar(value: Any) -> float:
    """A hyper-parameter as a Python float (``torch.optim`` accepts 0-dim tensors for lr and betas)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"expected a scalar hyper-parameter, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    return float(value)


@dataclass(frozen=True)
class LastUpdateOptions:
    """Disputed details of "the update the last step applied" (PipeOptim's ΔW_t).

    Attributes:
        weight_decay: rebuild the explicitly applied decay exactly (so the last update is ``W_{t−1} − W_t``);
            ``False`` leaves it out, as PipeOptim's Table I and code do.
        bias_step: bias-correction exponent: ``"t"`` (the last update's count, Table I) or ``"t+1"``.
        eps: override of the optimizer's eps (PipeOptim's code: 1e-8).
        eps_placement: ``"outside"``: ``sqrt(v̂) + eps`` (torch.optim, Table I); ``"inside"``: ``sqrt(v̂ + eps)``.
    """

    weight_decay: bool = True
    bias_step: Literal["t", "t+1"] = "t"
    eps: float | None = None
    eps_placement: Literal["outside", "inside"] = "outside"

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight_decay", check_flag("weight_decay", self.weight_decay))
        if self.eps is not None and (isinstance(self.eps, bool) or not isinstance(self.eps, numbers.Real)):
            raise TypeError(f"eps must be a number >= 0 or None, got {type(self.eps).__name__} {self.eps!r}")
        if self.bias_step not in ("t", "t+1"):
            raise ValueError(f"bias_step={self.bias_step!r}; choose 't' or 't+1'")
        if self.eps_placement not in ("outside", "inside"):
            raise ValueError(f"eps_placement={self.eps_placement!r}; choose 'outside' or 'inside'")
        if self.eps is not None and not self.eps >= 0:
            raise ValueError(f"eps must be >= 0 or None, got {self.eps!r}")

    def step_for_bias(self, step: float) -> float:
        return step + 1.0 if self.bias_step == "t+1" else step

    def decay(self, hp: dict[str, Any]) -> float:
        """The decay rate ``λ`` the last update is rebuilt with: the group's, or 0 without ``weight_decay``."""
        return hp["weight_decay"] if self.weight_decay else 0.0


def keep_fraction(c: float) -> float:
    """``1 − c``, the fraction of ``W_{t−1}`` a step with decay ``c = lr·λ`` kept; ValueError if it kept none."""
    keep = 1.0 - c
    if keep == 0.0:
        raise ValueError("lr·weight_decay = 1: the last step erased W_{t-1}, so the update it applied cannot be "
                         "rebuilt from the state; use weight_decay=False or another predictor")
    return keep


@dataclass
class BucketState:
    """Optimizer state of a bucket of parameters sharing one step count.

    ``tensors``: per state key, one tensor per parameter (``None`` where torch has not created it yet); they may be
    the optimizer's own tensors, which rules only read (hence ``Sequence``).
    """

    step: float
    tensors: dict[str, Sequence[Tensor | None]]
    scalars: dict[str, Tensor] = field(default_factory=dict)

    def present(self, key: str) -> list[Tensor]:
        """The tensors of ``key``, where all exist (created whole at the first step, or by ``init_state``)."""
        return cast(list[Tensor], self.tensors[key])


def denominator(x: list[Tensor], scale: float, eps: float, placement: str) -> list[Tensor]:
    """``sqrt(x / scale) + eps`` (``placement="outside"``) or ``sqrt(x / scale + eps)`` (``"inside"``)."""
    if placement == "outside":
        den = list(torch._foreach_sqrt(x))
        if scale != 1.0:
            torch._foreach_div_(den, scale ** 0.5)
        torch._foreach_add_(den, eps)
        return den
    inner = torch._foreach_div(x, scale) if scale != 1.0 else [t.clone() for t in x]
    torch._foreach_add_(inner, eps)
    return list(torch._foreach_sqrt(inner))


def fmul(xs: list[Tensor], c: float, own: bool) -> list[Tensor]:
    """``xs·c``: in place when the caller owns ``xs`` (``own``), else into new tensors."""
    if own:
        torch._foreach_mul_(xs, c)
        return xs
    return list(torch._foreach_mul(xs, c))


def flerp(xs: list[Tensor], ys: list[Tensor], w: float, own: bool) -> list[Tensor]:
    """``xs + w·(ys − xs)`` (in place when ``own``)."""
    if own:
        torch._foreach_lerp_(xs, ys, w)
        return xs
    return list(torch._foreach_lerp(xs, ys, w))


def fadd(xs: list[Tensor], ys: list[Tensor], alpha: float, own: bool) -> list[Tensor]:
    """``xs + alpha·ys`` (in place when ``own``)."""
    if own:
        torch._foreach_add_(xs, ys, alpha=alpha)
        return xs
    return list(torch._foreach_add(xs, ys, alpha=alpha))


def faddcmul(xs: list[Tensor], a: list[Tensor], b: list[Tensor], value: float, own: bool) -> list[Tensor]:
    """``xs + value·a·b`` (in place when ``own``)."""
    if own:
        torch._foreach_addcmul_(xs, a, b, value=value)
        return xs
    return list(torch._foreach_addcmul(xs, a, b, value=value))


def faddcdiv(xs: list[Tensor], a: list[Tensor], b: list[Tensor], value: float, own: bool) -> list[Tensor]:
    """``xs + value·a/b`` (in place when ``own``)."""
    if own:
        torch._foreach_addcdiv_(xs, a, b, value=value)
        return xs
    return list(torch._foreach_addcdiv(xs, a, b, value=value))


def fmaximum(xs: list[Tensor], ys: list[Tensor], own: bool) -> list[Tensor]:
    """``max(xs, ys)`` element-wise (in place when ``own``)."""
    if own:
        torch._foreach_maximum_(xs, ys)
        return xs
    return list(torch._foreach_maximum(xs, ys))


@dataclass
class Direction:
    """What one step subtracts from the weights (after decoupled decay): ``U = (c/k)·(Σ_i w_i·n_i)/den·post``.

    Attributes:
        c, k: kept apart because the fused path forms ``(−scale·c)/k``.
        terms: ``(w_i, n_i)`` pairs; without ``den`` a step sums them first, as torch's SGD forms ``g + μ·b``.
        post: a factor after the division (RAdam's rectification).
        fuse: ``apply_last`` may fold ``W − scale·U`` into one pass per term.
    """

    c: float
    terms: list[tuple[float, list[Tensor]]]
    den: list[Tensor] | None = None
    k: float = 1.0
    post: float = 1.0
    fuse: bool = True


class UpdateRule:
    """The update rule of one ``torch.optim`` family, read-only with respect to the optimizer.

    A family writes its maths once, as optax does: :meth:`advance` (the state after a step) and :meth:`direction`
    (the update ``U`` it subtracts); the base class derives :meth:`step`, :meth:`last_update` and the fused
    :meth:`apply_last` from them, in ``torch.optim``'s order of operations (equal to float64 rounding).
    """

    name: ClassVar[str] = ""
    optimizer_types: ClassVar[tuple[type, ...]] = ()
    options: ClassVar[tuple[str, ...]] = ()        # hyper-parameters this rule understands

    # -- hyper-parameters and state ------------------------------------------------------------
    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        """Validated hyper-parameters of a param group; raises ValueError on unsupported options."""
        if group.get("differentiable", False):
            raise ValueError(f"{self.name}(differentiable=True) is not supported by the weight predictors; "
                             "use differentiable=False")
        hp = {k: group[k] for k in self.options if k in group}
        hp["lr"] = scalar(group["lr"])
        hp["maximize"] = bool(group.get("maximize", False))
        hp["weight_decay"] = scalar(group.get("weight_decay", 0.0))
        return hp

    def bucket_key(self, state: dict[str, Any] | None) -> tuple:
        """Parameters with equal keys share step-dependent scalars and are updated together."""
        if not state or "step" not in state:
            return (0.0,)
        return (scalar(state["step"]),)

    def init_state(self, hp: dict[str, Any], p: Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, hp: dict[str, Any], states: list[dict[str, Any]]) -> BucketState:
        """Bucket state from the per-parameter state dicts (references, not copies)."""
        keys = self.state_keys(hp)
        step = scalar(states[0]["step"]) if "step" in states[0] else 0.0
        tensors: dict[str, Sequence[Tensor | None]] = {k: [st.get(k) for st in states] for k in keys}
        return BucketState(step, tensors, self.read_scalars(states))

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        raise NotImplementedError

    def read_scalars(self, states: list[dict[str, Any]]) -> dict[str, Tensor]:
        return {}

    # -- what a family defines -----------------------------------------------------------------
    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        """The state after one step with effective gradient ``g`` (in place into ``st`` when ``own``)."""
        raise NotImplementedError

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        """The update ``U`` of the step that produced ``st`` (``None`` before a first step); ``opts`` for a rebuild.

        ``grad()``: the effective gradient ``±g + wd·W`` (a rebuild raises ValueError when ``p.grad`` is missing).
        """
        raise NotImplementedError

    def needs_grad_for(self, hp: dict[str, Any]) -> str:
        """How error messages name this rule when its last update needs the last gradient."""
        return self.name

    def gradient_from_step(self, hp: dict[str, Any], st: BucketState, held: list[Tensor]) -> list[Tensor] | None:
        """The gradient ``g_t`` of the last step, from ``held``, what that step left in ``p.grad`` in its place.

        Only for an implementation whose step overwrites ``p.grad`` (:func:`pipelab.predictors.base.last_gradients`
        asks torch whether it does); ``st`` is the state after the step. ``None``: this rule has no inverse.
        """
        return None

    # -- derived: one step, the last update, and W − scale·(last update) ------------------------
    def step(self, hp: dict[str, Any], lr: float, st: BucketState, W: list[Tensor], g: list[Tensor], *,
             own_state: bool = False, own_weights: bool = False) -> tuple[list[Tensor], BucketState]:
        """One ``optimizer.step()`` with gradient ``g`` on weights ``W``: the new weights and state.

        Decay, advance, ``W ← W − U``; new tensors unless a rollout owns its copies (``own_state``/``own_weights``).
        """
        if hp["weight_decay"] != 0 and hp.get("decoupled_weight_decay", False):
            W = fmul(W, 1 - lr * hp["weight_decay"], own_weights)
            g, own_weights = self.effective_grad(hp, W, g, coupled_decay=False), True
        else:
            g = self.effective_grad(hp, W, g)
        st = self.advance(hp, st, g, own_state)
        d = self.direction(hp, lr, st, lambda: g, None)
        assert d is not None and d.post == 1.0
        f = d.c / d.k
        if d.den is None:
            (_, n), *rest = d.terms
            for w, x in rest:  # torch's SGD: d = g + μ·b, then W − lr·d
                n = list(torch._foreach_add(n, x, alpha=w))
            return fadd(W, n, -f, own_weights), st
        for w, n in d.terms:
            W, own_weights = faddcdiv(W, n, d.den, -(f * w), own_weights), True
        return W, st

    def _rebuild(self, hp: dict[str, Any], lr: float, st: BucketState, Wt: list[Tensor], g: list[Tensor] | None,
                 opts: LastUpdateOptions) -> tuple[Direction | None, float]:
        """The last :class:`Direction`, coupled decay solved for ``W_{t−1}`` (den ← den − a·wd), and ``c = lr·wd``."""
        wd = opts.decay(hp)
        decoupled = bool(hp.get("decoupled_weight_decay", False))
        used: list[list[Tensor]] = []

        def grad() -> list[Tensor]:
            if g is None:
                raise ValueError(f"the last update of {self.needs_grad_for(hp)} needs the last gradient (p.grad); "
                                 "predict before optimizer.zero_grad()")
            used.append(self.effective_grad(dict(hp, weight_decay=wd), Wt, g, coupled_decay=not decoupled))
            return used[-1]

        d = self.direction(hp, lr, st, grad, opts)
        if d is None:
            return None, 0.0
        if wd != 0 and not decoupled and used:
            a = (d.c / d.k) * next(w for w, n in d.terms if n is used[0])
            if d.den is None:
                d.k = d.k * keep_fraction(a * wd)
            else:  # a fresh denominator (rules only build these from state, never hand it out)
                torch._foreach_sub_(d.den, a * wd)
        return d, lr * wd if decoupled else 0.0

    @staticmethod
    def _materialise(d: Direction, Wt: list[Tensor], c: float) -> list[Tensor]:
        """``U`` as new tensors; with decoupled decay ``c``, ``(U + c·W_t)/(1 − c)``."""
        f = d.c / d.k
        (w0, n0), *rest = d.terms
        out = list(torch._foreach_mul(n0, f * w0))
        for w, n in rest:
            torch._foreach_add_(out, n, alpha=f * w)
        if d.den is not None:
            torch._foreach_div_(out, d.den)
        if d.post != 1.0:
            torch._foreach_mul_(out, d.post)
        if c != 0:
            keep = keep_fraction(c)
            torch._foreach_add_(out, Wt, alpha=c)
            torch._foreach_mul_(out, 1.0 / keep)
        return out

    def last_update(self, hp: dict[str, Any], lr: float, st: BucketState, W: list[Tensor],
                    g: list[Tensor] | None, opts: LastUpdateOptions) -> list[Tensor]:
        """``lr·ΔW_t = W_{t−1} − W_t``: the update the last step applied, rebuilt from the state and ``W = W_t``."""
        d, c = self._rebuild(hp, lr, st, W, g, opts)
        return [torch.zeros_like(w) for w in W] if d is None else self._materialise(d, W, c)

    def apply_last(self, hp: dict[str, Any], lr: float, st: BucketState, W: list[Tensor], g: list[Tensor] | None,
                   opts: LastUpdateOptions, scale: float, *, current: list[Tensor] | None = None) -> list[Tensor]:
        """``W − scale·last_update``, fused: with decoupled decay c, ``q = scale/(1 − c)``, ``W·(1 − q·c) − q·U``."""
        Wt = W if current is None else current
        d, c = self._rebuild(hp, lr, st, Wt, g, opts)
        if d is None:
            return [w.clone() for w in W]
        if not d.fuse:
            return list(torch._foreach_add(W, self._materialise(d, Wt, c), alpha=-scale))
        q, out, own = scale, W, False
        if c != 0:
            q = scale / keep_fraction(c)
            out = list(torch._foreach_mul(W, 1 - q * c) if current is None
                       else torch._foreach_add(W, current, alpha=-q * c))
            own = True
        v = -q * d.c / d.k
        for w, n in d.terms:
            out = fadd(out, n, v * w, own) if d.den is None else faddcdiv(out, n, d.den, v * w, own)
            own = True
        return list(out)

    # -- shared helpers ------------------------------------------------------------------------
    @staticmethod
    def effective_grad(hp: dict[str, Any], W: list[Tensor], g: list[Tensor], *, coupled_decay: bool = True
                       ) -> list[Tensor]:
        """``±g + wd·W`` as torch.optim forms it (sign from ``maximize``, L2 decay when coupled)."""
        out = list(torch._foreach_neg(g)) if hp["maximize"] else list(g)
        if coupled_decay and hp["weight_decay"] != 0:
            out = list(torch._foreach_add(out, W, alpha=hp["weight_decay"]))
        return out


def register_rule(rule: UpdateRule) -> UpdateRule:
    """Register ``rule`` for its ``optimizer_types`` (exact classes; subclasses resolve through the MRO)."""
    for cls in rule.optimizer_types:
        _RULES[cls] = rule
    return rule


def supported_optimizers() -> list[str]:
    """Names of the ``torch.optim`` classes the predictors understand."""
    return sorted({cls.__name__ for cls in _RULES})


def rule_for(optimizer: torch.optim.Optimizer) -> UpdateRule:
    """The :class:`UpdateRule` of ``optimizer``'s class (or its nearest registered base class).

    A subclass with its own ``step()`` may update differently, so it gets no inherited rule (TypeError): register
    one, e.g. ``register_rule(MyAdamRule())`` with ``class MyAdamRule(AdamRule): optimizer_types = (MyAdam,)``.
    """
    return _RULES[registered_class(optimizer)]


def registered_class(optimizer: torch.optim.Optimizer) -> type[torch.optim.Optimizer]:
    """The class whose rule ``optimizer`` follows: its own or its nearest registered base with the same ``step()``.

    Raises TypeError as :func:`rule_for` does.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    cls = type(optimizer)
    for base in cls.__mro__:
        if base in _RULES:
            if _step_of(cls) is not _step_of(base):
                rule = type(_RULES[base])
                raise TypeError(
                    f"optimizer {cls.__name__} subclasses {base.__module__}.{base.__qualname__} but overrides step(), "
                    f"so the weight predictors cannot assume {base.__name__}'s update rule; register a rule for it "
                    f"explicitly: class {cls.__name__}Rule({rule.__module__}.{rule.__qualname__}): "
                    f"optimizer_types = ({cls.__name__},), then pipelab.predictors.rules.register_rule("
                    f"{cls.__name__}Rule()) (or subclass UpdateRule if its update differs)")
            return cast(type[torch.optim.Optimizer], base)
    raise TypeError(f"optimizer {type(optimizer).__name__} is not supported by the weight predictors; "
                    f"supported: {', '.join(supported_optimizers())}")


def _step_of(cls: type) -> Any:
    """``cls.step`` without torch's profiling wrapper (``Optimizer.__init__`` may wrap an inherited step)."""
    return inspect.unwrap(cls.step)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------------
class SGDRule(UpdateRule):
    """SGD with momentum μ, dampening τ, Nesterov, L2 weight decay (``torch.optim.SGD``).

    ``b ← μ·b + (1−τ)·g`` (``b ← g`` first); ``U = lr·d``, ``d = g + μ·b`` (Nesterov), ``b``, or ``g`` (μ = 0). The
    last update is ``lr·b`` (Table I's ``v_t``), else ``lr·(±g_t + wd·W_t [+ μ·b])/(1 − lr·wd)``.
    """

    name = "SGD"
    optimizer_types = (torch.optim.SGD,)
    options = ("momentum", "dampening", "nesterov")

    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        hp["momentum"] = scalar(hp.get("momentum", 0.0))
        hp["dampening"] = scalar(hp.get("dampening", 0.0))
        hp["nesterov"] = bool(hp.get("nesterov", False))
        return hp

    def bucket_key(self, state: dict[str, Any] | None) -> tuple:
        return (state is not None and state.get("momentum_buffer") is not None,)

    def init_state(self, hp: dict[str, Any], p: Tensor) -> dict[str, Any]:
        return {"momentum_buffer": None}

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",)

    def needs_grad_for(self, hp: dict[str, Any]) -> str:
        return "SGD with nesterov=True or momentum=0"

    def gradient_from_step(self, hp: dict[str, Any], st: BucketState, held: list[Tensor]) -> list[Tensor] | None:
        """``g_t = d − μ·b_t`` from the Nesterov direction ``d = g_t + μ·b_t`` held in ``p.grad``.

        torch's multi-tensor SGD (``foreach``, the default for CUDA tensors) forms ``d`` in place in the gradient
        tensors when nothing copied them first (Nesterov, weight_decay 0, maximize False), so ``p.grad`` holds
        ``d`` after the step; the for-loop leaves ``g_t``. Without buffers no step has run: ``held`` is ``g``.
        """
        bufs = st.tensors["momentum_buffer"]
        if any(b is None for b in bufs):
            return held
        if not hp["nesterov"]:
            return None
        return list(torch._foreach_add(held, cast(list[Tensor], bufs), alpha=-hp["momentum"]))

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        mu, bufs = hp["momentum"], st.tensors["momentum_buffer"]
        if mu == 0:
            return BucketState(st.step + 1, st.tensors)
        if any(b is None for b in bufs):
            new_bufs = [x.detach().clone() for x in g]
        else:
            new_bufs = fmul(cast(list[Tensor], bufs), mu, own)
            torch._foreach_add_(new_bufs, g, alpha=1 - hp["dampening"])
        return BucketState(st.step + 1, {"momentum_buffer": list(new_bufs)})

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        mu, bufs = hp["momentum"], st.tensors["momentum_buffer"]
        have = all(b is not None for b in bufs)
        if mu != 0 and not hp["nesterov"]:
            return Direction(lr, [(1.0, cast(list[Tensor], bufs))]) if have else None  # no step yet: none
        if mu != 0 and have:
            return Direction(lr, [(1.0, grad()), (mu, cast(list[Tensor], bufs))])
        return Direction(lr, [(1.0, grad())], fuse=mu == 0)  # Nesterov before its first step: lr·g


class RMSpropRule(UpdateRule):
    """RMSprop with smoothing α, eps, optional centering and momentum (``torch.optim.RMSprop``).

    ``v ← α·v + (1−α)·g²``; ``a = sqrt(v [− ḡ²]) + eps``; momentum: ``b ← μ·b + g/a``, ``U = lr·b``; else
    ``U = lr·g/a``, last update ``lr·(±g_t + wd·W_t)/(a − lr·wd)``.
    """

    name = "RMSprop"
    optimizer_types = (torch.optim.RMSprop,)
    options = ("alpha", "eps", "momentum", "centered")

    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        for k in ("alpha", "eps", "momentum"):
            hp[k] = scalar(hp[k])
        hp["centered"] = bool(hp["centered"])
        return hp

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        keys = ["square_avg"]
        if hp["momentum"] > 0:
            keys.append("momentum_buffer")
        if hp["centered"]:
            keys.append("grad_avg")
        return tuple(keys)

    def init_state(self, hp: dict[str, Any], p: Tensor) -> dict[str, Any]:
        st: dict[str, Any] = {"step": torch.tensor(0.0), "square_avg": torch.zeros_like(p)}
        if hp["momentum"] > 0:
            st["momentum_buffer"] = torch.zeros_like(p)
        if hp["centered"]:
            st["grad_avg"] = torch.zeros_like(p)
        return st

    def needs_grad_for(self, hp: dict[str, Any]) -> str:
        return "RMSprop without momentum"

    def _avg(self, hp: dict[str, Any], st: BucketState, opts: LastUpdateOptions | None) -> list[Tensor]:
        """``a = sqrt(v − ḡ²) + eps`` (centered) or ``sqrt(v) + eps``, a new list."""
        eps = hp["eps"] if opts is None or opts.eps is None else opts.eps
        placement = "outside" if opts is None else opts.eps_placement
        sq = st.present("square_avg")
        if hp["centered"]:
            ga = st.present("grad_avg")
            sq = list(torch._foreach_addcmul(sq, ga, ga, value=-1))
        return denominator(sq, 1.0, eps, placement)

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        a = hp["alpha"]
        sq = fmul(st.present("square_avg"), a, own)
        torch._foreach_addcmul_(sq, g, g, value=1 - a)
        new = BucketState(st.step + 1, {"square_avg": sq})
        if hp["centered"]:
            new.tensors["grad_avg"] = flerp(st.present("grad_avg"), g, 1 - a, own)
        if hp["momentum"] > 0:
            buf = fmul(st.present("momentum_buffer"), hp["momentum"], own)
            torch._foreach_addcdiv_(buf, g, self._avg(hp, new, None))
            new.tensors["momentum_buffer"] = buf
        return new

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        if hp["momentum"] > 0:
            return Direction(lr, [(1.0, st.present("momentum_buffer"))])
        return Direction(lr, [(1.0, grad())], self._avg(hp, st, opts))


class AdagradRule(UpdateRule):
    """Adagrad with lr decay and initial accumulator (``torch.optim.Adagrad``).

    ``clr = lr / (1 + (t−1)·lr_decay)``; ``S ← S + g²``; ``U = clr·g/(sqrt(S) + eps)``; last update
    ``clr_t·(±g_t + wd·W_t)/(sqrt(S_t) + eps − clr_t·wd)``.
    """

    name = "Adagrad"
    optimizer_types = (torch.optim.Adagrad,)
    options = ("eps", "lr_decay", "initial_accumulator_value")

    def hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hp = super().hyper(group)
        for k in self.options:
            hp[k] = scalar(hp[k])
        return hp

    def state_keys(self, hp: dict[str, Any]) -> tuple[str, ...]:
        return ("sum",)

    def init_state(self, hp: dict[str, Any], p: Tensor) -> dict[str, Any]:
        return {"step": torch.tensor(0.0), "sum": torch.full_like(p, hp["initial_accumulator_value"])}

    def advance(self, hp: dict[str, Any], st: BucketState, g: list[Tensor], own: bool) -> BucketState:
        return BucketState(st.step + 1, {"sum": faddcmul(st.present("sum"), g, g, 1, own)})

    def direction(self, hp: dict[str, Any], lr: float, st: BucketState, grad: Callable[[], list[Tensor]],
                  opts: LastUpdateOptions | None) -> Direction | None:
        if st.step == 0:
            return None
        step = st.step if opts is None else opts.step_for_bias(st.step)
        clr = lr / (1 + (step - 1) * hp["lr_decay"])
        eps = hp["eps"] if opts is None or opts.eps is None else opts.eps
        den = denominator(st.present("sum"), 1.0, eps, "outside" if opts is None else opts.eps_placement)
        return Direction(clr, [(1.0, grad())], den)


register_rule(SGDRule())
register_rule(RMSpropRule())
register_rule(AdagradRule())
