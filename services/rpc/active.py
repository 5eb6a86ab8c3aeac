"""The active party's service (proto/vflsec/v1/active.proto): the operator's calls on :class:`ActiveParty`."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import TypeVar

import grpc

from vflsec.services.engines.active import ActiveParty, AlignProgress
from vflsec.services.transport import wire
from vflsec.services.transport.server import rpc
from vflsec.services.transport.tensors import to_tensor
from vflsec.v1 import active_pb2, active_pb2_grpc, common_pb2

T = TypeVar("T")
ALIGN_CHUNK_IDS = 65_536  # common IDs per AlignStream message (about 1 MB of 12-character IDs)


class ActiveServicer(active_pb2_grpc.ActiveServicer):
    def __init__(self, party: ActiveParty) -> None:
        self.party = party

    @rpc
    def CreateSession(self, request: active_pb2.CreateSessionRequest, context: grpc.ServicerContext):
        family, values = wire.model_settings(request.model, request.training)
        training = wire.training_config(request.training)
        s = self.party.create_session(request.session_id, wire.backend_name(request.backend), training, family, values)
        return active_pb2.SessionInfo(
            session_id=s.session_id,
            n_classes=s.n_classes,
            class_names=self.party.class_names,
            n_active_features=self.party.data.X.shape[1],
            passive_features=s.passive_features,
            score_release=wire.steps_message(s.score_release),
            param_release=wire.steps_message(s.param_release),
        )

    @rpc
    def Align(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        # The whole list in one message (vflsec.v1's first form; AlignStream bounds it).
        ids = self.party.data.ids[self.party.align(request.session_id)]
        return active_pb2.AlignReply(common_ids=ids.tolist(), n_active=len(self.party.data.ids), n_common=len(ids))

    @rpc
    def AlignStream(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        rows = yield from _with_progress(lambda report: self.party.align(request.session_id, report))
        n_active = len(self.party.data.ids)
        for start in range(0, len(rows), ALIGN_CHUNK_IDS):
            ids = self.party.data.ids[rows[start : start + ALIGN_CHUNK_IDS]].tolist()
            common = active_pb2.AlignReply(common_ids=ids, n_active=n_active, n_common=len(rows))
            yield active_pb2.AlignUpdate(common=common)

    @rpc
    def Train(self, request: active_pb2.TrainRequest, context: grpc.ServicerContext):
        for p in self.party.train(request.session_id, list(request.sample_ids), request.epochs):
            yield active_pb2.TrainProgress(
                epoch=p.epoch, batch=p.batch, n_batches=p.n_batches, step=p.step, seconds=p.seconds, done=p.done
            )

    @rpc
    def Predict(self, request: active_pb2.PredictRequest, context: grpc.ServicerContext):
        scores, chain, changed = self.party.predict(request.session_id, list(request.sample_ids))
        return active_pb2.PredictReply(
            sample_ids=request.sample_ids,
            scores=to_tensor(scores),
            chain=wire.steps_message(chain),
            argmax_changed=changed,
        )

    @rpc
    def FetchModel(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        model, released = self.party.fetch_model(request.session_id)
        lr_fields = {  # LR's reply as vflsec.v1 clients read it
            field: to_tensor(model.tensors[name])
            for field, name in (("active_weights", "w_active"), ("bias", "bias"))
            if name in model.tensors
        }
        tensors = {name: to_tensor(value) for name, value in model.tensors.items()}
        return active_pb2.ModelReply(
            released=wire.released_model_message(released), family=model.family, tensors=tensors, **lr_fields
        )

    @rpc
    def CloseSession(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.close(request.session_id)
        return common_pb2.Empty()


def _with_progress(run: Callable[[Callable[[AlignProgress], None]], T]) -> Generator[active_pb2.AlignUpdate, None, T]:
    """Run ``run(report)`` in a thread, yielding a progress message for the latest report (at most one every
    0.5 s), then return its result (or raise its error)."""
    latest: queue.Queue[AlignProgress] = queue.Queue()
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["result"] = run(latest.put)
        except BaseException as exc:  # re-raised in the handler's thread, where @rpc maps it to a status
            outcome["error"] = exc

    thread = threading.Thread(target=work, name="align", daemon=True)
    thread.start()
    while thread.is_alive() or not latest.empty():
        thread.join(0.5)
        report = None
        while not latest.empty():
            report = latest.get_nowait()
        if report is not None:
            progress = active_pb2.AlignProgress(done=report.done, total=report.total, stage=report.stage)
            yield active_pb2.AlignUpdate(progress=progress)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]


ROLE_POLICY: dict[str, frozenset[str]] = {
    method: frozenset({"operator"})
    for method in ("CreateSession", "Align", "AlignStream", "Train", "Predict", "FetchModel", "CloseSession")
}

