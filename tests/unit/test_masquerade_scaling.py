"""A masquerade party's scaling and column order are kept with its long-term secret (review 8b H1, L2; issue 12).

Q is fixed in scaled units: had the party refit its scaler when the operator added rows (a new min-max extreme; any
change for standard), or taken its columns in another order, the same raw row would reach the bottom as another x, Q
would act as another projection of the raw rows, and the bits (a PRF of the scaled row) would change: two sessions
over the same rows, stacked, would span x. The scaler is fitted at the first start and kept beside the secret."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from tests.unit.test_masquerade_drop import _collinear, _party, _q
from vflsec.services.app import load_party_data
from vflsec.services.config import DataConfig, ServiceConfig, TlsConfig
from vflsec.services.data import datasets
from vflsec.services.engines.checkpoint import StateDir

COLUMNS = ["flag", "c1", "c2", "c3", "c4"]  # _collinear's: flag ≈ c3 − c1 − c2 / 2 (binary, 30 % ones)
RAW_UNITS = np.array([1.0, 40.0, 3.0, 250.0, 12.0]), np.array([0.0, 18.0, -5.0, 1000.0, 60.0])  # scale, offset


def _raw(n: int, seed: int) -> np.ndarray:
    scale, offset = RAW_UNITS
    return _collinear(n, seed) * scale + offset


def _config(tmp_path: Path, raw: np.ndarray, *, scaling: str = "minmax", columns: tuple[str, ...] = (),
            embedding: tuple[str, ...] = ("masquerade:m=4",)) -> ServiceConfig:  # fmt: skip
    """A passive party's config over a shard of ``raw`` rows r0, r1, … (written afresh: the operator's file)."""
    path = tmp_path / "shard.csv"
    datasets.write_party_csv(path, [f"r{i}" for i in range(len(raw))], raw, COLUMNS)
    tls = TlsConfig(Path("ca.pem"), Path("cert.pem"), Path("key.pem"))  # never read here
    return ServiceConfig("passive", "passive-1", "127.0.0.1:0", tls, data=DataConfig(path, columns, scaling),
                         embedding_release=embedding, state_dir=tmp_path / "state")  # fmt: skip


def _span(party, session_id: str, x: np.ndarray) -> np.ndarray:
    """What a session's z_B = P [Q x; a(x)] + b spans on rows ``x`` (as its bottom receives them): [1, x Qᵀ, a(x)]."""
    session = party.sessions[session_id]
    q = session.trainer.bottom.module.q.numpy()
    return np.column_stack([np.ones(len(x)), x @ q.T, session.embedding.steps[0].bits(x)])


def _ls_match(span: np.ndarray, truth: np.ndarray) -> float:
    """The share of rows the least-squares fit of the binary ``truth`` from ``span``, rounded, gets right."""
    coef, *_ = np.linalg.lstsq(span, truth, rcond=None)
    return float(np.mean((span @ coef > 0.5) == (truth > 0.5)))


@pytest.mark.parametrize("scaling", ["minmax", "standard"])
def test_a_grown_shard_scales_as_at_the_first_start_and_sessions_before_and_after_share_one_span(
    tmp_path: Path, scaling: str
) -> None:
    raw = _raw(600, 0)
    config = _config(tmp_path, raw, scaling=scaling)
    first = load_party_data(config, StateDir(config.state_dir))
    before = _party(first, StateDir(config.state_dir))
    _q(before, "s1")
    # the operator adds rows, one with a new extreme in a continuous column (c4 at three times its old maximum)
    added = _raw(300, 9)
    added[0, 4] = 3 * raw[:, 4].max()
    grown = np.vstack([raw, added])
    second = load_party_data(_config(tmp_path, grown, scaling=scaling), StateDir(config.state_dir))
    after = _party(second, StateDir(config.state_dir))
    _q(after, "s2")

    truth = raw[:, 0]  # flag, 0 or 1
    one = _span(before, "s1", first.X)
    stacked = np.hstack([one, _span(after, "s2", second.X[:600])])  # the same 600 rows, before and after
    rank = np.linalg.matrix_rank
    majority = max(truth.mean(), 1 - truth.mean())
    # a refit (the old start) gives the same raw rows another x: Q and the bits see another projection of them
    refit = datasets.Scaler.fit(grown, scaling).transform(raw)
    moved = np.hstack([one, _span(after, "s2", refit)])
    print(f"\n{scaling}, 600 rows then 900: rank of [1, x Qᵀ, a(x)] one session {rank(one)}, two stacked "
          f"{rank(stacked)}, stacked after a refit {rank(moved)}; flag by least squares: one "
          f"{_ls_match(one, truth):.3f}, stacked {_ls_match(stacked, truth):.3f}, after a refit "
          f"{_ls_match(moved, truth):.3f} (majority {majority:.3f})")  # fmt: skip
    kept = len(before.masquerade_basis)  # drop=binary: the kept directions (d_B − 2 here: flag out, uncorrelated)
    assert rank(stacked) == rank(one) == 1 + kept + 4  # [1, Q x, 4 bits]
    assert _ls_match(stacked, truth) == _ls_match(one, truth) <= majority + 0.02
    assert rank(moved) > rank(one) and _ls_match(moved, truth) >= 0.99  # what the kept scaling prevents

    fitted = datasets.Scaler.fit(raw, scaling)  # at the first start, kept beside the secret
    assert np.array_equal(second.X[:600], first.X)  # the common rows scale as at the first start
    assert np.allclose(second.X[600:], fitted.transform(added))  # and the new ones with the kept scaler
    if scaling == "minmax":
        assert second.X[600, 4] == pytest.approx((3 * raw[:, 4].max() - raw[:, 4].min()) / np.ptp(raw[:, 4]))
    secrets = tmp_path / "state" / "secrets"
    kept_columns, kept_scaling = secrets / "masquerade_columns.npy", secrets / "masquerade_scaling.npy"
    assert np.load(kept_columns).tolist() == [scaling, *COLUMNS]
    assert np.array_equal(np.load(kept_scaling), np.stack([fitted.offset, fitted.scale]))
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in (kept_columns, kept_scaling))


def test_another_column_order_or_scaling_kind_refuses_naming_the_file_and_both(tmp_path: Path) -> None:
    raw = _raw(200, 1)
    config = _config(tmp_path, raw)
    load_party_data(config, StateDir(config.state_dir))
    swapped = ("flag", "c2", "c1", "c3", "c4")  # 1 in 21 such swaps passed masquerade's own start check (review 8b)
    kept = r"secrets/masquerade_columns\.npy: masquerade's Q was drawn for scaling = 'minmax' over the columns "
    with pytest.raises(ValueError, match=kept + r"\['flag', 'c1', 'c2', 'c3', 'c4'\], the config gives scaling = "
                       r"'minmax' over \['flag', 'c2', 'c1', 'c3', 'c4'\]: restore \[data\] scaling and columns"):
        load_party_data(_config(tmp_path, raw, columns=swapped), StateDir(config.state_dir))
    with pytest.raises(ValueError, match=kept + r".*the config gives scaling = 'standard' over \['flag', 'c1'"):
        load_party_data(_config(tmp_path, raw, scaling="standard"), StateDir(config.state_dir))
    with pytest.raises(ValueError, match=kept + r".*over \['flag', 'c1', 'c2', 'c3'\]: restore"):  # a column less
        load_party_data(_config(tmp_path, raw, columns=tuple(COLUMNS[:4])), StateDir(config.state_dir))
    again = load_party_data(config, StateDir(config.state_dir))  # as kept: starts
    kept_scaling = tmp_path / "state" / "secrets" / "masquerade_scaling.npy"
    np.save(kept_scaling, np.load(kept_scaling)[:, :4])  # a damaged file is refused, not refit
    with pytest.raises(ValueError, match=r"masquerade_scaling\.npy: not a finite \[offset; scale\] of 5 columns"):
        load_party_data(config, StateDir(config.state_dir))
    assert np.array_equal(again.X, datasets.Scaler.fit(raw, "minmax").transform(raw))


def test_the_feature_bound_applies_to_the_kept_scaling(tmp_path: Path) -> None:
    raw = _raw(200, 2)
    config = _config(tmp_path, raw)
    load_party_data(config, StateDir(config.state_dir))
    grown = np.vstack([raw, raw[:1]])
    grown[-1, 4] = raw[:, 4].min() + 100 * np.ptp(raw[:, 4])  # 100 in the kept min-max units: above the bound
    with pytest.raises(ValueError, match=r"scaling = 'minmax' reach \|x\| = 100; the masks hide \|x\| <= 64: rows "
                       r"added since the first start .* kept then \(secrets/masquerade_scaling\.npy\)"):  # fmt: skip
        load_party_data(_config(tmp_path, grown), StateDir(config.state_dir))
    assert load_party_data(_config(tmp_path, grown, embedding=()), StateDir(config.state_dir)).X.max() == 1.0
    # a first start refused on the bound keeps nothing: the scaling the operator then configures is the one kept
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    unscaled = _config(fresh, raw, scaling="none")
    with pytest.raises(ValueError, match=r"shard\.csv: features after scaling = 'none' reach \|x\| = \d+; the masks"):
        load_party_data(unscaled, StateDir(unscaled.state_dir))
    assert not list((fresh / "state" / "secrets").glob("masquerade_*"))
    load_party_data(_config(fresh, raw, scaling="standard"), StateDir(unscaled.state_dir))
    assert np.load(fresh / "state" / "secrets" / "masquerade_columns.npy")[0] == "standard"


def test_without_masquerade_or_a_state_folder_the_scaler_is_refit_at_every_start(tmp_path: Path) -> None:
    raw, grown = _raw(200, 3), np.vstack([_raw(200, 3), _raw(50, 4)])
    for embedding in ((), ("embedding_noise:sigma=0.1",)):
        config = _config(tmp_path, raw, embedding=embedding)
        load_party_data(config, StateDir(config.state_dir))
        data = load_party_data(_config(tmp_path, grown, embedding=embedding), StateDir(config.state_dir))
        assert np.array_equal(data.X, datasets.Scaler.fit(grown, "minmax").transform(grown))
        assert not (tmp_path / "state" / "secrets").exists()
    for state in (None, StateDir(None)):  # masquerade without a folder: its secret lasts for the process, as this
        data = load_party_data(_config(tmp_path, grown), state)
        assert np.array_equal(data.X, datasets.Scaler.fit(grown, "minmax").transform(grown))
