"""Early stopping's rule (client/federation/training.py) against a scripted operator, and the validation split of
the spec."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from vflsec.client.federation.launcher import FederationSpec, SpecError
from vflsec.client.federation.operator import Released
from vflsec.client.federation.training import train
from vflsec.services.data import datasets


@dataclass
class ScriptedOperator:
    """Answers Train with one progress message and Predict with scores whose accuracy follows a script."""

    accuracies: Sequence[float]
    calls: list[tuple[str, int]] = field(default_factory=list)

    def train(self, session_id: str, sample_ids: Sequence[str], epochs: int) -> Iterator[object]:
        self.calls.append(("train", epochs))
        yield type("P", (), {"epoch": 1, "batch": 1, "n_batches": 1, "done": False})()

    def predict(self, session_id: str, sample_ids: Sequence[str]) -> Released:
        self.calls.append(("predict", len(sample_ids)))
        accuracy = self.accuracies[sum(c[0] == "predict" for c in self.calls) - 1]
        right = round(accuracy * len(sample_ids))
        predicted = np.r_[np.ones(right, int), np.zeros(len(sample_ids) - right, int)]
        return Released(list(sample_ids), np.eye(2)[predicted], [], 0)


IDS = [f"v{i}" for i in range(10)]
LABELS = np.ones(10, int)


@pytest.mark.parametrize(
    ("accuracies", "epochs", "patience", "trained", "best"),
    [
        ([0.5, 0.7, 0.6, 0.7, 0.9], 10, 2, 4, 2),  # no strict improvement for 2 epochs after epoch 2 (a tie is none)
        ([0.5, 0.7, 0.6, 0.8, 0.7, 0.6], 10, 2, 6, 4),  # epoch 4 improves, so the count restarts
        ([0.5, 0.6, 0.7], 3, 1, 3, 3),  # always improving: every epoch asked for
        ([0.9, 0.1, 0.1, 0.1], 10, 3, 4, 1),
    ],
)
def test_stops_when_validation_accuracy_has_not_improved_for_patience_epochs(
    accuracies: list[float], epochs: int, patience: int, trained: int, best: int
) -> None:
    op = ScriptedOperator(accuracies)
    record = train(op, "s", ["t1", "t2"], epochs, validation_ids=IDS, validation_labels=LABELS, patience=patience)
    assert (record.epochs_trained, record.best_epoch) == (trained, best)
    assert record.validation_accuracy == pytest.approx(accuracies[:trained])
    # Every epoch is one Train call of one epoch, then one Predict of the validation rows.
    assert op.calls == [("train", 1), ("predict", len(IDS))] * trained
    assert record.to_dict()["stopped_early"] == (trained < record.epochs)
    assert f"best validation accuracy {accuracies[best - 1]:.4f} at epoch {best}" in record.summary()


def test_without_patience_training_is_one_train_call_and_no_query() -> None:
    op = ScriptedOperator([])
    record = train(op, "s", ["t1"], 7)
    assert op.calls == [("train", 7)] and record.epochs_trained == 7 and record.best_epoch is None


def test_early_stopping_needs_validation_rows() -> None:
    with pytest.raises(ValueError, match="validation rows"):
        train(ScriptedOperator([]), "s", ["t1"], 3, patience=2)


def test_validation_rows_come_out_of_the_training_side_stratified_and_disjoint() -> None:
    ds = datasets.load_dataset("breast_cancer")
    plain = FederationSpec(ds, queries=100)
    spec = FederationSpec(ds, queries=100, early_stopping_patience=3, validation_fraction=0.25)
    train_all, none, held = plain.dealt_sets()
    train_ids, validation, held_es = spec.dealt_sets()
    assert none == [] and held == held_es  # the queried rows do not move
    assert sorted(train_ids + validation) == sorted(train_all) and not set(train_ids) & set(validation)
    assert len(validation) == pytest.approx(0.25 * len(train_all), abs=2)
    y = ds.y[datasets.select_ids(ds.ids, validation)]
    y_all = ds.y[datasets.select_ids(ds.ids, train_all)]
    assert np.mean(y) == pytest.approx(np.mean(y_all), abs=0.01)  # stratified
    # Target encoding is fitted on the training rows only: the dealer's split excludes the validation rows.
    assert spec.dealt_split() == (train_ids, held)
    # train_rows subsamples what is left for training, never the validation rows.
    small = FederationSpec(ds, queries=100, early_stopping_patience=3, validation_fraction=0.25, train_rows=50)
    small_train, small_validation, _ = small.dealt_sets()
    assert small_validation == validation and len(small_train) == 50 and set(small_train) <= set(train_ids)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"validation_fraction": 0.0}, "validation fraction must lie in (0, 1), got 0.0"),
        ({"validation_fraction": 1.0}, "validation fraction must lie in (0, 1), got 1.0"),
        ({"early_stopping_patience": -1}, "early stopping patience must be 0 (off) or positive, got -1"),
    ],
)
def test_bad_early_stopping_settings_are_refused_with_the_bound(fields: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FederationSpec("breast_cancer", **fields)
