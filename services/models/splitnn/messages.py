"""split-NN's own messages (proto/vflsec/v1/splitnn.proto) as the steps the engines run through ``family_call``
(services/models/family.py FamilyStep): TopStep at the coordinator (coordinator-top), PlainForward at a passive
party (active-top). The engines' training-step admission and answer budget checkpoint what these change, so the
steps declare no checkpoint of their own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from vflsec.services.common import ACTIVE, COORDINATOR, PASSIVE
from vflsec.services.errors import InvalidArgument
from vflsec.services.models.family import FamilyStep, KeyHolderContext, MeteredKeys, PassiveContext, StepAnswer

if TYPE_CHECKING:
    from vflsec.services.crypto import he

    from .trainers import SplitNNKeyHolder, SplitNNPassive


def _top_step(
    trainer: SplitNNKeyHolder,
    ctx: KeyHolderContext,
    step: int,
    embedding: he.EncryptedMatrix,
    labels: np.ndarray,
    sample_index: np.ndarray,
    widths: Mapping[str, int],
    epoch: int = 0,
) -> StepAnswer:
    """coordinator-top (TopStep): the top model's step on the decrypted sum h of the step (in its Train call's
    ``epoch``, which sets the learning-rate schedule's rate); ∂L/∂h and the loss. Everything that can be checked
    without the key is checked before anything is decrypted (a refused step spends no budget)."""
    n = embedding.shape[0]
    if len(sample_index) != n or np.shape(labels) != (n,):
        raise InvalidArgument(f"{len(sample_index)} sample indices and {np.shape(labels)} labels for {n} rows")
    if epoch < 0:
        raise InvalidArgument(f"epoch must be >= 0, got {epoch}")
    classes = class_labels(labels, trainer.n_classes)

    def compute(keys: MeteredKeys) -> StepAnswer:
        try:
            keys.check_form(embedding.ciphertexts, product=False)
        except ValueError as exc:
            raise InvalidArgument(f"logits: {exc}") from exc
        return trainer.top_step(keys, embedding, classes, epoch)

    return ctx.train(step, sample_index, widths, embedding.layout, compute)


def class_labels(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """The batch's labels as class indices: integers in 0..n_classes-1, else INVALID_ARGUMENT (0.5 is refused, never
    truncated to class 0)."""
    values = np.asarray(labels, dtype=np.float64)
    if not np.isfinite(values).all() or (values != np.round(values)).any():
        raise InvalidArgument("labels must be integer class indices")
    if values.size and (values.min() < 0 or values.max() >= n_classes):
        raise InvalidArgument(f"labels must be classes 0..{n_classes - 1}, got {values.min():g}..{values.max():g}")
    return values.astype(np.int64)


def _plain_forward(
    trainer: SplitNNPassive, ctx: PassiveContext, step: int, sample_index: np.ndarray, epoch: int = 0
) -> np.ndarray:
    """active-top (PlainForward): z_p in the clear, step >= 1 training (in order, in its Train call's ``epoch``),
    0 inference."""
    return ctx.output_in_the_clear(step, sample_index, epoch)


STEPS: Mapping[str, Mapping[str, FamilyStep]] = {
    COORDINATOR: {"top_step": FamilyStep(_top_step, frozenset({ACTIVE}), checkpoint=False)},
    PASSIVE: {"plain_forward": FamilyStep(_plain_forward, frozenset({ACTIVE}), checkpoint=False)},
}
