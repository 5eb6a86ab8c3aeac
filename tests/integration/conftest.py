"""In-process federations: every party is a real gRPC server on loopback with real mTLS and real CKKS."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from vflsec.client.federation.launcher import FederationLayout, FederationSpec, run_in_process, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.crypto import ring_mask
from vflsec.services.data import datasets
from vflsec.services.transport.server import peer_channel
from vflsec.v1 import coordinator_pb2


@dataclass
class Federation:
    layout: FederationLayout
    parties: dict
    operator: Operator

    def channel(self, caller: str, target: str) -> grpc.Channel:
        """A channel to ``target`` authenticated with ``caller``'s certificate (to test role checks)."""
        return peer_channel(self.layout.addresses[target], target, self.layout.tls(caller), 64 << 20)


@contextlib.contextmanager
def federation(workdir: Path, **spec: object) -> Iterator[Federation]:
    name = spec.pop("dataset", "breast_cancer")
    layout = write_federation(FederationSpec(datasets.load_dataset(str(name)), **spec), workdir)
    with run_in_process(layout) as parties, layout.operator_channel() as channel:
        yield Federation(layout, parties, Operator(channel))


@contextlib.contextmanager
def curious_wine(workdir: Path, **spec: object) -> Iterator[tuple[Federation, Path]]:
    """wine dealt so that passive-1 holds 10 of 13 columns (it wins splits), with the curious plugin's store at
    passive-1: (the federation, the store's path). The tree-partition and review tests' federation."""
    store = workdir / "passive.sqlite"
    plugin = {"path": "vflsec.services.plugins.curious:CuriousPlugin", "options": {"store": str(store)}}
    with federation(workdir / "fed", dataset="wine", n_passive=1, passive_features=10, plugins=[plugin],
                    plugins_at="passive-1", **spec) as fed:  # fmt: skip
        yield fed, store


@pytest.fixture(scope="module")
def binary_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("binary"), dataset="breast_cancer", n_passive=1, allow_plain=True) as fed:
        yield fed


def binary_passive_dataset(n: int, d_active: int = 3, d_passive: int = 5, rebuilt: bool = False) -> datasets.Dataset:
    """ye's Bank shape: the passive party holds one binary feature among continuous ones, and the label needs it.
    ``rebuilt``: as on Bank (`contact` and the economic indicators), the party's continuous columns nearly rebuild
    the binary one (b3 = b1 + b2 / 2 + b0 + 0.02 noise); otherwise it is independent of them."""
    rng = np.random.default_rng(0)
    x_active = rng.normal(size=(n, d_active))
    x_passive = np.hstack([rng.integers(0, 2, size=(n, 1)), rng.normal(size=(n, d_passive - 1))])
    if rebuilt:
        x_passive[:, 3] = x_passive[:, 1] + 0.5 * x_passive[:, 2] + x_passive[:, 0] + 0.02 * x_passive[:, 3]
    y = x_active[:, 0] + 2 * x_passive[:, 0] + x_passive[:, 1] + rng.normal(0, 0.5, n) > 1.0
    ids = np.array([f"s{i:05d}" for i in range(n)])
    names = [f"a{j}" for j in range(d_active)] + [f"b{j}" for j in range(d_passive)]
    X = np.hstack([x_active, x_passive])
    return datasets.Dataset("binary-passive", ids, X, y.astype(np.int64), names, ["0", "1"])


def training_scores_request(
    passives: list,
    session_id: str,
    step: int,
    index: list[int],
    widths: dict[str, int],
    *,
    k: int = 1,
    replicas: int = 1,
) -> coordinator_pb2.TrainingScoresRequest:
    """A test playing every party of an LR step's forward: each passive party (its Coordinator stub) submits a share of
    zero logits for the step and rows (a share is any words: zero unmasked here), and the request carries the owner's
    share of zero too, so z = 0 and every p = 0.5 (what the tests' probes rely on)."""
    zeros = ring_mask.to_bytes(np.zeros((len(index), k), dtype=np.uint64))
    for stub in passives:
        stub.SubmitTrainingShare(
            coordinator_pb2.TrainingShare(session_id=session_id, step=step, sample_index=index, share=zeros)
        )
    return coordinator_pb2.TrainingScoresRequest(
        session_id=session_id, step=step, share=zeros, replicas=replicas, sample_index=index, widths=widths
    )
