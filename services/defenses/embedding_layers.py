"""The torch side of the passive embedding defenses (services/defenses/embeddings.py): the layers a defended
passive bottom is made of. Kept apart so that a party whose operator configured no embedding defense, or that never
trains a split-NN, starts without importing torch (about 190 MB and 1.3 CPU-s per process)."""

from __future__ import annotations

import hashlib
import math
from typing import Protocol

import numpy as np
import torch
from torch import nn

from vflsec.services.crypto.entropy import os_entropy

__all__ = ["MasqueradeLinear", "NoisyEmbedding", "model_version", "os_initialised"]


# What the layers ask of their defense (embeddings.Masquerade and EmbeddingNoise satisfy these): the layers sit
# below the defenses that build them, so they name no defense class.
class Bits(Protocol):
    m: int | None  # fabricated bits per row

    def projection(self, d_in: int) -> np.ndarray: ...

    def bits(self, x: np.ndarray) -> np.ndarray: ...


class Noise(Protocol):
    def draw(self, x: np.ndarray, width: int, version: bytes = b"") -> np.ndarray: ...


def os_initialised(module: nn.Module) -> nn.Module:
    """``module`` with every linear layer redrawn from OS entropy (torch's default U(±1/√fan_in)).

    A defended bottom never starts from the session seed: the active party chose it, and with the initial weights
    it would read [Q x; a(x)] (or x, under noise alone) off the first batch's z_B."""
    draw = os_entropy()
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                bound = 1.0 / math.sqrt(layer.in_features)
                for tensor in (layer.weight, layer.bias):
                    if tensor is not None:
                        tensor.copy_(torch.from_numpy(draw.uniform(-bound, bound, tuple(tensor.shape))))
    return module


class MasqueradeLinear(nn.Module):
    """z_B = P [Q x; a(x)] (+ b): Q (rank × d_B) and P ((rank + m) × width, its last m columns the u_i).

    Q is a fixed buffer, never trained, the same in every session of the party (embeddings.py's
    ``Masquerade.projection``): were it trained or drawn per session, z_B of two model versions or two sessions
    stacked side by side would span [Q_1 x, Q_2 x], which holds the true binary columns again (rank reduction
    undone). P and b train."""

    q: torch.Tensor

    def __init__(
        self, masquerade: Bits, d_in: int, width: int, rank: int, bias: bool, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        dtype = dtype or torch.float64  # split-NN's; a defended bottom takes the dtype of the one it replaces
        self.masquerade = masquerade
        self.register_buffer("q", torch.from_numpy(masquerade.projection(d_in)).to(dtype))
        self.p = os_initialised(nn.Linear(rank + (masquerade.m or 0), width, bias=bias).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.from_numpy(self.masquerade.bits(x.detach().cpu().numpy())).to(x.dtype)
        return self.p(torch.cat([x @ self.q.T, a], dim=1))


def model_version(module: nn.Module) -> bytes:
    """SHA-256 of ``module``'s weights and buffers: the same weights give the same digest, any update a new one."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        data = tensor.detach().cpu().numpy().tobytes()
        digest.update(len(name).to_bytes(8, "little") + name.encode() + len(data).to_bytes(8, "little") + data)
    return digest.digest()


class NoisyEmbedding(nn.Module):
    def __init__(self, module: nn.Module, noise: Noise) -> None:
        super().__init__()
        self.inner, self.noise = module, noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.inner(x)
        noise = self.noise.draw(x.detach().cpu().numpy(), z.shape[1], model_version(self.inner))
        return z + torch.from_numpy(noise).to(z.dtype)
