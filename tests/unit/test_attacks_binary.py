"""ye's binary feature reconstruction: Exact Cover instances (Theorem 2), planted binary columns, one-hot groups,
the adaptive attack against masquerade, the metric, and the coordinator-top refusal."""

from __future__ import annotations

import numpy as np
import pytest

from vflsec.services.attacks import NotApplicable, Observations, make_attack, run_attack
from vflsec.services.attacks.binary import (
    attack_accuracy,
    attack_in_groups,
    binary_match,
    enumerate_binary,
    one_hot_structure,
    peel_search,
    regression_search,
)
from vflsec.services.defenses.embeddings import binary_free_basis


def exact_cover_matrix(n: int, subsets: list[set[int]]) -> np.ndarray:
    """ye Theorem 2: Z = [I_{m+1}; Z_2; Z_3] has a nonzero binary vector in its span iff an exact cover exists."""
    m = len(subsets)
    z2 = np.array([[1.0 if i in s else 0.0 for s in subsets] + [-1.0] for i in range(n)])
    z3 = np.array([[2.0 * len(s) for s in subsets] + [-2.0 * n]])
    return np.vstack([np.eye(m + 1), z2, z3])


def test_exact_cover_instance_with_a_cover_yields_exactly_its_binary_vector() -> None:
    subsets = [{0, 1}, {2, 3}, {1, 2}, {0}, {3}]  # covers: {S0, S1} and {S2, S3, S4}
    z = exact_cover_matrix(4, subsets)
    found = enumerate_binary(z, z.shape[1], bias=False)
    covers = {frozenset(np.flatnonzero(v[: len(subsets)])) for v in found.vectors.T}
    assert covers == {frozenset({0, 1}), frozenset({2, 3, 4})}
    for v in found.vectors.T:  # each is Zw with w = (cover indicator, 1)
        assert v[len(subsets)] == 1 and np.all(v[len(subsets) + 1 :] == 0)


def test_exact_cover_instance_without_a_cover_yields_nothing() -> None:
    z = exact_cover_matrix(3, [{0, 1}, {1, 2}])
    assert enumerate_binary(z, z.shape[1], bias=False).vectors.shape[1] == 0


def planted(n: int, binary: int, continuous: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """z = W x + b for x = (binary columns, Gaussian columns), binaries stored standardised (ye §7)."""
    rng = np.random.default_rng(seed)
    bits = (rng.random((n, binary)) < rng.uniform(0.2, 0.6, binary)).astype(float)
    x = np.hstack([(bits - bits.mean(0)) / bits.std(0), rng.normal(size=(n, continuous))])
    return x @ rng.normal(size=(width, binary + continuous)).T + rng.normal(size=width), bits


def test_algorithm_1_recovers_every_planted_binary_column() -> None:
    z, bits = planted(3000, 6, 3, 12, seed=1)
    found = enumerate_binary(z, 9)
    assert np.all(binary_match(bits, found.vectors, complements=True).max(axis=1) == 1.0)
    assert found.rank == 10  # 9 features and the ones vector


@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_algorithm_2_finds_the_one_binary_column(sigma: float) -> None:
    z, bits = planted(20_000, 1, 7, 8, seed=2)
    z = z + np.random.default_rng(3).normal(scale=sigma, size=z.shape)
    found = regression_search(z, 8, restarts=10, rng=np.random.default_rng(4))
    assert attack_accuracy(bits, found.vectors[:, :1], complements=True) >= 0.99


def test_one_hot_group_shows_up_with_its_sums_and_is_regrouped() -> None:
    rng = np.random.default_rng(5)
    n = 4000
    category = rng.choice(4, size=n, p=[0.1, 0.2, 0.3, 0.4])
    one_hot = np.eye(4)[category]
    x = np.hstack([one_hot[:, :3], rng.normal(size=(n, 3))])  # the 4th indicator is 1 − the others: dropped
    z = x @ rng.normal(size=(8, 6)).T
    found = enumerate_binary(z, 6)
    # 15 non-empty subsets of 4 categories, paired with their complements by the ones vector: 7 distinct.
    assert found.vectors.shape[1] == 7
    structure = one_hot_structure(found.vectors)
    assert len(structure["one_hot_groups"]) == 1
    atoms = found.vectors[:, structure["one_hot_groups"][0]]
    assert np.all(binary_match(one_hot, atoms, complements=True).max(axis=1)[:3] == 1.0)
    assert attack_accuracy(one_hot, found.vectors, one_hot=((0, 1, 2, 3),)) == 1.0


def masqueraded(n: int, m: int, seed: int, rank_reduce: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """z = P [Q x; a] for one binary among 5 features, m fabricated fair bits a."""
    rng = np.random.default_rng(seed)
    truth = (rng.random(n) < 0.4).astype(float)
    x = np.column_stack([truth, rng.normal(size=(n, 4))])
    q = rng.normal(size=(4 if rank_reduce else 5, 5))
    a = (rng.random((n, m)) < 0.5).astype(float)
    p = rng.normal(size=(16, q.shape[0] + m))
    return np.hstack([x @ q.T, a]) @ p.T, truth, a


def test_adaptive_attack_beats_one_fabricated_bit_that_fools_the_plain_attack() -> None:
    z, truth, a = masqueraded(6000, 1, seed=6, rank_reduce=False)
    obs = Observations(np.zeros((6000, 1)), None, 2, 5, embeddings=z, param_chain=(("masquerade", {"m": "1"}),))
    adaptive = run_attack(make_attack("ye_adaptive", seed=0, restarts=8), obs)
    assert attack_accuracy(a, adaptive.meta["fabricated_bits"], complements=True) == 1.0
    assert attack_accuracy(truth[:, None], adaptive.meta["binary_features"], complements=True) >= 0.99
    assert adaptive.meta["fabricated_m"] == 1 and adaptive.meta["covered_rows"] == 1.0  # two groups, every row


def test_rank_reduced_masquerade_leads_the_plain_attack_to_the_fabricated_bit() -> None:
    z, truth, a = masqueraded(6000, 1, seed=7, rank_reduce=True)
    found = regression_search(z, 6, rng=np.random.default_rng(0))
    assert attack_accuracy(a, found.vectors[:, :1], complements=True) == 1.0
    assert attack_accuracy(truth[:, None], found.vectors[:, :1], complements=True) <= 0.6


def test_log2_n_fabricated_bits_leave_groups_too_small_to_attack() -> None:
    n = 2048
    z, _, a = masqueraded(n, 11, seed=8, rank_reduce=False)  # 2^11 = n patterns
    # Even handed the true bits the attack cannot run: it says why rather than answer zeros that score the majority.
    with pytest.raises(NotApplicable, match=r"no group .* is attackable: \d+ groups, the largest has [2-6] rows"):
        attack_in_groups(z, a, 5, rng=np.random.default_rng(0))


def collinear_masqueraded(n: int, m: int, seed: int, decorrelated: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """z = P [Q x; a] as under masquerade, Q of rank d_B − 1, where x's continuous columns track the binary one (as
    Bank's economic indicators track ``contact``). ``decorrelated``: Q keeps only directions uncorrelated with it."""
    rng = np.random.default_rng(seed)
    truth = (rng.random(n) < 0.4).astype(float)
    x = np.column_stack([truth, truth[:, None] + 0.3 * rng.normal(size=(n, 4))])
    # decorrelated: masquerade drop=binary's kept directions (free of column 0 and uncorrelated with it)
    q = binary_free_basis(x) if decorrelated else rng.normal(size=(4, 5))
    a = (rng.random((n, m)) < 0.5).astype(float)
    p = rng.normal(size=(q.shape[0] + m, q.shape[0] + m))
    return np.hstack([x @ q.T, a]) @ p.T, truth, a


@pytest.mark.parametrize("m", [1, 11])
def test_peeling_the_fabricated_bits_finds_a_feature_a_random_q_left_near_the_span(m: int) -> None:
    n = 2000  # m = 11 = ⌈log₂ n⌉: groups of about one row, so the adaptive attack has nothing to work with
    z, truth, a = collinear_masqueraded(n, m, seed=3, decorrelated=False)
    obs = Observations(np.zeros((n, 1)), None, 2, 5, embeddings=z, param_chain=(("masquerade", {"m": str(m)}),))
    plain = regression_search(z, 5 + m, rng=np.random.default_rng(0))
    assert attack_accuracy(truth[:, None], plain.vectors[:, :1], complements=True) <= 0.6  # fooled: a fabricated bit
    peeled = run_attack(make_attack("ye_peel", seed=0), obs)
    assert peeled.meta["fabricated_m"] == m
    assert attack_accuracy(a, peeled.meta["fabricated_bits"], complements=True) == 1.0
    # near the span, not in it: rows where the dropped direction matters round wrong (majority about 0.6)
    assert attack_accuracy(truth[:, None], peeled.meta["binary_features"][:, :1], complements=True) >= 0.95


def test_peeling_finds_nothing_when_q_keeps_only_directions_uncorrelated_with_the_binary_column() -> None:
    n, m = 2000, 11
    z, truth, _ = collinear_masqueraded(n, m, seed=3, decorrelated=True)
    obs = Observations(np.zeros((n, 1)), None, 2, 5, embeddings=z, param_chain=(("masquerade", {"m": str(m)}),))
    peeled = run_attack(make_attack("ye_peel", seed=0), obs)
    majority = max(truth.mean(), 1 - truth.mean())
    assert peeled.meta["fabricated_m"] == m  # the bits are still found: the span still holds them exactly
    assert attack_accuracy(truth[:, None], peeled.meta["binary_features"], complements=True) <= majority + 0.05


def test_peeling_takes_more_rounds_when_the_first_search_is_sampled() -> None:
    # span 4 + 16 + ones: 2^22 labelings per restart, 2^16 tried, so one round finds only some of the bits; each
    # later round searches a smaller span (exhaustive once 2^r ≤ 2^16) and finds the rest
    n, m = 3000, 16
    z, truth, a = collinear_masqueraded(n, m, seed=4, decorrelated=False)
    obs = Observations(np.zeros((n, 1)), None, 2, 5, embeddings=z, param_chain=(("masquerade", {"m": str(m)}),))
    peeled = run_attack(make_attack("ye_peel", seed=0, restarts=4, max_candidates=2**16), obs)
    assert peeled.meta["sampled"] is not None and peeled.meta["peel_rounds"] >= 2
    assert peeled.meta["fabricated_m"] == m
    assert attack_accuracy(a, peeled.meta["fabricated_bits"], complements=True) == 1.0
    assert attack_accuracy(truth[:, None], peeled.meta["binary_features"][:, :1], complements=True) >= 0.95
    # the later rounds are what finds the rest: stopped after one, the same search has not found them all
    one = peel_search(z, 5, m, max_rounds=1, rng=np.random.default_rng(0), restarts=4, max_candidates=2**16)
    assert one.bits.shape[1] < m


@pytest.mark.parametrize("name", ["ye_peel", "ye_adaptive"])
def test_a_true_feature_exactly_in_the_span_is_listed_even_when_it_is_more_balanced_than_the_bits(name: str) -> None:
    n, m = 2000, 1
    rng = np.random.default_rng(11)
    truth = np.zeros(n)
    truth[rng.permutation(n)[: n // 2]] = 1  # exactly balanced: the most balanced exact fit, ahead of the bit
    x = np.column_stack([truth, rng.normal(size=(n, 4))])
    a = (rng.random((n, m)) < 0.5).astype(float)
    z = np.hstack([x, a]) @ rng.normal(size=(5 + m, 5 + m)).T  # no rank reduction: the feature is in the span
    obs = Observations(np.zeros((n, 1)), None, 2, 5, embeddings=z, param_chain=(("masquerade", {"m": str(m)}),))
    result = run_attack(make_attack(name, seed=0), obs)
    assert attack_accuracy(truth[:, None], result.meta["binary_features"], complements=True) == 1.0


def test_metric_counts_matches_complements_and_one_hot_sums() -> None:
    truth = np.array([[1, 0], [1, 0], [0, 1], [0, 0]], dtype=float)
    found = np.array([[0], [0], [1], [0]], dtype=float)
    assert binary_match(truth, found).tolist() == [[0.25], [1.0]]
    assert attack_accuracy(truth[:, :1], found) == 0.25
    assert attack_accuracy(truth[:, :1], found, complements=True) == 0.75
    assert attack_accuracy(truth, np.array([[1], [1], [1], [0]], float), one_hot=((0, 1),)) == 1.0
    assert attack_accuracy(truth, np.zeros((4, 0))) == 0.0


@pytest.mark.parametrize("name", ["ye_alg1", "ye_alg2", "ye_adaptive", "ye_peel"])
def test_no_embeddings_is_not_applicable_with_the_reason(name: str) -> None:
    obs = Observations(np.zeros((10, 2)), np.full((10, 2), 0.5), 2, 3)
    with pytest.raises(NotApplicable, match="coordinator-top"):
        run_attack(make_attack(name), obs)


def test_span_beyond_max_rank_is_refused() -> None:
    z, _ = planted(500, 2, 10, 16, seed=9)
    with pytest.raises(NotApplicable, match="max_rank"):
        enumerate_binary(z, 12, max_rank=10)


def test_algorithm_2_beyond_its_candidate_bound_samples_instead_of_refusing() -> None:
    z, bits = planted(5000, 1, 10, 12, seed=9)  # span 11 + ones: 2^13 candidates per restart
    exhaustive = regression_search(z, 11, restarts=4, rng=np.random.default_rng(0))
    assert exhaustive.sampled is None
    sampled = regression_search(z, 11, restarts=20, max_candidates=2**10, rng=np.random.default_rng(0))
    assert sampled.sampled == "1024 of the 2^13 candidates per restart, drawn at random"
    # each restart hits the feature's labeling (or its complement) with probability ≈ 2 · 2^10 / 2^13
    assert attack_accuracy(bits, sampled.vectors[:, :1], complements=True) >= 0.99
    obs = Observations(np.zeros((5000, 1)), None, 2, 11, embeddings=z)
    found = run_attack(make_attack("ye_alg2", seed=0, max_candidates=2**10), obs)
    assert found.meta["sampled"].startswith("1024 of the 2^13")
    with pytest.raises(ValueError, match="max_candidates must be an integer >= 1"):
        make_attack("ye_adaptive", max_candidates=0)


def test_adaptive_attack_at_log2_n_bits_returns_its_best_effort_with_the_reason() -> None:
    n, m = 2048, 11
    z, truth, _ = masqueraded(n, m, seed=8, rank_reduce=False)  # span 5 + 11 + ones: 2^18 per restart
    obs = Observations(np.zeros((n, 1)), None, 2, 5, embeddings=z, param_chain=(("masquerade", {"m": "log2n"}),))
    result = run_attack(make_attack("ye_adaptive", seed=0, restarts=4, max_candidates=2**12), obs)
    assert result.meta["sampled"].startswith("4096 of the 2^18")
    assert 1 <= result.meta["fabricated_m"] <= m  # the bits it found (sampling misses some), not the m announced
    assert result.meta["largest_group"] <= n  # the groups the bits it found define
    assert result.meta["covered_rows"] > 0  # it ran inside a group: a result, not a give-up
    majority = max(truth.mean(), 1 - truth.mean())
    assert attack_accuracy(truth[:, None], result.meta["binary_features"], complements=True) <= majority + 0.05


def test_raw_residual_ranking_picks_e_under_noise_where_unexplained_fraction_picks_the_feature() -> None:
    """Why line 8 is ranked by 1 − R² here: e = [1, 0, …, 0] has raw residual ≤ 1, a noisy true feature n·σ²-ish."""
    z, bits = planted(8000, 1, 7, 8, seed=2)
    z = z + np.random.default_rng(3).normal(scale=0.05, size=z.shape)
    literal = regression_search(z, 8, restarts=5, literal=True, rng=np.random.default_rng(4))
    assert literal.vectors[:, 0].sum() == 1  # e (or its complement): a near-constant vector
    ranked = regression_search(z, 8, restarts=5, rng=np.random.default_rng(4))
    assert attack_accuracy(bits, ranked.vectors[:, :1], complements=True) >= 0.99


def test_the_default_attacks_include_the_adaptive_one_when_masquerade_is_announced() -> None:
    from vflsec.client.experiments.harness import default_attacks

    assert "ye_adaptive" not in default_attacks((), (), "splitnn")
    assert "ye_adaptive" not in default_attacks((), (), "splitnn", ["embedding_noise:sigma=0.1"])
    # Kerckhoffs: the announced masquerade calls for its attacker (ye §5), or the headline overstates the defense
    assert "ye_adaptive" in default_attacks((), (), "splitnn", ["masquerade:m=1"])
    assert "ye_adaptive" in default_attacks((), (), "splitnn", ["masquerade", "embedding_noise:sigma=0.1"])
    assert "ye_peel" in default_attacks((), (), "splitnn", ["masquerade:m=1"])  # the stronger one at large m


def test_the_harness_scores_ye_accuracy_against_one_hot_combinations_of_the_dataset() -> None:
    from vflsec.client.experiments.harness import binary_recovery, one_hot_groups

    names = ["age", "job=admin", "job=blue", "job=retired", "contact=telephone"]
    assert one_hot_groups(names) == ((1, 2, 3),)  # a two-category column is one indicator: no group
    rng = np.random.default_rng(0)
    job = np.eye(3)[rng.integers(0, 3, 400)]
    truth = np.column_stack([rng.random(400), job, rng.integers(0, 2, 400)])
    found = (job[:, 0] + job[:, 2])[:, None]  # admin or retired: a sum of the group's indicators
    plain = binary_recovery(truth, found)
    scored = binary_recovery(truth, found, one_hot_groups(names))
    assert plain["ye_accuracy"] < 0.9 and scored["ye_accuracy"] == 1.0
    assert scored["one_hot_groups"] == [[1, 2, 3]] and "one_hot_groups" not in plain
