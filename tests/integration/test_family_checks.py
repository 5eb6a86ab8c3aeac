"""A release step or an attack the chosen model family does not support is refused at configuration time: the CLI
before any party starts (naming the family), the coordinator at the session's creation (FAILED_PRECONDITION),
while a coordinator with that chain keeps serving the families it supports."""

from __future__ import annotations

import grpc
import pytest
from typer.testing import CliRunner

from tests.integration.conftest import federation
from vflsec.client.cli import app
from vflsec.client.experiments import harness
from vflsec.client.federation import demo
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain, served_families


@pytest.fixture
def nothing_starts(monkeypatch) -> None:
    """Writing a federation or starting a party fails the test: the refusals come before either."""

    def started(*args, **kwargs):
        raise AssertionError("a federation was written or a party started")

    for module in (demo, harness):
        for name in ("write_federation", "run_processes", "run_in_process"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, started)


@pytest.mark.usefixtures("nothing_starts")
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["demo", "--model", "splitnn", "--param-release", "varasteh:epsilon=0.01"], "varasteh"),
        (["demo", "--model", "tree", "--release", "pps_b"], "pps_b"),
        (["attack", "--model", "splitnn", "--param-release", "ppsa"], "ppsa"),
        (["attack", "--model", "splitnn", "--attacks", "esa"], "esa"),
        (["attack", "--model", "forest", "--attacks", "grn_rf,ls_clamped"], "ls_clamped"),
    ],
)
def test_the_cli_refuses_a_step_or_attack_the_family_does_not_support_before_starting(args, named) -> None:
    result = CliRunner().invoke(app, [*args, "--backend", "plain"])
    assert result.exit_code == 2, result.output
    family = args[args.index("--model") + 1]
    assert named in result.output and f"'{family}'" in result.output, result.output


def test_the_cli_still_runs_what_the_family_supports(monkeypatch) -> None:
    """The check is per family: an LR run with varasteh passes it (and trains: the harness is reached)."""
    reached = []
    monkeypatch.setattr(harness, "run_attack_scenario", lambda scenario, *progress: reached.append(scenario) or {})
    args = ["attack", "--model", "lr", "--attacks", "esa", "--param-release", "varasteh:epsilon=0.01"]
    CliRunner().invoke(app, [*args, "--backend", "plain"])
    assert reached and list(reached[0].spec.param_release) == ["varasteh:epsilon=0.01"]


def test_the_coordinator_refuses_the_session_of_a_family_its_chain_does_not_support(tmp_path) -> None:
    score, param = ScoreReleaseChain.from_specs([]), ParamReleaseChain.from_specs(["varasteh:epsilon=0.01"])
    assert served_families(score, param, ["lr", "splitnn", "tree", "forest"]) == ["lr"]
    spec = {"n_passive": 1, "backend": "plain", "param_release": ["varasteh:epsilon=0.01"]}
    with federation(tmp_path, dataset="breast_cancer", **spec) as fed:
        with pytest.raises(grpc.RpcError) as refused:
            fed.operator.create_session("plain", family="splitnn", settings={"embedding": 4})
        lr = fed.operator.create_session("plain", seed=1)  # the coordinator serves LR sessions on
        assert fed.operator.align(lr.session_id)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot serve splitnn" in refused.value.details() and "varasteh" in refused.value.details()
