"""The central reference: the same network as one torch module over the full feature matrix, trained on the same
batches with the same optimiser, so that a federated run can be compared with it step for step.

Training randomness (parameter init, data order, dropout masks) is seeded here and in the federated run alike;
none of it is release-time randomness.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F

from vflsec.services.data.datasets import Dataset, Scaler, select_ids, train_test_split_ids

from .config import SplitNNConfig
from .modules import DTYPE, CentralModel
from .optim import OptimizerConfig, build_optimizer


@dataclass(frozen=True)
class SplitData:
    """A vertically split train/test set: one column block per party (active first), labels separate."""

    train: tuple[np.ndarray, ...]
    y_train: np.ndarray
    test: tuple[np.ndarray, ...]
    y_test: np.ndarray

    def __post_init__(self) -> None:
        for name, blocks, y in (("train", self.train, self.y_train), ("test", self.test, self.y_test)):
            if {b.shape[0] for b in blocks} != {len(y)}:
                raise ValueError(f"{name} blocks have {[b.shape[0] for b in blocks]} rows for {len(y)} labels")
        if [b.shape[1] for b in self.train] != [b.shape[1] for b in self.test]:
            raise ValueError("train and test blocks differ in their column counts")

    @property
    def features(self) -> tuple[int, ...]:
        return tuple(b.shape[1] for b in self.train)

    @classmethod
    def from_dataset(cls, dataset: Dataset, n_passive: int = 1, test_fraction: float = 0.2, seed: int = 0) -> SplitData:
        """A seeded stratified split, standardised on the training rows, columns dealt out in order in
        ``n_passive + 1`` near-equal blocks (the first to the active party). Scaling is per column, so it is what
        each party would fit on its own block."""
        if not 1 <= n_passive < dataset.n_features:
            raise ValueError(f"n_passive must lie in 1..{dataset.n_features - 1}, got {n_passive}")
        train_ids, test_ids = train_test_split_ids(dataset.ids, dataset.y, test_fraction, seed)
        train, test = select_ids(dataset.ids, train_ids), select_ids(dataset.ids, test_ids)
        scaler = Scaler.fit(dataset.X[train], "standard")
        X_train, X_test = scaler.transform(dataset.X[train]), scaler.transform(dataset.X[test])
        blocks = np.array_split(np.arange(dataset.n_features), n_passive + 1)
        return cls(
            tuple(X_train[:, b] for b in blocks), dataset.y[train], tuple(X_test[:, b] for b in blocks), dataset.y[test]
        )


@dataclass
class RunResult:
    """A training run's outcome: test scores and accuracy, per-epoch mean loss and wall time."""

    test_scores: np.ndarray
    accuracy: float
    losses: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """An epoch's mini-batches: consecutive slices of a permutation seeded by (seed, epoch)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def run_epochs(
    step: Callable[[np.ndarray], float],
    end_epoch: Callable[[], None],
    n: int,
    epochs: int,
    batch_size: int,
    seed: int,
    batches_of: Callable[[int], list[np.ndarray]] | None = None,
) -> tuple[list[float], list[float]]:
    """Drive ``step(rows) -> loss`` over every epoch's batches (``batches_of(epoch)``; default
    :func:`epoch_batches`); (mean losses, seconds) per epoch. Dropout masks come from torch's global generator,
    seeded here for the run and restored afterwards."""
    losses, seconds = [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for epoch in range(epochs):
            start = time.perf_counter()
            batches = epoch_batches(n, batch_size, seed, epoch) if batches_of is None else batches_of(epoch)
            batch_losses = [step(rows) for rows in batches]
            end_epoch()
            seconds.append(time.perf_counter() - start)
            losses.append(float(np.mean(batch_losses)))
    return losses, seconds


def central_run(
    config: SplitNNConfig,
    optim: OptimizerConfig,
    data: SplitData,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    batches_of: Callable[[int], list[np.ndarray]] | None = None,
) -> tuple[RunResult, CentralModel]:
    """Train the central reference (on the federation's batches, if ``batches_of`` gives them); its result and
    the trained model."""
    if data.features != config.features:
        raise ValueError(f"data has party widths {data.features}, the config {config.features}")
    model = CentralModel(config, seed)
    optimizer, scheduler = build_optimizer(model.parameters(), optim)
    X = torch.tensor(np.hstack(data.train), dtype=DTYPE)
    y = torch.as_tensor(data.y_train, dtype=torch.int64)

    def step(rows: np.ndarray) -> float:
        model.train()
        index = torch.as_tensor(rows)
        loss = F.cross_entropy(model(X[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.item())

    losses, seconds = run_epochs(step, scheduler.step, len(y), epochs, batch_size, seed, batches_of)
    model.eval()
    with torch.no_grad():
        scores = torch.softmax(model(torch.tensor(np.hstack(data.test), dtype=DTYPE)), dim=1).numpy()
    return RunResult(scores, accuracy(scores, data.y_test), losses, seconds), model


def accuracy(scores: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(scores, axis=1) == np.asarray(y)))
