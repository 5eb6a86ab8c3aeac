"""Averaging over windows of passive columns (rassouli's "average over space") in the attack report."""

from __future__ import annotations

from vflsec.client.experiments.harness import average_over_windows


def window_report(mse: dict[str, float | None], accuracy: float) -> dict:
    attacks = {
        name: {"not_applicable": "withheld"}
        if value is None
        else {"mse": value, "mse_clipped": min(value, 1.0), "seconds": 1.0, "aware": name.startswith("aware")}
        for name, value in mse.items()
    }
    report = {"accuracy": accuracy, "baselines": {"half": 0.2}, "attacks": attacks, "mse_per_feature": {}}
    return report | {"strongest": {}}


def test_mses_are_averaged_and_an_attack_missing_in_some_window_is_not() -> None:
    reports = [
        window_report({"esa": 0.1, "aware_ls": 0.01, "grn": 0.3}, 0.9),
        window_report({"esa": 0.3, "aware_ls": 0.03, "grn": None}, 0.8),
    ]
    report = average_over_windows(reports)
    assert report["windows"] == 2 and abs(report["accuracy"] - 0.85) < 1e-12
    assert abs(report["attacks"]["esa"]["mse"] - 0.2) < 1e-12
    assert report["attacks"]["grn"] == {"not_applicable": "ran in 1 of 2 windows"}
    assert report["strongest"]["attack"] == "aware_ls" and abs(report["strongest"]["mse"] - 0.02) < 1e-12
    assert reports[0]["attacks"]["esa"]["mse"] == 0.1  # the windows' own reports are left as they were
    assert "mse_per_feature" not in report
