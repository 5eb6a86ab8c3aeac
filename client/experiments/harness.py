"""The evaluation harness: run a scenario through the real services with the curious plugin on the active
party (runs.py), launch attacks on its recordings, and score them against the passive parties' true features.

Only the harness (this module and runs.py) sees ground truth (the passive parties' data files, scaled exactly as
their services scale them); the attacks see the plugin's store and nothing else.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client.experiments.runs import (
    ACCURACY_WARNING,
    BASELINES,
    LABEL_ATTACKS,
    OPT_IN_ATTACKS,
    PHASES,
    SPLITNN_OPT_IN,
    TREE_ATTACKS,
    AttackScenario,
    ScenarioRun,
    StepCallback,
    cyclic_windows,
    default_attacks,
    one_hot_groups,
    run_from_base,
    run_scenario,
    train_base,
    true_passive_features,
)
from vflsec.client.federation.demo import Phases
from vflsec.client.federation.launcher import (
    FederationLayout,
    temporary_folder,
)
from vflsec.services import attacks
from vflsec.services.app import load_party_data
from vflsec.services.attacks.trees import correct_branching_rate, random_path_cbr
from vflsec.services.config import load_config
from vflsec.services.data import datasets
from vflsec.services.defenses.params import interpretability_loss
from vflsec.services.plugins import curious


def evaluate_attacks(
    obs: attacks.Observations,
    truth: np.ndarray,
    names: Sequence[str],
    options: dict[str, dict[str, Any]] | None = None,
    log: Callable[[str], None] | None = None,
    family: str = "lr",
    random_path: float | None = None,
    one_hot: tuple[tuple[int, ...], ...] = (),
    labelled_seed: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Run each attack on the recorded observations of a ``family`` model; MSE against the truth (luo Eq. 10)
    and time taken. An attack that does not support the family, or lacks an observation, says why. On released
    trees the CBR attacks are held against luo's ``random_path`` baseline (drawn here from OS entropy if not given).
    ``one_hot``: the truth's one-hot groups (column positions), for ye's accuracy. An attack with auxiliary
    knowledge (``Attack.auxiliary_rows``) is given the truth of that many rows, drawn with ``labelled_seed`` (the
    same rows for every such attack asking for as many; OS entropy if None), and scored on the other rows only."""
    results: dict[str, dict[str, Any]] = {}
    trees = obs.released_trees
    scored_paths = bool(trees) and not any(t.withholds_passive for t in trees)  # CBR needs every threshold
    if labelled_seed is None:
        labelled_seed = int(np.random.default_rng().integers(2**31))
    all_obs, all_truth = obs, truth
    for name in names:
        start = time.perf_counter()
        obs, truth = all_obs, all_truth
        try:
            attack = attacks.make_attack(name, family=family, **(options or {}).get(name, {}))
            k = attack.auxiliary_rows(obs.n_samples)
            if k:
                obs, scored = with_labelled_rows(obs, truth, k, labelled_seed)
            reconstruction = attacks.run_attack(attack, obs)
        except attacks.NotApplicable as exc:
            results[name] = {"not_applicable": exc.reason}
        else:
            if k:  # scored on the rows it was not given (``own_columns``: its baseline without z_B, likewise)
                truth = truth[scored]
                own = reconstruction.meta.get("own_columns")
                reconstruction = attacks.Reconstruction(
                    reconstruction.x_passive[scored],
                    {**reconstruction.meta, **({} if own is None else {"own_columns": np.asarray(own)[scored]})},
                )
            results[name] = {
                "mse": attacks.mse(truth, reconstruction.x_passive),
                # An unclipped estimate off a defended (infeasible) system can sit far outside the cube; the
                # clipped MSE is the figure tables compare, the raw one stays beside it.
                "mse_clipped": attacks.mse(truth, np.clip(reconstruction.x_passive, 0.0, 1.0)),
                "mse_per_feature": attacks.mse_per_feature(truth, reconstruction.x_passive).tolist(),
                "seconds": time.perf_counter() - start,
                "aware": name.startswith("aware_"),
                "options": _jsonable(attack.get_params()),  # the effective options, defaults included
            }
            if scored_paths:  # luo's CBR: x̂'s paths vs the true features
                results[name]["cbr"] = correct_branching_rate(trees, obs.x_active, truth, reconstruction.x_passive)
                if random_path is None:
                    random_path = random_path_baseline(trees, truth, np.random.default_rng())
            cbr = (results[name].get("cbr"), random_path)
            results[name]["metric"] = own_metric(attack.metric, obs, truth, reconstruction, cbr)
            if k:  # an attacker with auxiliary labels: how many it had, the rows scored, and its own-columns baseline
                results[name] |= {"labelled_rows": k, "scored_rows": len(truth)}
                if "own_columns" in reconstruction.meta:
                    own = attacks.Reconstruction(np.asarray(reconstruction.meta["own_columns"]))
                    results[name]["own_columns"] = {
                        "mse_clipped": attacks.mse(truth, np.clip(own.x_passive, 0.0, 1.0)),
                        "metric": own_metric(attack.metric, obs, truth, own, cbr)["value"],
                    }
            # sign_only: which of rassouli's cases ran; ye: whether the search was sampled, and the adaptive attack's
            # groups (how many, the largest, the share of rows its answer covers, the fabricated bits it found)
            for key in ("case", "sampled", "groups", "largest_group", "covered_rows", "fabricated_m"):
                if key in reconstruction.meta:
                    results[name][key] = reconstruction.meta[key]
            if "binary_features" in reconstruction.meta:  # ye: its columns come in no claimed order, so the MSE
                results[name] |= binary_recovery(truth, reconstruction.meta["binary_features"], one_hot)
        if log is not None:
            log(attack_line(name, results[name]))
    return results


def with_labelled_rows(
    obs: attacks.Observations, truth: np.ndarray, k: int, seed: int
) -> tuple[attacks.Observations, np.ndarray]:
    """``obs`` with the truth of k rows drawn with ``seed`` (auxiliary knowledge), and the other rows' positions."""
    n = obs.n_samples
    if not 0 < k < n:
        raise attacks.NotApplicable(f"{k} labelled rows of {n} queried leave no row to score")
    given = np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
    scored = np.setdiff1d(np.arange(n), given)
    return replace(obs, labelled_rows=given, labelled_passive=np.asarray(truth, dtype=float)[given]), scored


def attack_line(name: str, result: dict[str, Any]) -> str:
    """One progress line per attack: its figure and its time (or why it did not run)."""
    if "not_applicable" in result:
        return f"attack {name}: not applicable: {result['not_applicable']}"
    return f"attack {name}: MSE {result['mse_clipped']:.4g} ({result['seconds']:.1f} s)"


# Each attack's own figure (Attack.metric): its label, whether higher is better, and the blind baseline it must beat.
METRICS = {
    "mse": ("MSE (clipped to the cube)", False, "half"),
    "accuracy": ("attack accuracy (ye §6.3, up to complement)", True, "majority"),
    "cbr": ("correct branching rate (luo §VI)", True, "random_path"),
    "column_accuracy": ("accuracy per binary passive column, predicted in its own column", True, "majority"),
}


def random_path_baseline(trees: Sequence[Any], truth: np.ndarray, rng: np.random.Generator) -> float:
    """luo's random-path CBR (a path drawn uniformly per row), averaged over the trees that test a passive feature."""
    return float(np.nanmean([random_path_cbr(t, truth, rng) for t in trees]))


def own_metric(
    kind: str,
    obs: attacks.Observations,
    truth: np.ndarray,
    found: attacks.Reconstruction,
    cbr: tuple[float | None, float | None] = (None, None),
) -> dict[str, Any]:
    """The attack's own figure on this run and its blind baseline: MSE against Half (x̂ = ½); ye's accuracy (per
    binary passive column the best found vector's share of matching rows, complements counted, mean over those
    columns) against always answering the column's majority bit; CBR against luo's random path, both given in
    ``cbr`` as (the attack's CBR, the baseline's), computed once per run by :func:`evaluate_attacks`."""
    label, higher, baseline = METRICS[kind]
    truth = np.asarray(truth, dtype=float)
    value: float | None
    if kind == "mse":
        value = attacks.mse(truth, np.clip(found.x_passive, 0.0, 1.0))
        reference = attacks.mse(truth, np.full_like(truth, 0.5))
    elif kind == "column_accuracy":  # each column's prediction against that column (a supervised attacker knows which)
        binary = [j for j in range(truth.shape[1]) if set(np.unique(truth[:, j])) <= {0.0, 1.0}]
        if not binary:
            value, reference = None, None
        else:
            value = float(np.mean((found.x_passive[:, binary] >= 0.5) == (truth[:, binary] == 1.0)))
            share = truth[:, binary].mean(axis=0)
            reference = float(np.mean(np.maximum(share, 1.0 - share)))
    elif kind == "accuracy":
        from vflsec.services.attacks.binary import binary_match

        binary = [j for j in range(truth.shape[1]) if set(np.unique(truth[:, j])) <= {0.0, 1.0}]
        vectors = np.asarray(found.meta.get("binary_features", np.empty((len(truth), 0))), dtype=float)
        vectors = vectors.reshape(len(truth), -1)
        if not binary:
            value, reference = None, None
        else:
            best = binary_match(truth[:, binary], vectors, complements=True).max(axis=1) if vectors.shape[1] else 0.0
            value = float(np.mean(best))
            share = truth[:, binary].mean(axis=0)
            reference = float(np.mean(np.maximum(share, 1.0 - share)))
    else:
        value, reference = cbr
    metric: dict[str, Any] = {"name": kind, "label": label, "higher_is_better": higher, "value": value,
                              "baseline": {"name": baseline, "value": reference}}  # fmt: skip
    if value is None:
        metric["not_applicable"] = "no binary passive column to recover"
    return metric


def binary_recovery(truth: np.ndarray, found: np.ndarray, one_hot: tuple[tuple[int, ...], ...] = ()) -> dict[str, Any]:
    """ye §6.3 scored with the ground truth: how many binary vectors were found, which true passive columns
    (binary ones only) one of them equals on every row, up to complement (x and 1 − x are listed once), and ye's
    attack accuracy: the best match of the attack's answer x* (its first, least-residual vector) with any binary
    passive column or sum of a ``one_hot`` group's columns, without and with complements; ``..._any_listed``: of
    the best of every vector it listed."""
    from vflsec.services.attacks.binary import attack_accuracy, binary_match

    truth = np.asarray(truth, dtype=float)
    binary = [j for j in range(truth.shape[1]) if set(np.unique(truth[:, j])) <= {0.0, 1.0}]
    found = np.asarray(found, dtype=float).reshape(len(truth), -1)
    exact: list[int] = []
    report: dict[str, Any] = {"n_found": int(found.shape[1]), "binary_columns": binary, "recovered_columns": exact}
    # the groups among the binary columns, as positions in truth[:, binary]
    groups = tuple(g for g in (tuple(binary.index(j) for j in g if j in binary) for g in one_hot) if len(g) > 1)
    if binary and found.shape[1]:
        match = binary_match(truth[:, binary], found, complements=True)
        exact += [binary[i] for i in np.flatnonzero(match.max(axis=1) == 1.0)]
        x = truth[:, binary]
        report |= {
            "ye_accuracy": attack_accuracy(x, found[:, :1], one_hot=groups),
            "ye_accuracy_complements": attack_accuracy(x, found[:, :1], complements=True, one_hot=groups),
            "ye_accuracy_any_listed": attack_accuracy(x, found, complements=True, one_hot=groups),
        }
        if groups:
            report["one_hot_groups"] = [[binary[i] for i in g] for g in groups]
    return report


def ye_accuracy_cell(r: dict[str, Any]) -> str:
    """ye's attack accuracy for a table cell: without / with complements (and the best of all listed vectors)."""
    if "ye_accuracy" not in r:
        return ""
    return (
        f"{r['ye_accuracy']:.3f} / {r['ye_accuracy_complements']:.3f} (any listed {r['ye_accuracy_any_listed']:.3f})"
    )


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as JSON can carry them (tuples as lists, numpy scalars as numbers, anything else as text)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, tuple):
            value = list(value)
        out[key] = value if isinstance(value, str | int | float | bool | list | type(None)) else str(value)
    return out


# A model must beat always answering the majority class by this much to count as having learnt something.
MAJORITY_MARGIN = 0.02


def accuracy_warning(accuracy: float, majority_rate: float) -> str | None:
    """One line when the model is below the papers' accuracy (ACCURACY_WARNING), or barely above the majority
    class (on Bank, 0.886 of the labels are one class: 0.85 alone would let a constant model pass), else None."""
    if accuracy < ACCURACY_WARNING:
        return (
            f"the model's accuracy {accuracy:.4f} is below {ACCURACY_WARNING:.2f}, the papers' lowest "
            f"(majority class {majority_rate:.4f}); attack MSEs on a weak model are not comparable with theirs"
        )
    if accuracy < majority_rate + MAJORITY_MARGIN:
        return (
            f"the model's accuracy {accuracy:.4f} is within {MAJORITY_MARGIN:.2f} of the majority class "
            f"{majority_rate:.4f}: it has learnt little beyond the label balance, and attacks on its scores say little"
        )
    return None


def run_attack_scenario(
    scenario: AttackScenario,
    log: Callable[[str], None] | None = None,
    phases: Phases | None = None,
    on_step: StepCallback | None = None,
) -> dict[str, Any]:
    """One scenario, or with ``windows > 1`` the average of the MSEs over cyclic windows of passive columns.
    Progress: ``phases`` announces and times each phase, ``on_step`` hears of each training batch, ``log`` gets
    one line per attack with its time."""
    if scenario.windows <= 1:
        return _run_once(scenario, log, phases, on_step)
    spec = scenario.spec
    d_passive = sum(len(p) for p in spec.split.passive)
    reports = [
        _run_once(replace(scenario.with_spec(passive_features=window), windows=1), log, phases, on_step)
        for window in cyclic_windows(spec.data.feature_names, d_passive, scenario.windows)
    ]
    return average_over_windows(reports)


def average_over_windows(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rassouli's average over space: one report whose MSEs are the means over the windows' reports."""
    report = reports[0] | {
        "windows": len(reports),
        "accuracy": float(np.mean([r["accuracy"] for r in reports])),
        "attacks": dict(reports[0]["attacks"]),
    }
    if all("majority_rate" in r for r in reports):
        report["majority_rate"] = float(np.mean([r["majority_rate"] for r in reports]))
        report["accuracy_warning"] = accuracy_warning(report["accuracy"], report["majority_rate"])
    report["baselines"] = {b: float(np.mean([r["baselines"][b] for r in reports])) for b in report["baselines"]}
    report |= {f"{p}_seconds": sum(r[f"{p}_seconds"] for r in reports) for p in PHASES if f"{p}_seconds" in report}
    if "peak_rss_mb" in report:  # each window's federation is its own processes: the largest per party
        report["peak_rss_mb"] = {p: max(r["peak_rss_mb"].get(p, 0.0) for r in reports) for p in report["peak_rss_mb"]}
    for name, first in reports[0]["attacks"].items():
        ran = [r["attacks"][name] for r in reports if "mse" in r["attacks"].get(name, {})]
        if len(ran) == len(reports):
            report["attacks"][name] = {
                "mse": float(np.mean([r["mse"] for r in ran])),
                "mse_clipped": float(np.mean([r["mse_clipped"] for r in ran])),
                "seconds": float(np.sum([r["seconds"] for r in ran])),
                "aware": first["aware"],
                "options": first.get("options", {}),
            }
        elif ran:  # an average over some windows only would not be comparable with the others
            report["attacks"][name] = {"not_applicable": f"ran in {len(ran)} of {len(reports)} windows"}
    if "strongest" in report:
        report["strongest"] = strongest(report["attacks"])
    report.pop("mse_per_feature")
    return report


def _run_once(
    scenario: AttackScenario,
    log: Callable[[str], None] | None,
    phases: Phases | None = None,
    on_step: StepCallback | None = None,
) -> dict[str, Any]:
    # The federation lives in a temporary folder deleted after the run: nothing can resume it, so its parties
    # keep no session checkpoints (their fsync'd writes were 80 % of a plain training step on Bank).
    scenario = scenario.with_spec(checkpoints=False)
    if scenario.attacker != "active":  # label attacks on training gradients: no release chain changes what they see
        if (scenario.spec.gradient_defense or scenario.spec.partition_defense) and scenario.compare_undefended:
            return _label_run_with_undefended(scenario, log, phases, on_step)
        with _workdir() as workdir:
            run = run_scenario(scenario, workdir, Phases() if phases is None else phases.fresh(), on_step)
            return score_label_run(scenario, run, log)
    # Trees are left out: a passive party's fitted bins are not in its checkpoints, so no run can resume the model.
    chained = scenario.spec.score_release or scenario.spec.param_release
    if not (chained and scenario.compare_undefended) or scenario.spec.model in TREE_ATTACKS:
        with _workdir() as workdir:
            run = run_scenario(scenario, workdir, Phases() if phases is None else phases.fresh(), on_step)
            return score_run(scenario, run, log)
    # A defended run answers "what does the defense cost": the same trained model, queried on the same rows, released
    # once without the chains and once through them; both attacked, both against Half.
    phases = Phases() if phases is None else phases.fresh()
    with _workdir() as workdir:
        with phases("load", f"reading {scenario.spec.name}"):
            scenario.spec.data  # noqa: B018 (parsed once per process)
        trained, training = train_base(scenario, workdir / "base", phases, on_step)
        plain = replace(scenario.with_spec(score_release=(), param_release=()), extra_attacks=())
        if scenario.attacks is not None:  # the aware attacks target the chains: undefended, the naive ones
            plain = replace(plain, attacks=[n for n in scenario.attacks if not n.startswith("aware_")])
        if log is not None:
            log("undefended: the same model and query rows, released without the chains")
        base = workdir / "base"
        undefended_run = run_from_base(plain, base, trained, workdir / "undefended", training, phases.fresh())
        undefended = score_run(plain, undefended_run, log)
        if log is not None:
            log("defended: released through the chains")
        report = score_run(scenario, run_from_base(scenario, workdir / "base", trained, workdir / "defended",
                                                   training, phases), log)  # fmt: skip
    return with_undefended(report, undefended)


# An attacker whose strongest MSE is below (1 - LEAK_MARGIN) x Half's learns something Half's blind guess does not.
LEAK_MARGIN = 0.05
SCALE_NOTE = "features min-max scaled to [0, 1] per party: MSE is per feature; Half (guess ½ everywhere) is blind"


def advantage(mse: float | None, half: float) -> float | None:
    """The attacker's advantage over blind Half, max(0, 1 − MSE / MSE_Half): 0 is blind guessing, 1 exact."""
    return None if mse is None else max(0.0, 1.0 - mse / half)


def with_undefended(report: dict[str, Any], undefended: dict[str, Any]) -> dict[str, Any]:
    """The defended report with the undefended figures of the same model and query rows beside it (accuracy, the
    strongest attack and its MSE, the advantage over Half), the defended advantage and a one-line verdict."""
    half = report["baselines"]["half"]
    best = strongest(undefended["attacks"])
    mse = None if best is None else best["mse"]
    report["undefended"] = {
        "accuracy": undefended["accuracy"],
        "mse": mse,
        "strongest": best,
        "half": undefended["baselines"]["half"],
        "advantage": advantage(mse, half),
        "attacks": {n: r.get("mse_clipped", r.get("not_applicable")) for n, r in undefended["attacks"].items()},
        "attack_seconds": undefended["attack_seconds"],
    }
    defended = report.get("strongest")
    report["advantage"] = advantage(None if defended is None else defended["mse"], half)
    report["verdict"] = verdict(report)
    report["scaling_note"] = SCALE_NOTE
    return report


def verdict(report: dict[str, Any]) -> str:
    """One line: does the strongest attacker still beat blind Half under the defense, and at what accuracy cost."""
    half, undefended = report["baselines"]["half"], report["undefended"]
    best = report.get("strongest")
    cost = f"accuracy {undefended['accuracy']:.4f} undefended, {report['accuracy']:.4f} defended"
    before = "n/a" if undefended["mse"] is None else f"{undefended['mse']:.4g}"
    if best is None:
        return f"protects: no attack runs on what is released (undefended strongest {before}, Half {half:.4g}); {cost}"
    word = "leaks" if best["mse"] < (1.0 - LEAK_MARGIN) * half else "protects"
    return (
        f"{word}: strongest {best['attack']} {best['mse']:.4g} vs blind Half {half:.4g} "
        f"(undefended strongest {before}); {cost}"
    )


def score_run(scenario: AttackScenario, run: ScenarioRun, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The attacks and blind baselines on a finished run's recordings, scored against the true features."""
    start = time.perf_counter()
    store = curious.ObservationStore(run.store_path)
    try:
        obs, sample_ids = last_query(*curious.observations(store, run.session_id), run.queried)
    finally:
        store.close()
    truth, columns = true_passive_features(run.layout, sample_ids)
    spec = scenario.spec
    baselines = evaluate_attacks(obs, truth, BASELINES, {"rg": {"seed": spec.seed}}, family=spec.model)
    trees = obs.released_trees
    random_path = None
    if trees and not any(t.withholds_passive for t in trees):  # luo's random-path baseline, seeded as RG's
        random_path = random_path_baseline(trees, truth, np.random.default_rng(spec.seed))
    names = scenario.attacks
    if names is None:
        names = default_attacks(spec.score_release, spec.param_release, spec.model, spec.embedding_release)
        names = [*names, *(n for n in scenario.extra_attacks if n not in names)]
    if log is not None:
        log(f"attack: {len(names)} attacks on {obs.n_samples:,} queried rows ...")
    options = dict(scenario.attack_options)
    if scenario.mse_scope == "all":  # the training rows are attacked too: AM/RAM fit them in-sample (varasteh)
        for name in set(names) & {"am", "ram"}:
            options[name] = {"held_out": False, **options.get(name, {})}
    results = evaluate_attacks(
        obs, truth, names, options, log, family=spec.model, random_path=random_path, one_hot=one_hot_groups(columns),
        labelled_seed=spec.seed,
    )  # fmt: skip
    attack_seconds = time.perf_counter() - start
    report: dict[str, Any] = {
        "dataset": spec.name,
        "n_classes": run.n_classes,
        "d_passive": obs.d_passive,
        "d_active": obs.x_active.shape[1],
        "n_samples": obs.n_samples,
        "accuracy": run.accuracy,
        "backend": spec.backend,
        "score_release": list(spec.score_release),
        "param_release": list(spec.param_release),
        "baselines": {name: r["mse"] for name, r in baselines.items()},
        "attacks": {name: {k: v for k, v in r.items() if k != "mse_per_feature"} for name, r in results.items()},
        "mse_per_feature": {name: r["mse_per_feature"] for name, r in {**baselines, **results}.items() if "mse" in r},
    }
    if random_path is not None:  # the same draw every CBR attack's metric is held against
        report["cbr_random_path"] = random_path
    if spec.score_release or spec.param_release or spec.model != "lr":  # split NN: the headline says what runs
        report["strongest"] = strongest(report["attacks"])
    if run.forecasts:
        report["forecast"] = run.forecasts
    report["w_passive"] = None if obs.w_passive is None else obs.w_passive.tolist()
    report["batch_size"], report["batch_size_note"] = run.batch_size, run.batch_size_note
    report["epochs"], report["epochs_note"] = spec.epochs_for(run.n_train)
    report["majority_rate"] = run.majority_rate
    report["accuracy_warning"] = accuracy_warning(run.accuracy, run.majority_rate)
    opt_in = OPT_IN_ATTACKS if spec.model == "lr" else SPLITNN_OPT_IN if spec.topology == "active-top" else {}
    if scenario.attacks is None and opt_in:  # which attacks the defaults leave out, and why
        report["left_out"] = {name: why for name, why in opt_in.items() if name not in names}
    report["n_train"] = run.n_train
    report["n_queried"] = len(run.queried)
    report["query_rows_in_training"] = run.query_rows_in_training
    report["queries_note"] = run.queries_note
    report["encoding"] = spec.encoding
    report["mse_scope"] = scenario.mse_scope
    if run.training is not None:
        report["epochs_trained"] = run.training.epochs_trained
        if run.training.patience:
            report["early_stopping"] = run.training.to_dict()
    report["model"] = spec.model
    report["topology"] = spec.topology if spec.model == "splitnn" else None
    report["attacker"] = scenario.attacker
    if obs.embedding_chain:  # the passive parties' own defenses, as announced to (and recorded by) the active party
        report["embedding_release"] = [[name, dict(params)] for name, params in obs.embedding_chain]
        report["embedding_width"] = None if obs.embeddings is None else int(obs.embeddings.shape[1])
    # Where the run's wall time went: load (the dataset, then the parties starting and reading their shards),
    # deal (shards and configs), align (PSI), train, predict (model release and the query), attack (the
    # recordings read back, the truth, every attack and baseline).
    report |= {f"{name}_seconds": run.phases.seconds.get(name, 0.0) for name in PHASES[:-1]}
    report["attack_seconds"] = attack_seconds
    report["peak_rss_mb"] = run.peak_rss_mb
    return report


LABEL_NOTE = (
    "attacks without labelled rows score every training row the passive party holds; an attack given k labelled rows "
    "(auxiliary labels, e.g. model completion) is scored on the other rows, beside the same learner on the party's raw "
    "features (own_features: the labels without anything the federation sent). AUC 0.5 is blind, and an AUC below 0.5 "
    "is the same leak read upside down (the attacker took the wrong class for the rarer one: --attack-option "
    "NAME.positive=0 for norm and cosine); for more classes, accuracy against the majority rate"
)


def score_label_run(
    scenario: AttackScenario, run: ScenarioRun, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """A curious passive party's label attacks on its recordings, scored against the active party's true labels
    (read here only): by AUC for two classes, accuracy and per-class recall for more, beside the blind baselines (AUC
    0.5, the majority rate of the scored rows). An attack with auxiliary labels (Attack.auxiliary_rows) is given the
    labels of that many rows, drawn once per run, and scored on the others."""
    start = time.perf_counter()
    store = curious.ObservationStore(run.store_path)
    try:
        obs, sample_ids = curious.label_observations(store, run.session_id)
    finally:
        store.close()
    y = true_labels(run.layout, sample_ids)
    spec = scenario.spec
    defaults = LABEL_ATTACKS.get(spec.model, ())
    names = list(scenario.attacks) if scenario.attacks is not None else [*defaults, *scenario.extra_attacks]
    received = (
        f"{len(obs.gradients):,} gradients" if obs.gradients is not None
        else f"{len(obs.block_rows):,} gradients of its block" if obs.block_rows is not None
        else f"{len(obs.partitions or ()):,} nodes"
    )  # fmt: skip
    if log is not None:
        log(f"attack: {len(names)} label attacks on {obs.n_samples:,} training rows ({received})")
    labelled_seed = int(np.random.default_rng(spec.seed).integers(2**31))
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        began = time.perf_counter()
        try:
            attack = attacks.make_attack(name, family=spec.model, **scenario.attack_options.get(name, {}))
            if attack.target != "labels":
                raise attacks.NotApplicable(f"{name} infers features: a passive attacker runs the label attacks")
            k = attack.auxiliary_rows(obs.n_samples)
            attacked, scored = (obs, np.arange(obs.n_samples)) if not k else with_labels(obs, y, k, labelled_seed)
            reconstruction = attacks.run_attack(attack, attacked)
        except attacks.NotApplicable as exc:
            results[name] = {"not_applicable": exc.reason}
        else:
            results[name] = label_figures(reconstruction, y, scored, run.n_classes)
            if "gradient_scores" in reconstruction.meta and run.n_classes == 2:
                # Li et al.'s figure: the AUC of one step's batch, here averaged over the steps
                results[name]["auc_per_step"] = per_step_auc(obs, y, reconstruction.meta["gradient_scores"])
            if k:  # auxiliary labels: how many, the rows scored, their majority rate, the learner without federation
                results[name] |= {"labelled_rows": len(attacked.labelled_rows), "scored_rows": len(scored)}
                results[name]["majority_rate"] = float(np.bincount(y[scored]).max() / len(scored))
                own = reconstruction.meta.get("own_features")
                if own is not None:
                    results[name]["own_features"] = label_figures(own, y, scored, run.n_classes)
            results[name] |= {"seconds": time.perf_counter() - began, "options": _jsonable(attack.get_params())}
        if log is not None:
            log(f"attack {name}: {label_line(results[name])}")
    figure = "auc" if run.n_classes == 2 else "accuracy"
    ran = {n: r[figure] for n, r in results.items() if figure in r}
    counts = np.bincount(y, minlength=run.n_classes)
    report: dict[str, Any] = {
        "attacker": scenario.attacker,
        "dataset": spec.name,
        "model": spec.model,
        "topology": spec.topology if spec.model == "splitnn" else None,
        "backend": spec.backend,
        "n_classes": run.n_classes,
        "d_passive": obs.d_passive,  # the attacker's own width
        "n_samples": obs.n_samples,  # the training rows scored
        "n_gradients": len(obs.gradients) if obs.gradients is not None else len(obs.block_rows or ()),
        "steps": (
            len(np.unique(obs.gradient_steps)) if obs.gradient_steps is not None else len(obs.block_rows or ())
        ),
        "nodes": len(obs.partitions or ()),  # trees: the nodes whose rows the party saw
        "accuracy": run.accuracy,
        # blind: AUC 0.5 (binary labels) and the larger class's share of the scored rows
        "baselines": {**({"auc": 0.5} if run.n_classes == 2 else {}), "majority_rate": float(max(counts) / len(y))},
        "class_rates": (counts / counts.sum()).tolist(),
        "attacks": results,
        "strongest": None if not ran else {"attack": max(ran, key=ran.get), figure: max(ran.values())},
        "label_note": LABEL_NOTE,
    }
    report["batch_size"], report["batch_size_note"] = run.batch_size, run.batch_size_note
    report["epochs"], report["epochs_note"] = spec.epochs_for(run.n_train)
    report["majority_rate"] = run.majority_rate  # of the queried rows, as the active attacker's report has it
    report["accuracy_warning"] = accuracy_warning(run.accuracy, run.majority_rate)
    report["n_train"] = run.n_train
    report |= {f"{name}_seconds": run.phases.seconds.get(name, 0.0) for name in PHASES[:-1]}
    report["attack_seconds"] = time.perf_counter() - start
    report["peak_rss_mb"] = run.peak_rss_mb
    return report


def with_labels(
    obs: attacks.Observations, y: np.ndarray, k: int, seed: int
) -> tuple[attacks.Observations, np.ndarray]:
    """``obs`` with the true labels of k rows drawn with ``seed`` (auxiliary labels), and the other rows' positions.
    As in Fu et al.'s setting (a few labelled rows of every class), the k rows are spread over the classes: k // C of
    each (the remainder to the first classes), fewer where a class has fewer rows than that."""
    n = obs.n_samples
    if not 0 < k < n:
        raise attacks.NotApplicable(f"{k} labelled rows of {n} leave no row to score")
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    share = [k // len(classes) + (i < k % len(classes)) for i in range(len(classes))]
    given = np.sort(np.concatenate([
        rng.choice(np.flatnonzero(y == c), size=min(m, int(np.sum(y == c)) - 1), replace=False)
        for c, m in zip(classes, share, strict=True)
    ]))  # fmt: skip
    return replace(obs, labelled_rows=given, labelled_labels=y[given]), np.setdiff1d(np.arange(n), given)


def label_figures(
    found: attacks.Reconstruction, y: np.ndarray, scored: np.ndarray, n_classes: int
) -> dict[str, Any]:
    """A label attack's figures on the ``scored`` rows: AUC (two classes; its accuracy too when it predicts classes),
    accuracy and recall per class (more)."""
    truth = y[scored]
    figures: dict[str, Any] = {}
    if n_classes == 2:
        figures["auc"] = attacks.auc(truth, np.asarray(found.label_scores)[scored])
    if found.label_predictions is not None:
        predicted = np.asarray(found.label_predictions)[scored]
        figures["accuracy"] = float(np.mean(predicted == truth))
        figures["recall_per_class"] = [
            float(np.mean(predicted[truth == c] == c)) if np.any(truth == c) else None for c in range(n_classes)
        ]
    return figures


def label_line(result: dict[str, Any]) -> str:
    """One progress line per label attack: its figure (or why it did not run)."""
    if "not_applicable" in result:
        return f"not applicable: {result['not_applicable']}"
    figure = f"AUC {result['auc']:.4f}" if "auc" in result else f"accuracy {result['accuracy']:.4f}"
    if "labelled_rows" in result:
        figure += f" on {result['scored_rows']} rows ({result['labelled_rows']} labelled rows given)"
    return figure


def label_markdown(report: dict[str, Any]) -> str:
    """A passive attacker's report as markdown: each label attack's figure beside the blind baselines."""
    binary = report["n_classes"] == 2
    lines = [
        f"### {report['dataset']}: label inference by {report['attacker']} ({report['model']}), {report['n_samples']} "
        f"training rows, class rates {', '.join(f'{r:.3f}' for r in report['class_rates'])}, "
        f"accuracy = {report['accuracy']:.4f}",
        "",
        f"| attack | {'AUC' if binary else 'accuracy'} | {'AUC per step (mean)' if binary else 'recall per class'} "
        "| labelled rows (own features alone) |",
        "|---|---|---|---|",
        *(f"| {name} (baseline) | {value:.4g} | | |" for name, value in report["baselines"].items()),
    ]
    for name, r in report["attacks"].items():
        if "not_applicable" in r:
            lines.append(f"| {name} | not applicable: {r['not_applicable']} | | |")
            continue
        figure = r["auc"] if binary else r["accuracy"]
        second = (
            ("n/a" if r.get("auc_per_step") is None else f"{r['auc_per_step']:.4f}") if binary
            else ", ".join("n/a" if v is None else f"{v:.3f}" for v in r["recall_per_class"])
        )  # fmt: skip
        given = ""
        if "labelled_rows" in r:
            own = r.get("own_features", {}).get("auc" if binary else "accuracy")
            given = f"{r['labelled_rows']}" + ("" if own is None else f" ({own:.4f})")
        lines.append(f"| {name} | {figure:.4f} | {second} | {given} |")
    return "\n".join(lines) + "\n"


# What no gradient defense touches (issue 29): a passive party that holds its trained bottom and k labelled rows
# fits a top on them (Fu et al.'s passive model completion); measured in docs/defenses.md, "Gradient defenses".
REMAINING_NOTE = (
    "what remains: passive model completion with k labelled rows (Fu et al. 2022) reads the labels from the passive "
    "party's own trained bottom, which no gradient perturbation removes (it only weakens what the bottom learnt)"
)
# Trees: what a partition defense leaves (services/models/tree/partitions.py; measured in docs/defenses.md).
TREE_REMAINING_NOTE = (
    "what remains: the partitions of every node the defense still shows the passive party (later trees, upper "
    "levels), and completion with k labelled rows on its own columns, which no partition defense touches"
)
MAX_AUC_GOAL = 0.6  # issue 29's acceptance: every gradient attack at or below 0.6 AUC (either way round)
MAX_COST_GOAL = 0.02  # at no more than 2 pp of accuracy


def _label_run_with_undefended(
    scenario: AttackScenario,
    log: Callable[[str], None] | None,
    phases: Phases | None,
    on_step: StepCallback | None,
) -> dict[str, Any]:
    """"What does the gradient (or tree partition) defense cost": the same federation and split trained twice,
    without the defense and with it (it acts during training, so nothing trained can be shared), both attacked by
    the same label attacks."""
    phases = Phases() if phases is None else phases.fresh()
    plain = scenario.with_spec(gradient_defense=(), partition_defense=())
    specs = [*scenario.spec.gradient_defense, *scenario.spec.partition_defense]
    if log is not None:
        log("undefended: the same federation trained without the defense")
    with _workdir() as workdir:
        undefended = score_label_run(plain, run_scenario(plain, workdir, phases.fresh(), on_step), log)
    if log is not None:
        log(f"defended: trained under {', '.join(specs)}")
    with _workdir() as workdir:
        report = score_label_run(scenario, run_scenario(scenario, workdir, phases, on_step), log)
    return with_label_undefended(report, undefended, scenario.spec.gradient_defense, scenario.spec.partition_defense)


def either_way(results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The gradient attack furthest from blind: max(AUC, 1 − AUC) (an AUC below 0.5 is the same leak read upside
    down). Attacks given labelled rows (model completion) read the party's own bottom, not the gradients: apart."""
    ran = {n: max(r["auc"], 1.0 - r["auc"]) for n, r in results.items() if "auc" in r and "labelled_rows" not in r}
    if not ran:
        return None
    best = max(ran, key=ran.get)
    return {"attack": best, "auc": results[best]["auc"], "auc_either_way": ran[best]}


def with_label_undefended(
    report: dict[str, Any], undefended: dict[str, Any], specs: Sequence[str], partitions: Sequence[str] = ()
) -> dict[str, Any]:
    """The defended label report with the undefended run beside it: its accuracy and attacks, the accuracy cost, the
    strongest attack either way round, each step's formal guarantee, what remains and a one-line verdict.
    ``specs``: the gradient defense (split-NN), ``partitions``: the partition defense (trees)."""
    from vflsec.services.defenses.gradients import GradientChain
    from vflsec.services.models.tree.partitions import PartitionDefense

    chain = GradientChain.from_specs(specs)
    report["gradient_defense"] = [[name, params] for name, params in chain.describe()]
    if partitions:
        defense = PartitionDefense.from_specs(partitions, report.get("model", "tree"))
        report["partition_defense"] = [[name, params] for name, params in defense.describe()]
    report["undefended"] = {
        "accuracy": undefended["accuracy"],
        "strongest": undefended["strongest"],
        "strongest_either_way": either_way(undefended["attacks"]),
        "attacks": {n: r.get("auc", r.get("not_applicable")) for n, r in undefended["attacks"].items()},
        "train_seconds": undefended.get("train_seconds"),
    }
    report["accuracy_cost"] = undefended["accuracy"] - report["accuracy"]
    report["strongest_either_way"] = either_way(report["attacks"])
    # each row's ∂L/∂h leaves once per epoch
    accounting = {step.name: step.accounting(report["epochs"]) for step in chain.steps}
    report["gradient_accounting"] = {name: a for name, a in accounting.items() if a is not None}
    report["remaining"] = TREE_REMAINING_NOTE if partitions else REMAINING_NOTE
    completion = report["attacks"].get("completion", {})
    if "auc" in completion:  # measured beside the gradient attacks: what the defense leaves
        report["remaining"] += (
            f"; measured here: completion with {completion['labelled_rows']} labelled rows AUC {completion['auc']:.4f}"
            + (f" (undefended {undefended['attacks']['completion']['auc']:.4f})"
               if "auc" in undefended["attacks"].get("completion", {}) else "")
        )  # fmt: skip
    best = report["strongest_either_way"]
    worst = "no attack ran" if best is None else f"{best['attack']} AUC {best['auc']:.4f}"
    met = best is not None and best["auc_either_way"] <= MAX_AUC_GOAL and report["accuracy_cost"] <= MAX_COST_GOAL
    if best is None and partitions and report.get("nodes") == 0:  # nothing to attack: the best a defense can do
        worst, met = "none applies (the passive party saw no node's rows)", report["accuracy_cost"] <= MAX_COST_GOAL
    # The cost alone can mislead where the undefended model beats the majority class by less than the bound (Bank):
    # a defended model that learnt nothing but the prior would "meet" it. Say so.
    report["above_majority"] = report["accuracy"] - report["majority_rate"]
    trivial = report["above_majority"] <= 0.0
    kind = "partition" if partitions else "gradient"
    report["verdict"] = (
        f"{'meets' if met else 'misses'} the goal (every {kind} attack ≤ {MAX_AUC_GOAL} AUC either way at ≤ "
        f"{MAX_COST_GOAL * 100:.0f} pp accuracy cost): strongest {worst}, accuracy {report['accuracy']:.4f} against "
        f"{undefended['accuracy']:.4f} undefended ({report['accuracy_cost'] * 100:+.2f} pp cost), majority rate "
        f"{report['majority_rate']:.4f}"
        + ("; the defended model does no better than predicting the majority class" if trivial else "")
    )
    return report


def per_step_auc(obs: attacks.Observations, y: np.ndarray, scores: np.ndarray) -> float | None:
    """The mean over steps of the AUC of each step's gradient scores (steps whose batch holds both classes)."""
    truth = y[obs.gradient_rows]
    values = []
    for step in np.unique(obs.gradient_steps):
        at = obs.gradient_steps == step
        if len(np.unique(truth[at])) == 2:
            values.append(attacks.auc(truth[at], scores[at]))
    return float(np.mean(values)) if values else None


def true_labels(layout: FederationLayout, sample_ids: Sequence[str]) -> np.ndarray:
    """Ground truth of the label attacks: the active party's labels as its service reads them."""
    data = load_party_data(load_config(layout.configs["active"]))
    return np.asarray(data.y[datasets.select_ids(data.ids, list(sample_ids))], dtype=np.int64)


def last_query(
    obs: attacks.Observations, sample_ids: list[str], queried: Sequence[str]
) -> tuple[attacks.Observations, list[str]]:
    """The observations of the attack's query only: it is the session's last, so earlier releases (the
    validation rows scored during early stopping, by earlier models) are dropped."""
    n = len(queried)
    if sample_ids[-n:] != list(queried):
        raise RuntimeError("the recorded releases do not end with the attack's query")
    if len(sample_ids) == n:
        return obs, sample_ids
    rows = {"x_active": obs.x_active[-n:], "scores": None if obs.scores is None else obs.scores[-n:]}
    if obs.embeddings is not None:
        rows["embeddings"] = obs.embeddings[-n:]
    return replace(obs, **rows), sample_ids[-n:]


def strongest(results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The attack with the lowest clipped MSE among those that ran (naive and aware) on what was released alone; an
    attacker given labelled rows (auxiliary knowledge, scored on other rows) is reported beside it, not in it.
    None if none ran."""
    ran = {name: r for name, r in results.items() if "mse_clipped" in r and "labelled_rows" not in r}
    if not ran:
        return None
    name = min(ran, key=lambda n: ran[n]["mse_clipped"])
    return {"attack": name, "mse": ran[name]["mse_clipped"], "aware": ran[name]["aware"]}


def privacy_curve(base: AttackScenario, epsilons: Sequence[float]) -> list[dict[str, Any]]:
    """Varasteh's privacy–interpretability curve through the services: one scenario per ε (plus ε = 0), the
    LS and Half* MSE measured on the curious plugin's recordings, next to the passive party's forecast.

    The same seed trains the same model in every scenario (the plain backend is exact), so the achieved
    interpretability loss g is measured against the block the undefended run discloses.
    """
    rows: list[dict[str, Any]] = []
    w_true: np.ndarray | None = None
    for epsilon in [0.0, *epsilons]:
        chain = [f"varasteh:epsilon={epsilon!r}"] if epsilon else []
        scenario = replace(base.with_spec(param_release=chain), attacks=("ls", "half_star"), forecast=True, windows=1)
        report = _run_once(scenario, None)
        disclosed = np.asarray(report["w_passive"])
        w_true = disclosed if w_true is None else w_true
        (forecast,) = report["forecast"].values()
        rows.append(
            {
                "epsilon": epsilon,
                "achieved_g": interpretability_loss(w_true, disclosed),
                "case": "none" if not epsilon else "varasteh",
                "ls": report["attacks"]["ls"]["mse"],
                "half_star": report["attacks"]["half_star"]["mse"],
                "forecast_ls": forecast["ls"],
                "forecast_half_star": forecast["half_star"],
                "half": forecast["half"],
                "accuracy": report["accuracy"],
            }
        )
    return rows


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with temporary_folder("vflsec-attack-") as tmp:
        yield tmp


YE_COLUMN = "ye accuracy (plain / with complements)"


def markdown_table(report: dict[str, Any]) -> str:
    """The report as markdown: the strongest attacker first (the headline), then every attack and baseline."""
    lines = [
        f"### {report['dataset']}: d_passive = {report['d_passive']}, n = {report['n_samples']}, "
        f"accuracy = {report['accuracy']:.4f}, release = {report['score_release'] or 'none'}"
        + (f", param release = {report['param_release']}" if report.get("param_release") else ""),
        "",
    ]
    if "strongest" in report:
        lines += [headline(report), ""]
    ye = any("ye_accuracy" in r for r in report["attacks"].values())  # ye's column only where it has a figure
    lines += [
        "| attack | MSE (clipped to the cube) | raw MSE | seconds |" + (f" {YE_COLUMN} |" if ye else ""),
        "|---|---|---|---|" + ("---|" if ye else ""),
    ]
    for name, mse in report["baselines"].items():
        lines.append(f"| {name} (baseline) | {mse:.6g} | | |" + (" |" if ye else ""))
    for name, r in report["attacks"].items():
        label = f"{name} (aware)" if r.get("aware") else name
        if "not_applicable" in r:
            lines.append(f"| {label} | not applicable: {r['not_applicable']} | | |" + (" |" if ye else ""))
        else:
            row = f"| {label} | {r['mse_clipped']:.6g} | {r['mse']:.6g} | {r['seconds']:.3f} |"
            lines.append(row + (f" {ye_accuracy_cell(r)} |" if ye else ""))
    return "\n".join(lines) + "\n"


def labelled_line(name: str, r: dict[str, Any]) -> str:
    """One line for an attacker with auxiliary labels: its figure beside the same learner on the active party's own
    columns alone (what it would know without z_B) and the blind baseline, on the rows it was not given."""
    metric, own = r["metric"], r.get("own_columns", {})
    head = (
        f"{name} (an attacker with auxiliary labels: the passive columns of {r['labelled_rows']} queried rows; scored "
        f"on the other {r['scored_rows']}; not in the strongest): "
    )
    if metric["value"] is None:
        return head + f"MSE {r['mse_clipped']:.4g}, own columns alone {own.get('mse_clipped', float('nan')):.4g}"
    return head + (
        f"{metric['label']} {metric['value']:.4f} with z_B, {own.get('metric', float('nan')):.4f} from the active "
        f"party's own columns alone, majority {metric['baseline']['value']:.4f}"
    )


def headline(report: dict[str, Any]) -> str:
    """One line: the strongest attacker's MSE next to the best naive one and the blind Half baseline."""
    best = report["strongest"]
    if best is None:
        return f"no attack runs on what the active party received; Half {report['baselines']['half']:.6g}"
    naive = strongest({n: r for n, r in report["attacks"].items() if not r.get("aware", False)})
    kind = "aware" if best["aware"] else "naive"
    parts = [f"strongest: {best['attack']} ({kind}) MSE {best['mse']:.6g}"]
    if naive is not None:
        parts.append(f"best naive: {naive['attack']} {naive['mse']:.6g}")
    parts.append(f"Half {report['baselines']['half']:.6g}")
    parts += [  # ye's measure: which binary columns leaked exactly, whatever their (unknown) order does to the MSE
        f"{name} recovered {len(r['recovered_columns'])} of {len(r['binary_columns'])} binary passive columns exactly"
        + (f" (ye accuracy {r['ye_accuracy_complements']:.3f} with complements)" if "ye_accuracy" in r else "")
        for name, r in report["attacks"].items()
        if r.get("binary_columns")
    ]
    return "; ".join(parts)
