"""PsiFinish's request made and read by numpy (psi_stream.finish_request, read_finish): byte for byte what protobuf
writes, read back as protobuf reads it, across block boundaries; any other layout is protobuf's to read, its errors
included."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from vflsec.services.transport import psi_stream
from vflsec.v1 import passive_pb2

EDGES = [0, 1, 127, 128, 16_383, 16_384, 2**31 - 1, 2**35 - 1, 2**35, 2**62, -1, -(2**63)]


@pytest.mark.parametrize("session_id", ["", "s-1", "é" * 100])
@pytest.mark.parametrize("positions", [[], EDGES, "random"])
def test_the_request_is_protobufs_bytes_and_reads_back(session_id: str, positions, monkeypatch) -> None:
    monkeypatch.setattr(psi_stream, "_POSITIONS_BLOCK", 1000)  # many blocks each way
    monkeypatch.setattr(psi_stream, "_PACKED_BLOCK", 4099)
    if positions == "random":
        positions = np.random.default_rng(7).integers(0, 30_000_000, 50_000)
    positions = np.asarray(positions, dtype=np.int64)
    data = psi_stream.finish_request(session_id, positions)
    assert data == passive_pb2.PsiFinishRequest(session_id=session_id, positions=positions.tolist()).SerializeToString()
    read = psi_stream.read_finish(data)
    assert read.session_id == session_id
    assert read.positions.dtype == np.int64 and np.array_equal(read.positions, positions)


def test_other_layouts_are_read_as_protobuf_reads_them() -> None:
    unpacked_then_session = b"\x10\x05\x10\x07\x0a\x01s"  # fields in another order, positions not packed
    read = psi_stream.read_finish(unpacked_then_session)
    assert read.session_id == "s" and read.positions.tolist() == [5, 7]
    twice = psi_stream.finish_request("a", np.array([1])) + psi_stream.finish_request("b", np.array([2]))
    read = psi_stream.read_finish(twice)  # a repeated field appends, the last string wins
    assert read.session_id == "b" and read.positions.tolist() == [1, 2]


@pytest.mark.parametrize(
    "data",
    [
        b"\x12\x05\x80\x80",  # the packed field runs past the end
        b"\x12\x02\x01\x80",  # its last varint is cut
        b"\x0a\x02\xff\xfe",  # the session is not UTF-8
        b"\x0a\x05ab",  # the session runs past the end
    ],
)
def test_malformed_requests_raise_protobufs_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        psi_stream.read_finish(data)
