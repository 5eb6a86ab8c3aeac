"""The CLI's shared options are declared once (client/options.py) and every command keeps its flags and
defaults; the one option bag (FederationSpec) refuses a bad spec with the bound it breaks."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import typer
from typer.testing import CliRunner

from vflsec.client import options
from vflsec.client.cli import app
from vflsec.client.federation.launcher import STEPS_PER_EPOCH, FederationSpec, SpecError
from vflsec.services.models import lr

SHARED = {
    name: value.__metadata__[0]
    for name, value in vars(options).items()
    if typing.get_origin(value) is typing.Annotated and isinstance(value.__metadata__[0], typer.models.OptionInfo)
}


def commands() -> dict[str, typing.Any]:
    """Every leaf command by its full name ("bench he"), as click sees it."""
    found: dict[str, typing.Any] = {}

    def walk(command: typing.Any, path: tuple[str, ...]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))
        if path and command.callback is not None:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), ())
    return found


def declaration(command: typing.Any, param: str) -> object:
    """The typer OptionInfo a command's parameter was declared with."""
    hint = typing.get_type_hints(command.callback, include_extras=True)[param]
    return hint.__metadata__[0] if typing.get_origin(hint) is typing.Annotated else None


def flag_of(info: typer.models.OptionInfo) -> str:
    # In an Annotated declaration typer reads Option's first positional argument as the first flag.
    return info.default.split("/")[0]


# Today's flags and defaults of the commands that share options (issue 11 keeps them all).
DEFAULTS = {
    "demo": {"--dataset": "breast_cancer", "--passive": 1, "--passive-features": None, "--backend": "ckks",
             "--epochs": 30, "--batch-size": 0, "--learning-rate": 0.1, "--seed": 0, "--compare-plain": False,
             "--scaling": "standard", "--release": None, "--param-release": None, "--embedding-release": None,
             "--json": False},
    "prepare": {"--dataset": "breast_cancer", "--passive": 2, "--passive-features": None, "--seed": 0,
                "--compose": False, "--release": None, "--param-release": None, "--embedding-release": None},
    "run": {"--backend": "ckks", "--epochs": 30, "--batch-size": 0, "--learning-rate": 0.1, "--seed": 0,
            "--compare-plain": False, "--wait": 120.0, "--json": False},
    "attack": {"--dataset": "digits", "--passive": 1, "--passive-features": None, "--predictions": 1000,
               "--backend": "ckks", "--epochs": 0, "--seed": 0, "--windows": 1, "--release": None,
               "--param-release": None, "--embedding-release": None, "--json": False},
    "curve": {"--dataset": "wine", "--passive-features": "5", "--epochs": 30, "--json": False},
    "risk": {"--param-release": None, "--warn-fraction": 0.5, "--json": False},
    "bench he": {"--rows": 30000, "--epochs": 1, "--json": False},
    "bench plugin": {"--rows": 30000, "--backend": "ckks", "--json": False},
    "bench load": {"--backend": "ckks", "--json": False},
}  # fmt: skip


def test_every_shared_flag_is_the_one_declaration_in_options() -> None:
    """A command that takes a shared flag takes it through the options module's object, not a copy of it."""
    flags: dict[str, list[object]] = {}
    for info in SHARED.values():  # --epochs has two: fixed (the benches) and 0-follows-the-rows (the spec's users)
        flags.setdefault(flag_of(info), []).append(info)
    users: dict[tuple[str, int], list[str]] = {(flag, id(info)): [] for flag, infos in flags.items() for info in infos}
    for name, command in commands().items():
        for param in command.params:
            flag = next((o for o in param.opts if o in flags), None)
            if flag is not None:
                used = declaration(command, param.name)
                assert any(used is info for info in flags[flag]), f"{name} redeclares {flag}"
                users[flag, id(used)].append(name)
    # Each declaration is shared, and the click options built from it agree in everything but the default.
    assert all(len(names) >= 2 for names in users.values()), users
    for (flag, _), names in users.items():
        built = [next(p for p in commands()[n].params if flag in p.opts) for n in names]
        shapes = {(p.help, tuple(p.opts), tuple(p.secondary_opts), p.min, p.max, p.metavar) for p in built}
        assert len(shapes) == 1, (flag, shapes)


def test_flags_and_defaults_are_todays() -> None:
    every = commands()
    for name, expected in DEFAULTS.items():
        params = {p.opts[0]: p for p in every[name].params if p.opts[0].startswith("--")}
        assert {flag: params[flag].default for flag in expected} == expected, name


def test_batch_size_help_names_the_default() -> None:
    (batch,) = [p for p in commands()["demo"].params if p.name == "batch_size"]
    rule = f"0: max({lr.DEFAULT_BATCH_SIZE}, training rows / {STEPS_PER_EPOCH}), raised to the federation's minimum"
    assert rule in batch.help


@pytest.mark.parametrize(
    ("value", "parsed"), [("5", 5), ("0.25", 0.25), ("a, b", ["a", "b"]), (None, None), ("1.0", 1)]
)
def test_passive_features_parser(value, parsed) -> None:
    assert options.passive_features(value) == parsed


@pytest.mark.parametrize(
    ("values", "steps"),
    [
        (["masquerade:m=1,embedding_noise:sigma=0.01"], ["masquerade:m=1", "embedding_noise:sigma=0.01"]),
        (["masquerade:m=2,rank=3", "embedding_noise:sigma=1"], ["masquerade:m=2,rank=3", "embedding_noise:sigma=1"]),
        (["masquerade"], ["masquerade"]),
        (None, []),
    ],
)
def test_embedding_release_parser_splits_steps_not_their_parameters(values, steps) -> None:
    assert options.embedding_steps(values) == steps


def test_embedding_release_reaches_the_passive_parties_of_an_active_top_spec_only() -> None:
    spec = FederationSpec("wine", model="splitnn", topology="active-top", backend="plain",
                          embedding_release=["masquerade:m=1"])  # fmt: skip
    assert spec.embedding_release == ("masquerade:m=1",)
    with pytest.raises(SpecError, match="applies to --model splitnn --topology active-top only"):
        FederationSpec("wine", model="splitnn", embedding_release=["masquerade:m=1"])
    with pytest.raises(SpecError, match="'masquerade' has no parameter"):
        FederationSpec("wine", model="splitnn", topology="active-top", backend="plain",
                       embedding_release=["masquerade:n=1"])  # fmt: skip


def test_spec_is_frozen_and_validates_once() -> None:
    spec = FederationSpec("wine", passive_features=["a", "b"], score_release=["rounding:decimals=1"])
    assert spec.passive_features == ("a", "b") and spec.score_release == ("rounding:decimals=1",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.epochs = 3  # type: ignore[misc]
    for bad, message in [
        ({"backend": "paillier"}, "backend must be one of ckks, plain"),
        ({"scaling": "log"}, "scaling must be one of minmax, standard, none"),
        ({"n_passive": 0}, "n_passive must be at least 1"),
        ({"epochs": -1}, r"epochs must be 0 \(the default rule\) or positive"),
        ({"batch_size": -1}, "batch size must be 0"),
        ({"score_release": ["nope"]}, "unknown score release step 'nope'"),
        ({"param_release": ["nope"]}, "unknown parameter release step 'nope'"),
    ]:
        with pytest.raises(SpecError, match=message):
            FederationSpec("wine", **bad)


def test_default_batch_follows_the_minimum_and_an_explicit_one_below_it_is_refused() -> None:
    # digits, one passive party: 64 columns split 32 / 32, so the active block is 33 wide with its bias.
    spec = FederationSpec("digits")
    assert spec.widths == [33, 32]
    assert spec.batch_size_for(spec.widths) == (66, "default 64 raised to the minimum batch (2 x the widest "
                                                "block); minimum 66")  # fmt: skip
    assert FederationSpec("wine").batch_size_for([8, 7]) == (64, "default 64; minimum 16")
    with pytest.raises(SpecError, match=r"minimum batch 66 .* the smallest accepted value is 66"):
        FederationSpec("digits", batch_size=65).batch_size_for(spec.widths)
    assert FederationSpec("digits", batch_size=66).batch_size_for(spec.widths) == (66, "as requested; minimum 66")


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--batch-size", "2"],
        ["demo", "--backend", "paillier"],
        ["attack", "--release", "nope"],
        ["attack", "--model", "splitnn", "--topology", "active-top", "--embedding-release", "masquerade:m=0"],
        ["demo", "--embedding-release", "masquerade:m=1"],  # LR: the passive output leaves encrypted only
        ["prepare", "--out", "unused", "--passive-features", "99"],
        ["prepare", "--out", "unused", "--embedding-release", "masquerade:m=1"],  # active-top runs plain only
        ["prepare", "--out", "unused", "--allow-plain", "--embedding-release", "masquerade:n=1"],
        ["curve", "--dataset", "no_such_dataset"],
    ],
)
def test_cli_refuses_a_bad_spec_before_anything_starts(args, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.stderr.startswith("error: "), result.output
    assert not (tmp_path / "unused").exists()


def test_prepare_writes_the_embedding_release_into_every_passive_toml(tmp_path) -> None:
    import tomllib

    args = ["prepare", "--out", str(tmp_path / "fed"), "--allow-plain",
            "--embedding-release", "masquerade:m=1,embedding_noise:sigma=0.01"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for party in ("passive-1", "passive-2"):
        config = tomllib.loads((tmp_path / "fed" / party / "config.toml").read_text())
        assert config["defenses"]["embedding"] == ["masquerade:m=1", "embedding_noise:sigma=0.01"]
        assert config["policy"]["allowed_backends"] == ["ckks", "plain"]
    refused = CliRunner().invoke(app, ["prepare", "--out", str(tmp_path / "x"), "--embedding-release", "masquerade"])
    assert "add --allow-plain" in refused.stderr


def test_demo_attack_and_a_scenario_share_one_declaration_of_the_federation_options() -> None:
    """demo and attack declare the federation options once (options.FEDERATION_OPTIONS, each command picking its
    own defaults); a scenario file's federation keys are the same options, parsed by the same declaration."""
    from vflsec.client.experiments.scenario import spec_options

    names = [name for name, _, _ in options.FEDERATION_OPTIONS]
    for command in ("demo", "attack"):
        params = {p.name: p for p in commands()[command].params}
        assert set(names) <= set(params), command
        for name, info, _ in options.FEDERATION_OPTIONS:
            assert declaration(commands()[command], name) is info.__metadata__[0], (command, name)
    assert list(spec_options()) == names
    defaults = {c: {p.name: p.default for p in commands()[c].params} for c in ("demo", "attack")}
    assert defaults["demo"]["dataset"] == "breast_cancer" and defaults["attack"]["dataset"] == "digits"
    assert defaults["demo"]["epochs"] == 30 and defaults["attack"]["epochs"] == 0
