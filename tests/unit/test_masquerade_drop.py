"""Masquerade's ``drop`` (issue 12): ye's random dropped direction leaves a binary column that the other columns nearly
rebuild within the span (UCI Bank's ``contact``); drop=binary keeps only directions uncorrelated with the binary
columns, so the best linear fit of one from the span is the constant: the majority rate."""

from __future__ import annotations

import stat

import numpy as np
import pytest

from vflsec.client.experiments.reproduce.ye_measure import (
    ls_ceiling,  # the least-squares ceiling of a binary column from the span
)
from vflsec.services.crypto import he
from vflsec.services.crypto.entropy import new_key
from vflsec.services.data.datasets import PartyData
from vflsec.services.defenses.embeddings import (
    EMBEDDING_STEPS,
    MAX_BINARY_R2,
    EmbeddingChain,
    Masquerade,
    binary_columns,
    binary_exposure,
    binary_free_basis,
)
from vflsec.services.engines.checkpoint import StateDir
from vflsec.services.engines.passive import PassiveParty, PassiveSession
from vflsec.services.registry import PluginError

N, D, M, DRAWS = 4000, 5, 4, 8


def _collinear(n: int = N, seed: int = 0) -> np.ndarray:
    """A binary column (30 % ones) that three continuous columns nearly rebuild: b ≈ c3 − c1 − c2 / 2."""
    rng = np.random.default_rng(seed)
    b = (rng.random(n) < 0.3).astype(np.float64)
    c1, c2, c4 = rng.normal(size=(3, n))
    return np.column_stack([b, c1, c2, c1 + 0.5 * c2 + b + 0.02 * rng.normal(size=n), c4])


def test_drop_binary_leaves_the_majority_rate_where_a_random_drop_leaves_the_column() -> None:
    x = _collinear()
    kept = binary_free_basis(x)
    # b correlated with the others: two constraints (leave b out, be uncorrelated with it), d_B − 2 directions
    assert kept.shape == (D - 2, D) and np.allclose(kept @ kept.T, np.eye(D - 2))
    assert np.abs(np.cov(x, rowvar=False)[:, 0] @ kept.T).max() < 1e-12  # every kept direction: uncorrelated
    assert np.abs(kept[:, 0]).max() < 1e-12  # and free of b itself
    majority = float(max(x[:, 0].mean(), 1 - x[:, 0].mean()))
    binary = [ls_ceiling(Masquerade(M).with_secret(new_key(), kept), x, x[:, 0]) for _ in range(DRAWS)]
    random = [ls_ceiling(Masquerade(M, drop="random").with_secret(new_key()), x, x[:, 0]) for _ in range(DRAWS)]
    print(f"\nLS recovery, n = {N}, d_B = {D}, m = {M}, {DRAWS} secrets: drop=binary {min(binary):.4f}-"
          f"{max(binary):.4f}, drop=random {min(random):.4f}-{max(random):.4f} (majority {majority:.4f})")  # fmt: skip
    assert all(abs(r - majority) <= 0.02 for r in binary)
    # ye's random direction: b lies within 0.02 of the span unless the dropped direction nearly contains the
    # collinearity (1.5 % of 400 draws below 0.95, the lowest 0.80): the median is the column
    assert np.median(random) >= 0.99


def test_a_block_without_binary_columns_drops_one_random_direction_exactly_as_drop_random() -> None:
    x = np.random.default_rng(1).normal(size=(300, D))
    assert len(binary_columns(x)) == 0 and np.array_equal(binary_free_basis(x), np.eye(D))
    secret = new_key()
    binary = Masquerade(M).with_secret(secret, binary_free_basis(x)).resolve(300)
    random = Masquerade(M, drop="random").with_secret(secret).resolve(300)
    assert np.array_equal(binary.projection(D), random.projection(D)) and binary.min_width(D) == D - 1 + M


def test_collinear_binary_columns_and_constants_count_once_and_q_keeps_the_random_modes_scale() -> None:
    rng = np.random.default_rng(2)
    b = (rng.random(500) < 0.5).astype(np.float64)
    x = np.column_stack([b, 1 - b, np.full(500, 3.0), rng.normal(size=(500, 37))])  # b and its complement, a constant
    assert binary_columns(x).tolist() == [0, 1]
    kept = binary_free_basis(x)
    # b and 1 − b: e_0, e_1 and Σ e_0 = −Σ e_1 (it also has small correlations with the normal columns): 3 constraints
    assert kept.shape == (40 - 3, 40)
    masquerade = Masquerade(M).with_secret(new_key(), kept).resolve(500)
    q = masquerade.projection(40)
    assert q.shape == (37, 40) and np.abs(np.cov(x, rowvar=False)[:, :2].T @ q.T).max() < 1e-12
    # Q = R K, K's rows orthonormal: R = Q Kᵀ, its entries U(±1/√(d_B − r)), and Q's rows have R's norms, whose
    # square is 1/3 in expectation as for ye's Q (U(±1/√d_B) entries); 1,521 entries: a relative sd of 2.3 %
    r = q @ kept.T
    assert np.allclose(r @ kept, q) and np.abs(r).max() <= 1 / np.sqrt(37)
    assert np.mean(np.sum(q**2, axis=1)) == pytest.approx(1 / 3, rel=0.15)


def test_drop_is_a_validated_public_parameter_and_rank_is_bounded_by_the_kept_directions() -> None:
    assert Masquerade().drop == "binary"  # the default
    assert EMBEDDING_STEPS.parse("masquerade:m=4,drop=random", family="splitnn").drop == "random"
    assert Masquerade(4, drop="random").public_params() == {"m": "4", "drop": "random"}
    with pytest.raises(PluginError, match="drop must be one of binary, random"):
        EMBEDDING_STEPS.parse("masquerade:drop=all")
    with pytest.raises(ValueError, match="drop must be one of binary, random; got 'all'"):
        Masquerade(drop="all")  # type: ignore[arg-type]
    x = _collinear(400)
    kept = binary_free_basis(x)
    with pytest.raises(ValueError, match=r"needs K.*masquerade_basis.npy: restore.*drop=random needs none"):
        Masquerade(M).resolve(400).projection(D)
    with pytest.raises(ValueError, match=r"K has shape \(3, 5\), expected \(kept, d_B = 6\)"):
        Masquerade(M).with_secret(new_key(), kept).resolve(400).min_width(6)
    with pytest.raises(ValueError, match="drop=binary: rank must be <= 3, the directions of the d_B = 5 columns"):
        Masquerade(M, rank=5).with_secret(new_key(), kept).resolve(400).build(D, 20, bias=False)
    assert Masquerade(M, rank=5, drop="random").with_secret(new_key()).resolve(400).min_width(D) == 5 + M
    low = Masquerade(M, rank=2).with_secret(new_key(), kept).resolve(400)
    assert low.projection(D).shape == (2, D) and low.public_params() == {"m": str(M), "rank": "2", "drop": "binary"}


def test_an_all_binary_block_is_refused_naming_its_columns_and_the_way_out(tmp_path) -> None:
    bits = (np.random.default_rng(3).random((200, 3)) < 0.5).astype(np.float64)
    with pytest.raises(ValueError, match=r"no direction of .* 3 columns .* \(flag, opt_in, member\).*drop=rand"):
        binary_free_basis(bits, ["flag", "opt_in", "member"])
    data = PartyData(np.array([f"r{i}" for i in range(200)]), bits, ["flag", "opt_in", "member"])
    with pytest.raises(ValueError, match="flag, opt_in, member"):
        _party(data, StateDir(tmp_path / "state"), "masquerade")
    assert _party(data, StateDir(tmp_path / "state"), "masquerade:drop=random").masquerade_basis is None


class _Coordinator:
    """The one call JoinSession makes to the coordinator: a plain session opened by "active"."""

    def public_context(self, session_id: str) -> tuple[str, bytes, str]:
        return "plain", he.make_keyholder("plain").public_context(), "active"


def _party(data: PartyData, state: StateDir, spec: str = f"masquerade:m={M}") -> PassiveParty:
    return PassiveParty("passive-1", data, _Coordinator(), state, allowed_backends=("plain",), embedding_release=[spec])


def _q(party: PassiveParty, session_id: str) -> np.ndarray:
    party.join(session_id, "plain", 2, {"topology": "active-top", "party": 1}, "active", "splitnn")
    return party.sessions[session_id].trainer.bottom.module.q.numpy()


def _shard(x: np.ndarray) -> PartyData:
    return PartyData(np.array([f"r{i}" for i in range(len(x))]), x, [f"b{j}" for j in range(x.shape[1])])


def test_k_is_kept_beside_the_secret_the_same_after_restarts_and_added_rows(tmp_path) -> None:
    x = _collinear(600)
    first = _party(_shard(x), StateDir(tmp_path / "state"))
    q = _q(first, "s1")
    file = tmp_path / "state" / "secrets" / "masquerade_basis.npy"
    assert stat.S_IMODE(file.stat().st_mode) == 0o600 and np.array_equal(np.load(file), first.masquerade_basis)
    assert np.abs(np.cov(x, rowvar=False)[:, 0] @ q.T).max() < 1e-12  # Q = R K: uncorrelated with the binary column
    grown = np.vstack([x, _collinear(300, seed=9)])  # the operator adds rows (same population: another sample)
    assert not np.allclose(binary_free_basis(grown), first.masquerade_basis)
    assert max(binary_exposure(grown, first.masquerade_basis).values()) < MAX_BINARY_R2  # 0.002: chance
    restarted = _party(_shard(grown), StateDir(tmp_path / "state"))
    assert np.array_equal(restarted.masquerade_basis, first.masquerade_basis)
    assert _q(restarted, "s2").tobytes() == q.tobytes()  # same secret, same K: the same Q in every session
    # a session checkpoint restores its own Q (from the layer's buffers), sized by the kept K
    s = restarted.sessions["s2"]
    again = PassiveSession.from_state(*s.to_state(), restarted.masquerade_basis)
    assert again.trainer.bottom.module.q.numpy().tobytes() == q.tobytes()
    assert np.array_equal(again.trainer.inference_share(x[:20]), s.trainer.inference_share(x[:20]))
    # the operator switches to ye's drop=random: its new sessions take the random Q, the checkpointed ones keep theirs
    switched = _party(_shard(grown), StateDir(tmp_path / "state"), f"masquerade:m={M},drop=random")
    assert switched.sessions["s1"].trainer.bottom.module.q.numpy().tobytes() == q.tobytes()
    assert _q(switched, "s3").shape == (D - 1, D) and not np.array_equal(_q(switched, "s4"), q)
    with pytest.raises(ValueError, match=r"masquerade_basis.npy: masquerade's K was made for 5 columns.* has 4"):
        _party(_shard(x[:, :4]), StateDir(tmp_path / "state"))
    drifted = _collinear(300, seed=10)
    drifted[:, 4] += 2 * drifted[:, 0]  # rows on which c4 follows b: the kept K now carries b (R² 0.077 > 0.03)
    with pytest.raises(ValueError, match=r"masquerade_basis.npy: masquerade's K no longer hides the binary column b0"):
        _party(_shard(np.vstack([x, drifted])), StateDir(tmp_path / "state"))
    memory = _party(_shard(x), StateDir(None))  # no folder: K from the shard, for the process
    assert np.array_equal(memory.masquerade_basis, binary_free_basis(x))


def test_a_checkpoint_written_before_drop_existed_restores_as_ye_random_drop() -> None:
    chain = EmbeddingChain.from_specs([f"masquerade:m={M},drop=random"]).for_session(N, secret=new_key())
    from vflsec.services.models.splitnn.trainers import FAMILY

    settings = FAMILY.settings({"topology": "active-top", "party": 1})
    trainer = FAMILY.new_passive(2, D, settings).defended(chain.module, chain.min_width(D))
    context = he.make_keyholder("plain").public_context()
    s = PassiveSession(
        backend=he.open_public("plain", context), public_context=context, n_classes=2, family="splitnn",
        trainer=trainer, mask_key=new_key(), owner="active", share_mask_key=new_key(), embedding=chain,
    )  # fmt: skip
    arrays, meta = s.to_state()
    assert meta["embedding_release"] == [f"masquerade:m={M},drop=random"]
    meta["embedding_release"] = [f"masquerade:m={M}"]  # as the code before drop wrote it
    restored = PassiveSession.from_state(arrays, meta)  # no K needed: rank d_B − 1, Q from the buffers
    assert restored.embedding.masquerade is not None and restored.embedding.masquerade.drop == "random"
    assert restored.trainer.bottom.module.q.numpy().tobytes() == trainer.bottom.module.q.numpy().tobytes()
