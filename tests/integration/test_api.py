"""`vflsec.api` (issue 31, item 9): the CLI's commands as functions taking its options as keyword arguments and
returning the --json dict; a user mistake raises VflsecError with the CLI's one-line message; the example notebook
runs (its code cells executed in order, as a kernel would)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflsec import api
from vflsec.client import api as impl
from vflsec.client.experiments import runs

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "attack_quickstart.ipynb"


def test_keyword_arguments_are_the_cli_options() -> None:
    command = impl._command("attack")
    args = impl._arguments(command, {"dataset": "wine", "release": ["rounding:decimals=1", "gaussian:epsilon=1"],
                                    "withhold_model": True, "epochs": 3, "label": None})  # fmt: skip
    assert args == ["--dataset", "wine", "--release", "rounding:decimals=1", "--release", "gaussian:epsilon=1",
                    "--withhold-model", "--epochs", "3"]  # fmt: skip
    assert {"dataset", "release", "predictions", "mse_scope"} <= set(api.options("attack"))
    assert impl._arguments(impl._command("reproduce"), {"claim": "rg_minus_half", "fast": False}) == ["rg_minus_half"]
    with pytest.raises(TypeError, match=r"unknown option.* datasett; accepted: dataset"):
        api.attack(datasett="wine")


def test_mistakes_raise_the_cli_message() -> None:
    with pytest.raises(api.VflsecError, match="encoding must be one of onehot, ordinal, target") as refused:
        api.attack(dataset="wine", encoding="hash")
    assert refused.value.exit_code == 2
    with pytest.raises(api.VflsecError, match="--windows") as bad:
        api.attack(dataset="wine", windows="many")
    assert bad.value.exit_code == 2


def test_attack_returns_the_json_report(monkeypatch) -> None:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)
    report = api.attack(dataset="wine", backend="plain", attacks="esa,half_star", epochs=2)
    assert set(report["attacks"]) == {"esa", "half_star"} and report["query_rows_in_training"] == 0
    json.dumps(report)  # the --json line, parsed: plain JSON all the way down
    pd = pytest.importorskip("pandas")
    table = api.frame(report)
    assert isinstance(table, pd.DataFrame) and table.loc["half", "kind"] == "baseline"
    assert table.loc["esa", "mse"] == report["attacks"]["esa"]["mse"]


@pytest.mark.slow
def test_the_example_notebook_runs(monkeypatch) -> None:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)  # the same services, in this process
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    namespace: dict = {}
    for cell in cells:
        exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    report = namespace["report"]
    assert report["verdict"].startswith(("leaks:", "protects:")) and "undefended" in report


def test_attacks_and_defenses_list_one_line_each_and_reproduce_help_names_the_claims() -> None:
    from typer.testing import CliRunner

    from vflsec.client.cli import app
    from vflsec.client.experiments.reproduce.run import CLAIMS
    from vflsec.services.attacks import ATTACKS
    from vflsec.services.defenses.release import PARAM_STEPS, SCORE_STEPS

    listed = CliRunner().invoke(app, ["attacks", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output.strip().splitlines()[-1])
    assert [r["name"] for r in rows] == list(ATTACKS)
    esa = next(r for r in rows if r["name"] == "esa")
    assert esa["families"] and esa["summary"] and esa["summary"] in listed.output
    defenses = CliRunner().invoke(app, ["defenses", "list"])
    lines = defenses.output.strip().splitlines()
    assert defenses.exit_code == 0 and len(lines) >= len(SCORE_STEPS) + len(PARAM_STEPS)
    assert any(line.startswith("rounding [--release] (") and "decimals" in line for line in lines)
    assert any(line.startswith("withhold [--param-release] (") for line in lines)
    helped = CliRunner().invoke(app, ["reproduce", "--help"])
    assert helped.exit_code == 0 and all(name in " ".join(helped.output.split()) for name in CLAIMS)
