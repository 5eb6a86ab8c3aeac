"""vflsec.v1's one-message `Passive.PsiExchange`, kept beside `PsiExchangeStream` (docs/protocol.md, "Services,
model families and wire compatibility"): its contract is the one first released, and through the live services
(real gRPC, mTLS) it runs the stream's exchange: the same answer, the same one exchange per session shared by both
forms, the same refusals with the same status and message, the same "nothing kept" after a refusal, and a reply
that would pass the max message size is refused before any work."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor

from tests.integration.conftest import Federation, federation
from vflsec.services.crypto import psi
from vflsec.services.rpc import passive as passive_rpc
from vflsec.services.transport import psi_stream
from vflsec.services.transport.server import peer_channel, start_server
from vflsec.v1 import passive_pb2, passive_pb2_grpc

SALT = b"salt"


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("psi-v1"), n_passive=1, allow_plain=True) as running:
        yield running


def test_the_unary_contract_is_the_one_first_released() -> None:
    method = passive_pb2.DESCRIPTOR.services_by_name["Passive"].methods_by_name["PsiExchange"]
    assert (method.client_streaming, method.server_streaming) == (False, False)
    assert (method.input_type.full_name, method.output_type.full_name) == (
        "vflsec.v1.PsiExchangeRequest",
        "vflsec.v1.PsiExchangeReply",
    )

    def fields(message) -> list[tuple[str, int, int, bool]]:
        return [(f.name, f.number, f.type, f.is_repeated) for f in message.fields]

    string, bytes_ = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES
    assert fields(method.input_type) == [
        ("session_id", 1, string, False),
        ("salt", 2, bytes_, False),
        ("blinded", 3, bytes_, True),
    ]
    assert fields(method.output_type) == [("double_blinded", 1, bytes_, True), ("own_blinded", 2, bytes_, True)]


def _session(fed: Federation, seed: int) -> str:
    return fed.operator.create_session("plain", seed=seed).session_id


def _passive(fed: Federation):
    return fed.parties["passive-1"].engine


def _values(points: np.ndarray) -> list[bytes]:
    """An S32 array as the 32-byte values a repeated bytes field carries (through the buffer: an S32 element drops
    its trailing zero bytes)."""
    blob = points.tobytes()
    return [blob[i : i + psi.POINT_BYTES] for i in range(0, len(blob), psi.POINT_BYTES)]


def _unary(fed: Federation, session_id: str, points: np.ndarray, caller: str = "active", salt: bytes = SALT):
    with fed.channel(caller, "passive-1") as channel:
        request = passive_pb2.PsiExchangeRequest(session_id=session_id, salt=salt, blinded=_values(points))
        return passive_pb2_grpc.PassiveStub(channel).PsiExchange(request, timeout=60)


def _finish(fed: Federation, session_id: str) -> None:
    """PsiFinish on passive-1 (one common position): the session's rows are fixed and its exchange is final."""
    with fed.channel("active", "passive-1") as channel:
        request = passive_pb2.PsiFinishRequest(session_id=session_id, positions=[0])
        passive_pb2_grpc.PassiveStub(channel).PsiFinish(request, timeout=60)


def _stream(fed: Federation, session_id: str, points: np.ndarray, salt: bytes = SALT) -> list:
    with fed.channel("active", "passive-1") as channel:
        requests = psi_stream.requests(session_id, salt, psi.chunks_of(points))
        return list(passive_pb2_grpc.PassiveStub(channel).PsiExchangeStream(requests, timeout=60))


def _status(call, *args, **kw) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kw)
    return err.value.code(), err.value.details()


def _nothing_kept(fed: Federation, session_id: str) -> None:
    """passive-1 holds no exchange for the session: the honest active party (which streams) aligns it."""
    assert _passive(fed).session(session_id).psi_permutation is None
    assert len(fed.operator.align(session_id)) > 0


def test_unary_exchange_answers_as_the_stream_and_is_final_for_both_forms_once_finished(fed) -> None:
    session_id = _session(fed, 1)
    key, ids = psi.PsiKey(), np.array([*fed.parties["active"].engine.data.ids[:300], "not-a-passive-id"])
    reply = _unary(fed, session_id, key.blind(ids, SALT, workers=1))

    engine = _passive(fed)
    own_ids, permutation = engine.data.ids, engine.session(session_id).psi_permutation
    assert permutation is not None and len(reply.own_blinded) == len(own_ids)  # the exchange is final
    assert len(reply.double_blinded) == len(ids)
    # Our key on the party's list: the j-th value is its row permutation[j], so a common ID's double-blinded value
    # must sit at that ID's place in our list (the reply keeps our order) and a non-common one matches nothing.
    ours = dict(zip(key.reblind(list(reply.own_blinded), workers=1), own_ids[permutation], strict=True))
    matched = [ours.get(value) for value in reply.double_blinded]
    common = set(own_ids)
    assert matched == [i if i in common else None for i in ids]
    assert 250 < sum(m is not None for m in matched) < len(ids)

    again = key.blind(ids[:5], SALT, workers=1)
    # Before PsiFinish a failed alignment may exchange again (a fresh key, charged to the owner's budget), in
    # either form; once PsiFinish fixed the rows, no form may.
    assert len(_stream(fed, session_id, again)) > 0 and len(_unary(fed, session_id, again).own_blinded) > 0
    _finish(fed, session_id)
    code, details = _status(_unary, fed, session_id, again)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "open a new session" in details
    assert _status(_stream, fed, session_id, again) == (code, details)
    code, details = _status(fed.operator.align, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "open a new session" in details


def test_a_streamed_exchange_is_final_for_the_unary_form_too(fed) -> None:
    session_id = _session(fed, 2)
    points = psi.PsiKey().blind(["a", "b", "c"], SALT, workers=1)
    _stream(fed, session_id, points)
    _finish(fed, session_id)
    code, details = _status(_unary, fed, session_id, points)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "open a new session" in details


@pytest.mark.parametrize("caller", ["coordinator", "operator", "passive-1"])
def test_unary_exchange_from_a_non_active_identity_is_denied(fed, caller: str) -> None:
    session_id = _session(fed, 3)
    points = psi.PsiKey().blind(["a"], SALT, workers=1)
    code, details = _status(_unary, fed, session_id, points, caller=caller)
    assert code == grpc.StatusCode.PERMISSION_DENIED and caller in details
    assert _passive(fed).session(session_id).psi_permutation is None


@contextlib.contextmanager
def _own_ids(fed: Federation, ids: np.ndarray) -> Iterator[None]:
    data = _passive(fed).data
    original, data.ids = data.ids, ids
    try:
        yield
    finally:
        data.ids = original


@pytest.mark.parametrize("fault", ["over the cap", "own duplicate ids", "not a point", "no salt", "empty"])
def test_refusals_match_the_stream_and_keep_nothing(fed, fault: str) -> None:
    session_id = _session(fed, 4)
    points, salt, problem = psi.PsiKey().blind([f"x{i}" for i in range(20)], SALT, workers=1), SALT, ""
    with contextlib.ExitStack() as stack:
        if fault == "over the cap":
            caps = dataclasses.replace(_passive(fed).psi_caps, max_ids=10)
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(_passive(fed), "psi_caps", caps)
            problem = "PSI: the active party's list: 20 IDs announced, over this party's cap of 10"
        elif fault == "own duplicate ids":
            ids = _passive(fed).data.ids.copy()
            ids[5] = ids[2]
            stack.enter_context(_own_ids(fed, ids))
            problem = "PSI: passive-1's own IDs: duplicate ids at rows 2 and 5"
        elif fault == "not a point":
            points = points.copy()
            points[7] = b"\xff" * 32
            problem = "point at index 7 is not a canonical point"
        elif fault == "no salt":
            salt, problem = b"", "PSI: the active party sent no salt"
        else:
            points, problem = points[:0], "PSI: the active party sent no IDs"
        unary = _status(_unary, fed, session_id, points, salt=salt)
        assert unary == _status(_stream, fed, session_id, points, salt=salt)  # the same exchange refused the same way
    assert problem in unary[1]
    _nothing_kept(fed, session_id)


def test_a_value_that_is_not_32_bytes_is_named_and_nothing_kept(fed) -> None:
    session_id = _session(fed, 5)
    with fed.channel("active", "passive-1") as channel:
        request = passive_pb2.PsiExchangeRequest(session_id=session_id, salt=SALT, blinded=[b"p" * 32, b"q" * 31])
        code, details = _status(passive_pb2_grpc.PassiveStub(channel).PsiExchange, request, timeout=60)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "PSI: the active party's list: value 1 holds 31 bytes, not 32" in details
    _nothing_kept(fed, session_id)


def test_the_interim_in_place_stream_is_refused_and_nothing_kept(fed) -> None:
    # Issue 18 landed (ebcaf6d) a PsiExchange that streamed PsiExchangeChunk messages on the unary method's path;
    # 22cff47 restored the unary form, and that interim stream is refused.
    session_id = _session(fed, 7)
    requests = list(psi_stream.requests(session_id, SALT, psi.chunks_of(psi.PsiKey().blind(["a"], SALT, workers=1))))
    with fed.channel("active", "passive-1") as channel:
        call = channel.stream_stream(
            "/vflsec.v1.Passive/PsiExchange",
            request_serializer=passive_pb2.PsiExchangeChunk.SerializeToString,
            response_deserializer=passive_pb2.PsiExchangeChunkReply.FromString,
        )
        code, details = _status(lambda: list(call(iter(requests), timeout=60)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"PSI: the active party's list: value 0 holds {requests[0].blinded.ByteSize()} bytes, not 32" in details
    _nothing_kept(fed, session_id)


def test_a_reply_over_the_max_message_size_is_refused_before_any_work(fed) -> None:
    # passive-1's engine behind a second server whose max message size fits its own list and 10 more values exactly.
    engine = _passive(fed)
    n_own = len(engine.data.ids)
    limit = psi_stream.VALUE_BYTES * (n_own + 10)
    config = dataclasses.replace(fed.parties["passive-1"].config, listen="127.0.0.1:0", max_message_bytes=limit)
    servicer = passive_rpc.PassiveServicer(engine, config.max_message_bytes)
    server = start_server(
        config,
        lambda s: passive_pb2_grpc.add_PassiveServicer_to_server(servicer, s),
        {"vflsec.v1.Passive": passive_rpc.ROLE_POLICY},
    )
    points = psi.PsiKey().blind([f"y{i}" for i in range(11)], SALT, workers=1)
    try:
        with peer_channel(f"127.0.0.1:{server.port}", "passive-1", fed.layout.tls("active"), 64 << 20) as channel:
            stub = passive_pb2_grpc.PassiveStub(channel)

            def exchange(session_id: str, values: np.ndarray):
                request = passive_pb2.PsiExchangeRequest(session_id=session_id, salt=SALT, blinded=_values(values))
                return stub.PsiExchange(request, timeout=60)

            session_id = _session(fed, 6)
            code, details = _status(exchange, session_id, points)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (
                f"PSI: the one-message reply would hold 11 + {n_own} values ({limit + 34} bytes), over this party's "
                f"max message size of {limit} bytes ([limits] max_message_mb); use PsiExchangeStream"
            ) in details
            assert engine.session(session_id).psi_permutation is None
            reply = exchange(session_id, points[:10])  # at the bound exactly: gRPC's own limit lets it through
            assert (len(reply.double_blinded), len(reply.own_blinded)) == (10, n_own)
            assert reply.ByteSize() == limit
    finally:
        server.stop(0)
