"""Every command and sub-command of ``vflsec`` keeps its surface: its name, help, and each option's or argument's
flags, parameter name (the keyword of ``vflsec.api``), type, bounds, default as ``--help`` shows it, and help text.

The snapshot (cli_surface.json) was written from the CLI before client/ was given its rooms (issue #30), so a
move that changes what a user types or reads fails here. A deliberate change to the CLI rewrites it:
``VFLSEC_UPDATE_CLI_SURFACE=1 .venv/bin/python -m pytest -q tests/unit/test_cli_surface.py`` (review the diff).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer.main

from vflsec.client.cli import app

SNAPSHOT = Path(__file__).with_name("cli_surface.json")


def _plain(value: Any) -> Any:
    """A default as JSON: paths and other objects by their text, sequences as lists."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


# What a parameter shows or accepts (typer's own click: read through its attributes, none imported).
FIELDS = ("opts", "secondary_opts", "required", "multiple", "nargs", "default", "metavar", "min", "max", "help",
          "show_default", "is_flag", "hidden", "count")  # fmt: skip


def _param(param: Any) -> dict[str, Any]:
    described = {field: _plain(getattr(param, field, None)) for field in FIELDS}
    descriptor = getattr(param, "type_descriptor", None)
    parser = getattr(getattr(descriptor, "parameter_info", None), "parser", None)
    described |= {
        "kind": param.param_type_name,
        "annotation": _plain(getattr(descriptor, "annotation", None)),
        "parser": None if parser is None else parser.__name__,
    }
    return described


def surface() -> dict[str, Any]:
    """Every command by its full name (the root is ""), with its help and its parameters by name."""
    found: dict[str, Any] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        found[" ".join(path)] = {
            "help": command.help,
            "hidden": command.hidden,
            "group": hasattr(command, "commands"),
            "invoke_without_command": getattr(command, "invoke_without_command", False),
            "params": {p.name: _param(p) for p in command.params},
        }
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


def test_every_command_and_option_is_unchanged() -> None:
    now = surface()
    if os.environ.get("VFLSEC_UPDATE_CLI_SURFACE") == "1":
        SNAPSHOT.write_text(json.dumps(now, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    before = json.loads(SNAPSHOT.read_text())
    assert sorted(now) == sorted(before), "commands added or removed"
    for name in sorted(before):
        assert now[name] == before[name], f"`vflsec {name}` changed its surface"


def test_the_snapshot_holds_the_known_commands() -> None:
    """The walk reaches the nested groups (a walk that stopped at the root would compare nothing)."""
    before = json.loads(SNAPSHOT.read_text())
    assert {"attack", "demo", "bench he", "bench scale", "certs sign", "reproduce", "datasets show"} <= set(before)
    assert before["attack"]["params"]["dataset"]["default"] == "digits"
    assert before["demo"]["params"]["dataset"]["default"] == "breast_cancer"
