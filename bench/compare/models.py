"""The benchmark's three models, their deterministic initialisation and their synthetic data.

models.h holds the same definitions for C++. Both sides must stay in step: the harness
checks it (run.py trains both for a few steps and compares every parameter).

  small  MLP 512-1024-512-10, 1.05 M parameters: per-iteration overhead dominates.
  cnn    3 conv layers on 3x32x32 images and a 2-layer head, 2.2 M parameters:
         compute dominates (the head's 8.4 MB of gradients are ready early in backward
         and reduced while the convolutions' backward runs).
  wide   MLP 1024-4096-4096-1024-10, 25.2 M parameters (101 MB of gradients):
         communication dominates.
  tiny   one Linear 16-10 on 4 samples: next to no work, so that an iteration is mostly
         framework; it measures DDP's fixed cost per iteration at world size 1.
  gpt    (LayerNorm gains: the closed form + 1) examples/gpt's default character-level GPT (4 layers, 4 heads, n_embd 128,
         block 64, vocabulary 96, no dropout), 0.8 M parameters, 32 windows per rank:
         a transformer's mix of matrix products, attention and many small tensors.
         Its logits [B, T, 96] are flattened to [B*T, 96]; tokens and targets are
         (7 i + 3 s) % 96 and (5 i + 1 + s) % 96 over the flattened positions i.

Weights come from a closed form, not from a random generator, so that C++ and Python
start from bit-identical values without sharing a file:
  param p (in registration order), numel n:  sin(0.37 * arange(n) + p) * scale
  scale = 1/sqrt(fan_in) for weights (fan_in = numel / shape[0]), 0.01 for biases,
computed in float64 and rounded to float32. Data likewise: batch k of rank r is
  x = sin(0.013 * arange(B * D) + 1.7 * (r * K + k)),  y = (7 * arange(B) + 3 * (r * K + k)) % 10
for K pre-generated batches that the loop cycles through.
"""

import math
import os
import sys

import torch
from torch import nn

NUM_CLASSES = 10
NUM_BATCHES = 4  # K: distinct batches per rank, generated before timing

# name -> (per-rank batch, input shape without the batch dimension)
SPECS = {
    "small": (32, (512,)),
    "cnn": (16, (3, 32, 32)),
    "wide": (8, (1024,)),
    "tiny": (4, (16,)),
    "gpt": (32, (64,)),
}
GPT_VOCAB, GPT_BLOCK = 96, 64


def build(name):
    if name == "small":
        model = nn.Sequential(
            nn.Linear(512, 1024), nn.ReLU(),
            nn.Linear(1024, 512), nn.ReLU(),
            nn.Linear(512, NUM_CLASSES))
    elif name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(128 * 8 * 8, 256), nn.ReLU(),
            nn.Linear(256, NUM_CLASSES))
    elif name == "wide":
        model = nn.Sequential(
            nn.Linear(1024, 4096), nn.ReLU(),
            nn.Linear(4096, 4096), nn.ReLU(),
            nn.Linear(4096, 1024), nn.ReLU(),
            nn.Linear(1024, NUM_CLASSES))
    elif name == "tiny":
        model = nn.Sequential(nn.Linear(16, NUM_CLASSES))
    elif name == "gpt":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "examples", "gpt"))
        import gpt as gpt_example
        model = nn.Sequential(gpt_example.Gpt(GPT_VOCAB, GPT_BLOCK, 4, 4, 128, 0.0),
                              nn.Flatten(0, 1))
        init_deterministic(model)
        with torch.no_grad():  # LayerNorm gains near 1 (closed form + 1), as models.cpp
            for k, p in model.named_parameters():
                if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                    p.add_(1.0)
        return model
    else:
        raise ValueError(f"unknown model {name!r}: expected small, cnn, wide, tiny or gpt")
    init_deterministic(model)
    return model


@torch.no_grad()
def init_deterministic(model):
    for p, param in enumerate(model.parameters()):
        n = param.numel()
        if param.dim() > 1:
            scale = 1.0 / math.sqrt(n / param.shape[0])
        else:
            scale = 0.01
        w = torch.arange(n, dtype=torch.float64).mul_(0.37).add_(p).sin_().mul_(scale)
        param.copy_(w.to(torch.float32).view_as(param))


def batches(name, rank):
    batch, shape = SPECS[name]
    numel = batch * math.prod(shape)
    out = []
    for k in range(NUM_BATCHES):
        s = rank * NUM_BATCHES + k
        if name == "gpt":
            i = torch.arange(numel, dtype=torch.int64)
            out.append((((i * 7 + 3 * s) % GPT_VOCAB).view(batch, *shape),
                        (i * 5 + 1 + s) % GPT_VOCAB))
            continue
        x = torch.arange(numel, dtype=torch.float64).mul_(0.013).add_(1.7 * s).sin_()
        x = x.to(torch.float32).view(batch, *shape)
        y = (torch.arange(batch, dtype=torch.int64) * 7 + 3 * s) % NUM_CLASSES
        out.append((x, y))
    return out


def num_parameters(model):
    return sum(p.numel() for p in model.parameters())
