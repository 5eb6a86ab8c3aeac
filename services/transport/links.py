"""Typed clients for calls between parties: protobuf in and out here, numpy and he objects elsewhere."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
import numpy as np

from vflsec.services.crypto import he, oprf, psi, ring_mask
from vflsec.services.defenses.params import Distorted
from vflsec.services.defenses.release import ReleasedParams, ReleasedScores, StepDescription
from vflsec.services.errors import InvalidArgument, ServiceError
from vflsec.services.models.family import Received, TrainingConfig
from vflsec.services.transport import psi_stream, wire
from vflsec.services.transport.server import DEFAULT_CALL_POLICY, CallPolicy, call
from vflsec.services.transport.splitnn_links import SplitNnCoordinatorClient, SplitNnPassiveClient
from vflsec.services.transport.tensors import from_tensor
from vflsec.services.transport.tree_links import TreeCoordinatorClient, TreePassiveClient
from vflsec.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    passive_pb2,
    passive_pb2_grpc,
)

# The passive party validates and re-blinds our list and hashes and blinds its own (together about 0.15 ms per
# ID on one core, docs/performance.md): the exchange's deadline grows by 1 ms per ID we send, ample on a busy host.
PSI_SECONDS_PER_ID = 1e-3


@dataclass(frozen=True)
class Opened:
    """The coordinator's answer to OpenSession: epoch 0's public context and its release chains (public)."""

    public_context: bytes
    score_release: list[StepDescription]
    param_release: list[StepDescription]


@dataclass(frozen=True)
class Joined:
    """A passive party's answer to JoinSession."""

    n_features: int
    n_rows: int
    output_width: int  # its output's width when it sends it in the clear (split-NN active-top), else 0
    embedding_release: list[StepDescription]  # its own embedding defenses, announced (Kerckhoffs)
    share_mask_key: bytes  # the key of its zero-sum masks, its own draw


@dataclass(frozen=True)
class Admitted:
    """An admitted query: its id, the owner's total admitted so far (and its budget, 0: none)."""

    query_id: str
    scored: int
    budget: int


class CoordinatorClient:
    peer = "coordinator"

    def __init__(self, channel: grpc.Channel, policy: CallPolicy = DEFAULT_CALL_POLICY) -> None:
        self.stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        self.policy = policy
        # The families' services on the same channel (a family's trainer picks its own link by this name)
        self.splitnn = SplitNnCoordinatorClient(channel, policy)
        self.tree = TreeCoordinatorClient(channel, policy)

    def open_session(
        self,
        session_id: str,
        backend: str,
        n_classes: int,
        passive_parties: Sequence[str],
        family: str = "lr",
        training: TrainingConfig | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> Opened:
        """Open a session of model ``family`` (its settings: ``training`` and the family's ``values``)."""
        request = coordinator_pb2.OpenSessionRequest(
            session_id=session_id,
            backend=wire.BACKEND_ENUM[backend],
            n_classes=n_classes,
            passive_parties=list(passive_parties),
            model=wire.model_choice(family, values or {}),
            training=None if training is None else wire.training_message(training),
        )
        reply = call(self.peer, self.stub.OpenSession, request, self.policy)
        return Opened(reply.public_context, wire.steps_of(reply.score_release), wire.steps_of(reply.param_release))

    def public_context(self, session_id: str) -> tuple[str, bytes, str]:
        """The session's backend, public context and owner (the active party that opened it)."""
        reply = call(self.peer, self.stub.GetPublicContext, common_pb2.SessionRef(session_id=session_id), self.policy)
        return wire.backend_name(reply.backend), reply.data, reply.owner

    def training_context(self, session_id: str, step: int) -> tuple[int, int, bytes]:
        """(epoch, rotation, public context) of the training keys of ``step``."""
        request = coordinator_pb2.TrainingContextRequest(session_id=session_id, step=step)
        reply = call(self.peer, self.stub.GetTrainingContext, request, self.policy)
        return reply.epoch, reply.rotation, reply.data

    def training_scores(
        self,
        backend: he.Backend,
        session_id: str,
        step: int,
        share: np.ndarray,
        replicas: int,
        sample_index: np.ndarray,
        widths: Mapping[str, int],
    ) -> Received:
        """[[p]] of the step from the owner's masked share of the logits (words of Z_2^64), validated against its
        shape."""
        request = coordinator_pb2.TrainingScoresRequest(
            session_id=session_id,
            step=step,
            share=ring_mask.to_bytes(share),
            replicas=replicas,
            sample_index=sample_index.tolist(),
            widths=dict(widths),
        )
        reply = call(self.peer, self.stub.ComputeTrainingScores, request, self.policy)
        return wire.received(backend, reply, "training scores", rows=share.shape[0], cols=share.shape[1])

    def submit_training_share(self, session_id: str, step: int, sample_index: np.ndarray, share: np.ndarray) -> None:
        """A passive party's masked share of the logits of a training step (words of Z_2^64)."""
        request = coordinator_pb2.TrainingShare(
            session_id=session_id, step=step, sample_index=sample_index.tolist(), share=ring_mask.to_bytes(share)
        )
        call(self.peer, self.stub.SubmitTrainingShare, request, self.policy)

    def block_sums(
        self, session_id: str, step: int, ciphertexts: list[bytes], width: int, mask_tag: bytes
    ) -> np.ndarray:
        request = coordinator_pb2.BlockSumsRequest(
            session_id=session_id, step=step, ciphertexts=ciphertexts, width=width, mask_tag=mask_tag
        )
        return from_tensor(call(self.peer, self.stub.DecryptBlockSums, request, self.policy), "block sums", ndim=2)

    def finish_training(self, session_id: str) -> None:
        call(self.peer, self.stub.FinishTraining, common_pb2.SessionRef(session_id=session_id), self.policy)

    def admit_query(self, session_id: str, sample_index: np.ndarray) -> Admitted:
        request = coordinator_pb2.AdmitQueryRequest(session_id=session_id, sample_index=sample_index.tolist())
        reply = call(self.peer, self.stub.AdmitQuery, request, self.policy)
        return Admitted(reply.query_id, reply.scored, reply.budget)

    def submit_share(self, session_id: str, query_id: str, sample_index: np.ndarray, share: np.ndarray) -> None:
        """A passive party's masked inference share (words of Z_2^64) for rows of an admitted query."""
        request = coordinator_pb2.ShareRequest(
            session_id=session_id,
            query_id=query_id,
            sample_index=sample_index.tolist(),
            share=ring_mask.to_bytes(share),
        )
        call(self.peer, self.stub.SubmitShare, request, self.policy)

    def admit_queries(self, session_id: str, queries: Sequence[np.ndarray]) -> list[Admitted | ServiceError]:
        """Each query admitted on its own (AdmitQueries); a refused one is its error, in its place."""
        request = coordinator_pb2.AdmitQueriesRequest(
            session_id=session_id,
            queries=[common_pb2.QueryRows(sample_index=index.tolist()) for index in queries],
        )
        reply = call(self.peer, self.stub.AdmitQueries, request, self.policy)
        _check_entries(self.peer, "AdmitQueries", len(reply.queries), len(queries))
        return [
            wire.entry_error(self.peer, q.status)
            or Admitted(q.admitted.query_id, q.admitted.scored, q.admitted.budget)
            for q in reply.queries
        ]

    def submit_shares(
        self, session_id: str, shares: Sequence[tuple[str, np.ndarray, np.ndarray]]
    ) -> list[ServiceError | None]:
        """A passive party's masked shares of many admitted queries (SubmitShares); None where kept."""
        request = coordinator_pb2.SharesRequest(
            session_id=session_id,
            shares=_query_shares(shares),
        )
        reply = call(self.peer, self.stub.SubmitShares, request, self.policy)
        _check_entries(self.peer, "SubmitShares", len(reply.status), len(shares))
        return [wire.entry_error(self.peer, status) for status in reply.status]

    def release_batch(
        self, session_id: str, queries: Sequence[tuple[str, np.ndarray, np.ndarray]], *, n_classes: int
    ) -> list[ReleasedScores | ServiceError]:
        """Each query's released scores (ReleaseScoresBatch), as :meth:`release_scores`; a refused one is its error."""
        request = coordinator_pb2.ReleaseBatchRequest(
            session_id=session_id,
            queries=_query_shares(queries),
        )
        reply = call(self.peer, self.stub.ReleaseScoresBatch, request, self.policy)
        _check_entries(self.peer, "ReleaseScoresBatch", len(reply.released), len(queries))
        return [
            wire.entry_error(self.peer, entry.status) or self._released(entry.scores, len(index), n_classes)
            for entry, (_, index, _) in zip(reply.released, queries, strict=True)
        ]

    @staticmethod
    def _released(reply: coordinator_pb2.ReleasedScores, rows: int, n_classes: int) -> ReleasedScores:
        scores = from_tensor(reply.scores, "released scores", shape=(rows, n_classes), finite=False)
        return ReleasedScores(scores, wire.steps_of(reply.chain), reply.argmax_changed)

    def release_scores(
        self,
        session_id: str,
        query_id: str,
        own_share: np.ndarray,
        sample_index: np.ndarray,
        *,
        n_classes: int,
    ) -> ReleasedScores:
        """The released scores of the rows, ``n_classes`` columns each (taken as the release chain made them:
        not checked for finiteness)."""
        request = coordinator_pb2.ReleaseScoresRequest(
            session_id=session_id,
            query_id=query_id,
            share=ring_mask.to_bytes(own_share),
            sample_index=sample_index.tolist(),
        )
        reply = call(self.peer, self.stub.ReleaseScores, request, self.policy)
        return self._released(reply, len(sample_index), n_classes)

    def release_model(self, session_id: str) -> ReleasedParams:
        reply = call(self.peer, self.stub.ReleaseModel, common_pb2.SessionRef(session_id=session_id), self.policy)
        return wire.released_model_of(reply)

    def close(self, session_id: str) -> None:
        call(self.peer, self.stub.CloseSession, common_pb2.SessionRef(session_id=session_id), self.policy)


class PassiveClient:
    def __init__(self, party_id: str, channel: grpc.Channel, policy: CallPolicy = DEFAULT_CALL_POLICY) -> None:
        self.peer = party_id
        self.stub = passive_pb2_grpc.PassiveStub(channel)
        # PsiFinish's request as bytes, made by numpy (psi_stream.finish_request): no message of every position
        self._finish = channel.unary_unary(
            "/vflsec.v1.Passive/PsiFinish", response_deserializer=passive_pb2.PsiFinishReply.FromString
        )
        self.policy = policy
        # The families' services on the same channel (a family's trainer picks its own link by this name)
        self.splitnn = SplitNnPassiveClient(party_id, channel, policy)
        self.tree = TreePassiveClient(party_id, channel, policy)

    def join(
        self,
        session_id: str,
        backend: str,
        n_classes: int,
        training: TrainingConfig,
        family: str = "lr",
        values: Mapping[str, Any] | None = None,
    ) -> Joined:
        request = passive_pb2.JoinSessionRequest(
            session_id=session_id,
            backend=wire.BACKEND_ENUM[backend],
            n_classes=n_classes,
            training=wire.training_message(training),
            model=wire.model_choice(family, values or {}),
        )
        reply = call(self.peer, self.stub.JoinSession, request, self.policy)
        return Joined(
            reply.n_features,
            reply.n_rows,
            reply.output_width,
            wire.steps_of(reply.embedding_release),
            reply.share_mask_key,
        )

    def psi_exchange(
        self,
        session_id: str,
        salt: bytes,
        blinded: np.ndarray,
        check_size: Callable[[int], None] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Stream our blinded list (an S32 array) to the party in chunks and read its reply chunk by chunk:
        (our list re-blinded, its own blinded list). ``check_size`` may refuse the size the party announces for
        its own list before it arrives; ``progress`` hears of each chunk's values as they arrive. A reply that
        breaks the chunk rules cancels the call."""
        policy = replace(self.policy, timeout=self.policy.timeout + PSI_SECONDS_PER_ID * len(blinded))

        def exchange(_: None, timeout: float) -> tuple[np.ndarray, np.ndarray]:
            responses = self.stub.PsiExchangeStream(
                psi_stream.requests(session_id, salt, psi.chunks_of(blinded)), timeout=timeout
            )
            def our_size(n: int) -> None:  # refused before any memory is taken for it
                if n != len(blinded):
                    raise ValueError(f"{n} re-blinded values announced for our {len(blinded)} IDs")

            readers = {psi.DOUBLE: psi.ChunkReader(our_size), psi.OWN: psi.ChunkReader(check_size)}
            try:
                for reply in responses:
                    name = reply.WhichOneof("list")
                    if name is None:
                        raise ValueError("a reply message carries no chunk")
                    chunk = psi_stream.from_message(getattr(reply, name))
                    readers[name].add(chunk)
                    if progress is not None:
                        progress(len(chunk.data) // psi.POINT_BYTES)
                return readers[psi.DOUBLE].result(), readers[psi.OWN].result()
            except (ValueError, ServiceError) as exc:
                responses.cancel()
                raise InvalidArgument(f"PSI: {self.peer}'s reply: {exc}") from None

        double, own = call(self.peer, exchange, None, policy)
        if len(double) != len(blinded):
            raise InvalidArgument(f"PSI: {self.peer} returned {len(double)} values for {len(blinded)} IDs")
        return double, own

    def psi_oprf(
        self,
        hello: oprf.Hello,
        u_rows: Callable[[bytes, list[bytes]], Iterator[bytes]],
        prove: Callable[[bytes], oprf.Proof],
        check_size: Callable[[int], None],
        take: Callable[[np.ndarray], None],
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """The OPRF exchange (services/crypto/oprf.py) with the party: send ``hello``; on its keys, stream
        ``u_rows(code_seed, base_answers)`` (U's row chunks, made as the call takes them); on its challenge, send
        ``prove(challenge)``; hand its values to ``take`` chunk by chunk (S16 arrays, in order; none is kept here)
        and return their number, whose size ``check_size`` may refuse before any arrives. A reply that breaks the
        rules, or a ValueError from ``take``, cancels the call; ``progress`` hears of each U row chunk's rows and
        each value chunk's values."""
        policy = replace(self.policy, timeout=self.policy.timeout + PSI_SECONDS_PER_ID * hello.bins)

        def exchange(_: None, timeout: float) -> int:
            rows: queue.Queue[Iterator[bytes] | None] = queue.Queue()
            proofs: queue.Queue[oprf.Proof | None] = queue.Queue()

            def requests() -> Iterator[passive_pb2.PsiOprfRequest]:
                yield psi_stream.oprf_hello(hello)
                chunks = rows.get()  # the party's keys first
                if chunks is None:
                    return
                for chunk in chunks:
                    yield passive_pb2.PsiOprfRequest(u_rows=chunk)
                    if progress is not None:
                        progress(len(chunk) // oprf.CODE_BYTES)
                proof = proofs.get()  # then its challenge
                if proof is not None:
                    yield psi_stream.oprf_proof(proof)

            responses = self.stub.PsiOprfStream(requests(), timeout=timeout)
            reader = psi.ChunkReader(check_size, width=oprf.VALUE_BYTES, per_chunk=oprf.VALUES_PER_CHUNK, keep=False)
            try:
                first = next(responses, None)
                if first is None or first.WhichOneof("step") != "keys":
                    raise ValueError("the reply does not open with the party's keys")
                if len(first.keys.code_key) != oprf.KEY_BYTES:
                    raise ValueError(f"the code seed holds {len(first.keys.code_key)} bytes, not {oprf.KEY_BYTES}")
                rows.put(u_rows(first.keys.code_key, list(first.keys.base_answers)))
                second = next(responses, None)
                if second is None or second.WhichOneof("step") != "challenge":
                    raise ValueError("the reply after the keys is not the party's challenge")
                proofs.put(prove(second.challenge))
                for reply in responses:
                    if reply.WhichOneof("step") != "values":
                        raise ValueError("a reply message after the challenge carries no values")
                    values = reader.add(psi_stream.from_message(reply.values))
                    take(values)
                    if progress is not None:
                        progress(len(values))
                return reader.total()
            except (ValueError, ServiceError) as exc:
                responses.cancel()
                raise InvalidArgument(f"PSI: {self.peer}'s reply: {exc}") from None
            finally:
                rows.put(None)  # the request stream never waits for keys or a challenge that will not come
                proofs.put(None)

        return call(self.peer, exchange, None, policy)

    def psi_finish(self, session_id: str, positions: np.ndarray) -> int:
        return call(self.peer, self._finish, psi_stream.finish_request(session_id, positions), self.policy).n_common

    def share_training_logits(self, session_id: str, step: int, sample_index: np.ndarray) -> None:
        """LR: the party sends its masked share of the step's logits to the coordinator (nothing comes back)."""
        request = passive_pb2.ForwardRequest(session_id=session_id, step=step, sample_index=sample_index.tolist())
        call(self.peer, self.stub.ShareTrainingLogits, request, self.policy)

    def backward(self, session_id: str, step: int, sample_index: np.ndarray, delta: he.WireMatrix) -> None:
        request = passive_pb2.BackwardRequest(
            session_id=session_id, step=step, sample_index=sample_index.tolist(), delta=wire.message_of(delta)
        )
        call(self.peer, self.stub.Backward, request, self.policy)

    def tensors(self, session_id: str) -> dict[str, np.ndarray]:
        """The named tensors the party's family lets the coordinator pull after training (split-NN's GetBottom, the
        one family that releases such tensors)."""
        return self.splitnn.bottom(session_id)

    def share_logits(self, session_id: str, query_id: str, sample_index: np.ndarray) -> None:
        request = passive_pb2.ShareLogitsRequest(
            session_id=session_id, query_id=query_id, sample_index=sample_index.tolist()
        )
        call(self.peer, self.stub.ShareLogits, request, self.policy)

    def share_logits_batch(
        self, session_id: str, queries: Sequence[tuple[str, np.ndarray]]
    ) -> list[ServiceError | None]:
        """ShareLogits of many admitted queries in one call; each entry's outcome at the coordinator (None: shared)."""
        request = passive_pb2.ShareLogitsBatchRequest(
            session_id=session_id,
            queries=[common_pb2.QueryRows(query_id=q, sample_index=index.tolist()) for q, index in queries],
        )
        reply = call(self.peer, self.stub.ShareLogitsBatch, request, self.policy)
        _check_entries(self.peer, "ShareLogitsBatch", len(reply.status), len(queries))
        return [wire.entry_error(self.peer, status) for status in reply.status]

    def weights(self, session_id: str) -> np.ndarray:
        reply = call(self.peer, self.stub.GetWeights, common_pb2.SessionRef(session_id=session_id), self.policy)
        return from_tensor(reply, f"weights of {self.peer}", ndim=2).copy()

    def trained_rows(self, session_id: str) -> np.ndarray:
        reply = call(self.peer, self.stub.TrainedRows, common_pb2.SessionRef(session_id=session_id), self.policy)
        return from_tensor(reply, f"trained rows of {self.peer}", ndim=1).astype(np.int64)

    def aligned_rows(self, session_id: str) -> int:
        reply = call(self.peer, self.stub.AlignedRows, common_pb2.SessionRef(session_id=session_id), self.policy)
        return int(reply.aligned_rows)

    def close(self, session_id: str) -> None:
        call(self.peer, self.stub.CloseSession, common_pb2.SessionRef(session_id=session_id), self.policy)

    def disclose(self, session_id: str, specs: list[str]) -> list[tuple[str, Distorted]]:
        request = passive_pb2.DiscloseRequest(session_id=session_id, steps=specs)
        reply = call(self.peer, self.stub.DiscloseWeights, request, self.policy)
        if len(reply.steps) > len(specs):
            raise InvalidArgument(f"{self.peer} returned {len(reply.steps)} steps for {len(specs)} asked")
        return [(step.name, self._distorted(step)) for step in reply.steps]

    def _distorted(self, step: passive_pb2.DisclosedStep) -> Distorted:
        def tensor(field: str, ndim: int) -> np.ndarray | None:
            if not step.HasField(field):
                return None
            return from_tensor(getattr(step, field), f"{field} of {step.name} from {self.peer}", ndim=ndim).copy()

        return Distorted(
            None if step.withheld else tensor("weights", 2),
            bias_offset=tensor("bias_offset", 1),
            public=dict(step.public),
            private=dict(step.private),
        )


def _query_shares(items: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> list[common_pb2.QueryShare]:
    """(query id, rows, masked share) triples as the batched calls carry them."""
    return [
        common_pb2.QueryShare(query_id=q, sample_index=index.tolist(), share=ring_mask.to_bytes(share))
        for q, index, share in items
    ]


def _check_entries(peer: str, method: str, got: int, sent: int) -> None:
    if got != sent:
        raise InvalidArgument(f"{peer} answered {got} entries of {method} for {sent} sent")
