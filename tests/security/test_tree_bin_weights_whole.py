"""A passive party's bin weights are sums of row multiplicities, hence whole numbers: fractional ones are refused
(review 23: fractions spread over many bins kept both of the coordinator's sums within their 0.5 tolerance while
moving weight into a one-row bin, the review-18 gate, at a left child whose products are over its smaller sibling)."""

from __future__ import annotations

from tests.security.test_tree_residuals import _session, _train, wine  # noqa: F401  (fixture)
from vflsec.services.models.tree import trainers


def test_fractional_bin_weights_are_refused_naming_them(wine, monkeypatch) -> None:  # noqa: F811
    honest = trainers.TreePassive.node_products

    def fractional(self, keys, task, indicators, session_id, key_epoch):
        products, mask_sums, weights, digest = honest(self, keys, task, indicators, session_id, key_epoch)
        weights[0] += 0.25  # both sums still hold within 0.5
        weights[1] -= 0.25 if weights[1] >= 0.25 else 0.0
        return products, mask_sums, weights, digest

    monkeypatch.setattr(trainers.TreePassive, "node_products", fractional)
    sid, common = _session(wine, "tree", {"max_depth": 2})
    outcome = _train(wine, sid, common)
    assert outcome.startswith("INVALID_ARGUMENT") and "bin weights must be whole numbers" in outcome, outcome
    monkeypatch.undo()
    sid, common = _session(wine, "tree", {"max_depth": 2})
    assert _train(wine, sid, common) == "trained"  # the federation keeps serving
