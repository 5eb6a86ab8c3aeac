"""The curve work of PSI (services/crypto/psi.py), in pure Python and libsodium: RFC 9380's hash to edwards25519's
prime-order group and scalar multiplication, and the two units of work the PSI process pool runs on a chunk.

This module imports no numpy and nothing of the services, so a pool worker that only unpickles these functions and
their bytes arguments stays small (services/crypto/psi_pool.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from nacl.bindings import crypto_core_ed25519_add, crypto_scalarmult_ed25519_noclamp
from nacl.exceptions import CryptoError

POINT_BYTES = 32
# RFC 9380 §3.1 tag: application, version, suite. Bump the version if the encoding changes.
SUITE = "edwards25519_XMD:SHA-512_ELL2_RO_"
DST = f"vflsec-psi-v2-with-{SUITE}".encode()

# --- RFC 9380 hash_to_curve for edwards25519 (§6.7.1 Elligator 2, §6.8.2 rational map, h_eff = 8) ---
_P = 2**255 - 19
_A = 486662  # curve25519: v² = u³ + A·u² + u; Elligator 2 with Z = 2
_D2 = 2 * (-121665 * pow(121666, -1, _P)) % _P  # 2d of edwards25519: -x² + y² = 1 + d·x²·y²
_LOW_255 = (1 << 255) - 1


def _even_sqrt(a: int) -> int:
    """The even square root of a square ``a`` (p ≡ 5 mod 8); for the module's constants only."""
    root = pow(a, (_P + 3) // 8, _P)
    if root * root % _P != a:
        root = root * pow(2, (_P - 1) // 4, _P) % _P
    assert root * root % _P == a
    return root if root % 2 == 0 else _P - root


_C1 = _even_sqrt(_P - 486664)  # RFC 9380 §6.8.2: x = c1·s/t, sgn0(c1) = 0
_ORDER_4 = bytes(32)  # the point (i, 0), i = √-1 even: (x, y) + (i, 0) = (i·y, i·x)
_MINUS_I = _P - _even_sqrt(_P - 1)  # 1/i


def _edwards_x(y: int) -> int | None:
    """The even x with (x, y) on edwards25519, or None if there is none.

    The square root is libsodium's (decompression, in C; a Python 255-bit ``pow`` made hashing 2x slower). Adding the
    order-4 point (i, 0) to the decompressed point yields (i·y, i·x), so x comes back as the sum's y. libsodium's
    addition requires both points on the curve, not in the subgroup; the RFC 9380 vector test guards this.
    """
    try:
        total = crypto_core_ed25519_add(y.to_bytes(32, "little"), _ORDER_4)
    except CryptoError:  # (y² − 1)/(d·y² + 1) is not a square
        return None
    return _MINUS_I * (int.from_bytes(total, "little") & _LOW_255) % _P


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


def _batch_invert(values: list[int]) -> list[int]:
    """Montgomery's trick: every inverse for one exponentiation. Zero maps to zero (RFC 9380's inv0)."""
    prefix, acc = [], 1
    for v in values:
        prefix.append(acc)
        if v:
            acc = acc * v % _P
    inv = pow(acc, _P - 2, _P)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        if values[i]:
            out[i] = prefix[i] * inv % _P
            inv = inv * values[i] % _P
    return out


Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, x·y = T/Z
_IDENTITY: Point = (0, 1, 1, 0)


def _map_to_curve(us: list[int]) -> list[Point]:
    """Elligator 2 onto curve25519 (Z = 2), then the rational map onto edwards25519, for many u at once.

    Montgomery s is x1 = -A/(1 + 2u²) if g(x1) = x1³ + A·x1² + x1 is a square, else x2 = -x1 - A; Edwards
    y = (s − 1)/(s + 1), which has an x exactly when g(s) is a square (here -(d+1) is a square), so libsodium's
    decompression decides the branch and gives x up to sign. The sign follows RFC 9380: the Montgomery
    t = c1·s/x has sgn0(t) = 1 in the x1 branch, 0 in the x2 branch. s = -1 or t = 0 maps to the identity.
    """
    x1s = [-_A * inv % _P or _P - _A for inv in _batch_invert([(1 + 2 * u * u) % _P for u in us])]
    candidates = [*x1s, *((-x1 - _A) % _P for x1 in x1s)]
    inv_plus_one = _batch_invert([(s + 1) % _P for s in candidates])
    n, found = len(us), []
    for k in range(n):
        for branch, index in ((1, k), (0, n + k)):
            s = candidates[index]
            y = (s - 1) * inv_plus_one[index] % _P
            x = _edwards_x(y)
            if x is not None:
                found.append((s, x, y, branch, inv_plus_one[index] == 0))
                break
        else:  # unreachable: g(x2) = 2u²·g(x1) is a square when g(x1) is not
            raise AssertionError("Elligator 2 found no point")
    inv_x = _batch_invert([x for _, x, _, _, _ in found])
    points = []
    for (s, x, y, branch, at_infinity), ix in zip(found, inv_x, strict=True):
        if at_infinity or x == 0:
            points.append(_IDENTITY)
            continue
        if (_C1 * s % _P * ix % _P) & 1 != branch:
            x = _P - x
        points.append((x, y, 1, x * y % _P))
    return points


def _add(p: Point, q: Point) -> Point:
    """Complete addition on edwards25519 (a = -1), extended coordinates (Hisil et al. 2008, add-2008-hwcd-3)."""
    x1, y1, z1, t1 = p
    x2, y2, z2, t2 = q
    a = (y1 - x1) * (y2 - x2) % _P
    b = (y1 + x1) * (y2 + x2) % _P
    c = t1 * _D2 % _P * t2 % _P
    d = 2 * z1 * z2 % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _double(p: Point) -> Point:
    """Doubling on edwards25519 (a = -1), extended coordinates (dbl-2008-hwcd)."""
    x1, y1, z1, _ = p
    a, b, c = x1 * x1 % _P, y1 * y1 % _P, 2 * z1 * z1 % _P
    e = ((x1 + y1) * (x1 + y1) - a - b) % _P
    g = b - a
    f, h = g - c, -a - b
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def hash_to_group(messages: Sequence[bytes], dst: bytes = DST) -> list[bytes]:
    """RFC 9380 ``hash_to_curve`` (suite :data:`SUITE`) of each message, as 32-byte edwards25519 encodings."""
    # Chunks keep the intermediate integers of a million-ID list out of memory; inversions stay batched.
    chunk = 4096
    return [point for i in range(0, len(messages), chunk) for point in _hash_chunk(messages[i : i + chunk], dst)]


def _hash_chunk(messages: Sequence[bytes], dst: bytes) -> list[bytes]:
    us: list[int] = []
    for msg in messages:
        uniform = expand_message_xmd(msg, dst, 96)
        us += (int.from_bytes(uniform[:48], "big") % _P, int.from_bytes(uniform[48:], "big") % _P)
    mapped = _map_to_curve(us)
    points = []
    for i in range(0, len(mapped), 2):
        q = _add(mapped[i], mapped[i + 1])
        points.append(_double(_double(_double(q))))  # clear_cofactor, h_eff = 8
    inv_z = _batch_invert([z for _, _, z, _ in points])
    return [
        ((y * iz % _P) | ((x * iz % _P) & 1) << 255).to_bytes(32, "little")
        for (x, y, _, _), iz in zip(points, inv_z, strict=True)
    ]


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
    """``scalar·P`` for each 32-byte point of ``blob``; libsodium refuses any point that is not the canonical
    encoding of a non-identity point of the prime-order subgroup (``crypto_scalarmult_ed25519``'s contract)."""
    out = bytearray(len(blob))
    for i in range(0, len(blob), POINT_BYTES):
        try:
            out[i : i + POINT_BYTES] = crypto_scalarmult_ed25519_noclamp(scalar, blob[i : i + POINT_BYTES])
        except CryptoError:
            raise ValueError(
                f"point at index {start + i // POINT_BYTES} is not a canonical point of the prime-order subgroup "
                "of edwards25519"
            ) from None
    return bytes(out)
