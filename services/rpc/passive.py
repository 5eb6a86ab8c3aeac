"""A passive party's service (proto/vflsec/v1/passive.proto): the active party's and the coordinator's calls on
:class:`PassiveParty`."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np

from vflsec.services.crypto import he
from vflsec.services.defenses import params as param_defenses
from vflsec.services.engines.passive import PassiveParty, PassiveSession
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.transport import psi_stream, wire
from vflsec.services.transport.server import rpc
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.services.transport.tls import current_caller
from vflsec.v1 import common_pb2, passive_pb2, passive_pb2_grpc


class PassiveServicer(passive_pb2_grpc.PassiveServicer):
    def __init__(self, party: PassiveParty, max_message_bytes: int) -> None:
        self.party = party
        self.max_message_bytes = max_message_bytes  # the server's; bounds the one-message PsiExchange's reply

    def _owner(self, session_id: str) -> PassiveSession:
        """Active-only RPCs: the caller must be the active party that owns the session."""
        return self.party.owned(session_id, current_caller().party_id)

    @rpc
    def JoinSession(self, request: passive_pb2.JoinSessionRequest, context: grpc.ServicerContext):
        family, values = wire.model_settings(request.model, request.training)
        n = self.party.join(
            request.session_id,
            wire.backend_name(request.backend),
            request.n_classes,
            values,
            caller=current_caller().party_id,
            family_name=family,
        )
        s = self.party.session(request.session_id)
        return passive_pb2.JoinSessionReply(
            n_features=n,
            n_rows=len(self.party.data.ids),
            embedding_release=wire.steps_message(s.embedding.announced()),
            output_width=s.trainer.share_width if s.trainer.output_in_the_clear else 0,
            share_mask_key=s.share_mask_key or b"",
        )

    @rpc
    def PsiExchange(self, request: passive_pb2.PsiExchangeRequest, context: grpc.ServicerContext):
        """vflsec.v1's one-message form: the stream's exchange, its list cut into the stream's chunks."""
        self._owner(request.session_id)
        psi_stream.check_reply_size(len(request.blinded), len(self.party.data.ids), self.max_message_bytes)
        chunks = psi_stream.listed(request.blinded)
        return psi_stream.gathered(self.party.psi_exchange(request.session_id, request.salt, chunks))

    @rpc
    def PsiExchangeStream(self, requests: Iterator[passive_pb2.PsiExchangeChunk], context: grpc.ServicerContext):
        with self.party.psi_stream_slot(current_caller().party_id):
            opened = psi_stream.opened(requests)
            if opened is None:
                raise InvalidArgument("PSI: the active party's stream carries no message")
            session_id, salt, chunks = opened
            self._owner(session_id)
            for name, chunk in self.party.psi_exchange(session_id, salt, chunks):
                yield psi_stream.reply(name, chunk)

    @rpc
    def PsiOprfStream(self, requests: Iterator[passive_pb2.PsiOprfRequest], context: grpc.ServicerContext):
        with self.party.psi_stream_slot(current_caller().party_id):
            hello, steps = psi_stream.oprf_opened(requests)
            self._owner(hello.session_id)
            for out in self.party.psi_oprf(hello.session_id, hello, steps):
                yield psi_stream.oprf_reply(out)

    @rpc
    def PsiFinish(self, request: passive_pb2.PsiFinishRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        n = self.party.psi_finish(request.session_id, np.asarray(request.positions, dtype=np.int64))
        return passive_pb2.PsiFinishReply(n_common=n)

    @rpc
    def Forward(self, request: passive_pb2.ForwardRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        raise FailedPrecondition(
            "Forward is retired: an LR step's forward goes to the coordinator under this party's mask "
            "(ShareTrainingLogits); split-NN's through its own RPCs"
        )

    @rpc
    def ShareTrainingLogits(self, request: passive_pb2.ForwardRequest, context: grpc.ServicerContext):
        self.party.family_call(
            request.session_id,
            current_caller().party_id,
            "share_training_logits",
            step=request.step,
            sample_index=np.asarray(request.sample_index, dtype=np.int64),
            epoch=request.epoch,
        )
        return common_pb2.Empty()

    @rpc
    def ShareLogits(self, request: passive_pb2.ShareLogitsRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        index = np.asarray(request.sample_index, dtype=np.int64)
        self.party.share_logits(request.session_id, request.query_id, index)
        return common_pb2.Empty()

    @rpc
    def ShareLogitsBatch(self, request: passive_pb2.ShareLogitsBatchRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        queries = [(q.query_id, np.asarray(q.sample_index, dtype=np.int64)) for q in request.queries]
        outcomes = self.party.share_logits_batch(request.session_id, queries)
        return common_pb2.EntryStatuses(status=[wire.entry_status(error) for error in outcomes])

    @rpc
    def Backward(self, request: passive_pb2.BackwardRequest, context: grpc.ServicerContext):
        s = self._owner(request.session_id)
        index = np.asarray(request.sample_index, dtype=np.int64)
        feedback: he.EncryptedMatrix | np.ndarray
        if request.HasField("gradient"):  # split-NN's ∂L/∂h, in the clear
            feedback = from_tensor(request.gradient, "gradient", ndim=2).copy()
        else:
            feedback = wire.from_message(s.backend, request.delta, "delta")
        self.party.backward(request.session_id, request.step, index, feedback, wire.digest(request.delta.ciphertexts))
        return common_pb2.Empty()

    @rpc
    def GetWeights(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.check_coordinator(current_caller().party_id)
        return to_tensor(self.party.weights(request.session_id))

    @rpc
    def TrainedRows(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.check_coordinator(current_caller().party_id)
        return to_tensor(self.party.trained(request.session_id))

    @rpc
    def AlignedRows(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.check_coordinator(current_caller().party_id)
        return passive_pb2.AlignedRowsReply(aligned_rows=self.party.aligned(request.session_id))

    @rpc
    def DiscloseWeights(self, request: passive_pb2.DiscloseRequest, context: grpc.ServicerContext):
        self.party.check_coordinator(current_caller().party_id)
        steps = self.party.disclose(request.session_id, list(request.steps))
        return passive_pb2.Disclosure(steps=[disclosed_step(name, result) for name, result in steps])

    @rpc
    def ForecastRisk(self, request: passive_pb2.DiscloseRequest, context: grpc.ServicerContext):
        self.party.check_forecaster(current_caller().party_id)
        f = self.party.forecast(request.session_id, list(request.steps), request.warn_fraction)
        return passive_pb2.RiskForecast(
            d=f["d"],
            n_classes=f["n_classes"],
            rank=f["rank"],
            half=f["half"],
            withheld=f["withheld"],
            ls=float("nan") if f["ls"] is None else f["ls"],
            half_star=float("nan") if f["half_star"] is None else f["half_star"],
            rank_condition=f["rank_condition"],
            zero_error=f["zero_error"],
            warnings=f["warnings"],
        )

    @rpc
    def CloseSession(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.owned(request.session_id, current_caller().party_id, closing=True)
        self.party.close(request.session_id)
        return common_pb2.Empty()


def disclosed_step(name: str, result: param_defenses.Distorted) -> passive_pb2.DisclosedStep:
    # Only scalar private facts travel (the coordinator checks e.g. the achieved g); transforms stay here.
    private = {k: str(v) for k, v in result.private.items() if isinstance(v, int | float | str | bool)}
    return passive_pb2.DisclosedStep(
        name=name,
        withheld=result.disclosed is None,
        weights=None if result.disclosed is None else to_tensor(result.disclosed),
        bias_offset=None if result.bias_offset is None else to_tensor(result.bias_offset),
        public=result.public,
        private=private,
    )


# RPC -> the LR family step it runs (ModelFamily.steps; tests/unit/test_authz.py keeps the two equal)
LR_STEPS = {"ShareTrainingLogits": "share_training_logits"}
ROLE_POLICY: dict[str, frozenset[str]] = {
    "JoinSession": frozenset({"active"}),
    "PsiExchange": frozenset({"active"}),
    "PsiExchangeStream": frozenset({"active"}),
    "PsiOprfStream": frozenset({"active"}),
    "PsiFinish": frozenset({"active"}),
    "Forward": frozenset({"active"}),
    "ShareTrainingLogits": frozenset({"active"}),
    "ShareLogits": frozenset({"active"}),
    "ShareLogitsBatch": frozenset({"active"}),
    "Backward": frozenset({"active"}),
    "GetWeights": frozenset({"coordinator"}),
    "TrainedRows": frozenset({"coordinator"}),
    "AlignedRows": frozenset({"coordinator"}),
    "DiscloseWeights": frozenset({"coordinator"}),
    "ForecastRisk": frozenset({"coordinator", "operator"}),
    "CloseSession": frozenset({"active"}),
}


def add_to_server(servicer: PassiveServicer, server: grpc.Server) -> None:
    """passive_pb2_grpc's registration, but PsiFinish's request is read by psi_stream.read_finish (the same bytes,
    no message of every position)."""

    class Handlers:  # takes what the generated code registers
        def add_generic_rpc_handlers(self, _: object) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
            self.service, self.handlers = service, handlers

    taken = Handlers()
    passive_pb2_grpc.add_PassiveServicer_to_server(servicer, taken)
    handlers = dict(taken.handlers)
    handlers["PsiFinish"] = handlers["PsiFinish"]._replace(request_deserializer=psi_stream.read_finish)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(taken.service, handlers),))
    server.add_registered_method_handlers(taken.service, handlers)
