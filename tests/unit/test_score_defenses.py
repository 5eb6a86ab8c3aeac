"""Score-release defenses: argmax/ranking guarantees, the rounding rule, noise calibration, spec validation."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import rankdata

from vflsec.services.defenses import scores as sd
from vflsec.services.defenses.release import ReleaseConfigError, ReleaseContext, ScoreReleaseChain
from vflsec.services.models.lr import confidence_scores, softmax

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def logit_batches(draw: st.DrawFn, k_min: int = 2, k_max: int = 1000) -> np.ndarray:
    """(n, K) logits; a coarse grid (sometimes) makes exact ties, including ties for the top class."""
    k = draw(st.integers(k_min, k_max))
    n = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    z = rng.normal(scale=draw(st.sampled_from([0.1, 1.0, 4.0, 20.0])), size=(n, k))
    grid = draw(st.sampled_from([None, None, 0.5, 3.0]))
    if grid is not None:
        z = np.round(z / grid) * grid
    if draw(st.booleans()):  # a duplicated top class in the first row
        z[0, rng.integers(k)] = z[0].max()
    return z


def context(n_classes: int, seed: int = 0, passive: dict[str, np.ndarray] | None = None) -> ReleaseContext:
    return ReleaseContext(rng=np.random.default_rng(seed), n_classes=n_classes, passive_weights=passive or {})


def release(spec: str, scores: np.ndarray, logits: np.ndarray | None = None, **kwargs: object) -> np.ndarray:
    chain = ScoreReleaseChain.from_specs([spec])
    return chain(scores, scores if logits is None else logits, context(scores.shape[1], **kwargs))


def assert_same_ranking(raw: np.ndarray, released: np.ndarray) -> None:
    """Equal raw scores stay equal and strictly ordered ones stay strictly ordered, row by row."""
    order = np.argsort(raw, axis=1, kind="stable")
    raw_sorted = np.take_along_axis(raw, order, axis=1)
    out_sorted = np.take_along_axis(released, order, axis=1)
    raw_step, out_step = np.diff(raw_sorted, axis=1), np.diff(out_sorted, axis=1)
    assert np.all(out_step[raw_step == 0] == 0), "a tie was broken"
    assert np.all(out_step[raw_step > 0] > 0), "the order of two scores changed"


def assert_argmax_unchanged(raw: np.ndarray, released: np.ndarray) -> None:
    assert released.shape == raw.shape
    np.testing.assert_array_equal(released.argmax(axis=1), raw.argmax(axis=1))
    assert sd.argmax_agreement(raw, released) == 1.0


# --------------------------------------------------------------------------- argmax and ranking

ORDER_KEEPING = [
    "privee:epsilon=0.1",
    "privee:epsilon=0.05,basis=identity,per=batch",
    "privee_pp:epsilons=0.05:0.1",
    "privee_pp:epsilons=0.02;0.5;0.9,per=batch",
    "rank_only",
]


@pytest.mark.parametrize(
    "spec", [*ORDER_KEEPING, "privee:epsilon=0.1,basis=householder", "privee:epsilon=0.1,preset=authors", "label_only"]
)
@FAST
@given(z=logit_batches(), seed=st.integers(0, 2**16))
def test_argmax_unchanged(spec: str, z: np.ndarray, seed: int) -> None:
    scores = softmax(z)
    assert_argmax_unchanged(scores, release(spec, scores, seed=seed))


@pytest.mark.parametrize("spec", ORDER_KEEPING)
@FAST
@given(z=logit_batches(), seed=st.integers(0, 2**16))
def test_full_ranking_preserved_including_ties(spec: str, z: np.ndarray, seed: int) -> None:
    scores = softmax(z)
    assert_same_ranking(scores, release(spec, scores, seed=seed))


@FAST
@given(z=logit_batches(), seed=st.integers(0, 2**16))
def test_householder_is_identity_shifted_by_a_public_constant(z: np.ndarray, seed: int) -> None:
    # A = I − (2/K)·11ᵀ: p = c·(1 + s) − (2/K)·Σc with the very same draws as the identity basis.
    scores = softmax(z)
    k = scores.shape[1]
    identity = release("privee:epsilon=0.1", scores, seed=seed)
    householder = release("privee:epsilon=0.1,basis=householder", scores, seed=seed)
    np.testing.assert_allclose(householder, identity - 2.0 / k * scores.sum(axis=1, keepdims=True), atol=1e-12)
    # Ties stay ties and the order never reverses (float64 may merge scores far below 2/K, never reorder).
    order = np.argsort(scores, axis=1, kind="stable")
    steps = np.diff(np.take_along_axis(householder, order, axis=1), axis=1)
    raw_steps = np.diff(np.take_along_axis(scores, order, axis=1), axis=1)
    assert np.all(steps >= 0) and np.all(steps[raw_steps == 0] == 0)


@FAST
@given(z=logit_batches(k_max=300), seed=st.integers(0, 2**16), epsilon=st.floats(0.01, 5.0))
def test_privee_multiplier_lies_in_the_rank_sub_interval(z: np.ndarray, seed: int, epsilon: float) -> None:
    """(p/c − 1)/σ is u, drawn from the sub-interval [U·j/K, U·(j+1)/K) of the tie group's first position j."""
    scores = softmax(z)
    k = scores.shape[1]
    released = release(f"privee:epsilon={epsilon}", scores, seed=seed)
    sigma = sd.gaussian_sigma(epsilon, 1e-5, 0.1)
    order = np.argsort(scores, axis=1, kind="stable")
    c_sorted = np.take_along_axis(scores, order, axis=1)
    u = (np.take_along_axis(released, order, axis=1) / c_sorted - 1.0) / sigma
    group_start = np.array([np.searchsorted(row, row, side="left") for row in c_sorted])
    resolved = c_sorted > 1e-200  # p/c of (sub)normal-tiny scores carries no precision
    tolerance = 1e-9 * (1 + 3 * sigma) / sigma
    assert np.all(u[resolved] >= (3.0 * group_start / k - tolerance)[resolved])
    assert np.all(u[resolved] < (3.0 * (group_start + 1) / k + tolerance)[resolved])


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=60),
    seed=st.integers(0, 2**16),
    near=st.booleans(),
)
def test_rank_only_matches_competition_ranks(values: list[float], seed: int, near: bool) -> None:
    # Negative values and scores one ulp apart take the exact-sort fallback of the packed-key sort.
    row = np.array(values)
    if near:
        row = np.concatenate([row, np.nextafter(row, np.inf), row])
    batch = np.random.default_rng(seed).permuted(np.tile(row, (3, 1)), axis=1)
    expected = np.array([(rankdata(r, method="max") - 1) / r.size for r in batch])
    np.testing.assert_array_equal(release("rank_only", batch), expected)


@settings(max_examples=30, deadline=None)
@given(z=logit_batches(k_max=200), seed=st.integers(0, 2**16))
def test_privee_orders_scores_one_ulp_apart(z: np.ndarray, seed: int) -> None:
    base = softmax(z)
    scores = np.random.default_rng(seed).permuted(np.hstack([base, np.nextafter(base, 1.0)]), axis=1)
    assert_same_ranking(scores, release("privee:epsilon=0.1", scores, seed=seed))


def test_privee_draws_per_vector_or_per_batch() -> None:
    row = softmax(np.random.default_rng(1).normal(size=(1, 50)))
    batch = np.repeat(row, 4, axis=0)
    per_batch = release("privee:epsilon=0.1,per=batch", batch)
    per_vector = release("privee:epsilon=0.1,per=vector", batch)
    assert np.all(per_batch == per_batch[0])  # one A_pert for the whole batch
    assert len({tuple(r) for r in per_vector}) == 4  # a fresh u for every released vector


def test_privee_rejects_negative_scores() -> None:
    chain = ScoreReleaseChain.from_specs(["privee:epsilon=0.1"])
    with pytest.raises(ValueError, match="non-negative"):
        chain(np.array([[0.5, -0.1, 0.6]]), np.zeros((1, 3)), context(3))


def test_privee_pp_budget_per_rank() -> None:
    step = sd.PriveePlusPlus(epsilons="0.05:0.1")
    np.testing.assert_allclose(step._epsilons_by_rank(4), [0.0625, 0.075, 0.0875, 0.1])  # (a, b], top first
    listed = sd.PriveePlusPlus(epsilons="0.05;0.1")
    np.testing.assert_allclose(listed._epsilons_by_rank(3), [0.05, 0.075, 0.1])
    for k in (2, 7, 1000):  # the top class gets the smallest ε, so σ grows with the score
        assert np.all(np.diff(step.sigma_ascending(k)) >= 0)
        assert np.all(np.diff(listed.sigma_ascending(k)) >= 0)
    np.testing.assert_allclose(sd.Privee(epsilon=0.1).sigma_ascending(5), 4.8448, rtol=1e-4)


@pytest.mark.parametrize("k", [2, 5, 10])
def test_privee_authors_preset_is_the_authors_code(k: int) -> None:
    # The authors' mechanism written out: A_pert = I − (2/K)·11ᵀ + diag(σ ⊙ u), one u for the whole call,
    # u_i ~ U[i·U/K, (i + 1)·U/K) at ascending position i; DP++: ε_i = 0.05 + 0.05·(i + 1)/K, U = 1.
    scores = softmax(np.random.default_rng(k).normal(scale=2.0, size=(6, k)))
    for spec, upper in (("privee:epsilon=0.1,preset=authors", 3.0), ("privee_pp:preset=authors", 1.0)):
        step = ScoreReleaseChain.from_specs([spec]).describe()[0][1]
        announced = (step["preset"], step["basis"], step["per"], step["U"])
        assert announced == ("authors", "householder", "batch", str(upper))
        r = np.random.default_rng(3).random((1, k))[0]  # the draw the step makes from this seed
        u = (np.arange(k) + r) * upper / k
        eps = np.full(k, 0.1) if spec.startswith("privee:") else 0.05 + 0.05 * np.arange(1, k + 1) / k
        a_pert = np.eye(k) - 2.0 / k + np.diag(0.48448 / eps * u)
        order = np.argsort(scores, axis=1)
        expected = np.empty_like(scores)
        np.put_along_axis(expected, order, np.take_along_axis(scores, order, axis=1) @ a_pert.T, axis=1)
        np.testing.assert_allclose(release(spec, scores, seed=3), expected, rtol=1e-4, atol=1e-12)


def test_privee_pp_authors_budgets_can_swap_close_scores() -> None:
    # σ falls with the score in the authors' DP++, so adjacent ranks' multipliers overlap: two top scores
    # 1 % apart swap for some draws. The rank-safe default never swaps them.
    scores = np.array([[0.05] * 8 + [0.298, 0.302]])
    swaps = {
        params: sum(release(f"privee_pp:{params}", scores, seed=seed)[0].argmax() != 9 for seed in range(200))
        for params in ("per=batch", "preset=authors")
    }
    assert swaps["per=batch"] == 0 and 0 < swaps["preset=authors"] < 200


def test_row_blocks_match_the_single_block(monkeypatch: pytest.MonkeyPatch) -> None:
    scores = softmax(np.random.default_rng(2).normal(size=(9, 40)))
    for spec in ("privee:epsilon=0.2", "rank_only"):
        serial = release(spec, scores, seed=5)
        monkeypatch.setattr(sd, "_PARALLEL_MIN_ENTRIES", 1)
        monkeypatch.setattr(sd, "_workers", lambda: 3)
        parallel = release(spec, scores, seed=5)
        monkeypatch.undo()
        np.testing.assert_array_equal(parallel, serial)


# --------------------------------------------------------------------------- PPS-B


def passive_blocks(rng: np.random.Generator, k_logits: int, parties: int) -> dict[str, np.ndarray]:
    return {f"p{i}": rng.normal(size=(k_logits, int(rng.integers(1, 12)))) for i in range(parties)}


def dense_a_pinv_j(passive: dict[str, np.ndarray]) -> np.ndarray:
    """A⁺J built literally from eq. (4) (binary sigmoid: the one-row system W x = logit)."""
    w = np.hstack([passive[p] for p in passive])
    if w.shape[0] == 1:
        return np.linalg.pinv(w)
    k = w.shape[0]
    j = np.zeros((k - 1, k))
    j[np.arange(k - 1), np.arange(k - 1)], j[np.arange(k - 1), np.arange(1, k)] = -1.0, 1.0
    return np.linalg.pinv(j @ w) @ j


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 200), parties=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_pps_b_direction_attains_theorem_4(k: int, parties: int, seed: int) -> None:
    passive = passive_blocks(np.random.default_rng(seed), k, parties)
    v1 = sd.pps_b_direction(passive)
    b = dense_a_pinv_j(passive)
    assert v1.shape == (k,)
    assert math.isclose(np.linalg.norm(v1), 1.0, rel_tol=1e-9)
    assert abs(v1.sum()) < 1e-8  # J·1 = 0: a shift of every logit is invisible, so v_1 ⟂ 1
    np.testing.assert_allclose(np.linalg.norm(b @ v1), np.linalg.norm(b, 2), rtol=1e-8)  # ‖A⁺J v_1‖ = σ_1
    assert v1[np.flatnonzero(np.abs(v1) >= np.abs(v1).max() * (1 - 1e-9))[0]] > 0  # deterministic sign
    reordered = {p: passive[p][:, ::-1] for p in reversed(list(passive))}  # party / column order is moot
    np.testing.assert_allclose(sd.pps_b_direction(reordered), v1, atol=1e-8)


@pytest.mark.parametrize("scheme,alpha", [(1, 4.0), (2, 4.0), (2, 400.0), (3, 0.5), (3, 0.95)])
@FAST
@given(z=logit_batches(), seed=st.integers(0, 2**16))
def test_pps_b_keeps_argmax_multiclass(scheme: int, alpha: float, z: np.ndarray, seed: int) -> None:
    scores = softmax(z)
    passive = passive_blocks(np.random.default_rng(seed), z.shape[1], 2)
    released = release(f"pps_b:scheme={scheme},alpha={alpha}", scores, z, passive=passive)
    assert_argmax_unchanged(scores, released)
    np.testing.assert_allclose(released.sum(axis=1), 1.0)


@pytest.mark.parametrize("scheme", [1, 2, 3])
@FAST
@given(z=st.lists(st.floats(-30, 30), min_size=1, max_size=40), seed=st.integers(0, 2**16))
def test_pps_b_keeps_argmax_binary_sigmoid(scheme: int, z: list[float], seed: int) -> None:
    logits = np.array(z)[:, None]
    scores = confidence_scores(logits)  # [1 − p, p]
    passive = passive_blocks(np.random.default_rng(seed), 1, 2)
    released = release(f"pps_b:scheme={scheme},alpha=0.9", scores, logits, passive=passive)
    assert_argmax_unchanged(scores, released)


@settings(max_examples=20, deadline=None)
@given(k=st.integers(3, 40), seed=st.integers(0, 2**16), alpha=st.floats(0.01, 9.0))
def test_pps_b_perturbs_as_the_paper_says(k: int, seed: int, alpha: float) -> None:
    """Log-ratios of released non-top classes follow eqs. (92)-(94) and scheme 3 exactly."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(5, k))
    scores = softmax(z)
    passive = passive_blocks(rng, k, 2)
    v1 = sd.pps_b_direction(passive)
    top = scores.argmax(axis=1)
    for scheme in (1, 2, 3):
        a = alpha / 10 if scheme == 3 else alpha
        released = release(f"pps_b:scheme={scheme},alpha={a}", scores, z, passive=passive)
        for row in range(5):
            others = np.flatnonzero(np.arange(k) != top[row])
            n_tilde = np.where(np.arange(k) == top[row], v1.max(), v1)
            expected = {
                1: z[row] + math.sqrt(a) * n_tilde / np.linalg.norm(n_tilde),
                2: z[row] + math.sqrt(a) * v1,
                3: (1 - a) * z[row],
            }[scheme]
            got = np.log(released[row, others])
            np.testing.assert_allclose(got - got[0], expected[others] - expected[others][0], atol=1e-9)
            if scheme == 2:  # eq. (94): the top takes max z'; where that ties it, the public gap lifts it
                shifted = expected[others].max()
                lift = math.sqrt(a) * (v1.max() - v1.min()) if shifted >= expected[top[row]] else 0.0
                top_logit = max(expected[top[row]], shifted + lift)
                margin = np.log(released[row, top[row]]) - np.log(released[row, others]).max()
                np.testing.assert_allclose(margin, top_logit - shifted, atol=1e-9)


@pytest.mark.parametrize("scheme", [1, 2, 3])
def test_pps_b_float_guard_keeps_a_one_ulp_top(scheme: int) -> None:
    # The raw top leads by ~1 ulp; scaling by 1 − α (or adding noise of order 1) rounds the lead away.
    z = np.array([[0.0, 3e-16], [3e-16, 0.0], [1.0, 1.0 + 2.3e-16]])
    scores = softmax(z)
    assert np.all(scores[:, 0] != scores[:, 1])
    passive = {"p": np.array([[0.0, 1.0], [2.0, 0.5]])}
    released = release(f"pps_b:scheme={scheme},alpha=0.9", scores, z, passive=passive)
    assert_argmax_unchanged(scores, released)


def test_pps_b_caches_v1_and_needs_passive_weights() -> None:
    rng = np.random.default_rng(3)
    z = rng.normal(size=(4, 5))
    passive = passive_blocks(rng, 5, 1)
    ctx = context(5, passive=passive)
    step = sd.PpsB(alpha=1.0, scheme=2)
    step(softmax(z), z, ctx)
    np.testing.assert_array_equal(ctx.cache["pps_b.v1"], sd.pps_b_direction(passive))
    with pytest.raises(ValueError, match="passive weight"):
        step(softmax(z), z, context(5))


def test_pps_b_must_be_the_first_score_step() -> None:
    with pytest.raises(ReleaseConfigError, match="first score step"):
        ScoreReleaseChain.from_specs(["rounding:decimals=2", "pps_b:alpha=1"])
    assert len(ScoreReleaseChain.from_specs(["pps_b:alpha=1", "rounding:decimals=2"]).steps) == 2


# --------------------------------------------------------------------------- rounding


def floor_oracle(x: float, decimals: int) -> float:
    """The largest float of the grid {k/10^b} not above x, in exact rational arithmetic."""
    k = math.floor(Fraction(x) * 10**decimals)
    above = float(Fraction(k + 1, 10**decimals))  # the next grid point can round down onto x itself
    return above if above <= x else float(Fraction(k, 10**decimals))


@FAST
@given(z=logit_batches(k_max=40), decimals=st.integers(0, 8))
def test_rounding_floors_exactly(z: np.ndarray, decimals: int) -> None:
    scores = softmax(z)
    released = release(f"rounding:decimals={decimals}", scores)
    expected = np.vectorize(floor_oracle)(scores, decimals)
    np.testing.assert_array_equal(released, expected)
    assert np.all(released <= scores)


@FAST
@given(z=logit_batches(), decimals=st.integers(0, 4))
def test_rounding_ties_are_counted_not_hidden(z: np.ndarray, decimals: int) -> None:
    scores = softmax(z)
    released = release(f"rounding:decimals={decimals}", scores)
    scale = 10.0**decimals
    grid_index = np.round(released * scale)
    np.testing.assert_array_equal(released, grid_index / scale)  # on the grid
    assert np.all(released <= scores)  # down ...
    assert np.all((grid_index + 1) / scale > scores)  # ... to the nearest grid point
    n, k = scores.shape
    expected_ties = sum(k - np.unique(np.round(row * scale)).size for row in released)
    assert sd.count_ties(released) == expected_ties
    assert sd.count_ties(released) >= sd.count_ties(scores)  # flooring can only merge scores
    assert sd.count_ties(released) >= n * max(0, k - (int(scale) + 1))  # pigeonhole on the 10^b + 1 values


def test_rounding_examples() -> None:
    scores = np.array([[0.29, 0.71], [0.15, 0.85], [0.999, 0.001]])
    np.testing.assert_array_equal(release("rounding:decimals=2", scores), [[0.29, 0.71], [0.15, 0.85], [0.99, 0.0]])
    np.testing.assert_array_equal(release("rounding:decimals=1", scores), [[0.2, 0.7], [0.1, 0.8], [0.9, 0.0]])
    np.testing.assert_array_equal(release("rounding:decimals=0", scores), np.zeros((3, 2)))


# --------------------------------------------------------------------------- Gaussian noise


def test_gaussian_sigma_calibration() -> None:
    # The authors' Δf = 0.1, δ = 1e-5 give σ = 0.48448/ε (defenses-notes.md).
    for epsilon in (0.05, 0.1, 1.0):
        assert math.isclose(sd.GaussianNoise(epsilon=epsilon).sigma, 0.48448 / epsilon, rel_tol=1e-4)
    assert math.isclose(sd.gaussian_sigma(2.0, 0.01, 1.0), math.sqrt(2 * math.log(125)) / 2.0)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), epsilon=st.sampled_from([0.5, 2.0, 10.0]))
def test_gaussian_noise_has_the_calibrated_variance(seed: int, epsilon: float) -> None:
    scores = softmax(np.random.default_rng(seed).normal(size=(400, 250)))
    noise = release(f"gaussian:epsilon={epsilon}", scores, seed=seed) - scores
    sigma, count = sd.gaussian_sigma(epsilon, 1e-5, 0.1), noise.size
    # 100,000 draws: the sample variance has relative s.d. √(2/N) ≈ 0.45 %; 3 % is over six of them.
    assert abs(noise.var() / sigma**2 - 1.0) < 0.03
    assert abs(noise.mean()) < 6 * sigma / math.sqrt(count)


# --------------------------------------------------------------------------- label-only / rank-only / reports


def test_label_only_and_rank_only_values() -> None:
    scores = np.array([[0.1, 0.6, 0.3, 0.0], [0.4, 0.1, 0.4, 0.1]])
    np.testing.assert_array_equal(release("label_only", scores), [[0, 1, 0, 0], [1, 0, 0, 0]])
    # (K − rank)/K with rank 1 = top; tied scores share the best rank.
    np.testing.assert_array_equal(release("rank_only", scores), [[0.25, 0.75, 0.5, 0.0], [0.75, 0.25, 0.75, 0.25]])


def test_report_helpers() -> None:
    assert sd.count_ties(np.array([[1.0, 1.0, 1.0, 2.0], [3.0, 2.0, 1.0, 0.0]])) == 2
    raw = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    assert sd.argmax_agreement(raw, raw[:, ::-1]) == 0.0
    assert sd.argmax_agreement(raw, np.array([[0, 1], [1, 0], [1, 0], [0, 1]])) == 0.5


# --------------------------------------------------------------------------- specs and composition


@pytest.mark.parametrize(
    "spec",
    [
        "no_such_step",
        "privee",  # epsilon is required
        "privee:epsilon=abc",
        "privee:epsilon=0",
        "privee:epsilon=-1",
        "privee:epsilon=inf",
        "privee:epsilon=0.1,delta=1",
        "privee:epsilon=0.1,basis=fisip",
        "privee:epsilon=0.1,per=row",
        "privee:epsilon=0.1,colour=red",
        "privee:epsilon=0.1,preset=paper",
        "privee:epsilon=0.1,preset=authors,basis=identity",  # the preset fixes the basis ...
        "privee_pp:preset=authors,per=vector",  # ... and one draw per batch
        "privee_pp:epsilons=0.1:0.05",
        "privee_pp:epsilons=0.1;0.05",
        "privee_pp:epsilons=0:0.1",
        "gaussian:epsilon=nan",
        "rounding",  # decimals is required
        "rounding:decimals=-1",
        "rounding:decimals=1.5",
        "rounding:decimals=99",
        "pps_b:alpha=1,scheme=4",
        "pps_b:alpha=-1",
        "pps_b:alpha=1,scheme=3",
        "label_only:k=1",
        "privee:epsilon",
    ],
)
def test_bad_specs_fail_at_configuration_time(spec: str) -> None:
    with pytest.raises(ReleaseConfigError):
        ScoreReleaseChain.from_specs([spec])


def test_composition_keeps_shapes_and_order() -> None:
    scores = softmax(np.random.default_rng(4).normal(size=(7, 12)))
    chain = ScoreReleaseChain.from_specs(["privee:epsilon=0.1", "rounding:decimals=3"])
    released = chain(scores, scores, context(12))
    assert released.shape == scores.shape
    assert [name for name, _ in chain.describe()] == ["privee", "rounding"]
    np.testing.assert_array_equal(released, np.round(released * 1000) / 1000)  # the last step's grid


SPECS_WITH_DRAWS = [
    "privee:epsilon=0.1",
    "privee_pp:epsilons=0.05:0.1,per=batch",
    "gaussian:epsilon=1",
    "rounding:decimals=2",
    "pps_b:alpha=2,scheme=1",
    "label_only",
    "rank_only",
]


@pytest.mark.parametrize("spec", SPECS_WITH_DRAWS)
def test_public_params_never_hold_random_draws(spec: str) -> None:
    rng = np.random.default_rng(6)
    z = rng.normal(size=(5, 8))
    chain = ScoreReleaseChain.from_specs([spec])
    before = chain.describe()
    passive = passive_blocks(rng, 8, 1)
    for seed in (1, 2):
        chain(softmax(z), z, context(8, seed=seed, passive=passive))
    assert chain.describe() == before  # nothing drawn was stored on the step
    params = before[0][1]
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in params.items())
    # Every draw the step could have made with these seeds (uniform and normal streams) is absent.
    draws: set[str] = set()
    for seed in (1, 2):
        draws |= {str(v) for v in np.random.default_rng(seed).random(40)}
        draws |= {str(v) for v in np.random.default_rng(seed).normal(size=40)}
    assert not draws & set(params.values())
    assert "v1" not in params and "u" not in params
