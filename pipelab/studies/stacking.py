"""Stacked arms: K copies of one model with independent weights, trained as one model.

A sweep runs the same arm (task, policy, optimizer, D, learning rate) for several seeds. The seeds differ only in
their initial weights and data order, so K of them can run as *one* model whose every parameter carries a leading
arm axis, ``W[a] = W_a`` for arm a = 0..K−1, on inputs stacked along axis 1 (``x[:, a]`` is arm a's mini-batch; axis 0
stays the batch axis, so the pipeline still cuts micro-batches along it). Each block evaluates the K arms with
:func:`torch.func.vmap` over :func:`torch.func.functional_call` of the original block:

    f_stacked(x)[:, a] = f(x[:, a]; W_a),
    ℓ_stacked = (ℓ(f(x[:, 0]; W_0), y[:, 0]), ..., ℓ(f(x[:, K−1]; W_{K−1}), y[:, K−1])).

The loss is a vector of K per-arm losses. Its gradient with respect to ``W_a`` is arm a's own gradient: no arm's
output depends on another arm's weights, so the sum of the K losses (the vector-Jacobian product with ones that the
pipeline's backward takes) has ∂/∂W_a Σ_b ℓ_b = ∂ℓ_a/∂W_a. An optimizer whose update is elementwise in the parameter
tensor (SGD, momentum, Adam, AdamW, RMSprop, Adagrad, NAdam, RAdam, Adamax, and the staleness policies' predictors,
which are built from the same state) then updates each arm exactly as if it ran alone, and the stacked run equals K
separate runs up to floating-point rounding (the tests check 1e-10 in float64 for every policy). An arm that
diverges turns only its own weights to NaN; the others go on (the pipeline stops once every arm has diverged).

Muon is not elementwise: it orthogonalises each 2-D update by a Newton–Schulz iteration, so the stacked run gives
it :class:`StackedMuon`, which applies Muon's rule to every arm's own matrix (:func:`stacked_optimizer`); a policy
that predicts Muon's next weights reads the 2-D rule, so such arms run alone (:func:`check_stackable`). Refused as
well: modules with buffers (BatchNorm's running statistics would be shared state), and dropout: under ``vmap`` the
arms would draw one mask or K masks depending on the randomness mode, which a single run does not reproduce.

Reference: the stacked-ensemble technique of :func:`torch.func.stack_module_state` (PyTorch's "model ensembling"
tutorial), here applied per pipeline block so that the stacked model is still an ``nn.Sequential`` of blocks.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from ..predictors.rules_muon import lr_ratio, newton_schulz

__all__ = ["Stacked", "stack_models", "stacked_loss", "stacked_batch", "evaluate_arms", "check_stackable",
           "StackedMuon", "stacked_optimizer", "ARMWISE_OPTIMIZERS"]

#: optimizers whose update is not elementwise in a parameter tensor, with the optimizer that applies it arm by arm to
#: stacked parameters (:func:`stacked_optimizer`)
ARMWISE_OPTIMIZERS: tuple[str, ...] = ("muon",)


def check_stackable(model: nn.Module, optimizer: str | None = None, *, predicts: bool = False) -> None:
    """Refuse what a stacked run would not reproduce arm by arm (see the module docstring).

    Raises:
        ValueError: an optimizer of :data:`ARMWISE_OPTIMIZERS` under a policy that ``predicts`` its updates, a module
            with buffers, or a dropout layer with a non-zero rate.
    """
    if optimizer in ARMWISE_OPTIMIZERS and predicts:
        raise ValueError(f"optimizer {optimizer!r} cannot run stacked arms under a predicting policy: the predictor "
                         "reads its update rule for one 2-D parameter; run its arms one by one")
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ValueError(f"a model with buffers ({', '.join(buffers[:3])}) cannot run stacked arms: the arms would "
                         "share one running statistic; run its arms one by one")
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            raise ValueError(f"dropout {name!r} (p={module.p}) cannot run stacked arms: the arms' masks would not be "
                             "those of separate runs; run its arms one by one")
        rate = getattr(module, "dropout", None)
        if isinstance(rate, float) and rate > 0:
            raise ValueError(f"{name!r} has dropout {rate} and cannot run stacked arms; run its arms one by one")


class Stacked(nn.Module):
    """K copies of a block with independent weights: input ``(B, K, ...)`` → output ``(B, K, ...)``.

    Parameter i of the stacked block is ``torch.stack([p_i of block a for a in range(K)])`` (shape ``(K, *p_i.shape)``),
    registered in the order of the block's ``named_parameters`` under the same names with dots replaced by ``__``.

    Args:
        blocks: K modules of the same structure (same parameter names and shapes); their current weights are
            copied, the modules themselves are not used afterwards.

    Raises:
        ValueError: fewer than one block, blocks whose parameters differ in names or shapes, or a block that
            :func:`check_stackable` refuses.
    """

    def __init__(self, blocks: Sequence[nn.Module]) -> None:
        super().__init__()
        if not blocks:
            raise ValueError("Stacked needs at least one block")
        for b in blocks:
            check_stackable(b)
        shapes = [[(n, tuple(p.shape)) for n, p in b.named_parameters()] for b in blocks]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("stacked blocks must have the same parameter names and shapes")
        self.K = len(blocks)
        self.names = [n for n, _ in shapes[0]]
        for name in self.names:
            stacked = torch.stack([dict(b.named_parameters())[name].detach() for b in blocks]).clone()
            self.register_parameter(name.replace(".", "__"), nn.Parameter(stacked))
        # the template's own parameters are never read (functional_call replaces every one): keep it on "meta"
        self._template = (copy.deepcopy(blocks[0]).to("meta"),)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.K:
            raise ValueError(f"a stacked block of {self.K} arms takes input (batch, {self.K}, ...), got "
                             f"{tuple(x.shape)}")
        return _apply(self._template[0], "", x, dict(zip(self.names, self.parameters())))

    def arm(self, a: int) -> dict[str, Tensor]:
        """Arm a's weights, ``name -> tensor`` (views of the stacked parameters)."""
        return {name: p[a] for name, p in zip(self.names, self.parameters())}


_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid, nn.SiLU, nn.LeakyReLU, nn.ELU, nn.Identity)


def _apply(module: nn.Module, prefix: str, x: Tensor, params: dict[str, Tensor]) -> Tensor:
    """``module`` evaluated for every arm on ``x`` (``(B, K, ...)``) with the stacked ``params`` (``(K, ...)`` each).

    Direct batched forms for the common layers (one batched matmul for Linear, one grouped convolution for Conv2d,
    pooling and elementwise activations on the merged arm-channel axis); any other module through ``vmap`` of
    ``functional_call`` over the arm axis. The arithmetic per arm is the layer's own; only the batching differs.
    """
    if isinstance(module, nn.Sequential):
        for name, child in module.named_children():
            x = _apply(child, f"{prefix}{name}.", x, params)
        return x
    if isinstance(module, _ELEMENTWISE):
        return module(x)
    if type(module) is nn.Linear:
        W = params[prefix + "weight"]                       # (K, out, in)
        y = torch.matmul(x.transpose(0, 1), W.transpose(1, 2))  # (K, B, ..., out) for x (B, K, ..., in)
        if module.bias is not None:
            b = params[prefix + "bias"]
            y = y + b.reshape(b.shape[0], *([1] * (y.ndim - 2)), b.shape[1])
        return y.transpose(0, 1)
    if type(module) is nn.Flatten and module.start_dim >= 1 and module.end_dim == -1:
        return x.flatten(module.start_dim + 1)
    if type(module) is nn.Conv2d and module.padding_mode == "zeros" and x.ndim == 5:
        K, B = x.shape[1], x.shape[0]
        W = params[prefix + "weight"]                       # (K, out, in/groups, kh, kw)
        bias = params.get(prefix + "bias")
        y = nn.functional.conv2d(x.flatten(1, 2), W.flatten(0, 1), None if bias is None else bias.flatten(),
                                 module.stride, module.padding, module.dilation, module.groups * K)
        return y.reshape(B, K, -1, *y.shape[2:])
    if type(module) is nn.MaxPool2d and x.ndim == 5:
        y = module(x.flatten(1, 2))
        return y.reshape(x.shape[0], x.shape[1], -1, *y.shape[2:])
    own = {name[len(prefix):]: p for name, p in params.items() if name.startswith(prefix)}
    names = list(own)

    def call(ps: tuple[Tensor, ...], xa: Tensor) -> Tensor:
        return functional_call(module, dict(zip(names, ps)), (xa,))

    if not own:
        return vmap(module, in_dims=1, out_dims=1)(x)
    return vmap(call, in_dims=(0, 1), out_dims=1)(tuple(own.values()), x)


class StackedMuon(torch.optim.Optimizer):
    """``torch.optim.Muon`` for stacked arms: parameter ``(K, A, B)`` holds K arms' ``A×B`` matrices, and arm a's
    slice is updated exactly as Muon updates a matrix of its own.

    Per arm a, with gradient ``g_a`` and momentum buffer ``B_a``: ``B_a ← lerp(B_a, g_a, 1 − μ)``;
    ``O_a = NS(lerp(g_a, B_a, μ))`` (Nesterov) or ``NS(B_a)``, the bfloat16 Newton–Schulz orthogonalisation of
    :func:`pipelab.predictors.rules_muon.newton_schulz` (torch's, on the arm's own matrix);
    ``W_a ← (1 − lr·λ)·W_a − lr·r(A, B)·O_a``. The momentum and decay are elementwise, so they run on the whole
    stack; the orthogonalisation runs arm by arm, so each arm's arithmetic is that of its separate run.
    The hyperparameters are torch's (``lr``, ``weight_decay``, ``momentum``, ``nesterov``, ``ns_coefficients``,
    ``eps``, ``ns_steps``, ``adjust_lr_fn``).

    Reference: Jordan et al., "Muon" (2024, https://kellerjordan.github.io/posts/muon/); ``torch.optim.Muon``.

    Raises:
        ValueError: a parameter that is not 3-D (arms × matrix).
    """

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
                 eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn: str | None = None) -> None:
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 3:
                    raise ValueError(f"StackedMuon updates stacked matrices (arms, rows, columns), got a parameter of "
                                     f"shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                scale = lr * lr_ratio(group["adjust_lr_fn"], p.shape[1:])
                p.mul_(1 - lr * group["weight_decay"])
                for a in range(p.shape[0]):
                    ortho = newton_schulz(update[a], group["ns_coefficients"], group["ns_steps"], group["eps"])
                    p[a].add_(ortho, alpha=-scale)
        return loss


def stacked_optimizer(factory: Callable[[Any], torch.optim.Optimizer]) -> Callable[[Any], torch.optim.Optimizer]:
    """The factory a stacked run gives its stages in place of ``factory`` (``params -> optimizer``): the same, unless
    it builds ``torch.optim.Muon``, whose stacked counterpart :class:`StackedMuon` takes its hyperparameters."""
    probe = factory([nn.Parameter(torch.zeros(2, 2))])
    if not isinstance(probe, torch.optim.Muon):
        return factory
    hp = {k: v for k, v in probe.param_groups[0].items() if k != "params"}
    known = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn")
    return functools.partial(StackedMuon, **{k: hp[k] for k in known})


def stack_models(models: Sequence[nn.Sequential]) -> nn.Sequential:
    """One ``nn.Sequential`` whose block i stacks block i of every model (:class:`Stacked`).

    The models must share their structure; the stacked model has the same number of blocks, so
    :func:`pipelab.partition.split` cuts it into the same stages.
    """
    if not models:
        raise ValueError("stack_models needs at least one model")
    lengths = {len(m) for m in models}
    if len(lengths) != 1:
        raise ValueError(f"stacked models must have the same number of blocks, got {sorted(lengths)}")
    return nn.Sequential(*[Stacked([m[i] for m in models]) for i in range(len(models[0]))])


def stacked_loss(loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None) -> Callable[[Tensor, Tensor], Tensor]:
    """The per-arm loss vector ``(ℓ_0, ..., ℓ_{K−1})`` of stacked outputs ``(B, K, ...)`` and targets ``(B, K, ...)``.

    ``loss_fn`` (default cross-entropy) is the single-arm mean loss; arm a's entry is ``loss_fn(out[:, a], y[:, a])``.
    """
    base = loss_fn or nn.functional.cross_entropy

    def loss(out: Tensor, target: Tensor) -> Tensor:
        return vmap(base, in_dims=(1, 1))(out, target)

    return loss


def stacked_batch(batches: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Arms' mini-batches ``(x_a, y_a)`` stacked along axis 1: ``(B, K, ...)`` and ``(B, K, ...)``."""
    xs, ys = zip(*batches)
    return torch.stack(xs, 1), torch.stack(ys, 1)


@torch.no_grad()
def evaluate_arms(stages: Sequence[nn.Module], x: Tensor, y: Tensor, K: int,
                  weights: Sequence[Sequence[Tensor]] | None = None, *,
                  loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
                  batch_size: int = 2048, codec: Any = None) -> tuple[list[float], list[float]]:
    """Per-arm mean loss and accuracy of stacked stages (with ``weights[k]`` in ``named_parameters`` order; hand-overs
    through ``codec`` as in :func:`~pipelab.emulator.evaluate`).

    ``x``/``y`` are either shared by every arm (``(N, ...)``, e.g. the test set) or per arm (``(N, K, ...)``, e.g. each
    seed's own validation split) — the latter when axis 1 has length K and ``y`` has two axes or more. Accuracy is
    the fraction of argmax hits (for class-index targets). The stages are in eval mode for the call. An arm's loss
    and accuracy are NaN when one of its weights, outputs or losses is NaN or ±inf, as in
    :func:`~pipelab.emulator.evaluate`.

    Raises:
        ValueError: on an empty evaluation set.
    """
    if x.shape[0] == 0:
        raise ValueError("evaluate_arms() got an empty evaluation set (0 examples)")
    per_arm = y.ndim >= 2 and y.shape[1] == K
    if not per_arm:
        x = x.unsqueeze(1).expand(x.shape[0], K, *x.shape[1:])
        y = y.unsqueeze(1).expand(y.shape[0], K, *y.shape[1:])
    from ..emulator.reference import forward_batches
    from ..pipeline.driver import all_finite

    base = loss_fn or nn.functional.cross_entropy
    n = x.shape[0]
    used = [list(s.parameters()) for s in stages] if weights is None else weights
    finite = all_finite((w for W in used for w in W), arm_dim=0)  # stacked weights: (K, ...)
    total = torch.zeros(K, dtype=torch.float64)
    correct = torch.zeros(K, dtype=torch.float64)
    for h, yy in forward_batches(stages, x, y, weights, batch_size, codec):
        losses = vmap(base, in_dims=(1, 1))(h, yy)
        finite = finite & all_finite([h], arm_dim=1) & all_finite([losses], arm_dim=0)
        total += losses.detach().to(torch.float64).cpu() * yy.shape[0]
        if h.ndim == 3 and not yy.is_floating_point():
            correct += (h.argmax(2) == yy).sum(0).to(torch.float64).cpu()
    finite &= torch.isfinite(total)
    total[~finite] = math.nan
    correct[~finite] = math.nan
    return (total / n).tolist(), (correct / n).tolist()
