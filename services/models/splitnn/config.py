"""Split-NN architecture: one frozen, validated description shared by every party and the central reference.

Both topologies split the same network at its first layer: each bottom model ends in a linear layer (no
activation), so that the top model starts with the activation of the combined first-layer output, as in ye
§3.1 (f_θ applied to z = z_A + z_B). ``coordinator-top`` sums the parties' embeddings (h = Σ h_p, which is
what CKKS can add); ``active-top`` concatenates the active party's embedding with each passive party's
linear output z_B, whose width is free (ye's Algorithm 1 needs it >= d_B, hence the default max(d_B, 8)).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

# Shared by every family's settings (re-exported for this package's modules).
from vflsec.services.models.family import DictForm as DictForm
from vflsec.services.models.family import positive_int as positive_int

Topology = Literal["coordinator-top", "active-top"]
Activation = Literal["relu", "tanh", "sigmoid"]

TOPOLOGIES: tuple[str, ...] = get_args(Topology)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
MIN_PASSIVE_WIDTH = 8  # active-top default passive width is max(d_B, MIN_PASSIVE_WIDTH) (clarifications.md)
# A passive party's embedding defense widens its default z_p by at most this many columns (masquerade's m <= 128,
# services/defenses/embeddings.py): a wider announcement is refused before the active party builds on it.
MAX_WIDENING = 128

@dataclass(frozen=True)
class SplitNNConfig(DictForm):
    """The network of one federation. Party 0 is the active party, parties 1..P the passive ones.

    ``bottom_hidden[p]`` are party p's hidden layer widths before its embedding layer (empty: the bottom is
    one linear layer); in ``active-top`` the passive bottoms are always one linear layer, so only
    ``bottom_hidden[0]`` may be non-empty there. ``passive_width`` is the width of that layer (None: the
    default max(d_B, 8) per passive party); ``passive_widths``, when given, is each passive party's own width as it
    announced it at JoinSession (a party whose embedding defense needs more than the default widens its layer).
    """

    topology: Topology
    features: tuple[int, ...]
    n_classes: int
    embedding: int = 16
    bottom_hidden: tuple[tuple[int, ...], ...] | None = None  # None: no hidden layers at any party
    top_hidden: tuple[int, ...] = (32,)
    activation: Activation = "relu"
    dropout: float = 0.0
    bottom_bias: bool = True
    top_bias: bool = True
    passive_width: int | None = None
    passive_bias: bool = False
    passive_widths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Normalise sequences to tuples so that equal configs compare (and hash) equal.
        try:
            object.__setattr__(self, "features", tuple(self.features))
            object.__setattr__(self, "top_hidden", tuple(self.top_hidden))
            object.__setattr__(self, "passive_widths", tuple(self.passive_widths))
            hidden = ((),) * len(self.features) if self.bottom_hidden is None else self.bottom_hidden
            object.__setattr__(self, "bottom_hidden", tuple(tuple(h) for h in hidden))
        except TypeError:
            raise ValueError(
                "split-NN config: features and top_hidden must be sequences of integers, bottom_hidden one such "
                "sequence per party"
            ) from None
        for error in self._errors():
            raise ValueError(f"split-NN config: {error}")

    def _errors(self) -> Iterator[str]:
        if self.topology not in TOPOLOGIES:
            yield f"topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}"
        if len(self.features) < 2:
            yield f"features needs the active party and at least one passive party, got {self.features}"
        if any(not positive_int(d) for d in self.features):
            yield f"every party's feature count must be a positive integer, got {self.features}"
        if not (positive_int(self.n_classes) and self.n_classes >= 2):
            yield f"n_classes must be an integer >= 2, got {self.n_classes!r}"
        if not positive_int(self.embedding):
            yield f"embedding width must be a positive integer, got {self.embedding!r}"
        if len(self.bottom_hidden) != len(self.features):
            yield f"bottom_hidden has {len(self.bottom_hidden)} entries for {len(self.features)} parties"
        widths = [w for layers in self.bottom_hidden for w in layers] + list(self.top_hidden)
        if any(not positive_int(w) for w in widths):
            yield f"hidden layer widths must be positive integers, got {self.bottom_hidden} and {self.top_hidden}"
        if self.topology == "active-top" and any(self.bottom_hidden[1:]):
            yield "active-top passive bottoms are one linear layer (ye's setting): bottom_hidden[1:] must be empty"
        if self.topology == "coordinator-top" and self.passive_width is not None:
            yield "passive_width applies to active-top only (coordinator-top bottoms output the embedding width)"
        if self.passive_width is not None and not positive_int(self.passive_width):
            yield f"passive_width must be a positive integer, got {self.passive_width!r}"
        if self.passive_widths and self.topology != "active-top":
            yield "passive_widths apply to active-top only (coordinator-top bottoms output the embedding width)"
        if self.passive_widths and len(self.passive_widths) != self.n_passive:
            yield f"passive_widths has {len(self.passive_widths)} entries for {self.n_passive} passive parties"
        if any(not positive_int(w) for w in self.passive_widths):
            yield f"passive_widths must be positive integers, got {self.passive_widths}"
        elif self.passive_width is not None and any(w != self.passive_width for w in self.passive_widths):
            yield (
                f"a passive party announced a z_p width in {self.passive_widths}, but the session fixed "
                f"passive_width = {self.passive_width}"
            )
        elif self.passive_width is None and len(self.passive_widths) == self.n_passive:
            for d_p, w in zip(self.features[1:], self.passive_widths, strict=True):
                if not max(d_p, MIN_PASSIVE_WIDTH) <= w <= max(d_p, MIN_PASSIVE_WIDTH) + MAX_WIDENING:
                    yield (
                        f"a passive party of {d_p} features announced a z_p width of {w}, outside "
                        f"[max(d_p, {MIN_PASSIVE_WIDTH}), that + {MAX_WIDENING}]"
                    )
        if self.activation not in ACTIVATIONS:
            yield f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
        if not (isinstance(self.dropout, int | float) and math.isfinite(self.dropout) and 0 <= self.dropout < 1):
            yield f"dropout must lie in [0, 1), got {self.dropout!r}"
        for flag in ("bottom_bias", "top_bias", "passive_bias"):
            if not isinstance(getattr(self, flag), bool):
                yield f"{flag} must be a bool, got {getattr(self, flag)!r}"

    @property
    def n_passive(self) -> int:
        return len(self.features) - 1

    def output_width(self, party: int) -> int:
        """Width of party ``party``'s bottom output: E, or z_B's width for an active-top passive party."""
        if self.topology == "active-top" and party > 0:
            if self.passive_widths:
                return self.passive_widths[party - 1]
            return self.passive_width or max(self.features[party], MIN_PASSIVE_WIDTH)
        return self.embedding

    @property
    def top_input(self) -> int:
        """The top model's input: h = Σ h_p (E wide) or [h_a, z_1, ..., z_P] (concatenated)."""
        if self.topology == "coordinator-top":
            return self.embedding
        return sum(self.output_width(p) for p in range(len(self.features)))


def check_backend(topology: str, backend: str) -> None:
    """Refuse a backend the topology cannot use (clarifications.md): active-top has no coordinator and no HE."""
    if topology == "active-top" and backend != "plain":
        raise ValueError(
            f"--backend {backend} does not apply to --topology active-top: the passive party sends z_B to the "
            "active party in the clear (no coordinator, no HE), so there is nothing to encrypt; use --backend "
            "plain, or --topology coordinator-top to keep embeddings under CKKS"
        )
