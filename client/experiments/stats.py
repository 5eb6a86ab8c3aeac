"""What every summary row of an experiment is built from, the active attacker's (results.py) and a passive one's
(labels.py) alike: mean ± std, the DCS, a row's defense and fixed-axis point, and the plots' shared labels."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client.experiments.scenario import DEFENSE_AXIS, FIXED_AXES, TRAINING_DEFENSE_AXIS

DCS_BETA = 0.5
MARKERS = "osD^v<>ph*"
# Units of the swept release parameters on the plots' x axes; any other: "release-step parameter".
PARAM_UNITS = {"decimals": "decimal places kept", "epsilon": "dimensionless", "sigma": "score units"}


def save_plot(fig: Any, ax: Any, path: Path, below: bool = False) -> Path:
    """Legend (right of the axes, or under them for long labels so they do not squeeze the axes), grid, saved at
    150 dpi and closed: every experiment plot's finish. Returns ``path``."""
    import matplotlib.pyplot as plt

    if below:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, borderaxespad=0.0)
    else:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def dcs(ap: float, dmp: float, beta: float = DCS_BETA) -> float:
    return 1.0 / (1.0 + math.sqrt((1.0 - beta) * ap**2 + beta * dmp**2))


def stat(values: Sequence[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "n": len(values)}


def pm(value: Mapping[str, float]) -> str:
    return f"{value['mean']:.4g} ± {value['std']:.2g}"


def cells(row: Mapping[str, Any], *keys: str) -> list[str]:
    """A summary row's figures as table cells, "—" where the row has none (e.g. no undefended row to compare with)."""
    return [f"{row[key]:.4g}" if key in row else "—" for key in keys]


def defense_label(values: Mapping[str, Any], chains: Sequence[str] = ()) -> str:
    """The swept release parameters of a row, or (none swept) its chains; "none" for an undefended row."""
    release = {a: v for a, v in values.items() if a not in FIXED_AXES}
    if release and all(v is None for v in release.values()):
        return "none"
    return ", ".join(f"{a}={v}" for a, v in release.items()) or " + ".join(chains) or "none"


def row_group(row: dict[str, Any], fixed: Sequence[str]) -> str:
    """The fixed-axis point of a row ("passive_fraction=0.4"), "" without fixed axes: one series per point."""
    return ", ".join(f"{a}={row['values'][a]}" for a in fixed)


def axis_label(axis: str) -> str:
    if axis == DEFENSE_AXIS:
        return "defense (release step and its parameters)"
    if axis == TRAINING_DEFENSE_AXIS:
        return "training defense (the active party's gradient defense and its parameters)"
    step, _, param = axis.partition(".")
    return f"{step} {param} ({PARAM_UNITS.get(param, 'release-step parameter')})"
