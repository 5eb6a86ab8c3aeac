"""Plain values the engines share with the link layer, kept free of gRPC and protobuf so that importing an engine
loads neither: the parties' certificate roles, the row check every batch passes, the bounds of a batched serving call,
the fingerprint of serialized ciphertexts, protobuf's varint for the messages written by hand, and the idle thread
that makes work ahead once a reply has gone."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from vflsec.services.errors import InvalidArgument

# Certificate roles (the identity a party's certificate names; services/transport/tls.py issues and checks them).
COORDINATOR = "coordinator"
ACTIVE = "active"
PASSIVE = "passive"
OPERATOR = "operator"
ROLES: frozenset[str] = frozenset({COORDINATOR, ACTIVE, PASSIVE, OPERATOR})

# Entries of one batched serving call (AdmitQueries, ShareLogitsBatch, SubmitShares, ReleaseScoresBatch): the requests
# of one Predict round at most. A server refuses more, so no call's work grows with its message alone; below the
# coordinator's open queries per session (256), so the entries of one call never lapse one another.
BATCH_ENTRIES = 96
# Share words (rows x width) of one Predict chunk: a round's rows fit in one chunk (one message of 256 KB).
CHUNK_VALUES = 32_768
QUERY_ID_CHARS = 64  # the longest query id any RPC accepts (the coordinator draws 32 hex digits)


def digest(blobs: Iterable[bytes]) -> bytes:
    """SHA-256 over length-prefixed blobs: one fingerprint of a list of serialized ciphertexts."""
    h = hashlib.sha256()
    for blob in blobs:
        h.update(len(blob).to_bytes(8, "little") + blob)
    return h.digest()


_after_reply: contextvars.ContextVar[list[Callable[[], object]] | None] = contextvars.ContextVar(
    "after_reply", default=None
)
_idle: ThreadPoolExecutor | None = None
_idle_lock = threading.Lock()


def after_reply(work: Callable[[], object]) -> None:
    """Run ``work`` once the reply of the RPC being served has gone (transport's ``rpc`` wrapper hands it over), on
    this process's one idle thread: work made ahead of a later step, off every critical path (a step's encryptions
    of zero). Nothing may depend on it having run; an error in it is logged, never raised. Outside an RPC it is
    queued at once."""
    pending = _after_reply.get()
    if pending is None:
        run_idle([work])
    else:
        pending.append(work)


@contextlib.contextmanager
def collect_after_reply() -> Iterator[list[Callable[[], object]]]:
    """The work :func:`after_reply` asks for while the block runs (an RPC's handler), for the caller to hand to
    :func:`run_idle` once its reply is sent."""
    pending: list[Callable[[], object]] = []
    token = _after_reply.set(pending)
    try:
        yield pending
    finally:
        _after_reply.reset(token)


def run_idle(work: list[Callable[[], object]]) -> None:
    """Queue ``work`` on the idle thread (one a process, made on first use), in order."""
    global _idle
    with _idle_lock:
        if _idle is None:
            _idle = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ahead")
        executor = _idle
    for item in work:
        executor.submit(run_ahead, item)


def run_ahead(work: Callable[[], object]) -> None:
    """Run work made ahead here and now: an error in it is logged, never raised (an optimisation that failed: the
    step it was for makes its own)."""
    try:
        work()
    except Exception:
        logging.getLogger(__name__).exception("work made ahead failed")


def varint(n: int) -> bytes:
    """``n`` >= 0 as a protobuf varint: the lengths and counts of the messages written by hand (TenSEAL's vector
    message, level_keys.vector_message; PsiFinish's request, psi_stream.finish_request)."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def require_distinct_rows(sample_index: np.ndarray) -> None:
    """Every row once: a repeated row weighs a batch's sums (the batch bound counts distinct rows, and a bias
    sum over n copies of one row is n·δ_i) and repeats an inference share."""
    if not distinct_rows(sample_index):
        distinct = np.unique(sample_index).size
        raise InvalidArgument(
            f"sample_index repeats rows ({len(sample_index)} entries, {distinct} distinct): every row once"
        )


def distinct_rows(rows: np.ndarray) -> bool:
    """Whether no row repeats. A serving query has a few rows: a set of them costs a fraction of np.unique's sort
    (per request, under load); a tree node's rows come in increasing order: one pass, no sort (per node and
    message, 228k rows at the root)."""
    rows = np.asarray(rows)
    if len(rows) <= 1024:
        return len(set(rows.tolist())) == len(rows)
    return bool(np.all(rows[1:] > rows[:-1])) or np.unique(rows).size == len(rows)


def require_entries(n: int, field: str) -> None:
    """A batched call carries at most BATCH_ENTRIES entries, else INVALID_ARGUMENT naming ``field``."""
    if n > BATCH_ENTRIES:
        raise InvalidArgument(f"{field} holds {n} entries; one call carries at most {BATCH_ENTRIES}")


def require_query_id(query_id: str) -> None:
    """A query id no longer than QUERY_ID_CHARS (a refusal names the id: a longer one is not echoed)."""
    if len(query_id) > QUERY_ID_CHARS:
        raise InvalidArgument(f"query_id holds {len(query_id)} characters; at most {QUERY_ID_CHARS}")
