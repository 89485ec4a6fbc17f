"""Reference models as ``nn.Sequential`` of stage-splittable blocks.

Each top-level child of the returned ``nn.Sequential`` is one *block*: the unit that
:func:`pipelab.partition.split` assigns to pipeline stages. Blocks take and return a single tensor, so
any contiguous run of blocks is itself a valid stage.

- :func:`deep_mlp`: many equal Linear+activation blocks, the shape of SpecTrain's "SNN" scaled down
  (Chen et al., "Efficient and Robust Parallel DNN Training through Model Parallelism on Multi-GPU
  Platform", arXiv:1809.02839).
- :func:`small_cnn`: two conv blocks and a classifier head.
- :func:`small_resnet`: a residual CNN whose residual blocks are modules (He et al., CVPR 2016).
- :func:`transformer_classifier`: a small Transformer encoder over rows/chunks of the input as tokens.

Normalisation defaults to GroupNorm, not BatchNorm: BatchNorm's statistics depend on the micro-batch, so
a pipeline that splits a mini-batch into micro-batches would change the model's function. Pass
``norm="batch"`` to study that effect deliberately.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["deep_mlp", "small_cnn", "small_resnet", "transformer_classifier", "ResidualBlock", "Tokens", "MODELS",
           "build_model", "he_init"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def _activation(name: str) -> nn.Module:
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"activation={name!r}; choose one of {', '.join(_ACTIVATIONS)}") from None


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm={kind!r}; choose 'group', 'batch' or 'none'")


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def deep_mlp(
    in_features: int = 784, width: int = 256, depth: int = 16, num_classes: int = 10, activation: str = "relu",
    bias: bool = True,
) -> nn.Sequential:
    """A deep fully connected net of ``depth`` blocks: ``depth − 1`` × (Linear + activation), then a Linear head.

    The first block flattens its input, so images ``(N, C, H, W)`` and vectors ``(N, F)`` both work.

    ``bias=False`` drops every Linear's bias, so that each parameter is a matrix: ``torch.optim.Muon`` takes only
    2-D parameters, and this is how Muon can train the whole net. Zmushko et al. (arXiv:2606.30634) instead run
    Muon on the hidden matrices and AdamW on the rest (embeddings, gains, biases); pipelab's optimizer registry
    holds one optimizer per stage and no such hybrid, so a bias-free net is the exact way to give Muon every
    parameter (it changes the model, and every optimizer compared on it should run on the same bias-free net).

    Example:
        >>> m = deep_mlp(in_features=64, width=32, depth=8)
        >>> len(m), m(torch.zeros(2, 1, 8, 8)).shape
        (8, torch.Size([2, 10]))
    """
    _check_positive(in_features=in_features, width=width, depth=depth, num_classes=num_classes)
    if not isinstance(bias, bool):
        raise TypeError(f"bias must be a bool, got {type(bias).__name__}")
    if depth < 2:
        raise ValueError(f"depth must be at least 2 (one hidden block and the head), got {depth}")
    blocks: list[nn.Module] = [nn.Sequential(nn.Flatten(), nn.Linear(in_features, width, bias=bias),
                                             _activation(activation))]
    blocks += [nn.Sequential(nn.Linear(width, width, bias=bias), _activation(activation)) for _ in range(depth - 2)]
    blocks.append(nn.Linear(width, num_classes, bias=bias))
    return nn.Sequential(*blocks)


def small_cnn(in_channels: int = 1, num_classes: int = 10, width: int = 32, image_size: int = 28) -> nn.Sequential:
    """Four blocks: 2 × (conv3×3 + ReLU + max-pool 2), Flatten + Linear + ReLU, Linear head."""
    _check_positive(in_channels=in_channels, num_classes=num_classes, width=width, image_size=image_size)
    side = image_size // 4
    if side < 1:
        raise ValueError(f"image_size must be at least 4, got {image_size}")
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(2 * width * side * side, 4 * width), nn.ReLU()),
        nn.Linear(4 * width, num_classes),
    )


class ResidualBlock(nn.Module):
    """y = ReLU(x + norm(conv(ReLU(norm(conv(x)))))), with a 1×1 projection when shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, norm: str = "group") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(norm, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = _norm(norm, out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          _norm(norm, out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.shortcut(x) + self.norm2(self.conv2(h)))


def small_resnet(
    in_channels: int = 1, num_classes: int = 10, width: int = 16, blocks_per_stage: int = 2, norm: str = "group",
) -> nn.Sequential:
    """A residual CNN: stem, three groups of ``blocks_per_stage`` residual blocks (widths w, 2w, 4w, the
    last two downsampling by 2), then global average pooling and a Linear head; 2 + 3·blocks_per_stage blocks."""
    _check_positive(in_channels=in_channels, num_classes=num_classes, width=width, blocks_per_stage=blocks_per_stage)
    blocks: list[nn.Module] = [nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                                             _norm(norm, width), nn.ReLU())]
    channels = width
    for group, out in enumerate((width, 2 * width, 4 * width)):
        for i in range(blocks_per_stage):
            stride = 2 if group > 0 and i == 0 else 1
            blocks.append(ResidualBlock(channels, out, stride, norm))
            channels = out
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)))
    return nn.Sequential(*blocks)


class Tokens(nn.Module):
    """Embed an input as ``seq_len`` tokens: reshape to ``(N, seq_len, F/seq_len)``, project, add positions."""

    def __init__(self, in_features: int, seq_len: int, d_model: int) -> None:
        super().__init__()
        if in_features % seq_len:
            raise ValueError(f"in_features={in_features} must be divisible by seq_len={seq_len}")
        self.seq_len = seq_len
        self.proj = nn.Linear(in_features // seq_len, d_model)
        self.pos = nn.Parameter(torch.randn(1, seq_len, d_model) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.reshape(x.shape[0], self.seq_len, -1)) + self.pos


class _MeanPoolHead(nn.Module):
    def __init__(self, d_model: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.linear = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x.mean(dim=1)))


def transformer_classifier(
    in_features: int = 784, seq_len: int = 28, num_classes: int = 10, d_model: int = 64, nhead: int = 4,
    num_layers: int = 4, dim_feedforward: int = 128, dropout: float = 0.0,
) -> nn.Sequential:
    """A Transformer encoder classifier: token embedding, ``num_layers`` pre-norm encoder layers, mean-pool head.

    For Fashion-MNIST the 28 image rows are the tokens (``in_features=784, seq_len=28``); for MNIST-1D use
    ``in_features=40, seq_len=10``. Dropout defaults to 0 so that runs are deterministic given the seed.
    """
    _check_positive(in_features=in_features, seq_len=seq_len, num_classes=num_classes, d_model=d_model,
                    nhead=nhead, num_layers=num_layers)
    if d_model % nhead:
        raise ValueError(f"d_model={d_model} must be divisible by nhead={nhead}")
    layers = [nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True)
              for _ in range(num_layers)]
    return nn.Sequential(Tokens(in_features, seq_len, d_model), *layers, _MeanPoolHead(d_model, num_classes))


MODELS: dict[str, Callable[..., nn.Sequential]] = {
    "deep_mlp": deep_mlp,
    "small_cnn": small_cnn,
    "small_resnet": small_resnet,
    "transformer": transformer_classifier,
}


def build_model(name: str, *, seed: int | None = None, dtype: torch.dtype | None = None,
                device: torch.device | str | None = None, **kwargs: object) -> nn.Sequential:
    """Build a reference model by name (one of :data:`MODELS`), seeded for identical initialisation."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = factory(**kwargs)
    else:
        model = factory(**kwargs)
    return model.to(device=device, dtype=dtype)


def he_init(model: nn.Module, seed: int) -> None:
    """He (Kaiming-normal, fan-in) initialisation of Linear/Conv weights, zero biases, seeded.

    PyTorch's default Linear init (uniform with bound 1/sqrt(fan_in)) shrinks the signal through a deep
    ReLU MLP so much that an 8-block net barely trains in a few epochs; He init keeps its scale
    (He et al., "Delving Deep into Rectifiers", ICCV 2015): W ~ N(0, 2 / fan_in). The draws come from a
    generator seeded with 20000 + ``seed``, so the learning curves and the prediction-error runs of one seed
    start from the same weights.
    """
    gen = torch.Generator(device="cpu").manual_seed(20_000 + seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                fan_in = m.weight[0].numel()
                w = torch.randn(m.weight.shape, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / fan_in)
                m.weight.copy_(w)
                if m.bias is not None:
                    m.bias.zero_()
