"""Zero-sum masks in Z_2^64 on the shares the coordinator sums: LR's training logits, split-NN's training embeddings
and every family's inference shares (docs/protocol.md, "Training", "Split neural networks", "Inference and
release").

A sum needs no homomorphic encryption: passive party p sends the coordinator h_p + r_p, the owner sends
h_a − Σ_p r_p, and the coordinator adds the shares in Z_2^64, where the masks cancel and h = h_a + Σ_p h_p is all
that is left. Values are fixed point with FRAC_BITS fractional bits; r_p is a stream of uniform 64-bit words under a
key p drew from its own OS entropy and gave the owner at JoinSession, bound to a context (what the share is: the
session, the training step, or the model step and query) and the rows.

Hiding: a share h_p + r_p with r_p uniform in Z_2^64 is itself uniform whatever h_p is (a one-time pad), so the
coordinator learns nothing of one share; the owner learns nothing because no share is ever sent to it. Together
(the key holder colluding with the owner, who knows every r_p) they would read h_p, as they would with [[h_p]] and
the secret key. Nothing is decrypted, so no slot is charged to a key's budget (rule 2 counts decryptions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vflsec.services.crypto import entropy

FRAC_BITS = 24
# |value| a share encodes: larger values (and ±inf) are clipped to it, NaN is 0, so that encoding never refuses on a
# value (rule 4: a refusal would tell the caller whether a secret passed a bound); a sum of nine parties' values stays
# far below 2^63 / 2^24 and cannot wrap
ENCODE_BOUND = 2.0**31
WORD = np.dtype("<u8")
# |z| of a summed logit the coordinator scores (LR's training forward, every family's inference): an honest sum lies
# far inside; one beyond (a crafted share) is clipped to it, never refused (rule 4)
SCORE_BOUND = 2.0**23


def encode(values: np.ndarray) -> np.ndarray:
    """Fixed-point words of ``values``, clipped to ±ENCODE_BOUND (NaN: 0)."""
    arr = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=ENCODE_BOUND, neginf=-ENCODE_BOUND)
    return np.rint(np.clip(arr, -ENCODE_BOUND, ENCODE_BOUND) * 2.0**FRAC_BITS).astype(np.int64).view(np.uint64)


def decode(words: np.ndarray) -> np.ndarray:
    """The signed fixed-point values of a sum of shares (any words: a crafted share decodes to some value)."""
    return np.asarray(words, dtype=np.uint64).view(np.int64).astype(np.float64) / 2.0**FRAC_BITS


def open_sum(shares: Sequence[np.ndarray], bound: float) -> np.ndarray:
    """The values of every party's shares added in Z_2^64 (the masks cancel), clipped to ±``bound``: a crafted share
    is clipped, never refused (rule 4: a refusal would say whether the other parties' part passed a value the crafter
    chose)."""
    total = np.zeros_like(shares[0])
    for share in shares:
        total += share
    return np.clip(decode(total), -bound, bound)


def owner_share(values: np.ndarray, masks: Sequence[np.ndarray]) -> np.ndarray:
    """The owner's share of a sum: its own ``values`` encoded, less every passive party's mask (they cancel in the
    sum)."""
    share = encode(values)
    for m in masks:
        share -= m
    return share


def mask(key: bytes, sample_index: np.ndarray, width: int, *context: str | int) -> np.ndarray:
    """r_p for these rows: (len(sample_index), width) uniform words, bound to ``context`` and the rows, so that a share
    of other rows, of another step or of another query never carries the same mask."""
    rows = np.asarray(sample_index, dtype="<i8")
    stream = entropy.keyed_stream(key, *context, rows.tobytes())
    return np.frombuffer(stream.bytes(rows.size * width * WORD.itemsize), dtype=WORD).reshape(rows.size, width)


def embedding_mask(
    key: bytes, session_id: str, step: int, nonce: bytes, sample_index: np.ndarray, width: int
) -> np.ndarray:
    """r_p of one forward of a split-NN training step: ``nonce`` is the passive party's fresh draw for that forward, so
    that a step's rows computed twice (a repeat, a resumed step, dropout) never carry the same pad."""
    return mask(key, sample_index, width, "embedding-mask", session_id, step, nonce.hex())


def logit_mask(key: bytes, session_id: str, step: int, sample_index: np.ndarray, width: int) -> np.ndarray:
    """r_p of LR's training forward: bound to the step and rows (no fresh nonce), so that a replayed step rebuilds the
    same pad; z_p of a (step, rows) is one value (the block before that step), so a pad never hides two values."""
    return mask(key, sample_index, width, "logit-mask", session_id, step)


def share_mask(
    key: bytes, session_id: str, model_step: int, query_id: str, sample_index: np.ndarray, width: int
) -> np.ndarray:
    """r_p of an inference share: bound to the model's training step too, so that a query id reused after retraining
    never masks two values of a share alike."""
    return mask(key, sample_index, width, "share-mask", session_id, model_step, query_id)


def to_bytes(words: np.ndarray) -> bytes:
    return np.ascontiguousarray(words, dtype=WORD).tobytes()


def from_bytes(data: bytes, shape: tuple[int, int], what: str) -> np.ndarray:
    """Words of a (rows, width) share, else ValueError naming ``what``."""
    expected = shape[0] * shape[1] * WORD.itemsize
    if len(data) != expected:
        raise ValueError(f"{what} holds {len(data)} bytes; {shape[0]} x {shape[1]} words are {expected}")
    return np.frombuffer(data, dtype=WORD).reshape(shape).astype(np.uint64)
