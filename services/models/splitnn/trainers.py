"""The split-NN family (services/models/family.py): its sizes, its own messages (.messages) and the roles it builds
and restores (.roles, where the protocol of one step is described)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vflsec.services.models.family import State, register

from . import modules
from .messages import STEPS
from .roles import (
    NAME,
    ActiveTopActive,
    EmbeddingDefense,
    SplitNNActive,
    SplitNNKeyHolder,
    SplitNNPassive,
    SplitNNSettings,
)
from .steps import Bottom, Head

DEFAULT_BATCH = 128  # rows per step: small shipped datasets (breast_cancer: 257 training rows) still get steps


def _restore(state: State) -> tuple[SplitNNSettings, bytes, dict[str, Any]]:
    arrays, meta = state
    return SplitNNSettings.from_dict(meta["splitnn"]), arrays["splitnn"].tobytes(), meta


class SplitNNFamily:
    name = NAME
    releases_passive_blocks = False  # no W_p block: the bottoms are pulled as named tensors instead
    releases_passive_tensors = True
    steps = STEPS  # its own messages (proto/vflsec/v1/splitnn.proto): .messages

    @staticmethod
    def tensor_prefix(position: int) -> str:
        """The names the passive party at ``position`` may release (its bottom): no stand-in for another's."""
        return f"bottom/{position}/"

    @staticmethod
    def block_width(n_features: int, *, active: bool) -> int:
        return n_features

    @staticmethod
    def min_batch_size(widths: Iterable[int]) -> int:
        # Every party learns ∂L/∂h row by row whatever the batch: no batch size hides more (docs/protocol.md).
        return 1

    @staticmethod
    def default_batch_size(widths: Iterable[int]) -> int:
        return DEFAULT_BATCH

    @staticmethod
    def answers_per_step(widths: Iterable[int], n_classes: int) -> int:
        """A training step decrypts nothing (the shares are summed under zero-sum masks), so it answers no functional
        of the training key; 1 keeps the engine's key epochs as long as they go (T = N/4)."""
        return 1

    @staticmethod
    def settings(values: Mapping[str, Any]) -> SplitNNSettings:
        return SplitNNSettings.from_dict(dict(values))

    @staticmethod
    def new_active(
        n_classes: int, n_features: int, settings: SplitNNSettings, passive_features: Sequence[int] = ()
    ) -> SplitNNActive | ActiveTopActive:
        own = settings.with_party(0)
        if own.topology == "active-top":
            features = (n_features, *passive_features)
            head = Head.create(own.network(features, n_classes), own.optim, modules.own_seed())
            return ActiveTopActive(own, n_classes, features, head)
        return SplitNNActive(own, n_classes, own.bottom(n_features, n_classes))

    @staticmethod
    def restore_active(state: State) -> SplitNNActive | ActiveTopActive:
        settings, blob, meta = _restore(state)
        if settings.topology == "active-top":
            features = tuple(meta["features"])
            head = Head.create(settings.network(features, meta["n_classes"]), settings.optim, seed=0)  # overwritten
            return ActiveTopActive(settings, meta["n_classes"], features, _loaded(head, blob))
        bottom = _loaded(settings.bottom(meta["width"], meta["n_classes"]), blob)
        return SplitNNActive(settings, meta["n_classes"], bottom)

    @staticmethod
    def new_passive(n_classes: int, n_features: int, settings: SplitNNSettings) -> SplitNNPassive:
        if settings.party < 1:
            raise ValueError("a passive party's position must be >= 1")
        return SplitNNPassive(settings, n_classes, settings.bottom(n_features, n_classes))

    @staticmethod
    def restore_passive(state: State, defense: EmbeddingDefense | None = None) -> SplitNNPassive:
        """``defense``: the embedding defense the session ran with (:meth:`SplitNNPassive.defended`), rebuilt by its
        owner from its own checkpoint."""
        settings, blob, meta = _restore(state)
        trainer = SplitNNPassive(settings, meta["n_classes"], settings.bottom(meta["width"], meta["n_classes"]))
        if defense is not None:
            trainer = trainer.defended(defense)
        _loaded(trainer.bottom, blob)
        return trainer

    @staticmethod
    def new_key_holder(n_classes: int, passive_parties: Sequence[str], settings: SplitNNSettings) -> SplitNNKeyHolder:
        head = settings.head(n_classes) if settings.topology == "coordinator-top" else None
        return SplitNNKeyHolder(settings, n_classes, head, len(passive_parties))

    @staticmethod
    def restore_key_holder(state: State) -> SplitNNKeyHolder:
        arrays, meta = state
        settings = SplitNNSettings.from_dict(meta["splitnn"])
        if "splitnn" not in arrays:  # active-top: no top model here
            return SplitNNKeyHolder(settings, meta["n_classes"], None)
        head = _loaded(settings.head(meta["n_classes"]), arrays["splitnn"].tobytes())
        return SplitNNKeyHolder(settings, meta["n_classes"], head, meta.get("passives", 1))


def _loaded(role: Bottom | Head, blob: bytes) -> Any:
    role.load_state(blob)
    return role


FAMILY = register(SplitNNFamily())
