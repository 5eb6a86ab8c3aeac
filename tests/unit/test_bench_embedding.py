"""``vflsec bench embedding``'s arithmetic: medians against none, accuracy mean, spread and change in pp."""

from __future__ import annotations

import pytest

from vflsec.client.bench.embedding import defenses, summary, table


def test_defenses_compare_none_masquerade_at_one_and_default_m_and_noise() -> None:
    chains = defenses(41_188)
    assert list(chains.values()) == [[], ["masquerade:m=1"], ["masquerade"], ["embedding_noise:sigma=0.1"]]
    assert "masquerade m=16 (default)" in chains  # ⌈log₂ 41,188⌉


def test_summary_is_medians_over_runs_and_the_accuracy_spread() -> None:
    run = lambda wall, cpu, acc: {"epoch_seconds": wall, "epoch_cpu_seconds": cpu, "accuracy": acc}  # noqa: E731
    per_run = {
        "none": [run(1.0, 2.0, 0.90), run(3.0, 2.0, 0.92), run(2.0, 9.0, 0.91)],
        "masquerade m=1": [run(2.2, 2.2, 0.89), run(2.2, 2.4, 0.90), run(50.0, 2.2, 0.91)],
    }
    s = summary(per_run)
    assert s["none"]["wall_ratio"] == 1.0 and s["none"]["accuracy_change_pp"] == 0.0
    assert s["masquerade m=1"]["wall_ratio"] == pytest.approx(1.1)  # a load spike in one run does not count
    assert s["masquerade m=1"]["cpu_ratio"] == pytest.approx(1.1)
    assert s["masquerade m=1"]["accuracy_change_pp"] == pytest.approx(-1.0)
    assert (s["masquerade m=1"]["accuracy_min"], s["masquerade m=1"]["accuracy_max"]) == (0.89, 0.91)
    assert len(table(s)) == 3 and "majority_rate" not in s["none"]
    for rows in per_run.values():
        for r in rows:
            r["majority_rate"] = 0.886
    lines = table(summary(per_run))
    assert "majority class" in lines[0] and lines[1].endswith("0.8860")
