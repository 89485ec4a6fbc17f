"""The optimizer registry: one table of named ``torch.optim`` optimizers for experiments, benchmarks and tests.

A name is an *update rule* (a class and the settings of the variant), not a tuned recipe: torch's defaults
written out (so a change of torch's cannot silently change an experiment), plus the variant's own (momentum 0.9,
SpecTrain's and PipeOptim's; β1 = 0.99 for ``nadam_async``). An experiment's tuning is passed as overrides:
``make_optimizer(name, params, **overrides) = cls(params, **{**defaults, **overrides})``.

References: PyTorch ``torch.optim`` (2.x) documentation; Polyak (1964) heavy-ball momentum; Nesterov (1983);
Kingma & Ba, "Adam" (ICLR 2015); Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019);
Hinton, "RMSprop" (Coursera lecture 6e, 2012); Duchi et al., "Adagrad" (JMLR 2011); Dozat, "NAdam" (2016);
Liu et al., "RAdam" (ICLR 2020); Jordan et al., "Muon" (2024, https://kellerjordan.github.io/posts/muon/).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["OptimizerSpec", "OPTIMIZERS", "OptimizerFactory", "RegisteredFactory", "available_optimizers",
           "optimizer_spec", "optimizer_hyperparameters", "make_optimizer", "optimizer_factory", "optimizer_label"]


@dataclass(frozen=True)
class OptimizerSpec:
    """A registry entry: the ``torch.optim`` class, its defaults (read-only), label, description and reference."""

    cls: type[torch.optim.Optimizer]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    description: str = ""
    reference: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))

    def accepted(self) -> list[str]:
        """Keyword arguments the class's constructor takes (besides ``params``)."""
        sig = inspect.signature(self.cls.__init__)
        return [n for n, p in sig.parameters.items() if n not in ("self", "params")
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


#: What every driver and profiler takes as its optimizer: ``params -> torch.optim.Optimizer``, called once per
#: stage (a lambda, a class with its hyper-parameters bound, or :func:`optimizer_factory`'s picklable factory).
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

_TORCH = "PyTorch torch.optim"

#: name -> :class:`OptimizerSpec`; the one table of named optimizers (see the module docstring for the defaults).
OPTIMIZERS: Mapping[str, OptimizerSpec] = MappingProxyType({
    "sgd": OptimizerSpec(torch.optim.SGD, {"lr": 1e-3}, "SGD", "plain stochastic gradient descent", _TORCH),
    "sgdm": OptimizerSpec(torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9}, "SGDM", "SGD with heavy-ball momentum 0.9",
                          "Polyak (1964); torch.optim.SGD"),
    "nesterov": OptimizerSpec(torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9, "nesterov": True}, "SGD-Nesterov",
                              "SGD with Nesterov momentum 0.9", "Nesterov (1983); Sutskever et al. (ICML 2013)"),
    "adam": OptimizerSpec(torch.optim.Adam, {"lr": 1e-3}, "Adam", "Adam, betas (0.9, 0.999)",
                          "Kingma & Ba, ICLR 2015"),
    "adamw": OptimizerSpec(torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 1e-2}, "AdamW",
                           "Adam with decoupled weight decay 1e-2", "Loshchilov & Hutter, ICLR 2019"),
    "rmsprop": OptimizerSpec(torch.optim.RMSprop, {"lr": 1e-2}, "RMSprop", "RMSprop, smoothing 0.99",
                             "Hinton, Coursera lecture 6e (2012)"),
    "rmsprop_momentum": OptimizerSpec(torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.9, "centered": True},
                                      "RMSprop (centered, momentum)", "centered RMSprop with momentum 0.9",
                                      "Graves, arXiv:1308.0850 (centered); torch.optim.RMSprop"),
    "adagrad": OptimizerSpec(torch.optim.Adagrad, {"lr": 1e-2}, "Adagrad", "Adagrad (accumulated squared gradients)",
                             "Duchi et al., JMLR 2011"),
    "nadam": OptimizerSpec(torch.optim.NAdam, {"lr": 2e-3}, "NAdam", "Adam with Nesterov momentum",
                           "Dozat, ICLR 2016 workshop"),
    "nadam_async": OptimizerSpec(torch.optim.NAdam, {"lr": 2e-3, "betas": (0.99, 0.999)}, "NAdam (β1 0.99)",
                                 "NAdam with β1 = 0.99, the setting of the asynchronous-Nesterov runs",
                                 "Ajanthan et al., ICML 2025 (arXiv:2505.01099), its public code's run script"),
    "radam": OptimizerSpec(torch.optim.RAdam, {"lr": 1e-3}, "RAdam", "Adam with variance rectification",
                           "Liu et al., ICLR 2020"),
    "adamax": OptimizerSpec(torch.optim.Adamax, {"lr": 2e-3}, "Adamax", "Adam with the infinity norm",
                            "Kingma & Ba, ICLR 2015, §7.1"),
    "muon": OptimizerSpec(torch.optim.Muon, {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
                                           "ns_coefficients": (3.4445, -4.7750, 2.0315), "eps": 1e-7, "ns_steps": 5,
                                           "adjust_lr_fn": None},
                          "Muon", "Nesterov momentum 0.95 orthogonalised by Newton-Schulz (2-D parameters only)",
                          "Jordan et al., 2024 (kellerjordan.github.io/posts/muon); torch.optim.Muon"),
})


def available_optimizers() -> list[str]:
    """Names accepted by :func:`make_optimizer`, in registry order."""
    return list(OPTIMIZERS)


def optimizer_spec(name: str) -> OptimizerSpec:
    """The :class:`OptimizerSpec` of ``name``; ValueError (listing the known names) if there is none."""
    if not isinstance(name, str):
        raise TypeError(f"optimizer name must be a str (one of {', '.join(OPTIMIZERS)}), got {type(name).__name__}")
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}") from None


def optimizer_hyperparameters(name: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments ``name`` is built with: its defaults updated by ``overrides``.

    Raises:
        ValueError: unknown name. TypeError: an override the class does not accept (named in the message).
    """
    spec = optimizer_spec(name)
    accepted = spec.accepted()
    unknown = sorted(k for k in overrides if k not in accepted)
    if unknown:
        raise TypeError(f"optimizer {name!r} ({spec.cls.__name__}) does not accept {', '.join(unknown)}; "
                        f"it takes {', '.join(accepted)}")
    return {**spec.defaults, **overrides}


def make_optimizer(name: str, params: Iterable[Tensor] | Iterable[dict[str, Any]], **overrides: Any
                   ) -> torch.optim.Optimizer:
    """Build the registered optimizer ``name`` over ``params`` (tensors or param groups) with ``overrides``."""
    hp = optimizer_hyperparameters(name, **overrides)
    return OPTIMIZERS[name].cls(params, **hp)


@dataclass(frozen=True)
class RegisteredFactory:
    """``params -> optimizer`` for a registry name and fixed overrides (picklable, unlike a lambda)."""

    name: str
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]]) -> torch.optim.Optimizer:
        return make_optimizer(self.name, params, **self.overrides)


def optimizer_factory(name: str, **overrides: Any) -> Callable[[Any], torch.optim.Optimizer]:
    """A factory ``params -> optimizer`` for ``name`` with ``overrides``; names and overrides are checked now."""
    optimizer_hyperparameters(name, **overrides)
    return RegisteredFactory(name, dict(overrides))


def optimizer_label(name: str) -> str:
    """The label figures and tables print for ``name`` (e.g. ``"SGDM"``)."""
    return optimizer_spec(name).label
