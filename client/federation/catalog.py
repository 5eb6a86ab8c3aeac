"""``vflsec datasets``: what a dataset holds and how a federation spec would deal it, before anything runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from vflsec.client.federation.launcher import FederationSpec
from vflsec.services.data import datasets

# ye's Bank split (Table 1): one binary among 8. pdays/previous stay with the active party: "pdays = 999" (never
# contacted) is itself an almost exact binary column.
BANK_PASSIVE = (
    "contact=telephone", "age", "campaign", "emp.var.rate", "cons.price.idx", "cons.conf.idx", "euribor3m",
    "nr.employed",
)  # fmt: skip


def describe(spec: FederationSpec) -> dict[str, Any]:
    """Rows, classes, the columns before and after ``spec.encoding``, and the split ``spec`` deals."""
    ds = spec.data
    # Before encoding: one column per raw feature (the ordinal load keeps them whole).
    raw = ds if spec.encoding != "onehot" else FederationSpec(spec.dataset, label=spec.label, encoding="ordinal").data
    counts = np.bincount(ds.y, minlength=ds.n_classes)
    return {
        "dataset": spec.name,
        "rows": ds.n_samples,
        "classes": dict(zip(ds.class_names, counts.tolist(), strict=True)),
        "majority_rate": float(counts.max() / ds.n_samples),
        "encoding": spec.encoding,
        "columns_raw": raw.feature_names,
        "categorical": raw.categorical,
        "columns": ds.feature_names,
        "passive_features": None if spec.passive_features is None else str(spec.passive_features),
        "split": spec.split.to_dict(),
    }


def lines(info: dict[str, Any]) -> list[str]:
    """The description as short lines for a terminal."""
    classes = ", ".join(f"{name} {count}" for name, count in info["classes"].items())
    categorical = set(info["categorical"])
    raw = [f"{c}*" if c in categorical else c for c in info["columns_raw"]]
    out = [
        f"{info['dataset']}: {info['rows']} rows; classes: {classes} (majority {info['majority_rate']:.4f})",
        f"{len(raw)} columns before encoding (* categorical): {', '.join(raw)}",
        f"{len(info['columns'])} columns with --encoding {info['encoding']}",
        f"active ({len(info['split']['active'])}): {', '.join(info['split']['active'])}",
    ]
    for i, cols in enumerate(info["split"]["passive"], 1):
        out.append(f"passive-{i} ({len(cols)}): {', '.join(cols)}")
    return out


def catalog() -> dict[str, str]:
    """Every dataset name a command accepts here, with its one-line description."""
    return datasets.available_datasets()


def plugins(kind: str) -> list[dict[str, Any]]:
    """Every registered attack (``kind="attacks"``) or defense step (``"defenses"``: score, parameter and embedding
    release steps, gradient defenses): name, where it plugs in, model families, parameters with their defaults, and
    the first line of its docstring."""
    import inspect

    from vflsec.services.registry import ANY_SCORES

    if kind == "attacks":
        from vflsec.services.attacks import ATTACKS

        registries = [("attack", ATTACKS)]
    else:
        from vflsec.services.defenses.embeddings import EMBEDDING_STEPS
        from vflsec.services.defenses.gradients import GRADIENT_STEPS
        from vflsec.services.defenses.release import PARAM_STEPS, SCORE_STEPS
        from vflsec.services.models.tree.partitions import PARTITION_STEPS

        registries = [("--release", SCORE_STEPS), ("--param-release", PARAM_STEPS),
                      ("--embedding-release", EMBEDDING_STEPS), ("--gradient-defense", GRADIENT_STEPS),
                      ("--partition-defense", PARTITION_STEPS)]  # fmt: skip
    rows = []
    for where, registry in registries:
        for name in registry:
            entry = registry.entry(name)
            families = entry.cls.families
            params = {
                k: None if p.default is inspect.Parameter.empty else p.default for k, p in entry.parameters().items()
            }
            doc = (inspect.getdoc(entry.cls) or "").strip().split("\n")[0]  # its first line
            rows.append({
                "name": name,
                "kind": where,
                "families": "any that releases scores" if families >= ANY_SCORES else sorted(families),
                "parameters": {k: v if isinstance(v, str | int | float | bool | type(None)) else str(v)
                               for k, v in params.items()},
                "summary": doc.rstrip(".,:;"),
            })  # fmt: skip
    return rows


def plugin_line(row: dict[str, Any]) -> str:
    """One plug-in as one line: name, families, parameters (defaults), what it is."""
    families = row["families"] if isinstance(row["families"], str) else ",".join(row["families"])
    params = ", ".join(f"{k}={v}" if v is not None else k for k, v in row["parameters"].items()) or "-"
    where = "" if row["kind"] == "attack" else f" [{row['kind']}]"
    return f"{row['name']}{where} ({families}; {params}): {row['summary']}"
