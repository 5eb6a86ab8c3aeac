"""In-process federations: every party is a real gRPC server on loopback with real mTLS and real CKKS."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from vflsec.client.federation import FederationLayout, FederationSpec, run_in_process, write_federation
from vflsec.client.operator import Operator
from vflsec.services.data import datasets
from vflsec.services.transport.server import peer_channel


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


@pytest.fixture(scope="module")
def binary_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("binary"), dataset="breast_cancer", n_passive=1, allow_plain=True) as fed:
        yield fed
