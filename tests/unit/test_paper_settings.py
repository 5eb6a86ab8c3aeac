"""Setting up a paper's experiment from the command line (issue 16): encodings, random passive columns, the
session's split shared by the dealer and the operator, per-attack options, the default batch rule."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from vflsec.client import options
from vflsec.client.cli import app
from vflsec.client.experiments.harness import accuracy_warning
from vflsec.client.experiments.runs import check_attack_options
from vflsec.client.federation.launcher import STEPS_PER_EPOCH, FederationSpec, SpecError, write_federation
from vflsec.services.data import datasets as D

CSV = "colour,size,label\nred,1,yes\nred,2,no\nblue,3,yes\nblue,4,yes\ngreen,5,no\nred,6,yes\n"


@pytest.fixture
def small(tmp_path) -> D.Dataset:
    path = tmp_path / "small.csv"
    path.write_text(CSV)
    return D.load_csv(path, "label", categorical="ordinal")


def test_ordinal_loading_names_its_coded_columns(small) -> None:
    assert small.categorical == ["colour"] and small.feature_names == ["colour", "size"]
    assert small.X[:, 0].tolist() == [2, 2, 0, 0, 1, 2]  # blue, green, red


def test_target_encoding_is_the_mean_label_on_the_fit_rows_only(small) -> None:
    # Fit on rows 0..3: red -> (yes, no) = 0.5, blue -> (yes, yes) = 1; green is unseen -> the fit rows' mean.
    encoded = D.target_encode(small, [0, 1, 2, 3])
    assert encoded.X[:, 0].tolist() == [0.5, 0.5, 1.0, 1.0, 0.75, 0.5]
    assert encoded.X[:, 1].tolist() == small.X[:, 1].tolist()  # numeric columns untouched
    assert D.target_encode(small, range(6)).X[5, 0] == pytest.approx(2 / 3)  # red over every row
    with pytest.raises(ValueError, match="at least one row"):
        D.target_encode(small, [])


def test_random_passive_columns_are_seeded_and_sized() -> None:
    names = [f"f{i}" for i in range(10)]
    by_fraction = D.split_columns(names, 1, passive_features=D.RandomColumns(0.4), seed=3)
    by_count = D.split_columns(names, 1, passive_features=D.RandomColumns(4), seed=3)
    assert by_fraction == by_count and len(by_count.passive[0]) == 4
    own_seed = D.split_columns(names, 1, passive_features=D.RandomColumns(4, 11), seed=3)
    assert own_seed == D.split_columns(names, 1, passive_features=D.RandomColumns(4, 11), seed=99)
    seeds = {tuple(D.split_columns(names, 1, passive_features=D.RandomColumns(4, s)).passive[0]) for s in range(8)}
    assert len(seeds) > 1  # the seed does choose
    with pytest.raises(ValueError, match=r"the passive side needs 1\.\.9"):
        D.split_columns(names, 1, passive_features=D.RandomColumns(10))


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("random:0.4", D.RandomColumns(0.4)), ("random:12", D.RandomColumns(12)), ("random:3:7", D.RandomColumns(3, 7))],
)
def test_random_passive_features_parser(value, parsed) -> None:
    assert options.passive_features(value) == parsed


def test_random_passive_features_parser_refuses_junk() -> None:
    with pytest.raises(typer.BadParameter, match=r"random:COUNT\|FRACTION\[:SEED\]"):
        options.passive_features("random:many")


def test_session_split_is_one_choice_for_dealer_demo_and_harness() -> None:
    ids = np.array([f"s{i:03d}" for i in range(100)])
    labels = np.arange(100) % 2
    spec = FederationSpec("wine", queries=30, seed=4)
    train, held = spec.session_split(ids, labels)
    shuffled = np.random.default_rng(9).permutation(100)
    assert (train, held) == spec.session_split(ids[shuffled], labels[shuffled])  # PSI's order does not matter
    assert len(held) == 30 and len(train) == 70 and not set(train) & set(held)
    # Too many queries to keep half for training: the query set shrinks to half, never into the training rows.
    many = FederationSpec("wine", queries=60)
    many_train, many_held = many.session_split(ids, labels)
    assert len(many_train) == 50 and len(many_held) == 50 and not set(many_train) & set(many_held)
    assert many.queries_for(100) == (50, many.queries_for(100)[1]) and "not the 60 asked" in many.queries_for(100)[1]
    demo_train, demo_held = FederationSpec("wine").session_split(ids, labels)
    assert len(demo_held) == 20 and sorted(demo_train + demo_held) == sorted(ids)
    sub, _ = FederationSpec("wine", queries=30, seed=4, train_rows=25).session_split(ids, labels)
    assert len(sub) == 25 and set(sub) <= set(train)


def test_dealt_target_encoding_fits_on_the_sessions_training_rows(small) -> None:
    spec = FederationSpec(small, encoding="target", queries=2, drop_fraction=0.0, passive_features=1)
    train, _ = spec.session_split(small.ids, small.y)
    assert np.array_equal(spec.dealt_data().X, D.target_encode(small, D.select_ids(small.ids, train)).X)
    assert FederationSpec(small, encoding="ordinal").dealt_data() is small


def test_spec_refuses_unknown_training_choices() -> None:
    for bad, message in [
        ({"encoding": "hash"}, "encoding must be one of onehot, ordinal, target"),
        ({"optimizer": "lbfgs"}, "optimizer must be one of adam, sgd"),
        ({"l2": -1.0}, "l2 must be >= 0"),
        ({"train_rows": 0}, "train rows must be at least 1"),
    ]:
        with pytest.raises(SpecError, match=message):
            FederationSpec("wine", **bad)


def test_default_batch_follows_the_rows_and_the_minimum() -> None:
    spec = FederationSpec("wine")
    assert spec.batch_size_for([8, 7], 1000) == (64, "default 64; minimum 16")
    rows = 36_000
    wanted = -(-rows // STEPS_PER_EPOCH)
    batch, note = spec.batch_size_for([8, 7], rows)
    assert batch == wanted and note.startswith(f"default {wanted} (= {rows} training rows")
    assert spec.batch_size_for([600, 7], rows)[0] == 1200  # the coordinator's minimum still wins


def test_attack_options_are_parsed_once_by_the_registry() -> None:
    grouped = options.attack_options(["ram.n_refine=50", "sign_only.sign_relation=opposite"])
    assert grouped == {"ram": {"n_refine": "50"}, "sign_only": {"sign_relation": "opposite"}}
    typed = check_attack_options(grouped, ["ram", "sign_only"])
    assert typed == {"ram": {"n_refine": 50}, "sign_only": {"sign_relation": "opposite"}}
    with pytest.raises(typer.BadParameter, match=r"ATTACK\.KEY=VALUE"):
        options.attack_options(["ram=50"])
    with pytest.raises(ValueError, match=r"attack 'ram' has no parameter\(s\) \['epochs'\] \(accepted: "):
        check_attack_options({"ram": {"epochs": "3"}}, ["ram"])
    with pytest.raises(ValueError, match="sign_relation must be one of same, opposite"):
        check_attack_options({"sign_only": {"sign_relation": "maybe"}}, ["sign_only"])
    with pytest.raises(ValueError, match="--attack-option for grn, which this run does not attack with"):
        check_attack_options({"grn": {"epochs": "3"}}, ["ram"])


def test_accuracy_warning_names_the_threshold_and_the_majority_rate() -> None:
    assert accuracy_warning(0.9, 0.5) is None
    assert "0.7900 is below 0.85" in accuracy_warning(0.79, 0.24) and "majority class 0.2400" in accuracy_warning(
        0.79, 0.24
    )
    # Bank: 0.886 of the labels are "no"; 0.892 passes the papers' 0.85 but not the majority class by much.
    assert "within 0.02 of the majority class 0.8860" in accuracy_warning(0.892, 0.886)
    assert accuracy_warning(0.91, 0.886) is None


def test_the_dealer_deals_target_encoded_columns_and_no_labels_to_the_passive_party(small, tmp_path) -> None:
    spec = FederationSpec(small, encoding="target", queries=2, drop_fraction=0.0, passive_features=["colour"])
    layout = write_federation(spec, tmp_path / "fed")
    passive = D.read_party_csv(layout.configs["passive-1"].parent / "data.csv")
    train, held = spec.dealt_split()
    expected = D.target_encode(small, D.select_ids(small.ids, train))
    assert passive.y is None and passive.columns == ["colour"]
    assert np.array_equal(passive.X[:, 0], expected.X[D.select_ids(small.ids, passive.ids), 0])
    # The fit saw the training rows only: a held-out row's own label did not move its category's mean.
    assert set(held) and not set(held) & set(train)


def test_datasets_list_and_show(tmp_path) -> None:
    listed = CliRunner().invoke(app, ["datasets", "list"])
    assert listed.exit_code == 0 and "wine " in listed.output and "datasets folder:" in listed.output
    path = tmp_path / "small.csv"
    path.write_text(CSV)
    shown = CliRunner().invoke(
        app, ["datasets", "show", str(path), "--passive-features", "colour=red", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.stdout.strip().splitlines()[-1])
    assert info["rows"] == 6 and info["classes"] == {"no": 2, "yes": 4}
    assert info["columns_raw"] == ["colour", "size"] and info["categorical"] == ["colour"]
    assert info["columns"] == ["colour=blue", "colour=green", "colour=red", "size"]
    assert info["split"] == {"active": ["colour=blue", "colour=green", "size"], "passive": [["colour=red"]]}
    assert "2 columns before encoding (* categorical): colour*, size" in shown.output
    target = CliRunner().invoke(app, ["datasets", "show", str(path), "--encoding", "target", "--json"])
    assert json.loads(target.stdout.strip().splitlines()[-1])["columns"] == ["colour", "size"]
    bad = CliRunner().invoke(app, ["datasets", "show", str(path), "--passive-features", "random:5"])
    assert bad.exit_code == 2 and "the passive side needs 1..3" in bad.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--encoding", "hash"], "encoding must be one of onehot, ordinal, target"),
        (["demo", "--optimizer", "lbfgs"], "optimizer must be one of adam, sgd"),
        (["attack", "--dataset", "wine", "--passive-features", "random:13"], "the passive side needs 1..12"),
        (["prepare", "--out", "unused", "--encoding", "hash"], "encoding must be one of"),
    ],
)
def test_commands_refuse_a_bad_setting_before_starting(args, message) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def _rare_category_csv(path) -> str:
    """A column with 3 ones in 400 rows: standard scaling puts them far beyond a bound of 8 (set below)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 4))
    X[:, 3] = 0.0
    X[:3, 3] = 1.0
    # No ID column: one of 400 distinct text values is free text to the loader (refused), not a category.
    rows = ["a,b,c,rare,y", *(f"{','.join(map(str, x))},{int(x[0] > 0)}" for x in X)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_default_scaling_follows_the_feature_bound_and_an_explicit_one_is_refused(tmp_path, monkeypatch) -> None:
    from vflsec.client.federation import demo
    from vflsec.services.crypto import he

    monkeypatch.setattr(he, "FEATURE_BOUND", 8.0)  # Bank's rare categories reach 114 against the real bound 64
    data = _rare_category_csv(tmp_path / "rare.csv")
    seen: list[FederationSpec] = []
    monkeypatch.setattr(demo, "run_demo", lambda spec, **_: seen.append(spec) or {})
    monkeypatch.setattr("vflsec.client.commands.federation._report", lambda *_: None)
    result = CliRunner().invoke(app, ["demo", "--dataset", data, "--label", "y", "--passive-features", "2"])
    assert result.exit_code == 0, result.output
    assert seen[0].scaling == "minmax" and "scaling min-max instead" in " ".join(result.output.split())
    explicit = FederationSpec(data, label="y", passive_features=2, scaling="standard")
    assert explicit.scaled_peak() > 8.0
    with pytest.raises(SpecError, match=r"reach \|x\| = .*--scaling minmax"):
        write_federation(explicit, tmp_path / "fed")
    kept = CliRunner().invoke(app, ["demo", "--dataset", data, "--label", "y", "--scaling", "none"])
    assert kept.exit_code == 0 and seen[-1].scaling == "none"  # explicit: no fallback (the dealer refuses it)
