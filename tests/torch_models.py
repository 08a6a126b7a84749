"""PyTorch modules for ``--torch tests/torch_models.py:FUNC`` (tests/test_torch.py): each FUNC
returns (module, example inputs), seeded. Imported only by reprokit's --torch, never by pytest
collection (torch is optional)."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """x[1,3,32,32] → Conv-BN-ReLU → Conv-ReLU → MaxPool → global mean → Linear → [1,10]"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.head(x.mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    """x[1,16,64] → LayerNorm → 4-head self-attention (MatMul-Softmax-MatMul) + x → LayerNorm →
    MLP(GELU) + x → [1,16,64]. ``scale`` multiplies the attention logits (a large one overflows
    fp16 storage: the planted engine divergence)."""

    def __init__(self, dim: int = 64, heads: int = 4, scale: float = 1.0):
        super().__init__()
        self.heads, self.scale = heads, scale
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        logits = (q @ k.transpose(-2, -1)) * (self.scale / (d // self.heads) ** 0.5)
        attn = torch.softmax(logits, dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class _PlantedSwish(torch.autograd.Function):
    """Eager: x * sigmoid(x). Exported (legacy exporter): x * sigmoid(2x) — an exporter bug planted
    on purpose, as a wrong custom symbolic would be."""

    @staticmethod
    def forward(ctx, x):
        return x * torch.sigmoid(x)

    @staticmethod
    def symbolic(g, x):
        two = g.op("Constant", value_t=torch.tensor(2.0))
        return g.op("Mul", x, g.op("Sigmoid", g.op("Mul", x, two)))


class PlantedExporterBug(nn.Module):
    """x[1,32] → Linear → planted swish → Linear → [1,8]"""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(_PlantedSwish.apply(self.fc1(x)))


def small_cnn():
    torch.manual_seed(0)
    return SmallCNN(), (torch.randn(1, 3, 32, 32),)


def transformer_block():
    torch.manual_seed(0)
    return TransformerBlock(), (torch.randn(1, 16, 64),)


def transformer_block_overflow():
    torch.manual_seed(0)
    return TransformerBlock(scale=1e5), (torch.randn(1, 16, 64),)


def planted_exporter_bug():
    torch.manual_seed(0)
    return PlantedExporterBug(), (torch.randn(1, 32),)
