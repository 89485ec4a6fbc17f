"""Figures of the getting-started notebook: the datasets and how the reference models split into stages."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from ...partition import stage_sizes
from ..config import from_preset
from ..data import FASHION_MNIST_CLASSES, load_digits, load_fashion_mnist, load_mnist1d
from ..models import build_model
from . import FigureOutput, register


@dataclass(frozen=True)
class DataSamplesConfig:
    per_class: int = 1
    seed: int = 0


@register("data_samples", "One example per class of Fashion-MNIST, digits and MNIST-1D",
          budget={"tiny": 10, "quick": 10})
def data_samples(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset({p: DataSamplesConfig() for p in ("tiny", "quick", "paper")}, preset)
    fm, dg, m1 = load_fashion_mnist(), load_digits(), load_mnist1d()
    fig, axes = plt.subplots(3, 10, figsize=(11, 3.8))
    for row, (ds, names) in enumerate([(fm, FASHION_MNIST_CLASSES), (dg, [str(i) for i in range(10)]),
                                       (m1, [str(i) for i in range(10)])]):
        for c in range(10):
            ax = axes[row, c]
            x = ds.x_train[(ds.y_train == c).nonzero()[0, 0]].numpy()
            if x.ndim == 3:
                ax.imshow(x[0], cmap="gray_r")
                ax.set_xticks([]), ax.set_yticks([])
            else:
                ax.plot(x, np.arange(len(x)), lw=1.2)
                ax.invert_yaxis()
                ax.set_xticks([]), ax.set_yticks([])
            ax.grid(False)
            ax.set_title(names[c], fontsize=8)
        axes[row, 0].set_ylabel(ds.name, fontsize=9)
    fig.suptitle("Datasets: Fashion-MNIST (28×28), scikit-learn digits (8×8), MNIST-1D (40 samples)")
    fig.tight_layout()
    return FigureOutput(fig, cfg, cfg.seed)


@dataclass(frozen=True)
class ModelStagesConfig:
    D: int = 4
    seed: int = 0


@register("model_stages", "Parameters per stage of each reference model, split by block count vs by parameters",
          budget={"tiny": 5, "quick": 5})
def model_stages(preset: str, *, progress: bool = False) -> FigureOutput:
    cfg = from_preset({"tiny": ModelStagesConfig(D=4), "quick": ModelStagesConfig(D=4),
                       "paper": ModelStagesConfig(D=8)}, preset)
    names = ["deep_mlp", "small_cnn", "small_resnet", "transformer"]
    fig, axes = plt.subplots(1, len(names), figsize=(12, 3.2))
    records = {}
    for ax, name in zip(axes, names):
        model = build_model(name, seed=cfg.seed)
        counts = [sum(p.numel() for p in b.parameters()) for b in model]
        D = min(cfg.D, len(model))
        width = 0.4
        for j, balance in enumerate(("layers", "params")):
            sizes = stage_sizes(model, D, balance)
            bounds = np.cumsum([0] + sizes)
            per_stage = [sum(counts[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
            records[(name, balance)] = {"blocks": sizes, "params": per_stage}
            ax.bar(np.arange(D) + (j - 0.5) * width, np.array(per_stage) / 1e3, width, label=f"by {balance}")
        ax.set_title(f"{name} ({len(model)} blocks)")
        ax.set_xlabel("stage k")
        ax.set_xticks(range(D))
    axes[0].set_ylabel("parameters per stage (thousands)")
    axes[0].legend()
    fig.tight_layout()
    return FigureOutput(fig, cfg, cfg.seed, data=records,
                        notes={f"{n}/{b}": r for (n, b), r in records.items()})
