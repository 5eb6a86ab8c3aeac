"""Parity through the services on digits (1,797 x 64, ten classes; the plain backend: the ckks path is checked on
wine by test_tree_services.py, and CKKS changes no count, only the time).

* On the session's own training and held-out rows (the demo's split of the aligned IDs), the services' depth-5 tree
  predicts exactly what the in-process protocol predicts on those rows, and its accuracy lies within 1 pp of
  scikit-learn trained centrally on the same rows and the same per-party bins (the range over scikit-learn's
  tie-breaking orders: its result moves with its random feature order where two splits tie).
* A forest's bootstrap draws follow the seed and the training rows alone: two sessions, each with its own random
  PSI common order, grow the same forest, the in-process protocol's on the rows in sample-ID order.
* On wine the services' forest releases exactly the votes of scikit-learn grown on the same rows and bins, the same
  bootstrap rows and per-node candidate features (reference.central_votes).
* ``vflsec demo --model tree`` reports scikit-learn's accuracy on its own training and held-out rows beside its own.
"""

from __future__ import annotations

import json

import numpy as np
from sklearn.tree import DecisionTreeClassifier
from typer.testing import CliRunner

from tests.integration.conftest import federation
from vflsec.client.cli import app
from vflsec.client.federation import demo
from vflsec.client.federation.launcher import run_in_process
from vflsec.services.data import datasets
from vflsec.services.models.tree import LocalFederation, TreeConfig, TreeData, accuracy, central_votes, fit_bins

PARTIES = ("active", "passive-1")


def _rows(fed, party: str, ids: list[str]) -> np.ndarray:
    data = fed.parties[party].engine.data  # the party's own (scaled) columns, as its engine holds them
    return data.X[datasets.select_ids([str(i) for i in data.ids], ids)]


def _session(fed, family: str, settings: dict, name: str = "digits") -> tuple[np.ndarray, TreeData]:
    """Train through the services on the demo's split of the aligned IDs; the released votes on the held-out rows
    and the same rows as the in-process protocol sees them (sample-ID order)."""
    info = fed.operator.create_session("plain", family=family, settings=settings, seed=0)
    common = sorted(fed.operator.align(info.session_id))  # the split as the demo's: not PSI's order
    ds = datasets.load_dataset(name)
    labels = ds.y[datasets.select_ids(ds.ids, common)]
    train_ids, test_ids = (sorted(a) for a in datasets.train_test_split_ids(np.asarray(common), labels, 0.2, 0))
    assert list(fed.operator.train(info.session_id, train_ids, 1))[-1].done
    released = fed.operator.predict(info.session_id, test_ids)
    data = TreeData(
        [_rows(fed, p, train_ids) for p in PARTIES],
        [_rows(fed, p, test_ids) for p in PARTIES],
        ds.y[datasets.select_ids(ds.ids, train_ids)],
        ds.y[datasets.select_ids(ds.ids, test_ids)],
        ds.n_classes,
        name,
        shards=tuple(fed.parties[p].engine.data.X for p in PARTIES[1:]),  # the passive bins' rows: all it holds
    )
    return released.scores, data


def _in_process(config: TreeConfig, data: TreeData) -> np.ndarray:
    local = LocalFederation.create(config, data)
    local.train()
    return local.predict(data.test)


def test_digits_tree_equals_in_process_and_scikit_learn_on_the_same_rows(tmp_path) -> None:
    with federation(tmp_path / "fed", dataset="digits", n_passive=1, allow_plain=True) as fed:
        votes, data = _session(fed, "tree", {"max_depth": 5})
    config = TreeConfig(max_depth=5)
    assert np.array_equal(votes, _in_process(config, data))
    ours = accuracy(votes, data.y_test)
    bins = fit_bins(config, data)
    X = np.hstack([b.transform(x) for b, x in zip(bins, data.train, strict=True)])
    X_test = np.hstack([b.transform(x) for b, x in zip(bins, data.test, strict=True)])
    reference = [
        DecisionTreeClassifier(max_depth=5, random_state=seed).fit(X, data.y_train).score(X_test, data.y_test)
        for seed in range(10)
    ]
    assert min(reference) - 0.01 <= ours <= max(reference) + 0.01, (ours, reference)


def test_forest_does_not_follow_the_psi_order(tmp_path) -> None:
    settings = {"n_trees": 4, "max_depth": 3}
    with federation(tmp_path / "fed", dataset="digits", n_passive=1, allow_plain=True) as fed:
        first, data = _session(fed, "forest", settings)
        second, again = _session(fed, "forest", settings)
    assert all(np.array_equal(a, b) for a, b in zip(data.train, again.train, strict=True))
    assert np.array_equal(first, second)
    assert np.array_equal(first, _in_process(TreeConfig.forest(**settings), data))


def test_wine_forest_equals_scikit_learn_on_the_same_bootstraps(tmp_path) -> None:
    settings = {"n_trees": 10, "max_depth": 3}
    with federation(tmp_path / "fed", dataset="wine", n_passive=1, allow_plain=True) as fed:
        votes, data = _session(fed, "forest", settings, "wine")
    assert np.array_equal(votes, central_votes(TreeConfig.forest(**settings), data))


def test_demo_reports_scikit_learn_on_its_own_rows(monkeypatch) -> None:
    monkeypatch.setattr(demo, "run_processes", run_in_process)  # the same services, in this process
    result = CliRunner().invoke(app, ["demo", "--dataset", "wine", "--model", "tree", "--backend", "plain", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert list(report)[-2:] == ["reference_accuracy", "operator_peak_rss_mb"]  # the JSON grows at its end
    # 30 held-out rows: one row is 3.3 pp; the same rows and bins leave at most a tie-break between the two.
    assert abs(report["accuracy"] - report["reference_accuracy"]) <= 0.07, report
