"""`bench he`'s split-NN epoch: ckks and plain side by side through the services, one JSON object."""

from __future__ import annotations

import numpy as np

from tests.conftest import pinned_initial_weights
from vflsec.client.bench import he as bench_he


def test_splitnn_epoch_is_measured_on_both_backends(tmp_path, monkeypatch) -> None:
    lines: list[str] = []
    monkeypatch.setattr(bench_he, "SPLITNN_ACCURACY_SESSIONS", 2)  # the keys' form; the bench's own count is larger
    with pinned_initial_weights(0):  # both backends from the same initial weights (each party's own draw otherwise)
        out = bench_he._splitnn(bench_he.bench_dataset(1200), tmp_path, 1, lines.append)
    assert out["topology"] == "coordinator-top" and out["batch_size"] == bench_he.SPLITNN_BATCH
    for key in ("train_epoch_seconds", "inference_samples_per_second", "accuracy"):
        assert set(out[key]) == {"plain", "ckks"} and all(np.isfinite(v) and v > 0 for v in out[key].values())
    # The same model on the same batches: CKKS changes the sums by its decoding error only.
    assert abs(out["accuracy"]["ckks"] - out["accuracy"]["plain"]) <= 0.01
    # The accuracy also over several sessions per backend, the timed one first, and their medians' gap
    runs = bench_he.SPLITNN_ACCURACY_SESSIONS
    assert {key: len(values) for key, values in out["accuracy_runs"].items()} == {"plain": runs, "ckks": runs}
    for key, values in out["accuracy_runs"].items():
        assert values[0] == out["accuracy"][key] and out["accuracy_median"][key] == np.median(values)
    gap = 100 * (out["accuracy_median"]["ckks"] - out["accuracy_median"]["plain"])
    assert out["accuracy_gap_pp_median"]["ckks"] == gap
    # Both backends train on the same masked sums now (nothing is encrypted in split-NN training): no order between them
    assert out["ratios"]["train_ckks_over_plain"] > 0 and any("split-NN" in line for line in lines)
