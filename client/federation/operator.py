"""The active party's operator: drives a federation through the active party's gRPC API."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from google.protobuf.json_format import MessageToDict

from vflsec.services.errors import InvalidArgument
from vflsec.services.transport import wire
from vflsec.services.transport.server import peer_channel
from vflsec.services.transport.tensors import from_tensor
from vflsec.services.transport.tls import TlsFiles
from vflsec.v1 import active_pb2, active_pb2_grpc, common_pb2, passive_pb2, passive_pb2_grpc


@dataclass
class Released:
    sample_ids: list[str]
    scores: np.ndarray
    chain: list[tuple[str, dict[str, str]]]
    argmax_changed: int


@dataclass
class Model:
    active_weights: np.ndarray | None  # LR only
    bias: np.ndarray | None  # LR only
    passive: dict[str, np.ndarray | None]  # None: withheld by the parameter-release chain
    chain: list[tuple[str, dict[str, str]]]
    family: str = "lr"
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # the model as the active party holds it, by name


# Settings given as create_session's own arguments (they travel in the TrainingConfig), by their settings name.
_OWN_ARGUMENTS = {"seed": "seed", "name": "optimizer", "learning_rate": "learning_rate", "weight_decay": "l2"}


def _check_own_arguments(family: str, settings: Mapping[str, Any]) -> None:
    if family == "lr" and settings:
        wire.check_keys("LR settings (LR's are create_session's optimizer, learning_rate, l2, seed)", settings, ())
    optimizer = settings.get("optimizer") or {}
    given = [k for k in ("seed",) if k in settings] + [k for k in _OWN_ARGUMENTS if k != "seed" and k in optimizer]
    if given:
        names = ", ".join(f"{k} (create_session's {_OWN_ARGUMENTS[k]}=)" for k in given)
        raise InvalidArgument(f"{family} settings: {names} are this call's own arguments, not settings")


def _chain(steps: Sequence[common_pb2.ReleaseStep]) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, dict(s.params)) for s in steps]


def predict_request(session_id: str, sample_ids: Sequence[str]) -> active_pb2.PredictRequest:
    return active_pb2.PredictRequest(session_id=session_id, sample_ids=list(sample_ids))


def released(reply: active_pb2.PredictReply) -> Released:
    """A Predict's answer as the operator reads it (:meth:`Operator.predict`, and the load benchmark's asyncio
    callers)."""
    scores = from_tensor(reply.scores, "scores", ndim=2, finite=False)
    return Released(list(reply.sample_ids), scores, _chain(reply.chain), reply.argmax_changed)


class Operator:
    def __init__(self, channel: grpc.Channel) -> None:
        self.stub = active_pb2_grpc.ActiveStub(channel)

    def create_session(
        self,
        backend: str = "ckks",
        *,
        optimizer: str = "adam",
        learning_rate: float = 0.05,
        l2: float = 1e-4,
        batch_size: int = 0,  # 0: the active party's default (64, raised to the federation's minimum batch)
        seed: int = 0,
        session_id: str = "",
        family: str = "lr",
        settings: Mapping[str, Any] | None = None,
    ) -> active_pb2.SessionInfo:
        """``family`` and its ``settings`` choose the model (e.g. "splitnn" with {"embedding": 16}); LR by default.
        A setting the request would not carry, or one that belongs to this call's own arguments, is INVALID_ARGUMENT
        (services.errors.InvalidArgument) before anything is sent."""
        _check_own_arguments(family, settings or {})
        training = common_pb2.TrainingConfig(
            optimizer=optimizer, learning_rate=learning_rate, l2=l2, batch_size=batch_size, seed=seed
        )
        request = active_pb2.CreateSessionRequest(
            session_id=session_id,
            backend=wire.BACKEND_ENUM[backend],
            training=training,
            model=wire.model_choice(family, settings or {}),
        )
        return self.stub.CreateSession(request)

    def align(self, session_id: str, progress: Callable[[int, int, str], None] | None = None) -> list[str]:
        """The common IDs, in the common order (``AlignStream``: chunk by chunk); ``progress(done, total, stage)``
        hears the active party's counts of curve operations while the alignment runs."""
        common: list[str] = []
        for update in self.stub.AlignStream(common_pb2.SessionRef(session_id=session_id)):
            if update.HasField("progress"):
                if progress is not None:
                    progress(update.progress.done, update.progress.total, update.progress.stage)
            else:
                common += update.common.common_ids
        return common

    def train(self, session_id: str, sample_ids: Sequence[str], epochs: int) -> Iterator[active_pb2.TrainProgress]:
        yield from self.stub.Train(
            active_pb2.TrainRequest(session_id=session_id, sample_ids=list(sample_ids), epochs=epochs)
        )

    def predict(self, session_id: str, sample_ids: Sequence[str]) -> Released:
        return released(self.stub.Predict(predict_request(session_id, sample_ids)))

    def fetch_model(self, session_id: str) -> Model:
        reply = self.stub.FetchModel(common_pb2.SessionRef(session_id=session_id))
        passive = {
            b.party_id: None if b.withheld else from_tensor(b.weights, b.party_id, ndim=2)
            for b in reply.released.passive
        }
        return Model(
            from_tensor(reply.active_weights, "active weights", ndim=2) if reply.HasField("active_weights") else None,
            from_tensor(reply.bias, "bias", ndim=1) if reply.HasField("bias") else None,
            passive,
            _chain(reply.released.chain),
            reply.family or "lr",
            {name: from_tensor(t, name) for name, t in reply.tensors.items()},
        )

    def close(self, session_id: str) -> None:
        self.stub.CloseSession(common_pb2.SessionRef(session_id=session_id))


def forecast_risk(
    address: str, party: str, files: TlsFiles, session_id: str, steps: Sequence[str], warn_fraction: float = 0.0
) -> dict[str, Any]:
    """A passive party's forecast of the attack MSE its disclosed block would allow (``Passive.ForecastRisk``)."""
    request = passive_pb2.DiscloseRequest(session_id=session_id, steps=list(steps), warn_fraction=warn_fraction)
    with peer_channel(address, party, files, 16 << 20) as channel:
        reply = passive_pb2_grpc.PassiveStub(channel).ForecastRisk(request, timeout=600)
    return MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
