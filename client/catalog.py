"""``vflsec datasets``: what a dataset holds and how a federation spec would deal it, before anything runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from vflsec.client.federation import FederationSpec
from vflsec.services.data import datasets


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
