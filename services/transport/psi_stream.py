"""PSI lists on the wire: psi.Chunk <-> PointChunk, for the client (links.py) and the passive servicer;
vflsec.v1's one-message PsiExchange adapted to the same chunks, so both forms run one engine exchange; and the
OPRF exchange's messages (PsiOprfStream)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from vflsec.services import common
from vflsec.services.crypto import oprf, psi
from vflsec.services.errors import InvalidArgument, ResourceExhausted
from vflsec.v1 import passive_pb2


def to_message(chunk: psi.Chunk) -> passive_pb2.PointChunk:
    return passive_pb2.PointChunk(index=chunk.index, chunks=chunk.chunks, points=chunk.points, data=chunk.data)


def from_message(message: passive_pb2.PointChunk) -> psi.Chunk:
    return psi.Chunk(index=message.index, chunks=message.chunks, points=message.points, data=message.data)


def requests(session_id: str, salt: bytes, blinded: Iterable[psi.Chunk]) -> Iterator[passive_pb2.PsiExchangeChunk]:
    """The active party's request stream; session and salt travel on the first message (alone if the list is
    empty, so the passive party can name the problem)."""
    first = True
    for chunk in blinded:
        yield passive_pb2.PsiExchangeChunk(
            session_id=session_id if first else "", salt=salt if first else b"", blinded=to_message(chunk)
        )
        first = False
    if first:
        yield passive_pb2.PsiExchangeChunk(session_id=session_id, salt=salt)


def opened(
    stream: Iterator[passive_pb2.PsiExchangeChunk],
) -> tuple[str, bytes, Iterator[psi.Chunk]] | None:
    """(session, salt, the list's chunks) of a request stream, reading only its first message; None if the stream
    is empty."""
    first = next(stream, None)
    if first is None:
        return None

    def chunks() -> Iterator[psi.Chunk]:
        for request in itertools.chain((first,), stream):
            if request.HasField("blinded"):
                yield from_message(request.blinded)

    return first.session_id, first.salt, chunks()


def reply(name: str, chunk: psi.Chunk) -> passive_pb2.PsiExchangeChunkReply:
    """``name`` is psi.DOUBLE or psi.OWN, the reply's field."""
    return passive_pb2.PsiExchangeChunkReply(**{name: to_message(chunk)})


# --- vflsec.v1's one-message form (unary PsiExchange) ---
# A value in a `repeated bytes` field: tag, length, 32 bytes.
VALUE_BYTES = 2 + psi.POINT_BYTES


def check_reply_size(n_blinded: int, n_own: int, max_message_bytes: int) -> None:
    """Refuse, before any work, an exchange whose one-message reply would pass the gRPC max message size: it
    could not be sent, yet the exchange would be final."""
    size = VALUE_BYTES * (n_blinded + n_own)
    if size > max_message_bytes:
        raise ResourceExhausted(
            f"PSI: the one-message reply would hold {n_blinded} + {n_own} values ({size} bytes), over this party's "
            f"max message size of {max_message_bytes} bytes ([limits] max_message_mb); use PsiExchangeStream"
        )


def listed(values: Sequence[bytes]) -> Iterator[psi.Chunk]:
    """A one-message list as the chunks the stream would carry, read lazily by the engine's checks; a value that
    is not 32 bytes is a ValueError naming it (the engine names the sender)."""
    for row, value in enumerate(values):
        if len(value) != psi.POINT_BYTES:
            raise ValueError(f"value {row} holds {len(value)} bytes, not {psi.POINT_BYTES}")
    yield from psi.chunks_of(np.frombuffer(b"".join(values), dtype=f"S{psi.POINT_BYTES}"))


def gathered(chunks: Iterable[tuple[str, psi.Chunk]]) -> passive_pb2.PsiExchangeReply:
    """The engine's reply chunks as the one-message reply: each list's values in order."""
    reply = passive_pb2.PsiExchangeReply()
    for name, chunk in chunks:
        data = chunk.data
        getattr(reply, name).extend(data[i : i + psi.POINT_BYTES] for i in range(0, len(data), psi.POINT_BYTES))
    return reply


# --- PsiOprfStream (services/crypto/oprf.py) ---
def oprf_hello(hello: oprf.Hello) -> passive_pb2.PsiOprfRequest:
    return passive_pb2.PsiOprfRequest(
        hello=passive_pb2.PsiOprfHello(
            session_id=hello.session_id,
            salt=hello.salt,
            hash_key=hello.hash_key,
            bins=hello.bins,
            base_point=hello.base_point,
        )
    )


def oprf_opened(stream: Iterator[passive_pb2.PsiOprfRequest]) -> tuple[oprf.Hello, Iterator[bytes | oprf.Proof]]:
    """(the hello, then U's row chunks and the proof) of a request stream, reading only its first message;
    InvalidArgument if the stream does not open with a hello, or later carries another, or a proof of the wrong
    size."""
    first = next(stream, None)
    if first is None or first.WhichOneof("step") != "hello":
        raise InvalidArgument("PSI: the active party's stream does not open with a hello")
    h = first.hello

    def steps() -> Iterator[bytes | oprf.Proof]:
        for request in stream:
            step = request.WhichOneof("step")
            if step == "u_rows":
                yield request.u_rows
            elif step == "proof":
                try:
                    yield oprf.Proof.from_bytes(request.proof.words, request.proof.rows)
                except ValueError as exc:
                    raise InvalidArgument(f"PSI: the active party's proof: {exc}") from None
            else:
                raise InvalidArgument("PSI: the active party's stream carries a second hello or an empty message")

    return oprf.Hello(h.session_id, h.salt, h.hash_key, h.bins, h.base_point), steps()


def oprf_proof(proof: oprf.Proof) -> passive_pb2.PsiOprfRequest:
    words, rows = proof.to_bytes()
    return passive_pb2.PsiOprfRequest(proof=passive_pb2.PsiOprfProof(words=words, rows=rows))


def oprf_reply(out: tuple[bytes, Sequence[bytes]] | bytes | psi.Chunk) -> passive_pb2.PsiOprfReply:
    """The passive party's keys (code seed, base-OT answers), its challenge seed, or a chunk of its values."""
    if isinstance(out, psi.Chunk):
        return passive_pb2.PsiOprfReply(values=to_message(out))
    if isinstance(out, bytes):
        return passive_pb2.PsiOprfReply(challenge=out)
    code_seed, answers = out
    return passive_pb2.PsiOprfReply(keys=passive_pb2.PsiOprfKeys(code_key=code_seed, base_answers=answers))


# PsiFinish's request (session_id = 1, repeated int64 positions = 2, packed) written and read by numpy in blocks:
# the bytes protobuf writes, and read as protobuf reads them, without a message of 9M positions (building one took
# about 200 MB at 10M, parsing one as much, plus an int64 copy; docs/performance.md, "Bounded memory").
_POSITIONS_BLOCK = 1 << 16  # positions encoded at once
_PACKED_BLOCK = 1 << 20  # bytes of packed varints decoded at once
_SHORT_VARINT = 5  # bytes: any position below 2^35; a longer varint is left to protobuf



def _varints(values: np.ndarray) -> bytes:
    """int64 values as protobuf varints, concatenated (a negative one in 10 bytes, as protobuf writes it)."""
    v = values.astype(np.int64).view(np.uint64)
    lengths = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        lengths += v >= np.uint64(1 << (7 * k))
    begins = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    for k in range(int(lengths.max(initial=0))):
        has = np.flatnonzero(lengths > k)
        more = np.where(lengths[has] > k + 1, np.uint64(0x80), np.uint64(0))
        out[begins[has] + k] = ((v[has] >> np.uint64(7 * k)) & np.uint64(0x7F) | more).astype(np.uint8)
    return out.tobytes()


def finish_request(session_id: str, positions: np.ndarray) -> bytes:
    """PsiFinishRequest(session_id, positions).SerializeToString(), made in blocks."""
    blocks = [_varints(positions[a : a + _POSITIONS_BLOCK]) for a in range(0, len(positions), _POSITIONS_BLOCK)]
    packed = sum(len(block) for block in blocks)
    head = passive_pb2.PsiFinishRequest(session_id=session_id).SerializeToString()
    return b"".join([head, *((b"\x12", common.varint(packed)) if packed else ()), *blocks])


@dataclass(frozen=True)
class FinishRequest:
    """A PsiFinishRequest as read by :func:`read_finish`: its positions an int64 array."""

    session_id: str
    positions: np.ndarray


def read_finish(data: bytes) -> FinishRequest:
    """A PsiFinishRequest's bytes: laid out as protobuf writes them (the session, then the positions packed, each
    below 2^35), read by numpy in blocks; any other layout (or an error in it) is left to protobuf's own parser,
    whose DecodeError it raises."""
    try:
        at, session_id, positions = 0, "", np.empty(0, dtype=np.int64)
        if at < len(data) and data[at] == 0x0A:
            length, at = _read_varint(data, at + 1)
            session_id, at = data[at : at + length].decode("utf-8"), at + length
        if at < len(data) and data[at] == 0x12:
            length, at = _read_varint(data, at + 1)
            positions, at = _read_varints(memoryview(data)[at : at + length]), at + length
        if at == len(data):
            return FinishRequest(session_id, positions)
    except ValueError:  # a UnicodeDecodeError too
        pass
    message = passive_pb2.PsiFinishRequest.FromString(data)
    return FinishRequest(message.session_id, np.asarray(message.positions, dtype=np.int64))


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """(a length varint at ``at``, where what follows it begins); a ValueError if it runs past the end of data."""
    value, shift = 0, 0
    while at < len(data) and shift < 35:
        byte = data[at]
        value, at, shift = value | (byte & 0x7F) << shift, at + 1, shift + 7
        if byte < 0x80:
            if at + value > len(data):
                raise ValueError("a field runs past the end of the message")
            return value, at
    raise ValueError("an unterminated or long varint")


def _read_varints(packed: memoryview) -> np.ndarray:
    """Packed varints of at most _SHORT_VARINT bytes each as int64; a ValueError for a longer or cut one."""
    raw = np.frombuffer(packed, dtype=np.uint8)
    if raw.size and raw[-1] >= 0x80:
        raise ValueError("the last varint is cut")
    count = sum(int(np.count_nonzero(raw[a : a + _PACKED_BLOCK] < 0x80)) for a in range(0, len(raw), _PACKED_BLOCK))
    out, filled, start = np.empty(count, dtype=np.int64), 0, 0
    while start < len(raw):
        window = raw[start : start + _PACKED_BLOCK]
        ends = np.flatnonzero(window < 0x80)
        if not ends.size:
            raise ValueError("a varint longer than a block")
        lengths = np.diff(ends, prepend=-1)
        if lengths.max() > _SHORT_VARINT:
            raise ValueError("a varint longer than the positions'")
        begins = ends - lengths + 1
        values = np.zeros(len(ends), dtype=np.int64)
        for k in range(int(lengths.max())):
            has = np.flatnonzero(lengths > k)
            values[has] |= (window[begins[has] + k].astype(np.int64) & 0x7F) << (7 * k)
        out[filled : filled + len(values)] = values
        filled, start = filled + len(values), start + int(ends[-1]) + 1
    return out
