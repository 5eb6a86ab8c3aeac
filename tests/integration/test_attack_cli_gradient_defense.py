"""`vflsec attack --attacker passive-1 --gradient-defense ...`: the active party's gradient defense runs in the real
services (parties in-process, mTLS, CKKS), the curious passive party records the defended ∂L/∂h, and the report sets
the undefended run (the same federation trained again without the defense) beside the defended one."""

from __future__ import annotations

import json

import grpc
import pytest
from typer.testing import CliRunner

from tests.integration.conftest import federation
from vflsec.client.cli import app
from vflsec.client.experiments import runs


def attack(monkeypatch, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)  # same services, one process: CI-fast
    result = CliRunner().invoke(app, ["attack", "--json", *args])
    return result.exit_code, result.output


def test_dp_gaussian_lowers_the_direction_attack_through_the_services(monkeypatch) -> None:
    code, out = attack(
        monkeypatch, "--attacker", "passive-1", "--model", "splitnn", "--dataset", "breast_cancer", "--epochs", "2",
        "--batch-size", "32", "--predictions", "60", "--attacks", "cosine,axis_projection",
        "--gradient-defense", "dp_gaussian:noise_multiplier=50,clip=0.01",
    )  # fmt: skip
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    params = {"noise_multiplier": "50.0", "clip": "0.01", "delta": "1e-05"}
    assert report["gradient_defense"] == [["dp_gaussian", params]]
    before = report["undefended"]["attacks"]["cosine"]
    after = report["attacks"]["cosine"]["auc"]
    # undefended, the direction of ∂L/∂h reads breast_cancer's labels (either way round: 0.99-1.00 in
    # test_attack_cli_labels); noise 50x the clipped norm leaves it near blind (257 rows: AUC's spread is ~0.04)
    assert max(before, 1 - before) > 0.9
    assert max(after, 1 - after) < 0.7
    assert report["strongest_either_way"]["auc_either_way"] < 0.7
    # the accounting of two releases per row at z = 50, and the cost beside both accuracies
    assert report["gradient_accounting"]["dp_gaussian"]["releases_per_row"] == 2
    assert report["accuracy_cost"] == pytest.approx(report["undefended"]["accuracy"] - report["accuracy"])
    assert "model completion" in report["remaining"] and report["verdict"]


def test_a_bad_gradient_defense_is_refused_before_anything_starts(monkeypatch) -> None:
    code, out = attack(monkeypatch, "--attacker", "passive-1", "--model", "splitnn", "--gradient-defense", "max_nrm")
    assert code == 2 and "gradient defense step 'max_nrm'" in out and len(out.strip().splitlines()) == 1
    code, out = attack(monkeypatch, "--model", "lr", "--gradient-defense", "max_norm")
    assert code == 2 and "coordinator-top only" in out and len(out.strip().splitlines()) == 1


def test_the_active_party_refuses_a_bad_gradient_defense_over_the_wire(tmp_path) -> None:
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, backend="plain") as fed:
        for settings, named in (
            ({"gradient_defense": ["max_nrm"]}, "gradient defense step 'max_nrm'"),
            ({"gradient_defense": ["label_dp:epsilon=-1"]}, "epsilon must be > 0"),
            ({"topology": "active-top", "gradient_defense": ["max_norm"]}, "coordinator-top topology only"),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                fed.operator.create_session("plain", family="splitnn", settings={"embedding": 4, **settings})
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert named in refused.value.details()
        # a good one opens the session
        assert fed.operator.create_session("plain", family="splitnn", settings={"gradient_defense": ["max_norm"]})
