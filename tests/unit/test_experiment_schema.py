"""Scenario files: what the schema accepts, and errors that name the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from vflsec.client.experiments import scenario as exp_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(exp_scenario.ScenarioError) as info:
        exp_scenario.load_scenario(write(tmp_path, text))
    return str(info.value)


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
def test_examples_load(name: str) -> None:
    scenario = exp_scenario.load_scenario(EXAMPLES / f"{name}.yaml")
    assert scenario.name == name and exp_scenario.expand(scenario)


def test_fields_reach_the_one_federation_spec(tmp_path: Path) -> None:
    scenario = exp_scenario.load_scenario(
        write(
            tmp_path,
            "dataset: wine\nbackend: plain\npassive: 2\npassive_fraction: 0.5\n"
            "training: {epochs: 3, learning_rate: 1}\nrelease: ['rounding:decimals=2']\n"
            "param_release: withhold\nseed: 7\nrepetitions: 3\npredictions: 40\n",
        )
    )
    spec = scenario.spec
    assert (spec.name, spec.backend, spec.n_passive, spec.passive_features) == ("wine", "plain", 2, 0.5)
    assert (spec.epochs, spec.learning_rate, spec.seed) == (3, 1.0, 7)
    assert spec.score_release == ("rounding:decimals=2",) and spec.param_release == ("withhold",)
    assert (scenario.repetitions, scenario.predictions, scenario.name) == (3, 40, "scenario")


def test_unknown_key_names_its_line(tmp_path: Path) -> None:
    message = refused(tmp_path, "dataset: wine\n\nepoch: 3\n")
    assert message.startswith(f"{tmp_path / 'scenario.yaml'}:3: epoch: unknown key")


def test_every_federation_option_of_the_cli_through_its_own_parser(tmp_path: Path) -> None:
    """The scenario's federation keys are `vflsec attack`'s options (client/options.py), parsed as the CLI
    parses them: encoding, random passive columns, early stopping, the split-NN widths, training rows."""
    from vflsec.services.data.datasets import RandomColumns

    scenario = exp_scenario.load_scenario(
        write(
            tmp_path,
            "dataset: wine\nencoding: ordinal\npassive_features: random:0.4:3\nmodel: splitnn\nhidden: [16, 8]\n"
            "embedding: 4\ntraining:\n  early_stopping_patience: 3\n  validation_fraction: 0.25\n  train_rows: 90\n"
            "  optimizer: sgd\n  l2: 0\n  batch_size: 32\n",
        )
    )
    spec = scenario.spec
    assert spec.encoding == "ordinal" and spec.passive_features == RandomColumns(0.4, 3)
    assert (spec.hidden, spec.embedding, spec.train_rows, spec.optimizer) == ((16, 8), 4, 90, "sgd")
    assert (spec.early_stopping_patience, spec.validation_fraction, spec.batch_size) == (3, 0.25, 32)
    # The CLI's bounds and types, with the file's line and key.
    assert ":3: training.epochs: Invalid value for '--epochs'" in refused(
        tmp_path, "dataset: wine\ntraining:\n  epochs: -1\n"
    )
    assert ":2: early_stopping_patience: Invalid value" in refused(
        tmp_path, "dataset: wine\nearly_stopping_patience: 1.5\n"
    )
    assert ":2: passive_features: Invalid value" in refused(tmp_path, "dataset: wine\npassive_features: random:x\n")
    assert ":3: training.seed: given at the top level too" in refused(
        tmp_path, "dataset: wine\nseed: 1\ntraining: {seed: 2}\n"
    )
    assert ":2: encoding: encoding must be one of" in refused(tmp_path, "dataset: wine\nencoding: binary\n")


def test_nested_key_and_type_errors_name_the_line(tmp_path: Path) -> None:
    assert ":3: training.epoch: unknown key" in refused(tmp_path, "dataset: wine\ntraining:\n  epoch: 3\n")
    assert ":2: repetitions: expected int" in refused(tmp_path, "dataset: wine\nrepetitions: two\n")
    assert ":2: release_model: expected bool" in refused(tmp_path, "dataset: wine\nrelease_model: 1\n")
    assert ":5: sweep.privee.epsilon.1: expected a scalar" in refused(
        tmp_path, "dataset: wine\nsweep:\n  privee.epsilon:\n    - 0.1\n    - [0.2]\n"
    )


def test_models_not_wired_are_refused_by_name(tmp_path: Path) -> None:
    tree = refused(tmp_path, "dataset: wine\nmodel: tree\n")
    assert ":2: model: 'tree' is not wired through the services yet" in tree
    assert "must be one of lr, splitnn, tree" in refused(tmp_path, "dataset: wine\nmodel: gbm\n")
    assert ":2: topology: the lr family has no topology" in refused(tmp_path, "dataset: wine\ntopology: active-top\n")
    # split-NN's topologies reach the one spec; active-top has only the plain backend (it sends z_B in the clear)
    text = "dataset: wine\nmodel: splitnn\ntopology: active-top\nbackend: plain\n"
    scenario = exp_scenario.load_scenario(write(tmp_path, text))
    assert (scenario.spec.model, scenario.spec.topology, scenario.model) == ("splitnn", "active-top", "splitnn")
    assert "does not apply to --topology active-top" in refused(
        tmp_path, "dataset: wine\nmodel: splitnn\ntopology: active-top\n"
    )


def test_sweep_axes(tmp_path: Path) -> None:
    assert "a sweep axis is passive_fraction or STEP.PARAM" in refused(
        tmp_path, "dataset: wine\nsweep:\n  nosuch.x: [1]\n"
    )
    assert ":3: sweep.privee.eps: privee has no parameter 'eps'" in refused(
        tmp_path, "dataset: wine\nsweep:\n  privee.eps: [1]\n"
    )
    assert "passive fraction lies in (0, 1)" in refused(tmp_path, "dataset: wine\nsweep:\n  passive_fraction: [1.5]\n")
    assert "non-empty list" in refused(tmp_path, "dataset: wine\nsweep:\n  rounding.decimals: []\n")


def test_spec_and_chain_refusals_keep_their_message(tmp_path: Path) -> None:
    assert "backend: backend must be one of" in refused(tmp_path, "dataset: wine\nbackend: paillier\n")
    assert "release" in refused(tmp_path, "dataset: wine\nrelease: [nosuchstep]\n")
    # A swept value the step refuses is caught before anything runs, naming the cell.
    message = refused(tmp_path, "dataset: wine\nsweep:\n  rounding.decimals: [2, lots]\n")
    assert ":3: sweep.rounding.decimals.1: cell rounding.decimals=lots" in message
    assert "required" in refused(tmp_path, "backend: plain\n")
    assert "unknown attack 'nosuch'" in refused(tmp_path, "dataset: wine\nattacks: [esa, nosuch]\n")


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    assert "a scenario is a mapping" in refused(tmp_path, "- dataset\n")
    assert "not valid YAML" in refused(tmp_path, "dataset: [wine\n")


def test_exclude_attacks_narrows_each_cells_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "dataset: wine\nexclude_attacks: [rcc1]\nsweep:\n  privee.epsilon: [0.1]\n")
    scenario = exp_scenario.load_scenario(path)
    cells = exp_scenario.expand(scenario)
    undefended, defended = (exp_scenario.attack_scenario(scenario, cell).attacks for cell in cells)
    assert "rcc1" not in undefended and "esa" in undefended and "aware_ls" not in undefended
    assert "rcc1" not in defended and "aware_ls" in defended  # the aware attacks follow the cell's chain
    both = "dataset: wine\nattacks: [esa]\nexclude_attacks: [am]\n"
    assert "give attacks or exclude_attacks" in refused(tmp_path, both)


def test_a_split_the_dataset_cannot_deal_names_its_key(tmp_path: Path) -> None:
    message = refused(tmp_path, "dataset: wine\npassive_features: 20\n")
    assert ":2: passive_features: passive features 20 on wine" in message
