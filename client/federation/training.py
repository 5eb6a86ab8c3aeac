"""The operator's training loop, shared by ``demo`` and the attack harness: every epoch through the active
party's Train RPC, optionally stopped early on a validation split scored through the coordinator's release.

Early stopping needs no engine support: a Train request whose previous run is done starts a new run on the
same session (the optimizer state, the batch-order generator and the step counter carry on), and it ends with
FinishTraining, after which the coordinator releases scores of the finished model. So each epoch is one Train
call of one epoch, then one Predict of the validation rows (admitted, and charged to the owner's query budget,
like any query; the coordinator refuses releases while the next epoch trains). The services cannot roll a
model back, so the model kept is the last one trained (Keras' default): ``patience`` epochs after the best.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vflsec.client.federation.operator import Operator

StepCallback = Callable[[int, int, int], None]  # epoch (1-based, of the whole run), batch, batches in the epoch


@dataclass
class TrainingRecord:
    """What training did: epochs trained (the kept model's), and with early stopping the best epoch and the
    validation accuracy after every epoch."""

    epochs: int  # asked for
    epochs_trained: int
    patience: int = 0  # 0: no early stopping
    best_epoch: int | None = None
    validation_rows: int = 0
    validation_accuracy: list[float] = field(default_factory=list)

    @property
    def stopped_early(self) -> bool:
        return self.epochs_trained < self.epochs

    def to_dict(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "epochs_trained": self.epochs_trained,
            "patience": self.patience,
            "best_epoch": self.best_epoch,
            "stopped_early": self.stopped_early,
            "validation_rows": self.validation_rows,
            "validation_accuracy": self.validation_accuracy,
        }

    def summary(self) -> str:
        """One line for a report."""
        if not self.patience:
            return f"trained {self.epochs_trained} epochs (no early stopping)"
        best = self.validation_accuracy[self.best_epoch - 1] if self.best_epoch else float("nan")
        how = (
            f"stopped after epoch {self.epochs_trained} of {self.epochs}"
            if self.stopped_early
            else f"trained all {self.epochs} epochs"
        )
        return (
            f"early stopping (patience {self.patience}, {self.validation_rows} validation rows): {how}; best "
            f"validation accuracy {best:.4f} at epoch {self.best_epoch}; the model kept is epoch "
            f"{self.epochs_trained}'s"
        )

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> TrainingRecord:
        return cls(**{k: v for k, v in record.items() if k != "stopped_early"})


def train(
    operator: Operator,
    session_id: str,
    train_ids: Sequence[str],
    epochs: int,
    *,
    validation_ids: Sequence[str] = (),
    validation_labels: np.ndarray | None = None,
    patience: int = 0,
    on_step: StepCallback | None = None,
) -> TrainingRecord:
    """Train ``epochs`` epochs in one Train call, or with ``patience`` > 0 epoch by epoch until the validation
    accuracy has not improved for ``patience`` epochs."""
    if not patience:
        for p in operator.train(session_id, train_ids, epochs):
            if on_step is not None and not p.done:
                on_step(p.epoch, p.batch, p.n_batches)
        return TrainingRecord(epochs, epochs)
    if not len(validation_ids) or validation_labels is None or len(validation_labels) != len(validation_ids):
        raise ValueError("early stopping needs validation rows and their labels")
    record = TrainingRecord(epochs, 0, patience, validation_rows=len(validation_ids))
    best = -1.0
    for epoch in range(1, epochs + 1):
        for p in operator.train(session_id, train_ids, 1):
            if on_step is not None and not p.done:
                on_step(epoch, p.batch, p.n_batches)
        released = operator.predict(session_id, validation_ids)
        accuracy = float(np.mean(released.scores.argmax(axis=1) == validation_labels))
        record.validation_accuracy.append(accuracy)
        record.epochs_trained = epoch
        if accuracy > best:
            best, record.best_epoch = accuracy, epoch
        elif epoch - record.best_epoch >= patience:
            break
    return record
