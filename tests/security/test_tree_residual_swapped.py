"""Documented residual (review 23, F2; docs/protocol.md, "The smaller child first"): the review-18 shifted-bin-weights
attack, adapted to the nodes whose products are made over the smaller right sibling R (the nodes
test_tree_residuals' own shift skips). At such a left child L, passive-1 receives [[Y]]
of R's rows; it sends honest products of R but moves w_r of R's bin weights INTO the bin that holds exactly one row r
of L (and w_r out of R's heaviest bin). The coordinator derives L's counts as P - R, so L's last-class count in that
bin is L_w - w_r - L_other = -L_other: 0 if r is of the last class, -1 -> clipped otherwise, exactly the expression
the original attack produced on L's own products. Live: real gRPC over loopback with mTLS, breast_cancer, in-process
parties.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.security.conftest import federation
from tests.security.test_tree_residuals import _adds_up_per_feature, _session, _train
from vflsec.services.models.tree import steps, trainers

FAMILY, SETTINGS = "tree", {"max_depth": 4}


@pytest.fixture(scope="module")
def cancer(tmp_path_factory):
    # two classes: the last (1) is 63 % of the rows, so a right sibling R nearly always holds some
    with federation(tmp_path_factory.mktemp("r23-cancer"), dataset="breast_cancer", n_passive=1,
                    passive_features=20, backend="plain") as fed:  # fmt: skip
        yield fed


def test_residual_whole_weights_shifted_into_the_siblings_bin_read_a_rows_class_at_a_swapped_node(
    cancer, monkeypatch
) -> None:
    """Bin weights are whole numbers (fractions are refused), and the shift still reads whether a row of L is of the
    last class wherever the weight moved out of R comes from a bin holding a last-class row (``safe``)."""
    fed, last = cancer, 1
    tests: dict = {}
    verdicts: list = []
    labels: dict = {}
    swapped_nodes: list = []
    honest_products, honest_decide = trainers.TreePassive.node_products, trainers.TreeKeyHolder.decide
    honest_labels = steps.LabelHolder.__init__

    def shifted(self, keys, task, indicators, session_id, key_epoch):
        products, mask_sums, weights, digest = honest_products(self, keys, task, indicators, session_id, key_epoch)
        own = self.searched[task.key]
        if task.rows.tolist() == own:
            return products, mask_sums, weights, digest  # only the swapped nodes here (the original test does these)
        swapped_nodes.append(task.key)
        node = replace(task, rows=np.array(own), weights=np.ones(len(own)))  # L's rows: the party's own record
        ind_l, ind_r, offset = self.owner.indicator_matrix(node), self.owner.indicator_matrix(task), 0
        for f in task.features[self.settings.party]:
            size = self.owner.bins.sizes[f]
            single = np.flatnonzero(ind_l[:, offset : offset + size].sum(axis=0) == 1)
            occupied = offset + np.flatnonzero(ind_r[:, offset : offset + size].sum(axis=0) > 0)
            if single.size:
                b = offset + int(single[0])
                spread = occupied[occupied != b]
                if spread.size:
                    r = int(node.rows[np.flatnonzero(ind_l[:, b])[0]])
                    heavy = spread[int(np.argmax(weights[spread]))]  # whole numbers: all of it out of R's heaviest bin
                    weights[b] += 1.0
                    weights[heavy] -= 1.0
                    groups = [task.rows[np.flatnonzero(ind_r[:, heavy])]]
                    tests.setdefault(task.key, []).append((f, r, groups))
            offset += size
        return products, mask_sums, weights, digest

    def watching(self, key, own):
        task = self._searched(key)
        if self.pending is None and task.key in tests:
            candidate = _adds_up_per_feature(self, task)
            for f, r, groups in tests[task.key]:
                lacking = sum(not (labels["y"][g] == last).any() for g in groups)
                safe = lacking == 0  # the clip losses stay within the check's tolerance
                verdicts.append((candidate[f], int(labels["y"][r]), safe))
        return honest_decide(self, key, own)

    def capture(self, y, n_classes):
        honest_labels(self, y, n_classes)
        labels["y"] = self.y

    monkeypatch.setattr(trainers.TreePassive, "node_products", shifted)
    monkeypatch.setattr(trainers.TreeKeyHolder, "decide", watching)
    monkeypatch.setattr(steps.LabelHolder, "__init__", capture)
    sid, common = _session(fed, FAMILY, SETTINGS)
    assert _train(fed, sid, common) == "trained"
    safe = [(c, y) for c, y, s in verdicts if s]
    assert swapped_nodes, "no node had its products over the smaller sibling"
    assert safe and all(c == (y == last) for c, y in safe)
