"""`vflsec attack --model splitnn` through the real services (parties in-process, mTLS, CKKS in coordinator-top):
what each topology lets the curious active party run, next to the blind baselines, in the JSON report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import harness, runs

# The keys an LR report had before split-NN attacks: they keep their place; model and topology come after.
LR_KEYS = ["dataset", "n_classes", "d_passive", "d_active", "n_samples", "accuracy", "backend", "score_release"]


def attack(monkeypatch, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)  # same services, one process: CI-fast
    result = CliRunner().invoke(app, ["attack", "--model", "splitnn", "--json", *args])
    return result.exit_code, result.output


def report_of(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_coordinator_top_runs_the_gradient_attacks_on_the_released_model(monkeypatch) -> None:
    # CKKS: the active party receives the released scores, the top model, its own bottom and (empty parameter
    # chain) the passive bottom, never an embedding: GIA and GRN differentiate the released model, beside Half.
    code, out = attack(monkeypatch, "--dataset", "breast_cancer", "--epochs", "3", "--predictions", "60")
    assert code == 0, out
    report = report_of(out)
    keys = list(report)  # model and topology follow the LR keys together (the phase timings come after them)
    assert keys[: len(LR_KEYS)] == LR_KEYS and keys[keys.index("model") + 1] == "topology"
    assert report["model"] == "splitnn" and report["topology"] == "coordinator-top" and report["backend"] == "ckks"
    assert report["attacker"] == "active"  # the default curious party, named (a new key: none moved)
    assert set(report["baselines"]) == {"half", "rg", "zero"} and report["n_samples"] == 60
    assert set(report["attacks"]) == set(runs.SPLITNN_ATTACKS)
    # They ran: an MSE over the queried rows. Not compared with Half: on 60 rows after 3 epochs neither beats it
    # reliably (--seed 0..5: GIA 0.080-0.125, GRN 0.063-0.195, Half 0.095-0.108; GIA below Half in 4 of 6).
    for name in ("gia", "grn"):
        metric = report["attacks"][name]["metric"]
        assert metric["baseline"]["name"] == "half" and 0.0 <= metric["value"] <= 1.0
    for name in ("ye_alg1", "ye_alg2"):
        assert "never holds" in report["attacks"][name]["not_applicable"]
    assert "passive_bottom" in report["attacks"]["embedding_ls"]["not_applicable"]
    assert report["strongest"] is not None


def test_withhold_keeps_the_passive_bottom_and_the_gradient_attacks_say_why(monkeypatch) -> None:
    code, out = attack(
        monkeypatch, "--dataset", "breast_cancer", "--epochs", "1", "--predictions", "40", "--param-release",
        "withhold", "--attacks", "gia,grn",
    )  # fmt: skip
    assert code == 0, out
    report = report_of(out)
    for name in ("gia", "grn"):
        assert "the passive bottom f_p unknown" in report["attacks"][name]["not_applicable"]
    assert report["strongest"] is None


@pytest.fixture(scope="module")
def binary_table(tmp_path_factory) -> tuple[str, list[str]]:
    """Three continuous active columns, five binary passive ones (the last five), a label that needs both."""
    rng = np.random.default_rng(0)
    n = 400
    a = rng.normal(size=(n, 3))
    b = rng.integers(0, 2, size=(n, 5))
    y = (a[:, 0] + b @ np.array([1, -1, 1, -1, 1]) + rng.normal(0, 0.5, n) > 0.5).astype(int)
    names = [f"a{j}" for j in range(3)] + [f"b{j}" for j in range(5)]
    path = tmp_path_factory.mktemp("data") / "binary.csv"
    rows = [",".join([*(f"{v:.6f}" for v in a[i]), *map(str, b[i]), str(y[i])]) for i in range(n)]
    path.write_text("\n".join([",".join([*names, "label"]), *rows]) + "\n")
    return str(path), names


def test_active_top_recordings_give_ye_every_binary_passive_feature(monkeypatch, binary_table) -> None:
    path, _ = binary_table
    code, out = attack(
        monkeypatch, "--dataset", path, "--topology", "active-top", "--passive-features", "5", "--epochs", "2",
        "--predictions", "150", "--attacks", "gia,grn,embedding_ls,ye_alg1",
    )  # fmt: skip
    assert code == 0, out
    assert "active-top runs on the plain backend" in out  # the default backend followed the topology
    report = report_of(out)
    assert report["topology"] == "active-top" and report["backend"] == "plain" and report["d_passive"] == 5
    assert "half" in report["baselines"]
    attacks = report["attacks"]
    # The passive bottom W_B was released (empty parameter chain) and z_B = W_B x_B + b is noise-free with W_B of
    # full column rank: least squares recovers x_B exactly and GIA on z_B nearly so (--seed 0..3: embedding_ls
    # <= 6e-15, GIA <= 1e-3, Half 0.25). GRN learns x_B from x_act, which the label links only loosely: 0.250-0.261,
    # no better than Half, so only its range is checked.
    half = report["baselines"]["half"]
    assert attacks["embedding_ls"]["metric"]["value"] < 1e-9
    assert attacks["gia"]["metric"]["value"] < 0.02 * half
    assert 0.0 <= attacks["grn"]["metric"]["value"] <= 1.0
    # ye §4: noise-free z_B = W_B x_B spans every binary passive column; each one is found exactly on every queried
    # row (up to complement). The found vectors come in no claimed column order, so their MSE is reported, not
    # compared with Half.
    ye = attacks["ye_alg1"]
    assert ye["binary_columns"] == [0, 1, 2, 3, 4]
    assert ye["recovered_columns"] == [0, 1, 2, 3, 4] and ye["n_found"] == 5
    assert report["strongest"] is not None
    assert "ye_alg1 recovered 5 of 5 binary passive columns exactly" in harness.headline(report)


def test_an_explicit_ckks_backend_for_active_top_is_refused_with_the_reason(monkeypatch) -> None:
    code, out = attack(monkeypatch, "--dataset", "breast_cancer", "--topology", "active-top", "--backend", "ckks")
    assert code != 0
    assert "does not apply to --topology active-top" in out


def test_a_passive_masquerade_from_the_cli_is_announced_and_ye_accuracy_is_tabled(monkeypatch, binary_table) -> None:
    path, _ = binary_table
    code, out = attack(
        monkeypatch, "--dataset", path, "--topology", "active-top", "--passive-features", "5", "--epochs", "2",
        "--predictions", "150", "--attacks", "ye_alg2,ye_adaptive,gia", "--embedding-release",
        "masquerade:m=1,drop=random",  # every passive column is binary: the default drop=binary refuses the block
    )  # fmt: skip
    assert code == 0, out
    report = report_of(out)
    # what the active party was told
    assert report["embedding_release"] == [["masquerade", {"m": "1", "drop": "random"}]]
    assert report["embedding_width"] == 8  # rank d_B − 1 = 4 plus 1 bit fits the default max(d_B, 8)
    line = " ".join(out.split())  # the console wraps it; the parameters cross as a proto map, in either order
    orders = ("m=1,drop=random", "drop=random,m=1")
    assert any(f"passive embedding defense masquerade:{p}: z_p 8 wide" in line for p in orders)
    assert "ye accuracy" in out  # the table's column, beside the MSE
    # A defended passive party keeps its bottom (its layers would show the fabricated bits): GIA has no W_B.
    assert "unknown W_B" in report["attacks"]["gia"]["not_applicable"]
    for name in ("ye_alg2", "ye_adaptive"):
        r = report["attacks"][name]
        # ye §6.3: without complements <= with complements <= the best of every vector listed
        assert 0.0 <= r["ye_accuracy"] <= r["ye_accuracy_complements"] <= r["ye_accuracy_any_listed"] <= 1.0
