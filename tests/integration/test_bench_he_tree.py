"""`bench he`'s tree key: a decision tree grown through the services on ckks and on plain, one entry per dataset."""

from __future__ import annotations

import numpy as np

from vflsec.client.bench import he as bench_he


def test_tree_training_is_measured_on_both_backends(tmp_path) -> None:
    lines: list[str] = []
    ds = bench_he.bench_dataset(300)
    out = bench_he._tree([ds], tmp_path, lines.append)
    assert out["model"] == "tree" and out["max_depth"] == 5 and list(out["datasets"]) == [ds.name]
    entry = out["datasets"][ds.name]
    assert entry["rows"] == 300 and set(entry["train_seconds"]) == set(entry["accuracy"]) == {"plain", "ckks"}
    assert all(np.isfinite(v) and v > 0 for v in entry["train_seconds"].values())
    # CKKS opens exact integer counts: the same tree, the same predictions on both backends.
    assert entry["accuracy"]["ckks"] == entry["accuracy"]["plain"] > 0.5
    assert entry["train_ckks_over_plain"] > 0 and sum("tree" in line for line in lines) == 2
