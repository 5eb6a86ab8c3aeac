"""Experiments' scenario files: a YAML scenario validated and expanded into cells (sweep axes x repetitions), each
cell an attack run through the real services (client/experiments/harness.py; runner.py runs them, resumable, in a
process pool or on Ray, and results.py summarises them as results.json, results.md and PNG plots).

Training is the expensive part, and a cell that differs from another only in its release chains or its
attacks would train the very same model. So cells are grouped by everything training depends on; the first
cell of a group trains a *base* federation once (with session checkpoints on) and keeps its state folders;
every cell of the group then deals a fresh federation from the same spec (same seed: the same data files),
copies the base's checkpoints and the curious store into it, and starts its parties with its own release
chains. The parties resume the trained session from their checkpoints, and the cell's coordinator releases
the model and the scores through the cell's chains: every release still goes through the real services.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vflsec.client import options as opt
from vflsec.client.experiments import harness, runs
from vflsec.client.federation.launcher import FederationSpec, SpecError

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


@functools.cache
def spec_options() -> dict[str, Any]:
    """The federation options of `vflsec attack` (and `demo`), by parameter name: a scenario's federation keys, each
    converted by the CLI's own parser and bounds (client/options.py declares them once, FEDERATION_OPTIONS), so a
    scenario reaches every training and data option the CLI has, under the CLI's name."""
    fields = FederationSpec.__dataclass_fields__
    return {p.name: p for p in opt.federation_command().params if opt.SPEC_FIELD.get(p.name, p.name) in fields}


def _spec_option(check: _Checker, path: tuple[str, ...], name: str, value: Any) -> tuple[str, Any]:
    """A scenario value through its CLI option's parser (a list: a repeatable option's items, else one
    comma-separated value); the FederationSpec field and the parsed value."""
    import typer

    option = spec_options()[name]
    if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict | list) for v in value)):
        raise check.fail(path, f"expected a value or a list of values, got {value!r}")
    items = value if isinstance(value, list) else [value]
    texts = [str(v) for v in items] if option.multiple else [",".join(str(v) for v in items)]
    try:
        parsed = opt.federation_command().make_context("attack", [f"{option.opts[0]}={t}" for t in texts]).params[name]
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
    check_attack_options(scenario, check)
    return scenario


def cell_attacks(attack: harness.AttackScenario) -> list[str]:
    """The attacks a cell runs: its list, else the defaults of its attacker (the harness's choice)."""
    if attack.attacks is not None:
        return list(attack.attacks)
    spec = attack.spec
    if attack.attacker != "active":
        return list(harness.LABEL_ATTACKS.get(spec.model, ()))
    return list(harness.default_attacks(spec.score_release, spec.param_release, spec.model, spec.embedding_release))


def check_attack_options(scenario: Scenario, check: _Checker) -> None:
    """Options of an attack that no cell runs are refused (as `vflsec attack --attack-option` refuses them), and
    each attack's options are built once through the registry, so a bad key is refused at its line."""
    ran: dict[str, harness.AttackScenario] = {}  # each attack -> a cell that runs it
    for cell in expand(scenario):
        attack = attack_scenario(scenario, cell)
        for name in cell_attacks(attack):
            ran.setdefault(name, attack)
    for name, params in scenario.attack_options.items():
        path = ("attack_options", str(name))
        if name not in ran:
            raise check.fail(
                path, f"options for {name}, which no cell of this scenario runs (its attacks: {', '.join(ran)})"
            )
        if not isinstance(params, dict):
            raise check.fail(path, f"expected a mapping of {name}'s options, got {params!r}")
        try:
            runs.check_attack_options({name: params}, [name], ran[name].spec.model)
        except ValueError as exc:
            raise check.fail(path, str(exc)) from exc


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


def _attacker_key(scenario: Scenario, cell: Cell, *, result: bool = False) -> list[str]:
    """The attacker in a cell's digests when it is a passive party, and in its result's when the attacker is swept
    (that result's row carries the attacker: a folder shared with a scenario without the axis must not hand it
    back). The active party of a scenario without the axis keeps the keys cells had before it, so they are found
    again; its training depends on no attacker key (the same base trains either way)."""
    attacker = cell_attacker(scenario, cell)
    return [] if attacker == "active" and not (result and ATTACKER_AXIS in scenario.sweep) else [attacker]


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
            *_attacker_key(scenario, cell, result=True),
        ]
    )


def _spec_document(spec: FederationSpec) -> dict[str, Any]:
    fields = {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "dataset"}
    return {"dataset": spec.name, **fields}
