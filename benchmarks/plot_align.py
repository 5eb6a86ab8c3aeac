"""Plot `vflsec bench align --json` results: alignment seconds and its floor against rows (log-log).

    .venv/bin/python benchmarks/plot_align.py results.jsonl docs/performance/align_seconds.png

``results.jsonl`` holds one bench JSON object per line (one per --rows and --transport); one line per transport.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _transport(run: dict) -> str:
    """grpc (the shipped streamed exchange, one vflsec serve per party) or pipes (the computation alone)."""
    return "grpc" if run["transport"].startswith("grpc") else "pipes"


def main() -> None:
    source, target = sys.argv[1:3]
    with open(source) as lines:
        runs = sorted((json.loads(line) for line in lines if line.strip()), key=lambda run: run["rows"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for transport in sorted({_transport(run) for run in runs}):
        chosen = [run for run in runs if _transport(run) == transport]
        rows = [run["rows"] for run in chosen]
        ax.plot(rows, [run["align_seconds"] for run in chosen], "o-", label=f"alignment (wall), {transport}")
        ax.plot(rows, [run["floor_seconds"] for run in chosen], "s--", alpha=0.6, label=f"floor, {transport} runs")
        for run in chosen:
            ax.annotate(f"{run['ratio_to_floor']:.2f}x", (run["rows"], run["align_seconds"]),
                        textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="ids per party (90 % common, 1 passive party)", ylabel="seconds",
           title="PSI alignment on 2 cores (vflsec bench align)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=120)


if __name__ == "__main__":
    main()
