"""Score-release defenses: what the coordinator may do to confidence scores before they leave it.

Each defense is a score step of the release chain (``released = step(scores, logits, context)``), registered
by name so that specs such as ``"privee:epsilon=0.1,basis=householder"`` build it. Parameters arrive typed
(services/registry.py parses spec strings by the constructors' annotations); every constructor checks their
ranges (``ValueError`` with a clear message).
Random draws come from ``context.rng`` only and are never part of :meth:`public_params`.

Sources: PRIVEE (Madabushi et al.; mechanism facts in ``design/defenses-notes.md``), PPS-B (Rassouli et al.,
§VII-B, Theorem 4 and schemes 1-3), rounding down (Luo et al., §VII), Gaussian noise, label-only and rank-only
releases. Orientation used throughout: *rank 1 is the top class*; "ascending position" is the index in a row
sorted ascending.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Literal

import numpy as np

from vflsec.services.defenses.release import SCORE_STEPS, ReleaseContext, ScoreStep
from vflsec.services.models.activations import softmax
from vflsec.services.models.lr import softmax_layout
from vflsec.services.registry import ANY_SCORES, parse_value

__all__ = [
    "PRIVEE_PRESETS",
    "GaussianNoise",
    "LabelOnly",
    "PpsB",
    "Privee",
    "PriveePlusPlus",
    "RankOnly",
    "Rounding",
    "argmax_agreement",
    "count_ties",
    "gaussian_sigma",
    "pps_b_direction",
]

# Rounding to more decimals than float64 resolves (about 15.9 significant digits) is meaningless.
MAX_DECIMALS = 15


# --------------------------------------------------------------------------- parameter ranges
# Values arrive typed (the registry parses spec strings by the constructors' annotations); these check ranges.


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


def _open_unit(name: str, value: float) -> float:
    if not 0 < value < 1:
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")
    return float(value)


def _within(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value!r}")
    return value


def _as_batch(scores: np.ndarray) -> np.ndarray:
    batch = np.ascontiguousarray(scores, dtype=np.float64)
    if batch.ndim != 2 or batch.shape[1] < 2:
        raise ValueError(f"scores must be an (n, C) batch with C >= 2, got shape {batch.shape}")
    return batch


# --------------------------------------------------------------------------- shared helpers


def gaussian_sigma(epsilon: float | np.ndarray, delta: float, sensitivity: float) -> float | np.ndarray:
    """Gaussian-mechanism calibration σ = Δf·√(2 ln(1.25/δ))/ε (element-wise for an array of ε)."""
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def argmax_agreement(raw: np.ndarray, released: np.ndarray) -> float:
    """Fraction of rows whose released argmax equals the raw argmax (1.0 = accuracy untouched)."""
    raw, released = np.asarray(raw), np.asarray(released)
    if raw.shape != released.shape or raw.ndim != 2:
        raise ValueError(f"expected two (n, C) batches of one shape, got {raw.shape} and {released.shape}")
    if raw.shape[0] == 0:
        return 1.0
    return float(np.mean(raw.argmax(axis=1) == released.argmax(axis=1)))


def count_ties(released: np.ndarray) -> int:
    """Entries equal to another entry of their row, counted beyond the first: a row (a, a, a, b) has 2."""
    ordered = np.sort(np.asarray(released, dtype=np.float64), axis=1)
    return int(np.count_nonzero(ordered[:, 1:] == ordered[:, :-1]))


def _tie_group_bounds(ordered: np.ndarray, *, end: bool) -> np.ndarray:
    """For rows sorted ascending: the ascending position where each entry's tie group starts (or ends)."""
    n, k = ordered.shape
    positions = np.arange(k)
    if end:  # an entry ends its group unless its right neighbour equals it
        last = np.ones((n, k), dtype=bool)
        np.not_equal(ordered[:, :-1], ordered[:, 1:], out=last[:, :-1])
        marks = np.where(last, positions, k - 1)
        return np.minimum.accumulate(marks[:, ::-1], axis=1)[:, ::-1]
    first = np.ones((n, k), dtype=bool)
    np.not_equal(ordered[:, 1:], ordered[:, :-1], out=first[:, 1:])
    return np.maximum.accumulate(np.where(first, positions, 0), axis=1)


def _ascending_positions(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat indices listing each row of a C-contiguous block in ascending order, and the sorted rows.

    Fast path: non-negative doubles sort like their IEEE bit patterns, so the column index is packed into the
    low mantissa bits of a uint64 key and one SIMD value sort replaces ``argsort`` (about 2x faster). Dropping
    those ⌈log2 K⌉ bits can only misorder values that agree to ~K·2^-52 relative (2^-38 at K = 10^4); such
    rows, and rows holding negative values, fail the sortedness check below and are re-sorted with ``argsort``.
    """
    n, k = block.shape
    low_bits = np.uint64((1 << max(1, (k - 1).bit_length())) - 1)
    keys = block.view(np.uint64) & ~low_bits
    keys |= np.arange(k, dtype=np.uint64)
    keys.sort(axis=1)
    keys &= low_bits
    positions = keys.view(np.int64)
    positions += np.arange(0, n * k, k)[:, None]
    ordered = block.reshape(-1)[positions.reshape(-1)].reshape(n, k)
    misordered = np.flatnonzero(~(ordered[:, 1:] >= ordered[:, :-1]).all(axis=1))
    if misordered.size:
        exact = np.argsort(block[misordered], axis=1)
        ordered[misordered] = np.take_along_axis(block[misordered], exact, axis=1)
        positions[misordered] = exact + (misordered * k)[:, None]
    return positions.reshape(-1), ordered


# Below this many entries a batch runs in the calling thread; above it, row blocks run on every core (numpy's
# sorts and element-wise kernels release the GIL): about 1.6x faster on 2 cores at 1,000 x 10,000.
_PARALLEL_MIN_ENTRIES = 1 << 20
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _for_row_blocks(n: int, k: int, work: Callable[[slice], None]) -> None:
    """Run ``work`` on contiguous row blocks that together cover rows 0..n−1 (blocks write disjoint rows)."""
    global _POOL
    blocks = min(_workers(), n) if n * k >= _PARALLEL_MIN_ENTRIES else 1
    if blocks <= 1:
        work(slice(0, n))
        return
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="score-release")
    bounds = np.linspace(0, n, blocks + 1).astype(int)
    for future in [_POOL.submit(work, slice(lo, hi)) for lo, hi in itertools.pairwise(bounds)]:
        future.result()


# --------------------------------------------------------------------------- rounding


@SCORE_STEPS.register("rounding")
class Rounding(ScoreStep):
    """Round every score *down* to ``decimals`` decimals (Luo et al. §VII).

    The released value is the largest float of the grid {k / 10^b} that does not exceed the score: exactly
    ``released <= raw`` and the next grid float lies above ``raw`` (a naive ``floor(x·10^b)/10^b`` maps the
    float 0.29 to 0.28 and can also round up). Rounding creates ties; use
    :func:`count_ties` to report them. Downstream ``ln`` of a score must guard ``ln 0``.
    """

    families = ANY_SCORES

    def __init__(self, decimals: int) -> None:
        self.decimals = _within("decimals", decimals, 0, MAX_DECIMALS)

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        x = _as_batch(scores)
        scale = 10.0**self.decimals  # exact in float64 for decimals <= 22
        k = np.floor(x * scale)
        # x·scale is rounded once, so the floor is off by at most one grid step either way.
        k = np.where(k / scale > x, k - 1.0, k)
        k = np.where((k + 1.0) / scale <= x, k + 1.0, k)
        return k / scale


# --------------------------------------------------------------------------- Gaussian noise


@SCORE_STEPS.register("gaussian")
class GaussianNoise(ScoreStep):
    """Add i.i.d. N(0, σ²) to every score, σ from :func:`gaussian_sigma`. The argmax can flip."""

    families = ANY_SCORES

    def __init__(self, epsilon: float, delta: float = 1e-5, sensitivity: float = 0.1) -> None:
        self.epsilon = _positive("epsilon", epsilon)
        self.delta = _open_unit("delta", delta)
        self.sensitivity = _positive("sensitivity", sensitivity)
        self.sigma = float(gaussian_sigma(self.epsilon, self.delta, self.sensitivity))

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        x = _as_batch(scores)
        return x + context.rng.normal(0.0, self.sigma, size=x.shape)


# --------------------------------------------------------------------------- PRIVEE

# "rank_safe" (default): identity basis, a fresh u per vector, DP++'s smallest ε on the top class.
# "authors": the PRIVEE authors' code (sindhujamadabushi/PRIVEE, defenses/torch_generate_noise{1,2}.py):
# Householder basis, one A_pert per call (per batch), DP++'s budgets ε_i = a + (b − a)(i + 1)/K assigned
# by ascending position i, so the top class gets the largest ε — σ then falls with the score and close
# scores can swap (docs/defenses.md).
Preset = Literal["rank_safe", "authors"]
Basis = Literal["identity", "householder"]
Per = Literal["vector", "batch"]
PRIVEE_PRESETS: dict[Preset, dict[str, str]] = {
    "rank_safe": {"basis": "identity", "per": "vector"},
    "authors": {"basis": "householder", "per": "batch"},
}


class _PriveeMechanism(ScoreStep):
    """p_sorted = (A + diag(σ ⊙ u)) c_sorted with rank-aware u (defenses-notes.md, PRIVEE steps 1-6).

    [0, U] is split into K equal sub-intervals and the entry at ascending position i draws u_i from the i-th,
    so u increases strictly with rank; σ is non-decreasing along ascending positions. Every score is
    therefore multiplied by a factor that grows with its rank, which preserves the ranking. Tied scores share
    their tie group's lowest position (its multiplier), so ties stay ties. With the Householder basis
    A = I − (2/K)·11ᵀ the product is c·(1 + s) − (2/K)·Σc, computed in O(K) without forming A.

    Inputs must be non-negative (confidence scores): a rank-growing multiplier reverses the order of
    negative values, so PRIVEE has to come before any step that can produce them.
    """

    families = ANY_SCORES
    upper: ClassVar[float]  # U

    def __init__(self, delta: float, sensitivity: float, basis: Basis | None, per: Per | None, preset: Preset) -> None:
        self.delta = _open_unit("delta", delta)
        self.sensitivity = _positive("sensitivity", sensitivity)
        self.preset = preset
        fixed = PRIVEE_PRESETS[preset]
        self.basis = basis if basis is not None else fixed["basis"]
        self.per = per if per is not None else fixed["per"]
        if self.preset == "authors" and (self.basis, self.per) != (fixed["basis"], fixed["per"]):
            raise ValueError("preset=authors fixes basis=householder and per=batch (the authors' code); drop them")
        self._affine_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _epsilons_by_rank(self, k: int) -> np.ndarray:
        """The privacy budget of ranks 1..K (rank 1 = top class); non-decreasing."""
        raise NotImplementedError

    def _budget_params(self) -> dict[str, str]:
        raise NotImplementedError

    def public_params(self) -> dict[str, str]:
        return {
            **self._budget_params(),
            "preset": self.preset,
            "delta": str(self.delta),
            "sensitivity": str(self.sensitivity),
            "basis": self.basis,
            "per": self.per,
            "U": str(self.upper),
        }

    def sigma_ascending(self, k: int) -> np.ndarray:
        """σ per ascending position: non-decreasing when the top class gets the smallest ε (rank-safe)."""
        eps = self._epsilons_by_rank(k)
        return np.asarray(gaussian_sigma(eps, self.delta, self.sensitivity), dtype=np.float64)[::-1].copy()

    def _affine(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(slope, base) with 1 + σ_i·u_i = base_i + slope_i·r_i, since u_i = (i + r_i)·U/K, r_i ~ U[0, 1)."""
        affine = self._affine_cache.get(k)
        if affine is None:
            slope = self.sigma_ascending(k) * (self.upper / k)
            affine = self._affine_cache[k] = (slope, 1.0 + slope * np.arange(k))
        return affine

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        c = _as_batch(scores)
        if not np.all(np.isfinite(c)) or (c.size and c.min() < 0):
            raise ValueError(
                f"{self.name} needs finite non-negative confidence scores; put it before steps that add noise"
            )
        n, k = c.shape
        # r_i ~ U[0, 1) per ascending position: one row per vector, or one row shared by the batch.
        draws = context.rng.random((n, k) if self.per == "vector" else (1, k))
        affine, householder = self._affine(k), self.basis == "householder"
        released = np.empty_like(c)

        def block(rows: slice) -> None:
            block_draws = draws[rows] if self.per == "vector" else draws
            _privee_block(c[rows], block_draws, affine, householder, out=released[rows])

        _for_row_blocks(n, k, block)
        return released


def _share_within_ties(ordered: np.ndarray, values: np.ndarray, *, at_end: bool = False) -> np.ndarray:
    """Give every entry of a tie group the value at the group's first (or last) ascending position.

    ``ordered`` holds rows sorted ascending and ``values`` one value per ascending position (it may be a
    broadcast view). Only rows that contain ties pay for the group search.
    """
    tied_rows = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
    if tied_rows.size == 0:
        return values
    shared = np.array(values)  # writable copy
    bounds = _tie_group_bounds(ordered[tied_rows], end=at_end)
    shared[tied_rows] = np.take_along_axis(shared[tied_rows], bounds, axis=1)
    return shared


def _privee_block(
    c: np.ndarray,
    draws: np.ndarray,
    affine: tuple[np.ndarray, np.ndarray],
    householder: bool,
    out: np.ndarray,
) -> None:
    """PRIVEE on a block of rows, written into ``out`` (see :class:`_PriveeMechanism`)."""
    n, k = c.shape
    positions, ordered = _ascending_positions(c)  # tie order is irrelevant: ties share one multiplier
    slope, base = affine
    multiplier = draws * slope  # 1 + s_i = base_i + slope_i·r_i
    multiplier += base
    ordered *= _share_within_ties(ordered, np.broadcast_to(multiplier, (n, k)))
    if householder:
        ordered -= (2.0 / k) * c.sum(axis=1, keepdims=True)  # A·c = c − (2/K)(1ᵀc)·1
    out.reshape(-1)[positions] = ordered.reshape(-1)


@SCORE_STEPS.register("privee")
class Privee(_PriveeMechanism):
    """PRIVEE-DP: one ε for every rank, U = 3."""

    upper = 3.0

    def __init__(
        self,
        epsilon: float,
        delta: float = 1e-5,
        sensitivity: float = 0.1,
        basis: Basis | None = None,
        per: Per | None = None,
        preset: Preset = "rank_safe",
    ) -> None:
        super().__init__(delta, sensitivity, basis, per, preset)
        self.epsilon = _positive("epsilon", epsilon)

    def _epsilons_by_rank(self, k: int) -> np.ndarray:
        return np.full(k, self.epsilon)

    def _budget_params(self) -> dict[str, str]:
        return {"epsilon": str(self.epsilon)}


def _epsilon_entry(name: str, text: str) -> float:
    return _positive(name, parse_value(name, text, float))


def _parse_epsilons(text: str) -> tuple[str, tuple[float, ...]]:
    """``"a:b"`` -> ("range", (a, b)); ``"e1;e2;..."`` -> ("list", (e1, e2, ...)), rank 1 (top) first."""
    text = str(text).strip()
    if ":" in text:
        low_text, _, high_text = text.partition(":")
        low = _epsilon_entry("epsilons range start", low_text)
        high = _epsilon_entry("epsilons range end", high_text)
        if high < low:
            raise ValueError(f"epsilons range {text!r} must be increasing (start <= end)")
        return "range", (low, high)
    values = tuple(_epsilon_entry("epsilons entry", item) for item in text.split(";") if item.strip())
    if not values:
        raise ValueError("epsilons must be a range 'a:b' or a list 'e1;e2;...'")
    if any(later < earlier for earlier, later in itertools.pairwise(values)):
        raise ValueError(
            f"epsilons {text!r} must be non-decreasing from the top rank down "
            "(sigma must grow with the score for order preservation)"
        )
    return "list", values


@SCORE_STEPS.register("privee_pp")
class PriveePlusPlus(_PriveeMechanism):
    """PRIVEE-DP++: a per-rank budget vector, U = 1.

    ``epsilons="a:b"``: ε evenly spaced in (a, b], one per rank — rank r of K gets a + (b − a)·r/K (the
    authors' setting is 0.05:0.1). ``epsilons="e1;e2;...;eL"``: budgets for ranks 1..L (top first,
    non-decreasing), linearly interpolated onto K ranks (a single value means one ε for all ranks). The
    smallest ε, hence the largest σ, goes to the top class, which keeps σ non-decreasing in the score.
    """

    upper = 1.0

    def __init__(
        self,
        epsilons: str = "0.05:0.1",
        delta: float = 1e-5,
        sensitivity: float = 0.1,
        basis: Basis | None = None,
        per: Per | None = None,
        preset: Preset = "rank_safe",
    ) -> None:
        super().__init__(delta, sensitivity, basis, per, preset)
        self.kind, self.values = _parse_epsilons(epsilons)
        self.epsilons = (":" if self.kind == "range" else ";").join(str(v) for v in self.values)

    def _epsilons_by_rank(self, k: int) -> np.ndarray:
        if self.kind == "range":
            low, high = self.values
            eps = low + (high - low) * np.arange(1, k + 1) / k
        else:
            eps = np.interp(np.linspace(0.0, 1.0, k), np.linspace(0.0, 1.0, len(self.values)), self.values)
        # The authors' code hands the budgets out from the bottom class up: the top class gets the largest ε.
        return eps[::-1].copy() if self.preset == "authors" else eps

    def _budget_params(self) -> dict[str, str]:
        return {"epsilons": self.epsilons}


# --------------------------------------------------------------------------- PPS-B (Rassouli §VII-B)

_PPS_B_CACHE_KEY = "pps_b.v1"


def pps_b_direction(passive_weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """v_1: the top right singular vector of A⁺J with A = J·W_pas (Rassouli Theorem 4).

    W_pas concatenates the passive blocks column-wise (sorted by party id; the column order does not change
    v_1). J is the (K−1)×K first-difference matrix of eq. (4), so J·W is a row difference and A⁺J needs no
    K×K matrix. A binary sigmoid model is handled in its softmax form [0, z], whose J·W is W itself. The sign
    is fixed so that the entry of largest magnitude (the first, on ties up to rounding) is positive.
    """
    if not passive_weights:
        raise ValueError("pps_b needs the passive weight blocks in the release context (none are set)")
    blocks = [np.atleast_2d(np.asarray(passive_weights[p], dtype=np.float64)) for p in sorted(passive_weights)]
    if len({block.shape[0] for block in blocks}) != 1:
        raise ValueError(f"passive weight blocks disagree on K_logits: {[b.shape for b in blocks]}")
    stacked = np.hstack(blocks)
    w = softmax_layout(len(stacked)).T @ stacked
    a_pinv = np.linalg.pinv(np.diff(w, axis=0))  # (JW)⁺, d x (K−1)
    a_pinv_j = -np.diff(np.pad(a_pinv, ((0, 0), (1, 1))), axis=1)  # column k: a⁺_{k−1} − a⁺_k
    v1 = np.linalg.svd(a_pinv_j, full_matrices=False)[2][0]
    magnitude = np.abs(v1)
    # Entries equal in magnitude up to rounding (e.g. ±1/√2 for two classes) count as tied: take the first.
    pivot = np.flatnonzero(magnitude >= magnitude.max() * (1 - 1e-9))[0]
    return v1 if v1[pivot] > 0 else -v1


def _keep_top_strict(released: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Float64 guard: lift the top classes one ulp above the rest where rounding merged them.

    Every scheme keeps the top strictly ahead in exact arithmetic; rounding can only merge it with another
    class whose raw logit was within a few ulps (e.g. scheme 3 with α near 1), and this restores the argmax.
    """
    best_other = np.where(top, -np.inf, released).max(axis=1, keepdims=True)
    floor = np.nextafter(best_other, np.inf)
    return np.where(top & (released < floor), floor, released)


@SCORE_STEPS.register("pps_b")
class PpsB(ScoreStep):
    """Rassouli §VII-B: perturb the logits along v_1 (Theorem 4) and release σ(z̃); argmax unchanged.

    * scheme 1 (eqs. 91-93): n = √α·ñ/‖ñ‖ with ñ = v_1 except ñ_{i*} = max_j v_j; z̃ = z + n.
    * scheme 2 (eq. 94): z' = z + √α·v_1, then z̃ = z' except z̃_{i*} = max_j z'_j. When that maximum sits
      outside i* the paper's rule ties it with i*; we then lift i* by the public gap √α·(max v − min v) so
      that i* stays the unique argmax.
    * scheme 3 (§VIII-D): z̃ = (1 − α)·z + α·1, α in [0, 1) — a temperature that keeps the order.

    i* is the set of classes with the maximal *score* (footnote 19 for ties); all of i* get one value, so
    ties at the top stay ties (:func:`_keep_top_strict` is the float64 guard). The step reads the raw
    logits and replaces the scores, so it must be the first score step. Binary sigmoid models run in their
    softmax form [0, z], which releases [1 − p̃, p̃]. v_1 depends only on the model and is cached in
    ``context.cache``.
    """

    families = frozenset({"lr"})  # v_1 comes from the linear model's passive weight blocks
    uses_raw_logits = True

    def __init__(self, alpha: float, scheme: int = 1) -> None:
        self.scheme = _within("scheme", scheme, 1, 3)
        self.alpha = float(alpha)
        if self.scheme == 3 and not 0 <= self.alpha < 1:
            raise ValueError(f"alpha must lie in [0, 1) for scheme 3, got {alpha!r}")
        if self.alpha < 0:
            raise ValueError(f"alpha (the noise budget Tr S) must be >= 0, got {alpha!r}")

    def public_params(self) -> dict[str, str]:
        return {"scheme": str(self.scheme), "alpha": str(self.alpha)}

    def direction(self, context: ReleaseContext) -> np.ndarray:
        v1 = context.cache.get(_PPS_B_CACHE_KEY)
        if v1 is None:
            v1 = context.cache[_PPS_B_CACHE_KEY] = pps_b_direction(context.passive_weights)
        return v1

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        c = _as_batch(scores)
        z = np.asarray(logits, dtype=np.float64)
        z = z @ softmax_layout(z.shape[1])
        if z.shape != c.shape:
            raise ValueError(f"pps_b: logits {np.shape(logits)} do not match scores {c.shape}")
        top = c == c.max(axis=1, keepdims=True)
        z_top = np.where(top, z, -np.inf).max(axis=1, keepdims=True)
        if self.scheme == 3:
            keep = 1.0 - self.alpha
            perturbed, top_value = keep * z + self.alpha, keep * z_top + self.alpha
        else:
            perturbed, top_value = self._along_v1(z, z_top, top, self.direction(context))
        return _keep_top_strict(softmax(np.where(top, top_value, perturbed)), top)

    def _along_v1(
        self, z: np.ndarray, z_top: np.ndarray, top: np.ndarray, v1: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        if v1.shape != (z.shape[1],):
            raise ValueError(f"pps_b: v_1 has {v1.size} entries but the model has {z.shape[1]} classes")
        root_alpha = math.sqrt(self.alpha)
        if self.scheme == 1:
            n_tilde = np.where(top, v1.max(), v1)
            scale = root_alpha / np.linalg.norm(n_tilde, axis=1, keepdims=True)
            return z + scale * n_tilde, z_top + scale * v1.max()
        shifted = z + root_alpha * v1
        best_top = np.where(top, shifted, -np.inf).max(axis=1, keepdims=True)
        best_other = np.where(top, -np.inf, shifted).max(axis=1, keepdims=True)
        gap = root_alpha * (v1.max() - v1.min())
        return shifted, np.where(best_other >= best_top, best_other + gap, best_top)


# --------------------------------------------------------------------------- label-only / rank-only


@SCORE_STEPS.register("label_only")
class LabelOnly(ScoreStep):
    """Release the one-hot vector of the argmax class (the first maximal class on ties, as ``argmax``)."""

    families = ANY_SCORES

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        c = _as_batch(scores)
        released = np.zeros_like(c)
        released[np.arange(c.shape[0]), c.argmax(axis=1)] = 1.0
        return released


@SCORE_STEPS.register("rank_only")
class RankOnly(ScoreStep):
    """Release (K − rank)/K, rank 1 = top class: the top class gets (K − 1)/K, the bottom one 0.

    Tied scores share their best (competition, "min") rank, so ties stay ties and the argmax is unchanged;
    in ascending order the released value is the position where the entry's tie group ends, divided by K.
    """

    families = ANY_SCORES

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        c = _as_batch(scores)
        n, k = c.shape
        released = np.empty_like(c)

        def block(rows: slice) -> None:
            positions, ordered = _ascending_positions(c[rows])
            ranks = _share_within_ties(ordered, np.broadcast_to(np.arange(k) / k, ordered.shape), at_end=True)
            released[rows].reshape(-1)[positions] = ranks.reshape(-1)

        _for_row_blocks(n, k, block)
        return released
