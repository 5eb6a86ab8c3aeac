"""Public-key encryptions made straight at a level of the CKKS modulus chain, and SEAL's serialisation in memory.

SEAL encrypts under a public key below the key level by encrypting one level up and dropping that level's last prime
by division and rounding: at two primes an encryption of zero took a median 4.0 ms against 2.6 ms made over the two
primes directly, at one prime 3.0 against 1.7 (docs/performance.md, "Encryptions of zero at their level"). Dropping
primes of an RLWE public key (−a·s + e, a) leaves (−a·s + e, a) mod q_1···q_l: a public key of the same secret for
the parameters of those primes alone (the part of it SEAL's own encryption at those primes reads), whose key level is
that level, where SEAL encrypts without a division. The division only made the noise smaller: an encryption made
directly carries slot noise of std ~2^14 at scale 1 against ~2^10, which vanishes at the scales products are
re-randomised at (he.CkksBackend._zero_at: LR's 2^72; trees' 2^70, before the rescale divides it by a prime).
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from collections.abc import Callable
from typing import Protocol

import tenseal.sealapi as sealapi

from vflsec.services import common

__all__ = ["LevelEncryptors", "ZeroReserve", "load_bytes", "save_bytes", "vector_message"]


class _Serializable(Protocol):
    def save(self, path: str) -> None: ...


def save_bytes(obj: _Serializable) -> bytes:
    """SEAL's serialization of ``obj``: its Python binding saves only to a path, here one of an anonymous in-memory
    file (nothing on disk), or a private temporary file where there is none."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("vflsec-seal", os.MFD_CLOEXEC)
        try:
            obj.save(f"/proc/self/fd/{fd}")
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
    with tempfile.NamedTemporaryFile() as fh:
        obj.save(fh.name)
        return fh.read()


def load_bytes(obj: sealapi.Ciphertext | sealapi.PublicKey, context: sealapi.SEALContext, data: bytes) -> None:
    """``obj.load`` from SEAL's serialization ``data`` (the binding, again, reads only from a path)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("vflsec-seal", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            obj.load(context, f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        obj.load(context, fh.name)


def vector_message(ciphertext: bytes, size: int, scale: float) -> bytes:
    """TenSEAL's CKKSVectorProto (tenseal/proto/tensors.proto: 1 packed uint32 sizes, 2 bytes ciphertexts, 3 double
    scale) of one SEAL ciphertext of ``size`` slots."""
    sizes = common.varint(size)
    return (
        b"\x0a"
        + common.varint(len(sizes))
        + sizes
        + b"\x12"
        + common.varint(len(ciphertext))
        + ciphertext
        + b"\x19"
        + struct.pack("<d", scale)
    )


class ZeroReserve:
    """Encryptions of zero made ahead of need (he.Backend.make_ahead: in a party's idle time, off a step's critical
    path), each handed out once. A step that finds none makes its own, so what is held changes when a zero is made,
    never what a party sends: its randomness is SEAL's, from this process's OS entropy, either way."""

    HELD = 8  # at most, per kind and level (~260 KB each at two primes)

    def __init__(self) -> None:
        self._held: dict[tuple[str, tuple[int, ...]], list[sealapi.Ciphertext]] = {}
        self._lock = threading.Lock()

    def fill(
        self, kind: str, parms_id: object, count: int, make: Callable[[sealapi.Ciphertext], None]
    ) -> None:
        """Make zeros of ``kind`` at ``parms_id`` with ``make`` until ``count`` (at most HELD) are held."""
        key, target = (kind, tuple(parms_id)), min(count, self.HELD)  # type: ignore[call-overload]
        for _ in range(target):
            with self._lock:
                if len(self._held.get(key, ())) >= target:
                    return
            zero = sealapi.Ciphertext()
            make(zero)  # outside the lock: a step taking one never waits for one being made
            with self._lock:
                self._held.setdefault(key, []).append(zero)

    def take(self, kind: str, parms_id: object) -> sealapi.Ciphertext | None:
        """One zero of ``kind`` at ``parms_id`` made ahead, no longer held here; None if there is none."""
        with self._lock:
            held = self._held.get((kind, tuple(parms_id)))  # type: ignore[call-overload]
            return held.pop() if held else None


class LevelEncryptors:
    """Encryptions of zero under ``public_key`` made over the primes of a data level of ``context`` directly."""

    def __init__(self, context: sealapi.SEALContext, public_key: sealapi.PublicKey) -> None:
        self._context, self._public = context, public_key
        self._levels: dict[int, tuple[sealapi.Encryptor, object]] = {}
        self._lock = threading.Lock()  # a level's encryptor is built once (~20 ms), whichever thread asks first

    def encrypt_zero(self, parms_id: object, destination: sealapi.Ciphertext) -> None:
        """A fresh encryption of zero at the level ``parms_id`` (its randomness SEAL's, drawn from the OS entropy of
        this process as every SEAL encryption's is): the level's parameters and form, the scale left as SEAL's."""
        encryptor, key_level = self._at(parms_id)
        encryptor.encrypt_zero(key_level, destination)

    def _at(self, parms_id: object) -> tuple[sealapi.Encryptor, object]:
        data = self._context.get_context_data(parms_id)
        if data is None:
            raise ValueError("no such level in this context")
        primes = data.parms().coeff_modulus()
        with self._lock:
            if len(primes) not in self._levels:
                self._levels[len(primes)] = self._restricted(primes)
            return self._levels[len(primes)]

    def _restricted(self, primes: list) -> tuple[sealapi.Encryptor, object]:
        degree = self._context.key_context_data().parms().poly_modulus_degree()
        level = _context(degree, primes, sealapi.SEC_LEVEL_TYPE.TC128, chain=False)
        # SEAL's evaluator drops primes of data-level ciphertexts only, and the public key lives at the key level: so
        # it is read as a data-level ciphertext of a context with one more prime (any other NTT-friendly prime; a
        # context made for this only, which encrypts nothing), whose chain then has the same levels below it.
        key_primes = list(self._context.key_context_data().parms().coeff_modulus())
        taken = {p.value() for p in key_primes}
        candidates = sealapi.CoeffModulus.Create(degree, [60] * (len(key_primes) + 1))
        spare = next(p for p in candidates if p.value() not in taken)
        wide = _context(degree, [*key_primes, spare], sealapi.SEC_LEVEL_TYPE.NONE, chain=True)
        key = sealapi.Ciphertext()
        load_bytes(key, wide, save_bytes(self._public.data()))
        sealapi.Evaluator(wide).mod_switch_to_inplace(key, level.key_parms_id())
        public = sealapi.PublicKey()
        load_bytes(public, level, save_bytes(key))
        return sealapi.Encryptor(level, public), level.key_parms_id()


def _context(degree: int, primes: list, security: sealapi.SEC_LEVEL_TYPE, *, chain: bool) -> sealapi.SEALContext:
    params = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.CKKS)
    params.set_poly_modulus_degree(degree)
    params.set_coeff_modulus(primes)
    context = sealapi.SEALContext(params, chain, security)
    if not context.parameters_set():
        raise ValueError(f"invalid CKKS parameters for a level: {context.parameters_error_message()}")
    return context
