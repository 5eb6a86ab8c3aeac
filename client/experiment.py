"""Experiments: a YAML scenario file expanded into cells (sweep axes x repetitions), each cell an attack run
through the real services (client/harness.py), resumable, in a process pool or on Ray, summarised as
results.json, results.md and PNG plots.

Training is the expensive part, and a cell that differs from another only in its release chains or its
attacks would train the very same model. So cells are grouped by everything training depends on; the first
cell of a group trains a *base* federation once (with session checkpoints on) and keeps its state folders;
every cell of the group then deals a fresh federation from the same spec (same seed: the same data files),
copies the base's checkpoints and the curious store into it, and starts its parties with its own release
chains. The parties resume the trained session from their checkpoints, and the cell's coordinator releases
the model and the scores through the cell's chains: every release still goes through the real services.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client import harness
from vflsec.client import options as opt
from vflsec.client.federation import FederationSpec, SpecError, temporary_folder

# --- the scenario file --------------------------------------------------------------------------------------

MODELS = ("lr", "splitnn", "tree")  # the schema names every family; the services train lr and splitnn today
WIRED_MODELS = ("lr", "splitnn")
ATTACKER_AXIS = "attacker"  # who is curious: "active" (feature attacks) or "passive-N" (label attacks)
FIXED_AXES = ("passive_fraction", ATTACKER_AXIS)  # sweep axes that are not a defense: each point its own undefended row
DEFENSE_AXIS = "defense"  # a sweep axis of whole release steps, "STEP:key=value,...": one defense per cell
# A sweep axis of the active party's gradient defenses (split-NN coordinator-top), as `--gradient-defense` takes them:
# a value is one step "STEP:key=value,..." or a chain of them (a YAML list, or the steps joined by CHAIN_JOIN).
TRAINING_DEFENSE_AXIS = "training_defense"
CHAIN_JOIN = " + "


class ScenarioError(ValueError):
    """A scenario file the schema refuses; the message names the file, the line and the key."""


@dataclass(frozen=True)
class Scenario:
    """A validated scenario file: one base FederationSpec + the harness's attack settings, and the sweep."""

    name: str
    spec: FederationSpec  # the base spec (no sweep applied); repetitions vary its seed
    attacks: tuple[str, ...] | None  # None: harness.default_attacks for each cell's chains, less ``exclude``
    exclude_attacks: tuple[str, ...]
    attack_options: dict[str, dict[str, Any]]
    predictions: int
    release_model: bool
    repetitions: int
    sweep: dict[str, list[Any]]  # axis -> values, in file order
    baseline: bool  # add the undefended cells the ratios and DCS compare with
    in_process: bool  # parties as in-process servers of the cell's worker (default) or as OS processes
    model: str = "lr"
    source: dict[str, Any] = field(default_factory=dict)  # the file as loaded (results.json keeps it)
    attacker: str = "active"  # the curious party of every cell, unless the attacker is swept


def _line_map(node: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Every key path of a composed YAML document -> its 1-based line (the YAML loader's marks)."""
    import yaml

    lines: dict[tuple[str, ...], int] = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*path, str(key.value))
            lines |= _line_map(value, sub)
            lines[sub] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines |= _line_map(item, (*path, str(i)))
    return lines


class _Checker:
    def __init__(self, source: str, lines: dict[tuple[str, ...], int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, path: tuple[str, ...], message: str) -> ScenarioError:
        line = next((self.lines[path[:n]] for n in range(len(path), -1, -1) if path[:n] in self.lines), 1)
        key = ".".join(path) or "(top level)"
        return ScenarioError(f"{self.source}:{line}: {key}: {message}")

    def typed(self, raw: Mapping[str, Any], path: tuple[str, ...], key: str, kind: type | tuple, default: Any) -> Any:
        if key not in raw:
            return default
        value = raw[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail((*path, key), f"expected {names}, got {value!r}")
        return value

    def strings(self, raw: Mapping[str, Any], path: tuple[str, ...], key: str) -> list[str] | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail((*path, key), f"expected a list of strings, got {value!r}")
        return value


# The scenario's own keys; every other key is a federation option of `vflsec attack` (spec_options).
SCENARIO_KEYS = {
    "name", "passive_fraction", "scaling", "training", "attacks", "attack_options", "predictions", "release_model",
    "repetitions", "sweep", "baseline", "parties", "exclude_attacks", "attacker",
}  # fmt: skip
# Options of `vflsec attack` that are not about the federation (they have scenario keys of their own, or none).
NOT_SPEC_OPTIONS = {"attacks", "attack_option", "predictions", "mse_scope", "withhold_model", "windows", "markdown"}


@functools.cache
def spec_options() -> dict[str, Any]:
    """The `vflsec attack` options that set a FederationSpec field, by parameter name: a scenario's federation
    keys, each converted by the command's own parser and bounds (client/options.py declares each one once), so
    a scenario reaches every training and data option the CLI has, under the CLI's name."""
    import typer.main

    from vflsec.client.cli import app

    command = typer.main.get_command(app).commands["attack"]  # type: ignore[attr-defined]
    fields = FederationSpec.__dataclass_fields__
    return {
        p.name: p
        for p in command.params
        if p.name not in NOT_SPEC_OPTIONS and not p.is_flag and opt.SPEC_FIELD.get(p.name, p.name) in fields
    }


def _spec_option(check: _Checker, path: tuple[str, ...], name: str, value: Any) -> tuple[str, Any]:
    """A scenario value through its CLI option's parser (a list: a repeatable option's items, else one
    comma-separated value); the FederationSpec field and the parsed value."""
    import typer
    import typer.main

    from vflsec.client.cli import app

    option = spec_options()[name]
    if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict | list) for v in value)):
        raise check.fail(path, f"expected a value or a list of values, got {value!r}")
    items = value if isinstance(value, list) else [value]
    texts = [str(v) for v in items] if option.multiple else [",".join(str(v) for v in items)]
    command = typer.main.get_command(app).commands["attack"]  # type: ignore[attr-defined]
    try:
        parsed = command.make_context("attack", [f"{option.opts[0]}={t}" for t in texts]).params[name]
    except typer.BadParameter as exc:
        raise check.fail(path, exc.format_message()) from exc
    return opt.spec_value(name, tuple(parsed) if option.multiple else parsed)


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; every error names the file, the line and the key."""
    import yaml

    text = path.read_text()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}:1: a scenario is a mapping of keys (dataset, release, sweep, ...)")
    return parse_scenario(raw, _Checker(str(path), _line_map(node)), default_name=path.stem)


def parse_scenario(raw: dict[str, Any], check: _Checker, default_name: str = "experiment") -> Scenario:
    from vflsec.services.attacks import ATTACKS

    training = raw.get("training", {})
    if not isinstance(training, dict):
        raise check.fail(("training",), f"expected a mapping of options ({', '.join(spec_options())})")
    known = sorted({*SCENARIO_KEYS, *spec_options()})
    for key in raw:
        if key not in SCENARIO_KEYS and key not in spec_options():
            raise check.fail((str(key),), f"unknown key; known: {', '.join(known)}")
    for key in training:
        if key not in spec_options():
            raise check.fail(("training", str(key)), f"unknown key; known: {', '.join(spec_options())}")
        if key in raw:
            raise check.fail(("training", str(key)), "given at the top level too: give it once")
    fields: dict[str, Any] = {}
    # The federation's options: at the top level, or grouped under training: (a file's choice, same keys).
    for path, value in [*(((k,), v) for k, v in raw.items()), *((("training", k), v) for k, v in training.items())]:
        if path[-1] in spec_options() and value is not None:
            field_name, parsed = _spec_option(check, path, str(path[-1]), value)
            fields[field_name] = parsed
    model = fields.get("model", "lr")
    if model not in MODELS:
        raise check.fail(_key(raw, "model"), f"must be one of {', '.join(MODELS)}, got {model!r}")
    if model not in WIRED_MODELS:
        raise check.fail(
            _key(raw, "model"),
            f"{model!r} is not wired through the services yet (they train {', '.join(WIRED_MODELS)})",
        )
    if "topology" in fields and model != "splitnn":
        raise check.fail(_key(raw, "topology"), f"the {model} family has no topology (split-NN has)")
    if "passive_fraction" in raw:
        if "passive_features" in fields:
            raise check.fail(_key(raw, "passive_features"), "give passive_fraction or passive_features, not both")
        fields["passive_features"] = check.typed(raw, (), "passive_fraction", float, None)
    parties = check.typed(raw, (), "parties", str, "in_process")
    if parties not in ("in_process", "processes"):
        raise check.fail(("parties",), f"must be in_process or processes, got {parties!r}")
    fields["scaling"] = check.typed(raw, (), "scaling", str, "minmax")
    if "dataset" not in fields:
        raise check.fail(("dataset",), "required (digits, wine, a UCI name, a CSV path, ...)")
    try:
        spec = FederationSpec(**fields)
    except SpecError as exc:
        raise check.fail(_spec_key(str(exc), raw), str(exc)) from exc
    attacks = check.strings(raw, (), "attacks")
    exclude = check.strings(raw, (), "exclude_attacks")
    if attacks is not None and exclude is not None:
        raise check.fail(("exclude_attacks",), "excludes from the default attacks: give attacks or exclude_attacks")
    for key, names in (("attacks", attacks), ("exclude_attacks", exclude)):
        for i, name in enumerate(names or ()):
            if name not in ATTACKS:
                raise check.fail((key, str(i)), f"unknown attack {name!r}; known: {', '.join(sorted(ATTACKS))}")
    attack_options = check.typed(raw, (), "attack_options", dict, {})
    repetitions = check.typed(raw, (), "repetitions", int, 1)
    predictions = check.typed(raw, (), "predictions", int, 1000)
    for key, value in (("repetitions", repetitions), ("predictions", predictions)):
        if value < 1:
            raise check.fail((key,), f"must be at least 1, got {value}")
    sweep = parse_sweep(check.typed(raw, (), "sweep", dict, {}), spec, check)
    scenario = Scenario(
        name=check.typed(raw, (), "name", str, default_name),
        spec=spec,
        attacks=None if attacks is None else tuple(attacks),
        exclude_attacks=tuple(exclude or ()),
        attack_options=attack_options,
        predictions=predictions,
        release_model=check.typed(raw, (), "release_model", bool, True),
        repetitions=repetitions,
        sweep=sweep,
        baseline=check.typed(raw, (), "baseline", bool, True),
        in_process=parties == "in_process",
        model=model,
        source=raw,
        attacker=check.typed(raw, (), "attacker", str, "active"),
    )
    check_attackers(scenario, check)
    for cell in expand(scenario):  # every cell's chains and split, checked before anything runs
        try:
            cell_spec(scenario, cell).split  # noqa: B018
        except SpecError as exc:
            # Point at the swept value the refusal quotes, else at the sweep.
            quoted = [("sweep", a, str(sweep[a].index(v))) for a, v in cell.values if f"'{v}'" in str(exc)]
            split_key = "passive_fraction" if "passive_fraction" in raw else "passive_features"
            path = quoted[0] if quoted else (split_key,) if str(exc).startswith("passive features") else ("sweep",)
            raise check.fail(path, f"cell {cell.label}: {exc}" if cell.values else str(exc)) from exc
    return scenario


def _key(raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """Where a federation option sits in the file: at the top level or under training:."""
    return ("training", key) if key not in raw and key in raw.get("training", {}) else (key,)


def _spec_key(message: str, raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The scenario key a FederationSpec refusal is about (its messages name the field first)."""
    for key in sorted(spec_options(), key=len, reverse=True):
        field_name = opt.SPEC_FIELD.get(key, key)
        if message.startswith((field_name, field_name.replace("_", " "))):
            return _key(raw, key)
    if message.startswith("split-NN widths"):
        return _key(raw, "hidden")
    return ("release",) if "step" in message or "release" in message else ()


def parse_sweep(raw: dict[str, Any], spec: FederationSpec, check: _Checker) -> dict[str, list[Any]]:
    """Sweep axes: ``passive_fraction``, ``defense`` (whole release steps) or ``STEP.PARAM`` of a score or
    parameter release step."""
    from vflsec.services.defenses.release import PARAM_STEPS, SCORE_STEPS
    from vflsec.services.registry import parse_spec

    sweep: dict[str, list[Any]] = {}
    for axis, values in raw.items():
        path = ("sweep", str(axis))
        if not isinstance(values, list) or not values:
            raise check.fail(path, f"expected a non-empty list of values, got {values!r}")
        if axis == ATTACKER_AXIS:
            for i, v in enumerate(values):
                if not isinstance(v, str):
                    raise check.fail((*path, str(i)), f"an attacker is active or passive-N, got {v!r}")
        elif axis == TRAINING_DEFENSE_AXIS:  # each step parsed here; model and topology with each cell's spec
            values = [_training_chain(check, (*path, str(i)), v) for i, v in enumerate(values)]
        elif axis in FIXED_AXES:
            for i, v in enumerate(values):
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 < v < 1.0:
                    raise check.fail((*path, str(i)), f"a passive fraction lies in (0, 1), got {v!r}")
        elif axis == DEFENSE_AXIS:  # the step's own parameters are checked with each cell's chains
            for i, v in enumerate(values):
                step = parse_spec(v)[0] if isinstance(v, str) else None
                if step not in SCORE_STEPS and step not in PARAM_STEPS:
                    raise check.fail(
                        (*path, str(i)),
                        f"a defense is STEP:key=value,... of a release step ({', '.join([*SCORE_STEPS, *PARAM_STEPS])})"
                        f", got {v!r}",
                    )
        else:
            step, dot, param = str(axis).partition(".")
            registry = SCORE_STEPS if step in SCORE_STEPS else PARAM_STEPS if step in PARAM_STEPS else None
            if not dot or registry is None:
                raise check.fail(
                    path,
                    f"a sweep axis is passive_fraction or STEP.PARAM of a release step "
                    f"({', '.join([*SCORE_STEPS, *PARAM_STEPS])}), or {DEFENSE_AXIS}: [STEP:key=value, ...], or "
                    f"{ATTACKER_AXIS}: [active, passive-N, ...], or {TRAINING_DEFENSE_AXIS}: [a gradient defense "
                    "STEP:key=value (or a list of them), ...]",
                )
            accepted = registry.entry(step).parameters()
            if param not in accepted:
                raise check.fail(path, f"{step} has no parameter {param!r}; it takes {', '.join(accepted)}")
            for i, v in enumerate(values):
                if isinstance(v, dict | list):
                    raise check.fail((*path, str(i)), f"expected a scalar value, got {v!r}")
        sweep[str(axis)] = list(values)
    return sweep


def _training_chain(check: _Checker, path: tuple[str, ...], value: Any) -> str:
    """A training_defense value (one gradient-defense step, or a chain: a list of steps) as one string, the steps
    joined by CHAIN_JOIN; each step parsed by the gradient-defense registry, so a bad one is refused at its line."""
    from vflsec.services.defenses.gradients import GradientChain

    steps = value.split(CHAIN_JOIN) if isinstance(value, str) else value
    if not isinstance(steps, list) or not steps or not all(isinstance(v, str) and v.strip() for v in steps):
        raise check.fail(path, f"a training defense is STEP:key=value,... or a list of them, got {value!r}")
    steps = [v.strip() for v in steps]
    try:
        GradientChain.from_specs(steps)
    except ValueError as exc:
        raise check.fail(path, f"gradient defense {value!r}: {exc}") from exc
    return CHAIN_JOIN.join(steps)


def attackers(scenario: Scenario) -> list[str]:
    """Every curious party of the scenario: the swept ones, else the file's ``attacker``."""
    return [str(v) for v in scenario.sweep.get(ATTACKER_AXIS, [scenario.attacker])]


def check_attackers(scenario: Scenario, check: _Checker) -> None:
    """Each attacker is a party of the federation; a passive attacker's label attacks read the training gradients,
    so no release axis is swept with it (release chains act after training); listed attacks infer what some attacker
    of the scenario infers."""
    from vflsec.services.attacks import ATTACKS

    known = ["active", *(f"passive-{i}" for i in range(1, scenario.spec.n_passive + 1))]
    swept = ATTACKER_AXIS in scenario.sweep
    for i, attacker in enumerate(attackers(scenario)):
        if attacker not in known:
            path = ("sweep", ATTACKER_AXIS, str(i)) if swept else ("attacker",)
            raise check.fail(path, f"must be one of {', '.join(known)}, got {attacker!r}")
    targets = {"features" if a == "active" else "labels" for a in attackers(scenario)}
    if "labels" in targets:
        release = [a for a in scenario.sweep if a not in FIXED_AXES and a != TRAINING_DEFENSE_AXIS]
        if release:
            raise check.fail(
                ("sweep", release[0]),
                "a passive attacker's label attacks read the gradients of training; a release chain acts after it and "
                f"changes nothing they see: sweep {TRAINING_DEFENSE_AXIS} (gradient defenses) for it",
            )
    for i, name in enumerate(scenario.attacks or ()):
        if ATTACKS.entry(name).cls.target not in targets:
            raise check.fail(
                ("attacks", str(i)),
                f"{name} infers {ATTACKS.entry(name).cls.target}; this scenario's "
                f"attackers ({', '.join(attackers(scenario))}) infer {' and '.join(sorted(targets))}",
            )


# --- cells --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One point of the sweep (``None`` values: the undefended baseline of a release axis) and a repetition."""

    values: tuple[tuple[str, Any], ...]
    repetition: int

    @property
    def label(self) -> str:
        shown = [f"{a}={'none' if v is None else v}" for a, v in self.values]
        return ", ".join([*shown, f"rep {self.repetition}"])

    @property
    def row(self) -> tuple[tuple[str, Any], ...]:
        """The cell without its repetition: the rows of the tables average over repetitions."""
        return self.values


def expand(scenario: Scenario) -> list[Cell]:
    """The sweep's cartesian product x repetitions, plus (``baseline``) the undefended row per fixed-axis point:
    every release axis ``None`` at once, which the ratios and the DCS compare with."""
    axes = list(scenario.sweep)
    points = [tuple(zip(axes, combo, strict=True)) for combo in itertools.product(*scenario.sweep.values())]
    release_axes = [a for a in axes if a not in FIXED_AXES]
    if scenario.baseline and release_axes:
        fixed = [a for a in axes if a in FIXED_AXES]
        undefended = []
        for combo in itertools.product(*(scenario.sweep[a] for a in fixed)):
            given = dict(zip(fixed, combo, strict=True))
            undefended.append(tuple((a, given.get(a)) for a in axes))
        points = [*undefended, *points]  # the reference rows first
    return [Cell(point, rep) for point in points or [()] for rep in range(scenario.repetitions)]


def chains(scenario: Scenario, cell: Cell) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The cell's score and parameter release chains: the file's chains with the swept step parameters set
    (a step the chains lack is appended); a cell whose release axes are all ``None`` is undefended."""
    from vflsec.services.defenses.release import SCORE_STEPS
    from vflsec.services.registry import parse_spec

    release = [(a, v) for a, v in cell.values if a not in FIXED_AXES]
    if release and all(v is None for _, v in release):
        return (), ()
    release = [(a, v) for a, v in release if a != TRAINING_DEFENSE_AXIS]  # a training step, not a release one
    score = [parse_spec(s) for s in scenario.spec.score_release]
    param = [parse_spec(s) for s in scenario.spec.param_release]
    for axis, value in release:
        if axis == DEFENSE_AXIS:
            step, params = parse_spec(value)
            (score if step in SCORE_STEPS else param).append((step, params))
            continue
        step, _, key = axis.partition(".")
        chain = score if step in SCORE_STEPS else param
        found = next((params for name, params in chain if name == step), None)
        if found is None:
            found = {}
            chain.append((step, found))
        found[key] = str(value)

    def specs(chain: list[tuple[str, dict[str, str]]]) -> tuple[str, ...]:
        return tuple(name + (":" + ",".join(f"{k}={v}" for k, v in p.items()) if p else "") for name, p in chain)

    return specs(score), specs(param)


def gradient_chain(scenario: Scenario, cell: Cell) -> tuple[str, ...]:
    """The cell's gradient defenses: the file's ``gradient_defense`` chain with the swept training defense appended;
    none in an undefended cell (every defense axis ``None``)."""
    defense_axes = [v for a, v in cell.values if a not in FIXED_AXES]
    if defense_axes and all(v is None for v in defense_axes):
        return ()
    swept = dict(cell.values).get(TRAINING_DEFENSE_AXIS)
    return (*scenario.spec.gradient_defense, *([] if swept is None else str(swept).split(CHAIN_JOIN)))


def cell_attacker(scenario: Scenario, cell: Cell) -> str:
    return str(dict(cell.values).get(ATTACKER_AXIS) or scenario.attacker)


def cell_spec(scenario: Scenario, cell: Cell) -> FederationSpec:
    values = dict(cell.values)
    score, param = chains(scenario, cell)
    changes: dict[str, Any] = {"seed": scenario.spec.seed + cell.repetition, "score_release": score}
    changes["param_release"] = param
    changes["gradient_defense"] = gradient_chain(scenario, cell)
    if values.get("passive_fraction") is not None:
        changes["passive_features"] = float(values["passive_fraction"])
    return replace(scenario.spec, **changes)


def attack_scenario(scenario: Scenario, cell: Cell) -> harness.AttackScenario:
    from vflsec.services.attacks import ATTACKS

    spec = cell_spec(scenario, cell)
    attacker = cell_attacker(scenario, cell)
    target = "features" if attacker == "active" else "labels"
    attacks, options = scenario.attacks, scenario.attack_options
    if ATTACKER_AXIS in scenario.sweep:  # one list (and options) for every attacker: each takes its own kind
        attacks = tuple(a for a in attacks or () if ATTACKS.entry(a).cls.target == target) or None
        known = ATTACKS.names()  # an unknown name is kept: the harness's check refuses it by name
        options = {n: o for n, o in options.items() if n not in known or ATTACKS.entry(n).cls.target == target}
    if attacks is None and scenario.exclude_attacks:
        defaults = (
            harness.default_attacks(spec.score_release, spec.param_release, spec.model, spec.embedding_release)
            if target == "features" else harness.LABEL_ATTACKS.get(spec.model, ())
        )  # fmt: skip
        attacks = tuple(a for a in defaults if a not in scenario.exclude_attacks)
    return harness.AttackScenario(
        spec,
        attacks=attacks,
        attack_options=options,
        predictions=scenario.predictions,
        release_model=scenario.release_model,
        in_process=scenario.in_process,
        attacker=attacker,
    )


def _attacker_key(scenario: Scenario, cell: Cell) -> list[str]:
    """The attacker in a cell's digests when it is a passive party (the active one keeps the keys cells had before
    the attacker axis, so their results are found again)."""
    attacker = cell_attacker(scenario, cell)
    return [] if attacker == "active" else [attacker]


def _digest(document: Any) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:16]


def training_key(scenario: Scenario, cell: Cell) -> str:
    """Everything the trained model depends on (the chains and the attacks do not): cells sharing it share
    one trained base federation."""
    spec = replace(cell_spec(scenario, cell), score_release=(), param_release=())
    return _digest([_spec_document(spec), scenario.predictions, scenario.in_process, *_attacker_key(scenario, cell)])


def cell_key(scenario: Scenario, cell: Cell) -> str:
    """Everything the cell's result depends on: it names the cell's result file."""
    spec = cell_spec(scenario, cell)
    return _digest(
        [
            _spec_document(spec),
            scenario.predictions,
            scenario.attacks,
            scenario.exclude_attacks,
            scenario.attack_options,
            scenario.release_model,
            *_attacker_key(scenario, cell),
        ]
    )


def _spec_document(spec: FederationSpec) -> dict[str, Any]:
    fields = {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "dataset"}
    return {"dataset": spec.name, **fields}


# --- running a cell -----------------------------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, flush it to disk, rename it over ``path``: a reader sees the
    old file or the whole new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes 0600; results are measurements (no keys, no data rows), readable as the plots beside them.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def finished(out: Path, key: str) -> dict[str, Any] | None:
    """A cell's result if it was written whole; None if it is missing or unreadable (then it is redone)."""
    try:
        return json.loads((out / "cells" / f"{key}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between the workers of one machine; the OS drops it when its holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def trained_base(scenario: harness.AttackScenario, folder: Path) -> dict[str, Any]:
    """The trained base federation of a training group: trained once, by whichever cell gets here first; a
    base without its ``trained.json`` (a run killed while training) is trained again from scratch."""
    with _locked(folder.with_suffix(".lock")):
        marker = folder / "trained.json"
        if marker.exists():
            return json.loads(marker.read_text())
        shutil.rmtree(folder, ignore_errors=True)
        trained, _ = harness.train_base(scenario, folder)
        write_atomic(marker, json.dumps(trained))
        return trained


def run_cell(scenario: harness.AttackScenario, base: Path, trained: dict[str, Any]) -> dict[str, Any]:
    """One cell through the services: a federation dealt from the cell's spec, started from the base's trained
    checkpoints, releasing through the cell's chains; the harness's report on its recordings."""
    with temporary_folder("vflsec-cell-") as workdir:
        return harness.score_run(scenario, harness.run_from_base(scenario, base, trained, workdir))


def run_label_cell(scenario: harness.AttackScenario) -> dict[str, Any]:
    """A passive attacker's cell: train with the curious plugin at that party, then its label attacks on the gradients
    it recorded (harness.score_label_run). Training is what it attacks and no release axis is swept with it, so a
    cell is its own training group: no checkpoints (their fsync'd writes cost most of a plain step on Bank)."""
    scenario = scenario.with_spec(checkpoints=False)
    with temporary_folder("vflsec-cell-") as workdir:
        return harness.score_label_run(scenario, harness.run_scenario(scenario, workdir))


def cell_task(scenario: Scenario, cell: Cell, out: Path) -> dict[str, Any]:
    """Run one cell unless its result is already on disk; writes the result atomically and returns it."""
    key = cell_key(scenario, cell)
    done = finished(out, key)
    if done is not None:
        return done
    attack = attack_scenario(scenario, cell)
    if attack.attacker != "active":  # label attacks read training itself: no trained base to share (see run_label_cell)
        report = run_label_cell(attack)
    else:
        base = out / "train" / training_key(scenario, cell)
        trained = trained_base(attack, base)
        report = run_cell(attack, base, trained)
    result = {"key": key, "cell": {"values": dict(cell.values), "repetition": cell.repetition}, "report": report}
    write_atomic(out / "cells" / f"{key}.json", json.dumps(result))
    return result


def pending(scenario: Scenario, out: Path) -> tuple[list[Cell], list[Cell]]:
    """(cells already finished, cells still to run), the latter ordered so that concurrent workers start on
    different training groups first (one trains a base while the others train theirs)."""
    done, todo = [], []
    for cell in expand(scenario):
        (done if finished(out, cell_key(scenario, cell)) is not None else todo).append(cell)
    groups: dict[str, list[Cell]] = {}
    for cell in todo:
        groups.setdefault(training_key(scenario, cell), []).append(cell)
    interleaved = [c for batch in itertools.zip_longest(*groups.values()) for c in batch if c is not None]
    return done, interleaved


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_experiment(
    scenario: Scenario,
    out: Path,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    on_cell: Callable[[Cell, dict[str, Any] | None], None] | None = None,
) -> dict[str, Any]:
    """Every cell (finished ones are read back, not re-run), then results.json, results.md and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    done, todo = pending(scenario, out)
    for cell in done:
        if on_cell is not None:
            on_cell(cell, None)
    if todo:
        if ray_address is not None:
            _run_ray(scenario, todo, out, ray_address, on_cell)
        else:
            _run_pool(scenario, todo, out, workers or default_workers(), on_cell)
    results = [finished(out, cell_key(scenario, cell)) for cell in expand(scenario)]
    summary = summarise(scenario, [r for r in results if r is not None])
    write_atomic(out / "results.json", json.dumps(summary, indent=1, default=str))
    write_atomic(out / "results.md", markdown(summary))
    from vflsec.client.label_experiment import plot_labels

    summary["plots"] = [str(p) for p in [*plot(summary, out), *plot_labels(summary, out)]]
    shutil.rmtree(out / "train", ignore_errors=True)  # every cell is on disk: the bases have served
    return summary


def _run_pool(
    scenario: Scenario,
    todo: list[Cell],
    out: Path,
    workers: int,
    on_cell: Callable[[Cell, dict[str, Any] | None], None] | None,
) -> None:
    if workers == 1:
        for cell in todo:
            result = cell_task(scenario, cell, out)
            if on_cell is not None:
                on_cell(cell, result)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: gRPC and torch are not fork-safe once initialised.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(cell_task, scenario, cell, out): cell for cell in todo}
        for future in as_completed(futures):
            result = future.result()
            if on_cell is not None:
                on_cell(futures[future], result)


def _run_ray(
    scenario: Scenario,
    todo: list[Cell],
    out: Path,
    address: str,
    on_cell: Callable[[Cell, dict[str, Any] | None], None] | None,
) -> None:
    """Each cell as a Ray task on an existing cluster (``address``: ``auto``, ``local`` or ``host:port``); the
    output folder must be shared by its nodes (the bases' lock files and the cells' results live there)."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("--ray needs Ray: pip install 'vflsec[ray]'") from exc
    ray.init(address=None if address == "local" else address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(cell_task)
    refs = {task.remote(scenario, cell, out): cell for cell in todo}
    remaining = list(refs)
    while remaining:
        ready, remaining = ray.wait(remaining, num_returns=1)
        result = ray.get(ready[0])
        if on_cell is not None:
            on_cell(refs[ready[0]], result)


# --- summary: tables, DCS, plots ----------------------------------------------------------------------------

DCS_BETA = 0.5
DCS_FORMULA = (
    "DCS = 1 / (1 + sqrt((1 − β)·AP² + β·ΔMP²)), β = 0.5; AP = max(0, 1 − MSE_strongest / MSE_Half) (the "
    "strongest attacker's advantage over blind Half: 0 no better, 1 exact); ΔMP = max(0, accuracy of the "
    "undefended row − accuracy of this row)"
)
MSE_UNIT = "MSE per passive feature (features min-max scaled to [0, 1])"
_Y_STRONGEST = "strongest attack's MSE\n(per passive feature, features min-max scaled to [0, 1])"
_Y_ATTACK = "MSE\n(per passive feature, features min-max scaled to [0, 1])"
_MARKERS = "osD^v<>ph*"
BLOCKED_NOTE = "blocked: nothing released"  # a defense that leaves no attack anything to work on (withhold)
# Units of the swept release parameters on the plots' x axes; any other: "release-step parameter".
PARAM_UNITS = {"decimals": "decimal places kept", "epsilon": "dimensionless", "sigma": "score units"}


_Y_METRIC = {
    "mse": _Y_ATTACK,
    "accuracy": "attack accuracy (ye §6.3)\n(fraction of rows recovered, up to complement)",
    "cbr": "correct branching rate (luo §VI)\n(fraction of passive branchings taken as the truth does)",
}
_BASELINE_LABEL = {
    "half": "blind Half baseline",
    "majority": "majority-bit baseline",
    "random_path": "random-path baseline",
}


def _axis_label(axis: str) -> str:
    if axis == DEFENSE_AXIS:
        return "defense (release step and its parameters)"
    if axis == TRAINING_DEFENSE_AXIS:
        return "training defense (the active party's gradient defense and its parameters)"
    step, _, param = axis.partition(".")
    return f"{step} {param} ({PARAM_UNITS.get(param, 'release-step parameter')})"


def dcs(ap: float, dmp: float, beta: float = DCS_BETA) -> float:
    return 1.0 / (1.0 + math.sqrt((1.0 - beta) * ap**2 + beta * dmp**2))


def _stat(values: Sequence[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "n": len(values)}


def defense_label(values: Mapping[str, Any], chains: Sequence[str] = ()) -> str:
    """The swept release parameters of a row, or (none swept) its chains; "none" for an undefended row."""
    release = {a: v for a, v in values.items() if a not in FIXED_AXES}
    if release and all(v is None for v in release.values()):
        return "none"
    return ", ".join(f"{a}={v}" for a, v in release.items()) or " + ".join(chains) or "none"


def summarise(scenario: Scenario, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rows (a sweep point, averaged over its repetitions): accuracy, every attack's clipped and raw MSE
    (mean ± std), the blind baselines, the strongest attacker, its ratio to the undefended row and the DCS. A
    passive attacker's cells (label attacks) are summarised apart, as ``label_rows`` (summarise_labels)."""
    from vflsec.client.label_experiment import summarise_labels

    every = list(results)
    results = [r for r in every if not is_label_report(r["report"])]
    by_row: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_row.setdefault(json.dumps(r["cell"]["values"], sort_keys=False), []).append(r)
    rows = []
    for cells in by_row.values():
        values = cells[0]["cell"]["values"]
        reports = [c["report"] for c in cells]
        attacks: dict[str, Any] = {}
        for name in reports[0]["attacks"]:
            metrics = [_own_metric(rep, name) for rep in reports]
            ran = [(rep["attacks"][name], m) for rep, m in zip(reports, metrics, strict=True) if m is not None]
            if len(ran) == len(reports):
                first = ran[0][1]
                attacks[name] = {
                    "metric": first["name"],
                    "label": first["label"],
                    "higher_is_better": first["higher_is_better"],
                    "value": _stat([m["value"] for _, m in ran]),
                    "baseline": {
                        "name": first["baseline"]["name"],
                        "value": _stat([m["baseline"]["value"] for _, m in ran]),
                    },
                    "mse_clipped": _stat([a["mse_clipped"] for a, _ in ran]),
                    "mse": _stat([a["mse"] for a, _ in ran]),
                    "aware": ran[0][0]["aware"],
                }
            else:
                reason = next(
                    (rep["attacks"][name].get("not_applicable") for rep in reports if name in rep["attacks"]), None
                )
                reason = reason or next((m.get("not_applicable") for m in metrics if m), None)
                attacks[name] = {"not_applicable": reason or f"ran in {len(ran)} of {len(reports)} repetitions"}
        # The strongest attacker and the DCS compare MSEs: attacks judged by another figure stand beside them.
        ran = {n: a for n, a in attacks.items() if a.get("metric") == "mse"}
        best = min(ran, key=lambda n: ran[n]["mse_clipped"]["mean"]) if ran else None
        rows.append(
            {
                "values": values,
                "defense": defense_label(values, [*reports[0]["score_release"], *reports[0]["param_release"]]),
                "score_release": reports[0]["score_release"],
                "param_release": reports[0]["param_release"],
                "gradient_defense": list(gradient_chain(scenario, Cell(tuple(values.items()), 0))),
                "repetitions": len(reports),
                "accuracy": _stat([rep["accuracy"] for rep in reports]),
                "baselines": {b: _stat([rep["baselines"][b] for rep in reports]) for b in reports[0]["baselines"]},
                "attacks": attacks,
                "strongest": None
                if best is None
                else {"attack": best, "aware": ran[best]["aware"], "mse": ran[best]["mse_clipped"]["mean"]},
            }
        )
    for row in rows:
        reference = _undefended(row, rows)
        half = row["baselines"]["half"]["mean"]
        if row["strongest"] is None:  # no MSE-judged attack ran: another figure (CBR, ye's accuracy), or none at all
            nothing_ran = all("not_applicable" in a for a in row["attacks"].values())
            if nothing_ran and (row["score_release"] or row["param_release"]):  # nothing released to work on
                row["blocked"] = f"{BLOCKED_NOTE} that an attack could use"
                if reference is not None:
                    row["delta_mp"] = max(0.0, reference["accuracy"]["mean"] - row["accuracy"]["mean"])
            continue
        ap = max(0.0, 1.0 - row["strongest"]["mse"] / half)
        row["ap"] = ap
        if reference is not None and reference["strongest"] is not None:
            row["ratio_to_undefended"] = row["strongest"]["mse"] / reference["strongest"]["mse"]
            row["delta_mp"] = max(0.0, reference["accuracy"]["mean"] - row["accuracy"]["mean"])
            row["dcs"] = dcs(ap, row["delta_mp"])
    return {
        "name": scenario.name,
        "dataset": scenario.spec.name,
        "model": scenario.model,
        "backend": scenario.spec.backend,
        "sweep": scenario.sweep,
        "repetitions": scenario.repetitions,
        "predictions": scenario.predictions,
        "dcs_formula": DCS_FORMULA,
        "mse_unit": MSE_UNIT,
        "rows": rows,
        "verdict": verdict(rows),
        "cells": every,
        "scenario": scenario.source,
    } | summarise_labels(scenario, [r for r in every if is_label_report(r["report"])], rows)


# A defense "stops every attack" when the strongest attacker's advantage over Half is at most this (the attack
# command's verdict uses the same margin), "at no accuracy cost" when it loses at most this much accuracy.
STOPS_AP, FREE_DMP = harness.LEAK_MARGIN, 0.01


def verdict(rows: Sequence[dict[str, Any]]) -> str:
    """One line naming the defenses that stop every attack at no accuracy cost, or saying that none does."""
    defended = [r for r in rows if not _undefended_row(r)]
    if not defended:
        return "no defense in this sweep"
    stops = [r for r in defended if "blocked" in r or r.get("ap", 1.0) <= STOPS_AP]
    free = [r for r in stops if r.get("delta_mp", 0.0) <= FREE_DMP]
    rule = f"strongest attacker's advantage over Half ≤ {STOPS_AP:g}, accuracy cost ≤ {FREE_DMP:g}"
    if free:
        return f"meets the goal ({rule}): {', '.join(r['defense'] for r in free)}"
    if stops:
        cost = ", ".join(f"{r['defense']} (−{r.get('delta_mp', 0.0):.3f})" for r in stops)
        return f"none meets the goal ({rule}); these stop every attack at an accuracy cost: {cost}"
    scored = [r for r in defended if "dcs" in r]
    best = max(scored, key=lambda r: r["dcs"]) if scored else None
    tail = f"; best trade-off: {best['defense']} (DCS {best['dcs']:.3f})" if best else ""
    return f"none meets the goal ({rule}): every defense leaves an attack better than Half{tail}"


def is_label_report(report: dict[str, Any]) -> bool:
    """A passive attacker's cell report (label attacks), not the active party's (feature attacks)."""
    return report.get("attacker", "active") != "active"


def _own_metric(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    """One attack's own figure in one cell's report (harness.own_metric); a cell written before attacks carried it
    is read as MSE against Half. None: the attack did not run, or its figure has no value here."""
    result = report["attacks"].get(name, {})
    if "mse_clipped" not in result:
        return None
    label, higher, baseline = harness.METRICS["mse"]
    metric = result.get("metric") or {"name": "mse", "label": label, "higher_is_better": higher,
                                      "value": result["mse_clipped"],
                                      "baseline": {"name": baseline, "value": report["baselines"]["half"]}}  # fmt: skip
    return None if metric["value"] is None else metric


def _undefended(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The row without any defense at the same fixed-axis point (passive fraction), if the sweep has one."""
    fixed = {a: v for a, v in row["values"].items() if a in FIXED_AXES}
    for other in rows:
        if _undefended_row(other) and {a: v for a, v in other["values"].items() if a in FIXED_AXES} == fixed:
            return other
    return None


def _pm(stat: Mapping[str, float]) -> str:
    return f"{stat['mean']:.4g} ± {stat['std']:.2g}"


def markdown(summary: dict[str, Any]) -> str:
    from vflsec.client.label_experiment import label_markdown

    title = f"# {summary['name']}: {summary['dataset']}, {summary['model']}, backend {summary['backend']}"
    labels = label_markdown(summary)  # a passive attacker's rows, if any
    if labels and not summary["rows"]:
        return f"{title}\n\n{labels}"
    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    lines = [
        title,
        "",
        f"{summary['repetitions']} repetition(s) per row (mean ± std), {summary['predictions']} queried samples; "
        f"MSE: {summary['mse_unit']}, clipped to the cube (raw MSE in results.json). Strongest: the attack "
        "(naive or defense-aware) judged by MSE with the lowest mean MSE. Ratio: strongest MSE / the undefended row's.",
        "",
        f"{summary['dcs_formula']}.",
        "",
        *([f"Verdict: {summary['verdict']}.", ""] if "verdict" in summary else []),
        "| defense | " + "".join(f"{a} | " for a in fixed) + "accuracy | Half | RG | zero | strongest | "
        "MSE strongest | ratio to none | AP | ΔMP | DCS |",
        "|---|" + "---|" * (len(fixed) + 10),
    ]
    for row in summary["rows"]:
        best = row["strongest"]
        aware = " (aware)" if best is not None and best["aware"] else ""
        strongest_name = row.get("blocked", "—") if best is None else best["attack"] + aware
        mse = "—" if best is None else _pm(row["attacks"][best["attack"]]["mse_clipped"])

        def num(key: str, row: dict[str, Any] = row) -> str:
            return f"{row[key]:.4g}" if key in row else "—"

        lines.append(
            f"| {row['defense']} | "
            + "".join(f"{row['values'].get(a)} | " for a in fixed)
            + f"{_pm(row['accuracy'])} | {_pm(row['baselines']['half'])} | {_pm(row['baselines']['rg'])} | "
            f"{_pm(row['baselines']['zero'])} | {strongest_name} | {mse} | {num('ratio_to_undefended')} | "
            f"{num('ap')} | {num('delta_mp')} | {num('dcs')} |"
        )
    lines += [
        "",
        "## Every attack per row (mean ± std)",
        "",
        "Each attack by its own figure, beside the blind baseline that figure must beat: MSE (lower is better) "
        "against Half; ye's attack accuracy (higher is better; per binary passive column the best found vector, "
        "up to complement) against the majority bit; luo's correct branching rate (higher is better) against a "
        "random path. Every attack's clipped and raw MSE stand beside it.",
        "",
    ]
    for row in summary["rows"]:
        point = ", ".join(f"{a}={v}" for a, v in row["values"].items() if a in FIXED_AXES)
        lines += [f"### {row['defense']}" + (f" ({point})" if point else ""), ""]
        lines += ["| attack | metric | value | blind baseline | MSE | raw MSE |", "|---|---|---|---|---|---|"]
        for name, a in row["attacks"].items():
            label = name + (" (aware)" if a.get("aware") else "")
            if "not_applicable" in a:
                lines.append(f"| {label} | | not applicable: {a['not_applicable']} | | | |")
            else:
                better = "higher" if a["higher_is_better"] else "lower"
                lines.append(
                    f"| {label} | {a['label']} ({better} is better) | {_pm(a['value'])} | "
                    f"{a['baseline']['name']} {_pm(a['baseline']['value'])} | {_pm(a['mse_clipped'])} | "
                    f"{_pm(a['mse'])} |"
                )
        lines.append("")
    return "\n".join(lines) + (f"\n\n{labels}" if labels else "")


def summary_table(summary: dict[str, Any]) -> Any:
    """The headline table of results.md as a rich Table for the terminal (markdown wraps mid-row)."""
    from rich.table import Table

    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    table = Table(title=f"{summary['name']}: {summary['dataset']}, {summary['model']}, {summary['backend']}")
    for column in ("defense", *fixed, "accuracy", "Half", "strongest", "MSE strongest", "ratio", "AP", "ΔMP", "DCS"):
        table.add_column(column, overflow="fold")
    for row in summary["rows"]:
        best = row["strongest"]
        name = row.get("blocked", "—") if best is None else best["attack"] + (" (aware)" if best["aware"] else "")
        mse = "—" if best is None else _pm(row["attacks"][best["attack"]]["mse_clipped"])
        nums = [f"{row[k]:.4g}" if k in row else "—" for k in ("ratio_to_undefended", "ap", "delta_mp", "dcs")]
        table.add_row(row["defense"], *(str(row["values"].get(a)) for a in fixed), _pm(row["accuracy"]),
                      _pm(row["baselines"]["half"]), name, mse, *nums)  # fmt: skip
    return table


def _group(row: dict[str, Any], fixed: Sequence[str]) -> str:
    """The fixed-axis point of a row ("passive_fraction=0.4"), "" without fixed axes: one series per point."""
    return ", ".join(f"{a}={row['values'][a]}" for a in fixed)


def _undefended_row(row: dict[str, Any]) -> bool:
    return not row["score_release"] and not row["param_release"] and not row.get("gradient_defense")


def _short(defense: str) -> str:
    """A row's defense as the plots' notes name it: "withhold", not "defense=withhold"."""
    return defense.removeprefix(f"{DEFENSE_AXIS}=")


def privacy_utility_points(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The points of privacy_utility.png in drawing order: defended rows, then rows whose defense blocks every
    attack, drawn at their split's blind Half baseline (nothing is released, so the attacker can only guess
    blindly), then the undefended rows last, so that they are drawn on top of the others."""
    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    points: dict[str, list[dict[str, Any]]] = {"defended": [], "blocked": [], "undefended": []}
    for row in summary["rows"]:
        group = _group(row, fixed)
        suffix = f" ({group})" if group else ""
        point = {"defense": _short(row["defense"]), "group": group, "x": row["accuracy"]["mean"],
                 "xerr": row["accuracy"]["std"]}  # fmt: skip
        if "blocked" in row:
            label = f"{_short(row['defense'])}: {BLOCKED_NOTE} (at blind Half){suffix}"
            y = row["baselines"]["half"]["mean"]
            points["blocked"].append(point | {"kind": "blocked", "y": y, "yerr": 0.0, "label": label})
        elif row["strongest"] is not None:
            kind = "undefended" if _undefended_row(row) else "defended"
            s = row["attacks"][row["strongest"]["attack"]]["mse_clipped"]
            label = f"no defense{suffix}" if kind == "undefended" else f"{row['defense']}{suffix}"
            points[kind].append(point | {"kind": kind, "y": s["mean"], "yerr": s["std"], "label": label})
    return [*points["defended"], *points["blocked"], *points["undefended"]]


# How privacy_utility.png draws each kind of point: the undefended one on top, large and black.
_POINT_STYLE = {
    "defended": {"fmt": "o", "markersize": 6, "zorder": 2},
    "blocked": {"fmt": "X", "markersize": 10, "color": "dimgrey", "markeredgecolor": "white", "zorder": 3},
    "undefended": {"fmt": "*", "markersize": 16, "color": "black", "markeredgecolor": "white", "zorder": 5},
}


def axis_series(summary: dict[str, Any], axis: str) -> dict[str, dict[str, Any]]:
    """Per fixed-axis point, what mse_vs_<axis>.png draws: the strongest attacker's MSE at each value of ``axis``
    (``points``: x, mean, std), the rows that block every attack at their value (``blocked``: x, the blind Half),
    the undefended row's strongest MSE (``none``, or None) and the blind Half baseline (``half``). x is the value
    of a numeric axis, else the value's place in the sweep (categories keep the file's order)."""
    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    numeric = all(isinstance(v, int | float) for v in summary["sweep"][axis])
    series: dict[str, dict[str, Any]] = {}
    for row in summary["rows"]:
        group = series.setdefault(_group(row, fixed), {"points": [], "blocked": [], "none": None, "half": None})
        group["half"] = group["half"] if group["half"] is not None else row["baselines"]["half"]["mean"]
        value = row["values"].get(axis)
        if value is None:  # the undefended row of a swept parameter: a level, not a point on the axis
            if _undefended_row(row) and row["strongest"] is not None:
                group["none"] = row["attacks"][row["strongest"]["attack"]]["mse_clipped"]["mean"]
            continue
        x = value if numeric else summary["sweep"][axis].index(value)
        if "blocked" in row:
            group["blocked"].append({"x": x, "y": row["baselines"]["half"]["mean"], "defense": _short(row["defense"])})
        elif row["strongest"] is not None:
            s = row["attacks"][row["strongest"]["attack"]]["mse_clipped"]
            group["points"].append({"x": x, "mean": s["mean"], "std": s["std"]})
    for group in series.values():
        if numeric:
            group["points"].sort(key=lambda p: p["x"])
    return {g: s for g, s in series.items() if s["points"] or s["blocked"]}


def plot(summary: dict[str, Any], out: Path) -> list[Path]:
    """Privacy–utility (strongest MSE vs accuracy), strongest MSE vs each release axis, MSE per attack vs the
    passive fraction; every axis labelled with its unit, every figure with a legend. A defense that blocks every
    attack is drawn at the blind Half baseline and annotated; the undefended point is drawn on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in summary["rows"] if r["strongest"] is not None]  # the MSE figures' rows
    written: list[Path] = []
    if not summary["rows"]:
        return written
    title = f"{summary['name']} ({summary['dataset']}, {summary['backend']})"

    def save(fig: Any, ax: Any, name: str) -> None:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=150)
        plt.close(fig)
        written.append(out / name)

    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    all_groups: dict[str, list[dict[str, Any]]] = {}
    for row in summary["rows"]:
        all_groups.setdefault(_group(row, fixed), []).append(row)

    if rows:
        fig, ax = plt.subplots(figsize=(9.0, 4.6))
        halves: dict[str, float] = {}
        for point in privacy_utility_points(summary):
            halves.setdefault(point["group"], all_groups[point["group"]][0]["baselines"]["half"]["mean"])
            ax.errorbar(point["x"], point["y"], xerr=point["xerr"], yerr=point["yerr"], capsize=3,
                        label=point["label"], **_POINT_STYLE[point["kind"]])  # fmt: skip
            if point["kind"] != "defended":
                note = "no defense" if point["kind"] == "undefended" else f"{point['defense']}: {BLOCKED_NOTE}"
                ax.annotate(note, (point["x"], point["y"]), xytext=(6, 6), textcoords="offset points", fontsize=7,
                            zorder=6)  # fmt: skip
        for i, (group, half) in enumerate(halves.items()):  # Half depends on the passive columns: a line per split
            label = "blind Half baseline" + (f" ({group})" if group else "")
            ax.axhline(half, color="grey", linestyle=("--", "-.", ":")[i % 3], label=label, zorder=1)
        ax.set_xlabel("accuracy on the queried samples (fraction correct)")
        ax.set_ylabel(_Y_STRONGEST, fontsize=8)
        ax.set_title(f"privacy–utility: {title}", fontsize=9)
        save(fig, ax, "privacy_utility.png")

    for axis in (a for a in summary["sweep"] if a not in FIXED_AXES and rows):
        fig, ax = plt.subplots(figsize=(9.0, 4.6))
        values = summary["sweep"][axis]
        numeric = all(isinstance(v, int | float) for v in values)
        for i, (group, series) in enumerate(axis_series(summary, axis).items()):
            color, suffix = f"C{i}", f" ({group})" if group else ""
            points = series["points"]
            if points:
                ax.errorbar([p["x"] for p in points], [p["mean"] for p in points], capsize=3, color=color,
                            yerr=[p["std"] for p in points], marker="o", label=f"strongest attack{suffix}",
                            linestyle="-" if numeric else "none")  # categories: no line between them  # fmt: skip
            for j, b in enumerate(series["blocked"]):  # no MSE to draw: the attacker is left with a blind guess
                ax.plot(b["x"], b["y"], "X", color=color, markersize=10, zorder=4,
                        label=f"{BLOCKED_NOTE} (at blind Half){suffix}" if j == 0 else None)  # fmt: skip
                ax.annotate(BLOCKED_NOTE.replace(": ", ":\n"), (b["x"], b["y"]), xytext=(0, -9),
                            textcoords="offset points", fontsize=7, ha="center", va="top")  # fmt: skip
            if series["none"] is not None:
                ax.axhline(series["none"], linestyle=":", color=color, label=f"no defense{suffix}")
            ax.axhline(series["half"], color=color, linestyle="--", alpha=0.6, label=f"blind Half baseline{suffix}")
        ax.set_xlabel(_axis_label(axis))
        if numeric and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_xscale("log")
        if numeric:
            ax.set_xticks(sorted(values), [str(v) for v in sorted(values)])
        else:
            ax.set_xticks(range(len(values)), [str(v) for v in values], rotation=25, ha="right", fontsize=8)
            ax.set_xlim(-0.5, len(values) - 0.5)
        ax.set_ylabel(_Y_STRONGEST, fontsize=8)
        ax.set_title(f"strongest attack vs {axis}: {title}", fontsize=9)
        save(fig, ax, f"mse_vs_{axis.replace('.', '_')}.png")

    def per_attack(members: list[dict[str, Any]], axis: str, metric: str, xlabel: str, name: str, what: str) -> None:
        """Every attack judged by ``metric`` against ``axis`` over ``members`` (one row per x), with the baseline.
        Rows that block every attack have no figure (nor a baseline: no attack ran); the legend names them."""
        blocked = [_short(r["defense"]) for r in members if "blocked" in r]
        members = [r for r in members if "blocked" not in r]
        if not members:
            return
        attacks = [n for n in members[0]["attacks"] if all(r["attacks"].get(n, {}).get("metric") == metric
                                                           for r in members)]  # fmt: skip
        if not attacks:
            return
        numeric = all(isinstance(r["values"][axis], int | float) for r in members)
        xs = [r["values"][axis] if numeric else str(r["values"][axis]) for r in members]
        fig, ax = plt.subplots(figsize=(9.0, 4.6))
        for i, attack in enumerate(attacks):  # distinct markers and dashes: attacks that tie stay visible
            stats = [r["attacks"][attack]["value"] for r in members]
            ax.errorbar(xs, [s["mean"] for s in stats], yerr=[s["std"] for s in stats], capsize=2, label=attack,
                        marker=_MARKERS[i % len(_MARKERS)], markersize=8 - 0.4 * i, alpha=0.8,
                        linestyle=("-", "--", "-.", ":")[i % 4] if numeric else "none")  # fmt: skip
        baseline = members[0]["attacks"][attacks[0]]["baseline"]["name"]
        ax.plot(xs, [r["attacks"][attacks[0]]["baseline"]["value"]["mean"] for r in members], "k--",
                label=_BASELINE_LABEL[baseline])  # fmt: skip
        if blocked:  # a legend entry without a line: the note sits beside the legend, over no data
            ax.plot([], [], " ", label=f"not drawn: {', '.join(blocked)} ({BLOCKED_NOTE}, no attack ran)")
        if numeric:
            ax.set_xticks(sorted(set(xs)), [str(x) for x in sorted(set(xs))])
        else:
            plt.setp(ax.get_xticklabels(), rotation=25, ha="right", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(_Y_METRIC[metric], fontsize=8)
        ax.set_title(f"{harness.METRICS[metric][0]} per attack vs {axis}{what}: {title}", fontsize=8)
        save(fig, ax, name)

    metrics = sorted({a["metric"] for r in summary["rows"] for a in r["attacks"].values() if "metric" in a})
    for axis in (a for a in summary["sweep"] if a not in FIXED_AXES):  # MSE's is the strongest-attack plot above
        for metric in (m for m in metrics if m != "mse"):
            for group, members in all_groups.items():
                swept = [r for r in members if r["values"].get(axis) is not None]
                if all(isinstance(r["values"][axis], int | float) for r in swept):
                    swept.sort(key=lambda r: r["values"][axis])
                suffix = f" ({group})" if group else ""
                tag = re.sub(r"[^A-Za-z0-9]+", "_", f"{axis}_{group}".strip("_"))
                per_attack(swept, axis, metric, _axis_label(axis), f"{metric}_vs_{tag}.png", suffix)

    if "passive_fraction" in summary["sweep"]:
        defenses: dict[str, list[dict[str, Any]]] = {}
        for row in summary["rows"]:
            defenses.setdefault(row["defense"], []).append(row)
        for defense, members in defenses.items():
            members.sort(key=lambda r: r["values"]["passive_fraction"])
            tag = re.sub(r"[^A-Za-z0-9]+", "_", defense)
            for metric in metrics:
                per_attack(members, "passive_fraction", metric,
                           "passive fraction (share of feature columns held by the passive parties)",
                           f"{metric}_vs_passive_fraction_{tag}.png", f", defense {defense}")  # fmt: skip
    return written
