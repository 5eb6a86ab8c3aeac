"""The `defense` sweep axis: one whole release step per cell (score or parameter chain), the undefended row
first, one training shared by all, and a bad step refused at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vflsec.client.experiments import results as exp_results
from vflsec.client.experiments import scenario as exp_scenario


def scenario(tmp_path: Path, text: str) -> exp_scenario.Scenario:
    path = tmp_path / "s.yaml"
    path.write_text("dataset: wine\nbackend: plain\n" + text)
    return exp_scenario.load_scenario(path)


def test_each_defense_is_its_own_cell_on_one_training(tmp_path: Path) -> None:
    s = scenario(tmp_path, "sweep:\n  defense: ['privee:epsilon=0.1', 'rounding:decimals=2', 'ppsa:H=flip']\n")
    cells = exp_scenario.expand(s)
    assert [exp_scenario.chains(s, c) for c in cells] == [
        ((), ()),  # the undefended reference row first
        (("privee:epsilon=0.1",), ()),
        (("rounding:decimals=2",), ()),
        ((), ("ppsa:H=flip",)),
    ]
    assert len({exp_scenario.training_key(s, c) for c in cells}) == 1
    assert exp_results.defense_label(dict(cells[2].values)) == "defense=rounding:decimals=2"


def test_defense_is_appended_to_the_files_chain(tmp_path: Path) -> None:
    s = scenario(tmp_path, "release: ['rounding:decimals=3']\nsweep:\n  defense: ['gaussian:epsilon=1']\n")
    assert exp_scenario.chains(s, exp_scenario.expand(s)[1]) == (("rounding:decimals=3", "gaussian:epsilon=1"), ())


@pytest.mark.parametrize(
    ("value", "message"),
    [("nosuch:x=1", "a defense is STEP:key=value"), ("rounding:digits=2", "digits")],
)
def test_bad_defense_is_refused_at_its_line(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(exp_scenario.ScenarioError, match=message) as info:
        scenario(tmp_path, f"sweep:\n  defense: ['{value}']\n")
    assert "s.yaml:" in str(info.value)
