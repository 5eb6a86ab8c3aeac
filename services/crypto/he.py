"""Homomorphic-encryption backends and the encrypted-matrix packing used by every service.

Two backends share one interface so that services are written once:

* ``ckks`` — TenSEAL CKKS (N=8192, coefficient moduli [60, 40, 40, 60], scale 2^40, >= 128-bit security).
  The coordinator is the key holder; parties get a *public* context with the public key only. The protocol
  needs ct+ct, ct+pt and ct*pt: no rotations (so no Galois keys) and no ct*ct (so no relinearisation keys),
  which keeps the public context at ~0.5 MB instead of ~1.9 MB.
* ``plain`` — the same API and message flow, but a "ciphertext" is the float64 vector itself. It is the
  baseline for parity and speed checks and offers no confidentiality.

Packing (how a matrix is spread over ciphertexts) is services/crypto/layout.py's.
Masked products and block sums (protocol step 5) are services/crypto/masking.py's.
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeAlias

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from vflsec.services.crypto.layout import (  # re-exported: the packing is part of this module's interface
    LR_ENCRYPT_COST,
    LR_OPEN_COST,
    MatrixLayout,
    WireMatrix,
    choose_replicas,
    layout_error,
)
from vflsec.services.crypto.level_keys import LevelEncryptors, ZeroReserve
from vflsec.services.crypto.level_keys import save_bytes as _seal_bytes
from vflsec.services.crypto.level_keys import vector_message as _vector_message

__all__ = [
    "BACKENDS",
    "FRESH",
    "LOWERED",
    "LR_ENCRYPT_COST",
    "LR_OPEN_COST",
    "OPERAND",
    "Backend",
    "CkksBackend",
    "Ct",
    "EncryptedMatrix",
    "Form",
    "MatrixLayout",
    "PlainBackend",
    "PlainCiphertext",
    "WireMatrix",
    "add_matrices",
    "add_plain_matrix",
    "choose_replicas",
    "decrypt_matrix",
    "deserialize_all",
    "encrypt_matrix",
    "encrypt_to_wire",
    "layout_error",
    "make_keyholder",
    "matrix_from_wire",
    "matrix_to_wire",
    "open_public",
]

CKKS_POLY_MODULUS_DEGREE = 8192
CKKS_COEFF_MOD_BIT_SIZES = (60, 40, 40, 60)
CKKS_SCALE_BITS = 40
# An operand only ever multiplied once by a plaintext (at the global scale) and then decrypted (a tree node's [[Y]]):
# encrypted at this scale, one prime lower, its products are made over two primes and rescaled to one (2^30 x 2^40
# x a 2^25 masked slot fits 100 bits; rescaled, 2^30 x 2^25 fits 60), about a quarter cheaper (Backend.encrypt).
OPERAND_SCALE_BITS = 30
# The plaintext scale of a product that is not rescaled (LOWERED): a masked slot (<= sqrt(2) (2^24 + 64) in both parts)
# x 2^40 x 2^32 bounds every coefficient by 2^96.5, inside its two primes' q/2 = 2^99. The scale sets x's rounding,
# which the product keeps: at 2^30 a chunk's block sum could carry N/2 coefficients' rounding (x on a grid aligned with
# the encoding, review 25 F1), within 2^10 of the flooding at 30,000 rows; at 2^32 at least 2^10.4 below it (median
# 2^11.7 in 200 runs; what is left is [[δ]]'s own noise, review 26).
PRODUCT_PLAIN_SCALE_BITS = 32
SLOTS = CKKS_POLY_MODULUS_DEGREE // 2
CKKS_MASK_BOUND = 2.0**24
FEATURE_BOUND = 64.0  # |x| a party may multiply into a product; the masks hide |δ·x| <= FEATURE_BOUND
BLOCK_SUM_FLOODING = 2.0**-6  # std of the noise on each released CKKS block sum
BLOCK_SUM_GRID = 2.0**-10  # released block sums are multiples of this
# A training key answers at most N / KEY_ROTATION_MARGIN linear functionals of itself (key_rotation_steps).
KEY_ROTATION_MARGIN = 4
# Rule 2 (docs/protocol.md, "The four rules"): the slots the key holder may decrypt under one key, over every RPC
# of every family: each decrypted slot of a ciphertext of honest form is at most one linear functional of the key.
KEY_BUDGET = CKKS_POLY_MODULUS_DEGREE // KEY_ROTATION_MARGIN


def key_rotation_steps(functionals_per_step: int) -> int:
    """Key epoch length T = max(1, floor(N / (M · F))) steps per training key, for F functionals a step answers.

    A deviating party that submits a structured ciphertext of honest form, e.g. (0, t·x^j), reads one linear
    functional of the ternary secret key (N = 8192 unknowns) per block sum it is answered. With M = 4, all
    parties of a session together read at most N/4 per key, so the key stays underdetermined by >= 3N/4
    ternary unknowns (a lattice of dimension >= 6144, far beyond any reduction) however they pool them.
    """
    if functionals_per_step < 1:
        raise ValueError(f"functionals_per_step must be >= 1, got {functionals_per_step}")
    return max(1, CKKS_POLY_MODULUS_DEGREE // (KEY_ROTATION_MARGIN * functionals_per_step))


@dataclass(frozen=True, slots=True)
class Form:
    """A CKKS ciphertext form of the protocol, which check_form pins (the plain backend has none): its primes below
    the first data level, its scale, and its masked products' form: ``rescaled``, one prime lower at its scale, or not,
    at its level and its scale x 2^PRODUCT_PLAIN_SCALE_BITS."""

    name: str
    below: int
    scale_bits: int
    rescaled: bool

    def level_and_scale_bits(self, fresh_level: int, *, product: bool) -> tuple[int, int]:
        """Primes and scale (bits) of a ciphertext of this form, or with ``product`` of its masked products."""
        if not product:
            return fresh_level - self.below, self.scale_bits
        if self.rescaled:
            return fresh_level - self.below - 1, self.scale_bits
        return fresh_level - self.below, self.scale_bits + PRODUCT_PLAIN_SCALE_BITS


# A fresh encryption: every data prime, 2^40.
FRESH = Form("fresh", 0, CKKS_SCALE_BITS, rescaled=True)
# Trees' [[Y]]: multiplied once, then decrypted; 2^30 one prime lower, its products rescaled to one prime.
OPERAND = Form("operand", 1, OPERAND_SCALE_BITS, rescaled=True)
# LR's [[p]] and [[δ]]: 2^40 one prime lower, its products kept at two primes (no rescale, 2^72): the cheapest form
# at a fresh ciphertext's precision (an operand at 2^30 decodes 2^10 less precisely; review 24, F1).
LOWERED = Form("lowered", 1, CKKS_SCALE_BITS, rescaled=False)
_FORMS = (FRESH, OPERAND, LOWERED)


@dataclass(frozen=True, slots=True)
class PlainCiphertext:
    """The plain backend's stand-in for a ciphertext: a read-only float64 vector."""

    values: np.ndarray


Ct: TypeAlias = "ts.CKKSVector | PlainCiphertext"


class RandomSource(Protocol):
    """What masking draws from: a numpy Generator or services.entropy.CryptoRandom."""

    def uniform(self, low: float, high: float, size: tuple[int, ...]) -> np.ndarray: ...


def _as_vector(values: np.ndarray | Sequence[float], slots: int, what: str, *, complex_ok: bool = False) -> np.ndarray:
    """Validate a 1-D finite vector of 1..slots entries and return it as contiguous float64 (complex128 if it is
    complex and ``complex_ok``)."""
    complex_values = complex_ok and np.iscomplexobj(values)
    arr = np.ascontiguousarray(values, dtype=np.complex128 if complex_values else np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if not 1 <= arr.size <= slots:
        raise ValueError(f"{what} must have 1..{slots} entries, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains non-finite values")
    return arr


class Backend(ABC):
    """Common interface; public methods validate, subclasses implement the ``_``-prefixed primitives."""

    name: ClassVar[str]
    # Mask bound used by masked_feature_products when the caller does not choose one.
    default_mask_bound: ClassVar[float]
    # Std of the flooding noise on released block sums (0: exact, for a backend that hides nothing).
    block_sum_flooding: ClassVar[float]
    # Slots hold complex numbers (CKKS): a masked product's imaginary parts are masked too (masked_column_products).
    complex_slots: ClassVar[bool] = False
    slots: int
    _max_ct_bytes: int | None = None

    @classmethod
    @abstractmethod
    def keyholder(cls) -> Backend:
        """Fresh keys; only the coordinator calls this."""

    @classmethod
    @abstractmethod
    def from_public_context(cls, data: bytes) -> Backend:
        """A party's backend from the coordinator's public context; ValueError on bad bytes."""

    @abstractmethod
    def public_context(self) -> bytes:
        """Serialized public context (never the secret key), computed once and cached."""

    @property
    @abstractmethod
    def can_decrypt(self) -> bool: ...

    @abstractmethod
    def size(self, ct: Ct) -> int:
        """Number of meaningful slots in ``ct``."""

    @abstractmethod
    def _encrypt(self, values: np.ndarray) -> Ct: ...

    @abstractmethod
    def _decrypt(self, ct: Ct) -> np.ndarray: ...

    @abstractmethod
    def _serialize(self, ct: Ct) -> bytes: ...

    @abstractmethod
    def _deserialize(self, data: bytes) -> Ct: ...

    @abstractmethod
    def _add(self, a: Ct, b: Ct, inplace: bool) -> Ct: ...

    @abstractmethod
    def _add_plain(self, a: Ct, v: np.ndarray, inplace: bool) -> Ct: ...

    @abstractmethod
    def _mul_plain(self, a: Ct, v: np.ndarray) -> Ct: ...

    def encrypt(
        self, values: np.ndarray | Sequence[float], *, form: Form = FRESH, serialized: bool = False
    ) -> Ct | bytes:
        """An encryption in ``form`` (CKKS; see :class:`Form`): FRESH for a ciphertext that may be added to and
        multiplied, OPERAND (trees' [[Y]]) or LOWERED (LR's [[p]]) for one only ever multiplied once by a plaintext
        and then decrypted; ``serialized``: as the bytes :meth:`serialize` gives (CKKS: saved once, for the wire)."""
        arr = _as_vector(values, self.slots, "plaintext")
        if form is not FRESH:
            return self._encrypt_at(arr, form, serialized)
        ct = self._encrypt(arr)
        return self.serialize(ct) if serialized else ct

    def _encrypt_at(self, values: np.ndarray, form: Form, serialized: bool) -> Ct | bytes:
        return self.encrypt(values, serialized=serialized)  # a backend without forms (plain): a fresh encryption

    def decrypt(self, ct: Ct) -> np.ndarray:
        if not self.can_decrypt:
            raise PermissionError(f"{self.name} backend holds only the public context and cannot decrypt")
        return self._decrypt(ct)

    def serialize(self, ct: Ct) -> bytes:
        return self._serialize(ct)

    def decrypt_complex(self, ct: Ct) -> np.ndarray:
        """The slots with their imaginary parts (masked_column_products with two parts); real here."""
        return self.decrypt(ct).astype(np.complex128)

    @property
    def max_ciphertext_bytes(self) -> int:
        """Largest serialized ciphertext this context produces (a fresh full encryption) plus 1/16 slack;
        longer blobs are refused before the parser sees them."""
        if self._max_ct_bytes is None:
            fresh = self.serialize(self._encrypt(np.linspace(-1.0, 1.0, self.slots)))
            self._max_ct_bytes = len(fresh) + len(fresh) // 16
        return self._max_ct_bytes

    def deserialize(self, data: bytes) -> Ct:
        """Parse a ciphertext; malformed input raises ValueError (never a crash or a bare RuntimeError)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"ciphertext must be bytes, got {type(data).__name__}")
        if len(data) > self.max_ciphertext_bytes:
            raise ValueError(f"ciphertext of {len(data)} bytes exceeds this context's {self.max_ciphertext_bytes}")
        ct = self._deserialize(bytes(data))
        if not 1 <= self.size(ct) <= self.slots:
            raise ValueError(f"ciphertext has {self.size(ct)} slots, expected 1..{self.slots}")
        return ct

    def add(self, a: Ct, b: Ct, *, inplace: bool = False) -> Ct:
        """a + b; with ``inplace`` the result overwrites ``a`` (only when the caller owns ``a``)."""
        if self.size(a) != self.size(b):
            raise ValueError(f"ciphertext sizes differ: {self.size(a)} vs {self.size(b)}")
        return self._add(a, b, inplace)

    def add_plain(self, a: Ct, v: np.ndarray | Sequence[float], *, inplace: bool = False) -> Ct:
        return self._add_plain(a, self._matching_plain(a, v), inplace)

    def mul_plain(self, a: Ct, v: np.ndarray | Sequence[float]) -> Ct:
        return self._mul_plain(a, self._matching_plain(a, v))

    def make_ahead(self, form: Form, count: int, *, product: bool) -> None:
        """Up to ``count`` encryptions of zero made now, in this party's idle time, for a later step, each used once
        (a step that finds none makes its own): ``product``, the re-randomising zeros :meth:`masked_sum` starts
        ``form``'s products from; else the key holder's encryptions at ``form`` (:meth:`encrypt`). In the clear:
        nothing to make."""
        return None

    def masked_sum(
        self, cts: Sequence[Ct], plains: Sequence[np.ndarray], mask: np.ndarray, *, serialized: bool = False
    ) -> Ct | bytes:
        """Σ cts[i] ⊙ plains[i] + mask: one fold of :func:`masked_column_products`; ``serialized``: as the bytes
        :meth:`serialize` gives (for the wire: CKKS then saves it once, not into a vector and out again)."""
        if not cts or len(cts) != len(plains):
            raise ValueError(f"need as many plaintexts as ciphertexts (>= 1), got {len(plains)} and {len(cts)}")
        total = None
        for ct, v in zip(cts, plains, strict=True):
            # A product is a fresh object, so adding to it in place is safe and saves a copy.
            product = self.mul_plain(ct, v)
            total = product if total is None else self.add(total, product, inplace=True)
        total = self.add_plain(total, mask, inplace=True)
        return self.serialize(total) if serialized else total

    @abstractmethod
    def check_form(self, cts: Sequence[Ct], *, product: bool, form: Form = FRESH) -> None:
        """Refuse ciphertexts whose form no honest message of the protocol has (ValueError): that of an
        ``encrypt(..., form=form)`` ciphertext, or with ``product``, of its masked products."""

    def _matching_plain(self, a: Ct, v: np.ndarray | Sequence[float], *, complex_ok: bool = False) -> np.ndarray:
        arr = _as_vector(v, self.slots, "plaintext operand", complex_ok=complex_ok and self.complex_slots)
        if arr.size != self.size(a):
            raise ValueError(f"plaintext operand has {arr.size} entries, ciphertext has {self.size(a)}")
        return arr


class CkksBackend(Backend):
    """TenSEAL CKKS. The key holder keeps the secret key; public instances can only encrypt and compute."""

    name = "ckks"
    default_mask_bound = CKKS_MASK_BOUND
    complex_slots = True
    block_sum_flooding = BLOCK_SUM_FLOODING

    def __init__(self, context: ts.Context) -> None:
        self._ctx = context
        self.slots = context.data.seal_context().first_context_data().parms().poly_modulus_degree() // 2
        self._secret_key = context.secret_key() if context.has_secret_key() else None
        self._public_bytes: bytes | None = None
        self._fresh_level: int | None = None
        self._sealed: _Seal | None = None
        self._ahead = ZeroReserve()

    @classmethod
    def keyholder(cls) -> CkksBackend:
        ctx = ts.context(
            ts.SCHEME_TYPE.CKKS,
            poly_modulus_degree=CKKS_POLY_MODULUS_DEGREE,
            coeff_mod_bit_sizes=list(CKKS_COEFF_MOD_BIT_SIZES),
        )
        ctx.global_scale = 2.0**CKKS_SCALE_BITS
        return cls(ctx)

    @classmethod
    def from_public_context(cls, data: bytes) -> CkksBackend:
        try:
            ctx = ts.context_from(bytes(data))
        except (ValueError, RuntimeError, TypeError) as exc:
            raise ValueError(f"invalid CKKS public context: {exc}") from exc
        if ctx.has_secret_key():
            # A party must never hold the secret key; refuse rather than silently gaining decryption.
            raise ValueError("refusing a CKKS context that carries the secret key")
        if not ctx.has_public_key():
            raise ValueError("CKKS context has no public key")
        if not ctx.global_scale > 0:
            raise ValueError("CKKS context has no global scale")
        return cls(ctx)

    @classmethod
    def restore_keyholder(cls, data: bytes) -> CkksBackend:
        try:
            ctx = ts.context_from(bytes(data))
        except (ValueError, RuntimeError, TypeError) as exc:
            raise ValueError(f"invalid CKKS key-holder context: {exc}") from exc
        if not ctx.has_secret_key():
            raise ValueError("CKKS key-holder context has no secret key")
        return cls(ctx)

    def export_keyholder(self) -> bytes:
        if self._secret_key is None:
            raise PermissionError("public CKKS backend has no secret key")
        return self._ctx.serialize(
            save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
        )

    def public_context(self) -> bytes:
        if self._public_bytes is None:
            self._public_bytes = self._ctx.serialize(
                save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
            )
        return self._public_bytes

    @property
    def can_decrypt(self) -> bool:
        return self._secret_key is not None

    def secret_key_bytes(self) -> bytes:
        """SEAL serialization of the secret key (tests use it to prove the public context omits it)."""
        if self._secret_key is None:
            raise PermissionError("public CKKS backend has no secret key")
        return _seal_bytes(self._secret_key.data)

    def size(self, ct: Ct) -> int:
        return self._check(ct).size()

    @staticmethod
    def _check(ct: Ct) -> ts.CKKSVector:
        if not isinstance(ct, ts.CKKSVector):
            raise TypeError(f"ckks backend expects a CKKSVector, got {type(ct).__name__}")
        return ct

    def check_form(self, cts: Sequence[Ct], *, product: bool, form: Form = FRESH) -> None:
        """Before the key holder decrypts a caller's ciphertexts, and before a party multiplies a received δ or
        [[Y]] (its refusal then depends on those bytes only, never on the party's data: rule 4): each must have 2
        polynomials, the second nonzero, and the level and scale of an honest message of ``form`` (:class:`Form`:
        e.g. a fresh encryption, or sums of them plus plaintexts, has every prime of the first data level at 2^40,
        its masked products one prime fewer), with ``product`` of its masked products.

        A smaller scale would decode the decryption error magnified (2^8 instead of 2^40 shows it x 2^32,
        above the flooding), a third polynomial would bring s^2 into the decryption. This pins the form only:
        a crafted (0, t·x^j) of the right form still decrypts to linear functions of the secret key
        (docs/protocol.md, "Block sums").
        """
        level, scale_bits = form.level_and_scale_bits(self._level_of_fresh(), product=product)
        honest = "product" if product else "ciphertext"
        scale = 2.0**scale_bits
        for i, ct in enumerate(cts):
            raw = self._check(ct).ciphertext()[0]
            if raw.size() != 2 or raw.coeff_modulus_size() != level or raw.scale != scale:
                raise ValueError(
                    f"ciphertext {i} has {raw.size()} polynomials, {raw.coeff_modulus_size()} primes and scale "
                    f"2^{math.log2(raw.scale):.2f}; an honest {honest} has 2, {level} and 2^{scale_bits} "
                    f"({form.name} form)"
                )
            if raw.is_transparent():  # (c0, 0): no honest message has it, and SEAL refuses products of it
                raise ValueError(f"ciphertext {i} has a zero second polynomial; an honest {honest} has none")

    def _encrypt(self, values: np.ndarray) -> ts.CKKSVector:
        return ts.ckks_vector(self._ctx, values)

    def _decrypt(self, ct: Ct) -> np.ndarray:
        # Passing the key explicitly also decrypts vectors linked to a public context in the same process.
        return np.asarray(self._check(ct).decrypt(self._secret_key), dtype=np.float64)

    def _serialize(self, ct: Ct) -> bytes:
        return self._check(ct).serialize()

    def _deserialize(self, data: bytes) -> ts.CKKSVector:
        try:
            return ts.ckks_vector_from(self._ctx, data)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise ValueError(f"invalid CKKS ciphertext: {exc}") from exc

    def _add(self, a: Ct, b: Ct, inplace: bool) -> ts.CKKSVector:
        a, b = self._check(a), self._check(b)
        return a.add_(b) if inplace else a + b

    # The operands go to TenSEAL's native vector as lists: its Python wrapper would first copy a numpy array into a
    # PlainTensor through np.array(...).flatten().tolist() (~0.4 ms of a product's ~1.7 ms).
    def _add_plain(self, a: Ct, v: np.ndarray, inplace: bool) -> ts.CKKSVector:
        a = self._check(a)
        if inplace:
            a.data.add_plain_(v.tolist())
            return a
        return ts.CKKSVector(data=a.data.add_plain(v.tolist()))

    def _mul_plain(self, a: Ct, v: np.ndarray) -> ts.CKKSVector:
        a = self._check(a)
        product = ts.CKKSVector(data=a.data.mul_plain(v.tolist()))
        # Only a plaintext that encodes to zero (|v| below 2^-40 everywhere) can take TenSEAL's short-cut, so the
        # level (a copy of the ciphertext to read) is looked at only then.
        if float(np.max(np.abs(v))) < _ZERO_ENCODING_BELOW and _level(product) == _level(a):
            # TenSEAL short-cuts a plaintext that encodes to zero and returns a ciphertext one level above a
            # real product, which would tell the key holder "these features were all zero". Return a fresh,
            # properly rescaled encryption of zero instead (all-zero feature blocks, e.g. a constant column). It is
            # made under this backend's public key, so ``a`` must be encrypted under that key: under another epoch's
            # key it decrypts to noise of ~10^19 in every slot, which the key holder refuses.
            product = ts.ckks_vector(self._ctx, np.zeros(v.size)) * np.ones(v.size)
        return product

    def masked_sum(
        self, cts: Sequence[Ct], plains: Sequence[np.ndarray], mask: np.ndarray, *, serialized: bool = False
    ) -> Ct | bytes:
        # SEAL's evaluator, not TenSEAL's: TenSEAL rescales every ct x pt product (about 40 % of its cost), where a
        # sum of products needs one rescale or none, and adds only real plaintexts, where the mask must be complex
        # (complex_slots). The result has the form of the operands' products (Form, check_form).
        if not cts or len(cts) != len(plains):
            raise ValueError(f"need as many plaintexts as ciphertexts (>= 1), got {len(plains)} and {len(cts)}")
        values = [self._matching_plain(ct, v, complex_ok=True) for ct, v in zip(cts, plains, strict=True)]
        mask = self._matching_plain(cts[0], mask, complex_ok=True)
        seal = self._seal()
        # The operands share one form (checked where they are received), hence one level, scale and last prime.
        operand = self._check(cts[0]).ciphertext()[0]
        form = self._form_of(operand)
        # Rescaled: encoded at the scale of the prime the rescale drops, not 2^40, so that the product comes back at
        # the operand's scale exactly (labelled 2^40 it decoded x 2^40/q, 1 + 6.7e-7 for the prime under an operand:
        # an opened count of 750k rows off by one after rounding; review 21). Kept: at 2^PRODUCT_PLAIN_SCALE_BITS.
        plain_scale = self._last_prime(operand) if form.rescaled else 2.0**PRODUCT_PLAIN_SCALE_BITS
        product_scale = operand.scale * plain_scale
        # The sum starts from its re-randomising encryption of zero (below), made at the operands' level and the
        # products' scale (rescaled: before the rescale, which divides its noise by the prime it drops), whose c1 is
        # uniform: so no partial sum of crafted chunks can come out transparent and be dropped on the party's values
        # (review 27, F3; review 28 for trees' rescaled sums).
        total = self._zero_at(operand.parms_id(), scale=product_scale)
        for i, (ct, v) in enumerate(zip(cts, values, strict=True)):
            if np.max(np.abs(v)) < _ZERO_ENCODING_BELOW:
                continue  # encodes to zero: SEAL refuses the product (transparent), which is zero anyway
            raw = operand if i == 0 else self._check(ct).ciphertext()[0]
            plain = sealapi.Plaintext()
            seal.encoder.encode(v.tolist(), raw.parms_id(), plain_scale, plain)
            product = sealapi.Ciphertext()
            # SEAL raises on a transparent result (second polynomial zero), which crafted δ chunks reach only on some
            # plaintexts (c1_b = -c1_a cancels where chunks a and b carry equal values): such a result is dropped,
            # as a zero is, so that nothing raised depends on the party's values (rule 4); honest ones never are.
            if not _transparent_safe(seal.evaluator.multiply_plain, raw, plain, product):
                continue
            if not _transparent_safe(seal.evaluator.add_inplace, total, product):  # negligible: total's c1 uniform
                total = self._zero_at(operand.parms_id(), scale=product_scale)
        if form.rescaled:
            seal.evaluator.rescale_to_next_inplace(total)
        # Rescaled: scale x q / q, exact but for a double's last bit; kept: the operands' x 2^32, exact.
        total.scale = operand.scale if form.rescaled else product_scale
        plain = sealapi.Plaintext()
        seal.encoder.encode(mask.tolist(), total.parms_id(), total.scale, plain)
        seal.evaluator.add_plain_inplace(total, plain)
        # Re-randomised: the mask changes only c0, so c1 would be (rescaled) c1 of the operands times the party's
        # plaintexts, which a key holder knowing the operands' c1 (LR: [[δ]] = its [[p]] - y) tests guesses of the
        # plaintext against exactly (review 20, F3). The encryption of zero the sum started from, drawn from this
        # party's OS entropy, makes c1 uniform (an all-zero fold is that zero alone); its noise lies far inside the
        # mask.
        if serialized:  # TenSEAL's message of it, as serialize() would give it
            return _vector_message(_seal_bytes(total), self.size(cts[0]), total.scale)
        return self._vector(total, self.size(cts[0]))

    def make_ahead(self, form: Form, count: int, *, product: bool) -> None:
        # SEAL's symmetric encryption of a plaintext is its encryption of zero plus the plaintext: one made ahead and
        # added to later is the same ciphertext in distribution, its randomness this process's OS entropy either way.
        seal, parms_id = self._seal(), self._level_data(form).parms_id()
        if product:
            self._ahead.fill("public", parms_id, count, lambda zero: seal.zeros.encrypt_zero(parms_id, zero))
        elif self._secret_key is not None:
            encrypt = seal.encryptor.encrypt_zero_symmetric
            self._ahead.fill("secret", parms_id, count, lambda zero: encrypt(parms_id, zero))

    def _form_of(self, raw: sealapi.Ciphertext) -> Form:
        """The form of an operand of masked products (ValueError if none: parties check what they receive)."""
        for form in _FORMS:
            level, scale_bits = form.level_and_scale_bits(self._level_of_fresh(), product=False)
            if raw.coeff_modulus_size() == level and raw.scale == 2.0**scale_bits:
                return form
        raise ValueError(
            f"an operand of {raw.coeff_modulus_size()} primes at scale 2^{math.log2(raw.scale):.2f} has no form"
        )

    def _zero_at(self, parms_id: object, *, scale: float) -> sealapi.Ciphertext:
        """A fresh public-key encryption of zero (SEAL's, its randomness from the OS) made over the primes of
        ``parms_id`` directly (level_keys: 2.6 ms at two primes against 4.0 made one level up and divided), labelled
        ``scale``: a zero has none of its own. Its slot noise, ~2^14 at scale 1 against ~2^10, vanishes at the
        products' scales (2^72; 2^70 before trees' rescale, which divides it by the prime it drops)."""
        zero = self._ahead.take("public", parms_id)
        if zero is None:
            zero = sealapi.Ciphertext()
            self._seal().zeros.encrypt_zero(parms_id, zero)
        zero.scale = scale
        return zero

    def _last_prime(self, raw: sealapi.Ciphertext) -> float:
        """The last prime of ``raw``'s modulus: the one a rescale of its products drops."""
        parms = self._ctx.data.seal_context().get_context_data(raw.parms_id()).parms()
        return float(parms.coeff_modulus()[-1].value())

    def _encrypt_at(self, values: np.ndarray, form: Form, serialized: bool) -> ts.CKKSVector | bytes:
        # Encoded and encrypted over the form's primes only, not made over every prime and dropped to them. The key
        # holder encrypts under its secret key (symmetric: 1.0 ms against 2.4 for a public-key encryption at two
        # primes), a party under the public key; SEAL's randomness comes from the OS either way.
        seal, level = self._seal(), self._level_data(form)
        plain, raw = sealapi.Plaintext(), sealapi.Ciphertext()
        seal.encoder.encode(values.tolist(), level.parms_id(), 2.0**form.scale_bits, plain)
        zero = self._ahead.take("secret", level.parms_id()) if self._secret_key is not None else None
        if zero is not None:  # made ahead (make_ahead)
            raw, raw.scale = zero, 2.0**form.scale_bits
            seal.evaluator.add_plain_inplace(raw, plain)
        elif self._secret_key is not None:
            seal.encryptor.encrypt_symmetric(plain, raw)
        else:
            seal.encryptor.encrypt(plain, raw)
        if serialized:
            return _vector_message(_seal_bytes(raw), values.size, raw.scale)
        return self._vector(raw, values.size)

    def _level_data(self, form: Form) -> sealapi.SEALContext.ContextData:
        level = self._ctx.data.seal_context().first_context_data()
        for _ in range(form.below):
            level = level.next_context_data()
        return level

    def _vector(self, raw: sealapi.Ciphertext, size: int) -> ts.CKKSVector:
        """A SEAL ciphertext of ``size`` slots as a TenSEAL vector (its scale, TenSEAL's for the vector)."""
        return ts.ckks_vector_from(self._ctx, _vector_message(_seal_bytes(raw), size, raw.scale))

    def _level_of_fresh(self) -> int:
        if self._fresh_level is None:
            self._fresh_level = _level(self._encrypt(np.zeros(1)))
        return self._fresh_level

    def decrypt_complex(self, ct: Ct) -> np.ndarray:
        if self._secret_key is None:
            raise PermissionError("ckks backend holds only the public context and cannot decrypt")
        seal = self._seal()
        plain = sealapi.Plaintext()
        seal.decryptor.decrypt(self._check(ct).ciphertext()[0], plain)  # type: ignore[union-attr]
        return np.asarray(seal.encoder.decode_complex(plain), dtype=np.complex128)[: self.size(ct)]

    def _seal(self) -> _Seal:
        if self._sealed is None:
            context = self._ctx.data.seal_context()
            decryptor = None if self._secret_key is None else sealapi.Decryptor(context, self._secret_key.data)
            public = self._ctx.public_key().data
            encryptor = (
                sealapi.Encryptor(context, public)
                if self._secret_key is None
                else sealapi.Encryptor(context, public, self._secret_key.data)
            )
            self._sealed = _Seal(
                sealapi.CKKSEncoder(context),
                sealapi.Evaluator(context),
                encryptor,
                decryptor,
                LevelEncryptors(context, public),
            )
        return self._sealed


def _transparent_safe(operation: Callable[..., None], *args: object) -> bool:
    """Run a SEAL evaluator ``operation``; False if its result is transparent (SEAL raises then, after computing it)."""
    try:
        operation(*args)
    except RuntimeError as exc:
        if "transparent" not in str(exc):
            raise
        return False
    return True


def _level(ct: ts.CKKSVector) -> int:
    return ct.ciphertext()[0].coeff_modulus_size()


@dataclass(frozen=True, slots=True)
class _Seal:
    encoder: sealapi.CKKSEncoder
    evaluator: sealapi.Evaluator
    encryptor: sealapi.Encryptor
    decryptor: sealapi.Decryptor | None
    zeros: LevelEncryptors  # public-key encryptions of zero at a level's primes


# A plaintext whose every slot lies below this encodes to zero at scale 2^40 or may (with a margin of 2^-20: a nonzero
# slot above it gives a coefficient far above the rounding), so only then can ct x pt short-cut (_mul_plain).
_ZERO_ENCODING_BELOW = 2.0**-20


_PLAIN_CTX = struct.Struct("<8sI")
_PLAIN_CTX_MAGIC = b"VFPLCTX1"
_PLAIN_CT = struct.Struct("<4sBI")
_PLAIN_CT_MAGIC = b"VFPC"
_PLAIN_CT_VERSION = 1


class PlainBackend(Backend):
    """Unencrypted baseline with the CKKS backend's API, layouts and permission model."""

    name = "plain"
    default_mask_bound = 0.0
    block_sum_flooding = 0.0

    def __init__(self, slots: int, keyholder: bool) -> None:
        self.slots = slots
        self._keyholder = keyholder

    @classmethod
    def keyholder(cls) -> PlainBackend:
        return cls(SLOTS, keyholder=True)

    @classmethod
    def from_public_context(cls, data: bytes) -> PlainBackend:
        if len(data) != _PLAIN_CTX.size:
            raise ValueError(f"plain public context must be {_PLAIN_CTX.size} bytes, got {len(data)}")
        magic, slots = _PLAIN_CTX.unpack(data)
        if magic != _PLAIN_CTX_MAGIC:
            raise ValueError("not a plain-backend public context")
        if not 1 <= slots <= 1 << 20:
            raise ValueError(f"plain public context has an invalid slot count {slots}")
        return cls(slots, keyholder=False)

    @classmethod
    def restore_keyholder(cls, data: bytes) -> PlainBackend:
        return cls(cls.from_public_context(data).slots, keyholder=True)

    def export_keyholder(self) -> bytes:
        if not self._keyholder:
            raise PermissionError("public plain backend is not a key holder")
        return self.public_context()

    def public_context(self) -> bytes:
        return _PLAIN_CTX.pack(_PLAIN_CTX_MAGIC, self.slots)

    @property
    def can_decrypt(self) -> bool:
        return self._keyholder

    def size(self, ct: Ct) -> int:
        return self._check(ct).size

    def check_form(self, cts: Sequence[Ct], *, product: bool, form: Form = FRESH) -> None:
        for ct in cts:  # a plain "ciphertext" has no scale or level: only its type
            self._check(ct)

    @staticmethod
    def _check(ct: Ct) -> np.ndarray:
        if not isinstance(ct, PlainCiphertext):
            raise TypeError(f"plain backend expects a PlainCiphertext, got {type(ct).__name__}")
        return ct.values

    @staticmethod
    def _wrap(values: np.ndarray) -> PlainCiphertext:
        values.flags.writeable = False
        return PlainCiphertext(values)

    def _encrypt(self, values: np.ndarray) -> PlainCiphertext:
        return self._wrap(values.copy())

    def _decrypt(self, ct: Ct) -> np.ndarray:
        return self._check(ct).copy()

    def _serialize(self, ct: Ct) -> bytes:
        values = self._check(ct)
        header = _PLAIN_CT.pack(_PLAIN_CT_MAGIC, _PLAIN_CT_VERSION, values.size)
        return header + values.astype("<f8").tobytes()

    def _deserialize(self, data: bytes) -> PlainCiphertext:
        if len(data) < _PLAIN_CT.size:
            raise ValueError(f"plain ciphertext truncated: {len(data)} bytes")
        magic, version, count = _PLAIN_CT.unpack_from(data)
        if magic != _PLAIN_CT_MAGIC or version != _PLAIN_CT_VERSION:
            raise ValueError("not a plain-backend ciphertext (bad magic or version)")
        expected = _PLAIN_CT.size + 8 * count
        if len(data) != expected:
            raise ValueError(f"plain ciphertext of {count} slots must be {expected} bytes, got {len(data)}")
        values = np.frombuffer(data, dtype="<f8", offset=_PLAIN_CT.size).astype(np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError("plain ciphertext contains non-finite values")
        return self._wrap(values)

    # Plain "ciphertexts" are immutable, so in-place requests just return a new object.
    def _add(self, a: Ct, b: Ct, inplace: bool) -> PlainCiphertext:
        return self._wrap(self._check(a) + self._check(b))

    def _add_plain(self, a: Ct, v: np.ndarray, inplace: bool) -> PlainCiphertext:
        return self._wrap(self._check(a) + v)

    def _mul_plain(self, a: Ct, v: np.ndarray) -> PlainCiphertext:
        return self._wrap(self._check(a) * v)


BACKENDS: dict[str, type[Backend]] = {CkksBackend.name: CkksBackend, PlainBackend.name: PlainBackend}


def _backend_class(name: str) -> type[Backend]:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown HE backend {name!r}; choose one of {sorted(BACKENDS)}") from None


def make_keyholder(name: str) -> Backend:
    """The coordinator's backend with fresh keys."""
    return _backend_class(name).keyholder()


def restore_keyholder(name: str, data: bytes) -> Backend:
    return _backend_class(name).restore_keyholder(data)


def open_public(name: str, public_context: bytes) -> Backend:
    """A party's backend from the coordinator's serialized public context."""
    return _backend_class(name).from_public_context(public_context)


# --------------------------------------------------------------------------------------------------------
# Encrypted matrices (their layout: services/crypto/layout.py)


@dataclass(slots=True)
class EncryptedMatrix:
    """A layout plus its ciphertexts (one per chunk of ``rows_per_ct`` rows)."""

    layout: MatrixLayout
    ciphertexts: list[Ct]

    @property
    def shape(self) -> tuple[int, int]:
        return self.layout.shape

    @property
    def replicas(self) -> int:
        return self.layout.replicas

    @property
    def rows_per_ct(self) -> int:
        return self.layout.rows_per_ct


def encrypt_matrix(backend: Backend, M: np.ndarray, replicas: int = 1, *, form: Form = FRESH) -> EncryptedMatrix:
    """``form``: the ciphertexts' (:meth:`Backend.encrypt`)."""
    layout, vectors = _packed(backend, M, replicas)
    return EncryptedMatrix(layout, [backend.encrypt(v, form=form) for v in vectors])


def encrypt_to_wire(backend: Backend, M: np.ndarray, replicas: int = 1, *, form: Form = FRESH) -> WireMatrix:
    """:func:`encrypt_matrix` as it goes on the wire (:func:`matrix_to_wire`), each ciphertext saved once."""
    layout, vectors = _packed(backend, M, replicas)
    blobs = [backend.encrypt(v, form=form, serialized=True) for v in vectors]
    return WireMatrix(layout.shape, layout.replicas, layout.rows_per_ct, blobs)


def _packed(backend: Backend, M: np.ndarray, replicas: int) -> tuple[MatrixLayout, np.ndarray]:
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {M.shape}")
    layout = MatrixLayout.for_matrix(M.shape, replicas, backend.slots)
    return layout, layout.pack(M)


def decrypt_matrix(backend: Backend, em: EncryptedMatrix) -> np.ndarray:
    """Key holder only: the (n, k) matrix, read from the first replica."""
    return em.layout.unpack([backend.decrypt(ct) for ct in em.ciphertexts])


def add_matrices(backend: Backend, a: EncryptedMatrix, b: EncryptedMatrix) -> EncryptedMatrix:
    if a.layout != b.layout or len(a.ciphertexts) != len(b.ciphertexts):
        raise ValueError(f"layouts differ: {a.layout} vs {b.layout}")
    return EncryptedMatrix(a.layout, [backend.add(x, y) for x, y in zip(a.ciphertexts, b.ciphertexts, strict=True)])


def add_plain_matrix(backend: Backend, em: EncryptedMatrix, M: np.ndarray) -> EncryptedMatrix:
    """em + M, with M packed (and replicated) in em's layout."""
    packed = em.layout.pack(M)
    return EncryptedMatrix(em.layout, [backend.add_plain(ct, v) for ct, v in zip(em.ciphertexts, packed, strict=True)])


def matrix_to_wire(backend: Backend, em: EncryptedMatrix) -> WireMatrix:
    return WireMatrix(em.shape, em.replicas, em.rows_per_ct, [backend.serialize(ct) for ct in em.ciphertexts])


def matrix_from_wire(backend: Backend, wire: WireMatrix) -> EncryptedMatrix:
    """Validate the layout and every ciphertext's slot count; ValueError with the reason otherwise."""
    layout = MatrixLayout(tuple(int(s) for s in wire.shape), int(wire.replicas), int(wire.rows_per_ct))
    layout.validate(backend.slots, len(wire.ciphertexts))
    return EncryptedMatrix(layout, deserialize_all(backend, wire.ciphertexts, layout.ct_size))


def deserialize_all(backend: Backend, blobs: Sequence[bytes], ct_size: int) -> list[Ct]:
    """Deserialize ciphertexts that must all carry ``ct_size`` slots."""
    cts = []
    for index, blob in enumerate(blobs):
        ct = backend.deserialize(blob)
        if backend.size(ct) != ct_size:
            raise ValueError(f"ciphertext {index} has {backend.size(ct)} slots, layout needs {ct_size}")
        cts.append(ct)
    return cts
