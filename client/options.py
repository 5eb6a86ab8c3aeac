"""Every option that more than one ``vflsec`` command takes, declared once: flag, help text, bounds, parsing.

A command only picks its default where it declares the parameter (``dataset: options.Dataset = "digits"``).
A flag that names a different thing in different commands (``--out``: a federation folder, a CA folder, a
certificate file; ``--party``, ``--address``, ``--days``) stays with its command, as sharing it would share a
help text that is wrong for some of them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from vflsec.services.data.datasets import RandomColumns


def _number(text: str) -> int | float:
    number = float(text)
    return int(number) if number.is_integer() and number >= 1 else number


def passive_features(value: str | None) -> int | float | list[str] | RandomColumns | None:
    """A count (last N columns), a fraction in (0, 1), ``random:COUNT|FRACTION[:SEED]``, or comma-separated
    column names."""
    if value is None:
        return None
    if value.startswith("random:"):
        amount, _, seed = value.removeprefix("random:").partition(":")
        try:
            return RandomColumns(_number(amount), int(seed) if seed else None)
        except ValueError:
            raise typer.BadParameter(f"expected random:COUNT|FRACTION[:SEED], got {value!r}") from None
    try:
        return _number(value)
    except ValueError:
        return [c.strip() for c in value.split(",") if c.strip()]


def widths(value: str) -> tuple[int, ...]:
    """Comma-separated layer widths ("" for none)."""
    try:
        return tuple(int(w) for w in value.split(",") if w.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint="--hidden") from None


def attack_options(values: list[str] | None) -> dict[str, dict[str, str]]:
    """``ATTACK.KEY=VALUE`` items -> {attack: {key: value}}; the registry parses and checks the values."""
    grouped: dict[str, dict[str, str]] = {}
    for item in values or ():
        target, sep, value = item.partition("=")
        attack, dot, key = target.partition(".")
        if not (sep and dot and attack.strip() and key.strip()):
            raise typer.BadParameter(f"expected ATTACK.KEY=VALUE, got {item!r}", param_hint="--attack-option")
        grouped.setdefault(attack.strip(), {})[key.strip()] = value.strip()
    return grouped


def embedding_steps(values: list[str] | None) -> list[str]:
    """``--embedding-release`` values -> one spec per step, in order. One value may hold several steps separated by
    commas (``masquerade:m=1,embedding_noise:sigma=0.01``): a piece with ``:``, or without ``=``, starts a step,
    any other piece is one more ``key=value`` of the step before it."""
    steps: list[str] = []
    for value in values or ():
        for piece in (p.strip() for p in value.split(",")):
            if not piece:
                continue
            if ":" in piece or "=" not in piece:
                steps.append(piece)
            elif steps:
                steps[-1] += f",{piece}" if ":" in steps[-1] else f":{piece}"
            else:
                raise typer.BadParameter(
                    f"expected STEP[:key=value,...], got {value!r}", param_hint="--embedding-release"
                )
    return steps


# --- the federation: dataset and split
Dataset = Annotated[
    str, typer.Option("--dataset", help="breast_cancer | wine | digits | iris | a UCI name | a CSV or .parquet path.")
]
Label = Annotated[
    str | None, typer.Option("--label", help="Label column of a CSV dataset.", show_default="the last column")
]
Passive = Annotated[int, typer.Option("--passive", min=1, max=8, help="Number of passive parties.")]
PassiveFeatures = Annotated[
    Any,  # int | float | list[str] | None, parsed by passive_features
    typer.Option(
        "--passive-features",
        parser=passive_features,
        metavar="SPEC",
        help="Passive columns: a count (the last N), a fraction (of the last), random:COUNT|FRACTION[:SEED], "
        "or comma-separated names.",
        show_default="all columns, split evenly, active party first",
    ),
]
Encoding = Annotated[
    str,
    typer.Option(
        "--encoding",
        help="Categorical columns: onehot | ordinal (codes) | target (mean label per category, fitted by "
        "the dealer on the training rows: it sees the labels, as in the papers).",
    ),
]
Seed = Annotated[
    int,
    typer.Option(
        "--seed",
        help="Seeds the dealt ID overlap, the held-out and query splits and the batch order; never a release "
        "draw (OS entropy).",
    ),
]

# --- the release chains at the coordinator
Release = Annotated[
    list[str] | None,
    typer.Option(
        "--release",
        help="Score-release step STEP[:key=value,...] at the coordinator; repeatable, in order.",
        show_default="none",
    ),
]
ParamRelease = Annotated[
    list[str] | None,
    typer.Option(
        "--param-release",
        help="Parameter-release step STEP[:key=value,...]; repeatable, in order. Trees keep the passive thresholds "
        "with their owners unless given `thresholds` (luo's PRA / GRN-RF setting: `attack --model tree --attacks pra "
        "--param-release thresholds`).",
        show_default="none",
    ),
]

# --- the passive parties' own defenses (their [defenses] embedding)
EmbeddingRelease = Annotated[
    list[str] | None,
    typer.Option(
        "--embedding-release",
        metavar="STEP[:key=value,...][,STEP...]",
        help="split-NN active-top: every passive party's own defense of its z_p before it leaves ([defenses] "
        "embedding), in order: masquerade[:m=M,rank=R,drop=binary|random] (ye Alg. 3; m default ⌈log₂ n⌉; drop "
        "default binary: Q leaves out the binary columns' directions, random: ye's), embedding_noise:sigma=S"
        "[,max_answers=K] (each row answered at most K times a session, default 128). Comma-separated or repeatable.",
        show_default="none",
    ),
]

# --- the active party's gradient defenses (the session's SplitNnModel.gradient_defense)
GradientDefense = Annotated[
    list[str] | None,
    typer.Option(
        "--gradient-defense",
        metavar="STEP[:key=value,...]",
        help="split-NN coordinator-top: a defense the active party runs on ∂L/∂h before forwarding it to the passive "
        "parties (label_dp: on the training labels); repeatable, in order: max_norm, marvell[:scale=S], "
        "dp_gaussian[:noise_multiplier=Z,clip=C,delta=D], sparsification[:keep=F], discrete_sgd[:levels=L], "
        "label_dp[:epsilon=E] (docs/defenses.md).",
        show_default="none",
    ),
]

# --- the active party's partition defenses (the session's TreeModel.partition_defense)
PartitionDefense = Annotated[
    list[str] | None,
    typer.Option(
        "--partition-defense",
        metavar="STEP[:key=value,...]",
        help="tree / forest: nodes whose training rows no passive party sees, grown from the active party's features "
        "alone; repeatable: complete_secure[:trees=K] (the first K trees, FATE's complete-secure mode), "
        "passive_depth[:depth=L] (passive parties searched only above depth L) (docs/defenses.md).",
        show_default="none",
    ),
]

# --- training (the operator's session)
Backend = Annotated[str, typer.Option("--backend", help="ckks | plain")]
Model = Annotated[str, typer.Option("--model", help="Model family: lr | splitnn | tree | forest.")]
MaxDepth = Annotated[int, typer.Option("--max-depth", min=0, help="tree / forest: depth (0: tree 5, forest 3).")]
Trees = Annotated[int, typer.Option("--trees", min=0, help="forest: number of trees (0: 100).")]
Topology = Annotated[
    str,
    typer.Option(
        "--topology",
        help="split-NN: coordinator-top (embeddings summed under CKKS) | active-top (ye's; plain backend only).",
    ),
]
Embedding = Annotated[int, typer.Option("--embedding", min=1, help="split-NN: width E of every bottom's output.")]
Hidden = Annotated[
    str, typer.Option("--hidden", help="split-NN: the top model's hidden widths, comma-separated (e.g. 32,16).")
]
Epochs = Annotated[int, typer.Option("--epochs", min=1, help="Training epochs.")]
# The commands that train through the spec (attack, demo, run, curve): 0 follows the training rows
# (FederationSpec.epochs_for). The benches time a fixed number of epochs (Epochs).
AutoEpochs = Annotated[
    int,
    typer.Option(
        "--epochs",
        min=0,
        help="Training epochs. 0: for LR min(30, max(3, ceil(200,000 / training rows))), so 30 up to 6,667 rows; "
        "30 for split-NN or with early stopping.",
    ),
]
BatchSize = Annotated[
    int,
    typer.Option(
        "--batch-size",
        min=0,
        help="0: max(64, training rows / 32), raised to the federation's minimum batch (2 x the widest block).",
    ),
]
LearningRate = Annotated[float, typer.Option("--learning-rate", min=0.0, help="The optimizer's step size.")]
Optimizer = Annotated[str, typer.Option("--optimizer", help="adam | sgd")]
L2 = Annotated[float, typer.Option("--l2", min=0.0, help="L2 penalty on the weights (not the bias).")]
TrainRows = Annotated[
    int | None,
    typer.Option(
        "--train-rows",
        min=1,
        help="Train on a seeded subsample of at most N of the training rows.",
        show_default="every training row",
    ),
]
EarlyStoppingPatience = Annotated[
    int,
    typer.Option(
        "--early-stopping-patience",
        min=0,
        metavar="N",
        help="Stop when the validation accuracy has not improved for N epochs (0: off). Validation rows are "
        "held out of training and of the attack, scored through the coordinator (query budget).",
    ),
]
ValidationFraction = Annotated[
    float,
    typer.Option(
        "--validation-fraction",
        metavar="F",
        help="Share of the training rows held out for early stopping, in (0, 1) (stratified, seeded).",
    ),
]
ComparePlain = Annotated[
    bool, typer.Option("--compare-plain/--no-compare-plain", help="Also train on the plain backend and report both.")
]

# --- output and identity
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.", show_default="off")]
# Optional in type so that `health` can take a party's --config instead; the other commands require it.
TlsDir = Annotated[
    Path | None,
    typer.Option(
        "--tls-dir", help="The caller's tls/ folder (ca.pem, cert.pem, key.pem).", show_default="none"
    ),
]
Rows = Annotated[
    int, typer.Option("--rows", help="Rows of the synthetic data (bench he/plugin: when Credit default is absent).")
]

# --- the options above as FederationSpec fields (the CLI's `_spec` and a scenario file's keys, experiment.py)
# The field an option sets where its parameter has another name; every other option sets the field of its name.
SPEC_FIELD = {"passive": "n_passive", "release": "score_release"}


def spec_value(name: str, value: Any) -> tuple[str, Any]:
    """An option's parsed value as the FederationSpec field it sets (``--hidden``'s text as the widths)."""
    return SPEC_FIELD.get(name, name), widths(value) if name == "hidden" else value


# --- the federation a training command deals: one declaration of the options `demo` and `attack` share
# (parameter, its declaration, its default; a command may pick other defaults: attack trains digits, demo
# breast_cancer). A scenario file's federation keys are these options too (experiments, through
# federation_command).
FEDERATION_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("dataset", Dataset, "breast_cancer"),
    ("label", Label, None),
    ("passive", Passive, 1),
    ("passive_features", PassiveFeatures, None),
    ("encoding", Encoding, "onehot"),
    ("backend", Backend, "ckks"),
    ("model", Model, "lr"),
    ("topology", Topology, "coordinator-top"),
    ("embedding", Embedding, 16),
    ("hidden", Hidden, "32"),
    ("max_depth", MaxDepth, 0),
    ("trees", Trees, 0),
    ("epochs", AutoEpochs, 30),
    ("batch_size", BatchSize, 0),
    ("learning_rate", LearningRate, 0.1),
    ("optimizer", Optimizer, "adam"),
    ("l2", L2, 1e-4),
    ("train_rows", TrainRows, None),
    ("early_stopping_patience", EarlyStoppingPatience, 0),
    ("validation_fraction", ValidationFraction, 0.2),
    ("seed", Seed, 0),
    ("release", Release, None),
    ("param_release", ParamRelease, None),
    ("embedding_release", EmbeddingRelease, None),
    ("gradient_defense", GradientDefense, None),
    ("partition_defense", PartitionDefense, None),
)


@dataclass(frozen=True)
class Federation:
    """The federation options one command was given, by parameter name (``federation.values["dataset"]``)."""

    values: dict[str, Any]

    def spec_fields(self) -> dict[str, Any]:
        """The options as FederationSpec keyword arguments: --hidden's widths, the release chains as sequences."""
        fields = dict(spec_value(name, value) for name, value in self.values.items())
        fields["embedding_release"] = embedding_steps(self.values["embedding_release"])
        for chain in ("score_release", "param_release", "gradient_defense", "partition_defense"):
            fields[chain] = fields[chain] or ()
        return fields


def federation_options(**defaults: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command takes the federation options where it declares ``federation: Federation``: the parameter
    becomes the options of FEDERATION_OPTIONS (with ``defaults`` for some), and the command receives their values
    as one :class:`Federation`."""
    unknown = set(defaults) - {name for name, _, _ in FEDERATION_OPTIONS}
    if unknown:
        raise TypeError(f"not federation options: {sorted(unknown)}")

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index("federation")
        group = [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind,
                              default=defaults.get(name, default))
            for name, kind, default in FEDERATION_OPTIONS
        ]  # fmt: skip

        @functools.wraps(command)
        def with_federation(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name, _, _ in FEDERATION_OPTIONS}
            return command(*args, federation=Federation(values), **kwargs)

        merged = [*params[:at], *group, *params[at + 1 :]]
        with_federation.__signature__ = signature.replace(parameters=merged)  # type: ignore[attr-defined]
        with_federation.__annotations__ = {p.name: p.annotation for p in merged} | {"return": None}
        return with_federation

    return decorate


@functools.cache
def federation_command() -> Any:
    """The federation options alone as a click command (typer's own click): a scenario file's federation keys
    are parsed by it, with the CLI's parsers and bounds."""
    import typer.main

    app = typer.Typer()

    @app.command()
    @federation_options()
    def federation(federation: Federation) -> None:
        """The federation options."""

    return typer.main.get_command(app)
