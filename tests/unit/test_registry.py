"""The one plug-in convention (services/registry.py) for score steps, parameter steps and attacks."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from typing import Any, Literal

import pytest

from vflsec.client.experiments.harness import evaluate_attacks
from vflsec.services.attacks import ATTACKS, NotApplicable, make_attack
from vflsec.services.attacks.synthetic import lr_task
from vflsec.services.defenses import release
from vflsec.services.defenses.embeddings import EMBEDDING_STEPS
from vflsec.services.defenses.release import (
    PARAM_STEPS,
    SCORE_STEPS,
    ParamReleaseChain,
    ReleaseConfigError,
    ScoreReleaseChain,
)
from vflsec.services.models.tree.partitions import PARTITION_STEPS
from vflsec.services.registry import ANY_SCORES, Plugin, PluginError, Registry, parse_value

# One spec per built-in release step, with non-default values where a parameter has a choice.
SCORE_SPECS = [
    "pps_b:alpha=2,scheme=2",  # it recomputes the scores from the logits: first in a chain
    "rounding:decimals=3",
    "gaussian:epsilon=0.5,delta=1e-6",
    "privee:epsilon=0.1,preset=authors",
    "privee:epsilon=0.2,basis=householder,per=vector",
    "privee_pp:epsilons=0.05;0.08;0.1,per=batch",
    "label_only",
    "rank_only",
]
PARAM_SPECS = [
    "ppsa:H=orthonormal",
    "varasteh:epsilon=0.05,case=ii,secret_epsilon=yes,starts=2",
    "withhold",
    "thresholds",
]
REGISTRIES = {
    "score": SCORE_STEPS, "param": PARAM_STEPS, "attack": ATTACKS, "embedding": EMBEDDING_STEPS,
    "partition": PARTITION_STEPS,
}  # fmt: skip


def _spec(name: str, params: dict[str, Any]) -> str:
    """A spec string for these parameter values (tuples as ``a;b``), the inverse of the shared parser."""
    text = {k: ";".join(map(str, v)) if isinstance(v, tuple) else str(v) for k, v in params.items()}
    return name + ":" + ",".join(f"{k}={v}" for k, v in text.items())


def test_every_built_in_spec_is_covered() -> None:
    assert {s.partition(":")[0] for s in SCORE_SPECS} == set(SCORE_STEPS)
    assert {s.partition(":")[0] for s in PARAM_SPECS} == set(PARAM_STEPS)


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_the_name_is_written_once_in_the_registration(kind: str) -> None:
    registry = REGISTRIES[kind]
    for name in registry:
        entry = registry.entry(name)
        body = inspect.getsource(entry.cls)
        assert not re.search(r"^\s+name\s*(:[^=]*)?=", body, re.M), f"{entry.cls.__name__} writes its name again"
        assert entry.cls.families, f"{name} declares no model family"
        if not entry.preset:  # the class carries the name of its first plain registration ("esa", not "ls")
            assert registry.entry(entry.cls.name).cls is entry.cls
    built = ScoreReleaseChain.from_specs(SCORE_SPECS).describe() + ParamReleaseChain.from_specs(PARAM_SPECS).describe()
    assert [n for n, _ in built] == [s.partition(":")[0] for s in SCORE_SPECS + PARAM_SPECS]
    assert make_attack("grn_luo_no_reg").name == "grn_luo_no_reg" and make_attack("ls").name == "ls"


@pytest.mark.parametrize("spec", SCORE_SPECS + PARAM_SPECS)
def test_release_step_get_params_round_trip(spec: str) -> None:
    registry = SCORE_STEPS if spec in SCORE_SPECS else PARAM_STEPS
    step = registry.parse(spec)
    params = step.get_params()
    assert list(params) == list(step.param_names())
    again = registry.parse(_spec(step.name, params))  # through spec strings and the shared parser
    assert again.get_params() == params and again.public_params() == step.public_params()
    direct = type(step)(**params)  # and directly from the typed values
    assert direct.get_params() == params and direct.public_params() == step.public_params()


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_get_params_round_trip(name: str) -> None:
    attack = make_attack(name)
    params = attack.get_params()
    assert type(attack)(**params).get_params() == params
    assert ATTACKS.parse(_spec(name, params)).get_params() == params  # every value through the shared parser


def test_variants_preset_defaults_a_spec_may_override() -> None:
    assert make_attack("ls_clamped").clamp and not make_attack("ls").clamp
    assert make_attack("grn_luo").epochs == 60 and make_attack("grn_luo", epochs=2).epochs == 2
    assert make_attack("half").value == 0.5 and make_attack("zero").value == 0.0


# ------------------------------------------------------------------------------------- the shared parser


Choice = Literal["flip", "orthonormal"]


@pytest.mark.parametrize(
    ("value", "annotation", "expected"),
    [
        ("0.5", float, 0.5),
        (" 3 ", int, 3),
        ("yes", bool, True),
        ("OFF", bool, False),
        ("FLIP", Choice, "flip"),
        ("none", int | None, None),
        ("7", int | None, 7),
        ("600;200", tuple[int, ...], (600, 200)),
        ("abc", str, "abc"),
        (0.25, float, 0.25),  # typed values pass
    ],
)
def test_shared_parser_converts_by_annotation(value: Any, annotation: Any, expected: Any) -> None:
    assert parse_value("x", value, annotation) == expected


@pytest.mark.parametrize(
    ("value", "annotation", "message"),
    [
        ("abc", float, "x must be a number, got 'abc'"),
        ("nan", float, "x must be finite"),
        ("inf", float, "x must be finite"),
        ("1.5", int, "x must be an integer, got '1.5'"),
        ("maybe", bool, "x must be true or false"),
        ("random", Choice, "x must be one of flip, orthonormal; got 'random'"),
        ("1;b", tuple[int, ...], "x must be an integer, got 'b'"),
    ],
)
def test_shared_parser_errors_name_the_parameter(value: str, annotation: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_value("x", value, annotation)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "unknown score release step 'nosuch' (known: gaussian, label_only, pps_b"),
        ("rounding:digits=2", "score release step 'rounding' has no parameter(s) ['digits'] (accepted: decimals)"),
        ("rounding", "score release step 'rounding' needs parameter(s) ['decimals'] (accepted: decimals)"),
        ("rounding:decimals=two", "score release step 'rounding': decimals must be an integer, got 'two'"),
        ("rounding:decimals=99", "score release step 'rounding': decimals must lie in [0, 15]"),
        ("privee:epsilon", "'privee': expected key=value, got 'epsilon'"),
        ("privee:epsilon=0.1,basis=fisip", "basis must be one of identity, householder; got 'fisip'"),
    ],
)
def test_spec_errors_are_one_type_naming_the_plug_in(spec: str, message: str) -> None:
    with pytest.raises(ReleaseConfigError, match=re.escape(message)) as info:
        ScoreReleaseChain.from_specs([spec])
    assert isinstance(info.value, PluginError) and isinstance(info.value, ValueError)


def test_attack_errors_name_the_accepted_parameters() -> None:
    with pytest.raises(ValueError, match=re.escape("attack 'am' has no parameter(s) ['fold'] (accepted: refine,")):
        make_attack("am", fold=3)
    with pytest.raises(ValueError, match="unknown attack 'nope'"):
        make_attack("nope", family="lr")


# ------------------------------------------------------------------------------------------ model families


def test_a_chain_refuses_a_step_of_another_family_at_configuration_time() -> None:
    with pytest.raises(ReleaseConfigError, match="'pps_b' does not support the 'splitnn' model family"):
        ScoreReleaseChain.from_specs(["privee:epsilon=0.1", "pps_b:alpha=1"], family="splitnn")
    with pytest.raises(ReleaseConfigError, match="'ppsa' does not support the 'splitnn' model family"):
        ParamReleaseChain.from_specs(["ppsa:H=flip"], family="splitnn")
    # Score-only steps support every family that releases scores; LR supports them all.
    scores_only = [s for s in SCORE_SPECS if not s.startswith("pps_b")]
    assert len(ScoreReleaseChain.from_specs(scores_only, family="splitnn").steps) == len(scores_only)
    assert len(ScoreReleaseChain.from_specs(SCORE_SPECS, family="lr").steps) == len(SCORE_SPECS)
    lr_params = [s for s in PARAM_SPECS if s != "thresholds"]  # a tree's explicit threshold release
    assert len(ParamReleaseChain.from_specs(lr_params, family="lr").steps) == len(lr_params)
    assert len(ParamReleaseChain.from_specs(["thresholds"], family="tree").steps) == 1
    with pytest.raises(ReleaseConfigError, match="'thresholds' does not support the 'lr' model family"):
        ParamReleaseChain.from_specs(["thresholds"], family="lr")
    chain = ScoreReleaseChain.from_specs(["pps_b:alpha=1"])  # built for no family: checked when one is known
    with pytest.raises(ReleaseConfigError, match="splitnn"):
        chain.require("splitnn")
    with pytest.raises(ReleaseConfigError, match="splitnn"):
        ScoreReleaseChain(chain.steps, family="splitnn")


def test_attacks_refuse_a_model_family_they_do_not_support() -> None:
    with pytest.raises(NotApplicable, match="attack 'esa' does not support the 'splitnn' model family"):
        make_attack("esa", family="splitnn")
    assert make_attack("half", family="splitnn").name == "half"
    gradient = {"gia", "grn", "grn_direct", "grn_no_reg", "grn_noise_only", "grn_xadv_only", "aware_gia", "aware_grn"}
    luo = {n for n in ATTACKS.names() if n.startswith("grn_luo")}
    binary = {"ye_alg1", "ye_alg2", "ye_adaptive", "ye_peel"}
    labels = {"norm", "cosine", "clustering", "direct", "completion"}  # a passive party's label attacks
    labels |= {"axis_projection", "noise_residual"}  # and its Kerckhoffs attackers of the gradient defenses
    labelled = {"labelled_rows"}  # the attacker with auxiliary labels (opt-in)
    expected = {"half", "rg", "zero", "embedding_ls"} | gradient | luo | binary | labels | labelled
    assert set(ATTACKS.names("splitnn")) == expected
    tree_labels = {"id2graph", "id2graph_aware", "completion"}  # a passive party's, on the partitions it sees
    assert set(ATTACKS.names("tree")) == {"half", "rg", "zero", "pra", "grn_rf", "grn_rf_own"} | tree_labels
    task = lr_task(20, 3, 4, 3, seed=1)
    results = evaluate_attacks(task.obs, task.x_passive, ["esa", "half"], family="splitnn")
    assert "does not support the 'splitnn' model family" in results["esa"]["not_applicable"]
    assert "mse" in results["half"]
    assert "mse" in evaluate_attacks(task.obs, task.x_passive, ["esa"])["esa"]  # the harness attacks LR


def test_registration_enforces_the_convention() -> None:
    registry: Registry[Plugin] = Registry("widget")

    class NoFamily(Plugin):
        def __init__(self, size: int = 1) -> None:
            self.size = size

    with pytest.raises(TypeError, match="must declare the families"):
        registry.register("bare", NoFamily)

    @registry.register("sized")
    class Sized(Plugin):
        families = ANY_SCORES

        def __init__(self, size: int = 1) -> None:
            self.size = size

    assert Sized.name == "sized" and Sized.supports("anything")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("sized", Sized)
    with pytest.raises(TypeError, match=re.escape("has no parameter(s) ['colour']")):
        registry.register("red", Sized, colour="red")
    assert registry.build("sized", {"size": "4"}).size == 4


# ------------------------------------------------------------------------------------------ import layering


def test_defenses_import_no_attack_and_release_imports_no_step_module() -> None:
    code = (
        "import sys, vflsec.services.defenses.params; "
        "print(sorted(m for m in sys.modules if m.startswith('vflsec.services.attacks')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
    source = inspect.getsource(release)
    assert "importlib" not in source and "defenses.scores" not in source and "import params" not in source
