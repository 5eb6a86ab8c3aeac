"""``vflsec attacks list``, ``vflsec defenses list`` (the registered plug-ins) and ``vflsec datasets list | show``
(what a dataset holds and how a federation spec would deal it, before anything runs)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from vflsec.client import options as opt
from vflsec.client.commands.common import data_notes, federation_spec, refused

attacks_app = typer.Typer(help="The attack suite's registered attacks.", no_args_is_help=True)
defenses_app = typer.Typer(help="The registered defense steps (score, parameter and embedding release).",
                           no_args_is_help=True)  # fmt: skip


def _plugins_list(kind: str, as_json: bool) -> None:
    from vflsec.client.federation.catalog import plugin_line, plugins

    rows = plugins(kind)
    for row in rows:
        typer.echo(plugin_line(row), err=as_json)
    if as_json:
        typer.echo(json.dumps(rows))


@attacks_app.command("list")
def attacks_list(as_json: opt.Json = False) -> None:
    """Every attack: name (for --attacks), model families, parameters (--attack-option) with defaults, one line."""
    _plugins_list("attacks", as_json)


@defenses_app.command("list")
def defenses_list(as_json: opt.Json = False) -> None:
    """Every defense step: name, where it goes (--release, --param-release, --embedding-release, --gradient-defense),
    families, parameters (STEP:key=value) with defaults, one line."""
    _plugins_list("defenses", as_json)


datasets_app = typer.Typer(help="The datasets a command accepts, and how one would be dealt.", no_args_is_help=True)


@datasets_app.command("list")
def datasets_list(as_json: opt.Json = False) -> None:
    """Built-in names (the UCI ones when their files are in the datasets folder, $VFLSEC_DATASETS)."""
    from vflsec.client.federation.catalog import catalog
    from vflsec.services.data.datasets import shared_datasets_dir

    found = catalog()
    for name, description in found.items():
        typer.echo(f"{name:<14} {description}", err=as_json)
    typer.echo(f"datasets folder: {shared_datasets_dir() or 'not found (set VFLSEC_DATASETS)'}", err=as_json)
    if as_json:
        typer.echo(json.dumps(found))


@datasets_app.command("show")
def datasets_show(
    name: Annotated[str, typer.Argument(help="A name from `vflsec datasets list`, or a CSV path.")],
    label: opt.Label = None,
    encoding: opt.Encoding = "onehot",
    passive: opt.Passive = 1,
    passive_features: opt.PassiveFeatures = None,
    seed: opt.Seed = 0,
    as_json: opt.Json = False,
) -> None:
    """Rows, classes, columns before and after encoding, and which would be passive for a selection."""
    from rich.console import Console

    from vflsec.client.federation.catalog import describe, lines

    spec = federation_spec(
        name, label=label, encoding=encoding, n_passive=passive, passive_features=passive_features, seed=seed
    )
    data_notes(spec, Console(stderr=True))
    with refused():
        info = describe(spec)
    for line in lines(info):
        typer.echo(line, err=as_json)
    if as_json:
        typer.echo(json.dumps(info))

