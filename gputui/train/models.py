"""The models of the multi-GPU material: its LeNet variant, its ResNet-18 variant, and a small
MLP; and a GPT for text (``gputui.train.gpt``, sized by [model] and data.context).

Each model is an ``nn.Sequential`` of coarse blocks, so the model-parallel strategy can cut it
into consecutive stages at block boundaries.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from gputui.train.gpt import GPTShape, gpt


def lenet(in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Sequential:
    """The material's LeNet variant: 3x3 conv 20, ReLU, 2x2 avg-pool, 5x5 conv 50, ReLU,
    avg-pool, dense 800-128-10 (800 = 50*4*4 for 28x28 inputs)."""
    side = ((image_size - 2) // 2 - 4) // 2
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(in_channels, 20, kernel_size=3), nn.ReLU(),
                      nn.AvgPool2d(kernel_size=2, stride=2)),
        nn.Sequential(nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(),
                      nn.AvgPool2d(kernel_size=2, stride=2)),
        nn.Sequential(nn.Flatten(), nn.Linear(50 * side * side, 128), nn.ReLU()),
        nn.Linear(128, num_classes),
    )


class Residual(nn.Module):
    """The material's residual block: two 3x3 convs with batch norm, optional 1x1 shortcut."""

    def __init__(self, in_channels: int, channels: int, use_1x1: bool = False, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv3 = nn.Conv2d(in_channels, channels, 1, stride=stride) if use_1x1 else None
        self.bn1 = nn.BatchNorm2d(channels)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


def _resnet_stage(in_channels: int, channels: int, first: bool) -> nn.Sequential:
    if first:
        return nn.Sequential(Residual(in_channels, channels), Residual(channels, channels))
    return nn.Sequential(Residual(in_channels, channels, use_1x1=True, stride=2),
                         Residual(channels, channels))


def resnet18(in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Sequential:
    """The material's ResNet-18 variant: a 3x3 stride-1 stem without max-pool (small images),
    four stages of two residual blocks, global average pooling and a dense classifier."""
    del image_size  # global pooling makes the head independent of the input size
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
                      nn.BatchNorm2d(64), nn.ReLU()),
        _resnet_stage(64, 64, first=True),
        _resnet_stage(64, 128, first=False),
        _resnet_stage(128, 256, first=False),
        _resnet_stage(256, 512, first=False),
        nn.Sequential(nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(512, num_classes)),
    )


def mlp(in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Sequential:
    """A small multilayer perceptron: flatten, 256, 128, classes."""
    return nn.Sequential(
        nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, 256),
                      nn.ReLU()),
        nn.Sequential(nn.Linear(256, 128), nn.ReLU()),
        nn.Linear(128, num_classes),
    )


BUILDERS = {"lenet": lenet, "resnet18": resnet18, "mlp": mlp}


def init_weights(model: nn.Module, scheme: str, std: float) -> None:
    """'normal': every conv/linear weight from N(0, std), biases zero, as the material does;
    'default': leave PyTorch's init."""
    if scheme != "normal":
        return
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def gpt_shape(model, context: int, vocab: int) -> GPTShape:
    """The GPT a [model] table sizes, for windows of ``context`` tokens over ``vocab``."""
    return GPTShape(vocab_size=vocab, context=context, n_layer=model.n_layer,
                    n_head=model.n_head, n_embd=model.n_embd, tie=model.tie,
                    moe_experts=model.moe_experts, moe_top_k=model.moe_top_k,
                    moe_capacity_factor=model.moe_capacity_factor)


def build_model(name: str, in_channels: int, image_size: int, num_classes: int, *, seed: int,
                init: str = "normal", init_std: float = 0.01,
                shape: GPTShape | None = None) -> nn.Sequential:
    """Build and initialise a model on the CPU; the same seed gives the same parameters.
    ``gpt`` takes its ``shape`` (``gpt_shape``) and keeps GPT-2's init."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "gpt":
            if shape is None:
                raise ValueError("model 'gpt' needs its shape (models.gpt_shape)")
            return gpt(shape)
        model = BUILDERS[name](in_channels, image_size, num_classes)
        init_weights(model, init, init_std)
    return model


def count_params(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
