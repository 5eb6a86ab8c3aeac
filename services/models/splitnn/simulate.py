"""An in-process federated run: the per-party step objects of :mod:`.steps` played against each other.

No gRPC, but every message that would cross a party boundary does so here as the engines send it: in coordinator-top
each party's embedding reaches the key holder as a share under the zero-sum masks (services/crypto/ring_mask.py),
each passive party's from its own key, and the key holder sums the shares as the services do
(:func:`.steps.open_masked`). Used by the in-process parity tests
(tests/unit/test_splitnn_parity.py, test_splitnn_bank.py); ``bench he`` runs split-NN through the services.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflsec.services.crypto import entropy, ring_mask

from .config import SplitNNConfig
from .optim import OptimizerConfig
from .reference import RunResult, SplitData, accuracy, run_epochs
from .steps import Bottom, Head, open_masked


@dataclass
class LocalFederation:
    """Every role of one federation in one process: ``bottoms[p]`` for the parties that hold one, the head."""

    config: SplitNNConfig
    bottoms: dict[int, Bottom]
    head: Head
    mask_keys: dict[int, bytes]  # each passive party's embedding-mask key (its own draw; the active party holds it)
    steps: int = 0  # forwards so far: each binds its masks, as a training step's number does

    @classmethod
    def create(cls, config: SplitNNConfig, optim: OptimizerConfig, seed: int) -> LocalFederation:
        first = 0 if config.topology == "coordinator-top" else 1  # active-top: the active bottom is in the head
        bottoms = {p: Bottom.create(config, p, optim, seed) for p in range(first, len(config.features))}
        keys = {p: entropy.new_key() for p in range(1, len(config.features))}
        return cls(config, bottoms, Head.create(config, optim, seed), keys)

    def _summed_h(self, blocks: tuple[np.ndarray, ...], train: bool) -> np.ndarray:
        """coordinator-top forward: every party's share under the zero-sum masks; the key holder sums them."""
        self.steps += 1
        rows = np.arange(len(blocks[0]))
        width = self.config.embedding
        keys = self.mask_keys.items()
        masks = {
            p: ring_mask.embedding_mask(key, "local", self.steps, entropy.new_nonce(), rows, width) for p, key in keys
        }
        h = {p: bottom.forward(blocks[p], train=train) for p, bottom in self.bottoms.items()}
        own = ring_mask.owner_share(h[0], list(masks.values()))
        return open_masked([own, *(ring_mask.encode(h[p]) + masks[p] for p in masks)])

    def train_step(self, blocks: tuple[np.ndarray, ...], y: np.ndarray) -> float:
        """One mini-batch through every role; the batch loss."""
        if self.config.topology == "coordinator-top":
            step = self.head.train_step([self._summed_h(blocks, train=True)], y)
            for bottom in self.bottoms.values():
                bottom.backward(step.grads[0])  # ∂L/∂h_p = ∂L/∂h for every party
        else:
            z = [self.bottoms[p].forward(blocks[p], train=True) for p in range(1, len(blocks))]
            step = self.head.train_step(z, y, local=blocks[0])
            for p, grad in enumerate(step.grads, start=1):
                self.bottoms[p].backward(grad)
        return step.loss

    def scores(self, blocks: tuple[np.ndarray, ...]) -> np.ndarray:
        """Inference: the confidence scores softmax(top(...)) for these rows."""
        if self.config.topology == "coordinator-top":
            return self.head.scores([self._summed_h(blocks, train=False)])
        z = [self.bottoms[p].forward(blocks[p], train=False) for p in range(1, len(blocks))]
        return self.head.scores(z, local=blocks[0])

    def end_epoch(self) -> None:
        for role in [*self.bottoms.values(), self.head]:
            role.end_epoch()


def simulate(
    config: SplitNNConfig,
    optim: OptimizerConfig,
    data: SplitData,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
) -> tuple[RunResult, LocalFederation]:
    """Train a federation on ``data`` with the batches :func:`.reference.central_run` uses; result and roles."""
    if data.features != config.features:
        raise ValueError(f"data has party widths {data.features}, the config {config.features}")
    federation = LocalFederation.create(config, optim, seed)

    def step(rows: np.ndarray) -> float:
        return federation.train_step(tuple(b[rows] for b in data.train), data.y_train[rows])

    losses, seconds = run_epochs(step, federation.end_epoch, len(data.y_train), epochs, batch_size, seed)
    scores = np.vstack(
        [federation.scores(tuple(b[rows] for b in data.test)) for rows in _chunks(len(data.y_test), batch_size)]
    )
    return RunResult(scores, accuracy(scores, data.y_test), losses, seconds), federation


def _chunks(n: int, size: int) -> list[np.ndarray]:
    return [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
