"""The curve work of PSI (services/crypto/psi.py): hashing IDs into ristretto255 and scalar multiplication, both
libsodium's (through pysodium, over the system's libsodium), and the two units of work the PSI process pool runs on
a chunk.

ristretto255 (RFC 9496) is a group of prime order L = 2^252 + 27742317777372353535851937790883648493 built on
edwards25519: each element has exactly one 32-byte encoding, and decoding refuses every string that is not one
(non-canonical, negative, not a square, off the curve). There is no cofactor and no subgroup to check, so a received
value that decodes is a group element, and one that does not is refused by the multiplication itself.

This module imports no numpy and nothing of the services, so a pool worker that only unpickles these functions and
their bytes arguments stays small (services/crypto/psi_pool.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pysodium import crypto_core_ristretto255_from_hash, crypto_scalarmult_ristretto255

POINT_BYTES = 32
# RFC 9380 §3.1 tag: application, version, suite (RFC 9380 Appendix B). Bump the version if the encoding changes.
SUITE = "ristretto255_XMD:SHA-512_R255MAP_RO_"
DST = f"vflsec-psi-v3-with-{SUITE}".encode()


def expand_message_xmd(msg: bytes, dst: bytes, length: int) -> bytes:
    """RFC 9380 §5.3.1 with SHA-512 (b = 64, s = 128 bytes)."""
    if len(dst) > 255 or length > 255 * 64:
        raise ValueError("DST longer than 255 bytes or output too long")
    dst_prime = dst + bytes([len(dst)])
    b0 = hashlib.sha512(bytes(128) + msg + length.to_bytes(2, "big") + b"\x00" + dst_prime).digest()
    blocks = [hashlib.sha512(b0 + b"\x01" + dst_prime).digest()]
    while len(blocks) * 64 < length:
        mixed = (int.from_bytes(b0, "big") ^ int.from_bytes(blocks[-1], "big")).to_bytes(64, "big")
        blocks.append(hashlib.sha512(mixed + bytes([len(blocks) + 1]) + dst_prime).digest())
    return b"".join(blocks)[:length]


def hash_to_group(messages: Sequence[bytes], dst: bytes = DST) -> list[bytes]:
    """RFC 9380's ``hash_to_ristretto255`` (suite :data:`SUITE`) of each message: 64 uniform bytes from
    ``expand_message_xmd``, mapped by RFC 9496's one-way map (libsodium's ``crypto_core_ristretto255_from_hash``)."""
    return [crypto_core_ristretto255_from_hash(expand_message_xmd(msg, dst, 64)) for msg in messages]


def _message(sample_id: bytes, salt: bytes) -> bytes:
    # The salt is length-prefixed so (salt, id) splits are unambiguous; the id is its UTF-8 encoding.
    return len(salt).to_bytes(4, "big") + salt + sample_id


# --- the units of work: pure functions of (scalar, salt, chunk), so any process or machine can run one ---
def blind_task(scalar: bytes, salt: bytes, width: int, ids: bytes, start: int) -> bytes:
    """``scalar·H(id)`` for each id of a chunk, given as UTF-8 encodings padded with zero bytes to ``width`` bytes
    each and concatenated (a numpy ``S`` array's buffer: no Python object per id crosses to the worker)."""
    messages = [_message(ids[i : i + width].rstrip(b"\0"), salt) for i in range(0, len(ids), width)]
    return multiply_task(scalar, b"".join(hash_to_group(messages)), start)


def multiply_task(scalar: bytes, blob: bytes, start: int) -> bytes:
    """``scalar·P`` for each 32-byte value of ``blob``; a value that is not the canonical encoding of a ristretto255
    element, or is the identity (whose product is the identity: ``crypto_scalarmult_ristretto255``'s contract), is a
    ValueError naming its index."""
    out = bytearray(len(blob))
    for i in range(0, len(blob), POINT_BYTES):
        point = blob[i : i + POINT_BYTES]
        try:
            # RFC 9496 refuses s >= p, so bit 255 set; libsodium (1.0.18 at least) ignores that bit and would decode
            # a second encoding of the same element.
            if point[-1] & 0x80:
                raise ValueError
            out[i : i + POINT_BYTES] = crypto_scalarmult_ristretto255(scalar, point)
        except ValueError:
            raise ValueError(
                f"point at index {start + i // POINT_BYTES} is not a canonical point of ristretto255 (the encoding "
                "of an element other than the identity)"
            ) from None
    return bytes(out)
