"""Issue 16, fast runs: attack's default epochs follow the training rows by one stated rule; every shared option
says its default in --help (an option whose default is None says what None means)."""

from __future__ import annotations

import pytest

from tests.unit.test_cli_options import SHARED, commands
from vflsec.client.federation import launcher as federation
from vflsec.client.federation.launcher import FederationSpec


@pytest.mark.parametrize(
    ("rows", "epochs"),
    [(455, 30), (6_667, 30), (6_668, 30), (6_700, 30), (7_000, 29), (36_170, 6), (43_094, 5), (1_000_000, 3)],
)
def test_default_epochs_follow_the_training_rows(rows: int, epochs: int) -> None:
    got, note = FederationSpec("wine", epochs=0).epochs_for(rows)
    assert got == epochs == min(federation.MAX_EPOCHS, max(federation.MIN_EPOCHS, -(-federation.ROW_VISITS // rows)))
    assert note.startswith(f"default {epochs} = min(30, max(3, 200,000 / {rows} training rows))")


def test_explicit_epochs_split_nn_and_early_stopping_keep_theirs() -> None:
    assert FederationSpec("wine", epochs=7).epochs_for(36_170) == (7, "as requested")
    assert FederationSpec("wine", epochs=0, early_stopping_patience=2).epochs_for(36_170)[0] == 30
    assert FederationSpec("wine", epochs=0, model="splitnn", backend="plain").epochs_for(36_170)[0] == 30


def help_text(command_name: str, param_name: str) -> str:
    command = commands()[command_name]
    (param,) = [p for p in command.params if p.name == param_name]
    record = param.get_help_record(command.context_class(command))
    return "" if record is None else record[1]


def test_every_shared_option_shows_its_default_in_help() -> None:
    shared = {info.default.split("/")[0] for info in SHARED.values()}
    missing = [
        f"{name} {param.opts[0]}"
        for name, command in commands().items()
        for param in command.params
        if param.param_type_name == "option"
        and param.opts[0] in shared
        and "[default:" not in help_text(name, param.name)
    ]
    assert not missing, missing


def test_passive_features_help_names_the_default() -> None:
    assert "[default: (all columns, split evenly, active party first)]" in help_text("attack", "passive_features")
    assert "0: for LR min(30, max(3, ceil(200,000 / training rows)))" in help_text("attack", "epochs")
    assert "[default: 0;" in help_text("attack", "epochs") and "[default: 30;" in help_text("demo", "epochs")
