"""PSI lists on the wire: psi.Chunk <-> PointChunk, for the client (links.py) and the passive servicer."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from vflsec.services.crypto import psi
from vflsec.v1 import passive_pb2


def to_message(chunk: psi.Chunk) -> passive_pb2.PointChunk:
    return passive_pb2.PointChunk(index=chunk.index, chunks=chunk.chunks, points=chunk.points, data=chunk.data)


def from_message(message: passive_pb2.PointChunk) -> psi.Chunk:
    return psi.Chunk(index=message.index, chunks=message.chunks, points=message.points, data=message.data)


def requests(session_id: str, salt: bytes, blinded: Iterable[psi.Chunk]) -> Iterator[passive_pb2.PsiExchangeRequest]:
    """The active party's request stream; session and salt travel on the first message (alone if the list is
    empty, so the passive party can name the problem)."""
    first = True
    for chunk in blinded:
        yield passive_pb2.PsiExchangeRequest(
            session_id=session_id if first else "", salt=salt if first else b"", blinded=to_message(chunk)
        )
        first = False
    if first:
        yield passive_pb2.PsiExchangeRequest(session_id=session_id, salt=salt)


def opened(
    stream: Iterator[passive_pb2.PsiExchangeRequest],
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


def reply(name: str, chunk: psi.Chunk) -> passive_pb2.PsiExchangeReply:
    """``name`` is psi.DOUBLE or psi.OWN, the reply's field."""
    return passive_pb2.PsiExchangeReply(**{name: to_message(chunk)})
