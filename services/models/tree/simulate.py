"""An in-process federated run of the tree protocol: the per-party steps of :mod:`.steps` played against each other.

No gRPC, but every ciphertext that crosses a party boundary goes through its wire form (serialised and parsed as
the receiver does), the key holder decrypts with the secret key while the parties hold only the public context
(``he.make_keyholder`` / ``he.open_public``), and the masks come from OS entropy. Used by the tests and by
``benchmarks/bench_tree.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from vflsec.services.crypto import entropy, he

from .config import TreeConfig
from .reference import TreeData, accuracy, fit_bins
from .steps import ACTIVE, Builder, FeatureOwner, KeyHolder, LabelHolder, combine, full_tree
from .structure import Forest, ReleaseSetting, release_forest


@dataclass
class LocalFederation:
    config: TreeConfig
    builder: Builder
    labels: LabelHolder
    owners: list[FeatureOwner]
    keyholder: KeyHolder
    public: he.Backend
    messages: dict[str, int] = field(default_factory=dict)  # message kind -> count (and ciphertexts, bytes)

    @classmethod
    def create(cls, config: TreeConfig, data: TreeData, backend: str = "plain") -> LocalFederation:
        bins = fit_bins(config, data)  # a passive party's on its whole shard, as the services fit them
        owners = [FeatureOwner(p, b, x) for p, (b, x) in enumerate(zip(bins, data.train, strict=True))]
        builder = Builder(config, data.n_classes, len(data.y_train), [o.bins.sizes for o in owners])
        keys = he.make_keyholder(backend)
        public = he.open_public(backend, keys.public_context())
        return cls(config, builder, LabelHolder(data.y_train, data.n_classes), owners, KeyHolder(keys), public)

    def _count(self, kind: str, n: int = 1) -> None:
        self.messages[kind] = self.messages.get(kind, 0) + n

    def grow_node(self) -> None:
        """One node through every role."""
        task = self.builder.next_task()
        assert task is not None
        self._count("task")  # coordinator -> parties: rows, multiplicities, candidate features
        if not self.builder.open(task, self.labels.totals(task)):  # active -> coordinator: class totals
            return
        counts: dict[int, np.ndarray] = {}
        weights: dict[int, np.ndarray] = {}
        indicators = self.labels.indicators(task)
        if ACTIVE in task.features:  # the active party's own features: counts in the clear
            counts[ACTIVE] = self.owners[ACTIVE].plain_counts(task, indicators)
        passive = [p for p in task.features if p != ACTIVE]
        if passive:
            widest = max(self.builder.width(task, p) for p in passive)
            wire = self.labels.encrypt(self.public, task, widest)  # active -> passive parties
            self._count("encrypted indicators")
            self._count("indicator ciphertext bytes", sum(map(len, wire.ciphertexts)))
            for p in passive:
                received = he.matrix_from_wire(self.public, wire)
                products, mask_sums = self.owners[p].masked_products(self.public, received, task, entropy.os_entropy())
                blobs = [self.public.serialize(ct) for ct in products]  # passive -> coordinator
                self._count("masked products")
                self._count("product ciphertexts", len(blobs))
                self._count("product ciphertext bytes", sum(map(len, blobs)))
                weights[p] = self.owners[p].bin_weights(task)
                counts[p] = self.keyholder.open_counts(
                    p, task, self.builder.width(task, p), received.layout, blobs, mask_sums, weights[p]
                )
        split = self.builder.decide(task, counts, weights)
        if split is not None:  # coordinator -> owner: (feature, bin); owner -> everyone: the partition
            self._count("split")
            self.builder.apply(task, split, self.owners[split.owner].apply_split(task, split.feature, split.bin))

    def train(self) -> Forest:
        while not self.builder.done:
            self.grow_node()
        return self.builder.forest()

    def predict(self, X_parties: list[np.ndarray]) -> np.ndarray:
        """Each party answers its own splits; the coordinator routes and returns the (n, K) votes it would release."""
        directions = {o.party: o.directions(x) for o, x in zip(self.owners, X_parties, strict=True)}
        return combine(self.builder.forest(), directions, X_parties[0].shape[0])

    def released(self, setting: ReleaseSetting) -> Forest:
        """The model as the parameter-release chain discloses it to the active party."""
        return release_forest(full_tree(self.builder.forest(), self.owners), setting)


@dataclass
class TreeRun:
    votes: np.ndarray
    accuracy: float
    seconds: float
    federation: LocalFederation


def simulate(config: TreeConfig, data: TreeData, backend: str = "plain") -> TreeRun:
    federation = LocalFederation.create(config, data, backend)
    start = time.perf_counter()
    federation.train()
    seconds = time.perf_counter() - start
    votes = federation.predict(data.test)
    return TreeRun(votes, accuracy(votes, data.y_test), seconds, federation)
