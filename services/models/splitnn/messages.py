"""split-NN's own messages (proto/vflsec/v1/splitnn.proto) as the steps the engines run through ``family_call``
(services/models/family.py FamilyStep): TopStep and SubmitEmbedding at the coordinator, SendEmbedding at a passive
party (coordinator-top), PlainForward at a passive party (active-top). The engines' training-step admission and
answer budget checkpoint what these change, so the steps declare no checkpoint of their own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from vflsec.services.common import ACTIVE, COORDINATOR, PASSIVE
from vflsec.services.crypto import entropy, he, ring_mask
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models.family import FamilyStep, KeyHolderContext, PassiveContext, StepAnswer, share_words

if TYPE_CHECKING:
    from .roles import SplitNNKeyHolder, SplitNNPassive


def _top_step(
    trainer: SplitNNKeyHolder,
    ctx: KeyHolderContext,
    step: int,
    share: bytes,
    labels: np.ndarray,
    sample_index: np.ndarray,
    widths: Mapping[str, int],
    epoch: int = 0,
) -> StepAnswer:
    """coordinator-top (TopStep): the top model's step on h, the owner's share plus every passive party's share of
    the step for exactly these rows (in its Train call's ``epoch``, which sets the learning-rate schedule's rate);
    ∂L/∂h and the loss. Nothing is decrypted, so the engine charges no key budget."""
    n = len(sample_index)
    if not n:
        raise InvalidArgument("sample_index is empty")
    if np.shape(labels) != (n,):
        raise InvalidArgument(f"{np.shape(labels)} labels for {n} rows")
    if epoch < 0:
        raise InvalidArgument(f"epoch must be >= 0, got {epoch}")
    words = _words(trainer, share, n)
    classes = class_labels(labels, trainer.n_classes)
    layout = he.MatrixLayout.for_matrix(words.shape, 1, he.SLOTS)  # the step's record (no ciphertext)
    return ctx.train(
        step, sample_index, widths, layout, lambda keys: trainer.top_step(step, sample_index, words, classes, epoch)
    )


def _words(trainer: SplitNNKeyHolder, share: bytes, rows: int) -> np.ndarray:
    """A share's words, (rows, E), else INVALID_ARGUMENT naming the field."""
    if trainer.head is None:
        raise FailedPrecondition("an active-top session sums no embedding shares at the coordinator")
    return share_words(share, rows, trainer.settings.embedding)


def _submit_embedding(
    trainer: SplitNNKeyHolder, ctx: KeyHolderContext, step: int, sample_index: np.ndarray, share: bytes
) -> None:
    """A passive party's masked share of training step ``step`` (SubmitEmbedding): kept, for its position, until the
    owner's TopStep of that step; rows below the aligned count, distinct."""
    if step < 1:
        raise InvalidArgument(f"step must be a training step >= 1, got {step}")
    rows = ctx.share_rows(sample_index)
    trainer.accept_share(ctx.caller, step, rows, _words(trainer, share, len(rows)))


def _send_embedding(
    trainer: SplitNNPassive, ctx: PassiveContext, step: int, sample_index: np.ndarray, epoch: int = 0
) -> bytes:
    """coordinator-top (SendEmbedding): this party's h_p for training step ``step`` (in order), masked with its own
    zero-sum mask r_p (services/crypto/ring_mask.py) under a nonce drawn for this forward, and sent straight to the
    coordinator once the session lock is released; the owner gets the nonce when the coordinator has the share.
    Nothing here refuses on h_p's values (rule 4): encoding clips them."""
    if trainer.output_in_the_clear:
        raise FailedPrecondition("an active-top session sends its output with PlainForward")
    if step < 1:
        raise InvalidArgument(f"SendEmbedding is for training steps >= 1, got {step}")
    if not ctx.share_mask_key:
        raise FailedPrecondition("this session was joined without a share-mask key: open a new one")
    h = ctx.training_output(step, sample_index, epoch)
    nonce = entropy.new_nonce()
    mask = ring_mask.embedding_mask(ctx.share_mask_key, ctx.session_id, step, nonce, sample_index, h.shape[1])
    share, index = ring_mask.encode(h) + mask, np.array(sample_index)
    ctx.defer(lambda: ctx.key_holder.splitnn.submit_embedding(ctx.session_id, step, index, share))
    return nonce


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
    COORDINATOR: {
        "top_step": FamilyStep(_top_step, frozenset({ACTIVE}), checkpoint=False),
        "submit_embedding": FamilyStep(_submit_embedding, frozenset({PASSIVE}), checkpoint=False),
    },
    PASSIVE: {
        "plain_forward": FamilyStep(_plain_forward, frozenset({ACTIVE}), checkpoint=False),
        "send_embedding": FamilyStep(_send_embedding, frozenset({ACTIVE}), checkpoint=False),
    },
}
