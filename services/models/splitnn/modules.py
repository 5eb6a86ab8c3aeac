"""Torch modules of a split-NN: one bottom per party, the top, and their seeded construction.

Every module is built from its own seed derived from (seed, role), so a party that builds only its own bottom
gets exactly the parameters the central reference builds for that party given the same seed. In a deployment the
seed is :func:`own_seed`, a fresh draw from the OS entropy of the party that holds the module (rule 1,
docs/protocol.md): never the session's seed, which the active party chose and every party received.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from .config import SplitNNConfig

DTYPE = torch.float64  # CKKS decodes to float64; keeping torch in float64 too makes parity a pure HE question
_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
_TOP_ROLE = -1  # the top model's role index in the seed derivation (parties are 0..P)


def own_seed() -> int:
    """The seed of a module a service builds: 63 bits of this process's OS entropy, drawn per module. Parity tests
    (which need a central model's initial weights) replace this function in-process (tests/conftest.py
    ``pinned_initial_weights``); no RPC, configuration or CLI flag reaches it."""
    return secrets.randbits(63)


def module_seed(seed: int, role: int) -> int:
    """Independent torch seed for one role (party p >= 0, or the top)."""
    return int(np.random.SeedSequence([seed, role + 1]).generate_state(1)[0])


def _seeded(seed: int, role: int, build: Callable[[], nn.Module]) -> nn.Module:
    # fork_rng keeps the caller's global torch RNG untouched (dropout masks and data order stay theirs).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(module_seed(seed, role))
        return build().to(DTYPE)


def _mlp(widths: Sequence[int], config: SplitNNConfig, bias: bool, *, lead_activation: bool) -> nn.Sequential:
    """Linear layers through ``widths`` with activation + dropout between them (and first, if ``lead_activation``);
    the last layer is linear so that its outputs can be summed or concatenated across parties."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
        if i > 0 or lead_activation:
            layers.append(_ACTIVATIONS[config.activation]())
            if config.dropout > 0:
                layers.append(nn.Dropout(config.dropout))
        layers.append(nn.Linear(n_in, n_out, bias=bias))
    return nn.Sequential(*layers)


def build_bottom(config: SplitNNConfig, party: int, seed: int) -> nn.Module:
    """Party ``party``'s bottom model: x_p (batch, d_p) -> (batch, config.output_width(party))."""
    if not 0 <= party < len(config.features):
        raise ValueError(f"party index must lie in 0..{len(config.features) - 1}, got {party}")
    widths = [config.features[party], *config.bottom_hidden[party], config.output_width(party)]
    bias = config.passive_bias if config.topology == "active-top" and party > 0 else config.bottom_bias
    return _seeded(seed, party, lambda: _mlp(widths, config, bias, lead_activation=False))


def build_top(config: SplitNNConfig, seed: int) -> nn.Module:
    """The top model: combined first-layer output (batch, config.top_input) -> logits (batch, n_classes)."""
    widths = [config.top_input, *config.top_hidden, config.n_classes]
    return _seeded(seed, _TOP_ROLE, lambda: _mlp(widths, config, config.top_bias, lead_activation=True))


class ActiveTopHead(nn.Module):
    """active-top's active side: its own bottom, then the top on [h_a, z_1, ..., z_P]."""

    def __init__(self, config: SplitNNConfig, seed: int) -> None:
        super().__init__()
        self.bottom = build_bottom(config, 0, seed)
        self.top = build_top(config, seed)

    def forward(self, x_active: torch.Tensor, *z_passive: torch.Tensor) -> torch.Tensor:
        return self.top(torch.cat([self.bottom(x_active), *z_passive], dim=1))


class CentralModel(nn.Module):
    """The whole network over the full feature matrix (columns ordered active, passive 1, ..., passive P)."""

    def __init__(self, config: SplitNNConfig, seed: int) -> None:
        super().__init__()
        self.config = config
        self.bottoms = nn.ModuleList(build_bottom(config, p, seed) for p in range(len(config.features)))
        self.top = build_top(config, seed)

    def embeddings(self, X: torch.Tensor) -> list[torch.Tensor]:
        """Each party's bottom output, from its own column block of X."""
        blocks = torch.split(X, list(self.config.features), dim=1)
        return [bottom(x) for bottom, x in zip(self.bottoms, blocks, strict=True)]

    def combine(self, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.config.topology == "coordinator-top":
            return torch.stack(list(outputs)).sum(dim=0)
        return torch.cat(list(outputs), dim=1)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.top(self.combine(self.embeddings(X)))
