"""Ye et al.'s binary feature reconstruction on the embeddings z_B = W_B x_B (+ b) of an active-top split-NN.

Every binary column x of X_B lies in the column space of the recorded n × width matrix Z (ye §4), so the
attacks search that space for binary vectors:

* ``ye_alg1`` (Algorithm 1, exact, noise-free): pick k rows R whose k × k block of a basis is invertible,
  enumerate x' ∈ {0,1}^k \\ {0}, extend each to the unique span vector agreeing with x' on R, keep the binary ones.
* ``ye_alg2`` (Algorithm 2, noisy z_B): leverage-score sampling of r = k + 1 rescaled rows, least squares per
  x' ∈ {0,1}^r, threshold the prediction at 0.5 on the other rows, keep the best fits of 20 restarts; every
  distinct vector under a residual threshold is listed (several binary features, one-hot combinations).
* ``ye_adaptive`` (ye §5, against masquerade): recover the m fabricated bits first, split the rows into the
  2^m groups they define, attack inside the largest group and carry its regression weights to the others.
* ``ye_peel`` (against masquerade at any m): recover the fabricated bits round by round, each round projecting the
  ones found so far out of Z (a smaller span, so the next round's search is cheaper or exhaustive), then run
  Algorithm 2 on what is left. It needs no groups, so m = ⌈log₂ n⌉ (groups of one row) does not stop it: what
  protects the true feature is only its distance from the span, i.e. which directions Q drops.

Bias and recoding (ye §7): z_B = W_B x_B + b, or a binary feature stored as two other values (a standardised
column), only add the all-ones vector to the span. Ye subtracts one row of Z from the others; the attacks here
centre Z (subtract the mean row, the same span and less noisy) and adjoin the ones vector, so x and 1 − x are
found together and listed once (the side with fewer ones, a category indicator for one-hot groups).

Ranking (one deviation from ye line 8): the raw residual min_w ||Zw − x||² favours near-constant vectors under
noise (ye's default e = [1, 0, …, 0] has residual ≤ 1 and beats a true feature whose residual is noise · n), so
candidates are ranked by the *unexplained fraction* residual / ||x − mean(x)||² = 1 − R² of the regression.

The dimension k of the searched span is the numerical rank of Z, capped by what the public schema allows
(d_B, plus m fabricated bits under masquerade, plus the ones vector): under noise the top-k singular directions
are the denoised span. Enumeration is 2^k (Algorithm 1) or 2^(k+1) per restart (Algorithm 2). Algorithm 1's
``max_rank`` bounds it and refuses with NotApplicable beyond; Algorithm 2's ``max_candidates`` (a public attack
option: a Kerckhoffs attacker may spend more compute) bounds the candidates tried per restart and, beyond it,
tries that many drawn at random — a best effort whose result says it was sampled.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from .base import Attack, NotApplicable, Observations, Reconstruction, register

__all__ = [
    "BinarySearchResult",
    "YeAdaptive",
    "YeAlg1",
    "YeAlg2",
    "YePeel",
    "attack_accuracy",
    "attack_in_groups",
    "binary_match",
    "enumerate_binary",
    "one_hot_structure",
    "peel_search",
    "regression_search",
    "span_basis",
]

MAX_RANK = 20  # Algorithm 1: 2^20 candidates per enumeration, seconds; every extra dimension doubles it
MAX_CANDIDATES = 2**20  # Algorithm 2: all 2^r candidates per restart up to this many, a random sample beyond
_RANK_RTOL = 1e-8  # singular values below this fraction of the largest are numerical zeros


# --------------------------------------------------------------------------- the searched span


def span_basis(z: np.ndarray, max_dim: int, *, bias: bool = True) -> np.ndarray:
    """Orthonormal n × k basis of span(Z) (with the ones vector when ``bias``), k ≤ max_dim (+1 for the ones).

    The centred Z's top singular directions, truncated at its numerical rank and at ``max_dim``: exact for
    noise-free embeddings, the best rank-``max_dim`` approximation of the span under noise.
    """
    z = np.asarray(z, dtype=np.float64)
    if z.ndim != 2 or z.shape[0] < 2:
        raise ValueError(f"embeddings must be an (n, width) matrix with n >= 2, got shape {z.shape}")
    if not np.all(np.isfinite(z)):
        raise ValueError("embeddings contain NaN or infinite values")
    n = z.shape[0]
    centred = z - z.mean(axis=0) if bias else z
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    rank = int(np.sum(s > _RANK_RTOL * s[0])) if s.size and s[0] > 0 else 0
    u = u[:, : min(rank, max_dim)]
    return np.hstack([np.full((n, 1), 1 / np.sqrt(n)), u]) if bias else u


def _bits(k: int) -> np.ndarray:
    """Every nonzero x' ∈ {0,1}^k as rows, (2^k − 1, k)."""
    return ((np.arange(1, 2**k)[:, None] >> np.arange(k)) & 1).astype(np.float64)


def _unexplained(u: np.ndarray, x: np.ndarray, bias: bool) -> np.ndarray:
    """Per column of x (n, c): ||x − UUᵀx||² / ||x − mean||² (bias) or / ||x||² — 1 − R² of the regression."""
    total = x.sum(axis=0)  # x binary: Σx² = Σx
    residual = total - np.sum((x.T @ u) ** 2, axis=1)
    scale = total - total**2 / x.shape[0] if bias else total
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, np.maximum(residual, 0.0) / scale, np.inf)


def _residual(u: np.ndarray, x: np.ndarray, bias: bool) -> np.ndarray:
    """ye line 8 as printed: min_w ||Zw − x||² (x binary, U orthonormal)."""
    return np.maximum(x.sum(axis=0) - np.sum((x.T @ u) ** 2, axis=1), 0.0)


def _canonical(x: np.ndarray, bias: bool) -> np.ndarray:
    """With the ones vector in the span x and 1 − x come together: keep the side with fewer ones."""
    if not bias:
        return x
    flip = x.sum(axis=0) * 2 > x.shape[0]
    return np.where(flip, 1 - x, x)


@dataclass
class BinarySearchResult:
    """Distinct binary vectors found (n, K), best first, with their unexplained fraction (K,)."""

    vectors: np.ndarray
    scores: np.ndarray
    rank: int  # dimension of the searched span (ones vector included)
    sampled: str | None = None  # why the search was not exhaustive (Algorithm 2 beyond its candidate bound)

    def reconstruction(self, d_passive: int, **meta: object) -> Reconstruction:
        """x_passive: the found vectors in the first columns (at most d_p), 0.5 (no information) elsewhere;
        the column order carries no claim about which passive feature a vector is."""
        n, k = self.vectors.shape
        x = np.full((n, d_passive), 0.5)
        x[:, : min(k, d_passive)] = self.vectors[:, :d_passive]
        structure = one_hot_structure(self.vectors)
        return Reconstruction(
            x,
            {
                "binary_features": self.vectors.astype(np.uint8),
                "unexplained": self.scores,
                "n_found": k,
                "span_rank": self.rank,
                **({"sampled": self.sampled} if self.sampled else {}),
                **structure,
                **meta,
            },
        )


def _distinct(vectors: np.ndarray, scores: np.ndarray, bias: bool) -> tuple[np.ndarray, np.ndarray]:
    """Drop constant vectors and duplicates (complements with bias); best score first."""
    x = _canonical(vectors, bias)
    ones = x.sum(axis=0)
    keep = (ones > 0) & (ones < x.shape[0]) & np.isfinite(scores)
    x, scores = x[:, keep], scores[keep]
    order = np.argsort(scores, kind="stable")
    seen: dict[bytes, int] = {}
    for j in order:
        seen.setdefault(np.packbits(x[:, j].astype(bool)).tobytes(), int(j))
    chosen = sorted(seen.values(), key=lambda j: scores[j])
    return x[:, chosen], scores[chosen]


# --------------------------------------------------------------------------- Algorithm 1


def enumerate_binary(
    z: np.ndarray, max_dim: int, *, bias: bool = True, tol: float = 1e-6, max_rank: int = MAX_RANK
) -> BinarySearchResult:
    """ye Algorithm 1: every binary vector in span(Z) (noise-free), excluding the constant ones."""
    u = span_basis(z, max_dim, bias=bias)
    n, k = u.shape
    if k > max_rank:
        raise NotApplicable(f"the embedding span has dimension {k} > max_rank={max_rank} (2^{k} candidates)")
    # k rows whose k × k block is best conditioned (QR with column pivoting on Uᵀ), plus check rows that
    # reject most non-binary candidates before the full n-row test.
    pivots = scipy.linalg.qr(u.T, pivoting=True, mode="r")[1]
    rows, check = pivots[:k], pivots[k : k + 64]
    coefficients = np.linalg.solve(u[rows], _bits(k).T)  # k × (2^k − 1): U_R c = x'
    found: list[np.ndarray] = []
    for start in range(0, coefficients.shape[1], 4096):
        c = coefficients[:, start : start + 4096]
        c = c[:, _is_binary(u[check] @ c, tol)]
        if c.shape[1]:
            full = u @ c
            found.append(np.rint(full[:, _is_binary(full, tol)]))
    vectors = np.hstack(found) if found else np.zeros((n, 0))
    vectors, scores = _distinct(vectors, _unexplained(u, vectors, bias), bias)
    return BinarySearchResult(vectors, scores, k)


def _is_binary(values: np.ndarray, tol: float) -> np.ndarray:
    return np.all((np.abs(values) <= tol) | (np.abs(values - 1) <= tol), axis=0)


# --------------------------------------------------------------------------- Algorithm 2


def _candidate_chunks(
    r: int, sample: int | None, rng: np.random.Generator, chunk: int = 1 << 14
) -> Iterator[np.ndarray]:
    """x' ∈ {0,1}^r as (c, r) chunks: every nonzero one, or ``sample`` uniform draws (the bound's best effort)."""
    if sample is None:
        for begin in range(1, 2**r, chunk):
            labels = np.arange(begin, min(begin + chunk, 2**r))
            yield ((labels[:, None] >> np.arange(r)) & 1).astype(np.float64)
        return
    for begin in range(0, sample, chunk):
        bits = rng.integers(0, 2, size=(min(chunk, sample - begin), r)).astype(np.float64)
        yield bits[bits.any(axis=1)]


_PRESCREEN = 128  # probe rows of the first cut: a wrong labeling leaves non-binary predictions on most rows


def _screen(probe_solve: np.ndarray, bits: np.ndarray, bias: bool) -> np.ndarray:
    """Per candidate x' (rows of ``bits``): the distance of the probe rows' predictions from their rounding,
    over their spread (an upper bound of the unexplained fraction, float32: a ranking, not a result)."""
    probe = probe_solve @ bits.T.astype(np.float32)
    ones = np.count_nonzero(probe >= 0.5, axis=0).astype(np.float64)
    spread = ones - ones**2 / len(probe) if bias else ones
    gap = np.minimum(probe, 1 - probe)  # signed distance from the nearest of 0 and 1
    distance = np.einsum("ij,ij->j", gap, gap, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(spread > 0, distance / spread, np.inf)


def regression_search(
    z: np.ndarray,
    max_dim: int,
    *,
    bias: bool = True,
    restarts: int = 20,
    threshold: float = 0.05,
    screen_rows: int | None = 1024,
    keep: int = 32,
    rng: np.random.Generator | None = None,
    max_candidates: int = MAX_CANDIDATES,
    max_list: int = 64,
    literal: bool = False,
) -> BinarySearchResult:
    """ye Algorithm 2 with ``restarts`` restarts: the best vector and every other under ``threshold``.

    ``literal`` follows line 8 as printed (and SecretFlow): T starts with e = [1, 0, …, 0], candidates are
    ranked by the raw residual and only the best is returned — kept for cross-checks, see the module notes.

    Per restart, r = k + 1 rows are drawn by leverage score (without replacement: a repeated row only
    repeats an equation) and rescaled by 1/√(r p_i); each x' ∈ {0,1}^r gives w' by least squares and x by
    thresholding Zw' at 0.5 off the sample (x' on it). Line 8's exact residual costs n·k per candidate, so
    with ``screen_rows`` the 2^r candidates are first ranked on that many other random rows by the
    distance of Zw' from its rounding (an upper bound of the residual) and the ``keep`` best are scored
    exactly; ``screen_rows=None`` scores every candidate exactly. Candidates come in chunks; a large chunk is
    first cut to its 4 · ``keep`` best on 128 of those rows.

    Beyond ``max_candidates`` (2^r − 1 > it) each restart tries that many x' drawn uniformly instead of all
    of them: a best effort that finds a given target with probability about max_candidates / 2^r per restart
    (``BinarySearchResult.sampled`` says so). An attacker with more compute raises the bound.
    """
    rng = rng if rng is not None else np.random.default_rng()
    u = span_basis(z, max_dim, bias=bias)
    n, k = u.shape
    r = k + 1
    if n <= r:
        raise NotApplicable(f"{n} rows cannot determine a {k}-dimensional span (need more than {r})")
    sample = max_candidates if 2**r - 1 > max_candidates else None
    leverage = np.sum(u * u, axis=1) / k
    leverage /= leverage.sum()
    score_of = _residual if literal else _unexplained
    vectors, scores = [], []
    if literal:
        e = np.zeros((n, 1))
        e[0] = 1
        vectors, scores = [e.astype(np.uint8)], [score_of(u, e, bias)]

    def fit(rows: np.ndarray, solve: np.ndarray, bits: np.ndarray) -> None:
        """Score the candidates ``bits`` (c, r) exactly; keep what can be listed (memory O(n · max_list))."""
        for begin in range(0, len(bits), 2048):
            chosen = bits[begin : begin + 2048]
            x = (u @ (solve @ chosen.T) >= 0.5).astype(np.float64)
            x[rows] = chosen.T
            score = score_of(u, x, bias)
            kept = np.argsort(score, kind="stable")[: max(1, min(max_list, int(np.sum(score <= threshold))))]
            vectors.append(x[:, kept].astype(np.uint8))
            scores.append(score[kept])

    for _ in range(restarts):
        rows = rng.choice(n, size=r, replace=False, p=leverage)
        scale = 1 / np.sqrt(r * leverage[rows])
        solve = np.linalg.pinv(scale[:, None] * u[rows]) * scale[None, :]  # k × r: w' = solve @ x'
        # A sampled search always screens (on every other row when fewer than screen_rows): scoring 2^20
        # candidates exactly per restart would cost minutes.
        screening = screen_rows is not None and (n - r > screen_rows or (sample is not None and n - r > 2 * _PRESCREEN))
        if screening:
            others = np.ones(n, dtype=bool)
            others[rows] = False
            probe_rows = u[rng.choice(np.flatnonzero(others), size=min(screen_rows, n - r), replace=False)]
            probe_solve = (probe_rows @ solve).astype(np.float32)
        best_bits, best_screen = np.zeros((0, r)), np.zeros(0)
        for bits in _candidate_chunks(r, sample, rng):
            if not screening:
                fit(rows, solve, bits)
                continue
            if len(bits) > 8 * keep:  # a large chunk: a first cut on a few probe rows, the full screen on the rest
                bits = bits[np.argsort(_screen(probe_solve[:_PRESCREEN], bits, bias), kind="stable")[: 4 * keep]]
            best_bits = np.vstack([best_bits, bits])
            best_screen = np.concatenate([best_screen, _screen(probe_solve, bits, bias)])
            order = np.argsort(best_screen, kind="stable")[:keep]
            best_bits, best_screen = best_bits[order], best_screen[order]
        if screening:
            fit(rows, solve, best_bits)
    x, s = _distinct(np.hstack(vectors).astype(np.float64), np.concatenate(scores), bias)
    listed = 1 if literal else max(1, int(np.sum(s <= threshold)))
    x, s = x[:, : 4 * max_list][:, :listed], s[: 4 * max_list][:listed]
    # Rows near the 0.5 threshold flip between restarts: a vector within 1 % of a better one is the same find.
    chosen: list[int] = []
    for j in range(x.shape[1]):
        if len(chosen) == max_list:
            break
        if not chosen or binary_match(x[:, j : j + 1], x[:, chosen], complements=bias).max() < 0.99:
            chosen.append(j)
    sampled = None if sample is None else f"{sample} of the 2^{r} candidates per restart, drawn at random"
    return BinarySearchResult(x[:, chosen], s[chosen], k, sampled)


# --------------------------------------------------------------------------- one-hot groups


def one_hot_structure(vectors: np.ndarray) -> dict[str, list[list[int]] | list[int]]:
    """Atoms and one-hot groups among found vectors (ye §6.3: a one-hot group shows up with every sum).

    A vector is composite when it is the sum of two disjoint found vectors; the atoms that pair up that way
    (disjoint, their sum found) form one group — a categorical feature's indicator columns.
    """
    k = vectors.shape[1]
    keys = {np.packbits(vectors[:, j].astype(bool)).tobytes(): j for j in range(k)}
    composite: set[int] = set()
    pairs: list[tuple[int, int]] = []
    for i, j in itertools.combinations(range(k), 2):
        if not np.any(vectors[:, i] * vectors[:, j]):
            total = keys.get(np.packbits((vectors[:, i] + vectors[:, j]).astype(bool)).tobytes())
            if total is not None:
                composite.add(total)
                pairs.append((i, j))
    atoms = [j for j in range(k) if j not in composite]
    parent = {j: j for j in atoms}

    def root(j: int) -> int:
        while parent[j] != j:
            j = parent[j]
        return j

    for i, j in pairs:
        if i in parent and j in parent:
            parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for j in atoms:
        groups.setdefault(root(j), []).append(j)
    return {"atoms": atoms, "one_hot_groups": [g for g in groups.values() if len(g) > 1]}


# --------------------------------------------------------------------------- the adaptive attack


def attack_in_groups(
    z: np.ndarray,
    groups: np.ndarray,
    max_dim: int,
    *,
    bias: bool = True,
    rng: np.random.Generator | None = None,
    max_features: int = 8,
    **search: object,
) -> tuple[np.ndarray, np.ndarray]:
    """ye §5's adaptive step: (n, K) vectors and the (n,) mask of the rows they answer. Inside the rows that share
    a fabricated pattern the fabricated columns are constant (absorbed by the ones vector), so Algorithm 2 on the
    largest group lists the true features there (at most ``max_features``); each one's regression weights w carry
    to every other group, whose rows differ only by a constant offset (uᵀa), fitted per group as the shift that
    puts Zw closest to {0, 1}. Groups of one row are not covered (one row says nothing about its offset): their
    entries are 0, and the mask says so. No vector found in the largest group gives (n, 0).

    Raises NotApplicable when even the largest group is too small for Algorithm 2 (at most r rows): a give-up is
    never an answer to be scored."""
    rng = rng if rng is not None else np.random.default_rng()
    z = np.asarray(z, dtype=np.float64)
    labels, index = np.unique(groups, axis=0, return_inverse=True)
    index = index.reshape(-1)
    sizes = np.bincount(index, minlength=len(labels))
    rows = np.flatnonzero(index == int(np.argmax(sizes)))
    try:
        found = regression_search(z[rows], max_dim, bias=bias, rng=rng, **search)  # type: ignore[arg-type]
    except NotApplicable as exc:
        raise NotApplicable(
            f"no group of rows sharing a fabricated pattern is attackable: {len(labels)} groups, the largest has "
            f"{len(rows)} rows ({exc})"
        ) from exc
    covered = sizes[index] >= 2
    targets = found.vectors[:, :max_features]
    if targets.shape[1] == 0:
        return np.zeros((z.shape[0], 0)), covered
    design = np.hstack([z[rows], np.ones((len(rows), 1))]) if bias else z[rows]
    prediction = z @ np.linalg.lstsq(design, targets, rcond=None)[0][: z.shape[1]]
    x = np.zeros(prediction.shape)
    for members in np.split(np.argsort(index, kind="stable"), np.cumsum(sizes)[:-1]):
        if len(members) < 2:
            continue
        for j in range(x.shape[1]):
            values = prediction[members, j]
            shifts = np.linspace(-values.max(), 1 - values.min(), 512)  # every shift keeping a row in [0, 1]
            shifted = values[None, :] + shifts[:, None]
            cost = np.minimum(shifted**2, (shifted - 1) ** 2).sum(axis=1)
            x[members, j] = shifted[int(np.argmin(cost))] >= 0.5
    return x, covered


def _strip(z: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Z with the centred ``bits`` projected out of its centred columns: the span less the bits' directions."""
    if bits.shape[1] == 0:
        return z
    centred = bits - bits.mean(axis=0)
    return z - centred @ np.linalg.lstsq(centred, z - z.mean(axis=0), rcond=None)[0]


@dataclass
class PeelResult:
    """The fabricated bits peeled off (n, s) and the search over what was left (its vectors: the answer)."""

    bits: np.ndarray
    remaining: BinarySearchResult
    rounds: int


def peel_search(
    z: np.ndarray,
    d_passive: int,
    m: int,
    *,
    bias: bool = True,
    exact: float = 1e-6,
    max_rounds: int = 8,
    rng: np.random.Generator | None = None,
    **search: object,
) -> PeelResult:
    """Peel the fabricated bits off span(Z) round by round, then Algorithm 2 on the rest.

    Each round runs Algorithm 2 on Z with the bits found so far projected out (a span of dimension d_B + m − s,
    searched exhaustively once 2^r fits ``max_candidates``) and keeps every listed vector that is *exactly* in the
    original span (unexplained fraction ≤ ``exact`` there): projecting out the other bits left them near-binary,
    rounding restores them. Rounds stop when all m are found or a round finds none. The bits are PRF fair coins,
    so the most balanced m exact fits are taken for them and projected out; which exact fit is a bit and which a
    true feature exactly in the span (as without rank reduction) cannot be told apart, so every exact fit is also
    listed: the answer is the exact fits not taken for bits, then Algorithm 2's list over the stripped span (best
    fit first, less anything matching a peeled bit), then the m taken for bits.

    ``exact`` is the attack's own tolerance (an option: under announced noise no fit is exact, and the peel then
    finds no bit and says so through ``fabricated_m``)."""
    rng = rng if rng is not None else np.random.default_rng()
    z = np.asarray(z, dtype=np.float64)
    original = span_basis(z, d_passive + m, bias=bias)
    peeled = np.zeros((z.shape[0], 0))
    rounds, sampled = 0, None
    while peeled.shape[1] < m and rounds < max_rounds:
        rounds += 1
        found = regression_search(_strip(z, peeled), d_passive + m - peeled.shape[1], bias=bias, rng=rng, **search)
        sampled = sampled or (found.sampled and f"round {rounds}: {found.sampled}")
        candidates = found.vectors[:, _unexplained(original, found.vectors, bias) <= exact]
        new = [
            j for j in range(candidates.shape[1])
            if not peeled.shape[1] or binary_match(candidates[:, j : j + 1], peeled, complements=bias).max() < 0.99
        ]  # fmt: skip
        if not new:
            break
        peeled = np.hstack([peeled, candidates[:, new]])
    by_balance = np.argsort(np.abs(peeled.mean(axis=0) - 0.5), kind="stable")
    bits, exact_extra = peeled[:, by_balance[:m]], peeled[:, by_balance[m:]]
    rest = regression_search(_strip(z, bits), d_passive + m - bits.shape[1], bias=bias, rng=rng, **search)
    keep = [
        j for j in range(rest.vectors.shape[1])
        if not bits.shape[1] or binary_match(rest.vectors[:, j : j + 1], bits, complements=bias).max() < 0.99
    ]  # fmt: skip
    vectors = np.hstack([exact_extra, rest.vectors[:, keep], bits])
    scores = np.concatenate([np.zeros(exact_extra.shape[1]), rest.scores[keep], np.zeros(bits.shape[1])])
    sampled = sampled or (rest.sampled and f"the search after peeling: {rest.sampled}")
    return PeelResult(bits, BinarySearchResult(vectors, scores, rest.rank, sampled), rounds)


# --------------------------------------------------------------------------- metric


def binary_match(truth: np.ndarray, found: np.ndarray, *, complements: bool = False) -> np.ndarray:
    """(t, f): the fraction of rows on which true binary column i equals found vector j (or its complement)."""
    truth = np.asarray(truth, dtype=np.float64).reshape(len(truth), -1)
    found = np.asarray(found, dtype=np.float64).reshape(len(found), -1)
    if truth.shape[0] != found.shape[0]:
        raise ValueError(f"truth has {truth.shape[0]} rows, the found vectors {found.shape[0]}")
    agree = (truth.T @ found + (1 - truth).T @ (1 - found)) / truth.shape[0]
    return np.maximum(agree, 1 - agree) if complements else agree


def attack_accuracy(
    truth: np.ndarray,
    found: np.ndarray,
    *,
    complements: bool = False,
    one_hot: tuple[tuple[int, ...], ...] = (),
) -> float:
    """ye §6.3: max over the true binary features (and every non-empty sum of a one-hot group's columns) of
    the fraction of entries a found vector matches; with ``complements``, 1 − x counts as x."""
    truth = np.asarray(truth, dtype=np.float64).reshape(len(truth), -1)
    targets = [truth]
    for group in one_hot:
        for size in range(2, len(group) + 1):
            for subset in itertools.combinations(group, size):
                targets.append(truth[:, list(subset)].sum(axis=1, keepdims=True))
    if np.asarray(found).size == 0:
        return 0.0
    return float(binary_match(np.hstack(targets), found, complements=complements).max())


# --------------------------------------------------------------------------- the attacks


_NO_EMBEDDINGS = (
    "needs the passive embeddings z_B, which the active party never holds here (coordinator-top keeps them "
    "under CKKS and opens only the sum h = Σ h_p)"
)


def _embeddings(obs: Observations, name: str) -> np.ndarray:
    z = getattr(obs, "embeddings", None)
    if z is None:
        raise NotApplicable(f"{name} {_NO_EMBEDDINGS}")
    if np.shape(z)[0] != obs.n_samples:
        raise ValueError(f"embeddings have {np.shape(z)[0]} rows for {obs.n_samples} samples")
    return np.asarray(z, dtype=np.float64)


def _fabricated_from_chain(obs: Observations) -> int:
    """m of an announced masquerade step (Kerckhoffs: its public parameters are known); 1 if none.
    The default "log2n" is ⌈log₂ n⌉ of the passive party's rows, taken as the recorded rows here."""
    for step, params in (*obs.embedding_chain, *obs.param_chain, *obs.score_chain):
        if step == "masquerade" and "m" in params:
            m = params["m"]
            return math.ceil(math.log2(obs.n_samples)) if m == "log2n" else int(m)
    return 1


@register("ye_alg1")
class YeAlg1(Attack):
    """Algorithm 1: all binary vectors in the span of noise-free embeddings."""

    families = frozenset({"splitnn"})
    metric = "accuracy"

    def __init__(self, bias: bool = True, tol: float = 1e-6, max_rank: int = MAX_RANK) -> None:
        self.bias, self.tol, self.max_rank = bias, tol, max_rank

    def reconstruct(self, obs: Observations) -> Reconstruction:
        z = _embeddings(obs, self.name)
        found = enumerate_binary(z, obs.d_passive, bias=self.bias, tol=self.tol, max_rank=self.max_rank)
        return found.reconstruction(obs.d_passive)


@register("ye_alg2")
class YeAlg2(Attack):
    """Algorithm 2: leverage-score sampling, r = k + 1, best of ``restarts``; lists fits under ``threshold``."""

    families = frozenset({"splitnn"})
    metric = "accuracy"

    def __init__(
        self,
        restarts: int = 20,
        threshold: float = 0.05,
        bias: bool = True,
        screen_rows: int | None = 1024,
        seed: int | None = None,
        max_candidates: int = MAX_CANDIDATES,
    ) -> None:
        self.restarts, self.threshold, self.bias, self.screen_rows = restarts, threshold, bias, screen_rows
        self.seed = seed  # the attacker's own sampling; None draws fresh
        self.max_candidates = _positive("max_candidates", max_candidates)

    def reconstruct(self, obs: Observations) -> Reconstruction:
        z = _embeddings(obs, self.name)
        found = regression_search(
            z,
            obs.d_passive,
            bias=self.bias,
            restarts=self.restarts,
            threshold=self.threshold,
            screen_rows=self.screen_rows,
            rng=np.random.default_rng(self.seed),
            max_candidates=self.max_candidates,
        )
        return found.reconstruction(obs.d_passive)


class _AgainstMasquerade(Attack):
    """What the attacks on a masqueraded z_B share: m (the announced chain's unless given, Kerckhoffs) and the
    search's budget."""

    families = frozenset({"splitnn"})
    metric = "accuracy"

    def __init__(
        self,
        fabricated: int | None = None,
        restarts: int = 20,
        bias: bool = True,
        seed: int | None = None,
        max_candidates: int = MAX_CANDIDATES,
    ) -> None:
        self.fabricated, self.restarts, self.bias, self.seed = fabricated, restarts, bias, seed
        self.max_candidates = _positive("max_candidates", max_candidates)

    def _m(self, obs: Observations) -> int:
        return self.fabricated if self.fabricated is not None else _fabricated_from_chain(obs)


@register("ye_adaptive")
class YeAdaptive(_AgainstMasquerade):
    """ye §5 against masquerade with m fabricated bits (m from the announced chain unless given): Algorithm 2
    over a span of dimension d_B + m finds the fabricated bits first (they fit exactly), the rows are split by
    them, and the true feature is attacked inside the groups (:func:`attack_in_groups`).

    At large m the span exceeds ``max_candidates`` (2^(d_B + m + 1) labelings per restart): the bits are then
    searched among that many random labelings per restart (best effort, ``sampled`` in the result), and the
    groups they define hold about n / 2^m rows — ``largest_group`` says how many the attack had to work with."""

    def reconstruct(self, obs: Observations) -> Reconstruction:
        z = _embeddings(obs, self.name)
        m = self._m(obs)
        rng = np.random.default_rng(self.seed)
        everything = regression_search(
            z, obs.d_passive + m, bias=self.bias, restarts=self.restarts, threshold=1e-3, rng=rng,
            max_candidates=self.max_candidates,
        )  # fmt: skip
        # The exact fits (zero residual) include the fabricated columns; they are PRF fair coins (public), so among
        # exact fits the most balanced are taken for them (a binary feature that is exact too may come first else).
        exact = everything.vectors
        balance = np.abs(exact.mean(axis=0) - 0.5)
        bits = exact[:, np.argsort(balance, kind="stable")[:m]]
        if bits.shape[1] == 0:
            raise NotApplicable(f"{self.name} found none of the m = {m} fabricated bits to split the rows by")
        x, covered = attack_in_groups(
            z, bits, obs.d_passive, bias=self.bias, rng=rng, restarts=self.restarts, max_candidates=self.max_candidates
        )
        sizes = np.unique(bits, axis=0, return_counts=True)[1]
        # A true feature exactly in the span may be more balanced than a bit and taken for one: every exact fit is
        # listed after the answer from the groups (the bits cannot be told from such a feature).
        x = np.hstack([x, exact])
        result = BinarySearchResult(x, np.full(x.shape[1], np.nan), everything.rank, everything.sampled)
        # fabricated_m: the bits actually found (at most m); covered_rows: the share of rows in groups of >= 2 rows,
        # the only ones the answer speaks for (a row alone in its group gets 0).
        return result.reconstruction(
            obs.d_passive, fabricated_bits=bits.astype(np.uint8), fabricated_m=int(bits.shape[1]), groups=len(sizes),
            largest_group=int(sizes.max()), covered_rows=float(covered.mean()),
        )  # fmt: skip


@register("ye_peel")
class YePeel(_AgainstMasquerade):
    """Against masquerade at any m: peel the fabricated bits off the span (:func:`peel_search`), then Algorithm 2
    on the rest; ``threshold`` lists its fits as Algorithm 2's does, ``exact`` is what counts as a bit."""

    def __init__(
        self,
        fabricated: int | None = None,
        restarts: int = 20,
        threshold: float = 0.05,
        bias: bool = True,
        seed: int | None = None,
        max_candidates: int = MAX_CANDIDATES,
        exact: float = 1e-6,
    ) -> None:
        super().__init__(fabricated, restarts, bias, seed, max_candidates)
        self.threshold, self.exact = threshold, exact

    def reconstruct(self, obs: Observations) -> Reconstruction:
        z = _embeddings(obs, self.name)
        m = self._m(obs)
        peeled = peel_search(
            z, obs.d_passive, m, bias=self.bias, exact=self.exact, rng=np.random.default_rng(self.seed),
            restarts=self.restarts, threshold=self.threshold, max_candidates=self.max_candidates,
        )  # fmt: skip
        return peeled.remaining.reconstruction(
            obs.d_passive, fabricated_bits=peeled.bits.astype(np.uint8), fabricated_m=int(peeled.bits.shape[1]),
            peel_rounds=peeled.rounds,
        )  # fmt: skip


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value
